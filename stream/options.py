"""The option groups of ``WindowDataset``: where it runs, how datasets mix, its plan stages, how it reads.

Each group is one frozen value, checked when made (a ``ValueError`` or ``TypeError`` naming the
field): ``Ranks`` (this process's rank, the world size, the DataLoader workers), ``Mixing`` (how the
datasets of a mix are weighted, batched and aligned), ``Stages`` (declared plan stages: a cost, an
order, a deal) and ``ReadOptions`` (how bytes are fetched and decoded, and what each sample
carries). ``WindowDataset(sources, spec, ranks=Ranks(...), mix=Mixing(...), stages=Stages(...),
read=ReadOptions(...))``; ``None`` for a group means its defaults.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch

from .fetch import FetchPolicy
from .lookahead import Lookahead
from .planvalues import World
from .stages import CostStage, DealStage, OrderStage

__all__ = ["Mixing", "Ranks", "ReadOptions", "Stages"]


def _count(owner: str, name: str, value: object, least: int) -> None:
    """Refuse ``value`` unless it is None or an int >= ``least`` (bools are no counts)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
        raise ValueError(f"{owner}: {name} must be None or an int >= {least}, not {value!r}")


@dataclass(frozen=True)
class Ranks:
    """Where this process reads: its rank of the world, and the DataLoader workers per rank.

    Args:
        rank: this process's rank, 0-based. None: ``torch.distributed``'s when it is initialised
            (with ``world_size`` None too), else 0.
        world_size: processes in the run. None: ``torch.distributed``'s when it is initialised,
            else 1.
        num_workers: DataLoader worker processes per rank, needed only for ``len()`` before the
            first iteration and to compute the epoch's shared plan part once per rank
            (``WindowDataset.set_epoch``); ``WindowLoader`` sets it. None: unknown until the
            workers iterate (``torch.utils.data.get_worker_info``). 0 means no workers (one consumer).

    Raises:
        ValueError: ``rank`` below 0, ``world_size`` below 1, ``num_workers`` below 0, or
            ``rank >= world_size``.
    """

    rank: int | None = None
    world_size: int | None = None
    num_workers: int | None = None

    def __post_init__(self):
        _count("Ranks", "rank", self.rank, 0)
        _count("Ranks", "world_size", self.world_size, 1)
        _count("Ranks", "num_workers", self.num_workers, 0)
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise ValueError(f"Ranks: rank {self.rank} is out of range for world_size {self.world_size}")

    def world(self) -> World:
        """This process's rank and world size (``worker=0`` of 1).

        The fields when both are given, else ``torch.distributed`` when initialised, else rank 0
        of 1 (a field given alone is used, the other defaulted).
        """
        if self.rank is not None and self.world_size is not None:
            return World(self.rank, self.world_size)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return World(torch.distributed.get_rank(), torch.distributed.get_world_size())
        return World(self.rank or 0, self.world_size or 1)


