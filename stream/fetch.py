"""Fetching shard bytes for one worker: background prefetch, verified ranged reads, retries.

The reader knows, from its plan, every byte range it will need this epoch and in which order (the
fetch order), so requests go out ahead of the worker while it decodes, bounded in bytes
(``prefetch_bytes`` fetched and not yet consumed) and in number (a depth of requests in flight
that grows, by Little's law, until it covers the measured latency; see ``Fetcher``). Two modes:

- ``"stream"``: consecutive episodes of one shard in byte order are read front to back as one span
  in requests of ``chunk_bytes``; bytes between the members a worker needs are read too. An
  episode that does not continue such a run (a shuffled fetch order: episodes of many shards
  interleaved) starts its own request at its first member, so no span is read twice.
- ``"ranged"``: only the members each episode needs (its table and the requested cameras) are
  fetched, by byte range; ranges closer than ``coalesce_bytes`` (an episode's adjacent members,
  the next episode of the same shard) share one request. For shuffled orders or reading one
  camera of many.

Every response is checked: its length must be the requested length (a server that ignores Range
returns the whole object: then the requested bytes are cut out of it if it is complete, counted in
``range_ignored``, else a ``FetchError`` is raised), and every member's sha256 is compared with the
index. A reset, timeout, throttling answer (429, 503 ``SlowDown``) or 5xx is retried with
full-jitter backoff, honouring ``Retry-After``, for the policy's time budget (``retry_budget_s``,
counted from the request's last progress; ``epishard.format.retry``); a retry asks again from the first
byte not yet received. When the budget runs out the shard fails (``FetchError`` naming the URL,
status and time spent) and the reader applies its shard policy.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from epishard.format.errors import check_choice
from epishard.format.manifest import Manifest
from epishard.format.presigned import HTTPStatusError
from epishard.format.retry import (
    BACKOFF_MAX_S,
    BACKOFF_S,
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    RETRY_BUDGET_S,
    RetryBudgetExceeded,
    RetryPolicy,
    describe_failure,
    http_status_of,
    retry_after_s,
)
from epishard.format.storage import NotARegularFile
from epishard.redact import redact

from .cache import RangeCache

__all__ = [
    "FetchError",
    "FetchPolicy",
    "Fetcher",
    "ShardSource",
    "bridge",
    "episode_ranges",
    "fetch_failure",
    "plan_requests",
    "retryable",
    "wait_or_raise",
]

if TYPE_CHECKING:
    from .telemetry import Telemetry


class ShardSource(Protocol):
    """What the fetcher reads shards through (``stream.source.DatasetSource`` is one).

    ``local``: the shards are files on this machine (no range cache); ``manifest``: the dataset's
    checked manifest (each shard's ``sha256`` and ``size``).
    """

    local: bool
    manifest: Manifest

    def shard_path(self, shard: int) -> str:
        """Path or URL of shard number ``shard``, for messages."""
        ...

    def read_range(self, shard: int, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of shard number ``shard`` (raising what the storage raises)."""
        ...


@dataclass(frozen=True)
class FetchPolicy:
    """How a worker fetches.

    Args:
        mode: ``"stream"`` or ``"ranged"`` (see the module docstring).
        chunk_bytes: largest single request, bytes (stream mode reads shards in such requests).
        prefetch_bytes: bytes fetched ahead of the worker and not yet consumed, at most; 0 turns
            prefetch off (each range is fetched when the worker needs it).
        threads: requests in flight at the start (the depth then adapts, see ``Fetcher``).
        max_in_flight: requests in flight at most, per worker and dataset (threads are made as
            needed; an S3 client gets at least this many pooled connections). Set it to
            ``threads`` for a fixed depth.
        coalesce_bytes: ranged mode: a range that starts at most this many bytes after the previous
            request of the same shard joins it (the tar headers between an episode's members, a
            small member not asked for, the next episode of the shard), as long as the request stays
            within ``chunk_bytes``. 8 KiB, Arrow's ``ReadRangeCache`` default hole size.
        retry_budget_s: seconds a failing request keeps being retried, counted from when it was sent
            or last received bytes (default 60). Retried: connection errors, connect and read
            timeouts, HTTP 429, 500, 502, 503 (S3 ``SlowDown``), 504; each retry waits a full-jitter
            backoff (uniform in ``[0, min(backoff_max_s, backoff_s * 2**attempt)]`` seconds) or the
            server's ``Retry-After`` (seconds or an HTTP date) when longer; a ``Retry-After`` past the
            budget, or a request still failing when it is spent, fails the shard. A request that
            gets no answer costs at most ``connect_timeout_s + read_timeout_s + retry_budget_s``.
            The storage option ``retry_budget`` (seconds) overrides it.
        retries: also a limit on the number of retries per request; None (default): the budget alone.
        on_shard_error: ``"skip"`` (default for training: the shard's windows are replaced by repeats
            of the worker's other samples, flagged ``substitute``, so every rank keeps its batch count)
            or ``"raise"`` (strict).
        verify: compare each member with its sha256 from the index.
        cache_dir / disk_cache_bytes: keep fetched byte ranges in a local folder of at most
            ``disk_cache_bytes`` bytes on disk (``stream.cache.RangeCache``; keyed by the shard's
            sha256, so never stale). Local datasets are never cached. (Decoded frames are cached in
            memory by ``Lookahead.frame_cache_bytes``.)
        packets: where the index has packet tables (``WindowIndex.has_packets``), fetch only the
            packets of the groups of pictures each decode needs and feed them to a kept decoder
            (``stream.packets``); ranges of such a dataset are then coalesced as in ranged mode
            (gaps up to ``coalesce_bytes``) whatever ``mode`` says. False: fetch members whole.
        bridge_extra / bridge_gap: from a remote source (not a local folder), in ranged mode or by
            packets, the ranges of one fetch are also joined across gaps of at most ``bridge_gap``
            bytes (smallest first) while the bytes read stay within ``1 + bridge_extra`` times the
            bytes needed (``bridge``): fewer requests for a few more bytes. Default 0.5 and 1 MiB:
            on unitree (AV1, GOP 2, 640x480, 9 frames over 33 rows) 2.1 requests per sample instead
            of 4.2, 191 kB read per sample instead of 149 (docs/BENCHMARKS.md). 0 turns it off.
        connect_timeout_s / read_timeout_s: seconds to open a connection to S3 or an HTTP server,
            and to wait for the next bytes of a response; a request past either fails and is
            retried like a reset (storage options ``connect_timeout`` / ``read_timeout`` override).
        s3_transport: how an ``s3://`` dataset's shard ranges are fetched: ``"s3fs"`` (default:
            botocore signs each request) or ``"presigned"`` (each shard's URL signed once, every
            range a plain GET on a urllib3 pool: about a third of the client's CPU per request,
            ``epishard.format.presigned``); the same retries, budget, timeouts and redaction.
            Refused for other storage, and for storage options S3 needs on every GET
            (``requester_pays``, a customer encryption key).

    Raises:
        ValueError: an unknown ``mode``, ``on_shard_error`` or ``s3_transport``; ``threads``, ``max_in_flight`` or
            ``chunk_bytes`` below 1; ``coalesce_bytes``, ``bridge_extra``, ``bridge_gap``,
            ``retry_budget_s``, ``retries``, ``backoff_s`` or ``backoff_max_s`` below 0.
    """

    mode: Literal["stream", "ranged"] = "stream"
    chunk_bytes: int = 8 << 20
    prefetch_bytes: int = 256 << 20
    threads: int = 4
    max_in_flight: int = 32
    coalesce_bytes: int = 8 << 10
    retries: int | None = None
    backoff_s: float = BACKOFF_S
    backoff_max_s: float = BACKOFF_MAX_S
    retry_budget_s: float = RETRY_BUDGET_S
    on_shard_error: Literal["skip", "raise"] = "skip"
    verify: bool = True
    cache_dir: str | None = None
    disk_cache_bytes: int = 10 << 30
    packets: bool = True
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    read_timeout_s: float = READ_TIMEOUT_S
    bridge_extra: float = 0.5
    bridge_gap: int = 1 << 20
    s3_transport: Literal["s3fs", "presigned"] = "s3fs"

    def __post_init__(self):
        check_choice("FetchPolicy", "mode", self.mode, ("stream", "ranged"), {})
        check_choice("FetchPolicy", "s3_transport", self.s3_transport, ("s3fs", "presigned"), {})
        check_choice("FetchPolicy", "on_shard_error", self.on_shard_error, ("skip", "raise"), {})
        if self.threads < 1 or self.max_in_flight < 1 or self.chunk_bytes < 1 or self.coalesce_bytes < 0:
            raise ValueError(
                f"FetchPolicy: threads ({self.threads}), max_in_flight ({self.max_in_flight}) and chunk_bytes "
                f"({self.chunk_bytes}) must be >= 1, coalesce_bytes ({self.coalesce_bytes}) >= 0"
            )
        if not (self.bridge_extra >= 0 and self.bridge_gap >= 0):
            raise ValueError(
                f"FetchPolicy: bridge_extra ({self.bridge_extra}) and bridge_gap ({self.bridge_gap}) must be >= 0"
            )
        if not (
            self.retry_budget_s >= 0
            and self.backoff_s >= 0
            and self.backoff_max_s >= 0
            and (self.retries is None or self.retries >= 0)
        ):
            raise ValueError(
                f"FetchPolicy: retry_budget_s ({self.retry_budget_s}), backoff_s ({self.backoff_s}), "
                f"backoff_max_s ({self.backoff_max_s}) and retries ({self.retries}) must be >= 0"
            )

    @property
    def retry(self) -> RetryPolicy:
        """This policy's retry numbers as the one ``RetryPolicy`` (budget, backoff, retries, timeouts).

        A dataset opened with it (``DatasetSource``) applies the storage options' overrides on top.
        """
        return RetryPolicy(
            self.retry_budget_s,
            self.backoff_s,
            self.backoff_max_s,
            self.retries,
            self.connect_timeout_s,
            self.read_timeout_s,
        )


class FetchError(IOError):
    """A shard's bytes could not be fetched or verified; names the shard, the range and the cause."""

    def __init__(self, message: str, shard: int):
        super().__init__(redact(message))  # it names URLs: never their credentials
        self.shard = shard

    def __reduce__(self):  # to a DataLoader worker's parent, a Ray driver: the same class and fields
        return type(self), (self.args[0], self.shard), self.__dict__


_RETRYABLE = (OSError, TimeoutError, ConnectionError)


def retryable(exc: BaseException) -> bool:
    """Whether a failed request may succeed when asked again (resets, timeouts, 5xx, 408, 429)."""
    if isinstance(exc, FileNotFoundError | PermissionError | NotARegularFile | IsADirectoryError | RetryBudgetExceeded):
        return False
    if isinstance(exc, HTTPStatusError):  # a presigned GET's answer
        return exc.status >= 500 or exc.status in (408, 429)
    try:  # aiohttp is there whenever an HTTP or S3 filesystem is in use
        import aiohttp

        if isinstance(exc, aiohttp.ClientResponseError):
            return exc.status >= 500 or exc.status in (408, 429)
        if isinstance(exc, aiohttp.ClientError):
            return True
    except ImportError:
        pass
    name = type(exc).__name__
    return isinstance(exc, _RETRYABLE) or "Timeout" in name or "ServerError" in name or "EndpointConnection" in name


def fetch_failure(
    policy: RetryPolicy,
    exc: BaseException,
    attempt: int,
    where: str,
    shard: int,
    started: float,
    is_retryable=None,
) -> FetchError:
    """The ``FetchError`` for a request whose retries stop after try ``attempt`` (from 0).

    Names ``where``, the HTTP status or the exception, the retries and the seconds since ``started``
    (``time.monotonic()``), and why it stopped: not retryable (by ``is_retryable``, default
    ``retryable``), the policy's retries, or its budget (and the server's ``Retry-After``).
    """
    status, code, headers = http_status_of(exc)
    retry_after = retry_after_s(headers.get("retry-after"))
    elapsed = time.monotonic() - started
    what = f"{type(exc).__name__}: {exc}"
    if status is not None:
        what = f"{describe_failure(status, code, None)}: {what}"
    why = f"retry budget {policy.budget_s:g} s"
    if retry_after is not None:
        why += f"; Retry-After {headers['retry-after']}"
    if policy.retries is not None and attempt >= policy.retries:
        why = f"the policy's {policy.retries} retries"
    if not (is_retryable or retryable)(exc):
        why = "not retryable"
    return FetchError(f"{where}: {what} (after {attempt} retries in {elapsed:.1f} s: {why})", shard)


def wait_or_raise(policy: RetryPolicy, exc: Exception, attempt: int, where: str, shard: int, started: float) -> None:
    """After a failed request (try ``attempt``, from 0): wait before asking again, or raise.

    ``policy``: the dataset's ``RetryPolicy`` (``DatasetSource.retry``); ``started``:
    ``time.monotonic()`` when the request was sent (or last received bytes). Sleeps the policy's
    full-jitter backoff, or the server's ``Retry-After`` when longer (``RetryPolicy.next_delay``).

    Raises:
        FetchError: ``exc`` is not ``retryable``, the budget (or ``policy.retries``) is spent, or the
            server's ``Retry-After`` is past the budget (``fetch_failure``).
    """
    delay = None
    if retryable(exc):
        delay = policy.next_delay(started, attempt, retry_after_s(http_status_of(exc)[2].get("retry-after")))
    if delay is None:
        raise fetch_failure(policy, exc, attempt, where, shard, started) from exc
    time.sleep(delay)


_RANGE_WARNED: set[str] = set()  # shards this process warned about: one warning per shard


def _warn_range_ignored(path: str, size: int) -> None:
    """Say once per shard and process that its server answered a ranged request with the whole object.

    The reader stays correct (it cuts the range out), but every request then moves the whole shard.
    """
    if path in _RANGE_WARNED:
        return
    _RANGE_WARNED.add(path)
    warnings.warn(
        f"epishard: {redact(path)}: the server ignores Range requests (e.g. python -m http.server): each "
        f"request reads the whole shard ({size} bytes); serve the dataset from a server that answers "
        "Range (S3, nginx, a CDN) or copy it locally",
        stacklevel=2,
    )


class Fetcher:
    """Fetches, ahead of use, the byte ranges of a worker's episodes in fetch order.

    Args:
        source: the dataset.
        episodes: ``[(shard, [(start, stop), ...])]`` per episode in fetch order: the byte ranges
            (member data) the episode needs. Any order of shards and episodes (a fully shuffled
            one too), and the same episode may appear more than once (fetched again each time);
            more can be appended with ``extend``.
        policy: ``FetchPolicy``.
        sparse: the ranges are packets of groups of pictures, not members: coalesce them only
            across gaps of at most ``policy.coalesce_bytes`` (as ranged mode), in either mode.
        telemetry: the worker's ``Telemetry``; this counts ``bytes_read``, ``requests``, ``retries``,
            ``range_ignored``, ``cache_hits``, ``read_s`` (time the worker waited for data),
            ``fetch_waits`` (episodes whose bytes were not all there when asked) and
            ``fetch_depth`` (requests allowed in flight now) into it.

    Requests (``plan_requests``) are sent in fetch order while both bounds hold: at most
    ``policy.prefetch_bytes`` fetched (or in flight) and not yet consumed, and at most ``depth``
    requests in flight. ``depth`` starts at ``policy.threads`` and, each time the worker has to
    wait, rises to cover the latency by Little's law: ``ceil(1.5 * latency / compute) + 1``, where
    ``latency`` is the measured seconds per request and ``compute`` the worker's measured seconds
    between two requests it consumes (at least one more than before, at most
    ``policy.max_in_flight``). A request larger than the budget is sent only when the worker asks.
    """

    def __init__(
        self,
        source: ShardSource,
        episodes: list[tuple[int, list[tuple[int, int]]]],
        policy: FetchPolicy,
        telemetry: Telemetry,
        sparse: bool = False,
    ):
        self.source, self.policy, self.telemetry = source, policy, telemetry
        self.sparse = sparse
        self.episodes: list[tuple[int, list[tuple[int, int]]]] = []
        self.requests: list[tuple[int, int, int]] = []
        self._uses: list[list[int]] = []
        self._users = np.zeros(0, dtype=np.int64)
        self._futures: dict[int, Future] = {}
        self._next = 0  # next request to consider sending
        self._done = 0  # episodes before this one are consumed or skipped: their requests released
        self._held = 0  # bytes of requests sent and not yet released
        self._in_flight = 0
        self._depth = max(1, min(policy.threads, policy.max_in_flight))
        self._latency = 0.0  # seconds per request, moving average
        self._compute = 0.0  # worker seconds between two consumed requests, moving average
        self._returned: float | None = None  # when the last episode was handed to the worker
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=policy.max_in_flight + 1, thread_name_prefix="epishard-fetch")
        self._closed = False
        self._failed: dict[int, FetchError] = {}
        self._cache = (
            RangeCache(policy.cache_dir, policy.disk_cache_bytes) if policy.cache_dir and not source.local else None
        )
        self.telemetry.add(fetch_depth=self._depth)
        self.extend(episodes)

    def extend(self, episodes: list[tuple[int, list[tuple[int, int]]]]) -> None:
        """Append ``episodes`` (as the constructor's, in fetch order) to the fetch list; fetch ahead.

        For a reader whose schedule is computed as it goes. The new episodes' requests are planned
        among themselves (``plan_requests``): a range never joins a request planned before, which
        may already be in flight.
        """
        gap = None if self.policy.mode == "stream" and not self.sparse else self.policy.coalesce_bytes
        planned = episodes
        if gap is not None and not self.source.local and self.policy.bridge_extra > 0:
            # Object storage: a request costs a round trip and the server's work; read small gaps through.
            planned = [(s, bridge(r, self.policy.bridge_extra, self.policy.bridge_gap)) for s, r in episodes]
        requests, uses = plan_requests(planned, self.policy.chunk_bytes, gap)
        with self._lock:
            base = len(self.requests)
            users = np.bincount(np.asarray([i for u in uses for i in u], dtype=np.int64), minlength=len(requests))
            self.episodes.extend(episodes)
            self.requests.extend(requests)
            self._uses.extend([[base + i for i in u] for u in uses])
            self._users = np.concatenate([self._users, users])
        self._fill()

    # --- background fetching ----------------------------------------------------------------------

    def _fill(self) -> None:
        """Send requests ahead in fetch order while the byte budget and the depth allow.

        Never those of a failed shard or those no episode still needs.
        """
        if self.policy.prefetch_bytes <= 0:
            return  # no prefetch: each range is requested when the worker asks for it
        with self._lock:
            while self._next < len(self.requests) and self._in_flight < self._depth and not self._closed:
                i = self._next
                shard, a, b = self.requests[i]
                if shard not in self._failed and self._users[i] > 0 and i not in self._futures:
                    if self._held + (b - a) > self.policy.prefetch_bytes:
                        break
                    self._submit(i)
                self._next += 1

    def _submit(self, i: int) -> None:  # holding self._lock
        _, a, b = self.requests[i]
        self._futures[i] = self._pool.submit(self._run, i)
        self._held += b - a
        self._in_flight += 1

    def _run(self, i: int) -> bytes:
        t = time.perf_counter()
        try:
            return self._fetch(*self.requests[i])
        finally:
            with self._lock:
                self._in_flight -= 1
                self._latency = _average(self._latency, time.perf_counter() - t)
            self._fill()

    def _fetch(self, shard: int, start: int, stop: int) -> bytes:
        if self._cache is None:
            return self._fetch_remote(shard, start, stop)
        sha = self.source.manifest.shards[shard].sha256
        data = self._cache.get(sha, start, stop)
        if data is None:
            data = self._fetch_remote(shard, start, stop)
            self._cache.put(sha, start, stop, data)
        else:
            self.telemetry.add(cache_hits=1)
        return data

    def _fetch_remote(self, shard: int, start: int, stop: int) -> bytes:
        path = self.source.shard_path(shard)
        size = self.source.manifest.shards[shard].size
        parts, pos, attempt = [], start, 0
        started = time.monotonic()  # the budget counts from the request, then from its last progress
        retry = getattr(self.source, "retry", None) or self.policy.retry  # the storage options' overrides
        while pos < stop:
            try:
                data = self.source.read_range(shard, pos, stop)
                self.telemetry.add(requests=1)
                if len(data) > stop - pos:
                    if len(data) != size:
                        raise FetchError(
                            f"{path}: asked bytes {pos}-{stop}, got {len(data)} bytes that are neither "
                            f"the range nor the whole object ({size} bytes)",
                            shard,
                        )
                    self.telemetry.add(range_ignored=1)  # the server ignored Range: cut the range out
                    _warn_range_ignored(path, size)
                    data = data[pos:stop]
                if not data:
                    raise ConnectionError(f"{path}: empty response at byte {pos}")
            except FetchError:
                raise
            except Exception as exc:  # classified below: retried or turned into a FetchError
                wait_or_raise(retry, exc, attempt, f"{path}: bytes {pos}-{stop}", shard, started)
                self.telemetry.add(retries=1)
                attempt += 1
                continue
            parts.append(data)
            pos += len(data)
            started = time.monotonic()
            self.telemetry.add(bytes_read=len(data))
        return b"".join(parts)

    # --- consuming --------------------------------------------------------------------------------

    def _take(self, uses: list[int]) -> dict[tuple[int, int], bytes]:
        """The bytes of requests ``uses`` (sent now if they were not), keyed by ``(start, stop)``."""
        with self._lock:
            for i in uses:
                if i not in self._futures:  # not prefetched (prefetch off, or past the budget)
                    self._next = max(self._next, i + 1)
                    self._submit(i)
            futures = [self._futures[i] for i in uses]
            waited = not all(f.done() for f in futures)
        t = time.perf_counter()
        try:
            return {self.requests[i][1:]: f.result() for i, f in zip(uses, futures, strict=True)}
        finally:
            self.telemetry.add(read_s=time.perf_counter() - t, fetch_waits=int(waited))
            if waited:
                self._deepen()

    def _deepen(self) -> None:
        """The worker waited: allow enough requests in flight to cover the latency (Little's law)."""
        with self._lock:
            cover = math.ceil(1.5 * self._latency / max(self._compute, 1e-4)) + 1
            depth = min(self.policy.max_in_flight, max(self._depth + 1, cover))
            self.telemetry.add(fetch_depth=depth - self._depth)
            self._depth = depth
        self._fill()

    def episode(self, k: int, checksums: list[str] | None = None) -> list[bytes]:
        """Bytes of each range of the ``k``-th episode (in fetch order), verified.

        Must be called with increasing ``k``; episodes passed over are skipped (their requests are
        released). Raises ``FetchError`` if a request of its shard failed or a member's sha256
        differs from ``checksums``; the shard is then failed as a whole: its queued and in-flight
        requests are dropped, so the next shard starts with the full prefetch budget, and its later
        episodes raise the same error without a request.
        """
        now = time.perf_counter()
        if self._returned is not None:
            self._compute = _average(self._compute, (now - self._returned) / max(len(self._uses[k]), 1))
        self._release(k)  # episodes passed over
        shard, ranges = self.episodes[k]
        try:
            if shard in self._failed:
                raise self._failed[shard]
            pieces = self._take(self._uses[k])
            out = [_slice(pieces, a, b, self.source.shard_path(shard)) for a, b in ranges]
            if self.policy.verify and checksums is not None:
                for (a, b), data, digest in zip(ranges, out, checksums, strict=False):
                    if hashlib.sha256(data).hexdigest() != digest:
                        raise FetchError(
                            f"{self.source.shard_path(shard)}: bytes {a}-{b} do not match the index's sha256", shard
                        )
            return out
        except FetchError as exc:
            self._fail(shard, exc)
            raise
        finally:
            self._release(k + 1)
            self._returned = time.perf_counter()

    def _fail(self, shard: int, exc: FetchError) -> None:
        with self._lock:
            self._failed[shard] = exc
            for i in [i for i in self._futures if self.requests[i][0] == shard]:
                self._drop(i)

    def _release(self, stop: int) -> None:
        """Release the requests of every episode before ``stop`` not released yet; then fetch ahead."""
        with self._lock:
            for k in range(self._done, stop):
                for i in self._uses[k]:
                    self._users[i] -= 1
                    if self._users[i] == 0 and i in self._futures:
                        self._drop(i)
            self._done = max(self._done, stop)
        self._fill()

    def _drop(self, i: int) -> None:  # holding self._lock
        future = self._futures.pop(i)
        if future.cancel():  # still queued: never sent; one in flight finishes and is discarded
            self._in_flight -= 1
        _, a, b = self.requests[i]
        self._held -= b - a

    @property
    def held_bytes(self) -> int:
        """Bytes of requests sent (in flight or fetched) and not yet consumed."""
        return self._held

    @property
    def depth(self) -> int:
        """Requests allowed in flight now."""
        return self._depth

    def close(self) -> None:
        """Stop: queued requests are cancelled, those in flight finish and are discarded."""
        with self._lock:
            self._closed = True
            for i in list(self._futures):
                self._drop(i)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _average(old: float, new: float) -> float:
    """Exponential moving average (weight 0.2 on the new value; the first value taken as is)."""
    return new if old == 0.0 else 0.8 * old + 0.2 * new


