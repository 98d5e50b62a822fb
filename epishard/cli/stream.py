"""``epishard stream``: stream training windows and report throughput and stages (``stream.report``).

Internal, except ``add_per_episode_arguments`` and ``per_episode_options`` (documented for training
scripts' own parsers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from epishard.cli import show_progress, storage_options
from epishard.redact import redact

__all__ = ["HELP", "add_arguments", "add_per_episode_arguments", "frame_count", "per_episode_options", "run"]

HELP = "stream training windows from a converted dataset; report throughput and stages"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``epishard stream`` arguments."""
    p.add_argument("dataset", metavar="DATASET", help="converted dataset folder or URL")
    p.add_argument("--cameras", help="comma-separated camera names (default: all)")
    p.add_argument("--frames", type=frame_count, default=9, help="frames per camera per window (>= 1)")
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
    add_per_episode_arguments(p)
    p.add_argument("--size", help="resize frames to HxW, e.g. 224x224 (default: as stored)")
    p.add_argument("--float", action="store_true", help="float32 frames in [0, 1] (LeRobot's output)")
    p.add_argument("--batch-size", type=int, default=8, help="samples per batch")
    p.add_argument("--batches", type=int, default=50, help="batches to run (0: one epoch)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--seed", type=int, default=0, help="seed of the epoch plan")
    p.add_argument(
        "--shuffle-episodes",
        type=_pool,
        default="auto",
        metavar="N|auto|all|global",
        help="episodes whose windows are shuffled together in each worker's order: fewer decode each "
        "episode's frames for more windows at once (reuse), more give batches of more episodes (diversity); "
        "auto: the most episodes whose frames fit the frame cache, at most 8 x batch size and at least "
        "the pool that keeps 0.92 of a batch distinct; all: the worker's whole share; 0: read order; "
        "global: every window of the epoch dealt at random to every worker (i.i.d. diversity)",
    )
    p.add_argument(
        "--horizon", type=int, default=256, help="look-ahead: windows per decode chunk (one call per episode camera)"
    )
    p.add_argument(
        "--frame-cache-mb",
        type=int,
        default=548,
        help="look-ahead: decoded frames kept per worker, MiB (Lookahead.frame_cache_bytes)",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON line")
    p.add_argument("--plot", metavar="FILE", help="draw the telemetry into this PNG (default: no plot)")
    storage_options(p)


def _whole(text: str, what: str, minimum: int, others: str = "") -> int:
    """``text`` as an int >= ``minimum``, else ``argparse.ArgumentTypeError`` naming ``what`` it counts."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of {what}{others}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} {what}: must be >= {minimum}")
    return value


def frame_count(text: str) -> int:
    """``--frames``: an int >= 1 (frames per camera per window)."""
    return _whole(text, "frames per camera", 1)


def _pool(text: str) -> int | str | None:
    """``--shuffle-episodes``: an int >= 0, ``auto``, ``all`` (None: the whole share) or ``global``."""
    if text in ("auto", "all", "global"):
        return None if text == "all" else text
    return _whole(text, "episodes", 0, ", 'auto', 'all' or 'global'")


def add_per_episode_arguments(p: argparse.ArgumentParser) -> None:
    """``--per-episode-count N`` / ``--per-episode-fraction F``: windows per episode per epoch.

    Default: every anchor.
    """
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--per-episode-count",
        type=int,
        metavar="N",
        help="windows per episode per epoch, at most all (default: every anchor)",
    )
    group.add_argument(
        "--per-episode-fraction",
        type=float,
        metavar="F",
        help="this share of each episode's windows, in (0, 1] (default: all)",
    )


def per_episode_options(args: argparse.Namespace) -> dict:
    """``WindowSpec`` keywords from ``add_per_episode_arguments``' options."""
    return {"per_episode_count": args.per_episode_count, "per_episode_fraction": args.per_episode_fraction}


def run(args: argparse.Namespace) -> int:
    """Run ``epishard stream``; return the exit status."""
    from epishard.stream.report import StreamRun, render
    from epishard.stream.report import run as stream

    per_episode = per_episode_options(args)
    fields = (f.name for f in dataclasses.fields(StreamRun) if f.name not in per_episode)
    options = StreamRun(**{name: getattr(args, name) for name in fields}, **per_episode)
    report = stream(options, progress=show_progress(args))
    if args.plot:
        from epishard.stream.plots import plot_stream_report

        plot_stream_report(report, args.plot)
        if not args.json:
            print(redact(f"  telemetry plot: {args.plot}"))
    del report["per_step"]
    print(redact(json.dumps(report) if args.json else render(report)))
    return 0
