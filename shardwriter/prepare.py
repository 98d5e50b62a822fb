"""Prepare one episode for a shard: load, validate, map rows to frames, copy or cut its videos.

The row-to-frame map is resolved here, once: by the ``frame_index`` column or row position, plus
(LeRobot v3.0) the exact frame of the segment's ``from_timestamp``. Float timestamps are never
rounded to pick frames; they are compared with the video to report disagreements, and where they
reset or jump inside the episode a recording break is recorded (``segment_starts``) so that no
training window crosses it.

Internal: import from ``epishard.shardwriter``.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from epishard.format import manifest as fmt
from epishard.format.storage import RemoteFile

from .episode import CameraFrames, CameraVideo, Episode, LazyTable, read_file
from .errors import ConversionError
from .frames import encode_frames
from .images import GREY_IMAGE_SPEC, IMAGE_SPEC, column_images
from .streams import stream_members
from .video import (
    NO_PACKETS,
    CodecNotCopied,
    FrameTimingError,
    ReencodeSpec,
    VideoProbe,
    check_frames,
    cut,
    encode,
    frame_at_time,
    frame_table,
    packet_table,
    probe,
    reencode,
    resize,
    restamp,
    restamp_reason,
    scan,
)

__all__ = ["CHECKED_PREFIXES", "PrepareOptions", "PreparedEpisode", "discontinuities", "prepare"]

log = logging.getLogger(__name__)

CHECKED_PREFIXES = ("observation.state", "action")


@dataclass(frozen=True)
class PrepareOptions:
    """Per-episode conversion options.

    ``cameras``: camera names to keep (None: all). ``reencode``: re-encode settings or None for a
    bit-exact copy / stream-copy cut. ``timestamps``: ``"warn"`` records timestamp disagreements in
    the report (frames are mapped by frame_index, so they cannot shift frames); ``"raise"`` treats
    them as errors. ``check``: how each stored video's frame table is made and vouched for
    (``manifest.CHECK_LEVELS``): ``"full"`` builds it by decoding every frame (``video.probe``) and
    decodes every frame twice more the way the reader does (``video.check_frames``); ``"fast"``
    builds it from the container and decodes keyframes alone and the last group of pictures in the
    same pass (``video.scan`` with ``vouch``), and where they disagree does what ``"full"`` does for
    that video; ``"off"`` trusts the container (``video.scan``). A table the decoder disagrees
    with stops the episode (``frame_mismatch``).
    """

    cameras: tuple[str, ...] | None = None
    reencode: ReencodeSpec | None = None
    timestamps: Literal["warn", "raise"] = "warn"
    check: Literal["full", "fast", "off"] = "fast"


@dataclass
class PreparedEpisode:
    """An episode ready to append to a shard: tar members in order and its index row (sans offsets)."""

    key: str
    members: list[tuple[str, bytes]]
    row: dict
    warnings: list[dict] = field(default_factory=list)
    checks: dict[str, int] = field(default_factory=dict)  # check level -> videos checked at it


def _fail(kind: str, message: str, **where) -> ConversionError:
    return ConversionError(message, kind=kind, **where)


def _table_path(episode: Episode) -> str | None:
    """The file an episode's rows come from (a parquet, a table slice's file, a source's file), or None."""
    table = episode.table
    path = table if isinstance(table, (str, RemoteFile)) else getattr(table, "path", None)
    return None if path is None else str(path)


def _local_frames(table: pa.Table) -> np.ndarray:
    """Frame of each row within the episode's video (or segment).

    ``frame_index`` when present (LeRobot's per-episode frame counter), else row position.
    """
    if "frame_index" not in table.column_names:
        return np.arange(table.num_rows, dtype=np.int64)
    frames = table.column("frame_index").to_numpy(zero_copy_only=False).astype(np.int64)
    bad = np.flatnonzero(np.diff(frames) <= 0)
    if frames.size and frames[0] < 0:
        raise _fail("bad_frame_index", f"frame_index {frames[0]} is negative", row=0)
    if bad.size:
        r = int(bad[0]) + 1
        raise _fail("bad_frame_index", f"frame_index not increasing: {frames[r - 1]} then {frames[r]}", row=r)
    return frames


