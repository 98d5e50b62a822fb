"""ROS 2 bags in MCAP: image and joint-state topics, each at its own rate, resampled onto one row clock.

Read with mcap and its ROS 2 decoder (``epishard[mcap]``: ``mcap``, ``mcap-ros2-support``; no ROS
install). Each ``.mcap`` file is one episode (a folder of them: one episode per file, in natural
order), except in a rosbag2 folder (``metadata.yaml`` beside its files): its files are one
recording, one episode, read one after another in the order ``relative_file_paths`` lists them
(a recording split by ``--max-bag-size``). The source's episode list holds the file names only;
the worker reads the bags.

Resampling (docs/sources/mcap.md): every message's time is its ``header.stamp`` (read from the CDR
bytes, for a type whose first field is a ``std_msgs/Header``); the log time when the stamp is zero
or the type has none (``Float64MultiArray``). Rows are ``t0 + r / fps`` for ``t0`` the latest first
message of the mapped topics and up to the earliest last one; each row takes, per topic, the
message nearest its time. A row with a topic whose nearest message is farther than the tolerance
(default: the larger of a row period and the topic's median message period; ``tolerance`` in the
mapping sets it for every topic, in seconds) is dropped, and the rows after it start a new
recording segment (the ``timestamp`` column jumps; windows do not cross it). Per topic and
episode, the report (and the console) states the messages, the rows that repeat a message already
used, the messages no row uses, and the rows dropped for it: nothing is resampled silently.

Streams (the mapping's ``streams``: name -> topic, or ``"all"``; docs/sources/mcap.md): a topic
kept at its own rate, every message one sample at its own time (the resampler's), in seconds from
the first row (``_stream``), sorted by time where the bag's order differs (counted in the report:
``stream_reordered``); it takes no part in the row clock unless it is also resampled.

Default mapping: ``sensor_msgs/msg/Image`` and ``CompressedImage`` topics are cameras
(``/cam_high/image_raw`` -> ``observation.images.cam_high``; ``mono16``/``16UC1`` images are depth);
the ``sensor_msgs/msg/JointState`` topic not named like an action is ``observation.state`` (its
``position``; ``velocity`` and ``effort`` kept as ``observation.velocity`` / ``observation.effort``
when present), a topic whose name holds ``action`` or ``command`` (``JointState`` position or
``std_msgs/msg/Float64MultiArray`` / ``Float32MultiArray`` data) is ``action``. The mapping's
``columns`` keep more such topics (position, data, or a ``geometry_msgs/msg/WrenchStamped``'s
force and torque), resampled alike. Each mapped topic's type is
checked at open. The rate: ``--fps`` (or the mapping's
``fps``); without it, the median rate of the slowest camera topic (stated in the notes).

A bag from a stranger is read without trusting what it claims (``bounds``): mcap's library reads
only the summary section, through a file object whose reads never ask for more than the file
holds; the messages are read here, chunk by chunk in the order they lie in the file, each chunk's
offset, lengths and declared size checked against the file and ``bounds.MAX_RECORD_BYTES`` and
decompressed to at most its declared size. The row clock's span and row count are checked
(``bounds.MAX_SPAN_S``, ``bounds.MAX_ROWS``) before it is allocated; messages sharing a stamp
are counted (the first in the bag is used); a camera whose stamps disagree with the bag's order so
that more than ``_HELD_FRAMES`` images would have to be held is refused before any is decoded;
image sizes, vector lengths and columns are checked (``MAX_FRAME_BYTES``, ``MAX_VALUES``,
``MAX_ARRAY_BYTES``); a mapped topic's schema (the bag's own text) is parsed into the least size of
its messages (``_layout``), a message shorter than it refused before decoding, and messages are
decoded from bytes whose slices past the end raise (``_Strict``), so the work a schema asks for is
bounded by the message's bytes; every other failure while a bag is read is a named ``ConversionError``
(``bounds.reading``), and a ``SourceError`` naming the bag at open.

Internal: import from ``epishard.shardwriter.sources``.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import io
import re
import struct
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..episode import CameraFrames, Episode, FileInput, FrameReader, LazyTable, LoadedTable, Source, Stream
from ..errors import ConversionError, SourceError
from . import bounds
from .base import (
    Mapping,
    SourceOptions,
    build_table,
    column_name,
    episode_numbers,
    file_stamp,
    kept_cameras,
    natural_key,
    open_binary,
    require,
    size_of,
    source_files,
)

__all__ = ["CHUNK_FRAMES", "open_mcap"]

CHUNK_FRAMES = 32
_HELD_FRAMES = CHUNK_FRAMES  # decoded images of a camera held for rows still to come, besides the chunk
_IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")
_JOINT_TYPE = "sensor_msgs/msg/JointState"
_ARRAY_TYPES = ("std_msgs/msg/Float64MultiArray", "std_msgs/msg/Float32MultiArray")
_WRENCH_TYPE = "geometry_msgs/msg/WrenchStamped"  # force.xyz, torque.xyz
_VECTOR_TYPES = (_JOINT_TYPE, *_ARRAY_TYPES, _WRENCH_TYPE)  # what a state, action, column or stream topic may be
_NAME_NOISE = {"image_raw", "compressed", "image", "image_rect_color", "image_color", "color", "rgb"}
_MAGIC = b"\x89MCAP0\r\n"
_FOOTER, _MESSAGE, _CHUNK, _DATA_END = 0x02, 0x05, 0x06, 0x0F
_FOOTER_BYTES = 1 + 8 + 8 + 8 + 4  # opcode, length, summary start, summary offset start, crc
_INT64 = (1 << 63) - 1
_PIECE = 64 << 20  # decompressed bytes asked for at once: a chunk's claim is never allocated on its word
_IMAGE_SLACK = 1 << 20  # an image message's bytes beyond its pixels (header, encoding, frame id)
_METADATA = "metadata.yaml"  # a rosbag2 folder's description: its files (a split recording), storage, compression
_METADATA_BYTES = 16 << 20
_CDR_HEADER = 4  # a CDR message's encapsulation header, before its fields
_CDR_BYTES = {"bool": 1, "byte": 1, "char": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
              "float32": 4, "int64": 8, "uint64": 8, "float64": 8, "string": 4, "wstring": 4}  # fmt: skip
_HUGE = 1 << 64  # least sizes are counted up to here
_SCHEMA_BYTES = 1 << 20  # a ros2msg schema's text, its dependencies and comments included (recorders': kB)
_SCHEMA_LINES = 1 << 12  # its lines of fields and constants (the parser checks a definition's names pairwise)
_SCHEMA_DEFINITIONS = 256  # the message types it defines
_SCHEMA_NESTING = 32  # how deep its types nest (ROS types: a few levels; a type in itself: without end)
_RESERVED = ("observation.state", "observation.velocity", "observation.effort", "action", "timestamp",
             "timestamp_ns", "frame_index", "episode_index", "index", "task_index")  # fmt: skip


@dataclass(frozen=True)
class _Plan:
    """Which files and topics make the rows, at what rate and tolerance (picklable, small)."""

    files: tuple[FileInput, ...]  # the recording: one bag, or a rosbag2 folder's split files in order
    where: str  # what errors name: the bag, or the rosbag2 folder
    fps: float
    tolerance: float | None
    topics: tuple[str, ...]  # every mapped topic, sorted: each one decides which rows exist
    state: str | None
    action: str | None
    columns: tuple[tuple[str, str], ...] = ()  # (output column, topic): the mapping's other columns
    streams: tuple[tuple[str, str], ...] = ()  # (stream name, topic): kept at their own times, never resampled

    @property
    def read(self) -> tuple[str, ...]:
        """Every topic whose messages are read: the resampled ones and the streams' (sorted)."""
        return tuple(sorted({*self.topics, *(t for _, t in self.streams)}))

    def stamp(self) -> tuple:
        """(size, mtime) of each file: a cache keyed by it never serves a file rewritten in place."""
        return tuple(file_stamp(f) for f in self.files)

    def size(self) -> int:
        """The recording's bytes."""
        return sum(size_of(f) for f in self.files)


def _fail(message: str, file: FileInput, kind: str = "unreadable_file", **kw) -> ConversionError:
    return ConversionError(message, kind=kind, path=str(file), **kw)


class _Clamped:
    """A binary file object whose reads never ask for more than the file has left.

    mcap reads a record by its declared length (``read(length)``), and Python allocates what is
    asked for before reading: clamped, a forged length costs no more than the file's own bytes.
    """

    def __init__(self, f, size: int):
        self._f, self._size = f, size

    def read(self, n: int | None = -1) -> bytes:
        left = max(0, self._size - self._f.tell())
        return self._f.read(left if n is None or n < 0 else min(n, left))

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def seekable(self) -> bool:
        return True


