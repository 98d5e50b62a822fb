"""Errors raised by the writer, each naming where the problem is."""

from __future__ import annotations


class ConversionError(Exception):
    """A source episode cannot be converted.

    Attributes name the place precisely so a user can open the file and look: ``dataset`` (source
    name or path), ``episode`` (source episode index), ``camera`` (full camera name or None),
    ``row`` (table row within the episode or None), ``shard`` (the shard being written, or None),
    ``kind`` (a short machine-readable tag such as ``"nan"``, ``"frames_past_end"``,
    ``"unreadable_video"``; the report counts skips by it).
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
        self.dataset = dataset
        self.episode = episode
        self.camera = camera
        self.row = row
        self.path = path
        self.shard = shard
        self.detail = message
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
        fields = dict(
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
        # Crosses process boundaries (convert --workers): rebuild from the fields, not the rendered text.
        return _rebuild, (self.detail, self.to_dict())

    def to_dict(self) -> dict:
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


def _rebuild(message: str, fields: dict) -> ConversionError:
    fields = {("path" if k == "file" else k): v for k, v in fields.items() if k != "message"}
    return ConversionError(message, **fields)


class SourceError(Exception):
    """A source dataset as a whole is unusable (no meta/info.json, no episodes found, ...)."""


class OutputFolderError(Exception):
    """The output folder cannot be used: it holds files this writer did not create, is a file, or
    belongs to a conversion with another shard prefix. Nothing in it was changed.
    """
