"""ROS 2 bags in MCAP (written with mcap-ros2-support's writer, no ROS install): two image topics at
different rates and joint states, resampled by nearest timestamp; frames, rows and counts exact."""

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
from epishard.shardwriter.sources import Mapping, SourceOptions, detect_format

pytest.importorskip("mcap_ros2")
from mcap_ros2.writer import Writer

SEP = "=" * 80
HEADER = ("std_msgs/Header", "builtin_interfaces/Time stamp\nstring frame_id")
TIME = ("builtin_interfaces/Time", "int32 sec\nuint32 nanosec")


def _def(body: str, *deps) -> str:
    return body + "".join(f"\n{SEP}\nMSG: {n}\n{b}" for n, b in deps)


IMAGE = _def(
    "std_msgs/Header header\nuint32 height\nuint32 width\nstring encoding\nuint8 is_bigendian\nuint32 step\n"
    "uint8[] data",
    HEADER,
    TIME,
)
COMPRESSED = _def("std_msgs/Header header\nstring format\nuint8[] data", HEADER, TIME)
JOINTS = _def(
    "std_msgs/Header header\nstring[] name\nfloat64[] position\nfloat64[] velocity\nfloat64[] effort", HEADER, TIME
)
MS = 1_000_000
T0 = 1_700_000_000 * 1_000_000_000  # stamps in ns since the epoch, as a robot's clock gives them


def _png(image: np.ndarray) -> bytes:
    ctx = av.CodecContext.create("png", "w")
    ctx.width, ctx.height, ctx.pix_fmt, ctx.time_base = image.shape[1], image.shape[0], "rgb24", Fraction(1, 20)
    return b"".join(
        bytes(p) for p in [*ctx.encode(av.VideoFrame.from_ndarray(image, format="rgb24")), *ctx.encode(None)]
    )


