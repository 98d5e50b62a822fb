"""Streams at their own rate in the views: ``preview``'s sheets and Rerun export, ``inspect`` and ``verify``.

Two tiny episodes at 30 fps carry a 1 kHz wrench, a 200 Hz IMU with a dropout and an irregular
event stream (two events at one time), each sample holding its own sample number, beside a 30 fps
camera. The preview's data for a stream must be exactly the source's samples in the interval it
plots; the Rerun recording must hold them at their own times; ``inspect`` must state each
stream's counts; ``verify`` must name the episode and stream of a member that lies.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from videogen import make_episode_table, make_video

from epishard.cli import main as cli
from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, Stream, convert
from epishard.shardwriter.describe import describe, render, render_verification
from epishard.shardwriter.verify import verify
from epishard.stream.multirate import TOLERANCE_S

pytest.importorskip("matplotlib")
from epishard.stream.preview import export_rerun, preview, stream_samples

FPS = 30
CAM = "observation.images.front"
LENGTHS = [24, 18]
STREAMS = ["events", "obs.imu", "obs.wrench"]


def _streams(e: int, n: int, rng: np.random.Generator) -> dict[str, Stream]:
    seconds = n / FPS
    t1k = 0.0005 + np.arange(int(seconds * 1000)) / 1000
    t200 = np.arange(int(seconds * 200)) / 200
    t200 = np.delete(t200, np.arange(30, 50))  # a 0.1 s dropout
    events = np.sort(rng.uniform(0, seconds, 5))
    events[2] = events[1]  # two events at one time
    base = 10_000 * e
    return {
        "obs.wrench": Stream(t1k, np.stack([base + np.arange(t1k.size) + j for j in range(6)], 1) * 1.0, rate=1000.0),
        "obs.imu": Stream(t200, np.stack([base + np.arange(t200.size)] * 3, 1).astype(np.float32), rate=200.0),
        "events": Stream(events, base + np.arange(events.size, dtype=np.int64)),
    }


def _episodes(name: str, lengths=LENGTHS, video: bool = True) -> tuple[list[Episode], dict]:
    rng = np.random.default_rng(3)
    episodes, source = [], {}
    for e, n in enumerate(lengths):
        source[e] = _streams(e, n, rng)
        videos = {CAM: CameraVideo(make_video(None, n, fps=FPS, height=32, width=32))} if video else {}
        table = make_episode_table(n, fps=FPS)
        episodes.append(Episode(source=name, episode_index=e, table=table, videos=videos, fps=FPS, streams=source[e]))
    return episodes, source


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mrviews") / "ds")
    episodes, source = _episodes("mv")
    manifest = convert([Source(name="mv", episodes=episodes, fps=FPS)], root, ConvertOptions(progress=False))
    return root, source, manifest


def _in_interval(stream: Stream, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The source's samples the reader puts in ``[lo, hi]`` (both ends widened by TOLERANCE_S)."""
    t = stream.timestamps
    inside = (t >= lo - TOLERANCE_S) & (t <= hi + TOLERANCE_S)
    width = int(np.prod(stream.values.shape[1:], dtype=np.int64))
    return t[inside], stream.values[inside].reshape(int(inside.sum()), width)


def _check_window(w, source, names) -> None:
    """``stream_samples(w)`` is every source sample of its interval, values as the reader gives them."""
    series = stream_samples(w)
    assert sorted(series) == sorted(names)
    e = int(w.sample["episode_index"])
    for name, (times, values) in series.items():
        lo, hi = w.streams[name]
        want_t, want_v = _in_interval(source[e][name], lo, hi)
        np.testing.assert_array_equal(times, want_t)
        stored = want_v.astype(np.float32) if want_v.dtype.kind == "f" else want_v  # floats read as float32
        np.testing.assert_array_equal(values, stored.astype(np.float64))


def test_preview_draws_every_stream_at_its_own_times_over_the_window(dataset, tmp_path):
    root, source, _ = dataset
    result = preview(root, str(tmp_path / "p.html"), windows=4, frames=3, span=10, action_horizon=4)
    assert len(result.shown) == 4
    wrench_counts = []
    for w in result.shown:
        t0 = float(np.float32(w.anchor / FPS))  # the anchor row's timestamp, as the table stores it
        assert w.t0 == t0
        # By default: every stream, over the window's rows in seconds (state 9 rows back, action 3 ahead).
        assert w.streams == {name: (t0 - 9 / FPS, t0 + 3 / FPS) for name in STREAMS}
        _check_window(w, source, STREAMS)
        wrench_counts.append(stream_samples(w)["obs.wrench"][0].size)
    assert max(wrench_counts) > 300  # 0.4 s at 1 kHz: every sample, not one per row
    page = Path(result.html).read_text(encoding="utf-8")
    assert "Streams at their own rate" in page and "obs.wrench [-0.3, 0.1] s" in page
    # The sheet grows a plot per stream.
    plain = preview(root, str(tmp_path / "q.html"), windows=1, frames=3, span=10, action_horizon=4, streams=[])
    assert plain.shown[0].streams == {} and stream_samples(plain.shown[0]) == {}
    assert os.path.getsize(plain.sheets[0]) < os.path.getsize(result.sheets[0])


