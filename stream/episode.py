"""One episode loaded for a consumer; windows are cut out of it.

It holds its table columns, and every frame its windows need, decoded once per camera (merged
decoding) and post-processed once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from epishard.shardwriter.index import WindowIndex, read_table_bytes
from epishard.shardwriter.stats import numeric_matrix

from .decode import DecodeError, decode, decode_depth
from .spec import WindowSpec
from .telemetry import Telemetry
from .transform import PostProcess


@dataclass
class Normalizer:
    """``(x - shift) / scale`` per dimension, from manifest statistics.

    ``mode``: ``"mean_std"`` (shift mean, scale max(std, eps)) or ``"min_max"`` (to [-1, 1]).
    """

    shift: np.ndarray
    scale: np.ndarray

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any], mode: str, eps: float = 1e-8) -> Normalizer:
        """From a feature's manifest statistics: ``mode`` ``"mean_std"`` or ``"min_max"`` (to [-1, 1])."""
        if mode == "mean_std":
            return cls(np.asarray(stats["mean"], np.float32), np.maximum(np.asarray(stats["std"], np.float32), eps))
        if mode == "min_max":
            lo, hi = np.asarray(stats["min"], np.float32), np.asarray(stats["max"], np.float32)
            return cls((lo + hi) / 2, np.maximum((hi - lo) / 2, eps))
        raise ValueError(f"normalisation mode must be 'mean_std' or 'min_max', not {mode!r}")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``x`` (float32 ``[..., D]``) normalised: ``(x - shift) / scale``."""
        return (x - self.shift) / self.scale


def _clamped(rows: np.ndarray, lo, hi) -> tuple[np.ndarray, np.ndarray]:
    """Rows clamped into the anchor's recording segment ``[lo, hi)``, and pad flags.

    The segment is the episode unless its timestamps reset or jump; the pad flags mark the rows that
    fell outside it.
    """
    pad = (rows < lo) | (rows >= hi)
    return np.clip(rows, lo, hi - 1), pad


def _columns(table: pa.Table, n: int, fps: float, spec: WindowSpec, normalizers: dict[str, Normalizer]) -> dict:
    """The columns windows need, ``n`` rows each (state, action and extras as float32 matrices)."""
    if table.num_rows != n:
        raise ValueError(f"{table.num_rows} rows, the index says {n}")
    columns = {}
    for name in {spec.state_key, spec.action_key, *spec.extra_columns} - {None}:
        matrix = numeric_matrix(table.column(name))
        if matrix is None:
            raise ValueError(f"column {name!r} is not numeric")
        matrix = matrix.astype(np.float32)
        columns[name] = normalizers[name](matrix) if name in normalizers else matrix
    columns["frame_index"] = (
        table.column("frame_index").to_numpy() if "frame_index" in table.column_names else np.arange(n)
    )
    columns["timestamp"] = (
        table.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64)
        if "timestamp" in table.column_names
        else np.arange(n) / fps
    )
    return columns


@dataclass(frozen=True)
class EpisodeInfo:
    """What every window of a loaded episode shares.

    Its ``task`` text, source ``episode_index``,
    ``key``, ``fps``, the index stream of each window camera (``streams``: camera -> stream number)
    and its recording-segment edges (``segments``: int64 ``[S + 1]`` rows, ``WindowIndex.segment_edges``).
    """

    task: str
    episode_index: int
    key: str
    fps: float
    streams: dict[str, int]
    segments: np.ndarray


@dataclass
class LoadedEpisode:
    """An episode's columns and decoded frames, enough to cut all of the given windows.

    Built by ``load`` from the member bytes the fetcher delivered: one decoder and one
    ``get_frames_at`` call per camera for the sorted union of frames of all windows (split only
    past 256 MiB of decoded frames), and post-processing of exactly those frames.
    ``frames[cam]``: prepared uint8 ``[U, 3, H, W]`` (uint16 ``[U, 1, H, W]`` for a depth camera);
    ``positions[cam]``: the U frame numbers.
    """

    episode: int
    num_rows: int
    columns: dict
    frames: dict
    positions: dict
    info: EpisodeInfo

    @classmethod
    def load(
        cls,
        index: WindowIndex,
        episode: int,
        anchors: np.ndarray,
        spec: WindowSpec,
        cam_offsets: dict[str, np.ndarray],
        blobs: dict[int, bytes],
        post: PostProcess,
        normalizers: dict[str, Normalizer],
        telemetry: Telemetry,
    ) -> LoadedEpisode:
        """``blobs``: member number -> bytes, for the data member and the cameras' video members."""
        key, n = index.key(episode), int(index.num_rows[episode])
        names = index.camera_names(episode)
        streams = {cam: index.stream(episode, names.index(cam)) for cam in cam_offsets}
        fps = float(index.fps[episode])
        try:
            columns = _columns(read_table_bytes(blobs[int(index.data_member(episode))]), n, fps, spec, normalizers)
        except (pa.ArrowException, KeyError, ValueError, TypeError) as exc:
            raise DecodeError(
                f"episode {key}: its table does not read as the index describes: {type(exc).__name__}: {exc}"
            ) from exc

        frames, positions = {}, {}
        edges = index.segment_edges(episode)  # recording segments: windows stay inside their anchor's
        k = np.searchsorted(edges, anchors, side="right") - 1
        seg_lo, seg_hi = edges[k], edges[k + 1]
        for cam, offsets in cam_offsets.items():
            s = streams[cam]
            rows, _ = _clamped(anchors[:, None] + offsets[None, :], seg_lo[:, None], seg_hi[:, None])
            rows = rows.ravel()
            unique = np.unique(index.frames(s, rows))
            t1 = time.perf_counter()
            pts, duration, keyflags = index.frame_tables(s)
            keys = index.keyframes_of(s)
            where, data = f"episode {key} camera {cam}", blobs[int(index.stream_member[s])]
            if index.cam_depth[s]:
                decoded = decode_depth(
                    data,
                    unique,
                    pts,
                    keys,
                    where=where,
                    stream_index=int(index.cam_stream_index[s]),
                    post=post.prepare_depth,
                )
            else:
                decoded = decode(
                    data,
                    unique,
                    (pts, duration, keyflags),
                    where=where,
                    stream_index=int(index.cam_stream_index[s]),
                    time_base=float(index.cam_time_base[s]),
                    post=post.prepare,
                    height=int(index.cam_height[s]),
                    width=int(index.cam_width[s]),
                )
            frames[cam], positions[cam] = decoded.frames, unique
            telemetry.add(
                decode_s=time.perf_counter() - t1 - decoded.post_s,
                postprocess_s=decoded.post_s,
                decoder_opens=1,
                decode_calls=decoded.calls,
                frames_decoded=int(index.decoded_frames(s, unique)),
                frames_unique=unique.size,
            )
        info = EpisodeInfo(
            task=index.task(episode),
            episode_index=int(index.episode_index[episode]),
            key=key,
            fps=fps,
            streams=streams,
            segments=edges,
        )
        telemetry.add(episodes_loaded=1)
        return cls(episode, n, columns, frames, positions, info)

    def window(
        self, index: WindowIndex, anchor: int, spec: WindowSpec, cam_offsets: dict[str, np.ndarray], finish=None
    ) -> dict:
        """The sample of the window anchored at row ``anchor`` (see ``WindowDataset`` for keys).

        ``finish``: applied to each camera's frames (``PostProcess.finish``); None leaves them as
        stored (uint8, for a collate that converts them).
        """
        edges = self.info.segments
        k = int(np.searchsorted(edges, anchor, side="right")) - 1
        lo, hi = int(edges[k]), int(edges[k + 1])
        sample: dict = {}
        for cam, offsets in cam_offsets.items():
            rows, pad = _clamped(anchor + offsets, lo, hi)
            frames = index.frames(self.info.streams[cam], rows)
            picked = np.searchsorted(self.positions[cam], frames)
            frames = self.frames[cam].index_select(0, torch.from_numpy(picked))  # 50x faster than x[idx] for uint8
            depth = index.cam_depth[self.info.streams[cam]]  # depth stays uint16: never scaled as an image
            sample[cam] = finish(frames) if finish is not None and not depth else frames
            sample[f"{cam}_is_pad"] = torch.from_numpy(pad)
        if spec.state_key:
            rows, pad = _clamped(anchor + np.asarray(spec.state_offsets), lo, hi)
            sample[spec.state_key] = torch.from_numpy(self.columns[spec.state_key][rows])
            sample[f"{spec.state_key}_is_pad"] = torch.from_numpy(pad)
        if spec.action_key and spec.action_horizon:
            rows, pad = _clamped(anchor + np.arange(spec.action_horizon), lo, hi)
            sample[spec.action_key] = torch.from_numpy(self.columns[spec.action_key][rows])
            sample[f"{spec.action_key}_is_pad"] = torch.from_numpy(pad)
        for name in spec.extra_columns:
            sample[name] = torch.from_numpy(self.columns[name][anchor])
        sample["task"] = self.info.task
        sample["episode_index"] = self.info.episode_index
        sample["frame_index"] = int(self.columns["frame_index"][anchor])
        sample["timestamp"] = float(self.columns["timestamp"][anchor])
        return sample
