"""How far resizing inside swscale (PyAV, or torchcodec's decoder-side ``Resize``) lands from the reader's resize.

The reader resizes after converting to RGB at full size: swscale's YUV -> RGB (``stream/packets.py``),
then torch's antialiased bilinear (``PostProcess.prepare``). Converting at the output size instead
would save the full-size conversion, if the frames stayed within +-1 of today's. For every
``--step``-th frame of a video (up to ``--frames``), each output size and each swscale filter, this
prints the largest difference (levels of 0..255) and the share of values more than 1 apart:

- ``yuv``: swscale scales while it converts (``frame.reformat(width, height, "rgb24")``: what
  converting at the output size is; torchcodec's decoder-side ``Resize`` runs the same scaler);
- ``rgb``: swscale scales the full-size RGB frame (RGB -> RGB), the filter alone.

    python tools/bench/resize_fidelity.py \
        ../shared/data/unitree_g1_bottle_av1_v30/videos/observation.images.cam_high/chunk-000/file-000.mp4
"""

from __future__ import annotations

import argparse

import av
import numpy as np
import torch

FILTERS = ("BILINEAR", "AREA", "BICUBIC", "GAUSS", "LANCZOS", "X")


def reader_resize(frame: av.VideoFrame, size: tuple[int, int]) -> np.ndarray:
    """uint8 ``[h, w, 3]``: the reader's frame, full-size RGB resized by ``PostProcess``'s kernel."""
    rgb = torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1)[None]
    out = torch.nn.functional.interpolate(
        rgb.contiguous(memory_format=torch.channels_last), size=size, mode="bilinear", antialias=True
    )
    return out[0].permute(1, 2, 0).numpy()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("video")
    p.add_argument("--sizes", nargs="+", default=["224x224", "96x96", "256x256", "240x320"], help="HxW")
    p.add_argument("--frames", type=int, default=12)
    p.add_argument("--step", type=int, default=7)
    args = p.parse_args()
    with av.open(args.video) as container:
        stream = container.streams.video[0]
        frames = [f for i, f in enumerate(container.decode(stream)) if i % args.step == 0][: args.frames]
    height, width = frames[0].height, frames[0].width
    print(f"{args.video}: {len(frames)} frames of {width}x{height} {frames[0].format.name}")
    print(f"{'size':>8} {'path':>4} {'filter':>9} | {'max diff':>8} {'share > 1':>9}")
    for text in args.sizes:
        size = tuple(int(v) for v in text.split("x"))
        want = [reader_resize(f, size).astype(np.int16) for f in frames]
        for path in ("yuv", "rgb"):
            for name in FILTERS:
                worst, share = 0, 0.0
                for frame, ref in zip(frames, want, strict=True):
                    src = frame if path == "yuv" else av.VideoFrame.from_ndarray(frame.to_ndarray(format="rgb24"))
                    got = src.reformat(width=size[1], height=size[0], format="rgb24", interpolation=name)
                    diff = np.abs(got.to_ndarray().astype(np.int16) - ref)
                    worst, share = max(worst, int(diff.max())), share + float((diff > 1).mean()) / len(frames)
                print(f"{text:>8} {path:>4} {name:>9} | {worst:>8} {share:>9.2%}")


if __name__ == "__main__":
    main()
