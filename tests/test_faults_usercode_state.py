"""The reader's contract with the user's code and state.

1. An exception raised by the user's code (a ``PostProcess`` hook, a cost, order or deal stage)
   reaches the caller with its own type and a note naming the hook, with 0 and 2 DataLoader
   workers, under ``on_shard_error="skip"``; it is never a damaged episode. Data faults keep their
   policy.
2. A hostile loader state (negative counts, huge world sizes, wrong types, ...) is refused by
   ``load_state_dict`` with an error naming the field.
3. Columns: a column that cannot be returned (text, absent) is refused when the dataset is made,
   naming it; numeric columns keep their declared per-row shape everywhere they come back.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch
from faultgen import SPEC, copy, flip_byte, video_member
from videogen import decode_frame_number, make_episode_table, make_video

from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert
from epishard.stream import PostProcess, WindowDataset, WindowLoader, WindowSpec
from epishard.stream.decode import DecodeError
from epishard.stream.fetch import FetchPolicy
from epishard.stream.options import Mixing, Ranks, ReadOptions, Stages
from epishard.stream.statecheck import StateError, StateTypeError
from epishard.stream.usercode import UserCodeError

# --- 1. the user's exceptions -------------------------------------------------------------------


class HookBoom(Exception):
    """A user's own exception class (module level: a DataLoader worker re-raises it by class)."""


