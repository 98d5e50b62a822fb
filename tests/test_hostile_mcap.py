"""Hostile ROS 2 bags (issue 36): stamps that size the row clock, duplicated and reversed stamps,
claims inside messages and chunks, damaged records, and a ``.mcap`` link to a FIFO.

Each bag is tiny and written here (mcap-ros2-support's writer, or record by record where a chunk's
header must lie). What would allocate from a claim runs in one child process under a 3 GiB
address-space limit (``RLIMIT_AS``) and a timeout: a regression fails there with a ``MemoryError``
instead of eating the machine. Every failure must be a named ``ConversionError`` (its ``kind``, the
bag, the topic) or a ``SourceError`` at open, never ``[internal]`` or the CLI's "unexpected".
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
import weakref
from pathlib import Path

import lz4.frame
import numpy as np
import pytest
import zstandard
from sourcecheck import column, read_back
from videogen import decode_frame_number, encode_frame_number

from epishard.cli import main
from epishard.shardwriter import ConversionError, ConvertOptions, SourceError, convert
from epishard.shardwriter.sources import Mapping, SourceOptions, bounds, mcap_bag, open_source

pytest.importorskip("mcap_ros2")
from mcap.data_stream import RecordBuilder
from mcap.reader import make_reader
from mcap.records import Chunk, ChunkIndex, DataEnd, Footer, Header
from mcap.writer import CompressionType
from mcap.writer import Writer as McapWriter
from mcap_ros2.writer import Writer

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
LIMIT = 3 << 30  # the child's address space: a row clock over 14 years (70 GB) cannot be allocated
MS = 1_000_000
T0 = 1_700_000_000 * 1_000_000_000
YEARS_14 = 14 * 365 * 24 * 3600 * 1_000_000_000
MAGIC = b"\x89MCAP0\r\n"
CAM, JOINT = "/cam/image_raw", "/joint_states"
CAMERA = "observation.images.cam"
SEP = "=" * 80
TIME = "builtin_interfaces/Time"
HEADER = f"std_msgs/Header header\n{SEP}\nMSG: std_msgs/Header\n{TIME} stamp\nstring frame_id\n{SEP}\nMSG: {TIME}\n"
HEADER += "int32 sec\nuint32 nanosec"
IMAGE_DEF = "uint32 height\nuint32 width\nstring encoding\nuint8 is_bigendian\nuint32 step\nuint8[] data"
JOINT_DEF = "string[] name\nfloat64[] position\nfloat64[] velocity\nfloat64[] effort"
TYPES = {
    "image": ("sensor_msgs/msg/Image", IMAGE_DEF),
    "joints": ("sensor_msgs/msg/JointState", JOINT_DEF),
}


def _definition(body: str) -> str:
    head, deps = HEADER.split("\n", 1)
    return f"{head}\n{body}\n{deps}"


def header(t: int) -> dict:
    return {"stamp": {"sec": t // 1_000_000_000, "nanosec": t % 1_000_000_000}, "frame_id": "base"}


def image(t: int, n: int, h: int = 32, w: int = 32, **over) -> dict:
    data = encode_frame_number(n, h, w).tobytes()
    return {"header": header(t), "height": h, "width": w, "encoding": "rgb8", "is_bigendian": 0, "step": 3 * w,
            "data": data, **over}  # fmt: skip


def joints(t: int, k: int, n: int = 4) -> dict:
    return {"header": header(t), "name": [], "position": [k + 0.25 * j for j in range(n)], "velocity": [],
            "effort": []}  # fmt: skip


def write(path, messages, chunk_size=64 << 10, compression=CompressionType.ZSTD, types=None) -> str:
    """A bag of ``messages`` in file order: (topic, type name in ``TYPES``, log time, message dict)."""
    types = {**TYPES, **(types or {})}
    with open(path, "wb") as f:
        writer = Writer(f, chunk_size=chunk_size, compression=compression)
        schemas = {}
        for topic, kind, log, msg in messages:
            if kind not in schemas:
                name, body = types[kind]
                schemas[kind] = writer.register_msgdef(name, _definition(body))
            writer.write_message(topic, schemas[kind], msg, log_time=log, publish_time=log)
        writer.finish()
    return str(path)


def honest(cam=None, joint=None, e: int = 0, log=None) -> list:
    """Camera 10 Hz (frame ``100 e + i``) and joints 50 Hz over 1 s, sorted by log time (stamp + 2 ms).

    ``cam`` / ``joint``: the stamps instead; ``log``: ``(topic, i, stamp) -> log time``.
    """
    cam = cam if cam is not None else [T0 + i * 100 * MS for i in range(10)]
    joint = joint if joint is not None else [T0 + k * 20 * MS for k in range(50)]
    log = log or (lambda topic, i, t: t + 2 * MS)
    out = [(CAM, "image", log(CAM, i, t), image(t, 100 * e + i)) for i, t in enumerate(cam)]
    out += [(JOINT, "joints", log(JOINT, k, t), joints(t, k)) for k, t in enumerate(joint)]
    return sorted(out, key=lambda m: m[2])


def _opts(fps=10, on_error="raise", **kw) -> ConvertOptions:
    mapping = kw.pop("mapping", Mapping())
    return ConvertOptions(progress=False, on_error=on_error, sources=SourceOptions(fps=fps, mapping=mapping, **kw))


def _frames(ep) -> list[int]:
    return [decode_frame_number(f) for f in ep["frames"][CAMERA]]


def _named(exc, kind: str, file: str, *words: str) -> None:
    """``exc`` is a ConversionError of ``kind`` naming ``file`` and each of ``words``."""
    assert isinstance(exc, ConversionError), repr(exc)
    assert exc.kind == kind, str(exc)
    assert exc.path and exc.path.endswith(file), str(exc)
    for word in words:
        assert word in str(exc), (word, str(exc))


# -- bags forged record by record ----------------------------------------------------------------------


def forge(src: str, dst: str, *, compression="zstd", data=None, usize=None, data_length=None, offset=None) -> str:
    """``src``'s schemas, channels and messages rewritten as one chunk whose header may lie.

    ``data``: the chunk's compressed bytes (default: the records compressed); ``usize``: its
    ``uncompressed_size`` claim; ``data_length``: the records length its header claims; ``offset``:
    the chunk's offset in the summary's chunk index. The summary (schemas, channels, chunk index)
    is consistent otherwise, so the source opens.
    """
    with open(src, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        messages = [m for _, _, m in reader.iter_messages()]
    inner = RecordBuilder()
    for m in messages:
        m.write(inner)
    raw = inner.end()
    if data is None:
        data = {"zstd": zstandard.ZstdCompressor().compress, "lz4": lz4.frame.compress, "": bytes}[compression](raw)
    usize = len(raw) if usize is None else usize
    first, last = min(m.log_time for m in messages), max(m.log_time for m in messages)
    b = RecordBuilder()
    b.write(MAGIC)
    Header(profile="ros2", library="forged").write(b)
    for record in [*summary.schemas.values(), *summary.channels.values()]:
        record.write(b)
    start = b.count
    Chunk(compression=compression, data=data, message_start_time=first, message_end_time=last,
          uncompressed_crc=0, uncompressed_size=usize).write(b)  # fmt: skip
    length = b.count - start
    DataEnd(data_section_crc=0).write(b)
    summary_start = b.count
    for record in [*summary.schemas.values(), *summary.channels.values()]:
        record.write(b)
    ChunkIndex(message_start_time=first, message_end_time=last, chunk_start_offset=offset or start,
               chunk_length=length, message_index_offsets={}, message_index_length=0, compression=compression,
               compressed_size=len(data), uncompressed_size=usize).write(b)  # fmt: skip
    Footer(summary_start=summary_start, summary_offset_start=0, summary_crc=0).write(b)
    b.write(MAGIC)
    out = bytearray(b.end())
    if data_length is not None:  # the records length sits after 3 times, the size, the crc, the compression
        at = start + 9 + 8 * 3 + 4 + 4 + len(compression)
        out[at : at + 8] = data_length.to_bytes(8, "little")
    with open(dst, "wb") as f:
        f.write(out)
    return dst


def lz4_bomb(raw: bytes, extra: int) -> bytes:
    """An LZ4 frame of ``raw`` then ``extra`` zero bytes (without a content size): 255:1 at most."""
    c = lz4.frame.LZ4FrameCompressor()
    parts = [c.begin(), c.compress(raw)]
    zeros = bytes(64 << 20)
    for _ in range(extra // len(zeros)):
        parts.append(c.compress(zeros))
    parts.append(c.flush())
    return b"".join(parts)


# -- the memory-limited child ----------------------------------------------------------------------------

_CHILD = r"""
import json, resource, sys
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from epishard.shardwriter import ConvertOptions, convert
from epishard.shardwriter.sources import Mapping, SourceOptions, bounds

