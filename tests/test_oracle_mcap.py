"""Oracle for ROS 2 bags in MCAP (issue 35): epishard's rows and frames against the bag's own readers.

The oracle reads each generated bag with the ``mcap`` package's reader and ``mcap_ros2``'s decoder
(``make_reader(f, decoder_factories=[DecoderFactory()]).iter_decoded_messages(log_time_order=False)``,
the messages in the order they lie in the file) and, where installed, with ``rosbags`` (an
independent MCAP reader and CDR decoder, and rosbag2's reader of a bag folder: ``metadata.yaml``'s
``relative_file_paths``, the files of a split recording in order). It then applies the resampling
rule of docs/sources/mcap.md ("Resampling") itself, from the decoded messages: a message's time is
its ``header.stamp`` (its log time when the stamp is zero or the type has no header); rows at
``t0 + r / fps`` from the latest first message of the mapped topics to the earliest last one; each
row takes, per topic, the message nearest its time (ties: the earlier; messages sharing a stamp: the
first in the bag); a row some topic has no message within the tolerance for (the larger of a row
period and the topic's median period, or the mapping's) is dropped. Images are turned to pixels by
the rules of sensor_msgs/Image's encodings (REP 118 / sensor_msgs image_encodings.hpp: ``bgr8`` is
B, G, R; ``mono8`` grey; ``16UC1``/``mono16`` 16-bit, ``is_bigendian`` giving the byte order; rows
``step`` bytes apart) and CompressedImage's data as FFmpeg decodes it.

Variations come from a seeded numpy Generator (``variation(seed)``): every image encoding the reader
maps, CompressedImage JPEG / PNG / 16-bit PNG / compressedDepth, JointState with and without velocity
and effort, Float64MultiArray and Float32MultiArray (with and without a layout), chunk compression
none / zstd / lz4, chunked and unchunked files, header stamps or log times, out-of-order and
duplicated stamps, gaps, a topic with one message, topics of different rates, bags split into several
files (a rosbag2 folder with ``metadata.yaml``), the default mapping or a given one, and fsspec URLs;
converted with workers=1 or 2. CI runs a seeded sample, ``EPISHARD_SWEEP=1`` all of them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import pickle
import statistics
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SWEEP
from sourcecheck import column, read_back, stream_rows

from epishard.shardwriter import ConvertOptions, SourceError, convert
from epishard.shardwriter.sources import Mapping, SourceOptions, open_source

pytest.importorskip("mcap_ros2")
from mcap.reader import make_reader
from mcap.writer import CompressionType
from mcap.writer import Writer as McapWriter
from mcap_ros2._dynamic import serialize_dynamic
from mcap_ros2.decoder import DecoderFactory

ROSBAGS = importlib.util.find_spec("rosbags") is not None  # the second oracle, where installed
MS = 1_000_000
T0 = 1_700_000_000 * 1_000_000_000
SEP = "=" * 80
CI_VARIATIONS = 13  # one for each camera kind (the first camera of variation ``seed`` is kind ``seed % 13``)
SWEEP_VARIATIONS = 120


def _def(body: str, *deps: tuple[str, str]) -> str:
    return body + "".join(f"\n{SEP}\nMSG: {n}\n{b}" for n, b in deps)


HEADER = ("std_msgs/Header", "builtin_interfaces/Time stamp\nstring frame_id")
TIME = ("builtin_interfaces/Time", "int32 sec\nuint32 nanosec")
LAYOUT = ("std_msgs/MultiArrayLayout", "MultiArrayDimension[] dim\nuint32 data_offset")
DIM = ("std_msgs/MultiArrayDimension", "string label\nuint32 size\nuint32 stride")
POINT = ("geometry_msgs/Point", "float64 x\nfloat64 y\nfloat64 z")
QUAT = ("geometry_msgs/Quaternion", "float64 x\nfloat64 y\nfloat64 z\nfloat64 w")
POSE = ("geometry_msgs/Pose", "Point position\nQuaternion orientation")
TYPES = {
    "image": ("sensor_msgs/msg/Image", _def(
        "std_msgs/Header header\nuint32 height\nuint32 width\nstring encoding\nuint8 is_bigendian\nuint32 step\n"
        "uint8[] data", HEADER, TIME)),
    "compressed": ("sensor_msgs/msg/CompressedImage", _def(
        "std_msgs/Header header\nstring format\nuint8[] data", HEADER, TIME)),
    "joints": ("sensor_msgs/msg/JointState", _def(
        "std_msgs/Header header\nstring[] name\nfloat64[] position\nfloat64[] velocity\nfloat64[] effort",
        HEADER, TIME)),
    "f64": ("std_msgs/msg/Float64MultiArray", _def("std_msgs/MultiArrayLayout layout\nfloat64[] data", LAYOUT, DIM)),
    "f32": ("std_msgs/msg/Float32MultiArray", _def("std_msgs/MultiArrayLayout layout\nfloat32[] data", LAYOUT, DIM)),
    "pose": ("geometry_msgs/msg/PoseStamped", _def("std_msgs/Header header\nPose pose", HEADER, TIME, POSE, POINT,
                                                    QUAT)),
}  # fmt: skip
RAW = ("rgb8", "bgr8", "rgba8", "bgra8", "mono8", "8UC1", "8UC3", "mono16", "16UC1")
COMPRESSED = ("jpeg", "png", "png16", "compressedDepth")
VECTORS = ("joints", "joints_vel", "joints_vel_eff", "f64", "f64_dims", "f32")
CHANNELS = {"rgb8": 3, "bgr8": 3, "8UC3": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "8UC1": 1, "mono16": 1, "16UC1": 1}


# -- writing bags -------------------------------------------------------------------------------------------


def _encode(image: np.ndarray, codec: str) -> bytes:
    """One image file of ``image`` (uint8 RGB, or uint16 grey for 16-bit PNG) with FFmpeg's encoder."""
    ctx = av.CodecContext.create(codec, "w")
    ctx.width, ctx.height, ctx.time_base = image.shape[1], image.shape[0], Fraction(1, 10)
    if image.dtype == np.uint16:
        ctx.pix_fmt, fmt = "gray16be", "gray16le"
    else:
        ctx.pix_fmt, fmt = ("yuvj444p" if codec == "mjpeg" else "rgb24"), "rgb24"
    frame = av.VideoFrame.from_ndarray(image, format=fmt)
    if codec == "mjpeg":
        frame = frame.reformat(format="yuvj444p")
    return b"".join(bytes(p) for p in [*ctx.encode(frame), *ctx.encode(None)])


