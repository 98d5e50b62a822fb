"""Re-read a converted dataset and check it against its manifest and indexes.

Checks everything the reader relies on. The manifest: every field the reader uses, file names plain
(``shardwriter.validate``), before any file it names is opened. ``index.arrow``: its sha256, schema
and value bounds, and that it holds exactly the per-shard indexes. Per shard: the tar and index
exist as regular files, sizes and sha256 match the manifest; the index's schema; every tar member
lies exactly where the index says (data offset and size) and has the indexed sha256; an episode's
members are contiguous; its table has the indexed number of rows; and per episode and camera
(unless ``decode=False``), every frame of the video decodes through the reader's decoder with the
pts and pixels its frame table promises (``video.check_frames``: in order, and after a seek to each
keyframe).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import sys
import tarfile
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from . import format as fmt
from .index import WindowIndex, read_table_bytes
from .storage import NotARegularFile, Storage
from .validate import FormatError, check_index, check_index_table, check_index_version
from .video import check_frames

log = logging.getLogger(__name__)


def _problem(shard: str, message: str, **where) -> dict:
    return {"shard": shard, **where, "message": message}


def _check_video(data: bytes, cam: dict, tables: tuple, shard: str, key: str) -> list[dict]:
    """``tables``: the stream's (pts, duration, keyframe flags), ``WindowIndex.frame_tables``; their
    bounds and the row-to-frame map were checked with the index (``validate.check_index``).
    """
    problem = check_frames(data, *tables, Fraction(cam["time_base_num"], cam["time_base_den"]), cam.get("stream_index"))
    if problem is None:
        return []
    return [_problem(shard, f"the frame table disagrees with the video: {problem}", episode=key, camera=cam["name"])]


def _check_shard(
    storage: Storage, entry: fmt.ShardEntry, manifest: fmt.Manifest, decode: bool
) -> tuple[list[dict], pa.Table | None]:
    """Problems of one shard, and its index table when that is sound (else None)."""
    shard = entry.shard
    for name in (shard, entry.index):
        if not storage.exists(name):
            return [_problem(shard, f"missing file {storage.path(name)}")], None
    problems = []
    if storage.size(shard) != entry.size:
        problems.append(_problem(shard, f"size {storage.size(shard)} != manifest {entry.size}"))
    with storage.open(shard) as f:
        if _sha256(f) != entry.sha256:
            problems.append(_problem(shard, "sha256 differs from the manifest"))
    index_bytes = storage.read(entry.index)
    if hashlib.sha256(index_bytes).hexdigest() != entry.index_sha256:
        problems.append(_problem(shard, f"index {entry.index} sha256 differs from the manifest"))
    try:
        table = read_table_bytes(index_bytes)
        check_index_version(table.schema, manifest.format_version, storage.path(entry.index))
        table = table.replace_schema_metadata(None)
        check_index_table(table, storage.path(entry.index), shard_column=False)
        index = WindowIndex(table, np.zeros(table.num_rows, dtype=np.int32))
        cameras = dict.fromkeys(manifest.cameras)  # per-camera episode counts are dataset-wide: not checked here
        check_index(index, [entry], cameras, storage.path(entry.index))
    except (pa.ArrowException, FormatError) as exc:
        return [*problems, _problem(shard, f"index {entry.index} does not read: {exc}")], None
    rows = table.to_pylist()
    try:
        with storage.open(shard) as f, tarfile.open(fileobj=f) as tar:
            members = {m.name: m for m in tar.getmembers()}
            order = [m.name for m in tar.getmembers()]
            for episode, row in enumerate(rows):
                problems += _check_episode(f, members, order, row, shard, index if decode else None, episode)
    except tarfile.TarError as exc:
        problems.append(_problem(shard, f"tar does not parse: {exc}"))
    return problems, table


def _sha256(f) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def _check_episode(
    f, members: dict, order: list[str], row: dict, shard: str, index: WindowIndex | None, episode: int
) -> list[dict]:
    """Problems of one episode (row ``episode`` of the shard's index); its videos are decoded when
    ``index`` is given.
    """
    key, problems = row["key"], []
    names = [m["name"] for m in row["members"]]
    if any(n not in members for n in names):
        return [_problem(shard, f"members missing from the tar: {[n for n in names if n not in members]}", episode=key)]
    first = order.index(names[0])
    if order[first : first + len(names)] != names:
        problems.append(_problem(shard, "episode members are not contiguous in index order", episode=key))
    blobs = {}
    for m in row["members"]:
        info = members[m["name"]]
        if (info.offset_data, info.size) != (m["offset"], m["size"]):
            problems.append(
                _problem(
                    shard,
                    f"member {m['name']} at ({info.offset_data}, {info.size}) in the tar, "
                    f"index says ({m['offset']}, {m['size']})",
                    episode=key,
                )
            )
            continue
        f.seek(m["offset"])
        blobs[m["name"]] = data = f.read(m["size"])
        if hashlib.sha256(data).hexdigest() != m["sha256"]:
            problems.append(_problem(shard, f"member {m['name']} sha256 differs from the index", episode=key))
    data = next((blobs.get(m["name"]) for m in row["members"] if m["name"].endswith("." + fmt.DATA_EXT)), None)
    if data is not None:
        try:
            rows = pq.read_metadata(pa.BufferReader(data)).num_rows
            if rows != row["num_rows"]:
                problems.append(_problem(shard, f"table holds {rows} rows, index says {row['num_rows']}", episode=key))
        except pa.ArrowException as exc:
            problems.append(_problem(shard, f"table does not read: {exc}", episode=key))
    if index is not None:
        for c, cam in enumerate(row["cameras"]):
            name = row["members"][cam["member"]]["name"]
            if name in blobs:
                problems += _check_video(blobs[name], cam, index.frame_tables(index.stream(episode, c)), shard, key)
    return problems


def verify(root: str, decode: bool = True, storage_options: dict | None = None, progress: bool = False) -> dict:
    """Verify the dataset at ``root`` (local folder or fsspec URL); return
    ``{"ok": bool, "shards": n, "episodes": n, "problems": [...]}``.

    Each problem names the shard, and where it applies the episode key and camera. ``progress``: a
    progress bar on stderr over the shards.

    Raises:
        FileNotFoundError: no such folder or bucket. PermissionError: access denied.
        shardwriter.validate.FormatError (a ValueError): ``manifest.json`` breaks the format
            (nothing it names is opened then). NotARegularFile: it is a FIFO, directory or device.
    """
    storage = Storage(root, storage_options)
    if not storage.exists(fmt.MANIFEST_NAME):
        if not storage.names():  # raises for a missing bucket or denied access
            raise FileNotFoundError(errno.ENOENT, "no such dataset folder (or it is empty)", root)
        return {
            "ok": False,
            "shards": 0,
            "episodes": 0,
            "problems": [{"shard": None, "message": f"no {fmt.MANIFEST_NAME} in {root} (conversion unfinished?)"}],
        }
    manifest = fmt.Manifest.load(storage.read(fmt.MANIFEST_NAME), f"{storage.url}/{fmt.MANIFEST_NAME}")
    problems, tables = [], []
    for entry in tqdm(manifest.shards, unit="shard", desc="verify", disable=not progress, file=sys.stderr):
        try:
            found, table = _check_shard(storage, entry, manifest, decode)
        except NotARegularFile as exc:
            found, table = [_problem(entry.shard, str(exc))], None
        log.info("%s: %s", entry.shard, f"{len(found)} problem(s)" if found else "ok")
        problems += found
        tables.append(table)
    problems += _check_dataset_index(storage, manifest, tables)
    return {
        "ok": not problems,
        "shards": len(manifest.shards),
        "episodes": manifest.totals.episodes,
        "problems": problems,
    }


def _check_dataset_index(storage: Storage, manifest: fmt.Manifest, shard_tables: list) -> list[dict]:
    """``index.arrow``: sha256 as in the manifest, the format's schema, values in bounds, and the
    same rows as the per-shard indexes (``shard_tables``, None where a shard's index is unsound).
    """
    name = manifest.index.file
    where = storage.path(name)
    try:
        if not storage.exists(name):
            return [{"shard": None, "message": f"{name} is missing"}]
        data = storage.read(name)
        if hashlib.sha256(data).hexdigest() != manifest.index.sha256:
            return [{"shard": None, "message": f"{name} sha256 differs from the manifest"}]
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
        check_index_version(table.schema, manifest.format_version, where)
        check_index_table(table, where, shard_column=True)
        check_index(WindowIndex.from_dataset_table(table), manifest.shards, manifest.camera_episodes(), where)
    except (FormatError, pa.ArrowException, NotARegularFile) as exc:
        return [{"shard": None, "message": f"{name}: {exc}"}]
    if all(t is not None for t in shard_tables) and shard_tables:
        shards = pa.concat_tables(shard_tables)
        expected_shard = np.repeat(np.arange(len(shard_tables), dtype=np.int32), [t.num_rows for t in shard_tables])
        if not table.drop_columns(["shard"]).replace_schema_metadata(None).equals(shards) or not np.array_equal(
            table.column("shard").to_numpy(), expected_shard
        ):
            return [{"shard": None, "message": f"{name} differs from the per-shard indexes"}]
    return []
