"""The reader's contract with the user's code and state (issue 23, group G1).

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

import warnings

import numpy as np
import pytest
import torch
from faultgen import SPEC, copy, flip_byte, video_member
from videogen import decode_frame_number

from epishard.stream import PostProcess, WindowDataset, WindowLoader
from epishard.stream.fetch import FetchPolicy
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
    ds = WindowDataset(intact, SPEC, seed=5, postprocess=PostProcess(hook=NoisyHook(3)), fetch=_skip_policy(packets))
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
    ds = WindowDataset(intact, SPEC, seed=5, postprocess=post, fetch=_skip_policy(True))
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
    ds = WindowDataset(intact, SPEC, seed=5, cost=_boom_cost, fetch=_skip_policy(True))
    with pytest.raises(HookBoom) as info:
        for _ in WindowLoader(ds, batch_size=2, num_workers=workers):
            pass
    text = str(info.value) if workers else "\n".join(info.value.__notes__)
    assert "the cost stage" in text and "_boom_cost" in text


@pytest.mark.parametrize("workers", [0, 2])
def test_an_order_stage_that_is_no_permutation_is_refused(intact, workers, reference):
    """Old code: the zeros were taken as an order, the epoch yielded one window 30 times, silently."""
    ds = WindowDataset(intact, SPEC, seed=5, order=_lossy_order)
    with pytest.raises(UserCodeError, match=r"_lossy_order returned no permutation of the \d+ window positions"):
        for _ in WindowLoader(ds, batch_size=2, num_workers=workers):
            pass
    # A real permutation is taken as it is: the same windows, reversed.
    reversed_ds = WindowDataset(intact, SPEC, seed=5, order=_reverse_order)
    got = [(int(s["episode_index"]), int(s["frame_index"])) for s in reversed_ds]
    plain = [(int(s["episode_index"]), int(s["frame_index"])) for s in reference]
    assert sorted(got) == sorted(plain) and len(got) == len(plain)


def test_a_cost_stage_returning_nan_is_refused_naming_the_window(intact):
    ds = WindowDataset(intact, SPEC, seed=5, cost=_nan_cost)
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
        samples = list(WindowDataset(root, SPEC, seed=5, postprocess=post, fetch=_skip_policy(False)))
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
    assert loader.state_dict()["epoch"] == 0 and loader.dataset._resume is None


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
        loader = WindowLoader(WindowDataset(intact, SPEC, seed=5, rank=rank, world_size=2), batch_size=2)
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


def test_the_balanced_dataset_checks_its_balance_field(intact, saved):
    from epishard.balance.streaming import BalancedWindowDataset

    ds = BalancedWindowDataset(intact, SPEC, seed=5, batch_size=2)
    with pytest.raises(StateTypeError, match=r"field 'balance' is 'local'; must be a dict"):
        ds.load_state_dict({**saved, "balance": "local"})
    with pytest.raises(StateTypeError, match=r"the state is int"):
        ds.load_state_dict(5)
