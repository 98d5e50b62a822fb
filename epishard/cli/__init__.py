"""The ``epishard`` command: convert, inspect, verify, stream, preview.

The command line stands above the packages: each subcommand is a module here (``epishard.cli.<name>``)
that declares its arguments and makes one call into its package. Nothing here imports torch,
torchcodec, pyarrow, PyAV or numpy at import time, so ``epishard --help`` and argument errors
answer at once; a subcommand imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import re
import sys
import traceback
import warnings

from epishard._version import __version__
from epishard.redact import redact, remember
from epishard.storage_options import parse_storage_options

__all__ = ["COMMANDS", "build_parser", "main", "show_progress", "storage_options"]

# name -> module; each has HELP, add_arguments(parser) and run(args) -> exit status.
COMMANDS = ("convert", "inspect", "verify", "stream", "preview")

log = logging.getLogger("epishard")


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Append ``(default: ...)`` to the help of every option that has a default to show.

    Not for flags, counts, positionals or a ``None`` default, nor where the help already says it.
    (Done on the actions, not by overriding ``ArgumentDefaultsHelpFormatter``'s private hook.)
    """
    for action in parser._actions:
        text = action.help or ""
        nothing = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if "(default" in text or nothing or not action.option_strings or action.nargs == 0 or not text:
            continue
        action.help = text + " (default: %(default)s)"


def _common_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """``-q``, ``-v``, ``--debug`` before the command and after it (the latter do not override the former)."""
    flag_default: object = False if top else argparse.SUPPRESS
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=flag_default,
        help="no progress bars or status lines (drawn only on a terminal; warnings and errors still show)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0 if top else argparse.SUPPRESS,
        help="log what is being done on stderr (-vv: more detail)",
    )
    parser.add_argument(
        "--debug", action="store_true", default=flag_default, help="on an error, print the traceback too"
    )


def _storage_options_json(text: str) -> dict:
    try:
        return parse_storage_options(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def storage_options(parser: argparse.ArgumentParser) -> None:
    """``--storage-options JSON``: fsspec options for URLs, shared by every subcommand that opens data.

    ``epishard.format.storage.resolve_storage_options`` merges them over the environment.
    """
    parser.add_argument(
        "--storage-options",
        type=_storage_options_json,
        default=None,
        metavar="JSON",
        help='fsspec options for every URL (s3://, gs://, http(s)://, hf://), e.g. \'{"endpoint_url": '
        '"http://127.0.0.1:9000"}\' (default: none); merged over FSSPEC_<PROTOCOL>_<OPTION> environment '
        "variables; clients read their own too (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_PROFILE, HF_TOKEN, ...)",
    )


def show_progress(args: argparse.Namespace) -> bool:
    """Whether to draw progress bars and live status lines: on a terminal, unless ``-q``.

    A log file or a pipe gets only the summary, warnings and errors; ``-v`` logs the status lines there.
    """
    return not args.quiet and sys.stderr.isatty()


def build_parser() -> argparse.ArgumentParser:
    """The ``epishard`` parser with every subcommand (importing only the light ``epishard.cli`` modules)."""
    parser = argparse.ArgumentParser(
        prog="epishard",
        description="Window-indexed WebDataset shards and a streaming window reader for robot-learning episodes.",
        allow_abbrev=False,  # an option is its whole name: `--max-episodes 2` is not --max-episodes-per-shard
    )
    parser.add_argument("--version", action="version", version=f"epishard {__version__}")
    _common_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"epishard.cli.{name}")
        command = sub.add_parser(name, help=module.HELP, description=module.HELP, allow_abbrev=False)
        module.add_arguments(command)
        _common_options(command, top=False)
        _show_defaults(command)
        command.set_defaults(func=module.run)
    return parser


def _close_progress_bars() -> None:
    """Finish a progress bar an exception left open, so the error starts a line of its own."""
    if "tqdm" in sys.modules:
        from tqdm import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _is_writer_error(exc: BaseException) -> bool:
    # Checked through sys.modules: an error of these kinds can only exist once its module is loaded,
    # and importing it here would load the writer (pyarrow) for every error.
    errors = sys.modules.get("epishard.shardwriter.errors")
    return errors is not None and isinstance(
        exc, (errors.ConversionError, errors.SourceError, errors.OutputFolderError)
    )


