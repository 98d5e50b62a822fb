"""TFRecord files and ``tf.train.Example`` records, read without TensorFlow, in time linear in their bytes.

A TFRecord file is a run of records, each ``uint64 length``, ``uint32 masked_crc32c(length)``,
``data``, ``uint32 masked_crc32c(data)`` (little endian; the mask is TensorFlow's:
``((crc >> 15) | (crc << 17)) + 0xa282ead8``). ``tf.train.Example`` is the protobuf
``Example { Features features = 1 }``, ``Features { map<string, Feature> feature = 1 }``,
``Feature { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3 } }``,
each list ``repeated value = 1`` (numbers packed or not). CRC-32C comes from the ``crc32c``
package (``epishard[rlds]``).

The protobuf wire format (https://protobuf.dev/programming-guides/encoding/), as parsed here:

- A message is a run of fields; each is a key, the varint ``field_number << 3 | wire_type``, then
  a value: wire type 0 a varint, 1 eight bytes, 2 a varint length and that many bytes (strings,
  bytes, embedded messages, packed numbers), 5 four bytes. Wire types 3 and 4 (groups) are not in
  ``tf.train.Example``: refused. Field number 0 is invalid. A field this reader does not know is
  skipped, as protobuf does.
- A varint is base 128, low group first, the high bit of each byte set when another byte follows;
  a 64-bit value takes at most 10 bytes. A longer varint, or a 10-byte one whose value is 2^64 or
  more (an ``int64`` holds less), is refused; negative ``int64`` values are their 64-bit two's
  complement (10 bytes).
- "Packed repeated fields": a repeated number field may come packed (one wire-2 field holding the
  values back to back) or unpacked (one field per value: ``0x0d`` + 4 bytes per float, ``0x08`` +
  a varint per int), or as several fields of either kind; a parser must accept all and concatenate
  them in order.
- "Last one wins": a map entry given twice keeps the last; a oneof keeps its last member; an
  embedded message field given more than once is merged (for a list: the values concatenated).

Every input is parsed in time linear in its bytes: varints stop at 10 bytes, embedded messages
are walked as positions in one buffer (never copied level by level), and the lists of numbers
are decoded by numpy (packed floats as a view; unpacked floats over their regular 5-byte stride;
varints decoded in 1 MiB chunks, packed or unpacked), never as one Python object per value. A
feature holding more than ``bounds.MAX_VALUES`` values, or a record of more than ``MAX_FEATURES``
features, is refused (``RecordError(kind="too_large")``) before its values are allocated; a
record longer than ``bounds.MAX_RECORD_BYTES`` is refused before it is read.

Internal: import from ``epishard.shardwriter.sources``.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from typing import BinaryIO, overload

import numpy as np

from . import bounds
from .base import require

__all__ = [
    "MAX_FEATURES",
    "BytesValues",
    "RecordError",
    "Values",
    "compression",
    "masked_crc",
    "parse_example",
    "read_record",
    "scan",
]

_HEADER_BYTES = 12  # length (8) + its CRC (4)
MAX_FEATURES = 1 << 16  # distinct features in one record (RLDS episodes hold tens)
_MASK_DELTA = 0xA282EAD8
_MAX_VARINT = 10  # bytes of a 64-bit varint
_CHUNK = 1 << 20  # bytes of varints decoded at once (bounds the temporaries to ~30 MiB)


class RecordError(ValueError):
    """A record that cannot be read: truncated, a CRC mismatch, or protobuf bytes that do not parse.

    ``kind``: ``"unreadable_file"``, or ``"too_large"`` for a claim beyond a limit (``bounds``).
    ``feature``: the feature it concerns (None: the record's framing or its outer messages). The
    message starts with ``feature '<name>': `` when there is one.
    """

    def __init__(self, message: str, kind: str = "unreadable_file", feature: str | None = None) -> None:
        super().__init__(f"feature {feature!r}: {message}" if feature is not None else message)
        self.detail, self.kind, self.feature = message, kind, feature

    def naming(self, feature: str) -> RecordError:
        """This error naming ``feature`` (itself when it already names one)."""
        return self if self.feature is not None else RecordError(self.detail, self.kind, feature)


def masked_crc(data: bytes) -> int:
    """TensorFlow's masked CRC-32C of ``data``."""
    crc = require("crc32c").crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def scan(f: BinaryIO, limit: int | None = None) -> tuple[list[tuple[int, int]], str | None]:
    """The records of an open TFRecord file: ``[(offset of the header, data length)]`` and a problem.

    Reads the headers only (seeks over the data). The problem is None, or a message about the
    record where the scan stopped (a truncated file, a length whose CRC does not match, a length
    past the end of the file); the records before it are returned. ``limit``: stop after that many
    records plus one (the caller refuses a file of more records than it may list).
    """
    out: list[tuple[int, int]] = []
    f.seek(0, 2)
    end = f.tell()
    offset = 0
    while offset < end and (limit is None or len(out) <= limit):
        f.seek(offset)
        header = f.read(_HEADER_BYTES)
        if len(header) < _HEADER_BYTES:
            return out, f"record {len(out)} at byte {offset}: truncated header ({len(header)} of 12 bytes)"
        (length,) = struct.unpack("<Q", header[:8])
        (crc,) = struct.unpack("<I", header[8:])
        if masked_crc(header[:8]) != crc:
            return out, f"record {len(out)} at byte {offset}: the length's CRC does not match (not a TFRecord file?)"
        stop = offset + _HEADER_BYTES + length + 4
        if stop > end:
            return out, (
                f"record {len(out)} at byte {offset}: truncated (its header claims {length} bytes; the file holds "
                f"{end - offset} from there)"
            )
        out.append((offset, length))
        offset = stop
    return out, None


def compression(head: bytes) -> str | None:
    """``"GZIP"`` or ``"ZLIB"`` when a file that does not frame as TFRecords starts as one of them.

    TensorFlow writes compressed TFRecord files (``tf.io.TFRecordOptions(compression_type=...)``)
    as one gzip or zlib stream of the framed records; ``head``: the file's first two bytes (gzip's
    magic ``1f 8b``; a zlib header is ``78`` then a byte making the pair a multiple of 31). Call it
    only for a file whose first header's CRC did not match: an uncompressed file may start so.
    """
    if head[:2] == b"\x1f\x8b":
        return "GZIP"
    if len(head) == 2 and head[0] == 0x78 and (head[0] << 8 | head[1]) % 31 == 0:
        return "ZLIB"
    return None


def read_record(f: BinaryIO, offset: int, length: int) -> bytes:
    """The data of the record at ``offset`` (from ``scan``), its CRC checked.

    Raises:
        RecordError: ``kind="too_large"`` for a length above ``bounds.MAX_RECORD_BYTES`` (refused
            before reading), else truncated data or a CRC mismatch.
    """
    limit = bounds.MAX_RECORD_BYTES
    if length > limit:
        raise RecordError(
            f"{length} bytes, more than the {limit} a record may have (bounds.MAX_RECORD_BYTES): refused unread",
            kind="too_large",
        )
    f.seek(offset + _HEADER_BYTES)
    data = f.read(length)
    tail = f.read(4)
    if len(data) < length or len(tail) < 4:
        raise RecordError(f"truncated ({len(data) + len(tail)} of {length + 4} bytes)")
    (crc,) = struct.unpack("<I", tail)
    if masked_crc(data) != crc:
        raise RecordError("the data's CRC does not match (damaged file)")
    return data


class BytesValues(Sequence):
    """A ``BytesList``'s values: ``bytes`` read from the record on access (one copy per value taken).

    ``len``, ``[i]`` (bytes), ``[a:b]`` (a list of bytes), iteration; equal to a list or tuple of
    the same bytes. ``sizes()``: each value's length (int64 array).
    """

    __slots__ = ("_buf", "_starts", "_stops")

    def __init__(self, buf, starts: np.ndarray, stops: np.ndarray) -> None:
        self._buf, self._starts, self._stops = buf, starts, stops

    def __len__(self) -> int:
        return len(self._starts)

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        start, stop = int(self._starts[index]), int(self._stops[index])
        return bytes(self._buf[start:stop])

    def __iter__(self) -> Iterator[bytes]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (BytesValues, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def sizes(self) -> np.ndarray:
        """Each value's length in bytes, int64 ``[len(self)]``."""
        return self._stops - self._starts

    def __repr__(self) -> str:
        return f"BytesValues({len(self)} values)"


Values = BytesValues | np.ndarray


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` (before ``end``) and the position after it; at most 10 bytes read."""
    if pos >= end:
        raise RecordError("protobuf: truncated varint")
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    first, result, shift = pos, b & 0x7F, 7
    stop = min(end, pos + _MAX_VARINT)
    pos += 1
    while pos < stop:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >> 64:
                raise RecordError("protobuf: a varint whose value is 2^64 or more (an int64 holds less)")
            return result, pos
        shift += 7
    if pos - first >= _MAX_VARINT:
        raise RecordError(f"protobuf: a varint longer than {_MAX_VARINT} bytes (at byte {first})")
    raise RecordError("protobuf: truncated varint")


def _fields(buf, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """The fields of the message in ``buf[start:end]``: ``(number, wire, varint value, a, b)``.

    ``buf[a:b]`` is the value's bytes: the varint's own bytes (wire 0), the payload (wire 2), the
    fixed bytes (wire 1, 5). Raises RecordError for a truncated field or a wire type that is not
    0, 1, 2 or 5.
    """
    pos = start
    while pos < end:
        field_key, pos = _varint(buf, pos, end)
        number, wire = field_key >> 3, field_key & 7
        if number == 0:
            raise RecordError(f"protobuf: field number 0 at byte {pos} (not protobuf?)")
        if wire == 0:
            a = pos
            value, pos = _varint(buf, pos, end)
            yield number, 0, value, a, pos
        elif wire == 2:
            size, pos = _varint(buf, pos, end)
            if size > end - pos:
                raise RecordError(f"protobuf: a field of {size} bytes runs past its message ({end - pos} bytes left)")
            yield number, 2, size, pos, pos + size
            pos += size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if size > end - pos:
                raise RecordError("protobuf: truncated field")
            yield number, wire, 0, pos, pos + size
            pos += size
        else:
            raise RecordError(f"protobuf: wire type {wire} (groups are not in tf.train.Example; not protobuf?)")


def _check_values(count: int, partial: bool = False) -> None:
    limit = bounds.MAX_VALUES
    if count > limit:
        raise RecordError(
            f"{count}{' or more' if partial else ''} values, more than the {limit} one feature may hold "
            "(bounds.MAX_VALUES): refused before reading them",
            kind="too_large",
        )


def _decode_varints(buf, start: int, end: int, unpacked: bool = False) -> np.ndarray:
    """The varints in ``buf[start:end]`` (back to back) as uint64, decoded by numpy in 1 MiB chunks.

    ``unpacked``: the bytes are fields ``0x08 <varint>`` (unpacked int64 values): the keys are
    checked and the values returned. The count is checked (``MAX_VALUES``) before the result is
    allocated. Raises RecordError: a varint longer than 10 bytes or of 2^64 or more, a truncated
    one, a key other than field 1 wire 0 (``unpacked``).
    """
    data = np.frombuffer(buf, np.uint8, end - start, start)
    n = len(data)
    if n == 0:
        return np.zeros(0, np.uint64)
    if data[-1] & 0x80:
        raise RecordError("protobuf: truncated varint (its last byte says another follows)")
    count = sum(int(np.count_nonzero(data[i : i + _CHUNK] < 0x80)) for i in range(0, n, _CHUNK))
    if unpacked and count % 2:
        raise RecordError("protobuf: not unpacked int64 values (an odd number of varints)")
    _check_values(count // 2 if unpacked else count)
    out = np.empty(count // 2 if unpacked else count, np.uint64)
    filled = decoded_so_far = 0
    i = 0
    while i < n:
        j = min(n, i + _CHUNK)
        if j < n:  # end the chunk where a varint ends
            ahead = np.flatnonzero(data[j - 1 : j - 1 + _MAX_VARINT] < 0x80)
            if not len(ahead):
                raise RecordError(f"protobuf: a varint longer than {_MAX_VARINT} bytes")
            j = j + int(ahead[0])
        chunk = data[i:j]
        stops = np.flatnonzero(chunk < 0x80)
        starts = np.empty_like(stops)
        starts[0] = 0
        starts[1:] = stops[:-1] + 1
        lengths = stops - starts + 1
        if int(lengths.max()) > _MAX_VARINT:
            raise RecordError(f"protobuf: a varint longer than {_MAX_VARINT} bytes")
        place = np.arange(len(chunk), dtype=np.int64) - np.repeat(starts, lengths)  # byte's place in its varint
        if np.any(chunk[place == _MAX_VARINT - 1] > 1):
            raise RecordError("protobuf: a varint whose value is 2^64 or more (an int64 holds less)")
        parts = (chunk & 0x7F).astype(np.uint64) << (place.astype(np.uint64) * np.uint64(7))
        del place
        values = np.bitwise_or.reduceat(parts, starts)
        del parts
        if unpacked:
            first = decoded_so_far % 2  # this chunk's first key
            if np.any(values[first::2] != 8):
                raise RecordError("protobuf: not unpacked int64 values (a key other than field 1, varint)")
            values = values[1 - first :: 2]
        decoded_so_far += len(stops)
        out[filled : filled + len(values)] = values
        filled += len(values)
        i = j
    return out


def _gather(buf, start: int, end: int, wires: tuple[int, ...], what: str) -> bytearray:
    """The bytes of every field 1 of the list in ``buf[start:end]``, in order, in one buffer.

    Packed payloads and single values alike (at most the list's size); a field 1 whose wire type
    is not in ``wires`` is refused.
    """
    out = bytearray()
    mv = memoryview(buf)
    for number, wire, _, a, b in _fields(buf, start, end):
        if number != 1:
            continue
        if wire not in wires:
            raise RecordError(f"protobuf: a {what} value of wire type {wire}")
        out += mv[a:b]
    return out


def _floats(buf, start: int, end: int) -> np.ndarray:
    """A ``FloatList``'s values, float32: packed (a view), unpacked (one strided copy) or mixed."""
    n = end - start
    if n == 0:
        return np.zeros(0, np.float32)
    if buf[start] == 0x0A:  # one packed field holding every value: what protobuf writes
        size, p = _varint(buf, start + 1, end)
        if p + size == end:
            if size % 4:
                raise RecordError(f"a packed float list of {size} bytes (not a multiple of 4)")
            _check_values(size // 4)
            return np.frombuffer(buf, "<f4", size // 4, p)
    if buf[start] == 0x0D and n % 5 == 0:  # unpacked: key 0x0d + 4 bytes per value, a regular stride
        _check_values(n // 5)
        rows = np.frombuffer(buf, np.uint8, n, start).reshape(-1, 5)
        if bool((rows[:, 0] == 0x0D).all()):
            return np.ascontiguousarray(rows[:, 1:]).view("<f4").reshape(-1)
    data = _gather(buf, start, end, (2, 5), "float_list")
    if len(data) % 4:
        raise RecordError(f"a packed float list of {len(data)} bytes (not a multiple of 4)")
    _check_values(len(data) // 4)
    return np.frombuffer(data, "<f4")


def _ints(buf, start: int, end: int) -> np.ndarray:
    """An ``Int64List``'s values, int64 (two's complement): packed, unpacked or mixed."""
    n = end - start
    if n == 0:
        return np.zeros(0, np.int64)
    if buf[start] == 0x0A:  # one packed field holding every value
        size, p = _varint(buf, start + 1, end)
        if p + size == end:
            return _decode_varints(buf, p, end).view(np.int64)
    if buf[start] == 0x08:  # unpacked: key 0x08 + a varint per value
        try:
            return _decode_varints(buf, start, end, unpacked=True).view(np.int64)
        except RecordError as exc:
            if exc.kind == "too_large":
                raise
            # not only unpacked values (or damaged): field by field below, which names what is wrong
    data = _gather(buf, start, end, (0, 2), "int64_list")
    return _decode_varints(data, 0, len(data)).view(np.int64)


def _bytes(buf, start: int, end: int) -> BytesValues:
    """A ``BytesList``'s values: positions in ``buf`` (two int64 per value), no copy."""
    starts, stops = array("q"), array("q")
    limit = bounds.MAX_VALUES
    for number, wire, _, a, b in _fields(buf, start, end):
        if number != 1:
            continue
        if wire != 2:
            raise RecordError(f"protobuf: a bytes_list value of wire type {wire}")
        starts.append(a)
        stops.append(b)
        if len(starts) > limit:
            _check_values(len(starts), partial=True)
    return BytesValues(buf, np.frombuffer(starts, np.int64), np.frombuffer(stops, np.int64))


def _joined(buf, ranges: array) -> tuple[object, int, int]:
    """``(buffer, start, end)`` of the messages at ``ranges`` (start, end pairs), merged.

    One range stays in place; several are concatenated (protobuf merges a message given twice so).
    """
    if len(ranges) == 2:
        return buf, ranges[0], ranges[1]
    mv = memoryview(buf)
    out = bytearray()
    for k in range(0, len(ranges), 2):
        out += mv[ranges[k] : ranges[k + 1]]
    return out, 0, len(out)


def _feature(buf, ranges: array) -> tuple[str, Values]:
    """A ``Feature`` (its message at ``ranges``, merged) as ``(kind, values)``.

    ("bytes", BytesValues), ("float", float32 array) or ("int64", int64 array); an empty Feature
    is ("bytes", no values).
    """
    buf, start, end = _joined(buf, ranges)
    number, lists = 0, array("q")
    for n, wire, _, a, b in _fields(buf, start, end):
        if n not in (1, 2, 3):  # bytes_list, float_list, int64_list
            continue
        if wire != 2:
            raise RecordError(f"protobuf: Feature field {n} of wire type {wire} (not a list)")
        if n != number:  # a oneof keeps its last member; the same member again is merged
            number, lists = n, array("q")
        lists += array("q", (a, b))
    if not number:
        return "bytes", BytesValues(buf, np.zeros(0, np.int64), np.zeros(0, np.int64))
    body, start, end = _joined(buf, lists)
    if number == 1:
        return "bytes", _bytes(body, start, end)
    if number == 2:
        return "float", _floats(body, start, end)
    return "int64", _ints(body, start, end)


def parse_example(data: bytes) -> dict[str, tuple[str, Values]]:
    """A serialized ``tf.train.Example``: feature name -> (kind, values).

    Kinds and values: ``"bytes"``: a ``BytesValues`` (a sequence of ``bytes``); ``"float"``: a
    float32 array; ``"int64"``: an int64 array. Time linear in ``len(data)`` (module docstring).

    Raises:
        RecordError: bytes that are not a ``tf.train.Example`` (``kind="unreadable_file"``), a
            feature of more than ``bounds.MAX_VALUES`` values or a record of more than
            ``MAX_FEATURES`` features (``kind="too_large"``); it names the feature where one is
            concerned (``feature``, and the message's start).
    """
    buf = data if isinstance(data, (bytes, bytearray)) else memoryview(data).cast("B")
    out: dict[str, tuple[str, Values]] = {}
    for number, wire, _, a, b in _fields(buf, 0, len(buf)):
        if number != 1:
            continue
        if wire != 2:
            raise RecordError("protobuf: Example.features is not a message (not a tf.train.Example)")
        for n, w, _, c, d in _fields(buf, a, b):
            if n != 1:
                continue
            if w != 2:
                raise RecordError("protobuf: a Features entry is not a message (not a tf.train.Example)")
            name, values = _entry(buf, c, d)
            out[name] = values  # a name given twice: the last wins
            if len(out) > MAX_FEATURES:
                raise RecordError(
                    f"more than {MAX_FEATURES} features in one record (tfrecord.MAX_FEATURES): refused",
                    kind="too_large",
                )
    return out


def _entry(buf, start: int, end: int) -> tuple[str, tuple[str, Values]]:
    """A ``map<string, Feature>`` entry: key (field 1) and value (field 2, merged when repeated)."""
    raw, values = b"", array("q")
    for number, wire, _, a, b in _fields(buf, start, end):
        if number == 1 and wire == 2:
            raw = bytes(buf[a:b])
        elif number == 2 and wire == 2:
            values += array("q", (a, b))
        elif number in (1, 2):
            raise RecordError(f"protobuf: a Features entry's field {number} of wire type {wire}")
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        shown = raw[:40].decode("utf-8", "replace")
        raise RecordError(f"protobuf: a feature name that is not UTF-8 ({shown!r})") from None
    if not values:
        return name, ("bytes", BytesValues(buf, np.zeros(0, np.int64), np.zeros(0, np.int64)))
    try:
        return name, _feature(buf, values)
    except RecordError as exc:
        raise exc.naming(name) from None
