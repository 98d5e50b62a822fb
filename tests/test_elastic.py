"""Exact elastic resume: a mid-epoch state saved under (world W1, workers K1) resumed under (W2, K2).

The rule under test (docs/guide/streaming.md, "Elastic resume"): every window of the epoch's plan is consumed before
the save, or yielded exactly once after the resume by one of the new consumers, or is one of the
``R mod (W2 x K2)`` windows (``R``: windows not yet consumed) left out at the resume; none twice;
every new consumer yields the same number (so every new rank the same number of batches); the
next epoch is the new layout's own plan.

Pure tests first (``stream.plan``: no I/O), then the same through ``WindowLoader`` on a tiny
generated dataset whose frames carry their frame number.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from videogen import convert_numbered, decode_frame_number

from epishard.balance.streaming import BalancedOrder
from epishard.stream import WindowDataset, WindowLoader, WindowSpec, World
from epishard.stream.mixplan import BatchByDataset
from epishard.stream.options import Ranks
from epishard.stream.plan import EpisodeTable, EpochInputs, PerEpisode, Progress, global_plan, level_plan, worker_plan

# --- pure: stream.plan ---------------------------------------------------------------------------


def _table(stratified: bool = False) -> EpisodeTable:
    """3 shards (fewer than most layouts' consumers), 9 episodes of uneven length (one without windows)."""
    rows = np.array([41, 7, 130, 18, 0, 66, 25, 93, 12])
    shard = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    return EpisodeTable(
        shard=shard,
        lo=np.zeros(rows.size, dtype=np.int64),
        hi=rows.astype(np.int64),
        weight=np.ones(rows.size),
        cost_bytes=rows * 100 + 5,
        stratum=(shard == 2).astype(np.int64) if stratified else None,
    )


KW = dict(stride=1, per_episode=None, seed=3, epoch=1, shuffle_episodes=2)


def _inputs(table, stride=1, per_episode=None, seed=3, epoch=1, **_) -> EpochInputs:
    return EpochInputs(table, stride, per_episode, seed, epoch)


def _plans(table, world_size, workers, history=(), **stages):
    """Every consumer's ``WorkerPlan`` of a layout (``workers=0``: a process without workers, one consumer)."""
    k = max(workers, 1)
    return [
        worker_plan(
            _inputs(table, **KW),
            shuffle_episodes=KW["shuffle_episodes"],
            world=World.of_consumer(c, world_size, k),
            history=history,
            **stages,
        )
        for c in range(world_size * k)
    ]


def _consumed_counts(plans, world_size, workers, batches, batch_size) -> tuple[int, ...]:
    """What ``WindowLoader`` records after each rank consumed ``batches`` batches: the in-order
    round-robin gives worker ``w`` batches ``w, w + K, ...``."""
    k = max(workers, 1)
    out = []
    for c, plan in enumerate(plans):
        w = c % k
        taken = -(-(batches - w) // k) if batches > w else 0
        out.append(min(taken * batch_size, len(plan)))
    return tuple(out)


def _keys(plan, n=None) -> list[tuple[int, int]]:
    e, a = plan.episode[:n], plan.anchor[:n]
    return list(zip(e.tolist(), a.tolist(), strict=True))


def _check_exactly_once(table, old, new, batches, batch_size, **stages) -> int:
    """Resume ``old`` (ranks, workers) after ``batches`` batches per rank under ``new``; assert the
    rule; return how many windows the resume left out."""
    before = _plans(table, *old, **stages)
    progress = Progress(old[0], max(old[1], 1), _consumed_counts(before, *old, batches, batch_size))
    after = _plans(table, *new, history=(progress,), **stages)
    epoch = collections.Counter(
        _keys(global_plan(EpochInputs(table, KW["stride"], None, KW["seed"], KW["epoch"]), len(before)))
    )
    consumed = collections.Counter(k for p, n in zip(before, progress.consumed, strict=True) for k in _keys(p, n))
    yielded = collections.Counter(k for p in after for k in _keys(p))
    assert len({len(p) for p in after}) == 1  # every new consumer (so every new rank) yields as many
    assert max(consumed.values(), default=1) == 1 and max(yielded.values(), default=1) == 1
    assert not consumed & yielded  # nothing consumed is yielded again
    left_out = epoch - consumed - yielded
    assert consumed + yielded + left_out == epoch  # nothing outside the epoch's plan
    consumers = new[0] * max(new[1], 1)
    strata = np.zeros(table.num_episodes, dtype=np.int64) if table.stratum is None else table.stratum
    remaining = np.bincount([strata[e] for e, _ in (epoch - consumed).elements()], minlength=strata.max() + 1)
    # Each stratum (dataset of a mix) is dealt on its own: its remainder mod consumers is left out.
    assert left_out.total() == after[0].dropped == int(np.sum(remaining % consumers))
    return left_out.total()


LAYOUTS = [  # (ranks, workers) before -> after
    ((2, 2), (1, 2)),  # 2 -> 1 ranks
    ((2, 2), (4, 2)),  # 2 -> 4 ranks
    ((4, 2), (3, 2)),  # 4 -> 3 ranks
    ((2, 2), (2, 0)),  # workers 2 -> 0
    ((2, 0), (2, 2)),  # workers 0 -> 2
    ((1, 0), (3, 3)),
]


@pytest.mark.parametrize("old,new", LAYOUTS, ids=lambda x: f"{x[0]}x{x[1]}")
@pytest.mark.parametrize("batches", [0, 1, 5, 12])
def test_resume_under_another_layout_yields_every_window_not_consumed_exactly_once(old, new, batches):
    _check_exactly_once(_table(), old, new, batches, batch_size=4)


@pytest.mark.parametrize("old,new", LAYOUTS, ids=lambda x: f"{x[0]}x{x[1]}")
def test_union_of_consumed_and_resumed_is_the_whole_epoch_when_nothing_is_left_out(old, new):
    """Where the windows left divide evenly among the new consumers, consumed-before plus
    yielded-after is exactly the uninterrupted epoch's window set."""
    cuts = ((b, size) for size in (1, 3) for b in range(1, 40))
    evenly = next((cut for cut in cuts if _check_exactly_once(_table(), old, new, *cut) == 0), None)
    assert evenly, "no cut point in this epoch divides evenly: the test would not test the whole set"


def test_elastic_resume_with_strata_and_the_balanced_order_stage():
    """Mixed datasets (strata) and a cost-ordering stage: the same rule, and the new plans still give
    every consumer the same share of each stratum."""
    table = _table(stratified=True)
    stages = dict(cost=lambda e, a: (e * 7 + a % 5).astype(np.float64), order=BalancedOrder(4, 2, table.stratum, 2))
    for old, new in [((2, 2), (3, 1)), ((1, 0), (2, 2))]:
        for batches in (2, 7):
            _check_exactly_once(table, old, new, batches, batch_size=4, **stages)
    after = _plans(table, 3, 1, history=(Progress(2, 2, (3, 0, 8, 4)),), **stages)
    shares = {tuple(np.bincount(table.stratum[p.episode], minlength=2)) for p in after}
    assert len(shares) == 1
    assert all(p.cost is not None and p.cost.tolist() == stages["cost"](p.episode, p.anchor).tolist() for p in after)


def _whole_batches(plan, stratum, batch_size) -> bool:
    datasets = stratum[plan.episode].reshape(-1, batch_size) if len(plan) else np.zeros((0, batch_size))
    return len(plan) % batch_size == 0 and bool(np.all(datasets == datasets[:, :1]))


@pytest.mark.parametrize("old,new", [((2, 2), (3, 1)), ((1, 0), (2, 2)), ((2, 1), (1, 3))])
def test_elastic_resume_with_batch_by_dataset_keeps_batches_whole_and_exactly_once(old, new):
    """batch_by_dataset is the plan's group stage: the old consumers' grouped yield orders are
    replayed, what no consumer took (the windows the old grouping left out included) is dealt again
    and grouped again; every batch stays one dataset's, every new consumer yields as many, none twice."""
    table, size = _table(stratified=True), 3
    group = BatchByDataset(table.stratum, size)
    before = _plans(table, *old, group=group)
    assert all(_whole_batches(p, table.stratum, size) for p in before)
    progress = Progress(old[0], max(old[1], 1), _consumed_counts(before, *old, batches=3, batch_size=size))
    after = _plans(table, *new, history=(progress,), group=group)
    assert all(_whole_batches(p, table.stratum, size) for p in after) and len({len(p) for p in after}) == 1
    assert len(after[0]) > 0
    epoch = collections.Counter(
        _keys(global_plan(EpochInputs(table, 1, None, KW["seed"], KW["epoch"]), progress.consumers))
    )
    consumed = collections.Counter(k for p, n in zip(before, progress.consumed, strict=True) for k in _keys(p, n))
    yielded = collections.Counter(k for p in after for k in _keys(p))
    assert max(consumed.values()) == 1 and max(yielded.values()) == 1 and not consumed & yielded
    left_out = epoch - consumed - yielded
    assert consumed + yielded + left_out == epoch
    assert left_out.total() == after[0].dropped  # the deal's remainder plus the new grouping's


def test_two_layout_changes_in_one_epoch():
    """2x2 -> 3x1 -> 1x2: each change deals what is left again; still exactly once overall."""
    table = _table()
    first = _plans(table, 2, 2)
    p1 = Progress(2, 2, _consumed_counts(first, 2, 2, batches=3, batch_size=4))
    second = _plans(table, 3, 1, history=(p1,))
    p2 = Progress(3, 1, tuple(min(5, len(p)) for p in second))
    third = _plans(table, 1, 2, history=(p1, p2))
    consumed = [k for p, n in zip(first, p1.consumed, strict=True) for k in _keys(p, n)]
    consumed += [k for p, n in zip(second, p2.consumed, strict=True) for k in _keys(p, n)]
    yielded = [k for p in third for k in _keys(p)]
    every = consumed + yielded
    assert len(set(every)) == len(every)
    epoch = set(_keys(global_plan(EpochInputs(table, 1, None, KW["seed"], KW["epoch"]), 4)))
    dropped = second[0].dropped + third[0].dropped
    assert set(every) <= epoch and len(epoch) - len(every) == dropped < 3 + 2
    assert len({len(p) for p in third}) == 1


def test_remainder_is_a_pure_function_of_the_state_and_layout():
    table = _table()
    history = (Progress(2, 2, (9, 4, 0, 17)),)
    a = level_plan(_inputs(table, per_episode=PerEpisode()), **_level_kw(), consumers=6, history=history)
    b = level_plan(_inputs(_table(), per_episode=PerEpisode()), **_level_kw(), consumers=6, history=history)
    assert np.array_equal(a.episode, b.episode) and np.array_equal(a.anchor, b.anchor)
    same = level_plan(
        _inputs(table, per_episode=PerEpisode()), **_level_kw(), consumers=4
    )  # no history: the epoch's own plan
    plain = global_plan(EpochInputs(table, 1, None, KW["seed"], KW["epoch"]), 4)
    assert np.array_equal(same.episode, plain.episode) and same.dropped == plain.dropped
    with pytest.raises(ValueError, match="consumed 999 windows"):
        level_plan(
            _inputs(table, per_episode=PerEpisode()),
            **_level_kw(),
            consumers=6,
            history=(Progress(2, 2, (999, 0, 0, 0)),),
        )
    with pytest.raises(ValueError, match="needs 4 counts"):
        Progress(2, 2, (1, 2, 3))


def _level_kw() -> dict:
    from epishard.stream.stages import ConsumerStages

    return dict(stages=ConsumerStages(KW["shuffle_episodes"]))


# --- end to end: WindowLoader on a generated dataset ---------------------------------------------

LENGTHS = [23, 9, 31, 15, 27, 12, 40]
CAM = "observation.images.front"
SPEC = WindowSpec(cameras={CAM: (0,)}, state_offsets=(0,), action_horizon=1, boundary="pad", stride=2)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    cameras = {CAM: dict(height=32, width=32, gop=8)}
    tasks = ["t"] * len(LENGTHS)
    return convert_numbered(tmp_path_factory.mktemp("elastic"), LENGTHS, cameras, per_shard=3, tasks=tasks, name="el")


def _loader(dataset, rank, world, workers, batch_size=2):
    ds = WindowDataset(dataset, SPEC, seed=4, ranks=Ranks(rank=rank, world_size=world), shuffle=2)
    return WindowLoader(ds, batch_size=batch_size, num_workers=workers)


def _batch_keys(batch) -> list[tuple[int, int]]:
    keys = list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))
    for (e, f), frames in zip(keys, batch[CAM], strict=True):
        assert decode_frame_number(frames[0]) == 100 * e + f  # the frame is the window's own
    return keys