class _Bag:
    """An open bag: its summary (schemas, channels, chunk index) and its messages, read chunk by chunk.

    Every length, offset and size the file states is checked against the file's size and the
    bounds before anything is read or allocated on its word; chunks are read in the order they lie
    in the file, one at a time, decompressed to at most their declared size (``bounds.MAX_RECORD_BYTES``).
    """

    def __init__(self, f, file: FileInput):
        self.file, self.where = file, str(file)
        self.size = f.seek(0, io.SEEK_END)
        self.f = _Clamped(f, self.size)
        self.summary = self._summary()
        self._decoders: dict[int, _Layout] = {}  # channel id -> its schema's layout
        self._layouts: dict[int, _Layout] = {}  # schema id -> its layout
        self._stamped: dict[int, bool] = {}

    def _summary(self):
        records = require("mcap.records")
        stream_reader = require("mcap.stream_reader")
        if self.size < 2 * len(_MAGIC) + _FOOTER_BYTES:
            raise _fail(f"{self.size} bytes: too short for an MCAP file", self.file)
        self.f.seek(0)
        head = self.f.read(len(_MAGIC))
        self.f.seek(self.size - _FOOTER_BYTES - len(_MAGIC))
        tail = self.f.read(_FOOTER_BYTES + len(_MAGIC))
        if head != _MAGIC or tail[-len(_MAGIC) :] != _MAGIC or tail[0] != _FOOTER:
            raise _fail("not an MCAP file (no MCAP magic and footer at its ends; recording killed?)", self.file)
        (start,) = struct.unpack_from("<Q", tail, 9)
        if start == 0:
            return None
        if not len(_MAGIC) <= start <= self.size - _FOOTER_BYTES - len(_MAGIC):
            raise _fail(f"the footer puts the summary at offset {start}, past the end of the file", self.file)
        self.f.seek(start)
        reader = stream_reader.StreamReader(
            self.f, skip_magic=True, emit_chunks=True, record_size_limit=bounds.MAX_RECORD_BYTES
        )
        schemas, channels, chunks, statistics = {}, {}, [], None
        for record in reader.records:  # up to the footer: bounded by the file (every read is clamped)
            if isinstance(record, records.Schema):
                schemas[record.id] = record
            elif isinstance(record, records.Channel):
                channels[record.id] = record
            elif isinstance(record, records.ChunkIndex):
                chunks.append(record)
            elif isinstance(record, records.Statistics):
                statistics = record
        return _Summary(schemas, channels, chunks, statistics)

    def messages(self, topics) -> Iterator[tuple[Any, int, memoryview]]:
        """(channel, log time in ns, message bytes) of ``topics``' messages, in the order they lie in the file.

        The bytes are a view into the chunk being read: copy what outlives the next message.
        """
        summary = self.summary
        ids = {cid: c for cid, c in summary.channels.items() if c.topic in topics}
        if not summary.chunks:  # no chunk index: the data section, record by record
            yield from self._scan(ids)
            return
        wanted = [c for c in summary.chunks if not c.message_index_offsets or ids.keys() & c.message_index_offsets]
        end = 0
        for offset in sorted({c.chunk_start_offset for c in wanted}):
            if offset < end:  # chunks inside chunks would read the same bytes again and again
                raise _fail(f"the chunk index puts a chunk at offset {offset}, inside the one before it", self.file)
            data, end = self._chunk(offset)
            yield from self._in_chunk(data, ids, offset)

    def _scan(self, ids) -> Iterator[tuple[object, int, memoryview]]:
        pos = len(_MAGIC)
        while pos + 9 <= self.size:
            self.f.seek(pos)
            opcode, length = struct.unpack("<BQ", self.f.read(9))
            if opcode in (_DATA_END, _FOOTER):
                return
            if length > self.size - pos - 9:
                raise _fail(f"the record at offset {pos} claims {length} bytes, past the end of the file", self.file)
            if opcode == _CHUNK:
                data, _ = self._chunk(pos)
                yield from self._in_chunk(data, ids, pos)
            elif opcode == _MESSAGE:
                if length < 22:
                    raise _fail(f"a message record of {length} bytes at offset {pos}", self.file)
                (cid,) = struct.unpack("<H", self.f.read(2))
                if cid in ids:
                    if length > bounds.MAX_RECORD_BYTES:
                        raise bounds.too_large(
                            f"a message of {length} bytes at offset {pos}:", length, bounds.MAX_RECORD_BYTES, self.where
                        )
                    body = self.f.read(length - 2)
                    (log,) = struct.unpack_from("<Q", body, 4)
                    yield ids[cid], log, memoryview(body)[20:]
            pos += 9 + length

    def _chunk(self, offset: int) -> tuple[bytes | bytearray, int]:
        """(the records of the chunk record at ``offset``, decompressed; the offset where it ends)."""
        if offset > self.size - 41:
            raise _fail(f"the chunk index puts a chunk at offset {offset}, past the end of the file", self.file)
        self.f.seek(offset)
        opcode, length, _, _, usize, _, name_length = struct.unpack("<BQQQQII", self.f.read(41))
        end = offset + 9 + length
        if opcode != _CHUNK:
            raise _fail(f"no chunk at offset {offset} (a record of type {opcode})", self.file)
        if length > self.size - offset - 9 or name_length > 64:
            raise _fail(f"the chunk at offset {offset} claims {length} bytes, past the end of the file", self.file)
        compression = self.f.read(name_length).decode("utf-8", "replace")
        (stored,) = struct.unpack("<Q", self.f.read(8))
        if stored > end - self.f.tell():
            raise _fail(
                f"the chunk at offset {offset} claims {stored} bytes of records, past the end of the chunk "
                f"({length} bytes) and of the file",
                self.file,
            )
        if usize > bounds.MAX_RECORD_BYTES:
            raise _fail(
                f"the chunk at offset {offset} claims to decompress to {usize} bytes, more than the "
                f"{bounds.MAX_RECORD_BYTES} a chunk may hold (bounds.MAX_RECORD_BYTES); refused before reading",
                self.file,
                kind="too_large",
            )
        return _inflate(self.f.read(stored), compression, usize, f"the chunk at offset {offset}", self.file), end

    def _in_chunk(self, data: bytes | bytearray, ids, offset: int) -> Iterator[tuple[object, int, memoryview]]:
        view, pos, n = memoryview(data), 0, len(data)
        while pos < n:
            if pos + 9 > n:
                raise _fail(f"the chunk at offset {offset} ends inside a record", self.file)
            opcode, length = struct.unpack_from("<BQ", data, pos)
            body, pos = pos + 9, pos + 9 + length
            if pos > n:
                raise _fail(
                    f"a record in the chunk at offset {offset} claims {length} bytes, past the end of the chunk",
                    self.file,
                )
            if opcode == _MESSAGE:
                if length < 22:
                    raise _fail(f"a message record of {length} bytes in the chunk at offset {offset}", self.file)
                cid, _, log = struct.unpack_from("<HIQ", data, body)
                if cid in ids:
                    yield ids[cid], log, view[body + 22 : pos]

    def stamped(self, channel) -> bool:
        """Whether ``channel``'s messages begin with a ``std_msgs/Header`` (whose stamp is their time)."""
        known = self._stamped.get(channel.id)
        if known is None:
            schema = self.summary.schemas.get(channel.schema_id) if self.summary else None
            known = self._stamped[channel.id] = schema is not None and _header_first(schema)
        return known

    def decode(self, channel, data: memoryview, k: int):
        """(decoded message, schema name) of message ``k`` of ``channel``, its size checked first."""
        schema = self.summary.schemas.get(channel.schema_id)
        name = schema.name if schema else ""
        limit = _message_limit(name)
        if len(data) > limit:  # a vector decodes to Python floats first: about 4 times its bytes
            raise bounds.too_large(
                f"the bytes of message {k} ({name or 'no schema'})",
                len(data),
                limit,
                self.where,
                channel.topic,
            )
        layout = self._decoders.get(channel.id)
        if layout is None:
            if channel.message_encoding != "cdr" or schema is None or schema.encoding != "ros2msg":
                raise _fail(
                    f"topic {channel.topic}: messages in {channel.message_encoding!r} of {name or 'no schema'} "
                    "cannot be decoded (ROS 2 CDR with a ros2msg schema only)",
                    self.file,
                )
            layout = self._decoders[channel.id] = self.layout(channel)
        if len(data) < _CDR_HEADER + layout.least:  # the work the schema asks for, bounded before decoding
            raise _fail(
                f"topic {channel.topic}: message {k} ({name}) holds {len(data)} bytes, fewer than the "
                f"{_CDR_HEADER + layout.least} its schema asks for at least (the field that asks most: "
                f"{layout.field} ({layout.field_type}), at least {layout.field_bytes} bytes); refused before decoding",
                self.file,
            )
        return layout.decoder(_Strict(data)), name

    def layout(self, channel) -> _Layout:
        """The layout (least size, decoder) of ``channel``'s ros2msg schema, parsed once per schema.

        Raises:
            ConversionError(kind="unreadable_file"): a schema ``_layout`` refuses, naming the bag,
                the topic and the type.
        """
        schema = self.summary.schemas[channel.schema_id]
        layout = self._layouts.get(schema.id)
        if layout is None:
            try:
                layout = self._layouts[schema.id] = _layout(schema.name, bytes(schema.data))
            except _Refused as exc:
                raise _fail(f"topic {channel.topic}: its {schema.name} schema {exc}", self.file) from None
        return layout


