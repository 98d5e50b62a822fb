"""lerobot-lancedb's loaders on the benchmark window, run inside a Lance peer venv (``runs.run_lance``).

Adapted from ``../shared/peers/lance_windows.py`` (same window, DataLoader and memory sampling as
``lerobot_harness.py``); prints one JSON line with the fields ``runs.run_lance`` reads (``episode_ids``
of every timed batch for the diversity figures), or, with ``--check N``, a comparison of items with
LeRobot 0.6.1's ``LeRobotDataset`` on the folder it was converted from.

Layouts (``--layout``):
  lancedb  lerobot-lancedb 0.3.x ``LanceDBDataset`` (the newest release): three Lance tables, each
           source mp4 stored verbatim in a blob v2 column, ranged reads, torchcodec decode
           (``seek_mode="approximate"``), a per-worker LRU of decoders over sparse byte buffers.
           Not a LeRobotDataset subclass. DataLoader context: ``lance_mp_context()`` (forkserver),
           as its README says.
  jpeg     lerobot-lancedb 0.2.x ``LeRobotLanceDataset`` (the old plugin, < 0.3): one Lance table, one
           JPEG per frame and camera (lossy, default q95 4:2:0), a LeRobotDataset subclass; it forces
           the ``spawn`` start method itself.
  video022 lerobot-lancedb 0.2.x ``LeRobotLanceVideoDataset`` (the old plugin's mp4 blob layout).

Run inside the venv that has the release (0.3.x: /tmp/peer/lance/venv, 0.2.x: /tmp/peer/lance/venv022; both copies
of the LeRobot 0.6.1 peer venv), offline:

    . /tmp/peer/lance/env.sh && python lance_harness.py OUT/unitree_x50.lance031 --layout lancedb --uint8
    . /tmp/peer/lance/env022.sh && python lance_harness.py OUT/unitree_x50.jpeg022 --layout jpeg --uint8
    ... --check 6 --source WORK/unitree_g1_bottle_av1_v30_x50   # items vs LeRobot 0.6.1, no timing

Window (as the benchmark's): per camera W=9 frames at offsets 0,4,...,32 (as offset/fps seconds), the
action chunk of 16 steps; DataLoader(batch 8, shuffle=True, 2 workers, persistent); ``--warmup`` batches
(default 4) untimed, then at least ``--seconds`` (12) and ``--min-batches`` (5) timed. The clock starts
before ``iter(loader)`` (workers start inside the warm-up), as the LeRobot harness does.
Prints one JSON line: samples_per_s, rss_peak_mb (sum over this process and all descendants: the
forkserver / spawn helpers and DataLoader workers), pss_peak_mb, worker_rss_peak_mb, time to first batch,
distinct episodes per batch, dtype, shapes. Memory is sampled by tools/bench/peers/memory.py (imported
by path from the epishard checkout; nothing else of epishard is imported).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

assert os.environ.get("HF_HUB_OFFLINE") == "1", "source /tmp/peer/lance/env.sh (or env022.sh) first"

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from timedloop import timed_batches  # this folder's: the LeRobot harness's timed region and memory sampling


def window(meta, args):
    cams = meta.video_keys + meta.image_keys
    action = args.action_key or ("action" if "action" in meta.features else "actions")
    delta = {c: [i * args.stride / meta.fps for i in range(args.window)] for c in cams}
    delta[action] = [k / meta.fps for k in range(args.action_horizon)]
    return cams, action, delta


def build(args, delta=None):
    """(dataset, meta, mp_context, library version) for ``args.layout``; ``delta`` None: resolve from meta."""
    import lerobot_lancedb

    version = getattr(lerobot_lancedb, "__version__", "?")
    try:
        import importlib.metadata as md

        version = md.version("lerobot-lancedb")
    except Exception:
        pass
    opts = json.loads(args.storage_options) if args.storage_options else None
    if args.layout == "lancedb":
        from lerobot_lancedb import LanceDBDataset, lance_mp_context
        from lerobot_lancedb.reader import lance_metadata

        meta = lance_metadata(None, args.root, storage_options=opts)
        _cams, _action, d = window(meta, args)
        kw = {"storage_options": opts} if opts else {}
        if args.decoder_cache is not None:
            kw["video_decoder_cache_size"] = args.decoder_cache
        ds = LanceDBDataset(root=args.root, delta_timestamps=delta or d, return_uint8=args.uint8, **kw)
        ctx = lance_mp_context() if args.mp_context == "default" else args.mp_context
        return ds, ds.meta, ctx, version
    if args.layout in ("jpeg", "video022"):
        from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

        meta_root = Path(args.meta_root or args.root)
        meta = LeRobotDatasetMetadata(f"local/{meta_root.name}", root=meta_root)
        _cams, _action, d = window(meta, args)
        kw = {"connect_kwargs": {"storage_options": opts}} if opts else {}
        loc = {"uri": args.root, "meta_root": meta_root} if "://" in args.root else {"root": args.root}
        if args.table_name:
            loc["table_name"] = args.table_name
        if args.layout == "jpeg":
            from lerobot_lancedb import LeRobotLanceDataset as Cls

            kw["decode_device"] = "cpu"
        else:
            from lerobot_lancedb import LeRobotLanceVideoDataset as Cls
        ds = Cls(delta_timestamps=delta or d, return_uint8=args.uint8, **loc, **kw)
        import multiprocessing as mp

        ctx = mp.get_start_method(allow_none=True) if args.mp_context == "default" else args.mp_context
        return ds, ds.meta, ctx, version
    raise SystemExit(f"unknown layout {args.layout}")


def check(args) -> dict:
    """Compare ``--check N`` items (seeded random indices plus the first and last frame) with LeRobot
    0.6.1's LeRobotDataset on ``--source`` (the v3.0 folder it was converted from), same window and dtype."""
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds, meta, _, version = build(args)
    cams, _action, delta = window(meta, args)
    src = Path(args.source).resolve()
    ref = LeRobotDataset(f"local/{src.name}", root=src, delta_timestamps=delta, return_uint8=args.uint8)
    rng = np.random.default_rng(args.seed)
    n = len(ref)
    assert len(ds) == n, (len(ds), n)
    idx = sorted({0, n - 1, *rng.integers(0, n, args.check).tolist()})
    report: dict = {"layout": args.layout, "lerobot_lancedb": version, "indices": idx, "keys": {}}
    for i in idx:
        a, b = ds[i], ref[i]
        for k in sorted(set(a) | set(b)):
            r = report["keys"].setdefault(k, {"items": 0, "equal": 0, "notes": set()})
            r["items"] += 1
            if k not in a or k not in b:
                r["notes"].add("only in " + ("lance" if k in a else "lerobot"))
                continue
            x, y = a[k], b[k]
            if torch.is_tensor(x) and torch.is_tensor(y):
                if x.dtype != y.dtype:
                    r["notes"].add(f"dtype {x.dtype} vs {y.dtype}")
                if x.shape != y.shape:
                    r["notes"].add(f"shape {list(x.shape)} vs {list(y.shape)}")
                    continue
                if torch.equal(x.to(y.dtype), y) and x.dtype == y.dtype:
                    r["equal"] += 1
                elif torch.equal(x.double(), y.double()):
                    r["equal_values"] = r.get("equal_values", 0) + 1
                else:
                    diff = (x.double() - y.double()).abs()
                    r["max_abs_diff"] = max(r.get("max_abs_diff", 0.0), float(diff.max()))
                    r["mean_abs_diff_sum"] = r.get("mean_abs_diff_sum", 0.0) + float(diff.mean())
                    if k in cams:
                        scale = 255.0 if y.dtype == torch.uint8 else 1.0
                        mse = float(((x.double() - y.double()) / scale).pow(2).mean())
                        psnr = 10 * np.log10(1.0 / mse) if mse > 0 else float("inf")
                        r["min_psnr_db"] = min(r.get("min_psnr_db", 1e9), psnr)
            else:
                if x == y:
                    r["equal"] += 1
                else:
                    r["notes"].add(f"differs: {x!r} vs {y!r}"[:200])
    for r in report["keys"].values():
        r["notes"] = sorted(r["notes"])
        if "mean_abs_diff_sum" in r:
            r["mean_abs_diff"] = r.pop("mean_abs_diff_sum") / r["items"]
    report["frames_bit_exact"] = all(report["keys"][c]["equal"] == report["keys"][c]["items"] for c in cams)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="converted Lance folder (or s3:// URI)")
    ap.add_argument("--layout", choices=("lancedb", "jpeg", "video022"), default="lancedb")
    ap.add_argument("--meta-root", help="jpeg/video022 with an s3:// root: local folder holding meta/")
    ap.add_argument("--table-name", help="jpeg/video022: the Lance table (default: auto-detected)")
    ap.add_argument("--storage-options", help="JSON dict for lancedb.connect (s3 endpoint, keys, ...)")
    ap.add_argument("--label", default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--min-batches", type=int, default=5)
    ap.add_argument("--window", type=int, default=9)
    ap.add_argument("--stride", type=int, default=4)
    ap.add_argument("--action-horizon", type=int, default=16)
    ap.add_argument("--action-key", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--uint8", action="store_true", help="return_uint8=True")
    ap.add_argument("--mp-context", default="default", help="default: what the library recommends")
    ap.add_argument("--decoder-cache", type=int, default=None, help="lancedb: video_decoder_cache_size")
    ap.add_argument("--check", type=int, default=0, help="compare N items with LeRobot 0.6.1, then exit")
    ap.add_argument("--source", help="--check: the v3.0 folder the Lance copy was converted from")
    args = ap.parse_args()

    if args.check:
        print(json.dumps(check(args)))
        return

    t0 = time.perf_counter()
    ds, meta, ctx, version = build(args)
    build_s = time.perf_counter() - t0
    cams, action, _ = window(meta, args)
    run = timed_batches(
        ds,
        args,
        action,
        multiprocessing_context=ctx if args.workers > 0 else None,
    )
    b, mem, episodes, samples, seconds = run.last, run.mem, run.episodes, run.samples, run.seconds
    first, warmup_s, epochs = run.first_s, run.warmup_s, run.epochs
    shapes = {k: [*b[k].shape, str(b[k].dtype).replace("torch.", "")] for k in [*cams, action]}
    for c in cams:
        assert b[c].shape[1] == args.window, shapes
    distinct = sum(len(set(e)) for e in episodes) / max(len(episodes), 1)
    print(
        json.dumps(
            {
                "peer": f"lerobot-lancedb-{version}",
                "layout": args.layout,
                "label": args.label or f"lance {args.layout} {'u8' if args.uint8 else 'f32'}",
                "root": args.root,
                "samples": samples,
                "batches": len(episodes),
                "seconds": round(seconds, 3),
                "samples_per_s": round(samples / seconds, 2),
                "frames_per_s": round(samples * args.window * len(cams) / seconds, 1),
                "rss_peak_mb": round(mem.rss_peak / 1024, 1),
                "pss_peak_mb": round(mem.pss_peak / 1024, 1),
                "worker_rss_peak_mb": round(mem.worker_rss_peak / 1024, 1),
                "time_to_first_batch_s": round(first, 3),
                "warmup_s": round(warmup_s, 3),
                "build_s": round(build_s, 3),
                "epochs_crossed": epochs,
                "distinct_episodes_per_batch": round(distinct, 3),
                "episode_ids": episodes,
                "num_frames": len(ds),
                "dtype": shapes[cams[0]][-1],
                "shapes": shapes,
                "uint8": args.uint8,
                "mp_context": ctx,
                "workers": args.workers,
                "batch_size": args.batch_size,
                "warmup": args.warmup,
                "loadavg_1m": os.getloadavg()[0],
                "torch": torch.__version__,
                "host": platform.node(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
