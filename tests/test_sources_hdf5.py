"""HDF5 sources: ALOHA (raw and JPEG-compressed images) and robomimic/LIBERO, written with h5py.

Frames carry their number (videogen.encode_frame_number); every converted frame, state, action and
language row is checked exactly, episode boundaries too, and each bad input gives its error.
"""

from __future__ import annotations

import json
from fractions import Fraction

import av
import numpy as np
import pytest
from sourcecheck import check_verifies, column, read_back, stream_rows
from videogen import decode_frame_number, encode_frame_number

from epishard.cli import main
from epishard.shardwriter import ConversionError, ConvertOptions, SourceError, convert
from epishard.shardwriter.images import decode_image
from epishard.shardwriter.sources import Mapping, SourceOptions, detect_format

h5py = pytest.importorskip("h5py")

CAMS = ("top", "wrist")


def _frame(e: int, c: int, i: int, size=(64, 64)) -> np.ndarray:
    return encode_frame_number(1000 * e + 100 * c + i, *size)


def _jpeg(image: np.ndarray) -> bytes:
    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height, ctx.pix_fmt = image.shape[1], image.shape[0], "yuvj444p"
    ctx.time_base = Fraction(1, 50)
    frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuvj444p")
    return b"".join(bytes(p) for p in [*ctx.encode(frame), *ctx.encode(None)])


def _qpos(e: int, t: int) -> np.ndarray:
    return (np.arange(t * 14, dtype=np.float64).reshape(t, 14) * 0.001 + e).astype(np.float64)


def write_aloha(root, lengths, compress=False, sizes=None, skip_key=None, short_action=None, corrupt=None):
    """ALOHA folder: episode_<e>.hdf5 with qpos/qvel/effort/action and 2 cameras (JPEG rows with ``compress``)."""
    root.mkdir(parents=True, exist_ok=True)
    jpegs = {}
    for e, t in enumerate(lengths):
        with h5py.File(root / f"episode_{e}.hdf5", "w") as f:
            f.attrs["sim"] = False
            if compress:
                f.attrs["compress"] = True
            f.create_dataset("observations/qpos", data=_qpos(e, t))
            f.create_dataset("observations/qvel", data=-_qpos(e, t))
            f.create_dataset("observations/effort", data=np.full((t, 14), e, np.float32))
            n_action = t - 1 if short_action == e else t
            if skip_key != ("action", e):
                f.create_dataset("action", data=2 * _qpos(e, n_action))
            for c, cam in enumerate(CAMS):
                frames = [_frame(e, c, i, (sizes or {}).get((e, c, i), (64, 64))) for i in range(t)]
                if compress:
                    enc = [_jpeg(im) for im in frames]
                    if corrupt is not None and corrupt[:2] == (e, c):
                        enc[corrupt[2]] = b"\xff\xd8" + b"\x13" * 200
                    jpegs[(e, cam)] = enc
                    width = max(len(b) for b in enc) + 7  # ALOHA pads every row to the longest
                    padded = np.zeros((t, width), np.uint8)
                    for i, b in enumerate(enc):
                        padded[i, : len(b)] = np.frombuffer(b, np.uint8)
                    f.create_dataset(f"observations/images/{cam}", data=padded)
                else:
                    f.create_dataset(f"observations/images/{cam}", data=np.stack(frames))
            f.create_dataset("compress_len", data=np.zeros((2, t)))
    return jpegs


def _opts(**kw) -> ConvertOptions:
    return ConvertOptions(progress=False, **kw)


