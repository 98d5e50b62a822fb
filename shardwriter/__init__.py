"""epishard's writer: episodes in, window-indexed WebDataset tar shards and a manifest out.

Public API: ``convert``, ``ConvertOptions``, ``Episode``, ``CameraVideo``, ``TableSlice``,
``Source``, ``Stream``, ``read_lerobot``, ``WindowIndex``, ``Manifest``, ``ReencodeSpec``, ``ConversionError``,
``SourceError``, ``OutputFolderError``, ``verify``. The on-disk format is described in
docs/FORMAT.md and defined in ``epishard.format.manifest``.
"""

from epishard.format.index import WindowIndex
from epishard.format.manifest import Manifest

from .convert import ConvertOptions, convert
from .episode import CameraVideo, Episode, Source, Stream, TableSlice
from .errors import ConversionError, OutputFolderError, SourceError
from .lerobot import read_lerobot
from .verify import verify
from .video import ReencodeSpec

__all__ = [
    "CameraVideo",
    "ConversionError",
    "ConvertOptions",
    "Episode",
    "Manifest",
    "OutputFolderError",
    "ReencodeSpec",
    "Source",
    "SourceError",
    "Stream",
    "TableSlice",
    "WindowIndex",
    "convert",
    "read_lerobot",
    "verify",
]
