"""Errors raised by the writer, each naming where the problem is.

The error-policy vocabulary (``ErrorPolicy``) and the check of option values against their allowed
values (``check_choice``) are shared by writer and reader: they are defined in
``epishard.format.errors`` and exported here too.

Internal: import from ``epishard.shardwriter``.
"""

from __future__ import annotations

from typing import Any

from epishard.format.errors import DEPRECATED_POLICIES, ERROR_POLICIES, ErrorPolicy, check_choice
from epishard.redact import redact, redact_optional

__all__ = [
    "DEPRECATED_POLICIES",
    "ERROR_POLICIES",
    "ConversionError",
    "ErrorPolicy",
    "OutputFolderError",
    "SourceError",
    "check_choice",
]


class ConversionError(Exception):
    """A source episode cannot be converted.

    Attributes name the place precisely so a user can open the file and look: ``dataset`` (source
    name or path), ``episode`` (source episode index), ``camera`` (full camera name or None),
    ``row`` (table row within the episode or None), ``shard`` (the shard being written, or None),
    ``kind`` (a short machine-readable tag such as ``"nan"``, ``"frames_past_end"``,
    ``"unreadable_video"``; the report counts skips by it).

    The message, ``dataset`` and ``path`` are redacted (``epishard.redact``): a URL's credentials
    never reach the text, the manifest's report or a log.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        dataset: str | None = None,
        episode: int | None = None,
        camera: str | None = None,
        row: int | None = None,
        path: str | None = None,
        shard: str | None = None,
    ) -> None:
        self.kind = kind
        self.dataset = redact_optional(dataset)
        self.episode = episode
        self.camera = camera
        self.row = row
        self.path = redact_optional(path)
        self.shard = shard
        self.detail = redact(message)
        super().__init__(self._render())

    def _render(self) -> str:
        where = [
            f"{name}={value}"
            for name, value in (
                ("dataset", self.dataset),
                ("episode", self.episode),
                ("camera", self.camera),
                ("row", self.row),
                ("file", self.path),
                ("shard", self.shard),
            )
            if value is not None
        ]
        return f"[{self.kind}] {' '.join(where)}: {self.detail}"

    def with_context(self, **kw) -> ConversionError:
        """Return a copy with missing location fields filled in from ``kw``."""
        fields: dict[str, Any] = dict(
            kind=self.kind,
            dataset=self.dataset,
            episode=self.episode,
            camera=self.camera,
            row=self.row,
            path=self.path,
            shard=self.shard,
        )
        for name, value in kw.items():
            if fields.get(name) is None:
                fields[name] = value
        return ConversionError(self.detail, **fields)

    def __reduce__(self):
        # Crosses process boundaries (convert --workers, Ray): rebuild from the fields, not the rendered
        # text, as the same class (a subclass such as video.FrameTimingError stays one).
        return _rebuild, (self.detail, self.to_dict(), type(self)), self.__dict__

    def to_dict(self) -> dict:
        """``kind``, the location fields and ``detail``, for the manifest's report (JSON-ready)."""
        return {
            "kind": self.kind,
            "dataset": self.dataset,
            "episode": self.episode,
            "camera": self.camera,
            "row": self.row,
            "file": self.path,
            "shard": self.shard,
            "message": self.detail,
        }


def _rebuild(message: str, fields: dict, cls: type[ConversionError] | None = None) -> ConversionError:
    fields = {("path" if k == "file" else k): v for k, v in fields.items() if k != "message"}
    return (cls or ConversionError)(message, **fields)


class _Redacted(Exception):
    """An exception whose text arguments are redacted (``epishard.redact``) when it is made."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class SourceError(_Redacted):
    """A source dataset as a whole is unusable (no meta/info.json, no episodes found, ...).

    Its message names the source by path or URL, credentials redacted.
    """


class OutputFolderError(_Redacted):
    """The output folder cannot be used; nothing in it was changed (the message: credentials redacted).

    It holds files this writer did not create, is a file, or belongs to a conversion with another shard prefix.
    """
