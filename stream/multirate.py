"""Windows over streams at their own rate: every sample in a time span, or values at chosen times.

A dataset of format version 3 may carry, per episode, numeric streams with their own timestamps
(force-torque at 1 kHz, an IMU at 200 Hz, tactile arrays, sparse events; ``epishard.format.streams``).
A ``WindowSpec(streams={name: span(...) | at(...)})`` reads them relative to the window's anchor
time ``t0`` (the anchor row's ``timestamp``, seconds on the episode's clock), never resampled onto
the row clock:

- ``span(start, stop)``: every sample with ``t0 + start <= t <= t0 + stop`` (both ends included,
  widened by ``TOLERANCE_S`` for float rounding of the row clock), in time order, at its native
  rate: ``<name>`` ``[N, *shape]``, ``<name>_timestamp`` float64 ``[N]`` seconds (the samples' own
  times), ``<name>_is_pad`` bool ``[N]``: the first ``count`` entries are the samples, the rest
  padding (zeros, mask true). ``N`` is ``max_samples``, or the most samples any window can hold:
  ``floor((stop - start + 2 * TOLERANCE_S) / min_interval) + 1`` from the index's smallest
  interval between samples, capped at the stream's largest sample count.
- ``at(times, interp)``: values at ``t0 + times[j]``: ``"previous"`` (the last sample at or before,
  a zero-order hold), ``"nearest"`` (the closest; the earlier on a tie), ``"linear"``
  (interpolated between the samples around it, float32). ``<name>_timestamp`` is the time of the
  sample returned (the query time for ``linear``), ``<name>_is_pad`` true where the query has no
  sample to take: before the first sample (``previous``), outside the first-to-last range
  (``nearest``, ``linear``); a padded entry holds the nearest edge sample, as LeRobot clamps.

A stream an episode does not have, or has without samples, gives windows all padding. In an
episode with recording breaks (``segment_starts``) a window's times stop at the anchor's segment:
no sample from before the segment's first row (after the first segment) or at or after the next
segment's first row. Values: float streams as float32, integer and bool streams as int64 (exact),
``linear`` always float32.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "TOLERANCE_S",
    "At",
    "Span",
    "at",
    "clock_tolerance",
    "reach",
    "reach_pieces",
    "resolve_streams",
    "span",
    "stream_window",
]

TOLERANCE_S = 1e-6  # seconds: a sample this close outside a span's end still belongs to it (float32 row clocks)
_INTERP = ("previous", "nearest", "linear")


def _number(value) -> bool:
    """A finite real number: a Python or NumPy int or float, not a bool."""
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    return real and bool(np.isfinite(value))


@dataclass(frozen=True)
class Span:
    """Every sample of a stream from ``start`` to ``stop`` seconds around the anchor (``span``).

    ``max_samples``: the padded length ``N`` (None: bounded from the index, see the module).
    ``resolved``: ``(N, shape, dtype)`` as ``WindowDataset`` fixed them (not for users to set).
    """

    start: float
    stop: float
    max_samples: int | None = None
    resolved: tuple | None = field(default=None, repr=False)

    def __post_init__(self):
        for name in ("start", "stop"):
            value = getattr(self, name)
            if not _number(value):
                raise ValueError(f"span {name} must be a finite number of seconds, not {value!r}")
            object.__setattr__(self, name, float(value))
        if self.stop < self.start:
            raise ValueError(f"span({self.start}, {self.stop}): stop is before start")
        m = self.max_samples
        if m is not None:
            if isinstance(m, (bool, np.bool_)) or not isinstance(m, (int, np.integer)) or m < 1:
                raise ValueError(f"span max_samples must be an int >= 1, not {m!r}")
            object.__setattr__(self, "max_samples", int(m))


@dataclass(frozen=True)
class At:
    """A stream's values at ``times`` seconds around the anchor, by ``interp`` (``at``).

    ``resolved``: ``(len(times), shape, dtype)`` as ``WindowDataset`` fixed them (not for users to set).
    """

    times: tuple[float, ...]
    interp: str = "nearest"
    resolved: tuple | None = field(default=None, repr=False)

    def __post_init__(self):
        times = (self.times,) if _number(self.times) else tuple(np.asarray(self.times).ravel().tolist())
        if not times or not all(_number(t) for t in times):
            raise ValueError(f"at(times): times must be finite numbers of seconds, at least one; got {self.times!r}")
        object.__setattr__(self, "times", tuple(float(t) for t in times))
        if self.interp not in _INTERP:
            raise ValueError(f"at(interp=...) must be one of {', '.join(_INTERP)}, not {self.interp!r}")


def span(start: float, stop: float, max_samples: int | None = None) -> Span:
    """Every sample of a stream with ``t0 + start <= t <= t0 + stop`` (seconds), at its native rate.

    E.g. ``span(-0.5, 0.0)``: the last half second of a 1 kHz force sensor, about 501 samples.
    Returns ``<name>`` ``[N, *shape]``, ``<name>_timestamp`` float64 ``[N]``, ``<name>_is_pad``
    bool ``[N]`` (see the module for ``N``).

    Raises:
        ValueError: a bound not finite, ``stop < start``, or ``max_samples`` not an int >= 1.
    """
    return Span(start, stop, max_samples)


def at(times, interp: str = "nearest") -> At:
    """A stream's values at ``t0 + times[j]`` seconds, by ``interp``: ``previous``, ``nearest`` or ``linear``.

    E.g. ``at([-0.1, -0.05, 0.0], interp="linear")``. Returns ``<name>`` ``[len(times), *shape]``,
    ``<name>_timestamp`` float64 and ``<name>_is_pad`` bool, ``[len(times)]``.

    Raises:
        ValueError: no times, a time not finite, or another ``interp``.
    """
    return At((times,) if _number(times) else tuple(np.asarray(times).ravel().tolist()), interp)


def clock_tolerance(t0: float, coarse: bool) -> float:
    """Seconds a window's interval is widened by at anchor time ``t0``: ``TOLERANCE_S``, or more for a coarse clock.

    A row clock stored as float32 (``coarse``, LeRobot's ``timestamp``) holds each time rounded to
    the float32 spacing there (1.9 us past 16 s, 3.8 us past 32 s, 7.6 us past 64 s): the widening
    is then that spacing, so the sample at the row's true time is never lost to the rounding.
    """
    if not coarse:
        return TOLERANCE_S
    return max(TOLERANCE_S, float(np.spacing(np.float32(abs(t0)))))


def reach(read: Span | At) -> tuple[float, float]:
    """Seconds before and after the anchor a read can take samples from (``at``: its earliest and latest time)."""
    return (read.start, read.stop) if isinstance(read, Span) else (min(read.times), max(read.times))


def reach_pieces(index, signal: int, read: Span | At, anchors=None, times=None) -> np.ndarray:
    """Bool ``[P]``: the pieces of stream entry ``signal`` that windows of ``read`` can take samples from.

    The windows are at rows ``anchors`` (int64, their times bounded by the index's row clock
    entries around each row, ``WindowIndex.signal_row_clock``) or at anchor ``times`` (float64
    seconds, exact). A piece is reached when it may hold a sample of a window's interval; for
    ``at``, one piece more on each side (the samples it takes around a time: the one before it, the
    one after). A stream without a row clock table (a clock that goes back) reaches every piece.
    """
    pieces = index.signal_pieces(signal)[0].size
    lo, hi = reach(read)
    if times is None:
        step, clock = index.signal_row_clock(signal)
        if clock.size == 0:
            return np.ones(pieces, dtype=bool)
        block = np.minimum(np.asarray(anchors, dtype=np.int64) // step, clock.size - 1)
        first, last = clock[block], clock[np.minimum(block + 1, clock.size - 1)]
    else:
        first = last = np.asarray(times, dtype=np.float64)
    firsts = index.signal_piece_times(signal)
    # A span needs the pieces that may hold a sample of its interval (a sample at the interval's start
    # may end the piece before, when two share a time); ``at`` also the one before and after.
    extra = 0 if isinstance(read, Span) else 1
    # widened as much as any window may be (``clock_tolerance`` of a float32 clock at the latest time)
    tol = clock_tolerance(float(np.abs(last).max(initial=0.0)), True)
    k_lo = np.clip(np.searchsorted(firsts, first + lo - tol, side="left") - 1 - extra, 0, pieces - 1)
    k_hi = np.clip(np.searchsorted(firsts, last + hi + tol, side="right") - 1 + extra, 0, pieces - 1)
    marks = np.zeros(pieces + 1, dtype=np.int64)
    np.add.at(marks, k_lo, 1)
    np.add.at(marks, k_hi + 1, -1)
    return np.cumsum(marks)[:-1] > 0


def _out_dtype(stored: str, read: Span | At) -> np.dtype:
    """The dtype a window returns for a stream stored as ``stored`` (see the module)."""
    if isinstance(read, At) and read.interp == "linear":
        return np.dtype(np.float32)
    return np.dtype(np.float32) if np.issubdtype(np.dtype(stored), np.floating) else np.dtype(np.int64)


def resolve_streams(indexes: list, specs: list, names: list[str]) -> list:
    """Each dataset's spec with its streams' ``resolved`` ``(N, shape, dtype)`` fixed from the indexes.

    One ``N``, shape and dtype per stream across the mix (so batches stack): ``span``'s ``N`` is its
    ``max_samples``, else the bound of the module over every dataset having the stream. ``indexes``:
    each dataset's ``WindowIndex``; ``names``: the datasets as messages name them.

    Raises:
        KeyError: a stream no dataset has (naming the ones they have).
        ValueError: a stream of other shapes or kinds (integer, float) in two episodes; a span
            without ``max_samples`` over a stream with two samples at one time (no bound), naming
            dataset, episode and stream.
    """
    spec = specs[0]
    if not spec.streams:
        return specs
    resolved: dict[str, tuple] = {}
    for name, read in spec.streams.items():
        shapes: set[tuple[int, ...]] = set()
        dtypes: set[str] = set()
        bound = 0
        for index, shown in zip(indexes, names, strict=True):
            hit = np.flatnonzero(np.asarray(index.signal_names.to_numpy(zero_copy_only=False) == name))
            for s in hit.tolist():
                shapes.add(index.signal_shape(s))
                dtypes.add(str(_out_dtype(index.signal_dtype[s].as_py(), read)))
            if isinstance(read, Span) and read.max_samples is None and hit.size:
                count = index.signal_count[hit]
                gap = index.signal_min_interval[hit]
                tied = np.flatnonzero((count >= 2) & (gap <= 0))
                if tied.size:
                    s = int(hit[tied[0]])
                    e = int(np.searchsorted(index.episode_signals, s, side="right") - 1)
                    raise ValueError(
                        f"{shown}: episode {index.key(e)} stream {name!r} has samples sharing a time, so no "
                        f"number of samples bounds a span: give span({read.start}, {read.stop}, max_samples=N)"
                    )
                # widened as windows are (``clock_tolerance``: a float32 row clock's spacing at the
                # stream's latest time, at least TOLERANCE_S)
                latest = float(np.abs(np.concatenate([index.signal_t_first[hit], index.signal_t_last[hit]])).max())
                width = read.stop - read.start + 2 * clock_tolerance(latest, True)
                with np.errstate(divide="ignore", over="ignore"):
                    fit = np.where(count >= 2, np.floor(width / np.maximum(gap, 1e-300)) + 1, count)
                bound = max(bound, int(min(float(np.minimum(fit, count).max(initial=0)), float(count.max()))))
        if not shapes:
            have = sorted({n for index in indexes for n in index.signal_names.to_pylist()})
            raise KeyError(f"window spec names stream {name!r}; the datasets have streams {have}")
        if len(shapes) > 1 or len(dtypes) > 1:
            raise ValueError(
                f"stream {name!r} has samples of shapes {sorted(shapes)} and values read as {sorted(dtypes)} "
                "across the datasets' episodes: a batch needs one"
            )
        n = len(read.times) if isinstance(read, At) else (read.max_samples or max(bound, 1))
        resolved[name] = (n, next(iter(shapes)), next(iter(dtypes)))
    streams = {name: dataclasses.replace(read, resolved=resolved[name]) for name, read in spec.streams.items()}
    return [dataclasses.replace(s, streams=streams) for s in specs]


def stream_window(
    times: np.ndarray | None,
    values: np.ndarray | None,
    t0: float,
    read: Span | At,
    limits: tuple[float, float],
    where: str,
    tol: float = TOLERANCE_S,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One window of one stream: ``(values [N, *shape], timestamps float64 [N], is_pad bool [N])``.

    ``times``/``values``: the episode's stream (float64 ``[n]``, ``[n, *shape]``), None when the
    episode has none; ``t0``: the anchor's time (seconds); ``limits``: ``(lo, hi)`` seconds the
    window's samples must lie in (``lo <= t < hi``; the anchor's recording segment, infinite
    without breaks); ``read``: resolved (``resolve_streams``); ``tol``: seconds the interval is
    widened by (``clock_tolerance``).

    Raises:
        ValueError: a span holds more samples than its ``max_samples`` (naming ``where``, the
            anchor time and both counts).
    """
    n, shape, dtype = read.resolved  # type: ignore[misc]
    out = np.zeros((n, *shape), dtype=dtype)
    stamps = np.zeros(n, dtype=np.float64)
    pad = np.ones(n, dtype=bool)
    lo_limit, hi_limit = limits
    if times is not None and values is not None:
        # The samples of the anchor's recording segment (the whole stream without breaks).
        a = int(np.searchsorted(times, lo_limit, side="left"))
        b = int(np.searchsorted(times, hi_limit, side="left"))
        times, values = times[a:b], values[a:b]
    if times is None or values is None or times.size == 0:
        return out, stamps, pad
    if isinstance(read, Span):
        i = int(np.searchsorted(times, t0 + read.start - tol, side="left"))
        j = int(np.searchsorted(times, t0 + read.stop + tol, side="right"))
        count = j - i
        if count > n:
            raise ValueError(
                f"{where}: the span [{read.start}, {read.stop}] s around t={t0:.6f} s holds {count} samples, "
                f"more than the {n} it is padded to: raise max_samples, or (when that was left None and "
                "bounded from the index's min_interval) the index's min_interval is larger than the "
                "stream's; `epishard verify` checks it"
            )
        out[:count] = values[i:j]
        stamps[:count] = times[i:j]
        pad[:count] = False
        return out, stamps, pad
    queries = t0 + np.asarray(read.times, dtype=np.float64)
    last = times.size - 1
    if read.interp == "previous":
        k = np.searchsorted(times, queries + tol, side="right") - 1
        pad = k < 0
        k = np.clip(k, 0, last)
        return values[k].astype(dtype, copy=False), times[k].copy(), pad
    pad = (queries < times[0] - tol) | (queries > times[-1] + tol)
    right = np.clip(np.searchsorted(times, queries, side="left"), 0, last)
    left = np.clip(right - 1, 0, last)
    if read.interp == "nearest":
        k = np.where(np.abs(queries - times[left]) <= np.abs(times[right] - queries), left, right)
        return values[k].astype(dtype, copy=False), times[k].copy(), pad
    # linear: between the samples around each query, clamped to the edges outside them
    q = np.clip(queries, times[0], times[-1])
    right = np.clip(np.searchsorted(times, q, side="right"), 0, last)
    left = np.clip(right - 1, 0, last)
    span_t = times[right] - times[left]
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(span_t > 0, (q - times[left]) / span_t, 0.0)
    w = w.reshape(-1, *([1] * len(shape)))
    below, above = values[left].astype(np.float64), values[right].astype(np.float64)
    return (below + (above - below) * w).astype(np.float32), queries.copy(), pad
