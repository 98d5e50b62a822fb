"""``FetchPolicy(s3_transport="presigned")``: each shard's URL signed once, every range a plain GET on a
urllib3 pool (``epishard.format.presigned``). The same windows as through s3fs; errors classified as
the fetcher's retries expect; no message carries the signature or the access key id; refused where it
cannot serve. (Its retries under a burst of 503 SlowDown: ``tests/test_faults_storage_budget.py``.)"""

from __future__ import annotations

import http.server
import pickle
import re
import ssl
import threading
import time
from types import SimpleNamespace

import pytest
import torch
import urllib3
from faultgen import CAMERA, SPEC, convert_to_s3, hang_alarm, source
from remote_servers import FaultProxy

from epishard.format.presigned import (
    HTTPStatusError,
    PresignedRanges,
    TLSFailure,
    _connection_failure,
    presigned_refusal,
    tls_options,
)
from epishard.shardwriter import ConvertOptions, convert
from epishard.stream import WindowDataset, WindowLoader
from epishard.stream.fetch import FetchError, FetchPolicy, retryable
from epishard.stream.options import ReadOptions

SIGNED = ("X-Amz-Signature", "X-Amz-Credential", "testing")  # the query's signature, the key id's value


@pytest.fixture(scope="module")
def s3(moto_s3):
    return convert_to_s3(moto_s3, "signed")


def _read(options, transport: str) -> list[dict]:
    policy = FetchPolicy(mode="ranged", s3_transport=transport)
    return list(WindowDataset("s3://signed/ds", SPEC, seed=5, read=ReadOptions(storage_options=options, fetch=policy)))


def test_presigned_reads_the_same_windows_as_s3fs(s3):
    options, _ = s3
    plain, signed = _read(options, "s3fs"), _read(options, "presigned")
    assert len(signed) == len(plain) > 0
    for a, b in zip(signed, plain, strict=True):
        assert (int(a["episode_index"]), int(a["frame_index"])) == (int(b["episode_index"]), int(b["frame_index"]))
        assert torch.equal(a[CAMERA], b[CAMERA]) and torch.equal(a["action"], b["action"])
        assert not bool(a["substitute"])


def test_workers_and_a_pickled_dataset_read_through_their_own_clients(s3):
    options, _ = s3
    policy = FetchPolicy(mode="ranged", s3_transport="presigned")
    ds = WindowDataset("s3://signed/ds", SPEC, seed=5, read=ReadOptions(storage_options=options, fetch=policy))
    want = sorted((int(s["episode_index"]), int(s["frame_index"])) for s in _read(options, "s3fs"))
    with hang_alarm(120):
        got = [b for b in WindowLoader(ds, batch_size=2, num_workers=2)]  # forked workers
        again = list(pickle.loads(pickle.dumps(ds)))  # as a spawned worker or a Ray actor gets it
    seen = sorted((int(e), int(f)) for b in got for e, f in zip(b["episode_index"], b["frame_index"], strict=True))
    assert seen == want and sorted((int(s["episode_index"]), int(s["frame_index"])) for s in again) == want


def test_ranges_errors_and_their_classes(s3):
    _, fs = s3
    ranges = PresignedRanges(SimpleNamespace(fs=fs), connect_s=2, read_s=5)
    shard = sorted(k for k in fs.find("signed/ds") if k.endswith(".tar"))[0]
    assert ranges.get(shard, 100, 612) == fs.cat_file(shard, start=100, end=612)
    with pytest.raises(FileNotFoundError) as missing:
        ranges.get("signed/ds/no-such-shard.tar", 0, 10)
    assert not retryable(missing.value) and "s3://signed/ds/no-such-shard.tar" in str(missing.value)
    nowhere = "http://127.0.0.1:9/{}?X-Amz-Signature=s"  # nothing listens on port 9
    signer = type("Signer", (), {"url": lambda self, path, expires: nowhere.format(path)})()
    dead = PresignedRanges(SimpleNamespace(fs=signer), connect_s=1, read_s=1)
    with pytest.raises(ConnectionError) as refused:
        dead.get(shard, 0, 10)
    assert retryable(refused.value) and refused.value.__cause__ is None
    for e in (missing.value, refused.value):
        assert not any(s in str(e) for s in SIGNED), str(e)
    slow = HTTPStatusError("s3://signed/ds/x.tar", 503, "SlowDown", {"retry-after": "2"})
    assert retryable(slow) and not retryable(HTTPStatusError("s3://b/x", 400, "InvalidRange", {}))
    again = pickle.loads(pickle.dumps(slow))
    assert (type(again), again.status, again.code, str(again)) == (HTTPStatusError, 503, "SlowDown", str(slow))