def _check_finite(table: pa.Table) -> None:
    for name in table.column_names:
        if not name.startswith(CHECKED_PREFIXES):
            continue
        values = table.column(name).combine_chunks()
        while (
            pa.types.is_list(values.type)
            or pa.types.is_fixed_size_list(values.type)
            or pa.types.is_large_list(values.type)
        ):
            values = values.flatten()
        if not pa.types.is_floating(values.type):
            continue
        array = values.to_numpy(zero_copy_only=False).astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(array))
        if bad.size:
            width = max(1, array.size // max(table.num_rows, 1))
            row, dim = divmod(int(bad[0]), width)
            raise _fail("nan", f"column {name!r} holds {array[bad[0]]} at dimension {dim}", row=row)


# A step of more than this many frame periods between consecutive rows' timestamps is a jump in
# time (recording paused and resumed). Wall-clock timestamps of real recordings jitter up to about
# 1.3 periods (so101_bimanual_cloth: 18.5 Hz stamps on a 20 fps video); one dropped frame is 2.
_JUMP_PERIODS = 2.0


def discontinuities(table: pa.Table, fps: float) -> list[dict]:
    """Rows where the ``timestamp`` column starts a new recording segment inside one episode.

    A row starts one when its timestamp does not advance past the previous row's (``<= 0`` step:
    ``timestamps_reset`` when it goes back to the episode's first timestamp or earlier, else
    ``timestamps_non_monotonic``) or advances by more than ``_JUMP_PERIODS`` periods plus a quarter
    (``timestamps_jump``). The period is the frame period, or the episode's median step where its
    timestamps advance more slowly (another rate or unit, e.g. milliseconds): a steady rate is not a
    pause, and ``_timestamp_report`` reports it. A column that never advances (constant) holds no
    time to cut by: no breaks, and the timestamp report flags it. Returns ``[{kind, row, message}]``
    in row order; empty for a table without ``timestamp``.
    """
    if "timestamp" not in table.column_names or table.num_rows < 2:
        return []
    t = table.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64)
    step = np.diff(t)
    if not np.any(step > 0):
        return []
    tol = 0.25 / fps
    period = max(1.0 / fps, float(np.median(step[step > 0])))
    out = []
    for r in (np.flatnonzero((step <= 0) | (step > (_JUMP_PERIODS + 0.25) * period)) + 1).tolist():
        if step[r - 1] > 0:
            kind, what = "timestamps_jump", f"skips {step[r - 1] * fps:.1f} frame periods"
        else:
            kind = "timestamps_reset" if t[r] <= t[0] + tol else "timestamps_non_monotonic"
            what = "goes back" if step[r - 1] < 0 else "does not advance"
        out.append(
            {
                "kind": kind,
                "row": r,
                "message": f"timestamp goes from {t[r - 1]:.6f}s to {t[r]:.6f}s at row {r} ({what}): a new "
                "recording segment starts here; windows do not cross it",
            }
        )
    return out


def _timestamp_report(t: np.ndarray, expected: np.ndarray, fps: float, frame_seconds: float) -> dict | None:
    """Compare table timestamps with the video time each row's frame is shown at.

    Both in seconds; the rows of one recording segment.

    Returns None when they agree within a quarter frame, else a dict with ``kind`` one of
    ``timestamps_offset``, ``timestamps_rate``, ``timestamps_past_end``, the first row concerned
    and a message.
    """
    if t.size == 0:
        return None
    tol = 0.25 / fps
    d = t - expected
    if np.all(np.abs(d) <= tol):
        return None
    video_end = expected[-1] + frame_seconds
    if t[-1] > video_end + tol and np.abs(d[0]) <= tol:
        r = int(np.flatnonzero(t > video_end + tol)[0])
        rate = (t.size - 1) / (t[-1] - t[0]) if t[-1] > t[0] else 0.0
        return {
            "kind": "timestamps_past_end",
            "row": r,
            "message": f"timestamps run to {t[-1]:.3f}s but the video ends at {video_end:.3f}s "
            f"(timestamps advance at {rate:.2f} Hz, the video is {fps:g} fps); frames follow frame_index/row order",
        }
    if np.all(np.abs(d - d[0]) <= tol):
        return {
            "kind": "timestamps_offset",
            "row": 0,
            "message": f"timestamps are offset by {d[0]:+.6f}s ({d[0] * fps:+.2f} frames) from the video pts; "
            "frames follow frame_index/row order",
        }
    r = int(np.flatnonzero(np.abs(d) > tol)[0])
    rate = (t.size - 1) / (t[-1] - t[0]) if t[-1] > t[0] else 0.0
    return {
        "kind": "timestamps_rate",
        "row": r,
        "message": f"timestamps advance at {rate:.2f} Hz while the video is {fps:g} fps (row {r} is "
        f"{d[r]:+.3f}s off); frames follow frame_index/row order",
    }


