"""No secret leaked: credentials in URLs and storage options never reach what epishard writes or prints.

A canary secret rides in a URL's userinfo (``http://user:CANARY@host/...``), in storage options
(``headers``, ``key``/``secret``) and in a ``--storage-options`` value that does not parse. Every
command (convert, inspect, verify, stream with a plot, preview) and the Python API run against
loopback servers (HTTP, moto S3), on good and on failing inputs (a missing path, a wrong password,
a missing bucket, a bad video, a shard gone mid-epoch). The canary is then looked for in stdout,
stderr, log records, warnings, exception texts and the bytes of every file written (manifest,
indexes, shards, telemetry plot, preview page and sheets): it must appear in none, while what is
shown still names the place (``http://***@127.0.0.1:PORT/path``).
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import logging
import os
import re
import shutil
import threading
import warnings
from pathlib import Path

import pytest
from lerobotgen import write_v2
from remote_servers import RangeHandler, serve_http

from epishard.cli import main as cli
from epishard.format.storage import Location, RemoteFile, parse_storage_options
from epishard.redact import MASK, redact, redact_options, remember
from epishard.shardwriter import ConversionError, ConvertOptions, SourceError, convert, read_lerobot
from epishard.stream.options import ReadOptions
from epishard.stream.report import StreamRun

CANARY = "CANARY-s3cr3t-7f3a"
CAMERA = "observation.images.front"
PASSWORD = "right-horse-battery"  # the password the guarded server accepts
HEADERS = {"headers": {"X-Api-Token": CANARY}}  # HTTP storage options holding the canary


def _clean(*texts: object) -> None:
    for text in texts:
        assert CANARY not in str(text), text


def _clean_folder(folder: str | Path) -> list[str]:
    """Assert no file under ``folder`` holds the canary (raw bytes); return the file names seen."""
    seen = []
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            assert CANARY.encode() not in Path(path).read_bytes(), path
            seen.append(os.path.relpath(path, folder))
    return sorted(seen)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    """A folder served over HTTP: ``src`` (LeRobot v2.1, 2 episodes) and ``bad`` (episode 1's video garbage)."""
    folder = str(tmp_path_factory.mktemp("secrets"))
    write_v2(f"{folder}/src", [12, 9], [CAMERA])
    shutil.copytree(f"{folder}/src", f"{folder}/bad")
    Path(f"{folder}/bad/videos/chunk-000/{CAMERA}/episode_000001.mp4").write_bytes(b"not a video " * 40)
    return folder


@pytest.fixture(scope="module")
def server(base):
    """``http://127.0.0.1:PORT`` serving ``base``; the canary is its URLs' password (the server ignores it)."""
    httpd, url = serve_http(base)
    yield url
    httpd.shutdown()


def _with_canary(url: str) -> str:
    return url.replace("http://", f"http://user:{CANARY}@", 1)


def _masked(url: str) -> str:
    return url.replace("http://", f"http://{MASK}@", 1)


class _GuardedHandler(RangeHandler):
    """Answers 401 unless the request carries HTTP basic auth ``user:PASSWORD``."""

    def send_head(self):
        if self.headers.get("Authorization") != "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode():
            self.send_error(401, "Unauthorized")
            return None
        return super().send_head()


@pytest.fixture(scope="module")
def guarded(base):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_GuardedHandler, directory=base))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


