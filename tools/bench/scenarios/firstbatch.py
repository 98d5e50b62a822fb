"""Time to the first batch at up to 1,000,000 episodes, end to end, with its parts.

The dataset: ``DATASET`` (a converted dataset, e.g. ``make demo``'s ``out/demo``) tiled to
``--episodes`` episodes (``tile``: each shard's tar laid 32 times into one block file, the blocks
listed as many shards as needed, a manifest whose counts and index sha256 match). So the index really
lists that many episodes and the real reader opens it,
plans over all of them, fetches the first batch's members from the tars (byte ranges of real
members) and decodes its frames.

Each figure is a fresh child process (``--child``) that times, from nothing:

- ``index``: ``DatasetSource(url)`` (manifest, sha256 of ``index.arrow`` or its node stamp, Arrow
  read, checks, ``WindowIndex``); the first process of a node pays the hash (``cold``), others not;
- ``dataset``: ``WindowDataset(...)`` (the planner's episode table) and ``WindowLoader(...)``;
- ``first batch``: ``next(iter(loader))``: ``set_epoch`` (the shared plan cuts), worker start, and
  in the worker (its ``__telemetry__``): ``plan`` (its windows), ``schedule`` (the look-ahead's
  first step: the demand and next uses of the windows it looks at), ``read`` + ``decode`` (the
  first batch's fetch and decode); ``other`` is the rest (worker fork and imports, collate, etc.).

The window is ``make demo``'s stream line (9 frames over 33 rows, 16-step action chunk, 224x224,
batch 8), every anchor of every episode, the default shuffle (``shuffle="auto"``), seed 0;
rank 0 of ``--world-size`` (every anchor of 1M episodes of ~419 rows is ~387M windows: one process
cannot list an epoch of it, a rank of 64 lists ~6M).

``--ref REV``: the same beside the code of git revision ``REV`` (``git archive``), interleaved.

    python tools/bench/run.py firstbatch out/demo --episodes 1000000 --world-size 64 --workers 0 2
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import shutil
import tempfile
import time

import measure
import numpy as np

from epishard.stream.options import Ranks, ReadOptions


def child(dataset: str, world_size: int, workers: int, per_episode_count: int | None) -> dict:
    """Time one first batch in this process (see the module docstring)."""
    t0 = time.perf_counter()
    import torch

    from epishard.stream import Lookahead, PostProcess, WindowDataset, WindowLoader, WindowSpec, segment
    from epishard.stream.source import DatasetSource
    from epishard.stream.telemetry import summarize

    t1, cpu = time.perf_counter(), time.process_time()
    source = DatasetSource(dataset)
    t2 = time.perf_counter()
    spec = WindowSpec(
        cameras={c: segment(0, 32, 9) for c in source.cameras},
        action_horizon=16,
        per_episode_count=per_episode_count,
    )
    post = PostProcess(size=(224, 224), dtype=torch.uint8)
    ds = WindowDataset(
        source,
        spec,
        seed=0,
        postprocess=post,
        read=ReadOptions(telemetry=True, lookahead=Lookahead()),
        ranks=Ranks(rank=0, world_size=world_size),
    )
    loader = WindowLoader(ds, batch_size=8, num_workers=workers)
    t3 = time.perf_counter()
    batch = next(iter(loader))
    t4 = time.perf_counter()
    tel = summarize([batch["__telemetry__"].numpy()])
    windows = loader.dataset.windows_per_consumer(0, world_size, max(workers, 1))
    parts = {k: tel[k] for k in ("plan_s", "schedule_s", "read_s", "decode_s")}
    return {
        "imports_s": t1 - t0,
        "index_s": t2 - t1,
        "dataset_s": t3 - t2,
        "first_batch_s": t4 - t3,
        **parts,
        "other_s": t4 - t3 - sum(parts.values()),
        "total_s": t4 - t1,
        "cpu_s": time.process_time() - cpu,  # this process's (the workers' own are not in it)
        "episodes": source.index.num_episodes,
        "windows_per_worker": windows,
        "samples": int(batch["episode_index"].numel()),
    }


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


def _run(tree: str, tiled: str, world: int, workers: int, count: str, cache: str) -> dict:
    """One child process running ``tree``'s code (this checkout, or a ``--ref``'s)."""
    env = measure.env_with(tree, EPISHARD_CACHE=cache)
    got = measure.run_child("firstbatch", [tiled, str(world), str(workers), count], tree=tree, env=env)
    if got is None:
        raise RuntimeError(f"the first batch of {tiled} failed in {tree}")
    return got


SMOKE = {"episodes": 40, "world_size": [1], "workers": [0]}


def options(p) -> None:
    p.add_argument("dataset", nargs="?", help="a converted dataset (e.g. out/demo), tiled to --episodes")
    p.add_argument("--episodes", type=int, default=1_000_000)
    p.add_argument("--world-size", type=int, nargs="+", default=[64], help="rank 0 of this many ranks")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="DataLoader workers (0: none)")
    p.add_argument("--per-episode-count", type=int, default=None, help="windows per episode (default: every anchor)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--ref", nargs="*", default=[], help="git commits to run beside this tree (git archive), interleaved"
    )
    p.add_argument("--keep", default=None, help="folder for the tiled dataset, kept (default: a temporary one)")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)


def run(args) -> int:
    if args.child:
        dataset, world, workers, count = args.child
        return measure.child_result(child(dataset, int(world), int(workers), None if count == "all" else int(count)))
    if args.dataset is None:
        if not args.smoke:
            raise measure.Missing("give a converted dataset (e.g. make demo's out/demo)")
        args.dataset = str(measure.smoke_dataset())
    out = args.keep or tempfile.mkdtemp(prefix="bench_firstbatch_")
    if not args.keep:
        atexit.register(shutil.rmtree, out, True)
    t = time.perf_counter()
    tiled = tile(args.dataset, args.episodes, os.path.join(out, f"tiled{args.episodes}-1batch"), None)
    measure.say(f"tiled dataset {tiled} ({time.perf_counter() - t:.1f} s)")
    count = "all" if args.per_episode_count is None else str(args.per_episode_count)
    trees = {"this": str(measure.REPO), **{ref: str(measure.git_tree(ref)) for ref in args.ref}}
    print(
        f"{'tree':>8} {'round':>5} {'world':>5} {'workers':>7} {'cache':>5} {'windows/worker':>14} | {'total s':>7} = "
        f"{'index':>6} + {'dataset':>7} + {'first batch':>11} ({'plan':>5} {'sched':>5} {'read':>5} {'decode':>6} "
        f"{'other':>5}) | {'cpu s':>5} | load"
    )
    caches: dict[str, str] = {}  # per tree, the verification cache of its last cold run (its stamp)
    for r in range(args.rounds):
        for world in args.world_size:
            for workers in args.workers:
                for cold in (True, False):
                    for name, tree in trees.items():
                        if cold:
                            caches[name] = tempfile.mkdtemp(dir=out)
                        cache = caches[name]
                        load = os.getloadavg()[0]
                        g = _run(tree, tiled, world, workers, count, cache)
                        measure.emit({"tree": name, "round": r, "world": world, "workers": workers, "cold": cold, **g})
                        print(
                            f"{name[:8]:>8} {r:>5} {world:>5} {workers:>7} {'cold' if cold else 'warm':>5} "
                            f"{g['windows_per_worker']:>14} | {g['total_s']:>7.2f} = {g['index_s']:>6.2f} + "
                            f"{g['dataset_s']:>7.2f} + {g['first_batch_s']:>11.2f} ({g['plan_s']:>5.2f} "
                            f"{g['schedule_s']:>5.2f} {g['read_s']:>5.2f} {g['decode_s']:>6.2f} "
                            f"{g['other_s']:>5.2f}) | {g.get('cpu_s', float('nan')):>5.2f} | {load:.1f}",
                            flush=True,
                        )
    return 0
