"""Batch diversity: how many episodes a batch mixes, measured and what i.i.d. sampling would give.

A loader that reads episodes whole (merged decoding, shuffle buffers of decoded episodes) can be
fast by putting many windows of one episode into a batch; training then sees correlated samples.
These figures make that visible next to every throughput figure:

- ``distinct``: distinct episodes per batch (mean over batches);
- ``share``: the probability that two samples of a batch come from the same episode (mean over
  batches of the fraction of the batch's ``B (B - 1) / 2`` pairs that share an episode);

and, for comparison, their exact expectations under i.i.d. uniform sampling of windows (each
sample of a batch drawn independently, with replacement, every window of the epoch equally likely;
``iid``): with ``p_e = c_e / sum(c)`` the share of episode ``e``'s windows ``c_e``,

- ``E[distinct] = sum_e 1 - (1 - p_e) ** B``
- ``P[share] = sum_e p_e ** 2``.

Sampling without replacement inside an epoch (a shuffled sampler, LeRobot's) differs from this by
``O(B / sum(c))``: nothing at the dataset sizes compared. The headline figure, ``ratio``, is
measured distinct episodes per batch over the i.i.d. expectation (1.0: as diverse as i.i.d.).

Pure numpy; an episode is whatever hashable id the caller gives (e.g. ``(dataset, episode_index)``).

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Diversity", "iid", "measured", "merge_counts", "ratio", "summary"]


@dataclass(frozen=True)
class Diversity:
    """Batch diversity figures.

    ``distinct``: mean distinct episodes per batch; ``share``: mean probability that two samples
    of a batch come from the same episode (batches of one sample count no pairs and are left out
    of this mean; ``nan`` when there is none); ``batches``: batches measured (0 for an
    expectation); ``batch_size``: mean samples per batch.
    """

    distinct: float
    share: float
    batches: int
    batch_size: float


def measured(batches: Iterable[Sequence[Hashable]]) -> Diversity:
    """Diversity of batches given as the episode id of each of their samples.

    Args:
        batches: per batch, one hashable episode id per sample (a list, a tuple, a 1-D array).

    Returns:
        ``Diversity`` with the means over the batches.

    Raises:
        ValueError: no batch, or an empty batch.
    """
    distinct, share, sizes = [], [], []
    for batch in batches:
        counts = np.fromiter(Counter(_ids(batch)).values(), dtype=np.int64)
        n = int(counts.sum())
        if n == 0:
            raise ValueError("batch diversity: an empty batch")
        distinct.append(counts.size)
        sizes.append(n)
        if n > 1:
            share.append(float((counts * (counts - 1)).sum()) / (n * (n - 1)))
    if not sizes:
        raise ValueError("batch diversity: no batch to measure")
    return Diversity(
        float(np.mean(distinct)), float(np.mean(share)) if share else float("nan"), len(sizes), float(np.mean(sizes))
    )


def _ids(batch: Sequence[Hashable]) -> list:
    """Episode ids of a batch as hashable values (rows of a 2-D array become tuples)."""
    if isinstance(batch, np.ndarray) and batch.ndim == 2:  # one row of ids per sample, e.g. (dataset, episode)
        return [tuple(row.tolist()) for row in batch]
    return list(batch)


def iid(windows_per_episode: Sequence[float] | np.ndarray, batch_size: float) -> Diversity:
    """Exact expectations under i.i.d. uniform sampling of the epoch's windows.

    Args:
        windows_per_episode: ``c_e``, windows each episode contributes to the epoch under the
            sampling policy (float64 ``[E]``, >= 0; counts or expected counts). Episodes with 0
            windows never appear.
        batch_size: samples per batch ``B`` (> 0; a mean batch size is allowed, the formula is
            evaluated at that real ``B``).

    Returns:
        ``Diversity(distinct=sum 1 - (1 - p_e)^B, share=sum p_e^2, batches=0, batch_size=B)``.

    Raises:
        ValueError: no window at all, a negative count, or ``batch_size <= 0``.
    """
    c = np.asarray(windows_per_episode, dtype=np.float64).ravel()
    if (c < 0).any():
        raise ValueError("batch diversity: negative windows per episode")
    total = c.sum()
    if total <= 0:
        raise ValueError("batch diversity: no window to sample from")
    if batch_size <= 0:
        raise ValueError(f"batch diversity: batch size must be > 0, got {batch_size}")
    p = c[c > 0] / total
    # 1 - (1 - p)^B without cancellation for small p
    distinct = float(-np.expm1(batch_size * np.log1p(-np.minimum(p, 1.0))).sum()) if p.size > 1 else 1.0
    return Diversity(distinct, float((p * p).sum()), 0, float(batch_size))


def ratio(measured_: Diversity, reference: Diversity) -> float:
    """Measured distinct episodes per batch over the i.i.d. expectation (1.0: as diverse as i.i.d.).

    ``reference``: ``iid``'s (its ``distinct`` > 0 for any batch size > 0, so the ratio is finite).
    """
    return measured_.distinct / reference.distinct


def merge_counts(keys: Sequence[Hashable], windows: Sequence[float] | np.ndarray) -> np.ndarray:
    """Windows per episode id when several entries share an id (summed, in first-seen order).

    For a reference built from per-episode counts whose ids may repeat (e.g. ``episode_index``
    of two sources of one dataset): the i.i.d. expectation then treats them as the measurement
    does, as one episode. Returns float64 ``[distinct ids]``.
    """
    total: dict[Hashable, float] = {}
    for key, w in zip(keys, np.asarray(windows, dtype=np.float64).tolist(), strict=True):
        total[key] = total.get(key, 0.0) + w
    return np.fromiter(total.values(), dtype=np.float64, count=len(total))


def summary(measured_: Diversity, reference: Diversity) -> dict:
    """JSON-ready figures: measured and i.i.d. distinct episodes and share probability, and the ratio.

    Floats (distinct episodes per batch, same-episode pair probability, ``ratio``); ``diversity_batches``:
    the batches measured (int).
    """
    return {
        "distinct_episodes_per_batch": measured_.distinct,
        "distinct_episodes_per_batch_iid": reference.distinct,
        "same_episode_pair_probability": measured_.share,
        "same_episode_pair_probability_iid": reference.share,
        "diversity_ratio": ratio(measured_, reference),
        "diversity_batches": measured_.batches,
    }
