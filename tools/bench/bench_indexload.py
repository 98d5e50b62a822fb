"""Cost of opening a dataset at up to 1,000,000 episodes: ``DatasetSource`` before and after, in one run.

Opening a dataset is what every rank (and each process that builds its own ``WindowDataset``)
does before its first batch: read the manifest, hash ``index.arrow`` against the manifest's
sha256, read it (Arrow IPC), check its schema and every value (``check_index``), build the
``WindowIndex``.

The dataset: ``DATASET``'s ``index.arrow`` rows tiled to ``--tile`` episodes (each shard's rows
repeated, in shard order), with a manifest whose episode counts and index sha256 match, so
``DatasetSource`` accepts it as it is; the shard tars are symlinked (opening reads none). Two
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


def tile(dataset: str, episodes: int, out: str, batch_rows: int | None) -> str:
    """``out``: ``dataset`` with its index tiled to at least ``episodes`` episodes (made once).

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
    reps = -(-episodes // index.num_episodes)
    rows = [np.tile(np.flatnonzero(index.shard == s), reps) for s in range(len(manifest["shards"]))]
    with open(os.path.join(out, "index.arrow"), "wb") as f:
        f.write(index.take(np.concatenate(rows)).dataset_bytes(batch_rows))
    with open(os.path.join(out, "index.arrow"), "rb") as f:
        manifest["index"]["sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
    for entry in manifest["shards"]:
        entry["episodes"] *= reps
        for key in ("shard", "index"):
            os.symlink(os.path.abspath(os.path.join(dataset, entry[key])), os.path.join(out, entry[key]))
    for camera in manifest["cameras"].values():
        camera["episodes"] *= reps
    manifest["totals"]["episodes"] *= reps
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
