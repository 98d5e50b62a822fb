"""Planning rules of a mix of datasets, as pure functions (no I/O).

Planning rules of a mix of datasets, as pure functions (no I/O): the planner's table of a mix
(``mix_table``), probability weights turned into the planner's repeat factors, and the per-dataset
batch order of ``batch_by_dataset``.

Weights: the planner multiplies each dataset's windows by its weight (a repeat factor: 1:1 gives the
datasets' natural sizes). ``weights="probability"`` instead makes each dataset's share of an epoch
its normalised weight ``p_k``: an epoch has ``L`` windows (the mix's natural size, every dataset at
factor 1, unless ``epoch_length`` is given), dataset ``k`` contributes ``L * p_k`` of them in
expectation; each episode's count is drawn with the planner's seeded stochastic rounding (seed,
epoch, episode), so the per-epoch counts vary around ``L * p_k`` and repeat for the same seed.

``batch_by_dataset``: every batch holds windows of one dataset (per-embodiment heads). The planner
deals each dataset to every consumer on its own (``stratify``), so every consumer holds the same
number of windows of each dataset; each consumer then drops the same number (that count modulo the
batch size, chosen at random per epoch) and orders its windows in whole batches of one dataset,
keeping the shuffled order inside each dataset. Every rank still yields the same number of
samples and batches, and every window kept is yielded exactly once. It is the planner's declared
``group`` stage (after the shuffle buffer and any order stage), so elastic resume replays it too.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .plan import EpisodeTable, anchor_counts, episode_table, expected_windows
from .spec import WindowSpec

__all__ = ["BatchByDataset", "group_by_dataset", "mix_table"]


def mix_table(
    spec: WindowSpec,
    indexes: Sequence,
    specs: Sequence[WindowSpec],
    cam_offsets: Sequence[dict[str, np.ndarray]],
    keep: Sequence[np.ndarray],
    weights: Sequence[float],
    shard_counts: Sequence[int],
    *,
    stratify: bool,
    probability: bool = False,
    epoch_length: int | None = None,
    names: list[str] | None = None,
) -> tuple[EpisodeTable, np.ndarray, list[float]]:
    """The planner's table of every dataset of a mix, episodes and shards numbered on.

    ``spec``: the mix's window (its stride and windows per episode weigh ``probability``). Per
    dataset ``d``: its index (``WindowIndex``), its spec in its own rows (``stream.mix``), its
    camera offsets, ``keep`` (bool ``[episodes]``: its read-time selection), its weight and its shard
    count; ``plan.episode_table`` each, then ``EpisodeTable.concat`` (each dataset its own stratum with
    ``stratify``). With ``probability`` the weights are the datasets' shares of an epoch of
    ``epoch_length`` windows (``_probability_factors``), else repeat factors.

    Returns:
        the table, the first global episode number of each dataset (int64 ``[datasets + 1]``) and the
        repeat factor of each dataset (the weights as given, or the probability's factors).

    Raises:
        ValueError: see ``_probability_factors``.
    """
    parts = [
        episode_table(spec, index, offsets, weight=weight, keep=kept)
        for index, spec, offsets, kept, weight in zip(indexes, specs, cam_offsets, keep, weights, strict=True)
    ]
    table = EpisodeTable.concat(parts, shard_counts, stratify)
    base = np.cumsum([0, *[t.num_episodes for t in parts]])
    if not probability:
        return table, base, list(weights)
    anchors = anchor_counts(table.lo, table.hi, spec.stride, table.gaps)
    natural = np.add.reduceat(expected_windows(anchors, spec.sampling), base[:-1])
    factors = _probability_factors(natural, list(weights), epoch_length, names)
    return dataclasses.replace(table, weight=np.repeat(factors, np.diff(base))), base, factors.tolist()


def _probability_factors(
    natural: np.ndarray, weights: list[float], epoch_length: int | None = None, names: list[str] | None = None
) -> np.ndarray:
    """Repeat factor per dataset of ``weights="probability"``.

    Repeat factor per dataset (float64 ``[K]``) that gives dataset ``k`` an expected
    ``L * w_k / sum(w)`` windows per epoch; ``natural``: float64 ``[K]`` windows per dataset at
    factor 1; ``L``: ``epoch_length``, else ``natural.sum()``.

    Raises:
        ValueError: the weights sum to 0, or a dataset with a positive weight has no windows.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.sum() <= 0:
        raise ValueError(f"probability weights must not all be 0: {weights}")
    empty = [(names or [str(k) for k in range(w.size)])[k] for k in np.flatnonzero((w > 0) & (natural <= 0))]
    if empty:
        raise ValueError(f"datasets {empty} have a positive probability but no windows (selection, spec)")
    length = float(natural.sum() if epoch_length is None else epoch_length)
    return np.where(w > 0, length * (w / w.sum()) / np.maximum(natural, 1e-300), 0.0)


@dataclass(frozen=True)
class BatchByDataset:
    """The planner's group stage (``stream.stages.GroupStage``) of ``batch_by_dataset``.

    ``dataset_of_episode``: int64 ``[num_episodes]``, the dataset of each global episode number
    (the planner's stratum); ``batch_size``: windows per batch.
    """

    dataset_of_episode: np.ndarray
    batch_size: int

    def __call__(self, episode: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Positions kept, in whole batches (``group_by_dataset``) of the windows of ``episode``."""
        return group_by_dataset(self.dataset_of_episode[episode], self.batch_size, rng)

    def kept(self, episode: np.ndarray) -> int:
        """Windows a consumer keeps of its windows.

        Windows a consumer keeps of the windows of ``episode`` (int64 ``[n]``): per dataset, its
        count rounded down to whole batches.
        """
        counts = np.bincount(
            self.dataset_of_episode[episode], minlength=int(self.dataset_of_episode.max(initial=0)) + 1
        )
        return int(np.sum(counts // self.batch_size * self.batch_size))


def group_by_dataset(dataset: np.ndarray, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """Positions of the windows kept, in whole batches of one dataset each.

    Positions of windows kept, in an order of whole batches of ``batch_size`` windows of one
    dataset each (int64 ``[m]``); ``dataset``: int64 ``[n]``, each window's dataset, in yield order.

    Per dataset, ``count % batch_size`` windows are left out (chosen with ``rng``); the rest keep
    their order within the dataset, and a batch is emitted as soon as a dataset has ``batch_size``
    windows waiting (so an episode's windows are not held back much longer).
    """
    keep = np.ones(dataset.size, dtype=bool)
    for k in np.unique(dataset):
        mine = np.flatnonzero(dataset == k)
        extra = mine.size % batch_size
        if extra:
            keep[rng.choice(mine, size=extra, replace=False)] = False
    kept = np.flatnonzero(keep)
    if kept.size == 0:
        return kept.astype(np.int64)
    # Vectorised "emit a batch as soon as a dataset has batch_size windows waiting": each window's
    # batch is emitted at its last window's position; order by that, then by arrival.
    by_dataset = np.argsort(dataset[kept], kind="stable")
    group = dataset[kept][by_dataset]
    start = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    rank = np.arange(kept.size) - np.repeat(start, np.diff(np.r_[start, kept.size]))
    last = by_dataset[np.arange(kept.size) - rank + rank // batch_size * batch_size + batch_size - 1]
    emit = np.empty(kept.size, dtype=np.int64)
    emit[by_dataset] = last
    return kept[np.argsort(emit, kind="stable")].astype(np.int64)  # stable: arrival order within a batch