results = {}
for name, case in json.loads(sys.argv[1]).items():
    saved = {k: getattr(bounds, k) for k in case.get("bounds", {})}
    for k, v in case.get("bounds", {}).items():
        setattr(bounds, k, v)
    try:
        mapping = Mapping.from_dict(case.get("mapping", {}))
        sources = SourceOptions(fps=case.get("fps"), mapping=mapping)
        options = ConvertOptions(progress=False, on_error=case.get("on_error", "raise"), sources=sources)
        m = convert([case["src"]], case["out"], options)
        results[name] = {"episodes": m.totals.episodes, "skipped": dict(m.report.skipped_by_kind)}
    except BaseException as exc:  # MemoryError, OverflowError: a regression, reported not raised
        results[name] = {"error": type(exc).__name__, "kind": getattr(exc, "kind", None),
                         "path": getattr(exc, "path", None), "message": str(exc)[:2000]}
    for k, v in saved.items():
        setattr(bounds, k, v)
print("RESULT " + json.dumps(results))
"""


def _in_child(cases: dict[str, dict], timeout: float = 240) -> dict[str, dict]:
    """Run ``_CHILD`` on ``cases`` (name -> src, out, fps, on_error, mapping, bounds) under the limit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, REPO])}
    argv = [sys.executable, "-c", _CHILD, json.dumps(cases), str(LIMIT)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> tuple[str, dict[str, dict]]:
    """The bags whose claims would allocate, and what ``convert`` did with each in the limited child."""
    base = tmp_path_factory.mktemp("limited")
    cases: dict[str, dict] = {}

    def case(name: str, src: str, **kw) -> None:
        cases[name] = {"src": src, "out": str(base / f"out_{name}"), "fps": 10, **kw}

    # 1. a clock that jumps 14 years: every mapped topic's last message (the span the rows run over)
    folder = base / "span"
    folder.mkdir()
    for e in (0, 2):
        write(folder / f"good_{e}.mcap", honest(e=e))
    jumped = honest(e=1)
    for topic in (CAM, JOINT):
        i = max(i for i, m in enumerate(jumped) if m[0] == topic)
        t, kind, log, msg = jumped[i]
        jumped[i] = (t, kind, log, {**msg, "header": header(T0 + YEARS_14)})
    write(folder / "bad_1.mcap", jumped)
    case("span", str(folder))
    case("span_skip", str(folder), on_error="skip")
    # 1. one topic mapped: one message's stamp alone sets the span
    one = [m for m in honest() if m[0] == CAM]
    one[3] = (*one[3][:3], {**one[3][3], "header": header(T0 - YEARS_14)})
    case("outlier", write(base / "outlier.mcap", one), mapping={"state": [], "action": []})
    # 1. an honest second at 10^8 rows per second: the row count, not the span
    case("rows", write(base / "rows.mcap", honest()), fps=100_000_000)
    # 4. chunks whose header claims what the file does not hold
    plain = write(base / "plain.mcap", honest())
    case("usize", forge(plain, str(base / "usize.mcap"), usize=1 << 40))
    case("length", forge(plain, str(base / "length.mcap"), data_length=1 << 40))
    case("offset", forge(plain, str(base / "offset.mcap"), offset=1 << 40))
    with open(plain, "rb") as f:
        inner = RecordBuilder()
        for _, _, m in make_reader(f).iter_messages():
            m.write(inner)
        raw = inner.end()
    bomb = lz4_bomb(raw, 3 << 30)  # 3 GiB of zeros after the records, an honest-looking claim
    case("bomb", forge(plain, str(base / "bomb.mcap"), compression="lz4", data=bomb, usize=len(raw)))
    return str(base), _in_child(cases)


def test_a_clock_jump_of_14_years_is_refused_before_the_row_clock_is_allocated(limited):
    base, results = limited
    got = results["span"]
    assert got["error"] == "ConversionError" and got["kind"] == "too_large", got
    assert got["path"].endswith("bad_1.mcap"), got
    for word in (CAM, JOINT, str(T0), str(T0 + YEARS_14), "MAX_SPAN_S"):
        assert word in got["message"], (word, got["message"])
    got = results["span_skip"]  # the bag is skipped and counted; the other two convert whole
    assert got == {"episodes": 2, "skipped": {"too_large": 1}}, got
    back = read_back(os.path.join(base, "out_span_skip"))
    assert sorted(back) == [("span", 0), ("span", 2)]
    for e in (0, 2):
        ep = back[("span", e)]
        assert ep["table"].num_rows == 10  # a row per camera message
        assert _frames(ep) == [100 * e + i for i in range(10)]
        assert column(ep["table"], "timestamp_ns").tolist() == [T0 + i * 100 * MS for i in range(10)]


def test_one_outlier_stamp_of_the_only_topic_and_a_row_count_beyond_the_bound_are_refused(limited):
    _, results = limited
    got = results["outlier"]
    assert got["kind"] == "too_large" and got["path"].endswith("outlier.mcap"), got
    assert CAM in got["message"] and str(T0 - YEARS_14) in got["message"], got
    got = results["rows"]  # 1 s at 10^8 fps: 10^8 rows, more than MAX_ROWS
    assert got["kind"] == "too_large" and "MAX_ROWS" in got["message"], got


def test_chunk_claims_beyond_the_file_or_the_bound_are_named_before_allocation(limited):
    _, results = limited
    got = results["usize"]  # 1 TiB claimed
    assert got["kind"] == "too_large" and got["path"].endswith("usize.mcap"), got
    assert str(1 << 40) in got["message"] and "chunk" in got["message"], got
    for name in ("length", "offset"):  # a records length or an offset past the end of the file
        got = results[name]
        assert got["kind"] == "unreadable_file" and got["path"].endswith(f"{name}.mcap"), got
        assert "chunk" in got["message"] and "past the end" in got["message"], got
    got = results["bomb"]  # LZ4 decompressing to 3 GiB past its declared size: stopped at the claim
    assert got["kind"] == "unreadable_file" and "more than the" in got["message"], got


# -- 1, 2: stamps ---------------------------------------------------------------------------------------


def test_a_log_time_past_int64_is_named(tmp_path):
    messages = honest()
    i = next(i for i, m in enumerate(messages) if m[0] == CAM)
    messages[i] = (CAM, "image", (1 << 64) - 1, {**messages[i][3], "header": header(0)})  # no stamp: log time
    bag = write(tmp_path / "far.mcap", messages)
    with pytest.raises(ConversionError) as err:
        convert([bag], str(tmp_path / "out"), _opts())
    _named(err.value, "too_large", "far.mcap", CAM, str((1 << 64) - 1))


def test_every_camera_message_at_one_stamp_is_named_at_open_and_counted_with_fps(tmp_path, capsys):
    t = T0 + 500 * MS
    bag = write(tmp_path / "same.mcap", honest(cam=[t] * 10))
    code = main(["convert", bag, str(tmp_path / "out")])  # no --fps: the rate would be 1 / 0
    err = capsys.readouterr().err
    assert code == 2 and "unexpected" not in err and "ZeroDivisionError" not in err, err
    assert "same.mcap" in err and CAM in err and "--fps" in err, err
    manifest = convert([bag], str(tmp_path / "out2"), _opts())
    back = read_back(str(tmp_path / "out2"))[("same", 0)]
    assert column(back["table"], "timestamp_ns").tolist() == [t]
    assert _frames(back) == [0]  # of messages sharing a stamp, the first in the bag
    notes = [w.message for w in manifest.report.warnings if w.kind == "resampled" and w.message.startswith(CAM)]
    assert len(notes) == 1 and "9 messages share a stamp" in notes[0], notes


def test_a_camera_rate_that_rounds_to_zero_is_refused_at_open(tmp_path):
    bag = write(tmp_path / "slow.mcap", honest(cam=[T0, T0 + 1000 * 10**9], joint=[T0, T0 + 1000 * 10**9]))
    with pytest.raises(SourceError, match=r"slow\.mcap.*--fps"):
        convert([bag], str(tmp_path / "out"), _opts(fps=None))


def test_duplicated_and_out_of_order_stamps_resample_exactly_and_are_counted(tmp_path):
    # 10 stamps, each twice (frames i and 10 + i); each pair written in reversed order of stamp with
    # its neighbour: file order 1, 0, 3, 2, ... (the recorder's order, log time increasing)
    stamps = [T0 + i * 100 * MS for i in range(10)]
    cams = []
    for i in range(0, 10, 2):
        for j in (i + 1, i):
            cams += [(stamps[j], j), (stamps[j], 10 + j)]
    messages = [(CAM, "image", T0 + 2 * MS + k * MS, image(t, n)) for k, (t, n) in enumerate(cams)]
    messages += [(JOINT, "joints", T0 + k * 20 * MS + 2 * MS, joints(T0 + k * 20 * MS, k)) for k in range(50)]
    bag = write(tmp_path / "dup.mcap", messages)
    manifest = convert([bag], str(tmp_path / "out"), _opts())
    back = read_back(str(tmp_path / "out"))[("dup", 0)]
    assert column(back["table"], "timestamp_ns").tolist() == stamps
    assert _frames(back) == list(range(10))  # the first message of each stamp in the bag's order
    note = next(w.message for w in manifest.report.warnings if w.kind == "resampled" and w.message.startswith(CAM))
    assert "20 messages at 10.00 Hz" in note and "10 messages unused" in note, note
    assert "10 messages share a stamp" in note and "5 out of stamp order" in note, note


# -- 3: holding -------------------------------------------------------------------------------------------


@pytest.fixture
def held(monkeypatch):
    """The most decoded camera images alive at once (counted through ``mcap_bag._image``)."""
    state = {"live": 0, "peak": 0}
    decode = mcap_bag._image

    def counted(*args, **kw):
        out = decode(*args, **kw)
        if isinstance(out, np.ndarray):
            state["live"] += 1
            state["peak"] = max(state["peak"], state["live"])
            weakref.finalize(out, lambda: state.__setitem__("live", state["live"] - 1))
        return out

    monkeypatch.setattr(mcap_bag, "_image", counted)
    return state


def test_stamps_running_against_log_time_are_refused_before_images_are_held(tmp_path, held):
    n = 120  # header stamps decreasing while log time increases: the first row needs the last message
    cam = [T0 + (n - 1 - i) * 100 * MS for i in range(n)]
    joint = [T0 + k * 20 * MS for k in range(5 * n)]
    order = {CAM: lambda i: T0 + i * 100 * MS, JOINT: lambda k: T0 + k * 20 * MS}
    folder = tmp_path / "bags"
    folder.mkdir()
    bag = write(folder / "back_0.mcap", honest(cam=cam, joint=joint, log=lambda topic, i, t: order[topic](i)))
    with pytest.raises(ConversionError) as err:
        convert([bag], str(tmp_path / "out"), _opts())
    _named(err.value, "too_large", "back_0.mcap", CAM, f"{n} images", str(mcap_bag.CHUNK_FRAMES))
    assert held["peak"] == 0  # refused from the stamps, before one image is decoded
    write(folder / "ok_1.mcap", honest())
    manifest = convert([str(folder)], str(tmp_path / "out2"), _opts(on_error="skip"))
    assert manifest.totals.episodes == 1 and dict(manifest.report.skipped_by_kind) == {"too_large": 1}


def test_jittered_camera_stamps_stay_within_the_held_bound(tmp_path, held):
    n = 200  # stamps out of the bag's order by up to 20 frames: each block of 20 messages reversed
    cam = [T0 + (20 * (i // 20) + 19 - i % 20) * 100 * MS for i in range(n)]
    log = {CAM: lambda i: T0 + i * 100 * MS, JOINT: lambda k: T0 + k * 20 * MS}
    joint = [T0 + k * 20 * MS for k in range(5 * n)]
    bag = write(tmp_path / "jitter.mcap", honest(cam=cam, joint=joint, log=lambda topic, i, t: log[topic](i)))
    convert([bag], str(tmp_path / "out"), _opts())
    back = read_back(str(tmp_path / "out"))[("jitter", 0)]
    stamps = column(back["table"], "timestamp_ns").tolist()
    assert stamps == sorted(cam) and _frames(back) == [cam.index(t) for t in stamps]
    assert 20 <= held["peak"] <= 2 * mcap_bag.CHUNK_FRAMES, held  # the held images and one chunk of 32


def test_a_topic_logged_far_behind_the_camera_does_not_make_the_reader_hold_its_images(tmp_path):
    # the joints' log times run 30 s behind the camera's in the same chunks: read in log-time order,
    # every chunk of the next 30 s would be opened (and its images queued) before a camera message
    n, lag, h = 400, 30_000 * MS, 128
    messages = []
    for i in range(n):
        t = T0 + i * 100 * MS
        messages.append((CAM, "image", t, image(t, i, h, h)))
        messages += [(JOINT, "joints", t + j * 20 * MS - lag, joints(t + j * 20 * MS, 5 * i + j)) for j in range(5)]
    bag = write(tmp_path / "lag.mcap", messages, chunk_size=256 << 10)
    source = open_source(bag, SourceOptions(fps=10))
    reader = source.episodes[0].frames[CAMERA].reader
    tracemalloc.start()
    try:
        frames = []
        for chunk in reader.chunks():
            frames += [decode_frame_number(f) for f in chunk]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert frames == list(range(n))
    frame = h * h * 3
    # two chunks of 32 (the one the consumer holds, the one being filled) and one of the bag's
    # chunks, with room: not the 300 images of 30 s (404 images' worth when read in log-time order)
    assert peak < 3 * mcap_bag.CHUNK_FRAMES * frame + (2 << 20), peak / frame


# -- 4: claims inside messages ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "kind", "words"),
    [
        ({"data": bytes(100)}, "bad_image", ["32 x 96", "100 bytes"]),  # rows x step beyond the data
        ({"height": 1 << 20, "width": 1 << 20, "step": 3 << 20, "data": b""}, "bad_image", ["bytes"]),
        ({"width": 0, "step": 0, "data": b""}, "bad_image", ["0x32"]),
        ({"step": 10}, "bad_image", ["step 10"]),  # a row shorter than its pixels
        ({"encoding": "yuv422"}, "bad_image", ["yuv422"]),
    ],
)
def test_an_image_claiming_more_than_its_data_is_named(tmp_path, over, kind, words):
    messages = honest()
    i = [k for k, m in enumerate(messages) if m[0] == CAM][4]
    messages[i] = (*messages[i][:3], {**messages[i][3], **over})
    bag = write(tmp_path / "img.mcap", messages)
    with pytest.raises(ConversionError) as err:
        convert([bag], str(tmp_path / "out"), _opts())
    _named(err.value, kind, "img.mcap", *words)


def test_frames_and_vectors_beyond_the_bounds_are_refused(tmp_path, monkeypatch):
    bag = write(tmp_path / "big.mcap", honest())
    monkeypatch.setattr(bounds, "MAX_FRAME_BYTES", 32 * 32 * 3 - 1)  # one byte less than a frame
    with pytest.raises(ConversionError) as err:
        convert([bag], str(tmp_path / "o1"), _opts())
    _named(err.value, "too_large", "big.mcap", CAM)
    monkeypatch.undo()
    messages = honest()
    i = [k for k, m in enumerate(messages) if m[0] == JOINT][7]
    messages[i] = (*messages[i][:3], joints(T0, 7, n=5000))  # a JointState of 5000 positions
    bag = write(tmp_path / "wide.mcap", messages)
    monkeypatch.setattr(bounds, "MAX_VALUES", 1000)
    with pytest.raises(ConversionError) as err:
        convert([bag], str(tmp_path / "o2"), _opts())
    _named(err.value, "too_large", "wide.mcap", JOINT, "5000")
    monkeypatch.undo()
    monkeypatch.setattr(bounds, "MAX_ARRAY_BYTES", 50 * 4 * 8 - 1)  # 50 messages of 4 float64
    with pytest.raises(ConversionError) as err:
        convert([write(tmp_path / "col.mcap", honest())], str(tmp_path / "o3"), _opts())
    _named(err.value, "too_large", "col.mcap", JOINT)


# -- 5: damaged records and messages ------------------------------------------------------------------------


def test_damaged_messages_are_named_never_internal(tmp_path, capsys):
    cases = {}
    # a "JointState" whose definition has no position; an "Image" whose height is text
    fake = {"joints": ("sensor_msgs/msg/JointState", "float64 x"), "image": ("sensor_msgs/msg/Image", "string height")}
    for name, kind in (("nopos", "joints"), ("texth", "image")):
        msg = {"header": header(T0), "x": 1.0} if kind == "joints" else {"header": header(T0), "height": "tall"}
        messages = [m if m[1] != kind else (m[0], kind, m[2], {**msg, "header": m[3]["header"]}) for m in honest()]
        cases[name] = (
            write(tmp_path / f"{name}.mcap", messages, types={kind: fake[kind]}),
            ["bad_feature", "bad_image"],
        )
    # a message cut short inside a chunk (CDR decoding fails), and a chunk of garbage
    plain = write(tmp_path / "plain.mcap", honest())
    with open(plain, "rb") as f:
        inner = RecordBuilder()
        for _, channel, m in make_reader(f).iter_messages():
            if channel.topic == JOINT and m.log_time > T0 + 500 * MS:
                m.data = m.data[:30]
            m.write(inner)
    short = zstandard.ZstdCompressor().compress(inner.end())
    cases["short"] = (forge(plain, str(tmp_path / "short.mcap"), data=short), ["unreadable_file"])
    cases["garbage"] = (forge(plain, str(tmp_path / "garbage.mcap"), data=bytes(range(256)) * 4), ["unreadable_file"])
    for name, (bag, kinds) in cases.items():
        with pytest.raises(ConversionError) as err:
            convert([bag], str(tmp_path / f"out_{name}"), _opts())
        assert err.value.kind in kinds and err.value.path.endswith(f"{name}.mcap"), (name, str(err.value))
    folder = tmp_path / "all"
    folder.mkdir()
    for bag, _ in cases.values():
        os.link(bag, folder / os.path.basename(bag))
    write(folder / "plain.mcap", honest())
    code = main(["convert", str(folder), str(tmp_path / "cli"), "--fps", "10", "--on-error", "skip"])
    printed = capsys.readouterr()
    assert code == 0 and "internal" not in printed.out + printed.err, printed
    manifest = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert manifest["totals"]["episodes"] == 1 and sum(manifest["report"]["skipped_by_kind"].values()) == 4
    code = main(["convert", str(folder), str(tmp_path / "cli2"), "--fps", "10"])
    err = capsys.readouterr().err
    assert code == 2 and "unexpected" not in err and ".mcap" in err, err


def test_a_damaged_first_bag_is_a_source_error_at_open(tmp_path):
    plain = write(tmp_path / "p.mcap", honest())
    bag = forge(plain, str(tmp_path / "bad.mcap"), data=bytes(range(256)) * 4)
    with pytest.raises(SourceError, match=r"bad\.mcap"):  # no --fps: the first bag's camera rate is read at open
        convert([bag], str(tmp_path / "out"), _opts(fps=None))


def unchunked(src: str, dst: str) -> str:
    """``src`` rewritten without chunks (messages as records of the data section, no chunk index)."""
    with open(src, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        messages = [m for _, _, m in reader.iter_messages()]
    with open(dst, "wb") as out:
        w = McapWriter(out, use_chunking=False)
        w.start("ros2", "test")
        schemas = {i: w.register_schema(s.name, s.encoding, s.data) for i, s in summary.schemas.items()}
        channels = {i: w.register_channel(c.topic, "cdr", schemas[c.schema_id]) for i, c in summary.channels.items()}
        for m in messages:
            w.add_message(channels[m.channel_id], m.log_time, m.data, m.publish_time)
        w.finish()
    return dst


def test_an_unchunked_bag_reads_as_the_chunked_one_and_its_record_lengths_are_checked(tmp_path):
    plain = write(tmp_path / "plain.mcap", honest())
    flat = unchunked(plain, str(tmp_path / "flat.mcap"))
    with open(flat, "rb") as f:
        assert make_reader(f).get_summary().chunk_indexes == []  # read record by record
    convert([plain], str(tmp_path / "o1"), _opts())
    convert([flat], str(tmp_path / "o2"), _opts())
    a, b = read_back(str(tmp_path / "o1"))[("plain", 0)], read_back(str(tmp_path / "o2"))[("flat", 0)]
    assert a["table"].equals(b["table"]) and _frames(a) == _frames(b) == list(range(10))
    data = bytearray(Path(flat).read_bytes())
    pos = len(MAGIC)
    while data[pos] != 0x05:  # the first message record
        pos += 9 + int.from_bytes(data[pos + 1 : pos + 9], "little")
    data[pos + 1 : pos + 9] = (1 << 40).to_bytes(8, "little")
    (tmp_path / "long.mcap").write_bytes(data)
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "long.mcap")], str(tmp_path / "o3"), _opts())
    _named(err.value, "unreadable_file", "long.mcap", f"claims {1 << 40} bytes", "past the end of the file")


# -- 6: schemas that ask for more work than their messages hold -----------------------------------------------

BOOM = "evil/Boom"  # a message of one uint8[1]: mcap_ros2 reads it as a slice, which past the end is no error
BOOMS = f"\n{SEP}\nMSG: {BOOM}\nuint8[1] pad"
CLAIM = 2_000_000_000


def reschema(src: str, dst: str, joints: str, extra: bytes = b"") -> str:
    """``src`` with its JointState schema's text replaced by ``joints``; the messages as written, ``extra`` after."""
    with open(src, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        messages = [(c.topic, m) for _, c, m in reader.iter_messages()]
    with open(dst, "wb") as out:
        w = McapWriter(out)
        w.start("ros2", "test")
        texts = {i: joints.encode() if s.name == TYPES["joints"][0] else s.data for i, s in summary.schemas.items()}
        schemas = {i: w.register_schema(s.name, s.encoding, texts[i]) for i, s in summary.schemas.items()}
        channels = {i: w.register_channel(c.topic, "cdr", schemas[c.schema_id]) for i, c in summary.channels.items()}
        for topic, m in messages:
            data = m.data + (extra if topic == JOINT else b"")
            w.add_message(channels[m.channel_id], m.log_time, data, m.publish_time)
        w.finish()
    return dst


def test_a_schema_asking_for_billions_of_elements_is_refused_before_decoding(tmp_path):
    # the attack: a bag's own JointState schema adds "evil/Boom[2000000000] boom"; its messages are
    # honest. mcap_ros2 would build 2e9 Boom objects from the message's last bytes (no error: a
    # uint8[1] past the end is an empty slice): 35 s and 2.4 GB, then MemoryError (or the OOM killer).
    # And its sibling: "evil/Boom[] boom" whose length, 2e9, the message states.
    fixed = _definition(f"{JOINT_DEF}\n{BOOM}[{CLAIM}] boom") + BOOMS
    claimed = _definition(f"{JOINT_DEF}\n{BOOM}[] boom") + BOOMS
    plain = write(tmp_path / "plain.mcap", honest(e=1))
    cases: dict[str, dict] = {}
    for name, text, extra in (("fixed", fixed, b""), ("claim", claimed, CLAIM.to_bytes(4, "little") + bytes(8))):
        folder = tmp_path / name
        folder.mkdir()
        write(folder / "a_good_0.mcap", honest())
        reschema(plain, str(folder / f"b_{name}_1.mcap"), text, extra)
        for on_error in ("raise", "skip"):
            out = str(tmp_path / f"out_{name}_{on_error}")
            cases[f"{name}_{on_error}"] = {"src": str(folder), "out": out, "fps": 10, "on_error": on_error}
    alone = tmp_path / "alone"
    alone.mkdir()
    os.link(tmp_path / "fixed" / "b_fixed_1.mcap", alone / "b_fixed_1.mcap")
    cases["open"] = {"src": str(alone), "out": str(tmp_path / "out_open"), "fps": 10}
    start = time.monotonic()
    results = _in_child(cases, timeout=120)
    assert time.monotonic() - start < 30, results  # each refused at once: no element decoded from nothing
    got = results["fixed_raise"]  # the message (76 bytes) cannot hold the 2e9 bytes the schema asks for
    assert got["error"] == "ConversionError" and got["kind"] == "unreadable_file", got
    assert got["path"].endswith("b_fixed_1.mcap"), got
    for word in (JOINT, TYPES["joints"][0], f"boom ({BOOM}[{CLAIM}])", "refused before decoding"):
        assert word in got["message"], (word, got["message"])
    got = results["claim_raise"]  # each Boom read past the end of the message is an error: 8 are decoded
    assert got["error"] == "ConversionError" and got["kind"] == "unreadable_file", got
    assert got["path"].endswith("b_claim_1.mcap") and JOINT in got["message"] and "ends at byte" in got["message"], got
    for name in ("fixed", "claim"):  # skipped and counted; the good bag converts whole
        assert results[f"{name}_skip"] == {"episodes": 1, "skipped": {"unreadable_file": 1}}, results[f"{name}_skip"]
        back = read_back(str(tmp_path / f"out_{name}_skip"))
        assert sorted(back) == [(name, 0)] and _frames(back[(name, 0)]) == list(range(10))
    got = results["open"]  # the first bag: no message of it (its chunks hold a few kB) can be one
    assert got["error"] == "SourceError", got
    for word in ("b_fixed_1.mcap", JOINT, f"boom ({BOOM}[{CLAIM}])", "refused at open"):
        assert word in got["message"], (word, got["message"])


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (f"evil/A a\n{SEP}\nMSG: evil/A\nevil/A[] more", ["evil/A", "more", "in itself"]),  # a type in itself
        ("evil/T0 t" + "".join(f"\n{SEP}\nMSG: evil/T{i}\nevil/T{i + 1} t" for i in range(40)), ["32 deep"]),
        ("evil/Nope nope", ["does not define evil/Nope", "nope"]),
        (f"evil/E[] es\n{SEP}\nMSG: evil/E\n", ["es (evil/E[])", "without fields"]),  # elements of no bytes
        ("uint8 x" + "".join(f"\n{SEP}\nMSG: evil/T{i}\nuint8 x" for i in range(300)), ["256 definitions"]),
        ("\n".join(f"uint8 x{i}" for i in range(5000)), ["lines of fields, more than the 4096"]),
        ("uint8 x\n#" + "a" * (2 << 20), ["bytes of text"]),
        ("not a field", ["cannot be parsed"]),
    ],
)
def test_a_schema_whose_work_is_not_bounded_is_named_unparsed(tmp_path, extra, words):
    text = _definition(f"{JOINT_DEF}\n{extra.split(chr(10), 1)[0]}")
    text += "\n" + extra.split("\n", 1)[1] if "\n" in extra else ""
    folder = tmp_path / "bags"
    folder.mkdir()
    write(folder / "good_0.mcap", honest())
    bag = reschema(write(tmp_path / "plain.mcap", honest(e=1)), str(folder / "odd_1.mcap"), text)
    with pytest.raises(ConversionError) as err:
        convert([bag], str(tmp_path / "out"), _opts())
    _named(err.value, "unreadable_file", "odd_1.mcap", JOINT, TYPES["joints"][0], *words)
    manifest = convert([str(folder)], str(tmp_path / "out2"), _opts(on_error="skip"))
    assert manifest.totals.episodes == 1 and dict(manifest.report.skipped_by_kind) == {"unreadable_file": 1}


