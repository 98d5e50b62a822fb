"""Metadata that disagrees with the rows: the rows win, the disagreement is reported, data is kept.

- v3.0 ``to_timestamp`` off by one frame (an inclusive end, or one frame long): every row converts
  with its frame and a ``segment_end_mismatch`` warning names the fault.
- Timestamps that reset or jump inside an episode (recording paused and resumed): recorded in the
  index as ``segment_starts``, reported, and no window crosses them (anchors and pad masks).
- Declared cameras without files: dropped with the expected path named; when none is left the
  dataset is refused unless state and action only are asked for.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from lerobotgen import write_v2, write_v3
from torchcodec.decoders import VideoDecoder
from videogen import decode_frame_number, make_episode_table, make_video

from epishard.balance.cost import window_features
from epishard.cli import main as cli
from epishard.format.manifest import Manifest
from epishard.shardwriter import (
    CameraVideo,
    ConversionError,
    ConvertOptions,
    Episode,
    Source,
    SourceError,
    WindowIndex,
    convert,
    verify,
)
from epishard.stream import WindowDataset, WindowSpec, World

FPS = 20
CAM = "observation.images.front"


def _opts(**kw) -> ConvertOptions:
    return ConvertOptions(progress=False, **kw)


def _decoded_rows(out, index: WindowIndex, episode: int, camera: int = 0) -> list[int]:
    """Frame number shown by every row of ``episode``, decoded from the shard."""
    shards = Manifest.load(Path(f"{out}/manifest.json").read_bytes(), "manifest.json").shards
    look = index.lookup(episode, np.arange(int(index.num_rows[episode])), camera=camera)
    with open(f"{out}/{shards[look.shard].shard}", "rb") as f:
        f.seek(look.offset)
        data = f.read(look.size)
    return [
        decode_frame_number(x) for x in VideoDecoder(data, seek_mode="exact").get_frames_at(look.frames.tolist()).data
    ]


# --- v3.0 to_timestamp ------------------------------------------------------------------------------

LENGTHS_V3 = [13, 17, 11, 15, 12]  # 3 episodes in file 0, 2 in file 1; none starts on a keyframe (gop 8)


@pytest.mark.parametrize("end_shift", [-1, 0, 1])
def test_to_timestamp_off_by_one_frame_keeps_every_row_and_warns(end_shift, tmp_path):
    write_v3(str(tmp_path / "src"), LENGTHS_V3, CAM, fps=FPS, per_file=3, end_shift=end_shift)
    manifest = convert([str(tmp_path / "src")], str(tmp_path / "out"), _opts(max_episodes_per_shard=2))
    assert manifest.totals.episodes == 5 and manifest.totals.rows == sum(LENGTHS_V3)
    index = WindowIndex.load_dataset(str(tmp_path / "out"))
    for e, n in enumerate(LENGTHS_V3):
        assert _decoded_rows(tmp_path / "out", index, e) == list(range(sum(LENGTHS_V3[:e]), sum(LENGTHS_V3[:e]) + n))
    report = manifest.report
    if end_shift == 0:
        assert report.warnings_by_kind == {}
    else:
        assert report.warnings_by_kind == {"segment_end_mismatch": 5}
        w = report.warnings[0]
        assert (w.episode, w.camera, w.row) == (0, CAM, LENGTHS_V3[0] - 1)
        assert "to_timestamp" in w.message and "1.00 frame(s)" in w.message
        assert ("inclusive" in w.message) == (end_shift < 0)
    assert verify(str(tmp_path / "out"))["ok"]


def test_to_timestamp_short_by_more_than_a_frame_is_refused(tmp_path):
    write_v3(str(tmp_path / "src"), LENGTHS_V3, CAM, fps=FPS, per_file=3, end_shift=-2)
    with pytest.raises(ConversionError) as info:
        convert([str(tmp_path / "src")], str(tmp_path / "out"), _opts())
    err = info.value
    assert (err.kind, err.episode, err.camera, err.row) == ("frames_past_end", 0, CAM, LENGTHS_V3[0] - 1)
    assert "to_timestamp" in str(err)


def test_to_timestamp_mismatch_stops_with_timestamps_fail(tmp_path):
    write_v3(str(tmp_path / "src"), LENGTHS_V3, CAM, fps=FPS, per_file=3, end_shift=-1)
    with pytest.raises(ConversionError, match=r"\[segment_end_mismatch\] dataset=src episode=0 camera=observation"):
        convert([str(tmp_path / "src")], str(tmp_path / "out"), _opts(timestamps="raise"))


# --- discontinuities --------------------------------------------------------------------------------

ROWS = 60
RESET, JUMP = 20, 35  # row 20: timestamps restart at 0; row 35: they skip 10 frame periods
BREAK_SEGMENTS = [(0, 20), (20, 35), (35, 60)]


def _break_timestamps() -> np.ndarray:
    t = np.arange(ROWS, dtype=np.float64) / FPS
    t[RESET:] -= RESET / FPS
    t[JUMP:] += 9 / FPS
    return t


def _with_timestamps(t) -> pa.Table:
    table = make_episode_table(len(t), fps=FPS)
    return table.set_column(table.column_names.index("timestamp"), "timestamp", pa.array(np.asarray(t, np.float32)))


def _episodes(timestamps: dict[int, np.ndarray]) -> list[Episode]:
    out = []
    for e in range(3):
        t = timestamps.get(e, np.arange(ROWS) / FPS)
        video = make_video(None, ROWS, fps=FPS, height=32, width=32, gop=8, start_number=1000 * e)
        out.append(
            Episode(
                source="rec",
                episode_index=e,
                table=_with_timestamps(t),
                fps=FPS,
                videos={CAM: CameraVideo(video)},
                tasks=("fold",),
            )
        )
    return out


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """Episode 1 has a reset and a jump; episodes 0 and 2 are continuous."""
    out = tmp_path_factory.mktemp("breaks")
    manifest = convert(
        [Source(name="rec", episodes=_episodes({1: _break_timestamps()}), fps=FPS)],
        str(out),
        _opts(max_episodes_per_shard=2),
    )
    return str(out), manifest


def test_breaks_are_reported_and_indexed(broken):
    out, manifest = broken
    report = manifest.report
    assert report.warnings_by_kind == {"timestamps_jump": 1, "timestamps_reset": 1}
    assert [(w.episode, w.row, w.camera) for w in report.warnings] == [(1, RESET, None), (1, JUMP, None)]
    assert "skips 10.0 frame periods" in report.warnings[1].message
    index = WindowIndex.load_dataset(out)
    assert [index.row(e)["segment_starts"] for e in range(index.num_episodes)] == [[], [RESET, JUMP], []]
    lo, hi = index.segment_bounds(1, np.arange(ROWS))
    want = np.concatenate([[(a, b)] * (b - a) for a, b in BREAK_SEGMENTS])
    assert lo.tolist() == want[:, 0].tolist() and hi.tolist() == want[:, 1].tolist()
    # Frames are untouched: rows still show their frames.
    assert _decoded_rows(out, index, 1) == list(range(1000, 1000 + ROWS))
    assert verify(out)["ok"]


@pytest.mark.parametrize(
    "t, kind, row",
    [
        (_break_timestamps(), "timestamps_reset", RESET),
        (np.r_[np.arange(30), np.arange(40, 70)] / FPS, "timestamps_jump", 30),
        (np.r_[np.arange(30), np.arange(25, 55)] / FPS, "timestamps_non_monotonic", 30),
    ],
)
def test_timestamps_fail_stops_at_a_break(t, kind, row, tmp_path):
    with pytest.raises(ConversionError) as info:
        convert([Source(name="rec", episodes=_episodes({2: t}), fps=FPS)], str(tmp_path), _opts(timestamps="raise"))
    err = info.value
    assert (err.kind, err.dataset, err.episode, err.row) == (kind, "rec", 2, row)
    assert f"dataset=rec episode=2 row={row}" in str(err)


def test_jitter_and_one_dropped_frame_are_not_breaks(tmp_path):
    rng = np.random.default_rng(0)
    jitter = np.cumsum(np.r_[0, rng.uniform(0.9, 1.3, ROWS - 1)]) / FPS  # wall-clock stamps
    dropped = np.r_[np.arange(30), np.arange(31, 61)] / FPS  # one frame period missing: a step of 2
    manifest = convert(
        [Source(name="rec", episodes=_episodes({0: jitter, 1: dropped}), fps=FPS)], str(tmp_path), _opts()
    )
    kinds = manifest.report.warnings_by_kind
    assert not {"timestamps_jump", "timestamps_reset", "timestamps_non_monotonic"} & set(kinds)
    assert WindowIndex.load_dataset(str(tmp_path)).segment_starts.size == 0


def test_a_steady_other_rate_or_unit_is_not_a_break_but_a_pause_in_it_is(tmp_path):
    millis = np.arange(ROWS) * (1000.0 / FPS)  # milliseconds: every step is 1000 frame periods
    paused = np.r_[np.arange(30), np.arange(40, 70)] * (1000.0 / FPS)  # the same, paused at row 30
    slow = np.arange(ROWS) / (FPS / 3)  # one row every 3 frame periods (stamps at a third of the rate)
    constant = np.zeros(ROWS)  # a column that never advances
    manifest = convert(
        [
            Source(name="rec", episodes=_episodes({0: millis, 1: paused, 2: slow}), fps=FPS),
            Source(name="flat", episodes=_episodes({0: constant})[:1], fps=FPS),
        ],
        str(tmp_path),
        _opts(),
    )
    report = manifest.report
    assert [(w.dataset, w.episode, w.row) for w in report.warnings if w.kind == "timestamps_jump"] == [("rec", 1, 30)]
    # The disagreement with the video is reported instead (rec 1's too, before its pause).
    assert sorted((w.dataset, w.episode, w.kind) for w in report.warnings if w.kind != "timestamps_jump") == [
        ("flat", 0, "timestamps_rate"),
        ("rec", 0, "timestamps_past_end"),
        ("rec", 1, "timestamps_past_end"),
        ("rec", 2, "timestamps_past_end"),
    ]
    index = WindowIndex.load_dataset(str(tmp_path))
    assert [index.row(e)["segment_starts"] for e in range(index.num_episodes)] == [[], [30], [], []]
    # Every row still anchors a window, and shows its own frame.
    ds = WindowDataset(str(tmp_path), WindowSpec(cameras={CAM: (-1, 0)}, action_horizon=1), shuffle=0)
    got = sorted(
        (s["dataset"], int(s["episode_index"]), int(s["frame_index"]), decode_frame_number(s[CAM][1])) for s in ds
    )
    assert len(got) == 4 * (ROWS - 1) - 1
    assert all(frame == 1000 * e + a for _, e, a, frame in got)


OFFSETS = (-4, 0, 4)
SPEC_KW = dict(cameras={CAM: OFFSETS}, state_offsets=(-1, 0), action_horizon=3)


def _spec(boundary: str) -> WindowSpec:
    return WindowSpec(boundary=boundary, **SPEC_KW)


def _planned(ds: WindowDataset) -> set[tuple[int, int]]:
    plan = ds.plan(0, World())
    return set(zip(plan.episode.tolist(), plan.anchor.tolist(), strict=False))


def test_inside_windows_never_cross_a_break(broken):
    out, _ = broken
    ds = WindowDataset(out, _spec("inside"), seed=0, shuffle=0)
    # Window rows span anchor-4 .. anchor+4: anchors keep 4 rows from every segment edge.

    def inside(a: int, b: int) -> list[int]:
        return list(range(a + 4, b - 4))

    want = {(e, a) for e in (0, 2) for a in inside(0, ROWS)}
    want |= {(1, a) for lo, hi in BREAK_SEGMENTS for a in inside(lo, hi)}
    assert _planned(ds) == want and len(ds) == len(want)
    got = set()
    for s in ds:
        e, a = int(s["episode_index"]), int(s["frame_index"])
        got.add((e, a))
        assert [decode_frame_number(f) for f in s[CAM]] == [1000 * e + a + o for o in OFFSETS]
        assert not s[f"{CAM}_is_pad"].any() and not s["action_is_pad"].any()
    assert got == want


def test_pad_windows_are_padded_at_a_break_like_at_an_episode_edge(broken):
    out, _ = broken
    ds = WindowDataset(out, _spec("pad"), seed=0, shuffle=0)
    assert _planned(ds) == {(e, a) for e in range(3) for a in range(ROWS)}
    seen = 0
    for s in ds:
        e, a = int(s["episode_index"]), int(s["frame_index"])
        lo, hi = next((lo, hi) for lo, hi in BREAK_SEGMENTS if lo <= a < hi) if e == 1 else (0, ROWS)
        for key, offsets in ((CAM, OFFSETS), ("observation.state", (-1, 0)), ("action", (0, 1, 2))):
            rows = a + np.asarray(offsets)
            assert s[f"{key}_is_pad"].tolist() == ((rows < lo) | (rows >= hi)).tolist(), (key, e, a)
        rows = np.clip(a + np.asarray(OFFSETS), lo, hi - 1)
        assert [decode_frame_number(f) for f in s[CAM]] == (1000 * e + rows).tolist(), (e, a)
        assert s["action"][:, 0].tolist() == (np.clip(a + np.arange(3), lo, hi - 1) + 0.5).tolist()
        seen += 1
    assert seen == 3 * ROWS
    # The cost model clamps rows the way the reader does: anchor 19's row 23 is row 19.
    index = WindowIndex.load_dataset(out)
    spec = _spec("pad")
    at_break = window_features(index, spec, np.array([1]), np.array([19])).decoded
    continuous = window_features(index, spec, np.array([0]), np.array([19])).decoded
    assert at_break.tolist() == [19 - 8 + 1] and continuous.tolist() == [23 - 8 + 1]


# --- missing cameras --------------------------------------------------------------------------------

WRIST = "observation.images.wrist"


def test_one_camera_without_files_is_dropped_naming_the_expected_path(tmp_path):
    write_v2(str(tmp_path / "src"), [12, 9], [CAM], declared=[CAM, WRIST], fps=FPS)
    manifest = convert([str(tmp_path / "src")], str(tmp_path / "out"), _opts())
    assert list(manifest.cameras) == [CAM]
    notes = list(manifest.sources[0].notes)
    assert notes == [
        f"camera {WRIST} is declared in meta/info.json but has no video files "
        f"(expected e.g. videos/chunk-000/{WRIST}/episode_000000.mp4, from video_path)"
    ]
    index = WindowIndex.load_dataset(str(tmp_path / "out"))
    assert _decoded_rows(tmp_path / "out", index, 1) == list(range(1000, 1009))


def test_v3_camera_without_files_is_dropped_naming_the_expected_path(tmp_path):
    write_v3(str(tmp_path / "src"), [12, 9, 10], CAM, fps=FPS, per_file=2, absent=(WRIST,))
    manifest = convert([str(tmp_path / "src")], str(tmp_path / "out"), _opts())
    assert list(manifest.cameras) == [CAM] and manifest.totals.rows == 31
    assert list(manifest.sources[0].notes) == [
        f"camera {WRIST} is declared in meta/info.json but has no video files "
        f"(expected e.g. videos/{WRIST}/chunk-000/file-000.mp4, from video_path)"
    ]
    index = WindowIndex.load_dataset(str(tmp_path / "out"))
    assert _decoded_rows(tmp_path / "out", index, 2) == list(range(21, 31))


def test_no_camera_with_files_is_refused_naming_path_and_look_alike(tmp_path, capsys):
    src = str(tmp_path / "src")
    write_v2(src, [12, 9], [CAM, WRIST], fps=FPS, video_dir="video")  # videos/ misspelt
    with pytest.raises(SourceError) as info:
        convert([src], str(tmp_path / "out"), _opts())
    message = str(info.value)
    for cam in (CAM, WRIST):
        assert f"expected e.g. videos/chunk-000/{cam}/episode_000000.mp4" in message
    assert "video/ exists and looks like the intended folder" in message and "--no-cameras" in message
    assert (
        cli(["convert", src, str(tmp_path / "out"), "--quiet"]) == 2
    )  # an error (1 is for a verify that found damage)
    assert "no declared camera has video files" in capsys.readouterr().err


def test_no_cameras_option_converts_state_and_action_only(tmp_path, capsys):
    src = str(tmp_path / "src")
    write_v2(src, [12, 9], [CAM], declared=[CAM, WRIST], fps=FPS, video_dir="video")
    assert cli(["convert", src, str(tmp_path / "out"), "--quiet", "--no-cameras"]) == 0
    assert "not converted: state and action only" in capsys.readouterr().out
    index = WindowIndex.load_dataset(str(tmp_path / "out"))
    assert index.num_episodes == 2 and index.cam_names.to_pylist() == [] and index.num_rows.tolist() == [12, 9]
    ds = WindowDataset(str(tmp_path / "out"), WindowSpec(cameras={}, action_horizon=2), shuffle=0)
    rows = sorted((int(s["episode_index"]), float(s["observation.state"][0, 0])) for s in ds)
    assert rows == [(0, float(r)) for r in range(11)] + [(1, float(r)) for r in range(8)]
