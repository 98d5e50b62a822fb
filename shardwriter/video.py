"""Video work done at write time.

Frame tables, the check that a decoder agrees with them, segment cuts by stream copy, optional
re-encode.

Frame tables describe the frames a decoder **displays**: they are built from a full decode with
PyAV (FFmpeg), so edit lists, discard flags, B-frame reordering, negative start pts, header frame
counts that lie and truncated tails are all resolved by FFmpeg itself, not by a model of the
container. Frame ``i`` is the ``i``-th frame the decoder outputs (ascending pts). Because PyAV and
torchcodec may link different FFmpeg versions, ``check_frames`` then decodes every frame the way the
reader does (torchcodec with the table as ``custom_frame_mappings``: ``epishard.format.decoder``,
the decoder glue writer and reader share) and compares.

That is the ``full`` check level (``epishard.format.manifest.CHECK_LEVELS``). ``fast`` builds the same table from the
container (``scan``: the packets FFmpeg's demuxer does not flag as discarded, i.e. outside the edit
list, in pts order) and vouches for it with a few decodes in the same pass; ``off`` trusts the scan.

Internal: import from ``epishard.shardwriter``.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import io
import json
import multiprocessing
import os
import zlib
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import av
import numpy as np

from epishard.format import decoder
from epishard.format.decoder import open_decoder
from epishard.format.errors import VideoError
from epishard.format.storage import RemoteFile

from .errors import ConversionError

__all__ = [
    "NO_PACKETS",
    "CodecNotCopied",
    "FrameTimingError",
    "ReencodeSpec",
    "StreamEncoder",
    "VideoProbe",
    "VideoSource",
    "check_frames",
    "cut",
    "encode",
    "frame_at_time",
    "frame_stream",
    "frame_table",
    "packet_table",
    "probe",
    "reencode",
    "resize",
    "restamp",
    "restamp_reason",
    "scan",
]

VideoSource = bytes | str | RemoteFile  # encoded file bytes, a local path, or a file behind a URL


@dataclass(frozen=True)
class VideoProbe:
    """The frames a decoder displays from one video stream, in presentation order.

    ``pts``, ``duration``: int64 ``[num_frames]`` in units of ``time_base`` (seconds per tick), one
    entry per frame the decoder outputs (frames hidden by an edit list or discard flags are not
    frames). ``keyframes``: int32 ascending frame numbers where decoding can start: frames whose
    packet the demuxer flags as a keyframe, and always frame 0 (a seek to its pts lands on the
    demuxer's keyframe at or before it, which may be a hidden one). ``packet_pts``, ``packet_key``:
    int64 pts and bool keyframe flag of every packet, in file (decode) order, hidden ones included.
    ``width``, ``height``: size of the frames a decoder returns, after the stream's rotation
    (``rotation``, degrees counter-clockwise, from its display matrix). ``stream_index``: the
    container stream holding the frames. ``container``: the names of the FFmpeg demuxer that read
    the file (e.g. ``mov,mp4,m4a,3gp,3g2,mj2``).
    """

    codec: str
    width: int
    height: int
    pix_fmt: str
    time_base: Fraction
    pts: np.ndarray
    duration: np.ndarray
    keyframes: np.ndarray
    packet_pts: np.ndarray
    packet_key: np.ndarray
    average_fps: float
    stream_index: int = 0
    rotation: int = 0
    disagreement: str | None = None  # scan(vouch=True): what its decodes found against the table
    container: str = ""  # FFmpeg's demuxer name(s), comma-separated; "": not recorded (``restamp_reason``)

    @property
    def num_frames(self) -> int:
        """Frames the decoder displays (rows of the frame table)."""
        return int(self.pts.shape[0])

    def seconds(self, frames: np.ndarray) -> np.ndarray:
        """Presentation time in seconds of the given frame numbers (float64)."""
        return self.pts[frames].astype(np.float64) * float(self.time_base)

    @functools.cached_property
    def ascending(self) -> bool:
        """Whether ``pts`` never decreases (computed once per probe): a time is then found by binary search."""
        return bool(self.pts.size > 0 and np.all(self.pts[1:] >= self.pts[:-1]))

    @functools.cached_property
    def packet_lookup(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Packets by pts (computed once per probe, so a cut costs the same whatever its file holds).

        Returns (keyframe packets' pts, ascending; per entry: the last keyframe packet, in decode
        order, whose pts is at most that; every packet's pts, ascending; their packet numbers).
        """
        keys = np.flatnonzero(self.packet_key)
        by_pts = np.argsort(self.packet_pts[keys], kind="stable")
        order = np.argsort(self.packet_pts, kind="stable")
        return (
            self.packet_pts[keys][by_pts],
            np.maximum.accumulate(keys[by_pts]) if keys.size else keys,
            self.packet_pts[order],
            order,
        )

    def keyflags(self) -> np.ndarray:
        """Bool ``[num_frames]``: True at keyframes."""
        flags = np.zeros(self.num_frames, dtype=bool)
        flags[self.keyframes] = True
        return flags


@contextlib.contextmanager
def _readable(source: VideoSource):
    """Yield what FFmpeg (PyAV) and torchcodec open for ``source``.

    A local path as it is, bytes as a ``BytesIO``, a ``RemoteFile`` as a seekable file of range
    requests (at most ``storage.READ_BLOCK_BYTES`` read ahead: memory stays bounded whatever the
    file's size).
    """
    if isinstance(source, str):
        yield source
        return
    with io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source.open() as f:
        yield f


@contextlib.contextmanager
def _open(source: VideoSource):
    with _readable(source) as readable, av.open(readable, "r") as container:
        yield container


_KEPT_OPEN = 2  # source files whose containers a process keeps open between cuts
_kept: OrderedDict[tuple, tuple[contextlib.ExitStack, av.container.InputContainer]] = OrderedDict()
_kept_pid: list[int] = [os.getpid()]
_kept_inherited: list[OrderedDict] = []  # a forked process's copy of its parent's: never closed there


@contextlib.contextmanager
def _kept_open(source: VideoSource):
    """``_open``, but the container of a file (a path or ``RemoteFile``) stays open for the next cut.

    Episodes of a LeRobot v3.0 file are cut one after the other from the same file: opening it
    parses its whole index (MP4: every sample's entry; remotely: range requests for it), so
    opening it per episode made an episode's cost grow with the file. The ``_KEPT_OPEN`` most
    recent files stay open, per process, keyed by path, size and modification time (a file
    rewritten in place is opened anew); a container whose use raised is closed, not kept.
    """
    if isinstance(source, (bytes, bytearray)):
        with _open(source) as container:
            yield container
        return
    if _kept_pid[0] != os.getpid():  # forked: the parent's containers are its own
        _kept_inherited.append(OrderedDict(_kept))
        _kept.clear()
        _kept_pid[0] = os.getpid()
    if isinstance(source, RemoteFile):
        key: tuple = ("remote", source.url, source.known_size)
    else:
        st = os.stat(source)
        key = ("local", source, st.st_size, st.st_mtime_ns)
    entry = _kept.pop(key, None)
    if entry is None:
        stack = contextlib.ExitStack()
        try:
            entry = (stack, stack.enter_context(_open(source)))
        except BaseException:
            stack.close()
            raise
    try:
        yield entry[1]
    except BaseException:
        entry[0].close()
        raise
    _kept[key] = entry
    while len(_kept) > _KEPT_OPEN:
        _kept.popitem(last=False)[1][0].close()


def frame_stream(container, stream_index: int | None = None) -> av.video.stream.VideoStream:
    """The video stream that holds the frames (``epishard.format.decoder.frame_stream``), for the writer.

    Stream ``stream_index`` when given (None or -1: not recorded); else, attached pictures (cover
    art) skipped, FFmpeg's best video stream, else the first.

    Raises:
        ConversionError(kind="unreadable_video"): no video stream other than attached pictures.
    """
    try:
        return decoder.frame_stream(container, stream_index)
    except VideoError as exc:
        raise ConversionError(str(exc), kind="unreadable_video") from None


def _decode_all(stream, container) -> tuple[list, list, int]:
    """(packet rows (pts, key, duration) in decode order, frame rows (pts, duration), rotation)."""
    packets: list[tuple[int, bool, int]] = []
    frames: list[tuple[int, int]] = []
    rotation = 0
    for packet in container.demux(stream):
        if packet.size:
            pts = packet.pts if packet.pts is not None else packet.dts
            if pts is not None:
                packets.append((pts, packet.is_keyframe, packet.duration or 0))
        for frame in packet.decode():
            pts = frame.pts if frame.pts is not None else frame.dts
            if pts is None:
                raise FrameTimingError(f"decoded frame {len(frames)} has neither pts nor dts", kind="unreadable_video")
            if not frames:
                rotation = round(frame.rotation or 0)
            frames.append((pts, frame.duration or 0))
    return packets, frames, rotation


class FrameTimingError(ConversionError):
    """The decoded frames do not carry their presentation times.

    A frame without pts or dts (a raw stream), or frames shown in another order than their pts
    (decode-order timestamps: a muxer fed packets without pts). ``restamp`` makes a copy timed in
    the order the decoder shows the frames.
    """


def _decoded_probe(source: VideoSource) -> VideoProbe:
    """Decode every frame of the file's frame stream (see ``frame_stream``) and return its tables.

    Costs one full decode (no colour conversion). Durations: the frame's, else its packet's, else
    the gap to the next frame's pts.

    Raises:
        ConversionError(kind="unreadable_video"): the container cannot be opened, demuxed or
            decoded, has no stream holding frames, or its decoded frames' pts do not increase.
    """
    try:
        with _open(source) as container:
            stream = frame_stream(container)
            stream.thread_type = "AUTO"  # frame threads: same frames, sooner
            packets, frames, rotation = _decode_all(stream, container)
            fields = _stream_fields(stream)
    except ConversionError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise ConversionError(f"cannot demux or decode video: {exc}", kind="unreadable_video") from exc
    if not frames:
        raise ConversionError(
            f"video stream {fields['stream_index']} holds no frames ({len(packets)} packets, none displayed)",
            kind="unreadable_video",
        )
    pts = np.asarray([f[0] for f in frames], dtype=np.int64)
    bad = np.flatnonzero(np.diff(pts) <= 0)
    if bad.size:
        i = int(bad[0]) + 1
        raise FrameTimingError(
            f"decoded frame {i} has pts {pts[i]} after pts {pts[i - 1]} (pts must increase)", kind="unreadable_video"
        )
    packet_pts = np.asarray([p[0] for p in packets], dtype=np.int64)
    packet_key = np.asarray([p[1] for p in packets], dtype=bool)
    by_pts = {int(p): (bool(k), int(d)) for p, k, d in packets}
    duration = np.asarray(
        [f[1] or by_pts.get(int(p), (False, 0))[1] for p, f in zip(pts, frames, strict=False)], dtype=np.int64
    )
    gaps = np.diff(pts)
    fill = np.append(gaps, gaps[-1] if gaps.size else 1)
    duration = np.where(duration > 0, duration, fill)
    keyflags = np.asarray([by_pts.get(int(p), (False, 0))[0] for p in pts], dtype=bool)
    keyflags[0] = True
    return _video_probe(
        fields, rotation, keyflags, pts=pts, duration=duration, packet_pts=packet_pts, packet_key=packet_key
    )


def probe(source: VideoSource, decode: bool = True) -> VideoProbe:
    """The frame table of ``source``'s frame stream: by a full decode (``decode=True``), else by ``scan``.

    Raises ``ConversionError(kind="unreadable_video")`` as ``_decoded_probe`` and ``scan`` do.
    """
    return _decoded_probe(source) if decode else scan(source)


def frame_table(source: VideoSource, level: str) -> VideoProbe:
    """The frame table of a video to store, made as check ``level`` (``manifest.CHECK_LEVELS``) says.

    ``full``: ``probe`` (every frame decoded); ``fast``: ``scan(vouch=True)``; ``off``: ``scan``.
    """
    return _decoded_probe(source) if level == "full" else scan(source, vouch=level == "fast")


# FFmpeg demuxer names (``container.format.name`` lists them comma-separated) of the containers
# that store a presentation timestamp on every packet and seek by an index of them: ISO-BMFF
# (MP4/MOV) and Matroska/WebM. A video in any other container is stored as a ``restamp`` copy.
_TIMESTAMPED_FORMATS = frozenset({"mov", "mp4", "m4a", "3gp", "3g2", "mj2", "matroska", "webm"})


def restamp_reason(info: VideoProbe) -> str | None:
    """Why the video ``info`` describes is stored as a ``restamp`` copy rather than as it is, or None.

    Its container (``info.container``) is not one of ``_TIMESTAMPED_FORMATS``: AVI stores no
    presentation timestamps (FFmpeg infers them, differently from version to version, so the
    reader's decoder may number the frames otherwise than the writer's), a raw stream none at all,
    MPEG-TS, MPEG-PS and FLV store them per packet only optionally and seek by scanning for them,
    which lands on another keyframe than the table's when B-frames put a keyframe's pts after its
    dts.
    """
    if not info.container or _TIMESTAMPED_FORMATS.intersection(info.container.split(",")):
        return None  # "": a probe that does not record its container
    return f"its container ({info.container}) does not store a presentation timestamp on every packet"


# AVFMT_NOTIMESTAMPS: the demuxer's format stores no timestamps at all (raw elementary streams).
_NO_TIMESTAMPS_FLAG = 0x0080


# Containers ``restamp`` writes, first choice first: Matroska holds codecs MP4 does not (with
# millisecond timestamps). Neither takes some of AVI's intra-only codecs (HuffYUV, raw video).
_RESTAMP_FORMATS = ("mp4", "matroska")


def restamp(source: VideoSource, fps: float | None = None) -> bytes:
    """Stream-copy the frame stream (``frame_stream``) into an MP4 timed in the order the decoder shows it.

    Every packet is copied as it is, in decode order (nothing is re-encoded); one full decode with
    PyAV says which packet each displayed frame comes from (FFmpeg's ``copy_opaque``). The ``k``-th
    displayed frame gets the ``k``-th smallest timestamp of the stream's timeline: its packets' pts
    (else dts) as FFmpeg's demuxer gives them; in AVI, which stores only the decode timeline, their
    dts; ``k`` periods of ``fps`` (frames per second) where they do not give every packet a time of
    its own (a raw stream has none; concatenated MPEG-TS recordings restart them). For a container
    without presentation timestamps or with decode-order ones (a muxer fed packets without pts),
    these are the times a player shows. A packet's dts is the ``q``-th smallest
    timestamp for the ``q``-th packet, less the shift that puts no dts after its pts. The copy
    stores a pts on every packet, so its frame table is read from it like any MP4's, and every
    FFmpeg version decodes it to the same numbered frames: frame ``k`` of the copy is the ``k``-th
    frame the source displays. Only the frame stream is copied. A codec the MP4 muxer does not take
    goes into Matroska instead (``_RESTAMP_FORMATS``).

    Raises:
        ConversionError(kind="unreadable_video"): the file does not demux or decode, a packet has
            neither pts nor dts or two packets have one timestamp (and no ``fps`` is given), or
            packets and displayed frames are not one to one (a packet that shows no frame, or
            several: no timestamps can say that).
        CodecNotCopied (a ConversionError, kind "unreadable_video"): no container of
            ``_RESTAMP_FORMATS`` takes the stream's codec.
    """
    refused = []
    for fmt in _RESTAMP_FORMATS:
        try:
            return _restamp(source, fps, fmt)
        except _MuxRefused as exc:
            refused.append(f"{fmt}: {exc}")
    raise CodecNotCopied(f"no container takes the stream's codec ({'; '.join(refused)})", kind="unreadable_video")


class CodecNotCopied(ConversionError):
    """``restamp``: no container of ``_RESTAMP_FORMATS`` takes the stream's codec."""


class _MuxRefused(Exception):
    """The muxer of ``restamp``'s output format refused the stream (its codec, most likely)."""


def _restamp(source: VideoSource, fps: float | None, fmt: str) -> bytes:
    """``restamp`` into the container ``fmt`` (an FFmpeg muxer name); ``_MuxRefused`` where its muxer refuses."""
    packets: list = []
    order: list = []  # the packet each displayed frame comes from, in display order
    try:
        with _open(source) as src:
            stream = frame_stream(src)
            ctx = stream.codec_context
            ctx.copy_opaque = True
            for packet in src.demux(stream):
                if packet.size:
                    packet.opaque = len(packets)
                    packets.append(packet)
                order += [frame.opaque for frame in packet.decode()]
            time_base = stream.time_base
            if "avi" in str(src.format.name).split(","):
                times = [p.dts for p in packets]
            else:
                times = [p.pts if p.pts is not None else p.dts for p in packets]
            untimed = int(src.format.flags) & _NO_TIMESTAMPS_FLAG or None in times or len(set(times)) < len(times)
            if untimed and fps:
                times, time_base = list(range(len(packets))), 1 / Fraction(fps).limit_denominator(1001000)
            if any(t is None for t in times):
                q = times.index(None)
                raise ConversionError(f"packet {q} has neither pts nor dts", kind="unreadable_video")
            times.sort()
            same = [q for q in range(1, len(times)) if times[q] == times[q - 1]]
            if same:
                raise ConversionError(
                    f"packets of the frame stream share timestamp {times[same[0]]}: the display times "
                    "cannot be told apart",
                    kind="unreadable_video",
                )
            if not packets:
                raise ConversionError("the frame stream holds no packets", kind="unreadable_video")
            if sorted(o for o in order if o is not None) != list(range(len(packets))) or None in order:
                raise ConversionError(
                    f"{len(packets)} packets decode to {len(order)} displayed frames, not one frame each: "
                    "the frames cannot be given timestamps",
                    kind="unreadable_video",
                )
            pts = [0] * len(packets)
            for k, q in enumerate(order):
                pts[q] = times[k]
            shift = max(0, *(times[q] - pts[q] for q in range(len(packets))))
            out = io.BytesIO()
            try:
                with av.open(out, "w", format=fmt, options={"fflags": "+bitexact"}) as dst:
                    out_stream = dst.add_stream_from_template(stream, opaque=True)
                    out_stream.time_base = time_base
                    for q, packet in enumerate(packets):
                        packet.pts, packet.dts = pts[q], times[q] - shift
                        packet.time_base = time_base
                        packet.stream = out_stream
                        dst.mux(packet)
            except (av.error.FFmpegError, ValueError) as exc:
                raise _MuxRefused(str(exc)) from exc
    except (ConversionError, _MuxRefused):
        raise
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise ConversionError(f"cannot demux, decode or copy the video: {exc}", kind="unreadable_video") from exc
    return out.getvalue()


# Keyframes scan(vouch=True) decodes at most, evenly spread (first and last kept).
_FAST_CHECK_KEYFRAMES = 16


def scan(source: VideoSource, vouch: bool = False) -> VideoProbe:
    """The frame table from the container: demux every packet, decode only what vouches for it.

    The displayed frames are the packets FFmpeg's demuxer does not flag as discarded (MP4/MOV edit
    lists mark hidden ones that way), in pts order: the table ``probe`` builds by decoding every
    frame, for every video kind of the test suite and every file of ``../shared``, at a fraction of
    the cost. The first frame is decoded (it gives the rotation and must carry the smallest shown
    pts). Where the container does not fit that model (a packet without pts or flagged corrupt, two
    shown packets with one pts, a first frame elsewhere, no frame at all, a demuxer error), this
    falls back to ``probe``'s full decode, which also raises its errors; with ``vouch`` that table's
    ``disagreement`` then names the misfit, so level ``fast`` checks it as ``full`` does.

    ``vouch`` (check level ``fast``): also decode, in the same pass, each keyframe packet alone (at
    most ``_FAST_CHECK_KEYFRAMES``, evenly spread) and the last group of pictures from its keyframe
    packet; each keyframe must decode to its own pts and the last group to exactly the table's last
    frames, in pts order (a truncated, longer or reordered tail shows there, and timestamps in
    decode order rather than presentation order). What they find is returned in
    ``disagreement`` (None: they agree). They decode with PyAV's FFmpeg, not the reader's
    torchcodec: ``check_frames`` (level ``full``) checks through the reader's decoder.
    """
    try:
        with _open(source) as container:
            stream = frame_stream(container)
            ctx = stream.codec_context
            ctx.thread_count = 1  # a few frames are decoded: a thread pool would cost more than they do
            rows: list[tuple[int, bool, int, bool]] = []
            keys: list = []  # keyframe packets (vouch)
            tail: list = []  # packets from the last keyframe packet on (vouch)
            first_pts, rotation = None, 0
            for packet in container.demux(stream):
                if not packet.size:
                    continue
                pts = packet.pts if packet.pts is not None else packet.dts
                if pts is None or packet.is_corrupt:
                    what = "has neither pts nor dts" if pts is None else "is flagged corrupt"
                    return _decoded_fallback(source, vouch, f"packet {len(rows)} {what}")
                rows.append((pts, packet.is_keyframe, packet.duration or 0, packet.is_discard))
                if vouch:
                    if packet.is_keyframe:
                        keys.append(packet)
                        tail = []
                    tail.append(packet)
                if first_pts is None:  # decode until the first frame comes out (B-frames delay it)
                    for frame in packet.decode():
                        first_pts, rotation = _frame_pts(frame), round(frame.rotation or 0)
                        break
            if first_pts is None and rows:
                for frame in ctx.decode(None):
                    first_pts, rotation = _frame_pts(frame), round(frame.rotation or 0)
                    break
            fields = _stream_fields(stream)
            table = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
            model = _packet_model(table, first_pts)
            if model is None:
                return _decoded_fallback(source, vouch, "the packets' pts do not tell the displayed frames")
            pts, duration, keyflags, packet_pts, packet_key = model
            disagreement = (
                (_vouch(ctx, keys, tail, pts) or _decode_order_hint(ctx, table) or _jump_hint(ctx, table))
                if vouch
                else None
            )
    except ConversionError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        # raises the decode's own error, or finds what the scan could not
        return _decoded_fallback(source, vouch, f"demuxing failed: {exc}")
    tables = dict(pts=pts, duration=duration, packet_pts=packet_pts, packet_key=packet_key)
    return _video_probe(fields, rotation, keyflags, disagreement=disagreement, **tables)


def _decoded_fallback(source: VideoSource, vouch: bool, reason: str) -> VideoProbe:
    """``scan``'s table where the container does not tell it (``reason``): ``probe``'s full decode.

    With ``vouch`` its ``disagreement`` says so: that table comes from PyAV's decode, which no
    decode of the reader's vouched for, so check level ``fast`` checks it as ``full`` does.
    """
    info = _decoded_probe(source)
    return replace(info, disagreement=f"the container does not tell the frames ({reason})") if vouch else info


def _stream_fields(stream) -> dict:
    """The ``VideoProbe`` fields read from the open frame ``stream`` (PyAV), tables aside.

    Codec, stored size, pixel format, time base, average frame rate (frames per second; 0.0 when
    the container gives none) and stream index.

    Raises ``ConversionError(kind="unreadable_video")``: the stream has no time base (FFmpeg gives
    every stream one; PyAV types it optional).
    """
    ctx = stream.codec_context
    if stream.time_base is None:
        raise ConversionError("the frame stream has no time base", kind="unreadable_video")
    return dict(
        codec=ctx.codec.canonical_name,
        width=int(ctx.width),
        height=int(ctx.height),
        pix_fmt=ctx.format.name if ctx.format else "",
        time_base=Fraction(stream.time_base.numerator, stream.time_base.denominator),
        average_fps=float(stream.average_rate) if stream.average_rate else 0.0,
        stream_index=int(stream.index),
        container=str(stream.container.format.name),
    )


def _video_probe(fields: dict, rotation: int, keyflags: np.ndarray, **tables) -> VideoProbe:
    """The ``VideoProbe`` of a stream's ``fields`` (``_stream_fields``) and frame ``tables``.

    ``rotation``: degrees counter-clockwise of the first frame's display matrix; a quarter turn swaps
    the stored width and height (the reader returns frames upright). ``keyflags``: bool
    ``[num_frames]``, True where decoding can start.
    """
    width, height = fields["width"], fields["height"]
    if rotation % 180:
        width, height = height, width
    keyframes = np.flatnonzero(keyflags).astype(np.int32)
    return VideoProbe(
        **{**fields, "width": width, "height": height}, keyframes=keyframes, rotation=rotation % 360, **tables
    )


def _frame_pts(frame) -> int | None:
    return frame.pts if frame.pts is not None else frame.dts


def _packet_model(rows: np.ndarray, first_pts: int | None):
    """The table ``scan`` reads from packet ``rows``, or None where they do not make one.

    ``rows``: int64 ``[packets, 4]`` (pts, key, duration, discard) in decode order. Returns
    (pts, duration, keyflags, packet_pts, packet_key).
    """
    packet_pts, packet_key, packet_duration, discard = (rows[:, c] for c in range(4))
    shown = discard == 0
    order = np.argsort(packet_pts[shown], kind="stable")
    pts = packet_pts[shown][order]
    if not pts.size or first_pts != pts[0] or np.any(np.diff(pts) <= 0):
        return None
    gaps = np.diff(pts)
    duration = packet_duration[shown][order]
    duration = np.where(duration > 0, duration, np.append(gaps, gaps[-1] if gaps.size else 1))
    keyflags = np.isin(pts, packet_pts[packet_key == 1])
    keyflags[0] = True
    return pts, duration, keyflags, packet_pts, packet_key.astype(bool)


def _decode_order_hint(ctx, rows: np.ndarray) -> str | None:
    """Why the packets' pts may be decode-order timestamps, or None.

    The codec reorders frames (``has_b_frames``: the stream's headers declare a reorder delay, as
    with B-frames) yet the shown packets' pts (``rows`` as in ``_packet_model``) increase in decode
    order. Files that truly reorder have a packet whose pts is below an earlier one's (every
    B-frame); a muxer fed packets without pts writes such increasing ones, and the few decodes of
    ``_vouch`` miss that where no group they decode reorders (a last group of one keyframe).
    """
    shown = rows[rows[:, 3] == 0, 0]
    if not ctx.has_b_frames or shown.size < 2 or np.any(np.diff(shown) <= 0):
        return None
    return (
        "the codec reorders frames (B-frames) but the packets' pts increase in decode order: "
        "they may be decode-order timestamps"
    )


#: A gap between consecutive shown pts this many times the median gap is a jump (``_jump_hint``).
_JUMP_GAPS = 4


def _jump_hint(ctx, rows: np.ndarray) -> str | None:
    """Why the packets' pts may not give the decoder's display order, or None.

    Without reordering (no ``has_b_frames``) the decoder shows frames in decode order, so the shown
    packets' pts must increase in decode order. With it, a jump in the timestamps (a gap more than
    ``_JUMP_GAPS`` times the median gap: a muxer that shifted part of a stream, a recording pause)
    can move a frame past others in pts order that the decoder shows before them, in a group of
    pictures that ``_vouch``'s few decodes do not look at. Either way level ``fast`` checks the file
    as ``full`` does (a cost, not a refusal).
    """
    shown = rows[rows[:, 3] == 0, 0]
    if shown.size < 3:
        return None
    steps = np.diff(shown)
    if not ctx.has_b_frames:
        if np.any(steps <= 0):
            return "the codec does not reorder frames but the packets' pts go back in decode order"
        return None
    gaps = np.diff(np.sort(shown))
    median = float(np.median(gaps))
    if median > 0 and float(gaps.max()) > _JUMP_GAPS * median:
        jump = int(gaps.max())
        return f"the timestamps jump ({jump} after a median step of {median:g}) in a stream that reorders frames"
    return None


def _decode_alone(ctx, packets: list) -> list[int]:
    """Pts of the frames ``packets`` decode to from a flushed decoder, drained at the end."""
    ctx.flush_buffers()
    out = [_frame_pts(f) for p in packets for f in ctx.decode(p)]
    out += [_frame_pts(f) for f in ctx.decode(None)]
    ctx.flush_buffers()
    return [p for p in out if p is not None]


def _vouch(ctx, keys: list, tail: list, pts: np.ndarray) -> str | None:
    """What decoding keyframe packets alone and the last group of pictures finds against ``pts`` (see ``scan``)."""
    shown = [k for k in keys if not k.is_discard]
    if len(shown) > _FAST_CHECK_KEYFRAMES:
        shown = [shown[int(i)] for i in np.unique(np.linspace(0, len(shown) - 1, _FAST_CHECK_KEYFRAMES).round())]
    for packet in shown:
        key_pts = packet.pts if packet.pts is not None else packet.dts
        got = _decode_alone(ctx, [packet])
        if got != [key_pts]:
            frame = int(np.searchsorted(pts, key_pts))
            return f"keyframe {frame} (pts {key_pts}) decodes alone to pts {got}"
    if not tail:
        return None
    start = tail[0].pts if tail[0].pts is not None else tail[0].dts
    out = np.asarray([p for p in _decode_alone(ctx, tail) if p >= start], dtype=np.int64)
    back = np.flatnonzero(np.diff(out) <= 0)
    if back.size:  # a decoder shows frames in presentation order: these pts are not presentation times
        i = int(back[0]) + 1
        return (
            f"the last group of pictures (from pts {start}) decodes to a frame of pts {out[i]} after one of "
            f"pts {out[i - 1]}: the container's timestamps are not in the order the decoder shows the frames"
        )
    shown_pts = np.sort(out)
    want = pts[pts >= start]
    if not np.array_equal(shown_pts, want):
        first = int(np.searchsorted(pts, start))
        return (
            f"the last group of pictures (from frame {first}, pts {start}) decodes to {shown_pts.size} frames "
            f"(pts {shown_pts[:3].tolist()}..{shown_pts[-1:].tolist()}); the table lists {want.size} "
            f"(pts {want[:3].tolist()}..{want[-1:].tolist()}, {pts.size} frames in all)"
        )
    return None


_CHECK_BATCH = 32  # frames per get_frames_at call in check_frames: bounds its memory


def _decode_range(decoder, start: int, stop: int, time_base: Fraction) -> tuple[np.ndarray, list[int]]:
    """(pts ticks, CRC-32 of the pixels) of frames ``[start, stop)``, in consecutive calls."""
    ticks, crcs = [], []
    for a in range(start, stop, _CHECK_BATCH):
        batch = decoder.get_frames_at(list(range(a, min(stop, a + _CHECK_BATCH))))
        ticks.append(np.rint(batch.pts_seconds.double().numpy() / float(time_base)).astype(np.int64))
        # NCHW is a view of torchcodec's NHWC frames: hash those bytes (a CHW copy costs 50x the CRC).
        crcs += [zlib.crc32(frame.contiguous().numpy()) for frame in batch.data.permute(0, 2, 3, 1)]
    return np.concatenate(ticks), crcs


def check_frames(
    data: bytes,
    pts: np.ndarray,
    duration: np.ndarray,
    keyframe: np.ndarray,
    time_base: Fraction,
    stream_index: int | None,
) -> str | None:
    """Decode every frame through the reader's decoder (``open_decoder``) and compare it with the table.

    Two passes: all frames in order from a fresh decoder (no seek), then each keyframe's group of
    pictures from the last one to the first, so every group starts with a seek. Every access
    pattern of the reader (any sorted frame list: sequential runs, forward skips, seeks) returns
    frames one of these two passes returned, so the table is right for the reader exactly when the
    pts returned in both passes equal the table's and both passes return the same pixels (CRC-32).
    Costs two full decodes.

    Returns:
        None when they agree, else a message naming the first disagreeing frame.
    """
    n = int(pts.size)
    keys = np.flatnonzero(keyframe).tolist()
    where = "in order from the start"
    try:
        ticks, reference = _decode_range(open_decoder(data, pts, duration, keyframe, stream_index), 0, n, time_base)
        bad = np.flatnonzero(ticks != pts)
        if bad.size:
            i = int(bad[0])
            return (
                f"frame {i}: table pts {pts[i]}, the decoder returns pts {ticks[i]} decoding {where} "
                f"({n} frames in the table)"
            )
        decoder = open_decoder(data, pts, duration, keyframe, stream_index)
        for g in range(len(keys) - 1, -1, -1):
            start, stop = keys[g], keys[g + 1] if g + 1 < len(keys) else n
            where = f"after a seek to keyframe {start}"
            ticks, crcs = _decode_range(decoder, start, stop, time_base)
            for i, (t, c) in enumerate(zip(ticks, crcs, strict=False), start):
                if t != pts[i]:
                    return f"frame {i}: table pts {pts[i]}, the decoder returns pts {t} {where}"
                if c != reference[i]:
                    return f"frame {i}: decodes to other pixels {where} than decoding in order from the start"
    except Exception as exc:  # torchcodec raises RuntimeError/IndexError/ValueError by case
        return f"decoding {where} failed: {exc}"
    return None


def frame_at_time(info: VideoProbe, seconds: float, fps: float) -> int:
    """Frame number whose pts is nearest to ``seconds``; it must lie within half a frame (1/(2 fps)).

    Used once per episode and camera at write time to turn LeRobot v3.0 ``from_timestamp`` offsets
    into exact frame numbers.

    Raises:
        ValueError: no frame lies within half a frame period of ``seconds``.
    """
    if info.ascending:  # a v3.0 file of many episodes: not every frame's time is computed for each of them
        scale = float(info.time_base)
        i = bisect.bisect_left(range(info.num_frames), seconds, key=lambda c: float(info.pts[c]) * scale)
        i = min(i, info.num_frames - 1)
    else:
        i = int(np.clip(np.searchsorted(info.seconds(np.arange(info.num_frames)), seconds), 0, info.num_frames - 1))
    candidates = [c for c in (i - 1, i) if 0 <= c < info.num_frames]
    times = dict(zip(candidates, info.seconds(np.asarray(candidates, dtype=np.int64)), strict=True))
    best = min(candidates, key=lambda c: abs(times[c] - seconds))
    if abs(times[best] - seconds) > 0.5 / fps:
        raise ValueError(
            f"no frame within half a frame of t={seconds:.6f}s (nearest frame {best} at {times[best]:.6f}s)"
        )
    return best


def _cut_packets(info: VideoProbe, first: int, stop: int) -> tuple[np.ndarray, int]:
    """(mask over packets in decode order to keep, pts of the start keyframe packet)."""
    lo = int(info.pts[first])
    keys_by_pts, last_key, _, _ = info.packet_lookup
    below = int(np.searchsorted(keys_by_pts, lo, side="right"))  # keyframe packets whose pts is at most lo
    if not below:
        raise ConversionError(f"no keyframe packet at or before frame {first} (pts {lo})", kind="unreadable_video")
    p0 = int(last_key[below - 1])
    key_pts = int(info.packet_pts[p0])
    missing = set(info.pts[first:stop].tolist())
    keep = np.zeros(info.packet_pts.size, dtype=bool)
    for q in range(p0, info.packet_pts.size):
        if not missing and info.packet_key[q] and q != p0:
            break
        if info.packet_pts[q] >= key_pts:
            keep[q] = True
            missing.discard(int(info.packet_pts[q]))
    return keep, key_pts


def _timed(packets):
    """The packets that count in ``VideoProbe.packet_pts``: with data and a pts or dts."""
    return (p for p in packets if p.size and (p.pts if p.pts is not None else p.dts) is not None)


def _packets_from(src, source: VideoSource, info: VideoProbe, start: int):
    """Yield ``(q, packet)``: the frame stream's packets in decode order from packet ``start`` or earlier.

    ``q`` is the packet's index in ``info.packet_pts``; ``start`` is a keyframe.

    ``src`` (an open container of ``source``) is first seeked to that keyframe, so the packets of
    the episodes before it in a LeRobot v3.0 file are not read (remotely: not downloaded again for
    every episode). The first packet after the seek must be one whose pts occurs once in the table,
    at or before ``start``; otherwise (a demuxer that lands elsewhere) the packets are demuxed from
    the start of a freshly opened container, as without a seek.
    """
    stream = src.streams[info.stream_index]
    if start > 0:
        src.seek(int(info.packet_pts[start]), backward=True, any_frame=False, stream=stream)
        packets = _timed(src.demux(stream))
        head = next(packets, None)
        if head is not None:
            _, _, pts, order = info.packet_lookup
            value = head.pts if head.pts is not None else head.dts
            lo, hi = np.searchsorted(pts, value, side="left"), np.searchsorted(pts, value, side="right")
            if hi - lo == 1 and order[lo] <= start:  # the one packet of that pts
                yield int(order[lo]), head
                yield from enumerate(packets, int(order[lo]) + 1)
                return
    with _open(source) as fresh:
        yield from enumerate(_timed(fresh.demux(fresh.streams[info.stream_index])))


def cut(
    source: VideoSource, info: VideoProbe, first: int, stop: int, level: str = "full"
) -> tuple[bytes, VideoProbe, np.ndarray]:
    """Stream-copy the frames ``[first, stop)`` of a video into a new MP4, without re-encoding.

    The cut starts at the last keyframe packet at or before frame ``first`` (possibly one an edit
    list hides) and takes whole groups of pictures in decode order until every frame up to
    ``stop - 1`` is present, so every kept frame decodes exactly as in the source. Leading pictures
    (pts before the start keyframe) are dropped; timestamps are shifted so the cut starts at pts 0.
    The cut's frame table is made like any stored video's (``frame_table(..., level)``), and its
    displayed frames are matched to the source's by pts.

    Returns:
        (mp4 bytes, probe of the cut, source) where ``source`` is int64 ``[frames of the cut]``:
        the source frame number each frame of the cut shows, or -1 for a frame the source hides.
    """
    keep, offset = _cut_packets(info, first, stop)
    out = io.BytesIO()
    with _kept_open(source) as src, av.open(out, "w", format="mp4", options={"fflags": "+bitexact"}) as dst:
        in_stream = src.streams[info.stream_index]
        out_stream = dst.add_stream_from_template(in_stream, opaque=True)
        kept = np.flatnonzero(keep)
        for q, packet in _packets_from(src, source, info, int(kept[0])):
            if q > int(kept[-1]):
                break  # a v3.0 file holds many episodes: demux no further than this one's packets
            if not keep[q]:
                continue
            packet.pts = packet.pts - offset if packet.pts is not None else None
            if packet.dts is not None:
                packet.dts -= offset
            packet.stream = out_stream
            dst.mux(packet)
    data = out.getvalue()
    stored = frame_table(data, level)
    scale = stored.time_base / info.time_base
    wanted = [int(p * scale) + offset if (p * scale).denominator == 1 else None for p in stored.pts.tolist()]
    return data, stored, _frames_of_pts(info.pts, wanted, info.ascending or info.num_frames == 0)


def _frames_of_pts(pts: np.ndarray, wanted: list[int | None], ascending: bool | None = None) -> np.ndarray:
    """int64 ``[len(wanted)]``: the frame whose pts is each wanted pts (the last such), -1 where none or None.

    ``pts``: a probe's frame pts. Binary search when they ascend (presentation order), so a cut
    costs the same whatever the number of frames of its file (a v3.0 file of 10,000 episodes).
    ``ascending``: whether they do, when known (``VideoProbe.ascending``; None: looked at here).
    """
    values = np.asarray([-1 if p is None else p for p in wanted], dtype=np.int64)
    if ascending is None:
        ascending = not (pts.size > 1 and np.any(pts[1:] < pts[:-1]))
    if not ascending:  # not in pts order: a lookup table
        frame_of_pts = {int(p): i for i, p in enumerate(pts)}
        return np.asarray([-1 if p is None else frame_of_pts.get(p, -1) for p in wanted], dtype=np.int64)
    at = np.searchsorted(pts, values, side="right") - 1
    found = (at >= 0) & (pts[np.clip(at, 0, None)] == values) if pts.size else np.zeros(values.size, dtype=bool)
    found &= np.asarray([p is not None for p in wanted], dtype=bool)
    return np.where(found, at, -1).astype(np.int64)


@dataclass(frozen=True)
class ReencodeSpec:
    """Re-encode settings.

    ``codec`` (an FFmpeg encoder name, e.g. ``libx264``, ``libsvtav1``, ``mpeg4``), ``gop``
    (keyframe interval in frames), ``size`` (``(height, width)`` or None to keep), ``crf`` (quality
    for x264/SVT-AV1; None for the encoder's default).
    """

    codec: str = "libx264"
    gop: int = 10
    size: tuple[int, int] | None = None
    crf: int | None = 23

    def __post_init__(self):
        if self.gop < 1:
            raise ValueError(f"re-encode gop must be at least 1 frame, not {self.gop}")

    def describe(self) -> str:
        """The settings as one stable string (part of the conversion's plan digest)."""
        return "reencode:" + json.dumps(
            {"codec": self.codec, "gop": self.gop, "size": self.size, "crf": self.crf}, sort_keys=True
        )

    @classmethod
    def parse(cls, text: str) -> ReencodeSpec:
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


def reencode(source: VideoSource, info: VideoProbe, frames: np.ndarray, fps: float, spec: ReencodeSpec) -> bytes:
    """Decode the given source frames (torchcodec, frame-exact, 8-bit RGB) and encode them as a new MP4.

    ``info``: the source's probe; frames are numbered by its table (the displayed frames) and decoded
    through the reader's decoder (``open_decoder``) on its stream.
    ``frames``: int64 ``[n]`` source frame numbers, in output order. Output frame ``i`` is shown at
    ``i / fps`` seconds and every ``spec.gop``-th frame is a keyframe. A source of more than 8 bits
    per sample is reduced to 8 bits by the decode (the stored ``pix_fmt`` in the index says so).

    Raises:
        ConversionError(kind="unreadable_video"): the frames do not decode.
        ConversionError(kind="encode_failed"): the encoder refused the frames (see ``encode``).
    """
    try:
        with _readable(source) as readable:  # a file is decoded where it is, not read into memory
            decoder = open_decoder(readable, info.pts, info.duration, info.keyflags(), info.stream_index)
            pixels = decoder.get_frames_at(frames.tolist()).data.permute(0, 2, 3, 1)
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


def _encoder_pix_fmt(codec: str, height: int, width: int) -> str:
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


_encoder_pool: ProcessPoolExecutor | None = None


def encode(images: np.ndarray, fps: float, spec: ReencodeSpec) -> bytes:
    """Encode uint8 RGB ``images`` ``[n, H, W, 3]`` as an MP4 at ``fps``, a keyframe every ``spec.gop``.

    The pixel format is ``_encoder_pix_fmt``'s choice; uint16 grey ``images`` ``[n, H, W]`` are
    encoded in ``gray16le`` (with a lossless grey encoder such as ``ffv1``: values exact).
    Deterministic settings: one encoder thread, no scene-cut keyframes, ``+bitexact`` muxing.

    The encoder runs in a separate process (one per converting process, started on first use with
    ``spawn``): a native encoder that crashes (Debian's x265 3.5 corrupts its heap on some small
    4:4:4 sizes and aborts) ends that process, not the conversion, and becomes an error.

    Raises:
        ConversionError(kind="encode_failed"): the encoder is unknown, refuses the size, pixel
            format or options, or crashed; the message gives FFmpeg's reason (the caller adds
            dataset, episode and camera).
    """
    global _encoder_pool
    if _encoder_pool is None:
        _encoder_pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    try:
        return _encoder_pool.submit(_encode, images, fps, spec).result()
    except BrokenProcessPool:
        _encoder_pool = None
        n, height, width = int(images.shape[0]), int(images.shape[1]), int(images.shape[2])
        raise ConversionError(
            f"encoder {spec.codec} crashed ({width}x{height}, {n} frames): the encoder "
            "process died (a native encoder fault); no output was kept",
            kind="encode_failed",
        ) from None


def _encode(images: np.ndarray, fps: float, spec: ReencodeSpec) -> bytes:
    encoder = StreamEncoder(fps, spec)
    for image in images:
        encoder.add(image)
    return encoder.finish()


class StreamEncoder:
    """Encode frames one at a time into an MP4 held in memory, as ``encode`` does (same settings).

    ``add`` takes uint8 RGB ``[H, W, 3]`` or uint16 grey ``[H, W]`` (encoded in ``gray16le``); the
    first frame sets the size and kind. ``finish`` returns the MP4's bytes. Runs in this process
    (``encode`` isolates the encoder in a process of its own; this one lets frames arrive in chunks
    so a camera need not be in memory whole: ``shardwriter.frames``).

    Raises:
        ConversionError(kind="encode_failed"): the encoder is unknown, refuses the size, pixel
            format or options; the message gives FFmpeg's reason.
    """

    def __init__(self, fps: float, spec: ReencodeSpec) -> None:
        self.fps, self.spec = fps, spec
        self.frames = 0
        self._out = io.BytesIO()
        self._dst: Any = None
        self._stream: Any = None
        self._what = f"{spec.codec} (no frame yet"

    def _fail(self, exc: Exception) -> ConversionError:
        hint = ""
        if "format does not support" in str(exc):  # PyAV before 16 bundles an FFmpeg without FFV1 in MP4
            hint = f" (PyAV {av.__version__}: grey and depth cameras need PyAV >= 16, whose FFmpeg stores FFV1 in MP4)"
        return ConversionError(f"encoder {self._what}, {self.frames} frames) failed: {exc}{hint}", kind="encode_failed")

    def _open(self, height: int, width: int, grey: bool) -> None:
        spec = self.spec
        pix_fmt = "gray16le" if grey else _encoder_pix_fmt(spec.codec, height, width)
        self._what = f"{spec.codec} ({pix_fmt}, {width}x{height}"
        rate = Fraction(self.fps).limit_denominator(1001000)
        options = {"g": str(spec.gop), "keyint_min": str(spec.gop), "sc_threshold": "0"}
        if spec.crf is not None and spec.codec in ("libx264", "libx264rgb", "libsvtav1", "libx265"):
            options["crf"] = str(spec.crf)
        if spec.codec in ("libx264", "libx264rgb"):
            options["x264-params"] = f"keyint={spec.gop}:min-keyint={spec.gop}:scenecut=0"
        if spec.codec == "libx265":
            options["x265-params"] = (
                f"keyint={spec.gop}:min-keyint={spec.gop}:scenecut=0:log-level=error:frame-threads=1:pools=none"
            )
        self._dst = av.open(self._out, "w", format="mp4", options={"fflags": "+bitexact"})
        stream = self._dst.add_stream(spec.codec, rate=rate, options=options)
        if not isinstance(stream, av.VideoStream):
            raise ValueError(f"{spec.codec} is not a video encoder")
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        stream.codec_context.thread_count = 1
        self._stream = stream

    def add(self, image: np.ndarray) -> None:
        """Encode one frame (see the class)."""
        grey = image.ndim == 2
        try:
            if self._dst is None:
                self._open(int(image.shape[0]), int(image.shape[1]), grey)
            assert self._dst is not None and self._stream is not None
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="gray16le" if grey else "rgb24")
            for packet in self._stream.encode(frame):
                self._dst.mux(packet)
        except (av.error.FFmpegError, ValueError, OSError) as exc:
            self.close()
            raise self._fail(exc) from exc
        self.frames += 1

    def finish(self) -> bytes:
        """Flush the encoder and close the MP4; its bytes. ValueError when no frame was added."""
        if self._dst is None or self._stream is None:
            raise ValueError("no frame to encode")
        try:
            for packet in self._stream.encode():
                self._dst.mux(packet)
            self._dst.close()
        except (av.error.FFmpegError, ValueError, OSError) as exc:
            self.close()
            raise self._fail(exc) from exc
        self._dst = None
        return self._out.getvalue()

    def close(self) -> None:
        """Drop the encoder and what it wrote (after an error)."""
        if self._dst is not None:
            with contextlib.suppress(av.error.FFmpegError, ValueError, OSError):
                self._dst.close()
            self._dst = None


