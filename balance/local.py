"""Rank-local balancing for a streaming reader: reorder one consumer's planned windows.

The batches of a step then have matching costs on every rank, without moving a window to another rank.

Two pure functions, both permutations of a consumer's planned yield order:

- ``local_order``: cost-sorted blocks inside chunks, chunk block order shared by all ranks. Enough
  when every rank's stream mixes costs the same way (one dataset with varying lengths).
- ``stratified_order``: when costs differ by *stratum* (datasets with other window shapes, which
  live in their own shards, so at a given time one rank reads an expensive dataset and another a
  cheap one), every batch is taken from one stratum, and a schedule shared by all ranks names the
  stratum of each step. It needs a plan that gives every consumer the same number of windows of
  each stratum (the reader's equal-range cut applied per stratum) and reads the strata side by side.

``local_order`` in detail:

The streaming reader (``stream.plan``) gives each consumer ``(rank, worker)`` a fixed list of
windows from its own shards, in a yield order shuffled at plan level (its pool shuffle); every consumer of
a given worker id yields the same number of windows, and the DataLoader builds rank ``r``'s
``t``-th batch from worker ``t mod workers``'s ``(t // workers)``-th block of ``batch_size``
windows. ``local_order`` permutes that yield order *within chunks* of ``chunk_batches * batch_size``
windows:

1. each chunk is sorted by cost, descending (stable: equal costs keep the shuffled order) and cut
   into blocks of ``batch_size``: block ``k`` is the chunk's ``k``-th heaviest batch, its samples
   similar in cost (little padding);
2. the full blocks of chunk ``c`` are put in an order drawn from ``(seed, epoch, worker, c)``, the
   same on every rank (the rank is not an input), so in every step every rank carries the block of
   the same cost rank of its own chunk. Pairing sorted blocks across ranks (comonotone) minimises the
   sum over steps of the slowest rank's cost for the given blocks: for any threshold, the steps
   whose slowest rank exceeds it are at least as many as on the rank with most blocks above it,
   with equality when sorted blocks are paired. A trailing partial block stays last.

No communication is needed: each rank sorts only its own costs. What remains unequal is the
difference between the ranks' cost distributions inside a chunk, which only reading other ranks'
shards could remove; larger chunks lower it.

Guarantees kept (it is a permutation that is a pure function of ``(costs, batch_size,
chunk_batches, seed, epoch, worker)``): every window once, the same counts per consumer, exact
resume by counting consumed samples. A window moves at most ``chunk - 1`` positions earlier than
the plan yielded it, so a reader that loads episodes in read order until the requested one is
loaded (as ``WindowDataset`` does) holds at most one chunk more of windows in memory.

Internal: import from ``epishard.balance``.
"""

from __future__ import annotations

import numpy as np

from epishard.seeding import rng_for

__all__ = ["local_order", "rank_steps", "stratified_order"]

_SALT_LOCAL, _SALT_STRATA = 21, 22


def local_order(
    costs: np.ndarray, batch_size: int, chunk_batches: int, seed: int, epoch: int, worker: int = 0
) -> np.ndarray:
    """New yield order of one consumer's windows.

    Args:
        costs: float64 ``[n]`` costs of the consumer's windows in planned yield order.
        batch_size: the DataLoader's per-rank batch size.
        chunk_batches: batches per chunk (reordering horizon); 1 keeps every batch's members and
            only sorts inside each batch.
        seed, epoch, worker: the chunk block orders come from ``(seed, epoch, worker, chunk)``.

    Returns:
        int64 ``[n]``, a permutation: position ``i`` of the new order yields planned window ``out[i]``.
    """
    costs = np.asarray(costs, dtype=np.float64)
    if batch_size < 1 or chunk_batches < 1:
        raise ValueError("batch_size and chunk_batches must be >= 1")
    n, chunk = costs.size, batch_size * chunk_batches
    out = np.empty(n, dtype=np.int64)
    for c, start in enumerate(range(0, n, chunk)):
        pos = np.arange(start, min(start + chunk, n), dtype=np.int64)
        ordered = pos[np.argsort(-costs[pos], kind="stable")]
        full = ordered.size // batch_size
        blocks = rng_for(seed, epoch, _SALT_LOCAL, worker, c).permutation(full)
        head = ordered[: full * batch_size].reshape(full, batch_size)[blocks].reshape(-1)
        out[start : start + pos.size] = np.concatenate([head, ordered[full * batch_size :]])
    return out


