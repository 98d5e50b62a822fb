"""Cost of opening a dataset at up to 1,000,000 episodes: ``DatasetSource`` before and after, in one run.

Opening a dataset is what every rank (and each process that builds its own ``WindowDataset``)
does before its first batch: read the manifest, hash ``index.arrow`` against the manifest's
sha256, read it (Arrow IPC), check its schema and every value (``check_index``), build the
``WindowIndex``.

The dataset: ``DATASET`` tiled to ``--tile`` episodes (``tile``: each shard's tar laid 32 times
into one block file, the blocks listed as many shards as needed, symlinked), with a manifest whose
counts and index sha256 match, so ``DatasetSource`` accepts it as it is (opening reads no tar). Two
copies: ``index.arrow`` in 64K-row record batches (Arrow's default: how the writer wrote it
before, and how every existing dataset has it) and in one record batch (how it writes it now).

Each figure is a fresh child process (``--child``) opening a copy with the code of one tree:
``before`` (``git archive`` of ``--before``) or ``after`` (this checkout); wall and CPU (user +
system) seconds of ``DatasetSource(...)`` alone. Per round, with an empty verification cache
(``EPISHARD_CACHE``) each time a row says ``cold``:

- ``before``: the old code, 64K-row file;
- ``after old file``: the new code, the same 64K-row file, cold;
- ``after cold``: the new code, the one-batch file, cold (the first rank of a node);
- ``after warm``: the same again, the stamp of ``after cold`` present (every other rank of the node).

Rounds interleave before and after, so load changes hit both.

Usage:
    python tools/bench/bench_indexload.py DATASET [--tile 100000] [--rounds 2] [--before REV] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tile(dataset: str, episodes: int, out: str, batch_rows: int | None, block: int = 32) -> str:
    """``out``: ``dataset`` tiled to at least ``episodes`` episodes, a dataset the reader accepts (made once).

    Each source shard becomes a *block*: its tar's bytes written ``block`` times into one file,
    copy ``k``'s index rows pointing ``k`` tar sizes further in, so a block's members follow one
    another as a real shard's do (``block`` times the source's episodes per shard). The blocks are
    listed as often as needed, each listing its own shard entry (a symlink to the block), so the
    index checks hold: no two members of a shard share a byte. ``index.arrow`` is written straight
    to disk; the manifest's counts, sizes and index sha256 match.

    ``batch_rows``: rows per record batch of ``index.arrow`` (None: one batch, as the writer writes
    it now; 65536: Arrow's default, as it was written before).
    """
    from epishard.format.index import WindowIndex

    if os.path.exists(os.path.join(out, "manifest.json")):
        return out
    os.makedirs(out, exist_ok=True)
    index = WindowIndex.load_dataset(dataset)
    with open(os.path.join(dataset, "manifest.json")) as f:
        manifest = json.load(f)
    sources = manifest["shards"]
    reps = -(-episodes // index.num_episodes)
    block = max(1, min(block, reps))
    copies = -(-reps // block)
    digests = []
    for s, entry in enumerate(sources):
        with open(os.path.join(dataset, entry["shard"]), "rb") as f:
            data = f.read()
        digest = hashlib.sha256()
        with open(os.path.join(out, f"block-{s:06d}.tar"), "wb") as f:
            for _ in range(block):
                f.write(data)
                digest.update(data)
        digests.append(digest.hexdigest())
    # Rows in shard order: copy c of the blocks, source shard s, copy k of s's tar in the block.
    rows, shard, shift, shards = [], [], [], []
    for c in range(copies):
        for s, entry in enumerate(sources):
            own = np.flatnonzero(index.shard == s)
            rows.append(np.tile(own, block))
            shard.append(np.full(own.size * block, c * len(sources) + s))
            shift.append(np.repeat(np.arange(block, dtype=np.int64) * entry["size"], own.size))
            name = f"shard-{c * len(sources) + s:06d}"
            os.symlink(os.path.join(os.path.abspath(out), f"block-{s:06d}.tar"), os.path.join(out, name + ".tar"))
            os.symlink(
                os.path.abspath(os.path.join(dataset, entry["index"])), os.path.join(out, name + ".index.parquet")
            )
            counts = {k: entry[k] * block for k in ("episodes", "frames", "rows")}
            shards.append({**entry, **counts, "shard": name + ".tar", "index": name + ".index.parquet"})
            shards[-1].update(size=entry["size"] * block, sha256=digests[s])
    tiled = index.take(np.concatenate(rows)).relocated(np.concatenate(shard), np.concatenate(shift))
    del index, rows, shard, shift
    path = os.path.join(out, "index.arrow")
    tiled.write_dataset_index(path, batch_rows)
    del tiled
    with open(path, "rb") as f:
        manifest["index"]["sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
    manifest["shards"] = shards
    for camera in manifest["cameras"].values():
        camera["episodes"] *= copies * block
    for key in ("episodes", "frames", "rows"):
        manifest["totals"][key] *= copies * block
    manifest["totals"]["bytes"] = sum(entry["size"] for entry in shards)
    manifest["totals"]["shards"] = len(shards)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return out


def child(dataset: str) -> dict:
    """Open ``dataset`` once with the code on ``sys.path``: wall and CPU seconds, episodes."""
    from epishard.stream.source import DatasetSource

    wall, cpu = time.perf_counter(), time.process_time()
    source = DatasetSource(dataset)
    return {
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu,
        "episodes": source.index.num_episodes,
    }


def run(tree: str, dataset: str, cache: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree, "EPISHARD_CACHE": cache}
    cmd = [sys.executable, os.path.join(ROOT, "tools", "bench", "bench_indexload.py"), "--child", dataset]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=tree).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", nargs="?")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tile", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before", default="main", help="git revision of the 'before' code")
    ap.add_argument("--out", default=None, help="folder for the tiled datasets, kept (default: a temporary one)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    work = tempfile.mkdtemp(prefix="bench_indexload_")
    try:
        t = time.perf_counter()
        out = args.out or work
        old = tile(args.dataset, args.tile, os.path.join(out, f"tiled{args.tile}-64k"), 65536)
        new = tile(args.dataset, args.tile, os.path.join(out, f"tiled{args.tile}-1batch"), None)
        size = os.path.getsize(os.path.join(new, "index.arrow"))
        print(f"tiled datasets {old}, {new}: index.arrow {size / 1e6:.0f} MB (in {time.perf_counter() - t:.1f} s)")
        before = os.path.join(work, "before")
        os.makedirs(before)
        archive = subprocess.run(["git", "-C", ROOT, "archive", args.before], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        for r in range(args.rounds):
            runs = (
                ("before", before, old, True),
                ("after old file", ROOT, old, True),
                ("after cold", ROOT, new, True),
                ("after warm", ROOT, new, False),
            )
            for name, tree, dataset, cold in runs:
                if cold:
                    cache = tempfile.mkdtemp(dir=work)
                load = os.getloadavg()[0]
                got = run(tree, dataset, cache)
                print(
                    f"round {r} {name:14} {got['episodes']:>8} episodes  wall {got['wall']:7.3f} s  "
                    f"cpu {got['cpu']:7.3f} s  (load average {load:.1f})",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
