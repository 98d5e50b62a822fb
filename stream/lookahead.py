"""Look-ahead decoding: fetches, decodes and evictions scheduled from the known yield order.

The plan gives a consumer's windows in yield order before any I/O, so the reader knows every frame
it will return and exactly when each is needed again. ``schedule`` walks that order in chunks (the
horizon: ``Lookahead.first`` windows, then twice as many each chunk up to ``Lookahead.horizon``,
each chunk shortened so its frames fit the cache) and, for each (episode, camera) a chunk touches,
makes ONE decode call for the union of the chunk's frames of it that are not cached (merged
decoding, as ``stream.decode`` does per episode).

Two caches, each bounded in bytes, with Belady's furthest-next-use eviction (optimal for items of
one size, the standard rule for items of several; here the next use is exact, not predicted, within
``REACH`` windows: see ``Scheduler``; L. A. Belady, "A study of replacement algorithms for a
virtual-storage computer", IBM Systems Journal 5(2), 1966):

- decoded items: post-processed frames (``frame_key(stream, frame)``) and each episode's table
  columns (``columns_key(episode)``). A chunk's items must all be held while its windows are
  assembled; the items of other chunks are evicted furthest-next-use first when the chunk needs
  room, and an item with no later use is released as soon as its chunk is done.
- encoded member bytes of an episode (its table and window cameras' videos), kept so an episode
  decoded again soon is not fetched again; one whose next use is further than every kept one is
  not kept (Belady's bypass) and is fetched again when next needed, so the fetch list, repeats
  included, is known up front.

``schedule`` is pure: arrays in, a ``Schedule`` out, no I/O (the approach of ``stream.plan``); property-tested in
``tests/test_lookahead.py``. ``stream.dataset.WindowDataset`` executes it, holding the decoded
items in a ``Store``.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

__all__ = [
    "NEVER",
    "PICTURE_SHARE",
    "REACH",
    "WORKER_BYTES",
    "Decode",
    "Demand",
    "Demands",
    "LazyFrames",
    "Load",
    "Lookahead",
    "Schedule",
    "Scheduler",
    "Step",
    "Store",
    "WorkerBudget",
    "columns_key",
    "frame_key",
    "key_frame",
    "key_stream",
    "materialized",
    "schedule",
]

NEVER = np.iinfo(np.int64).max  # next use of an item no later chunk needs
REACH = 8192  # windows past a chunk whose needs the scheduler looks at (``Scheduler``)
_FRAME_BITS = 32


PICTURE_SHARE = 0.75  # ``Lookahead(pictures=None)``: a kept picture's bytes at most this share of its RGB's
WORKER_BYTES = 1_500_000_000  # a worker's default budget at 640x480, bytes (1.5 GB)
_INTERPRETER_BYTES = 448 << 20  # a forked DataLoader worker before it reads: Python, torch, torchcodec, index


@dataclass(frozen=True)
class WorkerBudget:
    """The bytes a DataLoader worker holds at most, by part (``Lookahead.budget``); ``total`` is their sum.

    ``interpreter``: an allowance, not a bound: the worker's RSS before it reads anything (Python,
    torch, torchcodec, the index; a forked worker measured 0.26 GB before it read, more once
    torch's and FFmpeg's code pages are touched; LeRobot 0.6.1's workers peak at 0.40-0.58 GB);
    ``frame_cache``: decoded, post-processed frames and table columns (``Lookahead.frame_cache_bytes``,
    held by the schedule); ``encoded``: kept encoded members (``Lookahead.encoded_bytes``);
    ``prefetch``: fetched, not yet consumed (``FetchPolicy.prefetch_bytes``); ``decode_call``: one
    decode call's RGB frames and their post-processed copy (``2 x Lookahead.decode_bytes``);
    ``batches``: collated batches the worker holds before the loader takes them (the DataLoader's
    ``prefetch_factor`` x a batch's bytes: uint8 8 x 9 frames of 640x480 are 66 MB, float32 265 MB;
    0 when not given). Open decoders are not bounded here: one per camera of each kept episode,
    their buffers inside FFmpeg.
    """

    interpreter: int
    frame_cache: int
    encoded: int
    prefetch: int
    decode_call: int
    batches: int = 0

    @property
    def total(self) -> int:
        """The budget, bytes: the parts' sum."""
        return self.interpreter + self.frame_cache + self.encoded + self.prefetch + self.decode_call + self.batches