# --- the helper ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("s3://AKIAKEY:abc/def+ghi@bucket/raw/ds", "s3://***@bucket/raw/ds"),
        ("https://user:pw@host:8443/ds/meta/info.json", "https://***@host:8443/ds/meta/info.json"),
        ("https://ghp_token@github.com/org/repo", "https://***@github.com/org/repo"),
        ("https://u:p@ss@host/x", "https://***@host/x"),
        (
            "https://b.s3.amazonaws.com/k.mp4?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F2024"
            "&X-Amz-Signature=9f86d08&X-Amz-Expires=60",
            "https://b.s3.amazonaws.com/k.mp4?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***"
            "&X-Amz-Signature=***&X-Amz-Expires=60",
        ),
        ("GET 'https://h/f.tar?sv=2022&sig=AB%2Fcd&se=1' failed", "GET 'https://h/f.tar?sv=2022&sig=***&se=1' failed"),
        ("https://h/a?access_token=xyz#top", "https://h/a?access_token=***#top"),
        # no credentials: kept character for character
        ("https://host/users/@me/file and mail@example.com", "https://host/users/@me/file and mail@example.com"),
        ("https://host:8080/a@b?episode=3", "https://host:8080/a@b?episode=3"),
        (
            "/data/ds/meta/info.json: fps must be a positive number",
            "/data/ds/meta/info.json: fps must be a positive number",
        ),
    ],
)
def test_redact_masks_userinfo_and_secret_query_values_only(text, shown):
    assert redact(text) == shown


def test_remembered_secrets_are_masked_anywhere_and_options_copied_masked():
    options = {
        "endpoint_url": "http://127.0.0.1:9000",
        "key": "AKIA-remembered-key",
        "client_kwargs": {"headers": {"Authorization": "Bearer tok-remembered-1"}, "region_name": "eu-west-1"},
    }
    remember("https://bob:p%40ss-remembered@host/ds", options)
    text = "botocore: AKIA-remembered-key denied; header tok-remembered-1; login p@ss-remembered; http://127.0.0.1:9000"
    assert redact(text) == "botocore: *** denied; header ***; login ***; http://127.0.0.1:9000"
    assert redact_options(options) == {
        "endpoint_url": "http://127.0.0.1:9000",
        "key": MASK,
        "client_kwargs": {"headers": {"Authorization": MASK}, "region_name": "eu-west-1"},
    }
    assert CANARY not in repr(RemoteFile("s3://b/k", 1, Location.of("s3://b", {"secret": CANARY})))
    assert CANARY not in repr(RemoteFile(f"https://user:{CANARY}@host/x.mp4", 1))
    assert CANARY not in repr(Location.of(f"https://user:{CANARY}@host/x"))  # the URL's userinfo too
    assert CANARY not in repr(StreamRun("s3://b/ds", storage_options={"secret": CANARY}))


# --- --storage-options that does not parse ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            '{"key": "AKIA", "secret": "' + CANARY,
            "is not valid JSON: Unterminated string starting at (line 1, column 27; the value is not shown",
        ),
        (
            "{secret: " + CANARY + "}",
            "is not valid JSON: Expecting property name enclosed in double quotes (line 1, column 2; "
            "the value is not shown",
        ),
        (json.dumps([CANARY]), "must be a JSON object, not a JSON array"),
        (json.dumps(CANARY), "must be a JSON object, not a JSON string"),
    ],
    ids=["unterminated", "unquoted-name", "array", "string"],
)
@pytest.mark.parametrize("command", ["convert", "inspect", "verify", "stream", "preview"])
def test_unparsable_storage_options_are_named_not_echoed(command, text, why, capsys):
    positional = ["src", "out"] if command == "convert" else ["out"]
    with pytest.raises(SystemExit) as exit_info:
        cli([command, *positional, "--storage-options", text])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    _clean(out, err)
    assert f"epishard {command}: error: argument --storage-options: --storage-options {why}" in err
    with pytest.raises(ValueError, match=f"^--storage-options {re.escape(why)}") as raised:
        parse_storage_options(text)
    _clean(raised.value)


# --- every command, on good input ---------------------------------------------------------------------


