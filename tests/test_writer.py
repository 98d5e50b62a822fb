"""The writer on small generated inputs whose video frames carry their frame number in pixels."""

from __future__ import annotations

import glob
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torchcodec.decoders import VideoDecoder
from videogen import decode_frame_number, make_episode_table, make_video

from epishard.cli import main as cli
from epishard.shardwriter import (
    CameraVideo,
    ConversionError,
    ConvertOptions,
    Episode,
    ReencodeSpec,
    Source,
    SourceError,
    WindowIndex,
    convert,
    verify,
)

FPS = 20


def _episode(
    i: int,
    rows: int = 40,
    *,
    source: str = "synth",
    cameras=("observation.images.front",),
    table=None,
    video=None,
    codec="h264",
    gop=30,
) -> Episode:
    video = video if video is not None else make_video(None, rows, codec=codec, gop=gop, fps=FPS)
    return Episode(
        source=source,
        episode_index=i,
        table=table if table is not None else make_episode_table(rows, fps=FPS),
        videos={cam: CameraVideo(video) for cam in cameras},
        fps=FPS,
        tasks=(f"task {i % 2}",),
        robot="toy",
    )


def _source(episodes, name="synth") -> Source:
    return Source(name=name, episodes=episodes, fps=FPS)


def _files(out) -> dict[str, bytes]:
    return {os.path.basename(p): Path(p).read_bytes() for p in sorted(glob.glob(f"{out}/*"))}


def _opts(**kw) -> ConvertOptions:
    return ConvertOptions(progress=False, **{"max_episodes_per_shard": 2, **kw})


@pytest.fixture(scope="module")
def episodes():
    cams = ("observation.images.front", "observation.images.wrist")
    return [_episode(i, rows=30 + 7 * i, cameras=cams) for i in range(5)]


def test_same_input_gives_byte_identical_output(episodes, tmp_path):
    convert([_source(episodes)], str(tmp_path / "a"), _opts())
    convert([_source(episodes)], str(tmp_path / "b"), _opts(workers=2))
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert list(a) == list(b) and len(a) == 3 * 2 + 2  # shards, shard indexes, index.arrow, manifest
    assert a == b


def test_index_offsets_match_tarfile(episodes, tmp_path):
    manifest = convert([_source(episodes)], str(tmp_path), _opts())
    for shard in manifest.shards:
        rows = pq.read_table(tmp_path / shard.index).to_pylist()
        with tarfile.open(tmp_path / shard.shard) as tar, open(tmp_path / shard.shard, "rb") as raw:
            names = [m.name for m in tar.getmembers()]
            assert names == [m["name"] for row in rows for m in row["members"]]  # contiguous, in index order
            for row in rows:
                for m in row["members"]:
                    raw.seek(m["offset"])
                    assert raw.read(m["size"]) == tar.extractfile(m["name"]).read()


def test_decoded_frame_numbers_follow_row_to_frame(tmp_path):
    rows = 45
    table = make_episode_table(rows, fps=FPS, start_frame=3)  # rows show video frames 3..47
    ep = _episode(0, table=table, video=make_video(None, 50, gop=10, fps=FPS))
    manifest = convert([_source([ep])], str(tmp_path), _opts())
    index = WindowIndex.load([tmp_path / manifest.shards[0].index])
    look = index.lookup(0, np.arange(rows), camera=0)
    with open(tmp_path / manifest.shards[0].shard, "rb") as f:
        f.seek(look.offset)
        data = f.read(look.size)
    frames = VideoDecoder(data).get_frames_at(look.frames.tolist()).data
    assert [decode_frame_number(x) for x in frames] == table.column("frame_index").to_pylist()
    assert look.keyframe == 0 and index.keyframe_before(0, 47) == 40


@pytest.mark.parametrize("codec", ["h264", "av1", "mpeg4"])
def test_segments_of_a_shared_file_are_cut_frame_exact(codec, tmp_path):
    """LeRobot v3.0 layout: three episodes in one file, starts not on keyframes (gop 16)."""
    lengths, starts = [37, 29, 40], [0, 37, 66]
    video = make_video(None, sum(lengths), codec=codec, gop=16, fps=FPS)
    eps = [
        Episode(
            source="v3",
            episode_index=i,
            table=make_episode_table(n, fps=FPS),
            fps=FPS,
            videos={"observation.images.top": CameraVideo(video, segment=(s / FPS, (s + n) / FPS))},
        )
        for i, (n, s) in enumerate(zip(lengths, starts, strict=False))
    ]
    manifest = convert([_source(eps, "v3")], str(tmp_path), _opts(max_episodes_per_shard=3))
    index = WindowIndex.load([tmp_path / manifest.shards[0].index])
    for e, (n, s) in enumerate(zip(lengths, starts, strict=False)):
        look = index.lookup(e, np.arange(n))
        with open(tmp_path / manifest.shards[0].shard, "rb") as f:
            f.seek(look.offset)
            data = f.read(look.size)
        got = [decode_frame_number(x) for x in VideoDecoder(data).get_frames_at(look.frames.tolist()).data]
        assert got == list(range(s, s + n))
    assert verify(str(tmp_path))["ok"]


