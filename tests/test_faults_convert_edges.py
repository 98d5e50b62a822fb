"""Data loss and cost at the edges of a conversion.

- A run killed (``kill -9``) while it writes its folder marker leaves only the marker's temporary
  file; the rerun, with or without ``--overwrite``, takes the folder as its own and converts.
- The cost of an episode does not grow with the number of episodes its LeRobot v3.0 file holds:
  no per-episode pass over the whole file's frame table, each shared file looked up once, the
  ``meta/episodes`` rows checked per column.
- Folder names with ``[``, ``]``, ``*``, ``?``, spaces, ``#``, ``%`` and non-ASCII letters work as
  sources and outputs, local and in S3; such a name is never a pattern (that matched a sibling
  folder: its episodes were converted, its files deleted).
- A refused source names the files it looked for, of the episodes that are there.
"""

from __future__ import annotations

import io
import math
import os
import shutil
import signal
import subprocess
import sys
import urllib.parse
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lerobotgen import write_v2, write_v3
from remote_servers import serve_http
from videogen import decode_frame_number, make_video

from epishard.cli import main as cli
from epishard.format import manifest as fmt
from epishard.shardwriter import (
    ConversionError,
    ConvertOptions,
    SourceError,
    convert,
    lerobot,
    read_lerobot,
    verify,
    video,
)
from epishard.stream import WindowDataset, WindowSpec
from epishard.stream.options import ReadOptions

REPO = Path(__file__).resolve().parents[1]
CAM = "observation.images.front"
WRIST = "observation.images.wrist"
OPTS = ConvertOptions(progress=False, max_episodes_per_shard=1)
ODD_NAMES = ["a[1]", "b]", "c*", "d?", "e f#g%41ü"]
ODD_ALL = "x[1]*? #%41ü"  # all of them in one name (S3: one conversion per version)


def _files(folder) -> dict[str, bytes]:
    return {n: Path(folder, n).read_bytes() for n in sorted(os.listdir(folder))}


@pytest.fixture(scope="module")
def v2_src(tmp_path_factory) -> str:
    src = str(tmp_path_factory.mktemp("v2") / "src")
    write_v2(src, [5, 6], [CAM])
    return src


# --- kill -9 while the marker is written -------------------------------------------------------------

