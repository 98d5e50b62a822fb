r"""Metadata from outside, read within bounds: JSON of capped size and depth, text safe for a terminal.

A dataset's ``manifest.json``, a LeRobot ``meta/info.json`` or ``meta/*.jsonl`` comes from a shared
folder or a bucket, so its size and nesting are the writer's choice, not ours:

- ``check_size``: a file larger than ``MAX_JSON_BYTES`` is refused from the size the file system
  (or the bucket's listing) states, before a byte of it is read;
- ``loads``: a JSON document is parsed only if it has at most ``MAX_JSON_BYTES`` bytes, and
  refused when it nests deeper than ``MAX_JSON_DEPTH`` arrays and objects (a 10^6-deep
  document would otherwise stop Python's parser with a ``RecursionError`` naming no file);
- ``printable``: control characters (terminal escape sequences, carriage returns, bidirectional
  overrides) in a string shown to a person are written as escapes (``\x1b``), never sent raw.

Each refusal raises the caller's error type (``FormatError`` for a dataset's files,
``SourceError`` for a source's) with a message naming the file.

Internal: import from ``epishard.format``.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

MAX_JSON_BYTES = 256 << 20  # a metadata file's size at most (manifest.json, info.json, a .jsonl file)
MAX_JSON_DEPTH = 64  # arrays and objects nested in one another at most (real metadata nests < 10)

__all__ = ["MAX_JSON_BYTES", "MAX_JSON_DEPTH", "check_size", "loads", "printable", "read_local"]


def check_size(size: int | None, where: str, error: type[Exception] = ValueError, limit: int = MAX_JSON_BYTES) -> None:
    """Refuse a metadata file of ``size`` bytes (None: unknown, not refused) when it exceeds ``limit``.

    Called with the size the file system states, before the file is read.

    Raises:
        error: "<where>: <size> bytes, more than the <limit> a metadata file may have".
    """
    if size is not None and size > limit:
        raise error(
            f"{where}: {size} bytes, more than the {limit} bytes a metadata file may have "
            "(epishard.format.untrusted.MAX_JSON_BYTES): refused unread"
        )


def read_local(path: str, where: str, error: type[Exception] = ValueError, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of local file ``path``, refused unread when it holds more than ``limit`` bytes.

    The size is taken from the open file (``fstat``), and at most ``limit + 1`` bytes are read, so
    a file growing meanwhile is refused too. A path that is not a regular file (a FIFO, whose open
    would wait for a writer; a device; a folder) or that resolves into ``/proc``, ``/sys`` or
    ``/dev`` is refused from ``stat``, before it is opened.

    Raises:
        error: the file is too large (``check_size``), or not a regular file. OSError: it does not open.
    """
    real = os.path.realpath(path)
    mode = os.stat(real).st_mode
    if not stat.S_ISREG(mode) or any(real == r or real.startswith(r + "/") for r in ("/proc", "/sys", "/dev")):
        raise error(f"{where}: resolves to {real}, not a regular file of a dataset: refused unread")
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK)  # (a FIFO swapped in since the stat: not waited on)
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as f:
        check_size(os.fstat(f.fileno()).st_size, where, error, limit)
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise error(f"{where}: not a regular file: refused unread")
        data = f.read(limit + 1)
    check_size(len(data), where, error, limit)
    return data


def loads(
    data: bytes | str,
    where: str,
    error: type[Exception] = ValueError,
    max_depth: int = MAX_JSON_DEPTH,
    max_bytes: int = MAX_JSON_BYTES,
) -> Any:
    """The JSON document in ``data``, parsed within bounds.

    ``data``: UTF-8 bytes or text of at most ``max_bytes`` bytes (characters for text); arrays and
    objects nested at most ``max_depth`` deep (``[]`` is depth 1). ``where`` names the file (and
    line) in messages.

    Raises:
        error: "<where>: not valid JSON (...)" (also bytes that are not UTF-8), "<where>: nested
            deeper than <max_depth> levels", or too many bytes (``check_size``).
    """
    check_size(len(data), where, error, max_bytes)
    try:
        obj = json.loads(data)
    except RecursionError:  # deeper than Python's parser goes: far deeper than max_depth
        raise error(f"{where}: arrays and objects nested deeper than {max_depth} levels: refused") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise error(f"{where}: not valid JSON ({exc})") from None
    if _deeper_than(obj, max_depth):
        raise error(f"{where}: arrays and objects nested deeper than {max_depth} levels: refused")
    return obj


def _deeper_than(obj: Any, limit: int) -> bool:
    """Whether a parsed document nests more than ``limit`` arrays/objects (iterative: no recursion)."""
    stack = [(obj, 1)] if isinstance(obj, (list, dict)) else []
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        for child in value.values() if isinstance(value, dict) else value:
            if isinstance(child, (list, dict)):
                stack.append((child, depth + 1))
    return False


# C0 controls (ESC, CR, BEL, ...), DEL, C1 controls (CSI 0x9b), and the invisible bidirectional
# marks and overrides that reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    r"""``text`` with each control character written as its Python escape (``\x1b``, ``\n``, ``\u202e``).

    For strings from a manifest or index (camera, shard, source names, messages) printed to a
    terminal: nothing in them can move the cursor, recolour, retitle or rewrite what is shown.
    """
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
