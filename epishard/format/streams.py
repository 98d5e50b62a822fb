"""Streams at their own rate (format version 3): one member per stream, written and read here.

A stream is a numeric signal an episode carries at its own clock (force-torque at 1 kHz, an IMU at
200 Hz, tactile arrays, sparse events) beside the per-row table and the videos, stored once and
losslessly, never resampled onto the row clock. It is stored in pieces, one member each
(``<key>.<field>.<k>.arrow``), each an Arrow IPC file (``STREAM_EXT``) of one record batch with
uncompressed buffers (so no piece decompresses into more than its own bytes) and two columns:

- ``timestamp``: float64 ``[n]`` seconds on the episode's clock (the clock of the table's
  ``timestamp`` column: row ``r`` is at ``timestamp[r]``, or ``r / fps`` without one), finite and
  non-decreasing (two samples may share a time: events);
- ``value``: ``fixed_size_list<dtype>[width]`` ``[n]``, ``width`` the product of the per-sample
  ``shape`` (1 for a scalar); ``dtype`` one of ``manifest.STREAM_DTYPES``, as the source gave it;
  floats finite, ``uint64`` values within int64's range (readers return integers as int64).

The index's ``streams`` entry of the episode states name, member, dtype, shape, count, first and
last time, the smallest and largest interval and the nominal rate (``manifest.STREAM_TYPE``); a
reader holds the member to them (``read_stream``) and finds any time range's samples by binary
search over ``timestamp``, never by scanning.

Internal: import from ``epishard.format``.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from .errors import FormatError
from .manifest import STREAM_DTYPES

__all__ = [
    "STREAM_EXPANSION",
    "StreamData",
    "encode_stream",
    "read_pieces",
    "read_stream",
    "sample_bytes",
    "stream_facts",
]

# A piece holds at most this many bytes of samples (8 per timestamp plus the values) per byte of
# member: pieces are stored uncompressed, so a sample count an index claims never sizes an
# allocation beyond the bytes behind it (``validate.check_index``, ``read_stream``).
STREAM_EXPANSION = 1
_SLACK = 4096  # bytes of an IPC file besides its samples' (magic, schema, metadata, footer, padding)


def sample_bytes(dtype: str, width: int) -> float:
    """Bytes one sample takes in a piece: 8 for its timestamp, its values (bools: a bit each)."""
    return 8 + (width / 8 if dtype == "bool" else width * np.dtype(dtype).itemsize)


def _u32(buf: bytes, at: int) -> int:
    return struct.unpack_from("<I", buf, at)[0]


def _field(buf: bytes, table: int, i: int) -> int | None:
    """Position of field ``i`` of the flatbuffer table at ``table``, None when absent."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    size = struct.unpack_from("<H", buf, vtable)[0]
    if 4 + 2 * i >= size:
        return None
    offset = struct.unpack_from("<H", buf, vtable + 4 + 2 * i)[0]
    return None if offset == 0 else table + offset


def _batch_facts(metadata: bytes) -> tuple[int, bool]:
    """``(rows, compressed)`` of an IPC record batch message's metadata (Arrow's ``Message.fbs``).

    Read from the flatbuffer before any buffer is touched: the message's header (field 2, a
    ``RecordBatch``) holds ``length`` (field 0) and, for compressed buffers, ``compression`` (field 3).
    """
    root = _u32(metadata, 0)
    header = _field(metadata, root, 2)
    if header is None:
        raise ValueError("a record batch message without a header")
    table = header + _u32(metadata, header)
    length = _field(metadata, table, 0)
    rows = struct.unpack_from("<q", metadata, length)[0] if length is not None else 0
    return rows, _field(metadata, table, 3) is not None


class StreamData(NamedTuple):
    """One episode's stream, as stored.

    ``timestamps`` float64 ``[n]`` seconds (non-decreasing), ``values`` ``[n, *shape]`` of its stored dtype.
    """

    timestamps: np.ndarray
    values: np.ndarray