def test_a_url_is_signed_once_and_again_before_it_expires(s3):
    _, fs = s3
    shard = sorted(k for k in fs.find("signed/ds") if k.endswith(".tar"))[0]
    signed: list[str] = []

    class Counting:
        def url(self, path, expires):
            signed.append(path)
            return fs.url(path, expires=expires)

    ranges = PresignedRanges(SimpleNamespace(fs=Counting()), connect_s=2, read_s=5, expires_s=1)
    for a in range(0, 4000, 1000):
        ranges.get(shard, a, a + 100)
    assert signed == [shard]  # once for four ranges
    time.sleep(0.85)  # past 0.8 of its validity: signed again
    ranges.get(shard, 0, 100)
    assert signed == [shard, shard]


def test_where_it_cannot_serve_it_is_refused(s3, tmp_path):
    options, _ = s3
    assert presigned_refusal({"endpoint_url": "x"}) is None
    assert "requester_pays" in presigned_refusal({"requester_pays": True})
    assert "SSECustomerKey" in presigned_refusal({"s3_additional_kwargs": {"SSECustomerKey": "k"}})
    with pytest.raises(ValueError, match="requester_pays"):
        WindowDataset(
            "s3://signed/ds",
            SPEC,
            read=ReadOptions(
                storage_options={**options, "requester_pays": True}, fetch=FetchPolicy(s3_transport="presigned")
            ),
        )
    local = str(tmp_path / "ds")
    convert([source()], local, ConvertOptions(progress=False))
    with pytest.raises(ValueError, match="s3:// datasets only"):
        WindowDataset(local, SPEC, read=ReadOptions(fetch=FetchPolicy(s3_transport="presigned")))
    with pytest.raises(ValueError, match="s3_transport"):
        FetchPolicy(s3_transport="curl")


def test_a_failed_shard_names_the_object_not_the_signature(s3):
    options, fs = s3
    fs.copy("signed/ds", "signed/broken", recursive=True)
    shard = sorted(k for k in fs.find("signed/broken") if k.endswith(".tar"))[0]
    fs.rm(shard)
    policy = FetchPolicy(mode="ranged", s3_transport="presigned", on_shard_error="raise", retry_budget_s=1)
    ds = WindowDataset("s3://signed/broken", SPEC, seed=5, read=ReadOptions(storage_options=options, fetch=policy))
    with pytest.raises(FetchError) as failed:
        list(ds)
    text = str(failed.value)
    assert shard.split("/")[-1] in text and not any(s in text for s in SIGNED), text


# --- answers S3 gives that moto does not: a small server of our own ------------------------------------

_BODY = bytes(range(256)) * 64
_SIGNED = re.compile(r"(Signature|X-Amz-Signature|X-Amz-Credential|AWSAccessKeyId)=(?!\*\*\*)")