def test_aloha_raw_frames_state_and_action_are_exact_and_stream(tmp_path):
    lengths = [7, 5, 9]
    write_aloha(tmp_path / "aloha", lengths)
    assert detect_format(str(tmp_path / "aloha")) == "aloha"
    out = str(tmp_path / "out")
    manifest = convert([str(tmp_path / "aloha")], out, _opts(max_episodes_per_shard=2))
    assert manifest.totals.episodes == 3 and manifest.totals.rows == sum(lengths)
    assert manifest.sources[0].format == "aloha" and manifest.fps == 50
    check_verifies(out)
    back = read_back(out)
    for e, t in enumerate(lengths):
        ep = back[("aloha", e)]
        assert ep["table"].num_rows == t  # episode boundaries exact
        assert np.array_equal(column(ep["table"], "observation.state"), _qpos(e, t))
        assert np.array_equal(column(ep["table"], "action"), 2 * _qpos(e, t))
        assert np.array_equal(column(ep["table"], "observation.velocity"), -_qpos(e, t))
        assert np.array_equal(column(ep["table"], "observation.effort"), np.full((t, 14), e, np.float32))
        for c, cam in enumerate(CAMS):
            frames = ep["frames"][f"observation.images.{cam}"]
            assert frames.shape == (t, 64, 64, 3)
            for i in range(t):
                assert np.array_equal(frames[i], _frame(e, c, i))  # lossless: bit-exact
    rows = stream_rows(out, "observation.images.wrist")
    assert len(rows) == sum(lengths)
    for (e, i), s in rows.items():
        assert decode_frame_number(s["observation.images.wrist"][0]) == 1000 * e + 100 + i
        assert np.allclose(s["observation.state"][0].numpy(), _qpos(e, lengths[e])[i].astype(np.float32))
    assert "compress_len" in " ".join(manifest.sources[0].notes)  # not per-step: named as not kept


def test_aloha_jpeg_rows_decode_to_the_jpegs_pixels(tmp_path):
    jpegs = write_aloha(tmp_path / "aloha", [6, 4], compress=True)
    out = str(tmp_path / "out")
    manifest = convert([str(tmp_path / "aloha")], out, _opts(workers=2, max_episodes_per_shard=1))
    assert "JPEG" in " ".join(manifest.sources[0].notes)
    check_verifies(out)
    back = read_back(out)
    for (e, cam), enc in jpegs.items():
        frames = back[("aloha", e)]["frames"][f"observation.images.{cam}"]
        assert len(frames) == len(enc)
        for i, data in enumerate(enc):
            assert np.array_equal(frames[i], decode_image(data)[0])  # FFmpeg's decode of the JPEG, exactly
            assert decode_frame_number(frames[i]) == 1000 * e + 100 * CAMS.index(cam) + i


def test_aloha_mapping_file_and_format_flag_through_the_cli(tmp_path, capsys):
    write_aloha(tmp_path / "aloha", [5, 6])
    mapping = tmp_path / "map.json"
    mapping.write_text(
        json.dumps(
            {
                "state": ["observations/qpos", "observations/qvel"],
                "cameras": {"observation.images.cam_high": "observations/images/top"},
                "columns": {},
                "others": False,
                "task": "fold the towel",
                "fps": 25,
            }
        )
    )
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "aloha"), str(out), "--format", "act", "--mapping", str(mapping), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "format aloha (given by --format)" in printed
    back = read_back(str(out))
    ep = back[("aloha", 1)]
    state = column(ep["table"], "observation.state")
    assert np.array_equal(state, np.concatenate([_qpos(1, 6), -_qpos(1, 6)], axis=1))
    assert list(ep["frames"]) == ["observation.images.cam_high"]
    assert ep["tasks"] == ["fold the towel"] and ep["meta"]["fps"] == 25
    assert ep["table"].column_names == ["frame_index", "timestamp", "observation.state", "action"]
    assert "observations/effort" in printed and "not kept" in printed


def test_a_camera_the_source_lacks_is_refused_naming_its_cameras(tmp_path, capsys):
    write_aloha(tmp_path / "aloha", [5])
    argv = ["convert", str(tmp_path / "aloha"), str(tmp_path / "out"), "-q"]
    assert main([*argv, "--cameras", "observation.images.front"]) == 2
    err = capsys.readouterr().err
    assert "camera observation.images.front is not in this source" in err, err
    assert f"its cameras: {', '.join('observation.images.' + c for c in CAMS)}" in err, err