class NoisyHook:
    """Raises ``HookBoom`` when a frame of ``episode`` (its frames show ``100 * e + i``) reaches it."""

    def __init__(self, episode: int):
        self.episode = episode

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        numbers = [decode_frame_number(f) for f in frames]
        if any(n // 100 == self.episode for n in numbers):
            raise HookBoom(f"bad frames {numbers}")
        return frames


def _skip_policy(packets: bool) -> FetchPolicy:
    return FetchPolicy(on_shard_error="skip", packets=packets)


def _caught_skips(caught) -> list[str]:
    return [str(w.message) for w in caught if "skipping episode" in str(w.message)]


@pytest.mark.parametrize("packets", [True, False], ids=["packets", "members"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_hook_exception_reaches_the_caller_with_its_type(intact, workers, packets):
    """Old code: the hook's exception became a ``DecodeError``, episode 3's windows substitutes, one warning."""
    ds = WindowDataset(
        intact, SPEC, seed=5, postprocess=PostProcess(hook=NoisyHook(3)), read=ReadOptions(fetch=_skip_policy(packets))
    )
    loader = WindowLoader(ds, batch_size=2, num_workers=workers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(HookBoom) as info:
            for _ in loader:
                pass
    assert not _caught_skips(caught)
    text = str(info.value) if workers else "\n".join(getattr(info.value, "__notes__", []))
    assert "PostProcess.hook" in text and "NoisyHook" in text and "bad frames [3" in str(info.value)
    if workers:  # torch's re-raise carries the worker's traceback, naming the hook's own line
        assert "in DataLoader worker process" in text and "raise HookBoom" in text


@pytest.mark.parametrize("workers", [0, 2])
def test_a_hook_returning_no_uint8_frames_is_a_user_error_naming_the_hook(intact, workers):
    """Old code: the AttributeError/mismatch inside decode made every episode 'damaged'."""
    post = PostProcess(hook=lambda frames: frames.float())
    ds = WindowDataset(intact, SPEC, seed=5, postprocess=post, read=ReadOptions(fetch=_skip_policy(True)))
    with pytest.raises(UserCodeError, match=r"PostProcess.hook .*<lambda> returned torch.float32 \[\d+, 3, 32, 32\]"):
        for _ in WindowLoader(ds, batch_size=2, num_workers=workers):
            pass


def _boom_cost(episodes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    raise HookBoom(f"cost of {episodes.size} windows")


def _reverse_order(episode, anchor, cost, world, seed, epoch) -> np.ndarray:
    return np.arange(episode.size)[::-1]


def _lossy_order(episode, anchor, cost, world, seed, epoch) -> np.ndarray:
    return np.zeros(episode.size, dtype=np.int64)  # every position the first: windows lost and repeated


def _nan_cost(episodes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    out = np.ones(episodes.size)
    out[1] = np.nan
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_cost_stage_exception_reaches_the_caller_named(intact, workers):
    ds = WindowDataset(intact, SPEC, seed=5, stages=Stages(cost=_boom_cost), read=ReadOptions(fetch=_skip_policy(True)))
    with pytest.raises(HookBoom) as info:
        for _ in WindowLoader(ds, batch_size=2, num_workers=workers):
            pass
    text = str(info.value) if workers else "\n".join(info.value.__notes__)
    assert "the cost stage" in text and "_boom_cost" in text


@pytest.mark.parametrize("workers", [0, 2])
def test_an_order_stage_that_is_no_permutation_is_refused(intact, workers, reference):
    """Old code: the zeros were taken as an order, the epoch yielded one window 30 times, silently."""
    ds = WindowDataset(intact, SPEC, seed=5, stages=Stages(order=_lossy_order))
    with pytest.raises(UserCodeError, match=r"_lossy_order returned no permutation of the \d+ window positions"):
        for _ in WindowLoader(ds, batch_size=2, num_workers=workers):
            pass
    # A real permutation is taken as it is: the same windows, reversed.
    reversed_ds = WindowDataset(intact, SPEC, seed=5, stages=Stages(order=_reverse_order))
    got = [(int(s["episode_index"]), int(s["frame_index"])) for s in reversed_ds]
    plain = [(int(s["episode_index"]), int(s["frame_index"])) for s in reference]
    assert sorted(got) == sorted(plain) and len(got) == len(plain)


def test_a_cost_stage_returning_nan_is_refused_naming_the_window(intact):
    ds = WindowDataset(intact, SPEC, seed=5, stages=Stages(cost=_nan_cost))
    refused = r"_nan_cost returned 1 costs that are not finite, the first nan for window 1 "
    with pytest.raises(UserCodeError, match=refused):
        next(iter(ds))


def test_a_damaged_video_keeps_its_policy_with_a_hook(intact, tmp_path):
    """The hook changes nothing for data faults: a damaged video's windows are still skipped, counted."""
    root = copy(intact, str(tmp_path / "damaged"))
    member = video_member(root, 0)
    flip_byte(root, 0, member["offset"] + member["size"] // 2)
    calls = []
    post = PostProcess(hook=lambda frames: calls.append(frames.shape[0]) or frames)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = list(WindowDataset(root, SPEC, seed=5, postprocess=post, read=ReadOptions(fetch=_skip_policy(False))))
    assert len(samples) == 6 * 20 and any(s["substitute"] for s in samples) and calls
    assert _caught_skips(caught) and not any(s["episode_index"] == 0 and not s["substitute"] for s in samples)


# --- 2. a hostile loader state ------------------------------------------------------------------


def _saved(intact, workers: int = 0, batches: int = 3) -> dict:
    """The state of a 1-rank loader (batches of 2) after ``batches`` batches of epoch 0."""
    loader = WindowLoader(WindowDataset(intact, SPEC, seed=5), batch_size=2, num_workers=workers)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    state = loader.state_dict()
    del it
    return state


@pytest.fixture(scope="module")
def saved(intact) -> dict:
    return _saved(intact)


def _batch_keys(batch) -> list[tuple[int, int]]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))


def _fresh_loader(intact, **kw) -> WindowLoader:
    return WindowLoader(WindowDataset(intact, SPEC, seed=5, **kw), batch_size=2)


# (edit of the saved state, error class, message): each refused naming the field, before any window is read
HOSTILE = {
    "negative-consumed": (
        {"consumed": [-5]},
        StateError,
        r"field 'consumed\[0\]' is -5; must be >= 0",
    ),
    "consumed-past-the-plan": (
        {"consumed": [121]},
        StateError,
        r"field 'consumed\[0\]' is 121; must be 0\.\.120 \(windows per consumer in epoch 0 of this plan under 1 ranks",
    ),
    "huge-world-size": (
        {"world_size": 10**9},
        StateError,
        r"needs the states of all 1000000000 ranks \(a list; got ranks \[0\]\)",
    ),
    "world-size-a-string": ({"world_size": "2"}, StateTypeError, r"field 'world_size' is '2' \(str\); must be an int"),
    "world-size-zero": ({"world_size": 0}, StateError, r"field 'world_size' is 0; must be >= 1"),
    "rank-out-of-the-world": ({"rank": 1}, StateError, r"field 'rank' is 1; must be 0\.\.0 \(ranks of world_size=1\)"),
    "consumed-not-a-list": (
        {"consumed": "abc"},
        StateTypeError,
        r"field 'consumed' is 'abc'; must be a list of 1 ints",
    ),
    "consumed-too-long": ({"consumed": [1, 2]}, StateError, r"field 'consumed' has 2 entries; must have 1"),
    "consumed-a-float": ({"consumed": [2.5]}, StateTypeError, r"field 'consumed\[0\]' is 2\.5 \(float\)"),
    "negative-epoch": ({"epoch": -1}, StateError, r"field 'epoch' is -1; must be 0\.\."),
    "epoch-a-float": ({"epoch": 0.5}, StateTypeError, r"field 'epoch' is 0\.5 \(float\); must be an int"),
    "version-from-the-future": ({"version": 99}, StateError, r"field 'version' is 99; must be 1\.\.\d"),
    "version-a-string": ({"version": "4"}, StateTypeError, r"field 'version' is '4' \(str\)"),
    "plan-version-zero": ({"plan_version": 0}, StateError, r"field 'plan_version' is 0; must be >= 1"),
    "plan-version-a-float": ({"plan_version": 4.0}, StateTypeError, r"field 'plan_version' is 4\.0 \(float\)"),
    "seed-a-string": ({"seed": "5"}, StateTypeError, r"field 'seed' is '5' \(str\)"),
    "rotation-past-the-workers": ({"rotation": 3}, StateError, r"field 'rotation' is 3; must be 0\.\.0"),
    "no-workers": ({"num_workers": 0, "consumed": []}, StateError, r"field 'num_workers' is 0; must be >= 1"),
    "negative-pool": ({"shuffle_episodes": -2}, StateError, r"field 'shuffle_episodes' is -2; must be >= 0"),
    "fresh-a-string": ({"fresh": "yes"}, StateTypeError, r"field 'fresh' is 'yes'; must be True or False"),
    "fresh-but-consumed": ({"fresh": True}, StateError, r"field 'fresh' is True \(an epoch boundary\) but"),
    "history-not-a-list": ({"history": 7}, StateTypeError, r"field 'history' is 7; must be a list"),
    "history-item-no-dict": ({"history": [3]}, StateTypeError, r"field 'history\[0\]' is 3; must be a dict"),
    "history-huge-layout": (
        {"history": [{"world_size": 10**9, "num_workers": 1, "consumed": [0]}]},
        StateError,
        r"history\[0\] field 'consumed' has 1 entries; must have 1000000000",
    ),
    "history-past-the-plan": (
        {"history": [{"world_size": 2, "num_workers": 1, "consumed": [61, 0]}]},
        StateError,
        r"field 'history\[0\]\.consumed\[0\]' is 61; must be 0\.\.60 \(windows per consumer in epoch 0",
    ),
    "missing-consumed": (None, StateTypeError, r"field 'consumed' is missing"),
    "unknown-key": ({"evil": 1}, StateError, r"unknown field\(s\) 'evil'; a state of this version has only \["),
    "history-entry-unknown-key": (
        {"history": [{"world_size": 1, "num_workers": 1, "consumed": [0], "evil": 1}]},
        StateError,
        r"history\[0\] has unknown field\(s\) 'evil'",
    ),
    "history-too-long": (
        {"history": [{"world_size": 1, "num_workers": 1, "consumed": [0]}] * 257},
        StateError,
        r"field 'history' has 257 entries; must have at most 256",
    ),
    "plan-digest-a-number": ({"plan_digest": 7}, StateTypeError, r"field 'plan_digest' is 7; must be a str"),
}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_a_hostile_state_is_refused_naming_the_field(intact, saved, attack):
    edit, error, message = HOSTILE[attack]
    state = {k: v for k, v in saved.items() if k != "consumed"} if edit is None else {**saved, **edit}
    loader = _fresh_loader(intact)
    with pytest.raises(error, match=message):
        loader.load_state_dict(state)
    assert isinstance(error("x"), ValueError)
    if error is StateTypeError:
        assert isinstance(error("x"), TypeError)
    # The loader is untouched: it runs epoch 0 from its start.
    assert loader.state_dict()["epoch"] == 0 and loader.dataset.cursor.pending is None


@pytest.mark.parametrize(
    "state,message",
    [
        (None, r"the state is NoneType; must be a dict"),
        ("state.pt", r"the state is str; must be a dict"),
        ([], r"no state given \(an empty list\)"),
        ([{"epoch": 0, "fresh": True}, 3], r"state \[1\] of the list is int; must be a dict"),
    ],
    ids=["none", "a-path", "empty-list", "list-with-an-int"],
)
def test_a_state_that_is_no_dict_is_refused(intact, state, message):
    with pytest.raises((StateError, StateTypeError), match=message):
        _fresh_loader(intact).load_state_dict(state)


def test_the_same_rank_twice_in_a_list_is_refused(intact, saved):
    with pytest.raises(StateError, match=r"field 'rank' is 0 in more than one state"):
        _fresh_loader(intact).load_state_dict([saved, dict(saved)])


def test_a_list_with_one_hostile_state_names_it(intact):
    states = []
    for rank in range(2):
        loader = WindowLoader(WindowDataset(intact, SPEC, seed=5, ranks=Ranks(rank=rank, world_size=2)), batch_size=2)
        it = iter(loader)
        next(it)
        states.append(loader.state_dict())
        del it
    states[1] = {**states[1], "consumed": [-1]}
    with pytest.raises(StateError, match=r"state \[1\] field 'consumed\[0\]' is -1"):
        _fresh_loader(intact).load_state_dict(states)
    states[1] = {**states[1], "consumed": [10**6]}
    with pytest.raises(StateError, match=r"state \[1\] field 'consumed\[0\]' is 1000000; must be 0\.\.60"):
        _fresh_loader(intact).load_state_dict(states)


def test_a_valid_state_and_a_minimal_fresh_state_still_load(intact, saved, reference):
    loader = _fresh_loader(intact)
    loader.load_state_dict(saved)
    rest = [k for b in loader for k in _batch_keys(b)]
    whole = [k for b in _fresh_loader(intact) for k in _batch_keys(b)]
    assert rest == whole[6:]  # 3 batches of 2 taken before the save
    fresh = _fresh_loader(intact)
    fresh.load_state_dict({"epoch": 2, "fresh": True})
    assert fresh.state_dict()["epoch"] == 2
    with pytest.raises(StateError, match=r"field 'epoch' is -3"):
        fresh.load_state_dict({"epoch": -3, "fresh": True})


def test_window_dataset_load_state_dict_checks_the_same_fields(intact, saved):
    ds = WindowDataset(intact, SPEC, seed=5)
    with pytest.raises(StateError, match=r"field 'consumed\[0\]' is -5"):
        ds.load_state_dict({**saved, "consumed": [-5]})
    with pytest.raises(StateTypeError, match=r"field 'num_workers' is None"):
        ds.load_state_dict({**saved, "num_workers": None})
    with pytest.raises(StateError, match=r"field 'num_workers \(argument\)' is -2; must be >= 0"):
        ds.load_state_dict(saved, num_workers=-2)


def test_the_ray_loader_checks_the_state_before_anything(intact, saved):
    """``RayWindowLoader.load_state_dict`` without a Ray cluster: the check comes before any actor is asked."""
    from epishard.stream.ray_loader import RayWindowLoader

    loader = object.__new__(RayWindowLoader)  # its __init__ starts Ray; load_state_dict needs only these
    loader._running, loader.num_workers = None, 1
    loader.dataset = WindowDataset(intact, SPEC, seed=5).with_options(num_workers=1, batch_size=2)
    loader._epoch, loader._next_start, loader._batches, loader._consumers = 0, None, 0, []
    with pytest.raises(StateError, match=r"field 'epoch' is -1"):
        loader.load_state_dict({"epoch": -1, "fresh": True})
    with pytest.raises(StateError, match=r"field 'consumed\[0\]' is -5"):
        loader.load_state_dict({**saved, "consumed": [-5]})
    with pytest.raises(StateTypeError, match=r"the state is list\[int\]|state \[0\] of the list is int"):
        loader.load_state_dict([1, 2])
    loader.load_state_dict(saved)
    assert loader._next_start is not None and loader._next_start.skip == (6,)


def test_a_million_entry_history_is_refused_before_any_entry_is_looked_at(intact, saved):
    bomb = {**saved, "history": [{"world_size": 1, "num_workers": 1, "consumed": [0]}] * 10**6}
    loader = _fresh_loader(intact)
    t = time.perf_counter()
    with pytest.raises(StateError, match=r"field 'history' has 1000000 entries; must have at most 256"):
        loader.load_state_dict(bomb)
    assert time.perf_counter() - t < 0.5  # was > 600 s (every entry replayed for every other)


def test_a_long_history_is_replayed_once_to_check_its_counts(intact, saved, monkeypatch):
    """Every level's counts are checked in one replay of the history (was one replay per level: quadratic)."""
    module = sys.modules[WindowDataset.__module__]
    calls = []
    real = module.level_plan
    monkeypatch.setattr(module, "level_plan", lambda *a, **kw: calls.append(len(kw["history"])) or real(*a, **kw))
    history = [{"world_size": 1, "num_workers": 1, "consumed": [0]}] * 40
    loader = _fresh_loader(intact)
    loader.load_state_dict({**saved, "history": history})
    assert calls == [40]
    assert loader.dataset.cursor.pending.skip == (6,) and len(loader.dataset.cursor.pending.history) == 40
    # A level past its windows is still named (found in the same replay).
    history = [*history[:5], {"world_size": 2, "num_workers": 1, "consumed": [61, 0]}, *history[:3]]
    calls.clear()
    with pytest.raises(StateError, match=r"field 'history\[5\]\.consumed\[0\]' is 61; must be 0\.\.60 \(windows per"):
        _fresh_loader(intact).load_state_dict({**saved, "history": history})
    assert calls == [9]


@pytest.fixture(scope="module")
def other(tmp_path_factory) -> str:
    """A second dataset: 4 episodes (80 windows of ``SPEC``) where ``intact`` has 6 (120)."""
    from faultgen import make_dataset

    return make_dataset(str(tmp_path_factory.mktemp("other_dataset")), episodes=4)


def test_a_state_of_another_dataset_is_refused_naming_its_plan_digest(intact, saved, other):
    assert len(WindowDataset(other, SPEC, seed=5)) == 80 and saved["consumed"] == [6]
    mine = WindowDataset(intact, SPEC, seed=5).plan_digest
    assert saved["plan_digest"] == mine and len(mine) == 32
    assert WindowDataset(other, SPEC, seed=5).plan_digest != mine
    assert WindowDataset(intact, dataclasses.replace(SPEC, stride=2), seed=5).plan_digest != mine
    loader = _fresh_loader(other)
    digests = r"field 'plan_digest' is '[0-9a-f]{32}', this reader's plan is '[0-9a-f]{32}'"
    with pytest.raises(StateError, match=digests):
        loader.load_state_dict(saved)
    assert loader.dataset.cursor.pending is None
    # A state saved before the digest was recorded still loads (and resumes exactly on its own data).
    old = {k: v for k, v in saved.items() if k != "plan_digest"}
    again = _fresh_loader(intact)
    again.load_state_dict(old)
    whole = [k for b in _fresh_loader(intact) for k in _batch_keys(b)]
    assert [k for b in again for k in _batch_keys(b)] == whole[6:]
    # A state at an epoch boundary loads into any plan.
    boundary = _fresh_loader(intact).state_dict()
    assert boundary["fresh"] and "plan_digest" in boundary
    fresh = _fresh_loader(other)
    fresh.load_state_dict({**boundary, "epoch": 3})
    assert fresh.state_dict()["epoch"] == 3


def test_the_balanced_dataset_checks_its_balance_field(intact, saved):
    from epishard.balance.streaming import BalancedWindowDataset

    ds = BalancedWindowDataset(intact, SPEC, seed=5, batch_size=2)
    with pytest.raises(StateTypeError, match=r"field 'balance' is 'local'; must be a dict"):
        ds.load_state_dict({**saved, "balance": "local"})
    with pytest.raises(StateTypeError, match=r"the state is int"):
        ds.load_state_dict(5)


# --- 3. columns ---------------------------------------------------------------------------------

ROWS3 = 12
CAM3 = "observation.images.front"


def _columns_table(e: int, reward_as_list: bool) -> pa.Table:
    """``make_episode_table`` plus: ``next.reward`` (row + 1000 e; a scalar, or a list of 1), ``reward1``
    (list of 1: row + 0.5), ``grid`` ([2, 3]: 6 row + k), ``note`` (text ``e{e}r{row}``, row 5 null),
    ``blob`` (binary), ``ragged`` (lists of 1 and 3 values), ``ragged_late`` (the same, but lists of
    2 in episode 0) and ``big`` (int64 2**40 + 1000 e + row)."""
    table = make_episode_table(ROWS3)
    rows = np.arange(ROWS3, dtype=np.float32)
    reward = pa.array(rows + 1000 * e)
    if reward_as_list:
        reward = pa.FixedSizeListArray.from_arrays(reward, 1)
    table = table.append_column("next.reward", reward)
    table = table.append_column("reward1", pa.FixedSizeListArray.from_arrays(pa.array(rows + 0.5), 1))
    grid = pa.array((np.repeat(6 * rows, 6) + np.tile(np.arange(6), ROWS3)).astype(np.float32))
    grid = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(grid, 3), 2)
    table = table.append_column("grid", grid)
    table = table.append_column("note", pa.array([None if r == 5 else f"e{e}r{r}" for r in range(ROWS3)]))
    # Lists of 1 and 3 values in turn (2 per row on average: flattened, they divide evenly into rows x 2).
    ragged = [[float(r)] * (1 + 2 * (r % 2)) for r in range(ROWS3)]
    table = table.append_column("ragged", pa.array(ragged, pa.list_(pa.float32())))
    late = ragged if e > 0 else [[float(r)] * 2 for r in range(ROWS3)]  # of one length in episode 0 only
    table = table.append_column("ragged_late", pa.array(late, pa.list_(pa.float32())))
    big = (2**40 + 1000 * e + np.arange(ROWS3, dtype=np.int64)).astype(np.int64)  # float32 rounds these
    table = table.append_column("big", pa.array(big))
    return table.append_column("blob", pa.array([bytes([r]) for r in range(ROWS3)], pa.binary()))


def _columns_dataset(out: str, reward_as_list: bool) -> str:
    episodes = [
        Episode(
            source="c",
            episode_index=e,
            table=_columns_table(e, reward_as_list),
            fps=20,
            tasks=("t",),
            videos={CAM3: CameraVideo(make_video(None, ROWS3, gop=4, start_number=100 * e, height=32, width=32))},
        )
        for e in range(3)
    ]
    features = {"next.reward": {"dtype": "float32", "shape": [1], "names": None}}  # LeRobot declares scalars so
    convert(
        [Source(name="c", fps=20, episodes=episodes, features=features)],
        out,
        ConvertOptions(max_episodes_per_shard=2, progress=False),
    )
    return out


@pytest.fixture(scope="module")
def columns_ds(tmp_path_factory) -> str:
    """3 episodes of 12 rows; ``next.reward`` stored as a scalar."""
    return _columns_dataset(str(tmp_path_factory.mktemp("columns")), reward_as_list=False)


@pytest.fixture(scope="module")
def columns_ds_list(tmp_path_factory) -> str:
    """The same, ``next.reward`` stored as a list of 1."""
    return _columns_dataset(str(tmp_path_factory.mktemp("columns_list")), reward_as_list=True)


def _cam_spec(**kw) -> WindowSpec:
    return WindowSpec(cameras={CAM3: (0,)}, boundary="pad", **kw)


def _all(loader) -> list[dict]:
    return list(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_text_extra_column_comes_back_as_strings(columns_ds, workers):
    """Old code: construction passed, then every episode was 'damaged' (not numeric) and the epoch failed."""
    ds = WindowDataset(columns_ds, _cam_spec(extra_columns=("note", "reward1")), seed=1, shuffle=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = _all(WindowLoader(ds, batch_size=4, num_workers=workers))
    assert not _caught_skips(caught)
    seen = 0
    for b in batches:
        assert isinstance(b["note"], list) and b["reward1"].shape == (len(b["note"]), 1)
        keys = _batch_keys(b)
        for (e, f), note, r1 in zip(keys, b["note"], b["reward1"], strict=True):
            assert note == ("" if f == 5 else f"e{e}r{f}")  # a null is the empty string
            assert r1.tolist() == [f + 0.5]
            seen += 1
    assert seen == 3 * ROWS3


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(column_offsets={"note": (0, 1)}), r"column 'note' \(column_offsets\) holds string values"),
        (dict(state_key="note"), r"column 'note' \(state_key\) holds string values"),
        (dict(extra_columns=("blob",)), r"column 'blob' \(extra_columns\) holds binary values"),
    ],
    ids=["text-window", "text-state", "binary-extra"],
)
def test_a_column_that_cannot_be_returned_is_refused_at_construction(columns_ds, kw, message):
    """Old code: construction passed; every episode then failed to read ('damaged'), the epoch raised FetchError."""
    with pytest.raises(ValueError, match=f"{columns_ds}: {message}"):
        WindowDataset(columns_ds, _cam_spec(**kw))


def test_a_missing_column_is_refused_at_construction_naming_it(columns_ds):
    with pytest.raises(KeyError, match=r"extra_columns asks for column 'next\.rewrd', which the dataset does not have"):
        WindowDataset(columns_ds, _cam_spec(extra_columns=("next.rewrd",)))
    with pytest.raises(KeyError, match=r"action_key asks for column 'actions'.*action_key=None"):
        WindowDataset(columns_ds, _cam_spec(action_key="actions"))


def test_a_column_as_a_window_and_an_extra_column_is_refused():
    """Old code: the anchor row replaced the window: ``next.reward`` came back ``[1]`` next to a ``[3]`` pad mask."""
    with pytest.raises(ValueError, match=r"extra_columns names \['next\.reward'\], which the spec already returns"):
        _cam_spec(extra_columns=("next.reward",), column_offsets={"next.reward": (-1, 0, 1)})
    with pytest.raises(ValueError, match=r"extra_columns names \['action'\]"):
        _cam_spec(extra_columns=("action",), action_horizon=4)
    with pytest.raises(ValueError, match=r"name \['frame_index'\], keys every sample has already"):
        _cam_spec(column_offsets={"frame_index": (0, 1)})


DELTAS = {"next.reward": [-0.1, 0.0, 0.05], "grid": [0.0, 0.05], "action": [0.0, 0.05], CAM3: [0.0]}


def _check_shape_one(samples: list[dict], stacked: bool) -> int:
    """Every window of ``next.reward`` is float32 ``[3, 1]`` (``[B, 3, 1]`` batched) with the rows' exact
    values, edge rows clamped and flagged; ``reward1`` ``[1]``; ``grid`` ``[2, 2, 3]``."""
    n = 0
    for s in samples:
        keys = _batch_keys(s) if stacked else None
        if not stacked:
            s = {k: (v[None] if isinstance(v, torch.Tensor) else [v]) for k, v in s.items()}
            keys = [(int(s["episode_index"][0]), int(s["frame_index"][0]))]
        b = len(keys)
        assert s["next.reward"].shape == (b, 3, 1) and s["next.reward"].dtype == torch.float32
        assert s["reward1"].shape == (b, 1) and s["grid"].shape == (b, 2, 2, 3)
        for i, (e, f) in enumerate(keys):
            rows = np.array([f - 2, f, f + 1])
            assert s["next.reward"][i, :, 0].tolist() == (np.clip(rows, 0, ROWS3 - 1) + 1000 * e).tolist()
            assert s["next.reward_is_pad"][i].tolist() == ((rows < 0) | (rows >= ROWS3)).tolist()
            assert s["reward1"][i].tolist() == [f + 0.5]
            g = min(f + 1, ROWS3 - 1)
            assert s["grid"][i, 1].tolist() == [[6 * g, 6 * g + 1, 6 * g + 2], [6 * g + 3, 6 * g + 4, 6 * g + 5]]
            n += 1
    return n


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shape_1_feature_keeps_its_shape_everywhere(columns_ds, workers):
    """``next.reward`` declared ``[1]``, stored as a scalar; ``grid`` ``[2, 3]`` (old code: ``[6]``, ``[T, 6]``)."""
    spec = WindowSpec.from_delta_timestamps(DELTAS, fps=20, boundary="pad", extra_columns=("reward1",))
    ds = WindowDataset(columns_ds, spec, seed=1)
    assert _check_shape_one(list(ds), stacked=False) == 3 * ROWS3  # the sample dicts, padded edges included
    batches = list(WindowLoader(ds, batch_size=5, num_workers=workers))
    assert sum(_check_shape_one([b], stacked=True) for b in batches) == 3 * ROWS3


@pytest.mark.parametrize("pad_dims", [None, True], ids=["natural", "pad_dims"])
def test_a_mix_of_a_scalar_and_a_list_of_one_batches_with_one_shape(columns_ds, columns_ds_list, pad_dims):
    spec = WindowSpec.from_delta_timestamps(DELTAS, fps=20, boundary="pad", extra_columns=("reward1",))
    ds = WindowDataset([columns_ds, columns_ds_list], spec, seed=1, mix=Mixing(pad_dims=pad_dims))
    batches = list(WindowLoader(ds, batch_size=6, num_workers=0))
    assert sum(_check_shape_one([b], stacked=True) for b in batches) == 2 * 3 * ROWS3
    if pad_dims:
        assert all(b["next.reward_dim_is_pad"].shape == (len(b["task"]), 1) for b in batches)
        assert "grid_dim_is_pad" not in batches[0]  # a [2, 3] column keeps its shape, never padded
    with pytest.raises(ValueError, match=r"column 'grid' is multi-dimensional"):
        WindowDataset([columns_ds, columns_ds_list], spec, mix=Mixing(pad_dims={"grid": 8}))


@pytest.mark.parametrize("persistent", [False, True], ids=["workers", "persistent-workers"])
def test_an_error_in_a_worker_stops_the_workers_at_once(intact, persistent):
    """Old code: the error's traceback kept torch's iterator in a cycle; collecting it waited 5 s per worker."""
    import gc
    import time

    ds = WindowDataset(intact, SPEC, seed=5, postprocess=PostProcess(hook=NoisyHook(0)))
    loader = WindowLoader(ds, batch_size=2, num_workers=2, persistent_workers=persistent)
    with pytest.raises(HookBoom):
        for _ in loader:
            pass
    t = time.perf_counter()
    gc.collect()
    assert time.perf_counter() - t < 2.5
    assert loader._iterator is None  # persistent workers too: the next iteration starts new ones
    ds_ok = WindowDataset(intact, SPEC, seed=5)
    assert sum(len(b["task"]) for b in WindowLoader(ds_ok, batch_size=2, num_workers=2)) == 6 * 20


def test_a_column_of_lists_of_varying_length_is_refused(columns_ds):
    """Old code: 1- and 3-value rows were flattened and cut into rows of 2, silently giving other rows' values."""
    varying = r"column 'ragged' \(extra_columns\) holds lists of varying length \(shape \[None\]\)"
    with pytest.raises(ValueError, match=varying):
        WindowDataset(columns_ds, _cam_spec(extra_columns=("ragged",)))
    # Of one length in the first episode (the manifest's shape [2]), ragged in the others: a data fault
    # of those episodes, named, under the shard policy.
    spec = _cam_spec(extra_columns=("ragged_late",))
    ds = WindowDataset(columns_ds, spec, seed=1, read=ReadOptions(fetch=FetchPolicy(on_shard_error="raise")), shuffle=0)
    with pytest.raises(
        DecodeError, match=r"episode c-e00000[12].*column 'ragged_late': row 1 holds 3 values, the first 1"
    ):
        list(ds)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = list(WindowDataset(columns_ds, spec, seed=1, shuffle=0))
    real = [s for s in samples if not s["substitute"]]
    assert {int(s["episode_index"]) for s in real} == {0} and len(_caught_skips(caught)) == 2
    assert all(s["ragged_late"].tolist() == [s["frame_index"]] * 2 for s in real)


def _fake_source(name: str, **features):
    """A stand-in for ``DatasetSource`` with only what ``check_columns`` reads: state, action and ``features``."""
    from types import SimpleNamespace

    from epishard.format.manifest import FeatureEntry

    given = {"observation.state": ("float", [4]), "action": ("float", [3]), **features}
    entries = {k: FeatureEntry(dtype=d, shape=tuple(shape), names=None) for k, (d, shape) in given.items()}
    return SimpleNamespace(shown=name, manifest=SimpleNamespace(features=entries))


def test_check_columns_refuses_text_lists_and_a_column_text_in_one_dataset_numeric_in_another():
    from epishard.stream.mix import check_columns

    spec = _cam_spec(extra_columns=("note",))
    check_columns([_fake_source("a", note=("string", [])), _fake_source("b", note=("large_string", []))], spec)
    with pytest.raises(ValueError, match=r"column 'note' is numeric in b but text in a"):
        check_columns([_fake_source("a", note=("string", [])), _fake_source("b", note=("double", [1]))], spec)
    with pytest.raises(ValueError, match=r"a: column 'note' \(extra_columns\) holds lists of text \(shape \[2\]\)"):
        check_columns([_fake_source("a", note=("string", [2]))], spec)
    dictionary = "dictionary<values=string, indices=int32, ordered=0>"
    check_columns([_fake_source("a", note=(dictionary, []))], spec)  # dictionary-encoded text is text


@pytest.mark.parametrize("workers", [0, 2])
def test_an_integer_column_comes_back_exactly(columns_ds, workers):
    """Old code: float32, so 2**40 + 1000 e + row came back rounded to a multiple of 2**17."""
    spec = _cam_spec(extra_columns=("big",), column_offsets={"index": (-1, 0)})
    batches = list(WindowLoader(WindowDataset(columns_ds, spec, seed=1), batch_size=4, num_workers=workers))
    seen = 0
    for b in batches:
        assert b["big"].dtype == torch.int64 and b["index"].dtype == torch.int64
        for (e, f), big, index in zip(_batch_keys(b), b["big"], b["index"], strict=True):
            assert big.tolist() == [2**40 + 1000 * e + f]
            assert index.tolist() == [[max(f - 1, 0)], [f]]
            seen += 1
    assert seen == 3 * ROWS3


def test_a_column_integer_in_one_dataset_and_float_in_another_is_refused_unless_normalised():
    from epishard.stream.mix import check_columns

    spec = _cam_spec(extra_columns=("count",))
    mix = [_fake_source("a", count=("int64", [])), _fake_source("b", count=("double", []))]
    with pytest.raises(ValueError, match=r"column 'count' is integer in a but numeric in b"):
        check_columns(mix, spec)
    check_columns(mix, spec, normalized=("count",))  # normalised: float32 in both


def _stopping_cost(episodes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    raise StopIteration


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stop_iteration_of_the_users_code_never_ends_the_epoch_silently(intact, workers):
    """Old code, 2 workers: torch re-raised the worker's StopIteration inside the loader, which ended the
    epoch with no batch and no error."""
    ds = WindowDataset(intact, SPEC, seed=5, stages=Stages(cost=_stopping_cost))
    with pytest.raises(UserCodeError, match=r"the cost stage .*_stopping_cost raised StopIteration"):
        for _ in WindowLoader(ds, batch_size=2, num_workers=workers):
            pass
