"""The writer reads and writes nothing outside its own output: a folder holding files it did not
create is refused untouched; its own folder (an earlier or interrupted conversion) is resumed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from videogen import make_episode_table, make_video

from epishard.cli import main as cli
from epishard.format import manifest as fmt
from epishard.shardwriter import (
    CameraVideo,
    ConversionError,
    ConvertOptions,
    Episode,
    OutputFolderError,
    Source,
    convert,
)

FPS = 10
# The files issue 11 found deleted or overwritten: every one must survive byte for byte.
UNRELATED = {
    "notes.txt.partial-4242": b"a user's half-downloaded file",
    "shard-000009.index.parquet": b"another tool's index",
    "manifest.json": b'{"mine": true}',
    "shard-000001.tar": b"someone else's tar",
}


@pytest.fixture(scope="module")
def source() -> Source:
    video = make_video(None, 12, fps=FPS, gop=4, height=32, width=32)
    episodes = [
        Episode(
            source="toy",
            episode_index=i,
            table=make_episode_table(12, fps=FPS),
            fps=FPS,
            videos={"observation.images.front": CameraVideo(video)},
        )
        for i in range(3)
    ]
    return Source(name="toy", episodes=episodes, fps=FPS)


def _opts(**kw) -> ConvertOptions:
    return ConvertOptions(progress=False, max_episodes_per_shard=1, **kw)


def _snapshot(folder) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` with its bytes and mtime (ns)."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, folder)] = (Path(path).read_bytes(), os.stat(path).st_mtime_ns)
    return out


def _plant(folder, files: dict[str, bytes]) -> None:
    os.makedirs(folder, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)


def test_folder_with_unrelated_files_is_refused_untouched(source, tmp_path):
    out = tmp_path / "out"
    _plant(out, UNRELATED)
    before = _snapshot(out)
    with pytest.raises(OutputFolderError) as info:
        convert([source], str(out), _opts())
    message = str(info.value)
    assert message.startswith(f"{out}: not empty and not made by epishard convert")
    assert all(name in message for name in UNRELATED) and "new or empty folder" in message
    assert _snapshot(out) == before


def test_cli_refusal_is_one_line_and_touches_nothing(tmp_path, capsys):
    from lerobotgen import write_v2

    src = str(tmp_path / "src")
    write_v2(src, [8], ["observation.images.front"], fps=FPS)
    out = tmp_path / "out"
    _plant(out, UNRELATED)
    before = _snapshot(out)
    assert cli(["convert", src, str(out), "--quiet"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"epishard convert: error: {out}: not empty and not made by")
    assert _snapshot(out) == before


@pytest.mark.parametrize("foreign", ["notes.txt", "shard-000001.tar.bak", "other-000000.tar", "sub/", ".DS_Store"])
def test_a_conversion_folder_with_a_foreign_file_is_refused(source, tmp_path, foreign):
    out = tmp_path / "out"
    convert([source], str(out), _opts())
    if foreign.endswith("/"):
        os.makedirs(out / foreign)
    else:
        _plant(out, {foreign: b"not the writer's"})
    before = _snapshot(out)
    with pytest.raises(OutputFolderError, match=f"did not write \\({foreign.rstrip('/')}\\)"):
        convert([source], str(out), _opts())
    assert _snapshot(out) == before


def test_another_prefix_is_refused(source, tmp_path):
    convert([source], str(tmp_path), _opts())
    before = _snapshot(tmp_path)
    with pytest.raises(OutputFolderError, match="--prefix 'shard', not 'part'"):
        convert([source], str(tmp_path), _opts(prefix="part"))
    assert _snapshot(tmp_path) == before


def test_output_that_is_a_file_is_refused(source, tmp_path):
    path = tmp_path / "out.tar"
    path.write_bytes(b"precious")
    with pytest.raises(OutputFolderError, match="is a file"):
        convert([source], str(path), _opts())
    assert path.read_bytes() == b"precious"


@pytest.mark.parametrize("prefix", ["../evil", "a/b", ".hidden", "", "/abs"])
def test_a_prefix_that_would_write_outside_the_folder_is_refused(source, tmp_path, prefix):
    with pytest.raises(ValueError, match="prefix must be a plain file-name stem"):
        convert([source], str(tmp_path / "out"), _opts(prefix=prefix))
    assert os.listdir(tmp_path) == []


def test_marker_is_written_first_and_a_rerun_resumes(source, tmp_path, monkeypatch):
    out = tmp_path / "out"
    convert([source], str(out), _opts())
    assert json.loads((out / fmt.CONVERT_MARKER).read_bytes()) == {"writer": "epishard convert", "prefix": "shard"}
    before = _snapshot(out)
    # The same plan again: every shard is kept as it is (same bytes, never rewritten).
    convert_module = sys.modules["epishard.shardwriter.convert"]

    def no_write(*args, **kw):
        raise AssertionError("a finished shard was written again")

    monkeypatch.setattr(convert_module, "write_shard", no_write)
    convert([source], str(out), _opts())
    after = _snapshot(out)
    shards = [n for n in before if n.startswith("shard-")]
    assert len(shards) == 6 and all(after[n] == before[n] for n in shards)


def test_interrupted_conversion_resumes_and_removes_only_its_own_partials(source, tmp_path):
    import dataclasses

    out = tmp_path / "out"
    bad = list(source.episodes)
    bad[2] = dataclasses.replace(bad[2], videos={"observation.images.front": CameraVideo(b"\0" * 500)})
    with pytest.raises(ConversionError):
        convert([dataclasses.replace(source, episodes=bad)], str(out), _opts())
    assert sorted(os.listdir(out)) == [
        fmt.CONVERT_MARKER,
        "shard-000000.index.parquet",
        "shard-000000.tar",
        "shard-000001.index.parquet",
        "shard-000001.tar",
    ]
    _plant(out, {"shard-000002.tar.partial-99999": b"left by a killed run"})
    kept = _snapshot(out)["shard-000000.tar"]
    convert([source], str(out), _opts())
    assert not [n for n in os.listdir(out) if ".partial-" in n]
    assert _snapshot(out)["shard-000000.tar"] == kept
    convert([source], str(tmp_path / "clean"), _opts())
    clean = {n: d for n, (d, _) in _snapshot(tmp_path / "clean").items()}
    assert {n: d for n, (d, _) in _snapshot(out).items()} == clean


# --- object store (moto) ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3(moto_s3):
    moto_s3[1].mkdir("safety")
    return moto_s3


def test_s3_prefix_with_unrelated_objects_is_refused_untouched(source, s3):
    options, fs = s3
    for name, data in UNRELATED.items():
        fs.pipe_file(f"safety/foreign/{name}", data)
    with pytest.raises(OutputFolderError, match="not made by epishard convert"):
        convert([source], "s3://safety/foreign", _opts(), storage_options=options)
    fs.invalidate_cache()
    assert {p.rsplit("/", 1)[1]: fs.cat_file(p) for p in fs.ls("safety/foreign")} == UNRELATED


def test_s3_conversion_resumes_and_refuses_a_foreign_object(source, s3):
    options, fs = s3
    url = "s3://safety/own"
    convert([source], url, _opts(), storage_options=options)
    fs.invalidate_cache()
    first = {p: fs.info(p)["LastModified"] for p in fs.ls("safety/own")}
    assert f"safety/own/{fmt.CONVERT_MARKER}" in first
    manifest = convert([source], url, _opts(), storage_options=options)
    fs.invalidate_cache()
    assert manifest.totals.episodes == 3
    shards = [p for p in first if p.rsplit("/", 1)[1].startswith("shard-")]
    assert len(shards) == 6 and all(fs.info(p)["LastModified"] == first[p] for p in shards)  # not rewritten
    fs.pipe_file("safety/own/notes.txt", b"mine")
    with pytest.raises(OutputFolderError, match=r"did not write \(notes.txt\)"):
        convert([source], url, _opts(), storage_options=options)
    assert fs.cat_file("safety/own/notes.txt") == b"mine"


def test_a_finished_dataset_of_another_plan_is_replaced_only_with_overwrite(source, tmp_path):
    out = str(tmp_path / "out")
    first = convert([source], out, _opts())
    before = _snapshot(out)
    fewer = ConvertOptions(progress=False, max_episodes_per_shard=1, episodes=frozenset({0, 1}))
    with pytest.raises(OutputFolderError, match=r"finished conversion of other sources or options.*--overwrite"):
        convert([source], out, fewer)
    assert _snapshot(out) == before
    # The same plan again is a resume (nothing to write), not a replacement.
    assert convert([source], out, _opts()).plan_digest == first.plan_digest
    replaced = convert(
        [source],
        out,
        ConvertOptions(progress=False, max_episodes_per_shard=1, episodes=frozenset({0, 1}), overwrite=True),
    )
    assert replaced.totals.episodes == 2 and replaced.plan_digest != first.plan_digest
    assert sorted(n for n in os.listdir(out) if n.endswith(".tar")) == ["shard-000000.tar", "shard-000001.tar"]


def test_cli_refuses_to_replace_a_finished_dataset_without_overwrite(source, tmp_path, capsys):
    out = str(tmp_path / "out")
    convert([source], out, _opts())
    lerobot = tmp_path / "other"
    from lerobotgen import write_v2

    write_v2(str(lerobot), [6, 7], ["observation.images.front"])
    assert cli(["convert", str(lerobot), out, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--overwrite" in err[0]
    assert cli(["convert", str(lerobot), out, "--quiet", "--overwrite"]) == 0
    assert fmt.Manifest.load(Path(os.path.join(out, "manifest.json")).read_bytes(), out).sources[0].name == "other"
