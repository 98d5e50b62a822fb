"""Sources keep native rates (issue 38): MCAP topics and HDF5 arrays written as streams at their own rate.

A real-shaped ROS 2 bag (two cameras at 30 Hz, JointState at 100 Hz, WrenchStamped at 1 kHz whose
values are their own sample number, an irregular Float64MultiArray event topic) is converted with
the mapping's ``streams``; each stream member is read back from the tar through the index
(``WindowIndex.load_dataset`` + ``read_stream``) and compared with the messages: every message kept,
values exact, timestamps the message times less the first row's. The resampled state must be what
it is without streams. HDF5: a file with a 1 kHz force array and its own timestamps, likewise.
Hostile: a stream message claiming a huge array, an HDF5 timestamp array that decreases.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from sourcecheck import column, read_back
from test_oracle_mcap import HEADER, TIME, _def  # the ROS 2 message definitions the oracle writes
from test_oracle_mcap import TYPES as ORACLE_TYPES
from videogen import encode_frame_number

from epishard.format.index import WindowIndex
from epishard.format.streams import read_pieces
from epishard.shardwriter import ConversionError, ConvertOptions, SourceError, convert
from epishard.shardwriter.sources import Mapping, SourceOptions, bounds, open_source

MS = 1_000_000
T0 = 1_700_000_000 * 1_000_000_000
WRENCH = ("geometry_msgs/Wrench", "Vector3 force\nVector3 torque")
VECTOR3 = ("geometry_msgs/Vector3", "float64 x\nfloat64 y\nfloat64 z")


TYPES = {
    **{k: ORACLE_TYPES[k] for k in ("image", "joints", "f64")},
    "wrench": ("geometry_msgs/msg/WrenchStamped", _def(
        "std_msgs/Header header\ngeometry_msgs/Wrench wrench", HEADER, TIME, WRENCH, VECTOR3)),
}  # fmt: skip
CAMS = {"/cam_high/image_raw": 5 * MS, "/cam_wrist/image_raw": 12 * MS}  # 30 Hz, offsets
JOINTS, FT, EVENTS = "/joint_states", "/wrench", "/events"


def _header(t: int) -> dict:
    return {"stamp": {"sec": t // 1_000_000_000, "nanosec": t % 1_000_000_000}, "frame_id": "f"}


def wrench_values(k: int) -> list[float]:
    """Sample ``k``'s force.xyz, torque.xyz: force.x is the sample number."""
    return [float(k), k + 0.5, -float(k), k * 0.25, 1.0, -2.0]


