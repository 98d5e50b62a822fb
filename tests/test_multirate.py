"""Streams at their own rate (format version 3): every window's samples against a brute-force reading of the source.

Generated episodes carry streams at 30, 200 (jittered, with a dropout) and 1,000 Hz and an
irregular event stream, each sample holding its own sample number, beside a 30 fps camera whose
frames show their frame number. Each window's samples must be exactly the source's samples in
that interval (no sample outside, none missing), with exact masks at the episode edges, the same
across ranks, workers and a resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest
import torch
from videogen import decode_frame_number, make_episode_table, make_video

from epishard.format.errors import FormatError
from epishard.shardwriter import CameraVideo, ConversionError, ConvertOptions, Episode, Source, Stream, convert
from epishard.stream import Ranks, WindowDataset, WindowLoader, WindowSpec, at, span
from epishard.stream.multirate import TOLERANCE_S

FPS = 30
CAM = "observation.images.front"
LENGTHS = [45, 30, 60]


def _streams(e: int, n: int, rng: np.random.Generator) -> dict[str, Stream]:
    """Episode ``e``'s streams (``n`` rows at ``FPS``): values are ``1000 * e + sample number`` (scaled per stream)."""
    seconds = n / FPS
    t30 = -0.2 + np.arange(int((seconds + 0.4) * 30)) / 30  # starts before the first row, ends after the last
    t200 = np.arange(int(seconds * 200)) / 200 + rng.uniform(-1e-4, 1e-4, int(seconds * 200))
    t200 = np.sort(np.delete(t200, np.arange(40, 60)))  # a 0.1 s dropout
    t1k = 0.0005 + np.arange(int(seconds * 1000)) / 1000
    events = np.sort(rng.uniform(0, seconds, 7))
    events[3] = events[2]  # two events at one time
    base = 100_000 * e
    return {
        "obs.s30": Stream(t30, (base + np.arange(t30.size)).astype(np.int32), rate=30.0),
        "obs.s200": Stream(t200, np.stack([base + np.arange(t200.size)] * 3, axis=1).astype(np.float32), rate=200.0),
        "obs.wrench": Stream(t1k, np.stack([base + np.arange(t1k.size)] * 6, axis=1).astype(np.float64), rate=1000.0),
        "events": Stream(events, base + np.arange(events.size, dtype=np.int64)),
    }


def _episodes(name: str = "mr", streams: bool = True) -> tuple[list[Episode], dict]:
    rng = np.random.default_rng(7)
    episodes, source = [], {}
    for e, n in enumerate(LENGTHS):
        own = _streams(e, n, rng) if streams else {}
        source[e] = own
        episodes.append(
            Episode(
                source=name,
                episode_index=e,
                table=make_episode_table(n, fps=FPS),
                videos={CAM: CameraVideo(make_video(None, n, fps=FPS, start_number=1000 * e, height=32, width=32))},
                fps=FPS,
                streams=own,
            )
        )
    return episodes, source


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("multirate") / "ds")
    episodes, source = _episodes()
    manifest = convert([Source(name="mr", episodes=episodes, fps=FPS)], root, ConvertOptions(progress=False))
    return root, source, manifest


SPEC = {
    "obs.wrench": span(-0.1, 0.0),
    "obs.s200": span(-0.05, 0.05),
    "obs.s30": at([-0.1, 0.0, 0.05], "previous"),
    "events": span(-0.5, 0.5, max_samples=8),
}


def _spec(streams=None) -> WindowSpec:
    return WindowSpec(cameras={CAM: (0,)}, streams=SPEC if streams is None else streams, boundary="pad")


def _expected_span(stream: Stream, t0: float, start: float, stop: float):
    t = stream.timestamps
    inside = (t >= t0 + start - TOLERANCE_S) & (t <= t0 + stop + TOLERANCE_S)
    return stream.values[inside], t[inside]


