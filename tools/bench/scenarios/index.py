"""Benchmark: window-index load time and per-sample lookup cost at 1 and 27,500 episodes.

Generates synthetic shard indexes (no videos) shaped like real data: 3 cameras per episode, 300
rows at 30 fps, a keyframe every 30 frames, 64 episodes per shard. For each size it measures
loading the dataset index (``index.arrow``, memory-mapped) and, for comparison, every per-shard
Parquet index into a ``WindowIndex``, and the per-sample lookup of a random window:
global window id -> (episode, anchor row) -> per camera (shard, byte range, frame numbers, keyframe).

    python tools/bench/run.py index [--episodes 1 27500] [--lookups 20000] [--rounds 5] [--json]
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import resource
import tempfile
import time
from pathlib import Path

import measure
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from epishard.format.index import WindowIndex, dataset_index_bytes, encode_index
from epishard.format.manifest import DATASET_INDEX_NAME, MANIFEST_NAME, ShardEntry, index_name
from epishard.format.validate import check_index
from epishard.shardwriter.video import NO_PACKETS

CAMERAS = ("observation.images.front", "observation.images.left", "observation.images.wrist")
ROWS, GOP, PER_SHARD = 300, 30, 64
OFFSETS = np.arange(0, 33, 4)  # 9 frames over a 33-frame span


def _row(e: int, offset: int = 512) -> dict:
    """Episode ``e``'s index row, its members laid from ``offset`` in the shard (``_next``: past them)."""
    members = []
    for name, size in [("json", 300), ("parquet", 40_000)] + [(c.split(".")[-1] + ".mp4", 900_000) for c in CAMERAS]:
        members.append({"name": f"bench-e{e:06d}.{name}", "offset": offset, "size": size, "sha256": "0" * 64})
        offset += 512 + (size + 511) // 512 * 512
    cams = [
        {
            "name": c,
            "member": 2 + i,
            "codec": "h264",
            "width": 224,
            "height": 224,
            "pix_fmt": "yuv420p",
            "time_base_num": 1,
            "time_base_den": 15360,
            "num_frames": ROWS,
            "pts_start": 0,
            "pts_step": 512,
            "pts": [],
            "duration": [],
            "keyframes": list(range(0, ROWS, GOP)),
            "first_frame": 0,
            "row_to_frame": [],
            "transform": "copy",
            "kind": "rgb",
            "stream_index": 0,
            "rotation": 0,
            **NO_PACKETS,  # no packet tables: members are fetched whole
        }
        for i, c in enumerate(CAMERAS)
    ]
    return {
        "key": f"bench-e{e:06d}",
        "source": "bench",
        "episode_index": e,
        "num_rows": ROWS,
        "fps": 30.0,
        "task": "pick",
        "tasks": ["pick"],
        "robot": "bench",
        "members": members,
        "cameras": cams,
        "window_start": 0,
        "window_stop": ROWS,
        "segment_starts": [],
        "_next": offset,
    }


def write_indexes(folder: str, episodes: int) -> list[str]:
    paths = []
    for shard, start in enumerate(range(0, episodes, PER_SHARD)):
        rows, offset = [], 512
        for e in range(start, min(start + PER_SHARD, episodes)):
            rows.append(_row(e, offset))
            offset = rows[-1].pop("_next")
        path = os.path.join(folder, index_name("bench", shard))
        with open(path, "wb") as f:
            f.write(encode_index(rows, {"shard": f"bench-{shard:06d}.tar"}))
        paths.append(path)
    return paths


def lookup(index: WindowIndex, cum_windows: np.ndarray, window: int) -> list:
    """Global window id -> per camera (shard, byte offset, size, frames, keyframe)."""
    episode = int(np.searchsorted(cum_windows, window, side="right"))
    anchor = window - (int(cum_windows[episode - 1]) if episode else 0)
    rows = anchor + OFFSETS
    return [index.lookup(episode, rows, c) for c in range(len(CAMERAS))]


