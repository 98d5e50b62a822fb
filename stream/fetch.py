"""Fetching shard bytes for one worker: background prefetch, verified ranged reads, retries.

The reader knows, from its plan, every byte range it will need this epoch and in which order, so
a small thread pool fetches ahead (bounded in bytes) while the worker decodes. Two modes:

- ``"stream"``: each shard's needed span (first to last needed byte, in tar order) is read front to
  back in requests of ``chunk_bytes``; bytes between the members a worker needs are read too.
- ``"ranged"``: only the members each episode needs (its table and the requested cameras) are
  fetched, by byte range; for global shuffling or reading one camera of many.

Every response is checked: its length must be the requested length (a server that ignores Range
returns the whole object: then the requested bytes are cut out of it if it is complete, counted in
``range_ignored``, else a ``FetchError`` is raised), and every member's sha256 is compared with the
index. A reset, timeout or 5xx is retried with bounded exponential backoff; a retry asks again from
the first byte not yet received. When retries run out the shard fails (``FetchError``) and the
reader applies its shard policy.
"""

from __future__ import annotations

import hashlib
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from epishard.shardwriter.errors import check_choice
from epishard.shardwriter.storage import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, NotARegularFile

from .cache import RangeCache

if TYPE_CHECKING:
    from .source import DatasetSource
    from .telemetry import Telemetry


@dataclass(frozen=True)
class FetchPolicy:
    """How a worker fetches.

    Args:
        mode: ``"stream"`` or ``"ranged"`` (see the module docstring).
        chunk_bytes: largest single request, bytes (stream mode reads shards in such requests).
        prefetch_bytes: bytes fetched ahead of the worker and not yet consumed, at most; 0 turns
            prefetch off (each range is fetched when the worker needs it).
        threads: concurrent requests per worker.
        retries: attempts after the first, per request; backoff ``backoff_s * 2**attempt`` capped at
            ``backoff_max_s`` seconds.
        on_shard_error: ``"skip"`` (default for training: the shard's windows are replaced by repeats
            of the worker's other samples, flagged ``substitute``, so every rank keeps its batch count)
            or ``"raise"`` (strict).
        verify: compare each member with its sha256 from the index.
        cache_dir / cache_bytes: keep fetched ranges in a local folder of at most ``cache_bytes``
            (``stream.cache.RangeCache``; keyed by the shard's sha256, so never stale). Local
            datasets are never cached.
        connect_timeout_s / read_timeout_s: seconds to open a connection to S3 or an HTTP server,
            and to wait for the next bytes of a response; a request past either fails and is
            retried like a reset (storage options ``connect_timeout`` / ``read_timeout`` override).
    """

    mode: Literal["stream", "ranged"] = "stream"
    chunk_bytes: int = 8 << 20
    prefetch_bytes: int = 256 << 20
    threads: int = 4
    retries: int = 5
    backoff_s: float = 0.05
    backoff_max_s: float = 2.0
    on_shard_error: Literal["skip", "raise"] = "skip"
    verify: bool = True
    cache_dir: str | None = None
    cache_bytes: int = 10 << 30
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    read_timeout_s: float = READ_TIMEOUT_S

    def __post_init__(self):
        check_choice("FetchPolicy", "mode", self.mode, ("stream", "ranged"), {})
        check_choice("FetchPolicy", "on_shard_error", self.on_shard_error, ("skip", "raise"), {})


class FetchError(IOError):
    """A shard's bytes could not be fetched or verified; names the shard, the range and the cause."""

    def __init__(self, message: str, shard: int):
        super().__init__(message)
        self.shard = shard


_RETRYABLE = (OSError, TimeoutError, ConnectionError)


def retryable(exc: BaseException) -> bool:
    """Whether a failed request may succeed when asked again (resets, timeouts, 5xx, 408, 429)."""
    if isinstance(exc, FileNotFoundError | PermissionError | NotARegularFile | IsADirectoryError):
        return False
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


