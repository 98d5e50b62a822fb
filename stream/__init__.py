"""epishard's streaming window reader.

Public API: ``WindowDataset`` (a torch ``IterableDataset``), ``WindowLoader`` (a ``DataLoader`` with
exact resume), ``WindowSpec`` and ``segment`` (what a window is), ``PostProcess`` (per-frame
post-processing), ``DatasetSource`` (an opened dataset), ``Selection`` (read-time episode
selection, ``stream.select``), and the pure planning functions in ``stream.plan`` and ``stream.mixplan``.
"""

from .dataset import WindowDataset, WindowLoader
from .select import Selection
from .source import DatasetSource
from .spec import WindowSpec, segment
from .transform import PostProcess

__all__ = ["DatasetSource", "PostProcess", "Selection", "WindowDataset", "WindowLoader", "WindowSpec", "segment"]
