"""Benchmark: the worker memory budget against the shuffle pool, from the schedule alone (no decoding).

For each converted dataset, one consumer (worker 0 of ``--workers``) of the benchmark's window
(``tools/bench/peers``: 9 frames over 33 rows per camera, action chunk 16, every anchor, native frame
size) at batch size ``--batch-size``, under each setting: ``old`` = the pool and frame cache before
this budget (64 episodes, 768 MiB), ``auto`` = ``shuffle="auto"`` with the default
``Lookahead`` (the pool sized from the cache). Reports the pool, the expected distinct episodes per
batch over i.i.d.'s (``stream.shuffle.expected_distinct`` over the consumer's windows per episode, pool
by pool, weighted by windows, against the whole dataset's i.i.d. figure), the frame cache's peak (the schedule's
``Step.held``), frames the schedule decodes per frame returned (misses: a lower bound of the
decoder's work, which also counts frames from each keyframe) and episodes fetched per window, over
the first ``--windows`` windows. Exact counts: the machine's load does not change them.

With ``--run SAMPLES`` it also iterates real ``WindowLoader``s (``--workers`` workers, native size,
uint8 and float32, ``old`` and ``auto`` interleaved, one after another in this process) and reports
the largest worker's peak RSS, the caches' peaks and the decoder's work per frame returned.

    PYTHONPATH=$PWD python tools/bench/bench_budget.py /tmp/epishard_bench_peers/*.epishard
    PYTHONPATH=$PWD python tools/bench/bench_budget.py /tmp/epishard_bench_peers/unitree*.epishard --run 400
"""

from __future__ import annotations

import argparse

import numpy as np

from epishard.stream.lookahead import Lookahead
from epishard.stream.options import Ranks, ReadOptions

OLD = Lookahead(frame_cache_bytes=768 << 20, encoded_bytes=128 << 20, decode_bytes=256 << 20)  # before the budget


def measure(root: str, setting: str, args) -> dict:
    from epishard.stream import WindowDataset, WindowSpec, segment
    from epishard.stream.fetch import FetchPolicy
    from epishard.stream.lookahead import Scheduler
    from epishard.stream.reader import EpochReader, _Demands
    from epishard.stream.report import iid_reference
    from epishard.stream.shuffle import expected_distinct
    from epishard.stream.source import DatasetSource

    src = DatasetSource(root)
    spec = WindowSpec(
        cameras={c: segment(0, 32, 9) for c in src.cameras}, state_offsets=(0,), action_horizon=16, boundary="pad"
    )
    kw = {"shuffle": 64, "read": ReadOptions(lookahead=OLD)} if setting == "old" else {}
    ds = WindowDataset(src, spec, seed=0, batch_size=args.batch_size, ranks=Ranks(num_workers=args.workers), **kw)
    pool = ds.pool_episodes()
    plan = ds.plan(0, Ranks(0, 1).world().with_worker(0, args.workers))
    episodes, anchors = plan.episode[: args.windows], plan.anchor[: args.windows]
    policy = Lookahead(**{**ds.lookahead.__dict__, "first": args.batch_size})
    demand = _Demands(EpochReader(ds.read_context()), episodes, anchors).part(0, episodes.size)
    sched = Scheduler(demand, policy)
    steps = list(sched)
    returned = int((demand.keys >= 0).sum())
    # Expected diversity of the pool: the consumer's windows per episode, pool by pool in read order.
    _, counts = np.unique(plan.episode, return_counts=True)
    pools = np.array_split(counts, max(1, (2 * counts.size + pool) // (2 * pool)))  # pool_shuffle's pools
    distinct = np.average([expected_distinct(c, args.batch_size) for c in pools], weights=[c.sum() for c in pools])
    iid_distinct = iid_reference(ds, args.batch_size).distinct
    return {
        "dataset": root.rstrip("/").split("/")[-1],
        "setting": setting,
        "pool": pool,
        "diversity": distinct / iid_distinct,
        "cache_mib": policy.frame_cache_bytes / 2**20,
        "peak_mib": max(s.held for s in steps) / 2**20,
        "decoded_per_returned": sum(s.misses for s in steps) / max(returned, 1),
        "fetches_per_window": len(sched.fetches) / max(episodes.size, 1),
        "budget_gb": policy.budget(FetchPolicy().prefetch_bytes).total / 1e9,
    }


def run(root: str, setting: str, dtype: str, args) -> dict:
    """Peak worker RSS of a real ``WindowLoader`` (``--workers`` workers) over ``--samples`` samples, this process."""
    import os
    import sys
    import time

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peers.memory import MemSampler

    from epishard.stream import PostProcess, WindowDataset, WindowLoader, WindowSpec, segment
    from epishard.stream.source import DatasetSource
    from epishard.stream.telemetry import summarize

    src = DatasetSource(root)
    spec = WindowSpec(
        cameras={c: segment(0, 32, 9) for c in src.cameras}, state_offsets=(0,), action_horizon=16, boundary="pad"
    )
    old = setting == "old"
    post = PostProcess(dtype=torch.uint8 if dtype == "u8" else torch.float32)
    read = ReadOptions(telemetry=True, lookahead=OLD if old else None)
    ds = WindowDataset(src, spec, seed=0, postprocess=post, read=read, shuffle=64 if old else "auto")
    loader = WindowLoader(ds, batch_size=args.batch_size, num_workers=args.workers, persistent_workers=True)
    mem = MemSampler()
    mem.start()
    t, samples, rows = time.perf_counter(), 0, []
    for batch in loader:
        samples += len(batch["episode_index"])
        rows.extend(batch["__telemetry__"].numpy())
        del batch
        if samples >= args.samples:
            break
    seconds = time.perf_counter() - t
    mem.stop()
    tel = summarize(rows)
    return {
        "dataset": root.rstrip("/").split("/")[-1],
        "setting": f"{setting} {dtype}",
        "pool": loader.dataset.pool_episodes(),
        "samples": samples,
        "seconds": seconds,
        "worker_rss_peak_mb": mem.worker_rss_peak / 1024,
        "cache_peak_mib": tel["frame_cache_bytes_peak"] / 2**20,
        "encoded_peak_mib": tel["encoded_bytes_peak"] / 2**20,
        "decoded_per_returned": tel["frames_decoded"] / max(tel["frames_returned"], 1),
        "load": os.getloadavg()[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("roots", nargs="+", help="converted epishard datasets")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--windows", type=int, default=4000, help="windows of the consumer's yield order scheduled")
    p.add_argument(
        "--run",
        type=int,
        default=0,
        metavar="SAMPLES",
        help="also run real loaders (old/auto x uint8/float32, interleaved) for SAMPLES samples each: peak worker RSS",
    )
    args = p.parse_args()
    args.samples = args.run
    cols = "dataset setting pool diversity cache_mib peak_mib decoded_per_returned fetches_per_window budget_gb"
    print("| " + " | ".join(cols.split()) + " |")
    print("|" + " --- |" * len(cols.split()))
    for root in args.roots:
        for setting in ("old", "auto"):
            r = measure(root, setting, args)
            print(
                "| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols.split()) + " |",
                flush=True,
            )

    if args.run:
        cols = "dataset setting pool samples seconds worker_rss_peak_mb cache_peak_mib encoded_peak_mib"
        cols += " decoded_per_returned load"
        print("\n| " + " | ".join(cols.split()) + " |")
        print("|" + " --- |" * len(cols.split()))
        for root in args.roots:
            for dtype in ("u8", "f32"):
                for setting in ("old", "auto"):
                    r = run(root, setting, dtype, args)
                    cells = [f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols.split()]
                    print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
