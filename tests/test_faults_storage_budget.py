"""Object storage under real-world faults: retries are a time budget, not a count.

A loopback HTTP proxy (``remote_servers.ThrottleProxy``) in front of a moto S3 server or a plain
HTTP file server answers ``503 SlowDown`` or ``429`` (with ``Retry-After``) for a while, resets
every connection, or stops listening; a silent socket stands for a stuck endpoint. Budgets and
bursts are short here (a 2 s burst under a 4 s budget, a 1 s budget that a longer burst exceeds);
the default budget is checked by value. Every surviving read is compared with the no-fault read,
window by window and frame by frame.
"""

from __future__ import annotations

import email.utils
import gc
import re
import time
import warnings
from pathlib import Path

import pytest
import torch
from faultgen import CAMERA, SPEC, convert_to_s3, hang_alarm, source
from remote_servers import FaultProxy, SilentServer, ThrottleProxy, serve_http

from epishard.format.retry import (
    BACKOFF_MAX_S,
    RETRY_BUDGET_S,
    RetryBudgetExceeded,
    S3RetryBudget,
    next_delay,
    retry_after_s,
)
from epishard.format.storage import Location, make_filesystem
from epishard.shardwriter import ConvertOptions, convert, verify
from epishard.stream import WindowDataset
from epishard.stream.fetch import FetchError, FetchPolicy
from epishard.stream.options import ReadOptions

pytest.importorskip("aiohttp")
FAST = dict(backoff_s=0.05, backoff_max_s=0.5)  # retries at least every 0.5 s: bursts end promptly


@pytest.fixture(autouse=True)
def watchdog():
    with hang_alarm(60):
        yield


@pytest.fixture(scope="module")
def http_server(intact):
    server, base = serve_http(intact)
    yield base
    server.shutdown()


@pytest.fixture()
def http_proxy(http_server):
    proxy = ThrottleProxy(http_server)
    yield proxy
    proxy.close()


@pytest.fixture(scope="module")
def s3(moto_s3):
    """The storage options of ``s3://budget/ds``, the converted fault dataset, on the moto server."""
    return convert_to_s3(moto_s3, "budget")[0]


@pytest.fixture()
def s3_proxy(s3):
    proxy = ThrottleProxy(s3["endpoint_url"])
    yield proxy
    proxy.close()


def _same_windows(got: list[dict], reference: list[dict]) -> None:
    """The exact windows of the no-fault read, in its order, with the same frames; none substituted."""
    assert [(int(s["episode_index"]), int(s["frame_index"])) for s in got] == [
        (int(s["episode_index"]), int(s["frame_index"])) for s in reference
    ]
    assert not any(bool(s["substitute"]) for s in got)
    for a, b in zip(got, reference, strict=True):
        assert torch.equal(a[CAMERA], b[CAMERA]) and torch.equal(a["action"], b["action"])


# --- the defaults, by value -------------------------------------------------------------------------


def test_default_budget_survives_a_30_s_burst_by_value():
    policy = FetchPolicy()
    assert RETRY_BUDGET_S >= 30 + BACKOFF_MAX_S  # a 30 s burst plus the last backoff fits
    assert policy.retry_budget_s == RETRY_BUDGET_S and policy.retries is None  # a time budget, not a count
    fs, _ = make_filesystem(Location.of("s3://bucket/ds", {"endpoint_url": "http://127.0.0.1:9"}))  # the writer
    budgets = [
        h.__self__.budget_s
        for h in fs.session._events._emitter._handlers.prefix_search("needs-retry.s3")
        if isinstance(getattr(h, "__self__", None), S3RetryBudget)
    ]
    assert budgets == [RETRY_BUDGET_S]
    assert fs.config_kwargs["retries"] == {"mode": "standard", "total_max_attempts": 1}  # ours is the only loop


def test_retry_after_seconds_and_http_date():
    now = 1_800_000_000.0
    assert retry_after_s("3") == 3.0 and retry_after_s(" 1.5 ") == 1.5 and retry_after_s("-4") == 0.0
    assert retry_after_s(email.utils.formatdate(now + 7, usegmt=True), now=now) == 7.0
    assert retry_after_s(email.utils.formatdate(now - 7, usegmt=True), now=now) == 0.0  # a date past: at once
    assert retry_after_s(None) is None and retry_after_s("soon") is None


