"""epishard's streaming window reader.

Public API: ``WindowDataset`` (a torch ``IterableDataset``) and its option groups ``Ranks``,
``Mixing``, ``Stages`` and ``ReadOptions`` (``stream.options``), ``WindowLoader`` (a ``DataLoader`` with
exact resume), ``WindowSpec`` and ``segment`` (what a window is), ``span`` and ``at`` (a window
of a stream at its own rate, ``stream.multirate``), ``PostProcess`` (per-frame
post-processing), ``DatasetSource`` (an opened dataset), ``World`` (a consumer's rank and worker),
``PerEpisode`` (windows per episode), ``Selection`` (read-time episode selection, ``stream.select``),
``Lookahead`` (look-ahead decoding: horizon and byte budgets, ``stream.lookahead``), ``FetchPolicy``
(how shard bytes are fetched, ``stream.fetch``), the errors
``StateError`` / ``StateTypeError`` (a saved state refused by ``load_state_dict``, naming the field)
and ``UserCodeError`` (a hook or plan stage of yours returned something unusable), and the pure
planning functions in ``stream.plan`` (the epoch plan), ``stream.shuffle`` (the pool shuffle),
``stream.stages`` (declared plan stages) and ``stream.mixplan`` (mixing rules).
"""

from .dataset import WindowDataset, WindowLoader
from .fetch import FetchPolicy
from .lookahead import Lookahead
from .multirate import at, span
from .options import Mixing, Ranks, ReadOptions, Stages
from .planvalues import World
from .select import Selection
from .source import DatasetSource
from .spec import PerEpisode, WindowSpec, segment
from .statecheck import StateError, StateTypeError
from .transform import PostProcess
from .usercode import UserCodeError

__all__ = [
    "DatasetSource",
    "FetchPolicy",
    "Lookahead",
    "Mixing",
    "PerEpisode",
    "PostProcess",
    "Ranks",
    "ReadOptions",
    "Selection",
    "Stages",
    "StateError",
    "StateTypeError",
    "UserCodeError",
    "WindowDataset",
    "WindowLoader",
    "WindowSpec",
    "World",
    "at",
    "segment",
    "span",
]
