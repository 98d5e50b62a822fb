"""The torch datasets of training windows streamed from epishard shards.

``WindowDataset``: a torch ``IterableDataset`` of training windows, and ``WindowLoader``: a
``DataLoader`` that adds exact mid-epoch resume.

Sample format (stable; ``default_collate`` batches it):

=================================  =========================================================
``<camera>`` (full name)           frames ``[T, C, H, W]``, uint8 RGB by default (``PostProcess``);
                                   a depth camera: uint16 ``[T, 1, H, W]``, stored units, always
``<camera>_is_pad``                bool ``[T]``: offset fell outside the episode (pad mode)
``observation.state``              float32 ``[T_s, D]`` (``spec.state_offsets`` rows)
``observation.state_is_pad``       bool ``[T_s]``
``action``                         float32 ``[H, D]`` (rows anchor .. anchor+H-1)
``action_is_pad``                  bool ``[H]``
``task``                           str, the instruction
``episode_index``                  int, episode index in its source dataset
``frame_index``, ``timestamp``     int and float (seconds) of the anchor row
``dataset``                        int, position of the dataset in the mix (always present)
``substitute``                     bool: True for a repeat of the worker's previous sample that
                                   stands in for a window of a shard that failed to fetch
                                   (``FetchPolicy(on_shard_error="skip")``)
``__telemetry__``                  float64 counters of the worker (only with ``telemetry=True``)
=================================  =========================================================

Distribution: rank and world size come from ``torch.distributed`` when it is initialised (or the
``rank``/``world_size`` arguments); the worker from ``torch.utils.data.get_worker_info()``. Every
rank yields the same number of samples per epoch (see ``stream.plan``).

Epochs: each ``__iter__`` runs the next epoch of the object it is called on. With a plain
``DataLoader`` and non-persistent workers, call ``set_epoch(e)`` before each epoch (as with
``DistributedSampler``); ``WindowLoader`` does this for you.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .collate import FloatCollate
from .decode import DecodeError
from .episode import LoadedEpisode, Normalizer
from .fetch import Fetcher, FetchError, FetchPolicy, episode_ranges
from .memory import limit_worker_arenas, release_free_memory
from .plan import EpisodeTable, WorkerPlan, anchor_counts, break_gaps, global_plan, worker_plan
from .source import DatasetSource
from .spec import WindowSpec
from .telemetry import Telemetry
from .transform import PostProcess

STATE_VERSION = 1


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return rank or 0, world_size or 1


def _camera_offsets(sources: list[DatasetSource], spec: WindowSpec) -> list[dict[str, np.ndarray]]:
    """Per dataset, camera -> frame offsets (``WindowSpec.camera_offsets``), checked across a mix.

    Every sample must carry the same keys or batches cannot be collated.

    Raises:
        KeyError: the spec names a camera a dataset lacks (the dataset is named).
        ValueError: the spec takes every camera (``cameras=None``) of datasets whose cameras differ.
    """
    out = []
    for source in sources:
        try:
            out.append(spec.camera_offsets(source.cameras))
        except KeyError as exc:
            raise KeyError(f"{source.url}: {exc.args[0]}") from None
    if spec.cameras is None and len({tuple(s.cameras) for s in sources}) > 1:
        have = "; ".join(f"{s.url} has {s.cameras}" for s in sources)
        raise ValueError(
            f"the window spec takes every camera (cameras=None) but the datasets' cameras differ ({have}): "
            "name the cameras every dataset has in WindowSpec(cameras=...)"
        )
    return out


def _camera_streams(source: DatasetSource, cam: str) -> np.ndarray:
    """``source.index.camera_streams(cam)`` (int64 ``[num_episodes]``).

    Raises:
        KeyError: an episode has no such camera, naming the index file and the episode.
    """
    try:
        return source.index.camera_streams(cam)
    except KeyError as exc:
        raise KeyError(f"{source.index_file}: {exc.args[0]}") from None


def _check_camera_kinds(sources: list[DatasetSource], cam_offsets: list[dict]) -> None:
    """Refuse a window camera that is depth in some episodes and RGB in others.

    Depth is uint16 ``[T, 1, H, W]``, RGB uint8 ``[T, 3, H, W]``; in episodes of one dataset or
    across a mix, such a camera's frames could not be batched together (the writer reports such
    episodes as ``depth_not_grey``).

    Raises:
        ValueError: naming the camera and one episode (key and dataset) of each kind.
        KeyError: an episode lacks the camera (``_camera_streams``).
    """
    for cam in sorted({c for offsets in cam_offsets for c in offsets}):
        example: dict[bool, str] = {}
        for source, offsets in zip(sources, cam_offsets, strict=False):
            if cam not in offsets:
                continue
            ix = source.index
            depth = ix.cam_depth[_camera_streams(source, cam)]
            for kind in (True, False):
                hits = np.flatnonzero(depth == kind)
                if hits.size and kind not in example:
                    example[kind] = f"episode {ix.key(int(hits[0]))} of {source.url}"
        if len(example) == 2:
            raise ValueError(
                f"camera {cam!r} is a depth camera (uint16 [T, 1, H, W]) in {example[True]} but RGB "
                f"(uint8 [T, 3, H, W]) in {example[False]}: its frames cannot be batched together. "
                "Leave it out of the window spec, or convert the episodes of each kind apart "
                "(--episodes) and do not mix them."
            )


@dataclass
class _Resume:
    epoch: int
    skip: list[int]  # samples already consumed, per consumer of this rank (worker order)
    rotation: int  # worker w continues the plan of consumer (w + rotation) % num_workers


class WindowDataset(IterableDataset):
    """Training windows from one or more epishard datasets.

    Args:
        sources: a dataset URL or ``DatasetSource``, or a list of them, or of ``(url, weight)``
            pairs to mix datasets (weight multiplies that dataset's windows per epoch).
        spec: the window (``WindowSpec``).
        seed: base seed; the plan is a pure function of (seed, epoch, world size, rank, workers).
        shuffle_windows / shuffle_bytes: bounds of each worker's shuffle buffer (windows; bytes of
            loaded episodes: encoded members plus decoded frames). ``shuffle_windows=0`` keeps the
            read order.
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
    """

    def __init__(
        self,
        sources,
        spec: WindowSpec,
        *,
        seed: int = 0,
        shuffle_windows: int = 512,
        shuffle_bytes: int = 1 << 30,
        rank: int | None = None,
        world_size: int | None = None,
        num_workers: int | None = None,
        postprocess: PostProcess | None = None,
        normalize: dict[str, str] | None = None,
        telemetry: bool = False,
        storage_options: dict | None = None,
        fetch: FetchPolicy | None = None,
        stratify: bool | None = None,
    ):
        super().__init__()
        items = sources if isinstance(sources, list) else [sources]
        pairs = [item if isinstance(item, tuple) else (item, 1.0) for item in items]
        self.fetch = fetch or FetchPolicy()
        self.sources = [
            s if isinstance(s, DatasetSource) else DatasetSource(s, storage_options, self.fetch) for s, _ in pairs
        ]
        self.weights = [float(w) for _, w in pairs]
        if any(w < 0 for w in self.weights):
            raise ValueError(f"dataset weights must not be negative: {self.weights}")
        self.spec = spec
        self.seed = seed
        self.shuffle_windows = shuffle_windows
        self.shuffle_bytes = shuffle_bytes
        self._rank, self._world_size = rank, world_size
        self.num_workers = num_workers
        self.post = postprocess or PostProcess()
        self.telemetry = telemetry
        self.cam_offsets = _camera_offsets(self.sources, spec)
        _check_camera_kinds(self.sources, self.cam_offsets)
        self.normalizers = [
            {col: Normalizer.from_stats(s.manifest.stats[col], mode) for col, mode in (normalize or {}).items()}
            for s in self.sources
        ]
        self.stratify = len(self.sources) > 1 if stratify is None else stratify
        self.table, self.episode_base = self._episode_table()
        self.defer_float = False  # set by WindowLoader: frames stay uint8 until its collate converts them
        self.epoch = 0
        self._resume: _Resume | None = None
        self._consumed = 0

    # --- planning ---------------------------------------------------------------------------------

    def _episode_table(self) -> tuple[EpisodeTable, np.ndarray]:
        parts, gap_parts, base, shard_base = [], [], [0], 0
        for source, weight, offsets in zip(self.sources, self.weights, self.cam_offsets, strict=False):
            ix = source.index
            rows = self.spec.row_offsets(list(offsets))
            if self.spec.boundary == "pad":
                lo, hi = ix.window_start, ix.window_stop
                gap = np.zeros((0, 3), dtype=np.int64)  # windows across a break are padded instead
            else:
                before, after = max(0, -int(rows.min())), max(0, int(rows.max()))
                lo, hi = ix.window_start + before, ix.window_stop - after
                # A recording break inside an episode is an episode boundary for windows.
                owner = np.repeat(np.arange(ix.num_episodes, dtype=np.int64), np.diff(ix.segment_offsets))
                gap = break_gaps(owner, ix.segment_starts, before, after)
            gap_parts.append(gap + np.array([base[-1], 0, 0]))
            # Bytes an episode holds while loaded: encoded members of the cameras read plus the
            # frames its windows need, decoded and prepared (uint8; float conversion happens per
            # window). Frames: all rows when every anchor is taken, else windows x offsets.
            cost = np.zeros(ix.num_episodes, dtype=np.int64)
            per = self.spec.per_episode
            anchors = anchor_counts(lo, hi, self.spec.stride, gap)
            windows = (
                anchors
                if per is None
                else np.ceil(anchors * per)
                if isinstance(per, (float, np.floating))
                else np.minimum(anchors, per)
            ) * weight
            for cam, cam_offsets in offsets.items():
                streams = _camera_streams(source, cam)
                size = (
                    np.array(self.post.size)
                    if self.post.size
                    else np.stack([ix.cam_height[streams], ix.cam_width[streams]], 1)
                )
                frames = np.minimum(ix.num_rows, np.ceil(windows * len(cam_offsets)))
                per_pixel = np.where(ix.cam_depth[streams], 2, 3)  # uint16 [1, H, W] or uint8 [3, H, W]
                cost += ix.cam_size[streams] + (frames * per_pixel * np.prod(size, axis=-1)).astype(np.int64)
            parts.append((ix.shard.astype(np.int64) + shard_base, lo, hi, np.full(ix.num_episodes, weight), cost))
            shard_base += len(source.shards)
            base.append(base[-1] + ix.num_episodes)
        cat = [np.concatenate([p[i] for p in parts]) for i in range(5)]
        stratum = np.repeat(np.arange(len(self.sources)), np.diff(base)) if self.stratify else None
        gaps = np.concatenate(gap_parts)
        return EpisodeTable(
            shard=cat[0],
            lo=cat[1].astype(np.int64),
            hi=cat[2].astype(np.int64),
            weight=cat[3],
            cost_bytes=cat[4],
            stratum=stratum,
            gaps=gaps if gaps.shape[0] else None,
        ), np.asarray(base)

    def plan(self, epoch: int, rank: int, world_size: int, num_workers: int, consumer: int) -> WorkerPlan:
        """This consumer's windows for ``epoch`` (global episode numbers), in yield order."""
        return worker_plan(
            self.table,
            stride=self.spec.stride,
            per_episode=self.spec.per_episode,
            seed=self.seed,
            epoch=epoch,
            world_size=world_size,
            rank=rank,
            num_workers=num_workers,
            worker=consumer,
            shuffle_windows=self.shuffle_windows,
            shuffle_bytes=self.shuffle_bytes,
        )

    def windows_per_consumer(self, epoch: int, world_size: int, num_workers: int) -> int:
        """Windows each (rank, worker) yields in ``epoch``: the planner's count, without the shuffle."""
        return global_plan(
            self.table, self.spec.stride, self.spec.per_episode, self.seed, epoch, world_size * num_workers
        ).per_consumer

    def samples_per_rank(self, num_workers: int | None = None, world_size: int | None = None, epoch: int = 0) -> int:
        """Samples every rank yields in ``epoch`` (the same on all ranks)."""
        _, world = _distributed(self._rank, self._world_size)
        world = world_size or world
        workers = max(num_workers if num_workers is not None else (self.num_workers or 0), 1)
        return self.windows_per_consumer(epoch, world, workers) * workers

    def __len__(self) -> int:
        return self.samples_per_rank(epoch=self.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` on the next ``__iter__`` (call before each epoch with non-persistent workers)."""
        self.epoch = epoch

    # --- iteration -------------------------------------------------------------------------------

    def _locate(self, episode: int) -> tuple[int, int]:
        d = int(np.searchsorted(self.episode_base, episode, side="right") - 1)
        return d, episode - int(self.episode_base[d])

    def __iter__(self):
        rank, world = _distributed(self._rank, self._world_size)
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            limit_worker_arenas()
        epoch, skip, consumer = self.epoch, 0, worker
        if self._resume is not None:
            if self._resume.epoch == epoch:
                consumer = (worker + self._resume.rotation) % workers
                skip = self._resume.skip[consumer]
            self._resume = None
        self.epoch += 1  # the next __iter__ of this object (a persistent worker's copy too) runs the next epoch
        self._consumed = skip
        telemetry = Telemetry(worker)
        t0 = time.perf_counter()
        plan = self.plan(epoch, rank, world, workers, consumer)
        telemetry.add(
            plan_s=time.perf_counter() - t0,
            windows_dropped=plan.dropped if consumer == 0 and rank == 0 else 0,
            episodes_without_windows=int(
                np.sum(anchor_counts(self.table.lo, self.table.hi, self.spec.stride, self.table.gaps) == 0)
            )
            if consumer == 0 and rank == 0
            else 0,
        )
        return self._generate(plan, skip, telemetry)

    def _generate(self, plan: WorkerPlan, skip: int, telemetry: Telemetry):
        episodes, anchors = plan.episode[skip:], plan.anchor[skip:]
        order = np.argsort(episodes, kind="stable")
        bounds = (
            np.flatnonzero(np.r_[True, episodes[order][1:] != episodes[order][:-1]])
            if episodes.size
            else np.zeros(0, np.int64)
        )
        pending = {
            int(episodes[order[b]]): np.sort(anchors[order[b:e]])
            for b, e in zip(list(bounds), [*list(bounds[1:]), episodes.size], strict=False)
        }
        remaining = {e: a.size for e, a in pending.items()}
        fetchers, slots = self._fetchers(plan, remaining, telemetry)
        loaded: dict[int, LoadedEpisode] = {}
        failed: set[int] = set()
        first_failure: tuple[int, Exception] | None = None
        last, owed = None, 0
        read_pos = 0
        try:
            for e, anchor in zip(episodes.tolist(), anchors.tolist(), strict=False):
                while e not in loaded and e not in failed:
                    nxt = int(plan.read_order[read_pos])
                    read_pos += 1
                    if remaining.get(nxt):
                        try:
                            loaded[nxt] = self._load(nxt, pending[nxt], fetchers, slots, telemetry)
                        except (FetchError, DecodeError) as exc:  # the shard policy decides, for both
                            if self.fetch.on_shard_error == "raise":
                                raise
                            warnings.warn(f"epishard: skipping episode {self._key(nxt)}: {exc}", stacklevel=2)
                            telemetry.add(episodes_skipped=1)
                            failed.add(nxt)
                            first_failure = first_failure or (self._locate(nxt)[0], exc)
                remaining[e] -= 1
                if e in failed:
                    # Keep this rank's sample count: repeat the worker's previous sample, flagged.
                    if last is None:
                        owed += 1
                        continue
                    sample = dict(last, substitute=True)
                else:
                    t = time.perf_counter()
                    d, _ = self._locate(e)
                    sample = loaded[e].window(
                        self.sources[d].index,
                        anchor,
                        self.spec,
                        self.cam_offsets[d],
                        finish=None if self.defer_float else self.post.finish,
                    )
                    sample["dataset"], sample["substitute"] = d, False
                    if remaining[e] == 0:
                        del loaded[e]
                    telemetry.add(
                        assemble_s=time.perf_counter() - t,
                        frames_returned=sum(len(o) for o in self.cam_offsets[d].values()),
                    )
                yield self._emit(sample, telemetry)
                for _ in range(owed):  # windows of failed episodes that came before any good sample
                    yield self._emit(dict(sample, substitute=True), telemetry)
                owed, last = 0, sample
            if owed:
                assert first_failure is not None  # samples are owed only after a failed episode
                d, cause = first_failure
                raise FetchError(
                    f"{self.sources[d].url}: every episode this worker read failed, so {owed} samples "
                    f"cannot be filled; the first: {cause}",
                    -1,
                )
        finally:
            for f in fetchers:
                f.close()
            if get_worker_info() is not None:
                release_free_memory()  # a persistent worker idles until the next epoch

    def _emit(self, sample: dict, telemetry: Telemetry) -> dict:
        telemetry.add(samples=1, substitutes=int(sample["substitute"]))
        if self.telemetry:
            sample = dict(sample, __telemetry__=telemetry.tensor())
        self._consumed += 1
        return sample

    def _key(self, episode: int) -> str:
        d, local = self._locate(episode)
        return self.sources[d].index.key(local)

    def _fetchers(self, plan: WorkerPlan, remaining: dict, telemetry: Telemetry):
        """One ``Fetcher`` per dataset, over the episodes this worker still needs, in read order."""
        lists: list[list] = [[] for _ in self.sources]
        slots: dict[int, tuple] = {}
        for e in plan.read_order.tolist():
            if not remaining.get(e):
                continue
            d, local = self._locate(e)
            ix = self.sources[d].index
            names = ix.camera_names(local)
            streams = [ix.stream(local, names.index(c)) for c in self.cam_offsets[d]]
            where = episode_ranges(ix, local, streams)
            slots[e] = (d, len(lists[d]), where.sha256, where.members)
            lists[d].append((where.shard, where.ranges))
        fetchers = [Fetcher(src, lst, self.fetch, telemetry) for src, lst in zip(self.sources, lists, strict=False)]
        return fetchers, slots

    def _load(self, episode: int, anchors: np.ndarray, fetchers, slots, telemetry: Telemetry) -> LoadedEpisode:
        d, k, shas, members = slots[episode]
        blobs = dict(zip(members, fetchers[d].episode(k, shas), strict=False))
        _, local = self._locate(episode)
        return LoadedEpisode.load(
            self.sources[d].index,
            local,
            anchors,
            self.spec,
            self.cam_offsets[d],
            blobs,
            self.post,
            self.normalizers[d],
            telemetry,
        )

    # --- resume ----------------------------------------------------------------------------------

    def state_dict(
        self, batches: int | None = None, batch_size: int | None = None, num_workers: int = 0, epoch: int | None = None
    ) -> dict:
        """Position of this rank in the current epoch, for ``load_state_dict``.

        Without arguments (iteration in this process, ``num_workers=0``): the samples yielded so far.
        ``WindowLoader.state_dict`` passes ``batches`` consumed, ``batch_size``, ``num_workers`` and
        the epoch it is in.
        """
        rank, world = _distributed(self._rank, self._world_size)
        workers = max(num_workers, 1)
        if epoch is None:  # iterated in this process: __iter__ already advanced self.epoch
            epoch = self.epoch - 1 if self._consumed else self.epoch
        if batches is None:
            consumed = [self._consumed]
        else:
            if batch_size is None:
                raise ValueError("WindowDataset.state_dict: batches consumed need the batch_size")
            per = self.windows_per_consumer(epoch, world, workers)
            consumed = [
                min(-(-(batches - w) // workers) * batch_size, per) if batches > w else 0 for w in range(workers)
            ]
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": epoch,
            "world_size": world,
            "num_workers": workers,
            "rank": rank,
            "consumed": consumed,
            "rotation": (batches or 0) % workers,
        }

    def load_state_dict(self, state: dict, num_workers: int = 0) -> None:
        """Continue exactly where ``state`` was taken.

        The next sample (or batch) is the one the uninterrupted run would have yielded next.

        Raises:
            ValueError: ``state`` was saved under another world size, worker count or seed; such a
                state cannot continue the same epoch plan (every rank's share would change).
        """
        rank, world = _distributed(self._rank, self._world_size)
        workers = max(num_workers, 1)
        for name, now in (("world_size", world), ("num_workers", workers), ("seed", self.seed), ("rank", rank)):
            if state[name] != now:
                raise ValueError(
                    f"cannot resume: the state was saved with {name}={state[name]}, this run has "
                    f"{name}={now}. Resume with the same settings, or start the next epoch fresh "
                    f"with set_epoch({state['epoch'] + 1})."
                )
        per = self.windows_per_consumer(state["epoch"], world, workers)
        if all(c >= per for c in state["consumed"]):
            self.epoch, self._resume = state["epoch"] + 1, None  # the epoch was finished
        else:
            self.epoch = state["epoch"]
            self._resume = _Resume(state["epoch"], list(state["consumed"]), state["rotation"])
        self._consumed = 0


class WindowLoader(DataLoader):
    """A ``DataLoader`` over a ``WindowDataset`` that tracks epochs and consumed batches.

    ``state_dict()`` / ``load_state_dict()`` then resume exactly mid-epoch with any ``num_workers``.

    Exactness relies on the DataLoader's in-order round-robin over workers (the default,
    ``in_order=True``) and on every worker of a rank holding the same number of windows.

    Persistent workers keep their own copy of the dataset, which can only run the epoch after the
    one it ran last; when the next iteration must run anything else (after ``load_state_dict``, or
    after an epoch left unfinished) the workers are restarted, so every iteration runs exactly the
    epoch ``state_dict()`` reports. An unfinished epoch is run again from its start (as without
    persistent workers) unless a state is loaded.
    """

    dataset: WindowDataset  # DataLoader's attribute, narrowed: the loader works on a WindowDataset

    def __init__(self, dataset: WindowDataset, batch_size: int = 1, **kw):
        if dataset.post.dtype.is_floating_point and "collate_fn" not in kw and batch_size is not None:
            # Frames stay uint8 through the workers and become float32 while copied into the batch.
            dataset.defer_float = True
            # Depth cameras stay uint16 (``PostProcess.prepare_depth``): not converted, not scaled.
            rgb = {
                c
                for src, o in zip(dataset.sources, dataset.cam_offsets, strict=False)
                for c in o
                if not src.index.is_depth(c)
            }
            kw["collate_fn"] = FloatCollate(sorted(rgb), dataset.post.dtype, dataset.post.scale)
        super().__init__(dataset, batch_size=batch_size, **kw)
        dataset.num_workers = self.num_workers
        self._epoch = dataset.epoch
        self._batches = 0
        self._workers_next: int | None = None  # the epoch persistent workers run on their next iteration
        self._running: object | None = None  # token of the iteration in progress

    def __iter__(self):
        if self._iterator is not None and (self._workers_next != self._epoch or self.dataset._resume is not None):
            # Their dataset copies cannot run this epoch. Persistent workers mean torch's multiprocessing
            # iterator, which has this method; the base iterator type mypy sees does not declare it.
            self._iterator._shutdown_workers()  # type: ignore[attr-defined]
            self._iterator = None
        if self._iterator is None:
            self.dataset.set_epoch(self._epoch)
        self._batches = 0
        self._running = token = object()
        try:
            batches = super().__iter__()  # starts the workers with the dataset as it is now
            self.dataset._resume = None  # taken by the workers' copies (or by this process's iteration)
            self._workers_next = self._epoch + 1
            for batch in batches:
                self._batches += 1
                yield batch
            self._epoch += 1
            self._batches = 0
        finally:
            if self._running is token:
                self._running = None

    def state_dict(self) -> dict:
        """The epoch and the batches this rank consumed in it, for ``load_state_dict``."""
        state = self.dataset.state_dict(self._batches, self.batch_size, self.num_workers, epoch=self._epoch)
        # At an epoch boundary nothing is consumed: such a state loads under any layout.
        return {**state, "fresh": True} if self._batches == 0 else state

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` on the next iteration.

        Raises:
            RuntimeError: an iteration over this loader is in progress (it would go on with its own
                epoch); load before the ``for`` loop, or after it ended or was dropped.
            ValueError: see ``WindowDataset.load_state_dict``.
        """
        if self._running is not None:
            raise RuntimeError(
                "WindowLoader.load_state_dict during an iteration over the loader: the running "
                "iteration would go on with its own epoch. Load the state before the for loop "
                "(or after it ended, or after deleting its iterator)."
            )
        self._batches = 0
        if state.get("fresh"):
            self._epoch = state["epoch"]
            self.dataset.set_epoch(self._epoch)
            self.dataset._resume = None
            return
        self.dataset.load_state_dict(state, self.num_workers)
        self._epoch = self.dataset.epoch
