"""Loopback servers for the object-storage tests: an HTTP file server that honours Range or ignores
it, and a fault-injecting TCP proxy (cut a response after N bytes, add latency per request)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import socket
import threading
import time
import urllib.parse


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """``http.server`` file handler that answers ``Range: bytes=a-b`` with 206 and Content-Range."""

    honour_range = True

    def log_message(self, *args):
        pass

    def send_head(self):
        path = self.translate_path(self.path)
        match = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if not self.honour_range or not match or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        start = int(match.group(1))
        stop = min(int(match.group(2)) + 1 if match.group(2) else size, size)
        f = open(path, "rb")  # noqa: SIM115 - the server closes it after sending the range
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return _Limited(f, stop - start)


class _Limited:
    def __init__(self, f, n):
        self.f, self.n = f, n

    def read(self, size=-1):
        size = self.n if size < 0 else min(size, self.n)
        data = self.f.read(size)
        self.n -= len(data)
        return data

    def close(self):
        self.f.close()


class IgnoreRangeHandler(RangeHandler):
    honour_range = False


class Gauge:
    """Requests a server is answering at once: ``now`` and the most seen (``peak``)."""

    def __init__(self):
        self.now = self.peak = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def request(self):
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            yield
        finally:
            with self._lock:
                self.now -= 1


class SlowRangeHandler(RangeHandler):
    """``RangeHandler`` that waits ``latency_s`` before answering a ranged request, counted in ``gauge``."""

    latency_s = 0.0
    gauge: Gauge | None = None

    def do_GET(self):
        if "Range" not in self.headers or self.gauge is None:
            return super().do_GET()
        with self.gauge.request():
            time.sleep(self.latency_s)
            return super().do_GET()


def serve_http(
    folder: str, honour_range: bool = True, latency_s: float = 0.0, gauge: Gauge | None = None
) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Start a threaded HTTP server for ``folder`` on 127.0.0.1; returns (server, base URL).

    ``latency_s``/``gauge``: ranged requests wait that long before the answer and are counted in
    ``gauge`` while answered (requests in flight as the server sees them).
    """
    handler: type[RangeHandler] = RangeHandler if honour_range else IgnoreRangeHandler
    if gauge is not None:
        handler = type("Slow", (SlowRangeHandler,), {"latency_s": latency_s, "gauge": gauge})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=folder))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class FaultProxy:
    """TCP proxy to ``upstream`` (host, port) on 127.0.0.1.

    ``cut_after``: cut the connection once a response to a ranged request (a shard read; metadata
    reads have no Range header) has sent this many bytes (a response is what the server sends
    after the client's latest request bytes), ``cuts`` times (``-1``: always).
    ``match``: cut only responses to requests containing these bytes (e.g. one shard's name).
    ``latency_s``: delay added before forwarding each request. ``cuts_done`` counts cuts.
    ``stall``: never forward responses to matching ranged requests, and keep their connections
    open (a server that stops answering); ``stalled`` counts such requests. ``bytes_out`` counts
    the response bytes forwarded to clients.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        cut_after: int = 0,
        cuts: int = 0,
        latency_s: float = 0.0,
        match: bytes = b"",
        stall: bool = False,
    ):
        self.upstream, self.cut_after, self.cuts, self.latency_s = upstream, cut_after, cuts, latency_s
        self.match, self.stall, self.stalled = match, stall, 0
        self.cuts_done = self.bytes_out = 0
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _should_cut(self) -> bool:
        with self._lock:
            if self.cuts == -1 or self.cuts_done < self.cuts:
                self.cuts_done += 1
                return True
            return False

    def _accept(self):
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket):
        server = socket.create_connection(self.upstream)
        state = {"sent": 0, "ranged": False}

        def upstream_pump():
            try:
                while data := client.recv(65536):
                    if self.latency_s:
                        time.sleep(self.latency_s)
                    state["sent"] = 0  # a new request: count its response from zero
                    state["ranged"] = b"\r\nrange:" in data.lower() and self.match in data
                    self.stalled += int(self.stall and state["ranged"])
                    server.sendall(data)
            except OSError:
                pass
            finally:
                _close(server)

        threading.Thread(target=upstream_pump, daemon=True).start()
        try:
            while data := server.recv(65536):
                if self.stall and state["ranged"]:
                    continue  # swallowed: the client waits until its read timeout
                if (
                    self.cut_after
                    and state["ranged"]
                    and state["sent"] + len(data) > self.cut_after
                    and self._should_cut()
                ):
                    client.sendall(data[: max(self.cut_after - state["sent"], 0)])
                    break
                state["sent"] += len(data)
                with self._lock:
                    self.bytes_out += len(data)
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(server)
            if self.stall and state["ranged"]:
                _wait_closed(client)  # the upstream has answered and closed; the client hears nothing
            _close(client)

    def close(self):
        self._closed = True
        _close(self._sock)


def _wait_closed(s: socket.socket):
    """Reads and discards until the peer closes the connection (or it breaks)."""
    try:
        while s.recv(65536):
            pass
    except OSError:
        pass


def _close(s: socket.socket):
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()


class _DenyHandler(http.server.BaseHTTPRequestHandler):
    """Answers every request 403 with S3's AccessDenied error document."""

    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
        b"<Message>Access Denied</Message></Error>"
    )

    def log_message(self, *args):
        pass

    def _deny(self):
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(self.body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _deny


def serve_access_denied() -> tuple[http.server.ThreadingHTTPServer, str]:
    """An S3 endpoint on 127.0.0.1 that refuses everything (HTTP 403 AccessDenied), as a store does
    for wrong credentials or a bucket policy; returns (server, endpoint URL)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DenyHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class SilentServer:
    """A TCP server on 127.0.0.1 that accepts every connection, reads what the client sends and
    never answers: a stuck S3 or HTTP endpoint. ``connections`` counts accepted connections."""

    def __init__(self):
        self.connections = 0
        self._clients: list[socket.socket] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            self._clients.append(client)
            threading.Thread(target=_wait_closed, args=(client,), daemon=True).start()

    def close(self):
        _close(self._sock)
        for client in self._clients:
            _close(client)


class FakeHubHandler(RangeHandler):
    """The parts of the Hugging Face Hub HTTP API that ``huggingface_hub.HfFileSystem`` reads a
    dataset repository through, serving ``<folder>/<user>/<repo>/`` as the dataset ``user/repo`` at
    revision ``main``: repository info (``/api/datasets/<repo>[/revision/<rev>]``), tree listings
    (``/api/datasets/<repo>/tree/<rev>[/<path>]``, recursive or not, one page), paths-info
    (``POST /api/datasets/<repo>/paths-info/<rev>``) and ranged file downloads
    (``/datasets/<repo>/resolve/<rev>/<path>``). Files are plain (no LFS/Xet pointers)."""

    SHA = "0" * 40

    def _repo_file(self, repo: str, rel: str = "") -> str:
        return os.path.join(self.directory, repo, urllib.parse.unquote(rel))

    def _entry(self, repo: str, rel: str) -> dict:
        path = self._repo_file(repo, rel)
        if os.path.isdir(path):
            return {"type": "directory", "path": rel, "oid": self.SHA}
        return {"type": "file", "path": rel, "size": os.path.getsize(path), "oid": self.SHA}

    def _json(self, value, status: int = 200) -> None:
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _api(self) -> bool:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        m = re.match(r"^/api/datasets/([^/]+/[^/]+)(?:/revision/[^/]+)?/?$", url.path)
        if m and os.path.isdir(self._repo_file(m.group(1))):
            self._json({"id": m.group(1), "sha": self.SHA, "private": False})
            return True
        m = re.match(r"^/api/datasets/([^/]+/[^/]+)/tree/[^/]+/?(.*)$", url.path)
        if m:
            repo, rel = m.group(1), urllib.parse.unquote(m.group(2)).strip("/")
            if not os.path.isdir(self._repo_file(repo, rel)):
                self._json({"error": "not found"}, 404)
                return True
            recursive = query.get("recursive", ["False"])[0].lower() == "true"
            entries = []
            for dirpath, dirs, files in os.walk(self._repo_file(repo, rel)):
                dirs.sort()
                for name in [*dirs, *sorted(files)]:
                    entries.append(
                        self._entry(repo, os.path.relpath(os.path.join(dirpath, name), self._repo_file(repo)))
                    )
                if not recursive:
                    break
            self._json(entries)
            return True
        return False

    def do_GET(self):
        if self._api():
            return
        m = re.match(r"^/datasets/([^/]+/[^/]+)/resolve/[^/]+/(.+)$", urllib.parse.urlsplit(self.path).path)
        if not m:
            self._json({"error": "not found"}, 404)
            return
        self.path = "/" + m.group(1) + "/" + m.group(2)
        super().do_GET()

    def do_HEAD(self):
        m = re.match(r"^/datasets/([^/]+/[^/]+)/resolve/[^/]+/(.+)$", urllib.parse.urlsplit(self.path).path)
        if m:
            self.path = "/" + m.group(1) + "/" + m.group(2)
        super().do_HEAD()

    def do_POST(self):
        m = re.match(r"^/api/datasets/([^/]+/[^/]+)/paths-info/[^/]+$", self.path)
        if not m:
            self._json({"error": "not found"}, 404)
            return
        form = urllib.parse.parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
        paths = [p.strip("/") for p in form.get("paths", [])]
        self._json([self._entry(m.group(1), p) for p in paths if os.path.exists(self._repo_file(m.group(1), p))])


def serve_fake_hub(folder: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A stand-in Hugging Face Hub on 127.0.0.1 (``FakeHubHandler``) for ``folder``; returns
    (server, endpoint URL) for ``HfFileSystem(endpoint=...)`` or ``HF_ENDPOINT``."""
    handler = functools.partial(FakeHubHandler, directory=folder)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


S3_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class ThrottleProxy:
    """HTTP reverse proxy on 127.0.0.1 in front of ``upstream`` (``http://host:port``: a moto S3 server
    or ``serve_http``) that injects time-bound faults, as a store under load does.

    ``burst(seconds, status=503, retry_after=None, match=b"")``: for ``seconds`` from now, every request
    whose request line contains ``match`` is answered ``status`` (S3's ``SlowDown`` error document;
    ``retry_after``: a ``Retry-After`` header value, seconds or an HTTP date) instead of being forwarded.
    ``burst_count(n, ...)``: the same for the next ``n`` matching requests. ``outage(seconds)``: every
    connection and request is reset (RST) for ``seconds``. Otherwise requests are forwarded and the
    upstream's answer returned. ``refuse(seconds)``: nothing listens for ``seconds`` (connection
    refused), then the proxy serves again on its port. ``log``: ``(monotonic time, method, path,
    status sent or "reset")`` per request; ``url``: the proxy's base URL.
    """

    def __init__(self, upstream: str):
        import http.client

        host, port = urllib.parse.urlsplit(upstream).netloc.split(":")
        self.log: list[tuple[float, str, str, int | str]] = []
        self._faults: list[dict] = []
        self._outage_until = 0.0
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def finish(self):
                with contextlib.suppress(OSError):
                    super().finish()

            def handle_one_request(self):
                if time.monotonic() < proxy._outage_until:
                    proxy._record("-", "-", "reset")
                    _reset(self.connection)
                    self.close_connection = True
                    return
                super().handle_one_request()

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                        if size == 0:
                            return out
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _forward(self):
                body = self._body()
                fault = proxy._fault(self.requestline.encode())
                if fault is not None:
                    proxy._record(self.command, self.path, fault["status"])
                    self.send_response(fault["status"])
                    if fault["retry_after"] is not None:
                        self.send_header("Retry-After", str(fault["retry_after"]))
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(S3_SLOW_DOWN)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(S3_SLOW_DOWN)
                    return
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "connection")
                }
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                finally:
                    conn.close()
                proxy._record(self.command, self.path, answer.status)
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                        self.send_header(k, v)
                length = answer.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self._handler = Handler
        self._serve(0)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def _serve(self, port: int) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), self._handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def _record(self, method: str, path: str, status: int | str) -> None:
        with self._lock:
            self.log.append((time.monotonic(), method, path, status))

    def _fault(self, line: bytes) -> dict | None:
        now = time.monotonic()
        with self._lock:
            for fault in self._faults:
                if fault["match"] in line and fault.pop("pending", None) is not None:
                    fault["until"] = now + fault["seconds"]  # a burst timed from its first request
                if fault["match"] in line and now < fault["until"] and fault["count"] != 0:
                    fault["count"] -= 1
                    return fault
        return None

    def burst(
        self,
        seconds: float,
        status: int = 503,
        retry_after: str | float | None = None,
        match: bytes = b"",
        from_first: bool = False,
    ):
        """Answer matching requests ``status`` for ``seconds`` from now (see the class docstring), or,
        with ``from_first``, from the first matching request (a burst a slow-starting client cannot miss)."""
        fault = dict(until=time.monotonic() + seconds, count=-1, status=status, retry_after=retry_after, match=match)
        if from_first:
            fault.update(until=float("inf"), seconds=seconds, pending=True)
        with self._lock:
            self._faults.append(fault)

    def burst_count(self, n: int, status: int = 503, retry_after: str | float | None = None, match: bytes = b""):
        """Answer the next ``n`` matching requests ``status``."""
        with self._lock:
            self._faults.append(dict(until=float("inf"), count=n, status=status, retry_after=retry_after, match=match))

    def clear(self) -> None:
        """End every burst now."""
        with self._lock:
            self._faults.clear()

    def outage(self, seconds: float) -> None:
        """Reset every connection and request for ``seconds`` from now."""
        self._outage_until = time.monotonic() + seconds

    def refuse(self, seconds: float) -> None:
        """Stop listening for ``seconds`` (new connections are refused, open ones reset), then serve again
        on the same port."""
        self._outage_until = time.monotonic() + seconds
        self.server.shutdown()
        self.server.server_close()
        timer = threading.Timer(seconds, self._serve, args=(self.port,))
        timer.daemon = True
        timer.start()

    def answered(self, status: int | str) -> int:
        """How many requests were answered ``status`` (an int, or ``"reset"``)."""
        with self._lock:
            return sum(1 for *_, s in self.log if s == status)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _reset(s: socket.socket) -> None:
    """Close ``s`` with an RST (SO_LINGER 0): the peer sees ECONNRESET, as from a store that went away."""
    import struct

    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