def _check_sample(sample: dict, source: dict) -> None:
    e, frame = int(sample["episode_index"]), int(sample["frame_index"])
    assert decode_frame_number(sample[CAM][0]) == 1000 * e + frame  # the camera's frame is the anchor's
    t0 = float(np.float32(frame / FPS))  # the anchor row's timestamp as the table stores it (float32)
    assert sample["timestamp"] == pytest.approx(t0, abs=0)
    own = source[e]
    for name, read in SPEC.items():
        values, stamps, pad = (
            sample[name].numpy(),
            sample[f"{name}_timestamp"].numpy(),
            sample[f"{name}_is_pad"].numpy(),
        )
        if hasattr(read, "start"):
            want, want_t = _expected_span(own[name], t0, read.start, read.stop)
            k = want_t.size
            assert k >= 1 or name == "events" or frame == 0  # (at t0 = 0 no wrench sample yet)
            assert pad.tolist() == [False] * k + [True] * (pad.size - k), (name, e, frame)
            np.testing.assert_array_equal(values[:k], want.astype(values.dtype).reshape(values[:k].shape))
            np.testing.assert_array_equal(stamps[:k], want_t)
            assert not values[k:].any()
        else:
            t = own[name].timestamps
            for j, dt in enumerate(read.times):
                i = int(np.searchsorted(t, t0 + dt + TOLERANCE_S, side="right")) - 1
                assert pad[j] == (i < 0), (name, e, frame, dt)
                assert values[j] == own[name].values[max(i, 0)]
                assert stamps[j] == t[max(i, 0)]


def test_every_window_holds_exactly_the_source_samples_of_its_interval(dataset):
    root, source, _ = dataset
    samples = list(WindowDataset(root, _spec(), shuffle=None))
    assert len(samples) == sum(LENGTHS)
    for sample in samples:
        _check_sample(sample, source)
    # The edges: the first window of an episode reaches before every wrench sample but one ...
    first = next(s for s in samples if s["episode_index"] == 0 and s["frame_index"] == 0)
    assert first["obs.wrench_is_pad"].logical_not().sum() == 0  # 0.0005 s is after t0 = 0: nothing in [-0.1, 0]
    second = next(s for s in samples if s["episode_index"] == 0 and s["frame_index"] == 1)
    # t0 = 1/30 s: samples at 0.0005 .. 0.0325 s, 33 of them
    assert int((~second["obs.wrench_is_pad"]).sum()) == 33
    # ... and the 30 Hz stream's samples before the first row are real data, not padding.
    assert not first["obs.s30_is_pad"].any()
    # The dropout of the 200 Hz stream shows as fewer samples, never as invented ones.
    counts = {int((~s["obs.s200_is_pad"]).sum()) for s in samples}
    assert min(counts) < 15 < max(counts)


def test_the_padded_length_is_bounded_from_the_index(dataset):
    root = dataset[0]
    ds = WindowDataset(root, _spec(), shuffle=None)
    sample = next(iter(ds))
    # 0.1 s at 1 kHz: floor((0.1 + 2e-6) / min_interval) + 1 = 101 (the stream's smallest gap is 1 ms).
    assert sample["obs.wrench"].shape == (101, 6)
    assert sample["obs.wrench"].dtype == torch.float32 and sample["obs.s30"].dtype == torch.int64
    assert sample["obs.s200"].shape[0] >= max(int((~s["obs.s200_is_pad"]).sum()) for s in ds)
    assert sample["events"].shape == (8,)


def test_a_span_over_samples_sharing_a_time_needs_max_samples(dataset):
    root, _, _ = dataset
    with pytest.raises(ValueError, match=r"stream 'events' has samples sharing a time.*max_samples=N"):
        WindowDataset(root, _spec({"events": span(-0.5, 0.5)}))
    with pytest.raises(ValueError, match=r"holds \d+ samples, more than the 1 it is padded to"):
        list(WindowDataset(root, _spec({"events": span(-5.0, 5.0, max_samples=1)}), shuffle=None))


