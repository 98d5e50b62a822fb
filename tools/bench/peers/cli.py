"""Benchmark: epishard's reader side by side with the loaders users would pick instead, in one run.

The command line of ``python tools/bench/bench_peers.py``; what it measures and how: the package
docstring (``tools/bench/peers/__init__.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .charts import charts, require
from .config import (
    DEFAULT,
    FRAMES,
    HORIZON,
    LANCE,
    LEROBOT,
    MIN_EPISODES,
    QUICK,
    SPAN,
    STEP,
    SYSTEMS,
    log,
    shared_dir,
)
from .measure import run_child
from .runs import (
    Dataset,
    find_datasets,
    lance_status,
    peer_status,
    prepare,
    ray_status,
    run_env,
    run_system,
    s3_server,
    setup_peers,
    start_s3,
)
from .summary import LEGEND, headline, markdown, print_tables, summarize
from .zygote import Zygote, zygote_main


def machine() -> dict:
    """The run header: CPU count and model, memory (GiB), host, Python / torch / torchcodec versions."""
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


def epishard_options(pairs: list[str]) -> tuple[dict, list[str]]:
    """``KEY=VALUE`` options (values as Python literals, else strings) split by feature detection into
    ``WindowDataset`` keywords and ``WindowSpec`` fields; the keys this epishard has neither of are
    returned apart (reported and ignored, so one command measures old and new readers alike)."""
    import ast
    import dataclasses
    import inspect

    from epishard.stream import WindowDataset, WindowSpec

    dataset = set(inspect.signature(WindowDataset.__init__).parameters) - {"self", "sources", "spec"}
    spec = {f.name for f in dataclasses.fields(WindowSpec)}
    out: dict = {"dataset": {}, "spec": {}}
    ignored = []
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise SystemExit(f"bench_peers: --epishard-opt {pair!r} is not KEY=VALUE")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        if key in dataset:
            out["dataset"][key] = value
        elif key in spec:
            out["spec"][key] = value
        else:
            ignored.append(key)
    return out, ignored


def parse(argv=None):
    """The ``tools/bench/bench_peers.py`` arguments (``argparse.Namespace``); exits on bad ones (argparse)."""
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
        help=f"comma-separated, from {','.join(SYSTEMS)} (default: {','.join(DEFAULT)})",
    )
    p.add_argument(
        "--quick", action="store_true", help=f"smoke run: 1 s timed, 2 batches, 1 warm-up, systems {','.join(QUICK)}"
    )
    p.add_argument("--seconds", type=float, help="timed region per run, at least (default 10; --quick 1)")
    p.add_argument("--min-batches", type=int, help="timed batches per run, at least (default 5; --quick 2)")
    p.add_argument("--warmup", type=int, help="warm-up batches per run, not timed (default 2; --quick 1)")
    p.add_argument("--rounds", type=int, default=1, help="rounds; systems alternate, order reversed every other round")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--min-episodes",
        type=int,
        default=MIN_EPISODES,
        help="tile v3.0 datasets to at least this many episodes (0: no tiling)",
    )
    p.add_argument(
        "--epishard-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a WindowDataset keyword or WindowSpec field for every epishard system (e.g. shuffle=8); "
        "keys this epishard lacks are reported and ignored",
    )
    p.add_argument(
        "--out", default="docs/bench/peers.jsonl", help="JSON lines: the run, every run's record, summaries, headline"
    )
    p.add_argument("--markdown", default="docs/bench/peers.md", help="the tables as markdown ('' for none)")
    p.add_argument("--charts", default="docs/bench", help="folder for the PNG charts ('' for none; needs matplotlib)")
    p.add_argument(
        "--work",
        default="/tmp/epishard_bench_peers",
        help="tiled datasets and their conversions (kept: a rerun reuses them)",
    )
    p.add_argument("--peers-dir", default=str(shared_dir() / "peers"), help="the LeRobot peers' setup scripts")
    p.add_argument("--setup-peers", action="store_true", help="build both LeRobot peer venvs first (~4 min)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument(
        "--s3-latency-ms",
        type=int,
        help="read every dataset from moto S3 on loopback (its own process) with this latency added per request "
        "(tools/bench/s3server.py): epishard and Lance systems only (the LeRobot and Ray Data loaders read "
        "local folders); the server's bytes sent and CPU seconds are recorded per run",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for every run, peers included",
    )
    p.add_argument(
        "--fresh-process",
        action="store_true",
        help="start a fresh interpreter per run (default: fork each run from a process that imported "
        "torch, torchcodec, ... once; its PSS is added to the run's)",
    )
    p.add_argument("--render", metavar="JSONL", help="only redraw the tables and charts from this --out (or .partial)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    args.systems = args.systems or (QUICK if quick else DEFAULT)
    args.seconds = args.seconds if args.seconds is not None else (1.0 if quick else 10.0)
    args.min_batches = args.min_batches if args.min_batches is not None else (2 if quick else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if quick else 2)
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {list(SYSTEMS)}")
    return args


def _meta(args, started, command, info, systems, ignored, datasets) -> dict:
    return {
        "record": "run",
        "started": started,
        "command": command,
        "machine": info,
        "window": {"frames": FRAMES, "span": SPAN, "offsets": list(range(0, SPAN, STEP)), "action_horizon": HORIZON},
        "batch_size": args.batch_size,
        "workers": args.workers,
        "warmup": args.warmup,
        "seconds_timed": args.seconds,
        "min_batches": args.min_batches,
        "rounds": args.rounds,
        "min_episodes": args.min_episodes,
        "env": args.env,
        "systems": [asdict(s) for s in systems],
        "epishard_options_given": " ".join(args.epishard_opt),
        "epishard_options": args.epishard_options,
        "epishard_options_ignored": ignored,
        "storage": "local disk" if args.s3_latency_ms is None else f"moto S3 on loopback, +{args.s3_latency_ms} ms",
        "datasets": [
            {k: getattr(d, k) for k in ("name", "main", "version", "original", "episodes", "tiles", "decode_limit")}
            for d in datasets
        ],
    }


def render(args, meta: dict, records: list[dict], failures: list[dict]) -> None:
    """Print the tables and write the JSON lines, the markdown and the charts of ``records``."""
    datasets = [Dataset(**d) for d in meta["datasets"]]
    rows = summarize(records, datasets, meta["warmup"] * meta["batch_size"])
    heads = headline(rows, datasets)
    print_tables(rows, heads, datasets)
    print("\n" + LEGEND)
    loads = [r["loadavg_1m"] for r in records] or [os.getloadavg()[0]]
    meta = {**meta, "load_min": min(loads), "load_max": max(loads)}
    print(
        f"\nnoise: 1-min load average during runs {min(loads):.1f}..{max(loads):.1f} on {meta['machine']['cpus']} "
        f"CPUs; total {meta['seconds']:.0f} s"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            for rec in [meta] + [dict(r, record="run_result") for r in records] + rows + heads + failures:
                f.write(json.dumps(rec) + "\n")
        print(f"wrote {args.out}")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(markdown(rows, heads, datasets, meta))
        print(f"wrote {args.markdown}")
    if args.charts:
        title = (
            f"{FRAMES} frames/{SPAN}-frame span, batch {meta['batch_size']}, {meta['workers']} workers; "
            f"{meta['started'][:10]}, {meta['machine']['cpus']} CPUs"
        )
        for p in charts(rows, datasets, Path(args.charts), title):
            print(f"chart {p}")


def rerender(args) -> int:
    """``--render FILE``: the tables, markdown and charts again from a JSON-lines file (a finished
    run's ``--out``, or the ``.partial`` an interrupted run left), without running anything."""
    lines = [json.loads(line) for line in Path(args.render).read_text().splitlines() if line.strip()]
    meta = next(r for r in lines if r["record"] == "run")
    records = [r for r in lines if r["record"] == "run_result"]
    meta.setdefault("seconds", sum(r.get("wall_s", 0.0) for r in records))
    render(args, meta, records, [r for r in lines if r["record"] == "failure"])
    return 0


def main(argv=None) -> int:
    """``tools/bench/bench_peers.py``: run (or ``--render``) the comparison; the exit status."""
    args = parse(argv)
    if args.zygote:
        zygote_main()
        return 0
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))), flush=True)
        return 0
    if args.charts:
        require()  # before any run: a missing matplotlib must not surface after 15 minutes, nor be skipped
    if args.render:
        return rerender(args)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    t_start = time.perf_counter()
    command = "python tools/bench/bench_peers.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.setup_peers:
        setup_peers(args)
    datasets = find_datasets(args)
    if not datasets:
        return 1
    args.epishard_options, ignored = epishard_options(args.epishard_opt)
    if ignored:
        print(f"epishard options NOT supported by this epishard, ignored: {', '.join(ignored)}", flush=True)
    systems = [SYSTEMS[s] for s in args.systems]
    for version, peer in LEROBOT.items():
        missing = peer_status(args, peer)
        if missing and any(s.lerobot == version for s in systems):
            print(f"skip LeRobot {version} peer: {missing}")
            systems = [s for s in systems if s.lerobot != version]
    for version, lance in LANCE.items():
        missing = lance_status(args, lance)
        if missing and any(s.lance == version for s in systems):
            print(f"skip Lance {version} peer: {missing}")
            systems = [s for s in systems if s.lance != version]
    if any(s.kind == "raydata" for s in systems):
        missing = ray_status(args)
        if missing:
            print(f"skip Ray Data peer: {missing}")
            systems = [s for s in systems if s.kind != "raydata"]
    if args.s3_latency_ms is not None:
        from s3server import CREDENTIALS, need_s3

        need_s3()
        os.environ.update(CREDENTIALS)  # before the zygote forks: every child talks to the server
        local_only = [s for s in systems if s.kind not in ("epishard", "lance") or s.ray]
        if local_only:
            print(f"--s3-latency-ms: {', '.join(s.id for s in local_only)} read local folders only: skipped")
            systems = [s for s in systems if s not in local_only]
    elif any(s.presigned for s in systems):
        print("presigned systems read from S3 only (--s3-latency-ms): skipped")
        systems = [s for s in systems if not s.presigned]
    info = machine()
    print(
        f"{started}; {info['cpus']} CPUs ({info['cpu']}), {info['memory_gib']} GiB; torch {info['torch']}, "
        f"torchcodec {info['torchcodec']}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(
        f"window: {FRAMES} frames over {SPAN} (offsets 0,{STEP},...,{SPAN - 1}) per camera, action chunk {HORIZON}, "
        f"batch {args.batch_size}, {args.workers} workers, {args.warmup} warm-up batches, timed >= {args.seconds} s "
        f"and >= {args.min_batches} batches, {args.rounds} rounds; datasets tiled to >= {args.min_episodes} episodes",
        flush=True,
    )
    records: list[dict] = []
    failures: list[dict] = []
    partial = Path(f"{args.out}.partial") if args.out else None
    # The S3 server's process is forked first: forked after the zygote, it would hold the zygote's stdin open.
    server = None if args.s3_latency_ms is None else s3_server(args.s3_latency_ms)
    zygote = None if args.fresh_process else Zygote(run_env(args))
    args.s3 = None
    try:
        prepare(datasets, Path(args.work), args.min_episodes)
        if server is not None:
            args.s3 = start_s3(args, datasets, server)
        meta = _meta(args, started, command, info, systems, ignored, datasets)
        if partial:  # kept as it goes: an interrupted run leaves its finished runs behind (--render it)
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(meta) + "\n")
        for d in datasets:
            plan = systems
            v3_only = ("lerobot", "raydata")  # LeRobot's harness and Ray Data's read_lerobot
            if not d.version.startswith("v3") and any(s.kind in v3_only for s in plan):
                print(f"{d.name}: the LeRobot harness reads v3.0 folders only ({d.version}): peers skipped")
                plan = [s for s in plan if s.kind not in v3_only]
            for r in range(args.rounds):
                for s in plan if r % 2 == 0 else plan[::-1]:
                    try:
                        rec = run_system(args, d, s, seed=r, zygote=zygote)
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:  # one failed run: named, not fatal
                        failures.append({"record": "failure", "dataset": d.name, "system": s.id, "error": str(exc)})
                        print(f"FAILED {d.name} {s.label} round {r + 1}: {str(exc)[-1500:]}", flush=True)
                        continue
                    records.append(rec)
                    if partial:
                        with open(partial, "a") as f:
                            f.write(json.dumps(dict(rec, record="run_result")) + "\n")
                    log(
                        f"  {d.name} round {r + 1}/{args.rounds} {s.label:<22} {rec['samples_per_s']:8.1f} samples/s, "
                        f"diversity {rec['diversity_ratio']:.2f} of i.i.d. (load {rec['loadavg_1m']:.1f})"
                    )
    finally:
        if zygote is not None:
            zygote.close()
        if server is not None:
            server.stop()
    render(args, {**meta, "seconds": time.perf_counter() - t_start}, records, failures)
    if partial:
        partial.unlink(missing_ok=True)
    if failures:
        print(f"{len(failures)} run(s) FAILED: " + ", ".join(f"{f['dataset']} {f['system']}" for f in failures))
    return 1 if failures else 0