def plan_requests(
    episodes: list[tuple[int, list[tuple[int, int]]]], chunk_bytes: int, gap: int | None
) -> tuple[list[tuple[int, int, int]], list[list[int]]]:
    """The requests that fetch ``episodes`` (in their order), and which requests each episode uses.

    Returns ``(requests, uses)``: ``requests`` ``[(shard, start, stop)]`` in fetch order, no
    longer than ``chunk_bytes``; ``uses[k]``: increasing request numbers holding episode ``k``'s
    ranges. A range joins the request before it when that request is of the same shard, starts at
    or before the range and ends no more than ``gap`` bytes before it (``None``: any distance, the
    stream mode: a shard's span read front to back), and the joined request stays within
    ``chunk_bytes``: the members of an episode (adjacent in the tar, tar headers between) and the
    next episode of the same shard in byte order become one request; a repeated or overlapping
    range reuses it. Otherwise the range starts new requests (split into ``chunk_bytes`` pieces).
    Like Arrow's ``ReadRangeCache`` (hole and range size limits).
    """
    requests: list[list[int]] = []
    uses: list[list[int]] = []
    for shard, ranges in episodes:
        mine: list[int] = []
        for a, b in sorted(ranges):
            last = requests[-1] if requests else None
            if (
                last is not None
                and last[0] == shard
                and last[1] <= a
                and (gap is None or a - last[2] <= gap)
                and max(b, last[2]) - last[1] <= chunk_bytes
            ):
                last[2] = max(last[2], b)
                mine.append(len(requests) - 1)
                continue
            for p in range(a, b, chunk_bytes):
                requests.append([shard, p, min(p + chunk_bytes, b)])
                mine.append(len(requests) - 1)
        uses.append(sorted(set(mine)))
    return [(s, a, b) for s, a, b in requests], uses