def test_reencode_sets_gop_and_is_recorded(tmp_path):
    ep = _episode(0, rows=40, gop=40)
    spec = ReencodeSpec(codec="libx264", gop=8, size=(48, 48), crf=18)
    manifest = convert([_source([ep])], str(tmp_path), _opts(reencode=spec))
    row = pq.read_table(tmp_path / manifest.shards[0].index).to_pylist()[0]
    cam = row["cameras"][0]
    assert cam["keyframes"] == list(range(0, 40, 8))
    assert cam["transform"].startswith("reencode:") and json.loads(cam["transform"][9:])["gop"] == 8
    assert (cam["width"], cam["height"]) == (48, 48)
    assert manifest.options.video == spec.describe()


def test_stats_are_exact_and_finite_for_constant_dims(tmp_path):
    table = make_episode_table(50, fps=FPS).append_column("constant", pa.array([2.0] * 50))
    manifest = convert([_source([_episode(0, rows=50, table=table)])], str(tmp_path), _opts())
    stats = manifest.stats
    state = np.arange(50.0)
    assert stats["observation.state"]["mean"][0] == pytest.approx(state.mean(), rel=1e-6)
    assert stats["observation.state"]["std"][0] == pytest.approx(state.std(), rel=1e-5)
    assert stats["observation.state"]["q99"][0] == pytest.approx(np.quantile(state, 0.99), rel=1e-6)
    assert stats["constant"]["std"] == [0.0] and stats["constant"]["min"] == [2.0]
    assert list(manifest.features["observation.state"].shape) == [4]


# --- validation: each failure names dataset, episode, camera and row, or is a counted skip ----------


def _bad_table(column: str, row: int, value: float) -> pa.Table:
    table = make_episode_table(40, fps=FPS)
    values = np.array(table.column(column).to_pylist(), dtype=np.float32)
    values[row, 1] = value
    i = table.column_names.index(column)
    return table.set_column(i, column, pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), values.shape[1]))


def _table_with(column: str, values) -> pa.Table:
    table = make_episode_table(40, fps=FPS)
    return table.set_column(table.column_names.index(column), column, pa.array(values, table.schema.field(column).type))


VIDEO40 = None


def _video40() -> bytes:
    global VIDEO40
    VIDEO40 = VIDEO40 or make_video(None, 40, fps=FPS, gop=10)
    return VIDEO40


