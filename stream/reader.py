"""The worker read loop of a ``WindowDataset``: one consumer's planned windows fetched, decoded and assembled.

``EpochReader(dataset).samples(plan, skip, telemetry)`` follows the look-ahead schedule of the
plan's windows (``stream.lookahead``): per chunk it evicts, fetches or reuses each episode's members
(``stream.fetch``; by packets where the index has packet tables, ``stream.packets``), reads its
columns, makes one decode call per (episode, camera) for the chunk's uncached frames, and yields
the chunk's samples (the sample format: ``stream.dataset``). A shard that fails to fetch or decode
is skipped or raised by ``FetchPolicy.on_shard_error``; a skipped window is replaced by a repeat of
the worker's previous sample, flagged ``substitute``.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from epishard.format.errors import FormatError
from epishard.format.streams import read_pieces

from .decode import DecodeError
from .episode import (
    COVER,
    PIECES,
    TIMES,
    VALUES,
    EpisodeInfo,
    columns_nbytes,
    cover_of,
    covered,
    decode_camera,
    decode_camera_packets,
    read_columns,
    read_signals,
    window_rows,
    window_sample,
)
from .fetch import Fetcher, FetchError, FetchPolicy, episode_ranges
from .lookahead import PICTURE_SHARE, Decode, Demand, Load, Lookahead, Scheduler, Step, Store, frame_key
from .memory import release_free_memory
from .mix import MixLayout, camera_streams, column_widths
from .multirate import reach_pieces
from .packets import picture_bytes, plan_runs, readable, run_ranges
from .plan import WorkerPlan
from .source import DatasetSource
from .spec import WindowSpec
from .telemetry import Telemetry
from .transform import PostProcess
from .usercode import from_user_code

__all__ = ["EpochReader", "ReadContext", "episode_bytes", "locate", "sample_frame_bytes"]


def locate(episode_base: np.ndarray, episode: int) -> tuple[int, int]:
    """``(dataset, episode in it)`` of a global episode number.

    ``episode_base``: int64 ``[datasets + 1]``, the first global episode number of each dataset of a mix.
    """
    d = int(np.searchsorted(episode_base, episode, side="right") - 1)
    return d, episode - int(episode_base[d])


@dataclass(frozen=True)
class ReadContext:
    """What one iteration's read loop takes from its ``WindowDataset`` (``WindowDataset.read_context``).

    Attributes:
        sources: the datasets of the mix.
        spec: the window.
        layout: how the mix's samples are laid out (``stream.mix.mix_layout``).
        cam_offsets: per dataset, its camera keys -> frame offsets (int64 arrays).
        normalizers: per dataset, per source in it: column -> normaliser.
        post: the frames' post-processing.
        episode_base: int64 ``[datasets + 1]``: the first global episode number of each dataset.
        fetch: how shard bytes are fetched.
        lookahead: the look-ahead policy.
        defer_float: frames stay uint8 (the collate converts them).
        failed: bool ``[global episodes]``: those of a shard its source failed on open (planned,
            never fetched: their windows are substitutes).
        first_chunk: windows of the first look-ahead chunk (the loader's batch), or None.
        lazy_frames: give picture frames as ``LazyFrames`` (the loader's collate writes them into the batch).
        emit: ``(sample, telemetry) -> sample`` as yielded (the dataset counts it into its cursor and
            attaches telemetry and cost).
    """

    sources: list[DatasetSource]
    spec: WindowSpec
    layout: MixLayout
    cam_offsets: list[dict[str, np.ndarray]]
    normalizers: list[dict]
    post: PostProcess
    episode_base: np.ndarray
    fetch: FetchPolicy
    lookahead: Lookahead
    defer_float: bool
    failed: np.ndarray
    first_chunk: int | None
    lazy_frames: bool
    emit: Callable[[dict, Telemetry], dict]

    def locate(self, episode: int) -> tuple[int, int]:
        """``(dataset, episode in it)`` of a global episode number."""
        return locate(self.episode_base, episode)


class EpochReader:
    """Reads one consumer's windows of a ``WindowDataset`` (its sources, layout, fetch and look-ahead policies).

    One per iteration of a worker: it holds nothing between epochs.
    """

    def __init__(self, ctx: ReadContext):
        self.ctx = ctx
        # Per dataset, the global number of its first camera stream (streams of a mix are numbered on).
        self._stream_base: list[int] = np.cumsum([0, *[s.index.cam_depth.size for s in ctx.sources]]).tolist()
        self._picture_bytes: dict[int, int] = {}  # global stream -> a kept picture's bytes (0: kept as RGB)
        self._signals: dict[int, tuple] = {}  # dataset -> its windows' streams at their own rate (``_signal_parts``)
        # Global episode -> the positions of its windows in the yield order (ascending), and the
        # anchors of that order (``samples``): which stream pieces a load fetches.
        self._positions: dict[int, np.ndarray] = {}
        self._plan_anchors = np.zeros(0, dtype=np.int64)

    def _signal_parts(self, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Dataset ``d``'s streams at their own rate that its windows read (the spec's ``streams``).

        ``(wanted bool [signal entries], decoded bytes int64 [episodes], member bytes int64 [episodes])``:
        the entries the spec names, and per episode what their arrays hold once read and what their
        members weigh (for the look-ahead's budgets).
        """
        if d not in self._signals:
            ix, spec = self.ctx.sources[d].index, self.ctx.layout.specs[d]
            n = ix.num_episodes
            wanted = np.isin(ix.signal_names.to_numpy(zero_copy_only=False), list(spec.streams))
            if not wanted.any():
                zeros = np.zeros(n, dtype=np.int64)
                self._signals[d] = (wanted, zeros, zeros)
            else:
                owner = np.repeat(np.arange(n), np.diff(ix.episode_signals))
                shapes = [ix.signal_shape(int(i)) for i in np.flatnonzero(wanted)]
                width = np.array([int(np.prod(shape, dtype=np.int64)) for shape in shapes], dtype=np.int64)
                decoded = np.zeros(wanted.size, dtype=np.int64)
                decoded[wanted] = ix.signal_count[wanted] * (8 + 8 * width)
                member = np.zeros(wanted.size, dtype=np.int64)
                for i in np.flatnonzero(wanted).tolist():  # every piece: an upper bound of what a load fetches
                    member[i] = int(ix.member_size[ix.signal_pieces(i)[0]].sum())
                self._signals[d] = (
                    wanted,
                    np.bincount(owner, weights=decoded, minlength=n).astype(np.int64),
                    np.bincount(owner, weights=member, minlength=n).astype(np.int64),
                )
        return self._signals[d]

    def _signal_pieces(self, d: int, local: int, episode: int, chunk: int) -> list[int]:
        """Flat member numbers of the stream pieces a load of episode ``local`` of dataset ``d`` fetches.

        Per stream the spec reads, the pieces the episode's windows (global ``episode``) from the
        load's ``chunk`` (a window of the yield order) to ``PIECE_REACH`` chunks' worth of windows
        later can reach (``reach_pieces``): the windows its columns most likely serve while
        cached; a window after them whose pieces are missing fetches them when it is assembled
        (``_cover_pieces``).
        """
        wanted = self._signal_parts(d)[0]
        ix, spec = self.ctx.sources[d].index, self.ctx.layout.specs[d]
        a, b = int(ix.episode_signals[local]), int(ix.episode_signals[local + 1])
        positions = self._positions.get(episode)
        anchors = None
        if positions is not None:
            reach = PIECE_REACH * max(self.ctx.lookahead.horizon, 1)
            lo, hi = np.searchsorted(positions, [chunk, chunk + reach])
            anchors = self._plan_anchors[positions[lo:hi]]
        out: list[int] = []
        for s in (np.flatnonzero(wanted[a:b]) + a).tolist():
            members = ix.signal_pieces(s)[0]
            read = spec.streams[ix.signal_names[s].as_py()]
            if anchors is None or not anchors.size:
                out.extend(members.tolist())
                continue
            out.extend(members[reach_pieces(ix, s, read, anchors=anchors)].tolist())
        return out

    def samples(self, plan: WorkerPlan, skip: int, telemetry: Telemetry):
        """Follow the look-ahead schedule of the plan's windows after the first ``skip`` (``stream.lookahead``).

        Per chunk: evict, fetch or reuse each episode's members, read its columns, one decode call
        per (episode, camera) for the chunk's uncached frames; then yield the chunk's windows from
        the cache and release what no later chunk needs.
        """
        episodes, anchors = plan.episode[skip:], plan.anchor[skip:]
        t0 = time.perf_counter()
        if any(spec.streams for spec in self.ctx.layout.specs):  # which stream pieces each episode's windows reach
            order = np.argsort(episodes, kind="stable")
            unique, starts = np.unique(episodes[order], return_index=True)
            groups = np.split(order.astype(np.int64), starts[1:])
            self._positions = dict(zip(unique.tolist(), groups, strict=True))
            self._plan_anchors = np.asarray(anchors, dtype=np.int64)
        demand = _Demands(self, episodes, anchors)
        policy = self.ctx.lookahead
        if self.ctx.first_chunk and policy.first == Lookahead.first:  # the loader's batch: first batch first
            policy = dataclasses.replace(policy, first=self.ctx.first_chunk)
        steps = Scheduler(demand, policy)
        fetchers = self._fetchers(telemetry)
        slots: list[tuple] = []  # per fetch so far: (dataset, position in its fetcher, sha256s, members)

        def advance() -> Step | None:
            """The next step, its fetches handed to the fetchers (a step ahead, so they go out early)."""
            t = time.perf_counter()
            step = next(steps, None)
            self._fetch_more(
                steps.fetches[len(slots) :],
                steps.fetch_work[len(slots) :],
                fetchers,
                slots,
                steps.fetch_chunk[len(slots) :],
            )
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
                        if self.ctx.failed[load.episode]:
                            raise self._shard_failure(load.episode)
                        self._load(load, fetchers, slots, encoded, store, telemetry)
                    except (FetchError, DecodeError) as exc:  # the shard policy decides, for both
                        # (data faults only: an exception of the user's hook is never skipped)
                        if self.ctx.fetch.on_shard_error == "raise" or from_user_code(exc):
                            raise
                        warnings.warn(f"epishard: skipping episode {self._key(load.episode)}: {exc}", stacklevel=2)
                        telemetry.add(episodes_skipped=1)
                        failed.add(load.episode)
                        first_failure = first_failure or (self.ctx.locate(load.episode)[0], exc)
                        encoded.drop((load.episode,))
                telemetry.add(
                    frame_cache_hits=step.hits, frame_cache_misses=step.misses, frame_cache_evictions=step.evict.size
                )
                telemetry.peak(frame_cache_bytes_peak=store.nbytes, encoded_bytes_peak=encoded.nbytes)
                for i in range(step.start, step.stop):
                    e = int(episodes[i])
                    d, _ = self.ctx.locate(e)
                    if e in failed:
                        # Keep this rank's sample count: repeat the worker's previous sample (of the same
                        # dataset when there is one: batch_by_dataset batches stay one dataset's), flagged.
                        if last is None:
                            owed += 1
                            continue
                        sample = dict(last_of.get(d, last), substitute=True)
                    else:
                        sample = self._window(e, int(anchors[i]), step.keys[i - step.start], store, telemetry)
                    yield self.ctx.emit(sample, telemetry)
                    for _ in range(owed):  # windows of failed episodes that came before any good sample
                        yield self.ctx.emit(dict(sample, substitute=True), telemetry)
                    owed, last = 0, sample
                    last_of[d] = sample
                if first:
                    upcoming, first = advance(), False
                store.drop(step.release)
            if owed:
                assert first_failure is not None  # owed > 0 only after a failure
                failed_dataset, first_error = first_failure
                raise FetchError(
                    f"{self.ctx.sources[failed_dataset].shown}: every episode this worker read failed, so {owed} "
                    f"samples cannot be filled; the first: {first_error}",
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
        d, _ = self.ctx.locate(episode)
        columns, info, _ = store.columns[episode]
        frames: dict[str, Any] = {}  # tensors, or LazyFrames for the loader's collate
        col = 0
        for cam, offsets in self.ctx.cam_offsets[d].items():
            frames[cam] = (
                store.stack(keys[col : col + len(offsets)], lazy=self.ctx.lazy_frames)
                if len(offsets)
                else self._no_frames(d, info, cam)
            )
            col += len(offsets)
        finish = None if self.ctx.defer_float else self.ctx.post.finish
        index = self.ctx.sources[d].index
        spec = self.ctx.layout.specs[d]  # the window in this dataset's rows (its frame rate)
        if spec.streams:
            self._cover_pieces(d, episode, columns, anchor, telemetry)
        sample = window_sample(index, info, columns, anchor, spec, self.ctx.cam_offsets[d], frames, finish)
        sample = self.ctx.layout.apply(sample, d, finish)
        sample["dataset"], sample["substitute"] = d, False
        telemetry.add(assemble_s=time.perf_counter() - t, frames_returned=col)
        return sample

    def _cover_pieces(self, d: int, episode: int, columns: dict, anchor: int, telemetry: Telemetry) -> None:
        """Read the stream pieces this window reaches that its episode's load did not fetch, into ``columns``.

        A load fetches the pieces of its episode's windows over ``PIECE_REACH`` horizons
        (``_signal_pieces``); a later window served by the same cached columns may reach others.
        They are read here, one range per piece, checked by sha256 and the index
        (``read_pieces``), and merged in piece order.

        Raises:
            DecodeError: a piece does not read as the index describes, or its bytes differ
                (naming the episode and the stream).
        """
        spec = self.ctx.layout.specs[d]
        time0 = float(columns["timestamp"][anchor])
        if all(covered(columns, name, read, time0) for name, read in spec.streams.items()):
            return  # the common case: the pieces held cover the window (no index lookup)
        _, local = self.ctx.locate(episode)
        src = self.ctx.sources[d]
        ix = src.index
        t0 = np.asarray([time0], dtype=np.float64)
        for name, s in ix.signals(local).items():
            read = spec.streams.get(name)
            if read is None:
                continue
            present = columns[PIECES + name]
            missing = np.flatnonzero(reach_pieces(ix, s, read, times=t0) & ~present)
            if not missing.size:
                continue
            members, _, counts = ix.signal_pieces(s)
            where = f"episode {ix.key(local)} stream {name}"
            blobs = {}
            for m in members[missing].tolist():
                start, stop = ix.member_ranges(m)
                data = src.read_range(int(ix.shard[local]), int(start), int(stop))
                if hashlib.sha256(data).hexdigest() != ix.member_sha256[m].as_py():
                    raise DecodeError(f"{where}: member {ix.member_names[m].as_py()}: sha256 differs from the index")
                blobs[m] = data
                telemetry.add(bytes_read=len(data))
            try:
                more = read_pieces(ix, s, blobs, where, missing.tolist())
            except FormatError as exc:
                raise DecodeError(str(exc)) from exc
            # Merge in piece order: the kept samples are the present pieces' in order, counts known.
            have = np.flatnonzero(present)
            parts_t: dict[int, np.ndarray] = {}
            parts_v: dict[int, np.ndarray] = {}
            if have.size:
                split_at = np.cumsum(counts[have])[:-1]
                parts_t.update(zip(have.tolist(), np.split(columns[TIMES + name], split_at), strict=True))
                parts_v.update(zip(have.tolist(), np.split(columns[VALUES + name], split_at), strict=True))
            split_more = np.cumsum(counts[missing])[:-1]
            parts_t.update(zip(missing.tolist(), np.split(more.timestamps, split_more), strict=True))
            dtype = columns[VALUES + name].dtype
            parts_v.update(
                zip(missing.tolist(), np.split(more.values.astype(dtype, copy=False), split_more), strict=True)
            )
            order = sorted(parts_t)
            columns[TIMES + name] = np.concatenate([parts_t[k] for k in order])
            columns[VALUES + name] = np.concatenate([parts_v[k] for k in order])
            present = present.copy()
            present[missing] = True
            columns[PIECES + name] = present
            columns[COVER + name] = cover_of(ix, s, present, columns[TIMES + name])

    def _no_frames(self, d: int, info, cam: str) -> torch.Tensor:
        """A camera read at no offsets: ``[0, C, h, w]`` of its prepared dtype."""
        s = info.streams[cam]
        size = _frame_size(self.ctx.post, self.ctx.sources[d].index, np.array([s]))
        depth = bool(self.ctx.sources[d].index.cam_depth[s])
        return torch.empty((0, 1 if depth else 3, *size[0]), dtype=torch.uint16 if depth else torch.uint8)

    def _shard_failure(self, episode: int) -> FetchError:
        """The error of an episode whose shard its source failed on open (``DatasetSource.skipped_shards``)."""
        d, local = self.ctx.locate(episode)
        shard = int(self.ctx.sources[d].index.shard[local])
        return FetchError(self.ctx.sources[d].skipped_shards[shard], shard)

    def _key(self, episode: int) -> str:
        d, local = self.ctx.locate(episode)
        return self.ctx.sources[d].index.key(local)

    def _demand(self, episodes: np.ndarray, anchors: np.ndarray, sizes: Demand) -> Demand:
        """What the windows (global ``episodes``, ``anchors``: int64 ``[n]``) need: ``stream.lookahead.Demand``.

        Frame keys per window and camera as ``LoadedEpisode`` used to compute them: rows clamped
        into the anchor's recording segment, then the index's row-to-frame map; item sizes from the
        index (post-processed frame size, encoded members) and the manifest (column widths), written
        into ``sizes``' per-stream and per-episode arrays (for these windows' episodes; the
        returned ``Demand`` shares them).
        """
        n = episodes.size
        width = max((sum(len(o) for o in offsets.values()) for offsets in self.ctx.cam_offsets), default=0)
        keys = np.full((n, width), -1, dtype=np.int64)
        stream_base = np.cumsum([0, *[s.index.cam_depth.size for s in self.ctx.sources]])
        stream_episode, frame_bytes = sizes.stream_episode, sizes.frame_bytes
        columns_bytes, encoded_bytes = sizes.columns_bytes, sizes.encoded_bytes
        dataset = np.searchsorted(self.ctx.episode_base, episodes, side="right") - 1
        for d, source in enumerate(self.ctx.sources):
            # A failed shard's episodes need nothing (keys -1, sizes 0): none of its index values is used.
            here = np.flatnonzero((dataset == d) & ~self.ctx.failed[episodes])
            if not here.size:
                continue
            ix, base = source.index, int(self.ctx.episode_base[d])
            local = episodes[here] - base
            unique = np.unique(local)
            members = [ix.data_member(unique)]
            col = 0
            packed = np.full(unique.size, self.ctx.fetch.packets)
            for cam, offsets in self.ctx.cam_offsets[d].items():
                streams = ix.camera_streams(cam, unique)
                packed &= readable(ix, streams)
                stream_episode[streams + stream_base[d]] = unique + base
                size = _frame_size(self.ctx.post, ix, streams)
                frame_bytes[streams + stream_base[d]] = np.where(ix.cam_depth[streams], 2, 3) * size[:, 0] * size[:, 1]
                members.append(ix.stream_member[streams])
                if len(offsets):
                    per_window = streams[np.searchsorted(unique, local)]
                    rows = window_rows(ix, local, anchors[here], offsets)
                    frames = ix.frames(per_window[:, None], rows)
                    keys[here, col : col + len(offsets)] = frame_key(per_window[:, None] + stream_base[d], frames)
                col += len(offsets)
            if self.ctx.post.prepares_nothing and packed.any() and self.ctx.lookahead.pictures is not False:
                # Read by packets with nothing to prepare: frames may be kept as decoded pictures
                # (``stream.packets.Picture``), their bytes as the decoder holds them.
                for cam in self.ctx.cam_offsets[d]:
                    streams = ix.camera_streams(cam, unique[packed]) + stream_base[d]
                    kept = self._pictures(d, streams)
                    frame_bytes[streams[kept > 0]] = kept[kept > 0]
            stacked = np.sort(np.stack(members, axis=1), axis=1)
            first = np.ones(stacked.shape, dtype=bool)
            first[:, 1:] = stacked[:, 1:] != stacked[:, :-1]
            _, signal_decoded, signal_members = self._signal_parts(d)
            encoded_bytes[unique + base] = np.sum(np.where(first, ix.member_size[stacked], 0), axis=1)
            encoded_bytes[unique + base] += signal_members[unique]
            # An episode read by its packets (``stream.packets``) fetches, for each load, the groups of
            # pictures that load decodes: its bytes are never kept for another load.
            encoded_bytes[unique[packed] + base] = _NEVER_KEPT
            columns_bytes[unique + base] = ix.num_rows[unique] * self._row_bytes(d) + signal_decoded[unique]
        return Demand(episodes, keys, stream_episode, frame_bytes, columns_bytes, encoded_bytes)

    def _pictures(self, d: int, streams: np.ndarray) -> np.ndarray:
        """Per global stream of dataset ``d`` read by packets, the bytes of a kept picture, or 0 for RGB (int64).

        ``Lookahead.pictures``: None keeps pictures where one holds at most ``PICTURE_SHARE`` of
        its RGB's bytes. Remembered per stream, so a stream's frames are kept one way all epoch.
        """
        ix, base, policy = self.ctx.sources[d].index, self._stream_base[d], self.ctx.lookahead.pictures
        out = np.zeros(streams.size, dtype=np.int64)
        for i, g in enumerate(streams.tolist()):
            kept = self._picture_bytes.get(g)
            if kept is None:
                s = g - base
                w, h = int(ix.cam_width[s]), int(ix.cam_height[s])
                kept = picture_bytes(ix.cam_pix_fmt[s].as_py(), w, h)
                if policy is None and kept > PICTURE_SHARE * 3 * w * h:
                    kept = 0
                self._picture_bytes[g] = kept
            out[i] = kept
        return out

    def _row_bytes(self, d: int) -> int:
        """Bytes per table row of ``read_columns`` in dataset ``d``.

        float32 widths from the manifest (64 when it has no statistics for a column), plus
        frame_index and timestamp.
        """
        names = {
            self.ctx.spec.state_key,
            self.ctx.spec.action_key,
            *self.ctx.spec.extra_columns,
            *self.ctx.spec.column_offsets,
        }
        widths = [max(column_widths(self.ctx.sources[d].manifest, c), default=64) for c in names if c is not None]
        return 16 + 4 * sum(widths)

    def _fetchers(self, telemetry: Telemetry) -> list[Fetcher]:
        """One ``Fetcher`` per dataset, over nothing yet (``_fetch_more`` feeds them)."""
        return [
            Fetcher(
                src,
                [],
                self.ctx.fetch,
                telemetry,
                sparse=self.ctx.fetch.packets and bool(readable(src.index, np.arange(src.index.cam_depth.size)).any()),
            )
            for src in self.ctx.sources
        ]

    def _fetch_more(
        self,
        fetches: list[int],
        work: list[tuple[bool, tuple[Decode, ...]]],
        fetchers: list[Fetcher],
        slots: list[tuple],
        chunks: list[int] | None = None,
    ) -> None:
        """Append the schedule's next ``fetches`` (global episodes, repeats allowed) to the fetchers.

        ``work``: per fetch, its load's (columns read, decode calls) (``Scheduler.fetch_work``);
        ``chunks``: per fetch, the first window of its chunk (``Scheduler.fetch_chunk``: the stream
        pieces fetched are those of the episode's windows from there on, ``_signal_pieces``).
        Appends to ``slots``, per fetch, ``(dataset, position in its fetcher, sha256s, members,
        runs)``: ``runs`` None when the episode's members are fetched whole, else, per global stream
        decoded, ``(runs, starts)`` (``stream.packets``): only the data member (when its columns are
        read) and the byte ranges of those runs are fetched, in that order after the members.
        """
        lists: list[list] = [[] for _ in self.ctx.sources]
        chunks = chunks if chunks is not None else [0] * len(fetches)
        for e, (columns, decodes), chunk in zip(fetches, work, chunks, strict=True):
            d, local = self.ctx.locate(e)
            if self.ctx.failed[e]:  # never fetched: its load fails (``_shard_failure``) before using its slot
                slots.append((d, -1, [], [], None))
                continue
            ix = self.ctx.sources[d].index
            streams = _streams(ix, local, self.ctx.cam_offsets[d])
            runs: dict[int, tuple] | None = None
            if self.ctx.fetch.packets and bool(np.all(readable(ix, streams))):
                ranges = episode_ranges(
                    ix, local, [], columns, self._signal_pieces(d, local, e, chunk) if columns else ()
                )
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
            pieces = self._signal_pieces(d, local, e, chunk) if columns else ()  # (with the columns they are read)
            ranges = episode_ranges(ix, local, streams, pieces=pieces)
            slots.append((d, len(fetchers[d].episodes) + len(lists[d]), ranges.sha256, ranges.members, None))
            lists[d].append((ranges.shard, ranges.ranges))
        for fetcher, more in zip(fetchers, lists, strict=True):
            if more:
                fetcher.extend(more)

    def _load(self, load: Load, fetchers, slots, encoded: _Encoded, store: Store, telemetry: Telemetry) -> None:
        """One episode's work of a step: its members (fetched, or kept), its columns, its decode calls."""
        e = load.episode
        d, local = self.ctx.locate(e)
        ix = self.ctx.sources[d].index
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
            normalizers = self.ctx.normalizers[d][ix.source(local)]
            spec = self.ctx.layout.specs[d]
            columns = read_columns(ix, local, blobs[int(ix.data_member(local))], spec, normalizers)
            if spec.streams:
                columns.update(read_signals(ix, local, blobs, spec))
            store.put_columns(e, columns, EpisodeInfo.of(ix, local, self.ctx.cam_offsets[d]), columns_nbytes(columns))
        if runs is not None:
            self._load_packets(load, ix, local, runs, pieces, store, telemetry)
            return
        base = self._stream_base[d]
        for call in load.decodes:
            s = call.stream - base
            where = f"episode {ix.key(local)} camera {ix.cam_names[s].as_py()}"
            data = blobs[int(ix.stream_member[s])]
            frames, kept = decode_camera(
                ix,
                s,
                call.frames,
                data,
                self.ctx.post,
                where,
                telemetry,
                decoders.get(s),
                self.ctx.lookahead.decode_bytes,
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
        d, _ = self.ctx.locate(load.episode)
        base, at = self._stream_base[d], 0
        for call in load.decodes:
            s = call.stream - base
            planned, starts = runs[call.stream]
            shard = self.ctx.sources[d].shard_path(int(ix.shard[local]))
            where = f"{shard}: episode {ix.key(local)} camera {ix.cam_names[s].as_py()}"
            mine = pieces[at : at + len(planned)]
            at += len(planned)
            frames = decode_camera_packets(
                ix,
                s,
                planned,
                starts,
                mine,
                self.ctx.post,
                where,
                telemetry,
                self.ctx.lookahead.decode_bytes,
                store.alloc,
                pictures=self.ctx.post.prepares_nothing and self._picture_bytes.get(call.stream, 0) > 0,
            )
            store.put_frames(call.stream, call.frames, frames)


def episode_bytes(sources: list[DatasetSource], cam_offsets: list[dict], post: PostProcess) -> tuple[int, int]:
    """Decoded bytes one episode keeps live while its windows are yielded, and one frame of each camera.

    Per camera, the frames of a window's span (rows from its first offset to its last: with
    consecutive anchors each of them is returned by some window) times the post-processed frame
    size (the camera's largest); the largest of the mix (``cam_offsets``: per dataset, camera key ->
    offsets). Bounds the default pool (``stream.shuffle.budget_shuffle_episodes``).
    """
    most = (0, 0)
    for d, source in enumerate(sources):
        total, frames = 0, 0
        for cam, offsets in cam_offsets[d].items():
            if not len(offsets):
                continue
            frame = _largest_frame(source, cam, post)
            total += (int(np.max(offsets)) - int(np.min(offsets)) + 1) * frame
            frames += frame
        most = max(most, (total, frames))
    return most


def sample_frame_bytes(sources: list[DatasetSource], cam_offsets: list[dict], post: PostProcess) -> int:
    """Bytes of one sample's frames at the output dtype (``post.dtype``; depth uint16), the largest of the mix.

    Per camera, its offsets times its largest frame after ``post.prepare``; what a batch of ``B``
    samples holds in frames is ``B`` times this (``WindowLoader`` sizes its batch buffers by it).
    """
    rgb_item = torch.empty(0, dtype=post.dtype).element_size()
    return max(
        (
            sum(
                len(offsets) * _largest_frame(source, cam, post, rgb_item)
                for cam, offsets in cam_offsets[d].items()
                if len(offsets)
            )
            for d, source in enumerate(sources)
        ),
        default=0,
    )


def _largest_frame(source: DatasetSource, cam: str, post: PostProcess, rgb_item: int = 1) -> int:
    """Bytes of camera ``cam``'s largest frame after ``post.prepare``.

    RGB at ``rgb_item`` bytes per sample (uint8: 1), depth at 2.
    """
    ix, streams = source.index, camera_streams(source, cam)
    size = _frame_size(post, ix, streams)
    return int(np.max(np.where(ix.cam_depth[streams], 2, 3 * rgb_item) * size[:, 0] * size[:, 1], initial=0))


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


# A load fetches the stream pieces of its episode's windows over this many horizons of the yield
# order from its chunk on (the windows its cached columns most likely serve).
PIECE_REACH = 2
_NEVER_KEPT = np.iinfo(np.int64).max // 4  # encoded size of an episode read by packets: above any budget


class _Demands:
    """A consumer's ``Demand`` (``stream.lookahead.Demands``), computed a part at a time as the ``Scheduler`` asks.

    The per-stream and per-episode arrays are allocated once (zeros, for every stream and episode
    of the mix) and filled for each part's episodes, so a part costs its own windows.
    """

    def __init__(self, reader: EpochReader, episodes: np.ndarray, anchors: np.ndarray):
        self.reader, self.episodes, self.anchors = reader, episodes, anchors
        ds = reader.ctx
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
        return self.reader._demand(self.episodes[start:stop], self.anchors[start:stop], self.sizes)


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