@pytest.mark.parametrize("old,new", [((2, 2), (3, 0)), ((1, 0), (2, 2))], ids=lambda x: f"{x[0]}x{x[1]}")
def test_window_loader_resumes_under_another_layout_exactly_once(dataset, old, new):
    cut = 3
    consumed, states = [], []
    for rank in range(old[0]):
        loader = _loader(dataset, rank, *old)
        it = iter(loader)
        consumed += [k for _ in range(cut) for k in _batch_keys(next(it))]
        states.append(loader.state_dict())
        del it
    yielded, batches = [], []
    for rank in range(new[0]):
        loader = _loader(dataset, rank, *new)
        loader.load_state_dict(states[::-1])  # any order
        got = [_batch_keys(b) for b in loader]
        batches.append(len(got))
        yielded += [k for b in got for k in b]
        next_epoch = [_batch_keys(b) for b in loader]
        assert next_epoch == _planned_batches(loader.dataset, 1, rank, *new, batch_size=2)  # the new layout's plan
    assert len(set(batches)) == 1  # every new rank the same number of batches
    ds = WindowDataset(dataset, SPEC, seed=4)
    epoch = collections.Counter(_keys(global_plan(EpochInputs(ds.table, 2, None, 4, 0), old[0] * max(old[1], 1))))
    got = collections.Counter(consumed) + collections.Counter(yielded)
    assert max(got.values()) == 1 and not got - epoch
    consumers = new[0] * max(new[1], 1)
    assert (epoch - got).total() == (epoch.total() - len(consumed)) % consumers


