"""Normalisation statistics per numeric feature: mean, std, min, max, q01, q99 over all rows.

Mean, std, min and max are exact (float64 sums). Quantiles are exact while the dataset has at most
``max_rows_per_episode`` rows per episode; longer episodes contribute that many evenly spaced rows
(deterministic, no random sampling, so reruns give identical manifests). A constant dimension has
std 0.0 (finite); readers normalise with ``max(std, eps)``.

Internal: import from ``epishard.format``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["DatasetStats", "FeatureStats", "numeric_matrix"]


def numeric_matrix(column: pa.ChunkedArray | pa.Array) -> np.ndarray | None:
    """A column as float64 ``[rows, dims]``, or None if it is not numeric (scalar or fixed-width list)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    rows = len(array)
    values = array
    while (
        pa.types.is_list(values.type) or pa.types.is_fixed_size_list(values.type) or pa.types.is_large_list(values.type)
    ):
        values = values.flatten()
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_boolean(values.type)):
        return None
    flat = values.to_numpy(zero_copy_only=False).astype(np.float64)
    if rows == 0 or flat.size % rows:
        return None
    return flat.reshape(rows, flat.size // rows)


class FeatureStats:
    """Accumulates statistics of one feature over many episodes, in the order they are added."""

    def __init__(self, max_rows_per_episode: int = 1000):
        self.max_rows = max_rows_per_episode
        self.count = 0
        self.width: int | None = None  # set by the first rows added
        # float64 [width] each once rows are added
        self.sum, self.sumsq, self.min, self.max = np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0)
        self.samples: list[np.ndarray] = []

    def add(self, matrix: np.ndarray) -> None:
        """Add an episode's rows: float64 ``[rows, width]`` (the width is fixed by the first call).

        Raises:
            ValueError: the width differs from the rows added before.
        """
        if self.width is None:
            self.width = dims = matrix.shape[1]
            self.sum, self.sumsq = np.zeros(dims), np.zeros(dims)
            self.min, self.max = np.full(dims, np.inf), np.full(dims, -np.inf)
        elif matrix.shape[1] != self.width:
            raise ValueError(f"feature width changed from {self.width} to {matrix.shape[1]}")
        self.count += matrix.shape[0]
        self.sum += matrix.sum(axis=0)
        self.sumsq += np.square(matrix).sum(axis=0)
        self.min = np.minimum(self.min, matrix.min(axis=0))
        self.max = np.maximum(self.max, matrix.max(axis=0))
        if matrix.shape[0] > self.max_rows:
            matrix = matrix[np.linspace(0, matrix.shape[0] - 1, self.max_rows).round().astype(np.int64)]
        self.samples.append(matrix)

    def merge(self, other: FeatureStats) -> None:
        """Add another accumulator's rows (same width)."""
        if self.width is None:
            self.width = other.width
            self.count, self.sum, self.sumsq = other.count, other.sum.copy(), other.sumsq.copy()
            self.min, self.max, self.samples = other.min.copy(), other.max.copy(), list(other.samples)
            return
        self.count += other.count
        self.sum += other.sum
        self.sumsq += other.sumsq
        self.min = np.minimum(self.min, other.min)
        self.max = np.maximum(self.max, other.max)
        self.samples += other.samples

    def result(self) -> dict:
        """``count``, ``mean``, ``std``, ``min``, ``max``, ``q01``, ``q99`` (lists of width floats).

        Quantiles come from at most ``max_rows_per_episode`` evenly spaced rows per episode.
        """
        mean = self.sum / self.count
        var = np.maximum(self.sumsq / self.count - np.square(mean), 0.0)
        sample = np.concatenate(self.samples)
        q01, q99 = np.quantile(sample, [0.01, 0.99], axis=0)
        return {
            "count": int(self.count),
            "mean": mean.tolist(),
            "std": np.sqrt(var).tolist(),
            "min": self.min.tolist(),
            "max": self.max.tolist(),
            "q01": q01.tolist(),
            "q99": q99.tolist(),
        }


_SKIP_COLUMNS = {"index", "episode_index", "frame_index", "task_index", "timestamp"}


class DatasetStats:
    """Statistics for every numeric column of the episode tables, over the whole dataset and per source.

    Bookkeeping columns are excluded.

    Sources may differ in a feature's width (robots with other state sizes): such a feature gets
    per-source statistics only, and ``mixed_widths`` names it.
    """

    def __init__(self) -> None:
        self.by_source: dict[str, dict[str, FeatureStats]] = {}

    def add_table(self, table: pa.Table, source: str = "") -> None:
        """Add an episode table's numeric columns (``numeric_matrix``) under ``source``."""
        features = self.by_source.setdefault(source, {})
        for name in table.column_names:
            if name in _SKIP_COLUMNS:
                continue
            matrix = numeric_matrix(table.column(name))
            if matrix is not None and matrix.shape[0]:
                features.setdefault(name, FeatureStats()).add(matrix)

    @property
    def mixed_widths(self) -> list[str]:
        """Features whose width differs between sources (sorted)."""
        widths: dict[str, set[int]] = {}
        for features in self.by_source.values():
            for name, acc in features.items():
                widths.setdefault(name, set()).add(acc.sum.shape[0])
        return sorted(name for name, w in widths.items() if len(w) > 1)

    def result(self) -> dict:
        """Feature -> statistics over all sources (features whose width is the same everywhere)."""
        mixed = set(self.mixed_widths)
        merged: dict[str, FeatureStats] = {}
        for features in self.by_source.values():
            for name, acc in features.items():
                if name not in mixed:
                    merged.setdefault(name, FeatureStats()).merge(acc)
        return {name: acc.result() for name, acc in sorted(merged.items())}

    def result_by_source(self) -> dict:
        """Source -> feature -> statistics (``FeatureStats.result``)."""
        return {source: {name: acc.result() for name, acc in sorted(f.items())} for source, f in self.by_source.items()}
