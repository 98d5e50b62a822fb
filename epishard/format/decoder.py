"""The decoder glue writer and reader share: the stream that holds the frames, and the reader's decoder.

- ``frame_stream``: the container stream a video's frames come from (the index records it; cover
  art skipped), for PyAV;
- ``frame_mappings``, ``open_decoder``: a torchcodec ``VideoDecoder`` opened on a video member with
  the index's frame tables as ``custom_frame_mappings``, so opening does not rescan the file. The
  writer checks every frame it indexes through ``open_decoder`` (``shardwriter.video.check_frames``)
  and the reader decodes through it (``stream.decode``), so both see the same frames;
- ``container_frames``: the frame count a video member's container states, to hold an index's
  ``num_frames`` against before a table of that many frames is built.

PyAV is imported with this module; torchcodec (which loads torch) only when a decoder is opened.
Errors: ``VideoError`` (``epishard.format.errors``) where a file holds no frame stream.

Internal: import from ``epishard.format``.
"""

from __future__ import annotations

import io
import json

import av
import numpy as np

from .errors import VideoError

__all__ = ["container_frames", "frame_mappings", "frame_stream", "open_decoder", "torchcodec_rotates"]


def frame_stream(container, stream_index: int | None = None) -> av.video.stream.VideoStream:
    """The video stream that holds the frames.

    Stream ``stream_index`` when given (an index records it; None or -1: not recorded); else,
    attached pictures (cover art) skipped, FFmpeg's best video stream (``av_find_best_stream``),
    else the first.

    Raises:
        VideoError: no video stream other than attached pictures.
    """
    if stream_index is not None and stream_index >= 0:
        return container.streams[int(stream_index)]
    candidates = [s for s in container.streams.video if not s.disposition & av.stream.Disposition.attached_pic]
    if not candidates:
        what = "only attached pictures (cover art)" if container.streams.video else "no video stream"
        raise VideoError(f"{what} in file: no video stream holds frames")
    best = container.streams.best("video")
    return best if best in candidates else candidates[0]


def frame_mappings(pts: np.ndarray, duration: np.ndarray, keyframe: np.ndarray) -> str:
    """Torchcodec ``custom_frame_mappings`` JSON (ffprobe's ``-show_frames`` shape) for one stream.

    ``pts``, ``duration``: int64 ``[num_frames]`` in the stream time base; ``keyframe``: bool.
    """
    frames = [
        {"pts": int(p), "duration": int(d), "key_frame": int(k)}
        for p, d, k in zip(pts.tolist(), duration.tolist(), keyframe.tolist(), strict=False)
    ]
    return json.dumps({"frames": frames})


def torchcodec_rotates() -> bool:
    """Whether the installed torchcodec turns frames by the stream's display matrix (torchcodec 0.11 and later).

    Earlier releases (0.10 is LeRobot 0.4.4's pin) return a rotated stream's frames as stored, sideways
    or upside down; ``open_decoder`` refuses such a stream there rather than return them.
    """
    import torchcodec

    try:
        major, minor = (int(p) for p in torchcodec.__version__.split(".")[:2])
    except ValueError:  # a development build: assume the newest behaviour
        return True
    return (major, minor) >= (0, 11)


def open_decoder(
    data,
    pts: np.ndarray,
    duration: np.ndarray,
    keyframe: np.ndarray,
    stream_index: int | None,
    rotation: int = 0,
):
    """The reader's decoder: a torchcodec ``VideoDecoder`` on ``data`` using the index's frame tables.

    The tables go in as ``custom_frame_mappings`` (no rescan); output is NCHW uint8 RGB (8 bits
    whatever the source's depth), upright (the display matrix applied); one FFmpeg thread.
    ``data``: the encoded bytes, a local path or a seekable binary file.

    ``stream_index``: the stream the tables describe (None or -1: FFmpeg's best video stream, for
    indexes written before the index recorded it). ``rotation``: degrees of the stream's display
    matrix, as the index records it.

    Raises:
        VideoError: ``rotation`` is not 0 and the installed torchcodec (before 0.11) would return
            the frames unturned (``torchcodec_rotates``).
        Whatever torchcodec raises.
    """
    import torchcodec
    from torchcodec.decoders import VideoDecoder

    if rotation % 360 and not torchcodec_rotates():
        raise VideoError(
            f"the video is stored turned ({rotation} degrees in its display matrix) and torchcodec "
            f"{torchcodec.__version__} returns such frames unturned: install torchcodec >= 0.11 (with its torch; "
            "LeRobot 0.6.x's range), or re-encode the video upright before converting"
        )
    stream_index = None if stream_index is None or stream_index < 0 else int(stream_index)
    return VideoDecoder(
        data,
        stream_index=stream_index,
        custom_frame_mappings=frame_mappings(pts, duration, keyframe),
        dimension_order="NCHW",
        num_ffmpeg_threads=1,
    )


def container_frames(data: bytes, stream_index: int) -> int | None:
    """Frames the container of a video member (``data``: its bytes) lists for a stream, read from its header.

    An MP4's sample table count (``stsz``): every frame a decoder shows comes from one of them, so
    an index claiming more frames than this describes another video; a reader checks it before it
    builds a frame table of that many entries (``WindowIndex.frame_tables``, torchcodec's
    ``custom_frame_mappings``: about 300 bytes of Python objects per frame while it is built).
    ``stream_index``: as the index records it (-1: FFmpeg's best video stream). Returns None when
    the container does not say (Matroska, WebM) or the bytes do not open (the decoder reports that).
    """
    try:
        with av.open(io.BytesIO(data), "r") as container:
            count = int(frame_stream(container, stream_index).frames)
    except (av.FFmpegError, VideoError, IndexError, ValueError):
        return None
    return count or None
