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

The ``before`` side runs only with ``--before REV`` (e.g. ``b804156``, the planner before the shared
epoch cuts); without it, this checkout alone.

Usage:
    python tools/bench/run.py plan [--sizes 1,1000,100000,1000000] [--layout 8x8] [--per-episode 4]
        [--before b804156] [--old-max-episodes 1000000] [--old-all-max 100000] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import measure
import numpy as np


def _plan_module(impl: str, before: str):
    """``epishard.stream.plan`` (after) or the ``before`` revision's ``stream/plan.py`` loaded on its own."""
    if impl == "after":
        from epishard.stream import plan

        return plan
    path = os.path.join(tempfile.gettempdir(), f"epishard_plan_{before}.py")
    if not os.path.exists(path):
        src = subprocess.run(
            ["git", "-C", str(measure.REPO), "show", f"{before}:stream/plan.py"],
            check=True,
            capture_output=True,
            text=True,
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


def _plan_kw(impl: str, pool: int | None) -> dict:
    # Before: the reader's default buffer (512 windows, 1 GiB); after: the default pool for batch 8.
    return dict(shuffle_windows=512, shuffle_bytes=1 << 30) if impl == "before" else dict(shuffle_episodes=pool)


def _call(P, fn: str, table, per, *args, **kw):
    """``P.<fn>`` of the epoch ``(table, stride 1, per, seed 0, epoch 0)``, in either revision's signature.

    The current planner takes ``EpochInputs``; an older revision (``--before``) the five arguments.
    """
    if hasattr(P, "EpochInputs"):
        return getattr(P, fn)(P.EpochInputs(table, 1, per, 0, 0), *args, **kw)
    if fn in ("worker_plan", "level_plan"):
        return getattr(P, fn)(table, *args, stride=1, per_episode=per, seed=0, epoch=0, **kw)
    return getattr(P, fn)(table, 1, per, 0, 0, *args, **kw)


def child(args) -> dict:
    P = _plan_module(args.impl, args.before)
    table = _table(P, args.size)
    ranks, workers = (int(x) for x in args.layout.split("x"))
    per = None if args.case == "all" else P.PerEpisode(count=args.per_episode)
    kw = _plan_kw(args.impl, 64)
    _call(P, "worker_plan", _table(P, 3), None, world=P.World(), **kw)  # warm-up: first-call costs are not planning
    base = measure.proc_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    windows = 0
    if args.case in ("worker", "all"):
        windows = len(_call(P, "worker_plan", table, per, world=P.World(0, ranks, workers // 2, workers), **kw))
    elif args.case == "rank":
        if args.impl == "after":  # as WindowDataset.set_epoch: the shared O(E) part once per rank
            kw["shared"] = _call(P, "epoch_cuts", table, per, ranks * workers)
        windows = sum(
            len(_call(P, "worker_plan", table, per, world=P.World(0, ranks, w, workers), **kw)) for w in range(workers)
        )
    elif args.case == "count":
        if args.impl == "before":
            stages = P.Stages(512, 1 << 30)
            windows = _call(P, "level_plan", table, per, consumers=ranks * workers, stages=stages).per_consumer
        else:
            windows = int(_call(P, "plan_shape", table, per, ranks * workers)[0].sum())
    elif args.case == "elastic":
        old, new = (8, 8), (12, 4)
        g = _call(P, "global_plan", table, per, old[0] * old[1])
        progress = P.Progress(*old, tuple([g.per_consumer // 2] * (old[0] * old[1])))
        base, t0, c0 = measure.proc_mb(), time.perf_counter(), time.process_time()
        world = P.World(5, new[0], 1, new[1])
        windows = len(_call(P, "worker_plan", table, per, world=world, history=(progress,), **kw))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = measure.peak_rss_mb()
    return {"time_s": elapsed, "cpu_s": cpu, "peak_mb": max(peak - base, 0.0), "windows": windows}


def _run_child(impl, case, size, args, timeout=900) -> dict | None:
    extra = ["--layout", args.layout, "--per-episode", str(args.per_episode), "--before", args.before]
    return measure.run_child("plan", [impl, case, str(size), *extra], timeout=timeout)


def main_bench(args) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    workers = int(args.layout.split("x")[1])
    rows = []
    measure.say(f"load average {os.getloadavg()[0]:.1f}; layout {args.layout}; per_episode_count {args.per_episode}")
    header = (
        f"{'case':8} {'episodes':>9} {'windows':>10} | {'before s':>9} {'CPU s':>8} {'MB':>7} | "
        f"{'after s':>9} {'CPU s':>8} {'MB':>7} | CPU ratio"
    )
    measure.say(header)
    wanted = args.cases.split(",")
    cases = [(c, s) for c in ("worker", "rank", "count", "all") if c in wanted for s in sizes]
    if "elastic" in wanted:
        cases.append(("elastic", max(1, args.elastic_windows // args.per_episode)))
    for case, size in cases:
        res = {}
        for impl in ("before", "after"):
            limit = args.old_all_max if case == "all" else args.old_max_episodes
            if impl == "before" and (not args.before or size > limit or case == "rank"):
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
        measure.emit(rows[-1])
        win = (a or b or {}).get("windows", 0)
        bs = f"{b['time_s']:9.3f} {b['cpu_s']:8.3f} {b['peak_mb']:7.0f}" if b else f"{'-':>9} {'-':>8} {'-':>7}"
        if b and b.get("derived"):
            bs = f"{b['time_s']:8.2f}* {b['cpu_s']:7.2f}* {'':>7}"
        as_ = f"{a['time_s']:9.3f} {a['cpu_s']:8.3f} {a['peak_mb']:7.0f}" if a else f"{'-':>9} {'-':>8} {'-':>7}"
        ratio = f"{b['cpu_s'] / a['cpu_s']:.0f}x" if a and b and a["cpu_s"] > 0 else ""
        if not measure.json_mode():
            print(
                f"{case:8} {size:9d} {win:10d} | {bs} | {as_} | {ratio}   (load {os.getloadavg()[0]:.1f})", flush=True
            )
    if args.before and not measure.json_mode():
        print("* before, rank = workers x the measured worker figure (every worker planned the whole epoch)")


SMOKE = {"sizes": "1000", "cases": "worker"}


def options(ap) -> None:
    ap.add_argument("--child", nargs=3, metavar=("IMPL", "CASE", "SIZE"), help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="1,1000,100000,1000000")
    ap.add_argument("--layout", default="8x8", help="ranks x workers (default 8x8)")
    ap.add_argument("--per-episode", type=int, default=4, help="windows per episode (the sampling policy)")
    ap.add_argument("--before", default="", help="git revision of the 'before' plan.py (e.g. b804156; default: none)")
    ap.add_argument("--old-max-episodes", type=int, default=1_000_000, help="largest size run with 'before'")
    ap.add_argument("--old-all-max", type=int, default=100_000, help="largest all-anchor size run with 'before'")
    ap.add_argument("--elastic-windows", type=int, default=230_000)
    ap.add_argument("--cases", default="worker,rank,count,all,elastic")


def run(args) -> int:
    if args.child:
        args.impl, args.case, size = args.child
        args.size = int(size)
        return measure.child_result(child(args))
    main_bench(args)
    return 0