def test_values_at_chosen_times_previous_nearest_linear(dataset):
    root, source, _ = dataset
    times = [-0.0503, -0.0002, 0.0, 0.0251, 0.5]
    spec = _spec(
        {
            "obs.wrench": at(times, "linear"),
            "obs.s200": at(times, "nearest"),
            "obs.s30": at(times, "previous"),
        }
    )
    for sample in WindowDataset(root, spec, shuffle=None):
        e, frame = int(sample["episode_index"]), int(sample["frame_index"])
        t0 = float(np.float32(frame / FPS))
        q = t0 + np.asarray(times)
        wrench = source[e]["obs.wrench"]
        t = wrench.timestamps
        want = np.stack([np.interp(q, t, wrench.values[:, d]) for d in range(6)], axis=1)
        np.testing.assert_allclose(sample["obs.wrench"].numpy(), want, rtol=1e-6)
        assert sample["obs.wrench_is_pad"].tolist() == ((q < t[0] - TOLERANCE_S) | (q > t[-1] + TOLERANCE_S)).tolist()
        s200 = source[e]["obs.s200"]
        t = s200.timestamps
        nearest = [int(np.argmin(np.abs(t - x))) for x in q]  # argmin: the earlier on a tie
        np.testing.assert_array_equal(sample["obs.s200"].numpy(), s200.values[nearest])
        np.testing.assert_array_equal(sample["obs.s200_timestamp"].numpy(), t[nearest])
        assert sample["obs.s200_is_pad"].tolist() == ((q < t[0] - TOLERANCE_S) | (q > t[-1] + TOLERANCE_S)).tolist()
        s30 = source[e]["obs.s30"]
        previous = np.searchsorted(s30.timestamps, q + TOLERANCE_S, side="right") - 1
        assert sample["obs.s30_is_pad"].tolist() == (previous < 0).tolist()
        np.testing.assert_array_equal(sample["obs.s30"].numpy(), s30.values[np.clip(previous, 0, None)])


def _key(sample) -> tuple[int, int]:
    return int(sample["episode_index"]), int(sample["frame_index"])


def test_ranks_workers_and_resume_give_the_same_stream_windows(dataset):
    root = dataset[0]
    whole = {_key(s): s for s in WindowDataset(root, _spec(), shuffle=None)}
    seen: dict = {}
    for rank in range(2):
        ds = WindowDataset(root, _spec(), seed=3, ranks=Ranks(rank=rank, world_size=2, num_workers=2))
        for batch in WindowLoader(ds, batch_size=4, num_workers=2):
            for i in range(len(batch["episode_index"])):
                key = (int(batch["episode_index"][i]), int(batch["frame_index"][i]))
                assert key not in seen
                seen[key] = {k: batch[k][i] for k in batch if k.startswith(tuple(SPEC))}
    assert set(seen) <= set(whole) and len(seen) >= len(whole) - 4  # equal per-rank counts drop at most a few
    for key, got in seen.items():
        for name, value in got.items():
            torch.testing.assert_close(value, whole[key][name], rtol=0, atol=0)
    # Resume mid-epoch: the rest of the epoch equals the uninterrupted run's rest, streams included.
    ds = WindowDataset(root, _spec(), seed=5)
    run = iter(ds)
    before = [next(run) for _ in range(20)]
    state = ds.state_dict()
    rest = list(run)
    again = WindowDataset(root, _spec(), seed=5)
    again.load_state_dict(state)
    resumed = list(again)
    assert [_key(s) for s in resumed] == [_key(s) for s in rest] and len(before) + len(rest) == len(whole)
    for a, b in zip(resumed, rest, strict=True):
        for name in SPEC:
            for suffix in ("", "_timestamp", "_is_pad"):
                torch.testing.assert_close(a[name + suffix], b[name + suffix], rtol=0, atol=0)


def test_the_manifest_and_index_state_each_stream(dataset):
    root, source, manifest = dataset
    assert manifest.format_version == 3
    samples = {name: sum(source[e][name].timestamps.size for e in source) for name in SPEC}
    assert {name: entry.samples for name, entry in manifest.streams.items()} == samples
    wrench = manifest.streams["obs.wrench"]
    assert wrench.dtype == "float64" and wrench.shape == (6,) and wrench.nominal_rate == 1000.0
    assert wrench.rate == pytest.approx(1000.0) and wrench.gaps == 0
    assert manifest.streams["obs.s200"].gaps == len(LENGTHS)  # one dropout per episode
    assert manifest.streams["events"].min_interval == 0.0
    on_disk = json.loads(Path(root, "manifest.json").read_text())
    assert on_disk["format_version"] == 3 and set(on_disk["streams"]) == set(SPEC)
    table = feather.read_table(os.path.join(root, "index.arrow"))
    assert table.schema.metadata[b"epishard.format_version"] == b"3"
    row = table.column("streams")[0].as_py()
    assert [s["name"] for s in row] == sorted(SPEC) and all(s["count"] > 0 for s in row)