@dataclass(frozen=True)
class Lookahead:
    """How far the reader looks ahead and how much it keeps (``WindowDataset(read=ReadOptions(lookahead=...))``).

    Args:
        horizon: windows per chunk at most: each (episode, camera) gets one decode call per chunk
            for the frames of all the chunk's windows (larger: more merging, more bytes held, and a
            longer pause: a chunk is decoded before its first window is yielded). Default 256 (32
            batches of 8): the plan yields each episode's windows in time order, so a decoder kept
            between chunks goes on forward and a short chunk loses little merging.
        first: windows of the first chunk (each later one twice the one before, up to ``horizon``),
            so the first batch waits only for its own frames and the next few soon after (a
            worker starts streaming without decoding a whole horizon first); the batch size when the dataset knows it
            (``WindowLoader``'s, or ``WindowDataset(batch_size=)``) and this is left at its default.
        frame_cache_bytes: decoded frames (after post-processing, uint8; uint16 depth) and table
            columns held at most, bytes. A chunk is shortened until its frames fit; one window
            alone larger than this is an error. The default shuffle pool
            (``WindowDataset(shuffle="auto")``) is sized so its episodes' frames fit in it
            (``stream.shuffle.budget_shuffle_episodes``). (Fetched bytes are cached on disk by
            ``FetchPolicy.disk_cache_bytes``.)
        encoded_bytes: encoded member bytes kept for episodes decoded again later, at most.
        decode_bytes: RGB bytes one decode call returns at most before post-processing (a longer
            call is split into consecutive calls on the same decoder: ``stream.decode.decode``).
        pictures: keep frames read by packets with nothing to prepare (no crop, resize or hook) as
            the decoder's pictures (``stream.packets.Picture``: 4:2:0 video holds 1.5 bytes per
            pixel against RGB's 3, so about twice the frames fit ``frame_cache_bytes``), each
            converted to RGB when a window takes it. None: where a picture, padding included
            (``stream.packets.picture_bytes``), holds at most ``PICTURE_SHARE`` of its RGB's
            bytes; True: always; False: never.

    The defaults keep a worker's reading within ``WORKER_BYTES`` (1.5 GB; 1.48 GB with the default
    prefetch): ``budget`` states the parts, the collated batches on top.

    Raises:
        ValueError: a count below 1 or a negative byte budget.
    """

    horizon: int = 256
    first: int = 8
    frame_cache_bytes: int = 548 << 20
    encoded_bytes: int = 96 << 20
    decode_bytes: int = 32 << 20
    pictures: bool | None = None

    def __post_init__(self):
        if self.horizon < 1 or self.first < 1:
            raise ValueError(f"Lookahead: horizon and first must be >= 1, not {self.horizon} and {self.first}")
        if self.frame_cache_bytes < 0 or self.encoded_bytes < 0 or self.decode_bytes < 1:
            raise ValueError(
                f"Lookahead: byte budgets must be >= 0 (decode_bytes >= 1), not {self.frame_cache_bytes}, "
                f"{self.encoded_bytes}, {self.decode_bytes}"
            )

    def budget(
        self, prefetch_bytes: int, batch_bytes: int = 0, interpreter_bytes: int = _INTERPRETER_BYTES
    ) -> WorkerBudget:
        """The bytes a worker holds at most with this policy, by part (``WorkerBudget``).

        ``prefetch_bytes``: the fetcher's (``FetchPolicy.prefetch_bytes``); ``batch_bytes``: the
        collated batches the worker holds at once (``prefetch_factor`` x one batch's bytes).
        """
        return WorkerBudget(
            interpreter_bytes,
            self.frame_cache_bytes,
            self.encoded_bytes,
            prefetch_bytes,
            2 * self.decode_bytes,
            batch_bytes,
        )