def _message_limit(name: str) -> int:
    """The most bytes a message of type ``name`` may have: an image's pixels, or numbers decoded one by one."""
    return bounds.MAX_FRAME_BYTES + _IMAGE_SLACK if name in _IMAGE_TYPES else bounds.MAX_ARRAY_BYTES // 8


def _header_first(schema) -> bool:
    """Whether a ros2msg schema's first field is a ``std_msgs/Header`` (CDR: its stamp leads the message).

    Constants (``uint8 MODE=1``) are not serialized; comments and blank lines are skipped. Types
    without a header (``std_msgs/Float64MultiArray`` starts with its layout) are timed by log time.
    """
    if schema.encoding != "ros2msg":
        return False
    for line in bytes(schema.data).decode("utf-8", "replace").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or re.match(r"\S+\s+\w+\s*=", line):
            continue
        return re.fullmatch(r"(std_msgs/(msg/)?)?Header\s+\w+(\s+.*)?", line) is not None
    return False


class _Refused(Exception):
    """A ros2msg schema whose decoding would not be bounded by its message's bytes (``_layout``)."""


@dataclass(frozen=True)
class _Layout:
    """What a ros2msg schema asks of a message: its least size in CDR, the field that asks most, the decoder."""

    least: int  # bytes after the CDR header, at least (alignment only adds)
    field: str  # the field that takes the most of them ("boom", "header.frame_id")
    field_type: str  # its type as the schema writes it ("evil/Boom[2000000000]")
    field_bytes: int  # what it takes, at least
    decoder: Callable[[bytes], Any]


class _Strict(bytes):
    """A message's bytes for mcap_ros2's decoder: a slice past the end raises instead of coming back short.

    mcap_ros2 reads a ``uint8``/``byte`` array and a string's text as a slice of the message, which
    past its end is shorter, not an error, and moves on: an array of messages made of such fields
    (``Boom[] boom``, ``uint8[1] pad``) would be decoded as many times as a length claims, from no
    bytes. With every read checked, each element decoded takes at least one byte of the message
    (``_layout`` refuses arrays of messages without fields): the work is bounded by the bytes.
    """

    __slots__ = ()

    def __getitem__(self, key):
        if isinstance(key, slice) and key.stop is not None and key.stop > len(self):
            raise IndexError(f"the message ends at byte {len(self)}; a field reads up to byte {key.stop}")
        return bytes.__getitem__(self, key)


def _layout(name: str, data: bytes) -> _Layout:
    """The ``_Layout`` of the ros2msg schema ``name`` whose text (with its dependencies) is ``data``.

    Parsed by mcap_ros2's own parser into the definitions its decoder reads (the last definition of
    a name wins, as there), then, from the type ``name``: the least bytes of a message in CDR (a
    primitive its size, a string or a sequence 4 for its length, a fixed array its size times its
    element's, a nested message its own, recursively). A message shorter than that cannot be one
    of the type: ``_Bag.decode`` refuses it before decoding, so what a fixed array asks for is
    bounded by the message's bytes; the ``_Strict`` bytes bound what a sequence's length asks for.

    Raises:
        _Refused: a text of more than ``_SCHEMA_BYTES`` bytes or ``_SCHEMA_LINES`` lines, more than
            ``_SCHEMA_DEFINITIONS`` definitions, types nested deeper than ``_SCHEMA_NESTING`` (or in
            themselves), a type it does not define, an array of messages without fields, or a text
            the parser refuses; the message names the field.
    """
    dynamic = require("mcap_ros2._dynamic")
    if len(data) > _SCHEMA_BYTES:
        raise _Refused(f"is {len(data)} bytes of text, more than the {_SCHEMA_BYTES} a schema may be")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Refused(f"is not UTF-8 text ({exc})") from None
    lines = sum(1 for line in text.splitlines() if line.split("#", 1)[0].strip())
    if lines > _SCHEMA_LINES:
        raise _Refused(f"has {lines} lines of fields, more than the {_SCHEMA_LINES} a schema may have")
    definitions: dict[str, Any] = {"builtin_interfaces/Time": dynamic.TimeDefinition,
                                   "builtin_interfaces/Duration": dynamic.TimeDefinition}  # fmt: skip
    named: list[str] = []

    def define(full: str, short: str, spec) -> None:  # as mcap_ros2's generate_dynamic
        if len(named) >= 2 * _SCHEMA_DEFINITIONS:
            raise _Refused(f"has more than {_SCHEMA_DEFINITIONS} definitions")
        definitions[full] = definitions[short] = spec
        named.extend((full, short))

    try:
        dynamic._for_each_msgdef(name, text, define)
    except _Refused:
        raise
    except Exception as exc:
        raise _Refused(f"cannot be parsed ({type(exc).__name__}: {str(exc)[:300]})") from None
    if name not in named:
        raise _Refused(f"does not define {name}")
    sizes: dict[int, tuple[int, int, tuple[str, str, int]]] = {}  # id -> (least, nesting, heaviest field)

    def size(spec, depth: int, within: tuple[int, ...]) -> tuple[int, int, tuple[str, str, int]]:
        """(least bytes, how deep its types nest, (field, type, least bytes) of the field that takes most).

        A nested message's field counts as itself: ``header.frame_id`` takes 4 bytes, not ``header``'s 12.
        """
        known = sizes.get(id(spec))
        if known is not None:
            return known
        least, nesting, most, heaviest = 0, 0, -1, ("", "", 0)
        for field in spec.fields:
            t = field.type
            fixed = t.is_array and not t.is_dynamic_array()
            shown = (field.name, str(t))
            if t.is_primitive_type():
                n = 4 if t.is_dynamic_array() else _CDR_BYTES.get(t.type, 1) * (t.array_size if fixed else 1)
                part = n
            else:
                nested = definitions.get(f"{t.pkg_name}/{t.type}")
                if nested is None:
                    raise _Refused(f"does not define {t.pkg_name}/{t.type}, the type of its field {field.name}")
                if id(nested) in within or depth >= _SCHEMA_NESTING:
                    raise _Refused(
                        f"nests {t.pkg_name}/{t.type} (field {field.name}) in itself or more than "
                        f"{_SCHEMA_NESTING} deep"
                    )
                inner, below, (path, kind, part) = size(nested, depth + 1, (*within, id(nested)))
                nesting = max(nesting, below + 1)
                if t.is_array and inner == 0:
                    raise _Refused(
                        f"has a field {field.name} ({t}): an array of a message without fields, whose elements "
                        "take no bytes"
                    )
                if t.is_array:
                    n = part = 4 if t.is_dynamic_array() else min(inner * t.array_size, _HUGE)
                else:  # a nested message: the field inside it that takes most
                    n = inner
                    shown = (f"{field.name}.{path}", kind) if path else shown
            least = min(least + n, _HUGE)
            if part > most:
                most, heaviest = part, (*shown, part)
        sizes[id(spec)] = (least, nesting, heaviest)
        return sizes[id(spec)]

    root = definitions[name]
    least, nesting, (field, field_type, field_bytes) = size(root, 0, (id(root),))
    if nesting > _SCHEMA_NESTING:
        raise _Refused(f"nests its types {nesting} deep, more than {_SCHEMA_NESTING}")
    return _Layout(least, field or "(none)", field_type, field_bytes, dynamic._make_read_message(name, definitions))


@dataclass
class _Summary:
    schemas: dict
    channels: dict
    chunks: list
    statistics: object


