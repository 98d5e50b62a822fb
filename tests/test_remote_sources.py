"""Remote LeRobot sources and one storage option everywhere.

LeRobot v2.1 and v3.0 datasets in a loopback S3 server (moto) and behind a loopback HTTP server
convert to exactly the bytes the local copy converts to; every command (convert, verify, inspect,
stream) reaches a custom S3 endpoint given only through ``--storage-options``, or only through the
environment.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from lerobotgen import write_v2, write_v3
from remote_servers import serve_access_denied, serve_fake_hub, serve_http

from epishard.cli import main as cli
from epishard.format.storage import RemoteFile, resolve_storage_options
from epishard.shardwriter import ConvertOptions, SourceError, convert, read_lerobot

CAMERA = "observation.images.front"
BUCKET = "epishard-sources"
OPTS = ConvertOptions(max_episodes_per_shard=2, progress=False)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> str:
    """A folder holding ``v2`` (LeRobot v2.1, 3 episodes, an mp4 per episode) and ``v3`` (v3.0, 4
    episodes, 2 per data and video file) datasets of 32x32 frame-numbered videos."""
    base = str(tmp_path_factory.mktemp("sources"))
    write_v2(f"{base}/v2", [12, 9, 15], [CAMERA])
    write_v3(f"{base}/v3", [12, 9, 15, 10], CAMERA, per_file=2)
    return base


@pytest.fixture(scope="module")
def local(sources, tmp_path_factory) -> dict[str, str]:
    """Each version converted from the local folder: the reference output."""
    out = tmp_path_factory.mktemp("local")
    for version in ("v2", "v3"):
        convert([f"{sources}/{version}"], f"{out}/{version}", OPTS)
    return {version: f"{out}/{version}" for version in ("v2", "v3")}


@pytest.fixture(scope="module")
def s3(moto_s3, sources) -> dict:
    """The sources uploaded to ``s3://epishard-sources/raw/{v2,v3}``; yields the storage options."""
    options, fs = moto_s3
    fs.mkdir(BUCKET)
    fs.put(f"{sources}/", f"{BUCKET}/raw/", recursive=True)
    return options


@pytest.fixture(scope="module")
def http(sources):
    server, base = serve_http(sources)
    yield base
    server.shutdown()


def _same_output(out: str, reference: str, source_url: str, source_path: str) -> None:
    """Every file of ``out`` has the bytes of the same file in ``reference``; the manifest differs
    only in where it says the source was read from."""
    names = sorted(os.listdir(reference))
    assert sorted(os.listdir(out)) == names and "manifest.json" in names
    for name in names:
        got = Path(f"{out}/{name}").read_bytes()
        if name == "manifest.json":
            assert json.dumps(source_url).encode() in got
            got = got.replace(json.dumps(source_url).encode(), json.dumps(source_path).encode())
        assert got == Path(f"{reference}/{name}").read_bytes(), name


@pytest.mark.parametrize("version", ["v2", "v3"])
@pytest.mark.parametrize("store", ["s3", "http"])
def test_remote_source_converts_to_the_bytes_of_the_local_copy(store, version, sources, local, request, tmp_path):
    if store == "s3":
        url, options = f"s3://{BUCKET}/raw/{version}", request.getfixturevalue("s3")
    else:
        url, options = f"{request.getfixturevalue('http')}/{version}", None
    source = read_lerobot(url, storage_options=options)
    videos = [v.source for e in source.episodes for v in e.videos.values()]
    assert videos and all(isinstance(v, RemoteFile) and v.url.startswith(url + "/") for v in videos)
    # S3 v3.0 with two workers: remote files are opened anew in each forked worker process.
    workers = 2 if (store, version) == ("s3", "v3") else 1
    opts = ConvertOptions(**{**OPTS.__dict__, "workers": workers})
    manifest = convert([url], str(tmp_path), opts, storage_options=options)
    assert manifest.sources[0].path == url
    _same_output(str(tmp_path), local[version], url, f"{sources}/{version}")


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_hf_dataset_through_huggingface_hub_against_a_stand_in_hub(version, sources, local, tmp_path):
    """``hf://datasets/<user>/<repo>`` goes through huggingface_hub's own ``HfFileSystem`` (repository
    and path resolution, tree listing, ranged downloads) against a loopback stand-in for the Hub's
    HTTP API (``remote_servers.FakeHubHandler``, the real Hub is out of reach here); it proves the
    hf:// path end to end as far as the stand-in answers as the Hub does."""
    pytest.importorskip("huggingface_hub")
    os.makedirs(tmp_path / "hub" / "lerobot")
    os.symlink(f"{sources}/{version}", tmp_path / "hub" / "lerobot" / version)
    server, endpoint = serve_fake_hub(str(tmp_path / "hub"))
    url = f"hf://datasets/lerobot/{version}"
    try:
        convert([url], str(tmp_path / "out"), OPTS, storage_options={"endpoint": endpoint})
    finally:
        server.shutdown()
    _same_output(str(tmp_path / "out"), local[version], url, f"{sources}/{version}")


