"""Image features (LeRobot's ``image`` dtype): a camera stored as one encoded image per table row.

Older LeRobot datasets keep some cameras as PNG (or JPEG) images inside the parquet, a column of
``struct<bytes: binary, path: string>``. The writer turns such a column into a camera like any
other: the images are decoded with FFmpeg's image decoders (through PyAV, already the writer's video
library) and encoded as a video with ``IMAGE_SPEC``: H.264 in RGB (``libx264rgb``), crf 0
(lossless), every frame a keyframe. Lossless RGB keeps the decoded pixels bit-exact through
torchcodec; all-intra keeps the cost of reading any frame at one frame, as with separate images.

Internal: import from ``epishard.shardwriter``.
"""

from __future__ import annotations

import av
import numpy as np
import pyarrow as pa

from .errors import ConversionError
from .video import ReencodeSpec

__all__ = ["GREY_IMAGE_SPEC", "IMAGE_SPEC", "column_images", "decode_image"]

IMAGE_SPEC = ReencodeSpec(codec="libx264rgb", gop=1, size=None, crf=0)
# 16-bit grey images (depth maps saved as PNG): lossless FFV1 in gray16le, every frame a keyframe;
# the camera is then a depth camera (uint16 [T, 1, H, W], values exact). Never re-encoded.
GREY_IMAGE_SPEC = ReencodeSpec(codec="ffv1", gop=1, size=None, crf=None)

# File signatures -> FFmpeg image decoder.
_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8", "mjpeg"), (b"BM", "bmp"))


def _decoder(data: bytes) -> str:
    for magic, codec in _SIGNATURES:
        if data.startswith(magic):
            return codec
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    raise ValueError(f"not a PNG, JPEG, BMP or WebP image (starts with {data[:8]!r})")


def decode_image(data: bytes) -> tuple[np.ndarray, bool]:
    """Decode one image file to uint8 RGB ``[H, W, 3]`` or, 16-bit grey, uint16 ``[H, W]``.

    A 16-bit grey image (a depth map) keeps its values exact; also returns whether an alpha
    channel was dropped.

    8-bit grey and palette images expand to RGB exactly; JPEG's YCbCr converts with FFmpeg's
    rounding.

    The size an image's header claims is bounded before its pixels are allocated: at most
    ``sources.bounds.MAX_FRAME_BYTES / 3`` pixels (FFmpeg's ``max_pixels``), so a small file
    claiming a huge picture (a PNG of zeros compresses 1000:1) is refused, not decoded.

    Raises:
        ValueError: unknown format, undecodable bytes, a picture of more pixels than the bound, or
            colour of more than 8 bits per sample (returning it as 8-bit RGB would lose precision
            silently).
    """
    from .sources import bounds

    codec = _decoder(data)
    limit = bounds.MAX_FRAME_BYTES // 3
    try:
        ctx = av.CodecContext.create(codec, "r")
        if not isinstance(ctx, av.VideoCodecContext):
            raise ValueError(f"{codec} is not an image decoder")
        ctx.options = {"max_pixels": str(limit)}
        frames = ctx.decode(av.Packet(data)) + ctx.decode(None)
    except av.error.ArgumentError as exc:  # what FFmpeg answers to a picture over max_pixels (EINVAL)
        raise ValueError(
            f"{codec} decoder refused the picture ({exc}): its header may claim more than the {limit} pixels "
            "a frame may have (epishard.shardwriter.sources.bounds.MAX_FRAME_BYTES)"
        ) from exc
    except av.error.FFmpegError as exc:
        raise ValueError(f"{codec} decoder failed: {exc}") from exc
    if not frames:
        raise ValueError(f"{codec} decoder returned no picture")
    frame = frames[0]
    bits = max(c.bits for c in frame.format.components)
    if bits > 8 and len(frame.format.components) == 1:
        return frame.reformat(format="gray16le").to_ndarray(), False
    if bits > 8:
        raise ValueError(f"{frame.format.name} image ({bits} bits per sample): only 8-bit images are supported")
    return frame.to_ndarray(format="rgb24"), len(frame.format.components) == 4


def _describe(image: np.ndarray) -> str:
    return f"{image.shape[1]}x{image.shape[0]} " + ("16-bit grey" if image.ndim == 2 else "8-bit RGB")


def column_images(table: pa.Table, column: str) -> tuple[np.ndarray, list[dict]]:
    """Decode an image column (one image per row) to uint8 RGB ``[num_rows, H, W, 3]``.

    16-bit grey images become uint16 ``[num_rows, H, W]``.

    Accepts LeRobot's ``struct<bytes, path>`` cells and plain binary cells. Returns the frames and
    report entries (``image_alpha_dropped``, once per column).

    Raises:
        ConversionError(kind="bad_image"): a row has no image bytes, an undecodable image, or a
            size or kind (16-bit grey, 8-bit RGB) other than row 0's; ``row`` names it.
    """
    cells = table.column(column).combine_chunks()
    if pa.types.is_struct(cells.type):
        cells = cells.field("bytes")
    frames: list[np.ndarray] = []
    alpha = False
    for row, data in enumerate(cells.to_pylist()):
        if not data:
            raise ConversionError(
                "image cell holds no bytes (images stored as paths are not supported)", kind="bad_image", row=row
            )
        try:
            image, has_alpha = decode_image(data)
        except ValueError as exc:
            raise ConversionError(str(exc), kind="bad_image", row=row) from exc
        if frames and image.shape != frames[0].shape:
            raise ConversionError(
                f"image is {_describe(image)}, row 0's is {_describe(frames[0])}", kind="bad_image", row=row
            )
        frames.append(image)
        alpha |= has_alpha
    notes = (
        [
            {
                "kind": "image_alpha_dropped",
                "row": None,
                "message": "images have an alpha channel; the camera keeps RGB only",
            }
        ]
        if alpha
        else []
    )
    return np.stack(frames), notes