def _inflate(data: bytes, compression: str, usize: int, what: str, file: FileInput) -> bytes | bytearray:
    """``data`` decompressed (zstd, lz4 or none), refused past ``usize`` bytes.

    Decompressed in pieces of at most ``_PIECE`` bytes: what is allocated is what the data holds,
    never what the header claims (mcap's own reader lets zstd allocate the claim, and lz4 grow
    without a bound).

    Raises:
        ConversionError(kind="unreadable_file"): an unknown compression, or more than ``usize`` bytes.
    """
    if compression == "":
        return data
    try:
        if compression == "zstd":
            import zstandard

            piece: Callable[[int], bytes] = (
                zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read
            )
        elif compression == "lz4":
            import lz4.frame

            decompressor = lz4.frame.LZ4FrameDecompressor()

            pending = [data]

            def lz4_piece(n: int) -> bytes:
                if decompressor.eof:
                    return b""
                return decompressor.decompress(pending.pop() if pending else b"", max_length=n)

            piece = lz4_piece
        else:
            raise _fail(f"{what} is compressed with {compression!r} (known: zstd, lz4)", file)
    except ImportError as exc:
        raise _fail(f"{what} is compressed with {compression}, whose Python package is missing ({exc})", file) from exc
    out = bytearray()
    while len(out) <= usize:
        more = piece(min(_PIECE, usize + 1 - len(out)))
        if not more:
            break
        out += more
    if len(out) > usize:
        raise _fail(f"{what} decompresses to more than the {usize} bytes it declares: refused", file)
    return out


@contextlib.contextmanager
def _open_bag(file: FileInput) -> Iterator[_Bag]:
    with open_binary(file) as f:
        yield _Bag(f, file)


def _stamp(data, log_time: int) -> int:
    """A message's time in ns: its header stamp (CDR: 4-byte encapsulation, int32 sec, uint32 nanosec) or log time.

    Only for a type whose first field is a header (``_Bag.stamped``).
    """
    if len(data) >= 12:
        order = "<" if data[1] & 1 else ">"  # the encapsulation kind: odd ones are little-endian
        sec, nsec = struct.unpack_from(order + "iI", data, 4)
        if sec or nsec:
            return sec * 1_000_000_000 + nsec
    return log_time


def _when(ns: int) -> str:
    try:
        return datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return "out of calendar range"


def _times(plan: _Plan) -> dict[str, np.ndarray]:
    """Topic -> int64 ns times of its messages, in the bag's order (one pass over the bag's chunks).

    Every topic read (``_Plan.read``): the resampled ones and the streams'.

    Raises:
        ConversionError: ``missing_key`` (a topic without messages), ``too_large`` (a log time past
            int64, more than ``bounds.MAX_ROWS`` messages of a topic), ``unreadable_file``.
    """
    return _times_of(plan, plan.stamp())


def _bags(plan: _Plan) -> Iterator[_Bag]:
    """The recording's files, opened one at a time in order (a split recording's files one after another)."""
    for file in plan.files:
        with _open_bag(file) as bag:
            if bag.summary is None:
                raise _fail("the MCAP file has no summary section (not finished writing?); reindex it", file)
            yield bag


@functools.lru_cache(maxsize=2)
def _times_of(plan: _Plan, stamp: tuple) -> dict[str, np.ndarray]:
    out: dict[str, array] = {t: array("q") for t in plan.read}
    with bounds.reading(plan.where):
        for bag in _bags(plan):
            for channel, log, data in bag.messages(plan.read):
                times = out[channel.topic]
                t = _stamp(data, log) if bag.stamped(channel) else log
                if t > _INT64:
                    raise _fail(
                        f"topic {channel.topic}: message {len(times)} is stamped {t} ns (its log time), past the "
                        f"{_INT64} ns (the year 2262) a stamp may be",
                        bag.file,
                        kind="too_large",
                    )
                if len(times) >= bounds.MAX_ROWS:
                    raise _fail(
                        f"topic {channel.topic} has more than {bounds.MAX_ROWS} messages (bounds.MAX_ROWS)",
                        plan.where,
                        kind="too_large",
                    )
                times.append(t)
    for topic, times in out.items():
        if not times:
            raise _fail(f"topic {topic} has no message in this bag", plan.where, kind="missing_key")
    return {t: np.frombuffer(v, dtype=np.int64) for t, v in out.items()}


