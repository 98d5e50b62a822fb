"""moto's S3 on loopback behind latency proxies, in its own process: what the S3 benchmarks read from.

``Server([100])`` forks a process serving moto's S3 (kept-alive HTTP/1.1 connections, ranged GETs
that read only their range, as an object store serves them) and one ``FaultProxy`` per latency in
milliseconds; ``Server.stats()`` gives that process's CPU seconds and the bytes each proxy sent, so
the server's share of the cores is visible. Used by ``run.py remote`` and ``bench_peers.py --s3``.
Needs ``tests/`` on ``sys.path`` (``remote_servers.FaultProxy``), as both entry points set it.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time

import measure
from remote_servers import FaultProxy

__all__ = ["CREDENTIALS", "Server", "need_s3", "upload"]

# What moto accepts; set in the environment of every process that talks to it.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


def need_s3() -> None:
    """Exit with the install line when moto's server, s3fs or urllib3 is missing."""
    for name in ("moto.server", "s3fs", "urllib3"):
        measure.need_module(name.split(".")[0], "pip install 's3fs' 'moto[server]'")


def serve_ranges_from_buffer() -> None:
    """Make moto answer a ranged GET by reading only the range, as an object store does.

    moto 5.x builds every GET's body from ``FakeKey.value``, the object's whole value read from its
    spooled buffer, and ``S3Response._handle_range_header`` then slices it: a 150 kB range of a
    55 MB shard costs the server a 55 MB read and copy (10 ms of CPU per sample on unitree, on the
    same two cores as the workers). Here, while ``key_response`` answers a GET with a ``Range``
    header, ``FakeKey.value`` is a view whose ``len`` is the object's size and whose slice reads
    only those bytes from the buffer, so the unchanged range handling (status 206, Content-Range,
    the invalid-range errors) sends the same bytes at a cost per byte sent. Everything else (the
    metadata GETs, HEAD, PUT) is moto's own code path.
    """
    import threading

    from moto.s3 import models, responses

    ranged = threading.local()
    stock_value = models.FakeKey.value
    stock_key_response = responses.S3Response.key_response

    class RangeView:
        def __init__(self, key):
            self.key = key

        def __len__(self) -> int:
            return self.key.size

        def __getitem__(self, part: slice) -> bytes:
            start, stop, _ = part.indices(self.key.size)
            with self.key.lock:
                self.key._value_buffer.seek(start)
                return self.key._value_buffer.read(max(stop - start, 0))

    def value(key):
        return RangeView(key) if getattr(ranged, "on", False) else stock_value.fget(key)

    def key_response(self, request, full_url, headers):
        ranged.on = request.method == "GET" and bool(request.headers.get("range"))
        try:
            return stock_key_response(self, request, full_url, headers)
        finally:
            ranged.on = False

    models.FakeKey.value = property(value, stock_value.fset)
    responses.S3Response.key_response = key_response


def start_moto(stock_moto: bool) -> tuple[str, int, object]:
    """moto's S3 on 127.0.0.1: ``(host, port, stop)``.

    By default moto's WSGI app is served by waitress, which keeps HTTP/1.1 connections open between
    requests, as an object store does; moto's own server (werkzeug's development server) answers
    every request with ``Connection: close``, so each ranged GET of a worker would open a new TCP
    connection (and, through the latency proxy, two threads and an upstream connection), a cost real
    S3 does not charge. ``stock_moto`` keeps moto's server and its ranged GET.
    """
    if stock_moto:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        return host, port, server.stop
    import threading

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from waitress import create_server

    serve_ranges_from_buffer()
    logging.getLogger("waitress").setLevel(logging.ERROR)  # its queue-depth warnings
    app = DomainDispatcherApplication(create_backend_app)
    wsgi = create_server(app, host="127.0.0.1", port=0, threads=16, channel_timeout=600)
    threading.Thread(target=wsgi.run, daemon=True).start()
    return "127.0.0.1", wsgi.effective_port, wsgi.close


def serve(conn, latencies: list[int], stock_moto: bool = False) -> None:
    """moto on loopback and one ``FaultProxy`` per latency; answers ``"stats"`` until ``"stop"``.

    Sends first ``{"endpoint": url, "proxies": {ms: port}}``; each ``"stats"`` gets this process's
    CPU seconds (moto, the proxies) and the response bytes each proxy forwarded. Ranged GETs read
    only their range (``serve_ranges_from_buffer``) and connections are kept open between requests
    (``start_moto``) unless ``stock_moto``.
    """
    host, port, stop = start_moto(stock_moto)
    proxies = {ms: FaultProxy((host, port), latency_s=ms / 1000) for ms in latencies}
    conn.send({"endpoint": f"http://{host}:{port}", "proxies": {ms: p.port for ms, p in proxies.items()}})
    while conn.recv() == "stats":
        conn.send({"cpu_s": time.process_time(), "bytes_out": {ms: p.bytes_out for ms, p in proxies.items()}})
    for p in proxies.values():
        p.close()
    stop()


class Server:
    """The server process (``serve``), started before anything else (a fork of a small process)."""

    def __init__(self, latencies: list[int], stock_moto: bool = False):
        ctx = mp.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=serve, args=(child, latencies, stock_moto), daemon=True)
        self._process.start()
        info = self._conn.recv()
        self.endpoint: str = info["endpoint"]
        self.proxies: dict[int, int] = info["proxies"]

    def stats(self) -> dict:
        self._conn.send("stats")
        return self._conn.recv()

    def stop(self) -> None:
        self._conn.send("stop")
        self._process.join(10)


def upload(endpoint: str, local: str, url: str) -> int:
    """Copy the folder ``local`` (recursively) to ``url`` (``s3://bucket/prefix``) on the server; its bytes.

    Raises ``ValueError`` for an empty file, before anything is sent: this server (moto under waitress)
    never answers s3fs's PUT of an empty object (curl's is answered), and no epishard or Lance folder
    the benchmarks upload holds one.
    """
    import os

    from epishard.format.storage import FileSystemHandle

    bucket = url.removeprefix("s3://").split("/")[0]
    fs = FileSystemHandle(f"s3://{bucket}", {"endpoint_url": endpoint}).get()  # its client closed on its own loop
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    paths = [os.path.join(folder, name) for folder, _, files in os.walk(local) for name in files]
    empty = [p for p in paths if not os.path.getsize(p)]
    if empty:
        raise ValueError(f"{empty[0]}: an empty file; this benchmark server cannot take one (s3server.upload)")
    for path in paths:
        fs.put_file(path, url.removeprefix("s3://") + "/" + os.path.relpath(path, local))
    return sum(map(os.path.getsize, paths))
