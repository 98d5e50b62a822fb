"""Ranged GETs of S3 objects through presigned URLs and one pooled urllib3 client.

Through s3fs, each ranged GET of a shard costs the reading process about 1.6 ms of CPU (botocore
builds, signs and parses every request, and s3fs hands it to its event-loop thread), under the GIL
that the decoding thread needs between FFmpeg calls. Here each shard's URL is signed once (by the
dataset's own s3fs filesystem, ``S3FileSystem.url``: SigV4 query-string authentication, valid for
``expires_s``) and every range of it is a plain ``GET`` with a ``Range`` header on a urllib3
connection pool (botocore's own HTTP library), about 0.5 ms of CPU per request
(``python tools/bench/run.py remote --part transport``). ``FetchPolicy(s3_transport="presigned")``
turns it on; s3fs stays the default.

What stays the same: the fetcher's retries (``stream.fetch.retryable`` reads the status of
``HTTPStatusError`` as it reads botocore's), its budget and timeouts (``RetryPolicy.connect_s`` /
``read_s``), and redaction: a presigned URL carries a signature and the access key id in its query,
so no message or exception here contains one (the path is named, ``s3://bucket/key``). A URL is
signed again shortly before it expires, and once when the server says it has (HTTP 403 with
``Request has expired``, e.g. after a clock jump).

Not for storage options that S3 needs on every GET (server-side encryption with a customer key,
requester pays): ``presigned_refusal`` names them, and ``DatasetSource`` refuses the transport then.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

__all__ = ["HTTPStatusError", "PresignedRanges", "TLSFailure", "presigned_refusal", "tls_options"]

# Storage options (and s3fs keywords) that add headers a presigned GET would not carry; options and
# environment variables that send botocore's requests through a proxy, which urllib3 here would not.
_NEEDS_HEADERS = ("requester_pays", "sse_customer_key", "sse_customer_algorithm", "RequestPayer", "SSECustomerKey")
_PROXIES = ("proxies", "proxy", "proxies_config")
# The environment's proxies, which botocore follows and urllib3 does not.
_PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")


class HTTPStatusError(OSError):
    """A presigned GET answered with an error status: ``status`` (int), ``code`` (S3's error code, or "").

    ``response`` is shaped as botocore's (``ResponseMetadata.HTTPStatusCode`` and ``HTTPHeaders``,
    ``Error.Code``), so ``epishard.format.retry.http_status_of`` reads it (and its ``Retry-After``).
    The message names the object as ``s3://bucket/key``, never the signed URL.
    """

    def __init__(self, where: str, status: int, code: str, headers: dict):
        super().__init__(f"{where}: HTTP {status}{' ' + code if code else ''}")
        self.where, self.status, self.code, self.headers = where, status, code, headers

    @property
    def response(self) -> dict:
        """The answer as botocore's ``ClientError.response`` shapes it (read by ``http_status_of``)."""
        return {
            "ResponseMetadata": {"HTTPStatusCode": self.status, "HTTPHeaders": self.headers},
            "Error": {"Code": self.code},
        }

    def __reduce__(self):  # pickled to a DataLoader worker's parent: the same class and fields
        return type(self), (self.where, self.status, self.code, self.headers), self.__dict__


def presigned_refusal(storage_options: dict) -> str | None:
    """Why the presigned transport cannot serve ``storage_options``, or None when it can.

    It cannot when an option needs headers on every GET (``requester_pays``, a customer encryption
    key) or S3 is reached through a proxy (a ``proxies`` option, or the environment's
    ``HTTPS_PROXY`` / ``HTTP_PROXY``), which botocore follows and this client would not. (TLS
    settings are followed: ``tls_options``.)
    """
    headers = [key for key, value in _options(storage_options or {}) if key in _NEEDS_HEADERS and value]
    proxies = [key for key, value in _options(storage_options or {}) if key in _PROXIES and value]
    if headers:
        return f"storage option {headers[0]!r} needs headers on every GET, which a presigned URL does not carry"
    env = [name for name in _PROXY_ENV if os.environ.get(name)]
    if proxies or env:
        what = f"storage option {proxies[0]!r}" if proxies else f"the environment's {env[0]}"
        return f"{what} sends requests through a proxy, which the presigned transport does not follow"
    return None


def _options(options: dict):
    """Every ``(key, value)`` of nested storage options (``client_kwargs``, ``config_kwargs``, ...)."""
    for key, value in options.items():
        yield key, value
        if isinstance(value, dict):
            yield from _options(value)


def tls_options(storage_options: dict) -> dict:
    """urllib3 ``PoolManager`` keywords for the TLS verification botocore would use.

    ``verify=False`` (e.g. in ``client_kwargs``): no verification; ``verify="/path/ca.pem"``, else
    the environment's ``AWS_CA_BUNDLE``: that CA bundle; otherwise urllib3's defaults.
    """
    verify = [value for key, value in _options(storage_options or {}) if key == "verify"]
    if verify and verify[0] is False:
        return {"cert_reqs": "CERT_NONE"}
    if verify and isinstance(verify[0], str):
        return {"ca_certs": verify[0]}
    bundle = os.environ.get("AWS_CA_BUNDLE")
    return {"ca_certs": bundle} if bundle else {}


# S3's codes for a request signed with credentials that expired since (temporary credentials:
# an IAM role, SSO), answered with HTTP 400 or 403: the URL is signed again, once.
_EXPIRED_CODES = ("ExpiredToken", "TokenRefreshRequired", "RequestExpired")
# The only response headers an error keeps (others, such as a redirect's Location, may repeat the signed URL).
_KEPT_HEADERS = ("retry-after", "x-amz-request-id", "x-amz-id-2")


