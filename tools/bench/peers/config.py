"""The benchmark's fixed settings: the window, paths, counters, the systems compared and the targets."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ENTRY = REPO / "tools" / "bench" / "bench_peers.py"  # the command; runs re-enter it with --zygote or --child
HARNESS = Path(__file__).resolve().parent / "lerobot_harness.py"  # runs inside a LeRobot peer venv
RAY_HARNESS = Path(__file__).resolve().parent / "raydata.py"  # Ray Data, run with the LeRobot 0.6.1 peer's python
LANCE_HARNESS = Path(__file__).resolve().parent / "lance_harness.py"  # lerobot-lancedb, run in a Lance peer venv
SPAN, FRAMES, STEP, HORIZON = 33, 9, 4, 16
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
TARGET = 3.0  # samples/s at least 3x LeRobot 0.6.1 with the same output dtype ...
DECODE_TARGET = 0.8  # ... or, where 3x exceeds the decode limit, at least 0.8 of it
# Issue 21, on AV1 (LeRobot's default recording: GOP 2): at least 2x LeRobot 0.6.1 with the same dtype,
# or 0.8 of the GOP-aware decode limit, whichever is lower.
AV1_TARGET = 2.0
MATCHED = 0.9  # matched diversity: distinct episodes per batch >= 0.9 of i.i.d.
MIN_EPISODES = 200  # datasets are tiled to at least this many episodes


def log(msg: str) -> None:
    """A progress line on stderr (stdout carries the tables)."""
    print(msg, file=sys.stderr, flush=True)


def shared_dir() -> Path:
    """The ../shared folder (``EPISHARD_SHARED_DATA``'s parent when set): data and peers' setup scripts."""
    return Path(os.environ.get("EPISHARD_SHARED_DATA", REPO.parent / "shared" / "data")).parent


@dataclass(frozen=True)
class Peer:
    """A LeRobot release in its own venv (built by the setup script in ../shared/peers)."""

    version: str
    venv: str
    env: str
    setup: str  # script name in ../shared/peers


LEROBOT = {
    "0.4.4": Peer("0.4.4", "/tmp/peer/lerobot-venv", "/tmp/peer/env.sh", "setup_lerobot_venv.sh"),
    "0.6.1": Peer("0.6.1", "/tmp/peer/lerobot061-venv", "/tmp/peer/lerobot061-env.sh", "setup_lerobot061_venv.sh"),
}


@dataclass(frozen=True)
class LancePeer:
    """A lerobot-lancedb release in its own venv (``../shared/peers/setup_lance_venvs.sh``, after the
    LeRobot 0.6.1 peer's), with its layout (``lance_harness.py --layout``) and the folder suffix of
    its conversion of a LeRobot v3.0 dataset."""

    version: str
    venv: str
    env: str
    layout: str  # "lancedb": mp4 blobs (LanceDBDataset); "jpeg": one JPEG per frame (LeRobotLanceDataset)
    suffix: str


LANCE = {
    "0.3.1": LancePeer("0.3.1", "/tmp/peer/lance/venv", "/tmp/peer/lance/env.sh", "lancedb", "lance031"),
    "0.2.2": LancePeer("0.2.2", "/tmp/peer/lance/venv022", "/tmp/peer/lance/env022.sh", "jpeg", "jpeg022"),
}
LANCE_SETUP = "setup_lance_venvs.sh"


@dataclass(frozen=True)
class System:
    """One loader configuration.

    ``kind``: ``lerobot``, ``raydata``, ``webdataset``, ``naive`` or ``epishard``; ``dtype``: the frames'
    output dtype; ``policy``: windows per episode per epoch (``"all"``: every anchor, as LeRobot's sampler
    over every frame; ``"pe4"``: 4 per episode, a fresh draw each epoch); ``lerobot``: the release
    (``raydata``: the LeRobot peer venv whose ``lerobot`` Ray's ``read_lerobot`` imports);
    ``reuse_buffers``: epishard's opt-in reused batch buffers (``WindowLoader(reuse_buffers=k)``: a
    batch stays valid until ``k`` more are drawn; the benchmark drops each batch at once);
    ``packets``: epishard reads cameras by their packet tables (the default), else members whole
    through torchcodec (``FetchPolicy(packets=False)``); ``ray``: epishard's batches made by Ray actors
    (``RayWindowLoader``, one actor per worker on a local Ray cluster of ``--workers`` CPUs, as Ray
    Data's read tasks), not DataLoader workers; ``recycle``: ``WindowLoader``'s default recycled batch
    buffers (False: every batch in fresh shared memory, ``recycle_buffers=False``); ``shuffle``:
    epishard's ``WindowDataset(shuffle=...)`` (None: its default, ``"auto"``; ``"global"``: every
    window of the epoch dealt at random, i.i.d. diversity; an int: a shuffle pool of that many
    episodes; ``"all"``: one pool of all the worker's episodes, ``shuffle=None``: the points of the
    diversity curve between the default and global); ``frame_cache_mb``: the look-ahead's frame cache
    (``Lookahead(frame_cache_bytes=)``, None: its default 548 MiB), the worker's memory knob;
    ``presigned``: ``FetchPolicy(s3_transport="presigned")`` (only with ``--s3-latency-ms``).
    """

    id: str
    kind: str
    dtype: str = "float32"
    policy: str = "all"
    lerobot: str = ""
    reuse_buffers: int = 0
    packets: bool = True
    ray: bool = False
    recycle: bool = True
    shuffle: int | str | None = None
    frame_cache_mb: int | None = None
    lance: str = ""
    presigned: bool = False

    @property
    def label(self) -> str:
        """The system's name in tables and charts, e.g. "LeRobot 0.6.1 u8", "epishard f32"."""
        dt = "u8" if self.dtype == "uint8" else "f32"
        if self.kind == "lerobot":
            return f"LeRobot {self.lerobot} {dt}"
        if self.kind == "raydata":
            return f"Ray Data 2.60 {dt}"
        if self.kind == "lance":
            return f"Lance {LANCE[self.lance].layout} {self.lance} {dt}"
        if self.kind == "epishard":
            reuse = f" reuse{self.reuse_buffers}" if self.reuse_buffers else ""
            whole = "" if self.packets else " whole"
            ray = " Ray actors" if self.ray else ""
            fresh = "" if self.recycle else " fresh"
            shuffle = "" if self.shuffle is None else f" pool {self.shuffle}"
            shuffle = " global" if self.shuffle == "global" else shuffle
            cache = f" cache {self.frame_cache_mb} MiB" if self.frame_cache_mb else ""
            signed = " presigned" if self.presigned else ""
            label = f"epishard {dt}" + ("" if self.policy == "all" else f" {self.policy}")
            return label + reuse + whole + ray + fresh + shuffle + cache + signed
        return f"{self.kind} {dt}"

    @property
    def windows_per_episode(self) -> int | None:
        """``WindowSpec.per_episode_count`` of the policy (None: every anchor)."""
        return {"all": None, "pe4": 4}[self.policy]


SYSTEMS = {
    s.id: s
    for s in (
        System("lerobot", "lerobot", lerobot="0.4.4"),
        System("lerobot061", "lerobot", lerobot="0.6.1"),
        System("lerobot061-u8", "lerobot", dtype="uint8", lerobot="0.6.1"),
        System("raydata", "raydata", lerobot="0.6.1"),
        System("raydata-u8", "raydata", dtype="uint8", lerobot="0.6.1"),
        System("webdataset", "webdataset"),
        System("webdataset-u8", "webdataset", dtype="uint8"),
        System("naive", "naive"),
        System("naive-u8", "naive", dtype="uint8"),
        System("es-f32", "epishard"),
        System("es-u8", "epishard", dtype="uint8"),
        System("es-f32-pe4", "epishard", policy="pe4"),
        System("es-u8-pe4", "epishard", dtype="uint8", policy="pe4"),
        System("es-f32-reuse", "epishard", reuse_buffers=2),
        System("es-u8-reuse", "epishard", dtype="uint8", reuse_buffers=2),
        System("es-f32-whole", "epishard", packets=False),
        System("es-u8-whole", "epishard", dtype="uint8", packets=False),
        System("es-ray-f32", "epishard", ray=True),
        System("es-ray-u8", "epishard", dtype="uint8", ray=True),
        System("es-u8-fresh", "epishard", dtype="uint8", recycle=False),
        System("es-f32-fresh", "epishard", recycle=False),
        System("lance-video", "lance", lance="0.3.1"),
        System("lance-video-u8", "lance", dtype="uint8", lance="0.3.1"),
        System("lance-jpeg", "lance", lance="0.2.2"),
        System("lance-jpeg-u8", "lance", dtype="uint8", lance="0.2.2"),
        System("es-u8-global", "epishard", dtype="uint8", shuffle="global"),
        System("es-f32-global", "epishard", shuffle="global"),
        System("es-u8-pool16", "epishard", dtype="uint8", shuffle=16),
        System("es-u8-poolall", "epishard", dtype="uint8", shuffle="all"),
        System("es-u8-cache256", "epishard", dtype="uint8", frame_cache_mb=256),
        System("es-u8-cache128", "epishard", dtype="uint8", frame_cache_mb=128),
        System("es-u8-presigned", "epishard", dtype="uint8", presigned=True),
        System("es-u8-global-presigned", "epishard", dtype="uint8", shuffle="global", presigned=True),
    )
}
PEERS = (
    "lerobot061",
    "lerobot061-u8",
    "lerobot",
    "raydata-u8",
    "raydata",
    "webdataset",
    "webdataset-u8",
    "naive",
    "naive-u8",
)
# The float32 runs tell the same story (webdataset, naive convert only 9 frames; Ray Data reads uint8
# and converts after); reused buffers are opt-in.
ON_REQUEST = (
    "webdataset-u8",
    "naive-u8",
    "raydata",
    "es-f32-reuse",
    "es-u8-reuse",
    "es-f32-whole",
    "es-u8-whole",
    "es-ray-f32",
    "es-ray-u8",
    "es-u8-fresh",
    "es-f32-fresh",
    "es-u8-global",
    "es-f32-global",
    "es-u8-pool16",
    "es-u8-poolall",
    "es-u8-cache256",
    "es-u8-cache128",
    "es-u8-presigned",
    "es-u8-global-presigned",
    "lance-video",
    "lance-video-u8",
    "lance-jpeg",
    "lance-jpeg-u8",
)
DEFAULT = [k for k in SYSTEMS if k not in ON_REQUEST]
QUICK = ["lerobot061-u8", "webdataset", "naive", "es-f32", "es-u8", "es-u8-pe4"]