def _segment_end_report(
    info: VideoProbe, absolute: np.ndarray, segment: tuple[float, float], fps: float
) -> dict | None:
    """Check a v3.0 ``to_timestamp`` against the frames the rows own.

    The rows and ``from_timestamp`` decide them; ``to_timestamp`` only has to agree within one frame.

    Returns None when the last row's frame ends within a quarter frame of ``to_timestamp``, else a
    ``segment_end_mismatch`` report (e.g. an inclusive end: the last frame's time).

    Raises:
        ConversionError: ``frames_past_end`` when a row's frame starts more than a quarter frame
            after ``to_timestamp``: it is past the episode's end by more than one frame, so it
            belongs to what follows in the file, not to this episode.
    """
    to = segment[1]
    times = info.seconds(absolute)
    tol = 0.25 / fps
    over = np.flatnonzero(times > to + tol)
    if over.size:
        r = int(over[0])
        raise _fail(
            "frames_past_end",
            f"row {r} needs video frame {int(absolute[r])} at {times[r]:.6f}s, more than one frame past the "
            f"episode's to_timestamp {to:.6f}s in meta/episodes",
            row=r,
        )
    d = to - (times[-1] + 1.0 / fps)
    if abs(d) <= tol:
        return None
    how = (
        "before the end of the last row's frame: the metadata's end looks inclusive (the last frame's time)"
        if d < 0
        else "after the end of the last row's frame: the segment is longer than the rows"
    )
    return {
        "kind": "segment_end_mismatch",
        "row": int(absolute.size - 1),
        "message": f"meta/episodes to_timestamp {to:.6f}s is {abs(d) * fps:.2f} frame(s) {how}; the rows "
        f"(length, frame_index) and from_timestamp {segment[0]:.6f}s decide the episode's frames",
    }


def _probe_shared(path: str | RemoteFile, decode: bool) -> VideoProbe:
    # Consecutive episodes of a LeRobot v3.0 dataset are segments of one video file: probe it once.
    # Keyed by size and mtime too, so a file rewritten in place is probed again, never served stale
    # (a remote file: by its URL and the size its listing gave, fixed for the conversion).
    if isinstance(path, RemoteFile):
        return _probe_cached(path, path.size(), 0, decode)
    st = os.stat(path)
    return _probe_cached(path, st.st_size, st.st_mtime_ns, decode)


@functools.lru_cache(maxsize=8)
def _probe_cached(path: str | RemoteFile, size: int, mtime_ns: int, decode: bool) -> VideoProbe:
    return probe(path) if decode else scan(path)


