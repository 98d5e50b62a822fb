"""Every LeRobot keyword the drop-in takes is honoured or refused by name (``EpishardLeRobotDataset``).

``LeRobotDataset(repo_id, episodes=[...], revision=..., video_backend=...)``: ``episodes`` reads
exactly those episodes (every frame of each, as LeRobot does) and refuses indices the converted
dataset does not hold; a ``revision`` or another ``video_backend`` cannot be honoured from shards and
is refused naming it. A keyword the drop-in does not know reaches ``WindowDataset`` and is refused
by Python naming it. Runs on the bundled sample (5 episodes, 2096 frames), frames 16x16.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import SAMPLE

from epishard.format.index import WindowIndex
from epishard.shardwriter import ConvertOptions, convert
from epishard.stream.lerobot_dataset import EpishardLeRobotDataset
from epishard.stream.select import Selection

SMALL = {"image_size": (16, 16)}


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("dropin-options") / "sample"
    convert([str(SAMPLE)], str(out), ConvertOptions(workers=1, max_episodes_per_shard=2, progress=False))
    return str(out)


@pytest.fixture(scope="module")
def lengths(shards) -> dict[int, int]:
    index = WindowIndex.load_dataset(shards)
    return dict(zip(index.episode_index.tolist(), index.num_rows.tolist(), strict=True))


def test_episodes_reads_every_frame_of_exactly_those_episodes(shards, lengths):
    ds = EpishardLeRobotDataset(shards, {"action": [0.0, 0.05]}, episodes=[3, 1], **SMALL)
    items = [(int(x["episode_index"]), int(x["index"])) for x in ds]  # index: the frame's global index
    assert ds.episodes == [1, 3]
    for e in (1, 3):  # each frame of the episode once (its global indices consecutive), nothing else
        got = sorted(i for ep, i in items if ep == e)
        assert got == list(range(got[0], got[0] + lengths[e]))
    assert {ep for ep, _ in items} == {1, 3} and len(items) == lengths[1] + lengths[3]
    assert ds.num_episodes == 2 and ds.num_frames == lengths[1] + lengths[3]
    assert ds.meta.total_frames == lengths[1] + lengths[3]
    assert ds.meta.episodes["episode_index"].tolist() == [1, 3]


def test_episodes_pads_at_the_episodes_own_edges(shards, lengths):
    """The last frame of a selected episode pads its future action with itself, as LeRobot does."""
    ds = EpishardLeRobotDataset(shards, {"action": [0.0, 0.05]}, episodes=[2], **SMALL)
    items = list(ds)
    last = max(items, key=lambda x: int(x["index"]))
    assert len(items) == lengths[2]
    assert last["action_is_pad"].tolist() == [False, True]
    assert np.array_equal(last["action"][0].numpy(), last["action"][1].numpy())


def test_episodes_the_dataset_does_not_hold_are_refused_by_index(shards):
    with pytest.raises(ValueError, match=r"episodes \[7, 9\] are not in .*sample, which holds 5 episodes"):
        EpishardLeRobotDataset(shards, episodes=[0, 7, 9], **SMALL)


def test_episodes_joins_a_selection_and_refuses_to_be_given_twice(shards, lengths):
    ds = EpishardLeRobotDataset(shards, episodes=[0, 1, 2], select=Selection(min_rows=lengths[1]), **SMALL)
    assert ds.episodes == [0, 1, 2]
    assert ds.meta.episodes["episode_index"].tolist() == [e for e in (0, 1, 2) if lengths[e] >= lengths[1]]
    with pytest.raises(ValueError, match="give the episodes once"):
        EpishardLeRobotDataset(shards, episodes=[0], select=Selection(episodes=[1]), **SMALL)
    with pytest.raises(ValueError, match="for a mix pass select="):
        EpishardLeRobotDataset([shards, shards], episodes=[0], **SMALL)


@pytest.mark.parametrize(
    ("keyword", "value", "message"),
    [
        ("revision", "v2.1", r"revision='v2.1': epishard shards hold the revision"),
        ("video_backend", "pyav", r"video_backend='pyav': epishard decodes with torchcodec"),
        ("video_backend", "video_reader", r"video_backend='video_reader'"),
    ],
)
def test_a_lerobot_keyword_the_shards_cannot_honour_is_refused_by_name(shards, keyword, value, message):
    with pytest.raises(ValueError, match=message):
        EpishardLeRobotDataset(shards, **{keyword: value}, **SMALL)


@pytest.mark.parametrize("value", [None, "torchcodec"])
def test_the_torchcodec_backend_is_what_the_drop_in_decodes_with(shards, value):
    ds = EpishardLeRobotDataset(shards, video_backend=value, revision=None, stride=500, **SMALL)
    assert len(list(ds)) == sum(-(-n // 500) for n in WindowIndex.load_dataset(shards).num_rows.tolist())


@pytest.mark.parametrize(
    ("keyword", "hint"),
    [
        ("force_cache_sync", "no Hub cache"),
        ("root", "first argument"),
        ("episode_filter", "episodes="),
        ("token", "storage_options"),
        ("episode", "it takes .*'episodes'"),
    ],
)
def test_a_keyword_the_drop_in_does_not_take_is_refused_naming_it_and_what_to_pass(shards, keyword, hint):
    with pytest.raises(TypeError, match=f"{keyword}.*{hint}"):
        EpishardLeRobotDataset(shards, **{keyword: True}, **SMALL)


def test_empty_episodes_and_a_delta_key_for_a_camera_left_out_say_so(shards):
    with pytest.raises(ValueError, match=r"episodes=\[\] selects no episode"):
        EpishardLeRobotDataset(shards, episodes=[], **SMALL)
    camera = EpishardLeRobotDataset(shards, stride=500, **SMALL).meta.camera_keys[0]
    with pytest.raises(KeyError, match=r"which cameras=\[\] leaves out"):
        EpishardLeRobotDataset(shards, {camera: [0.0]}, cameras=[], **SMALL)


def test_cameras_keeps_only_those_cameras_for_a_single_camera_policy(tmp_path):
    """VQ-BeT takes one camera: ``cameras=[...]`` returns and lists only those; the others are not read."""
    from conftest import shared_dataset

    out = tmp_path / "cloth"
    convert([str(shared_dataset("so101_bimanual_cloth_v30"))], str(out), ConvertOptions(progress=False, episodes=[0]))
    both = EpishardLeRobotDataset(str(out), stride=200, **SMALL)
    assert len(both.meta.camera_keys) == 2
    keep = both.meta.camera_keys[1]
    ds = EpishardLeRobotDataset(str(out), {keep: [-0.1, 0.0]}, cameras=[keep], stride=200, **SMALL)
    assert ds.meta.camera_keys == [keep] and [k for k, f in ds.meta.features.items() if f["dtype"] == "video"] == [keep]
    items, reference = list(ds), {int(x["index"]): x for x in both}
    assert items and all(set(x) & set(both.meta.camera_keys) == {keep} for x in items)
    for x in items:  # the kept camera's frames are the ones the full dataset returns
        assert torch.equal(x[keep][-1], reference[int(x["index"])][keep])
    with pytest.raises(KeyError, match=r"cameras \['observation.images.nope'\] are not in"):
        EpishardLeRobotDataset(str(out), cameras=["observation.images.nope"], **SMALL)
