"""Benchmark: conversion throughput per check level and worker count, this tree against a baseline, in one run.

The data: by default the synthetic set, ``--episodes`` (2,000) LeRobot v2.1 episodes of 2 cameras,
each ``--frames`` (40) frames of ``--size`` (64x64) H.264 with B-frames and a keyframe every 10
frames at 20 fps (``tests/videogen.make_video``, 8 distinct videos spread over the episodes; the
parquet tables of ``tests/videogen.make_episode_table``), written once into ``--data`` (kept
there for the next run). Or LeRobot dataset folders given as arguments.

Each configuration (tree x ``--check`` x ``--workers``) runs ``shardwriter.convert`` in a fresh
process (``PYTHONPATH`` = that tree), rounds interleaved (A B C ... A B C ...), and reports per
run the wall time, episodes/s, episodes/s per worker, source MB/s, and CPU time per episode (the
process and its worker processes, user + system), with the load average before and after (the
one-time torch/torchcodec import is done before the clock starts). The
baseline is ``git archive --baseline`` (default ``main``) unpacked into a temporary folder; a tree
without check levels runs ``full`` as ``decode_check=True`` and ``off`` as ``decode_check=False``
(and skips ``fast``). ``tar cf`` of the same files into the same kind of folder is the reference.

    python tools/bench/run.py writer [DATASET ...] [--episodes 2000] [--check full fast off] [--workers 1 2]
        [--baseline main] [--rounds 1] [--data /tmp/epishard-bench-writer] [--json]

``--per-file 200 1000 3000 10000``: instead, the cost of an episode against the size of the file
that holds it. For each count, a LeRobot v3.0 dataset whose one data file and one video file hold
that many episodes (``--per-file-frames``, 2, frames each, 32x32 H.264, ``tests/lerobotgen.write_v3``,
kept in ``--data``) has its first ``--convert`` (200) episodes converted (``--episodes`` of the
CLI), one worker, at the first ``--check`` level (default ``fast``); per tree it reports CPU ms per converted
episode (the whole ``convert`` call, opening the source included), the CPU ms of opening the source
alone (``read_lerobot`` with the selection, as ``convert`` opens it; a tree whose ``read_lerobot`` takes
no ``episodes``: every row), the CPU ms per converted episode without it, the CPU ms of the two costs
paid once per file (and worker), timed alone: the video file's frame table (``video.scan``) and the
read of its data file, and whether the shards and indexes are byte-identical to the first tree's;
with ``--rounds N``, the least CPU time of N runs.

    python tools/bench/run.py writer --per-file 200 1000 3000 10000 [--convert 200] [--baseline main]

``--formats aloha robomimic umi rlds mcap``: instead, episodes/s of each source format beyond
LeRobot (``scenarios/sources.py``: fixtures written with each format's own library, 2 cameras,
lossless frames).

    python tools/bench/run.py writer --formats aloha robomimic umi rlds mcap [--episodes 40] [--frames 40]
    python tools/bench/run.py writer --memory [--gb 1.0] [--formats ...]   # peak memory per source format
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import measure

REPO = measure.REPO
CAMERAS = ("observation.images.a", "observation.images.b")

# Runs in the child process: convert, then print wall and CPU seconds (its own and its workers').
RUNNER = """
import json, resource, sys, tempfile, time
from epishard.shardwriter import ConvertOptions, convert
import torchcodec.decoders  # loaded once per process whatever the episodes: not timed (fork shares it)
src, out, check, workers, levels = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
level = {"check": check} if levels else {"decode_check": check != "off"}
def cpu():
    return sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))
c, t = cpu(), time.perf_counter()
m = convert([src], out, ConvertOptions(progress=False, workers=workers, **level))
print(json.dumps({"wall_s": time.perf_counter() - t, "cpu_s": cpu() - c, "episodes": m.totals.episodes,
                  "checks": dict(m.report.checks or {}) if hasattr(m.report, "checks") else None}))
