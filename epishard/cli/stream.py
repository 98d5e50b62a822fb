"""``epishard stream``: stream training windows and report throughput and stages (``stream.report``)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from epishard.cli import show_progress

HELP = "stream training windows from a converted dataset; report throughput and stages"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", metavar="DATASET", help="converted dataset folder or URL")
    p.add_argument("--cameras", help="comma-separated camera names (default: all)")
    p.add_argument("--frames", type=int, default=9, help="frames per camera per window")
    p.add_argument("--span", type=int, default=33, help="rows the frames spread over, from the anchor")
    p.add_argument("--state-history", type=int, default=1, help="state rows, ending at the anchor")
    p.add_argument("--action-horizon", type=int, default=16, help="action rows from the anchor (the action chunk)")
    p.add_argument(
        "--boundary",
        choices=["inside", "pad"],
        default="inside",
        help="inside: only windows that fit in the episode; pad: every anchor, edge rows repeated and flagged",
    )
    p.add_argument("--stride", type=int, default=1, help="anchors every STRIDE rows")
    p.add_argument(
        "--per-episode",
        type=float,
        help="windows per episode per epoch: a fraction (<=1) or a count (default: every anchor)",
    )
    p.add_argument("--size", help="resize frames to HxW, e.g. 224x224 (default: as stored)")
    p.add_argument("--float", action="store_true", help="float32 frames in [0, 1] (LeRobot's output)")
    p.add_argument("--batch-size", type=int, default=8, help="samples per batch")
    p.add_argument("--batches", type=int, default=50, help="batches to run (0: one epoch)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--seed", type=int, default=0, help="seed of the epoch plan")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line")
    p.add_argument("--plot", metavar="FILE", help="draw the telemetry into this PNG (default: no plot)")


def run(args: argparse.Namespace) -> int:
    from epishard.stream.report import StreamRun, render
    from epishard.stream.report import run as stream

    options = StreamRun(**{f.name: getattr(args, f.name) for f in dataclasses.fields(StreamRun)})
    report = stream(options, progress=show_progress(args))
    if args.plot:
        from epishard.stream.plots import plot_stream_report

        plot_stream_report(report, args.plot)
        if not args.json:
            print(f"  telemetry plot: {args.plot}")
    del report["per_step"]
    print(json.dumps(report) if args.json else render(report))
    return 0