def test_backoff_is_full_jitter_within_the_budget():
    started = time.monotonic()
    delays = [next_delay(started, 10, 60.0, None, 0.05, 2.0) for _ in range(400)]
    assert all(0.0 <= d <= 2.0 for d in delays)  # capped
    assert min(delays) < 0.2 and max(delays) > 1.8  # spread over the whole range: full jitter
    assert next_delay(started, 0, 60.0, 5.0) >= 5.0  # Retry-After is a floor
    assert next_delay(started - 59.9, 10, 60.0, None, 0.05, 2.0) <= 0.1 + 1e-6  # never past the budget
    assert next_delay(started, 0, 60.0, 61.0) is None  # Retry-After past the budget: give up now
    assert next_delay(started - 60.0, 0, 60.0) is None


# --- reads survive bursts and outages ----------------------------------------------------------------


def test_http_open_and_read_survive_a_2_s_burst_of_503(http_proxy, reference):
    proxy = http_proxy
    t = time.monotonic()
    proxy.burst(2.0, status=503)  # the manifest and index reads meet it, then the shard reads
    ds = WindowDataset(
        proxy.url, SPEC, seed=5, read=ReadOptions(fetch=FetchPolicy(mode="ranged", retry_budget_s=4, **FAST))
    )
    got = list(ds)
    _same_windows(got, reference)
    assert proxy.answered(503) >= 3 and time.monotonic() - t >= 1.8  # it did wait the burst out


@pytest.mark.parametrize("transport", ["s3fs", "presigned"])
def test_s3_read_survives_a_2_s_burst_of_slowdown(s3, s3_proxy, reference, transport):
    policy = FetchPolicy(retry_budget_s=4, s3_transport=transport, **FAST)
    ds = WindowDataset(
        "s3://budget/ds", SPEC, seed=5, read=ReadOptions(storage_options={"endpoint_url": s3_proxy.url}, fetch=policy)
    )
    s3_proxy.burst(2.0, status=503, match=b".tar")
    got, skipped = _read_from(ds)
    _same_windows(got, reference)
    assert not skipped and s3_proxy.answered(503) >= 3