"""


# Runs in the child process for --per-file: open the source, then convert its first N episodes.
RUNNER_PER_FILE = """
import hashlib, inspect, json, os, resource, sys
from epishard.shardwriter import ConvertOptions, convert
from epishard.shardwriter.lerobot import read_lerobot
import torchcodec.decoders  # loaded once per process whatever the episodes: not timed
src, out, n, check = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
selection = frozenset(range(n))
# As convert opens it: with the selection (a tree whose read_lerobot takes none: every row).
takes = "episodes" in inspect.signature(read_lerobot).parameters
def open_source():
    return read_lerobot(src, episodes=selection) if takes else read_lerobot(src)
open_source()  # warm: imports and the first read of the files
c = cpu()
open_source()
read_s = cpu() - c
c = cpu()
m = convert([src], out, ConvertOptions(progress=False, episodes=selection, check=check))
convert_s = cpu() - c
digest = hashlib.sha256()
for name in sorted(os.listdir(out)):
    if name.endswith((".tar", ".index.parquet")):
        with open(os.path.join(out, name), "rb") as f:
            digest.update(name.encode() + f.read())
# The once-per-file costs, alone: the video file's frame table (check fast: a scan) and its data file read.
import glob, pyarrow.parquet as pq
from epishard.shardwriter import video
c = cpu()
video.scan(glob.glob(os.path.join(src, "videos", "**", "*.mp4"), recursive=True)[0])
scan_s = cpu() - c
c = cpu()
pq.read_table(glob.glob(os.path.join(src, "data", "**", "*.parquet"), recursive=True)[0])
data_s = cpu() - c
print(json.dumps({"cpu_s": convert_s, "read_s": read_s, "scan_s": scan_s, "data_s": data_s,
                  "episodes": m.totals.episodes, "sha256": digest.hexdigest()}))
