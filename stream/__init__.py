"""epishard's streaming window reader.

Public API: ``WindowDataset`` (a torch ``IterableDataset``), ``WindowLoader`` (a ``DataLoader`` with
exact resume), ``WindowSpec`` and ``segment`` (what a window is), ``PostProcess`` (per-frame
post-processing), ``DatasetSource`` (an opened dataset), and the pure planning functions in
``stream.plan``.
"""

from .dataset import WindowDataset, WindowLoader
from .source import DatasetSource
from .spec import WindowSpec, segment
from .transform import PostProcess

__all__ = ["DatasetSource", "PostProcess", "WindowDataset", "WindowLoader", "WindowSpec", "segment"]