def test_a_dataset_without_streams_stays_version_2(tmp_path):
    episodes, _ = _episodes("plain", streams=False)
    manifest = convert(
        [Source(name="plain", episodes=episodes[:1], fps=FPS)], str(tmp_path), ConvertOptions(progress=False)
    )
    assert manifest.format_version == 2 and manifest.streams is None
    table = feather.read_table(str(tmp_path / "index.arrow"))
    assert "streams" not in table.column_names and table.schema.metadata[b"epishard.format_version"] == b"2"
    assert "streams" not in json.loads((tmp_path / "manifest.json").read_text())


def test_a_mix_pads_a_stream_a_dataset_lacks(dataset, tmp_path):
    root = dataset[0]
    episodes, _ = _episodes("plain", streams=False)
    plain = str(tmp_path / "plain")
    convert([Source(name="plain", episodes=episodes[:1], fps=FPS)], plain, ConvertOptions(progress=False))
    ds = WindowDataset([root, plain], _spec({"obs.wrench": span(-0.1, 0.0)}), shuffle=None)
    by_dataset = {}
    for sample in ds:
        by_dataset.setdefault(sample["dataset"], []).append(sample)
    assert all(s["obs.wrench_is_pad"].all() and not s["obs.wrench"].any() for s in by_dataset[1])
    assert any(not s["obs.wrench_is_pad"].all() for s in by_dataset[0])
    assert {tuple(s["obs.wrench"].shape) for s in ds} == {(101, 6)}


def test_delta_timestamps_read_streams_at_their_times(dataset):
    root = dataset[0]
    spec = WindowSpec.from_delta_timestamps(
        {"observation.state": [0.0], "obs.s200": [-0.05, 0.0]}, FPS, stream_keys=("obs.s200",)
    )
    assert spec.streams == {"obs.s200": at([-0.05, 0.0], "nearest")}
    assert "obs.s200" not in spec.column_offsets
    sample = next(iter(WindowDataset(root, spec, shuffle=None)))
    assert sample["obs.s200"].shape == (2, 3)


def _convert_one(tmp_path, streams: dict, episode_index: int = 0) -> None:
    """One episode of 10 rows, no camera, with ``streams``, converted with ``on_error="raise"``."""
    table = make_episode_table(10, fps=FPS)
    episode = Episode(source="bad", episode_index=episode_index, table=table, videos={}, fps=FPS, streams=streams)
    options = ConvertOptions(progress=False, on_error="raise")
    convert([Source(name="bad", episodes=[episode], fps=FPS)], str(tmp_path / "out"), options)


@pytest.mark.parametrize(
    "stream, kind, message",
    [
        (Stream(np.array([0.0, 0.2, 0.1]), np.zeros(3)), "bad_stream", "sample 2's timestamp 0.1 is before sample 1's"),
        (Stream(np.array([0.0, np.nan]), np.zeros(2)), "bad_stream", "sample 1's timestamp is nan"),
        (Stream(np.array([0.0, 0.1]), np.array([1.0, np.inf])), "nan", "sample 1 holds inf"),
        (Stream(np.array([0.0, 0.1]), np.zeros(3)), "bad_stream", "3 values for 2 timestamps"),
        (Stream(np.array([0.0, 0.1]), np.array(["a", "b"])), "bad_stream", "values of type <U1"),
        (Stream(np.array([0.0]), np.zeros(1), rate=-5.0), "bad_stream", "rate -5.0"),
    ],
)
def test_a_bad_stream_is_refused_naming_episode_and_stream(tmp_path, stream, kind, message):
    with pytest.raises(ConversionError, match=message) as info:
        _convert_one(tmp_path, {"obs.ft": stream}, episode_index=4)
    assert info.value.kind == kind and info.value.episode == 4 and "'obs.ft'" in str(info.value)


def test_a_stream_may_not_take_a_columns_name(tmp_path):
    stream = Stream(np.array([0.0, 0.1]), np.zeros((2, 4)))
    with pytest.raises(ConversionError, match="has the name of a table column or camera"):
        _convert_one(tmp_path, {"observation.state": stream})


