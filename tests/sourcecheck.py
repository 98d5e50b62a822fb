"""Read a converted dataset back for the source-format tests: each episode's table, frames and task.

Frames are decoded with PyAV from the shard's video members (the writer has checked the frame
tables against the reader's decoder); ``stream_rows`` goes through the stream reader too.
"""

from __future__ import annotations

import glob
import io
import json
import os
import tarfile

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from epishard.shardwriter.verify import verify
from epishard.stream import WindowDataset, WindowSpec


def decode_member(data: bytes) -> np.ndarray:
    """Every frame of an MP4: uint8 ``[T, H, W, 3]``, or uint16 ``[T, H, W]`` for a grey 16-bit stream."""
    with av.open(io.BytesIO(data)) as c:
        frames = []
        for f in c.decode(video=0):
            if f.format.name.startswith("gray16"):
                frames.append(f.to_ndarray(format="gray16le"))
            else:
                frames.append(f.to_ndarray(format="rgb24"))
    return np.stack(frames)


def read_back(out: str) -> dict[tuple[str, int], dict]:
    """(source, episode index) -> {"table", "frames": {camera: array}, "tasks", "meta"} of every episode."""
    members: dict[str, bytes] = {}
    for shard in sorted(glob.glob(os.path.join(out, "*.tar"))):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m)
                assert f is not None
                members[m.name] = f.read()
    episodes = {}
    for name, data in members.items():
        if not name.endswith(".json"):
            continue
        key = name[: -len(".json")]
        meta = json.loads(data)
        table = pq.read_table(pa.BufferReader(members[f"{key}.parquet"]))
        frames = {cam: decode_member(members[f"{key}.{field}.mp4"]) for field, cam in meta["cameras"].items()}
        episodes[(meta["source"], meta["episode_index"])] = {
            "table": table,
            "frames": frames,
            "tasks": meta["tasks"],
            "meta": meta,
        }
    return episodes


def column(table: pa.Table, name: str) -> np.ndarray:
    """A column as a numpy array ``[T, ...]`` (fixed-size lists stacked)."""
    return np.asarray(table.column(name).to_pylist())


def check_verifies(out: str) -> None:
    """``epishard verify`` (decoding every frame) finds nothing wrong."""
    report = verify(out)
    assert report["ok"], report["problems"]


def stream_rows(out: str, camera: str, **spec_kw) -> dict[tuple[int, int], dict]:
    """(episode index, frame index) -> sample, one window of one frame per row, from the stream reader."""
    spec = WindowSpec(cameras={camera: (0,)}, boundary="inside", **spec_kw)
    return {(int(s["episode_index"]), int(s["frame_index"])): s for s in WindowDataset(out, spec, seed=0)}
