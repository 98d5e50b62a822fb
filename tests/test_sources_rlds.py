"""RLDS / Open X-Embodiment TFRecords (written with the ``tfrecord`` package, described by a TFDS
features.json) read without TensorFlow: frames, rows, language, boundaries, flags and damage."""

from __future__ import annotations

import json
from fractions import Fraction

import av
import numpy as np
import pytest
from sourcecheck import check_verifies, column, read_back, stream_rows
from videogen import decode_frame_number, encode_frame_number

from epishard.cli import main
from epishard.shardwriter import ConversionError, ConvertOptions, convert
from epishard.shardwriter.images import decode_image
from epishard.shardwriter.sources import detect_format
from epishard.shardwriter.sources.tfrecord import parse_example

tfrecord = pytest.importorskip("tfrecord")

TFDS = "tensorflow_datasets.core.features."


def _encode(image: np.ndarray, codec: str) -> bytes:
    ctx = av.CodecContext.create(codec, "w")
    ctx.width, ctx.height = image.shape[1], image.shape[0]
    ctx.pix_fmt = "rgb24" if codec == "png" else "yuvj444p"
    ctx.time_base = Fraction(1, 10)
    frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format=ctx.pix_fmt)
    return b"".join(bytes(p) for p in [*ctx.encode(frame), *ctx.encode(None)])


def _tensor(shape, dtype="float32"):
    return {
        "pythonClassName": TFDS + "tensor_feature.Tensor",
        "tensor": {"shape": {"dimensions": [str(d) for d in shape]}, "dtype": dtype, "encoding": "none"},
    }


def _image(shape):
    return {
        "pythonClassName": TFDS + "image_feature.Image",
        "image": {"shape": {"dimensions": [str(d) for d in shape]}, "dtype": "uint8", "encodingFormat": "jpeg"},
    }


def features_json() -> dict:
    scalar = {"pythonClassName": TFDS + "scalar.Scalar", "tensor": {"shape": {}, "dtype": "bool"}}
    step = {
        "observation": {
            "featuresDict": {
                "features": {
                    "image": _image([64, 64, 3]),
                    "wrist_image": _image([64, 64, 3]),
                    "state": _tensor([8]),
                }
            }
        },
        "action": _tensor([7]),
        "reward": _tensor([], "float32"),
        "discount": _tensor([], "float32"),
        "is_first": scalar,
        "is_last": scalar,
        "is_terminal": scalar,
        "language_instruction": {"pythonClassName": TFDS + "text_feature.Text", "text": {}},
    }
    return {
        "pythonClassName": TFDS + "features_dict.FeaturesDict",
        "featuresDict": {
            "features": {
                "steps": {
                    "pythonClassName": TFDS + "dataset_feature.Dataset",
                    "sequence": {"feature": {"featuresDict": {"features": step}}, "length": "-1"},
                },
                "episode_metadata": {"featuresDict": {"features": {"file_path": {"text": {}}}}},
            }
        },
    }


def _state(e, t):
    return (np.arange(t * 8, dtype=np.float32).reshape(t, 8) / 4 + e).astype(np.float32)


def _action(e, t):
    return (-np.arange(t * 7, dtype=np.float32).reshape(t, 7) / 8 - e).astype(np.float32)


def episode_datum(e: int, t: int, png_wrist=True, flags_ok=True, sizes=None, corrupt_row=None, texts=None):
    images = []
    for i in range(t):
        h, w = (sizes or {}).get(i, (64, 64))
        images.append(_encode(encode_frame_number(100 * e + i, h, w), "mjpeg"))
    if corrupt_row is not None:
        images[corrupt_row] = b"\xff\xd8\xff" + b"\x00" * 50
    wrist = [_encode(encode_frame_number(5000 + 100 * e + i), "png" if png_wrist else "mjpeg") for i in range(t)]
    first = [int(i == 0) for i in range(t)] if flags_ok else [int(i in (0, 2)) for i in range(t)]
    texts = texts or [f"pick block {e}".encode()] * t
    return {
        "steps/observation/image": (images, "byte"),
        "steps/observation/wrist_image": (wrist, "byte"),
        "steps/observation/state": (_state(e, t).reshape(-1).tolist(), "float"),
        "steps/action": (_action(e, t).reshape(-1).tolist(), "float"),
        "steps/reward": ([float(i == t - 1) for i in range(t)], "float"),
        "steps/discount": ([1.0] * t, "float"),
        "steps/is_first": (first, "int"),
        "steps/is_last": ([int(i == t - 1) for i in range(t)], "int"),
        "steps/is_terminal": ([int(i == t - 1) for i in range(t)], "int"),
        "steps/language_instruction": (texts, "byte"),
        "episode_metadata/file_path": ([f"/data/ep{e}.npy".encode()], "byte"),
    }


