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
5. Optional declared stages, pure functions of the consumer's windows: ``cost`` (a predicted cost
   per window), ``order`` (a permutation of the yield order, e.g. ``balance.streaming``'s
   cost-balanced order) and ``group`` (the order in whole batches of one stratum, leaving out each
   stratum's count modulo the batch size: ``stream.mixplan.BatchByDataset``).
6. An optional ``deal`` stage replaces step 3 (``DealStage``, e.g. ``balance.globaldeal``: every
   step's windows dealt to ranks by cost from the global list); it may fix each consumer's yield
   order itself (``keeps_order``: step 4 and the order and group stages are then skipped).

Elastic resume (``Progress``): a mid-epoch state records, per consumer of the layout that saved it,
how many windows it took from the front of its yield order. The windows not yet taken, kept in plan
order, are dealt again to the consumers of the new layout exactly as in step 3 (equal contiguous
ranges, per stratum; the remainder ``R mod consumers`` left out at random by ``(seed, epoch)``),
then steps 4-5 run per new consumer. Layouts can change again mid-epoch: each change adds a level.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from epishard.seeding import rng_for

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
            cost_bytes=cat("cost_bytes", np.int64),
            stratum=np.repeat(np.arange(len(tables)), np.diff(base)) if stratify else None,
            gaps=np.concatenate(gaps) if gaps else None,
        )


def episode_table(
    spec: WindowSpec,
    index,
    cameras: dict[str, np.ndarray],
    *,
    weight: float = 1.0,
    frame_size: tuple[int, int] | None = None,
    keep: np.ndarray | None = None,
) -> EpisodeTable:
    """The planner's ``EpisodeTable`` of one dataset for a window spec (pure: index arrays in, arrays out).

    Args:
        spec: the ``WindowSpec`` (its offsets, boundary mode, stride, windows per episode).
        index: the dataset's ``shardwriter.index.WindowIndex``.
        cameras: camera -> frame offsets the windows read (``WindowSpec.camera_offsets``).
        weight: the dataset's mixing weight (windows per episode multiplier).
        frame_size: ``(height, width)`` frames are resized to, or ``None`` (stored size), for the
            bytes a loaded episode holds.
        keep: optional bool ``[num_episodes]``: episodes left out get no windows (their anchor
            range is emptied; episode numbers stay), e.g. a read-time episode selection.

    Returns:
        ``EpisodeTable`` with shard numbers local to the dataset. Anchors: ``boundary="inside"``:
        rows whose every offset lies inside the episode and its recording segment (``gaps``);
        ``"pad"``: every row. ``cost_bytes``: encoded members of the cameras read plus the frames
        the expected windows (``expected_windows``) need, decoded (uint8 RGB, uint16 depth).
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
    windows = expected_windows(anchor_counts(lo, hi, spec.stride, gaps), spec.sampling, weight)
    cost = np.zeros(ix.num_episodes, dtype=np.int64)
    for cam, offsets in cameras.items():
        streams = ix.camera_streams(cam)
        size = np.array(frame_size) if frame_size else np.stack([ix.cam_height[streams], ix.cam_width[streams]], 1)
        frames = np.minimum(ix.num_rows, np.ceil(windows * len(offsets)))
        per_pixel = np.where(ix.cam_depth[streams], 2, 3)  # uint16 [1, H, W] or uint8 [3, H, W]
        cost += ix.cam_size[streams] + (frames * per_pixel * np.prod(size, axis=-1)).astype(np.int64)
    return EpisodeTable(
        shard=ix.shard.astype(np.int64),
        lo=lo,
        hi=hi,
        weight=np.full(ix.num_episodes, float(weight)),
        cost_bytes=cost,
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
    return np.lexsort((np.arange(table.num_episodes), rank_of_shard[table.shard]))


def select_anchors(
    lo: int,
    hi: int,
    stride: int,
    per_episode: PerEpisode | None,
    weight: float,
    rng: np.random.Generator,
    gaps: np.ndarray | None = None,
) -> np.ndarray:
    """Anchors of one episode for one epoch, ascending (int64). See ``PerEpisode``.

    ``weight`` scales the count (stochastic rounding); past all anchors they are drawn again.
    ``gaps``: int64 ``[k, 2]`` anchor ranges ``[lo, hi)``, sorted and disjoint, left out (windows
    across a recording break).

    Raises:
        ValueError: a negative weight (or a bad ``PerEpisode``).
    """
    per_episode = PerEpisode.of(per_episode)
    if weight < 0:
        raise ValueError(f"weight ({weight}) must not be negative")
    anchors = np.arange(lo, hi, stride, dtype=np.int64)
    if gaps is not None and len(gaps):
        anchors = anchors[~_in_ranges(gaps[:, 0], gaps[:, 1], anchors)]
    if anchors.size == 0:
        return anchors
    want = float(expected_windows(np.array([anchors.size]), per_episode, weight)[0])
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


def global_plan(
    table: EpisodeTable, stride: int, per_episode: PerEpisode | None, seed: int, epoch: int, consumers: int
) -> GlobalPlan:
    """Every window of the epoch in read order, trimmed to a multiple of ``consumers``.

    With ``table.stratum``, each stratum's windows are cut into ``consumers`` equal contiguous
    ranges on their own (its remainder dropped at random), and each consumer's ranges are
    interleaved in proportion, episode by episode: every consumer then reads every stratum in the
    same proportion at the same pace, which is what step-wise cost balancing across ranks needs
    when strata (datasets) differ in cost and live in separate shards.
    """
    order = episode_order(table, seed, epoch)
    episode, anchor = _anchors(table, order, stride, PerEpisode.of(per_episode), seed, epoch)
    return deal(table, episode, anchor, consumers, seed, epoch)


def deal(
    table: EpisodeTable, episode: np.ndarray, anchor: np.ndarray, consumers: int, seed: int, epoch: int, level: int = 0
) -> GlobalPlan:
    """Windows (in plan order) dealt to ``consumers`` in equal contiguous ranges, per stratum.

    ``level`` 0 is the epoch's own plan; level ``k > 0`` deals what was left after the ``k``-th
    layout change (elastic resume). Each stratum's remainder ``n mod consumers`` is left out, at
    random by ``(seed, epoch, stratum, level)``.
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
        empty = np.zeros(0, dtype=np.int64)
        return GlobalPlan(episode=empty, anchor=empty, per_consumer=0, dropped=0)
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


def _anchors(table: EpisodeTable, order: np.ndarray, stride: int, per_episode: PerEpisode, seed: int, epoch: int):
    """(episode, anchor) int64 arrays of every selected window, episodes in ``order``."""
    if per_episode.all and np.all(table.weight[order] == 1.0):
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
    ranks by cost). ``keeps_order``: consumers yield their part in the order given (no shuffle
    buffer, order or group stage after it), for a deal that already decided every step.
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


