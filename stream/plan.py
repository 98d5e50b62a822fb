"""The epoch plan: pure functions of (index arrays, spec, seed, epoch, world size, rank, workers).

No I/O and no global state, so every rank and worker computes the same global plan without
communication, and the plan is simulated and property-tested at any scale (the approach of MosaicML
Streaming's shuffle functions).

An epoch, step by step:

1. Shards are permuted by ``(seed, epoch)``; episodes keep their tar order inside a shard, so each
   worker reads its shards sequentially.
2. Each episode contributes anchors (``stride``, boundary mode, windows per episode, dataset
   weight), drawn by ``(seed, epoch, episode)``.
3. The global window list is cut into ``world_size * num_workers`` contiguous, equal ranges, one per
   consumer ``rank * num_workers + worker``. When there are fewer shards than consumers this splits
   shards by episode ranges (and long episodes by anchor ranges). The remainder ``W mod consumers``
   is dropped, chosen at random per epoch, so every rank yields the same number of samples and
   batches and DDP never waits at the end of an epoch; every other window is yielded exactly once.
4. Each consumer's windows are shuffled by a simulated bounded buffer (count and bytes), the way a
   streaming shuffle buffer mixes them, so the order is known before any I/O and resume is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from epishard.seeding import rng_for

__all__ = ["rng_for"]  # re-exported: the planner's (and tests') name for the one seed convention

_SALT_SHARDS, _SALT_ANCHORS, _SALT_DROP, _SALT_SHUFFLE = 1, 2, 3, 4


@dataclass(frozen=True)
class EpisodeTable:
    """The planner's view of the episodes of one or more datasets (int64 arrays ``[num_episodes]``).

    ``shard``: global shard number; ``lo``/``hi``: anchor range ``[lo, hi)`` for the window spec;
    ``weight``: window-count multiplier (dataset mixing weight); ``cost_bytes``: bytes an episode
    holds in a shuffle buffer while loaded; ``stratum``: optional stratum per episode (e.g. its
    dataset), constant within a shard: each stratum is then dealt to consumers on its own.
    ``gaps``: optional int64 ``[G, 3]`` rows ``(episode, lo, hi)``, sorted and disjoint
    (``break_gaps``): anchors in ``[lo, hi)`` of that episode are left out, because their window
    would cross a recording break (timestamps reset or jump inside the episode).
    """

    shard: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    weight: np.ndarray
    cost_bytes: np.ndarray
    stratum: np.ndarray | None = None
    gaps: np.ndarray | None = None

    @property
    def num_episodes(self) -> int:
        """Episodes in the table (all datasets of a mix)."""
        return int(self.shard.shape[0])


def break_gaps(episodes: np.ndarray, starts: np.ndarray, before: int, after: int) -> np.ndarray:
    """Anchors to leave out around recording breaks, as ``EpisodeTable.gaps``.

    A window of rows ``anchor - before .. anchor + after`` crosses a break at row ``b`` (the first
    row of a new recording segment) when ``b - after <= anchor < b + before``. ``episodes``,
    ``starts``: int64 ``[B]``, the breaks sorted by (episode, row). Overlapping ranges of one
    episode are merged; empty ones (``before == after == 0``) dropped. Returns int64 ``[G, 3]``.
    """
    episodes = np.asarray(episodes, dtype=np.int64)
    lo = np.maximum(np.asarray(starts, dtype=np.int64) - after, 0)
    hi = np.asarray(starts, dtype=np.int64) + before
    if before + after == 0 or episodes.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    span = int(hi.max()) + 1
    reach = np.maximum.accumulate(episodes * span + hi)  # furthest end so far (same episode: keys grow)
    new = np.r_[True, (episodes[1:] != episodes[:-1]) | (episodes[1:] * span + lo[1:] > reach[:-1])]
    first = np.flatnonzero(new)
    return np.stack([episodes[first], lo[first], np.maximum.reduceat(hi, first)], axis=1)


def _in_ranges(lo: np.ndarray, hi: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Bool ``[n]``: ``x[i]`` lies in one of the ranges ``[lo[k], hi[k])`` (sorted, disjoint)."""
    pos = np.searchsorted(lo, x, side="right") - 1
    return (pos >= 0) & (x < hi[np.maximum(pos, 0)])


