"""Time to the first batch at up to 1,000,000 episodes, end to end, with its parts.

The dataset: ``DATASET`` (a converted dataset, e.g. ``make demo``'s ``out/demo``) tiled to
``--episodes`` episodes (``tools/bench/bench_indexload.py``'s ``tile``: each shard's tar laid 32
times into one block file, the blocks listed as many shards as needed, a manifest whose counts and
index sha256 match). So the index really lists that many episodes and the real reader opens it,
plans over all of them, fetches the first batch's members from the tars (byte ranges of real
members) and decodes its frames.

Each figure is a fresh child process (``--child``) that times, from nothing:

- ``index``: ``DatasetSource(url)`` (manifest, sha256 of ``index.arrow`` or its node stamp, Arrow
  read, checks, ``WindowIndex``); the first process of a node pays the hash (``cold``), others not;
- ``dataset``: ``WindowDataset(...)`` (the planner's episode table) and ``WindowLoader(...)``;
- ``first batch``: ``next(iter(loader))``: ``set_epoch`` (the shared plan cuts), worker start, and
  in the worker (its ``__telemetry__``): ``plan`` (its windows), ``schedule`` (the look-ahead's
  first step: the demand and next uses of the windows it looks at), ``read`` + ``decode`` (the
  first batch's fetch and decode); ``other`` is the rest (worker fork and imports, collate, etc.).

The window is ``make demo``'s stream line (9 frames over 33 rows, 16-step action chunk, 224x224,
batch 8), every anchor of every episode, the default shuffle (``shuffle="auto"``), seed 0;
rank 0 of ``--world-size`` (every anchor of 1M episodes of ~419 rows is ~387M windows: one process
cannot list an epoch of it, a rank of 64 lists ~6M).

    PYTHONPATH=$PWD python tools/bench/bench_firstbatch.py out/demo --episodes 1000000 --world-size 64 --workers 0 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from epishard.stream.options import Ranks, ReadOptions

REPO = Path(__file__).resolve().parents[2]


def child(dataset: str, world_size: int, workers: int, per_episode_count: int | None) -> dict:
    """Time one first batch in this process (see the module docstring)."""
    t0 = time.perf_counter()
    import torch

    from epishard.stream import Lookahead, PostProcess, WindowDataset, WindowLoader, WindowSpec, segment
    from epishard.stream.source import DatasetSource
    from epishard.stream.telemetry import summarize

    t1, cpu = time.perf_counter(), time.process_time()
    source = DatasetSource(dataset)
    t2 = time.perf_counter()
    spec = WindowSpec(
        cameras={c: segment(0, 32, 9) for c in source.cameras},
        action_horizon=16,
        per_episode_count=per_episode_count,
    )
    post = PostProcess(size=(224, 224), dtype=torch.uint8)
    ds = WindowDataset(
        source,
        spec,
        seed=0,
        postprocess=post,
        read=ReadOptions(telemetry=True, lookahead=Lookahead()),
        ranks=Ranks(rank=0, world_size=world_size),
    )
    loader = WindowLoader(ds, batch_size=8, num_workers=workers)
    t3 = time.perf_counter()
    batch = next(iter(loader))
    t4 = time.perf_counter()
    tel = summarize([batch["__telemetry__"].numpy()])
    windows = loader.dataset.windows_per_consumer(0, world_size, max(workers, 1))
    parts = {k: tel[k] for k in ("plan_s", "schedule_s", "read_s", "decode_s")}
    return {
        "imports_s": t1 - t0,
        "index_s": t2 - t1,
        "dataset_s": t3 - t2,
        "first_batch_s": t4 - t3,
        **parts,
        "other_s": t4 - t3 - sum(parts.values()),
        "total_s": t4 - t1,
        "cpu_s": time.process_time() - cpu,  # this process's (the workers' own are not in it)
        "episodes": source.index.num_episodes,
        "windows_per_worker": windows,
        "samples": int(batch["episode_index"].numel()),
    }


def _tile(dataset: str, episodes: int, out: str) -> str:
    """The tiled copy of ``dataset`` (``tools/bench/bench_indexload.py``'s ``tile``, one record batch)."""
    spec = importlib.util.spec_from_file_location("bench_indexload", REPO / "tools" / "bench" / "bench_indexload.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tile(dataset, episodes, os.path.join(out, f"tiled{episodes}-1batch"), None)


def _tree(ref: str, out: str) -> str:
    """``ref`` extracted (``git archive``) under ``out``."""
    tree = tempfile.mkdtemp(prefix="tree_", dir=out)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def _run(tree: str, tiled: str, world: int, workers: int, count: str, cache: str) -> dict:
    """One child process of ``tree``'s code (its own ``tools/bench/bench_firstbatch.py``, else this one)."""
    script = Path(tree) / "tools" / "bench" / "bench_firstbatch.py"
    env = dict(os.environ, PYTHONPATH=tree, EPISHARD_CACHE=cache)
    cmd = [sys.executable, str(script if script.exists() else __file__), "--child", tiled, str(world), str(workers)]
    got = subprocess.run([*cmd, count], env=env, check=True, capture_output=True, text=True, cwd=tree)
    return json.loads(got.stdout.splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", nargs="?", help="a converted dataset (e.g. out/demo), tiled to --episodes")
    p.add_argument("--episodes", type=int, default=1_000_000)
    p.add_argument("--world-size", type=int, nargs="+", default=[64], help="rank 0 of this many ranks")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="DataLoader workers (0: none)")
    p.add_argument("--per-episode-count", type=int, default=None, help="windows per episode (default: every anchor)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--ref", nargs="*", default=[], help="git commits to run beside this tree (git archive), interleaved"
    )
    p.add_argument("--out", default=None, help="folder for the tiled dataset, kept (default: a temporary one)")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        dataset, world, workers, count = args.child
        print(json.dumps(child(dataset, int(world), int(workers), None if count == "all" else int(count))))
        return 0
    out = args.out or tempfile.mkdtemp(prefix="bench_firstbatch_")
    t = time.perf_counter()
    tiled = _tile(args.dataset, args.episodes, out)
    print(f"tiled dataset {tiled} ({time.perf_counter() - t:.1f} s)")
    count = "all" if args.per_episode_count is None else str(args.per_episode_count)
    trees = {"this": str(REPO), **{ref: _tree(ref, out) for ref in args.ref}}
    print(
        f"{'tree':>8} {'round':>5} {'world':>5} {'workers':>7} {'cache':>5} {'windows/worker':>14} | {'total s':>7} = "
        f"{'index':>6} + {'dataset':>7} + {'first batch':>11} ({'plan':>5} {'sched':>5} {'read':>5} {'decode':>6} "
        f"{'other':>5}) | {'cpu s':>5} | load"
    )
    caches: dict[str, str] = {}  # per tree, the verification cache of its last cold run (its stamp)
    for r in range(args.rounds):
        for world in args.world_size:
            for workers in args.workers:
                for cold in (True, False):
                    for name, tree in trees.items():
                        if cold:
                            caches[name] = tempfile.mkdtemp(dir=out)
                        cache = caches[name]
                        load = os.getloadavg()[0]
                        g = _run(tree, tiled, world, workers, count, cache)
                        print(
                            f"{name[:8]:>8} {r:>5} {world:>5} {workers:>7} {'cold' if cold else 'warm':>5} "
                            f"{g['windows_per_worker']:>14} | {g['total_s']:>7.2f} = {g['index_s']:>6.2f} + "
                            f"{g['dataset_s']:>7.2f} + {g['first_batch_s']:>11.2f} ({g['plan_s']:>5.2f} "
                            f"{g['schedule_s']:>5.2f} {g['read_s']:>5.2f} {g['decode_s']:>6.2f} "
                            f"{g['other_s']:>5.2f}) | {g.get('cpu_s', float('nan')):>5.2f} | {load:.1f}",
                            flush=True,
                        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
