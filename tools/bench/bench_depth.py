"""Depth decode cost: the PyAV full-precision path (``stream.decode.decode_depth``) against the
torchcodec RGB path (``stream.decode.decode``, which would squeeze depth into 8-bit RGB) on the same
video bytes.

Synthetic 320x240 scene, 120 frames, a keyframe every 30: a sloped floor (12-bit depth codes) with
a box moving across it and +-1 sensor noise, as lossless 12-bit HEVC and 16-bit FFV1. Two access
patterns: every frame, and 8 sparse frames (one every 15). Depth values are checked exactly. Median
of ``--rounds`` runs, milliseconds per frame returned.

    .venv/bin/python tools/bench/bench_depth.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from videogen import make_grey_video

from epishard.format.decoder import frame_mappings
from epishard.shardwriter.video import probe
from epishard.stream.decode import decode, decode_depth

H, W, N, GOP = 240, 320, 120, 30
PATTERNS = {"all 120": np.arange(N), "sparse 8": np.arange(0, N, 15) + 7}


def _scene() -> np.ndarray:
    """uint16 [N, H, W] 12-bit depth codes: floor sloping away, a nearer box moving right, noise."""
    rng = np.random.RandomState(0)
    y = np.arange(H, dtype=np.int64)[:, None]
    floor = np.broadcast_to(3800 - 10 * y, (H, W))
    frames = np.repeat(floor[None], N, axis=0).copy()
    for i in range(N):
        x0 = 20 + 2 * i
        frames[i, 80:160, x0 : x0 + 60] = 900 + i
    return (frames + rng.randint(-1, 2, frames.shape)).clip(0, 4095).astype(np.uint16)


def _median_ms(fn, frames: np.ndarray, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn(frames)
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times)) / frames.size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    depth = _scene()
    for codec, pix_fmt in (("hevc", "gray12le"), ("ffv1", "gray16le")):
        data = make_grey_video(depth, codec=codec, pix_fmt=pix_fmt, gop=GOP)
        info = probe(data)
        keys = info.keyframes.astype(np.int64)

        def run(frames, data=data, info=info, keys=keys):
            out = decode_depth(data, frames, info.pts, keys, where="bench").frames
            assert np.array_equal(out[:, 0].numpy(), depth[frames])

        flags = np.zeros(info.num_frames, bool)
        flags[info.keyframes] = True
        mappings = frame_mappings(info.pts, info.duration, flags)

        def run_rgb(frames, data=data, mappings=mappings):
            out = decode(data, frames, mappings, where="bench").frames
            assert tuple(out.shape) == (frames.size, 3, H, W)

        for name, frames in PATTERNS.items():
            print(
                f"{codec} {pix_fmt} {len(data) / 1e6:.2f} MB, {name}: depth path (PyAV, uint16) "
                f"{_median_ms(run, frames, args.rounds):.1f} ms/frame; RGB path (torchcodec, uint8) "
                f"{_median_ms(run_rgb, frames, args.rounds):.1f} ms/frame"
            )


if __name__ == "__main__":
    main()
