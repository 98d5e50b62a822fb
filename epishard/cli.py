"""The ``epishard`` command: convert, inspect, verify, stream."""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys
import traceback
import warnings

from epishard.shardwriter.convert import ConvertOptions, convert
from epishard.shardwriter.errors import ConversionError, OutputFolderError, SourceError
from epishard.shardwriter.video import ReencodeSpec


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    stem = text.strip().lower().rstrip("b").rstrip("i")
    try:
        return int(float(stem[:-1]) * units[stem[-1]]) if stem and stem[-1] in units else int(stem)
    except ValueError:
        raise ValueError(f"--max-shard-size: {text!r} is not a size in bytes like 512MiB or 1GiB") from None


def _ints(text: str) -> frozenset[int]:
    out: set[int] = set()
    try:
        for part in filter(None, text.split(",")):
            a, _, b = part.partition("-")
            out.update(range(int(a), int(b) + 1) if b else [int(a)])
    except ValueError:
        raise ValueError(f"--episodes: {text!r} is not a list of episode indices like 0-9,12") from None
    return frozenset(out)


def _reencode(text: str) -> ReencodeSpec:
    try:
        return ReencodeSpec.parse(text)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"--reencode {text!r}: {exc} (expected e.g. codec=libx264,gop=10,size=224x224,crf=23)"
        ) from None


def _cmd_convert(args) -> int:
    options = ConvertOptions(
        prefix=args.prefix,
        max_episodes_per_shard=args.max_episodes_per_shard,
        max_bytes_per_shard=_size(args.max_shard_size),
        episodes=_ints(args.episodes) if args.episodes else None,
        cameras=() if args.no_cameras else tuple(args.cameras.split(",")) if args.cameras else None,
        reencode=_reencode(args.reencode) if args.reencode else None,
        on_error=args.on_error,
        timestamps=args.timestamps,
        workers=args.workers,
        progress=not args.quiet,
        overwrite=args.overwrite,
    )
    runner = None
    if args.ray is not None:  # Ray is imported only when asked for
        from epishard.shardwriter.ray_convert import RayRunner

        runner = RayRunner(args.ray or None)
    manifest = convert(args.sources, args.out, options, storage_options=args.storage_options, runner=runner)
    t, report = manifest.totals, manifest.report
    print(f"wrote {t.shards} shards, {t.episodes} episodes, {t.rows} rows, {t.bytes / 1e6:.1f} MB to {args.out}")
    for source in manifest.sources:
        for note in source.notes:
            print(f"  note: {source.name}: {note}")
    for name, cam in manifest.cameras.items():
        if cam.conversion or cam.kind == "depth":
            print(f"  camera {name}: " + (cam.conversion or f"depth, read as uint16 [T, 1, H, W] ({cam.pix_fmt})"))
    for kind, n in report.skipped_by_kind.items():
        print(f"  skipped {n} episode(s): {kind}")
    for kind, n in report.warnings_by_kind.items():
        example = next(w for w in report.warnings if w.kind == kind)
        camera = f" camera {example.camera}" if example.camera else ""
        print(f"  warning x{n} {kind}: e.g. episode {example.episode}{camera}: {example.message}")
    return 0


def _cmd_inspect(args) -> int:
    from epishard.shardwriter.describe import describe, render

    summary = describe(args.root, args.storage_options)
    print(json.dumps(summary, indent=1) if args.json else render(summary))
    return 0


def _cmd_verify(args) -> int:
    from epishard.shardwriter.verify import verify

    result = verify(args.root, decode=not args.no_decode, storage_options=args.storage_options)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"{args.root}: {result['shards']} shards, {result['episodes']} episodes: "
            f"{'OK' if result['ok'] else str(len(result['problems'])) + ' problem(s)'}"
        )
        for p in result["problems"]:
            where = " ".join(f"{k}={p[k]}" for k in ("shard", "episode", "camera") if p.get(k) is not None)
            print(f"  {where}: {p['message']}")
    return 0 if result["ok"] else 1


