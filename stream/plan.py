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

Plan changes: the plan of a given ``(seed, epoch, layout)`` changes only with ``PLAN_VERSION``
(below), which every saved state records (its ``"plan_version"``; the state's own schema has its
version, ``stream.statecheck.STATE_VERSION``).

The shuffle of step 4 is ``stream.shuffle``'s; the stages of steps 5-6 are declared in
``stream.stages`` (``CostStage``, ``OrderStage``, ``GroupStage``, ``DealStage``), which also applies
them to a consumer's windows (``yield_order``); the value types (``World``, ``EpisodeTable``,
``GlobalPlan``) live in ``stream.planvalues`` and ``PerEpisode`` in ``stream.spec``.

Elastic resume (``Progress``): a mid-epoch state records, per consumer of the layout that saved it,
how many windows it took from the front of its yield order. The windows not yet taken, kept in plan
order, are dealt again to the consumers of the new layout exactly as in step 3 (equal contiguous
ranges, per stratum; the remainder ``R mod consumers`` left out at random by ``(seed, epoch)``),
then steps 4-5 run per new consumer. Layouts can change again mid-epoch: each change adds a level.
The replay lists the epoch's windows (int32 where they fit) and every old consumer's yield order,
all vectorised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from epishard.seeding import rng_for

from .planvalues import EpisodeTable, EpochInputs, GlobalPlan, World
from .spec import PerEpisode, WindowSpec
from .stages import ConsumerStages, CostStage, DealStage, GroupStage, OrderStage, yield_order
from .usercode import call_user, describe

__all__ = [
    "PLAN_VERSION",
    "SAME_PLAN_SINCE",
    "EpisodeTable",
    "EpochCuts",
    "EpochInputs",
    "GlobalPlan",
    "GlobalShuffle",
    "LevelOverrun",
    "Progress",
    "WorkerPlan",
    "World",
    "anchor_counts",
    "break_gaps",
    "consumer_plan",
    "deal",
    "episode_order",
    "episode_table",
    "episode_windows",
    "epoch_cuts",
    "epoch_windows",
    "expected_windows",
    "global_plan",
    "level_plan",
    "plan_shape",
    "rng_for",
    "select_anchors",
    "shard_order",
    "window_counts",
    "worker_plan",
]

# The version of the plan: the plan of a given ``(seed, epoch, layout)`` changes only with it, and a
# saved state records it (``"plan_version"``; states of schema version 4 and before record it as their
# ``"version"``, the two were one number then). 3: the plan-level pool shuffle and counter-based
# anchor draws; 4: a consumer's episodes cut into pools of equal size (``stream.shuffle.pool_shuffle``).
PLAN_VERSION = 4
# The oldest PLAN_VERSION whose mid-epoch states this plan continues exactly (``stream.resume`` refuses
# older ones mid-epoch; at an epoch boundary every version loads). Raise both with any change to the plan's
# order: the anchor draws, the cut, ``stream.shuffle.SALT`` or ``pool_shuffle`` (tests/test_shuffle.py pins them).
SAME_PLAN_SINCE = 4

_SALT_SHARDS, _SALT_ANCHORS, _SALT_DROP = 1, 2, 3  # (the shuffle's: 4, ``stream.shuffle``; the group stage's: 31)
_SALT_GLOBAL = 5  # ``GlobalShuffle``'s permutation


def expected_windows(anchors: np.ndarray, per_episode: PerEpisode, weight: np.ndarray | float = 1.0) -> np.ndarray:
    """Windows per episode per epoch (float64 ``[E]``, before stochastic rounding of the weight).

    ``anchors``: int64 ``[E]`` anchors each episode has (``anchor_counts``); ``weight``: dataset
    weight per episode. The planner draws ``floor`` or ``ceil`` of this (``window_counts``,
    ``select_anchors``), and ``weights="probability"`` sizes a mix's datasets by it: one rule for both.
    """
    n = np.asarray(anchors, dtype=np.float64)
    if per_episode.fraction is not None:
        want = np.where(n > 0, np.maximum(1.0, np.round(per_episode.fraction * n)), 0.0)
    elif per_episode.count is not None:
        want = np.minimum(n, float(per_episode.count))
    else:
        want = n
    return want * np.asarray(weight, dtype=np.float64)


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
        index: the dataset's ``epishard.format.index.WindowIndex``.
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


