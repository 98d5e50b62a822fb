"""``WindowDataset`` (training windows streamed from shards) and ``WindowLoader`` (exact resume).

``WindowDataset`` is a torch ``IterableDataset``; ``WindowLoader`` a ``DataLoader`` that adds exact
mid-epoch resume.

Sample format (stable; ``default_collate`` batches it):

=================================  =========================================================
``<camera>`` (the spec's name)     frames ``[T, C, H, W]``, uint8 RGB by default (``PostProcess``);
                                   a depth camera: uint16 ``[T, 1, H, W]``, stored units, always;
                                   zeros for a camera the sample's dataset lacks (``stream.mix``)
``<camera>_is_pad``                bool ``[T]``: offset fell outside the episode (pad mode), or the
                                   dataset lacks the camera (all true)
``observation.state``              float32 ``[T_s, D]`` (``spec.state_offsets`` rows)
``observation.state_is_pad``       bool ``[T_s]``
``action``                         float32 ``[H, D]`` (``spec.action_rows``: anchor .. anchor+H-1 by default)
``action_is_pad``                  bool ``[H]``
``<column>``, ``<column>_is_pad``  float32 ``[T, *shape]`` (int64 for an integer column not normalised),
                                   bool ``[T]``: ``spec.column_offsets`` columns
``<column>`` (anchor row)          float32 ``[*shape]`` (int64 likewise), or ``str`` for a text column:
                                   ``spec.extra_columns``
``<column>_dim_is_pad``            bool ``[D]``: padded dimensions, for columns padded to a common
                                   width in a mix (``pad_dims``)
``task``                           str, the instruction
``episode_index``                  int, episode index in its source dataset
``frame_index``, ``timestamp``     int and float (seconds) of the anchor row
``dataset``                        int, position of the dataset in the mix (always present)
``substitute``                     bool: True for a repeat of the worker's previous sample that
                                   stands in for a window of a shard that failed to fetch
                                   (``FetchPolicy(on_shard_error="skip")``)
``__telemetry__``                  float64 counters of the worker (only with ``ReadOptions(telemetry=True)``)
=================================  =========================================================

Columns keep the per-row shape the dataset stores (the manifest's ``features``): ``[D]`` for a
list column, ``[1]`` for a scalar one (as LeRobot declares scalars), ``[2, 3]`` for a list of
lists; a window adds ``T`` in front and a batch ``B``, the same shape in the sample, the batch,
``delta_timestamps`` windows and their padded rows. State and action are such columns too
(``[T_s, D]`` and ``[H, D]`` for 1-D ones). A column that cannot be returned (absent from a dataset,
text outside ``extra_columns``, binary or nested structures) is refused when the ``WindowDataset``
is made, naming the dataset and the column (``stream.mix.check_columns``).

Distribution: rank and world size come from ``torch.distributed`` when it is initialised (or
``ranks=Ranks(rank, world_size)``, ``stream.options``); the worker from ``torch.utils.data.get_worker_info()``. Every
rank yields the same number of samples per epoch (see ``stream.plan``).

Epochs: each ``__iter__`` runs the next epoch of the object it is called on. With a plain
``DataLoader`` and non-persistent workers, call ``set_epoch(e)`` before each epoch (as with
``DistributedSampler``); ``WindowLoader`` does this for you.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
import warnings
from typing import Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from epishard.redact import scrubbed, scrubbing

from .buffers import (
    RECYCLE_BYTES,
    HeldBatches,
    RecycledBatches,
    SlotFlags,
    batch_allowance,
    recycle_slots,
    ring_slots,
)
from .collate import BufferedCollate, FloatCollate
from .fetch import FetchPolicy
from .lookahead import Lookahead
from .memory import limit_worker_arenas
from .mix import mix_layout, normalizers
from .mixplan import BatchByDataset, mix_table
from .options import Mixing, Ranks, ReadOptions, Stages
from .plan import (
    EpochCuts,
    EpochInputs,
    GlobalShuffle,
    Progress,
    WorkerPlan,
    World,
    anchor_counts,
    epoch_cuts,
    level_plan,
    plan_shape,
    worker_plan,
)
from .reader import EpochReader, ReadContext, episode_bytes, locate, sample_frame_bytes
from .resume import Cursor, Resume, checked_states, load_state, state_dict
from .select import Selection, explain_empty, select_episodes
from .shuffle import budget_shuffle_episodes
from .source import DatasetSource
from .spec import WindowSpec
from .stages import ConsumerStages
from .statecheck import plan_digest
from .telemetry import Telemetry
from .transform import PostProcess

__all__ = ["WindowDataset", "WindowLoader"]


def _check_selected(
    sources: list[DatasetSource], selections: list[Selection | None], selected: list[np.ndarray], per_dataset: bool
) -> None:
    """Refuse a read-time selection that keeps no episode (an empty dataset would train on nothing, silently).

    A selection given per dataset (a list) must keep an episode of its dataset; one given for the
    whole mix must keep an episode of some dataset, and a dataset it keeps none of is warned about.

    Raises:
        ValueError: naming the dataset(s) and the selection, with how many episodes each criterion keeps.
    """
    empty = [
        (source, sel, keep)
        for source, sel, keep in zip(sources, selections, selected, strict=True)
        if sel is not None and source.index.num_episodes and not keep.any()
    ]
    if not empty:
        return
    why = "; ".join(f"{source.shown}: {explain_empty(source.index, sel)}" for source, sel, _ in empty if sel)
    if per_dataset or len(empty) == len(sources):
        raise ValueError(f"select= matches no episode: {why}")
    warnings.warn(f"select= keeps no episode of a dataset of the mix, which gives no windows: {why}", stacklevel=3)


class WindowDataset(IterableDataset):
    """Training windows from one or more epishard datasets.

    Args:
        sources: a dataset URL or ``DatasetSource``, or a list of them, or of ``(url, weight)``
            pairs to mix datasets (the weights: ``Mixing.weights``).
        spec: the window (``WindowSpec``). One made from ``delta_timestamps`` (seconds) is turned
            into rows at each dataset's own frame rate (a mix of 20 and 30 fps robots takes one spec;
            ``stream.mix.resolve_specs``); an offset off a dataset's frame grid is refused, naming
            the dataset, the key and the nearest allowed time.
        seed: base seed; the plan is a pure function of (seed, epoch, world size, rank, workers).
        shuffle: episodes per shuffle pool (``stream.shuffle.pool_shuffle``): each consumer's windows
            are permuted within consecutive pools of that many episodes in read order. Small: an
            episode's windows close together in time (one decode serves several), fewer distinct
            episodes per batch; large: diversity near i.i.d. ``None``: one pool (all of the
            consumer's episodes); ``0``: read order. ``"global"``: every window of the epoch dealt
            at random to every rank and worker (``stream.plan.GlobalShuffle``: a batch drawn from
            the whole dataset, as i.i.d.; each window decoded on its own). ``"auto"`` (default): the
            most episodes whose frames the look-ahead frame cache holds (``Lookahead.frame_cache_bytes``),
            at most ``8 x batch_size`` (at least 0.94 of i.i.d.'s distinct episodes per batch; 512 when
            the batch size is unknown) and at least the pool that keeps 0.92 of a batch distinct
            (``stream.shuffle.budget_shuffle_episodes``).
        ranks: this process's rank, the world size and the DataLoader workers (``Ranks``; None:
            ``torch.distributed``'s when initialised, else rank 0 of 1).
        batch_size: the per-rank batch size, when known before a ``WindowLoader`` gives its own:
            it sizes the ``"auto"`` shuffle pool and the first look-ahead chunk, and
            ``Mixing.batch_by_dataset`` needs it.
        postprocess: per-frame ``PostProcess`` (resize, crop, dtype, hook).
        normalize: column -> ``"mean_std"`` | ``"min_max"``, from the manifest statistics.
        select: which episodes to plan (``stream.select.Selection``): one for all datasets, or a
            list with one per dataset (None: all). Read from the index only.
        mix: how the datasets of a mix share an epoch (``Mixing``: weights, epoch length, batches
            of one dataset, stratified deal, camera map, padded widths).
        stages: declared plan stages (``Stages``: a cost per window, attached to every sample as
            ``__cost__``; a new yield order per consumer; a deal in place of the plan's cut); pure
            functions of the plan, so every guarantee of the plan holds
            (``balance.streaming.BalancedWindowDataset`` sets them).
        read: how bytes are fetched and decoded and what samples carry (``ReadOptions``: storage
            options, ``FetchPolicy``, ``Lookahead``, ``defer_float``, ``telemetry``).

    Raises:
        ValueError: ``shuffle`` neither ``"auto"``, ``"global"``, ``None`` nor an int >= 0 (or
            ``"global"`` with a deal stage); a negative dataset
            weight; ``select`` of another length than the datasets; a selection that keeps no
            episode; and what ``stream.mix.mix_layout`` refuses.

    The work is split by job: ``stream.mixplan.mix_table`` (the planner's table of the mix),
    ``stream.plan`` (the epoch plan), ``stream.reader`` (a worker's read loop), ``stream.resume``
    (states and mid-epoch resume).
    """

    def __init__(
        self,
        sources,
        spec: WindowSpec,
        *,
        seed: int = 0,
        shuffle: int | Literal["auto", "global"] | None = "auto",
        ranks: Ranks | None = None,
        batch_size: int | None = None,
        postprocess: PostProcess | None = None,
        normalize: dict[str, str] | None = None,
        select: Selection | list[Selection | None] | None = None,
        mix: Mixing | None = None,
        stages: Stages | None = None,
        read: ReadOptions | None = None,
    ):
        super().__init__()
        if not (shuffle in ("auto", "global", None) or (isinstance(shuffle, int) and shuffle >= 0)):
            raise ValueError(
                f"shuffle must be 'auto', 'global', None or an int >= 0 (episodes per pool), not {shuffle!r}"
            )
        self.ranks, self.mix = ranks or Ranks(), mix or Mixing()
        self.stages, self.read = stages or Stages(), read or ReadOptions()
        if shuffle == "global":
            if self.stages.deal is not None:
                raise ValueError("shuffle='global' deals the windows itself: it takes no Stages(deal=...)")
            self.stages = dataclasses.replace(self.stages, deal=GlobalShuffle())
        items = sources if isinstance(sources, list) else [sources]
        pairs = [item if isinstance(item, tuple) else (item, 1.0) for item in items]
        self.fetch = self.read.fetch or FetchPolicy()
        self.lookahead = self.read.lookahead or Lookahead()
        storage = self.read.storage_options
        self.sources = [s if isinstance(s, DatasetSource) else DatasetSource(s, storage, self.fetch) for s, _ in pairs]
        self.weights = [float(w) for _, w in pairs]
        if any(w < 0 for w in self.weights):
            raise ValueError(f"dataset weights must not be negative: {self.weights}")
        self.spec, self.seed, self.shuffle = spec, seed, shuffle
        self.num_workers = self.ranks.num_workers
        self.post = postprocess or PostProcess()
        self.telemetry, self.defer_float = self.read.telemetry, self.read.defer_float
        m = self.mix
        self.layout = mix_layout(self.sources, spec, self.post, m.camera_map, m.pad_dims, tuple(normalize or {}))
        self.cam_offsets = self.layout.offsets  # per dataset: its camera keys -> offsets
        self.normalizers = [  # per dataset, per source in it: column -> Normalizer
            {name: normalizers(s.manifest, normalize, name) for name in set(s.index.episode_column("source"))}
            for s in self.sources
        ]
        selections = select if isinstance(select, list) else [select] * len(self.sources)
        if len(selections) != len(self.sources):
            raise ValueError(f"select has {len(selections)} entries for {len(self.sources)} datasets")
        # Bool [num_episodes] per dataset, from the index alone (kept as arrays: ``where`` callables
        # need not pickle into DataLoader workers).
        self.selected = [select_episodes(s.index, sel) for s, sel in zip(self.sources, selections, strict=True)]
        _check_selected(self.sources, selections, self.selected, isinstance(select, list))
        self.batch_size = batch_size
        if batch_size is not None:
            self.layout.check_batchable()  # frames of several sizes cannot be stacked into a batch
        self.stratify = (len(self.sources) > 1 if m.stratify is None else m.stratify) or m.batch_by_dataset
        # The planner's table of the mix; episode_base: int64 [datasets + 1], each one's first global episode.
        self.table, self.episode_base, self.weights = mix_table(
            spec,
            [s.index for s in self.sources],
            self.layout.specs,
            self.cam_offsets,
            self.selected,
            self.weights,
            [len(s.shards) for s in self.sources],
            stratify=self.stratify,
            probability=m.weights == "probability",
            epoch_length=m.epoch_length,
            names=[s.shown for s in self.sources],
        )
        # Bool [global episodes]: those of a shard its source failed on open (its size check); they
        # stay planned, are never fetched or decoded, and each of their windows is a substitute.
        self._failed = np.concatenate([np.zeros(0, dtype=bool), *[s.failed_episodes() for s in self.sources]])
        self.epoch = 0
        self.cursor = Cursor()  # where the iteration stands (``stream.resume``; a worker's copy has its own)
        self._costs: np.ndarray | None = None
        self._per_consumer: dict[tuple, int] = {}  # windows_per_consumer's last answer
        self._shared: EpochCuts | None = None  # set_epoch's shared plan part, inherited by forked workers
        self._live_bytes: tuple[int, int] | None = None  # reader.episode_bytes, once computed
        # The frame cache the default shuffle pool is sized by: the dataset's own, also in a loader's
        # view whose cache makes room for its batch buffers (``WindowLoader``), so the plan is one.
        self._pool_cache_bytes = self.lookahead.frame_cache_bytes
        # Windows' picture frames as ``LazyFrames``, for a collate that writes them into the batch
        # (``WindowLoader`` with recycled buffers, ``with_options(lazy_frames=True)``); never for samples
        # the user takes.
        self._lazy_frames = False
        self._first_chunk = batch_size  # the first look-ahead chunk: one batch (WindowLoader's by default)

    def with_options(
        self,
        *,
        defer_float: bool | None = None,
        num_workers: int | None = None,
        batch_size: int | None = None,
        frame_cache_bytes: int | None = None,
        lazy_frames: bool | None = None,
    ) -> WindowDataset:
        """A shallow copy with these options changed (the indexes and plan are shared, not rebuilt).

        ``batch_size``: the loader's, taken by ``batch_by_dataset`` when the dataset was given none.
        ``frame_cache_bytes``: the look-ahead's decoded-frame cache (``Lookahead``); the plan, the
        shuffle pool included, stays the one of this dataset's own cache. ``lazy_frames``: samples
        carry a window's frames kept as pictures as ``stream.lookahead.LazyFrames``, which only a
        collate that writes them (``stream.collate.BufferedCollate``) may receive.
        """
        other = copy.copy(self)
        other.cursor = copy.copy(self.cursor)  # its own position (the pending resume, if any, copied)
        if lazy_frames is not None:
            other._lazy_frames = lazy_frames
        if frame_cache_bytes is not None:
            other.lookahead = dataclasses.replace(self.lookahead, frame_cache_bytes=frame_cache_bytes)
        if defer_float is not None:
            other.defer_float = defer_float
        if num_workers is not None:
            other.num_workers = num_workers
        if batch_size is not None and not other.batch_size:  # batch_by_dataset's and the shuffle pool's
            other.batch_size = batch_size
        if batch_size is not None:
            other._first_chunk = batch_size
        return other

    # --- planning (``stream.plan``) -------------------------------------------------------------

    def _group(self) -> BatchByDataset | None:
        """``batch_by_dataset``'s group stage (``stream.mixplan.BatchByDataset``), else None.

        Raises:
            ValueError: ``batch_by_dataset`` without a batch size.
        """
        if not self.mix.batch_by_dataset:
            return None
        if not self.batch_size:
            raise ValueError("batch_by_dataset needs the batch size: WindowDataset(..., batch_size=B) or WindowLoader")
        return BatchByDataset(np.repeat(np.arange(len(self.sources)), np.diff(self.episode_base)), self.batch_size)

    def pool_episodes(self, batch_size: int | None = None) -> int | None:
        """The shuffle pool in effect (``shuffle`` with ``"auto"`` resolved by the batch size).

        ``batch_size``: the loader's, when this dataset was given none (``state_dict`` for a loader).
        """
        if self.shuffle == "global":  # no pool: the global deal orders every consumer's windows
            return None
        if self.shuffle != "auto":
            return self.shuffle
        if self._live_bytes is None:
            self._live_bytes = episode_bytes(self.sources, self.cam_offsets, self.post)
        live, per_window = self._live_bytes
        chunk = self.lookahead.horizon * per_window
        return budget_shuffle_episodes(self.batch_size or batch_size, live, self._pool_cache_bytes, chunk)

    def _consumer_stages(self) -> ConsumerStages:
        s = self.stages
        return ConsumerStages(self.pool_episodes(), s.cost, s.order, self._group(), s.deal)

    def epoch_inputs(self, epoch: int) -> EpochInputs:
        """What ``epoch``'s plan is a pure function of, besides the layout (``stream.plan.EpochInputs``).

        The episode table, the spec's stride and sampling, the seed and ``epoch``.
        """
        return EpochInputs(self.table, self.spec.stride, self.spec.sampling, self.seed, epoch)

    def plan(self, epoch: int, world: World, history: tuple[Progress, ...] = ()) -> WorkerPlan:
        """One consumer's windows for ``epoch``, in yield order.

        Consumer ``world.consumer``'s windows for ``epoch`` (global episode numbers), in yield
        order; after ``history`` (earlier layouts' progress), its share of what is left.
        """
        s = self.stages
        return worker_plan(
            self.epoch_inputs(epoch),
            world=world,
            shuffle_episodes=self.pool_episodes(),
            cost=s.cost,
            order=s.order,
            group=self._group(),
            history=history,
            shared=self._shared,
            deal=s.deal,
        )

    def windows_per_consumer(
        self, epoch: int, world_size: int, num_workers: int, history: tuple[Progress, ...] = ()
    ) -> int:
        """Windows each (rank, worker) yields in ``epoch``.

        Windows each (rank, worker) yields in ``epoch`` (after ``history``): the planner's count
        (with ``batch_by_dataset``, per dataset rounded down to whole batches).

        Remembered per arguments (a resumed epoch's count replays the earlier layouts' yield orders,
        and ``state_dict`` asks at every checkpoint).
        """
        key = (epoch, world_size, num_workers, history, self.batch_size)
        if key not in self._per_consumer:
            self._per_consumer = {key: self._count(epoch, world_size * num_workers, history, num_workers)}
        return self._per_consumer[key]

    def _count(self, epoch: int, consumers: int, history: tuple[Progress, ...], num_workers: int = 1) -> int:
        stages, group = self._consumer_stages(), self._group()
        if not history and self.stages.deal is None:  # from counts alone: O(episodes), no window listed
            per, _ = plan_shape(self.epoch_inputs(epoch), consumers)
            return int(per.sum()) if group is None else int(np.sum(per // group.batch_size * group.batch_size))
        plan = level_plan(
            self.epoch_inputs(epoch),
            consumers=consumers,
            stages=stages,
            history=history,
            num_workers=num_workers,
        )
        if group is None:
            return plan.per_consumer
        # Every consumer holds as many windows of each dataset (the deal is per stratum).
        return group.kept(plan.episode[plan.consumer_slice(0)])

    def samples_per_rank(self, num_workers: int | None = None, world_size: int | None = None, epoch: int = 0) -> int:
        """Samples every rank yields in ``epoch`` (the same on all ranks)."""
        world = world_size or self.ranks.world().world_size
        workers = max(num_workers if num_workers is not None else (self.num_workers or 0), 1)
        return self.windows_per_consumer(epoch, world, workers) * workers

    def __len__(self) -> int:
        return self.samples_per_rank(epoch=self.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` on the next ``__iter__`` (call before each epoch with non-persistent workers).

        When the worker count is known (``WindowLoader`` sets it), the epoch's shared plan part
        (``stream.plan.epoch_cuts``, O(episodes)) is computed here, once per rank, before the
        DataLoader forks: each worker then plans only its own windows.
        """
        self.epoch = epoch
        self._shared = None
        if self.num_workers is not None and self.stages.deal is None:  # a deal stage plans from the whole list
            consumers = self.ranks.world().world_size * max(self.num_workers, 1)
            self._shared = epoch_cuts(self.epoch_inputs(epoch), consumers)

    # --- iteration (``stream.reader``) ----------------------------------------------------------

    def locate(self, episode: int) -> tuple[int, int]:
        """``(dataset, episode in it)`` of a global episode number."""
        return locate(self.episode_base, episode)

    def read_context(self) -> ReadContext:
        """What the read loop of an iteration takes from this dataset (``stream.reader.ReadContext``)."""
        return ReadContext(
            sources=self.sources,
            spec=self.spec,
            layout=self.layout,
            cam_offsets=self.cam_offsets,
            normalizers=self.normalizers,
            post=self.post,
            episode_base=self.episode_base,
            fetch=self.fetch,
            lookahead=self.lookahead,
            defer_float=self.defer_float,
            failed=self._failed,
            first_chunk=self._first_chunk,
            lazy_frames=self._lazy_frames,
            emit=self._emit,
        )

    @scrubbed  # an error while iterating names no credentials (in a worker: before torch formats it)
    def __iter__(self):
        here = self.ranks.world()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            limit_worker_arenas()
        epoch = self.epoch
        start, consumer, skip = self.cursor.begin(epoch, workers, worker)
        self.epoch += 1  # the next __iter__ of this object (a persistent worker's copy too) runs the next epoch
        telemetry = Telemetry(worker)
        t0 = time.perf_counter()
        world = here.with_worker(consumer, workers)
        plan = self.plan(epoch, world, start.history)
        self._costs = plan.cost
        first = world.consumer == 0
        telemetry.add(
            plan_s=time.perf_counter() - t0,
            windows_dropped=plan.dropped if first else 0,
            episodes_without_windows=int(
                np.sum(anchor_counts(self.table.lo, self.table.hi, self.spec.stride, self.table.gaps) == 0)
            )
            if first
            else 0,
        )
        # Scrubbed as they are read: this method returns the generator and runs none of it.
        return scrubbing(EpochReader(self.read_context()).samples(plan, skip, telemetry))

    def _emit(self, sample: dict, telemetry: Telemetry) -> dict:
        """``sample`` as yielded: counted, with its telemetry and planned cost when asked for."""
        telemetry.add(samples=1, substitutes=int(sample["substitute"]))
        if self.telemetry:
            sample = dict(sample, __telemetry__=telemetry.tensor())
        if self._costs is not None:  # the planned window's predicted cost (a substitute's too)
            sample = dict(sample, __cost__=float(self._costs[self.cursor.consumed]))
        self.cursor.consumed += 1
        return sample

    # --- resume (``stream.resume``) -------------------------------------------------------------

    def state_dict(
        self,
        batches: int | None = None,
        batch_size: int | None = None,
        num_workers: int = 0,
        epoch: int | None = None,
        start: Resume | None = None,
    ) -> dict:
        """Position of this rank in the current epoch, for ``load_state_dict`` (``stream.resume.state_dict``).

        Without arguments (iteration in this process, ``num_workers=0``): the samples yielded so far.
        ``WindowLoader.state_dict`` passes the ``batches`` consumed since ``start``, ``batch_size``,
        ``num_workers`` and the epoch it is in.
        """
        return state_dict(self, batches, batch_size, num_workers, epoch, start)

    @functools.cached_property
    def plan_digest(self) -> str:
        """Fingerprint of this reader's episode table and window spec (a state's ``"plan_digest"``).

        A mid-epoch state saved under another one (another dataset, selection or spec) is refused.
        """
        t = self.table
        arrays = [t.shard, t.lo, t.hi, t.weight, t.stratum, t.gaps]
        if self.shuffle == "global":  # the same windows in another order: its states are not another plan's
            return plan_digest(arrays, self.spec.stride, self.spec.sampling, "global")
        return plan_digest(arrays, self.spec.stride, self.spec.sampling)

    def load_state_dict(self, state: dict | list[dict], num_workers: int = 0) -> None:
        """Continue exactly where ``state`` was taken (``stream.resume.load_state``).

        ``state``: this rank's state (from the same layout), or the states of **every** rank of the
        run that saved them, as a list (any layout: elastic resume).

        Raises:
            StateError (a ``ValueError``; ``StateTypeError`` also a ``TypeError``): a field of a state
                is missing, of the wrong type, or out of range for this plan (``checked_states``).
            ValueError: the states were saved with another seed, or disagree (epoch, layout), or
                the layout changed and not every rank's state was given.
        """
        load_state(self, state, num_workers)

    def checked_states(self, state: object) -> list[dict]:
        """The states given to ``load_state_dict``, every field checked (``stream.resume.checked_states``).

        Raises:
            StateError / StateTypeError: naming the field (and the state of the list).
            ValueError: another seed.
        """
        return checked_states(self, state)


def _refuse_loader_options(kw: dict) -> None:
    """Refuse the ``DataLoader`` keywords that would break exact-once or exact resume, naming each.

    ``drop_last=True``: every worker drops its own last partial batch, so windows of the plan are
    lost silently (up to ``num_workers x (batch_size - 1)`` per epoch). ``in_order=False``: batches
    come in the order workers finish them, and a state counts batches per worker in round-robin
    order. ``sampler``, ``batch_sampler`` and ``shuffle`` are refused by torch itself for an
    iterable dataset, naming the option (the plan orders the windows). Any other keyword keeps both
    contracts (``multiprocessing_context``, ``generator``, ``worker_init_fn``, ``timeout``, ...).

    Raises:
        ValueError: naming the option, why, and what to do instead.
    """
    if kw.get("drop_last"):
        raise ValueError(
            "WindowLoader: drop_last=True is refused: each DataLoader worker would drop its own last partial "
            "batch, losing windows of the plan silently (up to num_workers x (batch_size - 1) per epoch); every "
            "batch but a worker's last is full anyway: drop a short batch in your loop if you must"
        )
    if kw.get("in_order", True) is False:
        raise ValueError(
            "WindowLoader: in_order=False is refused: batches would come in the order workers finish them, and "
            "exact resume counts each worker's batches in the DataLoader's round-robin order"
        )


class WindowLoader(DataLoader):
    """A ``DataLoader`` over a ``WindowDataset`` with exact and elastic mid-epoch resume.

    A ``DataLoader`` over a ``WindowDataset`` that tracks epochs and consumed batches, so that
    ``state_dict()`` / ``load_state_dict()`` resume exactly mid-epoch with any ``num_workers``, and
    under another world size or worker count given every rank's state (elastic resume).

    Exactness relies on the DataLoader's in-order round-robin over workers (the default,
    ``in_order=True``) and on every worker of a rank holding the same number of windows: the
    keywords that would break it (``drop_last=True``, ``in_order=False``) raise ``ValueError``
    naming them; torch refuses ``sampler``, ``batch_sampler`` and ``shuffle`` for an iterable
    dataset; every other ``DataLoader`` keyword is passed on.

    The loader iterates its own shallow copy of ``dataset`` (``loader.dataset``; the argument is not
    changed). ``defer_float`` (default: when the post-processing's dtype is a float and no
    ``collate_fn`` is given): frames stay uint8 in the workers and become float while copied into
    the batch (``FloatCollate``).

    ``reuse_buffers=k`` (default 0: off): batches are written into a few reused, pre-faulted buffers
    per worker instead of fresh shared memory (``stream.buffers``; no page faults per batch; the same
    values). A batch then stays valid only until ``k`` more batches are drawn: ``.clone()`` what you
    keep longer (a batch still referenced when its buffer comes round again is warned about once).
    Memory: ``ceil(k / num_workers) + prefetch_factor`` batches per worker, held for the workers'
    life (use ``persistent_workers=True``). With ``pin_memory=True`` and an accelerator the pin
    thread copies each batch into pinned memory, whose lifetime is torch's; without an accelerator
    ``pin_memory`` does nothing (torch warns). Raises ``ValueError`` with a ``collate_fn`` of yours or
    ``batch_size=None``.

    ``recycle_buffers`` (default ``None``: on with DataLoader workers, epishard's own collate, a
    ``batch_size``, no ``pin_memory`` and no ``reuse_buffers``, while a worker's ring fits its share
    of the worker's memory; ``True``: on whatever the ring's size; ``False``: off): each worker
    writes its batches into a ring of ``prefetch_factor + 1`` pre-faulted buffers (``+ 2`` with one
    worker) instead of fresh shared memory, and a buffer is written again only when
    nothing of the batch it held is referenced in this process any more (``buffers.RecycledBatches``
    counts the storage's references: a batch, a view, ``.numpy()`` or ``.detach()`` of it kept); a
    batch whose buffer is still held goes into fresh memory. So, unlike ``reuse_buffers``, batches
    keep their values for as long as they are held, and the page faults of fresh memory are saved
    whenever the training loop drops each batch before the next few come.

    Memory, by default (the dataset given no ``Lookahead`` of its own): a worker's batches in flight
    and its look-ahead frame cache share ``buffers.READ_ALLOWANCE`` (960 MiB; ``buffers.batch_allowance``).
    Batches that leave the default cache room (640x480 uint8: a 190 MiB ring) change nothing; larger
    ones (640x480 float32: a 760 MiB ring) are recycled while the ring leaves the cache at least
    ``buffers.FRAME_CACHE_FLOOR`` (128 MiB) and the cache shrinks to what they leave; larger still
    (1280x720 float32) go into fresh memory and the cache makes room for the one being written. The
    plan, its shuffle pool included, is the dataset's either way. Without a batch size, or with a
    ``Lookahead`` given, the ring holds at most ``buffers.RECYCLE_BYTES`` (256 MiB).

    Persistent workers keep their own copy of the dataset, which can only run the epoch after the
    one it ran last; when the next iteration must run anything else (after ``load_state_dict``, or
    after an epoch left unfinished) the workers are restarted, so every iteration runs exactly the
    epoch ``state_dict()`` reports. An unfinished epoch is run again from its start (as without
    persistent workers) unless a state is loaded.
    """

    dataset: WindowDataset  # its own copy of the dataset given

    def __init__(
        self,
        dataset: WindowDataset,
        batch_size: int = 1,
        *,
        defer_float: bool | None = None,
        reuse_buffers: int = 0,
        recycle_buffers: bool | None = None,
        **kw,
    ):
        _refuse_loader_options(kw)
        floating = dataset.post.dtype.is_floating_point
        ours = "collate_fn" not in kw  # epishard's own collate
        if ours and batch_size is not None:
            dataset.layout.check_batchable()  # frames of several sizes cannot be stacked into a batch
        if defer_float is None:
            defer_float = floating and ours and batch_size is not None
        defer_float = bool(defer_float and floating)
        # Depth cameras stay uint16 (``PostProcess.prepare_depth``): not converted, not scaled.
        rgb = sorted(c for c, depth in dataset.layout.depth.items() if not depth) if defer_float else []
        workers = kw.get("num_workers", 0)
        self._held: HeldBatches | None = None
        self._recycled: RecycledBatches | None = None
        if reuse_buffers and recycle_buffers:
            raise ValueError("WindowLoader: reuse_buffers and recycle_buffers exclude each other: choose one")
        if reuse_buffers:
            if reuse_buffers < 0 or not ours or batch_size is None:
                raise ValueError(
                    f"WindowLoader: reuse_buffers={reuse_buffers} needs an int >= 0, a batch_size and "
                    "epishard's own collate (no collate_fn)"
                )
            slots = ring_slots(reuse_buffers, workers, kw.get("prefetch_factor"))
            kw["collate_fn"] = BufferedCollate(rgb, dataset.post.dtype, dataset.post.scale, slots=slots)
            if not (kw.get("pin_memory") and torch.accelerator.is_available()):  # else batches are pinned copies
                self._held = HeldBatches(slots * max(workers, 1), reuse_buffers)
            recycle_buffers = False
        if recycle_buffers and (not ours or batch_size is None or workers < 1):
            raise ValueError(
                "WindowLoader: recycle_buffers=True needs DataLoader workers (num_workers >= 1), a batch_size "
                "and epishard's own collate (no collate_fn)"
            )
        frame_cache = None  # the look-ahead's frame cache in this loader's view (None: the dataset's)
        if recycle_buffers is None:  # the default: on where it applies, within the worker's allowance
            recycle_buffers = workers > 0 and ours and batch_size is not None and not kw.get("pin_memory")
            cap = RECYCLE_BYTES
            if batch_size is not None and dataset.read.lookahead is None:  # the reading budget is ours to split
                batch = batch_size * sample_frame_bytes(dataset.sources, dataset.cam_offsets, dataset.post)
                ring = recycle_slots(workers, kw.get("prefetch_factor")) * batch
                cap, frame_cache = batch_allowance(dataset.lookahead.frame_cache_bytes, batch, ring, recycle_buffers)
        else:
            cap = 1 << 62  # asked for: whatever the ring's size
        if recycle_buffers:
            self._recycling_frames = sorted(dataset.layout.depth)  # the cameras: only their frames are recycled
            slots = recycle_slots(workers, kw.get("prefetch_factor"))
            flags = SlotFlags(workers, slots)
            self._recycling = BufferedCollate(
                rgb,
                dataset.post.dtype,
                dataset.post.scale,
                slots=slots,
                flags=flags,
                max_bytes=cap,
                frames=list(self._recycling_frames),
            )
            kw["collate_fn"] = self._recycling  # (a wrapper set later, e.g. a timer, keeps calling it)
            self._recycled = RecycledBatches(flags, self._recycling_frames)
        elif defer_float and ours and not reuse_buffers:
            kw["collate_fn"] = FloatCollate(rgb, dataset.post.dtype, dataset.post.scale)
        view = dataset.with_options(
            defer_float=defer_float,
            num_workers=kw.get("num_workers", 0),
            batch_size=batch_size,
            frame_cache_bytes=frame_cache,
            # The recycled ring's collate converts kept pictures straight into the batch.
            lazy_frames=bool(recycle_buffers) and (defer_float or not floating),
        )
        super().__init__(view, batch_size=batch_size, **kw)
        self._epoch = view.epoch
        self._batches = 0
        self._start = view.cursor.pending or Resume(view.epoch)  # where this loader's run of the epoch begins
        self._workers_next: int | None = None  # the epoch persistent workers run on their next iteration
        self._running: object | None = None  # token of the iteration in progress

    def __len__(self) -> int:
        """Batches this rank yields in the loader's epoch (samples without a ``batch_size``).

        Every worker batches its own share of the windows and ends on its own partial batch, so this
        is ``workers * ceil(windows per worker / batch_size)``; torch's ``ceil(samples / batch_size)``
        would count one partial batch for all of them (3 for 2 workers of 12 windows in batches of 8,
        which yield 8, 8, 4, 4).
        """
        ds = self.dataset
        if self.batch_size is None:
            return len(ds)
        workers = max(self.num_workers, 1)
        per_worker = ds.windows_per_consumer(self._epoch, ds.ranks.world().world_size, workers)
        return workers * -(-per_worker // self.batch_size)

    @scrubbed  # a worker's error, re-raised here with its traceback as text, names no credentials
    def __iter__(self):
        if self._iterator is not None and (
            self._workers_next != self._epoch or self.dataset.cursor.pending is not None
        ):
            # Their dataset copies cannot run this epoch. A private method of torch's multi-process
            # iterator (the only way to stop persistent workers); typed on the subclass only.
            self._iterator._shutdown_workers()  # type: ignore[attr-defined]
            self._iterator = None
        if self._iterator is None:
            self.dataset.set_epoch(self._epoch)
        if self._recycled is not None and (self._iterator is None or not self.persistent_workers):
            # New workers, new rings: new flags (a worker still stopping keeps the old ones, which stay set).
            flags = SlotFlags(self.num_workers, self._recycling.buffers.slots)
            self._recycling.flags = flags
            self._recycled = RecycledBatches(flags, self._recycling_frames)
        resume = self.dataset.cursor.pending
        self._start = resume if resume is not None and resume.epoch == self._epoch else Resume(self._epoch)
        self._batches = 0
        self._running = token = object()
        batches = None
        if self._recycled is not None:
            # Free the slots of last epoch's batches dropped since the last one came, before persistent
            # workers write the new epoch's first batches (a slot still flagged sends its batch into
            # fresh memory: one batch more per worker at every epoch change).
            self._recycled.poll()
        try:
            batches = super().__iter__()  # starts the workers with the dataset as it is now
            self.dataset.cursor.pending = None  # taken by the workers' copies (or by this process's iteration)
            self._workers_next = self._epoch + 1
            for batch in batches:
                if self._held is not None:
                    self._held.received(batch)
                if self._recycled is not None:
                    self._recycled.received(batch)
                self._batches += 1
                yield batch
            self._epoch += 1
            self._batches = 0
            self._start = Resume(self._epoch)
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):
                self._stop_workers(batches)
            raise
        finally:
            if self._running is token:
                self._running = None

    @property
    def epoch(self) -> int:
        """The epoch the loader's next (or current) iteration runs: the resumed one after ``load_state_dict``."""
        return self._epoch

    def worker_pids(self) -> list[int]:
        """Process ids of the DataLoader workers now running (persistent ones between epochs), else ``[]``.

        Read from torch's multi-process iterator (a private member of torch: for diagnostics and
        benchmarks only).
        """
        workers = getattr(self._iterator, "_workers", None) or []
        return [w.pid for w in workers]

    def _stop_workers(self, batches) -> None:
        """Stop the workers of an iteration an error ends (a worker's or the user's), now.

        The error's traceback holds the torch iterator in a reference cycle; left to the garbage
        collector, its shutdown waits 5 s per worker for workers that never get the stop signal.
        Persistent workers are stopped too (their epoch is left unfinished; the next iteration
        starts new ones, as after a ``break``).
        """
        shutdown = getattr(batches, "_shutdown_workers", None)  # torch's multi-process iterator (private)
        if shutdown is not None:
            shutdown()
        if batches is not None and self._iterator is batches:
            self._iterator = None

    def state_dict(self) -> dict:
        """This rank's position (see ``WindowDataset.state_dict``).

        This rank's position (see ``WindowDataset.state_dict``). To resume under another world
        size or worker count, save every rank's state and load them all (a list).
        """
        start = self._start if self._start.epoch == self._epoch else Resume(self._epoch)
        return self.dataset.state_dict(self._batches, self.batch_size, self.num_workers, self._epoch, start)

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Continue from ``state`` (this rank's, or a list of every rank's) on the next iteration.

        Raises:
            RuntimeError: an iteration over this loader is in progress (it would go on with its own
                epoch); load before the ``for`` loop, or after it ended or was dropped.
            ValueError (``StateError``; ``StateTypeError`` is also a ``TypeError``): see
                ``WindowDataset.load_state_dict``.
        """
        if self._running is not None:
            raise RuntimeError(
                "WindowLoader.load_state_dict during an iteration over the loader: the running "
                "iteration would go on with its own epoch. Load the state before the for loop "
                "(or after it ended, or after deleting its iterator)."
            )
        self.dataset.load_state_dict(state, self.num_workers)  # an epoch boundary's state too
        self._batches, self._epoch = 0, self.dataset.epoch
        self._start = self.dataset.cursor.pending or Resume(self._epoch)