def write_bag(path, seconds=1.0, seed=0, wide=None) -> dict:
    """A real-shaped bag; returns topic -> (times in ns in bag order, values in bag order).

    ``/wrench`` 1 kHz: message 40's and 41's stamps swapped (out of order in the bag), message 70
    stamped as message 69 (a duplicate). ``/events``: irregular times (log time: no header).
    ``wide``: (topic, message number, values) a message whose array is that long instead.
    """
    rng = np.random.default_rng(seed)
    span = int(seconds * 1e9)
    messages, truth = [], {}
    for c, (topic, offset) in enumerate(CAMS.items()):
        stamps = [T0 + offset + round(i * 1e9 / 30) for i in range(int(seconds * 30))]
        for i, t in enumerate(stamps):
            data = encode_frame_number(100 * c + i, 32, 32).tobytes()
            msg = {"header": _header(t), "height": 32, "width": 32, "encoding": "rgb8", "is_bigendian": 0,
                   "step": 96, "data": data}  # fmt: skip
            messages.append((t + MS, topic, "image", msg))
        truth[topic] = (stamps, None)
    stamps = [T0 + 2 * MS + k * 10 * MS for k in range(int(seconds * 100))]
    values = [[k * 0.5, -k * 0.25, k * 1.0, 3.0] for k in range(len(stamps))]
    for t, v in zip(stamps, values, strict=True):
        msg = {"header": _header(t), "name": list("abcd"), "position": v, "velocity": [], "effort": []}
        messages.append((t + MS, JOINTS, "joints", msg))
    truth[JOINTS] = (stamps, values)
    logs = [T0 + 300_000 + k * MS for k in range(int(seconds * 1000))]
    stamps = list(logs)
    stamps[40], stamps[41] = stamps[41], stamps[40]
    stamps[70] = stamps[69]
    values = [wrench_values(k) for k in range(len(stamps))]
    for t, log, v in zip(stamps, logs, values, strict=True):
        msg = {"header": _header(t), "wrench": {"force": dict(zip("xyz", v[:3], strict=True)),
                                                "torque": dict(zip("xyz", v[3:], strict=True))}}  # fmt: skip
        messages.append((log + 200_000, FT, "wrench", msg))
    truth[FT] = (stamps, values)
    logs = sorted(T0 + int(x) for x in rng.integers(0, span, 23))
    values = [[float(j), float(rng.standard_normal())] for j in range(len(logs))]
    for log, v in zip(logs, values, strict=True):
        messages.append((log, EVENTS, "f64", {"layout": {"dim": [], "data_offset": 0}, "data": v}))
    truth[EVENTS] = (logs, values)
    if wide is not None:
        topic, n, count = wide
        i = [k for k, m in enumerate(messages) if m[1] == topic][n]
        log, _, kind, msg = messages[i]
        messages[i] = (log, topic, kind, {**msg, "data": [0.5] * count})
    messages.sort(key=lambda m: m[0])
    writer_module = pytest.importorskip("mcap_ros2.writer")
    with open(path, "wb") as f:
        writer = writer_module.Writer(f, chunk_size=256 << 10)
        schemas = {k: writer.register_msgdef(name, body) for k, (name, body) in TYPES.items()}
        for log, topic, kind, msg in messages:
            writer.write_message(topic, schemas[kind], msg, log_time=log, publish_time=log)
        writer.finish()
    return truth


def _opts(**mapping) -> ConvertOptions:
    return ConvertOptions(progress=False, sources=SourceOptions(mapping=Mapping(fps=30, **mapping)))


def read_streams(out) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray, float]]:
    """(episode index, stream name) -> (timestamps, values, the index's rate), read from the tars' bytes."""
    manifest = json.loads((out / "manifest.json").read_text())
    index = WindowIndex.load_dataset(str(out))
    got = {}
    for e in range(index.num_episodes):
        tar = out / manifest["shards"][int(index.shard[e])]["shard"]
        for name, sig in index.signals(e).items():
            blobs = {}
            for m in index.signal_pieces(sig)[0].tolist():  # the stream's pieces, one member each
                start, stop = index.member_ranges(m)
                with open(tar, "rb") as f:
                    f.seek(int(start))
                    blobs[m] = f.read(int(stop - start))
            stream = read_pieces(index, sig, blobs, f"{tar}: {name}")
            got[(int(index.row(e)["episode_index"]), name)] = (stream.timestamps, stream.values, index.signal_rate[sig])
    return got


STREAMS = {"observation.wrench": FT, "observation.events": EVENTS, "observation.joints": JOINTS}


