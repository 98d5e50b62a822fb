"""``BalancedWindowDataset``: the streaming reader with cost balancing across ranks, local or global.

``scope="local"`` (default) is described first; ``scope="global"`` below.

A ``stream.WindowDataset`` with two declared plan stages (``stream.plan.worker_plan``): a cost per
window (a ``CostFn``) and an order stage, ``BalancedOrder``, that permutes each consumer's yield
order after the reader's own plan (its shards, its pool shuffle) by ``local_order``. Each rank
still reads only its own shards; every batch count, exactly-once and resume guarantee of the reader
holds (elastic resume too), because the permutation is a pure function of the plan (see
``balance.local``). Every sample carries its predicted cost as ``__cost__`` (float64) so the
training loop can gather the step's costs for telemetry (``balance.telemetry.StepTelemetry``).

Scope: ``local_order`` evens out cost variation *inside* each rank's stream (lengths varying within
a dataset). When datasets are mixed, the reader's plan deals every dataset to every consumer evenly
(``stream.plan``, per-stratum cut), and ``stratified_order`` then makes each step come from one
dataset on every rank, cost-sorted inside it (``tools/bench/run.py balance``, section (c), "reader").
A substitute sample (an episode that failed to fetch) carries the planned window's ``__cost__``.

``scope="global"``: a deal stage (``balance.globaldeal.GlobalDeal``) replaces the plan's cut of the
windows into consumers: every step's windows are dealt to ranks by cost from the global window
list, and each consumer fetches the members of the episodes it is dealt, whichever shard they sit
in, with ranged reads (``FetchPolicy(mode="ranged")`` unless a ``fetch`` policy is given). The
windows kept are the plain plan's; exactly-once, equal steps, exact and elastic resume hold.

Why ``"local"`` stays the default: a global deal spreads an episode's windows over many consumers,
so each episode is fetched and decoded by several workers instead of one (more bytes read and more
frames decoded per sample, docs/BENCHMARKS.md, "Balancing end to end"), and the reader holds an episode loaded from
its first to its last window in a consumer, which the deal scatters over a chunk. Choose
``"global"`` when ranks' costs differ beyond what reordering inside a rank evens out (costs that
vary by episode, one rank holding the expensive ones) and storage serves ranged reads well.

Public entry point (imports torch): ``from epishard.balance.streaming import BalancedWindowDataset``
(also ``epishard.BalancedWindowDataset``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from epishard.stream.dataset import WindowDataset
from epishard.stream.fetch import FetchPolicy
from epishard.stream.options import ReadOptions, Stages
from epishard.stream.plan import World
from epishard.stream.statecheck import StateTypeError, states_of

from .cost import CostFn, WindowCost
from .globaldeal import GlobalDeal
from .local import local_order, stratified_order

__all__ = ["BalancedOrder", "BalancedWindowDataset"]


@dataclass(frozen=True)
class BalancedOrder:
    """The order stage (``stream.stages.OrderStage``) of cost balancing.

    ``strata``: int64 ``[episodes]`` stratum (dataset) of each global episode, or ``None`` (one
    stratum); ``num_strata``: how many. Without strata: ``local_order`` (cost-sorted blocks in
    chunks of ``chunk_batches`` batches); with them: ``stratified_order`` (every step from one
    stratum on all ranks). The schedule is drawn from ``(seed, epoch, worker)``, the same on every rank.
    """

    batch_size: int
    chunk_batches: int
    strata: np.ndarray | None = None
    num_strata: int = 1

    def __call__(
        self, episode: np.ndarray, anchor: np.ndarray, cost: np.ndarray | None, world: World, seed: int, epoch: int
    ) -> np.ndarray:
        """Yield order of one consumer's windows: an int64 permutation ``[n]`` (``OrderStage``).

        ``episode``, ``anchor``: int64 ``[n]`` windows in planned yield order; ``cost``: float64 ``[n]``
        predicted cost of each (``None``: all zero, so only the batch/stratum structure applies);
        ``world``: the consumer (its ``worker`` salts the schedule); ``seed``, ``epoch``: as the plan's.
        """
        costs = np.zeros(episode.size) if cost is None else cost
        if self.strata is None:
            return local_order(costs, self.batch_size, self.chunk_batches, seed, epoch, world.worker)
        return stratified_order(
            self.strata[episode],
            self.num_strata,
            self.batch_size,
            seed,
            epoch,
            world.worker,
            costs,
            self.chunk_batches,
        )


class BalancedWindowDataset(WindowDataset):
    """``WindowDataset`` whose batches match in cost across ranks step by step.

    Args (besides ``WindowDataset``'s):
        batch_size: the per-rank DataLoader batch size (must equal the loader's).
        chunk_batches: balancing horizon; None: the scope's default. ``"local"``: batches per
            worker (default 16; memory: at most this many batches of windows more are held
            loaded). ``"global"``: global steps per chunk of the global window list (default 64;
            ``balance.globaldeal``; a consumer holds the episodes of about ``chunk / workers`` of
            its batches). Larger balances better: a chunk must hold enough windows of similar cost
            to fill whole steps, which a long-tailed cost needs (64 steps gave max/mean 1.006 on
            lognormal costs where 16 gave 1.027, tests/test_balance_global.py).
        cost: a ``CostFn`` on global episode numbers and anchors; default
            ``WindowCost.from_dataset(self)`` (sequence tokens, see ``balance.cost.CostModel``).
        scope: ``"local"`` (each rank reorders the windows of its own shards) or ``"global"``
            (every step dealt to ranks from the global window list; ranged reads by default).

    Raises:
        ValueError: an unknown ``scope``; ``"global"`` with ``batch_by_dataset`` (the deal fixes
            every batch).
    """

    def __init__(
        self,
        sources,
        spec,
        *,
        batch_size: int,
        chunk_batches: int | None = None,
        cost: CostFn | None = None,
        scope: str = "local",
        **kw,
    ):
        if scope not in ("local", "global"):
            raise ValueError(f"BalancedWindowDataset: scope must be 'local' or 'global', not {scope!r}")
        if scope == "global":
            if kw.get("mix") is not None and kw["mix"].batch_by_dataset:
                raise ValueError(
                    "BalancedWindowDataset: scope='global' deals every batch by cost; batch_by_dataset "
                    "would regroup them by dataset (use scope='local')"
                )
            read = kw.get("read") or ReadOptions()
            if read.fetch is None:
                kw["read"] = dataclasses.replace(read, fetch=FetchPolicy(mode="ranged"))
        super().__init__(sources, spec, **kw)
        self.scope = scope
        self.batch_size = int(batch_size)
        self.chunk_batches = int(chunk_batches or (64 if scope == "global" else 16))
        self.cost = cost if cost is not None else WindowCost.from_dataset(self)
        if scope == "global":
            self.stages = Stages(cost=self.cost, deal=GlobalDeal(self.cost, self.batch_size, self.chunk_batches))
        else:
            order = BalancedOrder(self.batch_size, self.chunk_batches, self.table.stratum, len(self.sources))
            self.stages = Stages(cost=self.cost, order=order)

    def with_options(self, *, batch_size: int | None = None, **options) -> WindowDataset:
        """``WindowDataset.with_options``, checking the loader's batch size under ``scope="global"``.

        The deal fixes each rank's batch of every step, so another batch size is refused.

        Raises:
            ValueError: ``scope="global"`` and ``batch_size`` differs from the dataset's.
        """
        if self.scope == "global" and batch_size is not None and batch_size != self.batch_size:
            raise ValueError(
                f"BalancedWindowDataset(scope='global', batch_size={self.batch_size}) dealt its steps for batches of "
                f"{self.batch_size}; the loader's batch_size is {batch_size}"
            )
        return super().with_options(batch_size=batch_size, **options)

    def _balancing(self) -> dict:
        return {"scope": self.scope, "batch_size": self.batch_size, "chunk_batches": self.chunk_batches}

    def state_dict(self, *args, **kw) -> dict:
        """``WindowDataset.state_dict`` plus how the plan was balanced (``"balance"``: scope, batch size, chunk)."""
        return {**super().state_dict(*args, **kw), "balance": self._balancing()}

    def load_state_dict(self, state: dict | list[dict], num_workers: int = 0) -> None:
        """``WindowDataset.load_state_dict``, after checking that the states were balanced the same way.

        A mid-epoch state counts windows of the plan it was saved under, so it resumes exactly only
        under the same balancing; a state at an epoch boundary (``"fresh"``) loads under any. States
        without ``"balance"`` (saved before it was recorded) are taken as local-scope ones.

        Raises:
            ValueError: a state balanced another way (scope, batch size or chunk), naming both;
                a state that is no dict, or whose ``balance`` is none (``StateTypeError``).
        """
        for i, s in enumerate(states_of(state)):
            saved = s.get("balance", {"scope": "local"})
            mine = self._balancing()
            if not isinstance(saved, dict):
                raise StateTypeError(
                    f"load_state_dict: state [{i}] field 'balance' is {saved!r}; must be a dict (scope, batch_size, "
                    "chunk_batches)"
                )
            if s.get("fresh") is True:  # an epoch boundary: nothing consumed, any balancing continues it
                continue
            if any(saved.get(k, mine[k]) != mine[k] for k in mine):
                raise ValueError(
                    f"cannot resume: the state was saved with balancing {saved}, this dataset has {mine}; resume with "
                    f"the same BalancedWindowDataset options, or start the next epoch fresh with "
                    f"set_epoch({s['epoch'] + 1})"
                )
        super().load_state_dict(state, num_workers)