def _header(t: int) -> dict:
    return {"stamp": {"sec": t // 1_000_000_000, "nanosec": t % 1_000_000_000}, "frame_id": "f"}


def image_message(rng: np.random.Generator, kind: str, h: int, w: int, pad: int, big: bool, stamp: int) -> dict:
    """A camera message of ``kind`` (an Image encoding or a CompressedImage format) with random pixels."""
    if kind in COMPRESSED:
        if kind in ("png16", "compressedDepth"):
            data = _encode(rng.integers(0, 65536, (h, w), dtype=np.uint16), "png")
        else:
            data = _encode(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "mjpeg" if kind == "jpeg" else "png")
        fmt = {"jpeg": "rgb8; jpeg compressed bgr8", "png": "png", "png16": "mono16; png compressed mono16",
               "compressedDepth": "16UC1; compressedDepth png"}[kind]  # fmt: skip
        if kind == "compressedDepth":  # compressed_depth_image_transport's ConfigHeader: format, 2 floats
            data = np.array([0], "<i4").tobytes() + np.array([0.0, 0.0], "<f4").tobytes() + data
        return {"header": _header(stamp), "format": fmt, "data": data}
    channels = CHANNELS[kind]
    pixel = 2 * channels if kind in ("mono16", "16UC1") else channels
    step = w * pixel + pad
    data = rng.integers(0, 256, h * step, dtype=np.uint8).tobytes()
    return {"header": _header(stamp), "height": h, "width": w, "encoding": kind, "is_bigendian": int(big),
            "step": step, "data": data}  # fmt: skip


def vector_message(rng: np.random.Generator, kind: str, n: int, stamp: int) -> tuple[str, dict]:
    """(type key, message) of a state/action topic of ``kind`` with ``n`` random values."""
    values = rng.standard_normal(n)
    if kind == "pose":
        pose = {"position": dict(zip("xyz", rng.standard_normal(3).tolist(), strict=True)), "orientation": {"w": 1.0}}
        return "pose", {"header": _header(stamp), "pose": pose}
    if kind.startswith("joints"):
        vel = rng.standard_normal(n).tolist() if "vel" in kind else []
        eff = rng.standard_normal(n).tolist() if "eff" in kind else []
        msg = {"header": _header(stamp), "name": [f"j{i}" for i in range(n)], "position": values.tolist(),
               "velocity": vel, "effort": eff}  # fmt: skip
        return "joints", msg
    dims = [{"label": "joints", "size": n, "stride": n}] if kind == "f64_dims" else []
    if kind == "f32":
        values = values.astype(np.float32)
    return kind[:3], {"layout": {"dim": dims, "data_offset": 0}, "data": values.tolist()}


def topic_stamps(rng: np.random.Generator, spec: dict, t0: int, span: int) -> list[tuple[int, int]]:
    """(header stamp or 0, log time) of a topic's messages, in the order the recorder logs them.

    ``spec``: rate (Hz), jitter (fraction of a period), swaps (adjacent pairs whose stamps are
    exchanged), dups (messages repeated with the same stamp), gap ((from, to) fractions of the span
    without messages), single (one message), zero (header stamps left 0: the log time counts).
    """
    period = 1e9 / spec["rate"]
    count = 1 if spec["single"] else max(2, int(span / period))
    base = t0 + int(rng.integers(0, int(period)))
    if spec["single"]:
        base = t0 + span // 2
    times = [base + round(i * period + rng.uniform(-1, 1) * spec["jitter"] * period) for i in range(count)]
    if spec["gap"]:
        a, b = (t0 + int(f * span) for f in spec["gap"])
        times = [t for t in times if not a <= t < b] or times[:1]
    stamps = list(times)
    for _ in range(spec["swaps"]):
        if len(stamps) > 3:
            i = int(rng.integers(0, len(stamps) - 1))
            stamps[i], stamps[i + 1] = stamps[i + 1], stamps[i]
    out = []
    for t, s in zip(times, stamps, strict=True):
        log = t + int(rng.integers(1, 3 * MS))  # log times follow the recorder's clock, in order
        out.append((0 if spec["zero"] else s, log))
    for _ in range(spec["dups"]):
        i = int(rng.integers(0, len(out)))
        stamp, log = out[i]
        out.insert(i + 1, (stamp, log + 1000))  # the same stamp again (other data), logged just after
    return out


def bag_messages(rng: np.random.Generator, v: dict, e: int) -> list[tuple[str, str, int, dict]]:
    """(topic, type key, log time, message) of episode ``e`` of variation ``v``, sorted by log time."""
    t0 = T0 + e * 60 * 10**9
    span = int(v["seconds"] * 1e9)
    out = []
    for topic, cam in v["cameras"].items():
        for stamp, log in topic_stamps(rng, cam["times"], t0, span):
            msg = image_message(rng, cam["kind"], cam["h"], cam["w"], cam["pad"], cam["big"], stamp)
            out.append((topic, "compressed" if cam["kind"] in COMPRESSED else "image", log, msg))
    for topic, vec in v["vectors"].items():
        for stamp, log in topic_stamps(rng, vec["times"], t0, span):
            kind, msg = vector_message(rng, vec["kind"], vec["n"], stamp)
            out.append((topic, kind, log, msg))
    out.sort(key=lambda m: m[2])
    return out


def write_mcap(path: Path, messages: list, compression: str, chunked: bool, chunk_size: int) -> None:
    """A ROS 2 MCAP file of ``messages`` in that order (mcap's writer; CDR from mcap_ros2's encoder)."""
    kind = {"none": CompressionType.NONE, "zstd": CompressionType.ZSTD, "lz4": CompressionType.LZ4}[compression]
    with open(path, "wb") as f:
        writer = McapWriter(f, chunk_size=chunk_size, compression=kind, use_chunking=chunked)
        writer.start(profile="ros2", library="epishard-oracle")
        schemas, channels, encoders = {}, {}, {}
        for topic, key, log, msg in messages:
            if key not in schemas:
                name, text = TYPES[key]
                schemas[key] = writer.register_schema(name, "ros2msg", text.encode())
                encoders[key] = serialize_dynamic(name, text)[name]
            if topic not in channels:
                channels[topic] = writer.register_channel(topic, "cdr", schemas[key])
            writer.add_message(channels[topic], log, encoders[key](msg), log)
        writer.finish()


def write_rosbag2(folder: Path, messages: list, parts: int, **kw) -> list[Path]:
    """A rosbag2 folder: ``messages`` split by log time into ``parts`` MCAP files and a ``metadata.yaml``.

    As ``ros2 bag record --max-bag-size`` leaves it: ``<folder>_<i>.mcap``, each file a whole MCAP
    with the schemas and channels of its own messages, listed in ``relative_file_paths`` in order.
    """
    folder.mkdir(parents=True)
    cuts = np.array_split(np.arange(len(messages)), parts)
    names = []
    for i, idx in enumerate(cuts):
        name = f"{folder.name}_{i}.mcap"
        write_mcap(folder / name, [messages[j] for j in idx], **kw)
        names.append(name)
    topics: dict[str, list] = {}
    for topic, key, _, _ in messages:
        topics.setdefault(topic, [TYPES[key][0], 0])[1] += 1
    logs = [m[2] for m in messages]
    lines = ["rosbag2_bagfile_information:", "  version: 5", "  storage_identifier: mcap",
             "  duration:", f"    nanoseconds: {max(logs) - min(logs)}", "  starting_time:",
             f"    nanoseconds_since_epoch: {min(logs)}", f"  message_count: {len(messages)}",
             "  topics_with_message_count:"]  # fmt: skip
    for topic, (name, count) in topics.items():
        lines += ["    - topic_metadata:", f"        name: {topic}", f"        type: {name}",
                  "        serialization_format: cdr", '        offered_qos_profiles: ""',
                  f"      message_count: {count}"]  # fmt: skip
    lines += ['  compression_format: ""', '  compression_mode: ""', "  relative_file_paths:"]
    lines += [f"    - {n}" for n in names]
    lines += ["  files:"]
    for name, idx in zip(names, cuts, strict=True):
        part = [logs[j] for j in idx]
        lines += [f"    - path: {name}", "      starting_time:", f"        nanoseconds_since_epoch: {min(part)}",
                  "      duration:", f"        nanoseconds: {max(part) - min(part)}",
                  f"      message_count: {len(idx)}"]  # fmt: skip
    (folder / "metadata.yaml").write_text("\n".join(lines) + "\n")
    return [folder / n for n in names]


# -- the variations -----------------------------------------------------------------------------------------


def _times(rng: np.random.Generator, rate: float, odd: bool) -> dict:
    return {
        "rate": rate,
        "jitter": float(rng.choice([0.0, 0.05, 0.2])),
        "swaps": int(rng.integers(0, 4)) if odd else 0,
        "dups": int(rng.integers(0, 3)) if odd else 0,
        "gap": None,
        "single": False,
        "zero": False,
    }


def variation(seed: int) -> dict:
    """A generated variation: topics, their types and times, how the bags are written and read."""
    rng = np.random.default_rng(seed)
    odd = bool(rng.random() < 0.5)
    kinds = [*RAW, *COMPRESSED]
    cameras = {}
    for c in range(int(rng.integers(1, 3))):
        kind = kinds[seed % len(kinds)] if c == 0 else str(rng.choice(kinds))
        h, w = (int(x) for x in rng.choice([8, 12, 16], 2))
        times = _times(rng, float(rng.choice([5.0, 10.0, 15.0, 30.0])), odd)
        cameras[f"/cam{c}/image_raw" + ("/compressed" if kind in COMPRESSED else "")] = {
            "kind": kind, "h": h, "w": w, "pad": int(rng.choice([0, 0, 4])), "big": bool(rng.random() < 0.3),
            "times": times,
        }  # fmt: skip
    vectors = {}
    state = str(rng.choice([*VECTORS, "none"]))
    action = str(rng.choice([*VECTORS, "none"]))
    extra = str(rng.choice([*VECTORS, "none", "none"]))
    for topic, kind in (("/joint_states", state), ("/joint_command", action), ("/gripper", extra)):
        if kind != "none":
            vectors[topic] = {"kind": kind, "n": int(rng.integers(1, 8)), "times": _times(
                rng, float(rng.choice([20.0, 50.0, 100.0])), odd)}  # fmt: skip
    topics = [*cameras.values(), *vectors.values()]
    if rng.random() < 0.25:  # header stamps left 0 on one topic: its log times count
        rng.choice(topics)["times"]["zero"] = True
    if rng.random() < 0.2 and len(topics) > 1:  # a topic with one message
        rng.choice(topics[1:])["times"]["single"] = True
    tolerance = None
    if rng.random() < 0.25:  # a gap in one topic, rows there dropped
        rng.choice(topics)["times"]["gap"] = (0.4, 0.6)
        tolerance = float(rng.choice([0.06, 0.1]))
    split = int(rng.choice([1, 1, 1, 2, 3]))
    return {
        "seed": seed,
        "cameras": cameras,
        "vectors": vectors,
        "state": "/joint_states" if state != "none" else None,
        "action": "/joint_command" if action != "none" else None,
        "columns": {"observation.gripper": "/gripper"} if extra != "none" else {},
        "default_mapping": bool(rng.random() < 0.3) and extra == "none",
        "fps": None if rng.random() < 0.3 else float(rng.choice([10.0, 20.0, 29.97, 30.0])),
        "tolerance": tolerance,
        "seconds": float(rng.choice([1.0, 1.5, 2.0])),
        "episodes": int(rng.integers(1, 4)),
        "split": split,
        "rosbag2": split > 1 or bool(rng.random() < 0.2),
        "compression": str(rng.choice(["none", "zstd", "lz4"])),
        "chunked": bool(rng.random() < 0.8),
        "chunk_size": int(rng.choice([2048, 16 << 10, 1 << 20])),
        "remote": str(rng.choice(["", "", "", "memory"])),
        "workers": int(rng.choice([1, 2])),
    }


def write_variation(v: dict, root: Path, patch=None) -> list[list[Path]]:
    """The variation's bags under ``root``; each episode's files, in the order rosbag2 reads them.

    ``patch``: a function of (topic, message dict) that may change a message before it is written.
    """
    rng = np.random.default_rng(v["seed"] + 1000)
    root.mkdir(parents=True)
    kw = {"compression": v["compression"], "chunked": v["chunked"], "chunk_size": v["chunk_size"]}
    episodes = []
    for e in range(v["episodes"]):
        messages = bag_messages(rng, v, e)
        for topic, _, _, msg in messages if patch else ():
            patch(topic, msg)
        if v["rosbag2"]:
            episodes.append(write_rosbag2(root / f"rec_{e}", messages, v["split"], **kw))
        else:
            write_mcap(root / f"rec_{e}.mcap", messages, **kw)
            episodes.append([root / f"rec_{e}.mcap"])
    return episodes


# -- the oracle ---------------------------------------------------------------------------------------------


def read_messages(files: list[Path], topics) -> dict[str, list[tuple[int, object]]]:
    """Topic -> (time, decoded message) in the bag's order: mcap's reader and mcap_ros2's decoder.

    The time is the header stamp, or the log time when the stamp is zero or the type has no header
    (docs/sources/mcap.md, "Resampling").
    """
    out: dict[str, list] = {t: [] for t in topics}
    for path in files:
        with open(path, "rb") as f:
            reader = make_reader(f, decoder_factories=[DecoderFactory()])
            for _, channel, message, msg in reader.iter_decoded_messages(topics=list(topics), log_time_order=False):
                header = getattr(msg, "header", None)
                stamp = header.stamp.sec * 10**9 + header.stamp.nanosec if header is not None else 0
                out[channel.topic].append((stamp or message.log_time, msg))
    return out


def _values(x) -> np.ndarray:
    return np.frombuffer(bytes(x), np.uint8) if isinstance(x, (bytes, bytearray, memoryview)) else np.asarray(x)


def rosbags_agrees(files: list[Path], messages: dict[str, list], rosbag2: bool) -> int:
    """rosbags (an independent MCAP reader and CDR decoder) reads the same messages; their count."""
    if not ROSBAGS:
        return 0
    from rosbags.highlevel import AnyReader as anyreader

    paths = [files[0].parent] if rosbag2 else files
    seen: dict[str, list] = {t: [] for t in messages}
    with anyreader(paths) as reader:
        conns = [c for c in reader.connections if c.topic in messages]
        for conn, log, raw in reader.messages(connections=conns):
            msg = reader.deserialize(raw, conn.msgtype)
            seen[conn.topic].append((log, msg))
    n = 0
    for topic, ours in messages.items():
        theirs = seen[topic]
        assert len(theirs) == len(ours), topic
        for (t, a), (log, b) in zip(ours, sorted(theirs, key=lambda m: m[0]), strict=True):
            header = getattr(b, "header", None)
            stamp = header.stamp.sec * 10**9 + header.stamp.nanosec if header is not None else 0
            assert (stamp or log) == t, topic
            for name in ("position", "velocity", "effort", "data", "encoding", "step", "format"):
                if hasattr(a, name):
                    assert np.array_equal(_values(getattr(a, name)), _values(getattr(b, name))), (topic, name)
            n += 1
    return n


def pixels(msg, kind: str) -> np.ndarray:
    """The image a camera message shows: uint8 RGB ``[H, W, 3]`` or uint16 ``[H, W]`` (REP 118 encodings)."""
    if kind in COMPRESSED:
        data = bytes(msg.data)
        if kind == "compressedDepth":
            data = data[12:]  # compressed_depth_image_transport's ConfigHeader
        with av.open(io.BytesIO(data)) as c:
            frame = next(c.decode(video=0))
        if kind in ("png16", "compressedDepth"):
            return frame.to_ndarray(format="gray16le")
        return frame.to_ndarray(format="rgb24")
    h, w, step = msg.height, msg.width, msg.step
    rows = np.frombuffer(bytes(msg.data), np.uint8).reshape(h, step)
    if msg.encoding in ("mono16", "16UC1"):
        return rows[:, : 2 * w].copy().view(">u2" if msg.is_bigendian else "<u2").astype(np.uint16)
    c = CHANNELS[msg.encoding]
    image = rows[:, : w * c].reshape(h, w, c)
    if msg.encoding in ("bgr8", "bgra8"):
        image = image[..., [2, 1, 0]]
    if c == 1:
        image = np.repeat(image, 3, axis=2)
    return np.ascontiguousarray(image[..., :3])


def vectors(msg) -> dict[str, np.ndarray]:
    """``position`` (JointState position or MultiArray data), ``velocity`` and ``effort`` when not empty."""
    if hasattr(msg, "position"):
        out = {"position": np.asarray(msg.position, np.float64)}
        out.update({k: np.asarray(getattr(msg, k), np.float64) for k in ("velocity", "effort") if getattr(msg, k)})
        return out
    return {"position": np.asarray(msg.data, np.float64)}


def default_fps(first: dict[str, list], cameras: list[str]) -> float:
    """The slowest camera topic's median rate of distinct stamps, rounded to 0.01 Hz (topics of one stamp
    have no rate)."""
    rates = []
    for topic in cameras:
        stamps = sorted({t for t, _ in first[topic]})
        if len(stamps) > 1:
            rates.append(1e9 / statistics.median(np.diff(stamps).tolist()))
    return round(min(rates), 2)


def resample(messages: dict[str, list], fps: float, tolerance: float | None) -> tuple[list[int], dict[str, list]]:
    """(row times, topic -> the message each row takes): docs/sources/mcap.md's rule, in exact arithmetic."""
    first = {}
    for topic, ms in messages.items():
        by_stamp: dict[int, object] = {}
        for t, msg in ms:
            by_stamp.setdefault(t, msg)  # the first in the bag's order
        first[topic] = sorted(by_stamp.items())
    start = max(v[0][0] for v in first.values())
    stop = min(v[-1][0] for v in first.values())
    rate = Fraction(fps)
    n = int((stop - start) * rate // 10**9) + 1
    grid = [start + round(Fraction(r * 10**9) / rate) for r in range(n)]
    rows, picks = [], {t: [] for t in messages}
    for g in grid:
        chosen = {}
        for topic, stamped in first.items():
            stamps = [s for s, _ in stamped]
            median = statistics.median(np.diff(stamps).tolist()) if len(stamps) > 1 else 0
            tol = tolerance * 1e9 if tolerance is not None else max(1e9 / fps, median)
            k = min(range(len(stamps)), key=lambda i: (abs(stamps[i] - g), stamps[i]))
            if abs(stamps[k] - g) > tol:
                break
            chosen[topic] = stamped[k][1]
        else:
            rows.append(g)
            for topic, msg in chosen.items():
                picks[topic].append(msg)
    return rows, picks


def camera_name(topic: str) -> str:
    noise = {"image_raw", "compressed", "image", "image_rect_color", "image_color", "color", "rgb"}
    return "observation.images." + "_".join(p for p in topic.strip("/").split("/") if p not in noise)


def mapped(v: dict) -> tuple[dict[str, str], dict[str, str]]:
    """(camera -> topic, column -> topic) the variation maps: given, or docs/sources/mcap.md's default mapping
    (every image topic a camera; the JointState topic not named like an action the state; a JointState or
    MultiArray topic named ``action`` or ``command`` the action)."""
    cams = {camera_name(t): t for t in v["cameras"]}
    kinds = {t: vec["kind"] for t, vec in v["vectors"].items()}
    state, action = v["state"], v["action"]
    if v["default_mapping"]:
        state = state if state and kinds[state].startswith("joints") else None
    columns = {"observation.state": state, "action": action, **v["columns"]}
    return cams, {c: t for c, t in columns.items() if t}


def expected(v: dict, episodes: list[list[Path]]) -> tuple[list[dict], int]:
    """Each episode's rows and frames as the oracle reads them, or the kind of error that refuses it
    (``length_mismatch``: no row has a message of every topic within the tolerance; ``no_rate``: no fps
    given and no camera with two distinct stamps, refused at open); and the messages rosbags agreed on."""
    cams, columns = mapped(v)
    topics = sorted({*cams.values(), *columns.values()})
    fps = v["fps"]
    out, agreed = [], 0
    for e, files in enumerate(episodes):
        messages = read_messages(files, topics)
        agreed += rosbags_agrees(files, messages, v["rosbag2"])
        if fps is None:
            if not any(len({t for t, _ in messages[c]}) > 1 for c in cams.values()):
                return [{"episode": e, "refused": "no_rate"}], agreed
            fps = default_fps(messages, list(cams.values()))
        rows, picks = resample(messages, fps, v["tolerance"])
        if not rows:
            out.append({"episode": e, "refused": "length_mismatch"})
            continue
        table = {"timestamp_ns": np.asarray(rows, np.int64)}
        for name, topic in columns.items():
            got = [vectors(m) for m in picks[topic]]
            table[name] = np.stack([g["position"] for g in got])
            if name == "observation.state":
                for k in ("velocity", "effort"):
                    if k in vectors(messages[topic][0][1]):
                        table[f"observation.{k}"] = np.stack([g[k] for g in got])
        frames = {c: np.stack([pixels(m, v["cameras"][t]["kind"]) for m in picks[t]]) for c, t in cams.items()}
        out.append({"episode": e, "table": table, "frames": frames, "fps": fps})
    return out, agreed


# -- converting and comparing -------------------------------------------------------------------------------


def options(v: dict, workers: int | None = None, **kw) -> ConvertOptions:
    cams = {camera_name(t): t for t in v["cameras"]}
    if v["default_mapping"]:
        mapping = Mapping(fps=v["fps"], tolerance=v["tolerance"])
    else:
        mapping = Mapping(state=(v["state"],) if v["state"] else (), action=(v["action"],) if v["action"] else (),
                          cameras=cams, columns=v["columns"], fps=v["fps"], tolerance=v["tolerance"])  # fmt: skip
    depth = tuple(c for c, t in cams.items() if v["cameras"][t]["kind"] in ("mono16", "16UC1", "png16",
                                                                              "compressedDepth"))  # fmt: skip
    if not v["default_mapping"]:  # the default mapping: 16-bit images are depth without being named
        mapping = Mapping(**{**mapping.__dict__, "depth": depth})
    return ConvertOptions(progress=False, workers=workers or v["workers"], max_episodes_per_shard=1,
                          sources=SourceOptions(format="mcap", mapping=mapping), **kw)  # fmt: skip


def compare(v: dict, out: str, manifest, want: list[dict], stream: bool = False) -> tuple[int, int]:
    """Epishard's output equals the oracle's, row by row and frame by frame, and the episodes the oracle
    finds no row for are skipped and counted; (rows, frames) compared. ``stream``: each camera's frames
    read through the stream reader (``WindowDataset``) too."""
    back = {index: ep for (_, index), ep in read_back(out).items()}
    refused = {w["episode"]: w["refused"] for w in want if "refused" in w}
    assert {s.episode: s.kind for s in manifest.report.skipped} == refused
    assert sorted(back) == [w["episode"] for w in want if "refused" not in w]
    rows = frames = 0
    for w in want:
        if "refused" in w:
            continue
        table = back[w["episode"]]["table"]
        assert column(table, "timestamp_ns").tolist() == w["table"]["timestamp_ns"].tolist(), v["seed"]
        stamps = w["table"]["timestamp_ns"]
        assert np.array_equal(column(table, "timestamp"), ((stamps - stamps[0]) / 1e9).astype(np.float32))
        names = {f.name for f in table.schema} - {"timestamp", "timestamp_ns", "frame_index", "episode_index",
                                                  "index", "task_index"}  # fmt: skip
        assert names == set(w["table"]) - {"timestamp_ns"}, (names, set(w["table"]))
        for name, values in w["table"].items():
            assert np.array_equal(column(table, name), values), (v["seed"], name)
        for cam, wf in w["frames"].items():
            got = back[w["episode"]]["frames"][cam]
            assert got.shape == wf.shape and np.array_equal(got, wf), (v["seed"], cam, got.shape, wf.shape)
            frames += len(wf)
        rows += table.num_rows
    if stream and rows:
        _, columns = mapped(v)
        keys = {"state_key": "observation.state" if "observation.state" in columns else None,
                "action_key": "action" if "action" in columns else None}  # fmt: skip
        for cam in next(w["frames"] for w in want if "frames" in w):
            samples = stream_rows(out, cam, **keys)
            assert len(samples) == rows
            for w in want:
                for i, frame in enumerate(w.get("frames", {}).get(cam, ())):
                    got = np.asarray(samples[(w["episode"], i)][cam][0])
                    assert np.array_equal(got, frame.transpose(2, 0, 1) if frame.ndim == 3 else frame[None]), (cam, i)
    return rows, frames


SEEDS = list(range(SWEEP_VARIATIONS)) if SWEEP else list(range(CI_VARIATIONS))
TOTALS = {"variations": 0, "rows": 0, "frames": 0, "messages": 0, "refused": 0}


def source(v: dict, folder: Path) -> str:
    """The variation's source: ``folder``, or its copy in fsspec's memory filesystem (``memory://``)."""
    if v["remote"] != "memory":
        return str(folder)
    import fsspec

    fs = fsspec.filesystem("memory")
    for path in folder.rglob("*"):
        if path.is_file():
            fs.pipe(f"/oracle{v['seed']}/{path.relative_to(folder.parent)}", path.read_bytes())
    return f"memory://oracle{v['seed']}/{folder.name}"


def run_oracle(v: dict, tmp_path: Path, patch=None, **kw) -> tuple:
    """Write ``v``, read it with the oracle and with ``convert``; both equal. (manifest, rows, frames, out)."""
    folder = tmp_path / f"bags{v['seed']}"
    want, agreed = expected(v, write_variation(v, folder, patch))
    out = str(tmp_path / "out")
    if want[0].get("refused") == "no_rate":
        with pytest.raises(SourceError, match=r"no camera topic to take a rate from.*pass --fps"):
            convert([source(v, folder)], out, options(v, on_error="skip", **kw))
        return None, 0, 0, out
    manifest = convert([source(v, folder)], out, options(v, on_error="skip", **kw))
    rows, frames = compare(v, out, manifest, want, stream=v["seed"] % 4 == 0)
    TOTALS["variations"] += 1
    TOTALS["rows"] += rows
    TOTALS["frames"] += frames
    TOTALS["messages"] += agreed
    TOTALS["refused"] += sum("refused" in w for w in want)
    print(f"oracle mcap seed {v['seed']}: {rows} rows, {frames} frames, {agreed} messages agreed: {TOTALS}")
    return manifest, rows, frames, out


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_bags_read_as_the_oracle_reads_them(seed, tmp_path):
    run_oracle(variation(seed), tmp_path)


def _t(rate: float, **kw) -> dict:
    return {"rate": rate, "jitter": 0.0, "swaps": 0, "dups": 0, "gap": None, "single": False, "zero": False, **kw}


def plain(**over) -> dict:
    """A small fixed variation: an rgb8 camera at 10 Hz, JointState with velocity at 50 Hz, two bags."""
    v = {"seed": 7, "cameras": {"/cam0/image_raw": {"kind": "rgb8", "h": 8, "w": 8, "pad": 0, "big": False,
                                                    "times": _t(10.0)}},
         "vectors": {"/joint_states": {"kind": "joints_vel", "n": 3, "times": _t(50.0)}},
         "state": "/joint_states", "action": None, "columns": {}, "default_mapping": False, "fps": 10.0,
         "tolerance": None, "seconds": 1.0, "episodes": 2, "split": 1, "rosbag2": False, "compression": "zstd",
         "chunked": True, "chunk_size": 1 << 20, "remote": "", "workers": 1}  # fmt: skip
    return {**v, **over}


# -- what the oracle found: each disagreement, fixed or refused -------------------------------------------------


def test_a_multiarray_has_no_header_so_its_log_time_is_its_time(tmp_path):
    # Float64MultiArray starts with its layout: with a dimension, the CDR bytes where a header's stamp
    # would be hold the dimension count and the label's length (1 s and 7 ns after 1970), which were
    # read as the stamp (rows refused as spanning 53 years, or none overlapping)
    action = {"kind": "f64_dims", "n": 4, "times": _t(50.0)}
    v = plain(vectors={**plain()["vectors"], "/joint_command": action}, action="/joint_command")
    manifest, rows, _, _ = run_oracle(v, tmp_path)
    assert manifest.totals.episodes == 2 and rows >= 2 * 8  # a row each 100 ms of a second: the oracle's rows
    f32 = plain(vectors={"/joint_states": {"kind": "f32", "n": 5, "times": _t(30.0)}}, seed=8, episodes=1)
    assert run_oracle(f32, tmp_path / "f32")[1] >= 8


def test_a_split_rosbag2_recording_is_one_episode_read_in_the_order_its_metadata_lists(tmp_path):
    # ros2 bag record --max-bag-size: one recording in several files; each was an episode of its own
    # (rows cut at every split, the first rows of each part resampled apart from the rest)
    v = plain(rosbag2=True, split=3, episodes=2, seconds=2.0, chunk_size=2048)
    manifest, rows, frames, _ = run_oracle(v, tmp_path)
    assert manifest.totals.episodes == 2 and rows == frames >= 2 * 18  # two seconds each, at 10 fps
    assert any("3 files read as one episode" in n for n in manifest.sources[0].notes)


def test_mapped_columns_are_kept_and_what_cannot_be_read_is_refused_at_open(tmp_path):
    # mapping.columns was silently ignored: topics named there are columns now (JointState position,
    # MultiArray data), resampled like the state
    gripper = {"kind": "f32", "n": 2, "times": _t(20.0)}
    v = plain(vectors={**plain()["vectors"], "/gripper": gripper}, columns={"observation.gripper": "/gripper"})
    manifest, rows, _, _ = run_oracle(v, tmp_path)
    assert rows >= 16 and any("observation.gripper <- /gripper" in n for n in manifest.sources[0].notes)
    pose = plain(seed=9, vectors={**plain()["vectors"], "/pose": {"kind": "pose", "n": 0, "times": _t(50.0)}})
    write_variation(pose, tmp_path / "pose")
    bag = str(tmp_path / "pose" / "rec_0.mcap")
    cases = {
        "state": (Mapping(state=("/pose",)), r"topic /pose \(state\) is geometry_msgs/msg/PoseStamped"),
        "column": (Mapping(columns={"observation.pose": "/pose"}), r"topic /pose \(column observation.pose\)"),
        "camera": (Mapping(cameras={"observation.images.p": "/pose"}), r"topic /pose \(camera observation.images.p\)"),
        "others": (Mapping(others=True), "others is not read from MCAP bags"),
        "reserved": (Mapping(columns={"action": "/joint_states"}), "'action' is a column the MCAP reader makes"),
    }
    for name, (mapping, words) in cases.items():
        opts = ConvertOptions(progress=False, sources=SourceOptions(fps=10, mapping=mapping))
        with pytest.raises(SourceError, match=words):
            convert([bag], str(tmp_path / f"o_{name}"), opts)


def test_compressed_images_are_read_by_their_format_not_by_a_search_for_png(tmp_path):
    # a JPEG whose comment holds the PNG signature was cut there (taken for compressedDepth's header)
    comment = b"\x89PNG\r\n\x1a\n: a camera's note"

    def commented(topic: str, msg: dict) -> None:
        if "format" in msg:
            data = msg["data"]
            msg["data"] = data[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + data[2:]

    cam = {"kind": "jpeg", "h": 16, "w": 16, "pad": 0, "big": False, "times": _t(10.0)}
    v = plain(cameras={"/cam0/image_raw/compressed": cam})
    assert run_oracle(v, tmp_path, commented)[2] >= 16
    # compressedDepth of 32FC1 is quantized inverse depth, rvl is not a PNG: refused, not stored as depth
    for fmt in ("32FC1; compressedDepth png", "16UC1; compressedDepth rvl"):
        cam = {**cam, "kind": "compressedDepth"}
        v = plain(cameras={"/cam0/image_raw/compressed": cam}, seed=11)
        folder = tmp_path / fmt.split(";")[0] / fmt[-3:]
        write_variation(v, folder, lambda topic, msg, fmt=fmt: msg.update(format=fmt) if "format" in msg else None)
        manifest = convert([str(folder)], str(tmp_path / f"o_{fmt[-3:]}{fmt[:2]}"), options(v, on_error="skip"))
        assert dict(manifest.report.skipped_by_kind) == {"bad_image": 2}
        assert all(fmt in s.message and "/cam0/image_raw/compressed" in s.message for s in manifest.report.skipped)


def _rosbag2(tmp_path: Path, name: str, **over) -> tuple[dict, Path]:
    v = plain(rosbag2=True, split=2, episodes=1, seed=12, **over)
    write_variation(v, tmp_path / name)
    return v, tmp_path / name / "rec_0"


def test_rosbag2_folders_that_cannot_be_read_whole_are_refused_naming_the_file(tmp_path):
    v, bag = _rosbag2(tmp_path, "flow")  # a flow-style list of files reads as the block list does
    meta = (bag / "metadata.yaml").read_text()
    block = "  relative_file_paths:\n    - rec_0_0.mcap\n    - rec_0_1.mcap\n"
    assert block in meta
    (bag / "metadata.yaml").write_text(meta.replace(block, '  relative_file_paths: ["rec_0_0.mcap", rec_0_1.mcap]\n'))
    want, _ = expected(v, [[bag / "rec_0_0.mcap", bag / "rec_0_1.mcap"]])
    manifest = convert([str(tmp_path / "flow")], str(tmp_path / "o_flow"), options(v))
    assert compare(v, str(tmp_path / "o_flow"), manifest, want)[0] >= 8
    cases = {
        "message": (lambda m: m.replace('compression_mode: ""', "compression_mode: MESSAGE"), "mode 'message'"),
        "sqlite": (lambda m: m.replace("storage_identifier: mcap", "storage_identifier: sqlite3"), "'sqlite3'"),
        "missing": (lambda m: m.replace("rec_0_1.mcap", "rec_0_7.mcap"), "missing: rec_0_7.mcap"),
        "unlisted": (lambda m: m.replace("    - rec_0_1.mcap\n", ""), "not listed: rec_0_1.mcap"),
        "no_list": (lambda m: m.replace("relative_file_paths", "paths"), "without relative_file_paths"),
    }
    for name, (change, words) in cases.items():
        _, bag = _rosbag2(tmp_path, name)
        (bag / "metadata.yaml").write_text(change((bag / "metadata.yaml").read_text()))
        with pytest.raises(SourceError, match=words) as err:
            convert([str(tmp_path / name)], str(tmp_path / f"o_{name}"), options(v))
        assert "metadata.yaml" in str(err.value)


@pytest.mark.skipif(not ROSBAGS, reason="rosbags is not installed (its rosbag2 writer makes this bag)")
def test_a_bag_written_by_rosbags_rosbag2_writer_reads_as_the_oracle_reads_it(tmp_path):
    """rosbags' Writer (rosbag2 version 9, MCAP storage): its metadata.yaml, its chunking and CDR, its types."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    image, joints, array = (store.types[n] for n in ("sensor_msgs/msg/Image", "sensor_msgs/msg/JointState",
                                                     "std_msgs/msg/Float64MultiArray"))  # fmt: skip
    header, time, layout = (store.types[n] for n in ("std_msgs/msg/Header", "builtin_interfaces/msg/Time",
                                                     "std_msgs/msg/MultiArrayLayout"))  # fmt: skip
    rng = np.random.default_rng(5)
    folder = tmp_path / "bags" / "rosbags_0"
    folder.parent.mkdir()
    with Writer(folder, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        cam = writer.add_connection("/cam/image_raw", image.__msgtype__, typestore=store)
        js = writer.add_connection("/joint_states", joints.__msgtype__, typestore=store)
        cmd = writer.add_connection("/arm/command", array.__msgtype__, typestore=store)
        for k in range(50):
            t = T0 + k * 20 * MS
            head = header(stamp=time(sec=t // 10**9, nanosec=t % 10**9), frame_id="f")
            if k % 5 == 0:
                pixels_ = rng.integers(0, 256, 8 * 12 * 3, dtype=np.uint8)
                msg = image(header=head, height=8, width=12, encoding="bgr8", is_bigendian=0, step=36, data=pixels_)
                writer.write(cam, t + MS, store.serialize_cdr(msg, image.__msgtype__))
            empty = np.zeros(0)
            msg = joints(header=head, name=["a", "b"], position=rng.standard_normal(2), velocity=empty, effort=empty)
            writer.write(js, t + 2 * MS, store.serialize_cdr(msg, joints.__msgtype__))
            msg = array(layout=layout(dim=[], data_offset=0), data=rng.standard_normal(3))
            writer.write(cmd, t + 3 * MS, store.serialize_cdr(msg, array.__msgtype__))
    v = plain(cameras={"/cam/image_raw": {"kind": "bgr8"}}, vectors={"/joint_states": {"kind": "joints"},
              "/arm/command": {"kind": "f64"}}, default_mapping=True, action="/arm/command", fps=None,
              rosbag2=True)  # fmt: skip
    want, agreed = expected(v, [[folder / "rosbags_0.mcap"]])
    assert agreed == 10 + 50 + 50 and want[0]["fps"] == 10.0
    manifest = convert([str(tmp_path / "bags")], str(tmp_path / "out"), options(v))
    assert compare(v, str(tmp_path / "out"), manifest, want) == (9, 9)  # from the command's first log time (+3 ms)


# -- concurrency: workers=2, over HTTP, and Ray, byte-identical to workers=1 -------------------------------------

LOOPS = 20 if SWEEP else 3


def test_the_parent_holds_no_open_bag_and_episodes_carry_names_only(tmp_path):
    """Opening the source reads summaries and closes each bag: a forked or spawned worker opens its own."""
    v = concurrent_variation()
    _mixed(v, tmp_path)
    source = open_source(str(tmp_path / "bags"), SourceOptions(format="mcap", mapping=Mapping(fps=None)))
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
    assert not [f for f in fds if f.endswith(".mcap")], fds
    assert len(source.episodes) == 4
    data = pickle.dumps(source.episodes)
    assert len(data) < 16 << 10 and b"rec_0_2.mcap" in data  # file names and the plan, not messages


def _files(out: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(out).iterdir()) if p.is_file()}


def concurrent_variation() -> dict:
    """Four episodes, two of them rosbag2 recordings split in three: a JPEG camera, a raw one, three topics."""
    cams = {
        "/cam0/image_raw/compressed": {
            "kind": "jpeg",
            "h": 16,
            "w": 16,
            "pad": 0,
            "big": False,
            "times": _t(10.0, jitter=0.1, swaps=2, dups=1),
        },
        "/cam1/image_raw": {"kind": "mono16", "h": 8, "w": 12, "pad": 4, "big": True, "times": _t(15.0)},
    }
    vectors = {"/joint_states": {"kind": "joints_vel_eff", "n": 6, "times": _t(50.0, jitter=0.2)},
               "/joint_command": {"kind": "f64_dims", "n": 6, "times": _t(20.0)}}  # fmt: skip
    return plain(seed=21, cameras=cams, vectors=vectors, action="/joint_command", episodes=4, fps=None,
                 compression="lz4", chunk_size=4096)  # fmt: skip


def _mixed(v: dict, root: Path) -> list[list[Path]]:
    """``root / "bags"``: episodes 0 and 2 as rosbag2 recordings split in three, 1 and 3 as bags; their files."""
    write_variation({**v, "rosbag2": True, "split": 3}, root / "split")
    write_variation(v, root / "bags")
    episodes = []
    for e in range(v["episodes"]):
        if e % 2:
            episodes.append([root / "bags" / f"rec_{e}.mcap"])
            continue
        (root / "bags" / f"rec_{e}.mcap").unlink()
        (root / "split" / f"rec_{e}").rename(root / "bags" / f"rec_{e}")
        episodes.append(sorted((root / "bags" / f"rec_{e}").glob("*.mcap")))
    return episodes


def test_concurrent_conversions_are_byte_identical_to_workers_1_and_to_the_oracle(tmp_path):
    v = concurrent_variation()
    bags = tmp_path / "bags"
    want, _ = expected(v, _mixed(v, tmp_path))
    reference = str(tmp_path / "one")
    manifest = convert([str(bags)], reference, options(v, workers=1))
    rows, frames = compare(v, reference, manifest, want, stream=True)
    assert manifest.totals.episodes == 4 and rows > 0 and frames == 2 * rows
    files = _files(reference)
    assert sum(name.endswith(".tar") for name in files) == 4
    for loop in range(LOOPS):
        out = str(tmp_path / f"two-{loop}")
        convert([str(bags)], out, options(v, workers=2))
        assert _files(out) == files, loop
    from remote_servers import serve_http

    # over HTTP, each worker opens its bag itself (range requests); a folder's URL is taken for a file
    # by base.source_files (HTTP answers any URL), so the two bags are given one by one
    local = [str(bags / f"rec_{e}.mcap") for e in (1, 3)]
    convert(local, str(tmp_path / "local"), options(v, workers=1))
    server, base = serve_http(str(tmp_path))
    try:
        convert([f"{base}/bags/rec_{e}.mcap" for e in (1, 3)], str(tmp_path / "http"), options(v, workers=2))
    finally:
        server.shutdown()
    got, files = _files(str(tmp_path / "http")), _files(str(tmp_path / "local"))
    assert sorted(got) == sorted(files)
    for name, data in files.items():  # the plan digest holds the bags' paths: the shards are the same bytes
        if name.endswith(".tar"):
            assert got[name] == data, name
        elif name.endswith(".parquet"):
            assert pq.read_table(pa.BufferReader(got[name])).equals(pq.read_table(pa.BufferReader(data))), name


@pytest.fixture(scope="module")
def ray_address(netns):
    """A 2-node Ray cluster on loopback (``raycluster``), once for the module."""
    import raycluster

    with raycluster.cluster() as address:
        yield address


def _ray_unavailable() -> str | None:
    import raycluster

    return raycluster.unavailable()


@pytest.mark.skipif(_ray_unavailable() is not None, reason=str(_ray_unavailable()))
def test_ray_conversion_equals_the_oracle_and_workers_1(ray_address, tmp_path):
    """The concurrent variation through ``RayRunner``: the same files as workers=1 (``LOOPS`` times under
    SWEEP, once in CI), so the oracle's values."""
    from epishard.shardwriter.ray_convert import RayRunner

    v = concurrent_variation()
    _mixed(v, tmp_path)
    reference = str(tmp_path / "one")
    convert([str(tmp_path / "bags")], reference, options(v, workers=1))
    for loop in range(LOOPS if SWEEP else 1):
        out = str(tmp_path / f"ray-{loop}")
        convert([str(tmp_path / "bags")], out, options(v, workers=1), runner=RayRunner(ray_address))
        assert _files(out) == _files(reference), loop
