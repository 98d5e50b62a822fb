"""The contract's errors, and the check of an option value against its allowed values.

Nothing here imports another module of the contract, so every module of it (and writer, reader
and balancing) can raise these without an import cycle:

- ``FormatError``: a dataset's file (manifest, index, a member) breaks the format; the message
  names the file and the field (and, for the index, the row, episode key and camera);
- ``VideoError``: a video file or member holds no stream of frames the decoder glue
  (``epishard.format.decoder``) can use; the writer reports it as its own
  ``ConversionError(kind="unreadable_video")``;
- ``check_choice``: an option's value is one of the allowed ones (``ValueError`` naming the option),
  with the deprecated spellings of error policies (``"fail"`` -> ``"raise"``) accepted with a warning.

Internal: import from ``epishard.format``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Literal, get_args

from epishard.redact import redact

__all__ = ["DEPRECATED_POLICIES", "ERROR_POLICIES", "ErrorPolicy", "FormatError", "VideoError", "check_choice"]

# What to do about a bad input, in every option of writer and reader that decides it: stop with an
# error ("raise"), leave the input out and count it ("skip"), or go on and report it ("warn").
ErrorPolicy = Literal["raise", "skip", "warn"]
ERROR_POLICIES: tuple[str, ...] = get_args(ErrorPolicy)
# Spellings of earlier releases, still accepted with a DeprecationWarning.
DEPRECATED_POLICIES = {"fail": "raise"}


class FormatError(ValueError):
    """A manifest or index breaks the format.

    The message names the file and the field (and for an index the row, episode key and camera);
    a URL in it has its credentials redacted (``epishard.redact``).
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class VideoError(ValueError):
    """A video holds no stream of frames: no video stream, or only attached pictures (cover art).

    Raised by ``epishard.format.decoder.frame_stream``; the message says which of the two it is.
    """


def check_choice(
    owner: str, name: str, value: object, allowed: tuple[str, ...], deprecated: Mapping[str, str] = DEPRECATED_POLICIES
) -> str:
    """``value`` if it is one of ``allowed``; the new spelling of a deprecated one.

    A deprecated value warns (``DeprecationWarning``), e.g. ``"fail"`` -> ``"raise"``.

    Raises:
        ValueError: names ``owner``, ``name``, the value and the allowed values.
    """
    if value in deprecated and deprecated[value] in allowed:  # type: ignore[index]
        new = deprecated[value]  # type: ignore[index]
        warnings.warn(f"{owner}: {name}={value!r} is deprecated, use {new!r}", DeprecationWarning, stacklevel=4)
        return new
    if value not in allowed:
        raise ValueError(
            f"{owner}: invalid {name} {value!r}; allowed values are " + ", ".join(repr(a) for a in allowed)
        )
    return value