def _prepare_camera(
    video,
    local: np.ndarray,
    fps: float,
    opts: PrepareOptions,
    table: pa.Table,
    first_break: int,
    level: str,
    as_is: bool = False,
):
    """Return (stored bytes, probe of stored bytes, row_to_frame, transform, timestamp reports).

    ``first_break``: the row where the table's second recording segment starts (``num_rows`` if none).
    ``level``: the check level the stored video's frame table is made for (``video.frame_table``).
    Raises ``_Untimed`` for a container that does not time its frames (``video.restamp_reason``),
    unless ``as_is``.
    """
    source = video.source
    if video.segment is None and not isinstance(source, (bytes, bytearray)):
        source = read_file(source)  # copied whole: read once, probe and store these bytes
    # A segment's file (v3.0: many episodes) is probed and cut where it is, never read whole.
    if isinstance(source, (str, RemoteFile)):
        info = _probe_shared(source, level == "full")  # a file cut below: the cut is what gets checked
    else:
        info = frame_table(source, level)
    untimed = None if as_is else restamp_reason(info)
    if untimed is not None:
        raise _Untimed(untimed, kind="unreadable_video")
    base, seg_start = 0, 0.0
    if video.segment is not None:
        seg_start = video.segment[0]
        try:
            base = frame_at_time(info, seg_start, fps)
        except ValueError as exc:
            raise _fail("segment_offset", f"from_timestamp={seg_start}: {exc}") from exc
    absolute = base + local
    over = np.flatnonzero(absolute >= info.num_frames)
    if over.size:
        r = int(over[0])
        raise _fail(
            "frames_past_end",
            f"row {r} needs video frame {int(absolute[r])} but the video has frames "
            f"0..{info.num_frames - 1} ({table.num_rows} rows from frame {base})",
            row=r,
        )
    reports = [] if video.segment is None else [_segment_end_report(info, absolute, video.segment, fps)]
    # Where the table's timestamps should be: the frame's pts relative to the episode's time zero
    # (the video's first frame for a whole file, from_timestamp for a segment). Only the first
    # recording segment is compared: timestamps restart or jump at a discontinuity by definition.
    zero = seg_start if video.segment is not None else float(info.seconds(np.zeros(1, dtype=np.int64))[0])
    if "timestamp" in table.column_names:
        t = table.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64)[:first_break]
        reports.append(_timestamp_report(t, info.seconds(absolute[:first_break]) - zero, fps, 1.0 / fps))
    if opts.reencode is not None and _camera_kind(video.depth, info.pix_fmt) == "rgb":
        data = reencode(source, info, absolute, fps, opts.reencode)
        stored, row_to_frame, transform = frame_table(data, level), np.arange(absolute.size), opts.reencode.describe()
    elif video.segment is not None:
        data, stored, shown = cut(source, info, int(absolute[0]), int(absolute[-1]) + 1, level)
        frame_in_cut = {int(f): i for i, f in enumerate(shown) if f >= 0}
        lost = [r for r, f in enumerate(absolute.tolist()) if f not in frame_in_cut]
        if lost:
            raise _fail(
                "unreadable_video",
                f"the stream-copy cut does not show source frame {absolute[lost[0]]} "
                f"({len(lost)} rows without their frame)",
                row=lost[0],
            )
        row_to_frame, transform = np.asarray([frame_in_cut[f] for f in absolute.tolist()]), "cut"
    else:
        data, stored, row_to_frame, transform = bytes(source), info, absolute, "copy"
    return data, stored, row_to_frame.astype(np.int32), transform, [r for r in reports if r is not None]


def _prepare_images(table: pa.Table, column: str, fps: float, opts: PrepareOptions, level: str):
    """Encode an image column as a video.

    With ``IMAGE_SPEC``, or the re-encode settings when given; 16-bit grey images, depth maps, always
    with ``GREY_IMAGE_SPEC``: a depth camera with exact values.

    Returns (stored bytes, probe of them, row_to_frame, transform, report entries); frame ``r`` is
    row ``r``'s image, so there are no timestamps to check.
    """
    images, notes = column_images(table, column)
    if images.dtype == np.uint16:
        spec = GREY_IMAGE_SPEC
        data = encode(images, fps, spec)
    else:
        spec = opts.reencode or IMAGE_SPEC
        data = encode(resize(images, spec.size), fps, spec)
    transform = "images:" + spec.describe().partition(":")[2]
    return data, frame_table(data, level), np.arange(table.num_rows, dtype=np.int32), transform, notes