CASES = {
    "nan": (
        lambda: _episode(3, table=_bad_table("observation.state", 7, np.nan), video=_video40()),
        {"row": 7, "camera": None},
        "observation.state",
    ),
    "inf": (
        lambda: _episode(3, table=_bad_table("action", 11, np.inf), video=_video40()),
        {"row": 11, "camera": None},
        "action",
    ),
    "frames_past_end": (
        lambda: _episode(3, table=make_episode_table(40, fps=FPS), video=make_video(None, 33, fps=FPS)),
        {"row": 33, "camera": "observation.images.front"},
        "frames 0..32",
    ),
    "unreadable_video": (
        lambda: _episode(3, video=b"\x00not a video" * 100),
        {"camera": "observation.images.front"},
        "demux",
    ),
    "truncated_video": (
        lambda: _episode(3, video=_video40()[: len(_video40()) * 2 // 3]),
        {"camera": "observation.images.front"},
        "",
    ),
    "bad_frame_index": (
        lambda: _episode(
            3, table=_table_with("frame_index", [*list(range(10)), 9, *list(range(11, 40))]), video=_video40()
        ),
        {"row": 10},
        "not increasing",
    ),
    "timestamps_offset": (
        lambda: _episode(3, table=_table_with("timestamp", [(r + 1) / FPS for r in range(40)]), video=_video40()),
        {"camera": "observation.images.front", "row": 0},
        "+1.00 frames",
    ),
    "timestamps_rate": (
        lambda: _episode(3, table=_table_with("timestamp", [r / 25 for r in range(40)]), video=_video40()),
        {"camera": "observation.images.front"},
        "25.00 Hz",
    ),
    "timestamps_non_monotonic": (
        lambda: _episode(
            3,
            table=_table_with("timestamp", [r / FPS for r in range(20)] + [0.5] + [r / FPS for r in range(21, 40)]),
            video=_video40(),
        ),
        {"row": 20},
        "goes from",
    ),
    "timestamps_reset": (
        lambda: _episode(3, table=_table_with("timestamp", [r / FPS for r in range(20)] * 2), video=_video40()),
        {"row": 20},
        "goes from",
    ),
    "timestamps_past_end": (
        lambda: _episode(3, table=_table_with("timestamp", [r / 18.5 for r in range(40)]), video=_video40()),
        {"camera": "observation.images.front"},
        "video ends",
    ),
}
KIND = {"inf": "nan", "truncated_video": ("unreadable_video", "frames_past_end")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_episode_fails_with_a_precise_message(case, tmp_path):
    make, where, text = CASES[case]
    good = [_episode(i, video=_video40()) for i in range(3)]
    with pytest.raises(ConversionError) as info:
        convert([_source([*good, make()])], str(tmp_path), _opts(timestamps="raise"))
    err = info.value
    expected = KIND.get(case, case)
    assert err.kind in (expected if isinstance(expected, tuple) else (expected,))
    assert (err.dataset, err.episode) == ("synth", 3)
    assert "dataset=synth episode=3" in str(err) and text in str(err)
    for name, value in where.items():
        assert getattr(err, name) == value, (name, str(err))
    # Shards finished before the failure are complete; nothing is half-written under a final name.
    assert not glob.glob(f"{tmp_path}/*.partial-*") and not os.path.exists(tmp_path / "manifest.json")
    assert sorted(os.listdir(tmp_path)) == [".epishard-convert.json", "shard-000000.index.parquet", "shard-000000.tar"]


@pytest.mark.parametrize("case", ["nan", "frames_past_end", "unreadable_video"])
def test_skip_policy_counts_bad_episodes(case, tmp_path):
    good = [_episode(i, video=_video40()) for i in range(3)]
    manifest = convert([_source([*good, CASES[case][0]()])], str(tmp_path), _opts(on_error="skip"))
    assert manifest.totals.episodes == 3 and manifest.totals.skipped == 1
    assert manifest.report.skipped_by_kind == {KIND.get(case, case): 1}
    assert manifest.report.skipped[0].episode == 3
    assert verify(str(tmp_path))["ok"]


def test_timestamp_disagreements_are_reported_by_default(tmp_path):
    ep = CASES["timestamps_offset"][0]()
    manifest = convert([_source([ep])], str(tmp_path), _opts())
    assert manifest.report.warnings_by_kind == {"timestamps_offset": 1}


def test_missing_camera_is_named(tmp_path):
    ep = _episode(0, video=_video40())
    with pytest.raises(ConversionError, match=r"missing_camera.*camera=observation\.images\.side"):
        convert([_source([ep])], str(tmp_path), _opts(cameras=("observation.images.front", "observation.images.side")))


# --- resume ----------------------------------------------------------------------------------------


def test_rerun_after_failure_resumes_and_matches_a_clean_run(tmp_path):
    good = [_episode(i, video=_video40()) for i in range(5)]
    bad = list(good)
    bad[3] = _episode(3, table=_bad_table("action", 2, np.nan), video=_video40())
    with pytest.raises(ConversionError):
        convert([_source(bad)], str(tmp_path / "out"), _opts())
    first = _files(tmp_path / "out")
    assert "shard-000000.tar" in first and "manifest.json" not in first
    Path(tmp_path / "out" / "shard-000002.tar.partial-99999").write_bytes(b"junk from a killed run")
    convert([_source(good)], str(tmp_path / "out"), _opts())
    convert([_source(good)], str(tmp_path / "clean"), _opts())
    assert _files(tmp_path / "out") == _files(tmp_path / "clean")
    assert _files(tmp_path / "out")["shard-000000.tar"] == first["shard-000000.tar"]


def test_rerun_rewrites_a_shard_whose_index_is_missing(episodes, tmp_path):
    convert([_source(episodes)], str(tmp_path), _opts())
    before = _files(tmp_path)
    os.remove(tmp_path / "shard-000001.index.parquet")
    with open(tmp_path / "shard-000001.tar", "r+b") as f:
        f.truncate(1000)  # as if killed while renaming
    convert([_source(episodes)], str(tmp_path), _opts())
    assert _files(tmp_path) == before


# --- sources, keys, options ------------------------------------------------------------------------


def test_sources_with_one_name_get_unique_keys(tmp_path):
    a = _source([_episode(0, video=_video40(), source="robot")], "robot")
    b = _source([_episode(0, video=_video40(), source="robot")], "robot")
    manifest = convert([a, b], str(tmp_path), _opts())
    index = WindowIndex.load([tmp_path / s.index for s in manifest.shards])
    assert [index.key(i) for i in range(2)] == ["robot-e000000", "robot_2-e000000"]
    assert [s.name for s in manifest.sources] == ["robot", "robot_2"]


def test_duplicate_explicit_keys_are_refused(tmp_path):
    import dataclasses

    eps = [dataclasses.replace(_episode(i, video=_video40()), key="same") for i in range(2)]
    with pytest.raises(SourceError, match="'same' is used twice"):
        convert([_source(eps)], str(tmp_path), _opts())


def test_episode_and_camera_subsets(episodes, tmp_path):
    manifest = convert(
        [_source(episodes)], str(tmp_path), _opts(episodes=frozenset({1, 3}), cameras=("observation.images.wrist",))
    )
    index = WindowIndex.load([tmp_path / s.index for s in manifest.shards])
    assert [index.key(i) for i in range(index.num_episodes)] == ["synth-e000001", "synth-e000003"]
    assert list(manifest.cameras) == ["observation.images.wrist"]
    assert index.camera_names(0) == ["observation.images.wrist"]


def test_shard_byte_limit(episodes, tmp_path):
    manifest = convert([_source(episodes)], str(tmp_path), _opts(max_episodes_per_shard=100, max_bytes_per_shard=1))
    assert [s.episodes for s in manifest.shards] == [1] * 5


# --- CLI -------------------------------------------------------------------------------------------


def test_cli_verify_names_the_damaged_episode_and_camera(episodes, tmp_path, capsys):
    manifest = convert([_source(episodes)], str(tmp_path), _opts())
    row = pq.read_table(tmp_path / manifest.shards[1].index).to_pylist()[0]
    video = row["members"][row["cameras"][1]["member"]]
    with open(tmp_path / manifest.shards[1].shard, "r+b") as f:
        f.seek(video["offset"] + video["size"] // 2)
        f.write(b"\xff" * 64)
    assert cli(["verify", str(tmp_path), "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert {"shard": "shard-000001.tar", "message": "sha256 differs from the manifest"} in problems
    assert any(p.get("episode") == row["key"] and video["name"] in p["message"] for p in problems)


def test_frame_tables_are_compact_when_regular_and_exact_when_not(tmp_path):
    gap = list(range(20)) + list(range(21, 41))  # a dropped frame: row 20 shows video frame 21
    table = _table_with("frame_index", gap)
    manifest = convert(
        [_source([_episode(0, table=table, video=make_video(None, 41, fps=FPS))])], str(tmp_path), _opts()
    )
    row = pq.read_table(tmp_path / manifest.shards[0].index).to_pylist()[0]
    cam = row["cameras"][0]
    assert cam["pts"] == [] and cam["duration"] == [] and cam["pts_step"] > 0
    assert cam["row_to_frame"] == gap
    index = WindowIndex.load([tmp_path / manifest.shards[0].index])
    pts, _duration, keys = index.frame_tables(0)
    assert pts.tolist() == [cam["pts_start"] + i * cam["pts_step"] for i in range(41)]
    assert keys.nonzero()[0].tolist() == [0, 30]
    look = index.lookup(0, np.arange(40))
    with open(tmp_path / manifest.shards[0].shard, "rb") as f:
        f.seek(look.offset)
        data = f.read(look.size)
    assert [decode_frame_number(x) for x in VideoDecoder(data).get_frames_at(look.frames.tolist()).data] == gap


def test_sources_with_other_state_widths_get_per_source_stats(tmp_path):
    a = _source([_episode(0, video=_video40(), source="arm")], "arm")
    wide = Episode(
        source="humanoid",
        episode_index=0,
        table=make_episode_table(40, state_dim=9, action_dim=3),
        videos={"observation.images.front": CameraVideo(_video40())},
        fps=FPS,
    )
    manifest = convert([a, _source([wide], "humanoid")], str(tmp_path), _opts())
    assert list(manifest.stats_mixed_widths) == ["observation.state"]
    assert "observation.state" not in manifest.stats and "action" in manifest.stats
    assert len(manifest.stats_by_source["humanoid"]["observation.state"]["mean"]) == 9
    assert len(manifest.stats_by_source["arm"]["observation.state"]["mean"]) == 4
    assert manifest.stats["action"]["count"] == 80