def window_counts(inputs: EpochInputs) -> np.ndarray:
    """Windows each episode gives in the epoch (int64 ``[E]``, by episode number).

    ``floor`` or ``ceil`` of ``expected_windows`` (stochastic rounding, by a counter-based draw of
    ``(seed, epoch, episode)``); every anchor exactly when that is the expectation. O(E), vectorised.

    Raises:
        ValueError: a negative weight.
    """
    table, per_episode = inputs.table, PerEpisode.of(inputs.per_episode)
    n = anchor_counts(table.lo, table.hi, inputs.stride, table.gaps)
    weight = np.asarray(table.weight, dtype=np.float64)
    if np.any(weight < 0):
        raise ValueError(f"weights must not be negative (episode {int(np.argmax(weight < 0))})")
    if per_episode.all and np.all(weight == 1.0):
        return n
    want = expected_windows(n, per_episode, weight)
    base = np.floor(want)
    if np.array_equal(base, want):  # whole counts (no weight): nothing to round
        return base.astype(np.int64)
    up = _uniform(_key(inputs.seed, inputs.epoch, _SALT_ANCHORS), np.arange(n.size)) < want - base
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
    inputs: EpochInputs,
    episodes: np.ndarray,
    counts: np.ndarray,
    first: np.ndarray | None = None,
    stop: np.ndarray | None = None,
    anchors: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The windows of ``episodes`` (int64 ``[K]``, in this order), each's anchors ascending.

    ``counts``: int64 ``[K]`` windows each gives (``window_counts``). Episode ``e`` with ``n``
    anchors and count ``c = q * n + r`` takes every anchor ``q`` times and ``r`` distinct ones at
    random (``_distinct``, by ``(seed, epoch, e)`` of ``inputs``), sorted. ``first``/``stop``: optional int64
    ``[K]``, only the windows ``[first, stop)`` of each episode's sorted list. ``anchors``: optional
    int64 ``[K]``, their anchor counts (``anchor_counts``) when known. Returns (episode,
    anchor): int64 ``[n]``. O(windows of these episodes), whatever the table's size.
    """
    table, stride, seed, epoch = inputs.table, inputs.stride, inputs.seed, inputs.epoch
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
    inputs = EpochInputs(one, stride, per_episode, int(rng.integers(0, 1 << 63)), 0)
    return episode_windows(inputs, np.zeros(1, np.int64), window_counts(inputs))[1]


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


def _cut_windows(inputs: EpochInputs, cut: _Cut, consumer: int):
    """``consumer``'s windows of one stratum (episode, anchor int64), listing only those."""
    g0, g1 = cut.consumer_range(consumer)
    if g1 <= g0:
        return _empty_pair()
    a, b = int(np.searchsorted(cut.ends, g0, side="right")), int(np.searchsorted(cut.ends, g1 - 1, side="right")) + 1
    starts = cut.ends[a:b] - cut.counts[a:b]
    first = np.maximum(g0 - starts, 0)
    stop = np.minimum(g1 - starts, cut.counts[a:b])
    episode, anchor = episode_windows(inputs, cut.episodes[a:b], cut.counts[a:b], first, stop, cut.anchors[a:b])
    inside = cut.drops[(cut.drops >= g0) & (cut.drops < g1)] - g0
    if inside.size:
        keep = np.ones(episode.size, dtype=bool)
        keep[inside] = False
        episode, anchor = episode[keep], anchor[keep]
    return episode, anchor