def write_rlds(root, files: list[list[dict]], with_features=True):
    """A TFDS folder: features.json, dataset_info.json and one TFRecord file per list of episode datums."""
    root.mkdir(parents=True, exist_ok=True)
    if with_features:
        (root / "features.json").write_text(json.dumps(features_json()))
        (root / "dataset_info.json").write_text(json.dumps({"name": "toy", "splits": [{"name": "train"}]}))
    for i, datums in enumerate(files):
        writer = tfrecord.TFRecordWriter(str(root / f"toy-train.tfrecord-{i:05d}-of-{len(files):05d}"))
        for d in datums:
            writer.write(d)
        writer.close()


def test_own_example_parser_matches_the_writer():
    datum = episode_datum(3, 4)
    record = tfrecord.TFRecordWriter.serialize_tf_example(datum)
    parsed = parse_example(record)
    assert parsed["steps/observation/image"] == ("bytes", datum["steps/observation/image"][0])
    kind, values = parsed["steps/action"]
    assert kind == "float" and np.array_equal(values, _action(3, 4).reshape(-1))
    assert parsed["steps/is_first"][0] == "int64" and parsed["steps/is_first"][1].tolist() == [1, 0, 0, 0]


def test_rlds_episodes_frames_rows_and_language_are_exact(tmp_path):
    lengths = [[5, 7], [4]]
    write_rlds(
        tmp_path / "toy" / "1.0.0",
        [[episode_datum(e + 2 * f, t) for e, t in enumerate(ls)] for f, ls in enumerate(lengths)],
    )
    src = str(tmp_path / "toy" / "1.0.0")
    assert detect_format(src) == "rlds"
    out = str(tmp_path / "out")
    manifest = convert([src], out, ConvertOptions(progress=False, workers=2, max_episodes_per_shard=2))
    notes = " ".join(manifest.sources[0].notes)
    assert "episode_metadata/file_path (per episode) is not kept" in notes
    assert manifest.sources[0].name == "toy" and manifest.totals.episodes == 3
    check_verifies(out)
    back = read_back(out)
    # episode index: record order across the sorted files: (file 0: e0, e1), (file 1: e2)
    for index, (e, t) in enumerate([(0, 5), (1, 7), (2, 4)]):
        ep = back[("toy", index)]
        table = ep["table"]
        assert table.num_rows == t
        assert np.array_equal(column(table, "observation.state"), _state(e, t))
        assert np.array_equal(column(table, "action"), _action(e, t))
        assert column(table, "next.reward").tolist() == [0.0] * (t - 1) + [1.0]
        assert column(table, "discount").tolist() == [1.0] * t  # kept as a column
        assert column(table, "is_terminal").tolist() == [False] * (t - 1) + [True]
        assert table.column("language_instruction").to_pylist() == [f"pick block {e}"] * t
        assert ep["tasks"] == [f"pick block {e}"]
        assert "is_first" not in table.column_names
        image = ep["frames"]["observation.images.image"]
        wrist = ep["frames"]["observation.images.wrist_image"]
        for i in range(t):
            jpeg = _encode(encode_frame_number(100 * e + i), "mjpeg")
            assert np.array_equal(image[i], decode_image(jpeg)[0])  # the JPEG's decoded pixels, exactly
            assert np.array_equal(wrist[i], encode_frame_number(5000 + 100 * e + i))  # PNG: lossless end to end
    rows = stream_rows(out, "observation.images.image")
    assert {k: decode_frame_number(s["observation.images.image"][0]) for k, s in rows.items()} == {
        (index, i): 100 * e + i for index, (e, t) in enumerate([(0, 5), (1, 7), (2, 4)]) for i in range(t)
    }
    assert rows[(1, 3)]["task"] == "pick block 1"