def _checked_camera(
    video, table: pa.Table, cam: str, local: np.ndarray, fps: float, opts: PrepareOptions, first_break: int, level: str
):
    """One camera prepared and its frame table vouched for at check ``level`` (``_checked_level``).

    A video whose container stores no presentation timestamp on every packet
    (``video.restamp_reason``: AVI, MPEG-TS, FLV, raw streams, ...), or whose decoded frames do not
    carry their presentation times (``video.FrameTimingError``: no timestamps, or decode-order
    ones), is stored as a stream copy into an MP4 timed in the order the decoder shows it
    (``video.restamp``; transform ``remux``, or ``cut`` for a segment, unless re-encoded): frame
    ``k`` stays the ``k``-th frame the source displays, and the reader's decoder, whatever its FFmpeg
    version, numbers the frames as the table does. A file shared by segments (LeRobot v3.0) is
    copied once for all its episodes.

    Raises:
        ConversionError(kind="frame_mismatch"): the table disagrees with the reader's decoder.
        ConversionError(kind="unreadable_video"): the video does not decode, or needs a copy that
            cannot be made (its packets and displayed frames are not one to one).
    """
    remuxed, why = False, ""
    if isinstance(video, CameraFrames):  # encoded here, from its frames: nothing to copy or retime
        return _checked_level(video, table, cam, local, fps, opts, first_break, level)
    if video is not None and video.segment is None and not isinstance(video.source, (bytes, bytearray)):
        video = replace(video, source=read_file(video.source))  # copied whole: read once
    try:
        out = _checked_level(video, table, cam, local, fps, opts, first_break, level)
    except (FrameTimingError, _Untimed) as exc:
        if video is None:
            raise
        copy = _restamped(video.source, exc.detail, fps, keep=isinstance(exc, _Untimed))
        if copy is None:  # no container takes its codec (AVI's HuffYUV, raw video): as it is, in full
            log.info("camera %s: %s and no container takes its codec; checked in full", cam, exc.detail)
            out = _checked_level(video, table, cam, local, fps, opts, first_break, "full", as_is=True)
        else:
            log.info("camera %s: %s; stored as an MP4 copy timed as its decoder shows it", cam, exc.detail)
            video, remuxed, why = replace(video, source=copy), True, exc.detail
            out = _checked_level(video, table, cam, local, fps, opts, first_break, level)
    data, stored, row_to_frame, transform, notes, reports, checked = out
    if remuxed:  # the frames are the source's, their timing is the decoder's: said, never silent
        transform = "remux" if transform == "copy" else transform
        note = f"{why}; stored as a stream copy in MP4 timed in the order its decoder shows the frames"
        notes = [*notes, {"kind": "remuxed", "row": None, "message": note}]
    return data, stored, row_to_frame, transform, notes, reports, checked


class _Untimed(ConversionError):
    """``_prepare_camera``'s signal: the source's container does not time its frames (``video.restamp_reason``)."""


def _restamped(source, reason: str, fps: float, keep: bool) -> bytes | None:
    """``video.restamp(source, fps)``; its error also says why the copy was needed (``reason``).

    None where no container takes the stream's codec (``video.CodecNotCopied``) and ``keep``: the
    source may be kept as it is (its container is the reason, not its decoded frames). A file
    shared by segments (LeRobot v3.0) is copied once for all its episodes.
    """
    try:
        if isinstance(source, (str, RemoteFile)):
            return _restamped_cached(source, *_file_key(source), fps)
        return restamp(source, fps)
    except CodecNotCopied as exc:
        if keep:
            return None
        raise _fail(exc.kind, f"{reason}, and no copy timed as its decoder shows it can be made: {exc.detail}") from exc
    except ConversionError as exc:
        raise _fail(exc.kind, f"{reason}, and no copy timed as its decoder shows it can be made: {exc.detail}") from exc


def _file_key(path: str | RemoteFile) -> tuple[int, int]:
    """(size, mtime in ns) of a file: a cache keyed by them never serves a file rewritten in place.

    A remote file: the size its listing gave (fixed for the conversion) and 0.
    """
    if isinstance(path, RemoteFile):
        return path.size(), 0
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=2)
def _restamped_cached(path: str | RemoteFile, size: int, mtime_ns: int, fps: float) -> bytes:
    return restamp(path, fps)


def _checked_level(
    video,
    table: pa.Table,
    cam: str,
    local: np.ndarray,
    fps: float,
    opts: PrepareOptions,
    first_break: int,
    level: str,
    as_is: bool = False,
):
    """One camera prepared and its frame table vouched for at check ``level``.

    Returns (stored bytes, probe, row_to_frame, transform, notes, reports, the level it was checked
    at). At ``fast``, a table the few decodes disagree with is rebuilt and checked as at ``full``
    (the container did not tell the displayed frames; the decode does), so the level may come back
    ``full``. ``as_is``: as ``_prepare_camera``'s.

    Raises:
        ConversionError(kind="frame_mismatch"): the table disagrees with the reader's decoder.
    """
    if video is None:
        data, stored, row_to_frame, transform, notes = _prepare_images(table, cam, fps, opts, level)
        reports: list[dict] = []
    elif isinstance(video, CameraFrames):
        data, transform, notes = encode_frames(video, table.num_rows, fps, opts.reencode)
        stored, row_to_frame, reports = frame_table(data, level), np.arange(table.num_rows, dtype=np.int32), []
    else:
        data, stored, row_to_frame, transform, reports = _prepare_camera(
            video, local, fps, opts, table, first_break, level, as_is
        )
        notes = []
    if level != "off":
        problem = stored.disagreement
        if level == "full":
            problem = check_frames(
                data, stored.pts, stored.duration, stored.keyflags(), stored.time_base, stored.stream_index
            )
        if problem is not None and level == "fast":
            log.info("camera %s: the fast frame check disagrees (%s); checking it in full", cam, problem)
            return _checked_level(video, table, cam, local, fps, opts, first_break, "full", as_is)
        if problem is not None:
            raise _fail("frame_mismatch", f"the frame table disagrees with the decoder: {problem}")
    return data, stored, row_to_frame, transform, notes, reports, level