def test_every_command_over_a_url_with_credentials_shows_none(base, server, tmp_path, capsys):
    """convert (-vv) from ``http://user:CANARY@.../src``, then inspect, verify, stream (a plot) and
    preview of the converted dataset served from ``http://user:CANARY@.../converted``."""
    options = json.dumps(HEADERS)
    src = _with_canary(server) + "/src"
    out = f"{base}/converted"
    assert cli(["-vv", "convert", src, out, "--max-episodes-per-shard", "1", "--storage-options", options]) == 0
    printed = capsys.readouterr()
    _clean(printed.out, printed.err)
    assert f"wrote 2 shards, 2 episodes, 21 rows, 0.0 MB to {out}" in printed.out
    manifest = json.loads(Path(f"{out}/manifest.json").read_text())
    assert [(s["name"], s["path"], s["episodes"]) for s in manifest["sources"]] == [
        ("src", _masked(server) + "/src", 2)
    ]
    assert {"manifest.json", "index.arrow", "shard-000000.tar", "shard-000001.index.parquet"} <= set(_clean_folder(out))

    dataset = _with_canary(server) + "/converted"
    shown = _masked(server) + "/converted"
    assert cli(["inspect", dataset, "--json", "--storage-options", options]) == 0
    printed = capsys.readouterr()
    _clean(printed.out, printed.err)
    assert json.loads(printed.out)["root"] == shown

    assert cli(["verify", dataset, "--storage-options", options]) == 0
    printed = capsys.readouterr()
    _clean(printed.out, printed.err)
    assert printed.out.startswith(f"{shown}: 2 shards, 2 episodes, checked in ")

    plot = tmp_path / "telemetry.png"
    argv = ["-v", "stream", dataset, "--frames", "2", "--span", "3", "--action-horizon", "2", "--batch-size", "2"]
    assert (
        cli([*argv, "--workers", "1", "--batches", "3", "--json", "--plot", str(plot), "--storage-options", options])
        == 0
    )
    printed = capsys.readouterr()
    _clean(printed.out, printed.err)
    report = json.loads(printed.out)
    assert (report["dataset"], report["batches"], report["samples"]) == (shown, 3, 6)
    assert plot.stat().st_size > 0

    page = tmp_path / "preview" / "page.html"
    assert (
        cli(["preview", dataset, "--windows", "2", "--frames", "2", "--out", str(page), "--storage-options", options])
        == 0
    )
    printed = capsys.readouterr()
    _clean(printed.out, printed.err)
    assert printed.out.startswith(f"{shown}: 2 windows of 2 episodes: {page}")
    assert f"<title>epishard preview: {shown}</title>" in page.read_text()
    assert _clean_folder(tmp_path) == [
        "preview/page.html",
        "preview/page_sheets/window-000.png",
        "preview/page_sheets/window-001.png",
        "telemetry.png",
    ]


# --- failing inputs ---------------------------------------------------------------------------------------


def test_failing_inputs_name_the_place_without_the_secret(base, server, guarded, tmp_path, capsys):
    missing = _with_canary(server) + "/missing"
    cases = [
        (["convert", missing, str(tmp_path / "o1")], f"{_masked(server)}/missing: no meta/info.json"),
        (["convert", f"http://user:{CANARY}@{guarded[7:]}/src", str(tmp_path / "o2")], "401"),
        (["inspect", missing], f"{_masked(server)}/missing"),
        (["verify", missing], f"{_masked(server)}/missing"),
        (["stream", missing, "--workers", "0"], f"{_masked(server)}/missing: no manifest.json"),
        (["preview", missing, "--out", str(tmp_path / "p.html")], f"{_masked(server)}/missing: no manifest.json"),
        (["--debug", "convert", missing, str(tmp_path / "o3")], f"{_masked(server)}/missing: no meta/info.json"),
    ]
    for argv, named in cases:
        assert cli(argv) == 2, argv
        printed = capsys.readouterr()
        _clean(printed.out, printed.err)
        assert named in printed.err, (argv, printed.err)
    _clean_folder(tmp_path)
    # The right password still works: redaction only changes what is shown.
    assert cli(["convert", f"http://user:{PASSWORD}@{guarded[7:]}/src", str(tmp_path / "ok")]) == 0
    printed = capsys.readouterr()
    assert PASSWORD not in printed.out + printed.err + Path(tmp_path / "ok" / "manifest.json").read_text()


