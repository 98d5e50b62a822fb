"""Tile a LeRobot v3.0 dataset: ``k`` copies of its episodes as one dataset of ``k x E`` episodes.

Batch diversity can only be compared on datasets with many more episodes than a batch holds (the
real test datasets have 4-5): a tiled dataset stands in for a large one. Copy ``t`` of episode
``e`` is episode ``t x E + e``: the same rows (``episode_index`` and ``index`` renumbered,
``frame_index`` and ``timestamp`` kept) and the same video segment: its ``meta/episodes`` row points
at the original video file and timestamps, so no video byte is copied (the ``videos/`` folder is
a symlink to the original's). ``meta/tasks.parquet`` and ``meta/stats.json`` are the original's
(tiling leaves every statistic but the counts unchanged); ``info.json`` gets the new totals;
``TILED.json`` records where it came from.

LeRobot reads the tiled folder as it is; ``epishard convert`` converts it (each episode cut from the
shared file, so its shards do hold ``k`` copies of the bytes, as a real dataset of that size would).

    python -m peers.tile SRC OUT --min-episodes 200       (from tools/bench/)
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

DATA_FILE = "data/chunk-000/file-000.parquet"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"


def tiles_for(episodes: int, min_episodes: int) -> int:
    """Copies needed for at least ``min_episodes`` episodes (at least 1)."""
    return max(1, math.ceil(min_episodes / max(episodes, 1)))


def tile(src: str | Path, out: str | Path, min_episodes: int) -> Path:
    """Write the tiled copy of the v3.0 dataset ``src`` into ``out`` (replaced if it is an older tiling).

    Returns ``out``. A finished tiling of the same source and count (``TILED.json``) is kept as is.

    Raises:
        ValueError: ``src`` is not a v3.0 dataset, or its data rows are not one contiguous
            ``index`` range (the renumbering assumes it).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    src, out = Path(src).resolve(), Path(out)
    info = json.loads((src / "meta" / "info.json").read_text())
    if not str(info.get("codebase_version", "")).startswith("v3"):
        raise ValueError(f"{src}: tiling needs a LeRobot v3.0 dataset, not {info.get('codebase_version')}")
    data = pq.read_table([str(p) for p in sorted((src / "data").rglob("*.parquet"))])
    episodes = pq.read_table([str(p) for p in sorted((src / "meta" / "episodes").rglob("*.parquet"))])
    rows, count = data.num_rows, episodes.num_rows
    k = tiles_for(count, min_episodes)
    stamp = {"source": str(src), "tiles": k, "episodes": k * count, "frames": k * rows}
    marker = out / "TILED.json"
    if marker.exists() and json.loads(marker.read_text()) == stamp:
        return out
    index = data.column("index").to_numpy()
    if index.tolist() != list(range(int(index[0]), int(index[0]) + rows)):
        raise ValueError(f"{src}: data rows' index is not one contiguous range; cannot renumber copies")
    shutil.rmtree(out, ignore_errors=True)
    (out / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    (out / "data" / "chunk-000").mkdir(parents=True)
    os.symlink(src / "videos", out / "videos", target_is_directory=True)
    for name in ("tasks.parquet", "stats.json"):
        if (src / "meta" / name).exists():
            shutil.copyfile(src / "meta" / name, out / "meta" / name)

    def shifted(table: pa.Table, column: str, by: int) -> pa.Table:
        """``table`` with integer ``column`` plus ``by`` (a tile's episode and frame indices)."""
        i = table.schema.get_field_index(column)
        col = table.column(i)
        return table.set_column(i, table.field(i), pc.add(col, pa.scalar(by, col.type)))

    data_parts, episode_parts = [], []
    for t in range(k):
        d = shifted(shifted(data, "episode_index", t * count), "index", t * rows)
        e = shifted(episodes, "episode_index", t * count)
        for column in ("dataset_from_index", "dataset_to_index"):  # LeRobot writes them; they may be absent
            if column in e.column_names:
                e = shifted(e, column, t * rows)
        for column in ("data/chunk_index", "data/file_index", "meta/episodes/chunk_index", "meta/episodes/file_index"):
            if column in e.column_names:  # every copy's rows are in the one data file and episodes file
                i = e.schema.get_field_index(column)
                e = e.set_column(i, e.field(i), pa.array([0] * count, e.field(i).type))
        data_parts.append(d)
        episode_parts.append(e)
    pq.write_table(pa.concat_tables(data_parts), out / DATA_FILE)
    pq.write_table(pa.concat_tables(episode_parts), out / EPISODES_FILE)
    info.update(total_episodes=k * count, total_frames=k * rows, splits={"train": f"0:{k * count}"})
    (out / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    marker.write_text(json.dumps(stamp, indent=1))
    return out


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--min-episodes", type=int, default=200)
    a = p.parse_args()
    print(tile(a.src, a.out, a.min_episodes))
