"""Benchmark: what a 1 kHz stream at its own rate adds to a video window (issue 38, goal 4).

One generated dataset, read two ways over the same planned windows (same seed and shuffle),
alternating side by side ``--rounds`` times in this process (a ``WindowLoader`` with no DataLoader
workers, torch on one thread, as in a worker), batches of ``--batch``:

A  the video window alone: 33 consecutive frames of one camera (``segment(0, 32, 33)``), state at
   the anchor, a 16-step action chunk;
B  the same plus a 0.5 s history of a 1 kHz force-torque stream (``span(-0.5, 0.0)``: about 501
   samples of 6 float32 values, each window's own, with timestamps and mask).

Reported per side: samples/s per wall second and per CPU second (user+sys of this process),
frames decoded per sample, bytes read per sample after the warm-up (the dataset's members are
then in the encoded cache, or fetched ahead: small) and over the whole pass (every byte fetched,
per sample returned: exact for a pass of a whole epoch, ``--batches`` covering it); B's cost over
A's (CPU seconds per sample, the median of the rounds' ratios); the mean bytes per episode of the
video member and of the stream's pieces; and, in a pass of its own (``--io-windows`` windows per
episode at ``shuffle="global"``, nothing kept encoded: every load fetches, as over a dataset far
larger than the cache), the bytes fetched per window without and with the stream. Target: B <=
1.10x A, with the same frames decoded.

The dataset: ``--episodes`` episodes of ``--seconds`` s at 30 fps, one frame-numbered H.264
camera (``tests/videogen.make_video``, ``--size`` pixels square, keyframe every 30 frames, with
B-frames), state and action rows, and a ``obs.wrench`` stream at 1 kHz (float32 ``[6]``) with
its own clock (starting 0.3 ms after the first row, jittered by up to 50 us). Made once under
/tmp and reused.

    python tools/bench/run.py multirate                       # ~1 min on 2 cores after the dataset is made
    python tools/bench/run.py multirate --rounds 5 --batches 40 --json
    python tools/bench/run.py multirate --shuffle global --encoded-cache-mb 0   # every load fetches: bytes per sample
    python tools/bench/run.py multirate --reuse-buffers 2   # batches in pre-faulted buffers: no page faults per batch
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import measure

FPS, FRAMES, HORIZON, RATE, HISTORY = 30, 33, 16, 1000.0, 0.5
_LAYOUT = "v3-pieces-16k"  # in the cached dataset's name: a layout change makes a new one


def _dataset(episodes: int, seconds: float, size: int) -> Path:
    """The generated dataset (made once under /tmp, kept)."""
    root = Path(tempfile.gettempdir()) / "epishard_bench_multirate" / f"{_LAYOUT}_e{episodes}_s{seconds:g}_{size}"
    if (root / "manifest.json").exists():
        return root
    import numpy as np
    from videogen import make_episode_table, make_video

    from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, Stream, convert

    rng = np.random.default_rng(0)
    rows = int(seconds * FPS)
    out = []
    for e in range(episodes):
        n = int(seconds * RATE)
        times = 0.0003 + np.arange(n) / RATE + rng.uniform(-5e-5, 5e-5, n)
        force = rng.standard_normal((n, 6)).astype(np.float32)
        video = make_video(None, rows, fps=FPS, start_number=1000 * e, height=size, width=size, gop=30)
        out.append(
            Episode(
                source="multirate",
                episode_index=e,
                table=make_episode_table(rows, fps=FPS),
                videos={"observation.images.front": CameraVideo(video)},
                fps=FPS,
                streams={"obs.wrench": Stream(np.sort(times), force, rate=RATE)},
            )
        )
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    convert([Source(name="multirate", episodes=out, fps=FPS)], str(tmp), ConvertOptions(progress=False))
    tmp.rename(root)
    return root


def _member_bytes(root: str) -> tuple[float, float]:
    """Mean bytes per episode of the camera's video member and of the stream's member (what a load fetches)."""
    import numpy as np

    from epishard.shardwriter import WindowIndex

    index = WindowIndex.load_dataset(root)
    video = index.member_size[index.stream_member].mean()
    pieces = [
        m for e in range(index.num_episodes) for s in index.signals(e).values() for m in index.signal_pieces(s)[0]
    ]
    stream = index.member_size[np.asarray(pieces, dtype=np.int64)].sum() / max(index.num_episodes, 1)
    return float(video), float(stream)


def _io_pass(root: str, with_stream: bool, windows_per_episode: int, seed: int) -> float:
    """Bytes fetched per window over a whole small epoch at ``shuffle="global"``, nothing kept encoded.

    Every episode gives ``windows_per_episode`` windows, each at its own random place; with
    ``Lookahead(encoded_bytes=0)`` every load fetches (as over a dataset far larger than the cache).
    """
    from epishard.stream import Lookahead, ReadOptions, WindowDataset, WindowLoader, WindowSpec, segment, span
    from epishard.stream.telemetry import summarize

    spec = WindowSpec(
        cameras={"observation.images.front": segment(0, FRAMES - 1, FRAMES)},
        action_horizon=HORIZON,
        boundary="pad",
        per_episode_count=windows_per_episode,
        streams={"obs.wrench": span(-HISTORY, 0.0)} if with_stream else {},
    )
    read = ReadOptions(telemetry=True, lookahead=Lookahead(encoded_bytes=0))
    ds = WindowDataset(root, spec, seed=seed, shuffle="global", read=read)
    last = None
    for b in WindowLoader(ds, batch_size=1, num_workers=0):
        last = b["__telemetry__"]
    end = summarize([last])
    return end["bytes_read"] / end["samples"]


def _pass(
    root: str,
    with_stream: bool,
    batches: int,
    warmup: int,
    batch: int,
    seed: int,
    shuffle,
    encoded: int | None,
    reuse: int = 0,
) -> dict:
    """One timed pass of one side: rates after ``warmup`` batches, frames decoded and bytes read per sample."""
    import torch

    from epishard.stream import Lookahead, ReadOptions, WindowDataset, WindowLoader, WindowSpec, segment, span
    from epishard.stream.telemetry import summarize

    torch.set_num_threads(1)
    spec = WindowSpec(
        cameras={"observation.images.front": segment(0, FRAMES - 1, FRAMES)},
        action_horizon=HORIZON,
        boundary="pad",
        streams={"obs.wrench": span(-HISTORY, 0.0)} if with_stream else {},
    )
    lookahead = Lookahead() if encoded is None else Lookahead(encoded_bytes=encoded)
    ds = WindowDataset(root, spec, seed=seed, shuffle=shuffle, read=ReadOptions(telemetry=True, lookahead=lookahead))
    first = last = None
    t0 = c0 = 0.0
    for i, b in enumerate(WindowLoader(ds, batch_size=batch, num_workers=0, reuse_buffers=reuse)):
        if with_stream and b["obs.wrench"].shape[2] != 6:
            raise AssertionError(f"obs.wrench batch of shape {tuple(b['obs.wrench'].shape)}")
        if i == warmup:
            t0, c0, first = time.perf_counter(), measure.cpu_s(), summarize([b["__telemetry__"]])
        last = b["__telemetry__"]
        if i + 1 >= warmup + batches:
            break
    wall, cpu = time.perf_counter() - t0, measure.cpu_s() - c0
    end = summarize([last])
    n = end["samples"] - first["samples"]
    return {
        "side": "video + 0.5 s at 1 kHz" if with_stream else "video alone",
        "samples": n,
        "samples_per_s": n / wall,
        "samples_per_cpu_s": n / cpu,
        "cpu_ms_per_sample": 1e3 * cpu / n,
        "frames_decoded_per_sample": (end["frames_decoded"] - first["frames_decoded"]) / n,
        "bytes_read_per_sample": (end["bytes_read"] - first["bytes_read"]) / n,
        # every byte fetched over the whole pass (warm-up and fetches ahead included) per sample
        # returned: exact when the pass reads a whole epoch
        "bytes_fetched_per_sample_whole_pass": end["bytes_read"] / end["samples"],
        "epoch_samples": len(ds),
    }


SMOKE = {"episodes": 2, "seconds": 2.0, "size": 32, "batches": 2, "warmup": 1, "rounds": 1, "batch": 4}


def options(p) -> None:
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--seconds", type=float, default=20.0, help="episode length")
    p.add_argument("--size", type=int, default=256, help="frame width and height")
    p.add_argument("--batches", type=int, default=30, help="timed batches per pass")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="passes per side, alternating")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shuffle", choices=("auto", "global", "none"), default="auto", help="the reader's shuffle")
    p.add_argument(
        "--reuse-buffers",
        type=int,
        default=0,
        help="WindowLoader(reuse_buffers=K): batches in K pre-faulted buffers (0: fresh memory, the default loader)",
    )
    p.add_argument(
        "--io-windows", type=int, default=4, help="windows per episode of the bytes-per-window pass (global shuffle)"
    )
    p.add_argument(
        "--encoded-cache-mb",
        type=float,
        default=None,
        help="Lookahead(encoded_bytes=) in MiB (0: every load fetches, as over a dataset larger than the cache)",
    )


def run(args) -> int:
    root = str(_dataset(args.episodes, args.seconds, args.size))
    measure.say(f"{root}: load {measure.loadavg():.2f}")
    results: dict[bool, list[dict]] = {False: [], True: []}
    for _, with_stream in measure.alternate([False, True], args.rounds):
        shuffle = args.shuffle if args.shuffle in ("auto", "global") else None
        encoded = None if args.encoded_cache_mb is None else int(args.encoded_cache_mb * 2**20)
        r = _pass(
            root, with_stream, args.batches, args.warmup, args.batch, args.seed, shuffle, encoded, args.reuse_buffers
        )
        results[with_stream].append(r)
        measure.emit({**r, "load": measure.loadavg()})
    rows = []
    for side in (False, True):
        rs = results[side]
        rows.append(
            [
                rs[0]["side"],
                f"{measure.median(r['samples_per_s'] for r in rs):.1f}",
                f"{measure.median(r['cpu_ms_per_sample'] for r in rs):.2f}",
                f"{measure.median(r['frames_decoded_per_sample'] for r in rs):.2f}",
                f"{measure.median(r['bytes_read_per_sample'] for r in rs) / 1e3:.1f}",
                f"{measure.median(r['bytes_fetched_per_sample_whole_pass'] for r in rs) / 1e3:.1f}",
            ]
        )
    video_bytes, stream_bytes = _member_bytes(root)
    io = {side: _io_pass(root, side, args.io_windows, args.seed) for side in (False, True)}
    measure.emit(
        {
            "video_member_bytes": video_bytes,
            "stream_bytes_per_episode": stream_bytes,
            "io_bytes_per_window_video": io[False],
            "io_bytes_per_window_with_stream": io[True],
        }
    )
    pairs = zip(results[False], results[True], strict=True)
    ratios = [b["cpu_ms_per_sample"] / a["cpu_ms_per_sample"] for a, b in pairs]
    ratio = measure.median(ratios)
    measure.emit({"cost_ratio_cpu": ratio, "ratios": ratios, "target": 1.10})
    measure.table(
        ["window", "samples/s", "CPU ms / sample", "frames decoded / sample", "kB read / sample", "kB / sample, pass"],
        rows,
        title=f"multirate: {args.episodes} episodes x {args.seconds:g} s, {args.size}px, batch {args.batch}, "
        f"shuffle {args.shuffle}, reuse_buffers {args.reuse_buffers}, "
        f"{args.rounds} rounds; CPU per sample, stream over video alone: {ratio:.3f}x (target <= 1.10x); per "
        f"episode the video member is {video_bytes / 1e3:.0f} kB, the stream {stream_bytes / 1e3:.0f} kB; at "
        f"shuffle='global' with nothing kept, a window fetches {io[False] / 1e3:.1f} kB alone and "
        f"{io[True] / 1e3:.1f} kB with the stream",
    )
    return 0
