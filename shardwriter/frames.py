"""Cameras given as frames (``episode.CameraFrames``): arrays or encoded images, encoded to video here.

Sources that record frames rather than videos (HDF5, Zarr, RLDS TFRecords, ROS 2 bags) hand the
writer a ``FrameReader`` per camera and episode. The conversion worker reads its chunks in order
and feeds them to one encoder (``video.StreamEncoder``), so at most one chunk of raw frames and
the encoded video are in memory, never the episode's camera whole:

- uint8 RGB ``[n, H, W, 3]`` (or encoded PNG/JPEG images, decoded with ``images.decode_image``) are
  encoded with ``images.IMAGE_SPEC`` (lossless all-intra H.264 RGB: bit-exact frames), or with the
  conversion's ``reencode`` settings when given (codec, GOP and quality then recorded as the
  camera's transform); ``reencode.size`` resizes.
- uint16 grey ``[n, H, W]`` (depth) is encoded with ``images.GREY_IMAGE_SPEC`` (FFV1, values exact),
  never re-encoded or resized.
- uint8 grey ``[n, H, W]`` becomes RGB (R == G == B, exact); RGBA drops alpha (reported).

Internal: import from ``epishard.shardwriter``.
"""

from __future__ import annotations

import numpy as np

from .episode import CameraFrames
from .errors import ConversionError
from .images import GREY_IMAGE_SPEC, IMAGE_SPEC, decode_image
from .video import ReencodeSpec, StreamEncoder, resize

__all__ = ["encode_frames"]


def _describe(frame: np.ndarray) -> str:
    kind = "16-bit grey" if frame.dtype == np.uint16 else "8-bit RGB"
    return f"{frame.shape[1]}x{frame.shape[0]} {kind}"


def _as_frames(chunk, row: int) -> tuple[np.ndarray, bool]:
    """A chunk as uint8 RGB ``[n, H, W, 3]`` or uint16 ``[n, H, W]``; also whether alpha was dropped.

    Raises:
        ConversionError(kind="bad_image"): an undecodable image (``row`` names it) or an array of
            another dtype or shape.
    """
    alpha = False
    if isinstance(chunk, list):
        images: list[np.ndarray] = []
        for i, data in enumerate(chunk):
            if not data:
                raise ConversionError("image holds no bytes", kind="bad_image", row=row + i)
            try:
                image, has_alpha = decode_image(bytes(data))
            except ValueError as exc:
                raise ConversionError(str(exc), kind="bad_image", row=row + i) from exc
            if images and image.shape != images[0].shape:
                raise ConversionError(
                    f"frame is {_describe(image)}, frame {row}'s is {_describe(images[0])}",
                    kind="frame_size_changed",
                    row=row + i,
                )
            images.append(image)
            alpha |= has_alpha
        return np.stack(images), alpha
    array = np.asarray(chunk)
    if array.dtype == np.uint8 and array.ndim == 3:  # grey: exactly as RGB
        array = np.repeat(array[..., None], 3, axis=-1)
    if array.dtype == np.uint8 and array.ndim == 4 and array.shape[-1] == 4:
        array, alpha = array[..., :3], True
    if array.dtype == np.uint8 and array.ndim == 4 and array.shape[-1] == 3:
        return array, alpha
    if array.dtype == np.uint16 and array.ndim == 3:
        return array, False
    if array.dtype == np.uint16 and array.ndim == 4 and array.shape[-1] == 1:
        return array[..., 0], False
    raise ConversionError(
        f"frames are {array.dtype} {list(array.shape[1:])}: expected uint8 [H, W, 3] (RGB), uint8 [H, W] (grey) "
        "or uint16 [H, W] (depth)",
        kind="bad_image",
        row=row,
    )


def encode_frames(
    camera: CameraFrames, num_rows: int, fps: float, reencode: ReencodeSpec | None
) -> tuple[bytes, str, list[dict]]:
    """Encode a ``CameraFrames`` camera; return (MP4 bytes, transform, report entries).

    ``num_rows``: the episode's rows; the camera must have exactly one frame per row. The transform
    is ``"images:<settings>"`` as for image columns (``prepare._prepare_images``).

    Raises:
        ConversionError: ``frame_size_changed`` (a frame's size or kind differs from frame 0's,
            ``row`` names it), ``bad_image`` (undecodable image), ``length_mismatch`` (frames and
            rows differ in number), ``encode_failed``; the reader's own errors (missing key,
            truncated file) pass through. The caller adds dataset, episode and camera.
    """
    encoder: StreamEncoder | None = None
    first: np.ndarray | None = None
    alpha, row = False, 0
    try:
        for chunk in camera.reader.chunks():
            frames, has_alpha = _as_frames(chunk, row)
            alpha |= has_alpha
            if first is None:
                if not frames.shape[0]:
                    continue
                first = frames[0]
                grey = frames.dtype == np.uint16
                spec = GREY_IMAGE_SPEC if grey else reencode or IMAGE_SPEC
                encoder = StreamEncoder(fps, spec)
            if frames.shape[1:] != first.shape or frames.dtype != first.dtype:
                bad = next((i for i, f in enumerate(frames) if f.shape != first.shape), 0)
                raise ConversionError(
                    f"frame is {_describe(frames[bad])}, frame 0's is {_describe(first)}",
                    kind="frame_size_changed",
                    row=row + bad,
                )
            assert encoder is not None
            if frames.dtype == np.uint8:
                frames = resize(frames, encoder.spec.size)
            for frame in frames:
                if row >= num_rows:
                    raise ConversionError(
                        f"the camera has more frames than the episode's {num_rows} rows", kind="length_mismatch"
                    )
                encoder.add(frame)
                row += 1
        if row != num_rows:
            raise ConversionError(
                f"the camera has {row} frames, the episode {num_rows} rows", kind="length_mismatch", row=row
            )
        assert encoder is not None
        data = encoder.finish()
    finally:
        if encoder is not None:
            encoder.close()
    notes = (
        [{"kind": "image_alpha_dropped", "row": None, "message": "frames have an alpha channel; the camera keeps RGB"}]
        if alpha
        else []
    )
    return data, "images:" + encoder.spec.describe().partition(":")[2], notes
