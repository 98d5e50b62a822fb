"""What a training window is: frame offsets per camera, state history, action chunk, boundaries.

All offsets are in frames (table rows) relative to the window's anchor row. LeRobot-style
``delta_timestamps`` in seconds are accepted: the spec keeps them, and each dataset of a
``WindowDataset`` turns them into rows at its own frame rate (``WindowSpec.at_fps``), checked to be
multiples of 1/fps within a tolerance, as LeRobot's ``MultiLeRobotDataset`` does.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from .multirate import At, Span, at

__all__ = ["RESERVED_KEYS", "PerEpisode", "WindowSpec", "offsets_from_seconds", "segment"]


@dataclass(frozen=True)
class PerEpisode:
    """Windows an episode gives per epoch (before its dataset weight).

    ``count``: that many anchors (at most all), drawn by ``(seed, epoch, episode)``;
    ``fraction``: that share of its anchors, in (0, 1], rounded, at least 1 when it has any;
    neither: every anchor. ``expected_windows`` is the one rule that turns this into numbers.

    Raises:
        ValueError: both given, a negative count, or a fraction outside (0, 1].
    """

    count: int | None = None
    fraction: float | None = None

    def __post_init__(self):
        if self.count is not None and self.fraction is not None:
            raise ValueError(f"per episode: give a count or a fraction, not both ({self.count}, {self.fraction})")
        if self.count is not None and (not isinstance(self.count, (int, np.integer)) or self.count < 0):
            raise ValueError(f"per-episode window count must be an int >= 0, not {self.count!r}")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"per-episode window fraction must be in (0, 1], not {self.fraction!r}")

    @classmethod
    def of(cls, value: PerEpisode | None) -> PerEpisode:
        """``value`` as a ``PerEpisode`` (``None``: every anchor).

        Raises:
            TypeError: anything else (a bare number: say ``PerEpisode(count=n)`` or ``PerEpisode(fraction=f)``).
        """
        if value is None:
            return cls()
        if isinstance(value, PerEpisode):
            return value
        raise TypeError(
            f"per_episode must be a PerEpisode or None, not {value!r}: use PerEpisode(count=...) or "
            "PerEpisode(fraction=...) (WindowSpec(per_episode_count=...) / per_episode_fraction=...)"
        )

    @property
    def all(self) -> bool:
        """Every anchor (neither a count nor a fraction)."""
        return self.count is None and self.fraction is None


def segment(start: int, stop: int, count: int) -> tuple[int, ...]:
    """``count`` frame offsets spread evenly over ``[start, stop]`` (both ends included).

    ``segment(0, 32, 9)`` -> ``(0, 4, 8, ..., 32)``: 9 frames over a 33-frame span.

    Raises:
        ValueError: ``count < 1`` or ``stop < start``, or the spread is not a whole number of frames.
    """
    if count < 1 or stop < start:
        raise ValueError(f"segment({start}, {stop}, {count}): need count >= 1 and stop >= start")
    if count == 1:
        return (start,)
    if stop == start:
        raise ValueError(f"segment({start}, {stop}, {count}): {count} distinct frames need a span longer than 0")
    step, rest = divmod(stop - start, count - 1)
    if rest:
        raise ValueError(f"segment({start}, {stop}, {count}): {count} frames do not spread evenly over the span")
    return tuple(range(start, stop + 1, step))


def offsets_from_seconds(
    deltas: list[float], fps: float, tolerance: float = 1e-4, key: str = "", dataset: str = ""
) -> tuple[int, ...]:
    """Turn LeRobot ``delta_timestamps`` (seconds) into frame offsets (rows), in the given order.

    Any offsets are accepted: past, future, irregular, repeated. ``tolerance`` is LeRobot's
    ``tolerance_s`` (default 1e-4 s, as there). ``dataset``: the dataset the rows are for, as
    messages name it.

    Raises:
        ValueError: a delta is not a multiple of 1/fps within ``tolerance`` seconds (naming the
            dataset and its rate, ``key``, the delta, its position and the nearest allowed time).
    """
    out = []
    for i, d in enumerate(deltas):
        frames = round(d * fps)
        if abs(frames / fps - d) > tolerance:
            where = f"{key!r} " if key else ""
            of = f"{dataset} ({fps:g} fps): " if dataset else ""
            raise ValueError(
                f"{of}delta_timestamps {where}[{i}] = {d}s is not a multiple of 1/fps = {1 / fps:.6f}s "
                f"(nearest allowed time {frames / fps:.6f}s; tolerance {tolerance}s)"
            )
        out.append(int(frames))
    return tuple(out)


RESERVED_KEYS = frozenset(
    {"task", "episode_index", "frame_index", "timestamp", "dataset", "substitute", "__telemetry__", "__cost__"}
)


@dataclass(frozen=True)
class WindowSpec:
    """A training window, relative to an anchor row.

    Args:
        cameras: camera name -> frame offsets returned, in order (several segments are simply
            concatenated, e.g. ``segment(-32, -16, 3) + (0,) + segment(16, 32, 2)``). ``None``:
            every camera of the dataset with offsets ``(0,)``.
        state_offsets: rows of ``observation.state`` returned (history), e.g. ``(-2, -1, 0)``.
        action_horizon: rows of ``action`` returned: ``anchor + 0 .. anchor + horizon - 1``.
        action_offsets: rows of ``action`` returned, any offsets (e.g. ``(-1, 0, 1, ..., 14)``);
            when given, ``action_horizon`` becomes their count.
        column_offsets: other numeric table columns returned as windows: column -> row offsets,
            each ``float32 [T, *shape]`` with ``<column>_is_pad`` (``shape``: the column's per-row
            shape as the dataset stores it, a scalar column as ``[1]``; an integer column not
            normalised is int64, exactly; see ``WindowDataset``).
        extra_columns: table columns returned for the anchor row only: a numeric column as
            ``float32 [*shape]`` (int64 for an integer one), a text column as ``str`` (a list of
            strings per batch; a null as ``""``). A column is returned under its own name, so it
            may not also be a window (state, action, ``column_offsets``) nor a key every sample
            has (``RESERVED_KEYS``).
        state_key / action_key: table columns (``None`` to leave one out).
        boundary: ``"inside"``: only anchors whose every offset lies inside the episode (short
            episodes give zero windows and are counted); ``"pad"``: every anchor, out-of-range
            offsets clamped to the episode's edge and flagged in ``<key>_is_pad``. A recording
            break inside an episode (the index's ``segment_starts``: timestamps reset or jump) is
            an episode edge for both: no window crosses it.
        stride: anchors are taken every ``stride`` rows.
        per_episode_count: windows per episode per epoch: that many anchors (at most all).
        per_episode_fraction: windows per episode per epoch: that share of its anchors, in (0, 1]
            (rounded, at least 1 when any anchor exists). Neither: every anchor. See
            ``PerEpisode`` and ``stream.plan.expected_windows``.
        fps: the frame rate the row offsets are at (``from_delta_timestamps`` sets it). Without
            ``delta_timestamps``, a dataset with episodes of another rate is refused, since its rows
            would be other times; with them, each dataset gets the spec at its own rate
            (``at_fps``). None: offsets are rows, at any rate.
        delta_timestamps: key -> offsets in seconds, as given to ``from_delta_timestamps`` (which
            sets it; None for a spec in rows). ``tolerance_s``: the tolerance they are held to.
        streams: stream name -> ``span(start, stop)`` (every sample in that many seconds around
            the anchor's time, at its native rate) or ``at(times, interp)`` (values at chosen
            times): streams at their own rate (format version 3; ``stream.multirate``). Each
            returns ``<name>``, ``<name>_timestamp`` and ``<name>_is_pad``.
        missing_cameras: what a mix does with a camera of ``cameras`` that a dataset lacks:
            ``"pad"`` returns zeros of the camera's shape and dtype with ``<camera>_is_pad`` all
            true; ``"refuse"`` refuses such a dataset when the ``WindowDataset`` is made. A camera
            no dataset has is refused either way.

    The anchors of an episode (``[lo, hi)`` per boundary mode) are computed in one place:
    ``stream.plan.episode_table``.
    """

    cameras: dict[str, tuple[int, ...]] | None = None
    state_offsets: tuple[int, ...] = (0,)
    action_horizon: int = 1
    state_key: str | None = "observation.state"
    action_key: str | None = "action"
    boundary: str = "inside"
    stride: int = 1
    per_episode_count: int | None = None
    per_episode_fraction: float | None = None
    extra_columns: tuple[str, ...] = field(default=())
    action_offsets: tuple[int, ...] | None = None
    column_offsets: dict[str, tuple[int, ...]] = field(default_factory=dict)
    missing_cameras: str = "pad"
    fps: float | None = None
    delta_timestamps: dict[str, tuple[float, ...]] | None = None
    tolerance_s: float = 1e-4
    streams: dict[str, Span | At] = field(default_factory=dict)

    def __post_init__(self):
        PerEpisode(self.per_episode_count, self.per_episode_fraction)  # raises ValueError when invalid
        if self.action_offsets is not None:
            object.__setattr__(self, "action_offsets", tuple(int(o) for o in self.action_offsets))
            object.__setattr__(self, "action_horizon", len(self.action_offsets))
        if self.missing_cameras not in ("pad", "refuse"):
            raise ValueError(f"missing_cameras must be 'pad' or 'refuse', not {self.missing_cameras!r}")
        taken = {k for k in (self.state_key, self.action_key) if k is not None}
        if taken & set(self.column_offsets):
            raise ValueError(
                f"column_offsets names {sorted(taken & set(self.column_offsets))}: use state/action offsets"
            )
        self._check_keys()
        if self.boundary not in ("inside", "pad"):
            raise ValueError(f"boundary must be 'inside' or 'pad', not {self.boundary!r}")
        if self.stride < 1 or self.action_horizon < 0:
            raise ValueError("stride must be >= 1 and action_horizon >= 0")

    def _check_keys(self) -> None:
        """Refuse a spec whose returned columns would share a sample key (one would silently replace another).

        Raises:
            TypeError: ``extra_columns`` is a string, or names something other than strings.
            ValueError: a column is in ``extra_columns`` twice, in both ``extra_columns`` and
                ``column_offsets``, is the state or action key, a camera, or a key every sample has.
        """
        if isinstance(self.extra_columns, str) or not all(isinstance(c, str) for c in self.extra_columns):
            raise TypeError(f"extra_columns must be a tuple of column names, not {self.extra_columns!r}")
        object.__setattr__(self, "extra_columns", tuple(self.extra_columns))
        twice = sorted({c for c in self.extra_columns if self.extra_columns.count(c) > 1})
        if twice:
            raise ValueError(f"extra_columns names {twice} more than once")
        action = self.action_key if self.action_horizon else None
        windows = {k for k in (self.state_key, action) if k is not None} | set(self.column_offsets)
        both = sorted(windows & set(self.extra_columns))
        if both:
            raise ValueError(
                f"extra_columns names {both}, which the spec already returns as windows (state, action or "
                "column_offsets) under the same key: the anchor row would replace the window. Take the anchor's "
                "value from the window (offset 0), or leave it out of extra_columns"
            )
        bad = [name for name, read in self.streams.items() if not isinstance(read, (Span, At))]
        if bad:
            raise TypeError(f"streams[{bad[0]!r}] must be span(...) or at(...), not {self.streams[bad[0]]!r}")
        stream_keys = {f"{n}{suffix}" for n in self.streams for suffix in ("", "_timestamp", "_is_pad")}
        others = {*windows, *self.extra_columns, *(self.cameras or {}), *RESERVED_KEYS}
        others |= {f"{k}_is_pad" for k in (*windows, *(self.cameras or {}))}
        clash = sorted(stream_keys & others)
        if clash:
            raise ValueError(
                f"streams name {clash}: keys a camera, state, action or column of the spec (or every sample) returns"
            )
        returned = [*self.extra_columns, *self.column_offsets]
        cameras = sorted(set(self.cameras or {}) & set(returned))
        if cameras:
            raise ValueError(f"extra_columns / column_offsets name cameras {cameras}")
        reserved = sorted(set(returned) & RESERVED_KEYS)
        if reserved:
            raise ValueError(
                f"extra_columns / column_offsets name {reserved}, keys every sample has already "
                f"({', '.join(sorted(RESERVED_KEYS))}): those are returned for the anchor row anyway"
            )

    @property
    def sampling(self) -> PerEpisode:
        """Windows per episode per epoch, as the planner takes it."""
        return PerEpisode(self.per_episode_count, self.per_episode_fraction)

    @property
    def action_rows(self) -> np.ndarray:
        """int64 row offsets of the action window: ``action_offsets``, else ``0 .. action_horizon - 1``."""
        if self.action_offsets is not None:
            return np.asarray(self.action_offsets, dtype=np.int64)
        return np.arange(self.action_horizon, dtype=np.int64)

    @classmethod
    def from_delta_timestamps(
        cls,
        delta_timestamps: dict[str, list[float]],
        fps: float,
        *,
        tolerance_s: float = 1e-4,
        camera_keys: tuple[str, ...] | None = None,
        stream_keys: tuple[str, ...] = (),
        **kw,
    ) -> WindowSpec:
        """Build a spec from LeRobot ``delta_timestamps``.

        Build a spec from LeRobot ``delta_timestamps``: key -> offsets in seconds, any offsets
        (past, future, irregular) for every key, each turned into rows (``offsets_from_seconds``).

        Keys: the state key (``observation.state``) and the action key (``action``); cameras: keys
        in ``camera_keys``, or, when it is None, keys starting with ``observation.images.``
        (LeRobot's camera keys); keys in ``stream_keys``: streams at their own rate, read at those
        times by ``at(deltas, "nearest")`` (no grid to hold them to); every other key is a numeric
        table column (``column_offsets``).
        Offsets outside the episode are clamped and flagged in ``<key>_is_pad`` (``boundary="pad"``,
        LeRobot's semantics), or keep the anchor away from the edges (``"inside"``).

        The spec keeps the seconds (``delta_timestamps``): its own rows are those at ``fps``, and a
        ``WindowDataset`` resolves them again at each dataset's own rate (``at_fps``), so one spec
        serves a mix of robots recorded at 20 and 30 fps (LeRobot's ``MultiLeRobotDataset``).

        Raises:
            ValueError: an offset is not a multiple of 1/fps within ``tolerance_s`` seconds, naming
                the key, the offset and the nearest allowed time.
        """
        action_key, state_key = kw.get("action_key", "action"), kw.get("state_key", "observation.state")
        cams: dict[str, tuple[int, ...]] = {}
        columns: dict[str, tuple[int, ...]] = {}
        state: tuple[int, ...] = (0,)
        actions: tuple[int, ...] = ()
        streams = dict(kw.pop("streams", {}))
        for key, deltas in delta_timestamps.items():
            if key in stream_keys:
                streams[key] = at(list(deltas), "nearest")
                continue
            offsets = offsets_from_seconds(list(deltas), fps, tolerance_s, key)
            if key == action_key:
                actions = offsets
            elif key == state_key:
                state = offsets
            elif key in camera_keys if camera_keys is not None else key.startswith("observation.images."):
                cams[key] = offsets
            else:
                columns[key] = offsets
        seconds = {
            key: tuple(float(d) for d in deltas) for key, deltas in delta_timestamps.items() if key not in streams
        }
        return cls(
            streams=streams,
            cameras=cams or None,
            state_offsets=state,
            action_offsets=actions,
            column_offsets=columns,
            fps=fps,
            delta_timestamps=seconds,
            tolerance_s=tolerance_s,
            **kw,
        )

    def at_fps(self, fps: float, dataset: str = "") -> WindowSpec:
        """This spec with its ``delta_timestamps`` turned into rows at ``fps`` (frames per second).

        A spec without ``delta_timestamps`` (rows), or one already at ``fps``, is returned as it is.
        Each key keeps its role (camera, state, action, other column) and its number of offsets,
        so the samples of datasets at different rates have the same shapes.

        Raises:
            ValueError: an offset falls off the ``fps`` grid (not a multiple of 1/fps within
                ``tolerance_s``), naming ``dataset``, its rate, the key and the nearest allowed time.
        """
        if self.delta_timestamps is None or (self.fps is not None and abs(self.fps - fps) <= 1e-9 * fps):
            return self
        cams = dict(self.cameras or {})
        columns = dict(self.column_offsets)
        state, actions = self.state_offsets, self.action_offsets
        for key, deltas in self.delta_timestamps.items():
            offsets = offsets_from_seconds(list(deltas), fps, self.tolerance_s, key, dataset)
            if key == self.action_key:
                actions = offsets
            elif key == self.state_key:
                state = offsets
            elif key in cams:
                cams[key] = offsets
            else:
                columns[key] = offsets
        return dataclasses.replace(
            self,
            cameras=cams if self.cameras is not None else None,
            state_offsets=state,
            action_offsets=actions,
            column_offsets=columns,
            fps=float(fps),
        )

    def camera_offsets(self, available: list[str]) -> dict[str, np.ndarray]:
        """Camera -> int64 offsets for a dataset offering ``available`` cameras.

        Raises:
            KeyError: the spec names a camera the dataset does not have.
        """
        if self.cameras is None:
            return {c: np.zeros(1, dtype=np.int64) for c in available}
        missing = [c for c in self.cameras if c not in available]
        if missing:
            raise KeyError(f"window spec names cameras {missing}; the dataset has {available}")
        return {c: np.asarray(o, dtype=np.int64) for c, o in self.cameras.items()}

    def row_offsets(self, available: list[str]) -> np.ndarray:
        """Every row offset the window touches (cameras, state, action, columns), sorted and unique.

        ``available``: the dataset's cameras, used when ``cameras`` is None; named cameras count
        whether a dataset has them or not (in a mix, one may be padding), so every dataset of a mix
        at one frame rate has the same window rows (a spec from ``delta_timestamps`` has other rows
        at another rate: ``at_fps``).
        """
        cams = self.cameras if self.cameras is not None else {c: (0,) for c in available}
        parts = [np.asarray(o, dtype=np.int64) for o in cams.values() if len(o)]
        if self.state_key:
            parts.append(np.asarray(self.state_offsets, dtype=np.int64))
        if self.action_key and self.action_horizon:
            parts.append(self.action_rows)
        parts.extend(np.asarray(o, dtype=np.int64) for o in self.column_offsets.values() if len(o))
        return np.unique(np.concatenate(parts)) if parts else np.zeros(1, dtype=np.int64)
