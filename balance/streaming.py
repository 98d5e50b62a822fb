"""``BalancedWindowDataset``: the streaming reader with rank-local cost balancing (``balance.local``).

A thin subclass of ``stream.WindowDataset``: after the reader's own plan for a consumer (its shards,
its shuffle buffer), the consumer's yield order is permuted by ``local_order`` with the per-window
costs of a ``CostFn``. Each rank still reads only its own shards; every batch count, exactly-once
and resume guarantee of the reader holds, because the permutation is a pure function of the plan
(see ``balance.local``). Every sample carries its predicted cost as ``__cost__`` (float64) so the
training loop can gather the step's costs for telemetry (``balance.telemetry.StepTelemetry``).

Scope: ``local_order`` evens out cost variation *inside* each rank's stream (lengths varying within
a dataset). When datasets are mixed, the reader's plan deals every dataset to every consumer evenly
(``stream.plan``, per-stratum cut), and ``stratified_order`` then makes each step come from one
dataset on every rank, cost-sorted inside it (tools/bench_balance.py, section (c), "reader").
A substitute sample (an episode that failed to fetch) carries the planned window's ``__cost__``.

It relies on ``WindowDataset.plan`` and ``WindowDataset._generate``; the intended long-term home of
this step is ``stream.plan.worker_plan`` itself (one more pure stage after the shuffle buffer).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from epishard.stream.dataset import WindowDataset
from epishard.stream.plan import WorkerPlan

from .cost import CostFn, WindowCost
from .local import local_order, stratified_order


class BalancedWindowDataset(WindowDataset):
    """``WindowDataset`` whose batches match in cost across ranks step by step.

    Args (besides ``WindowDataset``'s):
        batch_size: the per-rank DataLoader batch size (must equal the loader's).
        chunk_batches: reordering horizon in batches per worker (memory: at most this many
            batches of windows more are held loaded); larger balances better.
        cost: a ``CostFn`` on global episode numbers and anchors; default
            ``WindowCost.from_dataset(self)`` (sequence tokens, see ``balance.cost.CostModel``).
    """

    def __init__(self, sources, spec, *, batch_size: int, chunk_batches: int = 16, cost: CostFn | None = None, **kw):
        super().__init__(sources, spec, **kw)
        self.batch_size = int(batch_size)
        self.chunk_batches = int(chunk_batches)
        self.cost = cost if cost is not None else WindowCost.from_dataset(self)

    def plan(self, epoch: int, rank: int, world_size: int, num_workers: int, consumer: int) -> WorkerPlan:
        """``WindowDataset.plan`` with the consumer's windows reordered by cost (``local``/``stratified_order``)."""
        plan = super().plan(epoch, rank, world_size, num_workers, consumer)
        costs = self.cost(plan.episode, plan.anchor)
        if self.table.stratum is None:
            order = local_order(costs, self.batch_size, self.chunk_batches, self.seed, epoch, consumer)
        else:  # mixed datasets, each dealt to every consumer evenly: every step from one dataset on all ranks
            order = stratified_order(
                self.table.stratum[plan.episode],
                len(self.sources),
                self.batch_size,
                self.seed,
                epoch,
                consumer,
                costs,
                self.chunk_batches,
            )
        return dataclasses.replace(plan, episode=plan.episode[order], anchor=plan.anchor[order])

    def _generate(self, plan: WorkerPlan, skip: int, telemetry):
        costs = np.asarray(self.cost(plan.episode[skip:], plan.anchor[skip:]), dtype=np.float64)
        for sample, cost in zip(super()._generate(plan, skip, telemetry), costs.tolist(), strict=False):
            sample["__cost__"] = cost
            yield sample