class _Answers(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "ok"

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        a, b = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
        first_signature = self.path.endswith("Signature=s1")
        if _Answers.mode == "redirect":
            return self._send(
                307, b"<Error><Code>TemporaryRedirect</Code></Error>", Location="http://elsewhere" + self.path
            )
        if _Answers.mode == "gzip":  # stored gzip-encoded: the stored bytes are what a range holds
            return self._send(206, _BODY[a : b + 1], Content_Encoding="gzip")
        if _Answers.mode == "token" and first_signature:
            return self._send(400, b"<Error><Code>ExpiredToken</Code><Message>expired</Message></Error>")
        return self._send(206, _BODY[a : b + 1])


@pytest.fixture()
def answers():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port, signed = server.server_address[1], []

    class Signer:
        def url(self, path, expires):
            signed.append(path)
            return (
                f"http://127.0.0.1:{port}/{path}?X-Amz-Credential=AKIA0000SECRET&X-Amz-Signature=s{signed.count(path)}"
            )

    yield PresignedRanges(SimpleNamespace(fs=Signer()), connect_s=2, read_s=2), signed
    server.shutdown()


def _chain_text(exc: BaseException) -> str:
    """Everything an exception and its chain say: str, repr and attribute values."""
    out, seen, e = [], set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out += [str(e), repr(e), *map(repr, vars(e).values())]
        e = e.__cause__ or e.__context__
    return "\n".join(out)


def test_answers_s3fs_would_read_the_same_way(answers):
    ranges, signed = answers
    _Answers.mode = "gzip"
    assert ranges.get("b/k.tar", 100, 612) == _BODY[100:612]  # not decoded: the stored bytes
    _Answers.mode = "token"  # temporary credentials expired (HTTP 400 ExpiredToken): signed again, once
    assert ranges.get("b/other.tar", 0, 10) == _BODY[:10] and signed.count("b/other.tar") == 2
    _Answers.mode = "redirect"
    with pytest.raises(HTTPStatusError) as moved:
        ranges.get("b/k.tar", 0, 10)
    assert moved.value.status == 307 and not _SIGNED.search(_chain_text(moved.value))
    assert not _SIGNED.search(_chain_text(pickle.loads(pickle.dumps(moved.value))))
    _Answers.mode = "ok"


def test_a_timed_out_read_keeps_no_signed_url_anywhere_in_its_chain(s3):
    options, _ = s3
    host, port = options["endpoint_url"].removeprefix("http://").split(":")
    proxy = FaultProxy((host, int(port)), match=b".tar", stall=True)
    try:
        policy = FetchPolicy(mode="ranged", s3_transport="presigned", on_shard_error="raise", retry_budget_s=0.5)
        opts = {"endpoint_url": f"http://127.0.0.1:{proxy.port}", "read_timeout": 0.5}
        ds = WindowDataset("s3://signed/ds", SPEC, seed=5, read=ReadOptions(storage_options=opts, fetch=policy))
        with hang_alarm(60), pytest.raises(FetchError) as failed:
            list(ds)
    finally:
        proxy.close()
    assert proxy.stalled >= 1 and "Timeout" in str(failed.value)
    assert not _SIGNED.search(_chain_text(failed.value)), _chain_text(failed.value)


def test_proxies_are_refused_and_tls_settings_followed(monkeypatch):
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    assert "proxies" in presigned_refusal({"config_kwargs": {"proxies": {"https": "http://p:3128"}}})
    assert presigned_refusal({"client_kwargs": {"verify": False}}) is None
    monkeypatch.setenv("HTTPS_PROXY", "http://p:3128")
    assert "HTTPS_PROXY" in presigned_refusal({"endpoint_url": "https://s3.example"})
    assert tls_options({"client_kwargs": {"verify": False}}) == {"cert_reqs": "CERT_NONE"}
    assert tls_options({"client_kwargs": {"verify": "/etc/ssl/corp.pem"}}) == {"ca_certs": "/etc/ssl/corp.pem"}
    assert tls_options({}) == {}
    monkeypatch.setenv("AWS_CA_BUNDLE", "/etc/ssl/env.pem")
    assert tls_options({}) == {"ca_certs": "/etc/ssl/env.pem"}


def test_a_certificate_that_does_not_verify_is_not_retried():
    failure = _connection_failure(
        urllib3.exceptions.SSLError(ssl.SSLCertVerificationError(1, "certificate verify failed")), "s3://b/k.tar"
    )
    assert isinstance(failure, TLSFailure) and not retryable(failure)
    reset = _connection_failure(urllib3.exceptions.ProtocolError("reset", ConnectionResetError()), "s3://b/k.tar")
    assert isinstance(reset, ConnectionError) and retryable(reset) and str(reset) == "s3://b/k.tar: ProtocolError"