def build(folder: str, episodes: int) -> dict:
    """Write ``episodes`` synthetic episodes as shard indexes plus the dataset index; time loading."""
    paths = write_indexes(folder, episodes)
    with open(os.path.join(folder, MANIFEST_NAME), "w") as f:
        json.dump({"shards": [{"index": os.path.basename(p)} for p in paths]}, f)
    with open(os.path.join(folder, DATASET_INDEX_NAME), "wb") as f:
        f.write(dataset_index_bytes([Path(p).read_bytes() for p in paths]))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    arrow_s, parquet_s = [], []
    for _ in range(3):
        t = time.perf_counter()
        index = WindowIndex.load_dataset(folder)
        arrow_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        WindowIndex.load(paths)
        parquet_s.append(time.perf_counter() - t)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    hash_s, check_s = _checks(folder, index, [t.num_rows for t in map(pq.read_metadata, paths)])
    span = int(OFFSETS[-1]) + 1
    cum = np.cumsum(np.maximum(index.window_stop - index.window_start - span + 1, 0))
    return {
        "episodes": episodes,
        "index_files": len(paths),
        "load_dataset_index_s": min(arrow_s),
        "load_shard_indexes_s": min(parquet_s),
        "peak_rss_growth_mb": max(rss1 - rss0, 0) / 1024,
        "sha256_index_s": hash_s,
        "check_index_s": check_s,
        "_index": index,
        "_cum": cum,
    }


def _checks(folder: str, index: WindowIndex, per_shard: list[int]) -> tuple[float, float]:
    """Seconds the reader spends on its load-time checks (best of 3): hashing ``index.arrow``
    through its memory map (cold pages are read from disk once, then shared), and reading it with
    the schema and bound checks of every value (``WindowIndex.read_dataset_index`` and
    ``epishard.format.validate.check_index``, as ``opening.load_dataset_index`` does after the hash)."""
    shards = [ShardEntry(f"s{i}.tar", f"s{i}.index.parquet", n, 0, 0, 1 << 40, "", "") for i, n in enumerate(per_shard)]
    path = os.path.join(folder, DATASET_INDEX_NAME)
    hash_s, check_s = [], []
    for _ in range(3):
        t = time.perf_counter()
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            hashlib.sha256(memoryview(mm)).hexdigest()
        hash_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        check_index(
            WindowIndex.read_dataset_index(pa.memory_map(path), path, None), shards, dict.fromkeys(CAMERAS), path
        )
        check_s.append(time.perf_counter() - t)
    return min(hash_s), min(check_s)


def time_lookups(entry: dict, ids: np.ndarray) -> float:
    index, cum = entry["_index"], entry["_cum"]
    t = time.perf_counter()
    for w in ids:
        lookup(index, cum, int(w))
    return (time.perf_counter() - t) / len(ids)


SMOKE = {"episodes": [1, 200], "lookups": 200, "rounds": 1}


def options(p) -> None:
    p.add_argument("--episodes", type=int, nargs="+", default=[1, 27_500])
    p.add_argument("--lookups", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5, help="alternating lookup rounds per size")


def run(args) -> int:
    with tempfile.TemporaryDirectory() as folder:
        results = []
        for n in args.episodes:
            os.makedirs(os.path.join(folder, str(n)))
            results.append(build(os.path.join(folder, str(n)), n))
        # Lookup rounds alternate between sizes (A B A B ...) so machine noise hits both alike.
        rng = np.random.default_rng(0)
        ids = [rng.integers(0, int(r["_cum"][-1]), size=args.lookups) for r in results]
        rounds: list[list[float]] = [[] for _ in results]
        for _, i in measure.alternate(range(len(results)), args.rounds):
            rounds[i].append(time_lookups(results[i], ids[i]))
    base = measure.median(rounds[0])
    rows = []
    for r, times in zip(results, rounds, strict=False):
        r = {k: v for k, v in r.items() if not k.startswith("_")}
        r["lookup_us"] = measure.median(times) * 1e6
        r["lookup_ratio_vs_first"] = measure.median(times) / base
        measure.emit(r)
        rows.append(
            (
                r["episodes"],
                r["index_files"],
                f"{r['load_dataset_index_s'] * 1e3:.1f} ms",
                f"{r['load_shard_indexes_s'] * 1e3:.1f} ms",
                f"{r['lookup_us']:.2f} us",
                f"{r['lookup_ratio_vs_first']:.2f}",
                f"+{r['peak_rss_growth_mb']:.0f} MB",
                f"{r['sha256_index_s'] * 1e3:.1f} ms",
                f"{r['check_index_s'] * 1e3:.1f} ms",
            )
        )
    head = ("episodes", "shard indexes", "load index.arrow (mmap)", "load all shard Parquet indexes")
    head += ("lookup per sample", "ratio to first", "peak RSS", "sha256 index.arrow", "schema and bound checks")
    measure.table(head, rows)
    return 0
