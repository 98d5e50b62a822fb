"""The decode limit: the samples/s a machine allows if decoding each frame a sample needs once, at
FFmpeg's own single-threaded decode-to-RGB speed, were the only work.

Per camera, ``ffmpeg -threads 1 -i VIDEO -f rawvideo -pix_fmt rgb24 -y /dev/null`` decodes the
dataset's video files; its rate is frames per CPU second of the ffmpeg process (user + system:
less distorted by other load than wall time). Three limits come from that rate, all averaged over
every anchor of every episode (the window's offsets 0, 4, ..., 32 clamped at the episode's edges):

- **distinct-frames limit** (``samples_per_s``): a sample needs ``d_c`` distinct frames of camera ``c``;

      limit = cores / sum_c (d_c / rate_c)            samples/s

  ("decode-to-RGB frames/s of ffmpeg -threads 1 x cores / distinct frames a sample
  needs"). It ignores the GOP: a frame after a keyframe costs the frames before it.
- **GOP-aware limit** (``samples_per_s_gop``): a sample needs ``g_c`` decoded frames, counting the
  lead-in: for each window frame, the frames from the keyframe at or before it up to it, decoding
  on from the previous window frame when no keyframe lies between (``WindowIndex.decoded_frames``'
  count, on the video's real keyframe table, read by demuxing with PyAV; frames in display order).
  ``limit = cores / sum_c (g_c / rate_c)``: the issue's "``ffmpeg -threads 1`` decode-to-RGB frames
  per CPU second x cores / the frames a sample must decode, counting the GOP lead-in". Every frame
  costs the file's mean.
- **cost-weighted GOP-aware limit** (``samples_per_s_gop_weighted``): the same decoded frames, each
  weighted by its measured cost: decode-only CPU time per packet kind (keyframe / other; PyAV
  ``CodecContext``, one thread) plus the RGB24 conversion, scaled so the file's mean frame costs
  ``1 / rate_c``. On the AV1 data's GOP 2 a keyframe packet (sequence header + frame OBU, ~19 kB)
  costs ~10x the other packets (one ~31-byte frame OBU: an inter frame with next to no residual),
  and the window's offsets are even: its frames are all keyframes, or all follow one. Weighting
  lowers that limit.

A loader can beat the GOP-aware limit only by decoding a frame once for several samples (reuse) or
by decoding less than the lead-in (never with these codecs), never by decoding faster.
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


def keyframe_table(video: Path) -> dict:
    """The first video stream's frames in display (pts) order, demuxed with PyAV (nothing decoded):
    ``keyframe`` (bool per frame), ``size`` (packet bytes per frame), ``frames``, ``codec``, size."""
    import av
    import numpy as np

    with av.open(str(video)) as c:
        s = c.streams.video[0]
        rows = [(p.pts, p.is_keyframe, p.size) for p in c.demux(s) if p.pts is not None and p.size]
        codec, width, height = s.codec_context.name, s.codec_context.width, s.codec_context.height
    order = np.argsort(np.array([r[0] for r in rows], dtype=np.int64), kind="stable")
    key = np.array([r[1] for r in rows], dtype=bool)[order]
    size = np.array([r[2] for r in rows], dtype=np.int64)[order]
    return {"frames": int(key.size), "keyframe": key, "size": size, "codec": codec, "width": width, "height": height}


def decoded_cost(first: int, n: int, keyframe, cum_weight) -> float:
    """Summed cost over every anchor of an ``n``-row episode starting at video frame ``first``:
    per window the frames a sequential decoder decodes (from the keyframe at or before the first
    wanted frame; on from the previous wanted frame, or from a keyframe when one lies between: the
    count ``WindowIndex.decoded_frames`` gives), each frame ``f`` costing ``w[f]``
    (``cum_weight = r_[0, cumsum(w)]``; ``w = 1``: the frame count)."""
    import numpy as np

    frames_in_video = len(keyframe)
    keys = np.flatnonzero(keyframe)
    rows = np.minimum(np.arange(n)[:, None] + np.arange(0, SPAN, STEP)[None, :], n - 1)
    f = np.minimum(first + rows, frames_in_video - 1)  # [n, 9], ascending per row
    pos = np.searchsorted(keys, f, side="right") - 1
    kb = np.where(pos >= 0, keys[np.maximum(pos, 0)], f)  # no keyframe before: counts from itself
    start = np.concatenate([kb[:, :1], np.maximum(kb[:, 1:], f[:, :-1] + 1)], axis=1)  # duplicates: empty range
    stop = np.maximum(f + 1, start)
    return float((cum_weight[stop] - cum_weight[start]).sum())


def packet_costs(video: Path, keyframe) -> dict:
    """Decode-only CPU time per packet kind and RGB24 conversion time per frame, one thread.

    Every packet of the first video stream goes through a PyAV ``CodecContext`` (the stream's
    extradata, ``thread_count=1``), timed with the thread's CPU clock; each output frame is then
    converted to RGB24 by a reused ``VideoReformatter`` (one swscale thread), timed apart. A packet's time is charged to
    the frame with its pts (``keyframe``: display order, as ``keyframe_table``). Returns ms per
    keyframe packet, per other packet, per RGB conversion, and the per-frame decode ms (display order).
    """
    import av
    import numpy as np
    from av.video.reformatter import VideoReformatter

    clock = time.thread_time_ns
    with av.open(str(video)) as c:
        s = c.streams.video[0]
        cc = av.CodecContext.create(s.codec_context.name, "r")
        if s.codec_context.extradata:
            cc.extradata = s.codec_context.extradata
        cc.thread_count, cc.thread_type = 1, "NONE"
        cc.open()
        fmt = VideoReformatter()
        pts, dec_ns, rgb_ns = [], [], []
        for p in c.demux(s):
            if p.pts is None or not p.size:
                continue
            t = clock()
            out = cc.decode(p)
            dec_ns.append(clock() - t)
            pts.append(p.pts)
            for fr in out:
                t = clock()
                fmt.reformat(fr, format="rgb24", threads=1)
                rgb_ns.append(clock() - t)
        for fr in cc.decode(None):  # drain
            t = clock()
            fmt.reformat(fr, format="rgb24", threads=1)
            rgb_ns.append(clock() - t)
    order = np.argsort(np.array(pts, dtype=np.int64), kind="stable")
    dec_ms = np.array(dec_ns, dtype=np.float64)[order] / 1e6
    key = np.asarray(keyframe, dtype=bool)
    if key.size != dec_ms.size:
        raise RuntimeError(f"{video}: {dec_ms.size} packets decoded, {key.size} frames in the keyframe table")
    return {
        "keyframe_decode_ms": float(dec_ms[key].mean()),
        "other_decode_ms": float(dec_ms[~key].mean()) if (~key).any() else None,
        "rgb24_ms": float(np.median(rgb_ns) / 1e6) if rgb_ns else 0.0,
        "frame_decode_ms": dec_ms,
    }


def _episodes(root: Path, info: dict, cam: str) -> list[tuple[Path, int, int]]:
    """(video file, first frame in it, rows) of each episode of camera ``cam`` (v3.0 meta)."""
    import pyarrow.parquet as pq

    files = [str(p) for p in sorted((root / "meta" / "episodes").rglob("*.parquet"))]
    cols = [f"videos/{cam}/chunk_index", f"videos/{cam}/file_index", f"videos/{cam}/from_timestamp", "length"]
    table = pq.read_table(files, columns=cols).to_pylist()
    template = info["video_path"]
    fps = float(info["fps"])
    out = []
    for r in table:
        path = root / template.format(video_key=cam, chunk_index=r[cols[0]], file_index=r[cols[1]])
        out.append((path, round(r[cols[2]] * fps), int(r["length"])))
    return out


def gop_frames(root: Path, info: dict, cam: str, weighted: bool = True) -> dict:
    """Per sample of camera ``cam``, over every anchor of every episode: frames decoded counting the
    GOP lead-in (``gop_frames_per_sample``), and, with ``weighted``, the same frames weighted by
    their measured cost in units of the mean frame of their file (``gop_weighted_frames_per_sample``;
    the decode part alone and RGB for the window's distinct frames only:
    ``gop_weighted_rgb_returned_frames_per_sample``) with the per-file measurements."""
    import numpy as np

    eps = _episodes(root, info, cam)
    tables, costs = {}, {}
    plain = heavy = heavy_rgb_ret = 0.0
    anchors = 0
    for path in sorted({p for p, _, _ in eps}):
        kt = keyframe_table(path)
        tables[path] = kt
        if weighted:
            pc = packet_costs(path, kt["keyframe"])
            d = np.where(kt["keyframe"], pc["keyframe_decode_ms"], pc["other_decode_ms"] or 0.0)
            mean = float((d + pc["rgb24_ms"]).mean())
            costs[path] = (pc, d, mean)
    for path, first, n in eps:
        kt = tables[path]
        ones = np.arange(kt["frames"] + 1, dtype=np.float64)
        plain += decoded_cost(first, n, kt["keyframe"], ones)
        anchors += n
        if weighted:
            pc, d, mean = costs[path]
            heavy += decoded_cost(first, n, kt["keyframe"], np.r_[0.0, np.cumsum((d + pc["rgb24_ms"]) / mean)])
            dec = decoded_cost(first, n, kt["keyframe"], np.r_[0.0, np.cumsum(d / mean)])
            heavy_rgb_ret += dec + distinct_frames([n]) * n * pc["rgb24_ms"] / mean
    out: dict = {"gop_frames_per_sample": plain / max(anchors, 1)}
    out["keyframes"] = {
        str(p): {
            "codec": t["codec"],
            "size": f"{t['width']}x{t['height']}",
            "frames": t["frames"],
            "keyframes": int(t["keyframe"].sum()),
            "keyframe_packet_bytes": float(t["size"][t["keyframe"]].mean()),
            "other_packet_bytes": float(np.median(t["size"][~t["keyframe"]])) if (~t["keyframe"]).any() else None,
        }
        for p, t in tables.items()
    }
    if weighted:
        out["gop_weighted_frames_per_sample"] = heavy / max(anchors, 1)
        out["gop_weighted_rgb_returned_frames_per_sample"] = heavy_rgb_ret / max(anchors, 1)
        for p, (pc, _, mean) in costs.items():
            out["keyframes"][str(p)].update(
                keyframe_decode_ms=pc["keyframe_decode_ms"],
                other_decode_ms=pc["other_decode_ms"],
                rgb24_ms=pc["rgb24_ms"],
                mean_frame_ms=mean,
            )
    return out


def decode_limit(lerobot_root: str | Path, cores: int | None = None, weighted: bool = True) -> dict:
    """The decode limits of a LeRobot v3.0 dataset (its own video files; a tiled copy shares them).

    Returns a JSON-ready dict: ``samples_per_s`` (the distinct-frames limit), ``samples_per_s_gop``
    (the GOP-aware limit: frames decoded counting the lead-in), ``samples_per_s_gop_weighted`` (the
    same, each frame weighted by its measured cost; with ``weighted``), ``cores``, and per camera
    the frames a sample needs and the ffmpeg rate (frames per CPU second over its files).
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
    per_camera = {}
    cost = {"": 0.0, "_gop": 0.0, "_gop_weighted": 0.0, "_gop_weighted_rgb_returned": 0.0}
    for cam in cams:
        runs = [ffmpeg_rate(v) for v in sorted((root / "videos" / cam).rglob("*.mp4"))]
        rate = sum(r["frames"] for r in runs) / sum(r["cpu_s"] for r in runs)
        g = gop_frames(root, info, cam, weighted)
        per_camera[cam] = {"distinct_frames_per_sample": d, "ffmpeg_frames_per_cpu_s": rate, "files": runs, **g}
        cost[""] += d / rate
        cost["_gop"] += g["gop_frames_per_sample"] / rate
        if weighted:
            cost["_gop_weighted"] += g["gop_weighted_frames_per_sample"] / rate
            cost["_gop_weighted_rgb_returned"] += g["gop_weighted_rgb_returned_frames_per_sample"] / rate
    out = {f"samples_per_s{k}": (cores / c if c else None) for k, c in cost.items()}
    if not weighted:
        out["samples_per_s_gop_weighted"] = out["samples_per_s_gop_weighted_rgb_returned"] = None
    return {**out, "cores": cores, "cameras": per_camera}
