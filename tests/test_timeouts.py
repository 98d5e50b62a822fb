"""Nothing waits forever (issue 11, item 2): every remote request has connect and read timeouts,
after which the retry and shard policies apply; only regular local files are opened.

A loopback socket that accepts and never answers stands in for a stuck S3 or HTTP endpoint, and a
proxy that swallows the responses to one shard's range requests for one that stops mid-dataset.
Every test runs under a watchdog: a hang fails it instead of blocking the suite.
"""

from __future__ import annotations

import os
import warnings

import pytest
from faultgen import SPEC, copy, hang_alarm, loaded, source
from remote_servers import FaultProxy, SilentServer, serve_http

from epishard.cli import main
from epishard.format.storage import NotARegularFile
from epishard.shardwriter import ConvertOptions, convert, verify
from epishard.stream import WindowDataset
from epishard.stream.fetch import FetchError, FetchPolicy
from epishard.stream.options import ReadOptions

pytest.importorskip("aiohttp")
SHORT = dict(connect_timeout_s=0.3, read_timeout_s=0.3, retries=1, backoff_s=0.01)


@pytest.fixture(autouse=True)
def watchdog():
    with hang_alarm(60):
        yield


def _stream(url: str, **kw) -> tuple[list[dict], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = list(WindowDataset(url, SPEC, seed=5, read=ReadOptions(**kw)))
    return samples, [str(w.message) for w in caught if "epishard: skipping" in str(w.message)]


def _check_stuck_shard(samples, messages, expected: int, stuck_episodes: set[int]) -> None:
    assert len(samples) == expected
    assert {int(s["episode_index"]) for s in samples if not s["substitute"]} == set(range(6)) - stuck_episodes
    assert sum(s["substitute"] for s in samples) > 0
    assert len(messages) == len(stuck_episodes) and all("Timeout" in m and "after 1 retries" in m for m in messages)


def test_http_shard_that_stops_answering_is_substituted(intact, reference):
    expected = len(reference)
    server, _ = serve_http(intact)
    proxy = FaultProxy(server.server_address, match=b"shard-000001.tar", stall=True)
    try:
        samples, messages = _stream(f"http://127.0.0.1:{proxy.port}", fetch=FetchPolicy(**SHORT))
        with pytest.raises(FetchError, match=r"shard-000001\.tar.*Timeout"):
            _stream(f"http://127.0.0.1:{proxy.port}", fetch=FetchPolicy(**SHORT, on_shard_error="raise"))
    finally:
        proxy.close()
        server.shutdown()
    _check_stuck_shard(samples, messages, expected, {2, 3})
    assert proxy.stalled >= 2  # the first request and its one retry, then the shard is given up


def test_http_endpoint_that_never_answers_fails_with_a_timeout():
    silent = SilentServer()
    try:
        with pytest.raises(FetchError, match=r"manifest.json: .*Timeout.*after 1 retries"):
            WindowDataset(silent.url, SPEC, read=ReadOptions(fetch=FetchPolicy(**SHORT)))
    finally:
        silent.close()
    assert silent.connections in (2, 4)  # the read and its one retry, after a size probe's HEAD and GET if one is made


@pytest.fixture(scope="module")
def s3(moto_s3):
    options, fs = moto_s3
    fs.mkdir("timeouts")
    return options


def test_s3_shard_that_stops_answering_is_substituted(intact, reference, s3):
    url = "s3://timeouts/ds"
    convert([source()], url, ConvertOptions(max_episodes_per_shard=2, progress=False), storage_options=s3)
    expected = len(reference)
    host, port = s3["endpoint_url"].rsplit("/", 1)[1].split(":")
    proxy = FaultProxy((host, int(port)), match=b"shard-000001.tar", stall=True)
    try:
        samples, messages = _stream(
            url, storage_options={"endpoint_url": f"http://127.0.0.1:{proxy.port}"}, fetch=FetchPolicy(**SHORT)
        )
    finally:
        proxy.close()
    _check_stuck_shard(samples, messages, expected, {2, 3})


def test_s3_endpoint_that_never_answers_fails_convert_verify_and_reader(intact, capsys):
    silent = SilentServer()
    options = {"endpoint_url": silent.url, "connect_timeout": 0.3, "read_timeout": 0.3, "retry_budget": 0.3}
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    try:
        with pytest.raises(Exception, match=r"[Tt]imeout"):
            convert([source()], "s3://stuck/ds", ConvertOptions(progress=False), storage_options=options)
        with pytest.raises(Exception, match=r"[Tt]imeout"):
            verify("s3://stuck/ds", storage_options=options)
        with pytest.raises(FetchError, match=r"manifest\.json: .*Timeout"):
            WindowDataset(
                "s3://stuck/ds",
                SPEC,
                read=ReadOptions(storage_options={"endpoint_url": silent.url}, fetch=FetchPolicy(**SHORT)),
            )
    finally:
        silent.close()


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_shard_that_is_not_a_regular_file_is_refused(intact, tmp_path, kind):
    root = copy(intact, str(tmp_path / "ds"))
    path = os.path.join(root, loaded(root).shards[1].shard)
    os.remove(path)
    {"fifo": os.mkfifo, "directory": os.mkdir, "device": lambda p: os.symlink("/dev/zero", p)}[kind](path)
    result = verify(root)
    assert not result["ok"]
    assert any("not a regular file" in p["message"] and p["shard"] == "shard-000001.tar" for p in result["problems"])
    samples, messages = _stream(root)
    assert {int(s["episode_index"]) for s in samples if not s["substitute"]} == {0, 1, 4, 5}
    assert len(messages) == 2 and all("not a regular file" in m for m in messages)


@pytest.mark.parametrize("name", ["manifest.json", "index.arrow"])
def test_metadata_that_is_a_fifo_is_refused(intact, tmp_path, name, capsys):
    root = copy(intact, str(tmp_path / "ds"))
    os.remove(os.path.join(root, name))
    os.mkfifo(os.path.join(root, name))
    with pytest.raises(NotARegularFile, match=f"{name} is a FIFO"):
        WindowDataset(root, SPEC)
    if name == "manifest.json":  # an error: nothing it would name is opened
        with pytest.raises(NotARegularFile, match=f"{name} is a FIFO"):
            verify(root)
        assert main(["verify", root]) == 2
        assert "is a FIFO" in capsys.readouterr().err
    else:  # damage verify reports
        result = verify(root)
        assert not result["ok"] and any("is a FIFO" in p["message"] for p in result["problems"])
        assert main(["verify", root]) == 1
        assert "is a FIFO" in capsys.readouterr().out
