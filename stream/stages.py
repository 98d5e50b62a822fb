"""The plan's declared stages, and their application to one consumer's windows.

A stage is a pure function of the plan, so every guarantee of the plan holds after it: ``CostStage``
(a predicted cost per window), ``OrderStage`` (a new yield order), ``GroupStage`` (the windows kept,
in whole batches of one stratum) and ``DealStage`` (windows dealt to consumers in place of the plan's
cut). ``ConsumerStages`` gathers the stages of one plan with its pool shuffle; ``yield_order`` runs
them on a consumer's windows (``stream.plan.worker_plan`` and ``level_plan`` call it). Each stage's
answer is checked, and its exceptions are marked as the user's (``stream.usercode``).

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from epishard.seeding import rng_for

from .planvalues import EpisodeTable, GlobalPlan, World
from .shuffle import SALT as _SALT_SHUFFLE
from .shuffle import pool_shuffle
from .usercode import UserCodeError, call_user, describe

__all__ = ["ConsumerStages", "CostStage", "DealStage", "GroupStage", "OrderStage", "yield_order"]

# The rngs of the stages (the plan's own: 1-3, stream.plan; the shuffle's: 4, stream.shuffle; balance: 11-25).
_SALT_GROUP = 31


class CostStage(Protocol):
    """Predicted cost of windows: float64 ``[n]`` for global episode numbers and anchors ``[n]``.

    Implemented by ``balance.cost.CostFn``.
    """

    def __call__(self, episodes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
        """Float64 ``[n]`` costs of the windows."""
        ...


class OrderStage(Protocol):
    """A consumer's new yield order: an int64 permutation ``[n]`` of its windows.

    A pure function of the consumer's windows in planned yield order (``episode``, ``anchor``:
    int64 ``[n]``), their costs (float64 ``[n]``, or ``None`` without a cost stage), the consumer's
    ``World``, the seed and the epoch. Every guarantee of the plan holds for any permutation.
    """

    def __call__(
        self, episode: np.ndarray, anchor: np.ndarray, cost: np.ndarray | None, world: World, seed: int, epoch: int
    ) -> np.ndarray:
        """Int64 ``[n]``: a permutation of the window positions."""
        ...


class GroupStage(Protocol):
    """A consumer's windows kept and reordered (a declared plan stage).

    A consumer's windows kept and reordered, e.g. into whole batches of one dataset: int64
    positions ``[m]`` (each at most once) into its windows in yield order (``episode``: int64
    ``[n]``), drawn with ``rng``. ``m`` must depend only on the consumer's per-stratum window counts,
    which the deal makes equal for every consumer, so every consumer keeps the same number.
    """

    def __call__(self, episode: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Int64 ``[m]``: positions kept, in their new order."""
        ...


class DealStage(Protocol):
    """Windows dealt to the consumers of a layout, in place of ``deal`` (a declared plan stage).

    Called with the windows to deal in plan order (``episode``, ``anchor``: int64 ``[n]``), the
    layout (``world_size`` ranks x ``num_workers`` workers, consumer ``rank * num_workers + worker``),
    the seed, the epoch and the level (0: the epoch's own plan, ``k``: after the ``k``-th layout
    change); returns a ``GlobalPlan`` whose consumer parts hold equal counts. A pure function of its
    arguments, like ``deal`` (e.g. ``balance.globaldeal.GlobalDeal``: each step's windows dealt to
    ranks by cost). ``keeps_order``: consumers yield their part in the order given (no pool
    shuffle, order or group stage after it), for a deal that already decided every step.
    """

    @property
    def keeps_order(self) -> bool:
        """Whether consumers yield their part in the order dealt (no shuffle, order or group after it)."""
        ...

    def __call__(
        self,
        table: EpisodeTable,
        episode: np.ndarray,
        anchor: np.ndarray,
        world_size: int,
        num_workers: int,
        seed: int,
        epoch: int,
        level: int,
    ) -> GlobalPlan:
        """The windows dealt: a ``GlobalPlan`` of equal consumer parts."""
        ...


@dataclass(frozen=True)
class ConsumerStages:
    """The per-consumer stages after the cut: the pool shuffle, then optional ``cost``, ``order``, ``group``.

    (``WindowDataset`` declares its stages with ``stream.options.Stages``; this is the planner's
    whole set, the pool and the group stage of ``batch_by_dataset`` included.)
    ``shuffle_episodes``: pool size of ``stream.shuffle.pool_shuffle`` (episodes whose windows are interleaved at
    a time; ``None``: all of the consumer's; ``0``: read order).
    ``deal``: an optional ``DealStage`` used instead of ``deal`` (the cut itself); when it
    ``keeps_order``, the pool shuffle, ``order`` and ``group`` do not apply (``group`` is refused).
    """

    shuffle_episodes: int | None = None
    cost: CostStage | None = None
    order: OrderStage | None = None
    group: GroupStage | None = None
    deal: DealStage | None = None


