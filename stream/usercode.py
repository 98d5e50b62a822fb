"""The user's code inside the reader (a ``PostProcess`` hook, a cost, order or deal stage), told apart from data faults.

The reader turns a damaged shard or an undecodable video into a counted skip when
``FetchPolicy(on_shard_error="skip")`` says so. An exception raised by the user's own code is not a data
fault: it reaches the caller with its own type and traceback (in the main process too, through the
DataLoader's re-raise of a worker's exception), with a note naming the hook or stage it came from.
``call_user`` runs such code and marks what it raises; the decode paths re-raise a marked exception
unchanged instead of wrapping it in a ``DecodeError``.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["UserCodeError", "call_user", "describe", "from_user_code"]

T = TypeVar("T")

_MARK = "_epishard_user_code"


def describe(fn: object) -> str:
    """A short name of a user callable, for messages: its qualified name, else its type's."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}.{name}" if module and module != "builtins" else str(name)


def _mark(exc: BaseException, what: str) -> BaseException:
    """Mark ``exc`` as raised by the user's code ``what`` (once) and add a note naming it; returns ``exc``."""
    if getattr(exc, _MARK, None) is None:
        with contextlib.suppress(AttributeError):  # a type with __slots__: the note still names the hook
            setattr(exc, _MARK, what)
        note = (
            f"epishard: raised by {what} (your code, not a data fault: FetchPolicy(on_shard_error=...) "
            "does not apply to it)"
        )
        add = getattr(exc, "add_note", None)  # Python >= 3.11; tracebacks print the notes
        if add is not None:
            add(note)
        else:
            with contextlib.suppress(AttributeError):
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
    return exc


def from_user_code(exc: BaseException) -> str | None:
    """The user's code ``exc`` was raised by (``_mark``), or None for any other exception."""
    return getattr(exc, _MARK, None)


def call_user(what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``; an ``Exception`` it raises is marked as the user's (``_mark``) and re-raised unchanged.

    ``what``: the hook or stage, e.g. ``"PostProcess.hook my_module.jitter"``.

    Raises:
        UserCodeError: ``fn`` raised ``StopIteration`` (chained): raised on, it would end the
            reader's iteration, or the DataLoader's, silently, as if the epoch were over.
    """
    try:
        return fn(*args)
    except StopIteration as exc:
        raise UserCodeError(f"{what} raised StopIteration: {exc!r}", what) from exc
    except Exception as exc:
        _mark(exc, what)
        raise


class UserCodeError(ValueError):
    """The user's code returned something the reader cannot use (a wrong type, dtype or shape; not a permutation).

    Raised in place of a later, unrelated failure; marked as the user's (``from_user_code``), so the
    shard policy never turns it into a skip.
    """

    def __init__(self, message: str, what: str = ""):
        super().__init__(message)
        if what:
            _mark(self, what)