def frame_key(stream, frame):
    """Cache key (int64, >= 0) of decoded ``frame`` of global camera ``stream``; arrays broadcast."""
    return (np.asarray(stream, dtype=np.int64) << _FRAME_BITS) | np.asarray(frame, dtype=np.int64)


def key_stream(key):
    """The camera stream of frame keys (int64 arrays)."""
    return np.asarray(key, dtype=np.int64) >> _FRAME_BITS


def key_frame(key):
    """The frame number of frame keys (int64 arrays)."""
    return np.asarray(key, dtype=np.int64) & ((1 << _FRAME_BITS) - 1)


def columns_key(episode):
    """Cache key (int64, < 0) of an episode's table columns."""
    return -1 - np.asarray(episode, dtype=np.int64)


@dataclass(frozen=True)
class Demand:
    """What each window of a consumer's yield order needs (the schedule's input).

    ``episode``: int64 ``[n]`` (any episode numbering, e.g. global); ``keys``: int64 ``[n, K]``
    ``frame_key``s of the frames each window returns (-1: none, e.g. a camera its dataset lacks);
    ``stream_episode``: int64 per global stream, its episode; ``frame_bytes``: int64 per global
    stream, bytes of one decoded, post-processed frame; ``columns_bytes`` / ``encoded_bytes``:
    int64 per episode, bytes of its table columns and of its encoded members.
    """

    episode: np.ndarray
    keys: np.ndarray
    stream_episode: np.ndarray
    frame_bytes: np.ndarray
    columns_bytes: np.ndarray
    encoded_bytes: np.ndarray

    @property
    def count(self) -> int:
        """Windows in the yield order."""
        return int(self.episode.size)

    def part(self, start: int, stop: int) -> Demand:
        """Windows ``[start, stop)`` (their rows; the per-stream and per-episode arrays shared)."""
        return dataclasses.replace(self, episode=self.episode[start:stop], keys=self.keys[start:stop])

    def need(self, start: int, stop: int) -> np.ndarray:
        """Sorted unique keys windows ``[start, stop)`` need: their episodes' columns (< 0), then frames."""
        frames = self.keys[start:stop].ravel()
        return np.unique(np.concatenate([frames[frames >= 0], columns_key(self.episode[start:stop])]))

    def sizes(self, keys: np.ndarray) -> np.ndarray:
        """Bytes of each key's item (int64, the shape of ``keys``)."""
        keys = np.asarray(keys, dtype=np.int64)
        frames = keys >= 0
        out = np.empty(keys.shape, dtype=np.int64)
        out[frames] = self.frame_bytes[key_stream(keys[frames])]
        out[~frames] = self.columns_bytes[-1 - keys[~frames]]
        return out


class Demands(Protocol):
    """A consumer's ``Demand`` given a part at a time (``Demand`` itself, or one computed on request).

    ``count``: windows in the yield order; ``part(start, stop)``: the ``Demand`` of windows
    ``[start, stop)``, whose per-stream and per-episode arrays hold at least those windows' entries.
    """

    @property
    def count(self) -> int:
        """Windows in the yield order."""
        ...

    def part(self, start: int, stop: int) -> Demand:
        """The ``Demand`` of windows ``[start, stop)``."""
        ...


@dataclass(frozen=True)
class Decode:
    """One decode call: ``frames`` (sorted unique int64) of global camera ``stream``."""

    stream: int
    frames: np.ndarray