# Runs `epishard convert SRC OUT`, SIGKILLing itself at the rename that would publish the marker: the
# marker's bytes are written and fsync'd under their temporary name, as a kill at that moment leaves them.
KILLED_AT_MARKER = """
import os, signal, sys
from epishard.cli import main
from epishard.format import manifest as fmt
from epishard.stream import WindowDataset, WindowSpec
rename = os.replace
def replace(src, dst):
    if os.path.basename(dst) == fmt.CONVERT_MARKER:
        os.kill(os.getpid(), signal.SIGKILL)
    return rename(src, dst)
os.replace = replace
sys.exit(main(["convert", sys.argv[1], sys.argv[2], "--quiet"]))
"""


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_run_killed_while_it_writes_the_marker_is_resumed(v2_src, tmp_path, overwrite):
    out = tmp_path / "out"
    child = subprocess.run(
        [sys.executable, "-c", KILLED_AT_MARKER, v2_src, str(out)], cwd=REPO, capture_output=True, check=False
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    left = os.listdir(out)  # the marker's bytes under their temporary name, nothing else
    assert len(left) == 1 and fmt.is_partial(left[0]) and left[0].startswith(fmt.CONVERT_MARKER + ".partial-")
    assert cli(["convert", v2_src, str(out), "--quiet", *(["--overwrite"] if overwrite else [])]) == 0
    assert cli(["convert", v2_src, str(tmp_path / "clean"), "--quiet"]) == 0
    assert _files(out) == _files(tmp_path / "clean")  # the same bytes, the temporary file gone
    assert verify(str(out))["ok"]


def test_a_half_written_marker_is_replaced(v2_src, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{fmt.CONVERT_MARKER}.partial-4242").write_bytes(b'{"writer": "epish')  # cut mid-write
    manifest = convert([v2_src], str(out), OPTS)
    assert manifest.totals.episodes == 2 and [e.episodes for e in manifest.shards] == [1, 1]
    assert sorted(os.listdir(out)) == [
        fmt.CONVERT_MARKER,
        "index.arrow",
        "manifest.json",
        "shard-000000.index.parquet",
        "shard-000000.tar",
        "shard-000001.index.parquet",
        "shard-000001.tar",
    ]


def test_a_partial_marker_beside_other_files_is_still_refused_untouched(v2_src, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    planted = {f"{fmt.CONVERT_MARKER}.partial-4242": b"{}", "notes.txt": b"mine"}
    for name, data in planted.items():
        (out / name).write_bytes(data)
    with pytest.raises(Exception, match="not made by epishard convert"):
        convert([v2_src], str(out), OPTS)
    assert _files(out) == planted


# --- the cost of an episode does not grow with its file -----------------------------------------------


@pytest.fixture(scope="module")
def many_per_file(tmp_path_factory) -> str:
    """A v3.0 dataset of 120 episodes of 3 frames, all in one data file and one video file."""
    src = str(tmp_path_factory.mktemp("many") / "src")
    write_v3(src, [3] * 120, CAM, per_file=120)
    return src


class _NoWalk(np.ndarray):
    """A frame table column that may be searched and sliced but not walked element by element in Python."""

    def __iter__(self):
        raise AssertionError("the whole file's frame table was walked in Python for one episode")


def test_cutting_one_episode_does_not_walk_the_whole_file(many_per_file):
    path = f"{many_per_file}/videos/{CAM}/chunk-000/file-000.mp4"
    info = video.scan(path)
    assert info.num_frames == 360
    guarded = video.VideoProbe(**{**info.__dict__, "pts": info.pts.view(_NoWalk)})
    for first in (0, 3 * 57, 357):  # episodes 0, 57, 119
        data, _, shown = video.cut(path, guarded, first, first + 3, "off")
        plain = video.cut(path, info, first, first + 3, "off")
        assert data == plain[0] and np.array_equal(shown, plain[2])
        # The cut starts at the keyframe before `first` (gop 8) and shows every wanted frame.
        assert shown.tolist() == list(range(first - first % 8, first - first % 8 + shown.size))
        assert set(range(first, first + 3)) <= set(shown.tolist())


def _shown(data: bytes, shown: np.ndarray) -> list[int]:
    """The number each displayed frame of a cut shows (``videogen``), in display order."""
    with av.open(io.BytesIO(data)) as container:
        frames = sorted(container.decode(video=0), key=lambda f: f.pts)
    return [decode_frame_number(f.to_ndarray(format="rgb24")) for f in frames][: shown.size]


def test_cuts_of_one_file_open_it_once_and_a_rewritten_file_again(many_per_file, tmp_path, monkeypatch):
    path = str(tmp_path / "file-000.mp4")
    shutil.copy(f"{many_per_file}/videos/{CAM}/chunk-000/file-000.mp4", path)
    info = video.scan(path)
    opened: list = []
    open_ = video._open
    monkeypatch.setattr(video, "_open", lambda source: opened.append(source) or open_(source))
    for first in (30, 90, 300):  # episodes 10, 30, 100: none starts at the file's first keyframe
        data, _, shown = video.cut(path, info, first, first + 3, "off")
        assert _shown(data, shown) == shown.tolist()  # frame i of the file shows i
    assert opened.count(path) == 1  # was opened (its whole index parsed) once per episode
    os.remove(path)  # rewritten in place: another file under the same name, opened anew
    make_video(path, 400, fps=20, height=32, width=32, gop=8, start_number=5000)
    info = video.scan(path)
    opened.clear()
    data, _, shown = video.cut(path, info, 90, 93, "off")
    assert _shown(data, shown) == [5000 + f for f in shown.tolist()] and opened.count(path) == 1


def test_frames_of_pts_matches_a_lookup_table():
    pts = np.array([0, 512, 1024, 1024, 2048], dtype=np.int64)  # a repeated pts: the last frame wins
    assert video._frames_of_pts(pts, [1024, 512, 7, None, 2048, 0, -5]).tolist() == [3, 1, -1, -1, 4, 0, -1]
    shuffled = np.array([1024, 0, 512], dtype=np.int64)  # not in pts order: still found
    assert video._frames_of_pts(shuffled, [0, 512, 1024, 3]).tolist() == [1, 2, 0, -1]
    assert video._frames_of_pts(np.zeros(0, dtype=np.int64), [0, None]).tolist() == [-1, -1]


def test_reading_a_v3_source_looks_each_file_up_once(many_per_file, monkeypatch):
    calls: list[str] = []
    exists = lerobot._Tree.exists
    monkeypatch.setattr(lerobot._Tree, "exists", lambda self, path: calls.append(path) or exists(self, path))
    source = read_lerobot(many_per_file)
    assert [e.episode_index for e in source.episodes] == list(range(120))
    assert [(e.table.start, e.table.stop) for e in source.episodes] == [(3 * i, 3 * i + 3) for i in range(120)]
    assert [e.videos[CAM].segment for e in source.episodes[:2]] == [(0.0, 0.15), (0.15, 0.3)]
    assert len(calls) == len(set(calls)) and len(calls) <= 5, calls  # info.json, tasks, data, video, stats.json


def _mutate_meta(src: str, change) -> str:
    path = f"{src}/meta/episodes/chunk-000/file-000.parquet"
    pq.write_table(change(pq.read_table(path)), path)
    return path


def _set(table: pa.Table, name: str, values, kind=None) -> pa.Table:
    column = pa.array(values, kind)
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, column)
    return table.append_column(name, column)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda t: _set(t, f"videos/{CAM}/from_timestamp", [0.0, 0.25, math.nan, 0.75]),
            f"row 2: videos/{CAM}/from_timestamp must be a finite number, got nan",
        ),
        (
            lambda t: _set(t, "tasks", [["fold"], ["fold", None], ["fold"], ["fold"]]),
            "row 1: tasks must be a list of strings, got ['fold', None]",
        ),
        (
            lambda t: _set(t, "data/chunk_index", ["0", "0", "0", "x"]),
            "row 0: data/chunk_index must be an integer, got '0'",
        ),
        (
            lambda t: _set(t, f"videos/{CAM}/file_index", [0, 0, 1.5, 1]),
            f"row 0: videos/{CAM}/file_index must be an integer, got 0.0",
        ),
        (
            lambda t: _set(t, "episode_index", [0, 1, None, 3], pa.int64()),
            "row 2: episode_index must be an integer, got None",
        ),
    ],
    ids=["nan", "null-task", "string-index", "float-index", "null-episode"],
)
def test_meta_episodes_rows_are_checked_naming_row_and_column(tmp_path, change, message):
    src = str(tmp_path / "src")
    write_v3(src, [5, 5, 5, 5], CAM, per_file=2)
    path = _mutate_meta(src, change)
    with pytest.raises(SourceError) as info:
        read_lerobot(src)
    assert str(info.value) == f"{path}: {message}"


