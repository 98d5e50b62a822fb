"""Planning cost from 1 to 1,000,000 episodes, before (a git revision's ``stream/plan.py``) and after, in one run.

Synthetic episode tables, no video: ``E`` episodes of 100-500 rows (uniform), 50 episodes per shard,
layout ``--layout RxW`` (ranks x DataLoader workers). Every figure is measured in a fresh child
process (``--child``), so peak memory is that measurement's own: ``peak MB`` is the child's peak
resident set minus its resident set before planning (the table built).

Cases, for each size and implementation:

- ``worker``: one DataLoader worker's epoch plan (``worker_plan``), windows per episode from the
  sampling policy (``--per-episode N``, the typical case), the pool shuffle after.
- ``rank``: every worker of rank 0 planned one after another in one process: the CPU a rank spends
  planning an epoch (after: with the shared O(E) part, ``epoch_cuts``, computed once first, as
  ``WindowDataset.set_epoch`` does before the DataLoader forks). Before, each worker planned the
  whole global plan, so the before figure is ``workers x worker`` (measured once per worker would
  take minutes at 1M); it is labelled so.
- ``count``: ``windows_per_consumer`` (``len()``, every ``state_dict``): the count of windows per
  consumer. Before: a full ``level_plan``; after: ``plan_shape`` (counts only).
- ``all``: ``worker`` with every anchor of every episode (``per_episode`` None).
- ``elastic``: one new worker's plan after a layout change mid-epoch (``history``): ``--elastic-windows``
  windows in the epoch, ``8x8`` -> ``12x4``, each old consumer halfway through.

``--first-batch DATASET``: the index side of the first batch at 1M episodes, measured honestly
without 1M episodes of video: the dataset's ``index.arrow`` rows are tiled to ``--tile`` episodes
(each shard's rows repeated through the format's writer, ``encode_index`` and
``dataset_index_bytes``: every row points at its real shard), and the steps a rank runs before its first
sample are timed one by one (sha256 of the index file, Arrow read and schema check, value check,
``WindowIndex``, ``episode_table``, one worker's plan); then the real first batch of the (small)
dataset itself is timed from ``iter()``. The sum estimates the first batch at that size.

Usage:
    python tools/bench/bench_plan.py [--sizes 1,1000,100000,1000000] [--layout 8x8] [--per-episode 4]
        [--before b804156] [--old-max-episodes 1000000] [--old-all-max 100000] [--json FILE]
    python tools/bench/bench_plan.py --first-batch out/demo [--tile 1000000]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _plan_module(impl: str, before: str):
    """``epishard.stream.plan`` (after) or the ``before`` revision's ``stream/plan.py`` loaded on its own."""
    if impl == "after":
        from epishard.stream import plan

        return plan
    path = os.path.join(tempfile.gettempdir(), f"epishard_plan_{before}.py")
    if not os.path.exists(path):
        src = subprocess.run(
            ["git", "-C", ROOT, "show", f"{before}:stream/plan.py"], check=True, capture_output=True, text=True
        ).stdout
        with open(path, "w") as f:
            f.write(src)
    spec = importlib.util.spec_from_file_location("epishard_plan_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["epishard_plan_before"] = module
    spec.loader.exec_module(module)
    return module


def _table(P, episodes: int):
    rng = np.random.default_rng(0)
    rows = rng.integers(100, 501, episodes).astype(np.int64)
    return P.EpisodeTable(
        shard=(np.arange(episodes) // 50).astype(np.int64),
        lo=np.zeros(episodes, np.int64),
        hi=rows,
        weight=np.ones(episodes),
        cost_bytes=rows * 1000,
    )


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _plan_kw(impl: str, pool: int | None) -> dict:
    # Before: the reader's default buffer (512 windows, 1 GiB); after: the default pool for batch 8.
    return dict(shuffle_windows=512, shuffle_bytes=1 << 30) if impl == "before" else dict(shuffle_episodes=pool)


def child(args) -> dict:
    P = _plan_module(args.impl, args.before)
    table = _table(P, args.size)
    ranks, workers = (int(x) for x in args.layout.split("x"))
    per = None if args.case == "all" else P.PerEpisode(count=args.per_episode)
    kw = dict(stride=1, per_episode=per, seed=0, epoch=0, **_plan_kw(args.impl, 64))
    small = dict(kw, per_episode=None)
    P.worker_plan(_table(P, 3), world=P.World(), **small)  # warm-up: first-call costs are not planning
    base = _rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    windows = 0
    if args.case in ("worker", "all"):
        windows = len(P.worker_plan(table, world=P.World(0, ranks, workers // 2, workers), **kw))
    elif args.case == "rank":
        if args.impl == "after":  # as WindowDataset.set_epoch: the shared O(E) part once per rank
            kw["shared"] = P.epoch_cuts(table, 1, per, 0, 0, ranks * workers)
        windows = sum(len(P.worker_plan(table, world=P.World(0, ranks, w, workers), **kw)) for w in range(workers))
    elif args.case == "count":
        if args.impl == "before":
            stages = P.Stages(512, 1 << 30)
            windows = P.level_plan(table, consumers=ranks * workers, stages=stages, **kw_level(kw)).per_consumer
        else:
            windows = int(P.plan_shape(table, 1, per, 0, 0, ranks * workers)[0].sum())
    elif args.case == "elastic":
        old, new = (8, 8), (12, 4)
        g = P.global_plan(table, 1, per, 0, 0, old[0] * old[1])
        progress = P.Progress(*old, tuple([g.per_consumer // 2] * (old[0] * old[1])))
        base, t0, c0 = _rss_mb(), time.perf_counter(), time.process_time()
        windows = len(P.worker_plan(table, world=P.World(5, new[0], 1, new[1]), history=(progress,), **kw))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"time_s": elapsed, "cpu_s": cpu, "peak_mb": max(peak - base, 0.0), "windows": windows}


def kw_level(kw: dict) -> dict:
    return {k: v for k, v in kw.items() if k in ("stride", "per_episode", "seed", "epoch")}


def _run_child(impl, case, size, args, timeout=900) -> dict | None:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", impl, case, str(size)]
    cmd += ["--layout", args.layout, "--per-episode", str(args.per_episode), "--before", args.before]
    env = dict(os.environ, PYTHONPATH=ROOT)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=True).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        print(f"  {impl} {case} {size}: failed: {str(exc)[:300]}", file=sys.stderr)
        return None
    return json.loads(out.strip().splitlines()[-1])


def main_bench(args) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    workers = int(args.layout.split("x")[1])
    rows = []
    print(f"load average {os.getloadavg()[0]:.1f}; layout {args.layout}; per_episode_count {args.per_episode}")
    header = (
        f"{'case':8} {'episodes':>9} {'windows':>10} | {'before s':>9} {'CPU s':>8} {'MB':>7} | "
        f"{'after s':>9} {'CPU s':>8} {'MB':>7} | CPU ratio"
    )
    print(header)
    wanted = args.cases.split(",")
    cases = [(c, s) for c in ("worker", "rank", "count", "all") if c in wanted for s in sizes]
    if "elastic" in wanted:
        cases.append(("elastic", max(1, args.elastic_windows // args.per_episode)))
    for case, size in cases:
        res = {}
        for impl in ("before", "after"):
            limit = args.old_all_max if case == "all" else args.old_max_episodes
            if impl == "before" and (size > limit or case == "rank"):
                res[impl] = None
                continue
            res[impl] = _run_child(impl, case, size, args)
        if case == "rank" and res["after"] is not None:
            w = next((r for r in rows if r["case"] == "worker" and r["episodes"] == size), None)
            if w and w["before"]:
                before = w["before"]
                res["before"] = {**before, "time_s": before["time_s"] * workers, "cpu_s": before["cpu_s"] * workers}
                res["before"]["derived"] = True
        b, a = res["before"], res["after"]
        rows.append({"case": case, "episodes": size, "before": b, "after": a, "load": os.getloadavg()[0]})
        win = (a or b or {}).get("windows", 0)
        bs = f"{b['time_s']:9.3f} {b['cpu_s']:8.3f} {b['peak_mb']:7.0f}" if b else f"{'-':>9} {'-':>8} {'-':>7}"
        if b and b.get("derived"):
            bs = f"{b['time_s']:8.2f}* {b['cpu_s']:7.2f}* {'':>7}"
        as_ = f"{a['time_s']:9.3f} {a['cpu_s']:8.3f} {a['peak_mb']:7.0f}" if a else f"{'-':>9} {'-':>8} {'-':>7}"
        ratio = f"{b['cpu_s'] / a['cpu_s']:.0f}x" if a and b and a["cpu_s"] > 0 else ""
        print(f"{case:8} {size:9d} {win:10d} | {bs} | {as_} | {ratio}   (load {os.getloadavg()[0]:.1f})", flush=True)
    print("* before, rank = workers x the measured worker figure (every worker planned the whole epoch)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def first_batch(args) -> None:
    """The index side of the first batch at ``--tile`` episodes, then the real first batch."""
    import pyarrow as pa

    from epishard.format.index import WindowIndex, dataset_index_bytes, encode_index
    from epishard.format.manifest import DATASET_INDEX_NAME, MANIFEST_NAME, Manifest
    from epishard.format.validate import check_index
    from epishard.stream import WindowDataset, WindowLoader, WindowSpec
    from epishard.stream.plan import World, episode_table, worker_plan

    real = WindowIndex.load_dataset(args.first_batch)
    with open(os.path.join(args.first_batch, MANIFEST_NAME), "rb") as f:
        manifest = Manifest.load(f.read(), args.first_batch)
    reps = -(-args.tile // real.num_episodes)
    # Each shard's index rows repeated (through the format's own writer: one large table per shard),
    # so every tiled episode points at its real shard's members.
    files = []
    for shard, entry in enumerate(manifest.shards):
        rows = [real.row(e) for e in np.flatnonzero(real.shard == shard).tolist()] * reps
        files.append(encode_index(rows, {"shard": entry.shard}))
    data = dataset_index_bytes(files)
    path = os.path.join(tempfile.mkdtemp(), DATASET_INDEX_NAME)
    with open(path, "wb") as f:
        f.write(data)
    print(
        f"load average {os.getloadavg()[0]:.1f}; {args.first_batch}: {real.num_episodes} episodes tiled to "
        f"{real.num_episodes * reps} ({len(data) / 1e6:.0f} MB index.arrow)"
    )
    steps: dict[str, float] = {}

    def done(name: str, t: float) -> None:
        steps[name] = time.perf_counter() - t
        print(f"  {name:66} {steps[name]:7.3f} s", flush=True)

    t = time.perf_counter()
    with open(path, "rb") as f:
        data = f.read()
    hashlib.sha256(data).hexdigest()
    done("read + sha256", t)
    t = time.perf_counter()
    ix = WindowIndex.read_dataset_index(pa.py_buffer(data), path, None)
    done("Arrow read + schema check + WindowIndex", t)
    counts = np.bincount(ix.shard, minlength=len(manifest.shards))  # the tiled index's episodes per shard
    shards = [dataclasses.replace(s, episodes=int(c)) for s, c in zip(manifest.shards, counts, strict=True)]
    t = time.perf_counter()
    check_index(ix, shards, dict.fromkeys(manifest.camera_episodes()), path)
    done("value check (check_index)", t)
    spec = WindowSpec(cameras=None, action_horizon=16, per_episode_count=args.per_episode)
    cams = {c: (0,) for c in ix.camera_names(0)}
    t = time.perf_counter()
    table = episode_table(spec, ix, cams)
    done("episode_table", t)
    ranks, workers = (int(x) for x in args.layout.split("x"))
    t = time.perf_counter()
    worker_plan(table, stride=1, per_episode=spec.sampling, seed=0, epoch=0, world=World(0, ranks, 0, workers))
    done("one worker's plan", t)
    ds = WindowDataset(args.first_batch, spec, seed=0)
    loader = WindowLoader(ds, batch_size=8, num_workers=2)
    t = time.perf_counter()
    next(iter(loader))
    done("real first batch of the small dataset (iter -> batch, 2 workers)", t)
    print(f"  {'sum (estimated first batch at ' + str(args.tile) + ' episodes)':66} {sum(steps.values()):7.3f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=3, metavar=("IMPL", "CASE", "SIZE"), help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="1,1000,100000,1000000")
    ap.add_argument("--layout", default="8x8", help="ranks x workers (default 8x8)")
    ap.add_argument("--per-episode", type=int, default=4, help="windows per episode (the sampling policy)")
    ap.add_argument("--before", default="b804156", help="git revision of the 'before' plan.py")
    ap.add_argument("--old-max-episodes", type=int, default=1_000_000, help="largest size run with 'before'")
    ap.add_argument("--old-all-max", type=int, default=100_000, help="largest all-anchor size run with 'before'")
    ap.add_argument("--elastic-windows", type=int, default=230_000)
    ap.add_argument("--cases", default="worker,rank,count,all,elastic")
    ap.add_argument("--json", default=None)
    ap.add_argument("--first-batch", default=None, metavar="DATASET")
    ap.add_argument("--tile", type=int, default=1_000_000)
    args = ap.parse_args()
    if args.child:
        args.impl, args.case, size = args.child
        args.size = int(size)
        print(json.dumps(child(args)))
    elif args.first_batch:
        first_batch(args)
    else:
        main_bench(args)


if __name__ == "__main__":
    main()