def rank_steps(yield_costs: list[np.ndarray], batch_size: int) -> np.ndarray:
    """Step layout of one rank from its workers' yield orders, as the DataLoader forms it.

    Args:
        yield_costs: per worker, float64 ``[n]`` costs in yield order (equal ``n``).
        batch_size: per-rank batch size.

    Returns:
        float64 ``[steps, batch_size]``: step ``t`` is worker ``t mod workers``'s batch
        ``t // workers`` (in-order round robin); only full batches.
    """
    workers = len(yield_costs)
    per = min(c.size for c in yield_costs) // batch_size
    blocks = np.stack([c[: per * batch_size].reshape(per, batch_size) for c in yield_costs], axis=1)
    return blocks.reshape(per * workers, batch_size)


def stratified_order(
    strata: np.ndarray,
    num_strata: int,
    batch_size: int,
    seed: int,
    epoch: int,
    worker: int = 0,
    costs: np.ndarray | None = None,
    chunk_batches: int = 1,
) -> np.ndarray:
    """Yield order of a consumer whose windows fall into cost strata (datasets, or cost buckets).

    Each of its batches comes from one stratum and every rank's step ``t`` from the same one.

    Args:
        strata: int64 ``[n]``: stratum of each window, in planned yield order (a stratum's windows
            keep their planned order among themselves).
        num_strata: ``K``; strata are ``0 .. K-1``.
        batch_size: per-rank batch size.
        seed, epoch, worker: the stratum schedule comes from ``(seed, epoch, worker)``: the same on
            every rank, so it aligns when every rank holds the same number of windows per stratum
            (a plan that cuts each stratum into equal ranges per consumer guarantees it; otherwise
            the order is still a permutation, only less balanced).
        costs: float64 ``[n]``; with ``chunk_batches > 1`` each stratum's windows are first
            reordered by ``local_order`` (cost-sorted blocks inside the stratum).

    Returns:
        int64 ``[n]`` permutation. First ``sum_k (c_k // batch_size)`` batches, each from the stratum
        the shared schedule names (a random order of the multiset of full batches), then the
        ``c_k mod batch_size`` leftovers of every stratum, in stratum order (trailing mixed batches).
    """
    strata = np.asarray(strata, dtype=np.int64)
    counts = np.bincount(strata, minlength=num_strata)
    queues = []
    for k in range(num_strata):
        pos = np.flatnonzero(strata == k)
        if costs is not None and chunk_batches > 1 and pos.size:
            pos = pos[
                local_order(
                    np.asarray(costs, dtype=np.float64)[pos],
                    batch_size,
                    chunk_batches,
                    seed,
                    epoch,
                    worker * num_strata + k,
                )
            ]
        queues.append(pos)
    full = counts // batch_size
    # Proportional schedule with a random phase per stratum: stratum k's j-th batch goes at
    # (j + u_k) / full_k of the epoch. Every rank derives the same schedule, and a worker never runs
    # more than about one batch per stratum ahead of its read order (bounded memory), unlike a
    # uniformly random order of the batches.
    phase = rng_for(seed, epoch, _SALT_STRATA, worker).random(num_strata)
    keys = np.concatenate([(np.arange(f) + phase[k]) / f for k, f in enumerate(full.tolist()) if f])
    labels = (
        np.concatenate([np.full(f, k) for k, f in enumerate(full.tolist()) if f])
        if full.any()
        else np.zeros(0, np.int64)
    )
    schedule = labels[np.argsort(keys, kind="stable")] if full.any() else labels
    taken = np.zeros(num_strata, dtype=np.int64)
    out = []
    for k in schedule.tolist():
        out.append(queues[k][taken[k] : taken[k] + batch_size])
        taken[k] += batch_size
    out += [queues[k][taken[k] :] for k in range(num_strata)]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
