"""The fetcher against its contract (issue 16, item 2; no timing): any fetch order, shuffled
across shards and with repeated episodes, gives every episode exactly the bytes it asked for; the
bytes fetched and not yet consumed never exceed the budget; adjacent ranges share requests and a
shuffled stream-mode order reads no span twice; and against a server that adds latency, the
requests in flight grow to cover it (counted at the server)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import random

import pytest
from faultgen import SPEC
from remote_servers import Gauge, serve_http

from epishard.stream import WindowDataset
from epishard.stream.fetch import Fetcher, FetchPolicy, episode_ranges, plan_requests
from epishard.stream.lookahead import Lookahead
from epishard.stream.options import ReadOptions
from epishard.stream.source import DatasetSource
from epishard.stream.telemetry import Telemetry


def _all_ranges(source: DatasetSource, episode: int):
    ix = source.index
    where = episode_ranges(ix, episode, [ix.stream(episode, j) for j in range(len(ix.camera_names(episode)))])
    return where.shard, where.ranges, where.sha256


def _shard_bytes(source: DatasetSource, shard: int, a: int, b: int) -> bytes:
    with open(os.path.join(source.url, source.shards[shard]), "rb") as f:
        f.seek(a)
        return f.read(b - a)


def _shuffled(n: int, repeats: int, seed: int) -> list[int]:
    order = [e for e in range(n) for _ in range(repeats)]
    random.Random(seed).shuffle(order)
    return order


@pytest.mark.parametrize("mode", ["stream", "ranged"])
@pytest.mark.parametrize("seed", range(6))
def test_any_order_with_repeats_gives_exact_bytes_within_the_budget(intact, monkeypatch, mode, seed):
    source = DatasetSource(intact)
    rng = random.Random(seed)
    order = _shuffled(source.index.num_episodes, 3, seed)
    where = [_all_ranges(source, e) for e in order]
    episodes = [(shard, ranges) for shard, ranges, _ in where]
    largest = max(b - a for _, ranges in episodes for a, b in ranges)
    chunk = rng.choice([1000, 3001, largest, 1 << 20])
    budget = rng.choice([0, 4096, 3 * largest])
    requests, uses = plan_requests(episodes, chunk, None if mode == "stream" else FetchPolicy().coalesce_bytes)
    # The guarantee: the budget, or the requests of the one episode the worker is asking for when
    # they alone are more (sent then, not ahead).
    limit = max([budget] + [sum(requests[i][2] - requests[i][1] for i in u) for u in uses])
    submit, seen = Fetcher._submit, []

    def checked(self, i):  # every request sent, prefetched or asked for, keeps the bytes held in bounds
        submit(self, i)
        seen.append(self.held_bytes)
        assert self.held_bytes <= limit

    monkeypatch.setattr(Fetcher, "_submit", checked)
    policy = FetchPolicy(mode=mode, chunk_bytes=chunk, prefetch_bytes=budget, threads=2, max_in_flight=4)
    fetcher = Fetcher(source, episodes, policy, Telemetry())
    skipped = set(rng.sample(range(len(order)), 4))  # the reader may pass episodes over
    try:
        for k, (shard, ranges, shas) in enumerate(where):
            if k in skipped:
                continue
            got = fetcher.episode(k, shas)
            assert got == [_shard_bytes(source, shard, a, b) for a, b in ranges]
            assert fetcher.held_bytes <= limit
    finally:
        fetcher.close()
    assert seen and fetcher.held_bytes == 0  # everything sent was released


def test_requests_coalesce_adjacent_members_and_reuse_a_repeat():
    # Episode 0: members at 0-100 and 612-700 (a tar header between); episode 1 of the same shard
    # 1000 bytes further; episode 0 again right after: it reuses the request still held.
    episodes = [(0, [(0, 100), (612, 700)]), (0, [(1700, 1800)]), (0, [(0, 100), (612, 700)]), (1, [(0, 50)])]
    requests, uses = plan_requests(episodes, chunk_bytes=1 << 20, gap=1024)
    assert requests == [(0, 0, 1800), (1, 0, 50)]  # the repeat of episode 0 is inside the first request
    assert uses == [[0], [0], [0], [1]]
    requests, uses = plan_requests(episodes, chunk_bytes=1 << 20, gap=0)  # no holes read
    assert requests == [(0, 0, 100), (0, 612, 700), (0, 1700, 1800), (0, 0, 100), (0, 612, 700), (1, 0, 50)]
    requests, _ = plan_requests(episodes, chunk_bytes=500, gap=1024)  # within chunk_bytes
    assert all(b - a <= 500 for _, a, b in requests)


def test_a_shuffled_stream_order_reads_no_span_twice(intact):
    source = DatasetSource(intact)
    n = source.index.num_episodes
    sequential = [_all_ranges(source, e)[:2] for e in range(n)]
    requests, _ = plan_requests(sequential, chunk_bytes=1 << 30, gap=None)
    assert len(requests) == len(source.shards)  # in order: one span per shard, as before
    shuffled = [sequential[e] for e in [1, 4, 0, 3, 5, 2]]  # no two consecutive episodes of one shard
    requests, _ = plan_requests(shuffled, chunk_bytes=1 << 30, gap=None)
    spans = sum(max(b for _, b in r) - min(a for a, _ in r) for _, r in shuffled)
    assert sum(b - a for _, a, b in requests) == spans  # each episode's own span, once


@pytest.mark.parametrize("compute_s", [0.0, 0.05])
def test_requests_in_flight_grow_to_cover_the_latency(intact, compute_s):
    """A server that answers each ranged request after 0.4 s; a worker that takes ``compute_s`` per
    episode. Starting from one request in flight, the fetcher must reach latency / compute requests
    in flight (Little's law: 8), counted by the server, within ``max_in_flight``; at least half of
    it, as a loaded machine adds its overhead to the measured compute time."""
    import time

    gauge = Gauge()
    server, base = serve_http(intact, latency_s=0.4, gauge=gauge)
    try:
        source = DatasetSource(base)
        order = _shuffled(source.index.num_episodes, 5, 0)
        where = [_all_ranges(source, e) for e in order]
        policy = FetchPolicy(mode="ranged", threads=1, max_in_flight=8)
        fetcher = Fetcher(source, [(s, r) for s, r, _ in where], policy, Telemetry())
        try:
            for k, (_, _, shas) in enumerate(where):
                fetcher.episode(k, shas)
                time.sleep(compute_s)
        finally:
            fetcher.close()
    finally:
        server.shutdown()
    needed = 8 if compute_s == 0 else int(0.4 / compute_s) // 2
    assert needed <= gauge.peak <= 8
    assert needed <= fetcher.depth <= 8


def test_a_fixed_depth_stays_fixed(intact):
    gauge = Gauge()
    server, base = serve_http(intact, latency_s=0.05, gauge=gauge)
    try:
        source = DatasetSource(base)
        where = [_all_ranges(source, e) for e in _shuffled(source.index.num_episodes, 2, 1)]
        fetcher = Fetcher(source, [(s, r) for s, r, _ in where], FetchPolicy(threads=2, max_in_flight=2), Telemetry())
        try:
            for k, (_, _, shas) in enumerate(where):
                fetcher.episode(k, shas)
        finally:
            fetcher.close()
    finally:
        server.shutdown()
    assert gauge.peak == 2 and fetcher.depth == 2


def test_the_next_chunk_is_fetched_while_this_chunk_loads(intact, monkeypatch):
    """The reader hands a look-ahead chunk's fetches to the fetcher before the previous chunk's loads
    run, so they are prefetched during that chunk's decoding (not only while its windows are yielded)."""
    added: list[int] = []  # per fetch position: the number of the extend call that appended it
    seen: dict[int, int] = {}  # per fetch position: extend calls made when the reader consumed it
    extend, episode = Fetcher.extend, Fetcher.episode

    def recording_extend(self, episodes):
        added.extend([len(set(added)) + 1] * len(episodes))
        extend(self, episodes)

    def recording_episode(self, k, checksums=None):
        seen[k] = len(set(added))
        return episode(self, k, checksums)

    monkeypatch.setattr(Fetcher, "extend", recording_extend)
    monkeypatch.setattr(Fetcher, "episode", recording_episode)
    spec = dataclasses.replace(SPEC, per_episode_count=1)
    ds = WindowDataset(intact, spec, seed=1, shuffle=0, read=ReadOptions(lookahead=Lookahead(horizon=1, first=1)))
    samples = list(ds)
    assert len(samples) == 6 and len(added) == 6 and sorted(seen) == list(range(6))
    # Chunk 1 (the first batch) goes out alone; from chunk 2 on, each chunk's loads start after the
    # next chunk's fetches were handed over (the last chunk has none after it).
    assert [seen[k] - added[k] for k in range(6)] == [0, 1, 1, 1, 1, 0]


@pytest.mark.parametrize("seed", range(20))
def test_bridge_joins_small_gaps_within_the_byte_allowance(seed):
    from epishard.stream.fetch import bridge

    rng = random.Random(seed)
    ranges = []
    for _ in range(rng.randint(1, 30)):
        a = rng.randrange(0, 100_000)
        ranges.append((a, a + rng.randint(1, 3000)))
    extra, max_gap = rng.choice([0.0, 0.1, 0.5, 2.0]), rng.choice([0, 500, 5000, 1 << 20])
    out = bridge(ranges, extra, max_gap)
    union = bridge(ranges, 0.0, 0)
    covered = sum(b - a for a, b in union)
    assert all(out[i][1] < out[i + 1][0] for i in range(len(out) - 1))  # sorted, disjoint, gaps between
    assert all(any(c <= a and b <= d for c, d in out) for a, b in ranges)  # every range inside one
    assert sum(b - a for a, b in out) <= (1 + extra) * covered
    # What was read through: only gaps of at most max_gap, and only gaps between the union's pieces.
    read_through = [(b, c) for (_, b), (c, _) in itertools.pairwise(union) if any(x <= b and c <= y for x, y in out)]
    assert all(c - b <= max_gap for b, c in read_through)
    if extra == 0 or max_gap == 0:
        assert out == union
    # Greedy by size: a gap left open is larger than the allowance left, or than max_gap.
    left = (1 + extra) * covered - sum(b - a for a, b in out)
    for (_, b), (c, _) in itertools.pairwise(union):
        if (b, c) not in read_through:
            assert c - b > max_gap or c - b > left


def test_bridge_reads_the_smallest_gaps_first():
    from epishard.stream.fetch import bridge

    # Needed 400 bytes; allowance 0.5 -> 200 extra bytes: the 50 and 100 byte gaps are read, not the 150.
    ranges = [(0, 100), (150, 250), (400, 500), (600, 700)]
    assert bridge(ranges, 0.5, 1 << 20) == [(0, 250), (400, 700)]
    assert bridge(ranges, 0.5, 60) == [(0, 250), (400, 500), (600, 700)]  # max_gap caps it
    assert bridge([(10, 20), (15, 30), (30, 40)], 0.0, 0) == [(10, 40)]  # overlapping and touching


def test_a_remote_source_reads_gaps_through_in_fewer_requests(intact):
    """Over HTTP, ranged mode: episodes asking for parts of their members (gaps between) get
    exactly their bytes either way; with bridging on, fewer requests reach the server
    and the bytes it sends stay within the allowance."""
    results = {}
    for extra in (0.0, 1.0):
        gauge = Gauge()
        server, base = serve_http(intact, gauge=gauge)
        try:
            source = DatasetSource(base)
            where = [_all_ranges(source, e) for e in range(source.index.num_episodes)]
            # Each member asked for as its first and last thirds: a gap between (as packets of GOPs).
            episodes = [
                (s, [piece for a, b in r for piece in ((a, a + (b - a) // 3), (b - (b - a) // 3, b))])
                for s, r, _ in where
            ]
            policy = FetchPolicy(mode="ranged", coalesce_bytes=0, bridge_extra=extra, bridge_gap=1 << 20)
            telemetry = Telemetry()
            fetcher = Fetcher(source, episodes, policy, telemetry)
            try:
                for k, (shard, ranges) in enumerate(episodes):
                    got = fetcher.episode(k)
                    local = DatasetSource(intact)
                    assert got == [_shard_bytes(local, shard, a, b) for a, b in ranges]
            finally:
                fetcher.close()
        finally:
            server.shutdown()
        needed = sum(b - a for _, r in episodes for a, b in r)
        results[extra] = (telemetry.values["requests"], telemetry.values["bytes_read"], needed)
    (plain, plain_bytes, needed), (bridged, bridged_bytes, _) = results[0.0], results[1.0]
    assert plain_bytes == needed
    assert bridged < plain
    assert needed < bridged_bytes <= 2 * needed
