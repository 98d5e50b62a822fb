"""Rank-local balancing for a streaming reader: reorder one consumer's planned windows so that the
batches of a step have matching costs on every rank, without moving a window to another rank.

The streaming reader (``stream.plan``) gives each consumer ``(rank, worker)`` a fixed list of
windows from its own shards, in a yield order simulated from its shuffle buffer; every consumer of
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
"""

from __future__ import annotations

import numpy as np

_SALT_LOCAL = 21


def local_order(costs: np.ndarray, batch_size: int, chunk_batches: int, seed: int, epoch: int,
                worker: int = 0) -> np.ndarray:
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
        blocks = np.random.default_rng([seed & 0xFFFFFFFF, epoch, _SALT_LOCAL, worker, c]).permutation(full)
        head = ordered[: full * batch_size].reshape(full, batch_size)[blocks].reshape(-1)
        out[start:start + pos.size] = np.concatenate([head, ordered[full * batch_size:]])
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
