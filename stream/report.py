"""``epishard stream``: run the loader over a dataset and report throughput and where time goes."""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from torch.utils.data import default_collate

from .dataset import WindowDataset, WindowLoader
from .spec import WindowSpec, segment
from .telemetry import summarize
from .transform import PostProcess


def _frame_size(text: str | None) -> tuple[int, int] | None:
    """``--size HEIGHTxWIDTH`` (e.g. ``224x224``) -> ``(height, width)``; None keeps the stored size."""
    if not text:
        return None
    parts = text.lower().split("x")
    if len(parts) != 2:
        raise ValueError(f"--size {text!r}: expected HEIGHTxWIDTH, e.g. 224x224")
    return int(parts[0]), int(parts[1])


def _timed_collate(samples: list[dict]) -> dict:
    t = time.perf_counter()
    batch = default_collate(samples)
    batch["__collate_s__"] = torch.tensor(time.perf_counter() - t, dtype=torch.float64)
    return batch


def add_per_episode_arguments(p: argparse.ArgumentParser) -> None:
    """Windows-per-episode options of the ``stream`` command.

    ``--per-episode-count N`` / ``--per-episode-fraction F`` (windows per episode per epoch), and
    the deprecated ``--per-episode F`` (a count above 1, else a fraction).
    """
    group = p.add_mutually_exclusive_group()
    group.add_argument("--per-episode-count", type=int, metavar="N", help="windows per episode per epoch (at most all)")
    group.add_argument(
        "--per-episode-fraction", type=float, metavar="F", help="this share of each episode's windows, in (0, 1]"
    )
    group.add_argument("--per-episode", type=float, help=argparse.SUPPRESS)  # deprecated