def wait_or_raise(policy: FetchPolicy, exc: Exception, attempt: int, where: str, shard: int) -> None:
    """After a failed request (try ``attempt``, from 0): wait before asking again, or raise.

    Sleeps ``backoff_s * 2**attempt`` seconds (at most ``backoff_max_s``), or raises ``FetchError``
    naming ``where`` and the cause when ``exc`` is not ``retryable`` or the policy's retries are
    used up.
    """
    if not retryable(exc) or attempt >= policy.retries:
        raise FetchError(f"{where}: {type(exc).__name__}: {exc} (after {attempt} retries)", shard) from exc
    time.sleep(min(policy.backoff_s * 2**attempt, policy.backoff_max_s))


class Fetcher:
    """Fetches, ahead of use, the byte ranges of a worker's episodes in read order.

    Args:
        source: the dataset.
        episodes: ``[(shard, [(start, stop), ...])]`` per episode in read order: the byte ranges
            (member data) the episode needs.
        policy: ``FetchPolicy``.
        telemetry: the worker's ``Telemetry``; this counts ``bytes_read``, ``requests``, ``retries``,
            ``range_ignored``, ``cache_hits`` and ``read_s`` (time the worker waited for data) into it.
    """

    def __init__(
        self,
        source: DatasetSource,
        episodes: list[tuple[int, list[tuple[int, int]]]],
        policy: FetchPolicy,
        telemetry: Telemetry,
    ):
        self.source, self.policy, self.telemetry = source, policy, telemetry
        self.episodes = episodes
        self.requests = self._requests(episodes)  # [(shard, start, stop)] in fetch order
        self._spans = _spans(self.requests, episodes)  # [(first, stop)] request numbers per episode
        self._futures: dict[int, Future] = {}
        self._next = 0  # next request to submit
        self._buffered = 0  # bytes submitted and not yet released
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=policy.threads, thread_name_prefix="epishard-fetch")
        self._failed: dict[int, FetchError] = {}
        self._cache = (
            RangeCache(policy.cache_dir, policy.cache_bytes) if policy.cache_dir and not source.local else None
        )
        self._fill()

    def _requests(self, episodes) -> list[tuple[int, int, int]]:
        chunk = self.policy.chunk_bytes
        if self.policy.mode == "ranged":
            ranges = [(shard, a, b) for shard, rs in episodes for a, b in _merge(rs)]
        else:  # one span per run of consecutive episodes of a shard
            ranges = []
            for shard, rs in episodes:
                a, b = min(r[0] for r in rs), max(r[1] for r in rs)
                if ranges and ranges[-1][0] == shard and ranges[-1][2] <= a:
                    ranges[-1] = (shard, ranges[-1][1], max(b, ranges[-1][2]))
                else:
                    ranges.append((shard, a, b))
        return [(s, p, min(p + chunk, b)) for s, a, b in ranges for p in range(a, b, chunk)]

    # --- background fetching ----------------------------------------------------------------------

    def _fill(self) -> None:
        """Submit requests ahead, up to ``prefetch_bytes`` in flight or unconsumed.

        Never those of a failed shard.
        """
        if self.policy.prefetch_bytes <= 0:
            return  # no prefetch: each range is requested when the worker asks for it
        with self._lock:
            while self._next < len(self.requests):
                shard, a, b = self.requests[self._next]
                if shard not in self._failed:
                    if self._buffered and self._buffered + (b - a) > self.policy.prefetch_bytes:
                        break
                    self._submit(self._next)
                self._next += 1

    def _submit(self, i: int) -> None:  # holding self._lock
        shard, a, b = self.requests[i]
        self._futures[i] = self._pool.submit(self._fetch, shard, a, b)
        self._buffered += b - a

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
                    data = data[pos:stop]
                if not data:
                    raise ConnectionError(f"{path}: empty response at byte {pos}")
            except FetchError:
                raise
            except Exception as exc:  # classified below: retried or turned into a FetchError
                wait_or_raise(self.policy, exc, attempt, f"{path}: bytes {pos}-{stop}", shard)
                self.telemetry.add(retries=1)
                attempt += 1
                continue
            parts.append(data)
            pos += len(data)
            self.telemetry.add(bytes_read=len(data))
        return b"".join(parts)

    # --- consuming --------------------------------------------------------------------------------

    def _take(self, i: int) -> bytes:
        with self._lock:
            if i not in self._futures:  # not prefetched (prefetch off, or past the budget)
                self._next = max(self._next, i + 1)
                self._submit(i)
            future = self._futures[i]
        t = time.perf_counter()
        try:
            return future.result()
        finally:
            self.telemetry.add(read_s=time.perf_counter() - t)

    def episode(self, k: int, checksums: list[str] | None = None) -> list[bytes]:
        """Bytes of each range of the ``k``-th episode (in read order), verified.

        Must be called with increasing ``k``. Raises ``FetchError`` if a request of its shard failed
        or a member's sha256 differs from ``checksums``; the shard is then failed as a whole: its
        queued and in-flight requests are dropped, so the next shard starts with the full prefetch
        budget, and its later episodes raise the same error without a request.
        """
        shard, ranges = self.episodes[k]
        first, stop = self._spans[k]
        try:
            if shard in self._failed:
                raise self._failed[shard]
            pieces = {self.requests[i][1:]: self._take(i) for i in range(first, stop)}
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
            self._release(k)

    def _fail(self, shard: int, exc: FetchError) -> None:
        with self._lock:
            self._failed[shard] = exc
            for i in [i for i in self._futures if self.requests[i][0] == shard]:
                self._drop(i)

    def _release(self, k: int) -> None:
        """Drop the requests episode ``k`` used, and every earlier one; then fetch ahead again.

        Earlier ones belong to skipped episodes; a last request the next episode shares is kept.
        """
        first, stop = self._spans[k]
        hi = max(b for _, b in self.episodes[k][1])
        with self._lock:
            self._next = max(self._next, first)
            for i in [i for i in self._futures if i < stop and not (i == stop - 1 and self.requests[i][2] > hi)]:
                self._drop(i)
        self._fill()

    def _drop(self, i: int) -> None:  # holding self._lock
        future = self._futures.pop(i)
        future.cancel()  # a request still queued is never sent; one in flight finishes and is discarded
        _, a, b = self.requests[i]
        self._buffered -= b - a

    def close(self) -> None:
        """Stop: queued requests are cancelled, those in flight finish and are discarded."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _spans(requests: list[tuple[int, int, int]], episodes) -> list[tuple[int, int]]:
    """``[first, stop)`` request numbers holding each episode's bytes.

    Requests and episodes are both in read order; consecutive episodes may share one request.
    """
    out, i = [], 0
    for shard, ranges in episodes:
        lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)

        def inside(j: int, shard: int = shard, lo: int = lo, hi: int = hi) -> bool:
            """Request ``j`` holds bytes of ``[lo, hi)`` in ``shard``."""
            return requests[j][0] == shard and requests[j][1] < hi and requests[j][2] > lo

        first = next((j for j in range(i, len(requests)) if inside(j)), None)
        if first is None:  # not after the previous episode: search from the start
            first = next(j for j in range(len(requests)) if inside(j))
        stop = first
        while stop < len(requests) and inside(stop):
            stop += 1
        out.append((first, stop))
        i = first
    return out


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1024:  # tar headers between adjacent members: read through them
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


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


def episode_ranges(index, episode: int, cameras: list[int]) -> EpisodeRanges:
    """Where the data member and the given camera streams of ``episode`` lie.

    Their shard, byte ranges, sha256s
    and member numbers (in tar order).
    """
    members = np.unique(np.append(index.stream_member[cameras], index.data_member(episode)))
    start, stop = index.member_ranges(members)
    shas = index.member_sha256.take(members).to_pylist()
    ranges = list(zip(start.tolist(), stop.tolist(), strict=True))
    return EpisodeRanges(int(index.shard[episode]), ranges, shas, members.tolist())
