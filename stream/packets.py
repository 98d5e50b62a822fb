"""Packet-level reading: fetch only the groups of pictures a decode call needs, feed a kept decoder.

The index's packet table (``WindowIndex.packets``; docs/FORMAT.md "Packet tables") gives, per
camera stream, every packet's byte offset, size, CRC-32 and the frame it shows, plus the codec's
extradata. For a decode call (sorted frame numbers of one stream) ``plan_runs`` finds the *runs*:
a run starts at the keyframe at or before its first frame and goes on, without a seek, through
every following wanted frame that no keyframe separates from the one before (torchcodec's
``get_frames_at`` decodes the same frames); its packets are, in decode order, those from the
keyframe's packet up to the last packet any frame shown between the keyframe and the run's last
frame comes from. Each run is one contiguous byte range of the member (the packet table keeps
file order), so the reader fetches those ranges, not the member (``run_ranges``).

``decode_runs`` cuts the packets out of the fetched bytes, checks each one's CRC-32, and feeds
them (pts from the index's frame table) to a PyAV decoder kept open per (codec, extradata, size)
for the worker's life (``DecoderPool``): no container is opened and no decoder is created per
episode. After a run's last packet the decoder is drained and flushed, so every frame the run
shows comes out and nothing carries into the next run. A frame is returned only when it comes
out with the pts of a wanted frame, exactly once; a wanted frame that does not is an error. RGB
conversion is swscale's bilinear conversion through one kept ``VideoReformatter`` per decoder, the
conversion torchcodec's CPU path makes (the tests compare both pixel for pixel).

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import functools
import os
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
import pyarrow as pa
import torch
from av.video.reformatter import VideoReformatter

from .decode import DecodeError
from .usercode import from_user_code

__all__ = [
    "PACKET_CODECS",
    "POOL",
    "DecoderPool",
    "PacketFrames",
    "Picture",
    "Run",
    "decode_runs",
    "picture_bytes",
    "plan_runs",
    "readable",
    "run_bytes",
    "run_ranges",
]

# PyAV >= 16 converts with swscale slice threads unless told ``threads=1`` (threads that would hang a
# forked worker); older PyAV (LeRobot 0.4.4 pins av < 16) has no such threads and no such argument.
_ONE_THREAD = {"threads": 1} if "threads" in (av.video.reformatter.VideoReformatter.reformat.__doc__ or "") else {}

# FFmpeg decoders to open for a codec, best first: FFmpeg's own AV1 decoder needs a hardware
# accelerator, so AV1 goes to libdav1d (what FFmpeg itself picks for an AV1 stream) or libaom.
_PREFERRED_DECODERS = {"av1": ("libdav1d", "libaom-av1", "av1")}
#: Codecs whose packets the reader decodes through its kept decoders: those the stream matrix and
#: tests/test_packets.py prove frame-exact on this path. Others (a decoder that needs the demuxer's
#: side data, e.g. a palette, or one not tested) are read whole through torchcodec.
PACKET_CODECS = frozenset({"h264", "hevc", "av1", "vp9", "mpeg4", "mpeg2video", "png", "mjpeg"})


@functools.lru_cache(maxsize=64)
def _eight_bit(pix_fmt: str) -> bool:
    try:
        return all(c.bits == 8 for c in av.VideoFormat(pix_fmt).components)
    except ValueError:  # a format this FFmpeg does not know
        return False


# Mean keyframe interval (frames) up to which a stream is read by its packets. Past it a window's
# runs reach far back to their keyframe anyway (most of the member), and the whole-member path keeps
# its decoder between look-ahead chunks, decoding on instead of from the keyframe again (an H.264
# stream with keyframes 250 apart decodes 1.6x the frames by packets).
_PACKET_GOP_FRAMES = 32


def readable(index, streams) -> np.ndarray:
    """Whether each camera stream (int array) is read by its packets: bool, same shape.

    It has a packet table (``WindowIndex.has_packets``), is an RGB camera of a codec in
    ``PACKET_CODECS``, stores 8-bit samples, and has keyframes at most ``_PACKET_GOP_FRAMES`` apart
    on average. swscale's conversion of 8-bit samples to RGB through PyAV is torchcodec's, pixel
    for pixel (tests/test_stream_matrix.py, tests/test_packets.py); of more bits it is not (up to
    131 levels apart on torchcodec's 10-bit H.264 sample), so such streams are decoded by
    torchcodec, as are the others.
    """
    streams = np.asarray(streams, dtype=np.int64)
    fmts = index.cam_pix_fmt.take(pa.array(streams.ravel())).to_pylist()
    eight = np.fromiter((_eight_bit(f) for f in fmts), dtype=bool, count=streams.size).reshape(streams.shape)
    keys = np.diff(index.key_offsets)[streams]
    short = index.cam_num_frames[streams] <= _PACKET_GOP_FRAMES * np.maximum(keys, 1)
    codecs = index.cam_codec.take(pa.array(streams.ravel())).to_pylist()
    known = np.fromiter((c in PACKET_CODECS for c in codecs), dtype=bool, count=streams.size).reshape(streams.shape)
    return index.has_packets(streams) & ~index.cam_depth[streams] & eight & short & known


@dataclass(frozen=True)
class PacketFrames:
    """What ``decode_runs`` returns.

    ``frames``: uint8 ``[N, 3, h, w]`` after ``post``, or, with no ``post``, a list of N standalone
    contiguous ``[3, H, W]`` tensors (each frame converted once into its own tensor, which a cache
    keeps without another copy), or of N ``Picture`` (``decode_runs(pictures=True)``); ``calls``:
    parts post-processed (1 unless ``max_bytes`` split them); ``post_s``: seconds in ``post``.
    """

    frames: torch.Tensor | list
    calls: int
    post_s: float


@dataclass(frozen=True)
class Run:
    """One uninterrupted decode: ``frames`` (sorted int64) from packets ``[first, stop)`` (decode order)."""

    frames: np.ndarray
    first: int
    stop: int


def plan_runs(frame_packet: np.ndarray, keyframes: np.ndarray, frames: np.ndarray) -> list[Run]:
    """The runs that decode ``frames`` (sorted unique int64 frame numbers) of one stream.

    ``frame_packet``: int64 ``[num_frames]``, the packet each frame comes from (``PacketTable``);
    ``keyframes``: int64 ascending frame numbers (the index's, frame 0 included). A new run starts
    where a keyframe lies after the previous wanted frame and at or before the next (a seek); it
    starts at that keyframe's packet, or at packet 0 for frame 0 (which may follow hidden packets
    the decoder needs first). It ends after the last packet that any frame shown from its
    keyframe to its last frame comes from; it also starts early enough to hold each of those
    frames' packets (a stream whose decode order is not its display order inside a group).
    """
    if not frames.size:
        return []
    key = keyframes[np.searchsorted(keyframes, frames, side="right") - 1]
    starts = np.flatnonzero(np.r_[True, key[1:] > frames[:-1]])
    ends = np.r_[starts[1:], frames.size]
    key_packets = frame_packet[keyframes]
    runs = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        k, last = int(key[a]), int(frames[b - 1])
        shown = frame_packet[k : last + 1]
        first = 0 if k == 0 else int(frame_packet[k])
        low = int(shown.min())
        if low < first:  # a frame of the run decoded before its keyframe: start at a keyframe before it
            earlier = key_packets[key_packets <= low]
            first = int(earlier.max()) if earlier.size else 0
        runs.append(Run(frames[a:b], first, int(shown.max()) + 1))
    return runs


def run_ranges(offset: np.ndarray, size: np.ndarray, runs: list[Run]) -> list[tuple[int, int]]:
    """Byte ranges ``[start, stop)`` in the member of each run's packets (one contiguous range per run)."""
    return [(int(offset[r.first]), int(offset[r.stop - 1] + size[r.stop - 1])) for r in runs]


def run_bytes(size: np.ndarray, runs: list[Run]) -> int:
    """Encoded bytes of the runs' packets: what a decode call needs, the measure for bytes read."""
    return int(sum(int(size[r.first : r.stop].sum()) for r in runs))


class _Decoder:
    """A kept PyAV decoder and its RGB converter."""

    def __init__(self, codec: str, extradata: bytes, width: int, height: int):
        last: Exception | None = None
        for name in _PREFERRED_DECODERS.get(codec, (codec,)):
            try:
                ctx: Any = av.CodecContext.create(name, "r")  # a VideoCodecContext; PyAV types it as the base
                if extradata:
                    ctx.extradata = extradata
                ctx.width, ctx.height = width, height
                ctx.thread_count = 1
                ctx.open()
                break
            except (av.error.FFmpegError, ValueError) as exc:  # this build lacks that decoder
                last = exc
        else:
            raise DecodeError(f"no FFmpeg decoder for codec {codec!r} opens: {last}")
        self.ctx, self.reformatter = ctx, VideoReformatter()


class DecoderPool:
    """Decoders kept open for a worker's life, one per (codec, extradata, width, height).

    Episodes recorded with one encoder setting share the key, so a worker opens one decoder per
    camera kind, not one per episode. At most ``size`` are kept (least recently used out first).
    A pool belongs to one process: a forked worker that finds its parent's pool starts its own.
    """

    def __init__(self, size: int = 8):
        self.size, self._pid = size, os.getpid()
        self._decoders: OrderedDict[tuple, _Decoder] = OrderedDict()
        self._inherited: list[OrderedDict] = []
        self.opens = 0

    def get(self, codec: str, extradata: bytes, width: int, height: int) -> tuple[_Decoder, bool]:
        """The kept decoder for this key (opened when missing) and whether it was opened now."""
        if os.getpid() != self._pid:  # forked: the parent's decoders are its own
            # Never freed here: freeing FFmpeg objects whose threads live only in the parent waits
            # for them forever (swscale's slice threads, a decoder's frame threads).
            self._inherited.append(self._decoders)
            self._decoders, self._pid = OrderedDict(), os.getpid()
        key = (codec, extradata, width, height)
        decoder = self._decoders.get(key)
        if decoder is not None:
            self._decoders.move_to_end(key)
            return decoder, False
        decoder = _Decoder(codec, extradata, width, height)
        self.opens += 1
        self._decoders[key] = decoder
        while len(self._decoders) > self.size:
            self._decoders.popitem(last=False)
        return decoder, True

    def discard(self, codec: str, extradata: bytes, width: int, height: int) -> None:
        """Forget a decoder (after an error its state is not trusted)."""
        self._decoders.pop((codec, extradata, width, height), None)


POOL = DecoderPool()


def decode_runs(
    pieces: list[bytes],
    starts: list[int],
    runs: list[Run],
    offset: np.ndarray,
    size: np.ndarray,
    crc32: np.ndarray,
    frame: np.ndarray,
    pts: np.ndarray,
    *,
    keyframes: np.ndarray | None = None,
    codec: str,
    extradata: bytes,
    width: int,
    height: int,
    where: str,
    post=None,
    max_bytes: int = 256 << 20,
    pool: DecoderPool | None = None,
    alloc=None,
    pictures: bool = False,
) -> tuple[PacketFrames, bool]:
    """Decode the ``runs`` of one stream from their fetched bytes: uint8 RGB frames after ``post`` (``PacketFrames``).

    ``pieces[i]``: the bytes of run ``i``'s range, which starts at byte ``starts[i]`` of the member;
    ``offset``, ``size``, ``crc32``, ``frame``: the stream's packet table (``PacketTable``);
    ``pts``: int64 ``[num_frames]``, the frame table's pts (the packets are given them, and each
    decoded frame is identified by its own); ``keyframes``: int64, the stream's keyframe numbers
    (``WindowIndex.keyframes_of``): their packets are flagged as key packets, as a demuxer flags
    them (decoders read the flag: FFmpeg's PNG decoder blends a packet not flagged key onto the
    previous picture). Default: only each run's first packet. Frames come out in the runs' order, which is the
    sorted order of the frames asked for. At most ``max_bytes`` of RGB frames are held before
    ``post`` runs on them (consecutive parts, as ``stream.decode.decode`` splits its calls).
    ``alloc(shape)``: where a frame without ``post`` is written (``Store.alloc``: reused tensors;
    default: new ones). ``pictures`` (without ``post``): return each frame as the decoder's
    ``Picture``, converted to RGB only when a window takes it (``Store.stack``).

    Returns ``(PacketFrames, opened)``: ``opened`` tells whether a decoder was opened for this call.

    Raises:
        DecodeError: a packet's CRC-32 differs from the index's, the decoder fails, or a wanted
            frame does not come out exactly once with its pts; ``where`` (episode key and camera)
            is in the message.
    """
    pool = POOL if pool is None else pool  # the worker's (``DecoderPool``)
    decoder, opened = pool.get(codec, extradata, width, height)
    key = np.zeros(size.shape, dtype=bool)
    if keyframes is None:
        key[[r.first for r in runs]] = True
    else:
        key[np.flatnonzero(np.isin(frame, keyframes))] = True
    table = (offset, size, crc32, frame, pts, key)
    total = sum(r.frames.size for r in runs)
    try:
        if post is None and pictures:
            nbytes = 0
            kept: list = []
            for picture in _decoded(decoder, runs, pieces, starts, table, where):
                nbytes = nbytes or picture_bytes(picture.format.name, width, height)
                kept.append(Picture(picture, decoder.reformatter, nbytes))
            return PacketFrames(kept, 1, 0.0), opened
        if post is None:  # each frame converted once, into its own CHW tensor
            single: list[torch.Tensor] = []
            for picture in _decoded(decoder, runs, pieces, starts, table, where):
                out = (
                    alloc((3, height, width))
                    if alloc is not None
                    else torch.empty((3, height, width), dtype=torch.uint8)
                )
                single.append(_write_planar(decoder.reformatter, picture, out))
            return PacketFrames(single, 1, 0.0), opened
        # Consecutive parts of at most max_bytes of RGB frames, each post-processed before the next.
        per_call = max(1, max_bytes // max(3 * height * width, 1))
        parts: list[torch.Tensor] = []
        post_s, buf, filled = 0.0, None, 0
        reformat = decoder.reformatter.reformat
        for i, picture in enumerate(_decoded(decoder, runs, pieces, starts, table, where)):
            # PyAV's array views the converted frame's buffer, freed (and reused by the next
            # conversion) once that frame object goes: copied into the batch before then.
            rgb = reformat(picture, format="rgb24", **_ONE_THREAD).to_ndarray()
            if buf is None:
                buf, filled = np.empty((min(per_call, total - i), height, width, 3), dtype=np.uint8), 0
            buf[filled] = rgb
            filled += 1
            if filled == buf.shape[0]:
                t = time.perf_counter()
                parts.append(post(torch.from_numpy(buf).permute(0, 3, 1, 2)))
                post_s += time.perf_counter() - t
                buf = None
    except DecodeError:
        pool.discard(codec, extradata, width, height)
        raise
    except Exception as exc:  # PyAV raises FFmpegError/ValueError by case
        pool.discard(codec, extradata, width, height)
        if from_user_code(exc):  # the post-processing hook's: the caller's, not a damaged video
            raise
        asked = np.concatenate([r.frames for r in runs]) if runs else np.zeros(0, np.int64)
        raise DecodeError(f"{where}: decoding frames {asked[:8].tolist()}... failed: {exc}") from exc
    if not parts:
        return PacketFrames(torch.empty((0, 3, height, width), dtype=torch.uint8), 0, 0.0), opened
    batch = parts[0] if len(parts) == 1 else torch.cat(parts)
    return PacketFrames(batch, len(parts), post_s), opened


# The RGB channel of each plane of swscale's planar RGB (``gbrp``): its planes are G, B, R.
_GBRP_CHANNEL = (1, 2, 0)


def _write_planar(reformatter: VideoReformatter, picture: av.VideoFrame, out: torch.Tensor) -> torch.Tensor:
    """Convert a decoded 8-bit ``picture`` to RGB into ``out`` (``[3, H, W]``, contiguous); returns ``out``.

    ``out`` is uint8, or a float dtype numpy has (float16/32/64: the values 0..255 cast, unscaled).

    swscale converts to its planar RGB (``gbrp``) and each plane is copied into its channel: the same
    values as its packed ``rgb24`` conversion (torchcodec's) permuted to CHW (tests/test_packets.py
    and tests/test_stream_matrix.py compare them pixel for pixel), at a third of the cost here (the
    packed array's HWC to CHW permute is a strided copy; 0.14 against 0.38 ms at 640x480).
    """
    planar = reformatter.reformat(picture, format="gbrp", **_ONE_THREAD)
    h, w = out.shape[1], out.shape[2]
    target = out.numpy()
    for channel, plane in zip(_GBRP_CHANNEL, planar.planes, strict=True):
        target[channel] = np.frombuffer(memoryview(plane), np.uint8).reshape(h, plane.line_size)[:, :w]
    return out


@functools.lru_cache(maxsize=64)
def picture_bytes(pix_fmt: str, width: int, height: int) -> int:
    """Bytes a kept decoded picture of this format and size holds (int): its planes at sizes aligned to 128.

    Decoders allocate pictures padded past the frame (libdav1d aligns both sides to 128 pixels; a
    640x480 yuv420p picture held measured 488 kB against 461 kB of pixels): this bounds that.
    """
    aligned = av.VideoFrame(-(-width // 128) * 128, -(-height // 128) * 128, pix_fmt)
    return int(sum(p.buffer_size for p in aligned.planes))


class Picture:
    """A decoded frame kept in its decoder's pixel format (``av.VideoFrame``) until a window needs its RGB.

    ``nbytes``: what it holds (``picture_bytes``); ``shape``: ``(3, H, W)`` of its RGB. Caching
    pictures rather than their RGB holds half the bytes per frame for 4:2:0 video (1.5 against 3
    bytes per pixel), so twice the frames fit a cache; each window converts its frames
    (``write``) into its own stack, which the RGB cache copied into it anyway.
    """

    __slots__ = ("frame", "nbytes", "reformatter", "shape")

    def __init__(self, frame: av.VideoFrame, reformatter: VideoReformatter, nbytes: int):
        self.frame, self.reformatter, self.nbytes = frame, reformatter, nbytes
        self.shape = (3, frame.height, frame.width)

    def write(self, out: torch.Tensor) -> torch.Tensor:
        """Its RGB written into ``out`` (uint8 ``[3, H, W]``, contiguous): ``_write_planar``; returns ``out``."""
        return _write_planar(self.reformatter, self.frame, out)


def _decoded(decoder: _Decoder, runs: list[Run], pieces: list[bytes], starts: list[int], table: tuple, where: str):
    """The wanted frames of ``runs``, in order, as the decoder's ``av.VideoFrame`` pictures (its pixel format).

    ``table``: (offset, size, crc32, frame, pts, key) as ``decode_runs`` takes them (``key``: bool
    per packet, the key-packet flag). Per run: every packet
    checked by CRC-32 and fed in its own zero-padded FFmpeg buffer (``av_new_packet``: bitstream
    readers may read into the padding, which must not be other memory), then the decoder drained
    and flushed. A decoder emits frames in presentation order, so the wanted ones must come out in
    the order asked, each once.

    Raises:
        DecodeError: a damaged packet, a wanted frame out of order or twice, or one that never came out.
    """
    offset, size, crc32, frame, pts, key = table
    ctx = decoder.ctx
    for run, data, start in zip(runs, pieces, starts, strict=True):
        wanted = {int(pts[f]): i for i, f in enumerate(run.frames.tolist())}
        done = 0
        for p in range(run.first, run.stop + 1):  # the last step drains the decoder
            if p == run.stop:
                packet = None
            else:
                a = int(offset[p]) - start
                payload = data[a : a + int(size[p])]
                if zlib.crc32(payload) != int(crc32[p]):
                    raise DecodeError(f"{where}: packet {p} does not match the index's CRC-32: its bytes are damaged")
                packet = av.Packet(len(payload))
                memoryview(packet)[:] = payload
                packet.is_keyframe = bool(key[p])
                if frame[p] >= 0:
                    packet.pts = int(pts[frame[p]])
            for f in ctx.decode(packet):
                i = wanted.get(f.pts)
                if i is None:
                    continue  # a frame the run decodes on the way (lead-in, hidden, or between)
                if i != done:
                    raise DecodeError(f"{where}: the decoder returned pts {f.pts} out of order or twice")
                done += 1
                yield f
        ctx.flush_buffers()
        if done < run.frames.size:
            f = int(run.frames[done])
            raise DecodeError(
                f"{where}: frame {f} (pts {int(pts[f])}) did not come out of packets {run.first}-{run.stop - 1}"
            )
