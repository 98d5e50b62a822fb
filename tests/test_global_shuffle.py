"""``WindowDataset(shuffle="global")``: every window of the epoch dealt at random to every rank and worker.

Pure tests of the deal stage first (``stream.plan.GlobalShuffle``: exactly once per epoch under every
layout, elastic resume, batch diversity against i.i.d. sampling), then through ``WindowLoader`` on a
tiny generated dataset whose frames carry their frame number (exact mid-epoch resume, a state of
another shuffle refused).
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from test_elastic import LAYOUTS, _check_exactly_once, _keys, _table
from videogen import convert_numbered, decode_frame_number

from epishard.stream import WindowDataset, WindowLoader, WindowSpec, World
from epishard.stream.diversity import iid, measured, ratio
from epishard.stream.plan import EpisodeTable, EpochInputs, GlobalShuffle, global_plan, worker_plan

# --- pure: the deal stage -------------------------------------------------------------------------


@pytest.mark.parametrize("old,new", LAYOUTS, ids=lambda x: f"{x[0]}x{x[1]}")
@pytest.mark.parametrize("batches", [0, 1, 5])
def test_global_shuffle_resumes_under_another_layout_exactly_once(old, new, batches):
    _check_exactly_once(_table(), old, new, batches, batch_size=4, deal=GlobalShuffle())
    _check_exactly_once(_table(stratified=True), old, new, batches, batch_size=4, deal=GlobalShuffle())


def _big_table(episodes: int = 400, seed: int = 0) -> EpisodeTable:
    rows = np.random.default_rng(seed).integers(20, 200, episodes)
    return EpisodeTable(
        shard=np.arange(episodes) // 10,
        lo=np.zeros(episodes, dtype=np.int64),
        hi=rows.astype(np.int64),
        weight=np.ones(episodes),
        cost_bytes=rows * 100,
    )


def _batches(table, world_size: int, workers: int, batch: int, **kw) -> list[list[int]]:
    """Every consumer's plan cut into batches of episode ids."""
    out = []
    for c in range(world_size * workers):
        plan = worker_plan(EpochInputs(table, 1, None, 7, 2), world=World.of_consumer(c, world_size, workers), **kw)
        e = plan.episode.tolist()
        out += [e[i : i + batch] for i in range(0, len(e) - batch + 1, batch)]
    return out


def test_a_batch_is_as_diverse_as_iid_sampling_of_the_whole_epoch():
    """400 episodes of 20-199 windows, 2 ranks x 2 workers, batches of 8: distinct episodes per batch
    >= 0.99 of i.i.d. (a pool of 16 episodes, for contrast, stays well under it); every window of the
    epoch once, a consumer's part drawn from (nearly) every episode."""
    table = _big_table()
    windows = (table.hi - table.lo).astype(float)
    reference = iid(windows, 8)
    glob = _batches(table, 2, 2, 8, deal=GlobalShuffle())
    pooled = _batches(table, 2, 2, 8, shuffle_episodes=16)
    assert ratio(measured(glob), reference) >= 0.99, measured(glob)
    assert ratio(measured(pooled), reference) < 0.97, measured(pooled)
    plans = [
        worker_plan(EpochInputs(table, 1, None, 7, 2), world=World.of_consumer(c, 2, 2), deal=GlobalShuffle())
        for c in range(4)
    ]
    got = collections.Counter(k for p in plans for k in _keys(p))
    epoch = collections.Counter(_keys(global_plan(EpochInputs(table, 1, None, 7, 2), 4)))
    assert got == epoch  # the same windows as the default plan keeps, each once
    assert all(len(set(p.episode.tolist())) > 0.95 * table.num_episodes for p in plans)


def test_the_deal_is_a_pure_function_of_seed_epoch_and_layout():
    table = _big_table(60)
    a = GlobalShuffle()(table, *_epoch_windows(table), 2, 2, 7, 3, 0)
    b = GlobalShuffle()(table, *_epoch_windows(table), 2, 2, 7, 3, 0)
    c = GlobalShuffle()(table, *_epoch_windows(table), 2, 2, 7, 4, 0)
    assert np.array_equal(a.episode, b.episode) and np.array_equal(a.anchor, b.anchor)
    assert not np.array_equal(a.episode, c.episode)


def _epoch_windows(table):
    from epishard.stream.plan import epoch_windows

    return epoch_windows(EpochInputs(table, 1, None, 7, 3))


# --- end to end: WindowLoader ---------------------------------------------------------------------

LENGTHS = [23, 9, 31, 15, 27, 12, 40, 18]
CAM = "observation.images.front"
SPEC = WindowSpec(cameras={CAM: (0,)}, state_offsets=(0,), action_horizon=1, boundary="pad", stride=2)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    cameras = {CAM: dict(height=32, width=32, gop=8)}
    return convert_numbered(
        tmp_path_factory.mktemp("global"), LENGTHS, cameras, per_shard=3, tasks=["t"] * len(LENGTHS), name="gl"
    )


def _loader(dataset, workers=2, batch_size=3, shuffle="global"):
    return WindowLoader(
        WindowDataset(dataset, SPEC, seed=4, shuffle=shuffle), batch_size=batch_size, num_workers=workers
    )


def _batch_keys(batch) -> list[tuple[int, int]]:
    keys = list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))
    for (e, f), frames in zip(keys, batch[CAM], strict=True):
        assert decode_frame_number(frames[0]) == 100 * e + f  # the frame is the window's own
    return keys


def test_every_window_once_with_its_own_frame_and_an_exact_mid_epoch_resume(dataset):
    reference = [_batch_keys(b) for b in _loader(dataset)]
    flat = [k for b in reference for k in b]
    windows = sum(-(-n // 2) for n in LENGTHS)
    assert len(flat) == len(set(flat)) == windows - windows % 2  # each once; the remainder mod 2 consumers out
    first_batch_episodes = [{e for e, _ in b} for b in reference]
    assert max(len(s) for s in first_batch_episodes) == 3  # windows of different episodes share batches
    loader = _loader(dataset)
    it = iter(loader)
    got = [_batch_keys(next(it)) for _ in range(5)]
    state = loader.state_dict()
    del it
    resumed = _loader(dataset)
    resumed.load_state_dict(state)
    got += [_batch_keys(b) for b in resumed]
    assert got == reference


def test_a_state_of_the_global_shuffle_is_refused_by_another_shuffle(dataset):
    loader = _loader(dataset, workers=0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    with pytest.raises(ValueError, match="plan_digest"):
        _loader(dataset, workers=0, shuffle=None).load_state_dict(state)
    with pytest.raises(ValueError, match="takes no Stages"):
        from epishard.balance.globaldeal import GlobalDeal
        from epishard.stream.options import Stages

        WindowDataset(dataset, SPEC, shuffle="global", stages=Stages(deal=GlobalDeal(lambda e, a: e * 1.0, 2)))


def test_epishard_stream_takes_the_global_shuffle(dataset, capsys):
    from epishard.cli import main

    assert main(["stream", dataset, "--shuffle-episodes", "global", "--batches", "2", "--batch-size", "4", "-q"]) == 0
    assert "8 samples in 2 batches" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["stream", dataset, "--shuffle-episodes", "globall"])
    assert "'auto', 'all' or 'global'" in capsys.readouterr().err
