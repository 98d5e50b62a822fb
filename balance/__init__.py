"""epishard cost-aware rank balancing.

- ``balance.cost``: per-window costs known before decoding (index + window spec -> features ->
  ``CostModel``), user cost functions, and a measured-cost hook for decoded samples.
- ``balance.assign``: ``balanced_steps`` (sort by cost, capped greedy least-loaded per step,
  shuffled rank ids and step order) and the ``random_steps`` baseline: pure functions.
- ``balance.local``: ``local_order`` and ``stratified_order``, the same idea applied rank-locally
  inside a streaming reader (each rank keeps its own shards); ``balance.streaming`` wires
  ``local_order`` into ``stream.WindowDataset`` (imports torch; not imported here).
- ``balance.globaldeal``: ``global_steps`` and the ``GlobalDeal`` plan stage, every step's windows
  dealt to ranks by cost from the global window list (``BalancedWindowDataset(scope="global")``;
  imports ``stream.plan``, hence torch: not imported here).
- ``balance.telemetry``: per-step max/mean rank cost, padded and packed step time, padding
  fraction; per-epoch summaries.
"""

from .assign import balanced_steps, dropped_samples, lpt_capped, random_steps, rank_samples, remainder
from .cost import (
    CostFn,
    CostModel,
    MeasuredCosts,
    WindowCost,
    WindowFeatures,
    estimate_tokens,
    sample_cost,
    sample_features,
    token_counts,
    window_features,
)
from .local import local_order, rank_steps, stratified_order
from .telemetry import StepStats, StepTelemetry, epoch_summary, padding_fraction, step_costs, step_stats

__all__ = [
    "CostFn",
    "CostModel",
    "MeasuredCosts",
    "StepStats",
    "StepTelemetry",
    "WindowCost",
    "WindowFeatures",
    "balanced_steps",
    "dropped_samples",
    "epoch_summary",
    "estimate_tokens",
    "local_order",
    "lpt_capped",
    "padding_fraction",
    "random_steps",
    "rank_samples",
    "rank_steps",
    "remainder",
    "sample_cost",
    "sample_features",
    "step_costs",
    "step_stats",
    "stratified_order",
    "token_counts",
    "window_features",
]