def test_the_least_size_of_honest_types_and_a_message_cut_short_of_it(tmp_path):
    for kind, least in (("joints", 28), ("image", 33)):  # header 12; 4 lengths; 3 uint32, a string, a uint8, a length
        name, body = TYPES[kind]
        assert mcap_bag._layout(name, _definition(body).encode()).least == least
    nested = _definition(f"{JOINT_DEF}\nevil/W w") + f"\n{SEP}\nMSG: evil/W\n{BOOM}[64] inner{BOOMS}"
    layout = mcap_bag._layout(TYPES["joints"][0], nested.encode())
    assert (layout.least, layout.field, layout.field_type, layout.field_bytes) == (92, "w.inner", f"{BOOM}[64]", 64)
    pads = bytes(range(64))
    bag = reschema(write(tmp_path / "plain.mcap", honest()), str(tmp_path / "w.mcap"), nested, pads)
    back = list(mcap_bag._decoded(mcap_bag._Plan((bag,), bag, 10.0, None, (JOINT,), JOINT, None), JOINT))
    assert len(back) == 50 and b"".join(b.pad for b in back[0][1].w.inner) == pads  # as written
    bag = reschema(write(tmp_path / "plain2.mcap", honest()), str(tmp_path / "short.mcap"), nested, pads[:4])
    with pytest.raises(ConversionError) as err:  # 80 bytes: the 4 floats of position, not the 64 pads
        convert([bag], str(tmp_path / "out"), _opts())
    _named(err.value, "unreadable_file", "short.mcap", JOINT, "80 bytes", "w.inner (evil/Boom[64])", "before decoding")


