"""The plan's shuffle: a consumer's windows permuted within pools of episodes, and the pool's size.

Pure functions (index arrays in, arrays out). ``pool_shuffle`` orders one consumer's windows;
``expected_distinct`` measures the diversity a pool gives a batch; ``default_shuffle_episodes`` and
``budget_shuffle_episodes`` size the pool (``WindowDataset(shuffle="auto")``) from the batch size
and the look-ahead frame cache (``Lookahead.frame_cache_bytes``).

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "DIVERSITY_FLOOR",
    "SALT",
    "budget_shuffle_episodes",
    "default_shuffle_episodes",
    "expected_distinct",
    "pool_shuffle",
    "stable_argsort",
]

# The salt of the pool shuffle's generator (``epishard.seeding.rng_for(seed, epoch, SALT, consumer...)``).
# It is part of the plan: a new value changes every yield order, so it goes with a new
# ``stream.plan.PLAN_VERSION`` and ``SAME_PLAN_SINCE`` (tests/test_shuffle.py pins the order it gives).
SALT = 4


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
    """The default pool's ceiling (``shuffle="auto"``): ``8 x batch_size`` episodes, 512 when it is unknown.

    With ``P = 8 B`` a batch holds at least ``P (1 - (1 - 1/P)^B) >= 0.94 B`` distinct episodes in
    expectation (``expected_distinct``'s bound; ``8 (1 - e^(-1/8)) = 0.9400`` as ``B`` grows), and
    i.i.d. uniform sampling gives at most ``B``: so at least 0.94 of i.i.d. diversity. 512 gives
    that for batches up to 64.
    """
    return 8 * int(batch_size) if batch_size else 512


DIVERSITY_FLOOR = 0.92  # the smallest default pool keeps this share of a batch distinct (i.i.d. gives <= 1)


def budget_shuffle_episodes(
    batch_size: int | None, episode_bytes: int, frame_cache_bytes: int, chunk_bytes: int = 0
) -> int:
    """The default pool (``WindowDataset(shuffle="auto")``) sized from the look-ahead frame cache.

    ``episode_bytes``: decoded bytes one episode keeps live while its windows are yielded (its
    cameras' post-processed frames over a window's span: ``WindowDataset`` estimates it);
    ``frame_cache_bytes``: ``Lookahead.frame_cache_bytes``; ``chunk_bytes``: what a look-ahead chunk adds on
    top while it is assembled (its windows' new frames, one per camera each). The pool's episodes
    are read side by side, so their frames must fit the cache together, else frames are evicted
    before their neighbours' windows reuse them and decoded again. Returns the most episodes that fit
    in ``frame_cache_bytes - chunk_bytes``, at most
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
    return int(min(ceiling, max(floor, (frame_cache_bytes - chunk_bytes) // episode_bytes)))
