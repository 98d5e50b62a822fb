"""What a source written by a stranger may claim, and where it may point: checked before anything is read.

A source's files state sizes (rows, shapes, dtypes, decompressed lengths, time spans, episode
counts) and may name other files (HDF5 external storage, external links and virtual datasets;
symbolic links inside a Zarr or TFDS folder). A reader trusts none of it:

- **Bounded before allocation.** ``check_count`` / ``check_bytes`` compare a claim with a limit
  (``MAX_ROWS``, ``MAX_ARRAY_BYTES``, ``MAX_FRAME_BYTES``, ``MAX_EPISODES``, ``MAX_SPAN_S``,
  ``MAX_RECORD_BYTES``, ``MAX_VALUES``) before the memory is asked for; a claim beyond it is a
  ``ConversionError(kind="too_large")`` naming file and key (an episode's: ``--on-error skip``
  skips and counts it), or a ``SourceError`` when the source as a whole is refused at open. The
  limits are module constants (tests lower them); each is far above what real recorders write.
- **Nothing outside the source is read.** ``confine`` accepts a local path only when it resolves
  (symbolic links followed) inside the source's folder and is a regular file: a FIFO, a device,
  ``/proc`` or ``/sys`` is refused from ``stat`` alone, never opened. ``check_local_file`` checks a
  file the source lists itself (``source_files``). Formats that can name other files refuse them
  at open unless ``SourceOptions.allow_external`` is set for a trusted local source, and even then
  only regular files are read (``check_external_target``).
- **Every failure is named.** ``reading`` wraps a library's own exception (h5py, zarr, numcodecs,
  mcap, protobuf decoding; ``MemoryError``; ``RecursionError``) raised while one episode is read as
  a ``ConversionError(kind="unreadable_file")`` naming file and key, so ``--on-error skip`` applies
  and no episode fails as ``[internal]``.
- **Types.** ``check_numeric`` refuses text, bytes or objects where numbers are mapped.

Internal: import from ``epishard.shardwriter.sources``.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

import numpy as np

from ..errors import ConversionError, SourceError

MAX_ROWS = 10_000_000  # rows of one episode (a 1 kHz topic for 2.7 hours)
MAX_ARRAY_BYTES = 2 << 30  # bytes of one array read whole into memory (an episode's column)
MAX_FRAME_BYTES = 256 << 20  # bytes of one camera frame (an 8K RGB frame is 100 MB)
MAX_EPISODES = 10_000_000  # episodes one source may list
MAX_SPAN_S = 7 * 24 * 3600.0  # seconds one episode may span (MCAP: the row clock is allocated over it)
MAX_RECORD_BYTES = 2 << 30  # bytes of one record (a TFRecord record: one RLDS episode; an MCAP chunk decompressed)
MAX_VALUES = 256 << 20  # values of one feature in one record (2^28: 1 GiB of float32)

# Paths whose files are the machine's, not a dataset's: refused even when a link is allowed.
SPECIAL_ROOTS = ("/proc", "/sys", "/dev")

__all__ = [
    "MAX_ARRAY_BYTES",
    "MAX_EPISODES",
    "MAX_FRAME_BYTES",
    "MAX_RECORD_BYTES",
    "MAX_ROWS",
    "MAX_SPAN_S",
    "MAX_VALUES",
    "SPECIAL_ROOTS",
    "check_bytes",
    "check_count",
    "check_external_target",
    "check_local_file",
    "check_numeric",
    "confine",
    "reading",
    "source_folder",
    "too_large",
]


def too_large(what: str, claimed: float, limit: float, where: str, key: str | None = None) -> ConversionError:
    """The error for a claim beyond a limit: ``ConversionError(kind="too_large")`` naming file and key."""
    at = f" {key!r}" if key else ""
    return ConversionError(
        f"{at.strip() + ': ' if at else ''}{what} {claimed:g} is more than the {limit:g} a source may claim "
        "(epishard.shardwriter.sources.bounds); refused before reading",
        kind="too_large",
        path=where,
    )


def check_count(what: str, claimed: float, limit: float, where: str, key: str | None = None) -> None:
    """Refuse ``claimed`` (rows, episodes, values, seconds) above ``limit``, or negative or not finite.

    Raises:
        ConversionError(kind="too_large"): naming ``where`` (the file) and ``key``.
    """
    if not np.isfinite(claimed) or claimed < 0 or claimed > limit:
        raise too_large(what, float(claimed), float(limit), where, key)


def check_bytes(
    shape: tuple[int, ...], itemsize: int, where: str, key: str | None = None, limit: int | None = None
) -> int:
    """The bytes an array of ``shape`` and ``itemsize`` takes, refused above ``limit`` (``MAX_ARRAY_BYTES``).

    Computed in Python integers (no overflow for a forged shape). Returns the byte count.

    Raises:
        ConversionError(kind="too_large"): naming ``where`` and ``key``, with the shape.
    """
    limit = MAX_ARRAY_BYTES if limit is None else limit
    total = int(itemsize)
    for n in shape:
        total *= int(n)
    if total > limit or any(int(n) < 0 for n in shape):
        raise too_large(f"an array of shape {list(shape)} x {itemsize} bytes =", total, limit, where, key)
    return total


def check_numeric(dtype, where: str, key: str) -> None:
    """Refuse a mapped array whose dtype is not numbers (bool, int, uint, float).

    Raises:
        ConversionError(kind="bad_feature"): text, bytes, objects, compound records, naming file and key.
    """
    dt = np.dtype(dtype)
    dt = dt.subdtype[0] if dt.subdtype is not None else dt  # a fixed-size array of numbers per row
    if dt.kind not in "biuf" or dt.fields is not None:
        raise ConversionError(
            f"{key!r} holds {dt} (not numbers); a state, action or column must be numbers",
            kind="bad_feature",
            path=where,
        )


def _special(real: str) -> bool:
    return any(real == r or real.startswith(r + os.sep) for r in SPECIAL_ROOTS)


def check_local_file(path: str, where: str | None = None, error: type[Exception] = SourceError) -> None:
    """Refuse a local file that is not a regular file (FIFO, device, socket) or lies in ``/proc``, ``/sys``, ``/dev``.

    Decided from ``stat`` (links followed), before the file is opened: a FIFO's writer never sees it
    opened. Raises ``error`` naming the path (and ``where``).
    """
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise _error(error, f"{path}: cannot be read ({exc.strerror})", where) from None
    if _special(real) or not stat.S_ISREG(st.st_mode):
        kind = "a special file" if _special(real) else _file_kind(st.st_mode)
        raise _error(error, f"{path}: resolves to {real}, {kind}, not a regular file: refused unread", where)


def source_folder(root: str) -> str:
    """The folder a local source's files must resolve inside: ``root``'s (resolved), or its Hub cache repository.

    A snapshot of the Hugging Face hub cache (``.../datasets--<org>--<name>/snapshots/<revision>``)
    holds its files as symbolic links to ``../../blobs/<hash>``: for such a root the bound is the
    repository's cache folder (``datasets--<org>--<name>``), which holds both.
    """
    real = os.path.realpath(root if os.path.isdir(root) else os.path.dirname(root) or ".")
    parent, revision = os.path.split(real)
    repo, snapshots = os.path.split(parent)
    if revision and snapshots == "snapshots" and os.path.basename(repo).startswith(("datasets--", "models--")):
        return repo
    return real


def confine(path: str, root: str, where: str, error: type[Exception] = SourceError) -> str:
    """``path`` (absolute, or relative to ``root``'s folder), resolved, when inside ``root`` and a regular file.

    ``root``: the source's folder (or file: its folder is the bound; ``source_folder``: a Hub cache
    snapshot's repository folder). Symbolic links are followed before the check, so a link inside
    the folder to ``/etc/passwd`` is refused as ``../..`` is.

    Raises:
        ``error`` (SourceError by default): the target lies outside the source, or is not a regular
            file (``check_local_file``), naming ``where``, the path and where it resolves.
    """
    base = source_folder(root)
    real = os.path.realpath(os.path.join(root if os.path.isdir(root) else os.path.dirname(root) or ".", path))
    if os.path.commonpath([base, real]) != base:
        raise _error(error, f"{path!r} resolves to {real}, outside the source folder {base}: refused unread", where)
    check_local_file(real, where, error)
    return real


def check_external_target(target: str, where: str, allow: bool, error: type[Exception] = SourceError) -> None:
    """Decide whether a file a source names (external storage, an external link) may be read.

    Without ``allow`` (``SourceOptions.allow_external``) every named file is refused; with it, a
    regular local file is read, a special file never (``check_local_file``).

    Raises:
        ``error``: naming ``where`` (file and key) and the target, with how to allow it.
    """
    if not allow:
        raise _error(
            error,
            f"names a file outside itself ({target!r}): refused unread (a dataset from elsewhere could read "
            "this machine's files this way); for a trusted local source pass --allow-external",
            where,
        )
    check_local_file(target, where, error)


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def _error(error: type[Exception], message: str, where: str | None) -> Exception:
    text = f"{where}: {message}" if where and not message.startswith(str(where)) else message
    if error is ConversionError:
        return ConversionError(message, kind="outside_source", path=where)
    return error(text)


@contextlib.contextmanager
def reading(where: str, key: str | None = None) -> Iterator[None]:
    """Turn a library's exception raised while one episode is read into a named, skippable error.

    ``ConversionError`` and ``SourceError`` pass through; ``KeyboardInterrupt`` and ``SystemExit``
    too. Anything else (h5py's ``OSError``, zarr's and numcodecs' errors, ``MemoryError``,
    ``RecursionError``, a ``ValueError`` from a damaged record) becomes
    ``ConversionError(kind="unreadable_file")`` naming ``where`` (file and group) and ``key``, with
    the library's class and message.
    """
    try:
        yield
    except (ConversionError, SourceError):
        raise
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        if len(detail) > 500:  # a library may put a whole buffer in its message
            detail = detail[:500] + "..."
        raise ConversionError(
            f"cannot read{f' {key!r}' if key else ''} ({detail})", kind="unreadable_file", path=where
        ) from exc