def test_meta_episodes_stats_columns_are_not_read_into_rows(tmp_path):
    src = str(tmp_path / "src")
    write_v3(src, [5, 5, 5, 5], CAM, per_file=2)
    _mutate_meta(src, lambda t: _set(t, "stats/observation.state/mean", [[0.5] * 4] * 4))
    rows = lerobot._v3_episode_rows(lerobot._Tree(src, None), [f"{src}/meta/episodes/chunk-000/file-000.parquet"])
    assert [r["episode_index"] for r in rows] == [0, 1, 2, 3]
    assert all(not name.startswith("stats/") for r in rows for name in r)


def test_a_null_episode_index_in_a_data_file_is_refused_naming_the_file(tmp_path):
    src = str(tmp_path / "src")
    write_v3(src, [5, 5, 5, 5], CAM, per_file=2)
    path = f"{src}/data/chunk-000/file-001.parquet"
    table = pq.read_table(path)
    column = table.column("episode_index").to_pylist()
    column[7] = None
    pq.write_table(table.set_column(table.column_names.index("episode_index"), "episode_index", pa.array(column)), path)
    with pytest.raises(SourceError, match=rf"^{path}: episode_index must hold integers without nulls, has int64$"):
        convert([src], str(tmp_path / "out"), OPTS)


