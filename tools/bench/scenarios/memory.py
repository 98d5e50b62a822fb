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

``--budget``: instead, the worker memory budget against the shuffle pool, from the schedule alone (no
decoding). For each converted dataset (the positional arguments), one consumer (worker 0 of
``--workers``) of the peer benchmark's window (9 frames over 33 rows per camera, action chunk 16, every
anchor, native frame size) at batch size ``--batch-size``, under each setting: ``old`` = the pool and
frame cache before the budget (64 episodes, 768 MiB), ``auto`` = ``shuffle="auto"`` with the default
``Lookahead`` (the pool sized from the cache). Reports the pool, the expected distinct episodes per batch
over i.i.d.'s (``stream.shuffle.expected_distinct`` over the consumer's windows per episode, pool by pool,
against the whole dataset's i.i.d. figure), the frame cache's peak (the schedule's ``Step.held``), frames
the schedule decodes per frame returned (a lower bound of the decoder's work) and episodes fetched per
window, over the first ``--windows`` windows: exact counts, the machine's load does not change them. With
``--run SAMPLES`` it also iterates real ``WindowLoader``s (native size, uint8 and float32, ``old`` and
``auto`` interleaved) and reports the largest worker's peak RSS, the caches' peaks and the decoder's work.

    python tools/bench/run.py memory --epochs 6
    python tools/bench/run.py memory ../shared/data/unitree_g1_bottle_av1 --epochs 2 --size 0 --shuffled \\
        --baseline b804156
    python tools/bench/run.py memory --budget /tmp/epishard_bench_peers/*.epishard
    python tools/bench/run.py memory --budget /tmp/epishard_bench_peers/unitree*.epishard --run 400
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import measure
import numpy as np

from epishard.shardwriter import ConvertOptions, convert
from epishard.stream import PostProcess, WindowDataset, WindowLoader, WindowSpec
from epishard.stream.lookahead import Lookahead
from epishard.stream.options import Ranks, ReadOptions

SOURCES = [measure.REPO / "sample" / "gr00t_robot_sim_picknplace", measure.shared_data() / "so101_bimanual_cloth"]


def memory_mb(pid: int) -> dict:
    """RSS, PSS and peak RSS (``VmHWM``: what a budget must bound) of a process, MB."""
    return {
        "rss": measure.proc_mb(pid, "Rss:", "smaps_rollup"),
        "pss": measure.proc_mb(pid, "Pss:", "smaps_rollup"),
        "peak": measure.proc_mb(pid, "VmHWM:"),
    }


def converted(sources: list[Path], work: Path) -> list[str]:
    out = []
    for src in sources:
        dst = work / src.name
        if not (dst / "manifest.json").exists():
            convert([str(src)], str(dst), ConvertOptions(max_episodes_per_shard=2, progress=False))
        out.append(str(dst))
    return out


SMOKE = {"epochs": 2, "workers": 1, "per_episode": 2, "size": 32, "windows": 50}


def options(p) -> None:
    p.add_argument(
        "sources",
        nargs="*",
        help="LeRobot folders to convert and mix (default: sample + so101); --budget: converted datasets",
    )
    p.add_argument("--work", default="/tmp/epishard_bench_memory", help="where converted datasets are kept")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--per-episode", type=int, default=48, help="windows per episode per epoch")
    p.add_argument("--size", type=int, default=128, help="frames resized to SIZE x SIZE (0: stored size)")
    p.add_argument("--shuffled", action="store_true", help="a random permutation of each consumer's plan")
    p.add_argument("--baseline", help="also measure the reader at this git commit, side by side")
    g = p.add_argument_group("--budget")
    g.add_argument("--budget", action="store_true", help="instead: the memory budget against the shuffle pool")
    g.add_argument("--batch-size", type=int, default=8)
    g.add_argument("--windows", type=int, default=4000, help="windows of the consumer's yield order scheduled")
    g.add_argument(
        "--run",
        type=int,
        default=0,
        metavar="SAMPLES",
        help="also run real loaders (old/auto x uint8/float32, interleaved) for SAMPLES samples each: peak worker RSS",
    )


def run(args) -> int:
    if args.budget:
        return budget(args)
    if args.baseline:
        return side_by_side(args)
    if args.smoke and not args.sources:
        args.sources, args.work = [str(measure.smoke_source())], str(measure.SMOKE_DIR / "memory")
    sources = [Path(s) for s in args.sources] or SOURCES
    missing = [str(s) for s in sources if not (s / "meta" / "info.json").exists()]
    if missing:
        raise measure.Missing(f"missing LeRobot sources: {missing}")
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
        measure.emit(rows[-1])
        if args.json:
            continue
        print(
            f"epoch {epoch}: {samples} samples in {rows[-1]['s']} s; "
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
    argv = list(args.argv)
    i = argv.index("--baseline")
    del argv[i : i + 2]
    for name, tree in (
        ("look-ahead (this checkout)", measure.REPO),
        (f"baseline {args.baseline}", measure.git_tree(args.baseline)),
    ):
        print(f"== {name}; load average {os.getloadavg()[0]:.1f}", flush=True)
        subprocess.run([sys.executable, str(measure.RUN), "memory", *argv], env=measure.env_with(tree), check=True)
    return 0


def _samples(batch: list[dict]) -> list[dict]:
    return batch


# --- the memory budget against the shuffle pool (--budget) ------------------------------------------------

OLD = Lookahead(frame_cache_bytes=768 << 20, encoded_bytes=128 << 20, decode_bytes=256 << 20)  # before the budget


def schedule(root: str, setting: str, args) -> dict:
    """The pool, diversity, cache peak and decoder work of one setting, from the schedule alone."""
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


def loader_run(root: str, setting: str, dtype: str, args) -> dict:
    """Peak worker RSS of a real ``WindowLoader`` (``--workers`` workers) over ``--samples`` samples, this process."""
    import torch

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
    mem = measure.mem_sampler()
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


def budget(args) -> int:
    roots = args.sources
    if not roots:
        if not args.smoke:
            raise measure.Missing("--budget: give converted datasets")
        roots = [str(measure.smoke_dataset())]
    args.samples = args.run
    cols = [
        "dataset",
        "setting",
        "pool",
        "diversity",
        "cache_mib",
        "peak_mib",
        "decoded_per_returned",
        "fetches_per_window",
        "budget_gb",
    ]
    rows = []
    for root in roots:
        for setting in ("old", "auto"):
            r = schedule(root, setting, args)
            measure.emit(r)
            rows.append([f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols])
    measure.table(cols, rows)
    if args.run:
        cols = "dataset setting pool samples seconds worker_rss_peak_mb cache_peak_mib encoded_peak_mib"
        cols = (cols + " decoded_per_returned load").split()
        rows = []
        for root in roots:
            for dtype in ("u8", "f32"):
                for setting in ("old", "auto"):
                    r = loader_run(root, setting, dtype, args)
                    measure.emit(r)
                    rows.append([f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols])
        measure.table(cols, rows)
    return 0
