"""Benchmark: the look-ahead schedule's cost (``stream.lookahead``), time to the first step and in total.

Synthetic consumer (no I/O): ``n`` windows in a random (fully shuffled) order over ``n / 10`` episodes
of 300 frames, 3 cameras, 9 frames per camera per window (the demo's ``segment(0, 32, 9)``), 224x224
uint8 frames (147 kB), the default ``Lookahead`` (first chunk 8 windows, horizon 2048, 768 MiB).
Each tree (``--trees``: checkouts; ``--ref``: git commits, extracted with ``git archive``) runs in its
own process, sides interleaved per size. A tree without an incremental ``Scheduler`` computes the
whole schedule before its first step, so its first-step time is its total.

    PYTHONPATH=$PWD python tools/bench/bench_schedule.py --sizes 2000 20000 100000 --ref main
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def child(n: int, seed: int) -> dict:
    """Time the schedule of one synthetic consumer in this process."""
    import numpy as np

    from epishard.stream import lookahead as la

    rng = np.random.default_rng(seed)
    episodes, cams, length = max(1, n // 10), 3, 300
    episode = rng.integers(0, episodes, size=n).astype(np.int64)
    anchor = rng.integers(0, length, size=n)
    frames = np.clip(anchor[:, None] + np.arange(0, 33, 4)[None, :], 0, length - 1)
    streams = episode[:, None] * cams + np.arange(cams)[None, :]
    keys = la.frame_key(streams[:, :, None], frames[:, None, :]).reshape(n, cams * frames.shape[1])
    t0 = time.perf_counter()
    demand = la.Demand(
        episode=episode,
        keys=keys,
        stream_episode=np.repeat(np.arange(episodes, dtype=np.int64), cams),
        frame_bytes=np.full(episodes * cams, 224 * 224 * 3, dtype=np.int64),
        columns_bytes=np.full(episodes, length * 64, dtype=np.int64),
        encoded_bytes=np.full(episodes, 2 << 20, dtype=np.int64),
    )
    policy = la.Lookahead()
    if hasattr(la, "Scheduler"):
        steps = la.Scheduler(demand, policy)
        next(steps)
        first = time.perf_counter() - t0
        count = 1 + sum(1 for _ in steps)
    else:
        count = len(la.schedule(demand, policy).steps)
        first = time.perf_counter() - t0
    return {"first_step_s": first, "total_s": time.perf_counter() - t0, "steps": count}


def tree_of(ref: str) -> str:
    out = tempfile.mkdtemp(prefix="bench_schedule_")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "x", "-C", out], input=archive, check=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000, 100000])
    p.add_argument("--ref", nargs="*", default=[], help="git commits to compare (extracted with git archive)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.seed)))
        return 0
    trees = {"this": str(REPO), **{r: tree_of(r) for r in args.ref}}
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'tree':<10} {'windows':>8} {'first step s':>13} {'total s':>9} {'steps':>6} {'load':>5}")
    for n in args.sizes:
        for name, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=tree)
            cmd = [sys.executable, str(Path(tree) / "tools" / "bench" / "bench_schedule.py"), "--child", str(n)]
            if not (Path(tree) / "tools" / "bench" / "bench_schedule.py").exists():
                cmd = [sys.executable, __file__, "--child", str(n)]
            r = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
            load = os.getloadavg()[0]
            print(f"{name:<10} {n:>8} {r['first_step_s']:>13.3f} {r['total_s']:>9.2f} {r['steps']:>6} {load:>5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