def per_episode_options(args: argparse.Namespace) -> dict:
    """``WindowSpec`` keywords from ``add_per_episode_arguments``' options."""
    old = args.per_episode
    if old is not None:
        kind = "count" if old > 1 else "fraction"
        print(
            f"epishard: --per-episode is deprecated (1 meant all windows, 2 two): use --per-episode-{kind}",
            file=sys.stderr,
        )
        return {"per_episode_count": int(old)} if old > 1 else {"per_episode_fraction": old}
    return {"per_episode_count": args.per_episode_count, "per_episode_fraction": args.per_episode_fraction}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``epishard stream`` options."""
    p.add_argument("dataset", metavar="DATASET", help="converted dataset folder or URL")
    p.add_argument("--cameras", help="comma-separated camera names (default: all)")
    p.add_argument("--frames", type=int, default=9, help="frames per camera per window (default 9)")
    p.add_argument("--span", type=int, default=33, help="rows the frames spread over (default 33)")
    p.add_argument("--state-history", type=int, default=1, help="state rows, ending at the anchor (default 1)")
    p.add_argument("--action-horizon", type=int, default=16)
    p.add_argument("--boundary", choices=["inside", "pad"], default="inside")
    p.add_argument("--stride", type=int, default=1)
    add_per_episode_arguments(p)
    p.add_argument("--size", help="resize frames to HxW, e.g. 224x224")
    p.add_argument("--float", action="store_true", help="float32 frames in [0, 1] (LeRobot's output)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--batches", type=int, default=50, help="batches to run (default 50; 0: one epoch)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")


def build(args) -> WindowLoader:
    """The loader ``epishard stream`` runs: spec, post-processing and workers from the options."""
    from .source import DatasetSource

    source = DatasetSource(args.dataset, getattr(args, "storage_options", None))
    cams = args.cameras.split(",") if args.cameras else source.cameras
    offsets = segment(0, args.span - 1, args.frames) if args.frames > 1 else (0,)
    spec = WindowSpec(
        cameras={c: offsets for c in cams},
        state_offsets=tuple(range(1 - args.state_history, 1)),
        action_horizon=args.action_horizon,
        boundary=args.boundary,
        stride=args.stride,
        **per_episode_options(args),
    )
    post = PostProcess(size=_frame_size(args.size), dtype=torch.float32 if args.float else torch.uint8)
    ds = WindowDataset(source, spec, seed=args.seed, postprocess=post, telemetry=True)
    return WindowLoader(ds, batch_size=args.batch_size, num_workers=args.workers, collate_fn=_timed_collate)


def run(args) -> dict:
    """Iterate ``args.batches`` batches (or one epoch); return the report."""
    t0 = time.perf_counter()
    loader = build(args)
    setup_s = time.perf_counter() - t0
    tel, distinct, collate_s, samples, first = [], [], 0.0, 0, None
    start = time.perf_counter()
    for i, batch in enumerate(loader):
        if first is None:
            first = time.perf_counter() - start
        tel.append(batch["__telemetry__"].numpy())
        distinct.append(len(set(zip(batch["dataset"].tolist(), batch["episode_index"].tolist(), strict=False))))
        collate_s += float(batch["__collate_s__"])
        samples += len(batch["episode_index"])
        if args.batches and i + 1 >= args.batches:
            break
    wall = time.perf_counter() - start
    t = summarize(tel)
    stages = {k: t[k] for k in ("plan_s", "read_s", "decode_s", "postprocess_s", "assemble_s")}
    stages["collate_s"] = collate_s
    return {
        "dataset": args.dataset,
        "batches": len(tel),
        "samples": samples,
        "wall_s": wall,
        "setup_s": setup_s,
        "time_to_first_batch_s": first,
        "samples_per_s": samples / wall if wall else 0.0,
        "frames_per_s": t["frames_returned"] / wall if wall else 0.0,
        "worker_stage_s": stages,
        "frames_decoded_per_returned": t["frames_decoded_per_returned"],
        "decoder_opens_per_sample": t["decoder_opens_per_sample"],
        "bytes_read_per_sample": t["bytes_read_per_sample"],
        "distinct_episodes_per_batch": float(np.mean(distinct)) if distinct else 0.0,
        "windows_per_rank_per_epoch": len(loader.dataset),
        "episodes_without_windows": t["episodes_without_windows"],
        "workers": args.workers,
    }


def render(r: dict) -> str:
    """A ``run`` report as a few lines of text."""
    stages = r["worker_stage_s"]
    total = sum(stages.values()) or 1.0
    lines = [
        f"{r['dataset']}: {r['samples']} samples in {r['batches']} batches, {r['wall_s']:.2f} s "
        f"({r['workers']} workers; {r['windows_per_rank_per_epoch']} windows per epoch)",
        f"  {r['samples_per_s']:.1f} samples/s, {r['frames_per_s']:.0f} frames/s, first batch after "
        f"{r['time_to_first_batch_s']:.2f} s (setup {r['setup_s']:.2f} s)",
        "  worker time per stage: "
        + ", ".join(f"{k[:-2]} {v:.2f}s ({100 * v / total:.0f}%)" for k, v in stages.items()),
        f"  frames decoded per frame returned {r['frames_decoded_per_returned']:.2f}, decoder opens per sample "
        f"{r['decoder_opens_per_sample']:.3f}, bytes read per sample {r['bytes_read_per_sample'] / 1e3:.1f} kB",
        f"  shuffle: {r['distinct_episodes_per_batch']:.2f} distinct episodes per batch; "
        f"{int(r['episodes_without_windows'])} episodes shorter than the window",
    ]
    return "\n".join(lines)


def main(args) -> int:
    """Run ``epishard stream``; print the report (``--json``: one JSON line); 0 on success.

    Raises:
        ValueError: no window of the dataset fits the request.
    """
    report = run(args)
    if not report["batches"]:
        raise ValueError(f"{args.dataset}: no window fits the request (episodes shorter than --span/--action-horizon?)")
    print(json.dumps(report) if args.json else render(report))
    return 0