def _planned_batches(ds, epoch, rank, world, workers, batch_size) -> list[list[tuple[int, int]]]:
    """The batches a rank's loader yields for a fresh ``epoch``: each worker's plan cut into batches,
    taken round-robin over the workers (the DataLoader's in-order mode)."""
    k = max(workers, 1)
    per_worker = []
    for w in range(k):
        keys = _keys(ds.plan(epoch, World(rank, world, w, k)))
        per_worker.append([keys[i : i + batch_size] for i in range(0, len(keys), batch_size)])
    return [b for step in zip(*per_worker, strict=True) for b in step]


def test_resuming_twice_in_one_epoch_continues_exactly(dataset):
    """A state taken after a resume counts the batches before the resume too: save, resume, save
    again, resume: the batches are the uninterrupted run's."""
    reference = [_batch_keys(b) for b in _loader(dataset, 0, 1, 2)]
    first = _loader(dataset, 0, 1, 2)
    it = iter(first)
    got = [_batch_keys(next(it)) for _ in range(3)]
    state = first.state_dict()
    del it
    second = _loader(dataset, 0, 1, 2)
    second.load_state_dict(state)
    it = iter(second)
    got += [_batch_keys(next(it)) for _ in range(4)]
    state = second.state_dict()
    del it
    third = _loader(dataset, 0, 1, 2)
    third.load_state_dict(state)
    got += [_batch_keys(b) for b in third]
    assert got == reference


