"""epishard's streaming window reader.

Public API: ``WindowDataset`` (a torch ``IterableDataset``), ``WindowLoader`` (a ``DataLoader`` with
exact resume), ``WindowSpec`` and ``segment`` (what a window is), ``PostProcess`` (per-frame
post-processing), ``DatasetSource`` (an opened dataset), ``World`` (a consumer's rank and worker)
and ``PerEpisode`` (windows per episode), and the pure planning functions in ``stream.plan``.
"""

from .dataset import WindowDataset, WindowLoader
from .plan import PerEpisode, World
from .source import DatasetSource
from .spec import WindowSpec, segment
from .transform import PostProcess

__all__ = [
    "DatasetSource",
    "PerEpisode",
    "PostProcess",
    "WindowDataset",
    "WindowLoader",
    "WindowSpec",
    "World",
    "segment",
]
