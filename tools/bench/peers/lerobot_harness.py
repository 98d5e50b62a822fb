"""LeRobotDataset (0.4.4 or 0.6.1) loading the benchmark's windows; run with a LeRobot peer venv's python.

Derived from ``../shared/peers/lerobot_windows.py`` / ``lerobot061_windows.py`` (same dataset,
``delta_timestamps``, DataLoader and memory sampling), with what the honest table needs: a timed
region of at least ``--seconds`` (after ``--warmup`` batches), the episode of every sample of every
timed batch (batch diversity), the output dtype, and the peak RSS of the largest single worker.
Imports only LeRobot, torch and ``memory.py`` beside it (the standard library's; never epishard), so
memory is sampled as epishard's runs sample it. Prints one JSON line.

    . /tmp/peer/lerobot061-env.sh && python tools/bench/peers/lerobot_harness.py ROOT [--uint8] [--seconds 10]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import time
from pathlib import Path

from timedloop import timed_batches  # tools/bench/peers/timedloop.py: this script's folder is sys.path[0]


def main() -> None:
    """Time LeRobotDataset on ``root``'s windows and print one JSON line (rates in samples/s, memory in MB)."""
    assert os.environ.get("HF_HUB_OFFLINE") == "1", "source the peer's env file first (HF_HUB_OFFLINE=1)"
    import lerobot
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0, help="timed region: at least this long")
    ap.add_argument("--min-batches", type=int, default=5)
    ap.add_argument("--window", type=int, default=9)
    ap.add_argument("--stride", type=int, default=4)
    ap.add_argument("--action-horizon", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--uint8", action="store_true", help="return_uint8=True (LeRobot >= 0.5's training default)")
    args = ap.parse_args()

    root = Path(args.root).resolve()
    repo_id = f"local/{root.name}"
    meta = LeRobotDatasetMetadata(repo_id, root=root)
    cams = meta.video_keys + meta.image_keys
    action = "action" if "action" in meta.features else "actions"
    delta = {c: [i * args.stride / meta.fps for i in range(args.window)] for c in cams}
    delta[action] = [k / meta.fps for k in range(args.action_horizon)]
    kw = {}
    if args.uint8:
        if "return_uint8" not in inspect.signature(LeRobotDataset.__init__).parameters:
            raise SystemExit(f"lerobot {lerobot.__version__} has no return_uint8 (0.5 added it)")
        kw["return_uint8"] = True
    t0 = time.perf_counter()
    ds = LeRobotDataset(repo_id, root=root, delta_timestamps=delta, **kw)
    build_s = time.perf_counter() - t0
    run = timed_batches(
        ds,
        args,
        action,
    )
    b, mem, episodes, samples, seconds, warmup_s = (
        run.last,
        run.mem,
        run.episodes,
        run.samples,
        run.seconds,
        run.warmup_s,
    )
    print(
        json.dumps(
            {
                "peer": f"lerobot-{lerobot.__version__}",
                "samples": samples,
                "batches": len(episodes),
                "seconds": seconds,
                "samples_per_s": samples / seconds,
                "frames_per_s": samples * args.window * len(cams) / seconds,
                "episode_ids": episodes,
                "dtype": str(b[cams[0]].dtype).replace("torch.", ""),
                "shapes": {c: [*b[c].shape] for c in cams},
                "rss_peak_mb": mem.rss_peak / 1024,  # MemSampler's peaks are in kB
                "pss_peak_mb": mem.pss_peak / 1024,
                "worker_rss_peak_mb": mem.worker_rss_peak / 1024,
                "warmup_s": warmup_s,
                "build_s": build_s,
                "num_frames": len(ds),
                "decoder": getattr(ds, "video_backend", getattr(ds, "_video_backend", None)),
            }
        )
    )


if __name__ == "__main__":
    main()