def test_unknown_mapping_field_is_named(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('stat = ["qpos"]\n')
    with pytest.raises(SourceError, match=r"m.toml: unknown field\(s\) stat"):
        Mapping.load(str(path))


def test_aloha_bad_inputs_name_file_episode_and_key(tmp_path):
    write_aloha(tmp_path / "a", [5, 5, 5], skip_key=("action", 1))
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "a")], str(tmp_path / "o1"), _opts())
    e = err.value
    assert (e.kind, e.episode) == ("missing_key", 1) and "episode_1.hdf5" in e.path and "'action'" in e.detail
    manifest = convert([str(tmp_path / "a")], str(tmp_path / "o2"), _opts(on_error="skip"))
    assert manifest.totals.episodes == 2 and manifest.report.skipped_by_kind == {"missing_key": 1}

    write_aloha(tmp_path / "b", [5, 6], short_action=1)
    with pytest.raises(ConversionError, match=r"observations/qpos 6 rows, action 5 rows") as err:
        convert([str(tmp_path / "b")], str(tmp_path / "o3"), _opts())
    assert (err.value.kind, err.value.episode) == ("length_mismatch", 1)

    write_aloha(tmp_path / "c", [5, 6], compress=True, sizes={(1, 1, 3): (48, 64)})
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "c")], str(tmp_path / "o4"), _opts())
    e = err.value
    assert (e.kind, e.episode, e.camera, e.row) == ("frame_size_changed", 1, "observation.images.wrist", 3)

    write_aloha(tmp_path / "d", [5, 6], compress=True, corrupt=(0, 0, 2))
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "d")], str(tmp_path / "o5"), _opts())
    e = err.value
    assert (e.kind, e.episode, e.camera, e.row) == ("bad_image", 0, "observation.images.top", 2)

    write_aloha(tmp_path / "t", [5, 6])
    path = tmp_path / "t" / "episode_1.hdf5"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "t")], str(tmp_path / "o6"), _opts())
    assert (err.value.kind, err.value.episode) == ("unreadable_file", 1) and "episode_1.hdf5" in err.value.path


def test_a_nan_in_the_rows_names_the_file_episode_row_and_column(tmp_path):
    write_aloha(tmp_path / "n", [5, 6])
    with h5py.File(tmp_path / "n" / "episode_1.hdf5", "r+") as f:
        f["observations/qpos"][3, 2] = np.nan
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "n")], str(tmp_path / "o"), _opts())
    e = err.value
    assert (e.kind, e.episode, e.row) == ("nan", 1, 3) and e.path.endswith("n/episode_1.hdf5")
    assert "column 'observation.state' holds nan at dimension 2" in e.detail and "file=" in str(e)


def write_robomimic(path, lengths, libero=True):
    """One HDF5 file with data/demo_<i>: obs images (rgb, depth), joint/gripper states, actions, rewards, dones."""
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        if libero:
            data.attrs["problem_info"] = json.dumps({"language_instruction": "put the bowl on the plate"})
        for d, t in enumerate(lengths):
            g = data.create_group(f"demo_{d}")
            g.attrs["num_samples"] = t
            g.create_dataset("obs/agentview_rgb", data=np.stack([_frame(d, 0, i) for i in range(t)]))
            g.create_dataset("obs/eye_in_hand_rgb", data=np.stack([_frame(d, 1, i) for i in range(t)]))
            depth = (np.arange(t * 32 * 32).reshape(t, 32, 32) * 37 + 1000 * d) % 65536
            g.create_dataset("obs/agentview_depth", data=depth.astype(np.uint16))
            g.create_dataset("obs/joint_states", data=_qpos(d, t)[:, :7])
            g.create_dataset("obs/gripper_states", data=_qpos(d, t)[:, 7:9])
            g.create_dataset("obs/ee_pos", data=_qpos(d, t)[:, :3].astype(np.float32))
            g.create_dataset("actions", data=_qpos(d, t)[:, :7] * 3)
            g.create_dataset("rewards", data=(np.arange(t) == t - 1).astype(np.uint8))
            g.create_dataset("dones", data=(np.arange(t) == t - 1).astype(np.uint8))


