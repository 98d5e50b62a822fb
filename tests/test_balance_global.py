"""Global cost balancing (``balance.globaldeal``, ``BalancedWindowDataset(scope="global")``).

Pure first (``global_steps`` and the deal stage inside ``stream.plan``: no I/O): every window once,
equal parts, the DataLoader's round robin turning consumers' orders into balanced global steps,
the plain plan's windows kept, elastic resume exactly once. Then through ``WindowLoader`` on a
tiny generated dataset whose frames carry their frame number: each rank's exact sample set and
step-by-step batches, exact resume, elastic resume to another layout.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from videogen import convert_numbered, decode_frame_number

from epishard.balance import CostModel, WindowCost, epoch_summary, rank_steps, step_stats
from epishard.balance.globaldeal import GlobalDeal, global_steps
from epishard.balance.streaming import BalancedOrder, BalancedWindowDataset
from epishard.stream import WindowLoader, WindowSpec, World
from epishard.stream.mixplan import BatchByDataset
from epishard.stream.options import Mixing, Ranks
from epishard.stream.plan import EpisodeTable, EpochInputs, Progress, global_plan, worker_plan
from epishard.stream.shuffle import default_shuffle_episodes
from epishard.stream.statecheck import STATE_VERSION

# --- pure: global_steps ----------------------------------------------------------------------------


def _steps_of(order: np.ndarray, world: int, workers: int, batch: int) -> list[list[np.ndarray]]:
    """Global steps as the DataLoader forms them: rank ``r``'s step ``s`` is worker ``s mod K``'s
    batch ``s // K`` (in-order round robin), the last batch of each worker possibly partial."""
    parts = order.reshape(world, workers, -1)
    n = parts.shape[2]
    per_worker = -(-n // batch)
    return [
        [parts[r, s % workers, (s // workers) * batch : (s // workers + 1) * batch] for r in range(world)]
        for s in range(per_worker * workers)
    ]


@pytest.mark.parametrize(
    "n,world,workers,batch,chunk",
    [
        (960, 2, 1, 8, None),
        (960, 4, 2, 4, 5),
        (1000, 2, 2, 6, 3),
        (40, 2, 2, 8, None),
        (12, 3, 1, 1, 1),
        (0, 2, 2, 4, 2),
    ],
)
def test_global_steps_is_a_permutation_into_equal_parts_of_whole_steps(n, world, workers, batch, chunk):
    costs = np.random.default_rng(0).lognormal(3, 1, n)
    order = global_steps(costs, world, workers, batch, chunk, seed=1, epoch=2)
    assert order.shape == (world * workers, n // (world * workers))
    assert np.array_equal(np.sort(order.ravel()), np.arange(n))
    per = order.shape[1]
    full_steps = (per // batch) * workers
    steps = _steps_of(order.ravel(), world, workers, batch)
    assert all(len({b.size for b in step}) == 1 for step in steps)  # every rank as many samples per step
    if chunk:  # a full step's windows come from one chunk of the plan order
        for step in steps[:full_steps]:
            assert len(set((np.concatenate(step) // (chunk * world * batch)).tolist())) == 1
    # the partial steps hold the plan order's last windows
    tail = np.concatenate([b for step in steps[full_steps:] for b in step]) if steps[full_steps:] else np.zeros(0)
    assert sorted(tail.tolist()) == list(range(n - tail.size, n))
    assert np.array_equal(order, global_steps(costs, world, workers, batch, chunk, seed=1, epoch=2))
    if n >= 40:
        assert not np.array_equal(order, global_steps(costs, world, workers, batch, chunk, seed=1, epoch=3))


def test_global_steps_on_a_hand_example():
    costs = np.array([8.0, 7, 6, 5, 4, 3, 2, 1])  # positions 0..7
    order = global_steps(costs, world_size=2, num_workers=1, batch_size=2, chunk_steps=None, seed=0, epoch=0)
    steps = {frozenset(frozenset(b.tolist()) for b in step) for step in _steps_of(order.ravel(), 2, 1, 2)}
    # sorted by cost, cut into steps of 4; least-loaded with 2 each: 8+5 / 7+6 and 4+1 / 3+2
    assert steps == {
        frozenset({frozenset({0, 3}), frozenset({1, 2})}),
        frozenset({frozenset({4, 7}), frozenset({5, 6})}),
    }


@pytest.mark.parametrize("chunk,imbalance", [(None, 1.01), (64, 1.01), (16, 1.03)])
def test_global_steps_balance_ranks_and_padding(chunk, imbalance):
    """Long-tailed costs (lognormal, sigma 1): max/mean rank cost and padding fall with the chunk
    (measured 1.003 / 2%, 1.006 / 4%, 1.027 / 11%); a shuffled deal gives 2.02 / 53%."""
    costs = np.random.default_rng(3).lognormal(4, 1.0, 8 * 4 * 2 * 60)
    order = global_steps(costs, world_size=8, num_workers=2, batch_size=4, chunk_steps=chunk, seed=0, epoch=0)
    steps = np.stack([np.stack(s) for s in _steps_of(order.ravel(), 8, 2, 4)])  # [steps, world, batch]
    s = epoch_summary(step_stats(costs[steps]))
    assert s["imbalance_mean"] < imbalance and s["padding"] < 0.12
    shuffled = np.random.default_rng(0).permutation(costs.size).reshape(-1, 8, 4)
    assert s["step_time_padded"] < 0.5 * epoch_summary(step_stats(costs[shuffled]))["step_time_padded"]


@pytest.mark.parametrize("workers", [1, 2])
def test_equal_costs_are_handed_out_as_contiguous_runs(workers):
    """Windows of equal cost are interchangeable for the balance: each consumer gets a contiguous
    run of them in plan order (an episode's neighbouring anchors share frames), not every other one."""
    costs = np.r_[np.full(48, 5.0), np.full(48, 2.0)]  # two "episodes" of 48 windows each
    order = global_steps(costs, world_size=2, num_workers=workers, batch_size=4, chunk_steps=None, seed=0, epoch=0)
    for part in order:
        for episode in (part[part < 48], part[part >= 48]):
            assert np.array_equal(np.sort(episode), np.arange(episode.min(), episode.min() + episode.size))


def test_global_steps_refuses_a_length_that_is_not_whole_consumers():
    with pytest.raises(ValueError, match="multiple of 4 consumers"):
        global_steps(np.ones(10), 2, 2, 2, None, 0, 0)


# --- pure: the deal stage inside stream.plan ---------------------------------------------------------


def _table() -> EpisodeTable:
    """12 shards of 2 episodes, uneven lengths (one without windows)."""
    rows = np.array([41, 7, 130, 18, 0, 66, 25, 93, 12, 50, 33, 71, 9, 44, 60, 28, 80, 15, 36, 22, 57, 11, 90, 19])
    return EpisodeTable(
        shard=np.arange(rows.size) // 2,
        lo=np.zeros(rows.size, dtype=np.int64),
        hi=rows.astype(np.int64),
        weight=np.ones(rows.size),
        cost_bytes=rows * 100 + 5,
    )


def _cost(e: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Cost varying mostly by episode (an instruction length), a little by anchor."""
    per_episode = np.random.default_rng(9).lognormal(4, 0.9, 64)
    return per_episode[e] + (a % 3)


KW = dict(stride=1, per_episode=None, seed=3, epoch=1, shuffle_episodes=4)


def _plans(table, world, workers, history=(), batch=4, chunk=8, **stages):
    stages = stages or dict(cost=_cost, deal=GlobalDeal(_cost, batch, chunk))
    return [
        worker_plan(
            EpochInputs(table, KW["stride"], KW["per_episode"], KW["seed"], KW["epoch"]),
            shuffle_episodes=KW["shuffle_episodes"],
            world=World.of_consumer(c, world, workers),
            history=history,
            **stages,
        )
        for c in range(world * workers)
    ]


def _keys(plan, n=None) -> list[tuple[int, int]]:
    return list(zip(plan.episode[:n].tolist(), plan.anchor[:n].tolist(), strict=True))


def _rank_costs(plans, world, workers, batch) -> np.ndarray:
    """float64 ``[steps, world, batch]`` of the full steps, as the DataLoader forms them."""
    per_rank = [rank_steps([plans[r * workers + w].cost for w in range(workers)], batch) for r in range(world)]
    return np.stack(per_rank, axis=1)


def test_deal_stage_keeps_the_plain_plans_windows_and_balances_where_local_order_cannot():
    table, world, workers, batch = _table(), 2, 2, 4
    plans = _plans(table, world, workers)
    plain = global_plan(EpochInputs(table, 1, None, KW["seed"], KW["epoch"]), world * workers)
    dealt = collections.Counter(k for p in plans for k in _keys(p))
    assert dealt == collections.Counter(zip(plain.episode.tolist(), plain.anchor.tolist(), strict=True))
    assert max(dealt.values()) == 1 and len({len(p) for p in plans}) == 1
    assert all(p.dropped == plain.dropped for p in plans)
    assert all(np.array_equal(p.cost, _cost(p.episode, p.anchor)) for p in plans)  # __cost__ in yield order
    assert all(sorted(p.read_order.tolist()) == sorted(set(p.episode.tolist())) for p in plans)  # each once
    local = _plans(table, world, workers, cost=_cost, order=BalancedOrder(batch, 8))
    g = epoch_summary(step_stats(_rank_costs(plans, world, workers, batch)))
    loc = epoch_summary(step_stats(_rank_costs(local, world, workers, batch)))
    assert g["imbalance_mean"] < 1.03 < loc["imbalance_mean"]
    assert g["step_time_padded"] < loc["step_time_padded"]


@pytest.mark.parametrize(
    "old,new,batches", [((2, 2), (3, 1), 5), ((2, 1), (1, 3), 9), ((1, 1), (2, 2), 17), ((3, 1), (2, 2), 0)]
)
def test_elastic_resume_deals_what_is_left_again_exactly_once(old, new, batches):
    table, batch = _table(), 4
    before = _plans(table, *old)
    k = old[1]
    consumed = tuple(
        min(-(-(batches - c % k) // k) * batch if batches > c % k else 0, len(before[c])) for c in range(len(before))
    )
    progress = Progress(*old, consumed)
    after = _plans(table, *new, history=(progress,))
    epoch = collections.Counter(k for p in before for k in _keys(p))
    taken = collections.Counter(k for p, n in zip(before, consumed, strict=True) for k in _keys(p, n))
    yielded = collections.Counter(k for p in after for k in _keys(p))
    assert max(yielded.values()) == 1 and not taken & yielded and len({len(p) for p in after}) == 1
    left_out = epoch - taken - yielded
    assert taken + yielded + left_out == epoch
    assert left_out.total() == (epoch.total() - taken.total()) % (new[0] * new[1]) == after[0].dropped
    g = epoch_summary(step_stats(_rank_costs(after, *new, batch)))
    assert g["imbalance_mean"] < 1.05  # the rest is dealt by cost for the new layout


def test_a_deal_that_keeps_its_order_refuses_a_group_stage():
    table = _table()
    with pytest.raises(ValueError, match="cannot be followed by a group stage"):
        _plans(table, 1, 1, deal=GlobalDeal(_cost, 4), group=BatchByDataset(np.zeros(table.num_episodes, int), 4))


# --- end to end: WindowLoader on a generated dataset ------------------------------------------------

LENGTHS = [14, 9, 17, 12, 15, 11, 8, 13]
TASKS = [
    "pick",
    "pick the red cube and place it in the blue bowl on the left",
    "open the drawer",
    "stack " * 30,
    "push",
    "wipe the table",
    "go",
    "close the lid and " * 4,
]
CAM = "observation.images.front"
SPEC = WindowSpec(cameras={CAM: (0, 2)}, state_offsets=(0,), action_horizon=2, boundary="pad", stride=1)
BATCH = 3


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    cameras = {CAM: dict(height=32, width=32, gop=4)}
    return convert_numbered(
        tmp_path_factory.mktemp("balance_global"), LENGTHS, cameras, per_shard=2, tasks=TASKS, name="bg"
    )


def _loader(dataset, rank, world, workers, scope="global"):
    ds = BalancedWindowDataset(
        dataset, SPEC, batch_size=BATCH, chunk_batches=4, seed=5, ranks=Ranks(rank=rank, world_size=world), scope=scope
    )
    return WindowLoader(ds, batch_size=BATCH, num_workers=workers)


def _batch_keys(batch) -> list[tuple[int, int]]:
    keys = list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))
    for (e, f), frames in zip(keys, batch[CAM], strict=True):
        n = LENGTHS[e]
        assert decode_frame_number(frames[0]) == 100 * e + f  # the window's own frames
        assert decode_frame_number(frames[1]) == 100 * e + min(f + 2, n - 1)
    return keys


def _planned(ds, epoch, rank, world, workers) -> list[list[tuple[int, int]]]:
    """The batches the deal gives ``rank``, step by step (the DataLoader's round robin over workers)."""
    k = max(workers, 1)
    per_worker = []
    for w in range(k):
        keys = _keys(ds.plan(epoch, World(rank, world, w, k)))
        per_worker.append([keys[i : i + BATCH] for i in range(0, len(keys), BATCH)])
    return [b for step in zip(*per_worker, strict=True) for b in step]


def test_each_rank_gets_exactly_the_dealt_batches_step_by_step(dataset):
    world, workers = 2, 2
    got, costs = [], []
    for rank in range(world):
        loader = _loader(dataset, rank, world, workers)
        batches = list(loader)
        assert [_batch_keys(b) for b in batches] == _planned(loader.dataset, 0, rank, world, workers)
        got.append(collections.Counter(k for b in batches for k in _batch_keys(b)))
        costs.append([b["__cost__"].numpy() for b in batches])
    assert len(costs[0]) == len(costs[1])  # equal steps
    seen = got[0] + got[1]
    assert max(seen.values()) == 1
    ds = _loader(dataset, 0, world, workers).dataset
    plain = global_plan(EpochInputs(ds.table, 1, None, 5, 0), world * workers)
    assert seen == collections.Counter(zip(plain.episode.tolist(), plain.anchor.tolist(), strict=True))
    # __cost__ is the default cost model's (sequence tokens: the instruction's length varies by episode)
    cost = WindowCost.from_dataset(ds, CostModel())
    for rank in range(world):
        steps = _planned(ds, 0, rank, world, workers)
        for step, c in zip(steps, costs[rank], strict=True):
            e, a = (np.array(x) for x in zip(*step, strict=True))
            assert np.allclose(c, cost(e, a))
    full = np.array([[c[s].sum() for c in costs] for s in range(len(costs[0])) if len(costs[0][s]) == BATCH])
    assert np.mean(full.max(1) / full.mean(1)) < 1.1


@pytest.mark.parametrize("workers,cut", [(0, 3), (2, 5)])
def test_global_scope_resumes_exactly(dataset, workers, cut):
    reference = _loader(dataset, 1, 2, workers)
    full = [_batch_keys(b) for b in reference] + [_batch_keys(b) for b in reference]  # epochs 0 and 1
    first = _loader(dataset, 1, 2, workers)
    it = iter(first)
    got = [_batch_keys(next(it)) for _ in range(cut)]
    state = first.state_dict()
    del it
    second = _loader(dataset, 1, 2, workers)
    second.load_state_dict(state)
    got += [_batch_keys(b) for b in second] + [_batch_keys(b) for b in second]
    assert got == full


def test_global_scope_resumes_under_another_layout_exactly_once(dataset):
    old, new, cut = (2, 2), (3, 1), 4
    consumed, states = [], []
    for rank in range(old[0]):
        loader = _loader(dataset, rank, *old)
        it = iter(loader)
        consumed += [k for _ in range(cut) for k in _batch_keys(next(it))]
        states.append(loader.state_dict())
        del it
    yielded, steps = [], []
    for rank in range(new[0]):
        loader = _loader(dataset, rank, *new)
        loader.load_state_dict(states)
        got = [_batch_keys(b) for b in loader]
        steps.append(len(got))
        yielded += [k for b in got for k in b]
        assert [_batch_keys(b) for b in loader] == _planned(loader.dataset, 1, rank, *new)  # next epoch: own plan
    assert len(set(steps)) == 1
    ds = _loader(dataset, 0, *old).dataset
    plain = global_plan(EpochInputs(ds.table, 1, None, 5, 0), old[0] * old[1])
    epoch = collections.Counter(zip(plain.episode.tolist(), plain.anchor.tolist(), strict=True))
    both = collections.Counter(consumed) + collections.Counter(yielded)
    assert max(both.values()) == 1 and not both - epoch
    assert (epoch - both).total() == (epoch.total() - len(consumed)) % (new[0] * new[1])


def test_scope_options_are_checked(dataset):
    with pytest.raises(ValueError, match="scope must be 'local' or 'global'"):
        BalancedWindowDataset(dataset, SPEC, batch_size=2, scope="world")
    with pytest.raises(ValueError, match="batch_by_dataset"):
        BalancedWindowDataset(dataset, SPEC, batch_size=2, scope="global", mix=Mixing(batch_by_dataset=True))
    ds = BalancedWindowDataset(dataset, SPEC, batch_size=2, scope="global")
    assert ds.fetch.mode == "ranged" and ds.stages.deal is not None and ds.stages.order is None
    local = BalancedWindowDataset(dataset, SPEC, batch_size=2)
    assert local.fetch.mode == "stream" and local.stages.deal is None and local.stages.order is not None


def test_a_state_balanced_another_way_is_refused_and_the_loader_batch_size_is_checked(dataset):
    loader = _loader(dataset, 0, 1, 0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    assert state["balance"] == {"scope": "global", "batch_size": BATCH, "chunk_batches": 4}
    # one state version holds both records: the balancing and the planner's shuffle pool
    assert state["version"] == STATE_VERSION and state["shuffle_episodes"] == default_shuffle_episodes(BATCH)
    with pytest.raises(ValueError, match="saved with balancing"):
        _loader(dataset, 0, 1, 0, scope="local").load_state_dict(state)
    with pytest.raises(ValueError, match="the loader's batch_size is 2"):
        WindowLoader(BalancedWindowDataset(dataset, SPEC, batch_size=BATCH, scope="global"), batch_size=2)
