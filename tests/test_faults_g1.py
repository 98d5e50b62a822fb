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