"""


def make_one_file_v3(root: str, episodes: int, frames: int) -> str:
    """A LeRobot v3.0 dataset whose one data file and one video file hold ``episodes`` episodes (kept in ``root``)."""
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return root
    sys.path.insert(0, str(REPO / "tests"))
    from lerobotgen import write_v3

    write_v3(root, [frames] * episodes, "observation.images.front", per_file=episodes)
    Path(done).touch()
    return root


def per_file(args, trees: dict[str, str], scratch: str) -> None:
    """The ``--per-file`` report (see the module docstring): one line per file size and tree."""
    check = args.check[0]
    print(
        f"# {args.convert} episodes converted per file, check {check}, least of {args.rounds} round(s); "
        f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    for count in args.per_file:
        src = make_one_file_v3(f"{args.data}/v3-one-file-{count}x{args.per_file_frames}", count, args.per_file_frames)
        first = None
        for name, tree in trees.items():
            runs = []
            for _ in range(args.rounds):  # the least CPU of the rounds: other load only ever adds
                out = tempfile.mkdtemp(dir=scratch)
                runs.append(_run_in_tree(tree, out, [RUNNER_PER_FILE, src, out, str(args.convert), check]))
            res = {**min(runs, key=lambda r: r["cpu_s"])}
            res.update({k: min(r[k] for r in runs) for k in ("read_s", "scan_s", "data_s")})
            first = first or res["sha256"]
            row = {"episodes_per_file": count, "tree": name, **res}
            row["cpu_ms_per_episode"] = res["cpu_s"] / res["episodes"] * 1e3
            # What is left once opening the source is taken out.
            row["cpu_ms_per_episode_after_open"] = (res["cpu_s"] - res["read_s"]) / res["episodes"] * 1e3
            if args.json:
                print(json.dumps(row), flush=True)
                continue
            print(
                f"{count:>7} episodes/file {name:<9} {row['cpu_ms_per_episode']:7.2f} ms CPU/episode "
                f"({res['episodes']} converted), {row['cpu_ms_per_episode_after_open']:6.2f} after opening "
                f"the source | read_lerobot {res['read_s'] * 1e3:7.1f} ms | once per file: frame table "
                f"{res['scan_s'] * 1e3:6.1f} ms, data file {res['data_s'] * 1e3:5.1f} ms | "
                f"bytes {'same' if res['sha256'] == first else 'DIFFER'} ({res['sha256'][:12]})",
                flush=True,
            )


def make_synthetic(root: str, episodes: int, frames: int, size: int) -> str:
    """Write the synthetic set (see the module docstring) into ``root`` unless it is there; return ``root``."""
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return root
    sys.path.insert(0, str(REPO / "tests"))
    import numpy as np
    import pyarrow as pa
    from lerobotgen import write_v2_files
    from videogen import make_episode_table, make_video

    videos = [
        make_video(None, frames, fps=20, height=size, width=size, gop=10, start_number=frames * k) for k in range(8)
    ]
    tables = []
    for e in range(episodes):
        table = make_episode_table(frames)
        column = table.column_names.index("episode_index")
        tables.append(table.set_column(column, "episode_index", pa.array(np.full(frames, e, np.int64))))
    files = {cam: [videos[(e + 3 * c) % len(videos)] for e in range(episodes)] for c, cam in enumerate(CAMERAS)}
    write_v2_files(root, tables, videos=files)
    Path(done).touch()
    return root


def _bytes(folder: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file() and p.name != ".complete")


def has_levels(tree: str) -> bool:
    # The format's names: epishard/format/manifest.py, in trees older than that package shardwriter/format.py.
    names = Path(tree, "epishard", "format", "manifest.py")
    return "CHECK_LEVELS" in (names if names.exists() else Path(tree, "shardwriter", "format.py")).read_text()


def run_convert(tree: str, src: str, check: str, workers: int, scratch: str) -> dict:
    out = tempfile.mkdtemp(dir=scratch)
    load = os.getloadavg()[0]
    result = _run_in_tree(tree, out, [RUNNER, src, out, check, str(workers), "1" if has_levels(tree) else "0"])
    return {**result, "load_before": load, "load_after": os.getloadavg()[0]}


def _run_in_tree(tree: str, out: str, script: list[str]) -> dict:
    """Run ``python -c *script`` against the code of ``tree``, remove ``out``, return its last JSON line."""
    proc = subprocess.run(
        [sys.executable, "-c", *script],
        env={**os.environ, "PYTHONPATH": tree},
        cwd=tree,  # `python -c` puts the working folder first on sys.path: make it the tree measured
        capture_output=True,
        text=True,
        check=False,
    )
    subprocess.run(["rm", "-rf", out], check=True)
    if proc.returncode:
        raise RuntimeError(f"convert in {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_tar(src: str, scratch: str) -> dict:
    out = os.path.join(tempfile.mkdtemp(dir=scratch), "all.tar")
    load = os.getloadavg()[0]
    before = os.times()
    t = time.perf_counter()
    subprocess.run(["tar", "cf", out, "-C", src, "."], check=True)
    wall = time.perf_counter() - t
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    subprocess.run(["rm", "-rf", os.path.dirname(out)], check=True)
    return {"wall_s": wall, "cpu_s": cpu, "episodes": None, "load_before": load, "load_after": os.getloadavg()[0]}


SMOKE = {"episodes": 4, "frames": 10, "size": 32, "workers": [1], "baseline": "", "check": ["fast"]}


def options(parser) -> None:
    parser.add_argument("datasets", nargs="*", help="LeRobot dataset folders (default: the synthetic set)")
    parser.add_argument("--episodes", type=int, default=None, help="default 2000 (--formats, --memory: 40)")
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--data", default=None, help="where the generated sources are kept (default: under /tmp)")
    parser.add_argument("--check", nargs="+", choices=["full", "fast", "off"], help="default: full fast off")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="--formats, --memory: the first")
    parser.add_argument("--baseline", default="main", help="git ref to compare with ('' for none)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="TREE:CHECK:WORKERS",
        help="run only these configurations, e.g. main:full:1 this:fast:1 this:fast:2 (default: every one)",
    )
    parser.add_argument(
        "--per-file", type=int, nargs="+", metavar="N", help="cost per episode against episodes per v3.0 file"
    )
    parser.add_argument("--per-file-frames", type=int, default=2, help="--per-file: frames per episode")
    parser.add_argument("--convert", type=int, default=200, help="--per-file: episodes converted per file")
    from scenarios.sources import FORMATS

    g = parser.add_argument_group("source formats beyond LeRobot")
    g.add_argument(
        "--formats",
        nargs="+",
        choices=FORMATS,
        metavar="FORMAT",
        help="instead, episodes/s per source format (" + " ".join(FORMATS) + "): fixtures of --episodes (40) x 2 "
        "cameras x --frames at --size, converted with --workers' first value, each in a fresh process",
    )
    g.add_argument("--memory", action="store_true", help="instead, the >= --gb raw-frame fixtures' peak memory")
    g.add_argument("--gb", type=float, default=1.0)
    g.add_argument("--memory-frames", type=int, default=50)
    g.add_argument("--limit", type=float, default=2.0, help="--memory: GB the peak must stay under")


def run(args) -> int:
    if args.formats or args.memory:  # the source formats beyond LeRobot
        from scenarios.sources import run_formats

        return run_formats(args)
    args.episodes = args.episodes or 2000
    args.data = args.data or os.path.join(tempfile.gettempdir(), "epishard-bench-writer")
    args.check = args.check or (None if args.per_file else ["full", "fast", "off"])
    if args.per_file:
        args.check = args.check or ["fast"]
        with tempfile.TemporaryDirectory(prefix="bench-writer-") as scratch:
            trees = {"this": str(REPO)}
            if args.baseline:
                trees[args.baseline] = str(measure.git_tree(args.baseline))
            per_file(args, trees, scratch)
        return 0
    datasets = args.datasets or [
        make_synthetic(
            f"{args.data}/synthetic-{args.episodes}x{args.frames}x{args.size}", args.episodes, args.frames, args.size
        )
    ]
    with tempfile.TemporaryDirectory(prefix="bench-writer-") as scratch:
        trees = {"this": str(REPO)}
        if args.baseline:
            trees[args.baseline] = str(measure.git_tree(args.baseline))
        for src in datasets:
            size = _bytes(src)
            print(f"# {src}: {size / 1e6:.1f} MB; load average {os.getloadavg()}; cpus {os.cpu_count()}", flush=True)
            configs = [
                (name, check, workers)
                for check in args.check
                for workers in args.workers
                for name, tree in trees.items()
                if (check != "fast" or has_levels(tree)) and (not args.only or f"{name}:{check}:{workers}" in args.only)
            ]
            for r in range(args.rounds):
                tar = run_tar(src, scratch)
                print(
                    f"round {r} {'tar cf':<22} {tar['wall_s']:8.2f} s {size / 1e6 / tar['wall_s']:8.1f} MB/s "
                    f"cpu {tar['cpu_s']:.2f} s | load {tar['load_before']:.1f} -> {tar['load_after']:.1f}",
                    flush=True,
                )
                for name, check, workers in configs:
                    res = run_convert(trees[name], src, check, workers, scratch)
                    eps = res["episodes"] / res["wall_s"]
                    row = {"round": r, "tree": name, "check": check, "workers": workers, "source_mb": size / 1e6, **res}
                    row |= {
                        "episodes_per_s": eps,
                        "episodes_per_s_per_worker": eps / workers,
                        "mb_per_s": size / 1e6 / res["wall_s"],
                        "cpu_ms_per_episode": res["cpu_s"] / res["episodes"] * 1e3,
                    }
                    measure.emit(row)
                    if args.json:
                        continue
                    print(
                        f"round {r} {name:<6} {check:<4} workers {workers} {res['wall_s']:8.2f} s "
                        f"{eps:7.1f} ep/s {eps / workers:7.1f} ep/s/worker {row['mb_per_s']:6.1f} MB/s "
                        f"cpu {row['cpu_ms_per_episode']:6.2f} ms/ep | load {res['load_before']:.1f} -> "
                        f"{res['load_after']:.1f} | checks {res['checks']}",
                        flush=True,
                    )
    return 0
