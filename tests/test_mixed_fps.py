"""One ``delta_timestamps`` (seconds) over datasets of different frame rates (issue 22, part 2).

Each dataset of a mix resolves the seconds at its own rate, as LeRobot's ``MultiLeRobotDataset``
does: at 20 fps 0.1 s is 2 rows, at 30 fps 3 rows. Frames carry their number (``videogen``), state
row ``r`` is ``r + 0.01 j`` and action row ``r`` is ``r + 0.5 + 0.01 j`` (``make_episode_table``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import shared_dataset
from videogen import convert_numbered, decode_frame_number

from epishard.stream import PostProcess, WindowDataset, WindowLoader, WindowSpec
from epishard.stream.options import Mixing

CAM = "observation.images.cam"
LENGTHS = {20: [14, 11], 30: [19, 16]}
STEP = {20: 100, 30: 1000}  # frame i of episode e shows STEP * e + i (the rates' frames never collide)
SECONDS = {CAM: [-0.1, 0.0, 0.1], "observation.state": [-0.1, 0.0], "action": [0.0, 0.1, 0.2]}
ROWS = {  # SECONDS in rows at each rate
    20: {CAM: (-2, 0, 2), "observation.state": (-2, 0), "action": (0, 2, 4)},
    30: {CAM: (-3, 0, 3), "observation.state": (-3, 0), "action": (0, 3, 6)},
}


@pytest.fixture(scope="module")
def rates(tmp_path_factory) -> dict[int, str]:
    root = tmp_path_factory.mktemp("mixed_fps")
    return {
        fps: convert_numbered(
            root / f"r{fps}",
            LENGTHS[fps],
            {CAM: dict(gop=4, height=32, width=32)},
            fps=fps,
            step=STEP[fps],
            name=f"r{fps}",
        )
        for fps in (20, 30)
    }


def _check(s: dict, fps: int) -> None:
    e, a = int(s["episode_index"]), int(s["frame_index"])
    n = LENGTHS[fps][e]
    for key, offsets in ROWS[fps].items():
        rows = a + np.asarray(offsets)
        clipped = np.clip(rows, 0, n - 1)
        assert s[f"{key}_is_pad"].tolist() == ((rows < 0) | (rows >= n)).tolist(), (fps, key, e, a)
        if key == CAM:
            assert [decode_frame_number(f) for f in s[key]] == (STEP[fps] * e + clipped).tolist(), (fps, e, a)
        else:
            base = 0.5 if key == "action" else 0.0
            want = (clipped[:, None] + base + 0.01 * np.arange(s[key].shape[1])[None, :]).astype(np.float32)
            assert np.array_equal(s[key].numpy(), want), (fps, key, e, a)


def test_one_spec_in_seconds_mixes_20_and_30_fps_in_one_batch_stream(rates):
    spec = WindowSpec.from_delta_timestamps(SECONDS, 20, boundary="pad")
    assert spec.cameras == {CAM: (-2, 0, 2)}  # the spec's own rows: at the fps it was given
    assert spec.at_fps(30).cameras == {CAM: (-3, 0, 3)} and spec.at_fps(30).action_offsets == (0, 3, 6)
    ds = WindowDataset([rates[20], rates[30]], spec, seed=0)
    assert [s.state_offsets for s in ds.layout.specs] == [(-2, 0), (-3, 0)]
    loader = WindowLoader(ds, batch_size=6, num_workers=0)
    seen: dict[int, set] = {20: set(), 30: set()}
    mixed = 0
    for batch in loader:
        assert batch[CAM].shape == (6, 3, 3, 32, 32) and batch[CAM].dtype == torch.uint8
        assert batch["action"].shape == (6, 3, 3) and batch["observation.state"].shape == (6, 2, 4)
        mixed += len(set(batch["dataset"].tolist())) == 2
        for i in range(6):
            s = {k: v[i] for k, v in batch.items() if isinstance(v, torch.Tensor)}
            fps = (20, 30)[int(s["dataset"])]
            _check(s, fps)
            seen[fps].add((int(s["episode_index"]), int(s["frame_index"])))
    assert mixed > 0  # the two rates share batches
    # pad mode: every anchor of both datasets exactly once (an epoch of 60 windows, 10 batches of 6)
    assert seen == {fps: {(e, a) for e, n in enumerate(LENGTHS[fps]) for a in range(n)} for fps in (20, 30)}


def test_inside_windows_keep_each_rate_rows_inside_the_episode(rates):
    spec = WindowSpec.from_delta_timestamps({"action": [0.0, 0.1, 0.2]}, 30)  # 0..6 rows at 30, 0..4 at 20
    anchors = {
        (int(s["dataset"]), int(s["episode_index"]), int(s["frame_index"]))
        for s in WindowDataset([rates[20], rates[30]], spec)
    }
    want = {(0, e, a) for e, n in enumerate(LENGTHS[20]) for a in range(n - 4)}
    want |= {(1, e, a) for e, n in enumerate(LENGTHS[30]) for a in range(n - 6)}
    assert anchors == want


def test_an_offset_off_a_dataset_grid_is_refused_naming_dataset_key_and_nearest_time(rates):
    spec = WindowSpec.from_delta_timestamps({"action": [0.0, 0.05]}, 20)  # one row at 20 fps, 1.5 at 30
    with pytest.raises(ValueError) as err:
        WindowDataset([rates[20], rates[30]], spec)
    message = str(err.value)
    assert "r30 (30 fps)" in message and "'action' [1] = 0.05s" in message, message
    assert "nearest allowed time 0.066667s" in message and "r20" not in message, message
    # a spec in rows made for 20 fps is refused on the 30 fps dataset, with a remedy that exists
    rows = WindowSpec(action_horizon=2, fps=20)
    with pytest.raises(
        ValueError, match=r"r30.*30 fps but the window spec's rows are at 20 fps.*from_delta_timestamps"
    ):
        WindowDataset([rates[20], rates[30]], rows)


def test_one_dataset_of_two_rates_is_refused_naming_an_episode_of_each(tmp_path):
    from videogen import make_episode_table, make_video

    from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert

    sources = [
        Source(
            name=f"r{fps}",
            episodes=[
                Episode(
                    source=f"r{fps}",
                    episode_index=0,
                    table=make_episode_table(6, fps=fps),
                    videos={CAM: CameraVideo(make_video(None, 6, fps=fps, height=32, width=32, gop=2))},
                    fps=fps,
                )
            ],
            fps=fps,
        )
        for fps in (20, 30)
    ]
    convert(sources, str(tmp_path / "both"), ConvertOptions(progress=False))
    spec = WindowSpec.from_delta_timestamps({"action": [0.0, 0.1]}, 20)
    with pytest.raises(
        ValueError, match=r"several frame rates \(episode r20-e000000 is 20 fps, episode r30-e000000 is 30 fps\)"
    ):
        WindowDataset(str(tmp_path / "both"), spec)


def test_real_so101_20fps_and_unitree_30fps_with_one_delta_timestamps(tmp_path):
    from epishard.shardwriter import ConvertOptions, convert, read_lerobot

    roots = [shared_dataset("so101_bimanual_cloth_v30"), shared_dataset("unitree_g1_bottle_av1_v30")]
    outs = [str(tmp_path / "cloth"), str(tmp_path / "g1")]
    for root, out in zip(roots, outs, strict=True):
        convert([str(root)], out, ConvertOptions(progress=False, episodes=frozenset({0})))
    spec = WindowSpec.from_delta_timestamps(
        {"front": [-0.1, 0.0], "observation.state": [-0.1, 0.0], "action": [0.0, 0.1, 0.2]},
        20,
        camera_keys=("front",),
        per_episode_count=5,
        boundary="pad",
    )
    camera_map = [{"front": "observation.images.cam0"}, {"front": "observation.images.cam_high"}]
    ds = WindowDataset(outs, spec, mix=Mixing(camera_map=camera_map), postprocess=PostProcess(size=(32, 32)))
    assert [s.action_offsets for s in ds.layout.specs] == [(0, 2, 4), (0, 3, 6)]
    assert [s.cameras for s in ds.layout.specs] == [{"front": (-2, 0)}, {"front": (-3, 0)}]
    tables = [next(e for e in read_lerobot(str(r)).episodes if e.episode_index == 0).load_table()[0] for r in roots]
    samples = list(ds)
    assert {int(s["dataset"]) for s in samples} == {0, 1}
    for s in samples:
        d, a = int(s["dataset"]), int(s["frame_index"])
        width, step = (12, 2) if d == 0 else (26, 3)
        assert s["front"].shape == (2, 3, 32, 32)
        assert s["front_is_pad"].tolist() == [a - step < 0, False]
        for key, offsets in (("observation.state", (-step, 0)), ("action", (0, step, 2 * step))):
            column = tables[d].column(key).to_pylist()
            rows = np.clip(a + np.asarray(offsets), 0, len(column) - 1)
            want = np.asarray([column[r] for r in rows], dtype=np.float32)
            assert np.array_equal(s[key][:, :width].numpy(), want), (d, key, a)
