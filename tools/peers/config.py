"""The benchmark's fixed settings: the window, paths, counters and the systems compared."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "tools" / "bench_peers.py"  # the command; runs re-enter it with --zygote or --child
SPAN, FRAMES, STEP, HORIZON = 33, 9, 4, 16
PEER_VENV = "/tmp/peer/lerobot-venv"
PEER_ENV = "/tmp/peer/env.sh"
STAGES = ("read_s", "decode_s", "postprocess_s", "assemble_s", "collate_s")
COUNTERS = (
    "read_s",
    "decode_s",
    "postprocess_s",
    "assemble_s",
    "frames_decoded",
    "frames_returned",
    "bytes_read",
    "decoder_opens",
    "frames_unique",
)
TARGET = 3.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def shared_dir() -> Path:
    return Path(os.environ.get("EPISHARD_SHARED_DATA", REPO.parent / "shared" / "data")).parent


# --- systems ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class System:
    """One loader configuration. ``source``: ``"main"`` (the v3.0 folder, or the folder given) or
    ``"v2"`` (its v2.x original); ``reuse``: epishard's windows per episode per epoch (``"epoch"``,
    ``"pe4"``, ``"all"``; see the module docstring)."""

    id: str
    kind: str
    source: str = "main"
    dtype: str = "float32"
    reuse: str = ""
    float_in_collate: bool = False  # reader yields uint8; the collate writes float32 [0, 1] into the batch
    float_in_main: bool = False  # reader yields uint8; the main process converts into 2 reused buffers

    @property
    def label(self) -> str:
        if self.kind != "epishard":
            return self.kind
        extra = {"epoch": "", "pe4": " pe4", "all": " all"}[self.reuse]
        out = (
            "f32c"
            if self.float_in_collate
            else "f32m"
            if self.float_in_main
            else ("f32" if self.dtype == "float32" else "u8")
        )
        return f"epishard {out}{extra}" + (" [v2]" if self.source == "v2" else "")


SYSTEMS = {
    s.id: s
    for s in (
        System("lerobot", "lerobot"),
        System("webdataset", "webdataset"),
        System("naive", "naive"),
        System("es-f32", "epishard", reuse="epoch"),
        System("es-u8", "epishard", dtype="uint8", reuse="epoch"),
        System("es-f32c", "epishard", reuse="epoch", float_in_collate=True),
        System("es-f32m", "epishard", reuse="epoch", float_in_main=True),
        System("es-f32-pe4", "epishard", reuse="pe4"),
        System("es-f32-all", "epishard", reuse="all"),
        System("es-f32-v2", "epishard", source="v2", reuse="epoch"),
        System("es-u8-v2", "epishard", source="v2", dtype="uint8", reuse="epoch"),
    )
}
PEERS = ("lerobot", "webdataset", "naive")
DEFAULT = [k for k in SYSTEMS if k not in ("es-u8-v2", "es-f32m")]  # on request: v2.x and v3.0 shards measure alike;
# es-f32m hands out batches that are overwritten two batches later (a training step must be done with them)