@dataclass(frozen=True)
class Load:
    """One episode's work in a chunk, in this order.

    ``drop_encoded``: episodes whose kept encoded bytes go first (room for this one);
    ``fetch``: position in ``Schedule.fetches`` of this episode's members, or None: they are
    kept from an earlier load; then its ``columns`` are read (when True) and its ``decodes`` run;
    ``keep``: its encoded bytes are kept afterwards (else dropped).
    """

    episode: int
    fetch: int | None
    columns: bool
    decodes: tuple[Decode, ...]
    keep: bool
    drop_encoded: tuple[int, ...] = ()


@dataclass(frozen=True)
class Step:
    """One chunk: windows ``[start, stop)`` of the yield order.

    First the ``evict`` keys leave the cache (forced by the budget, furthest next use first), then
    the ``loads`` run (their items enter the cache: ``held`` bytes after them, the most held in the
    step), then the windows are assembled from the cache, then the ``release`` keys (no later use)
    leave it.
    """

    start: int
    stop: int
    evict: np.ndarray
    loads: tuple[Load, ...]
    release: np.ndarray
    held: int
    hits: int  # frames of the chunk found in the cache
    misses: int  # frames of the chunk decoded for it
    keys: np.ndarray  # int64 [stop - start, K]: the frame keys of the chunk's windows (``Demand.keys`` rows)


@dataclass(frozen=True)
class Schedule:
    """``steps`` in order; ``fetches``: episodes (``Demand.episode``'s numbers) in fetch order (repeats: again)."""

    steps: list[Step]
    fetches: list[int]

    @property
    def peak_bytes(self) -> int:
        """Decoded items held at most, bytes."""
        return max((s.held for s in self.steps), default=0)