def global_plan(inputs: EpochInputs, consumers: int) -> GlobalPlan:
    """Every window of the epoch in read order, trimmed to a multiple of ``consumers``.

    With ``inputs.table.stratum``, each stratum's windows are cut into ``consumers`` equal contiguous
    ranges on their own (its remainder dropped at random), and each consumer's ranges are
    interleaved in proportion, episode by episode: every consumer then reads every stratum in the
    same proportion at the same pace, which is what step-wise cost balancing across ranks needs
    when strata (datasets) differ in cost and live in separate shards. ``consumer_plan`` lists one
    consumer's part alone, identical to its slice of this plan.
    """
    cuts = _epoch_cuts(inputs, consumers)
    parts = [_consumer_part(inputs, cuts, c) for c in range(consumers)]
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
    per-stratum cut and drops), for ``key``: ``(*EpochInputs.key, consumers)``. Computed once
    per rank (``WindowDataset.set_epoch``, before the DataLoader forks its workers), it spares each
    worker that pass: its plan is then O(its windows).
    """

    key: tuple
    cuts: tuple[_Cut, ...]


def epoch_cuts(inputs: EpochInputs, consumers: int) -> EpochCuts:
    """``EpochCuts`` of an epoch and layout (a pure function; O(E) array passes)."""
    return EpochCuts((*inputs.key, consumers), tuple(_epoch_cuts(inputs, consumers)))


def consumer_plan(inputs: EpochInputs, consumers: int, consumer: int, shared: EpochCuts | None = None) -> GlobalPlan:
    """Consumer ``consumer``'s part of ``global_plan`` alone, in read order (int64 arrays).

    O(E) array work over the table (read order, counts, cut points) plus O(its windows): no other
    consumer's window is listed, so a worker's planning stays flat in memory at any dataset size.
    ``shared``: that O(E) part computed beforehand (``epoch_cuts``), used when it is of these
    arguments. ``per_consumer`` and ``dropped`` are the global plan's.
    """
    if shared is not None and shared.key == (*inputs.key, consumers):
        cuts = list(shared.cuts)
    else:
        cuts = _epoch_cuts(inputs, consumers)
    episode, anchor = _consumer_part(inputs, cuts, consumer)
    return GlobalPlan(episode, anchor, sum(c.per_consumer for c in cuts), sum(c.drops.size for c in cuts))


def epoch_windows(inputs: EpochInputs) -> tuple[np.ndarray, np.ndarray]:
    """Every window of the epoch in read order, nothing left out: (episode, anchor) int64 ``[W]``.

    The list a ``DealStage`` deals (episodes in ``episode_order``, each one's anchors ascending, as
    ``episode_windows`` draws them); O(W).
    """
    order = episode_order(inputs.table, inputs.seed, inputs.epoch)
    return episode_windows(inputs, order, window_counts(inputs)[order])


def plan_shape(inputs: EpochInputs, consumers: int) -> tuple[np.ndarray, int]:
    """Windows each consumer holds of each stratum (int64 ``[strata]``) and the windows dropped, from counts alone.

    The same on every consumer (the deal is per stratum); O(E), nothing listed.
    """
    cuts, table = _epoch_cuts(inputs, consumers), inputs.table
    strata = 1 if table.stratum is None else int(table.stratum.max(initial=0)) + 1
    per = np.zeros(strata, dtype=np.int64)
    for cut in cuts:
        per[cut.stratum] = cut.per_consumer
    return per, sum(c.drops.size for c in cuts)


def _epoch_cuts(inputs: EpochInputs, consumers: int) -> list[_Cut]:
    table, seed, epoch = inputs.table, inputs.seed, inputs.epoch
    order = episode_order(table, seed, epoch)
    anchors = anchor_counts(table.lo, table.hi, inputs.stride, table.gaps)
    return _cuts(table, window_counts(inputs), anchors, order, consumers, seed, epoch)


def _consumer_part(inputs: EpochInputs, cuts: list[_Cut], consumer: int) -> tuple[np.ndarray, np.ndarray]:
    pieces = [_cut_windows(inputs, cut, consumer) for cut in cuts]
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


@dataclass(frozen=True)
class GlobalShuffle:
    """The global shuffle (a ``stream.stages.DealStage``; ``WindowDataset(shuffle="global")``).

    Every window of the epoch is dealt at random: the plan's own ``deal`` first leaves out its
    remainder (the same windows as without this stage), then one uniform random permutation of all
    kept windows (by ``(seed, epoch, level)``) is cut into the consumers' equal parts, each yielded in
    that order (``keeps_order``: no pool shuffle after it). Any window of the dataset can follow any
    other, on every rank and worker: a batch is drawn from the whole epoch without replacement, as a
    shuffled sampler over every window would draw it (batch diversity that of i.i.d. sampling, to
    ``O(batch / windows)``), each window once per epoch, resumable and elastic like every deal stage.

    Cost: a consumer's windows come from every episode, so reading them decodes each window's own
    groups of pictures (fetched alone where the index has packet tables) and the look-ahead frame
    cache seldom serves two windows.
    """

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
        """The windows (int64 ``[N]`` ``episode``, ``anchor`` in plan order) dealt at random: a ``GlobalPlan``."""
        kept = deal(table, episode, anchor, world_size * num_workers, seed, epoch, level)
        order = rng_for(seed, epoch, _SALT_GLOBAL, level).permutation(kept.episode.size)
        return GlobalPlan(kept.episode[order], kept.anchor[order], kept.per_consumer, kept.dropped)


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
        """Readers of the epoch: ``world_size * num_workers``."""
        return self.world_size * self.num_workers


class LevelOverrun(ValueError):
    """A level of a resumed epoch's history consumed more windows than its consumer had (``level_plan``).

    ``level``: the history entry; ``consumer``, ``consumed``: its count; ``windows``: the consumer's
    windows at that level of this plan.
    """

    def __init__(self, level: int, consumer: int, consumed: int, windows: int, progress: Progress, epoch: int):
        self.level, self.consumer, self.consumed, self.windows = level, consumer, consumed, windows
        self._made = (level, consumer, consumed, windows, progress, epoch)
        super().__init__(
            f"cannot resume: consumer {consumer} of {progress.world_size}x{progress.num_workers} consumed {consumed} "
            f"windows of epoch {epoch} but its plan has {windows} (another dataset, spec or seed?)"
        )

    def __reduce__(self):  # to a DataLoader worker's parent, a Ray driver: the same class and fields
        return type(self), self._made, self.__dict__


def level_plan(
    inputs: EpochInputs,
    *,
    consumers: int,
    stages: ConsumerStages,
    history: Sequence[Progress] = (),
    num_workers: int | None = None,
) -> GlobalPlan:
    """The windows of the epoch still to be yielded, dealt to ``consumers``, after earlier layouts' progress.

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
    table, seed, epoch = inputs.table, inputs.seed, inputs.epoch
    if stages.deal is None:
        plan = global_plan(inputs, first)
    else:
        windows = epoch_windows(inputs)
        what = f"the deal stage {describe(stages.deal)}"
        plan = call_user(what, stages.deal, table, *windows, *layouts[0], seed, epoch, 0)
    for level, progress in enumerate(history):
        taken = np.zeros(plan.episode.size, dtype=bool)
        for c, k in enumerate(progress.consumed):
            if not k:
                continue
            world = World.of_consumer(c, progress.world_size, progress.num_workers)
            part = plan.consumer_slice(c)
            order, _ = yield_order(plan.episode[part], plan.anchor[part], world, level, seed, epoch, stages)
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