def test_a_bad_video_behind_a_url_is_reported_without_the_secret(base, server, tmp_path, capsys):
    """The skipped episode's report entry (manifest, shard index) and the error of ``--on-error raise``
    name the file by its URL, the password masked."""
    src = _with_canary(server) + "/bad"
    file = f"{_masked(server)}/bad/videos/chunk-000/{CAMERA}/episode_000001.mp4"
    out = tmp_path / "skipped"
    assert cli(["convert", src, str(out), "--on-error", "skip"]) == 0
    printed = capsys.readouterr()
    _clean(printed.out, printed.err)
    skipped = json.loads((out / "manifest.json").read_text())["report"]["skipped"]
    assert [(s["kind"], s["episode"], s["file"]) for s in skipped] == [("unreadable_video", 1, file)]
    _clean_folder(out)

    assert cli(["convert", src, str(tmp_path / "raised")]) == 2
    printed = capsys.readouterr()
    _clean(printed.out, printed.err)
    assert f"[unreadable_video] dataset=bad episode=1 camera={CAMERA} file={file} shard=shard-000000.tar: " in (
        printed.err
    )
    with pytest.raises(ConversionError) as raised:
        convert([src], str(tmp_path / "api"), ConvertOptions(progress=False))
    assert (raised.value.path, raised.value.episode) == (file, 1)
    _clean(raised.value, raised.value.to_dict())


def test_s3_credentials_in_options_and_url_are_not_shown(moto_s3, base, tmp_path, capsys):
    """A moto endpoint: the canary as ``secret`` (a missing bucket) and as a URL's userinfo."""
    options, fs = moto_s3
    fs.mkdir("secrets-src")
    fs.mkdir("secrets-out")
    fs.put(f"{base}/src/", "secrets-src/src/", recursive=True)
    secret = json.dumps({**options, "key": "AKIAEXAMPLE", "secret": CANARY})
    assert cli(["convert", "s3://no-such-bucket/src", str(tmp_path / "o"), "--storage-options", secret]) == 2
    printed = capsys.readouterr()
    _clean(printed.out, printed.err)
    assert "s3://no-such-bucket/src" in printed.err
    assert cli(["convert", "s3://secrets-src/src", "s3://secrets-out/ds", "--storage-options", secret]) == 0
    printed = capsys.readouterr()
    _clean(printed.out, printed.err)
    assert json.loads(fs.cat_file("secrets-out/ds/manifest.json"))["sources"][0]["path"] == "s3://secrets-src/src"
    for path in fs.find("secrets-out"):
        assert CANARY.encode() not in fs.cat_file(path), path
    assert cli(["stream", f"s3://AKIAEXAMPLE:{CANARY}@secrets-out/ds", "--workers", "0", "--batches", "1"]) == 2
    printed = capsys.readouterr()
    _clean(printed.out, printed.err)
    assert "s3://***@secrets-out/ds" in printed.err


# --- the Python API -----------------------------------------------------------------------------------


def test_python_api_logs_warnings_and_errors_name_no_secret(base, server, tmp_path, caplog, monkeypatch):
    """convert, read_lerobot and a WindowDataset whose shard disappears mid-epoch (skipped, warned)."""
    from faultgen import SPEC

    from epishard.stream import DatasetSource, WindowDataset

    monkeypatch.setattr(logging.getLogger("epishard"), "propagate", True)  # a CLI test may have turned it off
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="epishard")  # a CLI test may have set it to WARNING
    src = _with_canary(server) + "/src"
    out = f"{base}/api"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manifest = convert([src], out, ConvertOptions(max_episodes_per_shard=1, progress=False), HEADERS)
        assert manifest.sources[0].path == _masked(server) + "/src"
        with pytest.raises(SourceError) as raised:
            read_lerobot(_with_canary(server) + "/missing")
        assert str(raised.value).startswith(f"{_masked(server)}/missing: no meta/info.json")
        with pytest.raises(FileNotFoundError) as missing:
            DatasetSource(_with_canary(server) + "/nothing")
        assert missing.value.filename == f"{_masked(server)}/nothing"  # opened as verify and inspect open it
        assert missing.value.strerror == "no manifest.json: no such dataset folder, or it is empty"
        ds = WindowDataset(DatasetSource(_with_canary(server) + "/api", HEADERS), SPEC, seed=0)
        os.remove(f"{out}/shard-000001.tar")  # gone after the index was read: its episode is skipped
        keys = {int(s["episode_index"]) for s in ds}
    assert keys == {0}
    skipped = [str(w.message) for w in caught if "skipping episode" in str(w.message)]
    assert skipped and all(f"{_masked(server)}/api/shard-000001.tar" in m for m in skipped), skipped
    # epishard's own records, and fsspec's, which name every URL it requests at DEBUG
    logged = [(r.name, r.getMessage()) for r in caplog.records]
    _clean(raised.value, missing.value, *(w.message for w in caught), *logged)
    assert ("epishard.shardwriter.convert", "shard 0 written: 1 episodes") in logged
    assert ("fsspec.http", _masked(server) + "/src/meta/info.json") in logged
    _clean_folder(out)