class TLSFailure(Exception):
    """The server's TLS certificate was not verified: not retried (asking again gets the same answer)."""


def _connection_failure(exc: BaseException, where: str) -> Exception:
    """The exception for a urllib3 failure, naming only its type: its message and ``url`` hold the signed URL.

    A certificate that does not verify is ``TLSFailure`` (not retryable); anything else (refused,
    reset, timed out, a TLS handshake cut short) a ``ConnectionError`` (retryable).
    """
    import ssl

    seen: set[int] = set()
    todo: list = [exc]
    while todo:  # the exception, its reason (urllib3's MaxRetryError), causes and exception arguments
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ssl.SSLCertVerificationError):
            why = getattr(e, "verify_message", None) or e.strerror
            return TLSFailure(f"{where}: the server's certificate does not verify ({why})")
        todo += [getattr(e, "reason", None), e.__cause__, e.__context__, *e.args]
    return ConnectionError(f"{where}: {type(exc).__name__}")


def _error_code(body: bytes) -> str:
    """S3's ``<Code>`` from an error body (XML), or ""."""
    start = body.find(b"<Code>")
    stop = body.find(b"</Code>", start)
    return body[start + 6 : stop].decode(errors="replace")[:64] if 0 <= start < stop else ""


class PresignedRanges:
    """Ranged GETs of one S3 filesystem's objects through presigned URLs (see the module docstring).

    Args:
        storage: what signs: an object whose ``fs`` is this process's ``s3fs.S3FileSystem`` (the
            dataset's ``Storage``; asked again in each process, as an s3fs client does not survive
            a fork); a URL is signed with ``fs.url(path, expires=...)``.
        connect_s / read_s: urllib3's connect and read timeouts, seconds (``RetryPolicy``'s).
        pool: connections kept per host (the fetcher's requests in flight at most).
        expires_s: how long a signed URL is valid; it is signed again after ``0.8 * expires_s``.
        tls: urllib3 TLS keywords (``tls_options``: as the storage options' ``verify`` says).

    Pickles without its connections and URLs; a forked process makes its own connection pool.
    """

    def __init__(
        self, storage, connect_s: float, read_s: float, pool: int = 32, expires_s: int = 3600, tls: dict | None = None
    ):
        self.storage, self.pool_size, self.expires_s = storage, max(int(pool), 1), int(expires_s)
        self.tls = dict(tls or {})
        self.connect_s, self.read_s = connect_s, read_s
        self._urls: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._http: Any = None  # the urllib3 PoolManager of this process

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_urls", "_lock", "_http", "_pid")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._urls, self._lock, self._pid, self._http = {}, threading.Lock(), os.getpid(), None

    def _client(self) -> Any:
        import urllib3

        if self._http is None or self._pid != os.getpid():
            self._http = urllib3.PoolManager(
                maxsize=self.pool_size,
                block=False,
                retries=False,  # the fetcher retries, under its budget
                timeout=urllib3.Timeout(connect=self.connect_s, read=self.read_s),
                **self.tls,
            )
            self._pid = os.getpid()
            with self._lock:
                self._urls.clear()
        return self._http

    def _url(self, path: str, fresh: bool = False) -> str:
        now = time.monotonic()
        with self._lock:
            cached = self._urls.get(path)
        if cached is not None and not fresh and now < cached[1]:
            return cached[0]
        url = self.storage.fs.url(path, expires=self.expires_s)
        with self._lock:
            self._urls[path] = (url, now + 0.8 * self.expires_s)
        return url

    def get(self, path: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of object ``path`` (``bucket/key``), one GET.

        The server may send more (the whole object, when it ignores Range): the caller checks the
        length, as for s3fs.

        Raises:
            FileNotFoundError: HTTP 404. PermissionError: HTTP 403 (after one new signature when the
                URL had expired). HTTPStatusError: any other error status (``retryable`` reads it;
                a 400 or 403 for expired credentials is signed again first, once).
            ConnectionError: the connection failed, was reset or timed out (the cause's type named).
            TLSFailure: the server's certificate does not verify.
        """
        import urllib3

        where = f"s3://{path}"
        http = self._client()
        for fresh in (False, True):
            failed = None
            try:
                r = http.request(
                    "GET",
                    self._url(path, fresh),
                    headers={"Range": f"bytes={start}-{stop - 1}", "Accept-Encoding": "identity"},
                    preload_content=True,
                    decode_content=False,  # the stored bytes, as s3fs returns them (a Content-Encoding kept)
                    redirect=False,
                )
            except urllib3.exceptions.HTTPError as exc:
                failed = exc
            if failed is not None:  # raised here, outside the handler: nothing chains to its URL
                raise _connection_failure(failed, f"{where}: bytes {start}-{stop}")
            if r.status in (200, 206):
                return r.data
            code = _error_code(r.data)
            if not fresh and (code in _EXPIRED_CODES or (r.status == 403 and b"expired" in r.data.lower())):
                continue  # the URL or its temporary credentials expired: signed again, once
            headers = {k.lower(): v for k, v in r.headers.items() if k.lower() in _KEPT_HEADERS}
            if r.status == 404:
                raise FileNotFoundError(2, f"HTTP 404{' ' + code if code else ''}", where)
            if r.status == 403:
                raise PermissionError(13, f"HTTP 403{' ' + code if code else ''}", where)
            raise HTTPStatusError(where, r.status, code, headers)
        raise AssertionError("unreachable")  # pragma: no cover