def test_a_file_url_is_the_local_folder(sources):
    by_url, by_path = read_lerobot(f"file://{sources}/v3"), read_lerobot(f"{sources}/v3")
    assert by_url.path == by_path.path == f"{sources}/v3" and by_url.episodes == by_path.episodes
    assert all(isinstance(v.source, str) for e in by_url.episodes for v in e.videos.values())


def test_interrupted_remote_conversion_resumes_to_the_same_bytes(s3, sources, local, tmp_path, monkeypatch):
    from epishard.shardwriter import prepare as prepare_module

    url, calls, real = f"s3://{BUCKET}/raw/v3", {"n": 0}, prepare_module.prepare

    def failing(episode, opts):
        calls["n"] += 1
        if calls["n"] == 3:  # the first episode of the second shard
            raise KeyboardInterrupt
        return real(episode, opts)

    convert_module = sys.modules["epishard.shardwriter.convert"]
    monkeypatch.setattr(convert_module, "prepare", failing)
    with pytest.raises(KeyboardInterrupt):
        convert([url], str(tmp_path), OPTS, storage_options=s3)
    assert sorted(os.listdir(tmp_path)) == [".epishard-convert.json", "shard-000000.index.parquet", "shard-000000.tar"]
    first = os.stat(tmp_path / "shard-000000.tar").st_mtime_ns
    monkeypatch.setattr(convert_module, "prepare", real)
    convert([url], str(tmp_path), OPTS, storage_options=s3)
    assert os.stat(tmp_path / "shard-000000.tar").st_mtime_ns == first  # kept, not rewritten
    _same_output(str(tmp_path), local["v3"], url, f"{sources}/v3")


def test_a_local_conversion_resumes_from_the_bucket_copy(s3, sources, local, tmp_path):
    """The plan names files relative to the source folder: the same dataset in a bucket is the same plan."""
    out = tmp_path / "out"
    convert([f"{sources}/v2"], str(out), OPTS)
    (out / "shard-000001.tar").unlink()  # as if the first run had stopped there
    kept = os.stat(out / "shard-000000.tar").st_mtime_ns
    convert([f"s3://{BUCKET}/raw/v2"], str(out), OPTS, storage_options=s3)
    assert os.stat(out / "shard-000000.tar").st_mtime_ns == kept
    _same_output(str(out), local["v2"], f"s3://{BUCKET}/raw/v2", f"{sources}/v2")


def test_remote_source_errors_name_the_url(s3, moto_s3):
    with pytest.raises(SourceError, match=f"^s3://{BUCKET}/raw/nothing: no meta/info.json"):
        read_lerobot(f"s3://{BUCKET}/raw/nothing", storage_options=s3)
    with pytest.raises(FileNotFoundError, match="bucket does not exist") as missing:
        read_lerobot("s3://no-such-bucket/raw/g1", storage_options=s3)
    assert missing.value.filename == "s3://no-such-bucket/raw/g1"
    server, endpoint = serve_access_denied()
    try:
        with pytest.raises(PermissionError, match="access denied") as denied:
            read_lerobot("s3://private/raw/g1", storage_options={"endpoint_url": endpoint})
    finally:
        server.shutdown()
    assert denied.value.filename == "s3://private/raw/g1"
    moto_s3[1].pipe(f"{BUCKET}/raw/broken/meta/info.json", b"{not json")
    with pytest.raises(SourceError, match=f"^s3://{BUCKET}/raw/broken/meta/info.json: not valid JSON"):
        read_lerobot(f"s3://{BUCKET}/raw/broken", storage_options=s3)


def test_storage_options_merge_the_environment_under_explicit_ones(monkeypatch):
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", "http://from-env:9000")
    monkeypatch.setenv("FSSPEC_S3", '{"anon": true}')
    assert resolve_storage_options("s3://b/x") == {"endpoint_url": "http://from-env:9000", "anon": True}
    assert resolve_storage_options("s3://b/x", {"endpoint_url": "http://given:1"})["endpoint_url"] == "http://given:1"
    assert resolve_storage_options("gs://b/x") == {}


