"""Streams at their own rate at their edges: the cases an attack on them found, each held to the right behaviour.

Episodes without a stream beside ones with, a float32 row clock past 32 s, empty streams, uint64
values, hostile pieces (compressed, NaN, a shape too large), a clock that resets, reserved names,
NumPy numbers in a spec, and the LeRobot drop-in's reading of a stream at an item's time.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from faultgen import rewrite_index

from epishard.format.errors import FormatError
from epishard.format.streams import read_stream
from epishard.shardwriter import ConversionError, ConvertOptions, Episode, Source, Stream, convert
from epishard.stream import WindowDataset, WindowSpec, at, span

FPS = 30


def _table(n: int, float32: bool = False, times=None) -> pa.Table:
    t = np.arange(n) / FPS if times is None else times
    return pa.table(
        {
            "timestamp": pa.array(t.astype(np.float32) if float32 else t),
            "observation.state": pa.array(np.zeros(n, np.float32)),
        }
    )


def _convert(root, episodes: list[Episode], **options) -> None:
    convert([Source(name="s", episodes=episodes, fps=FPS)], str(root), ConvertOptions(progress=False, **options))


def _episode(e: int, streams: dict, n: int = 30, **kw) -> Episode:
    table = kw.pop("table", None) or _table(n)
    return Episode(source="s", episode_index=e, table=table, videos={}, fps=FPS, streams=streams, **kw)


def _spec(streams: dict) -> WindowSpec:
    return WindowSpec(state_key="observation.state", action_key=None, streams=streams)


def test_a_shard_mixing_episodes_with_and_without_streams_converts_and_pads(tmp_path):
    force = {"force": Stream(np.arange(30) / 30, np.arange(30, dtype=np.float32))}
    _convert(tmp_path / "ds", [_episode(0, force), _episode(1, {})])
    samples = list(WindowDataset(str(tmp_path / "ds"), _spec({"force": at([0.0], "previous")}), shuffle=None))
    by_episode = {}
    for s in samples:
        by_episode.setdefault(int(s["episode_index"]), []).append(s)
    assert all(bool(s["force_is_pad"].all()) and float(s["force"][0]) == 0 for s in by_episode[1])
    assert [float(s["force"][0]) for s in by_episode[0]] == list(range(30))


def test_a_float32_row_clock_past_32_s_keeps_the_sample_at_t0(tmp_path):
    n = FPS * 70  # to 70 s: the float32 spacing reaches 7.6 us, more than TOLERANCE_S
    stamps = np.arange(n * 10) / (10 * FPS)  # one sample exactly on every row's true time
    stream = {"s": Stream(stamps, np.arange(stamps.size, dtype=np.int64))}
    _convert(tmp_path / "ds", [_episode(0, stream, table=_table(n, float32=True))])
    spec = _spec({"s": at([0.0], "previous")})
    got = [int(s["s"][0]) for s in WindowDataset(str(tmp_path / "ds"), spec, shuffle=None)]
    assert got == [10 * i for i in range(n)]
    spans = WindowDataset(str(tmp_path / "ds"), _spec({"s": span(-0.1, 0.0)}), shuffle=None)
    assert {int((~s["s_is_pad"]).sum()) for s in spans if int(s["frame_index"]) >= FPS} == {31}


@pytest.mark.parametrize("shape", [(0,), (0, 6)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_an_empty_stream_converts_and_reads_as_padding(tmp_path, shape, dtype):
    _convert(tmp_path / "ds", [_episode(0, {"e": Stream(np.zeros(0), np.zeros(shape, dtype))})])
    sample = next(iter(WindowDataset(str(tmp_path / "ds"), _spec({"e": at([0.0], "previous")}))))
    assert bool(sample["e_is_pad"].all())


def test_uint64_above_int64s_range_is_refused_at_conversion(tmp_path):
    stream = {"id": Stream(np.arange(30) / 30, np.full(30, 2**63 + 5, np.uint64))}
    with pytest.raises(ConversionError, match=r"uint64 value above int64's range") as info:
        _convert(tmp_path / "ds", [_episode(0, stream)], on_error="raise")
    assert info.value.kind == "bad_stream"
    fine = {"id": Stream(np.arange(30) / 30, np.full(30, 2**62, np.uint64))}
    _convert(tmp_path / "ok", [_episode(0, fine)])
    sample = next(iter(WindowDataset(str(tmp_path / "ok"), _spec({"id": at([0.0], "previous")}))))
    assert int(sample["id"][0]) == 2**62


def _column(values: np.ndarray) -> pa.Table:
    """A piece's table: timestamps 0.1 s apart, scalar ``values``."""
    times = pa.array(np.arange(values.size) / 10)
    return pa.table({"timestamp": times, "value": pa.FixedSizeListArray.from_arrays(pa.array(values), 1)})