def test_a_state_of_another_rank_of_the_same_layout_is_refused(dataset):
    state = WindowDataset(dataset, SPEC, seed=4, ranks=Ranks(rank=1, world_size=2)).state_dict(1, 2, 0, epoch=0)
    with pytest.raises(ValueError, match=r"the states are of ranks \[1\], not of this rank 0"):
        WindowDataset(dataset, SPEC, seed=4, ranks=Ranks(rank=0, world_size=2)).load_state_dict(state)


def test_the_shuffle_pool_follows_the_batch_size_and_a_state_records_it(dataset):
    """``shuffle_episodes="auto"`` is 8 x the loader's batch size; a mid-epoch state carries the pool and
    is refused by a run that would plan with another pool, or when saved by a version before the
    plan-level shuffle (another plan); at an epoch boundary either loads."""
    ds = WindowDataset(dataset, SPEC, seed=4)
    assert ds.pool_episodes() == 512  # no batch size known
    loader = WindowLoader(ds, batch_size=2)
    assert loader.dataset.pool_episodes() == 16 and ds.pool_episodes() == 512  # the loader's copy
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    assert state["shuffle_episodes"] == 16 and (state["version"], state["plan_version"]) == (5, 4)
    with pytest.raises(ValueError, match="shuffle_episodes=16"):
        WindowLoader(WindowDataset(dataset, SPEC, seed=4), batch_size=3).load_state_dict(state)
    same = WindowLoader(WindowDataset(dataset, SPEC, seed=4, shuffle=16), batch_size=3)
    same.load_state_dict(state)  # the same pool given explicitly: the same plan
    v3 = state | {"plan_version": 3}  # the same pool cut the old way (P, P, ..., the rest): another plan
    with pytest.raises(ValueError, match=r"pool cuts.*set_epoch\(1\)"):
        WindowLoader(WindowDataset(dataset, SPEC, seed=4), batch_size=2).load_state_dict(v3)
    v3 = {k: v for k, v in state.items() if k != "plan_version"} | {"version": 3}  # before the versions split
    with pytest.raises(ValueError, match=r"pool cuts.*set_epoch\(1\)"):
        WindowLoader(WindowDataset(dataset, SPEC, seed=4), batch_size=2).load_state_dict(v3)
    old = {k: v for k, v in state.items() if k not in ("shuffle_episodes", "plan_version")} | {"version": 2}
    with pytest.raises(ValueError, match=r"set_epoch\(1\)"):
        WindowLoader(WindowDataset(dataset, SPEC, seed=4), batch_size=2).load_state_dict(old)
    fresh = WindowLoader(WindowDataset(dataset, SPEC, seed=4), batch_size=2)
    fresh.load_state_dict({**old, "consumed": [0]})  # nothing consumed: any plan continues exactly
    newer = state | {"plan_version": 99}  # a plan this reader does not make
    with pytest.raises(ValueError, match=r"plan version 99 is newer"):
        WindowLoader(WindowDataset(dataset, SPEC, seed=4), batch_size=2).load_state_dict(newer)
    assert WindowDataset(dataset, SPEC, seed=4, shuffle=0).pool_episodes() == 0
    with pytest.raises(ValueError, match="shuffle must be"):
        WindowDataset(dataset, SPEC, seed=4, shuffle=-3)
