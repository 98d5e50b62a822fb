"""The parent's side: datasets found and converted, the LeRobot peer, one run per (dataset, system, round)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .config import ENTRY, FRAMES, HORIZON, REPO, SPAN, STEP, System, log
from .pipelines import clamped
from .zygote import Zygote


@dataclass
class Dataset:
    name: str
    main: str  # LeRobot folder (v3.0 when found in the shared data)
    version: str
    original: str | None = None  # its v2.x original, when there is one
    shards: dict | None = None  # "main"/"v2" -> converted epishard folder


def lerobot_version(folder: Path) -> str:
    with open(folder / "meta" / "info.json") as f:
        return json.load(f).get("codebase_version", "?")


def has_videos(folder: Path) -> bool:
    return (folder / "videos").is_dir() and any((folder / "videos").rglob("*.mp4"))


def find_datasets(args) -> list[Dataset]:
    if args.source:
        out = []
        for s in args.source:
            p = Path(s).resolve()
            out.append(Dataset(p.name, str(p), lerobot_version(p)))
        return out
    data = Path(args.data)
    if not data.is_dir():
        print(f"no shared data at {data}: nothing to measure (give --source FOLDER or set EPISHARD_SHARED_DATA)")
        return []
    out = []
    for p in sorted(data.iterdir()):
        if not (p / "meta" / "info.json").exists() or not lerobot_version(p).startswith("v3"):
            continue
        if args.datasets and p.name not in args.datasets:
            continue
        if not has_videos(p):
            print(f"skip {p.name}: a LeRobot v3.0 dataset without video files (nothing to decode)")
            continue
        orig = data / p.name.removesuffix("_v30")
        out.append(
            Dataset(
                p.name,
                str(p),
                lerobot_version(p),
                str(orig) if orig != p and (orig / "meta" / "info.json").exists() else None,
            )
        )
    return out


def convert_all(datasets: list[Dataset], work: Path) -> None:
    from epishard.shardwriter import ConvertOptions, convert

    for d in datasets:
        d.shards = {}
        for key, src in (("main", d.main), ("v2", d.original)):
            if src is None:
                continue
            out = work / f"{Path(src).name}"
            t = time.perf_counter()
            convert([src], str(out), ConvertOptions(progress=False))
            d.shards[key] = str(out)
            log(f"converted {Path(src).name} ({lerobot_version(Path(src))}) in {time.perf_counter() - t:.1f} s")


def peer_status(args) -> str | None:
    """None when the LeRobot peer can run, else the reason."""
    harness = Path(args.peers_dir) / "lerobot_windows.py"
    if not harness.exists():
        return f"no harness at {harness} (it lives in ../shared/peers)"
    if not Path(args.peer_venv, "bin", "python").exists() or not Path(args.peer_env).exists():
        return (
            f"peer venv {args.peer_venv} not found: "
            f"build it with `bash {Path(args.peers_dir) / 'setup_lerobot_venv.sh'}` "
            f"(~75 s, offline CPU venv) or run this command with --setup-peers"
        )
    return None


def setup_peers(args) -> None:
    script = Path(args.peers_dir) / "setup_lerobot_venv.sh"
    print(f"building the LeRobot peer venv: bash {script} {args.peer_venv}", flush=True)
    subprocess.run(["bash", str(script), args.peer_venv], check=True)


def run_env(args) -> dict:
    """The environment of every run (LeRobot's too): this one plus ``--env`` settings."""
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in args.env)
    return env


def run_lerobot(args, d: Dataset, seed: int) -> dict:
    harness = Path(args.peers_dir) / "lerobot_windows.py"
    cmd = (
        f"source {args.peer_env} && exec {args.peer_venv}/bin/python {harness} {d.main} --workers {args.workers} "
        f"--batches {args.batches} --warmup {args.warmup} --batch-size {args.batch_size} --window {FRAMES} "
        f"--stride {STEP} --action-horizon {HORIZON} --seed {seed}"
    )
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=args.timeout, env=run_env(args))
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode or not lines:
        raise RuntimeError(f"LeRobot harness failed (exit {p.returncode}): {p.stderr[-2000:]}")
    r = json.loads(lines[-1])
    fps_s = r["samples_per_s"]
    return {
        "system": "lerobot",
        "label": "lerobot",
        "kind": "lerobot",
        "dtype": "float32",
        "reuse": "",
        "root": d.main,
        "samples": r["batches"] * r["batch_size"],
        "batches": r["batches"],
        "seconds": r["seconds"],
        "samples_per_s": fps_s,
        "frames_per_s": r["frames_per_s"],
        "frames_decoded_per_returned": None,
        "time_to_first_batch_s": None,
        "warmup_s": r["warmup_s"],
        "build_s": r["build_s"],
        "timed": f"{r['batches']} batches",
        "rss_peak_mb": r["rss_peak_mb"],
        "pss_peak_mb": r["pss_peak_mb"],
        "bytes_read_per_sample": None,
        "worker_stage_s": None,
        "distinct_episodes_per_batch": None,
        "shapes": r.get("shapes"),
        "peer": r.get("peer"),
        "decoder": r.get("decoder"),
    }


def run_system(args, d: Dataset, system: System, seed: int, zygote: Zygote | None) -> dict:
    t = time.perf_counter()
    cfg = {
        "system": system.id,
        "root": d.shards[system.source],
        "batch_size": args.batch_size,
        "workers": args.workers,
        "batches": args.batches,
        "warmup": args.warmup,
        "seed": seed,
    }
    if system.kind == "lerobot":
        rec = run_lerobot(args, d, seed)
    elif zygote is not None:
        rec = zygote.run(cfg, args.timeout)
    else:
        p = subprocess.run(
            [sys.executable, str(ENTRY), "--child", json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=args.timeout,
            cwd=str(REPO),
            env=run_env(args),
        )
        lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
        if p.returncode or not lines:
            raise RuntimeError(f"{system.id} on {d.name} failed (exit {p.returncode}): {p.stderr[-3000:]}")
        rec = json.loads(lines[-1])
    rec.update(
        dataset=d.name,
        source_format=d.version if system.source == "main" else lerobot_version(Path(d.original)),
        seed=seed,
        loadavg_1m=os.getloadavg()[0],
        wall_s=time.perf_counter() - t,
    )
    return rec


def expected_decoded_per_returned(shards: str) -> float:
    """LeRobot decodes, per sample and camera, from the keyframe before each requested frame run
    (torchcodec batch API): the same count ``WindowIndex.decoded_frames`` gives, averaged over
    every anchor (LeRobot samples anchors uniformly)."""
    import numpy as np

    from epishard.shardwriter import WindowIndex

    ix = WindowIndex.load_dataset(shards)
    decoded = returned = 0
    for e in range(ix.num_episodes):
        n = int(ix.num_rows[e])
        for c in range(len(ix.camera_names(e))):
            s = ix.stream(e, c)
            for a in range(n):
                rows, _ = clamped(a + np.arange(0, SPAN, STEP), n)
                decoded += int(ix.decoded_frames(s, np.unique(ix.frames(s, rows))))
                returned += FRAMES
    return decoded / max(returned, 1)