def _distinct(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct stamps ascending, the index of the first message in the bag's order with each)."""
    order = np.argsort(t, kind="stable")
    ts = t[order]
    first = np.ones(ts.size, bool)
    first[1:] = ts[1:] != ts[:-1]
    return ts[first], order[first]


def _resample(plan: _Plan) -> tuple[np.ndarray, dict[str, np.ndarray], list[dict]]:
    """(row times in ns, topic -> message index of each row, report entries) of a bag (cached per process).

    Raises:
        ConversionError: ``too_large`` (the rows would span more than ``bounds.MAX_SPAN_S`` or
            number more than ``bounds.MAX_ROWS``: checked before the row clock is allocated),
            ``length_mismatch`` (no row has every topic), and ``_times``' errors.
    """
    return _resample_of(plan, plan.stamp())


def _check_span(plan: _Plan, times: dict[str, np.ndarray], start: int, stop: int, period: float) -> int:
    """The row count of ``[start, stop]`` at ``period`` ns, refused beyond the bounds before it is allocated."""
    span = (stop - start) / 1e9
    spans = "; ".join(
        f"{topic}: {int(t.min())} ns ({_when(int(t.min()))}) to {int(t.max())} ns ({_when(int(t.max()))})"
        for topic, t in times.items()
    )
    if span > bounds.MAX_SPAN_S:
        raise _fail(
            f"the rows would run from {start} ns to {stop} ns: {span:.6g} s, more than the {bounds.MAX_SPAN_S:g} s "
            f"an episode may span (bounds.MAX_SPAN_S; a stamp far from the others, a clock that jumped?); "
            f"refused before the row clock is allocated ({spans})",
            plan.where,
            kind="too_large",
        )
    rows = int((stop - start) // period) + 1
    if rows > bounds.MAX_ROWS:
        raise _fail(
            f"{span:.6g} s at {plan.fps:g} fps is {rows} rows, more than the {bounds.MAX_ROWS} an episode may have "
            f"(bounds.MAX_ROWS); refused before the row clock is allocated ({spans})",
            plan.where,
            kind="too_large",
        )
    return rows


@functools.lru_cache(maxsize=2)
def _resample_of(plan: _Plan, stamp: tuple) -> tuple[np.ndarray, dict[str, np.ndarray], list[dict]]:
    times = {topic: t for topic, t in _times(plan).items() if topic in plan.topics}  # streams take no part
    distinct = {topic: _distinct(t) for topic, t in times.items()}
    start = max(int(d[0][0]) for d in distinct.values())
    stop = min(int(d[0][-1]) for d in distinct.values())
    if stop < start:
        raise _fail(
            "the mapped topics do not overlap in time: no row can have a message of each",
            plan.where,
            kind="length_mismatch",
        )
    period = 1e9 / plan.fps
    grid = start + np.round(np.arange(_check_span(plan, times, start, stop, period)) * period).astype(np.int64)
    keep = np.ones(grid.size, bool)
    picks, tolerances = {}, {}
    for topic in plan.topics:
        ts, first = distinct[topic]
        i = np.clip(np.searchsorted(ts, grid), 1, max(1, ts.size - 1)) if ts.size > 1 else np.zeros(grid.size, int)
        if ts.size > 1:
            left, right = ts[i - 1], ts[i]
            i = np.where(np.abs(grid - left) <= np.abs(right - grid), i - 1, i)
        nearest = ts[i]
        median = float(np.median(np.diff(ts))) if ts.size > 1 else 0.0
        tol = plan.tolerance * 1e9 if plan.tolerance is not None else max(period, median)
        tolerances[topic] = tol
        keep &= np.abs(grid - nearest) <= tol
        picks[topic] = (first[i], np.abs(grid - nearest) <= tol, median)
    notes = []
    rows = grid[keep]
    if not rows.size:
        raise _fail(
            "no row has a message of every mapped topic within the tolerance", plan.where, kind="length_mismatch"
        )
    out = {}
    for topic in plan.topics:
        index, ok, median = picks[topic]
        out[topic] = index[keep]
        used = out[topic]
        t = times[topic]
        repeated = int(used.size - np.unique(used).size)
        unused = int(t.size - np.unique(used).size)
        dropped = int((~ok).sum())
        shared = int(t.size - distinct[topic][0].size)
        backwards = int((np.diff(t) < 0).sum())
        rate = 1e9 / median if median else 0.0
        odd = (
            f"; {shared} messages share a stamp with an earlier one (the first is used), {backwards} out of stamp order"
            if shared or backwards
            else ""
        )
        notes.append(
            {
                "kind": "resampled",
                "row": None,
                "message": f"{topic}: {t.size} messages at {rate:.2f} Hz -> {rows.size} rows at "
                f"{plan.fps:g} fps: {repeated} rows repeat a message, {unused} messages unused, {dropped} rows "
                f"dropped (no message within {tolerances[topic] / 1e6:.0f} ms){odd}",
            }
        )
    return rows, out, notes


def _decoded(plan: _Plan, topic: str, wanted=None) -> Iterator[tuple[int, object, str]]:
    """(message index, decoded message, schema name) of ``topic`` in the bag's order.

    ``wanted``: a function of the message index; messages it refuses are not decoded.
    """
    k = 0
    for bag in _bags(plan):
        for channel, _, data in bag.messages((topic,)):
            if wanted is None or wanted(k):
                yield k, *bag.decode(channel, data, k)
            k += 1


def _vector(msg, schema: str, topic: str, file: FileInput, k: int) -> dict[str, np.ndarray]:
    """The float64 vectors of a state, action, column or stream message, under ``position``.

    ``position`` (and ``velocity``, ``effort`` when not empty) of a JointState; a MultiArray's
    ``data``; a WrenchStamped's ``force.x, .y, .z, torque.x, .y, .z``.

    Raises:
        ConversionError: ``bad_feature`` (another type, a field missing or not numbers),
            ``too_large`` (a vector of more than ``bounds.MAX_VALUES`` values).
    """
    if schema not in _VECTOR_TYPES:
        raise _fail(f"topic {topic} is {schema}: only {', '.join(_VECTOR_TYPES)} give rows", file, kind="bad_feature")
    if schema == _WRENCH_TYPE:
        try:
            force, torque = msg.wrench.force, msg.wrench.torque
            wrench = [force.x, force.y, force.z, torque.x, torque.y, torque.z]
            return {"position": np.array(wrench, np.float64)}
        except (AttributeError, TypeError, ValueError) as exc:
            raise _fail(
                f"topic {topic} message {k}: a {schema} without wrench.force and wrench.torque numbers ({exc})",
                file,
                kind="bad_feature",
            ) from None
    names = ("position", "velocity", "effort") if schema == _JOINT_TYPE else ("data",)
    out = {}
    for name in names:
        values = getattr(msg, name, None)
        if values is None or isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise _fail(f"topic {topic} message {k}: a {schema} without a {name} array", file, kind="bad_feature")
        if name != "position" and name != "data" and not len(values):
            continue
        bounds.check_count(f"message {k}: {name} of", len(values), bounds.MAX_VALUES, str(file), topic)
        try:
            vector = np.asarray(values, np.float64)
        except (TypeError, ValueError) as exc:
            raise _fail(f"topic {topic} message {k}: {name} is not numbers ({exc})", file, kind="bad_feature") from None
        out["position" if name == "data" else name] = vector.reshape(-1)
    return out


def _stream(plan: _Plan, name: str, topic: str, times: np.ndarray, values: np.ndarray, t0: int, schema: str):
    """(``Stream``, report notes) of a topic kept at its own rate: every message, sorted by time.

    ``times``: the messages' int64 ns times in the bag's order (``_times``), ``values`` their
    vectors ``[n, width]`` in the same order, ``t0`` the first row's time: a sample's timestamp is
    ``(time - t0) / 1e9`` seconds, the clock of the table's ``timestamp`` column. Messages sharing
    a time are all kept (in the bag's order); messages out of time order are sorted and counted.

    Raises:
        ConversionError(kind="too_large"): a message more than ``bounds.MAX_SPAN_S`` from the first
            row (a stamp far off, a clock that jumped), naming the topic and the stamp.
    """
    lo, hi = int(times.min()), int(times.max())
    far = lo if t0 - lo > hi - t0 else hi
    if abs(far - t0) > bounds.MAX_SPAN_S * 1e9:
        raise _fail(
            f"topic {topic} (stream {name}): a message stamped {far} ns ({_when(far)}) is {abs(far - t0) / 1e9:.6g} s "
            f"from the first row ({t0} ns), more than the {bounds.MAX_SPAN_S:g} s an episode may span "
            "(bounds.MAX_SPAN_S; a clock that jumped?)",
            plan.where,
            kind="too_large",
        )
    order = np.argsort(times, kind="stable")
    backwards = int((np.diff(times) < 0).sum())
    stamps = (times[order] - t0) / 1e9
    values = values[order]
    if schema == "std_msgs/msg/Float32MultiArray":
        values = values.astype(np.float32)  # the message's own numbers (exact: they were float32)
    notes = []
    if backwards:
        shared = int(times.size - np.unique(times).size)
        message = f"{topic} -> stream {name}: {backwards} of {times.size} messages out of time order in the bag, "
        message += "stored sorted by time" + (f"; {shared} share a time with another (all kept)" if shared else "")
        notes.append({"kind": "stream_reordered", "row": None, "message": message})
    return Stream(stamps, values), notes


@dataclass(frozen=True)
class _MCAPTable(LazyTable):
    """A bag's rows: the resampled state, action and column topics, with the resampling reported per topic.

    The streams' topics (``_Plan.streams``) come with the rows as ``LoadedTable.streams``, every
    message at its own time (``_stream``).
    """

    plan: _Plan

    def load(self) -> LoadedTable:
        """The rows, resampled onto the row clock, and the streams at their own times.

        Raises:
            ConversionError: ``missing_key``, ``length_mismatch``, ``bad_feature``, ``too_large``,
                ``unreadable_file``, naming the bag and the topic.
        """
        plan = self.plan
        with bounds.reading(plan.where):
            rows, picks, notes = _resample(plan)
            times = _times(plan)
            counts = {topic: t.size for topic, t in times.items()}
        columns: dict[str, np.ndarray] = {}
        keys: dict[str, str] = {}
        read: dict[str, tuple[dict[str, np.ndarray], str]] = {}  # topic -> its vectors, decoded once
        outputs = [("observation.state", plan.state), ("action", plan.action), *plan.columns]
        for out, topic in outputs:
            if topic is None:
                continue
            with bounds.reading(plan.where, topic):
                if topic not in read:
                    read[topic] = self._vectors(topic, counts[topic])
                arrays = read[topic][0]
                for name, values in arrays.items():
                    if out != "observation.state" and name != "position":
                        continue
                    column = out if name == "position" else f"observation.{name}"
                    bounds.check_bytes((rows.size, values.shape[1]), 8, plan.where, topic)
                    columns[column] = values[picks[topic]]
                    keys[column] = topic
        table = build_table(columns, plan.fps, plan.where, keys, times=(rows - rows[0]) / 1e9)
        table = table.append_column("timestamp_ns", pa.array(rows))
        streams = {}
        for name, topic in plan.streams:
            with bounds.reading(plan.where, topic):
                if topic not in read:
                    read[topic] = self._vectors(topic, counts[topic])
                arrays, schema = read[topic]
                streams[name], more = _stream(plan, name, topic, times[topic], arrays["position"], int(rows[0]), schema)
                notes += more
        return LoadedTable(table, notes, (), streams)

    def _vectors(self, topic: str, count: int) -> tuple[dict[str, np.ndarray], str]:
        """(name -> float64 ``[count, n]`` of ``topic``'s messages in the bag's order, their type).

        Allocated once, after the first message (``bounds.MAX_ARRAY_BYTES``).
        """
        plan, arrays = self.plan, {}
        k, kind = -1, ""
        for k, msg, schema in _decoded(plan, topic):
            kind = schema
            vectors = _vector(msg, schema, topic, plan.where, k)
            if k == 0:
                for name, v in vectors.items():
                    bounds.check_bytes((count, v.size), 8, plan.where, topic)
                    arrays[name] = np.empty((count, v.size), np.float64)
            for name in sorted(set(arrays) | set(vectors)):
                got = vectors[name].size if name in vectors else 0
                want = arrays[name].shape[1] if name in arrays else 0
                if got != want or k >= count:
                    raise _fail(
                        f"topic {topic}: {name} changes length between messages ({want} values in message 0, "
                        f"{got} in message {k})",
                        plan.where,
                        "length_mismatch",
                    )
                arrays[name][k] = vectors[name]
        if k + 1 != count:
            raise _fail(f"topic {topic}: {k + 1} messages, {count} when the bag was first read", plan.where)
        return arrays, kind

    @property
    def path(self) -> str:
        """The bag's (first) MCAP file."""
        return str(self.plan.files[0])

    def fingerprint(self) -> list:
        """Bag, size and plan (the streams' names and topics when there are any)."""
        p = self.plan
        out = [[str(f) for f in p.files], p.size(), p.fps, p.tolerance, p.topics, p.state, p.action, p.columns]
        return [*out, p.streams] if p.streams else out

    def estimated_bytes(self) -> int:
        """A guess: 1 kB."""
        return 1 << 10


def _image(msg, schema: str, topic: str, file: FileInput, k: int):
    """A camera message as uint8 RGB ``[H, W, 3]``, uint16 ``[H, W]`` (mono16, 16UC1) or encoded bytes.

    Raises:
        ConversionError: ``bad_image`` (an unknown encoding; a size, step or data that do not hold
            the image claimed), ``too_large`` (a frame of more than ``bounds.MAX_FRAME_BYTES``).
    """
    where = f"topic {topic} message {k}"
    try:
        if schema.endswith("CompressedImage"):
            return _compressed(str(msg.format), bytes(msg.data), where, file)
        enc, h, w, step = str(msg.encoding).lower(), int(msg.height), int(msg.width), int(msg.step)
        big, data = bool(msg.is_bigendian), msg.data
    except (AttributeError, TypeError, ValueError) as exc:
        raise _fail(f"{where}: not an image {schema} can hold ({exc})", file, kind="bad_image") from None
    depth = enc in ("mono16", "16uc1")
    channels = 1 if depth else {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "8uc1": 1, "8uc3": 3}.get(enc)
    if channels is None:
        raise _fail(f"{where}: a {enc} image cannot be read (known: rgb8, bgr8, rgba8, bgra8, mono8, "
                    "8UC1, 8UC3, mono16, 16UC1)", file, kind="bad_image")  # fmt: skip
    pixel = 2 if depth else channels
    if h <= 0 or w <= 0 or step < w * pixel or h * step > len(data):
        raise _fail(
            f"{where}: a {enc} image of {w}x{h} (step {step}) claims {h} x {step} = {h * step} bytes, and "
            f"{w} x {pixel} bytes a row; its data holds {len(data)} bytes",
            file,
            kind="bad_image",
        )
    bounds.check_bytes((h, w, 1 if depth else 3), 2 if depth else 1, str(file), topic, bounds.MAX_FRAME_BYTES)
    rows = np.frombuffer(data, np.uint8, h * step).reshape(h, step)[:, : w * pixel]
    if depth:
        return rows.view(">u2" if big else "<u2").astype(np.uint16)
    image = rows.reshape(h, w, channels)
    if enc.startswith("bgr"):
        image = image[..., [2, 1, 0]]
    if channels == 1:
        image = np.repeat(image, 3, axis=-1)
    return image[..., :3]


def _compressed(fmt: str, data: bytes, where: str, file: FileInput) -> bytes:
    """A CompressedImage's image file: its data, or a ``compressedDepth`` PNG after its 12-byte header.

    compressed_depth_image_transport (``format`` ``"16UC1; compressedDepth png"``) puts a
    ``ConfigHeader`` (int32 format, float32 depthQuantA, depthQuantB) before a 16-bit PNG of the
    depth; for ``32FC1`` the PNG holds quantized inverse depth, and ``rvl`` is not a PNG: both are
    refused rather than stored as depth they are not.

    Raises:
        ConversionError(kind="bad_image"): a compressedDepth image other than a 16UC1/mono16 PNG.
    """
    if "compresseddepth" not in fmt.lower():
        return data
    encoding = fmt.split(";", 1)[0].strip().lower()
    if encoding not in ("16uc1", "mono16") or "rvl" in fmt.lower() or data[12:16] != b"\x89PNG":
        raise _fail(
            f"{where}: a compressedDepth image of format {fmt!r} cannot be read (only 16UC1/mono16 depth as PNG: "
            "32FC1 holds quantized inverse depth, rvl is not a PNG)",
            file,
            kind="bad_image",
        )
    return data[12:]


def _last_use(wanted: np.ndarray) -> np.ndarray:
    """Message index -> the last row that shows it (-1: none), for ``wanted`` (message per row)."""
    order = np.arange(wanted.size) if np.all(wanted[1:] >= wanted[:-1]) else np.argsort(wanted, kind="stable")
    w = wanted[order]
    ends = np.flatnonzero(np.append(w[1:] != w[:-1], True))  # the last row of each message (sorted)
    last_use = np.full(int(w[-1]) + 1, -1)
    last_use[w[ends]] = order[ends]
    return last_use


def _held_peak(wanted: np.ndarray, last_use: np.ndarray) -> int:
    """The most images streaming in the bag's order must hold at once to give ``wanted`` (message per row).

    Message ``m`` is decoded when read (its index: the bag's order) and held until the rows reach
    past the last row that shows it, which needs every message up to the running maximum of
    ``wanted`` there. Integer arithmetic on the message indices: nothing is read.
    """
    ready = np.maximum.accumulate(wanted)  # row r can be given once message ready[r] is read
    used = np.flatnonzero(last_use >= 0)
    release = ready[last_use[used]]
    n = last_use.size + 1
    held = np.cumsum(np.bincount(used, minlength=n) - np.bincount(release + 1, minlength=n))
    return int(held.max())


@dataclass(frozen=True)
class _MCAPFrames(FrameReader):
    """A camera topic's frames on the bag's row clock (a message repeated where rows repeat it)."""

    plan: _Plan
    topic: str
    estimate: int = 0

    def chunks(self) -> Iterator[np.ndarray | list[bytes]]:
        """``CHUNK_FRAMES`` frames at a time, arrays or encoded images (CompressedImage).

        The topic's messages are read once, in the bag's order; an image is decoded only when a row
        shows it, and held only until the last row that shows it is given (at most ``_HELD_FRAMES``
        besides the chunk).

        Raises:
            ConversionError: ``too_large`` (the stamps run against the bag's order so that more than
                ``_HELD_FRAMES`` images would be held: refused before any is decoded), ``_image``'s
                errors, ``unreadable_file`` (a damaged record or message), naming the bag and topic.
        """
        with bounds.reading(self.plan.where, self.topic):
            yield from self._chunks()

    def _chunks(self) -> Iterator[np.ndarray | list[bytes]]:
        plan, topic = self.plan, self.topic
        _, picks, _ = _resample(plan)
        wanted = picks[topic]
        last_use = _last_use(wanted)  # the last row that shows each message
        peak = _held_peak(wanted, last_use)
        if peak > _HELD_FRAMES:
            raise _fail(
                f"topic {topic}: its stamps run against the order of its messages in the bag: {peak} images "
                f"would have to be held at once to give the rows in stamp order, more than the {_HELD_FRAMES} a "
                "camera may hold; refused before its images are read (docs/sources/mcap.md)",
                plan.where,
                kind="too_large",
            )
        held: dict[int, object] = {}  # decoded messages a row still to come shows
        row = 0
        chunk = _Chunk(0, min(CHUNK_FRAMES, wanted.size))

        def shown(k: int) -> bool:
            return k < last_use.size and last_use[k] >= row

        for k, msg, schema in _decoded(plan, topic, shown):
            held[k] = _image(msg, schema, topic, plan.where, k)
            del msg
            while row < wanted.size and int(wanted[row]) in held:
                chunk.add(held[int(wanted[row])], row)
                row += 1
                if chunk.full:
                    out, chunk = chunk.out(), _Chunk(row, min(CHUNK_FRAMES, wanted.size - row))
                    yield out
            held = {m: v for m, v in held.items() if last_use[m] >= row}
            if row >= wanted.size:
                break
        if row < wanted.size:
            raise _fail(f"topic {topic}: the bag ended before row {row}'s message", plan.where)

    def fingerprint(self) -> list:
        """Bag, size, plan, topic."""
        p = self.plan
        return [[str(f) for f in p.files], p.size(), p.fps, p.tolerance, p.topics, self.topic]

    def estimated_bytes(self) -> int:
        """A share of the bag."""
        return self.estimate


class _Chunk:
    """The chunk being filled from row ``first``.

    Encoded images in a list, arrays copied into one ``[size, ...]`` array as they come (so an
    image no later row shows is freed at once, not held until the chunk is stacked).
    """

    def __init__(self, first: int, size: int):
        self.first, self.size, self.n = first, size, 0
        self.encoded: list[bytes] = []
        self.frames: np.ndarray | None = None

    @property
    def full(self) -> bool:
        return self.n >= self.size

    def add(self, image, row: int) -> None:
        """Append row ``row``'s image; ConversionError ``bad_image`` / ``frame_size_changed`` naming the row."""
        encoded = isinstance(image, bytes)
        if self.n and encoded != (self.frames is None):
            raise ConversionError("a topic mixes encoded and raw images", kind="bad_image", row=row)
        if encoded:
            self.encoded.append(image)
        elif self.n == 0:
            self.frames = np.empty((self.size, *image.shape), image.dtype)
            self.frames[0] = image
        elif self.frames is None:  # (typing: set with the first raw image)
            raise AssertionError("no frames buffer after the first raw image")
        elif image.shape != self.frames.shape[1:] or image.dtype != self.frames.dtype:
            first = self.frames.shape[1:]
            raise ConversionError(
                f"frame is {image.shape[1]}x{image.shape[0]} {image.dtype}, frame {self.first}'s is "
                f"{first[1]}x{first[0]} {self.frames.dtype}",
                kind="frame_size_changed",
                row=row,
            )
        else:
            self.frames[self.n] = image
        self.n += 1

    def out(self) -> np.ndarray | list[bytes]:
        return self.encoded if self.frames is None else self.frames


def _camera_name(topic: str) -> str:
    parts = [p for p in topic.strip("/").split("/") if p and p.lower() not in _NAME_NOISE]
    return "observation.images." + re.sub(r"[^A-Za-z0-9_]", "_", "_".join(parts) or "camera")


def _summary(file: FileInput) -> tuple[dict[str, str], dict[str, int]]:
    """(topic -> schema name, topic -> message count) from the bag's summary section.

    Raises:
        SourceError: not a readable MCAP file, or one without a summary section, naming it.
    """
    try:
        with _open_bag(file) as bag:
            summary = bag.summary
    except (ConversionError, SourceError) as exc:
        raise SourceError(f"{file}: not a readable MCAP file ({getattr(exc, 'detail', exc)})") from None
    except Exception as exc:
        raise SourceError(f"{file}: not a readable MCAP file ({type(exc).__name__}: {exc})") from exc
    if summary is None:
        raise SourceError(f"{file}: the MCAP file has no summary section (not finished writing?); reindex it")
    schemas = {sid: s.name for sid, s in summary.schemas.items()}
    topics = {c.topic: schemas.get(c.schema_id, "") for c in summary.channels.values()}
    counts = {}
    if summary.statistics is not None:
        for cid, n in summary.statistics.channel_message_counts.items():
            if cid in summary.channels:
                counts[summary.channels[cid].topic] = n
    return topics, counts


def _recording_summary(files: tuple[FileInput, ...]) -> tuple[dict[str, str], dict[str, int]]:
    """``_summary`` of every file of a recording: the topics any file has, the counts added up.

    Raises:
        SourceError: as ``_summary``; a topic whose type differs between the files, naming both.
    """
    topics: dict[str, str] = {}
    counts: dict[str, int] = {}
    for file in files:
        some, many = _summary(file)
        for topic, schema in some.items():
            if topics.setdefault(topic, schema) != schema:
                raise SourceError(f"{file}: topic {topic} is {schema}, {topics[topic]} in {files[0]}")
        for topic, n in many.items():
            counts[topic] = counts.get(topic, 0) + n
    return topics, counts


def _check_layouts(files: tuple[FileInput, ...], topics: list[str]) -> None:
    """Each mapped topic's schema in the first recording asks no more bytes than a message of its bag can hold.

    A message lies in a chunk (the summary's chunk index states each one's size) or, in a bag
    without chunks, in the file, and is at most ``_message_limit`` bytes. A schema that cannot be
    parsed is left to the episode's read (``_Bag.decode`` names it).

    Raises:
        SourceError: a schema whose least message is larger, naming the bag, the topic and the field.
    """
    for file in files:
        try:
            with _open_bag(file) as bag:
                summary = bag.summary
                if summary is None:
                    continue
                room = max((c.uncompressed_size for c in summary.chunks), default=bag.size)
                for channel in summary.channels.values():
                    schema = summary.schemas.get(channel.schema_id)
                    if channel.topic not in topics or schema is None or schema.encoding != "ros2msg":
                        continue
                    try:
                        layout = bag.layout(channel)
                    except ConversionError:
                        continue
                    most = min(room, _message_limit(schema.name))
                    if _CDR_HEADER + layout.least > most:
                        raise SourceError(
                            f"{file}: topic {channel.topic} ({schema.name}): its schema's field {layout.field} "
                            f"({layout.field_type}) alone takes at least {layout.field_bytes} bytes, and a message "
                            f"at least {_CDR_HEADER + layout.least}; no message of this bag can hold that (at most "
                            f"{most} bytes: its largest chunk, the file, or the limit of a {schema.name}); refused at "
                            "open"
                        )
        except ConversionError as exc:
            raise SourceError(f"{file}: not a readable MCAP file ({exc.detail})") from None


def _rate(files: tuple[FileInput, ...], where: str, cams: dict[str, str], root: str) -> float:
    """The slowest camera topic's median rate in the first recording (its distinct stamps), rounded to 0.01 Hz.

    Raises:
        SourceError: no camera topic with two distinct stamps, a rate that rounds to 0, or the
            bag cannot be read, naming the bag and the topics.
    """
    rates, lacking = [], []
    for topic in cams.values():
        try:
            times = _times(_Plan(files, where, 1.0, None, (topic,), None, None))[topic]
        except ConversionError as exc:
            raise SourceError(f"{where}: {exc.detail}") from None
        stamps = np.unique(times)
        if stamps.size > 1:
            rates.append((1e9 / float(np.median(np.diff(stamps))), topic))
        else:
            lacking.append(f"{topic}: {times.size} messages, all stamped {int(stamps[0])} ns")
    if not rates:
        if not lacking:
            raise SourceError(f"{root}: no camera topic to take a rate from; pass --fps")
        raise SourceError(f"{where}: no camera topic to take a rate from ({'; '.join(lacking)}); pass --fps")
    rate, topic = min(rates)
    if round(rate, 2) <= 0:
        raise SourceError(
            f"{where}: the slowest camera topic {topic} has a median rate of {rate:.3g} Hz, which rounds to 0; "
            "pass --fps"
        )
    return round(rate, 2)


def _folder(file: FileInput) -> str:
    return str(file).rsplit("/", 1)[0] if "/" in str(file) else "."


def _metadata_fields(meta: FileInput) -> dict[str, Any]:
    """``storage_identifier``, ``compression_mode`` and ``relative_file_paths`` of a rosbag2 ``metadata.yaml``.

    rosbag2 writes it block style (yaml-cpp); a flow list (``[a.mcap, b.mcap]``) is read too. Read
    here line by line (no YAML library): at most ``_METADATA_BYTES``.

    Raises:
        SourceError: too large, unreadable, or no ``relative_file_paths`` list, naming the file.
    """
    try:
        with open_binary(meta) as f:
            raw = f.read(_METADATA_BYTES + 1)
    except OSError as exc:
        raise SourceError(f"{meta}: cannot read the rosbag2 metadata ({exc})") from exc
    if len(raw) > _METADATA_BYTES:
        raise SourceError(f"{meta}: more than {_METADATA_BYTES} bytes: not a rosbag2 metadata.yaml")
    lines = raw.decode("utf-8", "replace").splitlines()
    out: dict[str, Any] = {}
    for i, line in enumerate(lines):
        found = re.match(r"\s*(storage_identifier|compression_mode|relative_file_paths)\s*:\s*(.*?)\s*$", line)
        if not found or found.group(1) in out:
            continue
        key, value = found.groups()
        if key != "relative_file_paths":
            out[key] = value.strip("'\"")
        elif value.startswith("["):
            out[key] = [v.strip().strip("'\"") for v in value.strip("[]").split(",") if v.strip()]
        else:
            items = []
            for item in lines[i + 1 :]:
                if not item.strip() or item.strip().startswith("#"):
                    continue
                listed = re.match(r"\s*-\s+(.*?)\s*$", item)
                if not listed:
                    break
                items.append(listed.group(1).strip("'\""))
            out[key] = items
    if not out.get("relative_file_paths"):
        raise SourceError(f"{meta}: a rosbag2 metadata.yaml without relative_file_paths")
    return out


def _recordings(files: list[FileInput]) -> list[tuple[str, tuple[FileInput, ...]]]:
    """(name, files) of each recording: a bag alone, or the files a rosbag2 folder's ``metadata.yaml`` lists.

    ``ros2 bag record`` writes a folder: ``metadata.yaml`` and the files it lists in
    ``relative_file_paths`` (several when split by ``--max-bag-size`` / ``--max-bag-duration``), one
    recording, read as rosbag2 reads it: its files one after another in that order.

    Raises:
        SourceError: a rosbag2 folder whose metadata names another storage than MCAP, a
            compression (``file``, ``message``: decompress it first), a listed file that is
            missing, or an MCAP file it does not list, naming the folder and the files.
    """
    metas = {_folder(f): f for f in files if str(f).rsplit("/", 1)[-1] == _METADATA}
    bags = [f for f in files if str(f).endswith(".mcap")]
    out: list[tuple[str, tuple[FileInput, ...]]] = []
    grouped: dict[str, list[FileInput]] = {}
    for f in bags:
        if _folder(f) in metas:
            grouped.setdefault(_folder(f), []).append(f)
        else:
            out.append((str(f), (f,)))
    for folder, found in grouped.items():
        meta = metas[folder]
        fields = _metadata_fields(meta)
        storage = fields.get("storage_identifier", "mcap")
        mode = str(fields.get("compression_mode", "")).lower()
        if storage != "mcap" or mode not in ("", "none"):
            raise SourceError(
                f"{meta}: a rosbag2 recording stored as {storage!r} with compression mode {mode!r}: only MCAP "
                "files without rosbag2's own compression are read (decompress it first: ros2 bag convert)"
            )
        by_name = {str(f).rsplit("/", 1)[-1]: f for f in found}
        listed = [name.replace("\\", "/").rsplit("/", 1)[-1] for name in fields["relative_file_paths"]]
        missing = [n for n in listed if n not in by_name]
        unlisted = sorted(set(by_name) - set(listed))
        if missing or unlisted:
            raise SourceError(
                f"{meta}: the rosbag2 recording lists {', '.join(listed)}; "
                + (f"missing: {', '.join(missing)}" if missing else f"not listed: {', '.join(unlisted)}")
                + " (a split recording is read whole, its files in the order listed)"
            )
        out.append((folder, tuple(by_name[n] for n in dict.fromkeys(listed))))
    return sorted(out, key=lambda r: natural_key(r[0]))


def _default(topics: dict[str, str]) -> Mapping:
    cameras = {_camera_name(t): t for t, s in sorted(topics.items()) if s in _IMAGE_TYPES}
    actionish = [
        t for t, s in sorted(topics.items()) if re.search(r"action|command", t) and s in (_JOINT_TYPE, *_ARRAY_TYPES)
    ]
    joints = [t for t, s in sorted(topics.items()) if s == _JOINT_TYPE and t not in actionish]
    return Mapping(
        state=tuple(joints[:1]),
        action=tuple(actionish[:1]),
        cameras=cameras,
        depth=(),
        columns={},
        others=False,
    )


def _streams(mapping: Mapping, topics: dict[str, str], cams: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """(stream name, topic) of the mapping's ``streams``, sorted by name.

    ``"all"``: every topic of the first recording of a type a stream reads (``_VECTOR_TYPES``: not
    a camera), named by its topic (``/ft/wrench`` -> ``ft.wrench``).

    Raises:
        SourceError: a stream given as anything but a topic, two topics of one name, or a name
            that is a column the reader makes, a mapped column or a camera.
    """
    given = mapping.streams
    if given is None:
        return ()
    if given == "all":
        pairs = [(column_name(t), t) for t, schema in sorted(topics.items()) if schema in _VECTOR_TYPES]
    elif isinstance(given, dict):
        pairs = []
        for name, topic in given.items():
            if not isinstance(topic, str):
                raise SourceError(f"mapping: streams: {name!r} is {topic!r}; an MCAP stream is a topic")
            pairs.append((name, topic))
    else:
        raise SourceError(f'mapping: streams must be "all" or map stream names to topics, got {given!r}')
    taken = {*_RESERVED, *(mapping.columns or {}), *cams}
    seen: dict[str, str] = {}
    for name, topic in pairs:
        if name in seen:
            raise SourceError(f"mapping: streams: topics {seen[name]} and {topic} would both be stream {name!r}")
        if name in taken or name.startswith("observation.images."):
            raise SourceError(
                f"mapping: stream {name!r} ({topic}) has the name of a column or camera of the episode; choose another"
            )
        seen[name] = topic
    return tuple(sorted(pairs))


def _check_mapping(
    mapping: Mapping, cams: dict[str, str], topics: dict[str, str], where: str, streams: tuple = ()
) -> None:
    """Every mapped topic (``streams``' too) is in the first recording and of a type its place reads.

    Raises:
        SourceError: more than one topic for ``state`` or ``action``; ``others``; a column named
            like a column the reader makes; a topic the recording lacks, or of another type,
            naming the topic, its type and the types read.
    """
    for field_name in ("state", "action"):
        if len(getattr(mapping, field_name) or ()) > 1:
            raise SourceError(
                f"mapping: {field_name} takes one topic in an MCAP source, got {getattr(mapping, field_name)}"
            )
    if mapping.others:
        raise SourceError("mapping: others is not read from MCAP bags: name each topic to keep in columns")
    for name in mapping.columns or {}:
        if name in _RESERVED or name.startswith("observation.images."):
            raise SourceError(f"mapping: column {name!r} is a column the MCAP reader makes; choose another name")
    places = [
        *(("state", t, _VECTOR_TYPES) for t in mapping.state or ()),
        *(("action", t, _VECTOR_TYPES) for t in mapping.action or ()),
        *((f"column {c}", t, _VECTOR_TYPES) for c, t in (mapping.columns or {}).items()),
        *((f"camera {c}", t, _IMAGE_TYPES) for c, t in cams.items()),
        *((f"stream {n}", t, _VECTOR_TYPES) for n, t in streams),
    ]
    for place, topic, types in places:
        if topic not in topics:
            raise SourceError(f"{where}: no topic {topic} (topics: {', '.join(sorted(topics))}); see --mapping")
        if topics[topic] not in types:
            raise SourceError(
                f"{where}: topic {topic} ({place}) is {topics[topic] or 'without a schema'}: a {place.split()[0]} "
                f"reads {', '.join(types)}; see --mapping"
            )


def open_mcap(
    root: str,
    options: SourceOptions,
    cameras: tuple[str, ...] | None,
    storage_options: dict | None,
    episodes: frozenset[int] | None,
) -> Source:
    """Describe a bag, a rosbag2 folder or a folder of them: reads the first recording's summary (topics, counts).

    Raises:
        SourceError: no ``.mcap`` file, one without a summary, a rosbag2 folder that cannot be read
            whole (``_recordings``), a mapped topic the first recording lacks or of a type its
            place does not read, more than one topic for ``state`` or ``action``, or no rate to
            resample to.
    """
    found = source_files(root, (".mcap", _METADATA), storage_options, allow_external=options.allow_external)
    recordings = _recordings(found)
    if not recordings:
        raise SourceError(f"{root}: no MCAP file (*.mcap)")
    first, first_files = recordings[0]
    topics, counts = _recording_summary(first_files)
    mapping = options.resolved(_default(topics))
    cams = kept_cameras(mapping.cameras, cameras, str(root))
    streams = _streams(mapping, topics, cams)
    _check_mapping(mapping, cams, topics, first, streams)
    state = (mapping.state or (None,))[0]
    action = (mapping.action or (None,))[0]
    columns = tuple((mapping.columns or {}).items())
    used = sorted({*cams.values(), *(t for t in (state, action) if t), *(t for _, t in columns)})  # resampled
    if streams and not used:
        raise SourceError(
            f"{first}: streams are timed from the first row: map a camera, state, action or column topic too"
        )
    kept = sorted({*used, *(t for _, t in streams)})
    _check_layouts(first_files, kept)
    fps = mapping.fps
    how = "given"
    if fps is None:
        how = "the slowest camera topic's median rate (pass --fps to choose)"
        fps = _rate(first_files, first, cams, root)
    notes = [
        f"mcap mapping: state = {state or 'none'}, action = {action or 'none'}, cameras = "
        + (", ".join(f"{c} <- {t}" for c, t in cams.items()) or "none")
        + "".join(f", {c} <- {t}" for c, t in columns)
        + "".join(f", stream {n} <- {t} (every message at its own time)" for n, t in streams)
        + f"; resampled to {fps:g} fps ({how}), nearest message within "
        + (f"{mapping.tolerance * 1000:g} ms" if mapping.tolerance else "a row period or the topic's own period")
    ]
    notes += [
        f"topic {t} ({topics[t]}, {counts.get(t, '?')} messages in {first}) is not kept"
        for t in sorted(topics)
        if t not in kept
    ]
    notes += [
        f"rosbag2 recording {where}: {len(files)} files read as one episode, in the order its metadata.yaml lists"
        for where, files in recordings
        if len(files) > 1
    ]
    name = root.rstrip("/").rsplit("/", 1)[-1].removesuffix(".mcap") or "mcap"
    out = []
    for index, (where, files) in zip(episode_numbers([w for w, _ in recordings]), recordings, strict=True):
        if episodes is not None and index not in episodes:
            continue
        plan = _Plan(files, where, float(fps), mapping.tolerance, tuple(used), state, action, columns, streams)
        share = plan.size() // max(1, len(cams))
        frames = {
            c: CameraFrames(_MCAPFrames(plan, t, share), depth=c in (mapping.depth or ())) for c, t in cams.items()
        }
        out.append(
            Episode(
                source=name,
                episode_index=index,
                table=_MCAPTable(plan),
                videos={},
                fps=float(fps),
                tasks=(mapping.task,) if mapping.task else (),
                robot="ros2",
                frames=frames,
            )
        )
    return Source(name=name, episodes=out, fps=float(fps), path=root, format="mcap", notes=notes)