@dataclass(frozen=True)
class Stages:
    """The per-consumer stages after the cut: shuffle buffer bounds, then optional ``cost``, ``order``, ``group``.

    The shuffle buffer (``buffer_shuffle``) is bounded in windows and in bytes of loaded episodes.
    ``deal``: an optional ``DealStage`` used instead of ``deal`` (the cut itself); when it
    ``keeps_order``, the shuffle buffer, ``order`` and ``group`` do not apply (``group`` is refused).
    """

    shuffle_windows: int = 0
    shuffle_bytes: int = 0
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
    those a group stage left out of that level's yield order included.

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
        order = episode_order(table, seed, epoch)
        episode, anchor = _anchors(table, order, stride, PerEpisode.of(per_episode), seed, epoch)
        plan = stages.deal(table, episode, anchor, *layouts[0], seed, epoch, 0)
    for level, progress in enumerate(history):
        taken = np.zeros(plan.episode.size, dtype=bool)
        for c, k in enumerate(progress.consumed):
            if not k:
                continue
            world = World.of_consumer(c, progress.world_size, progress.num_workers)
            order, _ = _consumer_order(table, plan, world, level, seed, epoch, stages)
            if k > order.size:
                raise ValueError(
                    f"cannot resume: consumer {c} of {progress.world_size}x{progress.num_workers} consumed {k} "
                    f"windows of epoch {epoch} but its plan has {order.size} (another dataset, spec or seed?)"
                )
            taken[c * plan.per_consumer + order[:k]] = True
        rest = plan.episode[~taken], plan.anchor[~taken]
        if stages.deal is None:
            nxt = history[level + 1].consumers if level + 1 < len(history) else consumers
            plan = deal(table, *rest, nxt, seed, epoch, level + 1)
        else:
            plan = stages.deal(table, *rest, *layouts[level + 1], seed, epoch, level + 1)
    return plan