def _camera_kind(declared_depth: bool, pix_fmt: str) -> str:
    """``"depth"`` for a grey video declared a depth map or of more than 8 bits per sample, else ``"rgb"``.

    The RGB path would squeeze such a video into 8 bits. See ``manifest.CAMERA_KINDS``.
    """
    try:
        desc = av.VideoFormat(pix_fmt)
    except (ValueError, av.error.FFmpegError):
        return "rgb"
    grey = pix_fmt.startswith("gray") and len(desc.components) == 1
    return "depth" if grey and (declared_depth or desc.components[0].bits > 8) else "rgb"


def _kind_notes(declared_depth: bool, kind: str, pix_fmt: str, opts: PrepareOptions) -> list[dict]:
    """Report entries for a camera read otherwise than its source or the options say."""
    if declared_depth and kind != "depth":
        return [
            {
                "kind": "depth_not_grey",
                "row": None,
                "message": f"declared a depth map but stored as {pix_fmt} (not a grey format): read as an RGB image",
            }
        ]
    if kind == "depth" and opts.reencode is not None:
        return [
            {
                "kind": "depth_not_reencoded",
                "row": None,
                "message": "depth camera kept as stored: a re-encode "
                f"through 8-bit RGB would lose its {av.VideoFormat(pix_fmt).components[0].bits}-bit values",
            }
        ]
    return []


def _packets(data: bytes, stored: VideoProbe, kind: str) -> dict:
    """The camera's packet table fields (``video.packet_table``): RGB cameras only (depth reads the member)."""
    if kind != "rgb":
        return NO_PACKETS
    fields, why = packet_table(data, stored.stream_index, stored.pts, stored.rotation)
    if why is not None:
        log.debug("no packet table (%s): the reader fetches this video whole", why)
    return fields


def _compact_tables(stored: VideoProbe, row_to_frame: np.ndarray) -> dict:
    """Index fields for the pts, duration and row-to-frame tables; lists left empty when regular."""
    pts, duration = stored.pts, stored.duration
    step = int(pts[1] - pts[0]) if pts.size > 1 else int(duration[0])
    regular_pts = bool(np.all(pts == pts[0] + step * np.arange(pts.size)))
    regular_duration = regular_pts and bool(np.all(duration == step))
    first = int(row_to_frame[0])
    regular_rows = bool(np.all(row_to_frame == first + np.arange(row_to_frame.size)))
    return {
        "pts_start": int(pts[0]),
        "pts_step": step if regular_pts else 0,
        "pts": [] if regular_pts else pts,
        "duration": [] if regular_duration else duration,
        "first_frame": first,
        "row_to_frame": [] if regular_rows else row_to_frame,
    }


def _clock(table: pa.Table, fps: float) -> np.ndarray:
    """The rows' times (float64 ``[num_rows]`` seconds): the ``timestamp`` column, or ``r / fps`` without one.

    The clock a reader anchors windows at (``stream.episode.read_columns``'s ``timestamp``).
    """
    if "timestamp" in table.column_names:
        return table.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64)
    return np.arange(table.num_rows) / fps