def _read_from(ds) -> tuple[list[dict], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = list(ds)
    return samples, [str(w.message) for w in caught if "epishard: skipping" in str(w.message)]


def test_s3_open_and_read_survive_an_outage_of_resets_and_refusals(s3, s3_proxy, reference):
    # The manifest and index reads meet it (every connection reset): 2.5 s, so a client that takes a
    # second to make its first request on a loaded machine still meets it, within the 4 s budget.
    s3_proxy.outage(2.5)
    ds = WindowDataset(
        "s3://budget/ds",
        SPEC,
        seed=5,
        read=ReadOptions(storage_options={"endpoint_url": s3_proxy.url}, fetch=FetchPolicy(retry_budget_s=4, **FAST)),
    )
    assert s3_proxy.answered("reset") >= 1
    s3_proxy.refuse(1.0)  # then nothing listens
    got, skipped = _read_from(ds)
    _same_windows(got, reference)
    assert not skipped


def test_http_429_retry_after_is_honoured(http_proxy, reference):
    proxy = http_proxy
    ds = WindowDataset(
        proxy.url,
        SPEC,
        seed=5,
        read=ReadOptions(fetch=FetchPolicy(retry_budget_s=4, backoff_s=0.01, backoff_max_s=0.02)),
    )
    proxy.burst_count(1, status=429, retry_after="1", match=b"shard-000000.tar")
    mark = len(proxy.log)
    got = list(ds)
    _same_windows(got, reference)
    log = [e for e in proxy.log[mark:] if "shard-000000.tar" in e[2]]
    assert log[0][3] == 429
    assert log[1][0] - log[0][0] >= 1.0  # waited the server's 1 s, not the 0.02 s backoff


def test_retry_after_past_the_budget_fails_at_once_naming_it(http_proxy):
    proxy = http_proxy
    ds = WindowDataset(
        proxy.url, SPEC, seed=5, read=ReadOptions(fetch=FetchPolicy(retry_budget_s=2, on_shard_error="raise"))
    )
    proxy.burst_count(1, status=429, retry_after="100", match=b"shard-000000.tar")
    t = time.monotonic()
    with pytest.raises(FetchError) as err:
        list(ds)
    assert time.monotonic() - t < 1.5
    message = str(err.value)
    assert f"{proxy.url}/shard-000000.tar" in message and "HTTP 429" in message
    assert "retry budget 2 s; Retry-After 100" in message and "after 0 retries" in message


# --- a budget that runs out: the error names URL, status and time; only that shard is lost -------------


def test_http_budget_exceeded_names_url_status_and_time_and_loses_only_that_shard(http_proxy, reference):
    proxy = http_proxy
    policy = FetchPolicy(retry_budget_s=1, **FAST)
    ds = WindowDataset(proxy.url, SPEC, seed=5, read=ReadOptions(fetch=policy))
    proxy.burst(30.0, status=503, match=b"shard-000001.tar")
    got, skipped = _read_from(ds)
    strict = WindowDataset(
        proxy.url, SPEC, seed=5, read=ReadOptions(fetch=FetchPolicy(retry_budget_s=1, on_shard_error="raise", **FAST))
    )
    t = time.monotonic()
    with pytest.raises(FetchError) as err:
        list(strict)
    spent = time.monotonic() - t
    assert len(got) == len(reference)
    assert {int(s["episode_index"]) for s in got if not s["substitute"]} == {0, 1, 4, 5}  # shard 1 holds 2 and 3
    assert sum(int(s["episode_index"]) in (0, 1, 4, 5) for s in reference) == sum(not s["substitute"] for s in got)
    assert len(skipped) == 2
    message = str(err.value)
    assert f"{proxy.url}/shard-000001.tar: bytes " in message and "HTTP 503" in message
    seconds = float(re.search(r"retries in ([\d.]+) s: retry budget 1 s\)", message).group(1))
    assert 1.0 <= seconds <= 1.8 and spent < 3.5


def test_a_stuck_range_costs_at_most_read_timeout_plus_budget(http_server, intact):
    host, port = http_server.rsplit("/", 1)[1].split(":")
    proxy = FaultProxy((host, int(port)), match=b"shard-000001.tar", stall=True)  # answers nothing for shard 1
    policy = FetchPolicy(connect_timeout_s=0.5, read_timeout_s=0.5, retry_budget_s=1.0, on_shard_error="raise", **FAST)
    try:
        ds = WindowDataset(f"http://127.0.0.1:{proxy.port}", SPEC, seed=5, read=ReadOptions(fetch=policy))
        with pytest.raises(FetchError) as err:
            list(ds)
    finally:
        proxy.close()
    message = str(err.value)
    assert "shard-000001.tar: bytes " in message and "Timeout" in message, message
    seconds = float(re.search(r"retries in ([\d.]+) s: retry budget 1 s\)", message).group(1))
    assert 1.0 <= seconds <= 0.5 + 1.0 + 0.4  # the budget, plus at most one read timeout
    assert proxy.stalled >= 2


def test_a_silent_http_endpoint_fails_within_the_budget_naming_the_timeout():
    silent = SilentServer()
    policy = FetchPolicy(connect_timeout_s=0.3, read_timeout_s=0.3, retry_budget_s=0.6, **FAST)
    t = time.monotonic()
    try:
        with pytest.raises(FetchError, match=r"manifest\.json: .*Timeout.* in [01]\.\d s: retry budget 0\.6 s\)"):
            WindowDataset(silent.url, SPEC, read=ReadOptions(fetch=policy))
    finally:
        silent.close()
    # a size probe (HEAD, GET), then the budgeted read, plus 2 s of scheduling slack on a loaded 2-core machine
    assert time.monotonic() - t <= 2 * 0.3 + 0.3 + 0.6 + 2.0


# --- convert writing to s3:// ------------------------------------------------------------------------


def test_convert_to_s3_survives_a_2_s_burst_of_slowdown(s3, s3_proxy, intact, moto_s3):
    _, fs = moto_s3
    url = "s3://budget/burst"
    options = {"endpoint_url": s3_proxy.url, "retry_budget": 4}
    s3_proxy.burst(2.0, status=503, from_first=True)  # from the first request: the convert's start is not timed
    manifest = convert(
        [source()], url, ConvertOptions(max_episodes_per_shard=2, progress=False), storage_options=options
    )
    assert s3_proxy.answered(503) >= 3
    assert verify(url, decode=False, storage_options=s3)["ok"]
    for shard in manifest.shards:  # byte-identical to the no-fault local conversion
        assert fs.cat_file(f"budget/burst/{shard.shard}") == Path(intact, shard.shard).read_bytes()
    assert sorted(s.shard for s in manifest.shards) == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]


