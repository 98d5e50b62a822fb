"""Streams at their own rate (format version 3): one member per stream, written and read here.

A stream is a numeric signal an episode carries at its own clock (force-torque at 1 kHz, an IMU at
200 Hz, tactile arrays, sparse events) beside the per-row table and the videos, stored once and
losslessly, never resampled onto the row clock. Its member ``<key>.<field>.arrow`` is an Arrow IPC
file (``STREAM_EXT``; zstd-compressed buffers) with two columns:

- ``timestamp``: float64 ``[n]`` seconds on the episode's clock (the clock of the table's
  ``timestamp`` column: row ``r`` is at ``timestamp[r]``, or ``r / fps`` without one), finite and
  non-decreasing (two samples may share a time: events);
- ``value``: ``fixed_size_list<dtype>[width]`` ``[n]``, ``width`` the product of the per-sample
  ``shape`` (1 for a scalar); ``dtype`` one of ``manifest.STREAM_DTYPES``, as the source gave it.

The index's ``streams`` entry of the episode states name, member, dtype, shape, count, first and
last time, the smallest and largest interval and the nominal rate (``manifest.STREAM_TYPE``); a
reader holds the member to them (``read_stream``) and finds any time range's samples by binary
search over ``timestamp``, never by scanning.

Internal: import from ``epishard.format``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from .errors import FormatError
from .manifest import STREAM_DTYPES

__all__ = ["STREAM_EXPANSION", "StreamData", "encode_stream", "read_pieces", "read_stream", "stream_facts"]

# A stream member holds at most this many bytes of samples (8 per timestamp plus the values) per
# byte of member: zstd gains 1-4x on sensor data, and the writer stores a member uncompressed where
# it would gain more than half this (a constant signal), so no sample count an index claims sizes
# an allocation beyond the bytes behind it (``validate.check_index``, ``read_stream``).
STREAM_EXPANSION = 32


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


def encode_stream(timestamps: np.ndarray, values: np.ndarray, compress: bool = True) -> bytes:
    """The member's bytes for ``timestamps`` (float64 ``[n]``) and ``values`` (``[n, *shape]``, ``STREAM_DTYPES``).

    Values are stored bit for bit (a float's NaN payload included). The caller has checked both
    (``shardwriter``'s stream checks); the file holds no other metadata, so equal inputs give
    equal bytes. ``compress``: zstd-compressed buffers (False: stored as they are).
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
    options = pa.ipc.IpcWriteOptions(compression="zstd" if compress else None)
    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
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
    claimed = count * (8 + width * np.dtype(dtype).itemsize)
    if count < 0 or claimed > STREAM_EXPANSION * len(data) + 4096:
        raise FormatError(f"{where}: {count} samples claimed of {len(data)} bytes (more than STREAM_EXPANSION allows)")
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
    return StreamData(times.astype(np.float64, copy=False), values)


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
