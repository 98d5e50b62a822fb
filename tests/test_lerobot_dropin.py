"""``EpishardLeRobotDataset`` gives LeRobotDataset's items, item by item, on the real v3.0 datasets.

Each real dataset in ``../shared/data`` is converted, read through the drop-in with two
``delta_timestamps`` sets (history and future on every camera; irregular offsets, past and future,
on one camera, state and action), every ``stride``-th frame an anchor (episode edges padded), and
compared with LeRobot's own ``LeRobotDataset`` at the same (episode, frame), run in a LeRobot peer
venv (``tests/lerobot_peer_items.py``): the same keys, shapes and dtypes, frames bit for bit (float
in [0, 1] against 0.4.4, uint8 against 0.6.1's ``return_uint8=True``), the same state, action,
``*_is_pad``, index, task. Skips when the peer venvs or ``../shared/data`` are absent.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SAMPLE, shared_dataset
from lerobot_peer_items import compact

from epishard.shardwriter import ConvertOptions, convert
from epishard.stream.lerobot_dataset import EpishardLeRobotDataset, StatsError, pool_stats
from epishard.stream.options import Ranks

HERE = Path(__file__).parent
PEERS = {  # LeRobot version -> (env file, venv python, frames as uint8)
    "0.4.4": ("/tmp/peer/env.sh", "/tmp/peer/lerobot-venv/bin/python", False),
    "0.6.1": ("/tmp/peer/lerobot061-env.sh", "/tmp/peer/lerobot061-venv/bin/python", True),
}
# dataset -> anchor stride (about 35 items per delta set; episodes are 240-520 frames long)
DATASETS = {"so101_bimanual_cloth_v30": 39, "unitree_g1_bottle_av1_v30": 41, "gr00t_robot_sim_picknplace_v30": 59}


def delta_sets(cameras: list[str], fps: float) -> dict[str, dict[str, list[float]]]:
    """Two ``delta_timestamps`` sets in seconds: history+future on every camera; irregular offsets."""
    return {
        "history_future": {
            **{c: [-4 / fps, 0.0, 4 / fps] for c in cameras},
            "observation.state": [-1 / fps, 0.0],
            "action": [k / fps for k in range(16)],
        },
        "irregular": {
            cameras[0]: [k / fps for k in (-10, -3, 0, 2, 7)],
            "observation.state": [k / fps for k in (-5, -2, 0, 3)],
            "action": [k / fps for k in (-1, 0, 1, 3, 6, 10, 15, 24)],
        },
    }


def peer_python(version: str) -> tuple[str, str, bool]:
    env, python, uint8 = PEERS[version]
    if not (Path(env).is_file() and Path(python).is_file()):
        pytest.skip(f"LeRobot {version} peer venv absent ({python}): bash ../shared/peers/setup_lerobot*_venv.sh")
    return env, python, uint8


@pytest.fixture(scope="module", params=sorted(PEERS))
def compared(request, tmp_path_factory):
    """(version, dataset, delta set) -> (epishard items, LeRobot items, keys with float64 in LeRobot)."""
    version = request.param
    env, python, uint8 = peer_python(version)
    tmp = tmp_path_factory.mktemp(f"dropin-{version}")
    ours, jobs, names = {}, [], []
    for name, stride in DATASETS.items():
        root = shared_dataset(name)
        out = tmp / name
        convert([str(root)], str(out), ConvertOptions(workers=1, progress=False))
        probe = EpishardLeRobotDataset(str(out), stride=stride)
        cameras, fps = probe.meta.camera_keys, probe.meta.fps
        for set_name, delta in delta_sets(cameras, fps).items():
            ds = EpishardLeRobotDataset(str(out), delta, stride=stride, return_uint8=uint8, seed=3)
            items = [compact(x, cameras) for x in ds]
            keys = [int(x["index"]) for x in items]
            ours[(name, set_name)] = items
            jobs.append({"root": str(root), "delta_timestamps": delta, "keys": keys, "uint8": uint8})
            names.append((name, set_name))
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    cmd = f". {env} && exec {python} {HERE / 'lerobot_peer_items.py'} {tmp / 'jobs.json'} {tmp / 'lerobot.pt'}"
    run = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    dump = torch.load(tmp / "lerobot.pt", weights_only=False)
    assert dump["lerobot"] == version
    return {(version, *key): (ours[key], job["items"]) for key, job in zip(names, dump["jobs"], strict=True)}


@pytest.mark.parametrize("set_name", ["history_future", "irregular"])
@pytest.mark.parametrize("name", sorted(DATASETS))
def test_items_equal_lerobotdataset_item_by_item(compared, name, set_name):
    version = next(iter(compared))[0]
    ours, theirs = compared[(version, name, set_name)]
    assert len(ours) == len(theirs) >= 30
    padded = {"first": 0, "last": 0}
    for a, b in zip(ours, theirs, strict=True):
        where = f"{name} {set_name} episode {int(a['episode_index'])} index {int(a['index'])}"
        assert set(a) == set(b), f"{where}: keys {sorted(set(a) ^ set(b))} differ"
        assert a["float_exact"] and b["float_exact"], where
        for key, va in a.items():
            vb = b[key]
            if not isinstance(vb, torch.Tensor):
                assert va == vb, f"{where}: {key}"
                continue
            assert tuple(va.shape) == tuple(vb.shape), f"{where}: {key} shape {tuple(va.shape)} != {tuple(vb.shape)}"
            assert va.dtype == vb.dtype, f"{where}: {key} dtype {va.dtype} != {vb.dtype}"
            assert torch.equal(va, vb), f"{where}: {key} differs (max {(va.double() - vb.double()).abs().max()})"
        padded["first"] += int(bool(a["observation.state_is_pad"][0]))
        padded["last"] += int(bool(a["action_is_pad"][-1]))
    # Episode edges were met at both ends: history padded at an episode's start, actions at its end.
    assert padded["first"] >= 3 and padded["last"] >= 1, padded
    # Floats are float32 on both sides, whatever the dataset stores (GR00T: float64 state, action, timestamps).
    assert ours[0]["action"].dtype == ours[0]["timestamp"].dtype == torch.float32


def test_stats_default_to_the_source_and_keep_the_manifests(tmp_path):
    """``meta.stats`` is the source's ``meta/stats.json`` (what LeRobot normalises with) unless asked otherwise.

    Converting only some episodes makes the two differ (cloth, 3 of 5 episodes).
    """
    root = shared_dataset("so101_bimanual_cloth_v30")
    out = tmp_path / "cloth"
    convert([str(root)], str(out), ConvertOptions(workers=1, episodes=frozenset({0, 1, 2}), progress=False))
    source = json.loads((root / "meta" / "stats.json").read_text())
    ds = EpishardLeRobotDataset(str(out))
    assert ds.meta.stats_from == f"source (stored at conversion): {root}/meta/stats.json"
    np.testing.assert_array_equal(ds.meta.stats["action"]["mean"], np.asarray(source["action"]["mean"]))
    assert ds.meta.stats["observation.images.cam0"]["mean"].shape == (3, 1, 1)
    manifest = json.loads((out / "manifest.json").read_text())["stats"]
    np.testing.assert_array_equal(ds.meta.manifest_stats["action"]["mean"], np.asarray(manifest["action"]["mean"]))
    gap = np.abs(ds.meta.stats["action"]["mean"] - ds.meta.manifest_stats["action"]["mean"]).max()
    assert gap > 1.0, gap  # the converted episodes' mean is not the source's
    chosen = EpishardLeRobotDataset(str(out), stats="manifest")
    assert chosen.meta.stats_from == "manifest" and "observation.images.cam0" not in chosen.meta.stats
    np.testing.assert_array_equal(chosen.meta.stats["action"]["mean"], np.asarray(manifest["action"]["mean"]))
    mine = {"action": {"mean": [0.0] * 12, "std": [1.0] * 12}}
    assert EpishardLeRobotDataset(str(out), stats=mine).meta.stats["action"]["std"].tolist() == [1.0] * 12


def test_stats_source_names_the_missing_file_and_the_choices(tmp_path):
    out = tmp_path / "sample"
    convert([str(SAMPLE)], str(out), ConvertOptions(workers=1, progress=False))
    with pytest.raises(StatsError, match=r"nowhere/meta/stats\.json.*cannot read"):
        EpishardLeRobotDataset(str(out), source_root=str(tmp_path / "nowhere"))
    with pytest.raises(StatsError, match="stats must be one of"):
        EpishardLeRobotDataset(str(out), stats="lerobot")
    with pytest.raises(KeyError, match=r"observation\.images\.front"):
        EpishardLeRobotDataset(str(out), {"observation.images.front": [0.0]})


def test_a_conversion_of_another_format_takes_the_manifests_stats_and_a_raw_folder_is_named(tmp_path):
    """Another source format (ALOHA HDF5) has no ``meta/stats.json``: the default takes epishard's
    statistics and says so; a LeRobot folder that was never converted is named as one; items are
    taken by iteration, and indexing says so."""
    pytest.importorskip("h5py")
    from test_sources_hdf5 import write_aloha

    from epishard.format.opening import NotConverted

    write_aloha(tmp_path / "aloha", [6, 5])
    out = tmp_path / "out"
    convert([str(tmp_path / "aloha")], str(out), ConvertOptions(workers=1, progress=False))
    ds = EpishardLeRobotDataset(str(out))
    assert ds.meta.stats_from == "manifest"
    manifest = json.loads((out / "manifest.json").read_text())["stats"]
    np.testing.assert_array_equal(ds.meta.stats["action"]["mean"], np.asarray(manifest["action"]["mean"]))
    with pytest.raises(StatsError, match=r"stats='source' needs the source's statistics.*source_root="):
        EpishardLeRobotDataset(str(out), stats="source")
    item = next(iter(ds))
    assert item["observation.images.top"].dtype == torch.float32 and int(item["episode_index"]) in (0, 1)
    with pytest.raises(TypeError, match="not indexable"):
        ds[0]
    with pytest.raises(NotConverted, match="epishard convert"):
        EpishardLeRobotDataset(str(SAMPLE))


def test_pooled_stats_of_a_mix_are_exact_for_mean_and_std():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(100, 3)), rng.normal(2.0, 3.0, size=(50, 3))

    def stats(x):
        entry = {"mean": x.mean(0), "std": x.std(0), "min": x.min(0), "max": x.max(0)}
        return {"x": {**entry, "count": np.array([len(x)])}}

    pooled = pool_stats([stats(a), stats(b)])["x"]
    both = np.concatenate([a, b])
    np.testing.assert_allclose(pooled["mean"], both.mean(0), rtol=1e-12)
    np.testing.assert_allclose(pooled["std"], both.std(0), rtol=1e-10)
    np.testing.assert_array_equal(pooled["min"], both.min(0))
    assert pooled["count"].tolist() == [150] and "q01" not in pooled
    with pytest.raises(StatsError, match="no count"):
        pool_stats([stats(a), {"x": {"mean": a.mean(0), "std": a.std(0)}}])


def test_items_keep_every_epishard_guarantee_resume_ranks(tmp_path):
    """The drop-in is a ``WindowDataset``: ranks split the frames, ``WindowLoader`` resumes exactly."""
    from epishard.stream import WindowLoader

    out = tmp_path / "sample"
    convert([str(SAMPLE)], str(out), ConvertOptions(workers=1, max_episodes_per_shard=2, progress=False))
    delta = {"action": [k / 20 for k in range(4)]}
    kw = {"stats": "manifest", "image_size": (32, 32), "stride": 25}
    ranks = [
        [int(x["index"]) for x in EpishardLeRobotDataset(str(out), delta, ranks=Ranks(rank=r, world_size=2), **kw)]
        for r in range(2)
    ]
    assert not set(ranks[0]) & set(ranks[1]) and len(ranks[0]) == len(ranks[1]) > 10
    ds = EpishardLeRobotDataset(str(out), delta, **kw)
    whole = [b["index"].tolist() for b in WindowLoader(ds, batch_size=4, num_workers=2)]
    loader = WindowLoader(ds, batch_size=4, num_workers=2)
    it = iter(loader)
    first = [next(it)["index"].tolist() for _ in range(3)]
    state = loader.state_dict()
    del it
    again = WindowLoader(ds, batch_size=4, num_workers=2)
    again.load_state_dict(state)
    rest = [b["index"].tolist() for b in again]
    assert first + rest == whole
    batch = next(iter(WindowLoader(ds, batch_size=4, num_workers=0)))
    assert batch["observation.images.ego_view"].dtype == torch.float32
    assert tuple(batch["observation.images.ego_view"].shape) == (4, 3, 32, 32)
    assert tuple(batch["action"].shape) == (4, 4, 44) and batch["action_is_pad"].dtype == torch.bool
    assert ds.meta.features["observation.images.ego_view"]["shape"] == [32, 32, 3]
    assert os.fspath(out) == ds.meta.root


class Flip:
    """An image transform (picklable into workers): frames upside down, as LeRobot's transforms are called."""

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        assert frames.dtype == torch.float32 and float(frames.max()) <= 1.0
        return frames.flip(-2)


def test_image_transforms_run_on_each_items_float_frames(tmp_path):
    """``image_transforms`` get LeRobot's float frames (``[C, H, W]``, ``[T, C, H, W]`` in delta_timestamps)."""
    out = tmp_path / "sample"
    convert([str(SAMPLE)], str(out), ConvertOptions(workers=1, progress=False))
    kw = {"stats": "manifest", "image_size": (32, 32), "stride": 97, "seed": 1}
    for delta in ({}, {"observation.images.ego_view": [-0.1, 0.0]}):
        plain = list(EpishardLeRobotDataset(str(out), delta, **kw))
        flipped = list(EpishardLeRobotDataset(str(out), delta, Flip(), **kw))
        assert len(plain) == len(flipped) > 10
        for a, b in zip(plain, flipped, strict=True):
            assert int(a["index"]) == int(b["index"])
            assert torch.equal(a["observation.images.ego_view"].flip(-2), b["observation.images.ego_view"])
            assert a["observation.images.ego_view"].dim() == (4 if delta else 3)
    u8 = next(iter(EpishardLeRobotDataset(str(out), None, return_uint8=True, **kw)))
    assert u8["observation.images.ego_view"].dtype == torch.uint8