def test_mcap_streams_keep_every_message_at_its_own_time(tmp_path):
    bag = tmp_path / "run.mcap"
    truth = write_bag(bag)
    plain = convert([str(bag)], str(tmp_path / "plain"), _opts())
    manifest = convert([str(bag)], str(tmp_path / "out"), _opts(streams=STREAMS))
    before, after = read_back(str(tmp_path / "plain"))[("run", 0)], read_back(str(tmp_path / "out"))[("run", 0)]
    for name in ("timestamp_ns", "timestamp", "observation.state"):  # resampling is unchanged by the streams
        assert np.array_equal(column(before["table"], name), column(after["table"], name)), name
    resampled = sorted(w.message for w in manifest.report.warnings if w.kind == "resampled")
    assert resampled == sorted(w.message for w in plain.report.warnings if w.kind == "resampled")
    assert {m.split(":")[0] for m in resampled} == {*CAMS, JOINTS}  # a stream topic is not resampled
    assert not any(FT in n and "not kept" in n for s in manifest.sources for n in s.notes)
    row_ns = column(after["table"], "timestamp_ns")
    t0 = max(truth[t][0][0] for t in (*CAMS, JOINTS))  # the latest first message of the resampled topics
    assert row_ns[0] == t0
    got = read_streams(tmp_path / "out")
    for name, topic in STREAMS.items():
        stamps = np.asarray(truth[topic][0], np.int64)
        values = np.asarray(truth[topic][1], np.float64)
        times, stored, rate = got[(0, name)]
        order = np.argsort(stamps, kind="stable")
        assert times.size == stamps.size == len(truth[topic][1])  # no message dropped
        assert np.array_equal(times, (stamps[order] - t0) / 1e9), name  # the message times less t0, exactly
        assert stored.dtype == np.float64 and np.array_equal(stored, values[order]), name
        assert rate == 0.0  # a bag declares no rate
        entry = manifest.streams[name]
        assert (entry.samples, entry.episodes, entry.shape) == (stamps.size, 1, (values.shape[1],))
    times, stored, _ = got[(0, "observation.wrench")]
    assert stored[:, 0].tolist() == [*range(40), 41, 40, *range(42, 1000)]  # sorted by time: 41 before 40
    assert times[69] == times[70] and stored[69, 0] == 69 and stored[70, 0] == 70  # a shared stamp keeps both
    # row r and a sample at the same instant share a time: rows every 33.3 ms from 12 ms, joints every 10 ms
    # from 2 ms meet at every third row (row 0 at 0.0 s is joint message 1)
    joint_times = got[(0, "observation.joints")][0]
    shared = np.intersect1d((row_ns - t0) / 1e9, joint_times)
    assert shared.size == (row_ns.size + 2) // 3 and shared[0] == 0.0 == joint_times[1]
    reordered = [w for w in manifest.report.warnings if w.kind == "stream_reordered"]
    assert len(reordered) == 1 and "/wrench -> stream observation.wrench: 1 of 1000" in reordered[0].message
    assert "1 share a time" in reordered[0].message
    assert manifest.format_version == 3


def test_mcap_streams_all_and_the_plan_fingerprint(tmp_path):
    bag = tmp_path / "run.mcap"
    truth = write_bag(bag, seconds=0.5)

    def episode(**mapping):
        return open_source(str(bag), SourceOptions(mapping=Mapping(fps=30, **mapping))).episodes[0]

    plain, streamed, every = episode(), episode(streams={"observation.wrench": FT}), episode(streams="all")
    prints = [json.dumps(e.table.fingerprint()) for e in (plain, streamed, every)]
    assert len(set(prints)) == 3  # the mapping's streams enter the plan digest
    loaded = every.table.load()
    assert sorted(loaded.streams) == ["events", "joint_states", "wrench"]  # every numeric topic, not the cameras
    assert loaded.streams["wrench"].values.shape == (len(truth[FT][0]), 6)
    assert plain.table.load().streams == {}
    for bad, words in (
        ({"observation.state": FT}, "name of a column"),
        ({"observation.wrench": "/cam_high/image_raw"}, "a stream reads"),
        ({"observation.wrench": "/nope"}, "no topic /nope"),
        ({"observation.wrench": {"values": FT, "timestamps": FT}}, "an MCAP stream is a topic"),
    ):
        with pytest.raises(SourceError, match=words):
            episode(streams=bad)
    with pytest.raises(SourceError, match="streams must be"):
        Mapping.from_dict({"streams": ["/wrench"]})


def test_a_stream_message_claiming_a_huge_array_is_refused_by_the_bounds(tmp_path, monkeypatch):
    bag = tmp_path / "wide.mcap"
    write_bag(bag, seconds=0.5, wide=(EVENTS, 3, 5000))
    monkeypatch.setattr(bounds, "MAX_VALUES", 1000)
    with pytest.raises(ConversionError) as err:
        convert([str(bag)], str(tmp_path / "out"), _opts(streams={"observation.events": EVENTS}))
    exc = err.value
    assert exc.kind == "too_large" and exc.path.endswith("wide.mcap") and EVENTS in str(exc) and "5000" in str(exc)
    monkeypatch.undo()
    # the events topic is not resampled: a stream's messages alone are bounded too (count x width, bytes)
    monkeypatch.setattr(bounds, "MAX_ARRAY_BYTES", 499 * 6 * 8)  # one wrench sample less than the bag holds
    write_bag(bag, seconds=0.5)
    with pytest.raises(ConversionError) as err:
        convert([str(bag)], str(tmp_path / "out2"), _opts(streams={"observation.wrench": FT}))
    assert err.value.kind == "too_large" and FT in str(err.value)


