"""A damaged shard costs only its own windows (issue 11, item 1).

Three shards of two episodes; one byte flipped inside the first video member of the first, middle
or last shard a worker reads; one epoch under both fetch modes, with and without prefetch, at
several chunk sizes. The damaged episode's windows become flagged substitutes with a warning that
names the shard, and so do its shard's other windows that need a fetch after the failure; every
window of the other shards is yielded with its real frames.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from faultgen import CAMERA, SPEC, copy, flip_byte, loaded, video_member
from videogen import decode_frame_number

from epishard.stream import WindowDataset, World
from epishard.stream.decode import DecodeError
from epishard.stream.fetch import FetchError, FetchPolicy
from epishard.stream.options import ReadOptions


def _key(s) -> tuple[int, int]:
    return int(s["episode_index"]), int(s["frame_index"])


def _read_order_shards(root: str) -> list[int]:
    ds = WindowDataset(root, SPEC, seed=5)
    plan = ds.plan(0, World())
    order = ds.table.shard[plan.read_order].tolist()
    return list(dict.fromkeys(order))


@pytest.fixture(scope="module")
def damaged(intact, tmp_path_factory):
    """position in the worker's shard order -> (dataset copy, damaged shard)."""
    out = {}
    for position, shard in enumerate(_read_order_shards(intact)):
        root = copy(intact, str(tmp_path_factory.mktemp(f"damaged{position}")))
        member = video_member(root, shard)
        flip_byte(root, shard, member["offset"] + member["size"] // 2)
        out[position] = (root, shard)
    return out


@pytest.mark.parametrize("position", [0, 1, 2], ids=["first", "middle", "last"])
@pytest.mark.parametrize("prefetch", [0, 4096, 256 << 20], ids=["no-prefetch", "prefetch-4k", "prefetch-default"])
@pytest.mark.parametrize("chunk", [1024, 3001, 8 << 20], ids=["chunk-1k", "chunk-3001", "chunk-8M"])
@pytest.mark.parametrize("mode", ["stream", "ranged"])
def test_damaged_shard_costs_only_its_windows(intact, keyed_reference, damaged, position, prefetch, chunk, mode):
    root, shard = damaged[position]
    # Members whole, each checked by its sha256 (tests/test_packets.py: packets, each by its CRC-32).
    policy = FetchPolicy(mode=mode, chunk_bytes=chunk, prefetch_bytes=prefetch, packets=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = list(WindowDataset(root, SPEC, seed=5, read=ReadOptions(fetch=policy)))
    name = loaded(root).shards[shard].shard
    damaged_episode, shard_episodes = 2 * shard, {2 * shard, 2 * shard + 1}
    assert len(samples) == len(keyed_reference)  # the rank keeps its sample count
    real = [s for s in samples if not s["substitute"]]
    # Every window of the other shards is real. The damaged episode never passes its sha256, so none
    # of its windows is; once the shard failed, its other episode's windows that needed a fetch are
    # substitutes too (those served from frames decoded before the failure are real, verified ones).
    expected = sorted(k for k in keyed_reference if k[0] not in shard_episodes)
    got = sorted(_key(s) for s in real)
    assert [k for k in got if k[0] not in shard_episodes] == expected
    assert not any(k[0] == damaged_episode for k in got) and len(set(got)) == len(got)
    assert sum(s["substitute"] for s in samples) == len(keyed_reference) - len(got)
    for s in samples:  # real windows and substitutes alike carry a real window's frames
        e, anchor = _key(s)
        assert e != damaged_episode
        assert torch.equal(s[CAMERA], keyed_reference[(e, anchor)][CAMERA])
        rows = np.clip(anchor + np.asarray(SPEC.cameras[CAMERA]), 0, 19)
        assert [decode_frame_number(f) for f in s[CAMERA]] == (100 * e + rows).tolist()
    messages = [str(w.message) for w in caught if "epishard: skipping" in str(w.message)]
    assert 1 <= len(messages) <= 2 and all(name in m and "sha256" in m for m in messages)


def test_strict_policy_names_the_damaged_shard(damaged):
    root, shard = damaged[1]
    name = loaded(root).shards[shard].shard
    with pytest.raises(FetchError, match=name):
        list(
            WindowDataset(
                root, SPEC, seed=5, read=ReadOptions(fetch=FetchPolicy(on_shard_error="raise", packets=False))
            )
        )
    # Read by packets, the damaged packet is found by its CRC-32; the error names the shard too.
    with pytest.raises(DecodeError, match=f"{name}.*CRC-32"):
        list(WindowDataset(root, SPEC, seed=5, read=ReadOptions(fetch=FetchPolicy(on_shard_error="raise"))))