# Camera fields of an index entry without a packet table: the reader then fetches the whole member.
NO_PACKETS = {
    "packet_start": 0,
    "packet_offset": [],
    "packet_size": [],
    "packet_frame": [],
    "packet_crc32": [],
    "extradata": b"",
}


_BLOCK_HEADER_BYTES = 64  # how far past a packet's reported position its payload may start (Matroska blocks)


def packet_table(data: bytes, stream_index: int, pts: np.ndarray, rotation: int) -> tuple[dict, str | None]:
    """The packet table of a stored video: where each packet of the frame stream lies in ``data``.

    One entry per packet of stream ``stream_index``, in file (decode) order: its byte offset in
    ``data``, its size, the frame it displays (``pts`` is the stored frame table, int64
    ``[num_frames]`` in presentation order; -1 for a packet no frame comes from, e.g. one an edit list
    hides) and the CRC-32 of its bytes; plus the stream's codec ``extradata`` (the decoder
    configuration: ``avcC``, ``av1C``, ...). With it a reader fetches only the packets of the groups
    of pictures a window needs and feeds them to a decoder it keeps open (``stream.packets``),
    instead of fetching the member and opening its container.

    Returns the index fields (``NO_PACKETS``' keys; ``packet_offset`` and ``packet_frame`` left empty
    when regular: offsets contiguous from ``packet_start``, packet ``i`` showing frame ``i``) and None,
    or ``NO_PACKETS`` and the reason a table cannot be made: the container does not store each
    packet's bytes contiguously at its position (MPEG-TS, some Matroska), packets out of file order,
    a packet without pts, packets and displayed frames not one to one, a rotated stream (the reader
    then decodes through torchcodec, which applies the rotation), a container that does not time its
    packets (``restamp_reason``: one kept as it is because no container takes its codec; its table
    was checked through torchcodec, which the reader then uses).
    """
    if rotation:
        return NO_PACKETS, "rotated stream"
    offsets: list[int] = []
    sizes: list[int] = []
    shown: list[int] = []
    crcs: list[int] = []
    try:
        with av.open(io.BytesIO(data), "r") as container:
            names = str(container.format.name)
            if not _TIMESTAMPED_FORMATS.intersection(names.split(",")):
                return NO_PACKETS, f"its container ({names}) does not time its packets"
            stream = frame_stream(container, stream_index)
            extradata = bytes(stream.codec_context.extradata or b"")
            for packet in container.demux(stream):
                if not packet.size:
                    continue
                pos, size = packet.pos, packet.size
                payload = bytes(packet)
                if pos is not None and pos >= 0 and data[pos : pos + size] != payload:
                    # Matroska/WebM give the block's position: the payload follows its few header bytes.
                    pos = data.find(payload, pos, pos + size + _BLOCK_HEADER_BYTES)
                if pos is None or pos < 0:
                    return NO_PACKETS, f"packet {len(sizes)}'s bytes are not stored at its position"
                if offsets and pos < offsets[-1] + sizes[-1]:
                    return NO_PACKETS, f"packet {len(sizes)} lies before the end of the one before it"
                p = packet.pts if packet.pts is not None else packet.dts
                if p is None:
                    return NO_PACKETS, f"packet {len(sizes)} has no pts"
                offsets.append(pos)
                sizes.append(size)
                crcs.append(zlib.crc32(payload))
                shown.append(-1 if packet.is_discard else int(p))
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        return NO_PACKETS, f"demuxing failed: {exc}"
    packet_pts = np.asarray(shown, dtype=np.int64)
    visible = packet_pts >= 0
    frame = np.full(packet_pts.size, -1, dtype=np.int64)
    pos = np.searchsorted(pts, packet_pts[visible])
    found = (pos < pts.size) & (pts[np.minimum(pos, pts.size - 1)] == packet_pts[visible])
    frame[np.flatnonzero(visible)[found]] = pos[found]
    counts = np.bincount(frame[frame >= 0], minlength=pts.size)
    if counts.size != pts.size or np.any(counts != 1):
        return NO_PACKETS, "packets and displayed frames are not one to one"
    offsets_np, sizes_np = np.asarray(offsets, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    contiguous = bool(np.all(offsets_np[1:] == offsets_np[:-1] + sizes_np[:-1]))
    in_order = bool(np.array_equal(frame, np.arange(frame.size)))
    return {
        "packet_start": int(offsets_np[0]) if offsets_np.size else 0,
        "packet_offset": [] if contiguous else offsets_np,
        "packet_size": sizes_np.astype(np.int32),
        "packet_frame": [] if in_order else frame.astype(np.int32),
        "packet_crc32": np.asarray(crcs, dtype=np.uint32),
        "extradata": extradata,
    }, None