def _storage_options_json(text: str) -> dict:
    from epishard.shardwriter.storage import parse_storage_options

    try:
        return parse_storage_options(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _storage_option(parser: argparse.ArgumentParser) -> None:
    """The one ``--storage-options`` every command takes (``shardwriter.storage.resolve_storage_options``)."""
    parser.add_argument(
        "--storage-options",
        type=_storage_options_json,
        default=None,
        metavar="JSON",
        help='fsspec options for every URL (s3://, gs://, http(s)://, hf://), e.g. \'{"endpoint_url": '
        '"http://127.0.0.1:9000"}\'; merged over FSSPEC_<PROTOCOL>_<OPTION> environment variables; '
        "clients read their own too (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_PROFILE, HF_TOKEN, ...)",
    )


def build_parser(selected: str | None = "stream") -> argparse.ArgumentParser:
    """The ``epishard`` parser.

    The ``stream`` command's arguments are added only when ``selected`` (the command given) is
    ``"stream"`` (they need torch).
    """
    parser = argparse.ArgumentParser(prog="epishard", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="on an error, print the traceback too")
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="convert LeRobot datasets (v2.0, v2.1, v3.0) into window-indexed tar shards")
    c.add_argument(
        "sources",
        nargs="+",
        metavar="SRC",
        help="LeRobot dataset folders or URLs (s3://, http(s)://, hf://datasets/...)",
    )
    c.add_argument("out", metavar="OUT", help="output folder")
    c.add_argument("--prefix", default="shard", help="shard file prefix (default: shard)")
    c.add_argument("--max-episodes-per-shard", type=int, default=64)
    c.add_argument("--max-shard-size", default="1GiB", help="bytes per shard, e.g. 512MiB (default 1GiB)")
    c.add_argument("--episodes", help="source episode indices to keep, e.g. 0-9,12")
    c.add_argument("--cameras", help="comma-separated camera names to keep (default: all)")
    c.add_argument(
        "--no-cameras",
        action="store_true",
        help="convert state and action only, no camera (needed when no declared camera has video files)",
    )
    c.add_argument(
        "--reencode", help="re-encode videos, e.g. codec=libx264,gop=10,size=224x224,crf=23 (default: copy bit-exact)"
    )
    c.add_argument(
        "--on-error",
        choices=["raise", "skip", "fail"],
        default="raise",
        metavar="{raise,skip}",
        help="bad episode: stop (default) or skip it and count it in the report ('fail': deprecated 'raise')",
    )
    c.add_argument(
        "--timestamps",
        choices=["warn", "raise", "fail"],
        default="warn",
        metavar="{warn,raise}",
        help="timestamps that disagree with the video: report (default) or stop ('fail': deprecated 'raise')",
    )
    c.add_argument("--workers", type=int, default=1, help="parallel processes (default 1)")
    c.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a finished conversion of other sources or options in OUT (refused without it)",
    )
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="write each shard as a task on a Ray cluster (ADDRESS, e.g. 10.0.0.1:6379; alone: RAY_ADDRESS "
        "or this machine's cluster); sources and OUT must be reachable from every node",
    )
    _storage_option(c)
    c.set_defaults(func=_cmd_convert)

    i = sub.add_parser("inspect", help="shards, episodes, frames, cameras, codecs, keyframe intervals, sizes")
    i.add_argument("root", metavar="OUT")
    i.add_argument("--json", action="store_true")
    _storage_option(i)
    i.set_defaults(func=_cmd_inspect)

    v = sub.add_parser("verify", help="re-read every shard; check checksums, index offsets, decoding")
    v.add_argument("root", metavar="OUT")
    v.add_argument("--json", action="store_true")
    v.add_argument("--no-decode", action="store_true", help="skip the per-camera decode check")
    _storage_option(v)
    v.set_defaults(func=_cmd_verify)

    st = sub.add_parser("stream", help="stream training windows from a converted dataset; report throughput and stages")
    if selected == "stream":
        # Only this command loads torch (and its native thread pools): the others start faster and
        # exit with fewer native libraries to tear down.
        from epishard.stream import report

        report.add_arguments(st)
        st.set_defaults(func=report.main)
    _storage_option(st)
    for command in (c, i, v, st):  # `--debug` also after the command
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def _close_progress_bars() -> None:
    """Finish a progress bar an exception left open, so the error starts a line of its own."""
    if "tqdm" in sys.modules:
        from tqdm import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def error_line(exc: BaseException) -> tuple[str, bool]:
    """``(message, expected)`` for an exception reaching the CLI.

    The message is one line naming the thing and the cause. ``expected`` is False for a fault the
    code did not anticipate (a bug to report).
    """
    text = str(exc)
    if "Original Traceback (most recent call last)" in text:
        # Re-raised from a DataLoader worker: the message carries the worker's traceback; its last
        # line is the worker's exception.
        text = [line for line in text.splitlines() if line.strip()][-1]
        return _one_line(re.sub(r"^[\w.]+\.(\w+): ", r"\1: ", text)), True
    if isinstance(exc, (ConversionError, SourceError, OutputFolderError)):
        return _one_line(text), True
    if isinstance(exc, OSError) and exc.filename is not None:
        cause = exc.strerror or text
        if exc.errno == errno.ENOSPC:
            cause += "; nothing half-written was kept: free space and run the same command again to resume"
        return _one_line(f"{exc.filename}: {cause}"), True
    if isinstance(exc, KeyError):  # ours carry a sentence; a bare missing key is a bug
        said = exc.args[0] if exc.args and isinstance(exc.args[0], str) and " " in exc.args[0] else None
        return (_one_line(said), True) if said else (f"KeyError: {text}", False)
    if isinstance(exc, (OSError, ValueError)):  # our own checks and fsspec/s3fs raise these with a message
        return _one_line(text), True
    return _one_line(f"{type(exc).__name__}: {text}"), False


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit status.

    Exit status: 0 done, 1 ``verify`` found damage, 2 an error (one line on stderr,
    ``epishard <command>: error: <thing>: <cause>``; the traceback too with ``--debug``), 130
    interrupted, 141 stdout closed early (a pipe into `head`).
    """
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(next((a for a in argv if not a.startswith("-")), None)).parse_args(argv)
    shown = warnings.formatwarning
    if not args.debug:  # notices (a skipped shard, ...) as one line each, without the source line
        warnings.formatwarning = lambda message, *_, **__: (
            f"epishard {args.command}: warning: {_one_line(str(message).removeprefix('epishard: '))}\n"
        )
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"epishard {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout piped into e.g. `head`, which exited: not a fault of the dataset
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by it
    except Exception as exc:  # every failure a user can meet: one line, the traceback on request
        _close_progress_bars()
        if args.debug:
            traceback.print_exc()
        message, expected = error_line(exc)
        dataset = getattr(args, "root", None) or getattr(args, "dataset", None)  # inspect, verify, stream
        if dataset and dataset not in message:
            message = f"{dataset}: {message}"
        hint = "" if expected or args.debug else " (unexpected: run with --debug for the traceback)"
        print(f"epishard {args.command}: error: {message}{hint}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = shown


if __name__ == "__main__":
    sys.exit(main())
