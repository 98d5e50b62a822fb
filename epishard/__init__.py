"""epishard: window-indexed WebDataset shards and a streaming window reader for robot-learning episodes.

The project keeps three packages at the top of the repository (``shardwriter/``, ``stream/``,
``balance/``); installed, they live under this one import namespace as ``epishard.shardwriter``,
``epishard.stream`` and ``epishard.balance`` (pyproject.toml maps the folders), so installing
epishard never shadows PyPI's own ``stream`` or ``balance``. The format they share (names,
manifest, index, validation, storage, the decoder glue) is ``epishard.format``, in this folder.

The names below are the curated API. They are imported on first use (PEP 562), so
``import epishard`` and ``epishard --help`` stay fast: torch and torchcodec load only when a
reader name is used.

Writer: ``convert``, ``ConvertOptions``, ``Episode``, ``CameraVideo``, ``TableSlice``, ``Source``,
``Stream``, ``read_lerobot``, ``ReencodeSpec``, ``verify``, ``ConversionError``, ``SourceError``,
``OutputFolderError``.
Format (``epishard.format``, the contract writer and reader share): ``Manifest``, ``WindowIndex``,
``FormatError``.
Reader: ``WindowDataset`` and its option groups ``Ranks``, ``Mixing``, ``Stages``, ``ReadOptions``;
``WindowLoader``, ``WindowSpec``, ``segment``, ``span``, ``at``, ``PostProcess``, ``DatasetSource``.
Balancing: ``BalancedWindowDataset``, ``CostModel``, ``balanced_steps``.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from ._version import __version__


def _extend_path_in_a_checkout() -> None:
    # In a source checkout (tests, `PYTHONPATH=$PWD`, editable installs) the three packages sit
    # next to this folder, not inside it: let `epishard.<name>` find them there. An installed
    # wheel has them inside this folder, and then nothing is added.
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if os.path.isdir(os.path.join(here, "stream")):
        return
    if os.path.isfile(os.path.join(root, "pyproject.toml")) and os.path.isfile(
        os.path.join(root, "stream", "__init__.py")
    ):
        __path__.append(root)


_extend_path_in_a_checkout()

_API = {
    "convert": "epishard.shardwriter",
    "ConvertOptions": "epishard.shardwriter",
    "Episode": "epishard.shardwriter",
    "CameraVideo": "epishard.shardwriter",
    "TableSlice": "epishard.shardwriter",
    "Source": "epishard.shardwriter",
    "Stream": "epishard.shardwriter",
    "read_lerobot": "epishard.shardwriter",
    "ReencodeSpec": "epishard.shardwriter",
    "verify": "epishard.shardwriter",
    "ConversionError": "epishard.shardwriter",
    "SourceError": "epishard.shardwriter",
    "OutputFolderError": "epishard.shardwriter",
    "Manifest": "epishard.format.manifest",
    "WindowIndex": "epishard.format.index",
    "FormatError": "epishard.format.errors",
    "WindowDataset": "epishard.stream",
    "WindowLoader": "epishard.stream",
    "WindowSpec": "epishard.stream",
    "Ranks": "epishard.stream",
    "Mixing": "epishard.stream",
    "Stages": "epishard.stream",
    "ReadOptions": "epishard.stream",
    "segment": "epishard.stream",
    "span": "epishard.stream",
    "at": "epishard.stream",
    "PostProcess": "epishard.stream",
    "DatasetSource": "epishard.stream",
    "BalancedWindowDataset": "epishard.balance.streaming",
    "CostModel": "epishard.balance",
    "balanced_steps": "epishard.balance",
}

__all__ = ["__version__", *sorted(_API)]


def __getattr__(name: str) -> Any:
    """Import a curated name on first use (PEP 562); AttributeError for anything else."""
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'epishard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
