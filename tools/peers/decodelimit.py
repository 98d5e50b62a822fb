"""The decode limit: the samples/s a machine allows if decoding each frame a sample needs once, at
FFmpeg's own single-threaded decode-to-RGB speed, were the only work.

Per camera, ``ffmpeg -threads 1 -i VIDEO -f rawvideo -pix_fmt rgb24 -y /dev/null`` decodes the
dataset's video files; its rate is frames per CPU second of the ffmpeg process (user + system:
less distorted by other load than wall time). A sample needs ``d_c`` distinct frames of camera
``c`` (the window's offsets clamped at the episode's edges, averaged over every anchor). Then

    limit = cores / sum_c (d_c / rate_c)            samples/s

(issue 16: "decode-to-RGB frames/s of ffmpeg -threads 1 x cores / distinct frames a sample needs").
A loader can beat it only by decoding a frame once for several samples (reuse), never by
decoding faster.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from pathlib import Path

from .config import SPAN, STEP


def ffmpeg_rate(video: Path) -> dict:
    """Decode ``video`` to RGB with one thread; frames, CPU and wall seconds, frames per CPU second."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(
        [
            *("ffmpeg", "-nostdin", "-v", "error", "-threads", "1", "-i", str(video), "-f", "rawvideo"),
            *("-pix_fmt", "rgb24", "-progress", "pipe:1", "-nostats", "-y", "/dev/null"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    frames = int([line for line in p.stdout.splitlines() if line.startswith("frame=")][-1].split("=")[1])
    return {"video": str(video), "frames": frames, "cpu_s": cpu, "wall_s": wall, "frames_per_cpu_s": frames / cpu}


def distinct_frames(lengths: list[int]) -> float:
    """Mean distinct rows a window reads per camera over every anchor of episodes of these lengths
    (offsets 0, STEP, ..., SPAN - 1 from the anchor, clamped to the episode: LeRobot's padding)."""
    import numpy as np

    offsets = np.arange(0, SPAN, STEP)
    total = count = 0
    for n in lengths:
        rows = np.minimum(np.arange(n)[:, None] + offsets[None, :], n - 1)
        total += int((np.diff(rows, axis=1) != 0).sum() + n)  # rows are sorted: distinct = 1 + changes
        count += n
    return total / max(count, 1)


def decode_limit(lerobot_root: str | Path, cores: int | None = None) -> dict:
    """The decode limit of a LeRobot v3.0 dataset (its own video files; a tiled copy shares them).

    Returns a JSON-ready dict: ``samples_per_s`` (the limit), ``cores``, and per camera the
    distinct frames a sample needs and the ffmpeg rate (frames per CPU second over its files).
    """
    import pyarrow.parquet as pq

    root = Path(lerobot_root)
    info = json.loads((root / "meta" / "info.json").read_text())
    cams = [k for k, f in info["features"].items() if f.get("dtype") == "video"]
    lengths = pq.read_table(
        [str(p) for p in sorted((root / "meta" / "episodes").rglob("*.parquet"))], columns=["length"]
    ).column("length")
    d = distinct_frames([int(n) for n in lengths.to_pylist()])
    cores = cores or os.cpu_count() or 1
    per_camera, cost = {}, 0.0
    for cam in cams:
        runs = [ffmpeg_rate(v) for v in sorted((root / "videos" / cam).rglob("*.mp4"))]
        rate = sum(r["frames"] for r in runs) / sum(r["cpu_s"] for r in runs)
        per_camera[cam] = {"distinct_frames_per_sample": d, "ffmpeg_frames_per_cpu_s": rate, "files": runs}
        cost += d / rate
    return {"samples_per_s": cores / cost, "cores": cores, "cameras": per_camera}