def worker_plan(
    inputs: EpochInputs,
    *,
    world: World,
    shuffle_episodes: int | None = None,
    cost: CostStage | None = None,
    order: OrderStage | None = None,
    group: GroupStage | None = None,
    history: Sequence[Progress] = (),
    shared: EpochCuts | None = None,
    deal: DealStage | None = None,
) -> WorkerPlan:
    """The windows consumer ``world.consumer`` yields this epoch, in yield order.

    ``shuffle_episodes``: the pool of ``stream.shuffle.pool_shuffle`` (``None``: the whole
    consumer; ``0``: read order); ``cost``, ``order``, ``group``, ``deal``: the declared stages
    (``stream.stages``). ``history``: the progress of earlier layouts of this epoch (elastic resume,
    ``level_plan``): the consumer then yields its share of the windows not yet consumed.
    ``dropped`` counts the windows a group stage leaves out too (every consumer leaves out as many).
    Without history and without ``deal`` the consumer lists only its own windows (``consumer_plan``,
    with ``shared`` when given: ``epoch_cuts`` computed once per rank). ``deal``: a ``DealStage``
    used instead of ``deal`` at every level (``ConsumerStages``); it sees the epoch's whole window
    list, so the plan then always goes through ``level_plan``.
    """
    stages = ConsumerStages(shuffle_episodes, cost, order, group, deal)
    if history or deal is not None:
        plan = level_plan(
            inputs,
            consumers=world.consumers,
            stages=stages,
            history=history,
            num_workers=world.num_workers,
        )
        part = plan.consumer_slice(world.consumer)
        episode, anchor = plan.episode[part].astype(np.int64), plan.anchor[part].astype(np.int64)
    else:
        plan = consumer_plan(inputs, world.consumers, world.consumer, shared)
        episode, anchor = plan.episode, plan.anchor
    order_, costs = yield_order(episode, anchor, world, len(history), inputs.seed, inputs.epoch, stages)
    if deal is None:  # plan order keeps an episode's windows together
        firsts = np.flatnonzero(np.r_[True, episode[1:] != episode[:-1]]) if episode.size else episode
    else:  # each episode once, where it first appears (a deal stage may spread an episode's windows)
        firsts = np.sort(np.unique(episode, return_index=True)[1])
    return WorkerPlan(
        episode=episode[order_],
        anchor=anchor[order_],
        read_order=episode[firsts],
        dropped=plan.dropped + (episode.size - order_.size) * world.consumers,
        total_windows=int(plan.per_consumer * world.consumers + plan.dropped),
        cost=costs,
    )