def yield_order(
    episode: np.ndarray, anchor: np.ndarray, world: World, level: int, seed: int, epoch: int, stages: ConsumerStages
) -> tuple[np.ndarray, np.ndarray | None]:
    """Yield order of ``world.consumer``'s windows (``episode``, ``anchor`` in plan order) and their costs.

    The pool shuffle (by ``(seed, epoch, consumer, level)``), then the cost, order and group stages
    (or only the costs, after a deal stage that ``keeps_order``). The order is int64 positions into
    the windows; costs are float64 in that order, or None.

    Raises:
        ValueError: a deal stage that keeps its order followed by a group stage.
        UserCodeError: a stage returned something unusable (``_stage_costs``, ``_permutation``).
    """
    if stages.deal is not None and stages.deal.keeps_order:
        if stages.group is not None:
            raise ValueError("a deal stage that keeps its order cannot be followed by a group stage")
        kept = np.arange(episode.size, dtype=np.int64)
        return kept, None if stages.cost is None else _stage_costs(stages.cost, episode, anchor)
    salt = (world.consumer,) if level == 0 else (world.consumer, level)
    order = pool_shuffle(episode, stages.shuffle_episodes, rng_for(seed, epoch, _SALT_SHUFFLE, *salt))
    cost = None
    if stages.cost is not None:
        cost = _stage_costs(stages.cost, episode[order], anchor[order])
    if stages.order is not None:
        what = f"the order stage {describe(stages.order)}"
        again = call_user(what, stages.order, episode[order], anchor[order], cost, world, seed, epoch)
        again = _permutation(again, order.size, what)
        order, cost = order[again], None if cost is None else cost[again]
    if stages.group is not None:
        kept = np.asarray(stages.group(episode[order], rng_for(seed, epoch, _SALT_GROUP, *salt)), dtype=np.int64)
        order, cost = order[kept], None if cost is None else cost[kept]
    return order, cost


def _stage_costs(stage: CostStage, episode: np.ndarray, anchor: np.ndarray) -> np.ndarray:
    """The cost stage's float64 ``[n]`` costs of the windows, its exception marked as the user's (``stream.usercode``).

    Raises:
        UserCodeError: the stage returned another shape than ``[n]``, or values that are not finite numbers.
    """
    what = f"the cost stage {describe(stage)}"
    raw = call_user(what, stage, episode, anchor)
    try:
        cost = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise UserCodeError(f"{what} returned {type(raw).__name__}, not costs [{episode.size}]: {exc}", what) from exc
    if cost.shape != episode.shape:
        raise UserCodeError(f"{what} returned costs of shape {list(cost.shape)} for {episode.size} windows", what)
    bad = np.flatnonzero(~np.isfinite(cost))
    if bad.size:
        raise UserCodeError(
            f"{what} returned {bad.size} costs that are not finite, the first {cost[bad[0]]} for window {int(bad[0])} "
            f"(episode {int(episode[bad[0]])}, anchor {int(anchor[bad[0]])})",
            what,
        )
    return cost


def _permutation(raw: object, n: int, what: str) -> np.ndarray:
    """``raw`` (an order stage's answer) as int64 ``[n]`` if it is a permutation of ``0 .. n-1``.

    Raises:
        UserCodeError: anything else (windows would be lost or yielded twice).
    """
    order = np.asarray(raw)
    if order.shape != (n,) or not (np.issubdtype(order.dtype, np.integer) or n == 0):
        raise UserCodeError(
            f"{what} returned {order.dtype} {list(order.shape)}; it must return a permutation of the {n} window "
            "positions (int [n])",
            what,
        )
    order = order.astype(np.int64)
    seen = np.zeros(n, dtype=np.int64)
    inside = (order >= 0) & (order < n)
    np.add.at(seen, order[inside], 1)
    if not inside.all() or (seen != 1).any():
        missing = int(np.sum(seen == 0))
        raise UserCodeError(
            f"{what} returned no permutation of the {n} window positions: {int(np.sum(~inside))} out of range, "
            f"{int(np.sum(seen > 1))} repeated, {missing} missing (windows would be lost or yielded twice)",
            what,
        )
    return order