def test_convert_to_s3_honours_retry_after(s3, s3_proxy):
    s3_proxy.burst_count(1, status=503, retry_after="1", match=b"PUT ")
    mark = len(s3_proxy.log)
    convert(
        [source(2)],
        "s3://budget/after",
        ConvertOptions(max_episodes_per_shard=2, progress=False),
        storage_options={"endpoint_url": s3_proxy.url, "retry_budget": 4},
    )
    puts = [e for e in s3_proxy.log[mark:] if e[1] == "PUT"]
    assert puts[0][3] == 503 and puts[1][2] == puts[0][2]  # the same request asked again
    assert puts[1][0] - puts[0][0] >= 1.0


def test_convert_budget_exceeded_names_url_status_and_time(s3, s3_proxy):
    s3_proxy.burst(30.0, status=503, match=b"PUT ")
    options = {"endpoint_url": s3_proxy.url, "retry_budget": 1}
    t = time.monotonic()
    with pytest.raises(RetryBudgetExceeded) as err:
        convert([source(2)], "s3://budget/lost", ConvertOptions(progress=False), storage_options=options)
    assert time.monotonic() - t < 4.0
    message = str(err.value)
    assert re.search(rf"PUT {re.escape(s3_proxy.url)}/budget/lost/\S+: HTTP 503 SlowDown", message), message
    seconds = float(re.search(r"attempts in ([\d.]+) s: retry budget 1 s\)", message).group(1))
    assert 1.0 <= seconds <= 1.8 and err.value.status == 503


