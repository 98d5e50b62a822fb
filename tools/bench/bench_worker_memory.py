"""Benchmark: memory of persistent DataLoader workers across epochs, on a mix of datasets.

A ``WindowLoader`` with ``persistent_workers=True`` runs ``--epochs`` epochs over a weighted mix of
converted datasets (default: the repo's sample, 1 camera 256x256 H.264 with keyframes 250 frames apart, and
``../shared/data/so101_bimanual_cloth``, 2 cameras 224x224 MPEG-4; converted once into ``--work``),
every camera at the anchor row, frames resized to 128x128, ``--per-episode`` windows per episode.
After every epoch it reads each worker's RSS and PSS (``/proc/<pid>/smaps_rollup``; PSS counts
pages still shared with the parent after fork in part). Reported: MB per worker per epoch, and each
worker's last epoch over its first
(the target: within 1.10). Machines are noisy; compare ratios within one run only.

Look-ahead decoding (``stream.lookahead``): ``--baseline REF`` runs the same measurement again
under the reader at git commit ``REF`` (extracted with ``git archive``; e.g. ``b804156``, the
reader before look-ahead, which holds whole decoded episodes in its shuffle buffer) and prints both
side by side; ``--shuffled`` replaces each consumer's yield order by a random permutation of its
plan (the planner's full shuffle); ``--size 0`` keeps the stored frame size (640x480 for the
unitree dataset: the size the 1.5 GB per-worker budget is stated for).

    PYTHONPATH=$PWD python tools/bench/bench_worker_memory.py --epochs 6
    PYTHONPATH=$PWD python tools/bench/bench_worker_memory.py ../shared/data/unitree_g1_bottle_av1 \
        --epochs 2 --size 0 --shuffled --baseline b804156
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TREE = os.environ.get("EPISHARD_BENCH_TREE", str(REPO))  # the reader measured (--baseline: another commit's)
sys.path.insert(0, TREE)

from epishard.shardwriter import ConvertOptions, convert
from epishard.stream import PostProcess, WindowDataset, WindowLoader, WindowSpec

SOURCES = [REPO / "sample" / "gr00t_robot_sim_picknplace", REPO.parent / "shared" / "data" / "so101_bimanual_cloth"]


def memory_mb(pid: int) -> dict:
    """RSS, PSS and peak RSS (MB) of a process."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts[0] in ("Rss:", "Pss:"):
                fields[parts[0][:-1].lower()] = int(parts[1]) / 1024
    with open(f"/proc/{pid}/status") as f:  # the peak RSS so far (VmHWM): what a budget must bound
        fields["peak"] = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    return fields


def converted(sources: list[Path], work: Path) -> list[str]:
    out = []
    for src in sources:
        dst = work / src.name
        if not (dst / "manifest.json").exists():
            convert([str(src)], str(dst), ConvertOptions(max_episodes_per_shard=2, progress=False))
        out.append(str(dst))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="*", help="LeRobot folders to convert and mix (default: sample + so101)")
    p.add_argument("--work", default="/tmp/epishard_bench_memory", help="where converted datasets are kept")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--per-episode", type=int, default=48, help="windows per episode per epoch")
    p.add_argument("--json", action="store_true")
    p.add_argument("--size", type=int, default=128, help="frames resized to SIZE x SIZE (0: stored size)")
    p.add_argument("--shuffled", action="store_true", help="a random permutation of each consumer's plan")
    p.add_argument("--baseline", help="also measure the reader at this git commit, side by side")
    args = p.parse_args()
    if args.baseline:
        return side_by_side(args)
    sources = [Path(s) for s in args.sources] or SOURCES
    missing = [str(s) for s in sources if not (s / "meta" / "info.json").exists()]
    if missing:
        print(f"missing LeRobot sources: {missing}", file=sys.stderr)
        return 2
    roots = converted(sources, Path(args.work))
    # Every camera of every dataset (the datasets differ in cameras, sizes and state widths, so
    # batches stay lists of samples), frames resized to --size (128x128), a 16-step action chunk.
    spec = WindowSpec(cameras=None, action_horizon=16, per_episode_count=args.per_episode)
    post = PostProcess(size=(args.size, args.size)) if args.size else PostProcess()
    mixed = WindowDataset([(r, 1.0) for r in roots], spec, seed=0, postprocess=post)
    loader = WindowLoader(mixed, batch_size=8, num_workers=args.workers, persistent_workers=True, collate_fn=_samples)
    if args.shuffled:
        shuffle(loader.dataset)  # the workers fork with it
    rows = []
    for epoch in range(args.epochs):
        t = time.perf_counter()
        samples = sum(len(b) for b in loader)
        pids = loader.worker_pids()
        rows.append(
            {
                "epoch": epoch,
                "samples": samples,
                "s": round(time.perf_counter() - t, 1),
                "workers": [memory_mb(pid) for pid in pids],
            }
        )
        print(
            json.dumps(rows[-1])
            if args.json
            else f"epoch {epoch}: {samples} samples in {rows[-1]['s']} s; "
            + "; ".join(
                f"w{i} RSS {m['rss']:.0f} MB PSS {m['pss']:.0f} MB peak {m['peak']:.0f} MB"
                for i, m in enumerate(rows[-1]["workers"])
            ),
            flush=True,
        )
    for i in range(args.workers):
        rss = [r["workers"][i]["rss"] for r in rows]
        print(
            f"worker {i}: RSS last/first epoch {rss[-1] / rss[0]:.3f}, max/first {max(rss) / rss[0]:.3f}, "
            f"last/second {rss[-1] / rss[min(1, len(rss) - 1)]:.3f}"
        )
    return 0


def shuffle(ds: WindowDataset) -> None:
    """Each consumer's yield order becomes a random permutation of its plan."""
    plan = ds.plan

    def permuted(epoch, world, history=()):
        p = plan(epoch, world, history)
        order = np.random.default_rng([7, epoch, world.consumer]).permutation(len(p))
        return dataclasses.replace(p, episode=p.episode[order], anchor=p.anchor[order])

    ds.plan = permuted  # type: ignore[method-assign]


def side_by_side(args) -> int:
    """This reader, then the one at ``--baseline``, each in its own process; their output in turn."""
    from bench_lookahead import baseline_tree  # tools/ is on sys.path when run as a script

    argv = [a for a in sys.argv[1:]]
    i = argv.index("--baseline")
    del argv[i : i + 2]
    for name, tree in (
        ("look-ahead (this checkout)", str(REPO)),
        (f"baseline {args.baseline}", baseline_tree(args.baseline)),
    ):
        env = dict(os.environ, EPISHARD_BENCH_TREE=tree, PYTHONPATH=tree)
        print(f"== {name}; load average {os.getloadavg()[0]:.1f}", flush=True)
        subprocess.run([sys.executable, __file__, *argv], env=env, check=True)
    return 0


def _samples(batch: list[dict]) -> list[dict]:
    return batch


if __name__ == "__main__":
    sys.exit(main())