# --- names that are not patterns ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def odd_sources(tmp_path_factory) -> dict[tuple[str, str], str]:
    """(version, name) -> a v2.1 (2 episodes: 5, 6 frames) or v3.0 (2 episodes in one file) dataset
    in a folder of that name."""
    base = tmp_path_factory.mktemp("odd")
    out = {}
    for name in [*ODD_NAMES, ODD_ALL]:
        out["v2", name] = str(base / "v2" / name)
        write_v2(out["v2", name], [5, 6], [CAM])
        out["v3", name] = str(base / "v3" / name)
        write_v3(out["v3", name], [5, 6], CAM, per_file=2)
    return out


@pytest.mark.parametrize("version", ["v2", "v3"])
@pytest.mark.parametrize("name", ODD_NAMES)
def test_local_folders_named_with_any_character_convert_and_resume(odd_sources, tmp_path, version, name):
    src = odd_sources[version, name]
    out = tmp_path / name / name
    first = convert([src], str(out), OPTS)
    assert first.totals.episodes == 2 and first.totals.rows == 11
    before = _files(out)
    again = convert([src], str(out), OPTS)  # a rerun: everything kept
    assert again.plan_digest == first.plan_digest and _files(out) == before
    replaced = convert([src], str(out), ConvertOptions(progress=False, episodes=frozenset({1}), overwrite=True))
    assert replaced.totals.episodes == 1 and replaced.totals.rows == 6
    assert sorted(n for n in os.listdir(out) if n.endswith(".tar")) == ["shard-000000.tar"]
    assert verify(str(out))["ok"]


def test_a_source_named_like_a_pattern_reads_only_its_own_files(tmp_path):
    # "ds?" as a glob also matches its sibling "dsX": that one's 3 episodes were converted instead.
    write_v2(str(tmp_path / "ds?"), [5, 6], [CAM])
    write_v2(str(tmp_path / "dsX"), [7, 8, 9], [CAM])
    write_v3(str(tmp_path / "v3[0]"), [5, 6], CAM, per_file=2)
    write_v3(str(tmp_path / "v30"), [7, 8, 9], CAM, per_file=3)  # what "v3[0]" matches as a pattern
    for folder, lengths in (("ds?", [5, 6]), ("v3[0]", [5, 6])):
        source = read_lerobot(str(tmp_path / folder))
        root = str(tmp_path / folder)
        assert [e.episode_index for e in source.episodes] == [0, 1]
        tables = [e.table for e in source.episodes]
        paths = [str(getattr(t, "path", t)) for t in tables]
        assert all(p.startswith(root + "/") for p in paths), paths
        assert [pq.read_metadata(p).num_rows for p in paths] in ([5, 6], [11, 11])
        manifest = convert([root], str(tmp_path / f"out-{folder}"), OPTS)
        assert manifest.totals.rows == sum(lengths)


@pytest.fixture(scope="module")
def s3_odd(moto_s3, odd_sources) -> tuple[dict, object]:
    options, fs = moto_s3
    fs.mkdir("odd-names")
    for (version, name), folder in odd_sources.items():
        for dirpath, _, files in os.walk(folder):
            for file in files:
                rel = os.path.relpath(os.path.join(dirpath, file), folder)
                fs.pipe_file(f"odd-names/raw/{version}/{name}/{rel}", Path(dirpath, file).read_bytes())
    return options, fs


