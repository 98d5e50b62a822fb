"""The epoch plan: pure functions of (index arrays, spec, seed, epoch, world size, rank, workers).

No I/O and no global state, so every rank and worker computes the same global plan without
communication, and the plan is simulated and property-tested at any scale (the approach of MosaicML
Streaming's shuffle functions).

An epoch, step by step:

1. Shards are permuted by ``(seed, epoch)``; episodes keep their tar order inside a shard, so each
   worker reads its shards sequentially.
2. Each episode's window count is ``floor`` or ``ceil`` of ``expected_windows`` (``stride``,
   boundary mode, windows per episode, dataset weight): ``window_counts``, O(E) array work, the
   rounding drawn by a counter-based hash of ``(seed, epoch, episode)``.
3. The epoch's window list (episodes in read order, each one's anchors ascending) is cut into
   ``world_size * num_workers`` contiguous, equal ranges, one per consumer
   ``rank * num_workers + worker``, from the counts alone (``consumer_plan``): a consumer lists only
   its own windows, drawing its episodes' anchors (``episode_windows``: ``r`` distinct anchors of
   an episode by counter-based draws of ``(seed, epoch, episode)``), so its cost is O(E) array
   passes plus O(its windows), flat in memory at any dataset size, and no rank or worker needs
   another's plan. When there are fewer shards than consumers this splits shards by episode ranges
   (and long episodes by anchor ranges). The remainder ``W mod consumers`` is dropped, chosen at
   random per epoch, so every rank yields the same number of samples and batches and DDP never
   waits at the end of an epoch; every other window is yielded exactly once.
4. Each consumer's windows are shuffled at plan level (``pool_shuffle``, index only): consecutive
   pools of about ``shuffle_episodes`` episodes in read order (equal sizes), the windows of a pool in a random order
   (one stable argsort of (pool, random key), by ``(seed, epoch, consumer, level)``), each episode's
   windows filling its random slots in time order (decoded forward, once). Small pools keep an
   episode's windows close together in time (one decode serves several); large pools give
   diversity near i.i.d. (``expected_distinct``; ``budget_shuffle_episodes``: at most ``8 x batch_size``).
5. Optional declared stages, pure functions of the consumer's windows: ``cost`` (a predicted cost
   per window), ``order`` (a permutation of the yield order, e.g. ``balance.streaming``'s
   cost-balanced order) and ``group`` (the order in whole batches of one stratum, leaving out each
   stratum's count modulo the batch size: ``stream.mixplan.BatchByDataset``).
6. An optional ``deal`` stage replaces step 3 (``DealStage``, e.g. ``balance.globaldeal``: every
   step's windows dealt to ranks by cost from the global list); it may fix each consumer's yield
   order itself (``keeps_order``: step 4 and the order and group stages are then skipped). It deals
   the epoch's whole window list (``epoch_windows``), so every consumer lists every window then
   (``level_plan``), not only its own (``consumer_plan``).

Plan changes: the plan of a given ``(seed, epoch, layout)`` changes only with the reader's
``STATE_VERSION`` (``stream.dataset``); version 3 (the pool shuffle and counter-based draws)
replaced the simulated buffer of decoded episodes and the per-episode generators of version 2.

Elastic resume (``Progress``): a mid-epoch state records, per consumer of the layout that saved it,
how many windows it took from the front of its yield order. The windows not yet taken, kept in plan
order, are dealt again to the consumers of the new layout exactly as in step 3 (equal contiguous
ranges, per stratum; the remainder ``R mod consumers`` left out at random by ``(seed, epoch)``),
then steps 4-5 run per new consumer. Layouts can change again mid-epoch: each change adds a level.
The replay lists the epoch's windows (int32 where they fit) and every old consumer's yield order,
all vectorised.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from epishard.seeding import rng_for

from .usercode import UserCodeError, call_user, describe

if TYPE_CHECKING:
    from .spec import WindowSpec

__all__ = ["rng_for"]  # re-exported: the planner's (and tests') name for the one seed convention

_SALT_SHARDS, _SALT_ANCHORS, _SALT_DROP, _SALT_SHUFFLE = 1, 2, 3, 4
_SALT_GROUP = 31  # the group stage's rng (balance: 11-22)


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
        return self.rank * self.num_workers + self.worker

    @property
    def consumers(self) -> int:
        return self.world_size * self.num_workers

    @classmethod
    def of_consumer(cls, consumer: int, world_size: int, num_workers: int) -> World:
        """The ``World`` of consumer id ``consumer`` in a layout."""
        return cls(consumer // num_workers, world_size, consumer % num_workers, num_workers)

    def with_worker(self, worker: int, num_workers: int) -> World:
        return dataclasses.replace(self, worker=worker, num_workers=num_workers)


@dataclass(frozen=True)
class PerEpisode:
    """Windows an episode gives per epoch (before its dataset weight).

    ``count``: that many anchors (at most all), drawn by ``(seed, epoch, episode)``;
    ``fraction``: that share of its anchors, in (0, 1], rounded, at least 1 when it has any;
    neither: every anchor. ``expected_windows`` is the one rule that turns this into numbers.

    Raises:
        ValueError: both given, a negative count, or a fraction outside (0, 1].
    """

    count: int | None = None
    fraction: float | None = None

    def __post_init__(self):
        if self.count is not None and self.fraction is not None:
            raise ValueError(f"per episode: give a count or a fraction, not both ({self.count}, {self.fraction})")
        if self.count is not None and (not isinstance(self.count, (int, np.integer)) or self.count < 0):
            raise ValueError(f"per-episode window count must be an int >= 0, not {self.count!r}")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"per-episode window fraction must be in (0, 1], not {self.fraction!r}")

    @classmethod
    def of(cls, value: PerEpisode | float | int | None) -> PerEpisode:
        """``value`` as a ``PerEpisode``.

        The old ambiguous forms (an int: a count, a float: a fraction) still work with a
        ``DeprecationWarning``.
        """
        if value is None:
            return cls()
        if isinstance(value, PerEpisode):
            return value
        kind = "fraction" if isinstance(value, (float, np.floating)) else "count"
        warnings.warn(
            f"per_episode={value!r} is deprecated (1 meant one window, 1.0 all): use "
            f"PerEpisode({kind}={value!r}) (WindowSpec(per_episode_{kind}=...))",
            DeprecationWarning,
            stacklevel=3,
        )
        return cls(fraction=float(value)) if kind == "fraction" else cls(count=int(value))

    @property
    def all(self) -> bool:
        return self.count is None and self.fraction is None


def expected_windows(anchors: np.ndarray, per_episode: PerEpisode, weight: np.ndarray | float = 1.0) -> np.ndarray:
    """Windows per episode per epoch (float64 ``[E]``, before stochastic rounding of the weight).

    ``anchors``: int64 ``[E]`` anchors each episode has (``anchor_counts``); ``weight``: dataset
    weight per episode. The planner draws ``floor`` or ``ceil`` of this (``select_anchors``) and the
    shuffle buffer's byte estimate (``episode_table``) uses it: one rule for both.
    """
    n = np.asarray(anchors, dtype=np.float64)
    if per_episode.fraction is not None:
        want = np.where(n > 0, np.maximum(1.0, np.round(per_episode.fraction * n)), 0.0)
    elif per_episode.count is not None:
        want = np.minimum(n, float(per_episode.count))
    else:
        want = n
    return want * np.asarray(weight, dtype=np.float64)


@dataclass(frozen=True)
class EpisodeTable:
    """The planner's view of the episodes of one or more datasets (int64 arrays ``[num_episodes]``).

    ``shard``: global shard number; ``lo``/``hi``: anchor range ``[lo, hi)`` for the window spec;
    ``weight``: window-count multiplier (dataset mixing weight); ``cost_bytes``: optional, bytes an
    episode holds while loaded (the plan does not use it since the buffer shuffle went; kept for
    ``buffer_shuffle``'s models); ``stratum``: optional stratum per episode (e.g. its
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


def episode_table(
    spec: WindowSpec,
    index,
    cameras: dict[str, np.ndarray],
    *,
    weight: float = 1.0,
    keep: np.ndarray | None = None,
) -> EpisodeTable:
    """The planner's ``EpisodeTable`` of one dataset for a window spec (pure: index arrays in, arrays out).

    Args:
        spec: the ``WindowSpec`` (its offsets, boundary mode, stride, windows per episode).
        index: the dataset's ``shardwriter.index.WindowIndex``.
        cameras: camera -> frame offsets the windows read (``WindowSpec.camera_offsets``).
        weight: the dataset's mixing weight (windows per episode multiplier).
        keep: optional bool ``[num_episodes]``: episodes left out get no windows (their anchor
            range is emptied; episode numbers stay), e.g. a read-time episode selection.

    Returns:
        ``EpisodeTable`` with shard numbers local to the dataset. Anchors: ``boundary="inside"``:
        rows whose every offset lies inside the episode and its recording segment (``gaps``);
        ``"pad"``: every row. No ``cost_bytes``: the plan-level shuffle needs no estimate of a
        loaded episode's bytes (the look-ahead reader bounds its own cache).
    """
    ix = index
    rows = spec.row_offsets(list(cameras))
    if spec.boundary == "pad":
        lo, hi = ix.window_start.astype(np.int64), ix.window_stop.astype(np.int64)
        gaps = np.zeros((0, 3), dtype=np.int64)  # windows across a break are padded instead
    else:
        before, after = max(0, -int(rows.min())), max(0, int(rows.max()))
        lo, hi = (ix.window_start + before).astype(np.int64), (ix.window_stop - after).astype(np.int64)
        # A recording break inside an episode is an episode boundary for windows.
        owner = np.repeat(np.arange(ix.num_episodes, dtype=np.int64), np.diff(ix.segment_offsets))
        gaps = break_gaps(owner, ix.segment_starts, before, after)
    if keep is not None:
        hi = np.where(np.asarray(keep, dtype=bool), hi, lo)
        gaps = gaps[np.asarray(keep, dtype=bool)[gaps[:, 0]]] if gaps.shape[0] else gaps
    return EpisodeTable(
        shard=ix.shard.astype(np.int64),
        lo=lo,
        hi=hi,
        weight=np.full(ix.num_episodes, float(weight)),
        gaps=gaps if gaps.shape[0] else None,
    )


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
    # A stable sort by shard rank keeps tar order inside a shard (timsort: fast on the runs of a table in shard order).
    return np.argsort(rank_of_shard[table.shard], kind="stable").astype(np.int64)


def _key(seed: int, epoch: int, salt: int) -> np.uint64:
    """A 64-bit key of ``(seed, epoch, salt)`` for the counter-based draws (``_uniform``)."""
    return np.uint64(rng_for(seed, epoch, salt).integers(0, 1 << 63))


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea & Flood 2014): a bijective 64-bit mix, uint64 in and out."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _uniform(key: np.uint64, *lanes: np.ndarray) -> np.ndarray:
    """Float64 in [0, 1), one per element: a counter-based hash of ``(key, *lanes)`` (int arrays, one shape).

    Counter-based (as Philox or JAX's threefry keys): element ``i`` depends only on the key and
    ``lanes[..][i]``, so any consumer draws the numbers of its own episodes alone and gets the same
    values as a draw over all episodes.
    """
    h = np.full(np.shape(lanes[0]), key, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for lane in lanes:
            h = _mix(h ^ _mix(np.asarray(lane).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def window_counts(table: EpisodeTable, stride: int, per_episode: PerEpisode | None, seed: int, epoch: int):
    """Windows each episode gives in ``epoch`` (int64 ``[E]``, by episode number).

    ``floor`` or ``ceil`` of ``expected_windows`` (stochastic rounding, by a counter-based draw of
    ``(seed, epoch, episode)``); every anchor exactly when that is the expectation. O(E), vectorised.

    Raises:
        ValueError: a negative weight.
    """
    per_episode = PerEpisode.of(per_episode)
    n = anchor_counts(table.lo, table.hi, stride, table.gaps)
    weight = np.asarray(table.weight, dtype=np.float64)
    if np.any(weight < 0):
        raise ValueError(f"weights must not be negative (episode {int(np.argmax(weight < 0))})")
    if per_episode.all and np.all(weight == 1.0):
        return n
    want = expected_windows(n, per_episode, weight)
    base = np.floor(want)
    if np.array_equal(base, want):  # whole counts (no weight): nothing to round
        return base.astype(np.int64)
    up = _uniform(_key(seed, epoch, _SALT_ANCHORS), np.arange(n.size)) < want - base
    return np.where(n > 0, base + up, 0).astype(np.int64)


def _distinct(n: np.ndarray, k: np.ndarray, episode: np.ndarray, key: np.uint64):
    """``k[i]`` distinct values of ``[0, n[i])`` per entry ``i`` (``k <= n``), uniformly at random.

    Returns (owner, value): int64 arrays, ``owner`` ascending, values ascending within an owner.
    Draws are counter-based on ``(key, episode[i], slot, round)``; duplicates within an entry are
    drawn again (the next round) until none is left, and entries wanting more than half their
    values draw the ones they leave out instead, so the work is O(sum k) and every entry's values
    depend on its own episode only.
    """
    flip = 2 * k > n
    m = np.where(flip, n - k, k)
    owner = np.repeat(np.arange(n.size), m)
    slot = np.arange(owner.size) - np.repeat(np.cumsum(m) - m, m)
    span = int(n.max(initial=0)) + 1  # (owner, value) as one sortable int64 key
    value = (_uniform(key, episode[owner], slot, np.zeros(owner.size, np.int64)) * n[owner]).astype(np.int64)
    check, rnd = np.arange(owner.size), 0
    while check.size:
        # Stable: of equal values within an entry the later slot is drawn again (next round);
        # only entries with a redraw are checked again.
        o = np.argsort(owner[check] * span + value[check], kind="stable")
        k = owner[check[o]] * span + value[check[o]]
        redo = check[o[1:][k[1:] == k[:-1]]]
        if not redo.size:
            break
        rnd += 1
        u = _uniform(key, episode[owner[redo]], slot[redo], np.full(redo.size, rnd))
        value[redo] = (u * n[owner[redo]]).astype(np.int64)
        again = np.zeros(n.size, dtype=bool)
        again[owner[redo]] = True
        check = np.flatnonzero(again[owner])
    order = np.argsort(owner * span + value, kind="stable")
    owner, value = owner[order], value[order]
    if not flip.any():
        return owner, value
    # Entries that drew the values they leave out: every other value of [0, n).
    keep = ~flip[owner]
    f = np.flatnonzero(flip)
    all_owner = np.repeat(f, n[f])
    all_value = np.arange(all_owner.size) - np.repeat(np.cumsum(n[f]) - n[f], n[f])
    out = ~np.isin(all_owner * span + all_value, owner[~keep] * span + value[~keep])
    owner = np.r_[owner[keep], all_owner[out]]
    value = np.r_[value[keep], all_value[out]]
    order = np.argsort(owner * span + value, kind="stable")
    return owner[order], value[order]


def _nth_anchors(table: EpisodeTable, episode: np.ndarray, index: np.ndarray, stride: int) -> np.ndarray:
    """The ``index``-th anchor (0-based, outside ``table.gaps``) of each ``episode`` (int64 ``[n]``)."""
    anchor = table.lo[episode] + index * stride
    if table.gaps is None or not table.gaps.shape[0] or not episode.size:
        return anchor
    gapped = np.flatnonzero(np.isin(episode, table.gaps[:, 0]))
    if gapped.size:  # enumerate the few episodes with recording breaks, their gaps left out
        eps = np.unique(episode[gapped])
        raw = anchor_counts(table.lo[eps], table.hi[eps], stride)
        owner = np.repeat(eps, raw)
        cand = np.repeat(table.lo[eps], raw) + (np.arange(owner.size) - np.repeat(np.cumsum(raw) - raw, raw)) * stride
        ok = ~_in_gaps(table.gaps, owner, cand)
        owner, cand = owner[ok], cand[ok]
        first = np.searchsorted(owner, eps)
        anchor[gapped] = cand[first[np.searchsorted(eps, episode[gapped])] + index[gapped]]
    return anchor


def episode_windows(
    table: EpisodeTable,
    episodes: np.ndarray,
    counts: np.ndarray,
    stride: int,
    seed: int,
    epoch: int,
    first: np.ndarray | None = None,
    stop: np.ndarray | None = None,
    anchors: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The windows of ``episodes`` (int64 ``[K]``, in this order), each's anchors ascending.

    ``counts``: int64 ``[K]`` windows each gives (``window_counts``). Episode ``e`` with ``n``
    anchors and count ``c = q * n + r`` takes every anchor ``q`` times and ``r`` distinct ones at
    random (``_distinct``, by ``(seed, epoch, e)``), sorted. ``first``/``stop``: optional int64
    ``[K]``, only the windows ``[first, stop)`` of each episode's sorted list. ``anchors``: optional
    int64 ``[K]``, their anchor counts (``anchor_counts``) when known. Returns (episode,
    anchor): int64 ``[n]``. O(windows of these episodes), whatever the table's size.
    """
    episodes = np.asarray(episodes, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if anchors is None:
        anchors = anchor_counts(table.lo, table.hi, stride, table.gaps)[episodes]
    n = np.asarray(anchors, dtype=np.int64)
    full, rest = np.divmod(counts, np.maximum(n, 1))
    owner = np.repeat(np.arange(episodes.size), full * n)
    index = np.arange(owner.size) - np.repeat(np.cumsum(full * n) - full * n, full * n)
    index //= np.repeat(np.maximum(full, 1), full * n)  # q copies of each anchor: 0, 0, 1, 1, ...
    if rest.any():
        r_owner, r_index = _distinct(n, rest, episodes, _key(seed, epoch, _SALT_ANCHORS + 100))
        owner, index = np.r_[owner, r_owner], np.r_[index, r_index]
        order = np.argsort(owner * (int(n.max()) + 1) + index, kind="stable")
        owner, index = owner[order], index[order]
    if first is not None and stop is not None:
        rank = np.arange(owner.size) - np.repeat(np.cumsum(counts) - counts, counts)
        keep = (rank >= first[owner]) & (rank < stop[owner])
        owner, index = owner[keep], index[keep]
    episode = episodes[owner]
    return episode, _nth_anchors(table, episode, index, stride)


def select_anchors(
    lo: int,
    hi: int,
    stride: int,
    per_episode: PerEpisode | None,
    weight: float,
    rng: np.random.Generator,
    gaps: np.ndarray | None = None,
) -> np.ndarray:
    """Anchors of one episode for one epoch, ascending (int64): the plan's rule on one episode.

    ``window_counts`` and ``episode_windows`` on a one-episode table, keyed by a number drawn from
    ``rng``. ``weight`` scales the count (stochastic rounding); past all anchors they are drawn
    again. ``gaps``: int64 ``[k, 2]`` anchor ranges ``[lo, hi)``, sorted and disjoint, left out.

    Raises:
        ValueError: a negative weight (or a bad ``PerEpisode``).
    """
    per_episode = PerEpisode.of(per_episode)
    if weight < 0:
        raise ValueError(f"weight ({weight}) must not be negative")
    g = None if gaps is None or not len(gaps) else np.c_[np.zeros(len(gaps), np.int64), np.asarray(gaps, np.int64)]
    one = EpisodeTable(
        shard=np.zeros(1, np.int64),
        lo=np.array([lo], np.int64),
        hi=np.array([hi], np.int64),
        weight=np.array([float(weight)]),
        gaps=g,
    )
    seed = int(rng.integers(0, 1 << 63))
    counts = window_counts(one, stride, per_episode, seed, 0)
    return episode_windows(one, np.zeros(1, np.int64), counts, stride, seed, 0)[1]


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


def _compact(x: np.ndarray) -> np.ndarray:
    """``x`` as int32 when every value fits (halves a global plan's memory), else int64."""
    return x.astype(np.int32) if x.size == 0 or (x.min() >= -(1 << 31) and x.max() < 1 << 31) else x


@dataclass(frozen=True)
class _Cut:
    """One stratum's windows of an epoch, in read order, as counts (nothing listed).

    ``episodes``/``counts``/``anchors``: int64 ``[K]`` its episodes with windows in read order,
    their window counts and anchor counts; ``ends``: cumulative counts; ``drops``: sorted positions
    (into the stratum's window list) left out; ``per_consumer``: windows each consumer takes.
    """

    stratum: int
    episodes: np.ndarray
    counts: np.ndarray
    anchors: np.ndarray
    ends: np.ndarray
    drops: np.ndarray
    per_consumer: int

    def consumer_range(self, consumer: int) -> tuple[int, int]:
        """Positions ``[g0, g1)`` of the stratum's window list spanned by ``consumer``'s windows."""
        m = self.per_consumer
        if m == 0:
            return 0, 0
        adj = self.drops - np.arange(self.drops.size)  # kept window j sits at position j + #(adj <= j)
        first, last = consumer * m, (consumer + 1) * m - 1
        return first + int(np.searchsorted(adj, first, side="right")), last + int(
            np.searchsorted(adj, last, side="right")
        ) + 1


def _cuts(
    table: EpisodeTable,
    counts: np.ndarray,
    anchors: np.ndarray,
    order: np.ndarray,
    consumers: int,
    seed: int,
    epoch: int,
) -> list[_Cut]:
    """Per stratum, its ``_Cut`` (episodes in ``order``): ``deal``'s cut of the listed windows, from counts."""
    live = order[counts[order] > 0]
    groups = (
        [(0, live)]
        if table.stratum is None
        else [(k, live[table.stratum[live] == k]) for k in np.unique(table.stratum[live])]
    )
    cuts = []
    for k, eps in groups:
        if not eps.size:
            continue
        ends = np.cumsum(counts[eps])
        total = int(ends[-1])
        extra = total % consumers
        drops = np.zeros(0, dtype=np.int64)
        if extra:
            drops = np.sort(rng_for(seed, epoch, _SALT_DROP, int(k)).choice(total, size=extra, replace=False))
        cuts.append(_Cut(int(k), eps, counts[eps], anchors[eps], ends, drops.astype(np.int64), total // consumers))
    return cuts


def _cut_windows(table: EpisodeTable, cut: _Cut, consumer: int, stride: int, seed: int, epoch: int):
    """``consumer``'s windows of one stratum (episode, anchor int64), listing only those."""
    g0, g1 = cut.consumer_range(consumer)
    if g1 <= g0:
        return _empty_pair()
    a, b = int(np.searchsorted(cut.ends, g0, side="right")), int(np.searchsorted(cut.ends, g1 - 1, side="right")) + 1
    starts = cut.ends[a:b] - cut.counts[a:b]
    first = np.maximum(g0 - starts, 0)
    stop = np.minimum(g1 - starts, cut.counts[a:b])
    episode, anchor = episode_windows(
        table, cut.episodes[a:b], cut.counts[a:b], stride, seed, epoch, first, stop, cut.anchors[a:b]
    )
    inside = cut.drops[(cut.drops >= g0) & (cut.drops < g1)] - g0
    if inside.size:
        keep = np.ones(episode.size, dtype=bool)
        keep[inside] = False
        episode, anchor = episode[keep], anchor[keep]
    return episode, anchor


def global_plan(
    table: EpisodeTable, stride: int, per_episode: PerEpisode | None, seed: int, epoch: int, consumers: int
) -> GlobalPlan:
    """Every window of the epoch in read order, trimmed to a multiple of ``consumers``.

    With ``table.stratum``, each stratum's windows are cut into ``consumers`` equal contiguous
    ranges on their own (its remainder dropped at random), and each consumer's ranges are
    interleaved in proportion, episode by episode: every consumer then reads every stratum in the
    same proportion at the same pace, which is what step-wise cost balancing across ranks needs
    when strata (datasets) differ in cost and live in separate shards. ``consumer_plan`` lists one
    consumer's part alone, identical to its slice of this plan.
    """
    cuts = _epoch_cuts(table, stride, per_episode, seed, epoch, consumers)
    parts = [_consumer_part(table, cuts, c, stride, seed, epoch) for c in range(consumers)]
    return GlobalPlan(
        episode=_compact(np.concatenate([e for e, _ in parts])),
        anchor=_compact(np.concatenate([a for _, a in parts])),
        per_consumer=sum(c.per_consumer for c in cuts),
        dropped=sum(c.drops.size for c in cuts),
    )


@dataclass(frozen=True)
class EpochCuts:
    """The shared, O(E) part of an epoch's plan for one layout: where every consumer's windows start.

    What ``consumer_plan`` computes before listing a consumer's windows (read order, window counts,
    per-stratum cut and drops), for ``(stride, per_episode, seed, epoch, consumers)``. Computed once
    per rank (``WindowDataset.set_epoch``, before the DataLoader forks its workers), it spares each
    worker that pass: its plan is then O(its windows).
    """

    key: tuple
    cuts: tuple[_Cut, ...]


def epoch_cuts(
    table: EpisodeTable, stride: int, per_episode: PerEpisode | None, seed: int, epoch: int, consumers: int
) -> EpochCuts:
    """``EpochCuts`` of an epoch and layout (a pure function; O(E) array passes)."""
    key = (stride, PerEpisode.of(per_episode), seed, epoch, consumers)
    return EpochCuts(key, tuple(_epoch_cuts(table, stride, per_episode, seed, epoch, consumers)))


def consumer_plan(
    table: EpisodeTable,
    stride: int,
    per_episode: PerEpisode | None,
    seed: int,
    epoch: int,
    consumers: int,
    consumer: int,
    shared: EpochCuts | None = None,
) -> GlobalPlan:
    """Consumer ``consumer``'s part of ``global_plan`` alone, in read order (int64 arrays).

    O(E) array work over the table (read order, counts, cut points) plus O(its windows): no other
    consumer's window is listed, so a worker's planning stays flat in memory at any dataset size.
    ``shared``: that O(E) part computed beforehand (``epoch_cuts``), used when it is of these
    arguments. ``per_consumer`` and ``dropped`` are the global plan's.
    """
    if shared is not None and shared.key == (stride, PerEpisode.of(per_episode), seed, epoch, consumers):
        cuts = list(shared.cuts)
    else:
        cuts = _epoch_cuts(table, stride, per_episode, seed, epoch, consumers)
    episode, anchor = _consumer_part(table, cuts, consumer, stride, seed, epoch)
    return GlobalPlan(episode, anchor, sum(c.per_consumer for c in cuts), sum(c.drops.size for c in cuts))


def epoch_windows(
    table: EpisodeTable, stride: int, per_episode: PerEpisode | None, seed: int, epoch: int
) -> tuple[np.ndarray, np.ndarray]:
    """Every window of the epoch in read order, nothing left out: (episode, anchor) int64 ``[W]``.

    The list a ``DealStage`` deals (episodes in ``episode_order``, each one's anchors ascending, as
    ``episode_windows`` draws them); O(W).
    """
    order = episode_order(table, seed, epoch)
    counts = window_counts(table, stride, per_episode, seed, epoch)
    return episode_windows(table, order, counts[order], stride, seed, epoch)


def plan_shape(
    table: EpisodeTable, stride: int, per_episode: PerEpisode | None, seed: int, epoch: int, consumers: int
) -> tuple[np.ndarray, int]:
    """Windows each consumer holds of each stratum (int64 ``[strata]``) and the windows dropped, from counts alone.

    The same on every consumer (the deal is per stratum); O(E), nothing listed.
    """
    cuts = _epoch_cuts(table, stride, per_episode, seed, epoch, consumers)
    strata = 1 if table.stratum is None else int(table.stratum.max(initial=0)) + 1
    per = np.zeros(strata, dtype=np.int64)
    for cut in cuts:
        per[cut.stratum] = cut.per_consumer
    return per, sum(c.drops.size for c in cuts)


def _epoch_cuts(table, stride, per_episode, seed, epoch, consumers) -> list[_Cut]:
    order = episode_order(table, seed, epoch)
    counts = window_counts(table, stride, per_episode, seed, epoch)
    anchors = anchor_counts(table.lo, table.hi, stride, table.gaps)
    return _cuts(table, counts, anchors, order, consumers, seed, epoch)


def _consumer_part(table, cuts, consumer, stride, seed, epoch) -> tuple[np.ndarray, np.ndarray]:
    pieces = [_cut_windows(table, cut, consumer, stride, seed, epoch) for cut in cuts]
    if len(pieces) == 1:
        return pieces[0]
    return _interleave(pieces) if pieces else _empty_pair()


def _empty_pair() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)


def deal(
    table: EpisodeTable, episode: np.ndarray, anchor: np.ndarray, consumers: int, seed: int, epoch: int, level: int = 0
) -> GlobalPlan:
    """Windows (in plan order) dealt to ``consumers`` in equal contiguous ranges, per stratum.

    ``level`` 0 is the epoch's own plan (``global_plan`` deals it from counts, the same way);
    level ``k > 0`` deals what was left after the ``k``-th layout change (elastic resume). Each
    stratum's remainder ``n mod consumers`` is left out, at random by ``(seed, epoch, stratum, level)``.
    """
    strata = np.zeros(episode.size, dtype=np.int64) if table.stratum is None else table.stratum[episode]
    cuts = []  # per stratum: (episode, anchor, windows per consumer)
    dropped = 0
    for k in np.unique(strata):
        e_k, a_k = episode[strata == k], anchor[strata == k]
        extra = int(e_k.size % consumers)
        if extra:
            keep = np.ones(e_k.size, dtype=bool)
            salt = (int(k),) if level == 0 else (int(k), level)
            keep[rng_for(seed, epoch, _SALT_DROP, *salt).choice(e_k.size, size=extra, replace=False)] = False
            e_k, a_k = e_k[keep], a_k[keep]
        cuts.append((e_k, a_k, e_k.size // consumers))
        dropped += extra
    if not cuts:
        empty = np.zeros(0, dtype=np.int32)
        return GlobalPlan(episode=empty, anchor=empty, per_consumer=0, dropped=0)
    if len(cuts) == 1:
        e, a, n = cuts[0]
        return GlobalPlan(episode=e, anchor=a, per_consumer=n, dropped=dropped)
    parts_e, parts_a = [], []
    for c in range(consumers):
        e_c, a_c = _interleave([(e[c * n : (c + 1) * n], a[c * n : (c + 1) * n]) for e, a, n in cuts])
        parts_e.append(e_c)
        parts_a.append(a_c)
    return GlobalPlan(
        episode=np.concatenate(parts_e),
        anchor=np.concatenate(parts_a),
        per_consumer=sum(n for _, _, n in cuts),
        dropped=dropped,
    )


def _interleave(pieces: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-stratum window runs, keeping each episode's windows together (vectorised).

    Ordered by how far through its stratum's part the episode's middle window lies (a proportional
    interleave), ties by stratum.
    """
    keys, strata, starts, lengths, bases = [], [], [], [], []
    base = 0
    for k, (e, _) in enumerate(pieces):
        if e.size:
            s = np.flatnonzero(np.r_[True, e[1:] != e[:-1]])
            t = np.r_[s[1:], e.size]
            keys.append((s + t) / 2 / e.size)
            strata.append(np.full(s.size, k))
            starts.append(s + base)
            lengths.append(t - s)
        bases.append(base)
        base += e.size
    if not keys:
        return _empty_pair()
    key, stratum, start, length = (np.concatenate(x) for x in (keys, strata, starts, lengths))
    by_stratum = np.argsort(stratum, kind="stable")  # two stable sorts: by key, ties by stratum
    run = by_stratum[np.argsort(key[by_stratum], kind="stable")]
    length = length[run]
    pos = np.repeat(start[run], length) + np.arange(length.sum()) - np.repeat(np.cumsum(length) - length, length)
    episode = np.concatenate([e for e, _ in pieces])[pos]
    anchor = np.concatenate([a for _, a in pieces])[pos]
    return episode.astype(np.int64), anchor.astype(np.int64)


def stable_argsort(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` (int64 ``[n]``), computed by the faster unstable sort.

    numpy's default sort (introsort, or SIMD sort) is ~1.8x faster than its stable merge sort on
    millions of int64 keys; equal keys then come in any order, so each run of equal keys gets its
    positions put back in ascending order (random keys have few ties: a small sort).
    """
    order = np.argsort(key)
    tie = key[order[1:]] == key[order[:-1]]
    if tie.any():
        where = np.flatnonzero(np.r_[tie, False] | np.r_[False, tie])
        group = np.cumsum(~np.r_[False, tie][where])
        order[where] = order[where][np.lexsort((order[where], group))]
    return order


def pool_shuffle(window_episode: np.ndarray, pool_episodes: int | None, rng: np.random.Generator) -> np.ndarray:
    """A consumer's yield order: its windows permuted within pools of ``pool_episodes`` episodes.

    Args:
        window_episode: int ``[n]`` episode of each window in read (plan) order; an episode's
            windows are contiguous.
        pool_episodes: episodes per pool, about: the consumer's ``R`` episodes, in read order,
            are cut into ``k = max(1, round(R / pool_episodes))`` consecutive pools of equal size
            (``R // k`` or one more; episode ``r`` in pool ``r * k // R``; so between 0.75x and 1.5x
            ``pool_episodes`` when ``R >= pool_episodes``), so no short last pool lowers the
            diversity of the epoch's last batches; the windows of a pool come out in a uniformly
            random order (sorted by a random 32-bit key; equal keys keep read order) before any
            window of the next pool.
            ``None``: one pool, the whole consumer; ``0``: no shuffle (read order).
        rng: the draw (``(seed, epoch, consumer, level)`` in the plan).

    Which slots of the yield order belong to which episode is uniformly random within a pool (so
    batch diversity is that of the random permutation: ``expected_distinct``); an episode's windows
    then fill its slots in time order (read order: ascending anchors). Each episode is thus read
    forward through the pool, so its frames are decoded once, by a decoder that only moves
    forward, and kept only while windows close in time still need them (``stream.lookahead``),
    where a random order inside the episode would seek back to a keyframe for most windows.

    Returns:
        int64 ``[n]``: window positions in yield order (a permutation). O(n log n), no Python loop.
    """
    n = int(window_episode.size)
    if pool_episodes == 0 or n == 0:
        return np.arange(n, dtype=np.int64)
    if pool_episodes is not None and pool_episodes < 0:
        raise ValueError(f"shuffle_episodes must be None or an int >= 0, not {pool_episodes}")
    run = np.cumsum(np.r_[0, window_episode[1:] != window_episode[:-1]])
    if pool_episodes is None:
        order = stable_argsort(rng.integers(0, 1 << 62, n))
    else:
        # One int64 key (pool, random 32 bits), one sort: numpy's lexsort is far slower on millions.
        runs = int(run[-1]) + 1
        pools = max(1, (2 * runs + pool_episodes) // (2 * pool_episodes))  # round(runs / pool), halves up
        order = stable_argsort(((run * pools // runs) << 32) | rng.integers(0, 1 << 32, n))
    # The episodes' slots stay; each episode's windows fill its slots in read (time) order. ``slots``:
    # yield slots grouped by episode run, ascending in each; runs are contiguous in read order, so
    # the k-th of them gets read position k. Below 65536 runs, uint16 run numbers: numpy sorts them
    # stably by radix (linear), 2.4x faster than int64's merge sort at 6M windows.
    ran = run[order]
    slots = np.argsort(ran.astype(np.uint16) if run[-1] < 1 << 16 else ran, kind="stable")
    timed = np.empty(n, dtype=np.int64)
    timed[slots] = np.arange(n, dtype=np.int64)
    return timed


def buffer_shuffle(
    window_episode: np.ndarray, cost_bytes: np.ndarray, capacity: int, capacity_bytes: int, rng: np.random.Generator
) -> np.ndarray:
    """Yield order of windows that arrive episode by episode through a bounded shuffle buffer.

    A model of a streaming shuffle buffer (webdataset's ``shuffle(bufsize)``), which the reader
    used before the plan-level shuffle (``pool_shuffle``); kept for the benchmarks that compare
    with such a buffer (``balance``'s). Not used by the plan.

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


def expected_distinct(windows: np.ndarray, batch_size: int) -> float:
    """Expected distinct episodes in a batch of ``batch_size`` windows drawn from one pool without replacement.

    ``windows``: int ``[P]`` windows each episode of the pool holds (``N`` in all). Episode ``i``
    is missed by the batch with probability ``C(N - m_i, B) / C(N, B)`` (hypergeometric), so the
    expectation is ``sum_i 1 - prod_{j<B} (N - m_i - j) / (N - j)``. A batch of a pool of ``P``
    episodes holds at least ``P * (1 - (1 - 1/P) ** B)`` (the bound as windows per episode grow),
    which is what i.i.d. sampling with replacement over ``P`` equal episodes gives.
    """
    m = np.asarray(windows, dtype=np.float64)
    total = float(m.sum())
    b = int(min(batch_size, total))
    if b <= 0:
        return 0.0
    j = np.arange(b, dtype=np.float64)
    ratio = np.clip((total - m[:, None] - j) / (total - j), 0.0, None)
    return float(np.sum(1.0 - np.prod(ratio, axis=1)))


def default_shuffle_episodes(batch_size: int | None) -> int:
    """The default pool (``shuffle_episodes``): ``8 x batch_size`` episodes, 512 when it is unknown.

    With ``P = 8 B`` a batch holds at least ``P (1 - (1 - 1/P)^B) >= 0.94 B`` distinct episodes in
    expectation (``expected_distinct``'s bound; ``8 (1 - e^(-1/8)) = 0.9400`` as ``B`` grows), and
    i.i.d. uniform sampling gives at most ``B``: so at least 0.94 of i.i.d. diversity. 512 gives
    that for batches up to 64.
    """
    return 8 * int(batch_size) if batch_size else 512


DIVERSITY_FLOOR = 0.92  # the smallest default pool keeps this share of a batch distinct (i.i.d. gives <= 1)


def budget_shuffle_episodes(batch_size: int | None, episode_bytes: int, cache_bytes: int, chunk_bytes: int = 0) -> int:
    """The default pool (``shuffle_episodes="auto"``) sized from the look-ahead frame cache.

    ``episode_bytes``: decoded bytes one episode keeps live while its windows are yielded (its
    cameras' post-processed frames over a window's span: ``WindowDataset`` estimates it);
    ``cache_bytes``: ``Lookahead.cache_bytes``; ``chunk_bytes``: what a look-ahead chunk adds on
    top while it is assembled (its windows' new frames, one per camera each). The pool's episodes
    are read side by side, so their frames must fit the cache together, else frames are evicted
    before their neighbours' windows reuse them and decoded again. Returns the most episodes that fit
    in ``cache_bytes - chunk_bytes``, at most
    ``default_shuffle_episodes(batch_size)`` and at least the smallest pool whose batches hold
    ``DIVERSITY_FLOOR`` (0.92) of ``batch_size`` distinct episodes in expectation
    (``P (1 - (1 - 1/P)^B)``, ``expected_distinct``'s bound; 42 for ``B = 8``): diversity is never
    given up for memory, the cache then evicts (furthest next use first) instead.
    """
    ceiling = default_shuffle_episodes(batch_size)
    if not batch_size or episode_bytes <= 0:
        return ceiling
    b = int(batch_size)
    floor = next(p for p in range(b, ceiling + 1) if p * (1 - (1 - 1 / p) ** b) >= DIVERSITY_FLOOR * b)
    return int(min(ceiling, max(floor, (cache_bytes - chunk_bytes) // episode_bytes)))


class CostStage(Protocol):
    """Predicted cost of windows: float64 ``[n]`` for global episode numbers and anchors ``[n]``.

    Implemented by ``balance.cost.CostFn``.
    """

    def __call__(self, episodes: np.ndarray, anchors: np.ndarray) -> np.ndarray: ...


class OrderStage(Protocol):
    """A consumer's new yield order: an int64 permutation ``[n]`` of its windows.

    A pure function of the consumer's windows in planned yield order (``episode``, ``anchor``:
    int64 ``[n]``), their costs (float64 ``[n]``, or ``None`` without a cost stage), the consumer's
    ``World``, the seed and the epoch. Every guarantee of the plan holds for any permutation.
    """

    def __call__(
        self, episode: np.ndarray, anchor: np.ndarray, cost: np.ndarray | None, world: World, seed: int, epoch: int
    ) -> np.ndarray: ...


class GroupStage(Protocol):
    """A consumer's windows kept and reordered (a declared plan stage).

    A consumer's windows kept and reordered, e.g. into whole batches of one dataset: int64
    positions ``[m]`` (each at most once) into its windows in yield order (``episode``: int64
    ``[n]``), drawn with ``rng``. ``m`` must depend only on the consumer's per-stratum window counts,
    which the deal makes equal for every consumer, so every consumer keeps the same number.
    """

    def __call__(self, episode: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...


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
    def keeps_order(self) -> bool: ...

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
    ) -> GlobalPlan: ...


@dataclass(frozen=True)
class WorkerPlan:
    """One consumer's epoch: its windows in yield order (int64 ``[n]`` each).

    ``cost``: float64 ``[n]`` predicted cost per window (with a cost stage), else ``None``.
    """

    episode: np.ndarray
    anchor: np.ndarray
    read_order: np.ndarray  # int64 [episodes]: this consumer's episodes in arrival (read) order
    dropped: int
    total_windows: int
    cost: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.episode.size)


@dataclass(frozen=True)
class Progress:
    """How far every consumer of one layout got through its windows of an epoch (a mid-epoch state).

    ``world_size`` x ``num_workers``: the layout; ``consumed``: per consumer id
    (``World.consumer``), the windows it took from the front of its yield order.

    Raises:
        ValueError: not one count per consumer, or a negative count.
    """

    world_size: int
    num_workers: int
    consumed: tuple[int, ...]

    def __post_init__(self):
        if len(self.consumed) != self.consumers or any(c < 0 for c in self.consumed):
            raise ValueError(
                f"progress of {self.world_size} ranks x {self.num_workers} workers needs {self.consumers} "
                f"counts >= 0, got {list(self.consumed)}"
            )

    @property
    def consumers(self) -> int:
        return self.world_size * self.num_workers


class LevelOverrun(ValueError):
    """A level of a resumed epoch's history consumed more windows than its consumer had (``level_plan``).

    ``level``: the history entry; ``consumer``, ``consumed``: its count; ``windows``: the consumer's
    windows at that level of this plan.
    """

    def __init__(self, level: int, consumer: int, consumed: int, windows: int, progress: Progress, epoch: int):
        self.level, self.consumer, self.consumed, self.windows = level, consumer, consumed, windows
        super().__init__(
            f"cannot resume: consumer {consumer} of {progress.world_size}x{progress.num_workers} consumed {consumed} "
            f"windows of epoch {epoch} but its plan has {windows} (another dataset, spec or seed?)"
        )


@dataclass(frozen=True)
class Stages:
    """The per-consumer stages after the cut: the pool shuffle, then optional ``cost``, ``order``, ``group``.

    ``shuffle_episodes``: pool size of ``pool_shuffle`` (episodes whose windows are interleaved at
    a time; ``None``: all of the consumer's; ``0``: read order).
    ``deal``: an optional ``DealStage`` used instead of ``deal`` (the cut itself); when it
    ``keeps_order``, the pool shuffle, ``order`` and ``group`` do not apply (``group`` is refused).
    """

    shuffle_episodes: int | None = None
    cost: CostStage | None = None
    order: OrderStage | None = None
    group: GroupStage | None = None
    deal: DealStage | None = None


def level_plan(
    table: EpisodeTable,
    *,
    stride: int,
    per_episode: PerEpisode | None,
    seed: int,
    epoch: int,
    consumers: int,
    stages: Stages,
    history: Sequence[Progress] = (),
    num_workers: int | None = None,
) -> GlobalPlan:
    """The windows of ``epoch`` still to be yielded, dealt to ``consumers``, after earlier layouts' progress.

    ``history``: the earlier layouts, oldest first (empty: the epoch's own plan, ``global_plan``).
    ``num_workers``: workers per rank of this layout (``consumers`` = ranks x workers); needed only
    by a ``stages.deal``, which deals every level in place of ``deal``.

    Each level's consumed windows are the first ``consumed[c]`` of consumer ``c``'s yield order
    (``worker_plan`` of that level); the rest keep their plan order and are dealt again (``deal``),
    those a group stage left out of that level's yield order included. Every step is vectorised:
    the replay costs a few array passes over the epoch's windows, not a loop per window.

    Raises:
        ValueError: a level consumed more windows than its consumer had (the state belongs to
            another dataset, spec or seed); a ``stages.deal`` without ``num_workers``.
    """
    if stages.deal is not None and num_workers is None:
        raise ValueError("level_plan: a deal stage needs the layout's num_workers")
    layouts = [(p.world_size, p.num_workers) for p in history] + [(consumers // (num_workers or 1), num_workers or 1)]
    first = history[0].consumers if history else consumers
    if stages.deal is None:
        plan = global_plan(table, stride, per_episode, seed, epoch, first)
    else:
        windows = epoch_windows(table, stride, per_episode, seed, epoch)
        what = f"the deal stage {describe(stages.deal)}"
        plan = call_user(what, stages.deal, table, *windows, *layouts[0], seed, epoch, 0)
    for level, progress in enumerate(history):
        taken = np.zeros(plan.episode.size, dtype=bool)
        for c, k in enumerate(progress.consumed):
            if not k:
                continue
            world = World.of_consumer(c, progress.world_size, progress.num_workers)
            part = plan.consumer_slice(c)
            order, _ = _yield_order(plan.episode[part], plan.anchor[part], world, level, seed, epoch, stages)
            if k > order.size:
                raise LevelOverrun(level, c, k, order.size, progress, epoch)
            taken[c * plan.per_consumer + order[:k]] = True
        rest = plan.episode[~taken], plan.anchor[~taken]
        if stages.deal is None:
            nxt = history[level + 1].consumers if level + 1 < len(history) else consumers
            plan = deal(table, *rest, nxt, seed, epoch, level + 1)
        else:
            what = f"the deal stage {describe(stages.deal)}"
            plan = call_user(what, stages.deal, table, *rest, *layouts[level + 1], seed, epoch, level + 1)
    return plan


def _yield_order(
    episode: np.ndarray, anchor: np.ndarray, world: World, level: int, seed: int, epoch: int, stages: Stages
) -> tuple[np.ndarray, np.ndarray | None]:
    """Yield order of ``world.consumer``'s windows (``episode``, ``anchor`` in plan order) and their costs.

    The order is int64 positions into the windows; costs are float64 in that order, or None.
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


def _old_shuffle_options(shuffle_episodes: int | None, shuffle_windows: int | None, shuffle_bytes: int | None):
    """``shuffle_episodes`` after the deprecated buffer bounds: ``shuffle_windows=0`` still means read order."""
    if shuffle_windows is None and shuffle_bytes is None:
        return shuffle_episodes
    warnings.warn(
        "shuffle_windows / shuffle_bytes bounded a buffer of decoded episodes, which the plan-level shuffle "
        "replaced: use shuffle_episodes (episodes whose windows are interleaved at a time; 0: read order)",
        DeprecationWarning,
        stacklevel=3,
    )
    return 0 if shuffle_windows == 0 else shuffle_episodes


def worker_plan(
    table: EpisodeTable,
    *,
    stride: int,
    per_episode: PerEpisode | None,
    seed: int,
    epoch: int,
    world: World,
    shuffle_episodes: int | None = None,
    cost: CostStage | None = None,
    order: OrderStage | None = None,
    group: GroupStage | None = None,
    history: Sequence[Progress] = (),
    shared: EpochCuts | None = None,
    shuffle_windows: int | None = None,
    shuffle_bytes: int | None = None,
    deal: DealStage | None = None,
) -> WorkerPlan:
    """The windows consumer ``world.consumer`` yields this epoch, in yield order.

    ``shuffle_episodes``: the pool of ``pool_shuffle`` (``None``: the whole consumer; ``0``: read
    order). ``history``: the progress of earlier layouts of this epoch (elastic resume,
    ``level_plan``): the consumer then yields its share of the windows not yet consumed.
    ``dropped`` counts the windows a group stage leaves out too (every consumer leaves out as many).
    Without history and without ``deal`` the consumer lists only its own windows (``consumer_plan``,
    with ``shared`` when given: ``epoch_cuts`` computed once per rank). ``deal``: a ``DealStage``
    used instead of ``deal`` at every level (``Stages``); it sees the epoch's whole window list, so
    the plan then always goes through ``level_plan``.
    ``shuffle_windows`` / ``shuffle_bytes``: deprecated (``shuffle_windows=0``: read order).
    """
    pool = _old_shuffle_options(shuffle_episodes, shuffle_windows, shuffle_bytes)
    stages = Stages(pool, cost, order, group, deal)
    if history or deal is not None:
        plan = level_plan(
            table,
            stride=stride,
            per_episode=per_episode,
            seed=seed,
            epoch=epoch,
            consumers=world.consumers,
            stages=stages,
            history=history,
            num_workers=world.num_workers,
        )
        part = plan.consumer_slice(world.consumer)
        episode, anchor = plan.episode[part].astype(np.int64), plan.anchor[part].astype(np.int64)
    else:
        plan = consumer_plan(table, stride, per_episode, seed, epoch, world.consumers, world.consumer, shared)
        episode, anchor = plan.episode, plan.anchor
    yield_order, costs = _yield_order(episode, anchor, world, len(history), seed, epoch, stages)
    if deal is None:  # plan order keeps an episode's windows together
        firsts = np.flatnonzero(np.r_[True, episode[1:] != episode[:-1]]) if episode.size else episode
    else:  # each episode once, where it first appears (a deal stage may spread an episode's windows)
        firsts = np.sort(np.unique(episode, return_index=True)[1])
    return WorkerPlan(
        episode=episode[yield_order],
        anchor=anchor[yield_order],
        read_order=episode[firsts],
        dropped=plan.dropped + (episode.size - yield_order.size) * world.consumers,
        total_windows=int(plan.per_consumer * world.consumers + plan.dropped),
        cost=costs,
    )