def error_line(exc: BaseException) -> tuple[str, bool]:
    """``(message, expected)`` for an exception reaching the CLI: one line naming the thing and the cause.

    ``expected`` is False for a fault the code did not anticipate (a bug to report).
    """
    text = str(exc)
    if "Original Traceback (most recent call last)" in text:
        # Re-raised from a DataLoader worker: the message carries the worker's traceback; its last
        # line is the worker's exception.
        text = [line for line in text.splitlines() if line.strip()][-1]
        return _one_line(re.sub(r"^[\w.]+\.(\w+): ", r"\1: ", text)), True
    if _is_writer_error(exc):
        return _one_line(text), True
    if isinstance(exc, OSError) and exc.filename is not None:
        cause = exc.strerror or text
        if exc.errno == errno.ENOSPC:
            cause += "; nothing half-written was kept: free space and run the same command again to resume"
        return _one_line(f"{exc.filename}: {cause}"), True
    if isinstance(exc, KeyError):  # ours carry a sentence; a bare missing key is a bug
        said = exc.args[0] if exc.args and isinstance(exc.args[0], str) and " " in exc.args[0] else None
        return (_one_line(said), True) if said else (f"KeyError: {text}", False)
    if isinstance(exc, (OSError, ValueError, ImportError)):  # our checks, fsspec/s3fs, an optional package
        return _one_line(text), True
    return _one_line(f"{type(exc).__name__}: {text}"), False


class _RedactingFormatter(logging.Formatter):
    """Log lines with credentials redacted (``epishard.redact``)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class _LogHandler(logging.StreamHandler):
    """Writes log lines above a running progress bar (through tqdm) instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        if "tqdm" not in sys.modules:
            return super().emit(record)
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


def _setup_logging(args: argparse.Namespace) -> None:
    """``-v``: INFO of the epishard loggers on stderr; ``-vv``: DEBUG; otherwise warnings only."""
    level = logging.WARNING if not args.verbose else logging.INFO if args.verbose == 1 else logging.DEBUG
    handler = _LogHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter(f"epishard {args.command}: %(message)s"))
    for handler_before in list(log.handlers):
        log.removeHandler(handler_before)
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False


def _remember_secrets(args: argparse.Namespace) -> None:
    """Let ``redact`` mask the credentials of every URL and storage option on the command line.

    Everything the CLI prints (results, log lines, warnings, errors, tracebacks) goes through
    ``redact``; remembering them here covers a client's error that quotes a secret outside a URL.
    """
    urls = list(getattr(args, "sources", None) or ())
    urls += [getattr(args, name, None) for name in ("out", "root", "dataset")]
    for url in urls:
        if isinstance(url, str):
            remember(url)
    remember(options=getattr(args, "storage_options", None))


def main(argv: list[str] | None = None) -> int:
    """Run the CLI.

    Exit status: 0 done, 1 ``verify`` found damage, 2 an error (one line on stderr, ``epishard
    <command>: error: <thing>: <cause>``; the traceback too with ``--debug``), 130 interrupted, 141
    stdout closed early (a pipe into `head`). Credentials of URLs and storage options are redacted
    from everything it prints (``epishard.redact``).
    """
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    _remember_secrets(args)
    _setup_logging(args)
    shown = warnings.formatwarning
    if args.debug:
        warnings.formatwarning = lambda *a, **k: redact(shown(*a, **k))
    else:  # notices (a skipped shard, ...) as one line each, without the source line
        warnings.formatwarning = lambda message, *_, **__: redact(
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
            print(redact(traceback.format_exc()), end="", file=sys.stderr)
        message, expected = error_line(exc)
        message = redact(message)
        dataset = getattr(args, "root", None) or getattr(args, "dataset", None)  # inspect, verify, stream, preview
        if dataset and redact(dataset) not in message:
            message = f"{redact(dataset)}: {message}"
        hint = "" if expected or args.debug else " (unexpected: run with --debug for the traceback)"
        print(f"epishard {args.command}: error: {message}{hint}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = shown