# --- every command against a custom S3 endpoint --------------------------------------------------------

STREAM = ["--frames", "2", "--span", "3", "--action-horizon", "2", "--batch-size", "2", "--batches", "2"]


def _commands(source: str, out: str) -> list[list[str]]:
    return [
        ["convert", source, out, "--quiet", "--max-episodes-per-shard", "2"],
        ["verify", out],
        ["inspect", out, "--json"],
        ["stream", out, *STREAM, "--workers", "0", "--json"],
    ]


def _run_all(commands: list[list[str]], extra: list[str], capsys) -> list[str]:
    outputs = []
    for args in commands:
        assert cli([*args, *extra]) == 0, (args, capsys.readouterr().err)
        outputs.append(capsys.readouterr().out)
    return outputs


def _check(outputs: list[str], out: str) -> None:
    convert_out, verify_out, inspect_out, stream_out = outputs
    assert "wrote 2 shards, 3 episodes, 36 rows" in convert_out
    assert verify_out.startswith(f"{out}: 2 shards, 3 episodes, checked in ") and verify_out.endswith(": OK\n")
    summary = json.loads(inspect_out)
    assert summary["root"] == out and summary["totals"]["episodes"] == 3
    assert summary["sources"][0]["format"] == "lerobot-v2.1"
    assert json.loads(stream_out)["batches"] == 2


def test_every_command_with_the_endpoint_only_in_storage_options(s3, capsys):
    out = f"s3://{BUCKET}/shards/by-option"
    outputs = _run_all(_commands(f"s3://{BUCKET}/raw/v2", out), ["--storage-options", json.dumps(s3)], capsys)
    _check(outputs, out)


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "FSSPEC_S3_ENDPOINT_URL"])
def test_every_command_with_the_endpoint_only_in_the_environment(s3, capsys, monkeypatch, variable):
    monkeypatch.setenv(variable, s3["endpoint_url"])
    out = f"s3://{BUCKET}/shards/by-{variable.lower()}"
    _check(_run_all(_commands(f"s3://{BUCKET}/raw/v2", out), [], capsys), out)


def test_train_example_reads_a_bucket_through_storage_options(s3, capsys, monkeypatch):
    """tools/examples/train_example.py (one process, no torchrun; run in this process) trains from shards in
    the bucket, the endpoint given only with --storage-options."""
    import importlib.util

    url = f"s3://{BUCKET}/shards/for-training"
    convert([f"s3://{BUCKET}/raw/v2"], url, OPTS, storage_options=s3)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(repo, "tools", "examples", "train_example.py")
    spec = importlib.util.spec_from_file_location("train_example", script)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    args = [url, "--storage-options", json.dumps(s3), "--workers", "0", "--batch-size", "2", "--size", "32"]
    args += ["--span", "3", "--frames", "2", "--horizon", "2", "--stop-after", "2", "--log-every", "1"]
    monkeypatch.setattr(sys, "argv", ["train_example.py", *args])
    monkeypatch.delenv("RANK", raising=False)
    threads = torch.get_num_threads()
    try:
        assert train.main() == 0
    finally:
        torch.set_num_threads(threads)  # the example sets one thread per process
    out = capsys.readouterr().out
    assert "[rank 0] epoch 0 step 2 loss" in out and "stopping after 2 steps" in out


def test_a_folder_of_hdf5_episodes_behind_http_is_listed_not_taken_for_a_file(tmp_path):
    """Over HTTP a folder's URL answers with its listing page (fsspec's isfile says yes): the folder of
    ALOHA files is listed and converts to the rows of the local folder."""
    pytest.importorskip("h5py")
    from sourcecheck import column, read_back
    from test_sources_hdf5 import write_aloha

    from epishard.shardwriter.sources import SourceOptions

    write_aloha(tmp_path / "aloha", [5, 4])
    httpd, url = serve_http(str(tmp_path))
    try:
        options = ConvertOptions(progress=False, sources=SourceOptions(format="aloha"))
        convert([f"{url}/aloha"], str(tmp_path / "remote"), options)
    finally:
        httpd.shutdown()
    convert([str(tmp_path / "aloha")], str(tmp_path / "local"), ConvertOptions(progress=False))
    remote, local = read_back(str(tmp_path / "remote")), read_back(str(tmp_path / "local"))
    assert sorted(e for _, e in remote) == sorted(e for _, e in local) == [0, 1]
    for (_, e), episode in remote.items():
        other = next(v for (_, i), v in local.items() if i == e)
        assert (column(episode["table"], "action") == column(other["table"], "action")).all()