@pytest.mark.parametrize("version", ["v2", "v3"])
@pytest.mark.parametrize("name", [ODD_ALL])
def test_s3_prefixes_named_with_any_character_convert_and_resume(s3_odd, odd_sources, tmp_path, version, name):
    options, fs = s3_odd
    src, out = f"s3://odd-names/raw/{version}/{name}", f"s3://odd-names/out/{version}/{name}"
    first = convert([src], out, OPTS, storage_options=options)
    assert first.totals.episodes == 2 and first.totals.rows == 11
    # The same bytes as the local copy's conversion into a local folder of the same name.
    local = convert([odd_sources[version, name]], str(tmp_path / name), OPTS)
    fs.invalidate_cache()
    got = {p.rsplit("/", 1)[1]: fs.cat_file(p) for p in fs.ls(out[5:])}
    want = _files(tmp_path / name)
    assert sorted(got) == sorted(want)
    assert all(got[n] == want[n] for n in want if n != "manifest.json")
    assert first.plan_digest == local.plan_digest
    again = convert([src], out, OPTS, storage_options=options)  # resumed: manifest removed and rewritten
    assert again.plan_digest == first.plan_digest
    replaced = convert(
        [src], out, ConvertOptions(progress=False, episodes=frozenset({0}), overwrite=True), storage_options=options
    )
    assert replaced.totals.episodes == 1
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(out[5:]) if p.endswith(".tar")) == ["shard-000000.tar"]
    assert verify(out, storage_options=options)["ok"]
    samples = list(WindowDataset(out, WindowSpec(), seed=1, read=ReadOptions(storage_options=options)))
    assert sorted(int(x["frame_index"]) for x in samples) == [0, 1, 2, 3, 4]  # episode 0's 5 rows


@pytest.fixture(scope="module")
def http_odd(odd_sources):
    server, base = serve_http(str(Path(odd_sources["v2", ODD_ALL]).parents[1]))
    yield base
    server.shutdown()


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_http_folders_named_with_any_character_convert(http_odd, odd_sources, tmp_path, version):
    url = f"{http_odd}/{version}/{urllib.parse.quote(ODD_ALL)}"  # as a URL writes the name
    remote = convert([url], str(tmp_path / "remote"), OPTS)
    local = convert([odd_sources[version, ODD_ALL]], str(tmp_path / "local"), OPTS)
    assert remote.plan_digest == local.plan_digest and remote.totals.rows == 11
    got, want = _files(tmp_path / "remote"), _files(tmp_path / "local")
    assert sorted(got) == sorted(want) and all(got[n] == want[n] for n in want if n != "manifest.json")


def test_an_http_url_with_a_raw_question_mark_says_how_to_write_it(http_odd):
    with pytest.raises(SourceError) as info:
        read_lerobot(f"{http_odd}/v2/d?")
    assert str(info.value).endswith("in a URL a folder name's '?', '#' and spaces are written %3F, %23 and %20")
    assert len(read_lerobot(f"{http_odd}/v2/d%3F").episodes) == 2


def test_s3_output_named_like_a_pattern_leaves_its_siblings_alone(s3_odd, v2_src):
    # `fs.rm("out/ds*/manifest.json")` expanded the pattern: the rerun deleted dsX's manifest and shards.
    options, fs = s3_odd
    sibling = "s3://odd-names/siblings/dsX"
    convert([v2_src], sibling, ConvertOptions(progress=False), storage_options=options)
    fs.invalidate_cache()
    kept = {p: fs.cat_file(p) for p in fs.ls(sibling[5:])}
    mine = "s3://odd-names/siblings/ds*"
    convert([v2_src], mine, OPTS, storage_options=options)
    convert([v2_src], mine, OPTS, storage_options=options)
    convert([v2_src], mine, ConvertOptions(progress=False, overwrite=True), storage_options=options)
    fs.invalidate_cache()
    assert {p: fs.cat_file(p) for p in fs.ls(sibling[5:])} == kept
    assert verify(sibling, storage_options=options)["ok"] and verify(mine, storage_options=options)["ok"]


# --- a refusal names the files it looked for ----------------------------------------------------------


def test_v3_subset_without_videos_names_the_video_files_of_its_episodes(tmp_path):
    src = tmp_path / "src"
    write_v3(str(src), [5, 5, 5, 5], CAM, per_file=2)
    os.remove(src / "data/chunk-000/file-000.parquet")  # a subset copy: episodes 2 and 3 only
    shutil.rmtree(src / "videos")
    with pytest.raises(SourceError) as info:
        convert([str(src)], str(tmp_path / "out"), OPTS)
    message = str(info.value)
    assert f"expected e.g. videos/{CAM}/chunk-000/file-001.mp4, from video_path" in message
    assert f"looked for 1 file: videos/{CAM}/chunk-000/file-001.mp4" in message
    assert "file-000.mp4" not in message  # the video of episodes 0 and 1, which are not there