class Scheduler:
    """The look-ahead schedule, computed one chunk at a time as the executor advances (an iterator of ``Step``).

    ``next()`` gives the next chunk's ``Step``; ``fetches`` grows by the episodes that step fetches
    (their positions are its loads' ``fetch``). The work per step is the step's own: its chunk's
    keys against the cache, and the next uses of the windows up to ``reach`` past it. Nothing is
    computed over the whole yield order, so the first step costs the first chunk and ``reach``
    windows, not the epoch (which may hold millions of windows).

    Next use, vectorised per part of the order: the ``demand`` of windows ``[a, a + horizon + 2
    reach)`` is asked for (``Demands.part``) when a chunk starting at ``a`` would look past the part
    in hand; each occurrence of an item (a window's frame key or its episode's columns) gets the
    window of its next occurrence in the part (one stable sort of the part's keys, ``O(m K log(m
    K))`` for ``m`` windows of ``K`` frames). So every next use within ``reach`` windows after a
    chunk is known exactly; an item needed next further on counts as needed never: it is released
    after its chunk and decoded again when needed (with the default budgets a frame kept that long
    would have been evicted first anyway). Belady compares next uses by window, not chunk (the
    same order, finer). The encoded cache takes as an episode's next use the next window of that
    episode (a load only if some of its items are not cached then: a kept episode with no load is
    kept on, with its next use moved past that chunk).

    Raises (from ``next``):
        ValueError: one window's frames and columns alone exceed ``policy.frame_cache_bytes`` (naming
            the window's position, its episode and the bytes).
    """

    def __init__(self, demand: Demands, policy: Lookahead, reach: int = REACH):
        if reach < 1:
            raise ValueError(f"Scheduler: reach must be >= 1 window, not {reach}")
        self.demand, self.policy, self.reach = demand, policy, reach
        self.fetches: list[int] = []
        # Per fetch, what its load does: (columns read, decode calls); a reader that fetches only
        # the packets a load decodes (``stream.packets``) sizes the fetch from it.
        self.fetch_work: list[tuple[bool, tuple[Decode, ...]]] = []
        self.fetch_chunk: list[int] = []  # per fetch, the first window of the chunk whose load it is
        self._start, self._size = 0, policy.first
        self._chunk = 0  # the first window of the chunk being scheduled
        # The part of the order in hand: its first window, its Demand, each occurrence's next window.
        self._base, self._part, self._next_window = 0, demand.part(0, 0), np.zeros(0, dtype=np.int64)
        # The decoded-item cache, as arrays sorted by key: key, bytes, next window that needs it.
        self._keys, self._sizes, self._nexts = (np.zeros(0, dtype=np.int64) for _ in range(3))
        # The encoded cache: episode -> bytes, episode -> next use, a lazy max-heap of (-next use, episode).
        self._held: dict[int, int] = {}
        self._next_use: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []
        self._held_bytes = 0

    def __iter__(self):
        return self

    def __next__(self) -> Step:
        policy, n = self.policy, self.demand.count
        a = self._start
        if a >= n:
            raise StopIteration
        stop = min(n, a + self._size)
        self._cover(a, min(n, stop + self.reach))
        part, base = self._part, self._base
        b = a + _fitting(part, a - base, stop - base, policy.frame_cache_bytes)
        if b == a:
            alone = int(part.sizes(part.need(a - base, a - base + 1)).sum())
            raise ValueError(
                f"look-ahead: window {a} (episode {int(part.episode[a - base])}) needs {alone} bytes of decoded "
                f"frames and columns, more than Lookahead.frame_cache_bytes = {policy.frame_cache_bytes}: raise "
                "frame_cache_bytes"
            )
        # Chunks grow from the first one (the first batch) to the horizon, doubling: the reader starts
        # streaming after one batch's decoding, not a horizon's, and merges fully once under way.
        self._start, self._size = b, min(policy.horizon, 2 * self._size)
        need, nxt = self._need(a, b)
        keys, sizes, nexts = self._keys, self._sizes, self._nexts
        cached = np.isin(need, keys, assume_unique=True)
        miss = need[~cached]
        miss_sizes = part.sizes(miss)
        over = int(sizes.sum() + miss_sizes.sum()) - policy.frame_cache_bytes
        evicted = np.zeros(0, dtype=np.int64)
        if over > 0:  # furthest next use first (ties: smaller key first), never what this chunk needs
            other = np.flatnonzero(~np.isin(keys, need, assume_unique=True))
            order = other[np.lexsort((keys[other], -nexts[other]))]
            count = int(np.searchsorted(np.cumsum(sizes[order]), over)) + 1
            if count > order.size:
                raise AssertionError("internal: the look-ahead cache would evict an item its chunk needs")
            gone = np.zeros(keys.size, dtype=bool)
            gone[order[:count]] = True
            evicted = keys[gone]
            keys, sizes, nexts = keys[~gone], sizes[~gone], nexts[~gone]
        held = int(sizes.sum() + miss_sizes.sum())
        # After the chunk: its items carry their next use; those with none are released.
        done = nxt == NEVER
        rest = ~np.isin(keys, need, assume_unique=True)
        keys = np.concatenate([keys[rest], need[~done]])
        sizes = np.concatenate([sizes[rest], part.sizes(need[~done])])
        nexts = np.concatenate([nexts[rest], nxt[~done]])
        order = np.argsort(keys, kind="stable")
        self._keys, self._sizes, self._nexts = keys[order], sizes[order], nexts[order]
        columns = need < 0
        episode_next = dict(zip((-1 - need[columns]).tolist(), nxt[columns].tolist(), strict=True))
        self._chunk = a
        loads = self._encoded(_loads(part, miss), episode_next)
        hits = int(np.count_nonzero(cached & (need >= 0)))
        misses = int(np.count_nonzero(miss >= 0))
        return Step(a, b, evicted, loads, need[done], held, hits, misses, part.keys[a - base : b - base])

    def _cover(self, a: int, want: int) -> None:
        """Have the part in hand hold windows ``[a, want)``: else ask for ``[a, a + horizon + 2 reach)``."""
        if self._base <= a and want <= self._base + self._part.count:
            return
        stop = min(self.demand.count, max(want, a + self.policy.horizon + 2 * self.reach))
        self._base, self._part = a, self.demand.part(a, stop)
        self._next_window = _next_windows(self._part)
        known = self._next_window != NEVER
        self._next_window[known] += a

    def _need(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Sorted unique keys windows ``[a, b)`` need (as ``Demand.need``), and each one's next window after ``b``."""
        part, base = self._part, self._base
        width, m, a, b = part.keys.shape[1], part.count, a - base, b - base
        frames = part.keys[a:b].ravel()
        valid = frames >= 0
        items = np.concatenate([frames[valid], columns_key(part.episode[a:b])])
        after = np.concatenate(
            [self._next_window[a * width : b * width][valid], self._next_window[m * width + a : m * width + b]]
        )
        need, inverse = np.unique(items, return_inverse=True)
        nxt = np.full(need.size, -1, dtype=np.int64)
        np.maximum.at(nxt, inverse, after)  # the last occurrence in the chunk points past it
        return need, nxt

    def _encoded(self, work: list, episode_next: dict[int, int]) -> tuple[Load, ...]:
        """Fetch or reuse each load's encoded bytes: Belady over episodes' next windows, with bypass."""
        budget, held, next_use, heap = self.policy.encoded_bytes, self._held, self._next_use, self._heap
        for e in held.keys() & episode_next.keys():  # used by this chunk: next needed after it
            next_use[e] = episode_next[e]
            heapq.heappush(heap, (-episode_next[e], e))
        built = []
        for e, columns, decodes in work:
            u, size = episode_next[e], int(self._part.encoded_bytes[e])
            fetch = None
            if e not in held:
                fetch = len(self.fetches)
                self.fetches.append(e)
                self.fetch_work.append((columns, decodes))
                self.fetch_chunk.append(self._chunk)
            drop: list[int] = []
            keep = u != NEVER and size <= budget
            if keep and e not in held:
                while self._held_bytes + size > budget:
                    negative, k = heapq.heappop(heap)
                    if k not in held or next_use[k] != -negative:
                        continue
                    if -negative < u:  # every kept one is needed sooner: bypass this one
                        heapq.heappush(heap, (negative, k))
                        keep = False
                        break
                    self._held_bytes -= held.pop(k)
                    drop.append(k)
            if keep:
                if e not in held:
                    held[e] = size
                    self._held_bytes += size
                next_use[e] = u
                heapq.heappush(heap, (-u, e))
            elif e in held:
                self._held_bytes -= held.pop(e)
            built.append(Load(e, fetch, columns, decodes, keep, tuple(drop)))
        return tuple(built)


def schedule(demand: Demand, policy: Lookahead, reach: int = REACH) -> Schedule:
    """The whole look-ahead schedule of a consumer's windows at once (``Scheduler``'s steps, listed).

    Raises:
        ValueError: as ``Scheduler``.
    """
    steps = Scheduler(demand, policy, reach)
    return Schedule(list(steps), steps.fetches)


def _fitting(demand: Demand, start: int, stop: int, budget: int) -> int:
    """How many windows from ``start`` (at most ``stop - start``) need at most ``budget`` bytes together.

    Each item counts once, at the first window that needs it; the bytes grow with the prefix.
    """
    m, width = stop - start, demand.keys.shape[1]
    flat = demand.keys[start:stop].ravel()
    valid = flat >= 0
    items = np.concatenate([flat[valid], columns_key(demand.episode[start:stop])])
    window = np.concatenate([np.repeat(np.arange(m), width)[valid], np.arange(m)])
    unique, first = np.unique(items, return_index=True)
    cumulative = np.cumsum(np.bincount(window[first], weights=demand.sizes(unique), minlength=m))
    return int(np.searchsorted(cumulative, budget, side="right"))


def _next_windows(demand: Demand) -> np.ndarray:
    """Per item occurrence, the window of the item's next occurrence (``NEVER``: none; int64).

    Occurrences are laid out as ``demand.keys.ravel()`` (frame ``j`` of window ``i`` at ``i * K + j``;
    a -1 key gets ``NEVER``) followed by each window's columns (window ``i`` at ``n * K + i``).
    """
    n, width = demand.keys.shape
    items = np.concatenate([demand.keys.ravel(), columns_key(demand.episode)])
    window = np.concatenate([np.repeat(np.arange(n, dtype=np.int64), width), np.arange(n, dtype=np.int64)])
    valid = np.concatenate([demand.keys.ravel() >= 0, np.ones(n, dtype=bool)])
    where = np.flatnonzero(valid)
    # Frames (>= 0) and columns (< 0) never share a key, and each part is in window order: a stable
    # sort by key puts each key's occurrences in window order.
    order = where[np.argsort(items[where], kind="stable")]
    same = items[order[1:]] == items[order[:-1]]
    out = np.full(items.size, NEVER, dtype=np.int64)
    out[order[:-1][same]] = window[order[1:][same]]
    return out


def _loads(demand: Demand, miss: np.ndarray) -> list[tuple[int, bool, tuple[Decode, ...]]]:
    """(episode, columns missing, decode calls) of a chunk's misses (sorted keys), in episode order.

    Loads run before any window of the chunk: in episode order, which is shard and tar order, so a
    stream-mode fetcher reads neighbouring episodes of a shard in one request.
    """
    frames = miss[miss >= 0]
    streams, numbers = key_stream(frames), key_frame(frames)
    bounds = np.flatnonzero(np.r_[True, streams[1:] != streams[:-1]]) if frames.size else np.zeros(0, np.int64)
    ends = [*bounds[1:].tolist(), frames.size] if frames.size else []
    calls = [Decode(s, numbers[a:b]) for s, a, b in zip(streams[bounds].tolist(), bounds.tolist(), ends, strict=True)]
    call_episode = demand.stream_episode[streams[bounds]]
    columns = -1 - miss[miss < 0]
    episodes = np.union1d(call_episode, columns)
    order = np.argsort(call_episode, kind="stable")  # each episode's calls, in stream order
    lo = np.searchsorted(call_episode[order], episodes, side="left").tolist()
    hi = np.searchsorted(call_episode[order], episodes, side="right").tolist()
    with_columns = np.isin(episodes, columns).tolist()
    order = order.tolist()
    return [
        (e, c, tuple(calls[j] for j in order[x:y]))
        for e, c, x, y in zip(episodes.tolist(), with_columns, lo, hi, strict=True)
    ]


class LazyFrames:
    """One camera's frames of a window, still as kept pictures (``stream.packets.Picture``), for a collate to write.

    Under ``WindowLoader``'s recycled batch buffers the reader gives a window's picture frames this
    way and ``stream.collate.BufferedCollate`` converts them to RGB straight into the batch: no
    per-window stack of full-size RGB frames is made and copied again. ``shape``: ``[T, 3, H, W]``;
    ``dtype``: uint8 (what ``write`` produces); ``tensor()``: the stack itself.
    """

    __slots__ = ("items",)
    dtype = torch.uint8

    def __init__(self, items: list):
        self.items = items

    @property
    def shape(self) -> torch.Size:
        """``[T, 3, H, W]`` of the frames."""
        return torch.Size((len(self.items), *self.items[0].shape))

    def write(self, out: torch.Tensor) -> torch.Tensor:
        """The frames' RGB written into ``out`` (``[T, 3, H, W]``, uint8 or float16/32/64, 0..255); returns ``out``."""
        for i, item in enumerate(self.items):
            item.write(out[i])
        return out

    def tensor(self) -> torch.Tensor:
        """The frames as a new uint8 ``[T, 3, H, W]`` tensor."""
        return self.write(torch.empty(self.shape, dtype=torch.uint8))


def materialized(sample: dict) -> dict:
    """``sample`` with every ``LazyFrames`` value made a tensor (the sample itself when it has none)."""
    if not any(isinstance(v, LazyFrames) for v in sample.values()):
        return sample
    return {k: v.tensor() if isinstance(v, LazyFrames) else v for k, v in sample.items()}


class Store:
    """The executor's side of the decoded-item cache: what ``Schedule`` steps put in and take out.

    Frames are kept one tensor per frame (copied out of their decode call's batch, so evicting one
    frees its bytes); columns with the episode's ``EpisodeInfo``. ``nbytes``: bytes held now.
    """

    def __init__(self):
        self.frames: dict[int, torch.Tensor] = {}
        self.columns: dict[int, tuple[dict, Any, int]] = {}
        self.nbytes = 0
        # Frames dropped from the cache, kept to be written again (``alloc``): a new frame then
        # reuses one of its shape instead of a fresh allocation (no page faults, no heap
        # fragmentation). At most the cache's own size, since only cached frames come back.
        self._free: dict[tuple, list[torch.Tensor]] = {}

    def alloc(self, shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """An uninitialised contiguous frame tensor of ``shape``: a dropped frame's, else a new one."""
        free = self._free.get((shape, dtype))
        return free.pop() if free else torch.empty(shape, dtype=dtype)

    def put_frames(self, stream: int, frames: np.ndarray, decoded: torch.Tensor | list) -> None:
        """``decoded``: ``[len(frames), C, h, w]``, frame ``frames[i]`` of global ``stream`` at ``i``.

        Or a list of standalone frames (``stream.packets.decode_runs`` without post-processing):
        kept as they are, tensors or ``stream.packets.Picture`` (a decoded picture, an ``nbytes``,
        ``shape`` and ``write(out)``, converted when stacked); a batch's frames are copied out of it.
        """
        items = decoded if isinstance(decoded, list) else [f.clone() for f in decoded.unbind(0)]
        for k, frame in zip(frame_key(stream, frames).tolist(), items, strict=True):
            self.frames[k] = frame
            self.nbytes += frame.nbytes

    def put_columns(self, episode: int, columns: dict, info, nbytes: int) -> None:
        """An episode's ``read_columns`` and ``EpisodeInfo``, ``nbytes`` as the schedule counts them."""
        self.columns[episode] = (columns, info, nbytes)
        self.nbytes += nbytes

    def drop(self, keys: np.ndarray) -> None:
        """Remove items by key (frames and columns; absent ones, e.g. of a failed episode, are skipped)."""
        for k in keys.tolist():
            if k >= 0:
                frame = self.frames.pop(k, None)
                if frame is not None:
                    self.nbytes -= frame.nbytes
                    if isinstance(frame, torch.Tensor) and frame.is_contiguous():
                        self._free.setdefault((tuple(frame.shape), frame.dtype), []).append(frame)
            else:
                item = self.columns.pop(-1 - k, None)
                self.nbytes -= 0 if item is None else item[2]

    def stack(self, keys: np.ndarray, lazy: bool = False) -> torch.Tensor | LazyFrames:
        """Frames of ``keys`` (int64 ``[T]``, T >= 1), stacked ``[T, C, h, w]`` in their stored dtype.

        Kept pictures (``stream.packets.Picture``) are converted to uint8 RGB straight into the
        stack; with ``lazy``, frames that are all pictures come back as ``LazyFrames`` instead, for
        the collate to convert into the batch (pictures never change, so a dropped one stays valid).

        Raises ``KeyError``: a key not held (the schedule's bug, never the data's).
        """
        items = [self.frames[k] for k in keys.tolist()]
        if isinstance(items[0], torch.Tensor):  # a window's frames of a camera are kept one way (one stream)
            return torch.stack(items)
        return LazyFrames(items) if lazy else LazyFrames(items).tensor()
