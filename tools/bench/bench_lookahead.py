"""Benchmark: look-ahead decoding against today's reader, side by side in one run.

Sides, each in its own Python process (so peak RSS is the side's own), one consumer iterating
in-process (``num_workers=0``, torch at 1 thread, as a DataLoader worker), one epoch (or
``--samples``; ``--per-episode`` windows per episode), the demo's window (9 frames over a 33-frame
span, 16-step action chunk, 224x224 unless ``--size 0``):

- ``before``: the reader at ``--baseline`` (a git commit; default: the commit before look-ahead),
  extracted with ``git archive``: it loads whole episodes in read order and holds each until its
  last window is yielded.
- ``before-shuffled``: the same reader with each consumer's yield order replaced by a random
  permutation of its plan (what the planner's full plan-level shuffle gives): it holds every
  episode it has started.
- ``lookahead``: this checkout, the plan's order (default ``Lookahead``).
- ``lookahead-shuffled-H<h>-C<MiB>``: this checkout, the random permutation, horizon ``h`` and
  frame cache ``C`` MiB (``--horizons``, ``--budgets``).

Reported per side: samples/s (wall), time to the first sample from ``iter()``, frames decoded per
frame returned (``WindowIndex.decoded_frames``: the decoder's work), decode calls per sample,
peak RSS of the process (MB; includes ~400 MB of interpreter and torch) and, for look-ahead, the
frame cache's peak bytes and hit rate. Rounds alternate the sides (A B C A B C ...); medians.

    PYTHONPATH=$PWD python tools/bench/bench_lookahead.py out/demo --per-episode 40 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from epishard.stream.options import ReadOptions

REPO = Path(__file__).resolve().parents[2]
BASELINE = "b804156"  # main before look-ahead decoding


def child(cfg: dict) -> dict:
    """Run one side in this process; returns its figures."""
    import dataclasses

    import numpy as np
    import torch

    torch.set_num_threads(1)
    from epishard.stream import PostProcess, WindowDataset, WindowSpec, segment
    from epishard.stream.source import DatasetSource
    from epishard.stream.telemetry import summarize

    source = DatasetSource(cfg["root"])
    cams = cfg["cameras"] or source.cameras
    spec = WindowSpec(
        cameras={c: segment(0, 32, 9) for c in cams},
        action_horizon=16,
        boundary="pad",
        per_episode_count=cfg["per_episode"],
    )
    kw = {}
    if cfg.get("horizon"):
        from epishard.stream.lookahead import Lookahead

        kw["read"] = ReadOptions(
            telemetry=True, lookahead=Lookahead(horizon=cfg["horizon"], frame_cache_bytes=cfg["budget"] << 20)
        )
    size = cfg["size"]
    post = PostProcess(size=(size, size)) if size else PostProcess()
    ds = WindowDataset(source, spec, seed=0, postprocess=post, **{"read": ReadOptions(telemetry=True), **kw})
    if cfg["shuffled"]:
        plan = ds.plan

        def permuted(epoch, world, history=()):
            p = plan(epoch, world, history)
            order = np.random.default_rng([7, epoch, world.consumer]).permutation(len(p))
            return dataclasses.replace(p, episode=p.episode[order], anchor=p.anchor[order])

        ds.plan = permuted
    t0 = time.perf_counter()
    it = iter(ds)
    last = next(it)
    first = time.perf_counter() - t0
    n = 1
    for last in it:  # noqa: B007 - the last sample's telemetry is the total
        n += 1
        if n >= cfg["samples"]:
            break
    wall = time.perf_counter() - t0
    t = summarize([last["__telemetry__"]])
    return {
        "samples": n,
        "samples_per_s": n / wall,
        "first_s": first,
        "frames_decoded_per_returned": t["frames_decoded_per_returned"],
        "decode_calls_per_sample": t["decode_calls"] / n,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cache_peak_mb": t.get("frame_cache_bytes_peak", float("nan")) / 2**20,
        "hit_rate": t.get("frame_cache_hit_rate", float("nan")),
    }


def baseline_tree(ref: str) -> str:
    folder = Path(tempfile.gettempdir()) / f"epishard_baseline_{ref}"
    if not (folder / "stream").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return str(folder)


def run_side(tree: str, cfg: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench" / "bench_lookahead.py"), "--child", json.dumps(cfg)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"side {cfg}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", nargs="?", help="a converted dataset")
    p.add_argument("--samples", type=int, default=10**9, help="samples per side (default: one epoch)")
    p.add_argument("--per-episode", type=int, default=None, help="windows per episode per epoch (default: all)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--size", type=int, default=224, help="frames resized to SIZE x SIZE (0: stored size)")
    p.add_argument("--cameras", nargs="*", default=None, help="window cameras (default: all)")
    p.add_argument("--horizons", type=int, nargs="+", default=[64, 2048])
    p.add_argument("--budgets", type=int, nargs="+", default=[768, 64], help="frame cache MiB")
    p.add_argument("--baseline", default=BASELINE, help="git commit of today's reader")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    base = {"root": args.root, "samples": args.samples, "size": args.size, "cameras": args.cameras}
    base["per_episode"] = args.per_episode
    old = baseline_tree(args.baseline)
    sides = {
        "before": (old, dict(base, shuffled=False)),
        "before-shuffled": (old, dict(base, shuffled=True)),
        "lookahead": (str(REPO), dict(base, shuffled=False)),
    }
    for h in args.horizons:
        for c in args.budgets:
            sides[f"lookahead-shuffled-H{h}-C{c}"] = (str(REPO), dict(base, shuffled=True, horizon=h, budget=c))
    results: dict[str, list[dict]] = {name: [] for name in sides}
    for r in range(args.rounds):
        for name, (tree, cfg) in sides.items():
            results[name].append(run_side(tree, cfg))
            print(f"round {r} {name}: {json.dumps(results[name][-1])}", flush=True)
    load = os.getloadavg()[0]
    what = f"{args.samples} samples" if args.samples < 10**9 else "one epoch"
    print(f"\n{args.root}: {what} per side, {args.rounds} rounds, medians; load average {load:.1f}")
    cols = ["samples_per_s", "first_s", "frames_decoded_per_returned", "decode_calls_per_sample", "rss_mb"]
    cols += ["cache_peak_mb", "hit_rate"]
    print("| side | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, rows in results.items():
        meds = [statistics.median(row[c] for row in rows) for c in cols]
        print(f"| {name} | " + " | ".join(f"{m:.2f}" for m in meds) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