def test_convert_to_a_silent_s3_endpoint_is_bounded_by_read_timeout_plus_budget(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    silent = SilentServer()
    options = {"endpoint_url": silent.url, "connect_timeout": 0.3, "read_timeout": 0.3, "retry_budget": 0.6}
    t = time.monotonic()
    try:
        with pytest.raises(RetryBudgetExceeded, match=r"Read timeout .* in [01]\.\d s: retry budget 0\.6 s\)"):
            convert([source(2)], "s3://stuck/ds", ConvertOptions(progress=False), storage_options=options)
    finally:
        silent.close()
    # s3fs's exists() swallows the first calls' errors: up to 3 rounds of timeout + budget, plus 2 s of scheduling
    # slack on a loaded 2-core machine (the defaults this guards against wait 60 s and more)
    assert time.monotonic() - t <= 3 * (0.3 + 0.6) + 2.0


# --- a missing bucket is named -----------------------------------------------------------------------


def test_a_missing_bucket_is_named_by_the_reader_and_inspect(s3):
    from epishard.shardwriter.describe import describe

    with pytest.raises(FileNotFoundError, match=r"bucket 'no-such-bucket' does not exist") as err:
        WindowDataset("s3://no-such-bucket/ds", SPEC, read=ReadOptions(storage_options=s3))
    assert err.value.filename == "s3://no-such-bucket/ds"
    with pytest.raises(FileNotFoundError, match=r"bucket 'no-such-bucket' does not exist"):
        describe("s3://no-such-bucket/ds", storage_options=s3)
    with pytest.raises(FileNotFoundError, match=r"no manifest\.json"):  # an existing bucket, no dataset
        WindowDataset("s3://budget/nothing-here", SPEC, read=ReadOptions(storage_options=s3))


def test_the_storage_option_retry_budget_sets_the_readers_budget(s3, s3_proxy):
    options = {"endpoint_url": s3_proxy.url, "retry_budget": 0.5}
    ds = WindowDataset(
        "s3://budget/ds",
        SPEC,
        seed=5,
        read=ReadOptions(storage_options=options, fetch=FetchPolicy(on_shard_error="raise")),
    )
    s3_proxy.burst(30.0, status=503, match=b"shard-000000.tar")
    with pytest.raises(
        FetchError, match=r"shard-000000\.tar: bytes .*HTTP 503 SlowDown.* in [01]\.\d s: retry budget 0\.5 s\)"
    ):
        list(ds)


@pytest.mark.parametrize("value", [-1.0, float("nan")])
def test_a_negative_or_nan_budget_is_refused(value):
    with pytest.raises(ValueError, match=r"retry_budget_s \((-1\.0|nan)\)"):
        FetchPolicy(retry_budget_s=value)
    with pytest.raises(
        ValueError, match=r"storage option retry_budget \((-1\.0|nan)\) must be a number of seconds >= 0"
    ):
        Location.of("s3://bucket/ds", {"endpoint_url": "http://127.0.0.1:9", "retry_budget": value})


@pytest.mark.parametrize("option", ["retry_budget", "connect_timeout", "read_timeout"])
@pytest.mark.parametrize("value", [float("inf"), "inf", True, "abc", None])
def test_an_endless_or_unreadable_storage_option_is_refused(option, value):
    """Nothing waits forever: infinity, a boolean or text is no number of seconds (named, with the URL)."""
    named = rf"s3://bucket/ds: storage option {option} \(.*\) must be a number of seconds"
    with pytest.raises(ValueError, match=named):
        Location.of("s3://bucket/ds", {option: value})
    with pytest.raises(ValueError, match=r"RetryPolicy: budget_s \(inf\) must be a finite number >= 0"):
        _ = FetchPolicy(retry_budget_s=float("inf")).retry


def _uploads_in_progress(fs, prefix: str) -> list[str]:
    answer = fs.call_s3("list_multipart_uploads", Bucket="budget", Prefix=prefix)
    return [u["Key"] for u in answer.get("Uploads", [])]


@pytest.mark.parametrize("fail", ["complete", "part"])
def test_a_multipart_upload_out_of_budget_is_aborted_and_its_own_error_raised(s3, s3_proxy, moto_s3, fail):
    from epishard.format.storage import Storage

    _, fs = moto_s3
    storage = Storage(f"s3://budget/mpu-{fail}", {"endpoint_url": s3_proxy.url, "retry_budget": 0.5})
    storage.fs.default_block_size = 5 << 20  # parts of 5 MiB (S3's smallest), so 11 MiB is a multipart upload
    if fail == "complete":  # the last step, in close(): CompleteMultipartUpload
        s3_proxy.burst(30.0, status=503, match=f"POST /budget/mpu-{fail}/big.bin?uploadId".encode())
        expected = r"POST \S+/big\.bin\?uploadId=\S+: HTTP 503 SlowDown"
    else:  # a part, and then the abort too: the store is still failing
        s3_proxy.burst(30.0, status=503, match=b"uploadId")
        expected = r"PUT \S+/big\.bin\?partNumber=\d+&uploadId=\S+: HTTP 503 SlowDown"
    with pytest.raises(RetryBudgetExceeded, match=expected), storage.writer("big.bin") as f:
        f.write(b"x" * (11 << 20))
    s3_proxy.clear()  # the store is back: a file left open would complete its upload when collected
    del f
    gc.collect()
    fs.invalidate_cache()
    assert not fs.exists(f"budget/mpu-{fail}/big.bin")  # nothing under the key
    left = _uploads_in_progress(fs, f"mpu-{fail}/")
    assert left == ([] if fail == "complete" else [f"mpu-{fail}/big.bin"])  # aborted, unless the abort failed too


# --- verify and inspect over HTTP --------------------------------------------------------------------


def test_verify_and_inspect_over_http_survive_a_2_s_burst_of_503(http_proxy, intact):
    from epishard.shardwriter.describe import describe

    options = {"retry_budget": 4}
    http_proxy.burst(2.0, status=503)
    result = verify(http_proxy.url, decode=False, storage_options=options)
    assert result["ok"] and result["shards"] == 3 and result["episodes"] == 6, result
    assert http_proxy.answered(503) >= 3
    http_proxy.burst(2.0, status=429, retry_after="0.5")
    assert describe(http_proxy.url, storage_options=options) == {**describe(intact), "root": http_proxy.url}


def test_verify_over_http_names_the_url_and_status_when_the_budget_runs_out(http_proxy):
    http_proxy.burst(30.0, status=503, match=b"manifest.json")
    with pytest.raises(
        RetryBudgetExceeded, match=rf"{re.escape(http_proxy.url)}/manifest\.json: HTTP 503 .* s: retry budget 0\.5 s\)"
    ):
        verify(http_proxy.url, decode=False, storage_options={"retry_budget": 0.5})


def test_convert_from_an_http_lerobot_source_survives_a_burst_on_its_videos(tmp_path):
    from lerobotgen import write_v2

    write_v2(str(tmp_path / "src" / "v2"), [12, 9, 15], [CAMERA])
    convert([str(tmp_path / "src" / "v2")], str(tmp_path / "local"), ConvertOptions(progress=False))
    server, base = serve_http(str(tmp_path / "src"))
    proxy = ThrottleProxy(base)
    try:
        proxy.burst(2.0, status=503, match=b".mp4")
        url = f"{proxy.url}/v2"
        convert([url], str(tmp_path / "out"), ConvertOptions(progress=False), storage_options={"retry_budget": 4})
    finally:
        proxy.close()
        server.shutdown()
    assert proxy.answered(503) >= 3
    for shard in sorted(p.name for p in (tmp_path / "local").glob("shard-*")):  # the bytes of the local copy's output
        assert (tmp_path / "out" / shard).read_bytes() == (tmp_path / "local" / shard).read_bytes(), shard


def test_a_dead_http_source_is_retried_and_named_not_taken_for_an_empty_folder(tmp_path):
    """Nothing listens: fsspec's listing took the refused connection for an empty folder, and
    convert said 'no meta/info.json' at once. Now the root is asked again for the budget and the
    error names the URL, the connection error and the time."""
    import socket

    from epishard.format.retry import RetryBudgetExceeded
    from epishard.shardwriter.lerobot import read_lerobot

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RetryBudgetExceeded) as caught:
        read_lerobot(f"http://127.0.0.1:{port}/ds", storage_options={"retry_budget": 0.5})
    message = str(caught.value)
    assert f"127.0.0.1:{port}/ds" in message and "retry budget 0.5 s" in message
    assert "info.json" not in message


