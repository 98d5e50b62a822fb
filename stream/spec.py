"""What a training window is: frame offsets per camera, state history, action chunk, boundaries.

All offsets are in frames (table rows) relative to the window's anchor row. LeRobot-style
``delta_timestamps`` in seconds are accepted and turned into frame offsets once, checked to be
multiples of 1/fps within a tolerance.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import numpy as np

from .plan import PerEpisode


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


def offsets_from_seconds(deltas: list[float], fps: float, tolerance: float = 1e-4) -> tuple[int, ...]:
    """Turn LeRobot ``delta_timestamps`` (seconds) into frame offsets.

    Raises:
        ValueError: a delta is not a multiple of 1/fps within ``tolerance`` seconds.
    """
    out = []
    for d in deltas:
        frames = round(d * fps)
        if abs(frames / fps - d) > tolerance:
            raise ValueError(
                f"delta_timestamp {d}s is not a multiple of 1/fps = {1 / fps:.6f}s (tolerance {tolerance}s)"
            )
        out.append(int(frames))
    return tuple(out)


@dataclass(frozen=True)
class WindowSpec:
    """A training window, relative to an anchor row.

    Args:
        cameras: camera name -> frame offsets returned, in order (several segments are simply
            concatenated, e.g. ``segment(-32, -16, 3) + (0,) + segment(16, 32, 2)``). ``None``:
            every camera of the dataset with offsets ``(0,)``.
        state_offsets: rows of ``observation.state`` returned (history), e.g. ``(-2, -1, 0)``.
        action_horizon: rows of ``action`` returned: ``anchor + 0 .. anchor + horizon - 1``.
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
            ``stream.plan.PerEpisode`` and ``expected_windows``.
        per_episode: deprecated (``1`` meant one window and ``1.0`` all of them): an int sets
            ``per_episode_count``, a float ``per_episode_fraction``, with a ``DeprecationWarning``.

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
    per_episode: InitVar[float | int | None] = None

    def __post_init__(self, per_episode):
        if per_episode is not None:
            if self.per_episode_count is not None or self.per_episode_fraction is not None:
                raise ValueError("give per_episode_count or per_episode_fraction, not the deprecated per_episode too")
            old = PerEpisode.of(per_episode)  # warns
            object.__setattr__(self, "per_episode_count", old.count)
            object.__setattr__(self, "per_episode_fraction", old.fraction)
        PerEpisode(self.per_episode_count, self.per_episode_fraction)  # raises ValueError when invalid
        if self.boundary not in ("inside", "pad"):
            raise ValueError(f"boundary must be 'inside' or 'pad', not {self.boundary!r}")
        if self.stride < 1 or self.action_horizon < 0:
            raise ValueError("stride must be >= 1 and action_horizon >= 0")

    @property
    def sampling(self) -> PerEpisode:
        """Windows per episode per epoch, as the planner takes it."""
        return PerEpisode(self.per_episode_count, self.per_episode_fraction)

    @classmethod
    def from_delta_timestamps(cls, delta_timestamps: dict[str, list[float]], fps: float, **kw) -> WindowSpec:
        """Build a spec from LeRobot ``delta_timestamps``.

        Keys: camera names, ``observation.state``, ``action``; the action deltas must be 0, 1/fps,
        2/fps, ... (an action chunk).
        """
        cams: dict[str, tuple[int, ...]] = {}
        state: tuple[int, ...] = (0,)
        horizon = 0
        for key, deltas in delta_timestamps.items():
            offsets = offsets_from_seconds(deltas, fps)
            if key == kw.get("action_key", "action"):
                if offsets != tuple(range(len(offsets))):
                    raise ValueError(f"action delta_timestamps must be 0, 1/fps, 2/fps, ...; got {deltas}")
                horizon = len(offsets)
            elif key == kw.get("state_key", "observation.state"):
                state = offsets
            else:
                cams[key] = offsets
        return cls(cameras=cams or None, state_offsets=state, action_horizon=horizon, **kw)

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
        """Every row offset the window touches (cameras, state, action), sorted and unique."""
        parts = list(self.camera_offsets(available).values())
        if self.state_key:
            parts.append(np.asarray(self.state_offsets, dtype=np.int64))
        if self.action_key and self.action_horizon:
            parts.append(np.arange(self.action_horizon, dtype=np.int64))
        return np.unique(np.concatenate(parts)) if parts else np.zeros(1, dtype=np.int64)