def test_preview_draws_the_streams_chosen(dataset, tmp_path, capsys):
    root, source, _ = dataset
    result = preview(root, str(tmp_path / "p.html"), windows=2, frames=2, span=4, streams=["obs.imu"])
    for w in result.shown:
        assert list(w.streams) == ["obs.imu"]
        _check_window(w, source, ["obs.imu"])
    with pytest.raises(ValueError, match=r"--streams names \['nope'\]; the dataset has streams \['events', 'obs.imu'"):
        preview(root, str(tmp_path / "x.html"), windows=1, streams=["nope"])
    argv = ["preview", root, "--windows", "2", "--frames", "2", "--span", "4", "--out", str(tmp_path / "c.html")]
    assert cli([*argv, "--streams", "obs.wrench,events"]) == 0
    assert "2 windows of" in capsys.readouterr().out
    assert cli([*argv, "--streams", "nope"]) == 2
    assert capsys.readouterr().err.endswith(f"--streams names ['nope']; the dataset has streams {STREAMS}\n")


def test_a_training_windows_streams_are_drawn_as_it_reads_them(dataset, tmp_path):
    from epishard.stream import WindowSpec, at, span

    root, source, _ = dataset
    spec = WindowSpec(cameras={CAM: (0,)}, streams={"obs.wrench": span(-0.05, 0.0), "obs.imu": at([-0.1, 0.0])})
    result = preview(root, str(tmp_path / "p.html"), windows=2, spec=spec, streams=["obs.wrench", "events"])
    for w in result.shown:
        assert w.streams["obs.wrench"] == (w.t0 - 0.05, w.t0)  # the spec's own read
        assert w.streams["events"] == (w.t0, w.t0)  # the window's rows: the anchor's only
        assert "obs.imu" not in w.streams and "obs.imu" not in w.sample
        _check_window(w, source, ["obs.wrench", "events"])


def _rerun_columns(rrd: str) -> dict[str, list[tuple[int, int, float]]]:
    """Entity path -> ``(window, time in ns, value)`` of every scalar in the recording."""
    from rerun.chunk import RrdReader

    out: dict[str, list] = {}
    for chunk in RrdReader(rrd).stream().to_chunks():
        batch = chunk.to_record_batch()
        names = batch.schema.names
        if "time" not in names or not any(n.endswith("Scalars:scalars") for n in names):
            continue
        scalars = batch.column(names[[n.endswith("Scalars:scalars") for n in names].index(True)]).to_pylist()
        times = batch.column("time").cast("int64").to_pylist()
        for n, t, v in zip(batch.column("window").to_pylist(), times, scalars, strict=True):
            out.setdefault(chunk.entity_path, []).append((n, t, v[0]))
    return out


def test_the_rerun_recording_holds_each_streams_samples_at_their_own_times(dataset, tmp_path):
    pytest.importorskip("rerun")
    from rerun.chunk import RrdReader

    from epishard.stream.report import stream_spec

    root, source, _ = dataset
    spec = stream_spec([CAM], frames=3, span=7, action_horizon=4, state_history=2, boundary="pad")
    result = export_rerun(root, str(tmp_path / "w.rrd"), spec, windows=2)
    assert len(result.shown) == 2
    got = _rerun_columns(result.rrd)
    for name, width in (("obs.wrench", 6), ("obs.imu", 3), ("events", 1)):
        for j in range(width):
            want = []
            for n, w in enumerate(result.shown):
                _check_window(w, source, STREAMS)
                # The stream window's rows: state 1 back to frames 6 ahead, 1/30 s each.
                assert w.streams[name] == (w.t0 - 1 / FPS, w.t0 + 6 / FPS)
                times, values = stream_samples(w)[name]
                want += [(n, round(t * 1e9), v) for t, v in zip(times.tolist(), values[:, j].tolist(), strict=True)]
            assert sorted(got.get(f"/stream/{name}/{j}", [])) == sorted(want), (name, j)
    # 1 kHz: a thousand points per second of the window (7 rows = 0.233 s), at each sample's own time.
    per_window = [sum(1 for p in got["/stream/obs.wrench/0"] if p[0] == n) for n in range(2)]
    assert all(p >= 200 for p in per_window), per_window
    # The frames are on the same time timeline, at their rows' times.
    frames = {}
    for chunk in RrdReader(result.rrd).stream().to_chunks():
        if chunk.entity_path.startswith(f"/window/{CAM}/"):
            batch = chunk.to_record_batch()
            times = batch.column("time").cast("int64").to_pylist()
            for n, t in zip(batch.column("window").to_pylist(), times, strict=True):
                frames[(chunk.entity_path, n)] = t
    for n, w in enumerate(result.shown):
        for j, row in enumerate(w.rows[CAM].tolist()):
            assert frames[(f"/window/{CAM}/{j}", n)] == round((w.t0 + (row - w.anchor) / FPS) * 1e9)