_EXIT_CHILD = """
import asyncio, json, sys
import aiohttp.connector

close = aiohttp.connector.BaseConnector.close


async def slow_close(self, *args, **kwargs):  # a busy loop at exit: longer than s3fs's own 0.1 s close
    await asyncio.sleep(0.3)
    return await close(self, *args, **kwargs)


aiohttp.connector.BaseConnector.close = slow_close
sys.path.insert(0, sys.argv[2])
from faultgen import SPEC
from epishard.stream import WindowDataset
from epishard.stream.options import ReadOptions

options = json.loads(sys.argv[1])
print(len(list(WindowDataset("s3://budget/ds", SPEC, seed=0, read=ReadOptions(storage_options=options)))))
"""


def test_a_process_that_read_from_s3_exits_without_a_client_warning(s3):
    """Every S3 client is closed on its own event loop at exit (``storage._close_at_exit``): no "Unclosed
    client session" / "attached to a different loop" / "Task exception was never retrieved", even when
    closing takes longer than s3fs's own 0.1 s attempt (made slow here, as a busy loop makes it)."""
    import json
    import subprocess
    import sys

    tests = str(Path(__file__).parent)
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_CHILD, json.dumps(s3), tests], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > 0
    for said in ("Unclosed client session", "different loop", "never retrieved", "Unclosed connector"):
        assert said not in done.stderr, done.stderr