def test_an_index_claiming_more_samples_than_its_member_holds_is_refused(dataset, tmp_path):

    root, _, _ = dataset
    copy = str(tmp_path / "ds")
    shutil.copytree(root, copy)
    path = os.path.join(copy, "index.arrow")
    table = feather.read_table(path)
    rows = table.column("streams").to_pylist()
    rows[0][0]["count"] = 10**12
    column = pa.array(rows, type=table.schema.field("streams").type)
    table = table.set_column(table.schema.get_field_index("streams"), "streams", column)
    feather.write_feather(table, path, compression="uncompressed")
    manifest = json.loads(Path(copy, "manifest.json").read_text())
    manifest["index"]["sha256"] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    Path(copy, "manifest.json").write_text(json.dumps(manifest))
    claims = r"stream events: count 1000000000000 claims more samples than its pieces. bytes can hold"
    with pytest.raises(FormatError, match=claims):
        WindowDataset(copy, _spec())


def test_the_lerobot_dropin_returns_streams_at_the_items_times(dataset):
    from epishard.stream.lerobot_dataset import EpishardLeRobotDataset

    root, source, _ = dataset
    deltas = [-0.0104, 0.0, 0.02]
    ds = EpishardLeRobotDataset(root, delta_timestamps={"obs.wrench": deltas})
    assert ds.meta.features["obs.wrench"]["shape"] == [6] and ds.meta.features["obs.s30"]["dtype"] == "int64"
    items = list(ds)
    assert len(items) == sum(LENGTHS)
    for item in items:
        e = int(item["episode_index"])
        q = float(item["timestamp"]) + np.asarray(deltas)
        wrench = source[e]["obs.wrench"]
        nearest = [int(np.argmin(np.abs(wrench.timestamps - x))) for x in q]
        np.testing.assert_array_equal(item["obs.wrench"].numpy(), wrench.values[nearest].astype(np.float32))
        edge = (q < wrench.timestamps[0] - TOLERANCE_S) | (q > wrench.timestamps[-1] + TOLERANCE_S)
        assert item["obs.wrench_is_pad"].tolist() == edge.tolist()
        s30 = source[e]["obs.s30"]  # not in delta_timestamps: the last sample at or before the item's time, 0-d
        t = float(item["timestamp"])
        previous = int(np.searchsorted(s30.timestamps, t + TOLERANCE_S, side="right")) - 1
        assert item["obs.s30"].shape == () and int(item["obs.s30"]) == s30.values[previous]
        assert item["obs.s30_is_pad"].shape == () and not bool(item["obs.s30_is_pad"])
        assert "obs.wrench_timestamp" not in item and "obs.s30_timestamp" not in item


def test_the_guides_end_to_end_example_runs(tmp_path, monkeypatch, capsys):
    import re

    page = (Path(__file__).parents[1] / "docs" / "guide" / "multirate.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/guide/multirate.md", "exec"), {"__name__": "guide"})
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("torch.Size")]
    assert printed == [
        "torch.Size([32, 501, 6])",
        "torch.Size([32, 501])",
        "torch.Size([32, 501])",
        "torch.Size([32, 1]) torch.Size([32, 1])",
    ]
    assert (tmp_path / "shards" / "rig" / "manifest.json").exists()


@pytest.fixture(scope="module")
def long_dataset(tmp_path_factory):
    """Two 40 s episodes: a 1 kHz float64 [6] wrench in pieces of about 64 kB, and 12 sparse events."""
    root = str(tmp_path_factory.mktemp("pieces") / "ds")
    rng = np.random.default_rng(3)
    n, source, episodes = 40 * FPS, {}, []
    for e in range(2):
        t = 0.0002 + np.arange(40_000) / 1000 + rng.uniform(-2e-5, 2e-5, 40_000)
        wrench = Stream(np.sort(t), np.stack([100_000 * e + np.arange(t.size)] * 6, axis=1).astype(np.float64))
        events = Stream(np.sort(rng.uniform(0, 40, 12)), 100 * e + np.arange(12, dtype=np.int64))
        source[e] = {"obs.wrench": wrench, "events": events}
        video = make_video(None, n, fps=FPS, start_number=0, height=32, width=32, gop=30)
        table = make_episode_table(n, fps=FPS)
        episodes.append(
            Episode(
                source="long",
                episode_index=e,
                table=table,
                videos={CAM: CameraVideo(video)},
                fps=FPS,
                streams=source[e],
            )
        )
    convert([Source(name="long", episodes=episodes, fps=FPS)], root, ConvertOptions(progress=False))
    return root, source


