"""The writer's side of streams at their own rate: check an episode's streams, lay out their members.

A ``Stream`` (``shardwriter.episode``) is checked here (timestamps finite and non-decreasing,
values of a numeric type, one per timestamp, floats finite) and becomes one tar member
(``epishard.format.streams``) and one entry of the index row's ``streams`` list. Nothing is
resampled, dropped or reordered: a stream that breaks a rule is refused, naming episode, stream
and sample, and the source that produced it decides (``sources`` sort MCAP messages by time and
say so in the report).

Internal: import from ``epishard.shardwriter``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from epishard.format import manifest as fmt
from epishard.format.streams import STREAM_EXPANSION, encode_stream, stream_facts

from .episode import Stream
from .errors import ConversionError

__all__ = ["check_stream", "stream_members"]

_MAX_SAMPLE_VALUES = 1 << 20  # values per sample (a 1024 x 1024 tactile array)


def _bad(message: str) -> ConversionError:
    return ConversionError(message, kind="bad_stream")


def check_stream(name: str, stream: Stream) -> tuple[np.ndarray, np.ndarray]:
    """``(timestamps float64 [n], values [n, *shape])`` of ``stream``, checked.

    Raises:
        ConversionError: kind ``bad_stream`` (not a ``Stream``; timestamps not one-dimensional, not
            numbers, not finite or decreasing; values not of ``manifest.STREAM_DTYPES``, of another
            length, or more than 2**20 per sample; a rate not a positive number), kind ``nan``
            (a float value not finite); the message names the stream and the first bad sample.
    """
    if not isinstance(stream, Stream):
        raise _bad(f"stream {name!r} is a {type(stream).__name__}, not a Stream")
    times = np.asarray(stream.timestamps)
    if times.ndim != 1 or not (np.issubdtype(times.dtype, np.floating) or np.issubdtype(times.dtype, np.integer)):
        raise _bad(f"stream {name!r}: timestamps must be a 1-D array of seconds, not {times.dtype} {times.shape}")
    times = times.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(times))
    if bad.size:
        raise _bad(f"stream {name!r}: sample {int(bad[0])}'s timestamp is {times[bad[0]]}")
    back = np.flatnonzero(np.diff(times) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise _bad(
            f"stream {name!r}: sample {i}'s timestamp {times[i]} is before sample {i - 1}'s ({times[i - 1]}); "
            "timestamps must not decrease (sort the samples by time first)"
        )
    values = np.asarray(stream.values)
    if values.dtype.name not in fmt.STREAM_DTYPES:
        raise _bad(f"stream {name!r}: values of type {values.dtype} (one of {', '.join(fmt.STREAM_DTYPES)})")
    if values.ndim < 1 or values.shape[0] != times.size:
        raise _bad(f"stream {name!r}: {values.shape[0] if values.ndim else 0} values for {times.size} timestamps")
    if int(np.prod(values.shape[1:], dtype=np.int64)) > _MAX_SAMPLE_VALUES or values.ndim > 9:
        raise _bad(f"stream {name!r}: samples of shape {values.shape[1:]} (at most 2**20 values, 8 dimensions)")
    if np.issubdtype(values.dtype, np.floating):
        flat = values.reshape(values.shape[0], -1)
        rows = np.flatnonzero(~np.isfinite(flat).all(axis=1))
        if rows.size:
            i = int(rows[0])
            raise ConversionError(f"stream {name!r}: sample {i} holds {flat[i][~np.isfinite(flat[i])][0]}", kind="nan")
    if stream.rate is not None and not (np.isfinite(stream.rate) and stream.rate > 0):
        raise _bad(f"stream {name!r}: rate {stream.rate!r} is not a positive number of samples per second")
    return times, values


def stream_members(
    key: str, streams: Mapping[str, Stream], taken: list[str], first_member: int, exclude: set[str]
) -> tuple[list, list]:
    """The tar members and index entries of an episode's ``streams`` (name -> ``Stream``).

    ``taken``: the episode's camera fields (member names stay distinct); ``first_member``: the
    position of the first stream member in the episode's member list; ``exclude``: names the
    stream may not have (the table's columns and the cameras: a window key would be ambiguous).
    Returns ``(members [(name, bytes)], entries [dict following manifest.STREAM_TYPE])``, streams in
    sorted order of their names. A member whose compressed bytes would hold more than
    ``STREAM_EXPANSION / 2`` times its size in samples (a constant signal) is stored uncompressed.

    Raises:
        ConversionError: as ``check_stream``; a name that is empty, holds a control character or
            is a table column or camera (``bad_stream``).
    """
    names = sorted(streams)
    fields = fmt.stream_fields(names, taken)
    members, entries = [], []
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name or any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise _bad(f"stream name {name!r} is not a name")
        if name in exclude:
            raise _bad(f"stream {name!r} has the name of a table column or camera of the episode")
        times, values = check_stream(name, streams[name])
        data = encode_stream(times, values)
        raw = times.nbytes + values.nbytes
        if raw > (STREAM_EXPANSION // 2) * len(data):
            data = encode_stream(times, values, compress=False)
        member = fmt.member_name(key, f"{fields[name]}.{fmt.STREAM_EXT}")
        fmt.check_member_name(member)
        members.append((member, data))
        entries.append(
            {
                "name": name,
                "member": first_member + i,
                "dtype": values.dtype.name,
                "shape": [int(n) for n in values.shape[1:]],
                **stream_facts(times),
                "rate": float(streams[name].rate or 0.0),
            }
        )
    return members, entries
