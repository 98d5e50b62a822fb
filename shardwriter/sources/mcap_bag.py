"""ROS 2 bags in MCAP: image and joint-state topics, each at its own rate, resampled onto one row clock.

Read with mcap and its ROS 2 decoder (``epishard[mcap]``: ``mcap``, ``mcap-ros2-support``; no ROS
install). Each ``.mcap`` file is one episode (a folder of them: one episode per file, in natural
order). The source's episode list holds the file names only; the worker reads the bag.

Resampling (docs/sources/mcap.md): every message's time is its ``header.stamp`` (read from the CDR
bytes; the log time when the stamp is zero). Rows are ``t0 + r / fps`` for ``t0`` the latest first
message of the mapped topics and up to the earliest last one; each row takes, per topic, the
message nearest its time. A row with a topic whose nearest message is farther than the tolerance
(default: the larger of a row period and the topic's median message period; ``tolerance`` in the
mapping sets it for every topic, in seconds) is dropped, and the rows after it start a new
recording segment (the ``timestamp`` column jumps; windows do not cross it). Per topic and
episode, the report (and the console) states the messages, the rows that repeat a message already
used, the messages no row uses, and the rows dropped for it: nothing is resampled silently.

Default mapping: ``sensor_msgs/msg/Image`` and ``CompressedImage`` topics are cameras
(``/cam_high/image_raw`` -> ``observation.images.cam_high``; ``mono16``/``16UC1`` images are depth);
the ``sensor_msgs/msg/JointState`` topic not named like an action is ``observation.state`` (its
``position``; ``velocity`` and ``effort`` kept as ``observation.velocity`` / ``observation.effort``
when present), a topic whose name holds ``action`` or ``command`` (``JointState`` position or
``std_msgs/msg/Float64MultiArray`` data) is ``action``. The rate: ``--fps`` (or the mapping's
``fps``); without it, the median rate of the slowest camera topic (stated in the notes).
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..episode import CameraFrames, Episode, FileInput, FrameReader, LazyTable, LoadedTable, Source
from ..errors import ConversionError, SourceError
from .base import (
    Mapping,
    SourceOptions,
    build_table,
    episode_numbers,
    file_stamp,
    kept_cameras,
    open_binary,
    require,
    size_of,
    source_files,
)

CHUNK_FRAMES = 32
IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")
JOINT_TYPE = "sensor_msgs/msg/JointState"
ARRAY_TYPES = ("std_msgs/msg/Float64MultiArray", "std_msgs/msg/Float32MultiArray")
_NAME_NOISE = {"image_raw", "compressed", "image", "image_rect_color", "image_color", "color", "rgb"}


@dataclass(frozen=True)
class _Plan:
    """Which topics make the rows, at what rate and tolerance (picklable, small)."""

    file: FileInput
    fps: float
    tolerance: float | None
    topics: tuple[str, ...]  # every mapped topic, sorted: each one decides which rows exist
    state: str | None
    action: str | None


def _reader(f):
    mcap_reader = require("mcap.reader")
    decoder = require("mcap_ros2.decoder")
    return mcap_reader.make_reader(f, decoder_factories=[decoder.DecoderFactory()])


def _stamp(data: bytes, log_time: int) -> int:
    """A message's time in ns: its header stamp (CDR: 4-byte encapsulation, int32 sec, uint32 nanosec) or log time."""
    if len(data) >= 12:
        order = "<" if data[1] == 1 else ">"
        sec, nsec = struct.unpack(order + "iI", data[4:12])
        if sec or nsec:
            return sec * 1_000_000_000 + nsec
    return log_time


def _fail(message: str, file: FileInput, kind: str = "unreadable_file", **kw) -> ConversionError:
    return ConversionError(message, kind=kind, path=str(file), **kw)


def _times(plan: _Plan) -> dict[str, np.ndarray]:
    """Topic -> int64 ns times of its messages, in log-time order (one pass over the bag's records)."""
    return _times_of(plan, file_stamp(plan.file))


@functools.lru_cache(maxsize=2)
def _times_of(plan: _Plan, stamp: tuple[int, int]) -> dict[str, np.ndarray]:
    out: dict[str, list[int]] = {t: [] for t in plan.topics}
    try:
        with open_binary(plan.file) as f:
            for _, channel, message in _reader(f).iter_messages(topics=list(plan.topics)):
                out[channel.topic].append(_stamp(message.data, message.log_time))
    except ConversionError:
        raise
    except Exception as exc:  # mcap's errors (truncated file, bad CRC, bad record) share no base class
        raise _fail(f"cannot read the bag ({type(exc).__name__}: {exc})", plan.file) from exc
    for topic, times in out.items():
        if not times:
            raise _fail(f"topic {topic} has no message in this bag", plan.file, kind="missing_key")
    return {t: np.asarray(v, dtype=np.int64) for t, v in out.items()}