def test_a_long_stream_is_stored_in_pieces_and_windows_read_only_theirs(long_dataset):
    from epishard.shardwriter import WindowIndex
    from epishard.stream import Lookahead, ReadOptions

    root, source = long_dataset
    index = WindowIndex.load_dataset(root)
    wrench = index.signals(0)["obs.wrench"]
    members, starts, counts = index.signal_pieces(wrench)
    assert members.size > 20 and counts.sum() == 40_000 and starts[0] == 0
    streams = [m for e in range(2) for s in index.signals(e).values() for m in index.signal_pieces(s)[0].tolist()]
    stream_bytes = int(index.member_size[streams].sum())
    other_bytes = int(index.member_size.sum()) - stream_bytes  # tables and videos, whole
    spec = WindowSpec(
        cameras={CAM: (0,)},
        streams={"obs.wrench": span(-0.25, 0.0), "events": at([-3.0, 0.0], "previous")},
        per_episode_count=3,
    )
    read = ReadOptions(telemetry=True, lookahead=Lookahead(encoded_bytes=0))
    loader = WindowLoader(WindowDataset(root, spec, seed=1, shuffle="global", read=read), batch_size=1, num_workers=0)
    batches = list(loader)
    assert len(batches) == 6
    for b in batches:
        e, frame = int(b["episode_index"][0]), int(b["frame_index"][0])
        t0 = float(np.float32(frame / FPS))
        want, want_t = _expected_span(source[e]["obs.wrench"], t0, -0.25, 0.0)
        k = want_t.size
        assert k >= 240 and (~b["obs.wrench_is_pad"][0]).sum() == k
        np.testing.assert_array_equal(b["obs.wrench"][0, :k].numpy(), want.astype(np.float32))
        np.testing.assert_array_equal(b["obs.wrench_timestamp"][0, :k].numpy(), want_t)
        ev = source[e]["events"]
        previous = np.searchsorted(ev.timestamps, t0 + np.array([-3.0, 0.0]) + TOLERANCE_S, side="right") - 1
        assert b["events_is_pad"][0].tolist() == (previous < 0).tolist()
        np.testing.assert_array_equal(b["events"][0].numpy(), ev.values[np.clip(previous, 0, None)])
    from epishard.stream.telemetry import summarize

    fetched = summarize([batches[-1]["__telemetry__"]])["bytes_read"]
    # 6 windows, each load fetching the few pieces its windows reach: far less than the streams whole
    assert fetched - other_bytes < stream_bytes / 2, (fetched, other_bytes, stream_bytes)


def test_a_window_reaching_pieces_its_load_did_not_fetch_reads_them(long_dataset, monkeypatch):
    from epishard.stream import reader

    root, source = long_dataset

    def first_pieces_only(self, d, local, episode, chunk):
        ix = self.ctx.sources[d].index
        return [int(ix.signal_pieces(s)[0][0]) for s in ix.signals(local).values()]

    monkeypatch.setattr(reader.EpochReader, "_signal_pieces", first_pieces_only)
    spec = WindowSpec(cameras={CAM: (0,)}, streams={"obs.wrench": span(-0.25, 0.0)}, per_episode_count=4)
    samples = list(WindowDataset(root, spec, seed=2, shuffle=None))
    assert len(samples) == 8
    for sample in samples:
        e, frame = int(sample["episode_index"]), int(sample["frame_index"])
        want, want_t = _expected_span(source[e]["obs.wrench"], float(np.float32(frame / FPS)), -0.25, 0.0)
        k = want_t.size
        assert int((~sample["obs.wrench_is_pad"]).sum()) == k
        np.testing.assert_array_equal(sample["obs.wrench"][:k].numpy(), want.astype(np.float32))
        np.testing.assert_array_equal(sample["obs.wrench_timestamp"][:k].numpy(), want_t)