def _ipc(table: pa.Table, compression=None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def test_a_compressed_piece_is_refused_before_it_is_decompressed():
    big = pa.table({"timestamp": pa.array(np.zeros(2_000_000)), "value": _column(np.zeros(2_000_000))["value"]})
    bomb = _ipc(big, "zstd")  # 2 M zero rows compress to a few kB
    assert len(bomb) < 100_000
    with pytest.raises(FormatError, match=r"piece: compressed buffers \(the format stores pieces uncompressed\)"):
        read_stream(bomb, "float64", (), 30, "piece")
    plain = _ipc(_column(np.zeros(3)))
    with pytest.raises(FormatError, match=r"piece: 3 samples, the index says 2"):
        read_stream(plain, "float64", (), 2, "piece")


def test_a_piece_holding_nan_or_an_out_of_range_uint64_is_refused():
    nan = _ipc(_column(np.array([0.0, np.nan, 1.0])))
    with pytest.raises(FormatError, match=r"piece: sample 1 holds a value that is not finite"):
        read_stream(nan, "float64", (), 3, "piece")
    with pytest.raises(FormatError, match=r"piece: sample 1 holds a uint64 value above int64's range"):
        read_stream(_ipc(_column(np.array([0, 2**63 + 1, 1], np.uint64))), "uint64", (), 3, "piece")


def test_an_index_whose_shape_holds_too_many_values_is_refused_at_open(tmp_path):
    _convert(tmp_path / "ds", [_episode(0, {"f": Stream(np.arange(3) / 30, np.zeros(3, np.int16))})])

    def widen(rows):
        rows[0]["streams"][0].update(shape=[2**20, 2047], count=0)

    rewrite_index(str(tmp_path / "ds"), widen)
    with pytest.raises(FormatError, match=r"stream f: shape .* holds more than 2\*\*20 values per sample"):
        WindowDataset(str(tmp_path / "ds"), _spec({"f": at([0.0])}))


def test_a_row_clock_that_resets_refuses_streams(tmp_path):
    n = 60
    times = np.where(np.arange(n) < 30, np.arange(n) / 30, np.arange(n) / 30 - 1.0)
    stream = {"s": Stream(np.arange(0, 3, 0.01), np.arange(300))}
    with pytest.raises(ConversionError, match=r"the row clock goes back at row 30 .* a recording reset") as info:
        _convert(tmp_path / "ds", [_episode(0, stream, table=_table(n, times=times))], on_error="raise")
    assert (info.value.kind, info.value.row, info.value.episode) == ("bad_stream", 30, 0)


@pytest.mark.parametrize(
    "name, stream, message",
    [
        ("task", Stream(np.zeros(1), np.zeros(1)), "a key every sample has"),
        ("force_is_pad", Stream(np.zeros(1), np.zeros(1)), "a key every sample has, or one a window returns"),
        ("force", Stream(np.zeros(1), np.zeros(1), rate="30"), "rate '30' is not a positive number"),
    ],
)
def test_reserved_names_and_a_rate_that_is_no_number_are_refused(tmp_path, name, stream, message):
    with pytest.raises(ConversionError, match=message) as info:
        _convert(tmp_path / "ds", [_episode(0, {name: stream})], on_error="raise")
    assert info.value.kind == "bad_stream"


def test_numpy_numbers_make_a_spec():
    assert at(np.array([-0.1, 0.0], np.float32)).times == (pytest.approx(-0.1), 0.0)
    assert at([np.int64(0)]).times == (0.0,)
    assert span(np.float64(-0.5), 0, max_samples=np.int64(8)).max_samples == 8
    with pytest.raises(ValueError, match="max_samples must be an int >= 1"):
        span(-1, 0, max_samples=np.bool_(True))


def test_the_dropin_reads_a_stream_at_the_items_time_causally_with_a_pad_flag(tmp_path):
    from epishard.stream.lerobot_dataset import EpishardLeRobotDataset

    n = 60
    table = _table(n, float32=True).append_column("action", pa.array(np.zeros(n, np.float32)))
    command = {"cmd": Stream(np.array([1.5]), np.array([7]))}
    _convert(tmp_path / "ds", [_episode(0, command, table=table), _episode(1, {}, table=table)])
    for item in EpishardLeRobotDataset(str(tmp_path / "ds")):
        e, t = int(item["episode_index"]), float(item["timestamp"])
        assert item["cmd"].shape == () and item["cmd_is_pad"].shape == ()
        if e == 1 or t < 1.5 - 1e-6:  # no command yet (never a later one), or no such stream
            assert bool(item["cmd_is_pad"])
        else:
            assert int(item["cmd"]) == 7 and not bool(item["cmd_is_pad"])