def bridge(ranges: list[tuple[int, int]], extra: float, max_gap: int) -> list[tuple[int, int]]:
    """``ranges`` (byte ``(start, stop)`` of one shard) joined across gaps, to cut the number of requests.

    Gaps of at most ``max_gap`` bytes are read through, smallest first, while the bytes read stay
    within ``(1 + extra)`` times the bytes ``ranges`` cover (their union). Returns the joined ranges,
    sorted and disjoint; each input range lies inside one of them. ``extra=0`` or ``max_gap=0``:
    only overlapping and touching ranges are joined. For a source where a request costs far more
    than its bytes (object storage: a round trip and the server's work per request; the default
    bytes allowance is 1.5x the groups of pictures a sample needs). Like Arrow's
    ``ReadRangeCache`` hole limit, with a byte budget on top.
    """
    if not ranges:
        return []
    joined: list[list[int]] = []
    for a, b in sorted(ranges):
        if joined and a <= joined[-1][1]:
            joined[-1][1] = max(joined[-1][1], b)
        else:
            joined.append([a, b])
    covered = sum(b - a for a, b in joined)
    budget = int(extra * covered)
    gaps = sorted((joined[i + 1][0] - joined[i][1], i) for i in range(len(joined) - 1))
    bridged = np.zeros(len(joined), dtype=bool)  # bridged[i]: the gap after joined[i] is read through
    for size, i in gaps:
        if size > max_gap or size > budget:
            break
        budget -= size
        bridged[i] = True
    out: list[tuple[int, int]] = []
    start = joined[0][0]
    for i, (_, b) in enumerate(joined):
        if not bridged[i]:
            out.append((start, b))
            if i + 1 < len(joined):
                start = joined[i + 1][0]
    return out