def _consumer_order(
    table: EpisodeTable, plan: GlobalPlan, world: World, level: int, seed: int, epoch: int, stages: Stages
) -> tuple[np.ndarray, np.ndarray | None]:
    """Yield order of ``world.consumer``'s part of ``plan`` and the windows' costs in that order.

    The order is int64 positions within the part; costs are float64 in that order, or None.
    """
    part = plan.consumer_slice(world.consumer)
    episode, anchor = plan.episode[part], plan.anchor[part]
    if stages.deal is not None and stages.deal.keeps_order:
        if stages.group is not None:
            raise ValueError("a deal stage that keeps its order cannot be followed by a group stage")
        kept = np.arange(episode.size, dtype=np.int64)
        return kept, None if stages.cost is None else np.asarray(stages.cost(episode, anchor), dtype=np.float64)
    salt = (world.consumer,) if level == 0 else (world.consumer, level)
    order = buffer_shuffle(
        episode,
        table.cost_bytes,
        stages.shuffle_windows,
        stages.shuffle_bytes,
        rng_for(seed, epoch, _SALT_SHUFFLE, *salt),
    )
    cost = None
    if stages.cost is not None:
        cost = np.asarray(stages.cost(episode[order], anchor[order]), dtype=np.float64)
    if stages.order is not None:
        again = np.asarray(stages.order(episode[order], anchor[order], cost, world, seed, epoch), dtype=np.int64)
        order, cost = order[again], None if cost is None else cost[again]
    if stages.group is not None:
        kept = np.asarray(stages.group(episode[order], rng_for(seed, epoch, _SALT_GROUP, *salt)), dtype=np.int64)
        order, cost = order[kept], None if cost is None else cost[kept]
    return order, cost


def worker_plan(
    table: EpisodeTable,
    *,
    stride: int,
    per_episode: PerEpisode | None,
    seed: int,
    epoch: int,
    world: World,
    shuffle_windows: int = 0,
    shuffle_bytes: int = 0,
    cost: CostStage | None = None,
    order: OrderStage | None = None,
    group: GroupStage | None = None,
    history: Sequence[Progress] = (),
    deal: DealStage | None = None,
) -> WorkerPlan:
    """The windows consumer ``world.consumer`` yields this epoch, in yield order.

    ``history``: the progress of earlier layouts of this epoch (elastic resume, ``level_plan``):
    the consumer then yields its share of the windows not yet consumed. ``dropped`` counts the
    windows a group stage leaves out too (every consumer leaves out as many). ``deal``: a
    ``DealStage`` used instead of ``deal`` at every level (``Stages``).
    """
    stages = Stages(shuffle_windows, shuffle_bytes, cost, order, group, deal)
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
    episode, anchor = plan.episode[part], plan.anchor[part]
    yield_order, costs = _consumer_order(table, plan, world, len(history), seed, epoch, stages)
    # Each episode once, where it first appears (a deal stage may spread an episode's windows).
    firsts = np.sort(np.unique(episode, return_index=True)[1])
    return WorkerPlan(
        episode=episode[yield_order],
        anchor=anchor[yield_order],
        read_order=episode[firsts],
        dropped=plan.dropped + (episode.size - yield_order.size) * world.consumers,
        total_windows=int(plan.episode.size + plan.dropped),
        cost=costs,
    )
