"""A LeRobot dataset from a stranger reads nothing outside its folder and nothing but regular files.

The LeRobot reader opens what ``meta/info.json`` and the folder name: a FIFO there would hang the
conversion, a symbolic link (or a feature named ``../../x``) would copy a file of this machine into
the shards, and a Parquet footer can claim 300 M rows from 15 MB. Each is refused, naming the file
and where it resolves, before it is opened (a FIFO's writer sees no reader) or decompressed;
``--allow-external`` reads regular files outside a trusted folder, never special ones; a Hugging
Face hub cache snapshot (files linked into ``../../blobs``) reads as it is.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from fifowatch import FifoWatch
from lerobotgen import write_v2
from sourcecheck import read_back

from epishard.cli import main
from epishard.shardwriter import ConvertOptions, convert
from epishard.shardwriter.sources import bounds

CAM = "observation.images.top"
CANARY = "CANARY-lerobot-4411"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lrhostile") / "good"
    write_v2(str(root), [6, 5, 4], [CAM])
    return root


def _copy(good: Path, tmp_path: Path, name: str = "src") -> Path:
    out = tmp_path / name
    shutil.copytree(good, out, symlinks=True)
    return out


VIDEO1 = f"videos/chunk-000/{CAM}/episode_000001.mp4"
DATA1 = "data/chunk-000/episode_000001.parquet"


@pytest.mark.parametrize("member", ["meta/info.json", "meta/tasks.jsonl", DATA1, VIDEO1])
@pytest.mark.parametrize("allow", [False, True], ids=["default", "allow-external"])
def test_a_fifo_in_the_dataset_is_refused_unopened(good, tmp_path, capsys, member, allow):
    src = _copy(good, tmp_path)
    watch = FifoWatch(src / member)
    try:
        argv = ["convert", str(src), str(tmp_path / "out"), "--quiet", "--on-error", "skip"]
        code = main([*argv, *(["--allow-external"] if allow else [])])
    finally:
        opened = watch.stop()
    err = capsys.readouterr().err
    assert code == 2 and not opened, err
    assert f"{src / member}: resolves to" in err and "a FIFO, not a regular file: refused unread" in err
    assert "--allow-external" not in err and "unexpected" not in err  # no way out is offered for a FIFO


@pytest.mark.parametrize(
    "member", [VIDEO1, DATA1, "data", "meta/tasks.jsonl", "meta/episodes.jsonl"], ids=lambda m: m.replace("/", "_")
)
def test_a_link_out_of_the_folder_is_refused_unless_allowed(good, tmp_path, capsys, member, monkeypatch):
    """A file (or the data folder) linked to a copy outside: refused naming its target; read with --allow-external."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY)
    src = _copy(good, tmp_path)
    elsewhere = tmp_path / "elsewhere" / os.path.basename(member)
    elsewhere.parent.mkdir()
    shutil.move(src / member, elsewhere)
    (src / member).symlink_to(elsewhere)
    argv = ["convert", str(src), str(tmp_path / "out"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"resolves to {elsewhere}" in err and "outside the source folder" in err, err
    assert "pass --allow-external" in err and not (tmp_path / "out" / "manifest.json").exists()
    assert main([*argv, "--allow-external"]) == 0, capsys.readouterr().err
    assert sorted(e for _, e in read_back(str(tmp_path / "out"))) == [0, 1, 2]


def test_proc_files_and_feature_names_climbing_out_are_refused(good, tmp_path, capsys, monkeypatch):
    """``meta/tasks.jsonl`` linked to ``/proc/self/environ`` (the canary lives there), and a camera named
    ``../../../outside/cam`` (its filled-in ``video_path`` climbs out): refused, the canary nowhere."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY)
    src = _copy(good, tmp_path, "proc")
    (src / "meta" / "tasks.jsonl").unlink()
    (src / "meta" / "tasks.jsonl").symlink_to("/proc/self/environ")
    for allow in ([], ["--allow-external"]):
        assert main(["convert", str(src), str(tmp_path / "o1"), "--quiet", *allow]) == 2
        err = capsys.readouterr().err
        assert "meta/tasks.jsonl" in err and "/proc/" in err and CANARY not in err, err
    climbing = _copy(good, tmp_path, "climb")
    info = json.loads((climbing / "meta" / "info.json").read_text())
    name = "../../../outside/cam"
    info["features"][name] = info["features"].pop(CAM)
    (climbing / "meta" / "info.json").write_text(json.dumps(info))
    outside = tmp_path / "outside" / "cam"
    outside.mkdir(parents=True)
    for e in range(3):
        shutil.copy(good / f"videos/chunk-000/{CAM}/episode_{e:06d}.mp4", outside / f"episode_{e:06d}.mp4")
    (climbing / "videos" / "chunk-000").mkdir(parents=True, exist_ok=True)
    assert main(["convert", str(climbing), str(tmp_path / "o2"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"resolves to {outside}/episode_000000.mp4, outside the source folder" in err, err


def test_a_hub_cache_snapshot_reads_through_its_links_into_blobs(good, tmp_path):
    """``datasets--org--name/snapshots/<rev>/...`` files are links to ``../../blobs/<hash>``, as huggingface_hub
    stores them: the repository's cache folder is the bound, so it converts as the folder itself does."""
    repo = tmp_path / "hub" / "datasets--org--name"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    for i, path in enumerate(sorted(p for p in good.rglob("*") if p.is_file())):
        blob = repo / "blobs" / f"blob{i:04d}"
        shutil.copy(path, blob)
        link = snapshot / path.relative_to(good)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    convert([str(snapshot)], str(tmp_path / "from_cache"), ConvertOptions(progress=False))
    convert([str(good)], str(tmp_path / "from_folder"), ConvertOptions(progress=False))
    cached, direct = read_back(str(tmp_path / "from_cache")), read_back(str(tmp_path / "from_folder"))
    assert sorted(e for _, e in cached) == [0, 1, 2]
    for (_, e), episode in cached.items():
        other = next(v for (_, i), v in direct.items() if i == e)
        assert episode["table"].equals(other["table"]) and (episode["frames"][CAM] == other["frames"][CAM]).all()


def test_a_parquet_footer_claiming_more_rows_than_the_bound_is_refused_before_reading(good, tmp_path, monkeypatch):
    """The footer's row count is checked before a page is decompressed: too_large naming the file, skippable."""
    monkeypatch.setattr(bounds, "MAX_ROWS", 5)  # episodes of 6, 5 and 4 rows: episode 0's file claims too many
    with pytest.raises(Exception, match=r"\[too_large\] .*episode=0 .*episode_000000\.parquet.* 6 rows"):
        convert([str(good)], str(tmp_path / "raise"), ConvertOptions(progress=False))
    manifest = convert([str(good)], str(tmp_path / "skip"), ConvertOptions(progress=False, on_error="skip"))
    assert manifest.report.skipped_by_kind == {"too_large": 1}
    assert sorted(e for _, e in read_back(str(tmp_path / "skip"))) == [1, 2]
