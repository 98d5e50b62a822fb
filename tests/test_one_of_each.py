"""One of each piece of infrastructure (issue 15, item 4): one seed convention (every plan's
randomness comes from ``epishard.seeding.rng_for``: ``[seed mod 2**64, epoch, *salt]``, in the
reader's planner and in ``balance`` alike), one fork-safe fsspec handle
(``epishard.format.storage.FileSystemHandle``), one set of counter names (the fetcher counts into
``Telemetry``)."""

from __future__ import annotations

import os
import pathlib
import pickle
import re
import tarfile

import numpy as np

from epishard.balance import local_order, random_steps
from epishard.format.storage import FileSystemHandle, Storage
from epishard.seeding import rng_for
from epishard.stream import DatasetSource, WindowDataset
from epishard.stream.lookahead import Lookahead
from epishard.stream.options import ReadOptions
from epishard.stream.plan import shard_order
from epishard.stream.telemetry import FIELDS, summarize

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_seeds_equal_modulo_2_64_give_the_same_plans_and_larger_seeds_are_not_truncated():
    costs = np.arange(64, dtype=np.float64)
    for plan in (
        lambda seed: random_steps(costs, 2, 4, seed=seed, epoch=1),
        lambda seed: local_order(costs, 4, 4, seed, 1),
        lambda seed: shard_order(64, seed, 1),
    ):
        assert np.array_equal(plan(-1), plan(2**64 - 1))
        assert not np.array_equal(plan(5), plan(5 + 2**32))  # a 32-bit mask would make these equal


def test_rng_for_is_numpys_generator_of_the_documented_sequence():
    assert np.array_equal(rng_for(7, 2, 13).random(4), np.random.default_rng([7, 2, 13]).random(4))


def test_no_plan_seeds_numpy_by_hand():
    uses = [
        f"{path.relative_to(REPO)}: {line.strip()}"
        for folder in ("stream", "balance")
        for path in (REPO / folder).glob("*.py")
        for line in path.read_text().splitlines()
        if re.search(r"default_rng\(|np\.random\.seed\(|RandomState\(", line)
    ]
    assert uses == []


def _code_lines(folders, pattern: str) -> list[str]:
    return [
        f"{path.relative_to(REPO)}: {line.strip()}"
        for folder in folders
        for path in (REPO / folder).glob("*.py")
        for line in path.read_text().splitlines()
        if re.search(pattern, line)
    ]


def test_the_filesystem_handle_is_made_per_process_and_pickles_without_it(monkeypatch):
    handle = FileSystemHandle("memory://epishard-handle", {})
    fs = handle.get()
    assert handle.get() is fs and handle.root == "/epishard-handle"
    clone = pickle.loads(pickle.dumps(handle))
    assert clone._fs is None and clone.get() is not fs  # a worker makes its own
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as in a forked child
    assert handle.get() is not fs


def test_writer_and_reader_share_the_one_handle(intact):
    assert isinstance(Storage("memory://epishard-handle")._handle, FileSystemHandle)
    assert isinstance(DatasetSource(intact).storage._handle, FileSystemHandle)
    made_elsewhere = [
        line
        for line in _code_lines(("epishard/format", "shardwriter", "stream", "balance"), r"make_filesystem\(")
        if not line.startswith("epishard/format/storage.py:")
    ]
    assert made_elsewhere == []
    assert _code_lines(("epishard/format",), r"def make_filesystem\(")  # the one place, where the scan looks


def test_the_fetcher_counts_into_the_telemetry_names(intact):
    from faultgen import SPEC

    # One look-ahead chunk for the epoch: each episode fetched once, in shard order.
    samples = list(
        WindowDataset(intact, SPEC, seed=5, read=ReadOptions(telemetry=True, lookahead=Lookahead(first=4096)))
    )
    totals = summarize([s["__telemetry__"] for s in samples])
    assert {"bytes_read", "requests", "retries", "range_ignored", "cache_hits", "read_s"} <= set(FIELDS)
    # Stream mode: one request per shard (under chunk_bytes), covering the members every episode needs.
    manifest = DatasetSource(intact).manifest
    needed = 0
    for shard in manifest.shards:
        with tarfile.open(os.path.join(intact, shard.shard)) as tar:
            needed += sum(m.size for m in tar.getmembers() if not m.name.endswith(".json"))
    assert totals["requests"] == len(manifest.shards) == 3 and totals["retries"] == 0
    assert needed <= totals["bytes_read"] <= manifest.totals.bytes


def test_a_dataset_root_is_opened_once_its_options_resolved_once(intact, monkeypatch, tmp_path):
    """The reader, ``verify`` and ``inspect`` open a root one way (``Location.of``): the storage options
    are merged with the environment once per open, not per filesystem, read or retry, and a whole epoch
    reads through that one opening."""
    from faultgen import SPEC

    import epishard.format.storage as storage
    from epishard.shardwriter.describe import describe
    from epishard.shardwriter.verify import verify

    resolved = []
    real = storage.resolve_storage_options
    monkeypatch.setattr(storage, "resolve_storage_options", lambda url, o=None: resolved.append(url) or real(url, o))
    samples = list(WindowDataset(intact, SPEC, seed=1))
    assert samples and resolved == [intact]
    resolved.clear()
    assert verify(intact, decode=False)["ok"] and resolved == [intact]
    resolved.clear()
    assert describe(intact)["totals"]["episodes"] == 6 and resolved == [intact]


def test_one_retry_policy_reaches_every_retry_loop():
    """``retry_budget`` / ``connect_timeout`` / ``read_timeout`` are read in one place (``RetryPolicy``), and a
    reader's fetch policy and the storage options meet in the one ``RetryPolicy`` of the opened location."""
    from epishard.format.retry import RetryPolicy
    from epishard.format.storage import Location
    from epishard.stream import FetchPolicy

    readers = [
        line
        for line in _code_lines(
            ("epishard", "epishard/format", "shardwriter", "shardwriter/sources", "stream", "balance"),
            r"[\"']retry_budget[\"']",
        )
        if not line.startswith("epishard/format/retry.py:")
    ]
    assert readers == []
    fetch = FetchPolicy(retry_budget_s=4, backoff_s=0.1, retries=3, connect_timeout_s=2)
    opened = Location.of("s3://bucket/ds", {"endpoint_url": "http://127.0.0.1:9", "retry_budget": 0.5}, fetch.retry)
    assert opened.retry == RetryPolicy(budget_s=0.5, backoff_s=0.1, retries=3, connect_s=2)
    assert opened.options == {"endpoint_url": "http://127.0.0.1:9"}  # the client gets no option of ours
    assert Location.of(opened) is opened