def _resample(plan: _Plan) -> tuple[np.ndarray, dict[str, np.ndarray], list[dict]]:
    """(row times in ns, topic -> message index of each row, report entries) of a bag (cached per process)."""
    return _resample_of(plan, file_stamp(plan.file))


@functools.lru_cache(maxsize=2)
def _resample_of(plan: _Plan, stamp: tuple[int, int]) -> tuple[np.ndarray, dict[str, np.ndarray], list[dict]]:
    times = _times(plan)
    start = max(int(t.min()) for t in times.values())
    stop = min(int(t.max()) for t in times.values())
    if stop < start:
        raise _fail(
            "the mapped topics do not overlap in time: no row can have a message of each",
            plan.file,
            kind="length_mismatch",
        )
    period = 1e9 / plan.fps
    grid = start + np.round(np.arange(int((stop - start) // period) + 1) * period).astype(np.int64)
    keep = np.ones(grid.size, bool)
    picks, tolerances = {}, {}
    for topic in plan.topics:
        t = times[topic]
        order = np.argsort(t, kind="stable")
        ts = t[order]
        i = np.clip(np.searchsorted(ts, grid), 1, max(1, ts.size - 1)) if ts.size > 1 else np.zeros(grid.size, int)
        if ts.size > 1:
            left, right = ts[i - 1], ts[i]
            i = np.where(np.abs(grid - left) <= np.abs(right - grid), i - 1, i)
        nearest = ts[i]
        median = float(np.median(np.diff(ts))) if ts.size > 1 else 0.0
        tol = plan.tolerance * 1e9 if plan.tolerance is not None else max(period, median)
        tolerances[topic] = tol
        keep &= np.abs(grid - nearest) <= tol
        picks[topic] = (order[i], np.abs(grid - nearest) <= tol, median)
    notes = []
    rows = grid[keep]
    if not rows.size:
        raise _fail(
            "no row has a message of every mapped topic within the tolerance", plan.file, kind="length_mismatch"
        )
    out = {}
    for topic in plan.topics:
        index, ok, median = picks[topic]
        out[topic] = index[keep]
        used = out[topic]
        repeated = int(used.size - np.unique(used).size)
        unused = int(times[topic].size - np.unique(used).size)
        dropped = int((~ok).sum())
        rate = 1e9 / median if median else 0.0
        notes.append(
            {
                "kind": "resampled",
                "row": None,
                "message": f"{topic}: {times[topic].size} messages at {rate:.2f} Hz -> {rows.size} rows at "
                f"{plan.fps:g} fps: {repeated} rows repeat a message, {unused} messages unused, {dropped} rows "
                f"dropped (no message within {tolerances[topic] / 1e6:.0f} ms)",
            }
        )
    return rows, out, notes


def _decoded(plan: _Plan, topic: str) -> Iterator[tuple[int, object, str]]:
    """(message index, decoded message, schema name) of ``topic`` in log-time order."""
    try:
        with open_binary(plan.file) as f:
            for k, (schema, _, _, decoded) in enumerate(_reader(f).iter_decoded_messages(topics=[topic])):
                yield k, decoded, schema.name if schema else ""
    except ConversionError:
        raise
    except Exception as exc:
        raise _fail(f"cannot read topic {topic} ({type(exc).__name__}: {exc})", plan.file) from exc


def _vector(msg, schema: str, topic: str, file: FileInput) -> dict[str, np.ndarray]:
    if schema == JOINT_TYPE:
        out = {"position": np.asarray(msg.position, np.float64)}
        for name in ("velocity", "effort"):
            values = getattr(msg, name)
            if len(values):
                out[name] = np.asarray(values, np.float64)
        return out
    if schema in ARRAY_TYPES:
        return {"position": np.asarray(msg.data, np.float64)}
    raise _fail(f"topic {topic} is {schema}: only JointState and Float64MultiArray give rows", file, kind="bad_feature")


@dataclass(frozen=True)
class MCAPTable(LazyTable):
    """A bag's rows: the resampled state and action topics, with the resampling reported per topic."""

    plan: _Plan

    def load(self) -> LoadedTable:
        """The rows; ConversionError (``missing_key``, ``length_mismatch``, ``unreadable_file``) naming the bag."""
        plan = self.plan
        rows, picks, notes = _resample(plan)
        columns: dict[str, np.ndarray] = {}
        keys: dict[str, str] = {}
        for out, topic in (("observation.state", plan.state), ("action", plan.action)):
            if topic is None:
                continue
            values: dict[str, list] = {}
            for _, msg, schema in _decoded(plan, topic):
                for name, v in _vector(msg, schema, topic, plan.file).items():
                    values.setdefault(name, []).append(v)
            for name, vs in values.items():
                if len({v.shape for v in vs}) > 1:
                    raise _fail(f"topic {topic}: {name} changes length between messages", plan.file, "length_mismatch")
                column = out if name == "position" else f"observation.{name}"
                if out == "action" and name != "position":
                    continue
                columns[column] = np.stack(vs)[picks[topic]]
                keys[column] = topic
        table = build_table(columns, plan.fps, str(plan.file), keys, times=(rows - rows[0]) / 1e9)
        table = table.append_column("timestamp_ns", pa.array(rows))
        return LoadedTable(table, notes)

    def fingerprint(self) -> list:
        """Bag, size and plan."""
        p = self.plan
        return [str(p.file), size_of(p.file), p.fps, p.tolerance, p.topics, p.state, p.action]

    def estimated_bytes(self) -> int:
        """A guess: 1 kB."""
        return 1 << 10


def _image(msg, schema: str, topic: str, file: FileInput, k: int):
    if schema.endswith("CompressedImage"):
        data = bytes(msg.data)
        png = data.find(b"\x89PNG")  # compressedDepth puts a 12-byte header before its PNG
        return data[png:] if png > 0 else data
    enc, h, w = msg.encoding.lower(), int(msg.height), int(msg.width)
    raw = np.frombuffer(bytes(msg.data), np.uint8)
    try:
        if enc in ("mono16", "16uc1"):
            return raw.view(">u2" if msg.is_bigendian else "<u2").reshape(h, -1)[:, :w].astype(np.uint16)
        channels = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "8uc1": 1, "8uc3": 3}[enc]
        image = raw.reshape(h, -1)[:, : w * channels].reshape(h, w, channels)
    except (KeyError, ValueError) as exc:
        raise _fail(
            f"topic {topic} message {k}: {enc} image of {w}x{h} cannot be read ({exc})", file, kind="bad_image"
        ) from exc
    if enc.startswith("bgr"):
        image = image[..., [2, 1, 0]]
    if channels == 1:
        image = np.repeat(image, 3, axis=-1)
    return image[..., :3]


@dataclass(frozen=True)
class MCAPFrames(FrameReader):
    """A camera topic's frames on the bag's row clock (a message repeated where rows repeat it)."""

    plan: _Plan
    topic: str
    estimate: int = 0

    def chunks(self) -> Iterator[np.ndarray | list[bytes]]:
        """``CHUNK_FRAMES`` frames at a time, arrays or encoded images (CompressedImage)."""
        _, picks, _ = _resample(self.plan)
        wanted = picks[self.topic]
        last_use = np.full(int(wanted.max()) + 1, -1)
        last_use[wanted] = np.arange(wanted.size)  # the last row that shows each message
        held: dict[int, object] = {}  # decoded messages a row still to come shows
        row, chunk = 0, []
        for k, msg, schema in _decoded(self.plan, self.topic):
            if k >= last_use.size or last_use[k] < row:
                continue
            held[k] = _image(msg, schema, self.topic, self.plan.file, k)
            while row < wanted.size and int(wanted[row]) in held:
                chunk.append(held[int(wanted[row])])
                row += 1
                if len(chunk) >= CHUNK_FRAMES:
                    yield _stacked(chunk, row - len(chunk))
                    chunk = []
            held = {m: v for m, v in held.items() if last_use[m] >= row}
        if chunk:
            yield _stacked(chunk, row - len(chunk))

    def fingerprint(self) -> list:
        """Bag, size, plan, topic."""
        p = self.plan
        return [str(p.file), size_of(p.file), p.fps, p.tolerance, p.topics, self.topic]

    def estimated_bytes(self) -> int:
        """A share of the bag."""
        return self.estimate


def _stacked(chunk: list, row: int):
    if all(isinstance(c, bytes) for c in chunk):
        return list(chunk)
    if any(isinstance(c, bytes) for c in chunk):
        raise ConversionError("a topic mixes encoded and raw images", kind="bad_image", row=row)
    shapes = [c.shape for c in chunk]
    bad = next((i for i, s in enumerate(shapes) if s != shapes[0]), None)
    if bad is not None:
        raise ConversionError(
            f"frame is {shapes[bad][1]}x{shapes[bad][0]}, frame {row}'s is {shapes[0][1]}x{shapes[0][0]}",
            kind="frame_size_changed",
            row=row + bad,
        )
    return np.stack(chunk)


def _camera_name(topic: str) -> str:
    parts = [p for p in topic.strip("/").split("/") if p and p.lower() not in _NAME_NOISE]
    return "observation.images." + re.sub(r"[^A-Za-z0-9_]", "_", "_".join(parts) or "camera")


def _summary(file: FileInput) -> tuple[dict[str, str], dict[str, int]]:
    """(topic -> schema name, topic -> message count) from the bag's summary section."""
    try:
        with open_binary(file) as f:
            summary = _reader(f).get_summary()
    except Exception as exc:
        raise SourceError(f"{file}: not a readable MCAP file ({type(exc).__name__}: {exc})") from exc
    if summary is None:
        raise SourceError(f"{file}: the MCAP file has no summary section (not finished writing?); reindex it")
    schemas = {sid: s.name for sid, s in summary.schemas.items()}
    topics = {c.topic: schemas.get(c.schema_id, "") for c in summary.channels.values()}
    counts = {}
    if summary.statistics is not None:
        for cid, n in summary.statistics.channel_message_counts.items():
            counts[summary.channels[cid].topic] = n
    return topics, counts


def _default(topics: dict[str, str]) -> Mapping:
    cameras = {_camera_name(t): t for t, s in sorted(topics.items()) if s in IMAGE_TYPES}
    actionish = [
        t for t, s in sorted(topics.items()) if re.search(r"action|command", t) and s in (JOINT_TYPE, *ARRAY_TYPES)
    ]
    joints = [t for t, s in sorted(topics.items()) if s == JOINT_TYPE and t not in actionish]
    return Mapping(
        state=tuple(joints[:1]),
        action=tuple(actionish[:1]),
        cameras=cameras,
        depth=(),
        columns={},
        others=False,
    )


def open_mcap(
    root: str,
    options: SourceOptions,
    cameras: tuple[str, ...] | None,
    storage_options: dict | None,
    episodes: frozenset[int] | None,
) -> Source:
    """Describe a bag or a folder of bags: reads the first bag's summary (topics, schemas, counts).

    Raises:
        SourceError: no ``.mcap`` file, one without a summary, a mapped topic the first bag lacks,
            more than one topic for ``state`` or ``action``, or no rate to resample to.
    """
    files = source_files(root, (".mcap",), storage_options)
    if not files:
        raise SourceError(f"{root}: no MCAP file (*.mcap)")
    topics, counts = _summary(files[0])
    mapping = options.resolved(_default(topics))
    for field_name in ("state", "action"):
        if len(getattr(mapping, field_name) or ()) > 1:
            raise SourceError(
                f"mapping: {field_name} takes one topic in an MCAP source, got {getattr(mapping, field_name)}"
            )
    cams = kept_cameras(mapping.cameras, cameras, str(root))
    for topic in [*(mapping.state or ()), *(mapping.action or ()), *cams.values()]:
        if topic not in topics:
            raise SourceError(f"{files[0]}: no topic {topic} (topics: {', '.join(sorted(topics))}); see --mapping")
    fps = mapping.fps
    how = "given"
    if fps is None:
        rates = []
        for topic in cams.values():
            times = _times(_Plan(files[0], 1.0, None, (topic,), None, None))[topic]
            if times.size > 1:
                rates.append(1e9 / float(np.median(np.diff(np.sort(times)))))
        if not rates:
            raise SourceError(f"{root}: no camera topic to take a rate from; pass --fps")
        fps, how = round(min(rates), 2), "the slowest camera topic's median rate (pass --fps to choose)"
    state = (mapping.state or (None,))[0]
    action = (mapping.action or (None,))[0]
    used = sorted({*cams.values(), *(t for t in (state, action) if t)})
    notes = [
        f"mcap mapping: state = {state or 'none'}, action = {action or 'none'}, cameras = "
        + (", ".join(f"{c} <- {t}" for c, t in cams.items()) or "none")
        + f"; resampled to {fps:g} fps ({how}), nearest message within "
        + (f"{mapping.tolerance * 1000:g} ms" if mapping.tolerance else "a row period or the topic's own period")
    ]
    notes += [
        f"topic {t} ({topics[t]}, {counts.get(t, '?')} messages in {files[0]}) is not kept"
        for t in sorted(topics)
        if t not in used
    ]
    name = root.rstrip("/").rsplit("/", 1)[-1].removesuffix(".mcap") or "mcap"
    out = []
    for index, file in zip(episode_numbers([str(f) for f in files]), files, strict=True):
        if episodes is not None and index not in episodes:
            continue
        plan = _Plan(file, float(fps), mapping.tolerance, tuple(used), state, action)
        share = size_of(file) // max(1, len(cams))
        frames = {
            c: CameraFrames(MCAPFrames(plan, t, share), depth=c in (mapping.depth or ())) for c, t in cams.items()
        }
        out.append(
            Episode(
                source=name,
                episode_index=index,
                table=MCAPTable(plan),
                videos={},
                fps=float(fps),
                tasks=(mapping.task,) if mapping.task else (),
                robot="ros2",
                frames=frames,
            )
        )
    return Source(name=name, episodes=out, fps=float(fps), path=root, format="mcap", notes=notes)