def _header(t: int) -> dict:
    return {"stamp": {"sec": t // 1_000_000_000, "nanosec": t % 1_000_000_000}, "frame_id": "base"}


def joint_position(k: int) -> list[float]:
    return [k * 0.5, -k * 0.25, k * 1.0, 3.0]


def bag_times(seconds=2.0, gap=None):
    """(topic -> [ns times]) of a bag: camera high 10 Hz, wrist 20 Hz (+10 ms), joints 50 Hz (+3 ms)."""
    high = [T0 + i * 100 * MS for i in range(int(seconds * 10))]
    if gap is not None:
        high = [t for t in high if not gap[0] <= (t - T0) / 1e9 < gap[1]]
    wrist = [T0 + 10 * MS + j * 50 * MS for j in range(int(seconds * 20))]
    joints = [T0 + 3 * MS + k * 20 * MS for k in range(int(seconds * 50))]
    return {"/cam_high/image_raw": high, "/cam_wrist/image_raw/compressed": wrist, "/joint_states": joints}


def write_bag(path, seconds=2.0, gap=None, sizes=None, corrupt=None, skip_topic=None, e=0):
    times = bag_times(seconds, gap)
    messages = []
    for i, t in enumerate(times["/cam_high/image_raw"]):
        n = 1000 * (e + 1) + round((t - T0) / (100 * MS))
        h, w = (sizes or {}).get(i, (64, 64))
        msg = {"header": _header(t), "height": h, "width": w, "encoding": "rgb8", "is_bigendian": 0, "step": 3 * w}
        messages.append((t, "/cam_high/image_raw", "image", {**msg, "data": encode_frame_number(n, h, w).tobytes()}))
    for j, t in enumerate(times["/cam_wrist/image_raw/compressed"]):
        data = b"\x89PNG garbage" if corrupt == j else _png(encode_frame_number(20000 * (e + 1) + j))
        messages.append(
            (t, "/cam_wrist/image_raw/compressed", "compressed", {"header": _header(t), "format": "png", "data": data})
        )
    for k, t in enumerate(times["/joint_states"]):
        msg = {
            "header": _header(t),
            "name": ["a", "b", "c", "g"],
            "position": joint_position(k),
            "velocity": [k * 1.0] * 4,
            "effort": [],
        }
        messages.append((t, "/joint_states", "joints", msg))
        messages.append(
            (
                t + MS,
                "/joint_command",
                "joints",
                {**msg, "header": _header(t + MS), "position": [-x for x in joint_position(k)]},
            )
        )
    messages.sort(key=lambda m: m[0])
    with open(path, "wb") as f:
        writer = Writer(f)
        schemas = {
            "image": writer.register_msgdef("sensor_msgs/msg/Image", IMAGE),
            "compressed": writer.register_msgdef("sensor_msgs/msg/CompressedImage", COMPRESSED),
            "joints": writer.register_msgdef("sensor_msgs/msg/JointState", JOINTS),
        }
        for t, topic, schema, msg in messages:
            if topic != skip_topic:
                writer.write_message(topic, schemas[schema], msg, log_time=t + 2 * MS, publish_time=t)
        writer.finish()
    return times


def nearest(times: list[int], grid: np.ndarray) -> np.ndarray:
    t = np.asarray(times)
    return np.abs(grid[:, None] - t[None, :]).argmin(axis=1)


def _opts(**kw):
    return ConvertOptions(progress=False, **kw)


def test_two_image_topics_at_different_rates_resample_exactly(tmp_path, capsys):
    folder = tmp_path / "bags"
    folder.mkdir()
    times = [write_bag(folder / f"run_{e}.mcap", seconds=1.0 + 0.5 * e, e=e) for e in range(2)]
    assert detect_format(str(folder)) == "mcap"
    out = tmp_path / "out"
    assert (
        main(["convert", str(folder), str(out), "--fps", "20", "--workers", "2", "--max-episodes-per-shard", "1"]) == 0
    )
    printed = capsys.readouterr().out
    for e, topic in [(0, "/cam_high/image_raw"), (1, "/cam_wrist/image_raw/compressed"), (1, "/joint_states")]:
        assert f"resampled: bags episode {e}: {topic}: " in printed  # a console line per episode and topic
    assert "/cam_high/image_raw: 10 messages at 10.00 Hz" in printed
    check_verifies(str(out))
    back = read_back(str(out))
    manifest = json.loads((out / "manifest.json").read_text())
    for e, tt in enumerate(times):
        start = max(v[0] for v in tt.values())
        stop = min(v[-1] for v in tt.values())
        grid = start + np.arange(int((stop - start) // (50 * MS)) + 1) * 50 * MS
        ep = back[("bags", e)]
        assert ep["table"].num_rows == grid.size
        assert column(ep["table"], "timestamp_ns").tolist() == grid.tolist()
        k = nearest(tt["/joint_states"], grid)
        assert np.array_equal(column(ep["table"], "observation.state"), np.asarray([joint_position(x) for x in k]))
        assert np.array_equal(column(ep["table"], "observation.velocity"), np.repeat(k[:, None] * 1.0, 4, 1))
        ka = nearest([t + MS for t in tt["/joint_states"]], grid)
        assert np.array_equal(column(ep["table"], "action"), -np.asarray([joint_position(x) for x in ka]))
        high = ep["frames"]["observation.images.cam_high"]
        want_high = [
            1000 * (e + 1) + round((tt["/cam_high/image_raw"][i] - T0) / (100 * MS))
            for i in nearest(tt["/cam_high/image_raw"], grid)
        ]
        assert [decode_frame_number(f) for f in high] == want_high
        assert all(np.array_equal(f, encode_frame_number(n)) for f, n in zip(high, want_high, strict=True))  # exact
        wrist = ep["frames"]["observation.images.cam_wrist"]
        want_wrist = [20000 * (e + 1) + j for j in nearest(tt["/cam_wrist/image_raw/compressed"], grid)]
        assert all(np.array_equal(f, encode_frame_number(n)) for f, n in zip(wrist, want_wrist, strict=True))
        entries = {
            w["message"].split(":")[0]: w["message"]
            for w in manifest["report"]["warnings"]
            if w["kind"] == "resampled" and w["episode"] == e
        }
        high_repeats = grid.size - len(set(want_high))
        assert f"{high_repeats} rows repeat a message" in entries["/cam_high/image_raw"]
        unused = len(tt["/joint_states"]) - len(set(k.tolist()))
        assert f"{unused} messages unused, 0 rows dropped" in entries["/joint_states"]
    rows = stream_rows(str(out), "observation.images.cam_wrist")
    assert len(rows) == sum(b["table"].num_rows for b in back.values())


def test_a_gap_drops_rows_counts_them_and_breaks_the_recording(tmp_path):
    times = write_bag(tmp_path / "gap.mcap", seconds=2.0, gap=(0.75, 1.35))
    options = SourceOptions(mapping=Mapping(fps=20, tolerance=0.06))
    manifest = convert([str(tmp_path / "gap.mcap")], str(tmp_path / "out"), _opts(sources=options))
    start = max(v[0] for v in times.values())
    stop = min(v[-1] for v in times.values())
    grid = start + np.arange(int((stop - start) // (50 * MS)) + 1) * 50 * MS
    high = np.asarray(times["/cam_high/image_raw"])
    keep = np.abs(grid[:, None] - high[None, :]).min(axis=1) <= 60 * MS
    back = read_back(str(tmp_path / "out"))
    assert column(back[("gap", 0)]["table"], "timestamp_ns").tolist() == grid[keep].tolist()
    messages = {w.message.split(":")[0]: w.message for w in manifest.report.warnings if w.kind == "resampled"}
    assert f"{int((~keep).sum())} rows dropped (no message within 60 ms)" in messages["/cam_high/image_raw"]
    assert "timestamps_jump" in manifest.report.warnings_by_kind  # windows do not cross the gap
    assert back[("gap", 0)]["meta"]["key"] == "gap-e000000"


def test_mcap_bad_inputs(tmp_path):
    folder = tmp_path / "a"
    folder.mkdir()
    write_bag(folder / "r_0.mcap", seconds=0.5)
    write_bag(folder / "r_1.mcap", seconds=0.5, sizes={2: (48, 64)})
    with pytest.raises(ConversionError) as err:
        convert([str(folder)], str(tmp_path / "o1"), _opts(sources=SourceOptions(fps=20)))
    e = err.value
    assert (e.kind, e.episode, e.camera) == ("frame_size_changed", 1, "observation.images.cam_high")

    write_bag(folder / "r_1.mcap", seconds=0.5, corrupt=3)
    with pytest.raises(ConversionError) as err:
        convert([str(folder)], str(tmp_path / "o2"), _opts(sources=SourceOptions(fps=20)))
    assert (err.value.kind, err.value.episode, err.value.camera) == ("bad_image", 1, "observation.images.cam_wrist")

    write_bag(folder / "r_1.mcap", seconds=0.5, skip_topic="/joint_states")
    with pytest.raises(ConversionError, match="topic /joint_states has no message") as err:
        convert([str(folder)], str(tmp_path / "o3"), _opts(sources=SourceOptions(fps=20)))
    assert (err.value.kind, err.value.episode) == ("missing_key", 1) and err.value.path.endswith("r_1.mcap")

    write_bag(folder / "r_1.mcap", seconds=0.5)
    data = (folder / "r_1.mcap").read_bytes()
    (folder / "r_1.mcap").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConversionError) as err:
        convert([str(folder)], str(tmp_path / "o4"), _opts(sources=SourceOptions(fps=20)))
    assert (err.value.kind, err.value.episode) == ("unreadable_file", 1) and err.value.path.endswith("r_1.mcap")
    manifest = convert([str(folder)], str(tmp_path / "o5"), _opts(on_error="skip", sources=SourceOptions(fps=20)))
    assert manifest.totals.episodes == 1 and manifest.report.skipped_by_kind == {"unreadable_file": 1}

    with pytest.raises(SourceError, match=r"no topic /nope"):
        convert([str(folder)], str(tmp_path / "o6"), _opts(sources=SourceOptions(mapping=Mapping(state=("/nope",)))))
