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
from epishard.format.streams import encode_stream, stream_facts

from .episode import Stream
from .errors import ConversionError

__all__ = ["MIN_PIECE_SAMPLES", "PIECE_BYTES", "ROW_STEP", "check_stream", "row_times", "stream_members"]

_MAX_SAMPLE_VALUES = 1 << 20  # values per sample (a 1024 x 1024 tactile array)
PIECE_BYTES = 16 << 10  # bytes of samples per piece member: half a second of a 1 kHz 6-axis wrench
MIN_PIECE_SAMPLES = 64  # (a piece of wide samples, a tactile array, still holds this many)
ROW_STEP = 10  # the index's row clock table holds every ROW_STEP-th row's time (a third of a second at 30 fps)
# Keys every sample has (a window returns them): no stream may take one (the reader's ``RESERVED_KEYS``).
_RESERVED = frozenset(
    {"task", "episode_index", "frame_index", "timestamp", "dataset", "substitute", "index", "task_index"}
)


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
    flat = values.reshape(values.shape[0], int(np.prod(values.shape[1:], dtype=np.int64)))
    if np.issubdtype(values.dtype, np.floating):
        rows = np.flatnonzero(~np.isfinite(flat).all(axis=1))
        if rows.size:
            i = int(rows[0])
            raise ConversionError(f"stream {name!r}: sample {i} holds {flat[i][~np.isfinite(flat[i])][0]}", kind="nan")
    if values.dtype == np.uint64 and flat.size and int(flat.max()) > np.iinfo(np.int64).max:
        i = int(np.flatnonzero((flat > np.iinfo(np.int64).max).any(axis=1))[0])
        raise _bad(f"stream {name!r}: sample {i} holds a uint64 value above int64's range (readers return int64)")
    rate = stream.rate
    number = isinstance(rate, (int, float, np.integer, np.floating)) and not isinstance(rate, (bool, np.bool_))
    if rate is not None and not (number and np.isfinite(rate) and rate > 0):
        raise _bad(f"stream {name!r}: rate {rate!r} is not a positive number of samples per second")
    return times, values


def _pieces(n: int, sample_bytes: int) -> list[tuple[int, int]]:
    """Sample ranges ``[a, b)`` of a stream's pieces: about ``PIECE_BYTES`` of samples each (one piece when empty)."""
    step = max(MIN_PIECE_SAMPLES, PIECE_BYTES // max(sample_bytes, 1))
    return [(a, min(a + step, n)) for a in range(0, n, step)] or [(0, 0)]


def row_times(times: np.ndarray, step: int = ROW_STEP) -> list[float]:
    """The row clock at rows ``0, step, 2 * step, ...`` and the last row (seconds), or ``[]`` when it decreases.

    ``times``: float64 ``[num_rows]``, the rows' times (the table's ``timestamp``, or ``r / fps``).
    A reader bounds a window's anchor time by the two entries around its row, so it fetches only
    the pieces of a stream that window can reach; a clock that goes back (a reset) gives none,
    and every piece is read.
    """
    if times.size and np.any(np.diff(times) < 0):
        return []
    rows = np.unique(np.append(np.arange(0, times.size, step), times.size - 1))
    return [float(t) for t in times[rows]]


def stream_members(
    key: str,
    streams: Mapping[str, Stream],
    taken: list[str],
    first_member: int,
    exclude: set[str],
    clock: np.ndarray,
) -> tuple[list, list]:
    """The tar members and index entries of an episode's ``streams`` (name -> ``Stream``).

    ``taken``: the episode's camera fields (member names stay distinct); ``first_member``: the
    position of the first stream member in the episode's member list; ``exclude``: names the
    stream may not have (the table's columns and the cameras: a window key would be ambiguous);
    ``clock``: the rows' times (float64 ``[num_rows]``, seconds). Returns ``(members [(name,
    bytes)], entries [dict following manifest.STREAM_TYPE])``, streams in sorted order of their
    names. Each stream is cut into pieces of about ``PIECE_BYTES`` of samples, one member each
    (``<key>.<field>.<k>.arrow``, consecutive), so a reader fetches only the pieces its windows
    reach; pieces are stored uncompressed (``epishard.format.streams``).

    Raises:
        ConversionError: as ``check_stream``; a name that is empty, holds a control character, is
            a table column or camera, a key every sample has, or ends in ``_is_pad`` /
            ``_timestamp``; a member name over 100 bytes; a row clock that goes back (a recording
            reset: streams cannot share it) (all ``bad_stream``).
    """
    names = sorted(streams)
    fields = fmt.stream_fields(names, taken)
    members: list[tuple[str, bytes]] = []
    entries: list[dict] = []
    back = np.flatnonzero(np.diff(clock) < 0) if names else np.zeros(0, dtype=np.int64)
    if back.size:
        row = int(back[0]) + 1
        raise ConversionError(
            f"the row clock goes back at row {row} ({clock[row - 1]} s, then {clock[row]} s: a recording reset), so "
            f"streams {names} cannot share it: split the episode at the reset, or give the rows one clock",
            kind="bad_stream",
            row=row,
        )
    clock_table = row_times(clock)
    for name in names:
        if not isinstance(name, str) or not name or any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise _bad(f"stream name {name!r} is not a name")
        if name in exclude:
            raise _bad(f"stream {name!r} has the name of a table column or camera of the episode")
        if name in _RESERVED or name.endswith(("_is_pad", "_timestamp")):
            raise _bad(
                f"stream {name!r}: a key every sample has, or one a window returns beside another "
                "(<name>_is_pad, <name>_timestamp): give it another name"
            )
        times, values = check_stream(name, streams[name])
        sample_bytes = 8 + int(values.itemsize * np.prod(values.shape[1:], dtype=np.int64))
        pieces = _pieces(times.size, sample_bytes)
        first = first_member + len(members)
        for k, (a, b) in enumerate(pieces):
            data = encode_stream(times[a:b], values[a:b])
            member = fmt.member_name(key, f"{fields[name]}.{k}.{fmt.STREAM_EXT}")
            try:
                fmt.check_member_name(member)
            except ValueError as exc:
                raise _bad(f"stream {name!r}: {exc} (USTAR's limit): give the stream a shorter name") from None
            members.append((member, data))
        entries.append(
            {
                "name": name,
                "member": first,
                "dtype": values.dtype.name,
                "shape": [int(n) for n in values.shape[1:]],
                **stream_facts(times),
                "rate": float(streams[name].rate or 0.0),
                "piece_start": [a for a, _ in pieces],
                "piece_time": [float(times[a]) if b > a else 0.0 for a, b in pieces],
                "row_step": ROW_STEP,
                "row_time": clock_table,
            }
        )
    return members, entries
