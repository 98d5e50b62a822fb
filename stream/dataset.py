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
``__telemetry__``                  float64 counters of the worker (only with ``telemetry=True``)
=================================  =========================================================

Columns keep the per-row shape the dataset stores (the manifest's ``features``): ``[D]`` for a
list column, ``[1]`` for a scalar one (as LeRobot declares scalars), ``[2, 3]`` for a list of
lists; a window adds ``T`` in front and a batch ``B``, the same shape in the sample, the batch,
``delta_timestamps`` windows and their padded rows. State and action are such columns too
(``[T_s, D]`` and ``[H, D]`` for 1-D ones). A column that cannot be returned (absent from a dataset,
text outside ``extra_columns``, binary or nested structures) is refused when the ``WindowDataset``
is made, naming the dataset and the column (``stream.mix.check_columns``).

Distribution: rank and world size come from ``torch.distributed`` when it is initialised (or the
``rank``/``world_size`` arguments); the worker from ``torch.utils.data.get_worker_info()``. Every
rank yields the same number of samples per epoch (see ``stream.plan``).

Epochs: each ``__iter__`` runs the next epoch of the object it is called on. With a plain
``DataLoader`` and non-persistent workers, call ``set_epoch(e)`` before each epoch (as with
``DistributedSampler``); ``WindowLoader`` does this for you.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import time
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from epishard.format.opening import NotConverted, lerobot_instead
from epishard.redact import scrubbed

from .buffers import RECYCLE_BYTES, HeldBatches, RecycledBatches, SlotFlags, recycle_slots, ring_slots
from .collate import BufferedCollate, FloatCollate
from .decode import DecodeError
from .episode import (
    EpisodeInfo,
    columns_nbytes,
    decode_camera,
    decode_camera_packets,
    read_columns,
    window_rows,
    window_sample,
)
from .fetch import Fetcher, FetchError, FetchPolicy, episode_ranges
from .lookahead import Decode, Demand, Load, Lookahead, Scheduler, Step, Store, frame_key
from .memory import limit_worker_arenas, release_free_memory
from .mix import camera_streams, column_widths, mix_layout, normalizers
from .mixplan import BatchByDataset, probability_factors
from .packets import plan_runs, readable, run_ranges
from .plan import (
    CostStage,
    DealStage,
    EpisodeTable,
    EpochCuts,
    LevelOverrun,
    OrderStage,
    Progress,
    Stages,
    WorkerPlan,
    World,
    anchor_counts,
    budget_shuffle_episodes,
    episode_table,
    epoch_cuts,
    expected_windows,
    level_plan,
    plan_shape,
    worker_plan,
)
from .select import Selection, explain_empty, select_episodes
from .source import DatasetSource
from .spec import WindowSpec
from .statecheck import StateError, bounded, check_digest, check_fields, plan_digest, states_of
from .telemetry import Telemetry
from .transform import PostProcess
from .usercode import from_user_code

# 2: + "history" (progress under earlier layouts of the epoch: elastic resume). 3: + "shuffle_episodes";
# the plan changed (plan-level pool shuffle, counter-based anchor draws), so a mid-epoch state of an
# earlier version cannot continue exactly and is refused (a state at an epoch boundary still loads).
# 4: the plan changed again (a consumer's episodes cut into pools of equal size: ``pool_shuffle``).
STATE_VERSION = 4


def _shuffle_option(
    shuffle_episodes: int | Literal["auto"] | None, shuffle_windows: int | None, shuffle_bytes: int | None
) -> int | Literal["auto"] | None:
    """``shuffle_episodes`` checked, after the deprecated buffer bounds (``shuffle_windows=0``: read order).

    Raises:
        ValueError: not ``"auto"``, ``None`` or an int >= 0.
    """
    if not (shuffle_episodes in ("auto", None) or (isinstance(shuffle_episodes, int) and shuffle_episodes >= 0)):
        raise ValueError(f"shuffle_episodes must be 'auto', None or an int >= 0, not {shuffle_episodes!r}")
    if shuffle_windows is None and shuffle_bytes is None:
        return shuffle_episodes
    warnings.warn(
        "WindowDataset(shuffle_windows=, shuffle_bytes=) bounded a buffer of decoded episodes, which the plan-level "
        "shuffle replaced: use shuffle_episodes (episodes whose windows are interleaved at a time; 0: read order)",
        DeprecationWarning,
        stacklevel=3,
    )
    return 0 if shuffle_windows == 0 else shuffle_episodes


def _distributed(rank: int | None, world_size: int | None) -> World:
    """This process's rank and world size (``worker=0`` of 1).

    The arguments when given, else ``torch.distributed`` when initialised, else rank 0 of 1.
    """
    if rank is not None and world_size is not None:
        return World(rank, world_size)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return World(torch.distributed.get_rank(), torch.distributed.get_world_size())
    return World(rank or 0, world_size or 1)


def open_source(url: str, storage_options: dict | None = None, fetch: FetchPolicy | None = None) -> DatasetSource:
    """``DatasetSource(url, ...)``; a LeRobot dataset or Hub repo id in its place is named as one.

    Raises:
        shardwriter.describe.NotConverted (a FileNotFoundError): ``url`` has no manifest but is a
            LeRobot dataset (``meta/info.json``) or a Hugging Face repo id: run ``epishard convert``.
        and what ``DatasetSource`` raises.
    """
    try:
        return DatasetSource(url, storage_options, fetch)
    except FileNotFoundError:
        hint = lerobot_instead(url, storage_options) if isinstance(url, str) else None
        if hint:
            raise NotConverted(hint) from None
        raise


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


@dataclass(frozen=True)
class Resume:
    """Where a rank's run of an epoch starts (the loader's bookkeeping, from ``load_state_dict``).

    ``history``: complete progress of earlier layouts of the epoch (elastic resume), oldest first;
    the windows left after it are dealt to this layout. ``skip``: windows each consumer of this
    rank (``worker`` order, empty: none) already took of its plan; worker ``w`` continues consumer
    ``(w + rotation) % num_workers`` (the DataLoader's round-robin resumes at batch ``rotation``).
    """

    epoch: int
    history: tuple[Progress, ...] = ()
    skip: tuple[int, ...] = ()
    rotation: int = 0

    @property
    def fresh(self) -> bool:
        """Nothing of the epoch consumed yet."""
        return not self.history and not any(self.skip)


class WindowDataset(IterableDataset):
    """Training windows from one or more epishard datasets.

    Args:
        sources: a dataset URL or ``DatasetSource``, or a list of them, or of ``(url, weight)``
            pairs to mix datasets (see ``weights``).
        spec: the window (``WindowSpec``). One made from ``delta_timestamps`` (seconds) is turned
            into rows at each dataset's own frame rate (a mix of 20 and 30 fps robots takes one spec;
            ``stream.mix.resolve_specs``); an offset off a dataset's frame grid is refused, naming
            the dataset, the key and the nearest allowed time.
        seed: base seed; the plan is a pure function of (seed, epoch, world size, rank, workers).
        shuffle_episodes: the shuffle's one knob (``stream.plan.pool_shuffle``): how many episodes'
            windows are interleaved at a time in each consumer's yield order (consecutive pools of
            that many episodes in read order, windows permuted within a pool). Small: an episode's
            windows close together in time (one decode serves several) but fewer distinct episodes
            per batch; large: diversity near i.i.d. ``None``: the whole consumer's windows (the most
            diverse); ``0``: read order, no shuffle. ``"auto"`` (default): as many episodes as the
            look-ahead frame cache holds the frames of (``lookahead.cache_bytes``), at most ``8 x
            batch_size`` (at least 0.94 of the distinct episodes per batch of i.i.d. sampling; 512
            when the batch size is unknown; ``WindowLoader`` passes its own) and never so few that
            less than 0.92 of a batch is distinct (``stream.plan.budget_shuffle_episodes``; 42 episodes for
            batches of 8: 2 cameras of 640x480 frames do not fit, so frames are evicted and decoded
            again rather than diversity given up).
        shuffle_windows / shuffle_bytes: deprecated (the bounds of the old buffer of decoded
            episodes; a ``DeprecationWarning``): ``shuffle_windows=0`` still means read order, other
            values are ignored (the look-ahead reader bounds its own memory).
        rank / world_size: override ``torch.distributed``.
        num_workers: DataLoader workers, needed only for ``len()`` before iteration.
        postprocess: per-frame ``PostProcess`` (resize, crop, dtype, hook).
        normalize: column -> ``"mean_std"`` | ``"min_max"``, from the manifest statistics.
        telemetry: attach ``__telemetry__`` counters to every sample.
        storage_options: fsspec options for URLs (``DatasetSource``; merged over the environment's).
        fetch: how shard bytes are fetched (``FetchPolicy``: stream or ranged mode, prefetch
            budget, retries, and the shard policy when retries run out).
        stratify: deal each dataset of a mix to the consumers on its own, so every worker of every
            rank reads all datasets in proportion at the same pace (default: True when mixing).
            Each worker then reads one shard per dataset side by side.
        defer_float: leave frames uint8 in the workers even when ``postprocess`` has a float dtype
            (a quarter of the bytes to move); the collate must convert them (``FloatCollate``).
            ``WindowLoader`` sets this on its own copy and adds the collate.
        cost / order: declared plan stages (``stream.plan.CostStage`` / ``OrderStage``): a predicted
            cost per window, attached to every sample as ``__cost__`` (float), and a new yield order
            per consumer; both pure functions of the plan, so every guarantee of the plan holds
            (``balance.streaming.BalancedWindowDataset`` sets them).
        deal: a declared deal stage (``stream.plan.DealStage``) used instead of the plan's cut of
            the windows into consumers (``balance.globaldeal.GlobalDeal``: global cost balancing).
        camera_map: model camera (a name in ``spec.cameras``) -> the dataset's camera key; one dict
            for all datasets or a list with one per dataset (``stream.mix``).
        pad_dims: padding of state/action/other columns to a common width with
            ``<column>_dim_is_pad`` masks: None (when widths differ), True, False, or column -> width
            (``stream.mix.mix_layout``).
        select: which episodes to plan (``stream.select.Selection``): one for all datasets, or a
            list with one per dataset (None: all). Read from the index only.
        weights: ``"repeat"``: a weight multiplies that dataset's windows per epoch (1:1 gives the
            natural sizes); ``"probability"``: weights are the datasets' shares of an epoch of
            ``epoch_length`` windows (default: the 1:1 size) (``stream.mixplan``).
        batch_by_dataset: every batch of ``batch_size`` samples comes from one dataset (implies
            ``stratify``); ``WindowLoader`` passes its batch size. Each consumer drops, per
            dataset, its count modulo the batch size (``stream.mixplan.group_by_dataset``).
        lookahead: look-ahead decoding (``stream.lookahead.Lookahead``): chunk sizes (horizon,
            first chunk: the batch size when known) and the byte budgets of the decoded-frame cache
            and the kept encoded members; together they bound a worker's memory.
    """

    def __init__(
        self,
        sources,
        spec: WindowSpec,
        *,
        seed: int = 0,
        shuffle_episodes: int | Literal["auto"] | None = "auto",
        shuffle_windows: int | None = None,
        shuffle_bytes: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        num_workers: int | None = None,
        postprocess: PostProcess | None = None,
        normalize: dict[str, str] | None = None,
        telemetry: bool = False,
        storage_options: dict | None = None,
        fetch: FetchPolicy | None = None,
        stratify: bool | None = None,
        defer_float: bool = False,
        cost: CostStage | None = None,
        order: OrderStage | None = None,
        camera_map: dict[str, str] | list[dict[str, str] | None] | None = None,
        pad_dims: bool | dict[str, int] | None = None,
        select: Selection | list[Selection | None] | None = None,
        weights: str = "repeat",
        epoch_length: int | None = None,
        batch_by_dataset: bool = False,
        batch_size: int | None = None,
        deal: DealStage | None = None,
        lookahead: Lookahead | None = None,
    ):
        super().__init__()
        if weights not in ("repeat", "probability"):
            raise ValueError(f"weights must be 'repeat' or 'probability', not {weights!r}")
        items = sources if isinstance(sources, list) else [sources]
        pairs = [item if isinstance(item, tuple) else (item, 1.0) for item in items]
        self.fetch = fetch or FetchPolicy()
        self.sources = [
            s if isinstance(s, DatasetSource) else open_source(s, storage_options, self.fetch) for s, _ in pairs
        ]
        self.weights = [float(w) for _, w in pairs]
        if any(w < 0 for w in self.weights):
            raise ValueError(f"dataset weights must not be negative: {self.weights}")
        self.spec = spec
        self.seed = seed
        self.shuffle_episodes = _shuffle_option(shuffle_episodes, shuffle_windows, shuffle_bytes)
        self._rank, self._world_size = rank, world_size
        self.num_workers = num_workers
        self.post = postprocess or PostProcess()
        self.telemetry = telemetry
        self.layout = mix_layout(self.sources, spec, self.post, camera_map, pad_dims, tuple(normalize or {}))
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
        self.batch_by_dataset, self.batch_size = batch_by_dataset, batch_size
        if batch_size is not None:
            self.layout.check_batchable()  # frames of several sizes cannot be stacked into a batch
        self.stratify = (len(self.sources) > 1 if stratify is None else stratify) or batch_by_dataset
        self.table, self.episode_base = self._episode_table()
        # Bool [global episodes]: those of a shard its source failed on open (its size check); they
        # stay planned, are never fetched or decoded, and each of their windows is a substitute.
        self._failed = np.concatenate([np.zeros(0, dtype=bool), *[s.failed_episodes() for s in self.sources]])
        if weights == "probability":
            self._probability_weights(epoch_length)
        self.defer_float = defer_float
        self.cost, self.order, self.deal = cost, order, deal
        self.epoch = 0
        self._resume: Resume | None = None  # taken by the next __iter__ (of a worker's copy too)
        self._started = Resume(0)  # what the last __iter__ in this process started from
        self._consumed = 0
        self._costs: np.ndarray | None = None
        self._per_consumer: dict[tuple, int] = {}  # windows_per_consumer's last answer
        self._shared: EpochCuts | None = None  # set_epoch's shared plan part, inherited by forked workers
        self.lookahead = lookahead or Lookahead()
        self._live_bytes: tuple[int, int] | None = None  # _episode_bytes, once computed
        self._first_chunk = batch_size  # the first look-ahead chunk: one batch (WindowLoader's by default)

    def with_options(
        self, *, defer_float: bool | None = None, num_workers: int | None = None, batch_size: int | None = None
    ) -> WindowDataset:
        """A shallow copy with these options changed (the indexes and plan are shared, not rebuilt).

        ``batch_size``: the loader's, taken by ``batch_by_dataset`` when the dataset was given none.
        """
        other = copy.copy(self)
        if defer_float is not None:
            other.defer_float = defer_float
        if num_workers is not None:
            other.num_workers = num_workers
        if batch_size is not None and not other.batch_size:  # batch_by_dataset's and the shuffle pool's
            other.batch_size = batch_size
        if batch_size is not None:
            other._first_chunk = batch_size
        return other

    # --- planning ---------------------------------------------------------------------------------

    def _episode_table(self) -> tuple[EpisodeTable, np.ndarray]:
        """The planner's table of every dataset of the mix.

        The planner's table of every dataset of the mix (``plan.episode_table`` each, its
        read-time selection as ``keep``), and the first global episode number of each dataset
        (int64 ``[datasets + 1]``).
        """
        parts = [
            episode_table(spec, source.index, offsets, weight=weight, keep=keep)
            for source, spec, weight, offsets, keep in zip(
                self.sources, self.layout.specs, self.weights, self.cam_offsets, self.selected, strict=True
            )
        ]
        table = EpisodeTable.concat(parts, [len(s.shards) for s in self.sources], self.stratify)
        return table, np.cumsum([0, *[t.num_episodes for t in parts]])

    def _probability_weights(self, epoch_length: int | None) -> None:
        """Replace the table's weights by the repeat factors of ``weights="probability"``."""
        anchors = anchor_counts(self.table.lo, self.table.hi, self.spec.stride, self.table.gaps)
        natural = np.add.reduceat(expected_windows(anchors, self.spec.sampling), self.episode_base[:-1])
        factors = probability_factors(natural, self.weights, epoch_length, [s.shown for s in self.sources])
        self.weights = factors.tolist()
        self.table = dataclasses.replace(self.table, weight=np.repeat(factors, np.diff(self.episode_base)))

    def _dataset_of_episode(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.sources)), np.diff(self.episode_base))

    def _group(self) -> BatchByDataset | None:
        """``batch_by_dataset``'s group stage (``stream.mixplan.BatchByDataset``), else None.

        Raises:
            ValueError: ``batch_by_dataset`` without a batch size.
        """
        if not self.batch_by_dataset:
            return None
        if not self.batch_size:
            raise ValueError("batch_by_dataset needs the batch size: WindowDataset(..., batch_size=B) or WindowLoader")
        return BatchByDataset(self._dataset_of_episode(), self.batch_size)

    def pool_episodes(self, batch_size: int | None = None) -> int | None:
        """The shuffle pool in effect (``shuffle_episodes`` with ``"auto"`` resolved by the batch size).

        ``batch_size``: the loader's, when this dataset was given none (``state_dict`` for a loader).
        """
        if self.shuffle_episodes == "auto":
            live, per_window = self._episode_bytes()
            chunk = self.lookahead.horizon * per_window
            return budget_shuffle_episodes(self.batch_size or batch_size, live, self.lookahead.cache_bytes, chunk)
        return self.shuffle_episodes

    def _episode_bytes(self) -> tuple[int, int]:
        """Decoded bytes one episode keeps live while its windows are yielded, and one frame of each camera.

        Per camera, the frames of a window's span (rows from its first offset to its last: with
        consecutive anchors each of them is returned by some window) times the post-processed frame
        size (the camera's largest); the largest of the mix. Bounds the default pool
        (``stream.plan.budget_shuffle_episodes``).
        """
        if self._live_bytes is not None:
            return self._live_bytes
        most = (0, 0)
        for d, source in enumerate(self.sources):
            ix, total, frames = source.index, 0, 0
            for cam, offsets in self.cam_offsets[d].items():
                if not len(offsets):
                    continue
                streams = camera_streams(source, cam)
                size = _frame_size(self.post, ix, streams)
                frame = int(np.max(np.where(ix.cam_depth[streams], 2, 3) * size[:, 0] * size[:, 1], initial=0))
                total += (int(np.max(offsets)) - int(np.min(offsets)) + 1) * frame
                frames += frame
            most = max(most, (total, frames))
        self._live_bytes = most
        return most

    def _stages(self) -> Stages:
        return Stages(self.pool_episodes(), self.cost, self.order, self._group(), self.deal)

    def plan(self, epoch: int, world: World, history: tuple[Progress, ...] = ()) -> WorkerPlan:
        """One consumer's windows for ``epoch``, in yield order.

        Consumer ``world.consumer``'s windows for ``epoch`` (global episode numbers), in yield
        order; after ``history`` (earlier layouts' progress), its share of what is left.
        """
        return worker_plan(
            self.table,
            stride=self.spec.stride,
            per_episode=self.spec.sampling,
            seed=self.seed,
            epoch=epoch,
            world=world,
            shuffle_episodes=self.pool_episodes(),
            cost=self.cost,
            order=self.order,
            group=self._group(),
            history=history,
            shared=self._shared,
            deal=self.deal,
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
        stages, group = self._stages(), self._group()
        if not history and self.deal is None:  # from counts alone: O(episodes), no window listed
            per, _ = plan_shape(self.table, self.spec.stride, self.spec.sampling, self.seed, epoch, consumers)
            return int(per.sum()) if group is None else int(np.sum(per // group.batch_size * group.batch_size))
        plan = level_plan(
            self.table,
            stride=self.spec.stride,
            per_episode=self.spec.sampling,
            seed=self.seed,
            epoch=epoch,
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
        world = world_size or _distributed(self._rank, self._world_size).world_size
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
        if self.num_workers is not None and self.deal is None:  # a deal stage plans from the whole list
            world = _distributed(self._rank, self._world_size)
            consumers = world.world_size * max(self.num_workers, 1)
            self._shared = epoch_cuts(self.table, self.spec.stride, self.spec.sampling, self.seed, epoch, consumers)

    # --- iteration -------------------------------------------------------------------------------

    def _locate(self, episode: int) -> tuple[int, int]:
        d = int(np.searchsorted(self.episode_base, episode, side="right") - 1)
        return d, episode - int(self.episode_base[d])

    @scrubbed  # an error while iterating names no credentials (in a worker: before torch formats it)
    def __iter__(self):
        here = _distributed(self._rank, self._world_size)
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            limit_worker_arenas()
        epoch = self.epoch
        start = self._resume if self._resume is not None and self._resume.epoch == epoch else Resume(epoch)
        self._resume = None
        if start.skip and len(start.skip) != workers:
            raise ValueError(
                f"the resume state was loaded for {len(start.skip)} workers but {workers} iterate: "
                "pass the DataLoader's num_workers to load_state_dict (WindowLoader does)"
            )
        consumer = (worker + start.rotation) % workers
        skip = start.skip[consumer] if start.skip else 0
        self.epoch += 1  # the next __iter__ of this object (a persistent worker's copy too) runs the next epoch
        self._started, self._consumed = start, skip
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
        return self._generate(plan, skip, telemetry)

    def _generate(self, plan: WorkerPlan, skip: int, telemetry: Telemetry):
        """Follow the look-ahead schedule of the plan's windows after the first ``skip`` (``stream.lookahead``).

        Per chunk: evict, fetch or reuse each episode's members, read its columns, one decode call
        per (episode, camera) for the chunk's uncached frames; then yield the chunk's windows from
        the cache and release what no later chunk needs.
        """
        episodes, anchors = plan.episode[skip:], plan.anchor[skip:]
        t0 = time.perf_counter()
        demand = _Demands(self, episodes, anchors)
        policy = self.lookahead
        if self._first_chunk and policy.first == Lookahead.first:  # the loader's batch: first batch first
            policy = dataclasses.replace(policy, first=self._first_chunk)
        steps = Scheduler(demand, policy)
        fetchers = self._fetchers(telemetry)
        slots: list[tuple] = []  # per fetch so far: (dataset, position in its fetcher, sha256s, members)

        def advance() -> Step | None:
            """The next step, its fetches handed to the fetchers (a step ahead, so they go out early)."""
            t = time.perf_counter()
            step = next(steps, None)
            self._fetch_more(steps.fetches[len(slots) :], steps.fetch_work[len(slots) :], fetchers, slots)
            telemetry.add(schedule_s=time.perf_counter() - t)
            return step

        telemetry.add(schedule_s=time.perf_counter() - t0)
        store, encoded = Store(), _Encoded()
        failed: set[int] = set()
        first_failure = None
        last, owed = None, 0
        last_of: dict[int, dict] = {}  # the last sample of each dataset
        try:
            upcoming, first = advance(), True
            while upcoming is not None:
                step = upcoming
                if not first:  # the next chunk's fetches go out now, while this chunk's loads decode
                    upcoming = advance()
                store.drop(step.evict)
                for load in step.loads:
                    encoded.drop(load.drop_encoded)
                    if load.episode in failed:
                        continue
                    try:
                        if self._failed[load.episode]:
                            raise self._shard_failure(load.episode)
                        self._load(load, fetchers, slots, encoded, store, telemetry)
                    except (FetchError, DecodeError) as exc:  # the shard policy decides, for both
                        # (data faults only: an exception of the user's hook is never skipped)
                        if self.fetch.on_shard_error == "raise" or from_user_code(exc):
                            raise
                        warnings.warn(f"epishard: skipping episode {self._key(load.episode)}: {exc}", stacklevel=2)
                        telemetry.add(episodes_skipped=1)
                        failed.add(load.episode)
                        first_failure = first_failure or (self._locate(load.episode)[0], exc)
                        encoded.drop((load.episode,))
                telemetry.add(
                    frame_cache_hits=step.hits, frame_cache_misses=step.misses, frame_cache_evictions=step.evict.size
                )
                telemetry.peak(cache_bytes_peak=store.nbytes, encoded_bytes_peak=encoded.nbytes)
                for i in range(step.start, step.stop):
                    e = int(episodes[i])
                    d, _ = self._locate(e)
                    if e in failed:
                        # Keep this rank's sample count: repeat the worker's previous sample (of the same
                        # dataset when there is one: batch_by_dataset batches stay one dataset's), flagged.
                        if last is None:
                            owed += 1
                            continue
                        sample = dict(last_of.get(d, last), substitute=True)
                    else:
                        sample = self._window(e, int(anchors[i]), step.keys[i - step.start], store, telemetry)
                    yield self._emit(sample, telemetry)
                    for _ in range(owed):  # windows of failed episodes that came before any good sample
                        yield self._emit(dict(sample, substitute=True), telemetry)
                    owed, last = 0, sample
                    last_of[d] = sample
                if first:
                    upcoming, first = advance(), False
                store.drop(step.release)
            if owed:
                assert first_failure is not None  # owed > 0 only after a failure
                failed_dataset, first_error = first_failure
                raise FetchError(
                    f"{self.sources[failed_dataset].shown}: every episode this worker read failed, so {owed} samples "
                    f"cannot be filled; the first: {first_error}",
                    -1,
                )
        finally:
            for f in fetchers:
                f.close()
            if get_worker_info() is not None:
                release_free_memory()  # a persistent worker idles until the next epoch

    def _window(self, episode: int, anchor: int, keys: np.ndarray, store: Store, telemetry: Telemetry) -> dict:
        """The sample of one window, from the store (``keys``: its frame keys, ``Demand.keys`` row)."""
        t = time.perf_counter()
        d, _ = self._locate(episode)
        columns, info, _ = store.columns[episode]
        frames, col = {}, 0
        for cam, offsets in self.cam_offsets[d].items():
            frames[cam] = store.stack(keys[col : col + len(offsets)]) if len(offsets) else self._no_frames(d, info, cam)
            col += len(offsets)
        finish = None if self.defer_float else self.post.finish
        index = self.sources[d].index
        spec = self.layout.specs[d]  # the window in this dataset's rows (its frame rate)
        sample = window_sample(index, info, columns, anchor, spec, self.cam_offsets[d], frames, finish)
        sample = self.layout.apply(sample, d, finish)
        sample["dataset"], sample["substitute"] = d, False
        telemetry.add(assemble_s=time.perf_counter() - t, frames_returned=col)
        return sample

    def _no_frames(self, d: int, info, cam: str) -> torch.Tensor:
        """A camera read at no offsets: ``[0, C, h, w]`` of its prepared dtype."""
        s = info.streams[cam]
        size = _frame_size(self.post, self.sources[d].index, np.array([s]))
        depth = bool(self.sources[d].index.cam_depth[s])
        return torch.empty((0, 1 if depth else 3, *size[0]), dtype=torch.uint16 if depth else torch.uint8)

    def _emit(self, sample: dict, telemetry: Telemetry) -> dict:
        telemetry.add(samples=1, substitutes=int(sample["substitute"]))
        if self.telemetry:
            sample = dict(sample, __telemetry__=telemetry.tensor())
        if self._costs is not None:  # the planned window's predicted cost (a substitute's too)
            sample = dict(sample, __cost__=float(self._costs[self._consumed]))
        self._consumed += 1
        return sample

    def _shard_failure(self, episode: int) -> FetchError:
        """The error of an episode whose shard its source failed on open (``DatasetSource.skipped_shards``)."""
        d, local = self._locate(episode)
        shard = int(self.sources[d].index.shard[local])
        return FetchError(self.sources[d].skipped_shards[shard], shard)

    def _key(self, episode: int) -> str:
        d, local = self._locate(episode)
        return self.sources[d].index.key(local)

    def _demand(self, episodes: np.ndarray, anchors: np.ndarray, sizes: Demand) -> Demand:
        """What the windows (global ``episodes``, ``anchors``: int64 ``[n]``) need: ``stream.lookahead.Demand``.

        Frame keys per window and camera as ``LoadedEpisode`` used to compute them: rows clamped
        into the anchor's recording segment, then the index's row-to-frame map; item sizes from the
        index (post-processed frame size, encoded members) and the manifest (column widths), written
        into ``sizes``' per-stream and per-episode arrays (for these windows' episodes; the
        returned ``Demand`` shares them).
        """
        n = episodes.size
        width = max((sum(len(o) for o in offsets.values()) for offsets in self.cam_offsets), default=0)
        keys = np.full((n, width), -1, dtype=np.int64)
        stream_base = np.cumsum([0, *[s.index.cam_depth.size for s in self.sources]])
        stream_episode, frame_bytes = sizes.stream_episode, sizes.frame_bytes
        columns_bytes, encoded_bytes = sizes.columns_bytes, sizes.encoded_bytes
        dataset = np.searchsorted(self.episode_base, episodes, side="right") - 1
        for d, source in enumerate(self.sources):
            # A failed shard's episodes need nothing (keys -1, sizes 0): none of its index values is used.
            here = np.flatnonzero((dataset == d) & ~self._failed[episodes])
            if not here.size:
                continue
            ix, base = source.index, int(self.episode_base[d])
            local = episodes[here] - base
            unique = np.unique(local)
            members = [ix.data_member(unique)]
            col = 0
            packed = np.full(unique.size, self.fetch.packets)
            for cam, offsets in self.cam_offsets[d].items():
                streams = ix.camera_streams(cam, unique)
                packed &= readable(ix, streams)
                stream_episode[streams + stream_base[d]] = unique + base
                size = _frame_size(self.post, ix, streams)
                frame_bytes[streams + stream_base[d]] = np.where(ix.cam_depth[streams], 2, 3) * size[:, 0] * size[:, 1]
                members.append(ix.stream_member[streams])
                if len(offsets):
                    per_window = streams[np.searchsorted(unique, local)]
                    rows = window_rows(ix, local, anchors[here], offsets)
                    frames = ix.frames(per_window[:, None], rows)
                    keys[here, col : col + len(offsets)] = frame_key(per_window[:, None] + stream_base[d], frames)
                col += len(offsets)
            stacked = np.sort(np.stack(members, axis=1), axis=1)
            first = np.ones(stacked.shape, dtype=bool)
            first[:, 1:] = stacked[:, 1:] != stacked[:, :-1]
            encoded_bytes[unique + base] = np.sum(np.where(first, ix.member_size[stacked], 0), axis=1)
            # An episode read by its packets (``stream.packets``) fetches, for each load, the groups of
            # pictures that load decodes: its bytes are never kept for another load.
            encoded_bytes[unique[packed] + base] = _NEVER_KEPT
            columns_bytes[unique + base] = ix.num_rows[unique] * self._row_bytes(d)
        return Demand(episodes, keys, stream_episode, frame_bytes, columns_bytes, encoded_bytes)

    def _row_bytes(self, d: int) -> int:
        """Bytes per table row of ``read_columns`` in dataset ``d``.

        float32 widths from the manifest (64 when it has no statistics for a column), plus
        frame_index and timestamp.
        """
        names = {self.spec.state_key, self.spec.action_key, *self.spec.extra_columns, *self.spec.column_offsets}
        widths = [max(column_widths(self.sources[d].manifest, c), default=64) for c in names if c is not None]
        return 16 + 4 * sum(widths)

    def _fetchers(self, telemetry: Telemetry) -> list[Fetcher]:
        """One ``Fetcher`` per dataset, over nothing yet (``_fetch_more`` feeds them)."""
        return [
            Fetcher(
                src,
                [],
                self.fetch,
                telemetry,
                sparse=self.fetch.packets and bool(readable(src.index, np.arange(src.index.cam_depth.size)).any()),
            )
            for src in self.sources
        ]

    def _fetch_more(
        self,
        fetches: list[int],
        work: list[tuple[bool, tuple[Decode, ...]]],
        fetchers: list[Fetcher],
        slots: list[tuple],
    ) -> None:
        """Append the schedule's next ``fetches`` (global episodes, repeats allowed) to the fetchers.

        ``work``: per fetch, its load's (columns read, decode calls) (``Scheduler.fetch_work``).
        Appends to ``slots``, per fetch, ``(dataset, position in its fetcher, sha256s, members,
        runs)``: ``runs`` None when the episode's members are fetched whole, else, per global stream
        decoded, ``(runs, starts)`` (``stream.packets``): only the data member (when its columns are
        read) and the byte ranges of those runs are fetched, in that order after the members.
        """
        lists: list[list] = [[] for _ in self.sources]
        for e, (columns, decodes) in zip(fetches, work, strict=True):
            d, local = self._locate(e)
            if self._failed[e]:  # never fetched: its load fails (``_shard_failure``) before using its slot
                slots.append((d, -1, [], [], None))
                continue
            ix = self.sources[d].index
            streams = _streams(ix, local, self.cam_offsets[d])
            runs: dict[int, tuple] | None = None
            if self.fetch.packets and bool(np.all(readable(ix, streams))):
                ranges = episode_ranges(ix, local, [], columns)
                runs, extra = {}, []
                base = self._stream_base[d]
                for call in decodes:
                    s_local = call.stream - base
                    table = ix.packets(s_local)
                    planned = plan_runs(table.frame_packet, ix.keyframes_of(s_local), call.frames)
                    within = run_ranges(table.offset, table.size, planned)
                    member = int(ix.cam_offset[s_local])
                    runs[call.stream] = (planned, [a for a, _ in within])
                    extra += [(member + a, member + b) for a, b in within]
                slots.append((d, len(fetchers[d].episodes) + len(lists[d]), ranges.sha256, ranges.members, runs))
                lists[d].append((ranges.shard, ranges.ranges + extra))
                continue
            ranges = episode_ranges(ix, local, streams)
            slots.append((d, len(fetchers[d].episodes) + len(lists[d]), ranges.sha256, ranges.members, None))
            lists[d].append((ranges.shard, ranges.ranges))
        for fetcher, more in zip(fetchers, lists, strict=True):
            if more:
                fetcher.extend(more)

    def _load(self, load: Load, fetchers, slots, encoded: _Encoded, store: Store, telemetry: Telemetry) -> None:
        """One episode's work of a step: its members (fetched, or kept), its columns, its decode calls."""
        e = load.episode
        d, local = self._locate(e)
        ix = self.sources[d].index
        if load.fetch is None:
            blobs, decoders = encoded.blobs[e], encoded.decoders[e]
            runs, pieces = None, []  # a kept episode is one read by members (packet reads are never kept)
            telemetry.add(encoded_cache_hits=1)
        else:
            dd, k, shas, members, runs = slots[load.fetch]
            fetched = fetchers[dd].episode(k, shas)
            blobs, decoders = dict(zip(members, fetched[: len(members)], strict=True)), {}
            pieces = fetched[len(members) :]
            telemetry.add(episodes_loaded=1)
        if load.columns:
            normalizers = self.normalizers[d][ix.source(local)]
            columns = read_columns(ix, local, blobs[int(ix.data_member(local))], self.layout.specs[d], normalizers)
            store.put_columns(e, columns, EpisodeInfo.of(ix, local, self.cam_offsets[d]), columns_nbytes(columns))
        if runs is not None:
            self._load_packets(load, ix, local, runs, pieces, store, telemetry)
            return
        base = self._stream_base[d]
        for call in load.decodes:
            s = call.stream - base
            where = f"episode {ix.key(local)} camera {ix.cam_names[s].as_py()}"
            data = blobs[int(ix.stream_member[s])]
            frames, kept = decode_camera(
                ix, s, call.frames, data, self.post, where, telemetry, decoders.get(s), self.lookahead.decode_bytes
            )
            decoders[s] = kept
            store.put_frames(call.stream, call.frames, frames)
        if load.keep:
            encoded.put(e, blobs, decoders)
        else:
            encoded.drop((e,))

    def _load_packets(
        self, load: Load, ix, local: int, runs: dict, pieces: list[bytes], store: Store, telemetry
    ) -> None:
        """The decode calls of a load read by packets, each from its runs' bytes (``pieces``, in call order)."""
        d, _ = self._locate(load.episode)
        base, at = self._stream_base[d], 0
        for call in load.decodes:
            s = call.stream - base
            planned, starts = runs[call.stream]
            shard = self.sources[d].shard_path(int(ix.shard[local]))
            where = f"{shard}: episode {ix.key(local)} camera {ix.cam_names[s].as_py()}"
            mine = pieces[at : at + len(planned)]
            at += len(planned)
            frames = decode_camera_packets(
                ix, s, planned, starts, mine, self.post, where, telemetry, self.lookahead.decode_bytes, store.alloc
            )
            store.put_frames(call.stream, call.frames, frames)

    @functools.cached_property
    def _stream_base(self) -> list[int]:
        """Per dataset, the global number of its first camera stream (streams of a mix are numbered on)."""
        return np.cumsum([0, *[s.index.cam_depth.size for s in self.sources]]).tolist()

    # --- resume ----------------------------------------------------------------------------------

    def state_dict(
        self,
        batches: int | None = None,
        batch_size: int | None = None,
        num_workers: int = 0,
        epoch: int | None = None,
        start: Resume | None = None,
    ) -> dict:
        """Position of this rank in the current epoch, for ``load_state_dict``.

        Without arguments (iteration in this process, ``num_workers=0``): the samples yielded so far.
        ``WindowLoader.state_dict`` passes the ``batches`` consumed since ``start`` (where its run
        of the epoch began), ``batch_size``, ``num_workers`` and the epoch it is in. Consumer ``c``
        of the rank took ``consumed[c]`` windows of its plan (the DataLoader's in-order round-robin
        gives worker ``w`` batches ``w, w + K, ...``, so the counts follow from ``batches``).
        """
        here = _distributed(self._rank, self._world_size)
        workers = max(num_workers, 1)
        if batches is None:  # iterated in this process
            start = self._started if self._consumed else Resume(self.epoch)
            consumed, rotation = [self._consumed], 0
        else:
            epoch = self.epoch if epoch is None else epoch
            start = start if start is not None and start.epoch == epoch else Resume(epoch)
            per = self.windows_per_consumer(start.epoch, here.world_size, workers, start.history)
            consumed = list(start.skip) or [0] * workers
            for w in range(min(batches, workers)):
                c = (w + start.rotation) % workers
                consumed[c] = min(consumed[c] + -(-(batches - w) // workers) * int(batch_size or 1), per)
            rotation = (start.rotation + batches) % workers
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "shuffle_episodes": self.pool_episodes(None if batches is None else batch_size),
            "epoch": start.epoch,
            "world_size": here.world_size,
            "num_workers": workers,
            "rank": here.rank,
            "consumed": consumed,
            "rotation": rotation,
            "history": [
                {"world_size": p.world_size, "num_workers": p.num_workers, "consumed": list(p.consumed)}
                for p in start.history
            ],
            "plan_digest": self.plan_digest,
        }

    @functools.cached_property
    def plan_digest(self) -> str:
        """Fingerprint of this reader's episode table and window spec (a state's ``"plan_digest"``).

        A mid-epoch state saved under another one (another dataset, selection or spec) is refused.
        """
        t = self.table
        return plan_digest([t.shard, t.lo, t.hi, t.weight, t.stratum, t.gaps], self.spec.stride, self.spec.sampling)

    def load_state_dict(self, state: dict | list[dict], num_workers: int = 0) -> None:
        """Continue exactly where ``state`` was taken.

        ``state``: this rank's state (from the same layout: the next sample or batch is the one the
        uninterrupted run would have yielded next), or the states of **every** rank of the run that
        saved them, as a list (any layout: elastic resume). Under another layout (world size or
        worker count) the windows of the epoch not consumed by any rank are dealt again to this
        layout's consumers (``stream.plan.level_plan``): each is yielded once, every rank yields the
        same number, and ``R mod (world_size x workers)`` of them (``R`` windows left) are left out
        at random; the next epoch is this layout's own plan.

        Raises:
            StateError (a ``ValueError``; ``StateTypeError`` also a ``TypeError``): a field of a state
                is missing, of the wrong type, or out of range for this plan (``checked_states``).
            ValueError: the states were saved with another seed, or disagree (epoch, layout), or
                the layout changed and not every rank's state was given.
        """
        here = _distributed(self._rank, self._world_size)
        bounded(num_workers, "num_workers (argument)", 0, None, "", "the DataLoader's worker count")
        workers = max(num_workers, 1)
        states = [_upgrade(s) for s in self.checked_states(state)]
        first = states[0]
        if all(s.get("fresh") for s in states):  # an epoch boundary: loads under any layout
            self.set_epoch(first["epoch"])
            self._resume, self._consumed = None, 0
            return
        if self.shuffle_episodes == "auto" and not self.batch_size and "shuffle_episodes" in first:
            self.shuffle_episodes = first["shuffle_episodes"]  # no batch size here: the saving run's pool
        _check_plan(first, self.pool_episodes())
        epoch, old_world, old_workers = first["epoch"], first["world_size"], first["num_workers"]
        history = tuple(Progress(h["world_size"], h["num_workers"], tuple(h["consumed"])) for h in first["history"])
        mine = [s for s in states if s["rank"] == here.rank]
        same = (old_world, old_workers) == (here.world_size, workers)
        if not same and len(states) != old_world:  # before any list of old_world entries is made
            ranks = sorted(s["rank"] for s in states)
            raise StateError(
                f"cannot resume: the state was saved with world_size={old_world}, this run has "
                f"world_size={here.world_size} (num_workers {old_workers} then, {workers} now). Resuming under "
                f"another layout needs the states of all {old_world} ranks (a list; got ranks "
                f"{ranks[:16]}{'...' if len(ranks) > 16 else ''}); or start the next epoch fresh with "
                f"set_epoch({epoch + 1})."
            )
        self._check_counts(states, epoch, history)
        if same and mine:
            start = Resume(epoch, history, tuple(mine[0]["consumed"]), mine[0].get("rotation", 0))
            consumed, per = start.skip, self.windows_per_consumer(epoch, old_world, old_workers, history)
        else:
            ranks = sorted(s["rank"] for s in states)
            if same and ranks != list(range(old_world)):
                raise ValueError(f"cannot resume: the states are of ranks {ranks}, not of this rank {here.rank}")
            if ranks != list(range(old_world)):
                raise ValueError(
                    f"cannot resume: the state was saved with world_size={old_world}, this run has "
                    f"world_size={here.world_size} (num_workers {old_workers} then, {workers} now). Resuming under "
                    f"another layout needs the states of all {old_world} ranks (a list; got ranks {ranks}); or "
                    f"start the next epoch fresh with set_epoch({epoch + 1})."
                )
            consumed = tuple(c for s in sorted(states, key=lambda s: s["rank"]) for c in s["consumed"])
            progress = Progress(old_world, old_workers, consumed)
            per = self.windows_per_consumer(epoch, old_world, old_workers, history)
            start = Resume(epoch, (*history, progress), (0,) * workers, 0)
        if all(c >= per for c in consumed):
            self.epoch, self._resume = epoch + 1, None  # the epoch was finished
        else:
            self.epoch, self._resume = epoch, start
        self._consumed = 0

    def checked_states(self, state: object) -> list[dict]:
        """The states given to ``load_state_dict``, every field checked (``stream.statecheck``) and their agreement.

        Types and ranges of every field (version, seed, epoch, world size and rank, worker count,
        consumed counts, rotation, shuffle pool, history), then: the seed is this reader's, the
        states of a list agree on seed, epoch, layout and history, and each rank's state comes once.
        The consumed counts are checked against the plan by ``load_state_dict`` (``_check_counts``).
        ``WindowLoader`` and ``RayWindowLoader`` call this before they take a state at an epoch boundary.

        Raises:
            StateError / StateTypeError: naming the field (and the state of the list).
            ValueError: another seed.
        """
        states = states_of(state)
        for i, s in enumerate(states):
            check_fields(s, STATE_VERSION, f"state [{i}] " if len(states) > 1 else "")
            check_digest(s, self.plan_digest, f"state [{i}] " if len(states) > 1 else "")
        first = states[0]
        if "seed" in first and first["seed"] != self.seed:
            raise StateError(
                f"cannot resume: the state was saved with seed={first['seed']}, this run has seed={self.seed}. "
                f"Resume with the same seed, or start the next epoch fresh with set_epoch({first['epoch'] + 1})."
            )
        for s in states[1:]:
            for key in ("seed", "epoch", "world_size", "num_workers", "history"):
                if s.get(key) != first.get(key):
                    raise StateError(f"cannot resume: the states disagree on {key} ({first.get(key)} vs {s.get(key)})")
        ranks = [s.get("rank", 0) for s in states]
        if len(set(ranks)) != len(ranks):
            twice = min(r for r, n in collections.Counter(ranks).items() if n > 1)
            raise StateError(f"load_state_dict: field 'rank' is {twice} in more than one state; give each rank's once")
        return states

    def _check_counts(self, states: list[dict], epoch: int, history: tuple[Progress, ...]) -> None:
        """Every consumed count of ``states`` (and of their ``history``) within its consumer's windows in this plan.

        Raises:
            StateError: a count above the windows its consumer has in ``epoch`` under its layout.
        """
        first = states[0]
        try:  # one replay of the history checks every level's counts (linear in its length)
            per = self.windows_per_consumer(epoch, first["world_size"], first["num_workers"], history)
        except LevelOverrun as exc:
            level = history[exc.level]
            raise StateError(
                f"load_state_dict: field 'history[{exc.level}].consumed[{exc.consumer}]' is {exc.consumed}; must be "
                f"0..{exc.windows} (windows per consumer in epoch {epoch} of this plan under {level.world_size} ranks "
                f"x {level.num_workers} workers)"
            ) from exc
        for i, s in enumerate(states):
            at = f"state [{i}] " if len(states) > 1 else ""
            for c, n in enumerate(s["consumed"]):
                if n > per:
                    raise StateError(
                        f"load_state_dict: {at}field 'consumed[{c}]' is {n}; must be 0..{per} (windows per consumer "
                        f"in epoch {epoch} of this plan under {first['world_size']} ranks x {first['num_workers']} "
                        "workers)"
                    )


def _check_plan(state: dict, pool: int | None) -> None:
    """Refuse a mid-epoch state whose epoch plan differs from this reader's (planner or shuffle pool).

    Raises:
        ValueError: the state is of a version before the plan-level shuffle's equal pools, or its shuffle pool
            (``shuffle_episodes``, resolved) differs.
    """
    consumed = any(state["consumed"]) or state["history"]
    if state.get("version", 1) < 4 and consumed:
        raise ValueError(
            f"cannot resume: the state (version {state.get('version', 1)}) was saved mid-epoch by a reader whose plan "
            f"(shuffle buffer, anchor draws, pool cuts) this version no longer makes; start the next epoch fresh with "
            f"set_epoch({state['epoch'] + 1})"
        )
    if "shuffle_episodes" in state and state["shuffle_episodes"] != pool and consumed:
        raise ValueError(
            f"cannot resume: the state was saved with shuffle_episodes={state['shuffle_episodes']}, this run plans "
            f"with {pool} (the default follows the batch size and the frame cache): "
            f"pass shuffle_episodes={state['shuffle_episodes']}"
        )


def _upgrade(state: dict) -> dict:
    """A state of any ``STATE_VERSION`` in the current form (version 1 had no ``history``)."""
    if state.get("version", 1) > STATE_VERSION:
        raise ValueError(f"cannot resume: state version {state['version']} is newer than this reader's {STATE_VERSION}")
    return {"history": [], **state}


def _streams(index, episode: int, cameras) -> list[int]:
    """Index stream numbers of the window cameras (names the episode stores) of ``episode``."""
    names = index.camera_names(episode)
    return [index.stream(episode, names.index(c)) for c in cameras]


def _frame_size(post: PostProcess, index, streams: np.ndarray) -> np.ndarray:
    """``(h, w)`` (int64 ``[len(streams), 2]``) of the streams' frames after ``post.prepare`` (hook aside)."""
    size = np.stack([index.cam_height[streams], index.cam_width[streams]], axis=1).astype(np.int64)
    if post.crop is not None:
        size[:] = post.crop[2:]
    if post.size is not None:
        size[:] = post.size
    return size


_NEVER_KEPT = np.iinfo(np.int64).max // 4  # encoded size of an episode read by packets: above any budget


class _Demands:
    """A consumer's ``Demand`` (``stream.lookahead.Demands``), computed a part at a time as the ``Scheduler`` asks.

    The per-stream and per-episode arrays are allocated once (zeros, for every stream and episode
    of the mix) and filled for each part's episodes, so a part costs its own windows.
    """

    def __init__(self, ds: WindowDataset, episodes: np.ndarray, anchors: np.ndarray):
        self.ds, self.episodes, self.anchors = ds, episodes, anchors
        streams, total = sum(s.index.cam_depth.size for s in ds.sources), int(ds.episode_base[-1])
        width = max((sum(len(o) for o in offsets.values()) for offsets in ds.cam_offsets), default=0)
        self.sizes = Demand(
            episode=np.zeros(0, dtype=np.int64),
            keys=np.zeros((0, width), dtype=np.int64),
            stream_episode=np.full(streams, -1, dtype=np.int64),
            frame_bytes=np.zeros(streams, dtype=np.int64),
            columns_bytes=np.zeros(total, dtype=np.int64),
            encoded_bytes=np.zeros(total, dtype=np.int64),
        )

    @property
    def count(self) -> int:
        return int(self.episodes.size)

    def part(self, start: int, stop: int) -> Demand:
        return self.ds._demand(self.episodes[start:stop], self.anchors[start:stop], self.sizes)


class _Encoded:
    """Encoded member bytes the schedule keeps for episodes decoded again (``Load.keep``).

    With them, each camera's open decoder and the last frame it returned (``decode_camera``'s
    ``kept``): the next call on that camera decodes on from there when it can.
    """

    def __init__(self):
        self.blobs: dict[int, dict[int, bytes]] = {}
        self.decoders: dict[int, dict] = {}
        self.nbytes = 0

    def put(self, episode: int, blobs: dict[int, bytes], decoders: dict) -> None:
        if episode not in self.blobs:
            self.nbytes += sum(len(b) for b in blobs.values())
        self.blobs[episode], self.decoders[episode] = blobs, decoders

    def drop(self, episodes) -> None:
        for e in episodes:
            blobs = self.blobs.pop(e, None)
            self.decoders.pop(e, None)
            self.nbytes -= 0 if blobs is None else sum(len(b) for b in blobs.values())


class WindowLoader(DataLoader):
    """A ``DataLoader`` over a ``WindowDataset`` with exact and elastic mid-epoch resume.

    A ``DataLoader`` over a ``WindowDataset`` that tracks epochs and consumed batches, so that
    ``state_dict()`` / ``load_state_dict()`` resume exactly mid-epoch with any ``num_workers``, and
    under another world size or worker count given every rank's state (elastic resume).

    Exactness relies on the DataLoader's in-order round-robin over workers (the default,
    ``in_order=True``) and on every worker of a rank holding the same number of windows.

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
    ``batch_size``, no ``pin_memory`` and no ``reuse_buffers``, while a worker's ring holds at most
    ``buffers.RECYCLE_BYTES``, 256 MiB, of batches; ``True``: on whatever the ring's size; ``False``:
    off): each worker writes its batches into a ring of ``prefetch_factor + 1`` pre-faulted buffers
    (``+ 2`` with one worker) instead of fresh shared memory, and a buffer is written again only when
    nothing of the batch it held is referenced in this process any more (``buffers.RecycledBatches``
    counts the storage's references: a batch, a view, ``.numpy()`` or ``.detach()`` of it kept); a
    batch whose buffer is still held goes into fresh memory. So, unlike ``reuse_buffers``, batches
    keep their values for as long as they are held, and the page faults of fresh memory are saved
    whenever the training loop drops each batch before the next few come.

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
        if recycle_buffers is None:  # the default: on where it applies, within RECYCLE_BYTES per worker
            recycle_buffers = workers > 0 and ours and batch_size is not None and not kw.get("pin_memory")
            cap = RECYCLE_BYTES
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
            defer_float=defer_float, num_workers=kw.get("num_workers", 0), batch_size=batch_size
        )
        super().__init__(view, batch_size=batch_size, **kw)
        self._epoch = view.epoch
        self._batches = 0
        self._start = view._resume or Resume(view.epoch)  # where this loader's run of the epoch begins
        self._workers_next: int | None = None  # the epoch persistent workers run on their next iteration
        self._running: object | None = None  # token of the iteration in progress

    @scrubbed  # a worker's error, re-raised here with its traceback as text, names no credentials
    def __iter__(self):
        if self._iterator is not None and (self._workers_next != self._epoch or self.dataset._resume is not None):
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
        resume = self.dataset._resume
        self._start = resume if resume is not None and resume.epoch == self._epoch else Resume(self._epoch)
        self._batches = 0
        self._running = token = object()
        batches = None
        try:
            batches = super().__iter__()  # starts the workers with the dataset as it is now
            self.dataset._resume = None  # taken by the workers' copies (or by this process's iteration)
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
        state = self.dataset.state_dict(self._batches, self.batch_size, self.num_workers, self._epoch, start)
        # At an epoch boundary nothing is consumed: such a state loads under any layout.
        return {**state, "fresh": True} if self._batches == 0 and start.fresh else state

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
        states = self.dataset.checked_states(state)  # every field, before anything is taken from it
        self._batches = 0
        if all(s.get("fresh") for s in states):
            self._epoch = states[0]["epoch"]
            self.dataset.set_epoch(self._epoch)
            self.dataset._resume = None
        else:
            self.dataset.load_state_dict(state, self.num_workers)
            self._epoch = self.dataset.epoch
        self._start = self.dataset._resume or Resume(self._epoch)