def test_v3_without_data_files_names_the_data_files_it_looked_for(tmp_path):
    src = tmp_path / "src"
    write_v3(str(src), [5, 5, 5, 5, 5], CAM, per_file=2)
    shutil.rmtree(src / "data")
    with pytest.raises(SourceError) as info:
        read_lerobot(str(src))
    assert str(info.value) == (
        f"{src}: none of the episodes in meta/episodes has its data file present (data_path "
        "'data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet'; looked for 3 files: "
        "data/chunk-000/file-000.parquet, data/chunk-000/file-001.parquet, data/chunk-000/file-002.parquet)"
    )


def test_v2_without_matching_data_files_names_the_files_it_saw(tmp_path):
    src = tmp_path / "src"
    write_v2(str(src), [5, 6], [CAM])
    for e in (0, 1):
        os.rename(src / f"data/chunk-000/episode_00000{e}.parquet", src / f"data/chunk-000/ep{e}.parquet")
    with pytest.raises(SourceError) as info:
        read_lerobot(str(src))
    assert str(info.value) == (
        f"{src}: no data file matches data_path 'data/chunk-{{episode_chunk:03d}}/episode_{{episode_index:06d}}"
        ".parquet' (the folder holds its .parquet files, none of them a match: 2 files: "
        "data/chunk-000/ep0.parquet, data/chunk-000/ep1.parquet)"
    )
    shutil.rmtree(src / "data")
    with pytest.raises(SourceError, match=r"\(the folder holds no \.parquet file\)$"):
        read_lerobot(str(src))


def test_v2_refusal_names_every_video_file_it_looked_for(tmp_path):
    src = tmp_path / "src"
    write_v2(str(src), [5, 6, 7, 8, 9, 4], [CAM, WRIST])
    shutil.rmtree(src / "videos")
    with pytest.raises(SourceError) as info:
        read_lerobot(str(src))
    message = str(info.value)
    for cam in (CAM, WRIST):
        assert (
            f"looked for 6 files: videos/chunk-000/{cam}/episode_000000.mp4, "
            f"videos/chunk-000/{cam}/episode_000001.mp4, videos/chunk-000/{cam}/episode_000002.mp4, "
            f"videos/chunk-000/{cam}/episode_000003.mp4 and 2 more"
        ) in message


def test_train_example_resumes_from_a_checkpoint_folder_named_like_a_pattern(tmp_path, monkeypatch):
    import torch

    monkeypatch.syspath_prepend(str(REPO / "tools" / "examples"))
    import train_example

    folder = tmp_path / "run[1]"  # as a pattern it matches "run1", which holds no states
    folder.mkdir()
    for rank in (0, 1):
        torch.save({"world_size": 2, "rank": rank}, folder / f"loader.rank{rank}.pt")
    assert [s["rank"] for s in train_example.loader_states(str(folder))] == [0, 1]


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_an_episode_without_its_video_names_the_file_looked_for(tmp_path, version):
    src = tmp_path / "src"
    if version == "v2":
        write_v2(str(src), [5, 6, 7], [CAM])
        gone = src / f"videos/chunk-000/{CAM}/episode_000001.mp4"
    else:
        write_v3(str(src), [5, 6, 7, 8], CAM, per_file=2)
        gone = src / f"videos/{CAM}/chunk-000/file-001.mp4"  # episodes 2 and 3
    os.remove(gone)
    with pytest.raises(ConversionError) as info:
        convert([str(src)], str(tmp_path / "out"), OPTS)
    error = info.value
    assert error.kind == "missing_camera" and error.camera == CAM and error.path == str(gone)
    assert f"no video file for this episode (looked for {gone})" in str(error)
    skipped = convert([str(src)], str(tmp_path / "skip"), ConvertOptions(progress=False, on_error="skip"))
    assert [(e.episode, e.file) for e in skipped.report.skipped] == (
        [(1, str(gone))] if version == "v2" else [(2, str(gone)), (3, str(gone))]
    )
