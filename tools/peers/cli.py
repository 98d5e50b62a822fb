"""Benchmark: epishard's reader side by side with the loaders users would pick instead, in one run.

The command line of ``python tools/bench_peers.py``; what it measures and how: the package
docstring (``tools/peers/__init__.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from .charts import charts
from .config import DEFAULT, FRAMES, HORIZON, PEER_ENV, PEER_VENV, SPAN, STEP, SYSTEMS, log, shared_dir
from .measure import run_child
from .runs import (
    convert_all,
    expected_decoded_per_returned,
    find_datasets,
    peer_status,
    run_env,
    run_system,
    setup_peers,
)
from .summary import LEGEND, print_tables, summarize, verdict
from .zygote import Zygote, zygote_main


def machine() -> dict:
    import torch
    import torchcodec

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchcodec": torchcodec.__version__,
        "host": platform.node(),
        "cpu": next(
            (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?"
        ),
    }


def parse(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--data", default=str(shared_dir() / "data"), help="folder of LeRobot datasets (default ../shared/data)"
    )
    p.add_argument("--datasets", type=lambda s: s.split(","), help="comma-separated v3.0 folder names (default: all)")
    p.add_argument("--source", action="append", help="a LeRobot dataset folder to measure instead (repeatable)")
    p.add_argument(
        "--systems",
        type=lambda s: s.split(","),
        default=DEFAULT,
        help=f"comma-separated, from {','.join(SYSTEMS)} (default: all but es-u8-v2)",
    )
    p.add_argument(
        "--batches",
        type=int,
        default=20,
        help="timed batches (default 20: a full run in ~10 min on 2 cores; epishard's epoch configs time "
        "one epoch of about as many)",
    )
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default="docs/bench/peers.jsonl", help="JSON lines (every run, summaries, ratios)")
    p.add_argument("--charts", default="docs/bench", help="folder for the PNG charts ('' for none)")
    p.add_argument("--work", help="folder for converted shards (default: a temporary folder, removed)")
    p.add_argument("--peers-dir", default=str(shared_dir() / "peers"))
    p.add_argument("--peer-venv", default=PEER_VENV)
    p.add_argument("--peer-env", default=PEER_ENV)
    p.add_argument(
        "--setup-peers", action="store_true", help="build the LeRobot peer venv first (setup_lerobot_venv.sh)"
    )
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for every run, peers included (e.g. THP_MEM_ALLOC_ENABLE=1: torch's large "
        "CPU allocations on transparent huge pages)",
    )
    p.add_argument(
        "--fresh-process",
        action="store_true",
        help="start a fresh interpreter per run (default: fork each run from a process that imported "
        "torch, torchcodec, ... once; its PSS is added to the run's)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {list(SYSTEMS)}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.zygote:
        zygote_main()
        return 0
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))), flush=True)
        return 0
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    t_start = time.perf_counter()
    command = "python tools/bench_peers.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.setup_peers:
        setup_peers(args)
    datasets = find_datasets(args)
    if not datasets:
        return 1
    systems = [SYSTEMS[s] for s in args.systems]
    missing = peer_status(args) if "lerobot" in args.systems else None
    if missing:
        print(f"skip LeRobotDataset peer: {missing}")
        systems = [s for s in systems if s.kind != "lerobot"]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="epishard_bench_peers_"))
    info = machine()
    print(
        f"{started}; {info['cpus']} CPUs ({info['cpu']}), {info['memory_gib']} GiB; torch {info['torch']}, "
        f"torchcodec {info['torchcodec']}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(
        f"window: {FRAMES} frames over {SPAN} (offsets 0,{STEP},...,{SPAN - 1}) per camera, "
        f"action chunk {HORIZON}, batch {args.batch_size}, {args.workers} workers, "
        f"{args.warmup} warm-up batches, {args.batches} timed batches, "
        f"{args.rounds} rounds",
        flush=True,
    )
    records: list[dict] = []
    zygote = None if args.fresh_process else Zygote(run_env(args))
    try:
        convert_all(datasets, work)
        lerobot_decode = {}
        for d in datasets:
            plan = [s for s in systems if s.source == "main" or d.original]
            if not d.version.startswith("v3"):
                if any(s.kind == "lerobot" for s in plan):
                    print(f"{d.name}: LeRobot harness reads v3.0 folders only ({d.version}): peer skipped")
                plan = [s for s in plan if s.kind != "lerobot"]
            if any(s.kind == "lerobot" for s in plan):
                lerobot_decode[d.name] = expected_decoded_per_returned(d.shards["main"])
            for r in range(args.rounds):
                order = plan if r % 2 == 0 else plan[::-1]
                for s in order:
                    rec = run_system(args, d, s, seed=r, zygote=zygote)
                    if s.kind == "lerobot":
                        rec["frames_decoded_per_returned_expected"] = lerobot_decode[d.name]
                    records.append(rec)
                    log(
                        f"  {d.name} round {r + 1}/{args.rounds} {s.label:<22} {rec['samples_per_s']:8.1f} samples/s  "
                        f"(load {rec['loadavg_1m']:.1f})"
                    )
    finally:
        if zygote is not None:
            zygote.close()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    rows, ratios = summarize(records, datasets, systems)
    print_tables(rows, ratios, datasets, lerobot_decode)
    print("\n" + LEGEND)
    loads = [r["loadavg_1m"] for r in records]
    total_s = time.perf_counter() - t_start
    print(
        f"\nnoise: 1-min load average during runs {min(loads):.1f}..{max(loads):.1f} on {info['cpus']} CPUs; "
        f"total {total_s:.0f} s"
    )
    lines = verdict(ratios, datasets)
    if lines:
        print("acceptance (float32, v3.0 datasets):")
        for line in lines:
            print("  " + line)
    meta = {
        "record": "run",
        "started": started,
        "command": command,
        "seconds": total_s,
        "machine": info,
        "window": {"frames": FRAMES, "span": SPAN, "offsets": list(range(0, SPAN, STEP)), "action_horizon": HORIZON},
        "batch_size": args.batch_size,
        "workers": args.workers,
        "warmup": args.warmup,
        "batches": args.batches,
        "rounds": args.rounds,
        "env": args.env,
        "systems": [asdict(s) for s in systems],
        "lerobot_expected_decoded_per_returned": lerobot_decode,
        "verdict": lines,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            for rec in [meta] + [dict(r, record="run_result") for r in records] + rows + ratios:
                f.write(json.dumps(rec) + "\n")
        print(f"wrote {args.out}")
    if args.charts:
        title = (
            f"{FRAMES} frames/{SPAN}-frame span, batch {args.batch_size}, {args.workers} workers; "
            f"{started[:10]}, {info['cpus']} CPUs"
        )
        for p in charts(rows, datasets, Path(args.charts), title):
            print(f"chart {p}")
    return 0
