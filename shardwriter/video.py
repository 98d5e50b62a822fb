"""Video work done at write time: packet tables, segment cuts by stream copy, optional re-encode.

Packet-level work uses PyAV (FFmpeg's demuxer and muxer) so that nothing is decoded except where a
re-encode is asked for. Frame numbers follow torchcodec's exact seek mode: frame ``i`` is the packet
with the ``i``-th smallest pts, and keyframes are packets flagged as such by the demuxer.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from .errors import ConversionError

VideoSource = bytes | str  # encoded file bytes, or a local path


@dataclass(frozen=True)
class VideoProbe:
    """What the demuxer says about one video stream, in presentation order.

    ``pts``, ``duration``: int64 ``[num_frames]`` in units of ``time_base`` (seconds per tick).
    ``keyframes``: int32 ascending frame numbers of keyframes. ``decode_order``: int64
    ``[num_frames]`` frame number of each packet in file (decode) order.
    """

    codec: str
    width: int
    height: int
    pix_fmt: str
    time_base: Fraction
    pts: np.ndarray
    duration: np.ndarray
    keyframes: np.ndarray
    decode_order: np.ndarray
    average_fps: float

    @property
    def num_frames(self) -> int:
        return int(self.pts.shape[0])

    def seconds(self, frames: np.ndarray) -> np.ndarray:
        """Presentation time in seconds of the given frame numbers (float64)."""
        return self.pts[frames].astype(np.float64) * float(self.time_base)


def _open(source: VideoSource):
    return av.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source, "r")


def probe(source: VideoSource) -> VideoProbe:
    """Demux every packet of the first video stream (no decoding) and return its frame tables.

    Raises:
        ConversionError(kind="unreadable_video"): the container cannot be opened or demuxed, has
            no video stream, or has packets without pts.
    """
    try:
        with _open(source) as container:
            if not container.streams.video:
                raise ConversionError("no video stream in file", kind="unreadable_video")
            stream = container.streams.video[0]
            ctx = stream.codec_context
            rows = [
                (p.pts, p.duration or 0, p.is_keyframe)
                for p in container.demux(stream)
                if p.size and p.pts is not None
            ]
            info = (ctx.codec.canonical_name, ctx.width, ctx.height, ctx.format.name if ctx.format else "", stream.time_base)
            fps = float(stream.average_rate) if stream.average_rate else 0.0
    except ConversionError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise ConversionError(f"cannot demux video: {exc}", kind="unreadable_video") from exc
    if not rows:
        raise ConversionError("video stream holds no frames", kind="unreadable_video")
    table = np.asarray(rows, dtype=np.int64)
    order = np.argsort(table[:, 0], kind="stable")
    frame_of_packet = np.empty_like(order)
    frame_of_packet[order] = np.arange(order.size)
    pts = table[order, 0]
    if np.any(np.diff(pts) == 0):
        raise ConversionError("two packets share one pts", kind="unreadable_video")
    codec, width, height, pix_fmt, time_base = info
    return VideoProbe(
        codec=codec,
        width=int(width),
        height=int(height),
        pix_fmt=pix_fmt,
        time_base=Fraction(time_base.numerator, time_base.denominator),
        pts=pts,
        duration=table[order, 1],
        keyframes=np.flatnonzero(table[order, 2]).astype(np.int32),
        decode_order=frame_of_packet,
        average_fps=fps,
    )


def frame_at_time(info: VideoProbe, seconds: float, fps: float) -> int:
    """Frame number whose pts is nearest to ``seconds``; it must lie within half a frame (1/(2 fps)).

    Used once per episode and camera at write time to turn LeRobot v3.0 ``from_timestamp`` offsets
    into exact frame numbers.

    Raises:
        ValueError: no frame lies within half a frame period of ``seconds``.
    """
    times = info.seconds(np.arange(info.num_frames))
    i = int(np.clip(np.searchsorted(times, seconds), 0, info.num_frames - 1))
    candidates = [c for c in (i - 1, i) if 0 <= c < info.num_frames]
    best = min(candidates, key=lambda c: abs(times[c] - seconds))
    if abs(times[best] - seconds) > 0.5 / fps:
        raise ValueError(
            f"no frame within half a frame of t={seconds:.6f}s (nearest frame {best} at {times[best]:.6f}s)"
        )
    return best


def cut(source: VideoSource, info: VideoProbe, first: int, stop: int) -> tuple[bytes, np.ndarray]:
    """Stream-copy the frames ``[first, stop)`` of a video into a new MP4, without re-encoding.

    The cut starts at the last keyframe at or before ``first`` and takes whole groups of pictures
    in decode order until every frame up to ``stop - 1`` is present, so every kept frame decodes
    exactly as in the source. Timestamps are shifted so the cut starts at pts 0.

    Returns:
        (mp4 bytes, kept) where ``kept`` is int64 ``[frames in the cut]``: the source frame number of
        each frame of the cut, ascending (frame ``i`` of the cut is source frame ``kept[i]``).
    """
    start_key = int(info.keyframes[np.searchsorted(info.keyframes, first, side="right") - 1])
    is_key = np.zeros(info.num_frames, dtype=bool)
    is_key[info.keyframes] = True
    # Walk packets in decode order from the start keyframe; stop at a keyframe once all needed
    # frames have been seen. Leading pictures (pts before the start keyframe) are dropped.
    positions = np.flatnonzero(info.decode_order == start_key)
    keep: list[int] = []
    missing = set(range(first, stop))
    for frame in info.decode_order[int(positions[0]):]:
        frame = int(frame)
        if not missing and is_key[frame] and frame != start_key:
            break
        if frame >= start_key:
            keep.append(frame)
            missing.discard(frame)
    kept = np.sort(np.asarray(keep, dtype=np.int64))
    wanted = set(keep)
    offset = int(info.pts[start_key])
    out = io.BytesIO()
    with _open(source) as src, av.open(out, "w", format="mp4", options={"fflags": "+bitexact"}) as dst:
        in_stream = src.streams.video[0]
        out_stream = dst.add_stream_from_template(in_stream, opaque=True)
        frame_of_pts = {int(p): i for i, p in enumerate(info.pts)}
        for packet in src.demux(in_stream):
            if not packet.size or packet.pts is None:
                continue
            if frame_of_pts[int(packet.pts)] not in wanted:
                continue
            packet.pts -= offset
            if packet.dts is not None:
                packet.dts -= offset
            packet.stream = out_stream
            dst.mux(packet)
    return out.getvalue(), kept


@dataclass(frozen=True)
class ReencodeSpec:
    """Re-encode settings: ``codec`` (an FFmpeg encoder name, e.g. ``libx264``, ``libsvtav1``,
    ``mpeg4``), ``gop`` (keyframe interval in frames), ``size`` (``(height, width)`` or None to keep),
    ``crf`` (quality for x264/SVT-AV1; None for the encoder's default)."""

    codec: str = "libx264"
    gop: int = 10
    size: tuple[int, int] | None = None
    crf: int | None = 23

    def __post_init__(self):
        if self.gop < 1:
            raise ValueError(f"re-encode gop must be at least 1 frame, not {self.gop}")

    def describe(self) -> str:
        return "reencode:" + json.dumps(
            {"codec": self.codec, "gop": self.gop, "size": self.size, "crf": self.crf}, sort_keys=True
        )

    @classmethod
    def parse(cls, text: str) -> "ReencodeSpec":
        """Parse ``codec=libx264,gop=10,size=224x224,crf=23`` (any subset, in any order)."""
        fields: dict = {}
        for part in filter(None, text.split(",")):
            name, _, value = part.partition("=")
            if name == "codec":
                fields["codec"] = value
            elif name == "gop":
                fields["gop"] = int(value)
            elif name == "crf":
                fields["crf"] = int(value)
            elif name == "size":
                h, _, w = value.lower().partition("x")
                fields["size"] = (int(h), int(w))
            else:
                raise ValueError(f"unknown re-encode option {name!r} in {text!r} (codec, gop, size, crf)")
        return cls(**fields)


def reencode(source: VideoSource, frames: np.ndarray, fps: float, spec: ReencodeSpec) -> bytes:
    """Decode the given source frames (torchcodec, frame-exact, 8-bit RGB) and encode them as a new MP4.

    ``frames``: int64 ``[n]`` source frame numbers, in output order. Output frame ``i`` is shown at
    ``i / fps`` seconds and every ``spec.gop``-th frame is a keyframe. A source of more than 8 bits
    per sample is reduced to 8 bits by the decode (the stored ``pix_fmt`` in the index says so).

    Raises:
        ConversionError(kind="unreadable_video"): the frames do not decode.
        ConversionError(kind="encode_failed"): the encoder refused the frames (see ``encode``).
    """
    from torchcodec.decoders import VideoDecoder

    try:
        decoder = VideoDecoder(source, seek_mode="exact", dimension_order="NHWC")
        pixels = decoder.get_frames_at(frames.tolist()).data
    except Exception as exc:  # torchcodec raises RuntimeError/IndexError/ValueError by case
        raise ConversionError(f"decoding frames for the re-encode failed: {exc}", kind="unreadable_video") from exc
    return encode(resize(pixels.numpy(), spec.size), fps, spec)


def resize(images: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
    """uint8 RGB ``[n, H, W, 3]`` resized to ``size`` = ``(h, w)`` (bilinear, antialiased), or as is."""
    import torch

    if size is None or tuple(images.shape[1:3]) == tuple(size):
        return np.ascontiguousarray(images)
    chw = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float()
    chw = torch.nn.functional.interpolate(chw, size=size, mode="bilinear", antialias=True)
    return chw.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


def encoder_pix_fmt(codec: str, height: int, width: int) -> str:
    """Pixel format ``encode`` gives encoder ``codec`` for frames of ``height`` x ``width``.

    RGB encoders (``libx264rgb``) get ``rgb24`` (lossless with crf 0); others ``yuv420p``, the
    format every player decodes, unless a dimension is odd: 4:2:0 needs even sizes in x264 and
    x265, so an encoder that offers ``yuv444p`` gets that (no padding, no cropping: the stored
    video has the frames' own size). Encoders without 4:4:4 (``mpeg4``, ``libsvtav1``) accept odd
    sizes in 4:2:0 (padding internally) and decode back to the given size.

    Raises:
        ConversionError(kind="encode_failed"): FFmpeg has no encoder named ``codec``.
    """
    try:
        offered = [f.name for f in av.codec.Codec(codec, "w").video_formats or ()]
    except (av.error.FFmpegError, ValueError) as exc:
        raise ConversionError(f"no FFmpeg video encoder named {codec!r}", kind="encode_failed") from exc
    if "rgb24" in offered and "yuv420p" not in offered:
        return "rgb24"
    if (height % 2 or width % 2) and "yuv444p" in offered:
        return "yuv444p"
    return "yuv420p" if "yuv420p" in offered or not offered else offered[0]


def encode(images: np.ndarray, fps: float, spec: ReencodeSpec) -> bytes:
    """Encode uint8 RGB ``images`` ``[n, H, W, 3]`` as an MP4 at ``fps``, a keyframe every ``spec.gop``.

    The pixel format is ``encoder_pix_fmt``'s choice. Deterministic settings: one encoder thread,
    no scene-cut keyframes, ``+bitexact`` muxing.

    Raises:
        ConversionError(kind="encode_failed"): the encoder is unknown or refuses the size, pixel
            format or options; the message gives FFmpeg's reason (the caller adds dataset, episode
            and camera).
    """
    n, height, width = int(images.shape[0]), int(images.shape[1]), int(images.shape[2])
    pix_fmt = encoder_pix_fmt(spec.codec, height, width)
    out = io.BytesIO()
    rate = Fraction(fps).limit_denominator(1001000)
    options = {"g": str(spec.gop), "keyint_min": str(spec.gop), "sc_threshold": "0"}
    if spec.crf is not None and spec.codec in ("libx264", "libx264rgb", "libsvtav1", "libx265"):
        options["crf"] = str(spec.crf)
    if spec.codec in ("libx264", "libx264rgb"):
        options["x264-params"] = f"keyint={spec.gop}:min-keyint={spec.gop}:scenecut=0"
    if spec.codec == "libx265":
        options["x265-params"] = f"keyint={spec.gop}:min-keyint={spec.gop}:scenecut=0:log-level=error:frame-threads=1:pools=none"
    try:
        with av.open(out, "w", format="mp4", options={"fflags": "+bitexact"}) as dst:
            stream = dst.add_stream(spec.codec, rate=rate, options=options)
            stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
            stream.codec_context.thread_count = 1
            for image in images:
                for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                    dst.mux(packet)
            for packet in stream.encode():
                dst.mux(packet)
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        raise ConversionError(f"encoder {spec.codec} ({pix_fmt}, {width}x{height}, {n} frames) failed: {exc}",
                              kind="encode_failed") from exc
    return out.getvalue()