def test_libero_file_demos_become_episodes_with_task_and_depth(tmp_path):
    lengths = [6, 8, 5]
    write_robomimic(tmp_path / "libero_spatial.hdf5", lengths)
    src = str(tmp_path / "libero_spatial.hdf5")
    assert detect_format(src) == "robomimic"
    out = str(tmp_path / "out")
    manifest = convert([src], out, _opts(episodes=frozenset({0, 2})))
    assert manifest.tasks == ("put the bowl on the plate",)
    assert manifest.cameras["observation.images.agentview_depth"].kind == "depth"
    check_verifies(out)
    back = read_back(out)
    assert sorted(back) == [("libero_spatial", 0), ("libero_spatial", 2)]
    for d in (0, 2):
        ep, t = back[("libero_spatial", d)], lengths[d]
        assert ep["table"].num_rows == t and ep["tasks"] == ["put the bowl on the plate"]
        assert np.array_equal(column(ep["table"], "observation.state"), _qpos(d, t)[:, :9])
        assert np.array_equal(column(ep["table"], "action"), _qpos(d, t)[:, :7] * 3)
        assert column(ep["table"], "next.reward").tolist() == [0] * (t - 1) + [1]
        assert np.array_equal(column(ep["table"], "obs.ee_pos"), _qpos(d, t)[:, :3].astype(np.float32))
        depth = ep["frames"]["observation.images.agentview_depth"]
        assert depth.dtype == np.uint16
        assert np.array_equal(depth, ((np.arange(t * 32 * 32).reshape(t, 32, 32) * 37 + 1000 * d) % 65536))
        for c, cam in enumerate(("agentview", "eye_in_hand")):
            frames = ep["frames"][f"observation.images.{cam}"]
            assert all(np.array_equal(frames[i], _frame(d, c, i)) for i in range(t))
    rows = stream_rows(out, "observation.images.agentview_depth")
    assert len(rows) == lengths[0] + lengths[2]
    sample = rows[(2, 4)]
    assert sample["observation.images.agentview_depth"].dtype.is_floating_point is False
    assert sample["task"] == "put the bowl on the plate"


def test_robomimic_reencode_states_its_codec_and_mapping_from_options(tmp_path):
    write_robomimic(tmp_path / "lift.hdf5", [6, 6], libero=False)
    out = str(tmp_path / "out")
    from epishard.shardwriter.video import ReencodeSpec

    options = SourceOptions(
        mapping=Mapping(state=("obs/joint_states",), cameras={"observation.images.front": "obs/agentview_rgb"})
    )
    manifest = convert(
        [str(tmp_path / "lift.hdf5")],
        out,
        _opts(reencode=ReencodeSpec(codec="libx264", gop=3, crf=18), sources=options),
    )
    assert manifest.options.video.startswith("reencode:") and '"gop": 3' in manifest.options.video
    assert manifest.tasks == ()
    back = read_back(out)
    frames = back[("lift", 1)]["frames"]["observation.images.front"]
    assert [decode_frame_number(f) for f in frames] == [1000 + i for i in range(6)]  # lossy, same frames
    assert np.array_equal(column(back[("lift", 1)]["table"], "observation.state"), _qpos(1, 6)[:, :7])


def test_a_missing_mapped_key_is_refused_when_the_source_opens(tmp_path):
    write_robomimic(tmp_path / "x.hdf5", [4])
    options = SourceOptions(mapping=Mapping(action=("obs/nope",)))
    with pytest.raises(SourceError, match=r"x.hdf5:data/demo_0: no key 'obs/nope'"):
        convert([str(tmp_path / "x.hdf5")], str(tmp_path / "o"), _opts(sources=options))


def test_an_fsspec_url_is_read_through_file_objects(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    write_aloha(tmp_path / "aloha", [4, 3])
    fs = fsspec.filesystem("memory")
    for path in sorted((tmp_path / "aloha").iterdir()):
        fs.pipe(f"/hdf5-url-test/aloha/{path.name}", path.read_bytes())
    try:
        out = str(tmp_path / "out")
        convert(["memory://hdf5-url-test/aloha"], out, _opts(sources=SourceOptions(format="aloha")))
        back = read_back(out)
        assert [back[("aloha", e)]["table"].num_rows for e in (0, 1)] == [4, 3]
        frames = back[("aloha", 1)]["frames"]["observation.images.top"]
        assert all(np.array_equal(frames[i], _frame(1, 0, i)) for i in range(3))
    finally:
        fs.rm("/hdf5-url-test", recursive=True)


def test_a_missing_library_names_the_extra_to_install(tmp_path, monkeypatch):
    write_aloha(tmp_path / "aloha", [3])
    monkeypatch.setitem(__import__("sys").modules, "h5py", None)  # as if h5py were not installed
    with pytest.raises(SourceError, match=r"needs the Python package 'h5py'.*pip install 'epishard\[hdf5\]'"):
        convert([str(tmp_path / "aloha")], str(tmp_path / "out"), _opts())