def test_rlds_without_features_json_and_a_varying_instruction(tmp_path):
    texts = [b"open the drawer"] * 3 + [b"close the drawer"] * 2
    write_rlds(tmp_path / "r", [[episode_datum(0, 5, texts=texts)]], with_features=False)
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "r"), str(out), "--format", "oxe", "--fps", "5", "-q"]) == 0
    back = read_back(str(out))
    ep = back[("r", 0)]
    assert ep["tasks"] == ["open the drawer"] and ep["meta"]["fps"] == 5
    assert ep["table"].column("language_instruction").to_pylist() == [t.decode() for t in texts]
    assert np.array_equal(column(ep["table"], "observation.state"), _state(0, 5))  # width from the values
    import json as _json

    manifest = _json.loads((out / "manifest.json").read_text())
    assert [w["kind"] for w in manifest["report"]["warnings"]] == ["language_varies"]


def test_rlds_bad_inputs(tmp_path):
    write_rlds(tmp_path / "flags", [[episode_datum(0, 4), episode_datum(1, 5, flags_ok=False)]])
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "flags")], str(tmp_path / "o1"), ConvertOptions(progress=False))
    e = err.value
    assert (e.kind, e.episode, e.row) == ("bad_episode_flags", 1, 2) and "tfrecord-00000" in e.path

    write_rlds(tmp_path / "size", [[episode_datum(0, 5, sizes={3: (48, 64)})]])
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "size")], str(tmp_path / "o2"), ConvertOptions(progress=False))
    assert (err.value.kind, err.value.camera, err.value.row) == ("frame_size_changed", "observation.images.image", 3)

    write_rlds(tmp_path / "jpeg", [[episode_datum(0, 5, corrupt_row=1)]])
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "jpeg")], str(tmp_path / "o3"), ConvertOptions(progress=False))
    assert (err.value.kind, err.value.episode, err.value.row) == ("bad_image", 0, 1)

    short = episode_datum(1, 5)
    short["steps/action"] = (short["steps/action"][0][:-7], "float")
    write_rlds(tmp_path / "len", [[episode_datum(0, 4), short]])
    with pytest.raises(ConversionError, match=r"steps/action holds 28 values; 5 steps of \[7\] need 35") as err:
        convert([str(tmp_path / "len")], str(tmp_path / "o4"), ConvertOptions(progress=False))
    assert (err.value.kind, err.value.episode) == ("length_mismatch", 1)

    write_rlds(tmp_path / "cut", [[episode_datum(0, 4), episode_datum(1, 5), episode_datum(2, 3)]])
    path = next((tmp_path / "cut").glob("*.tfrecord*"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])  # the last record loses its end
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "cut")], str(tmp_path / "o5"), ConvertOptions(progress=False))
    assert (err.value.kind, err.value.episode) == ("unreadable_file", 2) and "truncated" in err.value.detail
    manifest = convert([str(tmp_path / "cut")], str(tmp_path / "o6"), ConvertOptions(progress=False, on_error="skip"))
    assert manifest.totals.episodes == 2 and manifest.report.skipped_by_kind == {"unreadable_file": 1}

    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF  # inside record 0's data: its CRC no longer matches
    path.write_bytes(bytes(data))
    with pytest.raises(ConversionError, match="CRC does not match") as err:
        convert([str(tmp_path / "cut")], str(tmp_path / "o7"), ConvertOptions(progress=False, episodes=frozenset({0})))
    assert err.value.episode == 0


def test_rlds_refuses_streams_in_its_mapping(tmp_path):
    from epishard.shardwriter import SourceError
    from epishard.shardwriter.sources import Mapping, SourceOptions

    write_rlds(tmp_path / "ds", [[episode_datum(0, 4)]])
    options = ConvertOptions(progress=False, sources=SourceOptions(mapping=Mapping(streams={"obs.x": "action"})))
    with pytest.raises(SourceError, match=r"ds: the mapping's streams: RLDS steps share one clock"):
        convert([str(tmp_path / "ds")], str(tmp_path / "out"), options)
