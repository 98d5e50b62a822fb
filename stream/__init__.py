"""epishard's streaming window reader.

Public API: ``WindowDataset`` (a torch ``IterableDataset``), ``WindowLoader`` (a ``DataLoader`` with
exact resume), ``WindowSpec`` and ``segment`` (what a window is), ``PostProcess`` (per-frame
post-processing), ``DatasetSource`` (an opened dataset), ``World`` (a consumer's rank and worker),
``PerEpisode`` (windows per episode), ``Selection`` (read-time episode selection, ``stream.select``),
``Lookahead`` (look-ahead decoding: horizon and byte budgets, ``stream.lookahead``), the errors
``StateError`` / ``StateTypeError`` (a saved state refused by ``load_state_dict``, naming the field)
and ``UserCodeError`` (a hook or plan stage of yours returned something unusable), and the pure
planning functions in ``stream.plan`` and ``stream.mixplan``.
"""

from .dataset import WindowDataset, WindowLoader
from .lookahead import Lookahead
from .plan import PerEpisode, World
from .select import Selection
from .source import DatasetSource
from .spec import WindowSpec, segment
from .statecheck import StateError, StateTypeError
from .transform import PostProcess
from .usercode import UserCodeError

__all__ = [
    "DatasetSource",
    "Lookahead",
    "PerEpisode",
    "PostProcess",
    "Selection",
    "StateError",
    "StateTypeError",
    "UserCodeError",
    "WindowDataset",
    "WindowLoader",
    "WindowSpec",
    "World",
    "segment",
]