def _slice(pieces: dict[tuple[int, int], bytes], start: int, stop: int, path: str) -> bytes:
    out = []
    for (a, b), data in sorted(pieces.items()):
        if b <= start or a >= stop:
            continue
        out.append(data[max(start, a) - a : min(stop, b) - a])
    joined = b"".join(out)
    if len(joined) != stop - start:
        raise FetchError(f"{path}: internal: assembled {len(joined)} of {stop - start} bytes", -1)
    return joined


@dataclass(frozen=True)
class EpisodeRanges:
    """Where an episode's members lie.

    Its ``shard``, the byte ``ranges`` ``[(start, stop)]`` of the
    members it needs in tar order, their hex ``sha256`` and their global member numbers (``members``).
    """

    shard: int
    ranges: list[tuple[int, int]]
    sha256: list[str]
    members: list[int]


def episode_ranges(index, episode: int, cameras: list[int], data: bool = True, pieces=()) -> EpisodeRanges:
    """Where the data member (unless ``data`` is False) and the given camera streams of ``episode`` lie.

    ``index``: the dataset's ``WindowIndex``; ``cameras``: global stream numbers (the index's camera
    streams of this episode); ``pieces``: flat member numbers of the pieces of its streams at their
    own rate that come with the data member (``WindowIndex.signal_pieces``). Their shard, byte
    ranges (``[start, stop)`` offsets in the shard's tar), sha256s and member numbers (in tar order).
    """
    members = index.stream_member[np.asarray(cameras, dtype=np.int64)]
    if data:
        extra = np.asarray(list(pieces), dtype=np.int64)
        members = np.concatenate([members, extra, [index.data_member(episode)]]).astype(np.int64)
    members = np.unique(members)
    start, stop = index.member_ranges(members)
    shas = index.member_sha256.take(members).to_pylist()
    ranges = list(zip(start.tolist(), stop.tolist(), strict=True))
    return EpisodeRanges(int(index.shard[episode]), ranges, shas, members.tolist())
