"""Per-step balance telemetry and padding, from a step layout and per-sample costs: pure numpy.

A step layout is int64 ``[steps, world_size, batch_size]`` of sample indices (``balance.assign``),
or, for a live run, the costs themselves as float64 ``[steps, world_size, batch_size]``
(``step_stats`` accepts either together with ``costs=None``).

Per rank and step: ``sum`` is the cost of the rank's batch when samples are packed (no padding);
``padded`` is ``batch_size * max`` (every sample padded to the longest in the batch). The step time
of synchronous data parallelism is the slowest rank: ``max`` over ranks of ``padded`` (padded
batches) or of ``sum`` (packed batches).

Padding fraction of a batch: ``1 - sum / padded``, the share of padded work that is padding. Give
``sizes`` in tokens (sequence lengths) to get the share of padding tokens; give costs to get the
share of wasted compute (they differ when cost is non-linear in length).

Internal: import from ``epishard.balance``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["StepStats", "StepTelemetry", "epoch_summary", "padding_fraction", "step_costs", "step_stats"]


def step_costs(steps: np.ndarray, costs: np.ndarray | None) -> np.ndarray:
    """float64 ``[steps, world_size, batch_size]``: the cost of every slot."""
    if costs is None:
        return np.asarray(steps, dtype=np.float64)
    return np.asarray(costs, dtype=np.float64)[steps]


def padding_fraction(sizes: np.ndarray) -> float:
    """Padding share of batches: ``1 - sum(sizes) / sum(batch_size * max per batch)``.

    ``sizes``: float64 ``[..., batch_size]`` (last axis is one batch), e.g. ``step_costs(...)``.
    0.0 for all-equal batches; 0.0 when everything is 0.
    """
    sizes = np.asarray(sizes, dtype=np.float64)
    padded = float(np.sum(sizes.max(axis=-1) * sizes.shape[-1]))
    return 1.0 - float(sizes.sum()) / padded if padded > 0 else 0.0


@dataclass(frozen=True)
class StepStats:
    """Telemetry per step (float64 ``[steps]`` each).

    ``max_rank`` / ``mean_rank``: largest and mean packed rank cost (sum over the rank's batch);
    ``imbalance``: ``max_rank / mean_rank`` (1.0 is perfect; 1.0 when all are 0);
    ``padded_time``: slowest rank's padded cost (``batch_size * max`` sample cost), the step time
    with padded batches; ``packed_time``: ``max_rank``, the step time with packed batches;
    ``padding``: padding fraction of the step (all its batches).
    """

    max_rank: np.ndarray
    mean_rank: np.ndarray
    imbalance: np.ndarray
    padded_time: np.ndarray
    packed_time: np.ndarray
    padding: np.ndarray

    def __len__(self) -> int:
        return int(self.max_rank.shape[0])


def step_stats(steps: np.ndarray, costs: np.ndarray | None = None, sizes: np.ndarray | None = None) -> StepStats:
    """Per-step telemetry of a layout.

    Args:
        steps: int64 ``[steps, world_size, batch_size]`` sample indices, or float64 slot costs when
            ``costs`` is None.
        costs: float64 ``[N]`` per-sample costs.
        sizes: float64 ``[N]`` per-sample sizes for the padding fraction (e.g. sequence tokens);
            default: the costs.
    """
    c = step_costs(steps, costs)
    s = c if sizes is None else step_costs(steps, sizes)
    rank_sum = c.sum(axis=2)
    max_rank, mean_rank = rank_sum.max(axis=1), rank_sum.mean(axis=1)
    imbalance = np.divide(max_rank, mean_rank, out=np.ones_like(max_rank), where=mean_rank > 0)
    padded_rank = c.max(axis=2) * c.shape[2]
    s_padded = (s.max(axis=2) * s.shape[2]).sum(axis=1)
    padding = np.divide(s_padded - s.sum(axis=(1, 2)), s_padded, out=np.zeros(c.shape[0]), where=s_padded > 0)
    return StepStats(
        max_rank=max_rank,
        mean_rank=mean_rank,
        imbalance=imbalance,
        padded_time=padded_rank.max(axis=1),
        packed_time=max_rank,
        padding=padding,
    )


def epoch_summary(stats: StepStats, *, samples: int | None = None, dropped: int | None = None) -> dict:
    """One epoch in a few numbers (plain floats, JSON-ready).

    ``steps``; ``imbalance_mean`` (mean over steps of max/mean rank cost), ``imbalance_p95``,
    ``imbalance_max``; ``imbalance_total`` (``sum max_rank / sum mean_rank``: the share of the
    epoch's packed time ranks spend waiting, plus 1); ``step_time_padded`` / ``step_time_packed``
    (mean step times); ``padding`` (mean padding fraction); ``samples``/``dropped`` when given.
    """
    out: dict[str, float] = {"steps": len(stats)}
    if len(stats):
        out.update(
            imbalance_mean=float(stats.imbalance.mean()),
            imbalance_p95=float(np.percentile(stats.imbalance, 95)),
            imbalance_max=float(stats.imbalance.max()),
            imbalance_total=float(stats.max_rank.sum() / stats.mean_rank.sum()) if stats.mean_rank.sum() > 0 else 1.0,
            step_time_padded=float(stats.padded_time.mean()),
            step_time_packed=float(stats.packed_time.mean()),
            padding=float(stats.padding.mean()),
        )
    if samples is not None:
        out["samples"] = int(samples)
    if dropped is not None:
        out["dropped"] = int(dropped)
    return out


class StepTelemetry:
    """Live accumulator for a training loop: ``add(rank_costs)`` once per step, ``summary()`` per epoch.

    ``rank_costs``: float64 ``[world_size, batch_size]`` costs of the step's slots on every rank
    (known before the step from the plan, or gathered after it, e.g. with
    ``torch.distributed.all_gather`` of each rank's ``[batch_size]`` costs).
    """

    def __init__(self) -> None:
        self.steps: list[StepStats] = []

    def add(self, rank_costs: np.ndarray) -> dict:
        """Record one step; returns its telemetry ``{"imbalance", "padded_time", "packed_time", "padding"}``.

        Steps may differ in batch size (an epoch's last, partial batch).
        """
        s = step_stats(np.asarray(rank_costs, dtype=np.float64)[None])
        self.steps.append(s)
        return {
            "imbalance": float(s.imbalance[0]),
            "padded_time": float(s.padded_time[0]),
            "packed_time": float(s.packed_time[0]),
            "padding": float(s.padding[0]),
        }

    def summary(self, reset: bool = True) -> dict:
        """``epoch_summary`` of the steps recorded so far (then forgets them when ``reset``)."""
        if not self.steps:
            return {"steps": 0}
        merged = StepStats(
            **{
                f: np.concatenate([getattr(s, f) for s in self.steps])
                for f in ("max_rank", "mean_rank", "imbalance", "padded_time", "packed_time", "padding")
            }
        )
        if reset:
            self.steps = []
        return epoch_summary(merged)
