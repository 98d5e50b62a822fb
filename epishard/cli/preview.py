"""``epishard preview``: look at windows of a converted dataset in a browser (``stream.preview``).

Internal: the command line's own module (``epishard.cli``).
"""

from __future__ import annotations

import argparse

from epishard.cli import show_progress, storage_options
from epishard.cli.convert import parse_episodes
from epishard.cli.stream import frame_count
from epishard.redact import redact

__all__ = ["HELP", "add_arguments", "run", "stream_window_size"]

HELP = (
    "an HTML page and PNG contact sheets of training windows: frames, pad masks, state/action curves, "
    "streams at their own rate"
)


_PAGE_FRAMES, _PAGE_SPAN = 6, 30  # the page's own window: frames over the span ending at the anchor
_STREAM_FRAMES, _STREAM_SPAN = 9, 33  # `epishard stream`'s defaults (epishard.cli.stream)


def stream_window_size(frames: int | None, span: int | None) -> tuple[int, int]:
    """(frames, span) of the ``--window stream`` / ``--rrd`` window: ``epishard stream``'s defaults where not given.

    A span not given is the shortest one from ``_STREAM_SPAN`` on that the frames spread evenly over
    (``segment`` needs ``(span - 1) % (frames - 1) == 0``): 6 frames take 36 rows, 9 take 33.
    """
    frames = _STREAM_FRAMES if frames is None else frames
    if span is None:
        span = _STREAM_SPAN
        while frames > 1 and (span - 1) % (frames - 1):
            span += 1
    return frames, span


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``epishard preview`` arguments."""
    p.add_argument("dataset", metavar="OUT", help="converted dataset folder or URL")
    p.add_argument("--episodes", metavar="LIST", help="source episode indices to show, e.g. 0-9,12 (default: all)")
    p.add_argument("--windows", type=int, default=8, help="windows to show")
    p.add_argument("--cameras", metavar="NAMES", help="comma-separated camera names (default: all)")
    p.add_argument(
        "--frames",
        type=frame_count,
        help=f"frames per camera per window (>= 1; default: {_PAGE_FRAMES}; the --window stream and --rrd window: "
        f"{_STREAM_FRAMES}, as `epishard stream`)",
    )
    p.add_argument(
        "--span",
        type=int,
        help=f"rows the frames spread over, ending at the anchor (default: {_PAGE_SPAN}; the --window stream and "
        f"--rrd window: {_STREAM_SPAN} as `epishard stream`, or the next longer span the frames spread evenly over)",
    )
    p.add_argument("--action-horizon", type=int, default=16, help="action rows drawn from the anchor on")
    p.add_argument(
        "--streams",
        metavar="NAMES",
        help="comma-separated streams at their own rate to draw, each sample at its own time over the window's "
        "rows in seconds (default: every stream the dataset has)",
    )
    p.add_argument(
        "--window",
        choices=("preview", "stream"),
        default="preview",
        help="preview: frames over the span ending at the anchor, state over it; stream: the window `epishard "
        "stream` trains on with the same --frames/--span/--action-horizon/--state-history/--boundary/--stride "
        "(frames from the anchor on)",
    )
    p.add_argument("--state-history", type=int, default=1, help="state rows up to the anchor (--window stream)")
    p.add_argument("--boundary", choices=("inside", "pad"), default="pad", help="window boundary (--window stream)")
    p.add_argument("--stride", type=int, default=1, help="anchor every N rows (--window stream)")
    p.add_argument("--seed", type=int, default=0, help="seed of the window choice")
    p.add_argument("--out", default="preview.html", metavar="HTML", help="the HTML page to write (images inlined)")
    p.add_argument(
        "--sheets",
        metavar="DIR",
        help="folder for the PNG contact sheets, one per window (default: next to the page, <page>_sheets)",
    )
    p.add_argument(
        "--rrd",
        metavar="FILE",
        help="also write training windows to a Rerun recording (.rrd, for the Rerun viewer): the --window stream "
        "window from the same options (needs rerun-sdk: pip install 'epishard[rerun]'; default: none)",
    )
    storage_options(p)


def _names(value: str | None) -> list[str] | None:
    """``--streams``' names (None when not given: every stream)."""
    return None if value is None else [n for n in (v.strip() for v in value.split(",")) if n]


def run(args: argparse.Namespace) -> int:
    """Run ``epishard preview``; return the exit status."""
    from epishard.stream.preview import preview

    spec = None
    if args.window == "stream" or args.rrd:
        from epishard.stream.report import dataset_columns, stream_spec
        from epishard.stream.source import DatasetSource

        source = DatasetSource(args.dataset, args.storage_options)
        cams = args.cameras.split(",") if args.cameras else source.cameras
        frames, span = stream_window_size(args.frames, args.span)
        spec = stream_spec(
            cams,
            frames,
            span,
            args.action_horizon,
            args.state_history,
            args.boundary,
            args.stride,
            columns=dataset_columns(source),
        )
    result = preview(
        args.dataset,
        args.out,
        episodes=parse_episodes(args.episodes) if args.episodes else None,
        windows=args.windows,
        cameras=args.cameras.split(",") if args.cameras else None,
        frames=_PAGE_FRAMES if args.frames is None else args.frames,
        span=_PAGE_SPAN if args.span is None else args.span,
        action_horizon=args.action_horizon,
        seed=args.seed,
        sheets=args.sheets,
        storage_options=args.storage_options,
        progress=show_progress(args),
        spec=spec if args.window == "stream" else None,
        streams=_names(args.streams),
    )
    if args.rrd:
        from epishard.stream.preview import export_rerun

        assert spec is not None
        rerun = export_rerun(
            args.dataset,
            args.rrd,
            spec,
            episodes=parse_episodes(args.episodes) if args.episodes else None,
            windows=args.windows,
            seed=args.seed,
            storage_options=args.storage_options,
            streams=_names(args.streams),
        )
        shown = f"{len(rerun.shown)} training windows in the Rerun recording {rerun.rrd}"
        print(redact(f"{shown} (open it with: rerun {rerun.rrd})"))
    print(
        redact(
            f"{args.dataset}: {result.windows} windows of {result.episodes} episodes: {result.html} "
            f"and {len(result.sheets)} contact sheets in {result.sheets_dir}"
        )
    )
    return 0
