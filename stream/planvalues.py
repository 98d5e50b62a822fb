"""The epoch plan's value types: a consumer's place, the episodes planned, windows dealt to consumers.

``World`` (where a consumer sits), ``EpisodeTable`` (the episodes planned), ``EpochInputs`` (what
an epoch's plan is a pure function of, besides the layout) and ``GlobalPlan`` (a plan of windows
dealt to consumers).

Shared by the planner (``stream.plan``) and the declared stages (``stream.stages``), which import
this module and not each other's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .spec import PerEpisode

__all__ = [
    "EpisodeTable",
    "EpochInputs",
    "GlobalPlan",
    "World",
]


@dataclass(frozen=True)
class World:
    """Where one consumer of the epoch plan sits (as MosaicML Streaming's ``World``).

    ``rank`` of ``world_size`` processes, DataLoader ``worker`` of ``num_workers`` (a process that
    reads without workers is ``worker=0, num_workers=1``). Its consumer id is
    ``rank * num_workers + worker`` of ``world_size * num_workers``.

    Raises:
        ValueError: a count below 1, or rank or worker out of range.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self):
        if not (0 <= self.rank < self.world_size and 0 <= self.worker < self.num_workers):
            raise ValueError(f"rank {self.rank}/{self.world_size} worker {self.worker}/{self.num_workers} out of range")

    @property
    def consumer(self) -> int:
        """This consumer's id: ``rank * num_workers + worker``."""
        return self.rank * self.num_workers + self.worker

    @property
    def consumers(self) -> int:
        """Consumers of the layout: ``world_size * num_workers``."""
        return self.world_size * self.num_workers

    @classmethod
    def of_consumer(cls, consumer: int, world_size: int, num_workers: int) -> World:
        """The ``World`` of consumer id ``consumer`` in a layout."""
        return cls(consumer // num_workers, world_size, consumer % num_workers, num_workers)

    def with_worker(self, worker: int, num_workers: int) -> World:
        """This rank's consumer ``worker`` of ``num_workers``."""
        return dataclasses.replace(self, worker=worker, num_workers=num_workers)


@dataclass(frozen=True)
class EpisodeTable:
    """The planner's view of the episodes of one or more datasets (int64 arrays ``[num_episodes]``).

    ``shard``: global shard number; ``lo``/``hi``: anchor range ``[lo, hi)`` for the window spec;
    ``weight``: window-count multiplier (dataset mixing weight); ``cost_bytes``: optional, bytes an
    episode holds while loaded (carried along, not used by the plan; benchmarks' tables set it);
    ``stratum``: optional stratum per episode (e.g. its
    dataset), constant within a shard: each stratum is then dealt to consumers on its own.
    ``gaps``: optional int64 ``[G, 3]`` rows ``(episode, lo, hi)``, sorted and disjoint
    (``break_gaps``): anchors in ``[lo, hi)`` of that episode are left out, because their window
    would cross a recording break (timestamps reset or jump inside the episode).
    """

    shard: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    weight: np.ndarray
    cost_bytes: np.ndarray | None = None
    stratum: np.ndarray | None = None
    gaps: np.ndarray | None = None

    @property
    def num_episodes(self) -> int:
        """Episodes in the table (all datasets of a mix)."""
        return int(self.shard.shape[0])

    @classmethod
    def concat(cls, tables: Sequence[EpisodeTable], shard_counts: Sequence[int], stratify: bool) -> EpisodeTable:
        """The tables of a mix of datasets as one, episodes and shards numbered in order.

        Dataset ``d``'s episode ``e`` becomes ``sum(episodes of datasets < d) + e``, shards likewise
        by ``shard_counts``; with ``stratify`` each dataset is its own stratum.
        """
        base = np.cumsum([0, *[t.num_episodes for t in tables]])
        shard_base = np.cumsum([0, *shard_counts])
        gaps = [
            t.gaps + np.array([base[d], 0, 0]) for d, t in enumerate(tables) if t.gaps is not None and t.gaps.shape[0]
        ]

        def cat(name: str, dtype) -> np.ndarray:
            parts = [np.asarray(getattr(t, name)) for t in tables]
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

        return cls(
            shard=np.concatenate([t.shard + shard_base[d] for d, t in enumerate(tables)]).astype(np.int64)
            if tables
            else np.zeros(0, dtype=np.int64),
            lo=cat("lo", np.int64),
            hi=cat("hi", np.int64),
            weight=cat("weight", np.float64),
            cost_bytes=None if any(t.cost_bytes is None for t in tables) else cat("cost_bytes", np.int64),
            stratum=np.repeat(np.arange(len(tables)), np.diff(base)) if stratify else None,
            gaps=np.concatenate(gaps) if gaps else None,
        )


@dataclass(frozen=True, eq=False)
class EpochInputs:
    """What one epoch's plan is a pure function of, besides the layout (the consumers it is dealt to).

    Every plan function of ``stream.plan`` (``global_plan``, ``consumer_plan``, ``level_plan``,
    ``worker_plan``, ...) takes these together, as MosaicML Streaming's partition is a function of
    ``(seed, epoch, ...)``.

    Args:
        table: the episodes planned (``EpisodeTable``).
        stride: windows start every ``stride`` anchors (frames) of an episode, >= 1.
        per_episode: windows drawn per episode (``PerEpisode``; None: every window).
        seed: the plan's seed (any int; taken mod 2**64, ``epishard.seeding``).
        epoch: the epoch number, >= 0.
    """

    table: EpisodeTable
    stride: int
    per_episode: PerEpisode | None
    seed: int
    epoch: int

    @property
    def key(self) -> tuple:
        """``(stride, PerEpisode, seed, epoch)``: equal keys of one table give equal plans (``EpochCuts.key``)."""
        return (self.stride, PerEpisode.of(self.per_episode), self.seed, self.epoch)


@dataclass(frozen=True)
class GlobalPlan:
    """All windows of an epoch in read order, and how they are dealt to consumers.

    ``episode``/``anchor``: int32 ``[W]`` (int64 past 2**31); ``per_consumer``: windows each
    consumer yields; ``dropped``: windows left out so that every consumer yields the same number.
    """

    episode: np.ndarray
    anchor: np.ndarray
    per_consumer: int
    dropped: int

    def consumer_slice(self, consumer: int) -> slice:
        """The windows of ``consumer`` (``rank * workers + worker``) in the plan's arrays."""
        return slice(consumer * self.per_consumer, (consumer + 1) * self.per_consumer)
