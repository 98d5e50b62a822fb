"""An encoded image (JPEG/PNG in an HDF5, RLDS, MCAP or LeRobot source) is decoded only within the frame bound.

A PNG of zeros compresses about 1000:1, so a small cell can claim a picture of gigabytes. FFmpeg's
``max_pixels`` refuses it before the pixels are allocated; the writer names it (``bad_image``).
"""

from __future__ import annotations

import av
import numpy as np
import pytest

from epishard.shardwriter.images import decode_image
from epishard.shardwriter.sources import bounds


def _png(height: int, width: int) -> tuple[bytes, np.ndarray]:
    rng = np.random.default_rng(0)
    image = np.zeros((height, width, 3), np.uint8)
    image[: height // 4, : width // 4] = rng.integers(0, 256, (height // 4, width // 4, 3), dtype=np.uint8)
    ctx = av.CodecContext.create("png", "w")
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "rgb24"
    packets = ctx.encode(av.VideoFrame.from_ndarray(image, format="rgb24")) + ctx.encode(None)
    return bytes(packets[0]), image


def test_a_picture_over_the_frame_bound_is_refused_before_decoding(monkeypatch):
    data, image = _png(1200, 1600)  # 1.92 M pixels, about 0.4 MB of PNG
    got, alpha = decode_image(data)
    assert np.array_equal(got, image) and not alpha  # under the bound: exact
    monkeypatch.setattr(bounds, "MAX_FRAME_BYTES", 3 * 1_000_000)  # 1 M pixels at most
    with pytest.raises(ValueError, match=r"more than the 1000000 pixels a frame may have .*MAX_FRAME_BYTES"):
        decode_image(data)
    small, image = _png(600, 800)  # 0.48 M pixels: still decoded, exactly
    assert np.array_equal(decode_image(small)[0], image)