def stream_facts(timestamps: np.ndarray) -> dict:
    """The index's facts about a stream's ``timestamps`` (float64 ``[n]``, checked non-decreasing).

    ``count``, ``t_first``, ``t_last`` (0.0 when empty), ``min_interval``, ``max_interval``
    (0.0 with fewer than two samples), seconds.
    """
    n = int(timestamps.size)
    gaps = np.diff(timestamps)
    return {
        "count": n,
        "t_first": float(timestamps[0]) if n else 0.0,
        "t_last": float(timestamps[-1]) if n else 0.0,
        "min_interval": float(gaps.min()) if gaps.size else 0.0,
        "max_interval": float(gaps.max()) if gaps.size else 0.0,
    }


def encode_stream(timestamps: np.ndarray, values: np.ndarray) -> bytes:
    """The member's bytes for ``timestamps`` (float64 ``[n]``) and ``values`` (``[n, *shape]``, ``STREAM_DTYPES``).

    Values are stored bit for bit (a float's NaN payload included). The caller has checked both
    (``shardwriter``'s stream checks); the file holds no other metadata, so equal inputs give
    equal bytes. One record batch, buffers uncompressed.
    """
    values = np.ascontiguousarray(values)
    width = int(np.prod(values.shape[1:], dtype=np.int64))
    inner = pa.array(values.reshape(-1)) if values.size else pa.array([], type=pa.from_numpy_dtype(values.dtype))
    table = pa.table(
        {
            "timestamp": pa.array(np.ascontiguousarray(timestamps, dtype=np.float64)),
            "value": pa.FixedSizeListArray.from_arrays(inner, width),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def read_stream(data: bytes, dtype: str, shape: tuple[int, ...], count: int, where: str) -> StreamData:
    """The stream in member ``data``, held to the index's ``dtype``, ``shape`` and ``count``.

    Returns ``StreamData`` (timestamps float64 ``[count]``, values ``[count, *shape]`` of ``dtype``).

    Raises:
        FormatError: not an Arrow IPC file, other columns or types than the index says, another
            number of samples, or timestamps not finite or decreasing (naming ``where`` and the
            first bad sample).
    """
    if dtype not in STREAM_DTYPES:
        raise FormatError(f"{where}: stream dtype {dtype!r} is not one of {', '.join(STREAM_DTYPES)}")
    width = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count < 0 or count * sample_bytes(dtype, width) > STREAM_EXPANSION * len(data) + _SLACK:
        raise FormatError(f"{where}: {count} samples claimed of {len(data)} bytes (pieces are stored uncompressed)")
    _check_messages(data, count, where)  # before pyarrow reads a buffer: no compression, the rows the index says
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"{where}: not an Arrow IPC file: {exc}") from None
    want = pa.schema([("timestamp", pa.float64()), ("value", pa.list_(pa.from_numpy_dtype(np.dtype(dtype)), width))])
    if not table.schema.remove_metadata().equals(want):
        raise FormatError(f"{where}: columns {table.schema.remove_metadata()}, the index says {want}")
    if table.num_rows != count:
        raise FormatError(f"{where}: {table.num_rows} samples, the index says {count}")
    value = table.column("value").combine_chunks()
    for name, column in (("timestamp", table.column("timestamp")), ("value", value), ("value", value.flatten())):
        if column.null_count:
            raise FormatError(f"{where}: column {name!r} holds a null")
    times = table.column("timestamp").to_numpy()
    bad = ~np.isfinite(times)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise FormatError(f"{where}: sample {i}'s timestamp is {times[i]}")
    back = np.flatnonzero(np.diff(times) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise FormatError(f"{where}: sample {i}'s timestamp {times[i]} is before sample {i - 1}'s ({times[i - 1]})")
    flat = value.flatten().to_numpy(zero_copy_only=False)
    values = flat.astype(np.dtype(dtype), copy=False).reshape(count, *shape)
    rows = values.reshape(count, -1) if count else values.reshape(0, width)
    if np.issubdtype(values.dtype, np.floating) and not np.isfinite(rows).all():
        i = int(np.flatnonzero(~np.isfinite(rows).all(axis=1))[0])
        raise FormatError(f"{where}: sample {i} holds a value that is not finite")
    if values.dtype == np.uint64 and rows.size and int(rows.max()) > np.iinfo(np.int64).max:
        i = int(np.flatnonzero((rows > np.iinfo(np.int64).max).any(axis=1))[0])
        raise FormatError(f"{where}: sample {i} holds a uint64 value above int64's range")
    return StreamData(times.astype(np.float64, copy=False), values)


def _check_messages(data: bytes, count: int, where: str) -> None:
    """The piece is an IPC file of uncompressed record batches holding ``count`` rows in all (``FormatError``).

    Read from the messages' metadata only (``_batch_facts``), so a hostile piece whose buffers would
    decompress into far more than its bytes is refused before anything is allocated for them.
    """
    if len(data) < 8 or data[:6] != b"ARROW1":
        raise FormatError(f"{where}: not an Arrow IPC file")
    rows = 0
    try:
        for message in pa.ipc.MessageReader.open_stream(pa.py_buffer(data)[8:]):
            if message.type != "record batch":
                continue
            got, compressed = _batch_facts(message.metadata.to_pybytes())
            if compressed:
                raise FormatError(f"{where}: compressed buffers (the format stores pieces uncompressed)")
            rows += got
            if got < 0 or rows > count:
                break
    except FormatError:
        raise
    except (pa.ArrowException, OSError, ValueError, struct.error, IndexError) as exc:
        raise FormatError(f"{where}: not an Arrow IPC file: {exc}") from None
    if rows != count:
        raise FormatError(f"{where}: {rows} samples, the index says {count}")


def read_pieces(index, signal: int, blobs, where: str, pieces=None) -> StreamData:
    """A stream's samples from its piece members (all, or the ``pieces`` given, in order), held to the index.

    ``index``: the ``WindowIndex`` (``signal_pieces``, ``signal_piece_times``); ``signal``: the flat
    stream entry; ``blobs``: flat member number -> bytes; ``where``: what messages name before the
    piece's member (e.g. the episode and stream); ``pieces``: piece numbers, ascending (None: every
    piece). Each piece is read by ``read_stream`` against its own count, its first sample's time
    must be the index's ``piece_time``, and times must not decrease across pieces.

    Returns ``StreamData`` of the pieces' samples concatenated.

    Raises:
        FormatError: as ``read_stream``, or a piece's first time other than the index's (naming
            ``where`` and the piece).
        KeyError: a piece's member is not in ``blobs``.
    """
    members, _, counts = index.signal_pieces(signal)
    firsts = index.signal_piece_times(signal)
    dtype, shape = index.signal_dtype[signal].as_py(), index.signal_shape(signal)
    chosen = range(len(members)) if pieces is None else pieces
    times: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for k in chosen:
        label = f"{where} member {index.member_names[int(members[k])].as_py()}".strip()
        part = read_stream(blobs[int(members[k])], dtype, shape, int(counts[k]), label)
        if part.timestamps.size and part.timestamps[0] != firsts[k]:
            raise FormatError(
                f"{label}: its first sample is at {part.timestamps[0]} s, the index's piece_time says {firsts[k]}"
            )
        if times and times[-1].size and part.timestamps.size and part.timestamps[0] < times[-1][-1]:
            raise FormatError(f"{label}: its first sample is before the previous piece's last")
        times.append(part.timestamps)
        values.append(part.values)
    if not times:
        return StreamData(np.zeros(0), np.zeros((0, *shape), dtype=np.dtype(dtype)))
    return StreamData(np.concatenate(times), np.concatenate(values))