def test_python_api_errors_of_describe_verify_and_a_broken_manifest_name_no_secret(base, server):
    """A missing dataset and a manifest that breaks the format, behind a URL with a password: the
    errors name the place (``http://***@...``), never the password."""
    from epishard.format.errors import FormatError
    from epishard.shardwriter import verify
    from epishard.shardwriter.describe import describe
    from epishard.stream import DatasetSource

    url, shown = _with_canary(server), _masked(server)
    with pytest.raises(FileNotFoundError) as described:
        describe(f"{url}/nothing")
    assert described.value.filename == f"{shown}/nothing" and "no manifest.json" in str(described.value)
    with pytest.raises(FileNotFoundError) as verified:
        verify(f"{url}/nothing")
    assert verified.value.filename == f"{shown}/nothing"
    os.makedirs(f"{base}/broken", exist_ok=True)
    Path(f"{base}/broken/manifest.json").write_text('{"format": "epishard"}')
    errors = []
    for open_it in (DatasetSource, describe, verify):
        with pytest.raises(FormatError) as broken:
            open_it(f"{url}/broken")
        assert str(broken.value).startswith(f"{shown}/broken/manifest.json: "), (open_it, broken.value)
        errors.append(broken.value)
    _clean(described.value, verified.value, verified.value.filename, *errors)


def test_tracebacks_of_api_errors_name_no_secret(base, server, tmp_path):
    """The whole traceback a training script prints or logs, chained causes included: a shard gone
    under ``on_shard_error="raise"`` (in this process, and in a DataLoader worker, whose traceback
    arrives as text), and a bad video converted by two writer processes (the pool's remote traceback)."""
    import traceback

    from faultgen import SPEC, make_dataset

    from epishard.stream import WindowDataset, WindowLoader
    from epishard.stream.fetch import FetchPolicy

    root = make_dataset(f"{base}/tb")
    url, shown = _with_canary(server) + "/tb", _masked(server) + "/tb"
    os.remove(f"{root}/shard-000001.tar")
    texts = []
    for workers in (0, 1):
        ds = WindowDataset(url, SPEC, seed=0, read=ReadOptions(fetch=FetchPolicy(on_shard_error="raise")))
        with pytest.raises(Exception) as raised:  # a FetchError, or torch's re-raise of it
            for _ in WindowLoader(ds, batch_size=2, num_workers=workers):
                pass
        texts.append("".join(traceback.format_exception(raised.value)))
        assert f"FetchError: {shown}/shard-000001.tar: " in texts[-1], texts[-1]
    options = ConvertOptions(max_episodes_per_shard=1, workers=2, progress=False)
    with pytest.raises(ConversionError) as converted:
        convert([_with_canary(server) + "/bad"], str(tmp_path / "out"), options)
    texts.append("".join(traceback.format_exception(converted.value)))
    assert f"file={_masked(server)}/bad/videos/chunk-000/{CAMERA}/episode_000001.mp4" in texts[-1]
    _clean(*texts)