# -- the source's files: a link to a FIFO -------------------------------------------------------------------


def test_a_mcap_link_to_a_fifo_is_refused_unopened(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    folder = tmp_path / "bags"
    folder.mkdir()
    write(folder / "a_0.mcap", honest())
    os.symlink(fifo, folder / "b_1.mcap")
    outside = tmp_path / "elsewhere.mcap"
    write(outside, honest(e=2))
    opened, other, stop = [], [], threading.Event()

    def writer():  # a reader that opened the FIFO would let this open succeed (ENXIO: none did)
        while not stop.is_set():
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    other.append(exc)
                time.sleep(0.001)
                continue
            opened.append(True)
            os.close(fd)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        for allow in (False, True):
            with pytest.raises(SourceError, match=r"b_1\.mcap.*FIFO|b_1\.mcap.*outside"):
                convert([str(folder)], str(tmp_path / f"out_{allow}"), _opts(allow_external=allow))
        assert main(["convert", str(folder / "b_1.mcap"), str(tmp_path / "cli"), "--fps", "10"]) == 2
    finally:
        stop.set()
        thread.join()
    assert not opened and not other
    os.remove(folder / "b_1.mcap")
    os.symlink(outside, folder / "c_2.mcap")  # a link out of the folder to a real bag: only when allowed
    with pytest.raises(SourceError, match="outside the source folder"):
        convert([str(folder)], str(tmp_path / "o3"), _opts())
    manifest = convert([str(folder)], str(tmp_path / "o4"), _opts(allow_external=True))
    assert manifest.totals.episodes == 2
