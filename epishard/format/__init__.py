"""The epishard format: the contract the writer, the reader and balancing share.

What a converted dataset is on disk, and how to open it safely: the writer (``epishard.shardwriter``)
produces it, the reader (``epishard.stream``) and balancing (``epishard.balance``) consume it, and
all three import it from here. This package imports none of them.

Modules, from the bottom layer up (each imports only those above it in this list):

- ``errors``: ``FormatError`` (a file breaks the format), ``VideoError`` (no frame stream in a
  video), ``check_choice`` and the error-policy vocabulary (``ErrorPolicy``);
- ``untrusted``: metadata from outside read within bounds (``loads``, ``check_size``) and text
  made safe for a terminal (``printable``);
- ``retry``: the time budget of retried remote calls;
- ``verified``: per-node stamps of files whose sha256 was checked;
- ``stats``: per-feature statistics (``numeric_matrix``, ``DatasetStats``);
- ``manifest``: format names and constants (file, member and shard names, the index's Arrow
  schema, the format version), the typed manifest (``Manifest``) and the checks of its fields;
- ``validate``: the checks of a window index against its manifest (``check_index``, ...);
- ``index``: ``WindowIndex``, the window index in memory;
- ``storage``: local folders and fsspec URLs (``Storage``, ``FileSystemHandle``, storage options);
- ``opening``: an index opened against its manifest (``load_dataset_index``,
  ``load_shard_indexes``), and ``NotConverted`` for a LeRobot dataset given in place of a converted one;
- ``decoder``: the decoder glue (``frame_stream``, ``open_decoder``, ``container_frames``).

The package's face is ``__all__``: the names writer, reader, tools and users import from
``epishard.format`` (``from epishard.format import Manifest, WindowIndex, FormatError``). The modules
above are internal: code inside the packages imports a module's own ``__all__`` names from it.
The face is loaded on first use (PEP 562), so importing this package loads none of the modules;
``decoder`` loads PyAV, and torchcodec only when a decoder is opened.
"""

from __future__ import annotations

import importlib
from typing import Any

_FACE = {
    "FormatError": "errors",
    "VideoError": "errors",
    "ErrorPolicy": "errors",
    "FORMAT_NAME": "manifest",
    "FORMAT_VERSION": "manifest",
    "MANIFEST_NAME": "manifest",
    "DATASET_INDEX_NAME": "manifest",
    "Manifest": "manifest",
    "DatasetStats": "stats",
    "check_index": "validate",
    "WindowIndex": "index",
    "Storage": "storage",
    "RemoteFile": "storage",
    "resolve_storage_options": "storage",
    "open_manifest": "opening",
    "load_dataset_index": "opening",
    "load_shard_indexes": "opening",
    "NotConverted": "opening",
    "ManifestMissing": "opening",
    "open_decoder": "decoder",
    "frame_stream": "decoder",
}

__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    """Import a name of the face on first use (PEP 562); AttributeError for anything else."""
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module 'epishard.format' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"epishard.format.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FACE))
