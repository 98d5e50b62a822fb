"""The object-storage benchmarks' S3 server (``tools/bench/s3server.py``: moto answering ranged GETs from the
object's buffer) sends the same bytes, status and Content-Range as moto's own code path; ``upload`` copies a
folder tree as it is."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

pytest.importorskip("moto.server")
s3fs = pytest.importorskip("s3fs")
pytest.importorskip("botocore")
import botocore.session  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 3_000_003


def _bench():
    if os.path.join(REPO, "tools", "bench") not in sys.path:
        sys.path.insert(0, os.path.join(REPO, "tools", "bench"))
    import s3server

    return s3server


def _get(client, rng: str | None) -> tuple[int, str | None, bytes]:
    from botocore.exceptions import ClientError

    try:
        r = client.get_object(Bucket="bench", Key="shard.tar", **({"Range": rng} if rng else {}))
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], None, b""
    return r["ResponseMetadata"]["HTTPStatusCode"], r.get("ContentRange"), r["Body"].read()


@pytest.fixture(scope="module")
def servers(monkeypatch_module):
    bench = _bench()
    monkeypatch_module.setenv("AWS_ACCESS_KEY_ID", "bench")
    monkeypatch_module.setenv("AWS_SECRET_ACCESS_KEY", "bench")
    monkeypatch_module.setenv("AWS_DEFAULT_REGION", "us-east-1")
    data = np.random.default_rng(3).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    out = {}
    for stock in (False, True):
        server = bench.Server([0], stock_moto=stock)
        fs = s3fs.S3FileSystem(endpoint_url=server.endpoint, skip_instance_cache=True)
        fs.mkdir("bench")
        fs.pipe_file("bench/shard.tar", data)
        client = botocore.session.get_session().create_client(
            "s3", endpoint_url=server.endpoint, region_name="us-east-1"
        )
        out[stock] = (server, client)
    yield data, out
    for server, _ in out.values():
        server.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


RANGES = [
    ("bytes=0-0", slice(0, 1)),
    ("bytes=1000-151999", slice(1000, 152000)),
    ("bytes=2999000-", slice(2999000, SIZE)),
    ("bytes=2999000-9999999", slice(2999000, SIZE)),
    ("bytes=-4096", slice(SIZE - 4096, SIZE)),
    (None, slice(0, SIZE)),
]


@pytest.mark.parametrize(("rng", "want"), RANGES)
def test_ranges_match_the_object_and_moto(servers, rng, want):
    data, out = servers
    patched, stock = _get(out[False][1], rng), _get(out[True][1], rng)
    assert patched[2] == data[want]
    assert patched == stock
    assert patched[0] == (200 if rng is None else 206)


def test_a_range_past_the_end_is_refused_like_moto(servers):
    _, out = servers
    patched, stock = _get(out[False][1], f"bytes={SIZE}-"), _get(out[True][1], f"bytes={SIZE}-")
    assert patched[0] == stock[0] == 416


def _two_ranged_gets(client) -> tuple[list[tuple[int, str | None, bytes]], bool]:
    """Two presigned ranged GETs over one ``http.client`` connection: their answers, and whether the
    second went over the first one's socket (the server kept the connection open)."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(client.generate_presigned_url("get_object", Params={"Bucket": "bench", "Key": "shard.tar"}))
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    answers, socks = [], []
    try:
        for rng in ("bytes=0-99", "bytes=1000-151999"):
            conn.request("GET", f"{url.path}?{url.query}", headers={"Range": rng})
            r = conn.getresponse()
            answers.append((r.status, r.getheader("Content-Range"), r.read()))
            socks.append(conn.sock)  # None once the server closed the connection
    finally:
        conn.close()
    return answers, socks[0] is not None and socks[0] is socks[1]


def test_the_bench_server_keeps_connections_open_as_an_object_store_does(servers):
    """moto's own server closes every connection (a TCP connection per request, which real S3 does not
    charge a client); the benchmark's keeps it open and answers the same bytes."""
    data, out = servers
    patched, kept = _two_ranged_gets(out[False][1])
    stock, stock_kept = _two_ranged_gets(out[True][1])
    assert kept and not stock_kept
    assert [a[2] for a in patched] == [data[0:100], data[1000:152000]]
    assert patched == stock


def test_upload_copies_a_folder_tree_byte_for_byte(servers, tmp_path):
    bench = _bench()
    server = servers[1][False][0]
    files = {"manifest.json": b"{}", "a/b/shard-000000.tar": os.urandom(70_001), "a/c.idx": b"x"}
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    assert bench.upload(server.endpoint, str(tmp_path), "s3://copies/ds") == sum(map(len, files.values()))
    fs = s3fs.S3FileSystem(endpoint_url=server.endpoint, skip_instance_cache=True)
    assert {k.removeprefix("copies/ds/"): fs.cat_file(k) for k in fs.find("copies/ds")} == files
    (tmp_path / "a" / "empty").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        bench.upload(server.endpoint, str(tmp_path), "s3://copies/other")
    assert not fs.find("copies/other")
