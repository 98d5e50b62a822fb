"""``epishard inspect``: what a converted dataset holds, from its manifest and indexes (``shardwriter.describe``)."""

from __future__ import annotations

import argparse
import json

from epishard.cli import show_progress, storage_options
from epishard.redact import redact

__all__ = [
    "HELP",
    "add_arguments",
    "run",
]

HELP = "shards, episodes, frames, cameras, codecs, keyframe intervals, sizes, columns, streams at their own rate"


def add_arguments(i: argparse.ArgumentParser) -> None:
    """The ``epishard inspect`` arguments."""
    i.add_argument("root", metavar="OUT", help="converted dataset folder")
    i.add_argument("--json", action="store_true", help="print the summary as JSON")
    storage_options(i)


def run(args: argparse.Namespace) -> int:
    """Run ``epishard inspect``; return the exit status."""
    from epishard.shardwriter.describe import describe, render

    summary = describe(args.root, args.storage_options, progress=show_progress(args))
    print(redact(json.dumps(summary, indent=1) if args.json else render(summary)))
    return 0
