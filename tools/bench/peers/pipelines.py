"""The peer pipelines (webdataset, naive) and the timed collate functions; they run inside DataLoader workers."""

from __future__ import annotations

import json
import time

from .config import COUNTERS, HORIZON, SPAN, STEP


def clamped(rows, n: int):
    """``rows`` (int64 array) clamped into an episode of ``n`` rows, and bool pad flags (as LeRobot's ``_is_pad``)."""
    import numpy as np

    return np.clip(rows, 0, n - 1), (rows < 0) | (rows >= n)


class _SpanDecoder:
    """What the webdataset and naive pipelines do per sample: per camera a fresh decoder on the
    video's bytes, ``get_frames_at`` for the window's distinct frames (decoded from the keyframe
    before each; only those converted to RGB), only those frames converted to float32."""

    def __init__(self, root: str, dtype: str):
        self.root, self.dtype = root, dtype
        self.index = None

    def _open(self) -> None:
        if self.index is None:
            from epishard.shardwriter import WindowIndex

            self.index = WindowIndex.load_dataset(self.root)

    def window(self, episode: int, anchor: int, videos: dict, table, counters: dict) -> dict:
        """``videos``: camera name -> member bytes; ``table``: the episode's pyarrow table."""
        import numpy as np
        import torch
        from torchcodec.decoders import VideoDecoder

        from epishard.format.stats import numeric_matrix

        ix, n = self.index, int(self.index.num_rows[episode])
        names = ix.camera_names(episode)
        offsets = np.arange(0, SPAN, STEP)
        sample = {}
        rows, pad = clamped(anchor + offsets, n)
        for cam in sorted(videos):
            s = ix.stream(episode, names.index(cam))
            wanted = ix.frames(s, rows)
            kept = np.unique(wanted)
            t0 = time.perf_counter()
            decoder = VideoDecoder(videos[cam], dimension_order="NCHW", num_ffmpeg_threads=1)
            frames = decoder.get_frames_at(kept.tolist()).data  # decodes from each keyframe; RGB only for these
            t1 = time.perf_counter()
            if self.dtype == "float32":
                frames = frames.to(torch.float32) / 255.0  # only the frames kept, as LeRobot's output
            t2 = time.perf_counter()
            sample[cam] = frames[torch.from_numpy(np.searchsorted(kept, wanted))]
            sample[f"{cam}_is_pad"] = torch.from_numpy(pad)
            counters["decode_s"] += t1 - t0
            counters["postprocess_s"] += t2 - t1
            counters["frames_decoded"] += int(ix.decoded_frames(s, kept))
            counters["frames_returned"] += offsets.size
            counters["frames_unique"] += kept.size
            counters["decoder_opens"] += 1
        t3 = time.perf_counter()
        state = numeric_matrix(table.column("observation.state")).astype(np.float32)
        action = numeric_matrix(table.column("action")).astype(np.float32)
        rows, pad = clamped(anchor + np.arange(HORIZON), n)
        sample["observation.state"] = torch.from_numpy(state[[anchor]])
        sample["action"] = torch.from_numpy(action[rows])
        sample["action_is_pad"] = torch.from_numpy(pad)
        sample["episode_index"] = episode
        sample["frame_index"] = anchor
        counters["assemble_s"] += time.perf_counter() - t3
        sample["__counters__"] = torch.tensor([counters[k] for k in COUNTERS], dtype=torch.float64)
        return sample


class TarWindows(_SpanDecoder):
    """webdataset ``map`` stage: one episode sample (``json``, ``parquet``, ``<field>.mp4`` bytes) ->
    the window at one random anchor."""

    def __init__(self, root: str, dtype: str, seed: int):
        super().__init__(root, dtype)
        self.seed, self.rng, self.episode_of_key = seed, None, None

    def __call__(self, sample: dict) -> dict:
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq
        import torch

        if self.index is None:
            self._open()
            self.episode_of_key = {self.index.key(e): e for e in range(self.index.num_episodes)}
            info = torch.utils.data.get_worker_info()
            self.rng = np.random.default_rng([self.seed, info.id if info else 0])
        counters = dict.fromkeys(COUNTERS, 0.0)
        counters["bytes_read"] = sum(len(v) for k, v in sample.items() if isinstance(v, bytes))
        t = time.perf_counter()
        meta = json.loads(sample["json"])
        table = pq.read_table(pa.BufferReader(sample["parquet"]))
        counters["read_s"] += time.perf_counter() - t
        episode = self.episode_of_key[sample["__key__"]]
        anchor = int(self.rng.integers(int(meta["num_rows"])))
        videos = {cam: sample[f"{field}.mp4"] for field, cam in meta["cameras"].items()}
        return self.window(episode, anchor, videos, table, counters)


class NaiveWindows(_SpanDecoder):
    """Map-style: item ``i`` is the ``i``-th (episode, anchor) of the dataset; members are read by
    the index's byte offsets (a fresh file open per sample)."""

    def __init__(self, root: str, dtype: str):
        import numpy as np

        from epishard.stream import DatasetSource

        super().__init__(root, dtype)
        self.source = DatasetSource(root)
        self.cameras = self.source.cameras
        rows = self.source.index.num_rows
        self.start = np.r_[0, np.cumsum(rows)]
        self.index = None  # re-opened (memory-mapped) in each worker

    def __len__(self) -> int:
        return int(self.start[-1])

    def _read(self, shard: int, offset: int, size: int) -> bytes:
        with open(self.source.shard_path(shard), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def __getitem__(self, i: int) -> dict:
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._open()
        ix = self.index
        episode = int(np.searchsorted(self.start, i, side="right") - 1)
        anchor = int(i - self.start[episode])
        counters = dict.fromkeys(COUNTERS, 0.0)
        t = time.perf_counter()
        shard = int(ix.shard[episode])
        names = ix.camera_names(episode)
        start, stop = ix.member_ranges(ix.data_member(episode))
        table_bytes = self._read(shard, int(start), int(stop - start))
        videos = {}
        for cam in self.cameras:
            s = ix.stream(episode, names.index(cam))
            videos[cam] = self._read(shard, int(ix.cam_offset[s]), int(ix.cam_size[s]))
        table = pq.read_table(pa.BufferReader(table_bytes))
        counters["read_s"] += time.perf_counter() - t
        counters["bytes_read"] = len(table_bytes) + sum(len(v) for v in videos.values())
        return self.window(episode, anchor, videos, table, counters)


def timed_collate(samples: list[dict]) -> dict:
    """``default_collate`` with its time added as ``__collate_s__`` (float64 seconds)."""
    import torch
    from torch.utils.data import default_collate

    t = time.perf_counter()
    batch = default_collate(samples)
    batch["__collate_s__"] = torch.tensor(time.perf_counter() - t, dtype=torch.float64)
    return batch


class TimedCollate:
    """Wraps a collate function and adds its time as ``__collate_s__``."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, samples: list[dict]) -> dict:
        import torch

        t = time.perf_counter()
        batch = self.fn(samples)
        batch["__collate_s__"] = torch.tensor(time.perf_counter() - t, dtype=torch.float64)
        return batch
