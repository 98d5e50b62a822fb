"""Small LeRobot dataset folders (v2.1 and v3.0 layouts) on disk, from ``videogen`` episodes.

Test-support module (not a test file). Video frame ``i`` of a camera shows the number
``camera_base + i`` (``videogen.decode_frame_number`` reads it back), so a test can check which
source frame every row was given. Layouts follow LeRobot's ``meta/info.json`` path templates, and
the meta files are those LeRobot's writers leave (v2.1: ``episodes.jsonl``, ``tasks.jsonl``,
``episodes_stats.jsonl``; v3.0: ``meta/episodes``, ``tasks.parquet``, ``stats.json``), so a
conversion of them takes no fallback (``shardwriter.lerobot``: a missing meta file is a warning).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from videogen import make_episode_table, make_video

V2_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V2_VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
V3_DATA = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V3_VIDEO = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"


def _info(version: str, fps: int, lengths: list[int], cameras: list[str], data: str, video: str) -> dict:
    features = {
        "observation.state": {"dtype": "float32", "shape": [4], "names": None},
        "action": {"dtype": "float32", "shape": [3], "names": None},
        **{cam: {"dtype": "video", "shape": [32, 32, 3], "names": ["height", "width", "channel"]} for cam in cameras},
    }
    return {
        "codebase_version": version,
        "fps": fps,
        "robot_type": "toy",
        "total_episodes": len(lengths),
        "data_path": data,
        "video_path": video,
        "features": features,
    }


def _write_json(path: str, value) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f)


def edit_json(path: str, change) -> None:
    """Replace the JSON value in ``path`` by ``change(value)`` (NaN/Infinity written as Python's
    json writes them)."""
    with open(path) as f:
        value = json.load(f)
    with open(path, "w") as f:
        json.dump(change(value), f)


def table_stats(table: pa.Table) -> dict:
    """LeRobot's statistics of a table's numeric columns (``compute_episode_stats`` of LeRobot 0.4.4).

    Feature -> ``{"min", "max", "mean", "std", "count"}`` over the rows (axis 0; a scalar column
    keeps one dimension, ``[1]``); ``count``: ``[rows]``. Columns of other types are left out.
    """
    out = {}
    for name in table.column_names:
        kind = table.column(name).type
        if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind):
            kind = kind.value_type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
                continue
            data = np.asarray(table.column(name).to_pylist(), dtype=np.float64)
        elif pa.types.is_integer(kind) or pa.types.is_floating(kind):
            data = table.column(name).to_numpy().astype(np.float64)[:, None]
        else:
            continue
        out[name] = {
            "min": data.min(0).tolist(),
            "max": data.max(0).tolist(),
            "mean": data.mean(0).tolist(),
            "std": data.std(0).tolist(),
            "count": [int(data.shape[0])],
        }
    return out


def _write_episodes_stats(root: str, tables: list[pa.Table]) -> None:
    with open(f"{root}/meta/episodes_stats.jsonl", "w") as f:
        f.writelines(json.dumps({"episode_index": e, "stats": table_stats(t)}) + "\n" for e, t in enumerate(tables))


def _table(episode: int, rows: int, fps: int, first_index: int, timestamps=None) -> pa.Table:
    table = make_episode_table(rows, fps=fps)
    table = table.set_column(
        table.column_names.index("episode_index"), "episode_index", pa.array(np.full(rows, episode, np.int64))
    )
    table = table.set_column(
        table.column_names.index("index"), "index", pa.array(np.arange(first_index, first_index + rows, dtype=np.int64))
    )
    if timestamps is not None:
        table = table.set_column(
            table.column_names.index("timestamp"),
            "timestamp",
            pa.array(np.asarray(timestamps, np.float32), pa.float32()),
        )
    return table


def write_v2(
    root: str,
    lengths: list[int],
    cameras: list[str],
    *,
    fps: int = 20,
    declared: list[str] | None = None,
    video_dir: str = "videos",
) -> None:
    """A v2.1 dataset: one parquet and one mp4 per camera per episode (32x32 H.264, gop 8).

    ``declared``: cameras listed in ``meta/info.json`` (default ``cameras``); only ``cameras`` get
    files, stored under ``video_dir`` (``"video"`` misplaces them). Episode ``e``'s frames show
    ``1000 * e + i``. ``meta/tasks.jsonl`` and ``meta/episodes.jsonl`` give every episode the task "fold";
    ``meta/episodes_stats.jsonl`` has each episode's statistics (``table_stats``; no camera's).
    """
    declared = cameras if declared is None else declared
    _write_json(f"{root}/meta/info.json", _info("v2.1", fps, lengths, declared, V2_DATA, V2_VIDEO))
    tables = []
    for e, n in enumerate(lengths):
        path = f"{root}/{V2_DATA.format(episode_chunk=0, episode_index=e)}"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tables.append(_table(e, n, fps, sum(lengths[:e])))
        pq.write_table(tables[-1], path)
        for cam in cameras:
            video = f"{root}/{V2_VIDEO.format(episode_chunk=0, video_key=cam, episode_index=e)}"
            video = video.replace(f"{root}/videos/", f"{root}/{video_dir}/", 1)
            os.makedirs(os.path.dirname(video), exist_ok=True)
            make_video(video, n, fps=fps, height=32, width=32, gop=8, start_number=1000 * e)
    with open(f"{root}/meta/tasks.jsonl", "w") as f:
        f.write(json.dumps({"task_index": 0, "task": "fold"}) + "\n")
    with open(f"{root}/meta/episodes.jsonl", "w") as f:
        f.writelines(
            json.dumps({"episode_index": e, "tasks": ["fold"], "length": n}) + "\n" for e, n in enumerate(lengths)
        )
    _write_episodes_stats(root, tables)


def write_v3(
    root: str,
    lengths: list[int],
    camera: str,
    *,
    fps: int = 20,
    per_file: int = 3,
    end_shift: int = 0,
    timestamps: dict[int, np.ndarray] | None = None,
    absent: tuple[str, ...] = (),
) -> None:
    """A v3.0 dataset: ``per_file`` episodes per data file and per video file (32x32 H.264, gop 8,
    B-frames), one camera. Frame ``i`` of every video file shows ``i`` counted over all files, so
    episode ``e``'s row ``r`` must show ``sum(lengths[:e]) + r``.

    ``end_shift``: frames added to every ``to_timestamp`` (``-1``: the last frame's time, as some
    recorders write it; ``0``: exact; ``1``: one frame long). ``timestamps``: episode -> its
    ``timestamp`` column (default ``frame_index / fps``). ``absent``: more cameras declared, with
    meta/episodes columns like ``camera``'s, but no video files. ``meta/tasks.parquet`` holds the
    one task, "fold"; ``meta/stats.json`` the statistics of all rows (``table_stats``; no camera's).
    """
    _write_json(f"{root}/meta/info.json", _info("v3.0", fps, lengths, [camera, *absent], V3_DATA, V3_VIDEO))
    meta, every = [], []
    for file_index, first in enumerate(range(0, len(lengths), per_file)):
        episodes = range(first, min(first + per_file, len(lengths)))
        base = sum(lengths[:first])
        tables = [_table(e, lengths[e], fps, sum(lengths[:e]), (timestamps or {}).get(e)) for e in episodes]
        data = f"{root}/{V3_DATA.format(chunk_index=0, file_index=file_index)}"
        os.makedirs(os.path.dirname(data), exist_ok=True)
        pq.write_table(pa.concat_tables(tables), data)
        every += tables
        video = f"{root}/{V3_VIDEO.format(video_key=camera, chunk_index=0, file_index=file_index)}"
        os.makedirs(os.path.dirname(video), exist_ok=True)
        make_video(video, sum(lengths[e] for e in episodes), fps=fps, height=32, width=32, gop=8, start_number=base)
        start = 0
        for e in episodes:
            row = {
                "episode_index": e,
                "tasks": ["fold"],
                "length": lengths[e],
                "data/chunk_index": 0,
                "data/file_index": file_index,
            }
            for cam in (camera, *absent):
                row.update(
                    {
                        f"videos/{cam}/chunk_index": 0,
                        f"videos/{cam}/file_index": file_index,
                        f"videos/{cam}/from_timestamp": start / fps,
                        f"videos/{cam}/to_timestamp": (start + lengths[e] + end_shift) / fps,
                    }
                )
            meta.append(row)
            start += lengths[e]
    os.makedirs(f"{root}/meta/episodes/chunk-000", exist_ok=True)
    pq.write_table(pa.Table.from_pylist(meta), f"{root}/meta/episodes/chunk-000/file-000.parquet")
    pq.write_table(pa.table({"task_index": [0], "task": ["fold"]}), f"{root}/meta/tasks.parquet")
    _write_json(f"{root}/meta/stats.json", table_stats(pa.concat_tables(every)))


def write_v2_files(
    root: str,
    tables: list[pa.Table],
    *,
    fps: int = 20,
    videos: dict[str, list[bytes]] | None = None,
    features: dict | None = None,
) -> str:
    """A v2.1 dataset from given parts: episode ``e``'s table ``tables[e]`` and, per camera, its mp4
    ``videos[camera][e]``. ``features`` adds or overrides ``meta/info.json`` feature entries (an
    ``image`` dtype column, ``info: {"video.is_depth_map": true}``). The meta files are
    ``write_v2``'s (task "fold"). Returns ``root``."""
    videos = videos or {}
    info = _info("v2.1", fps, [t.num_rows for t in tables], list(videos), V2_DATA, V2_VIDEO)
    for name, spec in (features or {}).items():
        info["features"][name] = {**info["features"].get(name, {}), **spec}
    _write_json(f"{root}/meta/info.json", info)
    for e, table in enumerate(tables):
        path = f"{root}/{V2_DATA.format(episode_chunk=0, episode_index=e)}"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(table, path)
        for cam, files in videos.items():
            path = f"{root}/{V2_VIDEO.format(episode_chunk=0, video_key=cam, episode_index=e)}"
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(files[e])
    with open(f"{root}/meta/tasks.jsonl", "w") as f:
        f.write(json.dumps({"task_index": 0, "task": "fold"}) + "\n")
    with open(f"{root}/meta/episodes.jsonl", "w") as f:
        f.writelines(
            json.dumps({"episode_index": e, "tasks": ["fold"], "length": t.num_rows}) + "\n"
            for e, t in enumerate(tables)
        )
    _write_episodes_stats(root, tables)
    return root