@dataclass(frozen=True)
class Mixing:
    """How the datasets of a mix share an epoch (``stream.mix``, ``stream.mixplan``); one dataset is a mix of one.

    Args:
        weights: ``"repeat"``: a dataset's weight (``(url, weight)`` in ``sources``) multiplies its
            windows per epoch (1:1 gives the natural sizes); ``"probability"``: the weights are the
            datasets' shares of an epoch of ``epoch_length`` windows (``stream.mixplan``).
        epoch_length: windows per epoch with ``weights="probability"`` (default: the mix's size at
            1:1); ignored with ``"repeat"``.
        batch_by_dataset: every batch of ``batch_size`` samples comes from one dataset (implies
            ``stratify``; needs ``WindowDataset(batch_size=...)`` or ``WindowLoader``). Each consumer
            drops, per dataset, its count modulo the batch size (``stream.mixplan.group_by_dataset``).
        stratify: deal each dataset to the consumers on its own, so every worker of every rank
            reads all datasets in proportion at the same pace (each worker reads one shard per
            dataset side by side). None: True when mixing several datasets.
        camera_map: model camera (a name in ``spec.cameras``) -> the dataset's camera key; one dict
            for all datasets or a list with one per dataset.
        pad_dims: padding of state, action and other columns to a common width, with
            ``<column>_dim_is_pad`` masks: None (when widths differ), True (always), False (never: a
            mix of widths is refused), or column -> width (``stream.mix.mix_layout``).

    Raises:
        ValueError: an unknown ``weights``, or ``epoch_length`` below 1.
        TypeError: ``camera_map`` neither a dict, a list nor None.
    """

    weights: Literal["repeat", "probability"] = "repeat"
    epoch_length: int | None = None
    batch_by_dataset: bool = False
    stratify: bool | None = None
    camera_map: dict[str, str] | list[dict[str, str] | None] | None = None
    pad_dims: bool | dict[str, int] | None = None

    def __post_init__(self):
        if self.weights not in ("repeat", "probability"):
            raise ValueError(f"Mixing: weights must be 'repeat' or 'probability', not {self.weights!r}")
        _count("Mixing", "epoch_length", self.epoch_length, 1)
        if self.camera_map is not None and not isinstance(self.camera_map, dict | list):
            raise TypeError(f"Mixing: camera_map must be a dict, a list of them or None, not {self.camera_map!r}")


@dataclass(frozen=True)
class Stages:
    """Declared plan stages (``stream.stages``), pure functions of the plan, so every guarantee of the plan holds.

    Args:
        cost: a predicted cost per window (``CostStage``), attached to every sample as
            ``__cost__`` (float).
        order: a new yield order per consumer (``OrderStage``).
        deal: used instead of the plan's cut of the windows into consumers (``DealStage``;
            ``balance.globaldeal.GlobalDeal``: global cost balancing).

    ``balance.streaming.BalancedWindowDataset`` sets them.

    Raises:
        TypeError: a stage that is not callable.
    """

    cost: CostStage | None = None
    order: OrderStage | None = None
    deal: DealStage | None = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            stage = getattr(self, f.name)
            if stage is not None and not callable(stage):
                raise TypeError(f"Stages: {f.name} must be callable (a {f.name} stage) or None, not {stage!r}")


@dataclass(frozen=True)
class ReadOptions:
    """How the reader fetches and decodes, and what each sample carries besides the window.

    Args:
        storage_options: fsspec options for dataset URLs (``DatasetSource``; merged over the
            environment's). Secrets: never shown in messages.
        fetch: how shard bytes are fetched (``FetchPolicy``: stream or ranged mode, prefetch
            budget, retries, the on-disk range cache ``disk_cache_bytes``, and the shard policy when
            retries run out). None: ``FetchPolicy()``.
        lookahead: look-ahead decoding (``Lookahead``: chunk sizes and the byte budgets of the
            decoded-frame cache ``frame_cache_bytes`` and the kept encoded members; together they
            bound a worker's memory). None: ``Lookahead()``.
        defer_float: leave frames uint8 in the workers even when ``postprocess`` has a float dtype
            (a quarter of the bytes to move); the collate must convert them (``FloatCollate``).
            ``WindowLoader`` sets this on its own copy and adds the collate.
        telemetry: attach the worker's ``__telemetry__`` counters (float64) to every sample.

    Raises:
        TypeError: ``fetch`` not a ``FetchPolicy``, ``lookahead`` not a ``Lookahead``, or
            ``storage_options`` not a dict.
    """

    storage_options: dict | None = dataclasses.field(default=None, repr=False)  # secrets: never shown
    fetch: FetchPolicy | None = None
    lookahead: Lookahead | None = None
    defer_float: bool = False
    telemetry: bool = False

    def __post_init__(self):
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise TypeError(f"ReadOptions: storage_options must be a dict or None, not {type(self.storage_options)}")
        if self.fetch is not None and not isinstance(self.fetch, FetchPolicy):
            raise TypeError(f"ReadOptions: fetch must be a FetchPolicy or None, not {self.fetch!r}")
        if self.lookahead is not None and not isinstance(self.lookahead, Lookahead):
            raise TypeError(f"ReadOptions: lookahead must be a Lookahead or None, not {self.lookahead!r}")
