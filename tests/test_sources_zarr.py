"""Zarr ReplayBuffer sources (UMI, Diffusion Policy), written with zarr: frames, rows, boundaries, errors."""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest
from sourcecheck import check_verifies, column, read_back, stream_rows
from videogen import decode_frame_number, encode_frame_number

from epishard.cli import main
from epishard.shardwriter import ConversionError, ConvertOptions, SourceError, convert
from epishard.shardwriter.sources import Mapping, SourceOptions, detect_format

zarr = pytest.importorskip("zarr")


def _opts(**kw) -> ConvertOptions:
    return ConvertOptions(progress=False, **kw)


def _pose(n: int, width: int, scale: float) -> np.ndarray:
    return (np.arange(n * width, dtype=np.float32).reshape(n, width) * scale).astype(np.float32)


def write_umi(root, lengths, zarr_format=2, short=None):
    """A UMI ReplayBuffer: data/camera0_rgb (frame k shows k), robot0_* poses, meta/episode_ends."""
    ends = np.cumsum(lengths)
    n = int(ends[-1])
    g = zarr.open_group(str(root), mode="w", zarr_format=zarr_format)
    data, meta = g.create_group("data"), g.create_group("meta")
    frames = np.stack([encode_frame_number(k) for k in range(n)])
    data.create_array("camera0_rgb", data=frames, chunks=(4, 64, 64, 3))
    data.create_array("robot0_eef_pos", data=_pose(n, 3, 0.5)[: short or n])
    data.create_array("robot0_eef_rot_axis_angle", data=_pose(n, 3, -0.25))
    data.create_array("robot0_gripper_width", data=_pose(n, 1, 0.01))
    data.create_array("robot0_demo_start_pose", data=_pose(n, 6, 2.0))
    meta.create_array("episode_ends", data=ends.astype(np.int64))
    return ends


def test_umi_replay_buffer_episodes_frames_and_state_are_exact(tmp_path):
    lengths = [5, 9, 6]
    ends = write_umi(tmp_path / "cup.zarr", lengths)
    src = str(tmp_path / "cup.zarr")
    assert detect_format(src) == "umi"
    out = str(tmp_path / "out")
    manifest = convert([src], out, _opts(workers=2, max_episodes_per_shard=1))
    notes = " ".join(manifest.sources[0].notes)
    assert "no action array mapped" in notes and "format umi (recognised from the files)" in notes
    assert manifest.totals.episodes == 3 and manifest.totals.rows == sum(lengths)
    check_verifies(out)
    back = read_back(out)
    n = int(ends[-1])
    state = np.concatenate([_pose(n, 3, 0.5), _pose(n, 3, -0.25), _pose(n, 1, 0.01)], axis=1)
    for e, stop in enumerate(ends.tolist()):
        start = stop - lengths[e]
        ep = back[("cup", e)]
        assert ep["table"].num_rows == lengths[e]  # episode boundaries from meta/episode_ends
        assert np.array_equal(column(ep["table"], "observation.state"), state[start:stop])
        assert np.array_equal(column(ep["table"], "robot0_demo_start_pose"), _pose(n, 6, 2.0)[start:stop])
        assert "action" not in ep["table"].column_names
        frames = ep["frames"]["observation.images.camera0"]
        assert all(np.array_equal(frames[i], encode_frame_number(start + i)) for i in range(lengths[e]))
    rows = stream_rows(out, "observation.images.camera0", action_key=None)
    assert {(e, i): decode_frame_number(s["observation.images.camera0"][0]) for (e, i), s in rows.items()} == {
        (e, i): int(ends[e]) - lengths[e] + i for e in range(3) for i in range(lengths[e])
    }


