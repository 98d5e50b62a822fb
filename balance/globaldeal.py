"""Global cost balancing for the streaming reader: every step's windows dealt to ranks by cost.

Rank-local balancing (``balance.local``) can only reorder the windows of the shards a rank reads,
so a rank that holds the expensive episodes stays the slowest. Here the plan's global window list
(every consumer's windows, from the index alone) is cut into global steps of ``world_size x
batch_size`` windows of similar cost, and each step's windows are dealt to ranks by cost, as
``balance.assign.balanced_steps`` does for map-style samplers; each consumer then fetches the
windows it is dealt from whichever shard they sit in (ranged reads, ``FetchPolicy(mode="ranged")``).

``global_steps`` (a pure function, numpy in and out), for ``N`` windows in plan order (``N`` a
multiple of the consumers, the plan's remainder already left out):

1. Each consumer yields ``n = N / (world_size x num_workers)`` windows, as in the plain plan:
   ``q = n // batch_size`` full batches and a last batch of ``t = n mod batch_size`` (the
   DataLoader's partial batch, every worker has one). The last ``world_size x num_workers x t``
   windows in plan order make the ``num_workers`` partial steps; the rest make
   ``num_workers x q`` full global steps.
2. The full part is cut, in plan order, into chunks of ``chunk_steps`` global steps (None: one
   chunk, the whole epoch). Inside a chunk windows are sorted by cost, descending, and cut into
   steps, so a step holds windows of similar cost (little padding); each step's windows go to ranks
   by ``balance.assign.lpt_capped`` (greedy least-loaded with exactly ``batch_size`` per rank:
   max/mean rank cost close to 1). Rank ids of every step and the order of the steps inside each
   chunk are shuffled by ``(seed, epoch, level)``. Chunks follow the plan's read order (shards
   permuted per epoch), so a consumer holds only the episodes of about one chunk at a time; a
   larger chunk balances better and mixes more episodes.
3. The partial steps are balanced the same way (one chunk, ``t`` per rank).
4. Steps become consumers' yield orders as torch's DataLoader takes them: with the default in-order
   round robin, worker ``w`` of ``K`` gives a rank its batches ``w, w + K, ...``, so rank ``r``'s
   batch of global step ``s`` is the ``(s // K)``-th batch of consumer ``(r, s mod K)``.
5. Windows of equal cost in a chunk (often one episode's windows: a cost that depends on the
   instruction) are interchangeable for the balance, so they are handed out so that each consumer
   gets a contiguous run of them in plan order (neighbouring anchors of an episode, which share
   frames) instead of every other one: each frame is then decoded by fewer consumers.

``GlobalDeal`` is that as a declared plan stage (``stream.stages.DealStage``, ``keeps_order``: no
pool shuffle after it). The windows kept and dropped are the plain plan's (``stream.plan.deal``
without strata: ``R mod consumers`` left out at random per ``(seed, epoch, level)``), so the global
deal changes who yields a window and when, never whether. Exactly once, equal steps per rank and
exact resume hold as for any plan; elastic resume replays each old consumer's order and deals the
rest again with this stage for the new layout (``stream.plan.level_plan``).

Internal: import from ``epishard.balance``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from epishard.seeding import rng_for
from epishard.stream.plan import EpisodeTable, GlobalPlan, deal

from .assign import lpt_capped
from .cost import CostFn

__all__ = ["GlobalDeal", "global_steps"]

_SALT_RANKS, _SALT_STEPS = 24, 25  # balance.assign 11-15, balance.local 21-22


def _balanced(costs: np.ndarray, chunk: np.ndarray, world_size: int, num_workers: int, batch_size: int, rng):
    """int64 ``[steps, world_size, batch_size]`` positions into ``costs``, steps in yield order.

    ``chunk``: int64 ``[N]`` chunk of each window (ascending); ``N`` a multiple of ``world_size x
    batch_size`` and every chunk whole steps. Steps 2 and 5 of the module docstring.
    """
    per_step = world_size * batch_size
    steps = costs.size // per_step
    ranks, order = rng
    ordered = np.lexsort((-costs, chunk)).reshape(steps, per_step)  # stable: ties keep plan order
    rank = lpt_capped(costs[ordered], world_size, batch_size)
    by_rank = np.argsort(rank, axis=1, kind="stable")  # heaviest first inside a rank's batch
    out = np.take_along_axis(ordered, by_rank, axis=1).reshape(steps, world_size, batch_size)
    physical = np.argsort(ranks.random((steps, world_size)), axis=1)  # a random rank permutation per step
    out = np.take_along_axis(out, physical[:, :, None], axis=1)
    out = out[np.lexsort((order.random(steps), chunk[ordered[:, 0]]))]
    return _contiguous_ties(out, costs, chunk, num_workers)


def _contiguous_ties(out: np.ndarray, costs: np.ndarray, chunk: np.ndarray, num_workers: int) -> np.ndarray:
    """``out`` with windows of equal cost in a chunk redistributed over the slots that hold that cost.

    Slots are taken in (rank, worker, step) order and filled with the windows in plan order, so each
    consumer gets a contiguous run of them (often one episode's neighbouring anchors, which share
    frames: decoded once by one consumer instead of by all). Every slot keeps its cost, so the
    balance is unchanged. Step 5 of the module docstring.
    """
    steps, world_size, batch_size = out.shape
    key = np.lexsort((costs, chunk))
    run = np.empty(costs.size, dtype=np.int64)  # equal (chunk, cost) -> one run id, increasing
    if costs.size:
        sorted_key = np.stack([chunk[key], costs[key]])
        run[key] = np.cumsum(np.r_[0, np.any(sorted_key[:, 1:] != sorted_key[:, :-1], axis=0)])
    g, r, j = np.meshgrid(np.arange(steps), np.arange(world_size), np.arange(batch_size), indexing="ij")
    slots = np.lexsort((j.ravel(), g.ravel(), (g % num_workers).ravel(), r.ravel(), run[out].ravel()))
    windows = np.lexsort((np.arange(costs.size), run))
    flat = out.reshape(-1).copy()
    flat[slots] = windows
    return flat.reshape(out.shape)


def global_steps(
    costs: np.ndarray,
    world_size: int,
    num_workers: int,
    batch_size: int,
    chunk_steps: int | None,
    seed: int,
    epoch: int,
    level: int = 0,
) -> np.ndarray:
    """Consumers' yield orders of windows dealt step by step by cost (module docstring).

    Args:
        costs: float64 ``[N]`` predicted costs of the windows in plan order, finite; ``N`` a
            multiple of ``world_size x num_workers``.
        world_size, num_workers: the layout; consumer ``rank * num_workers + worker``.
        batch_size: samples per rank per step (the DataLoader's).
        chunk_steps: global steps per balancing chunk, or None for the whole epoch.
        seed, epoch, level: randomness (tie order, rank ids, step order) comes from these.

    Returns:
        int64 ``[world_size * num_workers, N / (world_size * num_workers)]``: row ``c`` is consumer
        ``c``'s windows (positions into ``costs``) in yield order; every position exactly once.

    Raises:
        ValueError: ``N`` not a multiple of the consumers, a count below 1, or non-finite costs.
    """
    costs = np.asarray(costs, dtype=np.float64)
    consumers = world_size * num_workers
    if min(world_size, num_workers, batch_size) < 1 or (chunk_steps is not None and chunk_steps < 1):
        raise ValueError(
            f"world_size, num_workers, batch_size, chunk_steps must be >= 1 ({world_size}, "
            f"{num_workers}, {batch_size}, {chunk_steps})"
        )
    if costs.ndim != 1 or costs.size % consumers or not np.isfinite(costs).all():
        raise ValueError(f"costs must be finite, 1-D, a multiple of {consumers} consumers long (got {costs.shape})")
    n = costs.size // consumers
    q, t = divmod(n, batch_size)
    full = consumers * q * batch_size  # windows in the num_workers x q full steps
    rng = tuple(rng_for(seed, epoch, salt, level) for salt in (_SALT_RANKS, _SALT_STEPS))
    chunk = np.arange(full, dtype=np.int64) // (chunk_steps * world_size * batch_size) if chunk_steps else None
    steps = _balanced(
        costs[:full], np.zeros(full, np.int64) if chunk is None else chunk, world_size, num_workers, batch_size, rng
    )
    out = np.empty((world_size, num_workers, n), dtype=np.int64)
    for w in range(num_workers):  # round robin: consumer (r, w) gives global steps w, w + K, ...
        out[:, w, : q * batch_size] = steps[w::num_workers].transpose(1, 0, 2).reshape(world_size, -1)
    if t:
        tail = full + _balanced(costs[full:], np.zeros(costs.size - full, np.int64), world_size, num_workers, t, rng)
        out[:, :, q * batch_size :] = tail.transpose(1, 0, 2)  # partial step w: consumer (r, w)'s last batch
    return out.reshape(consumers, n)


@dataclass(frozen=True)
class GlobalDeal:
    """The global cost-balancing deal stage (``stream.stages.DealStage``) of ``global_steps``.

    ``cost``: a ``CostFn`` on global episode numbers and anchors; ``batch_size``: the loader's
    per-rank batch size; ``chunk_steps``: global steps per balancing chunk (None: the whole epoch).
    ``keeps_order``: True, consumers yield exactly the dealt order.
    """

    cost: CostFn
    batch_size: int
    chunk_steps: int | None = None
    keeps_order: bool = field(default=True, init=False)

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
        """The windows (in plan order) dealt to the layout's consumers: a ``GlobalPlan`` in yield order.

        ``episode``, ``anchor``: int64 ``[N]`` (global episode numbers, anchor rows) in plan order. The
        plan's own ``deal`` first leaves out its remainder (``N`` a multiple of the consumers, no
        strata: the deal is global); ``cost`` prices the kept windows (float64); ``global_steps``
        deals them (its errors: ``ValueError``).
        """
        consumers = world_size * num_workers
        kept = deal(dataclasses.replace(table, stratum=None), episode, anchor, consumers, seed, epoch, level)
        costs = np.asarray(self.cost(kept.episode, kept.anchor), dtype=np.float64)
        pos = global_steps(costs, world_size, num_workers, self.batch_size, self.chunk_steps, seed, epoch, level)
        pos = pos.reshape(-1)
        return GlobalPlan(kept.episode[pos], kept.anchor[pos], kept.per_consumer, kept.dropped)