def test_verify_reports_a_missing_shard_without_the_secret(base, server):
    """``verify``'s result (returned, printed by ``--json``) names the shard a store could not serve
    by its URL, the password masked."""
    from faultgen import make_dataset

    from epishard.shardwriter import verify

    root = make_dataset(f"{base}/verified")
    os.remove(f"{root}/shard-000002.tar")
    result = verify(_with_canary(server) + "/verified", decode=False)
    assert not result["ok"]
    missing = [p for p in result["problems"] if p["shard"] == "shard-000002.tar"]
    assert missing and f"{_masked(server)}/verified/shard-000002.tar" in missing[0]["message"], result["problems"]
    _clean(json.dumps(result))


def test_an_http_error_chain_shows_no_header_secret(server):
    """An HTTP error answer with the canary in an ``Authorization`` header: aiohttp's
    ``ClientResponseError`` carries the request headers (``request_info``, its ``args``), so the
    ``repr``, ``str`` and formatted traceback of every exception in the chain are checked. The
    answer: a 403 to the manifest (not retried: refused at once)."""
    import traceback

    import aiohttp
    from faultgen import SPEC
    from remote_servers import ThrottleProxy

    from epishard.stream import WindowDataset

    options = {"headers": {"Authorization": "Bearer " + CANARY}}
    proxy = ThrottleProxy(server)
    try:
        proxy.burst_count(1, status=403, match=b"manifest.json")
        with pytest.raises(aiohttp.ClientResponseError) as raised:
            WindowDataset(proxy.url + "/nothing-here", SPEC, read=ReadOptions(storage_options=options))
    finally:
        proxy.close()
    chain, e = [], raised.value
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    responses = [e for e in chain if isinstance(e, aiohttp.ClientResponseError)]
    assert responses, chain
    info = responses[0].request_info
    assert info.headers["Authorization"] == MASK
    assert str(info.url) == proxy.url + "/nothing-here/manifest.json"  # the rest is kept
    assert responses[0].args[0].headers["Authorization"] == MASK
    assert responses[0].status == 403
    texts = ["".join(traceback.format_exception(raised.value))]
    for e in chain:
        texts += [repr(e), str(e), repr(e.args), "".join(traceback.format_exception(e))]
    assert "'Authorization': '***'" in repr(responses[0])
    _clean(*texts)


def test_botocore_debug_logs_show_no_endpoint_userinfo_or_signed_headers(moto_s3, caplog, monkeypatch):
    """The root logger at DEBUG, an ``endpoint_url`` with the canary as its password and a session
    token from the environment (never given to epishard, so only its header name tells it):
    botocore's records (the endpoint it resolves, the request it signs and sends) mask both."""
    import traceback

    import botocore.exceptions

    from epishard.stream import DatasetSource

    options, _ = moto_s3
    endpoint = options["endpoint_url"].replace("http://", f"http://u:{CANARY}@", 1)
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-" + CANARY)
    token = {"retry_budget": 0}
    with pytest.raises(botocore.exceptions.HTTPClientError) as raised:  # aiohttp: auth in the URL and a header
        DatasetSource("s3://no-such-bucket/ds", {"endpoint_url": endpoint, **token})
    _clean(repr(raised.value), "".join(traceback.format_exception(raised.value)))
    records = [(r.name, r.getMessage()) for r in caplog.records]
    boto = [m for name, m in records if name.startswith(("botocore.", "aiobotocore."))]
    assert any(f"'Endpoint': 'http://***@{endpoint.split('@', 1)[1]}'" in m for m in boto), boto[:20]
    assert any("'X-Amz-Security-Token': b'***'" in m for m in boto), boto[:20]
    assert any("x-amz-security-token:***" in m for m in boto), boto[:20]  # the canonical request
    assert "Signature: ***" in boto, boto[:20]  # botocore.auth logs the signature alone
    assert any("'Authorization': b'***'" in m for m in boto), boto[:20]
    _clean(*records, caplog.text)
