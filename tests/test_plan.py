"""Property tests of the epoch plan (``stream.plan``) and window spec (``stream.spec``).

Pure functions only: no I/O. ``EpisodeTable`` objects are built directly from numpy arrays, and
every property is checked on exact values (multisets of ``(episode, anchor)`` pairs, counts,
orders) over grids of world sizes x workers, datasets, seeds and epochs.
"""

from __future__ import annotations

import collections
import math
from types import SimpleNamespace

import numpy as np
import pytest

from epishard.stream import plan as P
from epishard.stream.plan import (
    EpisodeTable,
    EpochInputs,
    PerEpisode,
    World,
    episode_order,
    global_plan,
    select_anchors,
    shard_order,
    worker_plan,
)
from epishard.stream.spec import WindowSpec, offsets_from_seconds, segment

# A window that needs 32 rows of history and 15 rows of future: anchors [32, num_rows - 15).
BEFORE, AFTER = 32, 15
GRIDS = [(1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (4, 4), (8, 4)]  # (world_size, num_workers)
SEEDS = (0, 12345)
EPOCHS = (0, 1)


# --- helpers -------------------------------------------------------------------------------------


def make_table(shard, num_rows, weight=1.0, cost=None) -> EpisodeTable:
    shard = np.asarray(shard, dtype=np.int64)
    num_rows = np.asarray(num_rows, dtype=np.int64)
    weight = np.broadcast_to(np.asarray(weight, dtype=np.float64), shard.shape).copy()
    cost = num_rows * 1000 + 7 if cost is None else np.asarray(cost, dtype=np.int64)
    return EpisodeTable(
        shard=shard,
        lo=np.full(shard.shape, BEFORE, dtype=np.int64),
        hi=(num_rows - AFTER).astype(np.int64),
        weight=weight,
        cost_bytes=cost,
    )


def _uneven() -> EpisodeTable:
    """7 shards of 1..20 episodes of 10..400 rows; every 9th episode shorter than the window."""
    rng = np.random.default_rng(7)
    counts = rng.integers(1, 21, size=7)
    shard = np.repeat(np.arange(7), counts)
    rows = rng.integers(10, 401, size=shard.size)
    rows[::9] = rng.integers(10, BEFORE + AFTER, size=rows[::9].size)  # lo >= hi: zero windows
    return make_table(shard, rows)


def _single_shard() -> EpisodeTable:
    rng = np.random.default_rng(8)
    rows = rng.integers(10, 401, size=12)
    rows[3] = 20
    return make_table(np.zeros(12), rows)


def _few_shards() -> EpisodeTable:
    """3 shards, far fewer than 32 consumers: shards (and episodes) must be split."""
    return make_table([0, 0, 1, 2, 2, 2], [120, 300, 47 + 3, 400, 30, 90])


def _one_episode() -> EpisodeTable:
    return make_table([0], [300])


def _weighted() -> EpisodeTable:
    """Two datasets mixed with weights, shard numbers with gaps (shard ids 0, 3, 4, 9, 10)."""
    rng = np.random.default_rng(9)
    shard = np.repeat([0, 3, 4, 9, 10], [4, 2, 5, 1, 3])
    rows = rng.integers(30, 250, size=shard.size)
    weight = np.where(shard < 4, 2.0, 0.45)
    return make_table(shard, rows, weight=weight)


DATASETS = {
    "uneven": _uneven(),
    "single_shard": _single_shard(),
    "few_shards": _few_shards(),
    "one_episode": _one_episode(),
    "weighted": _weighted(),
}

# (dataset, stride, per_episode, shuffle_episodes)
CASES = [
    ("uneven", 1, None, 4),
    ("uneven", 5, None, 0),
    ("uneven", 2, PerEpisode(fraction=0.25), 2),
    ("uneven", 1, PerEpisode(count=3), None),
    ("single_shard", 1, None, 3),
    ("few_shards", 1, None, 1),
    ("one_episode", 1, None, None),
    ("weighted", 3, None, 8),
    ("weighted", 1, PerEpisode(count=2), 1),
]


def all_anchors(table: EpisodeTable, stride: int) -> list[tuple[int, int]]:
    """Every (episode, anchor) of the table, stride applied, weight 1 and every anchor taken."""
    return [(e, a) for e in range(table.num_episodes) for a in range(int(table.lo[e]), int(table.hi[e]), stride)]


def selected(table: EpisodeTable, stride: int, per_episode, seed: int, epoch: int) -> list[tuple[int, int]]:
    """The windows the planner selects before the remainder is dropped, in read order (every episode's
    windows listed, ``episode_windows`` on the whole read order)."""
    order = episode_order(table, seed, epoch)
    counts = P.window_counts(EpochInputs(table, stride, per_episode, seed, epoch))
    return pairs(*P.episode_windows(EpochInputs(table, stride, None, seed, epoch), order, counts[order]))


def pairs(episode: np.ndarray, anchor: np.ndarray) -> list[tuple[int, int]]:
    return list(zip(episode.tolist(), anchor.tolist(), strict=False))


def runs(seq) -> list:
    """Consecutive duplicates collapsed: [3, 3, 1, 1, 3] -> [3, 1, 3]."""
    out = []
    for x in seq:
        if not out or out[-1] != x:
            out.append(x)
    return out


def all_worker_plans(table, world, workers, *, stride, per_episode, seed, epoch, shuffle_episodes):
    return [
        [
            worker_plan(
                EpochInputs(table, stride, per_episode, seed, epoch),
                world=World(r, world, w, workers),
                shuffle_episodes=shuffle_episodes,
            )
            for w in range(workers)
        ]
        for r in range(world)
    ]


# --- 1. exactly once, equal steps ----------------------------------------------------------------


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"{g[0]}x{g[1]}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-s{c[1]}-pe{c[2] and (c[2].count or c[2].fraction)}")
def test_exactly_once_and_equal_steps(case, grid):
    name, stride, per_episode, pool = case
    table = DATASETS[name]
    world, workers = grid
    consumers = world * workers
    for seed in SEEDS:
        for epoch in EPOCHS:
            plan = global_plan(EpochInputs(table, stride, per_episode, seed, epoch), consumers)
            chosen = selected(table, stride, per_episode, seed, epoch)
            # The global plan is the selection, in read order, minus `dropped` windows (< consumers).
            assert plan.dropped == len(chosen) % consumers < consumers
            assert plan.episode.size == len(chosen) - plan.dropped == plan.per_consumer * consumers
            kept = pairs(plan.episode, plan.anchor)
            it = iter(chosen)
            assert all(p in it for p in kept), "global plan is not an ordered sub-sequence of the selection"
            if per_episode is None and np.all(table.weight == 1.0):  # (PerEpisode() would be the same)
                # Every anchor lo, lo + stride, ... < hi exactly once, unless dropped.
                full = all_anchors(table, stride)
                assert sorted(chosen) == full
                assert len(set(kept)) == len(kept) and set(kept) <= set(full)
                assert len(full) - len(kept) == plan.dropped

            plans = all_worker_plans(
                table,
                world,
                workers,
                stride=stride,
                per_episode=per_episode,
                seed=seed,
                epoch=epoch,
                shuffle_episodes=pool,
            )
            union = []
            for r in range(world):
                for w in range(workers):
                    wp = plans[r][w]
                    c = r * workers + w
                    # every consumer: exactly its contiguous slice of the global plan, reordered
                    assert len(wp) == wp.anchor.size == plan.per_consumer
                    assert wp.dropped == plan.dropped and wp.total_windows == len(chosen)
                    part = plan.consumer_slice(c)
                    assert sorted(pairs(wp.episode, wp.anchor)) == sorted(pairs(plan.episode[part], plan.anchor[part]))
                    assert wp.read_order.tolist() == runs(plan.episode[part].tolist())
                    union += pairs(wp.episode, wp.anchor)
            assert sorted(union) == sorted(kept)  # multiset union == global plan: each window exactly once

            # Every rank the same samples and batches (DataLoader: each worker yields ceil(n / B) batches).
            samples = [sum(len(wp) for wp in plans[r]) for r in range(world)]
            assert len(set(samples)) == 1 and samples[0] == plan.per_consumer * workers
            for batch in (1, 3, 8):
                batches = [sum(math.ceil(len(wp) / batch) for wp in plans[r]) for r in range(world)]
                dropped_last = [sum(len(wp) // batch for wp in plans[r]) for r in range(world)]
                assert len(set(batches)) == 1 and len(set(dropped_last)) == 1


def test_known_counts():
    """Hand-checked numbers: one 300-row episode, window needs rows [-32, +15] -> anchors 32..284."""
    table = DATASETS["one_episode"]
    plan = global_plan(EpochInputs(table, 1, None, 0, 0), 32)
    assert (plan.per_consumer, plan.dropped) == (7, 253 % 32) == (7, 29)
    plan = global_plan(EpochInputs(table, 4, None, 0, 0), 1)
    assert plan.anchor.tolist() == list(range(32, 285, 4)) and plan.dropped == 0
    # few_shards: 88 + 238 + 3 + 353 + 0 + 43 windows
    plan = global_plan(EpochInputs(DATASETS["few_shards"], 1, None, 3, 0), 32)
    assert plan.per_consumer * 32 + plan.dropped == 725 and plan.dropped == 725 % 32


def test_more_consumers_than_windows_and_empty():
    table = make_table([0, 0, 1], [50, 20, 49])  # 3 + 0 + 2 windows
    for world, workers in [(2, 4), (1, 5)]:
        plan = global_plan(EpochInputs(table, 1, None, 0, 0), world * workers)
        if world * workers > 5:
            assert plan.per_consumer == 0 and plan.dropped == 5 and plan.episode.size == 0
        else:
            assert plan.per_consumer == 1 and plan.dropped == 0
        for r in range(world):
            for w in range(workers):
                wp = worker_plan(
                    EpochInputs(table, 1, None, 0, 0), world=World(r, world, w, workers), shuffle_episodes=4
                )
                assert len(wp) == plan.per_consumer and wp.total_windows == 5
    # all episodes shorter than the window, and an empty table
    for t in (make_table([0, 1], [10, 46]), make_table(np.zeros(0), np.zeros(0))):
        plan = global_plan(EpochInputs(t, 1, None, 0, 0), 4)
        assert plan.episode.size == 0 and plan.dropped == 0 and plan.per_consumer == 0
        wp = worker_plan(EpochInputs(t, 1, None, 0, 0), world=World(1, 2, 1, 2), shuffle_episodes=4)
        assert len(wp) == 0 and wp.read_order.size == 0


@pytest.mark.parametrize("rank,worker", [(2, 0), (-1, 0), (0, 3), (0, -1)])
def test_worker_plan_range(rank, worker):
    with pytest.raises(ValueError):
        worker_plan(EpochInputs(DATASETS["uneven"], 1, None, 0, 0), world=World(rank, 2, worker, 3), shuffle_episodes=4)


# --- 2. determinism ------------------------------------------------------------------------------


def _wp(table, seed, epoch, rank=1, worker=0):
    return worker_plan(EpochInputs(table, 1, None, seed, epoch), world=World(rank, 2, worker, 2), shuffle_episodes=4)


@pytest.mark.parametrize("name", ["uneven", "single_shard", "few_shards", "one_episode", "weighted"])
def test_determinism(name):
    table = DATASETS[name]
    a, b = _wp(table, 5, 3), _wp(table, 5, 3)
    for f in ("episode", "anchor", "read_order"):
        assert np.array_equal(getattr(a, f), getattr(b, f))
    half = PerEpisode(fraction=0.5)
    g1, g2 = global_plan(EpochInputs(table, 1, half, 5, 3), 4), global_plan(EpochInputs(table, 1, half, 5, 3), 4)
    assert np.array_equal(g1.episode, g2.episode) and np.array_equal(g1.anchor, g2.anchor)
    # a copy of the table (other arrays, same values) gives the same plan: no identity or global state
    copy = EpisodeTable(*(np.array(getattr(table, f)) for f in ("shard", "lo", "hi", "weight", "cost_bytes")))
    assert np.array_equal(_wp(copy, 5, 3).anchor, a.anchor)

    for other in (_wp(table, 5, 4), _wp(table, 6, 3)):  # another epoch, another seed
        assert not (np.array_equal(other.episode, a.episode) and np.array_equal(other.anchor, a.anchor))
    for other in (global_plan(EpochInputs(table, 1, None, 5, 4), 1), global_plan(EpochInputs(table, 1, None, 6, 3), 1)):
        base = global_plan(EpochInputs(table, 1, None, 5, 3), 1)
        if np.unique(table.shard).size >= 5:  # several shards: the read order itself changes
            assert not np.array_equal(other.episode, base.episode)


def test_shard_order_changes_with_epoch_and_seed():
    for n in (1, 3, 7, 50):
        for seed in SEEDS:
            for epoch in range(4):
                assert sorted(shard_order(n, seed, epoch).tolist()) == list(range(n))
                assert np.array_equal(shard_order(n, seed, epoch), shard_order(n, seed, epoch))
    for n in (7, 50):
        for seed in SEEDS:
            assert not np.array_equal(shard_order(n, seed, 0), shard_order(n, seed, 1))
            assert not np.array_equal(shard_order(n, seed, 0), shard_order(n, seed + 1, 0))
    # 3 shards: any two epochs may tie by chance (1/6), but over 10 epochs several orders occur
    assert len({tuple(shard_order(3, 0, e)) for e in range(10)}) >= 3
    # the shard order the plan reads in follows shard_order
    table = DATASETS["uneven"]
    for seed in SEEDS:
        reads = [
            runs(table.shard[global_plan(EpochInputs(table, 1, None, seed, e), 1).episode].tolist()) for e in (0, 1)
        ]
        assert reads[0] != reads[1]


# --- 3. shard dealing ----------------------------------------------------------------------------


def _check_read_order(table, wp):
    ro = wp.read_order.tolist()
    assert len(set(ro)) == len(ro), "an episode arrives twice"
    shards = table.shard[wp.read_order].tolist()
    assert len(runs(shards)) == len(set(shards)), f"a shard is read in several runs: {shards}"
    for s in set(shards):
        eps = [e for e in ro if table.shard[e] == s]
        assert eps == sorted(eps), "episodes of a shard not in tar order"
    assert set(wp.episode.tolist()) == set(ro)


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"{g[0]}x{g[1]}")
@pytest.mark.parametrize("name", ["uneven", "single_shard", "few_shards", "weighted"])
def test_shard_runs_per_consumer(name, grid):
    table = DATASETS[name]
    world, workers = grid
    for seed in SEEDS:
        for epoch in EPOCHS:
            for row in all_worker_plans(
                table,
                world,
                workers,
                stride=2,
                per_episode=None,
                seed=seed,
                epoch=epoch,
                shuffle_episodes=4,
            ):
                for wp in row:
                    _check_read_order(table, wp)


def test_episode_order_interleaved_shards():
    """Episodes of a shard need not be adjacent in the table: tar order is the episode number."""
    shard = np.array([2, 0, 2, 1, 0, 2, 1, 0])
    table = make_table(shard, np.full(8, 100))
    for seed in SEEDS:
        for epoch in EPOCHS:
            order = episode_order(table, seed, epoch).tolist()
            expect = [e for s in shard_order(3, seed, epoch).tolist() for e in range(8) if shard[e] == s]
            assert order == expect


@pytest.mark.parametrize("world,workers", [(1, 1), (1, 2), (2, 2), (1, 3)])
def test_many_shards_few_consumers(world, workers):
    """40 shards, <= 4 consumers: each consumer reads a contiguous run of the permuted shard order."""
    rng = np.random.default_rng(11)
    counts = rng.integers(1, 5, size=40)
    shard = np.repeat(np.arange(40), counts)
    table = make_table(shard, rng.integers(60, 200, size=shard.size))
    consumers = world * workers
    for seed in SEEDS:
        for epoch in EPOCHS:
            perm = shard_order(40, seed, epoch).tolist()
            plan = global_plan(EpochInputs(table, 1, None, seed, epoch), consumers)
            present = set(table.shard[plan.episode].tolist())
            order = [s for s in perm if s in present]
            assert runs(table.shard[plan.episode].tolist()) == order  # the plan reads shards in permuted order, once
            seen = []
            for row in all_worker_plans(
                table,
                world,
                workers,
                stride=1,
                per_episode=None,
                seed=seed,
                epoch=epoch,
                shuffle_episodes=4,
            ):
                for wp in row:
                    _check_read_order(table, wp)
                    mine = runs(table.shard[wp.read_order].tolist())
                    i = order.index(mine[0])
                    assert order[i : i + len(mine)] == mine, "consumer's shards are not a contiguous run"
                    seen.append(mine)
            # consecutive consumers continue where the previous stopped (sharing at most one shard)
            joined = seen[0]
            for mine in seen[1:]:
                joined += mine[1:] if mine[0] == joined[-1] else mine
            assert joined == order


# --- 4. select_anchors ---------------------------------------------------------------------------


@pytest.mark.parametrize("lo,hi,stride", [(0, 10, 1), (32, 285, 1), (32, 285, 4), (5, 6, 3), (0, 100, 7)])
def test_select_anchors_semantics(lo, hi, stride):
    rng = np.random.default_rng(0)
    every = np.arange(lo, hi, stride)
    n = every.size
    a = select_anchors(lo, hi, stride, None, 1.0, rng)
    assert a.dtype == np.int64 and a.tolist() == every.tolist()
    assert np.all((a >= lo) & (a < hi) & ((a - lo) % stride == 0))
    for frac in (0.01, 0.25, 0.5, 1.0):
        a = select_anchors(lo, hi, stride, PerEpisode(fraction=frac), 1.0, rng)
        assert a.size == max(1, round(frac * n)) and np.unique(a).size == a.size
        assert set(a.tolist()) <= set(every.tolist()) and np.all(np.diff(a) > 0)
    for k in (1, 3, 1000):
        a = select_anchors(lo, hi, stride, PerEpisode(count=k), 1.0, rng)
        assert a.size == min(k, n) and np.unique(a).size == a.size and set(a.tolist()) <= set(every.tolist())
        assert np.all(np.diff(a) > 0)
    # weight 2 doubles the count: every anchor twice (None), or twice the picks
    a = select_anchors(lo, hi, stride, None, 2.0, rng)
    assert a.tolist() == np.repeat(every, 2).tolist()
    assert select_anchors(lo, hi, stride, PerEpisode(count=1), 2.0, rng).size == 2
    a = select_anchors(lo, hi, stride, PerEpisode(count=3), 2.0, rng)
    assert a.size == 2 * min(3, n) and np.all(np.diff(a) >= 0) and set(a.tolist()) <= set(every.tolist())
    assert np.bincount(a - lo).max() <= (2 if n >= 3 else math.ceil(6 / n))
    assert select_anchors(lo, hi, stride, None, 0.0, rng).size == 0


def test_select_anchors_numpy_scalars_and_empty():
    rng = np.random.default_rng(0)
    assert select_anchors(0, 50, 1, PerEpisode(count=np.int64(4)), 1.0, rng).size == 4
    assert select_anchors(0, 50, 1, PerEpisode(fraction=np.float64(0.5)), 1.0, rng).size == 25
    assert select_anchors(0, 50, 1, None, np.float64(1.0), rng).tolist() == list(range(50))
    for lo, hi in [(10, 10), (32, 9), (0, 0)]:
        for pe in (None, PerEpisode(fraction=0.5), PerEpisode(count=3)):
            assert select_anchors(lo, hi, 1, pe, 2.0, rng).size == 0


def test_select_anchors_rejects_negative_count():
    """per_episode is "an int that many (at most all)": a negative count must not yield windows."""
    try:
        a = select_anchors(0, 10, 1, PerEpisode(count=-1), 1.0, np.random.default_rng(0))
    except ValueError:
        return
    assert a.size == 0, f"per_episode=-1 gave {a.size} windows: {a.tolist()}"


def test_select_anchors_fractional_weight_stochastic_rounding():
    # one episode, many draws: count is floor or ceil of the expectation, averaging to it
    counts = np.array([select_anchors(0, 7, 1, None, 0.3, np.random.default_rng(i)).size for i in range(3000)])
    assert set(counts.tolist()) <= {2, 3}
    assert abs(counts.mean() - 2.1) < 0.04  # sd of the mean ~0.0055
    counts = np.array([select_anchors(0, 10, 1, None, 1.55, np.random.default_rng(i)).size for i in range(2000)])
    assert set(counts.tolist()) <= {15, 16} and abs(counts.mean() - 15.5) < 0.05
    a = select_anchors(0, 10, 1, None, 1.55, np.random.default_rng(1))
    assert np.bincount(a, minlength=10).min() == 1 and np.bincount(a, minlength=10).max() == 2
    # many episodes through the global plan: total close to the sum of expectations
    table = make_table(np.repeat(np.arange(20), 100), np.full(2000, BEFORE + AFTER + 7), weight=0.3)
    total = global_plan(EpochInputs(table, 1, None, 0, 0), 1).episode.size
    assert abs(total - 2000 * 2.1) < 5 * math.sqrt(2000 * 0.09)
    per_ep = np.bincount(global_plan(EpochInputs(table, 1, None, 0, 0), 1).episode, minlength=2000)
    assert set(per_ep.tolist()) <= {2, 3}
    # mixing weights: weight 2 episodes give exactly twice their anchors
    table = DATASETS["weighted"]
    plan = global_plan(EpochInputs(table, 1, None, 1, 0), 1)
    per_ep = np.bincount(plan.episode, minlength=table.num_episodes)
    n = np.maximum(table.hi - table.lo, 0)
    heavy = table.weight == 2.0
    assert np.array_equal(per_ep[heavy], 2 * n[heavy])
    light = ~heavy
    assert np.all(np.abs(per_ep[light] - 0.45 * n[light]) < 1)


# --- 5. WindowSpec -------------------------------------------------------------------------------


def test_segment():
    assert segment(0, 32, 9) == (0, 4, 8, 12, 16, 20, 24, 28, 32)
    assert segment(-32, -16, 3) == (-32, -24, -16)
    assert segment(16, 32, 2) == (16, 32)
    assert segment(5, 5, 1) == (5,) and segment(3, 9, 1) == (3,)
    assert segment(0, 3, 4) == (0, 1, 2, 3)
    for args in [(0, 32, 0), (0, 32, -1), (10, 5, 2), (0, 33, 9), (0, 2, 4), (5, 5, 2)]:
        with pytest.raises(ValueError):
            segment(*args)


def test_offsets_from_seconds():
    assert offsets_from_seconds([-0.1, 0.0, 1 / 30, 0.5], 30) == (-3, 0, 1, 15)
    assert offsets_from_seconds([0.0333], 30) == (1,)  # 33 us off: inside the default 1e-4 s
    assert offsets_from_seconds([-0.2, 0.1], 10) == (-2, 1)
    with pytest.raises(ValueError):
        offsets_from_seconds([0.035], 30)  # 1.7 ms off
    with pytest.raises(ValueError):
        offsets_from_seconds([0.0, 0.05], 10)
    assert offsets_from_seconds([0.035], 30, tolerance=0.01) == (1,)
    assert offsets_from_seconds([], 30) == ()


def test_from_delta_timestamps():
    fps = 10
    spec = WindowSpec.from_delta_timestamps(
        {
            "observation.images.top": [-1.0, -0.5, 0.0],
            "observation.images.wrist": [0.0],
            "observation.state": [-0.2, -0.1, 0.0],
            "action": [i / fps for i in range(16)],
        },
        fps,
    )
    assert spec.cameras == {"observation.images.top": (-10, -5, 0), "observation.images.wrist": (0,)}
    assert spec.state_offsets == (-2, -1, 0) and spec.action_horizon == 16
    assert anchor_range(spec, 100, ["observation.images.top", "observation.images.wrist"]) == (10, 85)
    # no camera keys: every camera at offset 0; no action key: no action rows; kwargs pass through
    spec = WindowSpec.from_delta_timestamps({"observation.state": [0.0]}, 30, stride=3, boundary="pad")
    assert spec.cameras is None and spec.action_horizon == 0 and spec.stride == 3 and spec.boundary == "pad"
    spec = WindowSpec.from_delta_timestamps({"actions": [0, 1 / 30, 2 / 30]}, 30, action_key="actions")
    assert spec.action_horizon == 3 and spec.action_key == "actions"
    # Any action offsets: past, irregular, repeated (Diffusion Policy's [-1/fps, 0, ..., 14/fps]).
    for deltas, rows in (([0.0, 0.2], (0, 2)), ([-0.1, 0.0], (-1, 0)), ([0.0, 0.1, 0.1], (0, 1, 1))):
        spec = WindowSpec.from_delta_timestamps({"action": deltas}, fps)
        assert spec.action_offsets == rows and spec.action_horizon == len(rows)
        assert spec.action_rows.tolist() == list(rows)
    spec = WindowSpec.from_delta_timestamps({"action": [i / fps for i in range(-1, 15)]}, fps)
    assert anchor_range(spec, 100, []) == (1, 86)
    # Keys that are neither state, action nor a camera are numeric columns with their own offsets.
    spec = WindowSpec.from_delta_timestamps({"effort": [-0.2, 0.0], "front": [0.0]}, fps, camera_keys=("front",))
    assert spec.column_offsets == {"effort": (-2, 0)} and spec.cameras == {"front": (0,)}
    with pytest.raises(ValueError, match=r"'cam' \[1\] = 0.033s is not a multiple of 1/fps"):
        WindowSpec.from_delta_timestamps({"cam": [0.0, 0.033]}, fps)  # not a multiple of 1/10 s
    assert WindowSpec.from_delta_timestamps({"cam": [0.0, 0.033]}, fps, tolerance_s=0.05).column_offsets == {
        "cam": (0, 0)
    }


def test_window_spec_validation():
    for kw in [
        dict(boundary="clamp"),
        dict(stride=0),
        dict(action_horizon=-1),
        dict(per_episode_fraction=0.0),
        dict(per_episode_fraction=1.5),
        dict(per_episode_count=-1),
        dict(per_episode_count=2, per_episode_fraction=0.5),
    ]:
        with pytest.raises(ValueError):
            WindowSpec(**kw)
    assert WindowSpec(per_episode_fraction=1.0).sampling == PerEpisode(fraction=1.0)
    assert WindowSpec(per_episode_count=5).sampling == PerEpisode(count=5)


def test_expected_windows_is_the_count_the_planner_draws():
    """One rule for windows per episode: the planner draws floor or ceil of ``expected_windows``."""
    anchors = np.array([0, 1, 3, 10, 101])
    assert P.expected_windows(anchors, PerEpisode()).tolist() == [0, 1, 3, 10, 101]
    assert P.expected_windows(anchors, PerEpisode(count=4)).tolist() == [0, 1, 3, 4, 4]
    assert P.expected_windows(anchors, PerEpisode(fraction=0.25)).tolist() == [0, 1, 1, 2, 25]
    assert P.expected_windows(anchors, PerEpisode(count=4), np.full(5, 1.5)).tolist() == [0, 1.5, 4.5, 6, 6]
    for n in anchors.tolist():
        for per in (PerEpisode(), PerEpisode(count=4), PerEpisode(fraction=0.25)):
            got = select_anchors(0, n, 1, per, 1.0, np.random.default_rng(n)).size
            assert got == P.expected_windows(np.array([n]), per)[0]
    with pytest.raises(KeyError):
        WindowSpec(cameras={"front": (0,)}).camera_offsets(["top"])


SPEC = WindowSpec(
    cameras={"top": (*segment(-32, -16, 3), 0, *segment(16, 32, 2)), "wrist": (0,)},
    state_offsets=(-2, -1, 0),
    action_horizon=16,
)


def anchor_range(spec: WindowSpec, num_rows: int, cams: list[str]) -> tuple[int, int]:
    """Anchors ``[lo, hi)`` of one episode of ``num_rows`` rows, from ``plan.episode_table`` (the one
    place a spec becomes anchor ranges), on a one-episode index."""
    index = SimpleNamespace(
        num_episodes=1,
        num_rows=np.array([num_rows]),
        window_start=np.array([0]),
        window_stop=np.array([num_rows]),
        segment_offsets=np.zeros(2, dtype=np.int64),
        segment_starts=np.zeros(0, dtype=np.int64),
        shard=np.zeros(1, dtype=np.int32),
        camera_streams=lambda cam: np.zeros(1, dtype=np.int64),
        cam_height=np.array([8]),
        cam_width=np.array([8]),
        cam_depth=np.array([False]),
        cam_size=np.array([100]),
    )
    table = P.episode_table(spec, index, spec.camera_offsets(cams))
    return int(table.lo[0]), int(table.hi[0])


def test_anchor_range_inside_and_pad():
    cams = ["top", "wrist", "side"]
    assert SPEC.row_offsets(cams).tolist() == [
        -32,
        -24,
        -16,
        -2,
        -1,
        0,
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        8,
        9,
        10,
        11,
        12,
        13,
        14,
        15,
        16,
        32,
    ]
    assert anchor_range(SPEC, 100, cams) == (32, 68)
    assert anchor_range(SPEC, 65, cams) == (32, 33)  # exactly one window
    assert anchor_range(SPEC, 64, cams) == (32, 32)  # hi <= lo: zero windows
    lo, hi = anchor_range(SPEC, 20, cams)
    assert hi <= lo and select_anchors(lo, hi, 1, None, 1.0, np.random.default_rng(0)).size == 0
    # the action chunk decides the end when it reaches furthest
    spec = WindowSpec(cameras={"c": (0,)}, action_horizon=16)
    assert anchor_range(spec, 100, ["c"]) == (0, 85)
    assert anchor_range(WindowSpec(cameras={"c": (5,)}, state_key=None, action_key=None), 50, ["c"]) == (0, 45)
    assert anchor_range(WindowSpec(cameras={"c": (-5,)}, state_key=None, action_key=None), 50, ["c"]) == (5, 50)
    assert anchor_range(WindowSpec(), 7, ["a", "b"]) == (0, 7)  # cameras None: offsets 0
    pad = WindowSpec(cameras=SPEC.cameras, state_offsets=(-2, -1, 0), action_horizon=16, boundary="pad")
    for n in (0, 1, 20, 64, 100):
        assert anchor_range(pad, n, cams) == (0, n)


@pytest.mark.parametrize(
    "spec",
    [
        SPEC,
        WindowSpec(cameras={"c": (3, 9)}, state_offsets=(-4,), action_horizon=0),
        WindowSpec(cameras={"c": (-7,)}, state_offsets=(0,), action_horizon=2),
    ],
)
def test_anchor_range_is_exactly_the_inside_anchors(spec):
    """Every anchor in [lo, hi) keeps all offsets inside the episode, and no anchor outside does."""
    cams = ["top", "wrist", "c"]
    offs = spec.row_offsets(cams)
    for n in range(0, 90, 3):
        lo, hi = anchor_range(spec, n, cams)
        inside = [a for a in range(-50, n + 50) if np.all((a + offs >= 0) & (a + offs < n))]
        assert list(range(lo, hi)) == inside


@pytest.mark.parametrize("world,workers", [(1, 1), (2, 2), (4, 2), (8, 4)])
def test_stratified_plan_deals_every_stratum_evenly_and_exactly_once(world, workers):
    rng = np.random.default_rng(3)
    n = 40
    shard = np.repeat(np.arange(10), 4)  # strata own whole shards: shards 0-5 stratum 0, 6-9 stratum 1
    stratum = (shard >= 6).astype(np.int64)
    lengths = rng.integers(5, 80, size=n)
    table = EpisodeTable(
        shard=shard,
        lo=np.zeros(n, np.int64),
        hi=lengths.astype(np.int64),
        weight=np.ones(n),
        cost_bytes=np.full(n, 10, np.int64),
        stratum=stratum,
    )
    consumers = world * workers
    plan = global_plan(EpochInputs(table, 1, None, 5, 1), consumers)
    per_stratum = [int(lengths[stratum == k].sum()) for k in (0, 1)]
    assert plan.dropped == sum(t % consumers for t in per_stratum)
    assert plan.per_consumer == sum(t // consumers for t in per_stratum)
    every = collections.Counter(zip(plan.episode.tolist(), plan.anchor.tolist(), strict=False))
    assert all(c == 1 for c in every.values()) and len(every) == sum(per_stratum) - plan.dropped
    got = collections.Counter()
    for rank in range(world):
        for worker in range(workers):
            wp = worker_plan(
                EpochInputs(table, 1, None, 5, 1), world=World(rank, world, worker, workers), shuffle_episodes=0
            )
            counts = [int(np.sum(stratum[wp.episode] == k)) for k in (0, 1)]
            assert counts == [t // consumers for t in per_stratum]  # every consumer: the same share of each
            got.update(zip(wp.episode.tolist(), wp.anchor.tolist(), strict=False))
    assert got == every
    # Proportional interleave: in every half of a consumer's plan both strata appear.
    part = plan.episode[plan.consumer_slice(0)]
    half = part.size // 2
    if half > 100:
        assert set(stratum[part[:half]]) == {0, 1} and set(stratum[part[half:]]) == {0, 1}


@pytest.mark.parametrize("seed", range(4))
def test_recording_breaks_remove_exactly_the_crossing_anchors(seed):
    """Anchors, counts and per-episode draws around recording breaks, against a brute force."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        n_ep = int(rng.integers(1, 6))
        rows = rng.integers(1, 60, n_ep)
        breaks = [np.unique(rng.integers(1, max(int(n), 2), rng.integers(0, 4))) for n in rows]
        breaks = [b[b < n] for b, n in zip(breaks, rows, strict=False)]
        before, after, stride = int(rng.integers(0, 6)), int(rng.integers(0, 6)), int(rng.integers(1, 4))
        owner = np.concatenate([np.full(b.size, e) for e, b in enumerate(breaks)]).astype(np.int64)
        gaps = P.break_gaps(owner, np.concatenate(breaks).astype(np.int64), before, after)
        lo, hi = np.full(n_ep, before, np.int64), (rows - after).astype(np.int64)
        want = {
            (e, a)
            for e in range(n_ep)
            for a in range(lo[e], hi[e], stride)
            if all(not (b - after <= a < b + before) for b in breaks[e])
        }
        counts = P.anchor_counts(lo, hi, stride, gaps)
        assert counts.tolist() == [sum(1 for w in want if w[0] == e) for e in range(n_ep)]
        table = EpisodeTable(
            shard=np.zeros(n_ep, np.int64),
            lo=lo,
            hi=hi,
            weight=np.ones(n_ep),
            cost_bytes=np.ones(n_ep, np.int64),
            gaps=gaps,
        )
        for per_episode in (None, PerEpisode(fraction=1.0)):  # vectorised path and per-episode draw path
            plan = global_plan(EpochInputs(table, stride, per_episode, 0, 0), 1)
            assert set(
                zip(plan.episode.tolist(), plan.anchor.tolist(), strict=False)
            ) == want and plan.episode.size == len(want)
        half = global_plan(EpochInputs(table, stride, PerEpisode(fraction=0.5), 0, 0), 1)
        assert set(zip(half.episode.tolist(), half.anchor.tolist(), strict=False)) <= want


def test_stable_argsort_is_numpys_stable_argsort_on_keys_with_many_ties():
    from epishard.stream.shuffle import stable_argsort

    rng = np.random.default_rng(3)
    ties = 0
    for _ in range(300):
        keys = rng.integers(0, int(rng.integers(1, 50)), int(rng.integers(0, 300)))
        assert np.array_equal(stable_argsort(keys), np.argsort(keys, kind="stable"))
        ties += keys.size > np.unique(keys).size
    assert ties > 200
