"""``epishard verify``: re-read every shard and check it (``shardwriter.verify``)."""

from __future__ import annotations

import argparse
import json
import time

from epishard.cli import show_progress, storage_options
from epishard.redact import redact

__all__ = [
    "HELP",
    "add_arguments",
    "run",
]

HELP = "re-read every shard; check checksums, index offsets, decoding (exit 1 on damage)"


def add_arguments(v: argparse.ArgumentParser) -> None:
    """The ``epishard verify`` arguments."""
    v.add_argument("root", metavar="OUT", help="converted dataset folder or URL")
    v.add_argument("--json", action="store_true", help="print the result as JSON")
    v.add_argument(
        "--no-decode", action="store_true", help="skip the per-camera decode check (checksums and offsets only)"
    )
    storage_options(v)


def run(args: argparse.Namespace) -> int:
    """Run ``epishard verify``; return the exit status."""
    from epishard.shardwriter.describe import render_verification
    from epishard.shardwriter.verify import verify

    start = time.perf_counter()
    result = verify(
        args.root, decode=not args.no_decode, storage_options=args.storage_options, progress=show_progress(args)
    )
    if args.json:
        print(redact(json.dumps(result, indent=1)))
    else:
        print(redact(render_verification(result, args.root, time.perf_counter() - start)))
    return 0 if result["ok"] else 1
