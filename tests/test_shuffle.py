"""Property tests of the plan-level shuffle (``stream.shuffle.pool_shuffle``, ``shuffle_episodes``) and of
the consumer-local planning (``consumer_plan``, ``plan_shape``).

Pure functions, exact values: permutations, pool boundaries, determinism, and the measured
distinct episodes per batch of a tiny plan against ``expected_distinct``.
"""

from __future__ import annotations

import numpy as np
import pytest

from epishard.stream import plan as P
from epishard.stream import shuffle as S
from epishard.stream.plan import EpisodeTable, EpochInputs, PerEpisode, World, rng_for, worker_plan
from epishard.stream.shuffle import pool_shuffle


def _windows(rng, episodes, lo=1, hi=30):
    sizes = rng.integers(lo, hi, size=episodes)
    ids = rng.permutation(10 * episodes)[:episodes]  # any episode ids, in read order
    return np.repeat(ids, sizes).astype(np.int64), sizes


@pytest.mark.parametrize("pool", [0, 1, 3, 8, 1000, None])
def test_pool_shuffle_is_a_permutation_that_respects_pools(pool):
    for k in range(5):
        episode, sizes = _windows(np.random.default_rng(k), 25)
        out = pool_shuffle(episode, pool, rng_for(1, 2, 3, k))
        assert out.dtype == np.int64 and np.array_equal(np.sort(out), np.arange(episode.size))
        assert np.array_equal(out, pool_shuffle(episode, pool, rng_for(1, 2, 3, k)))  # deterministic
        run = np.repeat(np.arange(sizes.size), sizes)  # each window's episode position in read order
        if pool == 0:
            assert np.array_equal(out, np.arange(episode.size))  # read order
        elif pool is not None:
            k = max(1, round(sizes.size / pool + 1e-9))  # pools of equal size (to one episode), about ``pool`` each
            pools = run[out] * k // sizes.size
            assert np.all(np.diff(pools) >= 0)  # every window of a pool before any of the next
            assert np.all(np.diff(pools) <= 1)
            members = np.bincount(np.arange(sizes.size) * k // sizes.size)  # episodes per pool
            assert members.max() - members.min() <= 1 and members.size == k
            if sizes.size >= pool:
                assert 0.75 * pool <= members.min() and members.max() < 1.5 * pool + 1
        if pool not in (0, 1):
            assert not np.array_equal(out, np.arange(episode.size))


def test_pool_shuffle_of_one_episode_pools_is_read_order():
    episode, _ = _windows(np.random.default_rng(9), 30)
    out = pool_shuffle(episode, 1, np.random.default_rng(0))
    assert np.array_equal(out, np.arange(episode.size))  # one episode per pool: its windows in time order


@pytest.mark.parametrize("pool", [2, 5, None])
def test_pool_shuffle_yields_each_episodes_windows_in_time_order_in_random_slots(pool):
    """Each episode's windows come out in read (time) order; which slots are whose is random."""
    episode, sizes = _windows(np.random.default_rng(4), 20)
    run = np.repeat(np.arange(sizes.size), sizes)
    slot_sets = set()
    for k in range(4):
        out = pool_shuffle(episode, pool, rng_for(7, k))
        for r in range(sizes.size):
            mine = out[run[out] == r]  # this episode's read positions, in yield order
            assert np.all(np.diff(mine) > 0)
        slot_sets.add(tuple(run[out]))  # the episode sequence of the yield order
    assert len(slot_sets) == 4  # the episodes' slots differ with the draw


def test_pool_shuffle_rejects_a_negative_pool_and_takes_empty_input():
    with pytest.raises(ValueError, match="shuffle_episodes"):
        pool_shuffle(np.array([1, 1, 2]), -1, np.random.default_rng(0))
    assert pool_shuffle(np.zeros(0, np.int64), 4, np.random.default_rng(0)).size == 0


def _distinct_per_batch(episodes: np.ndarray, batch: int) -> float:
    full = episodes[: episodes.size // batch * batch].reshape(-1, batch)
    return float(np.mean([np.unique(b).size for b in full]))


@pytest.mark.parametrize("pool,per_episode,batch", [(4, 6, 8), (16, 10, 8), (64, 3, 8), (40, 20, 16)])
def test_measured_diversity_matches_the_formula(pool, per_episode, batch):
    """Equal episodes of ``per_episode`` windows, pools of ``pool`` episodes: the distinct episodes per
    batch, averaged over many seeds, sit on ``expected_distinct`` (batches that straddle two pools
    can only add episodes, so the figure is close to and not below the formula)."""
    episodes = 64 * pool
    read = np.repeat(np.arange(episodes), per_episode)
    measured = np.mean(
        [_distinct_per_batch(read[pool_shuffle(read, pool, np.random.default_rng(s))], batch) for s in range(20)]
    )
    want = S.expected_distinct(np.full(pool, per_episode), batch)
    straddle = batch / (pool * per_episode)  # share of batches that cross a pool boundary
    assert want - 0.05 <= measured <= want + 0.05 + straddle * batch
    assert want >= pool * (1 - (1 - 1 / pool) ** batch) - 1e-9  # the with-replacement bound


def test_expected_distinct_known_values_and_the_default_rule():
    assert S.expected_distinct(np.ones(50), 8) == pytest.approx(8.0)  # one window each: all distinct
    assert S.expected_distinct(np.array([8]), 8) == pytest.approx(1.0)
    assert S.expected_distinct(np.array([4, 4]), 8) == pytest.approx(2.0)
    assert S.expected_distinct(np.array([5, 5]), 2) == pytest.approx(2 * (1 - (5 * 4) / (10 * 9)))
    assert S.expected_distinct(np.zeros(0), 8) == 0.0
    for batch in (1, 2, 8, 32, 256, 1024):
        pool = S.default_shuffle_episodes(batch)
        assert pool == 8 * batch
        worst = S.expected_distinct(np.full(pool, 10_000), batch)  # many windows per episode: the bound
        assert worst >= 0.94 * batch
    assert S.default_shuffle_episodes(None) == 512


def _table(n=60, shards=9, seed=0, stratified=False):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 40, n)
    shard = np.sort(rng.integers(0, shards, n))
    return EpisodeTable(
        shard=shard,
        lo=np.zeros(n, np.int64),
        hi=rows.astype(np.int64),
        weight=np.where(np.arange(n) % 5 == 0, 1.5, 1.0),
        stratum=(shard % 2).astype(np.int64) if stratified else None,
    )


@pytest.mark.parametrize("stratified", [False, True])
@pytest.mark.parametrize("per_episode", [None, PerEpisode(count=3), PerEpisode(fraction=0.3)])
def test_consumer_plan_is_its_slice_of_the_global_plan(stratified, per_episode):
    table = _table(stratified=stratified)
    for consumers in (1, 3, 8, 50):
        g = P.global_plan(EpochInputs(table, 2, per_episode, 7, 1), consumers)
        per, dropped = P.plan_shape(EpochInputs(table, 2, per_episode, 7, 1), consumers)
        assert per.sum() == g.per_consumer and dropped == g.dropped
        for c in range(consumers):
            mine = P.consumer_plan(EpochInputs(table, 2, per_episode, 7, 1), consumers, c)
            part = g.consumer_slice(c)
            assert np.array_equal(mine.episode, g.episode[part]) and np.array_equal(mine.anchor, g.anchor[part])
            if stratified:
                assert np.bincount(table.stratum[mine.episode], minlength=2).tolist() == per.tolist()


def test_worker_plan_yields_its_windows_pooled_in_read_order():
    """The yield order is the consumer's own windows, pool by pool of ``shuffle_episodes`` episodes."""
    table = _table(n=200, shards=20, seed=3)
    for pool in (1, 5, None):
        wp = worker_plan(EpochInputs(table, 1, None, 2, 0), world=World(1, 2, 1, 2), shuffle_episodes=pool)
        mine = P.consumer_plan(EpochInputs(table, 1, None, 2, 0), 4, 3)
        assert sorted(zip(wp.episode.tolist(), wp.anchor.tolist(), strict=True)) == sorted(
            zip(mine.episode.tolist(), mine.anchor.tolist(), strict=True)
        )
        position = {e: i for i, e in enumerate(wp.read_order.tolist())}
        pools = np.array([position[e] for e in wp.episode.tolist()]) // (pool or len(position))
        assert np.all(np.diff(pools) >= 0)


def test_anchor_draws_are_counter_based_per_episode():
    """An episode's windows depend on (seed, epoch, episode) only, not on which other episodes are listed."""
    table = _table(n=80)
    counts = P.window_counts(EpochInputs(table, 1, PerEpisode(count=4), 5, 2))
    every = np.arange(80)
    e_all, a_all = P.episode_windows(EpochInputs(table, 1, None, 5, 2), every, counts)
    some = np.array([70, 3, 41])
    e_some, a_some = P.episode_windows(EpochInputs(table, 1, None, 5, 2), some, counts[some])
    for e in some:
        assert a_some[e_some == e].tolist() == a_all[e_all == e].tolist()
    for e in every:
        got = a_all[e_all == e]
        n = int(table.hi[e] - table.lo[e])
        assert got.size == counts[e] and np.all(np.diff(got) >= 0) and np.all((got >= 0) & (got < max(n, 1)))
        if table.weight[e] == 1.0:
            assert got.size == min(4, n) and np.unique(got).size == got.size
    other = P.episode_windows(EpochInputs(table, 1, None, 5, 3), every, counts)[1]
    assert not np.array_equal(other, a_all)  # another epoch, other anchors


def test_a_shared_epoch_cut_gives_the_same_plan_and_a_mismatched_one_is_ignored():
    """``epoch_cuts`` computed once per rank (before the DataLoader forks) spares each worker the O(E) pass;
    the plan is the same with it, and one of another epoch or layout is not used."""
    table = _table(n=120, shards=12, seed=5, stratified=True)
    per = PerEpisode(count=3)
    shared = P.epoch_cuts(EpochInputs(table, 1, per, 4, 2), 6)
    for c in range(6):
        world = World.of_consumer(c, 3, 2)
        inputs, later = EpochInputs(table, 1, per, 4, 2), EpochInputs(table, 1, per, 4, 3)
        kw = dict(world=world, shuffle_episodes=5)
        a, b = worker_plan(inputs, **kw), worker_plan(inputs, **kw, shared=shared)
        assert np.array_equal(a.episode, b.episode) and np.array_equal(a.anchor, b.anchor)
        other = worker_plan(later, **kw, shared=shared)  # another epoch: recomputed
        assert np.array_equal(other.episode, worker_plan(later, **kw).episode)


def test_the_plan_of_this_state_version_is_pinned():
    """The yield order of a ``(seed, epoch, layout)`` is part of ``PLAN_VERSION``'s contract: saved
    mid-epoch states resume on it. A change to the shuffle's draws (``stream.shuffle.SALT``,
    ``pool_shuffle``), the anchor draws or the cut fails here; it then goes with a new
    ``PLAN_VERSION`` and ``SAME_PLAN_SINCE`` (older mid-epoch states refused, ``stream.resume``)."""
    from epishard.stream.stages import ConsumerStages, yield_order

    assert (P.PLAN_VERSION, P.SAME_PLAN_SINCE, S.SALT) == (4, 4, 4)
    episode, anchor = np.repeat(np.arange(6), 3), np.tile(np.arange(3), 6)
    pinned = {
        None: [9, 3, 6, 4, 15, 12, 13, 14, 0, 5, 16, 10, 17, 7, 1, 11, 8, 2],
        3: [0, 3, 6, 7, 1, 4, 5, 8, 2, 15, 9, 12, 10, 11, 13, 16, 14, 17],
    }
    for pool, order in pinned.items():
        got, _ = yield_order(episode, anchor, World(0, 1, 0, 1), 0, 0, 0, ConsumerStages(shuffle_episodes=pool))
        assert got.tolist() == order
    plan = worker_plan(
        EpochInputs(_table(40, shards=4), 4, PerEpisode(count=2), 7, 1), world=World(1, 2, 1, 2), shuffle_episodes=3
    )
    assert plan.episode.tolist() == [8, 9, 9, 10, 10, 10, 12, 11, 12, 11, 13, 13, 14, 14, 15, 16, 15, 15, 16]
    assert plan.anchor.tolist() == [4, 12, 28, 4, 12, 16, 0, 20, 4, 24, 4, 8, 8, 24, 0, 8, 16, 24, 16]


def test_a_mid_epoch_state_of_a_plan_before_same_plan_since_is_refused(monkeypatch):
    """``stream.resume`` refuses mid-epoch states older than ``SAME_PLAN_SINCE`` (the bound it reads)."""
    from epishard.stream import resume

    state = {"plan_version": P.SAME_PLAN_SINCE, "consumed": [1], "history": [], "epoch": 2}
    resume._check_plan(state, None)  # the current plan: accepted
    monkeypatch.setattr(resume, "SAME_PLAN_SINCE", P.SAME_PLAN_SINCE + 1)
    with pytest.raises(ValueError, match=r"set_epoch\(3\)"):
        resume._check_plan(state, None)
    resume._check_plan({**state, "consumed": [0]}, None)  # at an epoch boundary: any version loads