def _in_gaps(gaps: np.ndarray | None, episode: np.ndarray, anchor: np.ndarray) -> np.ndarray:
    """Bool ``[n]``: anchor ``i`` of episode ``i`` lies in one of ``gaps`` (sorted, disjoint)."""
    if gaps is None or gaps.shape[0] == 0 or anchor.size == 0:
        return np.zeros(anchor.shape, dtype=bool)
    span = int(max(anchor.max(), gaps[:, 2].max())) + 1  # (episode, row) -> one sortable key
    return _in_ranges(gaps[:, 0] * span + gaps[:, 1], gaps[:, 0] * span + gaps[:, 2], episode * span + anchor)


def anchor_counts(lo: np.ndarray, hi: np.ndarray, stride: int, gaps: np.ndarray | None = None) -> np.ndarray:
    """Anchors per episode (int64 ``[E]``): rows ``lo, lo + stride, ... < hi`` outside ``gaps``.

    Counted without listing them.
    """
    counts = np.maximum(-((lo - hi) // stride), 0).astype(np.int64)  # ceil((hi - lo) / stride)
    if gaps is not None and gaps.shape[0]:
        e, first = gaps[:, 0], lo[gaps[:, 0]]
        a, b = np.maximum(gaps[:, 1], first), np.minimum(gaps[:, 2], hi[e])
        # Anchors first + k*stride in [a, b): ceil((b - first) / stride) - ceil((a - first) / stride).
        inside = np.where(b > a, -((first - b) // stride) + ((first - a) // stride), 0)
        counts -= np.bincount(e, weights=inside, minlength=counts.size).astype(np.int64)
    return counts


def shard_order(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    """Permutation of shard numbers for this epoch (identical on every process)."""
    return rng_for(seed, epoch, _SALT_SHARDS).permutation(num_shards)


def episode_order(table: EpisodeTable, seed: int, epoch: int) -> np.ndarray:
    """Episodes in read order: shards permuted, episodes in tar order inside each shard."""
    num_shards = int(table.shard.max()) + 1 if table.num_episodes else 0
    rank_of_shard = np.empty(num_shards, dtype=np.int64)
    rank_of_shard[shard_order(num_shards, seed, epoch)] = np.arange(num_shards)
    return np.lexsort((np.arange(table.num_episodes), rank_of_shard[table.shard]))


def select_anchors(
    lo: int, hi: int, stride: int, per_episode, weight: float, rng: np.random.Generator, gaps: np.ndarray | None = None
) -> np.ndarray:
    """Anchors of one episode for one epoch, ascending (int64). See ``WindowSpec.per_episode``.

    ``weight`` scales the count (stochastic rounding); past all anchors they are drawn again.
    ``gaps``: int64 ``[k, 2]`` anchor ranges ``[lo, hi)``, sorted and disjoint, left out (windows
    across a recording break).
    """
    if weight < 0 or (per_episode is not None and per_episode < 0):
        raise ValueError(f"per_episode ({per_episode}) and weight ({weight}) must not be negative")
    anchors = np.arange(lo, hi, stride, dtype=np.int64)
    if gaps is not None and len(gaps):
        anchors = anchors[~_in_ranges(gaps[:, 0], gaps[:, 1], anchors)]
    if anchors.size == 0:
        return anchors
    if per_episode is None:
        want = float(anchors.size)
    elif isinstance(per_episode, (float, np.floating)):
        want = max(1.0, round(per_episode * anchors.size))
    else:
        want = float(min(int(per_episode), anchors.size))
    want *= weight
    count = int(want) + int(rng.random() < want - int(want))
    if count == anchors.size and weight == 1.0:
        return anchors
    full, rest = divmod(count, anchors.size)
    picks = [anchors] * full + [rng.choice(anchors, size=rest, replace=False)]
    return np.sort(np.concatenate(picks))


@dataclass(frozen=True)
class GlobalPlan:
    """All windows of an epoch in read order, and how they are dealt to consumers.

    ``episode``/``anchor``: int64 ``[W]``; ``per_consumer``: windows each consumer yields;
    ``dropped``: windows left out so that every consumer yields the same number.
    """

    episode: np.ndarray
    anchor: np.ndarray
    per_consumer: int
    dropped: int

    def consumer_slice(self, consumer: int) -> slice:
        """The windows of ``consumer`` (``rank * workers + worker``) in the plan's arrays."""
        return slice(consumer * self.per_consumer, (consumer + 1) * self.per_consumer)


def global_plan(table: EpisodeTable, stride: int, per_episode, seed: int, epoch: int, consumers: int) -> GlobalPlan:
    """Every window of the epoch in read order, trimmed to a multiple of ``consumers``.

    With ``table.stratum``, each stratum's windows are cut into ``consumers`` equal contiguous
    ranges on their own (its remainder dropped at random), and each consumer's ranges are
    interleaved in proportion, episode by episode: every consumer then reads every stratum in the
    same proportion at the same pace, which is what step-wise cost balancing across ranks needs
    when strata (datasets) differ in cost and live in separate shards.
    """
    order = episode_order(table, seed, epoch)
    episode, anchor = _anchors(table, order, stride, per_episode, seed, epoch)
    strata = np.zeros(episode.size, dtype=np.int64) if table.stratum is None else table.stratum[episode]
    cuts = []  # per stratum: (episode, anchor, windows per consumer)
    dropped = 0
    for k in np.unique(strata):
        e_k, a_k = episode[strata == k], anchor[strata == k]
        extra = int(e_k.size % consumers)
        if extra:
            keep = np.ones(e_k.size, dtype=bool)
            keep[rng_for(seed, epoch, _SALT_DROP, int(k)).choice(e_k.size, size=extra, replace=False)] = False
            e_k, a_k = e_k[keep], a_k[keep]
        cuts.append((e_k, a_k, e_k.size // consumers))
        dropped += extra
    if len(cuts) == 1:
        e, a, n = cuts[0]
        return GlobalPlan(episode=e, anchor=a, per_consumer=n, dropped=dropped)
    parts_e, parts_a = [], []
    for c in range(consumers):
        pieces = [(e[c * n : (c + 1) * n], a[c * n : (c + 1) * n]) for e, a, n in cuts]
        e_c, a_c = _interleave(pieces)
        parts_e.append(e_c)
        parts_a.append(a_c)
    return GlobalPlan(
        episode=np.concatenate(parts_e),
        anchor=np.concatenate(parts_a),
        per_consumer=sum(n for _, _, n in cuts),
        dropped=dropped,
    )


def _anchors(table: EpisodeTable, order: np.ndarray, stride: int, per_episode, seed: int, epoch: int):
    """(episode, anchor) int64 arrays of every selected window, episodes in ``order``."""
    if per_episode is None and np.all(table.weight[order] == 1.0):
        # Every anchor of every episode: vectorised, no per-episode random draws.
        counts = anchor_counts(table.lo[order], table.hi[order], stride)
        episode = np.repeat(order.astype(np.int64), counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        anchor = (np.repeat(table.lo[order], counts) + (np.arange(episode.size) - first) * stride).astype(np.int64)
        keep = ~_in_gaps(table.gaps, episode, anchor)
        return episode[keep], anchor[keep]
    gaps = table.gaps if table.gaps is not None else np.zeros((0, 3), dtype=np.int64)
    gap_first = np.searchsorted(gaps[:, 0], np.arange(table.num_episodes + 1))
    episodes, anchors = [], []
    for e in order:
        a = select_anchors(
            int(table.lo[e]),
            int(table.hi[e]),
            stride,
            per_episode,
            float(table.weight[e]),
            rng_for(seed, epoch, _SALT_ANCHORS, int(e)),
            gaps[gap_first[e] : gap_first[e + 1], 1:],
        )
        episodes.append(np.full(a.size, e, dtype=np.int64))
        anchors.append(a)
    if not episodes:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(episodes), np.concatenate(anchors)


def _interleave(pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-stratum window runs, keeping each episode's windows together.

    Ordered by how far through its stratum's part the episode's middle window lies (a proportional
    interleave).
    """
    runs = []  # (key, stratum, episode windows)
    for k, (e, a) in enumerate(pieces):
        if e.size == 0:
            continue
        starts = np.flatnonzero(np.r_[True, e[1:] != e[:-1]])
        ends = np.r_[starts[1:], e.size]
        for s, t in zip(starts.tolist(), ends.tolist(), strict=False):
            runs.append(((s + t) / 2 / e.size, k, e[s:t], a[s:t]))
    runs.sort(key=lambda r: (r[0], r[1]))
    if not runs:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate([r[2] for r in runs]), np.concatenate([r[3] for r in runs])


def buffer_shuffle(
    window_episode: np.ndarray, cost_bytes: np.ndarray, capacity: int, capacity_bytes: int, rng: np.random.Generator
) -> np.ndarray:
    """Yield order of windows that arrive episode by episode through a bounded shuffle buffer.

    Args:
        window_episode: int64 ``[n]`` episode of each window, in arrival (read) order; an episode's
            windows are contiguous and arrive together.
        cost_bytes: bytes each episode (indexed by episode id) holds while any of its windows waits.
        capacity: windows the buffer holds before it starts yielding (webdataset's ``bufsize``).
        capacity_bytes: bytes of loaded episodes the buffer holds before it starts yielding.

    Returns:
        int64 ``[n]``: window positions (into ``window_episode``) in yield order; a permutation.
    """
    n = window_episode.size
    out = np.empty(n, dtype=np.int64)
    buffer: list[int] = []
    remaining: dict[int, int] = {}
    loaded_bytes = 0
    produced = 0
    starts = (
        np.flatnonzero(np.r_[True, window_episode[1:] != window_episode[:-1]]) if n else np.zeros(0, dtype=np.int64)
    )
    ends = np.r_[starts[1:], n]
    for a, b in zip(starts.tolist(), ends.tolist(), strict=False):
        e = int(window_episode[a])
        buffer.extend(range(a, b))
        remaining[e] = remaining.get(e, 0) + (b - a)
        loaded_bytes += int(cost_bytes[e])
        while buffer and (len(buffer) > capacity or loaded_bytes > capacity_bytes):
            produced, loaded_bytes = _pop(
                buffer, remaining, window_episode, cost_bytes, rng, out, produced, loaded_bytes
            )
    while buffer:
        produced, loaded_bytes = _pop(buffer, remaining, window_episode, cost_bytes, rng, out, produced, loaded_bytes)
    return out


def _pop(buffer, remaining, window_episode, cost_bytes, rng, out, produced, loaded_bytes):
    j = int(rng.integers(len(buffer)))
    buffer[j], buffer[-1] = buffer[-1], buffer[j]
    w = buffer.pop()
    out[produced] = w
    e = int(window_episode[w])
    remaining[e] -= 1
    if remaining[e] == 0:
        del remaining[e]
        loaded_bytes -= int(cost_bytes[e])
    return produced + 1, loaded_bytes


@dataclass(frozen=True)
class WorkerPlan:
    """One consumer's epoch: its windows in yield order (int64 ``[n]`` each)."""

    episode: np.ndarray
    anchor: np.ndarray
    read_order: np.ndarray  # int64 [episodes]: this consumer's episodes in arrival (read) order
    dropped: int
    total_windows: int

    def __len__(self) -> int:
        return int(self.episode.size)


def worker_plan(
    table: EpisodeTable,
    *,
    stride: int,
    per_episode,
    seed: int,
    epoch: int,
    world_size: int,
    rank: int,
    num_workers: int,
    worker: int,
    shuffle_windows: int,
    shuffle_bytes: int,
) -> WorkerPlan:
    """The windows consumer ``rank * num_workers + worker`` yields this epoch, in yield order.

    Raises:
        ValueError: rank or worker out of range.
    """
    if not (0 <= rank < world_size and 0 <= worker < num_workers):
        raise ValueError(f"rank {rank}/{world_size} worker {worker}/{num_workers} out of range")
    plan = global_plan(table, stride, per_episode, seed, epoch, world_size * num_workers)
    part = plan.consumer_slice(rank * num_workers + worker)
    episode, anchor = plan.episode[part], plan.anchor[part]
    consumer = rank * num_workers + worker
    order = buffer_shuffle(
        episode, table.cost_bytes, shuffle_windows, shuffle_bytes, rng_for(seed, epoch, _SALT_SHUFFLE, consumer)
    )
    firsts = np.flatnonzero(np.r_[True, episode[1:] != episode[:-1]]) if episode.size else np.zeros(0, dtype=np.int64)
    return WorkerPlan(
        episode=episode[order],
        anchor=anchor[order],
        read_order=episode[firsts],
        dropped=plan.dropped,
        total_windows=int(plan.episode.size + plan.dropped),
    )