def test_inspect_lists_each_stream_with_its_counts(dataset, capsys):
    root, source, manifest = dataset
    summary = describe(root)
    samples = {name: sum(source[e][name].timestamps.size for e in source) for name in STREAMS}
    assert {name: s["samples"] for name, s in summary["streams"].items()} == samples
    assert {name: s["episodes"] for name, s in summary["streams"].items()} == dict.fromkeys(STREAMS, 2)
    assert summary["streams"] == {name: entry.to_json() for name, entry in manifest.streams.items()}
    lines = render(summary).splitlines()
    wrench = manifest.streams["obs.wrench"]
    assert (
        f"  stream obs.wrench: float64 [6], 2 episodes, {samples['obs.wrench']:,} samples, {wrench.rate:.5g} Hz "
        "(nominal 1000 Hz), intervals 1.0-1.0 ms, 0 gaps"
    ) in lines
    imu = manifest.streams["obs.imu"]
    assert (
        f"  stream obs.imu: float32 [3], 2 episodes, {samples['obs.imu']:,} samples, {imu.rate:.5g} Hz "
        "(nominal 200 Hz), intervals 5.0-105.0 ms, 2 gaps"
    ) in lines
    events = manifest.streams["events"]  # no nominal rate; two events at one time
    assert (
        f"  stream events: int64 [], 2 episodes, 10 samples, {events.rate:.5g} Hz, "
        f"intervals 0.0-{events.max_interval * 1e3:.1f} ms, {events.gaps} gaps"
    ) in lines
    assert cli(["inspect", root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["streams"]["obs.wrench"]["samples"] == samples["obs.wrench"]
    assert cli(["inspect", root]) == 0
    assert "  stream obs.imu: float32 [3], 2 episodes" in capsys.readouterr().out


def test_verify_reads_every_stream_member(dataset):
    root = dataset[0]
    result = verify(root)
    assert result["ok"] and result["problems"] == [], result["problems"]


def _lying_dataset(tmp_path, monkeypatch) -> tuple[str, float]:
    """One episode whose ``obs.imu`` member has its last sample 0.5 s later than the index's facts say
    (the writer's facts and every sha256 from the bytes written): only reading the member finds it.
    Returns the dataset and the last sample's true time."""
    import epishard.shardwriter.streams as writer

    real, truth = writer.encode_stream, []

    def encode(times, values):
        if values.dtype == np.float32:  # obs.imu
            truth.append(float(times[-1]))
            times = times.copy()
            times[-1] += 0.5
        return real(times, values)

    monkeypatch.setattr(writer, "encode_stream", encode)
    root = str(tmp_path / "lying")
    episodes, _ = _episodes("ly", lengths=[9], video=False)
    convert([Source(name="ly", episodes=episodes, fps=FPS)], root, ConvertOptions(progress=False))
    monkeypatch.undo()
    return root, truth[0]


def test_verify_names_the_episode_and_stream_of_a_member_that_lies(tmp_path, monkeypatch):
    root, t_last = _lying_dataset(tmp_path, monkeypatch)
    result = verify(root)
    assert not result["ok"]
    member, stored = "ly-e000000.obs_imu.0.arrow", t_last + 0.5
    message = f"member {member}: its samples' t_last is {stored!r} s, the index says {t_last!r} s"
    assert result["problems"] == [
        {"shard": "shard-000000.tar", "episode": "ly-e000000", "stream": "obs.imu", "message": message}
    ]
    text = render_verification(result, root, 0.1)
    assert f"  shard=shard-000000.tar episode=ly-e000000 stream=obs.imu: {message}" in text.splitlines()
    assert text.endswith(f"{root}: 1 shards, 1 episodes, checked in 0.1 s: 1 problem(s)")


def test_verify_of_altered_stream_bytes_names_the_checksums_and_the_stream(dataset, tmp_path):
    """Bytes altered in place: the shard's and the member's sha256 differ (said first), and the member no
    longer reads as an Arrow file, named by episode and stream."""
    import shutil

    root = str(tmp_path / "ds")
    shutil.copytree(dataset[0], root)
    shard = os.path.join(root, "shard-000000.tar")
    with tarfile.open(shard) as tar:
        info = next(m for m in tar.getmembers() if m.name.endswith("e000001.obs_wrench.0.arrow"))
    with open(shard, "r+b") as f:
        f.seek(info.offset_data + info.size - 16)
        f.write(b"\0" * 16)  # the Arrow file's footer length and closing magic gone
    result = verify(root)
    messages = [(p.get("episode"), p.get("stream"), p["message"]) for p in result["problems"]]
    key = "mv-e000001"
    assert messages[0] == (None, None, "sha256 differs from the manifest")
    assert messages[1] == (key, None, f"member {info.name} sha256 differs from the index")
    assert messages[2][:2] == (key, "obs.wrench")
    assert messages[2][2].startswith(f"stream does not read: member {info.name}: not an Arrow IPC file: ")
    assert len(messages) == 3