# -- HDF5 --------------------------------------------------------------------------------------------------


def write_aloha(path, rows=40, ft_times=None) -> tuple[np.ndarray, np.ndarray]:
    """An ALOHA episode: qpos, action, one camera at 50 Hz; a 1 kHz force-torque array with its own times."""
    h5py = pytest.importorskip("h5py")
    n = rows * 20
    times = np.arange(n, dtype=np.float64) / 1000.0 + 0.0003 if ft_times is None else ft_times
    ft = (np.arange(n * 6, dtype=np.float32).reshape(n, 6) * 0.5).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("observations/qpos", data=np.arange(rows * 3, dtype=np.float64).reshape(rows, 3))
        f.create_dataset("action", data=-np.arange(rows * 3, dtype=np.float64).reshape(rows, 3))
        cams = np.stack([encode_frame_number(i, 32, 32) for i in range(rows)])
        f.create_dataset("observations/images/top", data=cams)
        f.create_dataset("observations/ft", data=ft)
        f.create_dataset("observations/ft_time", data=times)
    return times, ft


HDF5_STREAMS = {"observation.force": {"values": "observations/ft", "timestamps": "observations/ft_time", "rate": 1000}}


def test_hdf5_stream_with_its_own_timestamps(tmp_path):
    folder = tmp_path / "aloha"
    folder.mkdir()
    truth = [write_aloha(folder / f"episode_{e}.hdf5", rows=30 + 10 * e) for e in range(2)]
    options = ConvertOptions(progress=False, sources=SourceOptions(mapping=Mapping(streams=HDF5_STREAMS)))
    manifest = convert([str(folder)], str(tmp_path / "out"), options)
    back = read_back(str(tmp_path / "out"))
    got = read_streams(tmp_path / "out")
    for e, (times, ft) in enumerate(truth):
        table = back[("aloha", e)]["table"]
        assert "observations.ft" not in table.column_names and "observations.ft_time" not in table.column_names
        assert column(table, "timestamp").tolist() == (np.arange(table.num_rows) / 50).astype(np.float32).tolist()
        stamps, values, rate = got[(e, "observation.force")]
        assert np.array_equal(stamps, times) and values.dtype == np.float32 and np.array_equal(values, ft)
        assert rate == 1000.0
    entry = manifest.streams["observation.force"]
    samples = sum(t.size for t, _ in truth)
    assert (entry.samples, entry.episodes, entry.nominal_rate, entry.gaps) == (samples, 2, 1000.0, 0)
    assert not any("observations/ft" in n and "not kept" in n for s in manifest.sources for n in s.notes)


def test_hdf5_stream_timestamps_that_decrease_are_refused(tmp_path):
    folder = tmp_path / "aloha"
    folder.mkdir()
    write_aloha(folder / "episode_0.hdf5")
    times = np.arange(800, dtype=np.float64) / 1000.0
    times[500] = times[498]  # back by 2 ms
    write_aloha(folder / "episode_1.hdf5", ft_times=times)
    options = ConvertOptions(progress=False, sources=SourceOptions(mapping=Mapping(streams=HDF5_STREAMS)))
    with pytest.raises(ConversionError) as err:
        convert([str(folder)], str(tmp_path / "out"), options)
    exc = err.value
    assert (exc.kind, exc.episode) == ("bad_feature", 1) and exc.path.endswith("episode_1.hdf5"), str(exc)
    assert "stream 'observation.force'" in str(exc) and "sample 500" in str(exc), str(exc)
    dated = np.arange(800, dtype=np.float64) / 1000.0 + 1.7e9  # unix seconds, not the row clock
    write_aloha(folder / "episode_1.hdf5", ft_times=dated)
    with pytest.raises(ConversionError, match="not a date") as err:
        convert([str(folder)], str(tmp_path / "out2"), options)
    assert err.value.kind == "too_large"
    with pytest.raises(SourceError, match="names its arrays"):
        open_source(str(folder), SourceOptions(mapping=Mapping(streams="all")))
