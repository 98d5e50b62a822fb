"""Every user-facing failure of the CLI is one line on stderr, ``epishard <command>: error: <thing>:
<cause>``, exit status 2 (1 only for a verify that found damage); the traceback only with --debug."""

from __future__ import annotations

import errno
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lerobotgen import edit_json, write_v2
from remote_servers import serve_access_denied

from epishard.cli import main as cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAMERA = "observation.images.front"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """A LeRobot v2.1 dataset of 3 short episodes (12, 9, 10 rows at 10 fps, one camera)."""
    root = str(tmp_path_factory.mktemp("src") / "toy")
    write_v2(root, [12, 9, 10], [CAMERA], fps=10)
    return root


@pytest.fixture(scope="module")
def converted(dataset, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("converted") / "ds")
    assert cli(["convert", dataset, out, "--quiet", "--max-episodes-per-shard", "2"]) == 0
    return out


def _copy(folder: str, tmp_path, name: str = "copy") -> str:
    return shutil.copytree(folder, str(tmp_path / name))


def _error(capsys, command: str) -> str:
    """The one error line on stderr (warnings, one line each, may precede it); fails on anything else."""
    err = capsys.readouterr().err
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith(f"epishard {command}: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert all(line.startswith(f"epishard {command}: warning: ") for line in lines[:-1]), err
    return errors[0][len(f"epishard {command}: error: ") :]


# --- source metadata ---------------------------------------------------------------------------------


def test_fps_zero_is_one_line_and_the_traceback_only_with_debug(dataset, tmp_path, capsys):
    src = _copy(dataset, tmp_path)
    edit_json(f"{src}/meta/info.json", lambda info: info | {"fps": 0})
    env = {**os.environ, "PYTHONPATH": REPO}
    command = [sys.executable, "-m", "epishard.cli", "convert", src, str(tmp_path / "out"), "--quiet"]
    plain = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode == 2 and plain.stdout == ""
    assert plain.stderr == (
        f"epishard convert: error: {src}/meta/info.json: fps must be a positive number (frames per second), got 0\n"
    )
    assert cli(["--debug", *command[3:]]) == 2
    debug = capsys.readouterr().err
    assert "Traceback (most recent call last)" in debug and "_check_info" in debug
    assert debug.splitlines()[-1] == plain.stderr.strip()
    assert not os.path.exists(tmp_path / "out")  # a bad source is refused before the output is touched


@pytest.mark.parametrize(
    "change, said",
    [
        (
            lambda info: info | {"features": ["observation.state"]},
            'features must be an object of feature objects, got ["observation.state"]',
        ),
        (lambda info: info | {"features": {CAMERA: "video"}}, "features must be an object of feature objects"),
        (lambda info: [info], "the document must be a JSON object"),
        (lambda info: "v2.1", 'the document must be a JSON object, got "v2.1"'),
        (lambda info: info | {"fps": "30"}, 'fps must be a positive number (frames per second), got "30"'),
        (lambda info: info | {"fps": -10}, "fps must be a positive number (frames per second), got -10"),
        (lambda info: info | {"total_episodes": "3"}, 'total_episodes must be an integer >= 0, got "3"'),
        (
            lambda info: info | {"video_path": "../toy/" + info["video_path"]},
            "video_path must be a path inside the dataset folder (relative, no '..')",
        ),
    ],
)
def test_info_json_of_the_wrong_type(dataset, tmp_path, capsys, change, said):
    src = _copy(dataset, tmp_path)
    edit_json(f"{src}/meta/info.json", change)
    assert cli(["convert", src, str(tmp_path / "out"), "--quiet"]) == 2
    assert _error(capsys, "convert").startswith(f"{src}/meta/info.json: {said}")


def test_truncated_info_json(dataset, tmp_path, capsys):
    src = _copy(dataset, tmp_path)
    data = Path(f"{src}/meta/info.json").read_bytes()
    Path(f"{src}/meta/info.json").write_bytes(data[: len(data) // 2])
    assert cli(["convert", src, str(tmp_path / "out"), "--quiet"]) == 2
    assert _error(capsys, "convert").startswith(f"{src}/meta/info.json: not valid JSON (")


# --- manifest ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["verify", "inspect"])
@pytest.mark.parametrize("shards", ["shard-000000.tar", {"shard": "shard-000000.tar"}, None, [["shard-000000.tar"]]])
def test_manifest_shards_of_the_wrong_type(converted, tmp_path, capsys, command, shards):
    ds = _copy(converted, tmp_path)
    edit_json(f"{ds}/manifest.json", lambda m: m | {"shards": shards})
    assert cli([command, ds]) == 2
    line = _error(capsys, command)
    expected = (
        "shards must be a JSON array" if not isinstance(shards, list) else "shards[0].shard must be a JSON string"
    )
    assert line.startswith(f"{ds}/manifest.json: {expected}")


def test_manifest_shards_of_the_wrong_type_under_stream(converted, tmp_path, capsys):
    ds = _copy(converted, tmp_path)
    edit_json(f"{ds}/manifest.json", lambda m: m | {"shards": "shard-000000.tar"})
    assert cli(["stream", ds, "--workers", "0", "--batches", "1"]) == 2
    assert _error(capsys, "stream").startswith(f"{ds}/manifest.json: shards must be a JSON array")


# --- output ------------------------------------------------------------------------------------------


def test_output_path_that_is_a_file(dataset, tmp_path, capsys):
    out = tmp_path / "out"
    out.write_bytes(b"keep me")
    assert cli(["convert", dataset, str(out), "--quiet"]) == 2
    assert _error(capsys, "convert") == f"{out}: is a file; the output must be a new or empty folder"
    assert out.read_bytes() == b"keep me"


@pytest.mark.parametrize(
    "option, said",
    [
        (["--max-shard-size", "abc"], "--max-shard-size: 'abc' is not a size in bytes like 512MiB or 1GiB"),
        (["--episodes", "1-x"], "--episodes: '1-x' is not a list of episode indices like 0-9,12"),
        (["--reencode", "gop=x"], "--reencode 'gop=x': invalid literal for int() with base 10: 'x'"),
        (["--prefix", "../evil"], "ConvertOptions: prefix must be a plain file-name stem"),
        (["--max-episodes-per-shard", "0"], "ConvertOptions: max_episodes_per_shard must be >= 1, got 0"),
        (["--episodes", "3-1"], "--episodes: range '3-1' runs backwards (write 1-3)"),
        (
            ["--episodes", "5,7-9"],
            "no episodes to convert: none of --episodes is in the sources (episode indices toy: 0-2)",
        ),
    ],
)
def test_bad_options(dataset, tmp_path, capsys, option, said):
    assert cli(["convert", dataset, str(tmp_path / "out"), "--quiet", *option]) == 2
    assert _error(capsys, "convert").startswith(said)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["observation.images.back", "front"])
def test_unknown_camera_is_named_with_the_dataset_cameras_and_nothing_is_written(dataset, tmp_path, capsys, name):
    assert cli(["convert", dataset, str(tmp_path / "out"), "--quiet", "--cameras", name]) == 2
    said = _error(capsys, "convert")
    assert said == (
        f"{dataset}: camera {name} is not in this dataset (--cameras takes full feature names); its cameras: {CAMERA}"
    )
    assert os.listdir(tmp_path) == []


class _FullDisk:
    """Stands in for ``open`` in epishard.format.storage: files written through it share ``free`` bytes,
    then every write fails with ENOSPC, as on a full disk."""

    def __init__(self, free: int):
        self.free = free

    def __call__(self, path, mode="r", *args, **kw):
        return _Limited(open(path, mode, *args, **kw), self)


class _Limited:
    def __init__(self, f, disk: _FullDisk):
        self._f, self._disk = f, disk

    def write(self, data) -> int:
        if len(data) > self._disk.free:
            self._f.write(bytes(data[: self._disk.free]))
            self._disk.free = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._disk.free -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)


def test_disk_full_leaves_no_half_written_shard_and_a_rerun_resumes(dataset, converted, tmp_path, capsys, monkeypatch):
    storage_module = sys.modules["epishard.format.storage"]
    out = tmp_path / "out"
    first_shard = sum(os.path.getsize(f"{converted}/{n}") for n in ("shard-000000.tar", "shard-000000.index.parquet"))
    monkeypatch.setattr(storage_module, "open", _FullDisk(first_shard + 200), raising=False)
    assert cli(["convert", dataset, str(out), "--quiet", "--max-episodes-per-shard", "2"]) == 2
    assert _error(capsys, "convert") == (
        f"{out}/shard-000001.tar: No space left on device; nothing half-written was "
        "kept: free space and run the same command again to resume"
    )
    assert sorted(os.listdir(out)) == [".epishard-convert.json", "shard-000000.index.parquet", "shard-000000.tar"]
    kept = os.stat(out / "shard-000000.tar").st_mtime_ns
    monkeypatch.undo()  # space freed
    assert cli(["convert", dataset, str(out), "--quiet", "--max-episodes-per-shard", "2"]) == 0
    assert os.stat(out / "shard-000000.tar").st_mtime_ns == kept  # resumed, not rewritten
    names = sorted(n for n in os.listdir(converted))
    assert sorted(os.listdir(out)) == names
    assert all(Path(f"{out}/{n}").read_bytes() == Path(f"{converted}/{n}").read_bytes() for n in names)


# --- object store ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def denied(moto_s3):  # moto_s3 sets test credentials in the environment
    server, endpoint = serve_access_denied()
    yield json.dumps({"endpoint_url": endpoint})
    server.shutdown()


@pytest.mark.parametrize("command", ["convert", "verify"])
def test_s3_access_denied(dataset, denied, capsys, command):
    args = [dataset, "s3://private/ds", "--quiet"] if command == "convert" else ["s3://private/ds"]
    assert cli([command, *args, "--storage-options", denied]) == 2
    assert _error(capsys, command) in (
        "s3://private/ds: access denied (Access Denied)",  # s3fs's words for a
        "s3://private/ds: access denied (Forbidden)",
    )  # listing and a HEAD


@pytest.mark.parametrize("command", ["convert", "verify"])
def test_s3_missing_bucket(dataset, moto_s3, capsys, command):
    options = json.dumps(moto_s3[0])
    args = [dataset, "s3://no-such-bucket/ds", "--quiet"] if command == "convert" else ["s3://no-such-bucket/ds"]
    assert cli([command, *args, "--storage-options", options]) == 2
    assert _error(capsys, command) == "s3://no-such-bucket/ds: bucket 'no-such-bucket' does not exist"


# --- reading -----------------------------------------------------------------------------------------

STREAM = ["--frames", "2", "--span", "3", "--action-horizon", "2", "--batch-size", "2", "--batches", "2"]


@pytest.mark.parametrize("damage", ["empty", "directory"])
@pytest.mark.parametrize("workers", ["0", "2"])
def test_every_shard_unreadable_under_stream(converted, tmp_path, capsys, damage, workers):
    ds = _copy(converted, tmp_path)
    for shard in ("shard-000000.tar", "shard-000001.tar"):
        os.remove(f"{ds}/{shard}")
        if damage == "empty":
            open(f"{ds}/{shard}", "wb").close()
        else:
            os.mkdir(f"{ds}/{shard}")
    assert cli(["stream", ds, *STREAM, "--workers", workers]) == 2
    line = _error(capsys, "stream")  # from a worker, the exception's class comes first
    assert line.startswith((f"{ds}: ", f"FetchError: {ds}: ")) and "failed" in line and "shard-00000" in line


def test_verify_damage_exits_1(converted, tmp_path, capsys):
    ds = _copy(converted, tmp_path)
    with open(f"{ds}/shard-000001.tar", "r+b") as f:
        f.seek(700)
        f.write(b"\xff" * 16)
    assert cli(["verify", ds]) == 1
    assert "sha256 differs from the manifest" in capsys.readouterr().out


# --- workers and unexpected faults -------------------------------------------------------------------


def test_output_piped_into_a_reader_that_stops_early_is_no_error(converted):
    """`epishard inspect OUT --json | head -1`: the closed pipe is not blamed on the dataset."""
    env = {**os.environ, "PYTHONPATH": REPO}
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    done = subprocess.run(
        [sys.executable, "-m", "epishard.cli", "inspect", converted, "--json"],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=120,
    )
    os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


def test_worker_error_names_dataset_shard_episode_and_camera(dataset, tmp_path, capsys):
    src = _copy(dataset, tmp_path, "toy")
    with open(f"{src}/videos/chunk-000/{CAMERA}/episode_000001.mp4", "wb") as f:
        f.write(b"\0 not a video" * 100)
    out = tmp_path / "out"
    assert cli(["convert", src, str(out), "--quiet", "--workers", "2", "--max-episodes-per-shard", "1"]) == 2
    line = _error(capsys, "convert")
    assert line.startswith(f"[unreadable_video] dataset=toy episode=1 camera={CAMERA} ")
    assert "shard=shard-000001.tar" in line


def test_unexpected_fault_says_how_to_see_the_traceback(dataset, tmp_path, capsys, monkeypatch):
    convert_module = importlib.import_module("epishard.shardwriter.convert")  # the CLI calls its `convert`

    def broken(*args, **kw):
        raise RuntimeError("something\nbroke")

    monkeypatch.setattr(convert_module, "convert", broken)
    assert cli(["convert", dataset, str(tmp_path / "out"), "--quiet"]) == 2
    assert _error(capsys, "convert") == "RuntimeError: something broke (unexpected: run with --debug for the traceback)"
    assert cli(["--debug", "convert", dataset, str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert (
        "Traceback (most recent call last)" in err
        and err.splitlines()[-1] == "epishard convert: error: RuntimeError: something broke"
    )