def _task(episode: Episode, table: pa.Table) -> tuple[list[str], list[dict]]:
    """The episode's task texts, and a ``task_unknown`` warning when its rows name a task no task file defines.

    ``episode.tasks`` when given; else the text its first row's ``task_index`` has in
    ``extra["task_text"]`` (a LeRobot dataset's task file, ``extra["task_file"]``), or that file's
    one text when the table has no ``task_index`` column. An index the file does not define (or a
    null one) leaves the text empty, never another task's.
    """
    if episode.tasks:
        return list(episode.tasks), []
    texts = episode.extra.get("task_text", {})
    if "task_index" not in table.column_names or not table.num_rows:
        return (list(texts.values()) if len(texts) == 1 else []), []
    if texts or "task_file" in episode.extra:
        value = table.column("task_index")[0].as_py()
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if whole and not isinstance(value, bool) and int(value) in texts:
            return [texts[int(value)]], []
        where = episode.extra.get("task_file", "the task file")
        message = f"task_index {value!r} of the first row is not in {where}: the episode's task text is left empty"
        return [], [{"kind": "task_unknown", "row": 0, "message": message}]
    return [], []


def prepare(episode: Episode, opts: PrepareOptions) -> PreparedEpisode:
    """Load and validate one episode; return its tar members and index row.

    Raises:
        ConversionError: naming dataset, episode, camera and row, for: empty table, NaN/Inf in
            state or action (``nan``), bad ``frame_index``, a missing camera, an unreadable or
            truncated video, a frame table the reader's decoder disagrees with (``frame_mismatch``),
            rows past the video's end, an encoder failure (``encode_failed``), an image camera's
            undecodable row (``bad_image``), and (with ``timestamps="raise"``) timestamps that
            disagree with the video, a v3.0 ``to_timestamp`` off by up to a frame, or a recording
            break (timestamps reset or jump).
    """
    where = {"dataset": episode.source, "episode": episode.episode_index}
    key = episode.key or fmt.episode_key(episode.source, episode.episode_index)
    if "." in key:
        raise _fail("bad_key", f"episode key {key!r} contains a dot", **where)
    wanted = opts.cameras
    missing = [c for c in episode.extra.get("missing_cameras", []) if wanted is None or c in wanted]
    if wanted is not None:
        missing += [
            c
            for c in wanted
            if c not in episode.videos and c not in episode.images and c not in episode.frames and c not in missing
        ]
    if missing:
        looked = episode.extra.get("missing_paths", {}).get(missing[0])  # where a LeRobot source looked
        message = "no video file for this episode" + (f" (looked for {looked})" if looked else "")
        raise _fail("missing_camera", message, camera=missing[0], path=looked, **where)
    loaded_notes: list[dict] = []
    loaded_tasks: tuple[str, ...] = ()
    loaded_streams: Mapping = {}
    try:
        if isinstance(episode.table, LazyTable):
            table, loaded_notes, loaded_tasks, loaded_streams = episode.table.load()
            raw = None
        else:
            table, raw = episode.load_table()
    except ConversionError as exc:
        raise exc.with_context(**where) from None
    except (OSError, pa.ArrowException) as exc:
        raise _fail("unreadable_table", str(exc), path=_table_path(episode), **where) from exc
    if table.num_rows == 0:
        raise _fail("empty_episode", "the episode has no rows", **where)
    try:
        _check_finite(table)
        local = _local_frames(table)
    except ConversionError as exc:  # named with the file the rows came from
        raise exc.with_context(path=_table_path(episode), **where) from None
    breaks = discontinuities(table, episode.fps)
    if breaks and opts.timestamps == "raise":
        raise _fail(breaks[0]["kind"], breaks[0]["message"], row=breaks[0]["row"], **where)
    warnings = [
        {**b, "dataset": episode.source, "episode": episode.episode_index, "camera": None}
        for b in [*loaded_notes, *breaks]
    ]
    first_break = breaks[0]["row"] if breaks else table.num_rows
    absent = [c for c in episode.images if c not in table.column_names and (wanted is None or c in wanted)]
    if absent:
        raise _fail("missing_camera", "image feature has no column in the table", camera=absent[0], **where)
    cameras = sorted(c for c in (*episode.videos, *episode.images, *episode.frames) if wanted is None or c in wanted)
    fields = fmt.camera_fields(cameras)
    members: list[tuple[str, bytes]] = []
    cam_rows = []
    checks: dict[str, int] = {}
    for cam in cameras:
        video = episode.videos.get(cam) or episode.frames.get(cam)  # None: an image column
        path = (
            str(video.source)
            if isinstance(video, CameraVideo) and isinstance(video.source, (str, RemoteFile))
            else None
        )
        try:
            data, stored, row_to_frame, transform, notes, reports, level = _checked_camera(
                video, table, cam, local, episode.fps, opts, first_break, opts.check
            )
            checks[level] = checks.get(level, 0) + 1
        except ConversionError as exc:
            raise exc.with_context(camera=cam, path=path, **where) from None
        declared_depth = video is not None and video.depth
        kind = _camera_kind(declared_depth, stored.pix_fmt)
        for note in notes + _kind_notes(declared_depth, kind, stored.pix_fmt, opts):
            warnings.append({**note, "dataset": episode.source, "episode": episode.episode_index, "camera": cam})
        for report in reports:
            if opts.timestamps == "raise":
                raise _fail(report["kind"], report["message"], camera=cam, row=report["row"], path=path, **where)
            warnings.append({**report, "dataset": episode.source, "episode": episode.episode_index, "camera": cam})
        cam_rows.append(
            {
                "name": cam,
                "member": None,
                "codec": stored.codec,
                "width": stored.width,
                "height": stored.height,
                "rotation": stored.rotation,
                "stream_index": stored.stream_index,
                "pix_fmt": stored.pix_fmt,
                "time_base_num": stored.time_base.numerator,
                "time_base_den": stored.time_base.denominator,
                "num_frames": stored.num_frames,
                **_compact_tables(stored, row_to_frame),
                "keyframes": stored.keyframes,
                "transform": transform,
                "kind": kind,
                **_packets(data, stored, kind),
            }
        )
        members.append((fmt.member_name(key, f"{fields[cam]}.{fmt.VIDEO_EXT}"), data))
    if episode.images:  # their images now live in the cameras' videos
        table, raw = table.drop_columns([c for c in episode.images if c in table.column_names]), None
    tasks, unknown = _task(episode, table)
    tasks = tasks or list(loaded_tasks)
    warnings += [{**w, **where, "camera": None} for w in unknown]
    streams = {**loaded_streams, **episode.streams}
    twice = sorted(set(loaded_streams) & set(episode.streams))
    if twice:
        raise _fail("bad_stream", f"stream {twice[0]!r} is given by both the Episode and its table's source", **where)
    try:
        stream_data, stream_rows = stream_members(
            # after the JSON and table members (2) and the videos
            key,
            streams,
            list(fields.values()),
            2 + len(members),
            {*table.column_names, *cameras},
            _clock(table, episode.fps),
        )
    except ConversionError as exc:
        raise exc.with_context(**where) from None
    members += stream_data
    meta = {
        "key": key,
        "source": episode.source,
        "episode_index": episode.episode_index,
        "num_rows": table.num_rows,
        "fps": episode.fps,
        "tasks": tasks,
        "robot": episode.robot,
        "cameras": {fields[c]: c for c in cameras},
    }
    if stream_rows:  # (absent without streams: the member stays version 2's, byte for byte)
        first = {r["member"] - 2 - len(cam_rows): r["name"] for r in stream_rows}  # each stream's first piece
        meta["streams"] = {stream_data[k][0].split(".")[1]: name for k, name in first.items()}
    if raw is None:
        buf = io.BytesIO()
        pq.write_table(table, buf)
        raw = buf.getvalue()
    head = [
        (fmt.member_name(key, fmt.META_EXT), json.dumps(meta, sort_keys=True).encode()),
        (fmt.member_name(key, fmt.DATA_EXT), raw),
    ]
    for i, cam_row in enumerate(cam_rows):
        cam_row["member"] = len(head) + i
    row = {
        "key": key,
        "source": episode.source,
        "episode_index": episode.episode_index,
        "num_rows": table.num_rows,
        "fps": float(episode.fps),
        "task": tasks[0] if tasks else "",
        "tasks": tasks,
        "robot": episode.robot,
        "cameras": cam_rows,
        "window_start": 0,
        "window_stop": table.num_rows,
        "segment_starts": [b["row"] for b in breaks],
    }
    if stream_rows:  # a version-3 index row; without streams the row is version 2's, byte for byte
        row["streams"] = stream_rows
    return PreparedEpisode(key=key, members=head + members, row=row, warnings=warnings, checks=checks)
