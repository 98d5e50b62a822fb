"""TFRecord files and ``tf.train.Example`` records, read without TensorFlow.

A TFRecord file is a run of records, each ``uint64 length``, ``uint32 masked_crc32c(length)``,
``data``, ``uint32 masked_crc32c(data)`` (little endian; the mask is TensorFlow's:
``((crc >> 15) | (crc << 17)) + 0xa282ead8``). ``tf.train.Example`` is the protobuf
``Example { Features features = 1 }``, ``Features { map<string, Feature> feature = 1 }``,
``Feature { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3 } }``,
each list ``repeated value = 1`` (numbers packed or not). CRC-32C comes from the ``crc32c``
package (``epishard[rlds]``).
"""

from __future__ import annotations

import struct
from typing import BinaryIO

import numpy as np

from .base import require

HEADER_BYTES = 12  # length (8) + its CRC (4)
_MASK_DELTA = 0xA282EAD8


class RecordError(ValueError):
    """A record that cannot be read: truncated, a CRC mismatch, or protobuf bytes that do not parse."""


def masked_crc(data: bytes) -> int:
    """TensorFlow's masked CRC-32C of ``data``."""
    crc = require("crc32c").crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def scan(f: BinaryIO) -> tuple[list[tuple[int, int]], str | None]:
    """The records of an open TFRecord file: ``[(offset of the header, data length)]`` and a problem.

    Reads the headers only (seeks over the data). The problem is None, or a message about the
    record where the scan stopped (a truncated file, a length whose CRC does not match); the
    records before it are returned.
    """
    out: list[tuple[int, int]] = []
    f.seek(0, 2)
    end = f.tell()
    offset = 0
    while offset < end:
        f.seek(offset)
        header = f.read(HEADER_BYTES)
        if len(header) < HEADER_BYTES:
            return out, f"record {len(out)} at byte {offset}: truncated header ({len(header)} of 12 bytes)"
        (length,) = struct.unpack("<Q", header[:8])
        (crc,) = struct.unpack("<I", header[8:])
        if masked_crc(header[:8]) != crc:
            return out, f"record {len(out)} at byte {offset}: the length's CRC does not match (not a TFRecord file?)"
        stop = offset + HEADER_BYTES + length + 4
        if stop > end:
            return out, f"record {len(out)} at byte {offset}: truncated ({end - offset} of {stop - offset} bytes)"
        out.append((offset, length))
        offset = stop
    return out, None


def read_record(f: BinaryIO, offset: int, length: int) -> bytes:
    """The data of the record at ``offset`` (from ``scan``), its CRC checked. Raises RecordError."""
    f.seek(offset + HEADER_BYTES)
    data = f.read(length + 4)
    if len(data) < length + 4:
        raise RecordError(f"record at byte {offset}: truncated ({len(data)} of {length + 4} bytes)")
    (crc,) = struct.unpack("<I", data[length:])
    if masked_crc(data[:length]) != crc:
        raise RecordError(f"record at byte {offset}: the data's CRC does not match (damaged file)")
    return data[:length]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise RecordError("protobuf: truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a protobuf message: ints for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise RecordError("protobuf: truncated field")
            yield number, wire, buf[pos : pos + size]
            pos += size
        elif wire == 5:
            yield number, wire, buf[pos : pos + 4]
            pos += 4
        elif wire == 1:
            yield number, wire, buf[pos : pos + 8]
            pos += 8
        else:
            raise RecordError(f"protobuf: unknown wire type {wire}")


def _feature(buf: bytes) -> tuple[str, list[bytes] | np.ndarray]:
    """A ``Feature``: ("bytes", [values]), ("float", float32 array) or ("int64", int64 array)."""
    for number, _, body in _fields(buf):
        assert isinstance(body, bytes)
        if number == 1:
            return "bytes", [bytes(v) for n, _, v in _fields(body) if n == 1 and isinstance(v, bytes)]
        if number == 2:
            parts: list[np.ndarray] = []
            for n, _, v in _fields(body):
                if n == 1 and isinstance(v, bytes):
                    parts.append(np.frombuffer(v, "<f4"))  # packed (wire 2) or one value (wire 5)
            return "float", np.concatenate(parts) if parts else np.zeros(0, np.float32)
        if number == 3:
            ints: list[int] = []
            for n, wire, v in _fields(body):
                if n != 1:
                    continue
                if wire == 2 and isinstance(v, bytes):
                    p = 0
                    while p < len(v):
                        x, p = _varint(v, p)
                        ints.append(x)
                elif isinstance(v, int):
                    ints.append(v)
            return "int64", np.asarray(ints, dtype=np.uint64).astype(np.int64)
    return "bytes", []


def parse_example(data: bytes) -> dict[str, tuple[str, list[bytes] | np.ndarray]]:
    """A serialized ``tf.train.Example``: feature name -> (kind, values). Raises RecordError."""
    out = {}
    try:
        for number, _, features in _fields(data):
            if number != 1 or not isinstance(features, bytes):
                continue
            for n, _, entry in _fields(features):
                if n != 1 or not isinstance(entry, bytes):
                    continue
                name, value = "", None
                for m, _, v in _fields(entry):
                    if m == 1 and isinstance(v, bytes):
                        name = v.decode()
                    elif m == 2 and isinstance(v, bytes):
                        value = _feature(v)
                out[name] = value if value is not None else ("bytes", [])
    except (UnicodeDecodeError, IndexError) as exc:
        raise RecordError(f"protobuf: not a tf.train.Example ({exc})") from exc
    return out