def test_diffusion_policy_zip_store_through_the_cli_with_a_mapping(tmp_path, capsys):
    folder = tmp_path / "pusht.zarr"
    g = zarr.open_group(str(folder), mode="w", zarr_format=2)
    lengths, n = [4, 7], 11
    g.create_group("data").create_array("img", data=np.stack([encode_frame_number(100 + k) for k in range(n)]))
    g["data"].create_array("state", data=_pose(n, 5, 1.0))
    g["data"].create_array("action", data=_pose(n, 2, 3.0))
    g["data"].create_array("keypoint", data=_pose(n, 18, 1.0).reshape(n, 9, 2))
    g.create_group("meta").create_array("episode_ends", data=np.cumsum(lengths))
    zipped = tmp_path / "pusht.zarr.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        for dirpath, _, files in os.walk(folder):
            for f in files:
                path = os.path.join(dirpath, f)
                z.write(path, os.path.relpath(path, folder))
    mapping = tmp_path / "m.toml"
    mapping.write_text('task = "push the T"\nfps = 10\n[cameras]\n"observation.image" = "img"\n')
    out = tmp_path / "out"
    assert main(["convert", str(zipped), str(out), "--mapping", str(mapping), "-q"]) == 0
    assert "umi mapping: state = state, action = action, cameras = observation.image <- img" in capsys.readouterr().out
    back = read_back(str(out))
    ep = back[("pusht", 1)]
    assert ep["tasks"] == ["push the T"]
    assert np.array_equal(column(ep["table"], "action"), _pose(n, 2, 3.0)[4:])
    assert np.array_equal(column(ep["table"], "keypoint"), _pose(n, 18, 1.0).reshape(n, 9, 2)[4:])
    assert [decode_frame_number(f) for f in ep["frames"]["observation.image"]] == list(range(104, 111))


def test_zarr_bad_inputs(tmp_path):
    write_umi(tmp_path / "a.zarr", [4, 4, 4], short=10)  # robot0_eef_pos ends inside episode 2
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "a.zarr")], str(tmp_path / "o1"), _opts())
    e = err.value
    assert (e.kind, e.episode) == ("length_mismatch", 2) and "data/robot0_eef_pos has 10 rows" in e.detail
    assert e.path.endswith("a.zarr")
    manifest = convert([str(tmp_path / "a.zarr")], str(tmp_path / "o2"), _opts(on_error="skip"))
    assert manifest.totals.episodes == 2 and manifest.report.skipped_by_kind == {"length_mismatch": 1}

    write_umi(tmp_path / "b.zarr", [4, 4])
    chunk = tmp_path / "b.zarr" / "data" / "camera0_rgb" / "1.0.0.0"  # frames 4..7: episode 1's
    chunk.write_bytes(chunk.read_bytes()[:20])
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "b.zarr")], str(tmp_path / "o3"), _opts())
    e = err.value
    assert (e.kind, e.episode, e.camera) == ("unreadable_file", 1, "observation.images.camera0")
    assert "data/camera0_rgb rows 4..7" in e.detail

    options = SourceOptions(mapping=Mapping(action=("robot0_action",)))
    with pytest.raises(SourceError, match=r"b.zarr: no array data/robot0_action \(arrays: camera0_rgb, "):
        convert([str(tmp_path / "b.zarr")], str(tmp_path / "o4"), _opts(sources=options))


def test_zarr_format_3_reads_the_same(tmp_path):
    write_umi(tmp_path / "v3.zarr", [3, 5], zarr_format=3)
    out = str(tmp_path / "out")
    convert([str(tmp_path / "v3.zarr")], out, _opts(sources=SourceOptions(format="zarr")))
    back = read_back(out)
    assert [back[("v3", e)]["table"].num_rows for e in (0, 1)] == [3, 5]
    assert [decode_frame_number(f) for f in back[("v3", 1)]["frames"]["observation.images.camera0"]] == [3, 4, 5, 6, 7]


def test_a_replay_buffer_behind_an_fsspec_url(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    write_umi(tmp_path / "m.zarr", [3, 4])
    fs = fsspec.filesystem("memory")
    for path in sorted(p for p in (tmp_path / "m.zarr").rglob("*") if p.is_file()):
        fs.pipe(f"/zarr-url-test/m.zarr/{path.relative_to(tmp_path / 'm.zarr')}", path.read_bytes())
    try:
        out = str(tmp_path / "out")
        convert(["memory://zarr-url-test/m.zarr"], out, _opts())
        back = read_back(out)
        assert [decode_frame_number(f) for f in back[("m", 1)]["frames"]["observation.images.camera0"]] == [3, 4, 5, 6]
    finally:
        fs.rm("/zarr-url-test", recursive=True)


def test_a_replay_buffer_refuses_streams_in_its_mapping(tmp_path):
    write_umi(tmp_path / "a.zarr", [4, 4])
    options = SourceOptions(mapping=Mapping(streams={"observation.pose": "robot0_eef_pos"}))
    with pytest.raises(SourceError, match=r"a.zarr: the mapping's streams: a replay buffer's arrays share one clock"):
        convert([str(tmp_path / "a.zarr")], str(tmp_path / "out"), _opts(sources=options))
