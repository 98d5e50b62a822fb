"""The per-shard window index: written next to each shard, loaded as flat columnar arrays.

On disk an index is a Parquet file with one row per episode (schema ``manifest.INDEX_SCHEMA``) and
a JSON document under the schema metadata key ``epishard.shard`` (the shard's name, size, sha256,
plan digest and conversion report). In memory, ``WindowIndex`` holds numpy arrays only: nested
lists become one flat values array plus an offsets array (Arrow's own list layout), so loading
tens of thousands of episodes takes milliseconds, lookups are O(1) array reads, and the arrays are
shared copy-on-write by forked DataLoader workers without per-episode Python objects.

``WindowIndex`` is the only view of an index: the index's Arrow table (a shard's Parquet, or
``index.arrow``) is read, built and kept in this module alone, and every other module uses the
arrays and vectorised lookups of ``WindowIndex`` (``tests/test_architecture.py`` checks it).

Internal: import from ``epishard.format``.
"""

from __future__ import annotations

import functools
import io
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.parquet as pq

from .errors import FormatError
from .manifest import (
    DATA_EXT,
    DATASET_INDEX_NAME,
    INDEX_SCHEMA,
    MANIFEST_NAME,
    STREAM_TYPE,
    STREAMS_INDEX_SCHEMA,
    VERSION_KEY,
    Manifest,
)
from .untrusted import loads, read_local
from .validate import check_index_table, check_index_version, check_stream_packets

__all__ = [
    "CameraLookup",
    "PacketTable",
    "WindowIndex",
    "camera_row_frames",
    "dataset_index_bytes",
    "encode_index",
    "read_shard_meta",
    "read_table_bytes",
]

_SHARD_META_KEY = b"epishard.shard"


def _plain(value):
    return value.tolist() if isinstance(value, np.ndarray) else value


def _clean_rows(rows: list[dict]) -> list[dict]:
    """Rows with numpy arrays in their camera entries turned into lists, as pyarrow takes them.

    When any row has streams (a version-3 index), a row without holds an empty ``streams`` list.
    """
    streams = any(row.get("streams") for row in rows)
    return [
        {
            **row,
            "cameras": [{k: _plain(v) for k, v in cam.items()} for cam in row["cameras"]],
            **({"streams": row.get("streams") or []} if streams else {}),
        }
        for row in rows
    ]


def _schema_of(rows: list[dict]) -> pa.Schema:
    """``STREAMS_INDEX_SCHEMA`` (format version 3) when a row has streams, else ``INDEX_SCHEMA`` (version 2).

    A shard whose episodes carry no stream keeps the version-2 layout byte for byte.
    """
    return STREAMS_INDEX_SCHEMA if any(row.get("streams") for row in rows) else INDEX_SCHEMA


def _unify(tables: list[pa.Table]) -> list[pa.Table]:
    """Index tables of one dataset made concatenable: a ``streams`` column (empty lists) where one lacks it.

    A dataset of format version 3 may hold shards of version-2 layout (none of their episodes had a
    stream): they have no ``streams`` column.
    """
    if not any("streams" in t.column_names for t in tables):
        return tables
    out = []
    for t in tables:
        if "streams" not in t.column_names:
            empty = pa.array([[]] * t.num_rows, type=pa.list_(STREAM_TYPE))
            at = t.schema.get_field_index("shard")
            t = t.append_column("streams", empty) if at < 0 else t.add_column(at, "streams", empty)
        out.append(t)
    return out


def encode_index(rows: list[dict], shard_meta: dict) -> bytes:
    """Serialise index rows (dicts following ``INDEX_SCHEMA``) and shard metadata to Parquet bytes.

    Rows with streams (a ``streams`` list) make a version-3 index (``STREAMS_INDEX_SCHEMA``).
    """
    clean = _clean_rows(rows)
    base = _schema_of(rows)
    schema = base.with_metadata({**base.metadata, _SHARD_META_KEY: json.dumps(shard_meta, sort_keys=True).encode()})
    table = pa.Table.from_pylist(clean, schema=schema)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def read_table_bytes(data: bytes) -> pa.Table:
    """A Parquet file held in memory (an index or an episode's data member), read in the calling thread.

    ``pq.read_table`` would start Arrow's CPU and I/O thread pools, which then stay alive
    until the process exits; pool threads alive during the C++ teardown at interpreter exit are a
    known cause of ``terminate called without an active exception`` aborts (apache/arrow#34314,
    #39862). These tables are small: threads gain nothing here.
    """
    return pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)


def dataset_index_bytes(index_files: list[bytes]) -> bytes:
    """Concatenate per-shard index files (Parquet bytes, in shard order) into one Arrow IPC file.

    The file is uncompressed, with an int32 ``shard`` column, so it can be memory-mapped (``WindowIndex.load_dataset``).
    Its schema metadata holds the format version (``manifest.VERSION_KEY``), as each shard index's does.
    """
    tables = _unify([read_table_bytes(data).replace_schema_metadata(None) for data in index_files])
    table = pa.concat_tables(tables)
    shard = np.repeat(np.arange(len(tables), dtype=np.int32), [t.num_rows for t in tables])
    table = table.append_column("shard", pa.array(shard))
    return _dataset_table_bytes(table)


def _dataset_table_bytes(table: pa.Table, batch_rows: int | None = None) -> bytes:
    """An ``index.arrow`` file of ``table`` (index columns plus ``shard``), the format's version stated.

    One record batch (``batch_rows`` None; a number: at most that many rows per batch, for
    benchmarks of older files): a reader maps every column of the file as one array, without
    copying (``WindowIndex.read_dataset_index``); Arrow's default of 64K-row batches made every
    reader concatenate the nested columns, about 1 s per million episodes.
    """
    sink = pa.BufferOutputStream()
    _write_dataset_table(table, sink, batch_rows)
    return sink.getvalue().to_pybytes()


def _write_dataset_table(table: pa.Table, sink, batch_rows: int | None = None) -> None:
    """Write ``table`` (index columns plus ``shard``) to ``sink`` (a path or Arrow output stream) as ``index.arrow``.

    ``batch_rows`` as ``_dataset_table_bytes`` takes it.
    """
    schema = STREAMS_INDEX_SCHEMA if "streams" in table.column_names else INDEX_SCHEMA
    table = table.combine_chunks().replace_schema_metadata({VERSION_KEY: schema.metadata[VERSION_KEY]})
    feather.write_feather(table, sink, compression="uncompressed", chunksize=batch_rows or max(table.num_rows, 1))


def read_shard_meta(source) -> dict:
    """Return the ``epishard.shard`` JSON of an index file (path or file object) without reading rows."""
    meta = pq.read_schema(source).metadata or {}
    if _SHARD_META_KEY not in meta:
        raise ValueError(f"{source}: not an epishard index (no {_SHARD_META_KEY.decode()} metadata)")
    return loads(meta[_SHARD_META_KEY], f"{source}: schema metadata {_SHARD_META_KEY.decode()}")


def _one(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as one array: its only chunk as it is (no copy: ``index.arrow`` has one), else concatenated."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def _flat(list_array: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """(values, int64 offsets) of a list array, offsets rebased to start at 0."""
    list_array = _one(list_array)
    offsets = list_array.offsets.to_numpy().astype(np.int64)
    values = list_array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    return values, offsets - offsets[0]


def _np(array: pa.Array, dtype) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _flat_np(list_array: pa.Array | pa.ChunkedArray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(values as ``dtype``, int64 offsets from 0) of a list array of numbers."""
    values, offsets = _flat(list_array)
    return _np(values, dtype), offsets


@dataclass(frozen=True)
class PacketTable:
    """One camera stream's packets in file (decode) order (``WindowIndex.packets``).

    ``offset``, ``size``: int64 ``[P]`` byte offset in the video member and length of each packet;
    ``frame``: int64 ``[P]`` the frame (presentation order) each packet shows, -1 for none;
    ``crc32``: uint32 ``[P]`` of each packet's bytes; ``extradata``: the decoder configuration.
    """

    offset: np.ndarray
    size: np.ndarray
    frame: np.ndarray
    crc32: np.ndarray
    extradata: bytes

    @functools.cached_property
    def frame_packet(self) -> np.ndarray:
        """int64 ``[num_frames]``: the packet that shows each frame."""
        shown = np.flatnonzero(self.frame >= 0)
        out = np.full(int(self.frame.max(initial=-1)) + 1, -1, dtype=np.int64)
        out[self.frame[shown]] = shown
        return out


@dataclass
class CameraLookup:
    """Where one camera's frames for one window lie.

    Shard number, byte range of the video member in the shard, frame numbers (int64 ``[n]``) in that
    video, and the keyframe to start decoding at.
    """

    shard: int
    offset: int
    size: int
    frames: np.ndarray
    keyframe: int


class WindowIndex:
    """The indexes of one or more shards, as flat numpy arrays: the only view of an index.

    Every reader of an index (fetcher, episode loader, cost model, ``verify``, ``inspect``, the
    converter's summary) goes through the arrays and lookups here; the Arrow table they come from
    is private to this module.

    Episode arrays have one entry per episode (``num_episodes``; ``shard``, ``num_rows``,
    ``episode_index``, ``fps``, ``window_start``, ``window_stop``). Member arrays have one entry per
    tar member (``member_offset``, ``member_size`` in bytes; ``member_names``, ``member_sha256``),
    grouped by episode through ``episode_members`` offsets (int64 ``[num_episodes + 1]``). Camera-stream
    arrays have one entry per (episode, camera) (``cam_*``; ``stream_member`` is the flat member
    number of the stream's video), grouped by ``episode_cams`` offsets. ``pts``, ``duration``,
    ``keyframes``, ``row_to_frame`` and ``segment_starts`` are flat with per-stream (per-episode)
    offsets. String columns stay Arrow arrays (``keys``, ``member_names``, ``member_sha256``,
    ``cam_names``, ``cam_codec``, ``cam_pix_fmt``, ``cam_kind``): no Python object per value, so
    forked workers share every page.
    """

    def __init__(self, table: pa.Table, shard_of_row: np.ndarray, where: str = "window index"):
        self._table = table
        self.where = where  # the file(s) it was read from, as its errors name them
        self._packets_checked: set[int] = set()  # streams whose packet table ``packets`` has checked
        self.shard = shard_of_row.astype(np.int32)
        self.keys = _one(table.column("key"))
        self.num_rows = _np(table.column("num_rows"), np.int64)
        self.episode_index = _np(table.column("episode_index"), np.int64)
        self.fps = _np(table.column("fps"), np.float64)
        self.window_start = _np(table.column("window_start"), np.int64)
        self.window_stop = _np(table.column("window_stop"), np.int64)
        members, self.episode_members = _flat(table.column("members"))
        self.member_offset = _np(members.field("offset"), np.int64)
        self.member_size = _np(members.field("size"), np.int64)
        self.member_names = members.field("name")
        self.member_sha256 = members.field("sha256")
        cams, self.episode_cams = _flat(table.column("cameras"))
        self.cam_names = cams.field("name")
        self.cam_codec = cams.field("codec")
        self.cam_pix_fmt = cams.field("pix_fmt")
        self.cam_member = _np(cams.field("member"), np.int64)
        self.cam_num_frames = _np(cams.field("num_frames"), np.int64)
        self.cam_width = _np(cams.field("width"), np.int32)
        self.cam_height = _np(cams.field("height"), np.int32)
        # Indexes written before camera kinds existed hold RGB cameras only.
        self.cam_kind = (
            cams.field("kind") if "kind" in [f.name for f in cams.type] else pa.array(np.full(len(cams), "rgb"))
        )
        # bool per stream: decoded at full precision, uint16 [1, H, W]
        self.cam_depth = pc.equal(self.cam_kind, "depth").to_numpy(zero_copy_only=False)
        # Indexes written before the stream was recorded decode FFmpeg's best video stream (-1).
        self.cam_stream_index = (
            _np(cams.field("stream_index"), np.int64)
            if cams.type.get_field_index("stream_index") >= 0
            else np.full(len(cams), -1, np.int64)
        )
        # Degrees counter-clockwise of the stream's display matrix (0 in indexes written before it was recorded).
        self.cam_rotation = (
            _np(cams.field("rotation"), np.int32)
            if cams.type.get_field_index("rotation") >= 0
            else np.zeros(len(cams), np.int32)
        )
        self.cam_time_base_num = _np(cams.field("time_base_num"), np.int64)
        self.cam_time_base_den = _np(cams.field("time_base_den"), np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):  # a zero denominator is rejected by check_index
            self.cam_time_base = self.cam_time_base_num.astype(np.float64) / self.cam_time_base_den
        # Byte range of each stream's video member, resolved once so a lookup is one array read.
        episode_of_stream = np.repeat(np.arange(self.num_rows.shape[0]), np.diff(self.episode_cams))
        # Clipped so that a damaged index still loads; epishard.format.validate.check_index rejects it.
        self.stream_member = np.clip(
            self.episode_members[episode_of_stream] + self.cam_member, 0, self.member_size.size
        )
        self.cam_offset, self.cam_size = (
            np.append(self.member_offset, 0)[self.stream_member],
            np.append(self.member_size, 0)[self.stream_member],
        )
        self.cam_first_frame = _np(cams.field("first_frame"), np.int64)
        self.cam_pts_start = _np(cams.field("pts_start"), np.int64)
        self.cam_pts_step = _np(cams.field("pts_step"), np.int64)
        self.pts, self.pts_offsets = _flat_np(cams.field("pts"), np.int64)
        self.duration, self.duration_offsets = _flat_np(cams.field("duration"), np.int64)
        self.keyframes, self.key_offsets = _flat_np(cams.field("keyframes"), np.int64)
        self.row_to_frame, self.r2f_offsets = _flat_np(cams.field("row_to_frame"), np.int64)
        self._packet_arrays(cams)
        if "segment_starts" in table.column_names:
            starts, self.segment_offsets = _flat(table.column("segment_starts"))
            self.segment_starts = _np(starts, np.int64)
        else:  # an index written before recording segments were recorded
            self.segment_starts = np.zeros(0, dtype=np.int64)
            self.segment_offsets = np.zeros(self.num_rows.shape[0] + 1, dtype=np.int64)
        self._signal_arrays(table)

    def _signal_arrays(self, table: pa.Table) -> None:
        """The ``streams`` column (format version 3: streams at their own rate), flat with per-episode offsets.

        ``signal_*`` arrays have one entry per (episode, stream) (``episode_signals`` offsets; "signal"
        keeps them apart from the camera streams): ``signal_names``, ``signal_dtype`` (Arrow
        strings), ``signal_member`` (flat member number of its ``.arrow`` member), ``signal_count``,
        ``signal_t_first``, ``signal_t_last``, ``signal_min_interval``, ``signal_max_interval``,
        ``signal_rate`` (seconds, Hz), and the shapes (``signal_shape``). An index without the
        column (version 2) has none.
        """
        n = self.num_rows.shape[0]
        if "streams" in table.column_names:
            sig, self.episode_signals = _flat(table.column("streams"))
        else:
            sig, self.episode_signals = pa.array([], type=STREAM_TYPE), np.zeros(n + 1, dtype=np.int64)
        self.signal_names = sig.field("name")
        self.signal_dtype = sig.field("dtype")
        self.signal_member_pos = _np(sig.field("member"), np.int64)
        self.signal_shape_values, self.signal_shape_offsets = _flat_np(sig.field("shape"), np.int64)
        self.signal_count = _np(sig.field("count"), np.int64)
        self.signal_t_first = _np(sig.field("t_first"), np.float64)
        self.signal_t_last = _np(sig.field("t_last"), np.float64)
        self.signal_min_interval = _np(sig.field("min_interval"), np.float64)
        self.signal_max_interval = _np(sig.field("max_interval"), np.float64)
        self.signal_rate = _np(sig.field("rate"), np.float64)
        self.piece_start, self.piece_offsets = _flat_np(sig.field("piece_start"), np.int64)
        self.piece_time, self.piece_time_offsets = _flat_np(sig.field("piece_time"), np.float64)
        self.signal_row_step = _np(sig.field("row_step"), np.int64)
        self.row_time, self.row_time_offsets = _flat_np(sig.field("row_time"), np.float64)
        owner = np.repeat(np.arange(n), np.diff(self.episode_signals))
        # Clipped so that a damaged index still loads; validate.check_index rejects it.
        self.signal_member = np.clip(self.episode_members[owner] + self.signal_member_pos, 0, self.member_size.size)

    def signal_pieces(self, signal: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A stream's pieces: flat member numbers, first sample and sample count of each (int64 ``[P]``).

        Piece ``k`` is member ``signal_member + k`` and holds samples ``start[k] .. start[k] + count[k] - 1``.
        """
        a, b = int(self.piece_offsets[signal]), int(self.piece_offsets[signal + 1])
        start = self.piece_start[a:b]
        count = np.diff(np.append(start, self.signal_count[signal]))
        return int(self.signal_member[signal]) + np.arange(b - a, dtype=np.int64), start, count

    def signal_piece_times(self, signal: int) -> np.ndarray:
        """float64 ``[P]``: the time of each piece's first sample (seconds)."""
        a, b = int(self.piece_offsets[signal]), int(self.piece_offsets[signal + 1])
        return self.piece_time[a:b]

    def signal_row_clock(self, signal: int) -> tuple[int, np.ndarray]:
        """``(row_step, times)``: the episode's row clock at rows ``0, step, 2 * step, ...`` and its last row.

        ``times`` float64, seconds; empty when the clock goes back (every piece is then read).
        """
        a, b = int(self.row_time_offsets[signal]), int(self.row_time_offsets[signal + 1])
        return int(self.signal_row_step[signal]), self.row_time[a:b]

    def signal_shape(self, signal: int) -> tuple[int, ...]:
        """Per-sample shape of a flat stream entry (``()`` for a scalar)."""
        a, b = int(self.signal_shape_offsets[signal]), int(self.signal_shape_offsets[signal + 1])
        return tuple(int(v) for v in self.signal_shape_values[a:b])

    def signals(self, episode: int) -> dict[str, int]:
        """Stream name -> flat stream entry of ``episode`` (streams at their own rate; empty in version 2)."""
        a, b = int(self.episode_signals[episode]), int(self.episode_signals[episode + 1])
        return {name: a + i for i, name in enumerate(self.signal_names.slice(a, b - a).to_pylist())}

    @property
    def has_signals(self) -> bool:
        """Whether any episode carries a stream at its own rate."""
        return bool(self.signal_count.size)

    def _packet_arrays(self, cams: pa.StructArray) -> None:
        """The packet tables (``manifest.CAMERA_TYPE``'s ``packet_*`` fields), flat with per-stream offsets.

        An index written before packet tables existed has none: every stream then has 0 packets.
        """
        n = len(cams)
        if cams.type.get_field_index("packet_size") < 0:
            empty = np.zeros(n + 1, dtype=np.int64)
            self.packet_start = np.zeros(n, dtype=np.int64)
            self.packet_size, self.psize_offsets = np.zeros(0, dtype=np.int32), empty
            self.packet_offset, self.poffset_offsets = np.zeros(0, dtype=np.int64), empty
            self.packet_frame, self.pframe_offsets = np.zeros(0, dtype=np.int32), empty
            self.packet_crc32, self.pcrc_offsets = np.zeros(0, dtype=np.uint32), empty
            self.cam_extradata = pa.array([b""] * n, pa.binary())
            return
        self.packet_start = _np(cams.field("packet_start"), np.int64)
        # Kept in their stored dtypes (views of the memory-mapped file, no copy: at a million
        # episodes the tables hold hundreds of millions of packets); ``packets`` widens one stream's.
        values, self.psize_offsets = _flat(cams.field("packet_size"))
        self.packet_size = _np(values, np.int32)
        values, self.poffset_offsets = _flat(cams.field("packet_offset"))
        self.packet_offset = _np(values, np.int64)
        values, self.pframe_offsets = _flat(cams.field("packet_frame"))
        self.packet_frame = _np(values, np.int32)
        values, self.pcrc_offsets = _flat(cams.field("packet_crc32"))
        self.packet_crc32 = _np(values, np.uint32)
        self.cam_extradata = cams.field("extradata")

    def has_packets(self, streams) -> np.ndarray:
        """Whether each stream (an int or int array) has a packet table, so its GOPs can be fetched alone (bool)."""
        streams = np.asarray(streams, dtype=np.int64)
        return self.psize_offsets[streams + 1] > self.psize_offsets[streams]

    def packets(self, stream: int) -> PacketTable:
        """The packet table of a camera stream (``manifest.CAMERA_TYPE`` ``packet_*``), expanded.

        The stream's table is checked at its first call in this process
        (``validate.check_stream_packets``): a reader's open leaves per-packet values unchecked.

        Raises:
            KeyError: the stream has none (``has_packets``).
            FormatError: its table breaks the format; names ``where``, the episode and the camera.
        """
        a, b = int(self.psize_offsets[stream]), int(self.psize_offsets[stream + 1])
        if b == a:
            raise KeyError(
                f"camera stream {stream} of episode {self.key(self.stream_episode(stream))} has no packet table"
            )
        if stream not in self._packets_checked:
            check_stream_packets(self, stream, self.where)
            self._packets_checked.add(stream)
        size = self.packet_size[a:b].astype(np.int64)
        x, y = int(self.poffset_offsets[stream]), int(self.poffset_offsets[stream + 1])
        if y > x:
            offset = self.packet_offset[x:y]
        else:
            offset = int(self.packet_start[stream]) + np.concatenate([[0], np.cumsum(size[:-1])]).astype(np.int64)
        x, y = int(self.pframe_offsets[stream]), int(self.pframe_offsets[stream + 1])
        frame = self.packet_frame[x:y].astype(np.int64) if y > x else np.arange(b - a, dtype=np.int64)
        x, y = int(self.pcrc_offsets[stream]), int(self.pcrc_offsets[stream + 1])
        return PacketTable(offset, size, frame, self.packet_crc32[x:y], self.cam_extradata[stream].as_py())

    def stream_episode(self, stream: int) -> int:
        """The episode a flat camera-stream number belongs to."""
        return int(np.searchsorted(self.episode_cams, stream, side="right") - 1)

    # -- loading ---------------------------------------------------------------------------------

    @classmethod
    def load(cls, sources: list) -> WindowIndex:
        """Load per-shard index files (paths or file objects); shard ``i`` is ``sources[i]``.

        Unchecked: for files this process wrote (readers of outside data use ``read_shard_indexes``).
        """
        tables = _unify([pq.read_table(s).replace_schema_metadata(None) for s in sources])
        counts = np.array([t.num_rows for t in tables], dtype=np.int64)
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        return cls(table, np.repeat(np.arange(len(tables)), counts))

    @classmethod
    def from_rows(cls, rows: list[dict]) -> WindowIndex:
        """One shard's index from rows (dicts following ``INDEX_SCHEMA``, as ``encode_index`` takes)."""
        table = pa.Table.from_pylist(_clean_rows(rows), schema=_schema_of(rows))
        return cls(table, np.zeros(len(rows), dtype=np.int32))

    @classmethod
    def load_dataset(cls, root: str) -> WindowIndex:
        """Load a local dataset's index from its memory-mapped ``index.arrow``, else per-shard Parquet.

        ``index.arrow`` is one file for all shards: milliseconds for tens of thousands of episodes,
        pages shared by forked workers. When it is absent, the per-shard Parquet indexes the manifest
        lists are read. Unchecked.
        """
        path = os.path.join(root, DATASET_INDEX_NAME)
        if os.path.exists(path):
            table = feather.read_table(path, memory_map=True)
            check_index_version(table.schema, None, path)
            return cls._from_dataset_table(table, path)
        manifest_path = os.path.join(root, MANIFEST_NAME)
        shards = Manifest.load(read_local(manifest_path, manifest_path, FormatError), manifest_path).shards
        return cls.load([os.path.join(root, s.index) for s in shards])

    @classmethod
    def _from_dataset_table(cls, table: pa.Table, where: str) -> WindowIndex:
        """From the table of an ``index.arrow`` file (index columns plus ``shard``) read from ``where``."""
        return cls(table.drop_columns(["shard"]), _np(table.column("shard"), np.int32), where)

    @classmethod
    def read_dataset_index(cls, data, where: str, format_version: int | None) -> WindowIndex:
        """The index in ``data`` (``index.arrow``'s bytes or buffer, an Arrow IPC file), checked.

        Its format version (``validate.check_index_version``, against the manifest's
        ``format_version``; None: not compared) and schema (``validate.check_index_table``) are
        checked here; values are checked by ``validate.check_index``.

        Raises:
            FormatError: not an Arrow IPC file, another format version, or a column breaks the
                format; names ``where``.
        """
        try:
            table = pa.ipc.open_file(data).read_all()
        except (pa.ArrowException, OSError) as exc:
            raise FormatError(f"{where}: not an Arrow IPC file: {exc}") from None
        check_index_version(table.schema, format_version, where)
        check_index_table(table, where, shard_column=True)
        return cls._from_dataset_table(table, where)

    @classmethod
    def read_shard_indexes(cls, files: Iterable[tuple[bytes, str]], format_version: int | None) -> WindowIndex:
        """The index of per-shard index files (``(Parquet bytes, where)`` in shard order), checked.

        An iterator is consumed one file at a time, so a caller may check each file's digest as it
        yields it. Each file's format version (``validate.check_index_version``, against the
        manifest's ``format_version``; None: not compared) and schema (``validate.check_index_table``)
        are checked.

        Raises:
            FormatError: a file is not Parquet, states another format version, or a column breaks
                the format; names its ``where``.
        """
        tables = []
        for data, where in files:
            try:
                table = read_table_bytes(data)
            except (pa.ArrowException, OSError) as exc:
                raise FormatError(f"{where}: not a Parquet file: {exc}") from None
            check_index_version(table.schema, format_version, where)
            check_index_table(table, where, shard_column=False)
            tables.append(table.replace_schema_metadata(None))
        if not tables:
            raise ValueError("no shard index files")
        counts = [t.num_rows for t in tables]
        return cls(pa.concat_tables(_unify(tables)), np.repeat(np.arange(len(tables)), counts))

    @classmethod
    def concat_shards(cls, shards: list[WindowIndex]) -> WindowIndex:
        """One index per shard, in shard order, as one index: the rows of ``shards[i]`` are shard ``i``."""
        tables = _unify([ix._table.replace_schema_metadata(None) for ix in shards])
        return cls(pa.concat_tables(tables), np.repeat(np.arange(len(tables)), [t.num_rows for t in tables]))

    def take(self, episodes) -> WindowIndex:
        """The index of ``episodes`` (int array: any order, repeats allowed), each keeping its shard."""
        episodes = np.asarray(episodes, dtype=np.int64)
        return WindowIndex(self._table.take(pa.array(episodes)), self.shard[episodes], self.where)

    def relocated(self, shard, member_shift) -> WindowIndex:
        """These episodes moved: episode ``e`` into shard ``shard[e]``, its members ``member_shift[e]`` bytes later.

        ``shard``, ``member_shift``: int arrays ``[num_episodes]`` (shard numbers, bytes). For tools
        that lay a shard's bytes several times into one file (``tools/bench/run.py firstbatch``'s
        tiler); unchecked, as the result's ``check_index`` is the caller's.
        """
        shift = np.repeat(np.asarray(member_shift, dtype=np.int64), np.diff(self.episode_members))
        members = _one(self._table.column("members"))
        flat = members.flatten()
        fields = list(members.type.value_type)
        moved = pa.StructArray.from_arrays(
            [pa.array(self.member_offset + shift) if f.name == "offset" else flat.field(f.name) for f in fields],
            fields=fields,
        )
        column = pa.ListArray.from_arrays(pa.array(self.episode_members.astype(np.int32)), moved, type=members.type)
        table = self._table.set_column(self._table.schema.get_field_index("members"), "members", column)
        return WindowIndex(table, np.asarray(shard, dtype=np.int32), self.where)

    def _dataset_table(self) -> pa.Table:
        """The rows of an ``index.arrow`` file: index columns plus ``shard``."""
        return self._table.replace_schema_metadata(None).append_column("shard", pa.array(self.shard))

    def write_dataset_index(self, path: str, batch_rows: int | None = None) -> None:
        """This index written to ``path`` as an ``index.arrow`` file: ``dataset_bytes``, not held in memory."""
        _write_dataset_table(self._dataset_table(), path, batch_rows)

    def dataset_bytes(self, batch_rows: int | None = None) -> bytes:
        """This index as an ``index.arrow`` file (``_dataset_table_bytes``; ``batch_rows`` as there)."""
        return _dataset_table_bytes(self._dataset_table(), batch_rows)

    def equals(self, other: WindowIndex) -> bool:
        """Whether both hold the same rows (every column, schema metadata aside) in the same shards."""
        mine, theirs = (ix._table.replace_schema_metadata(None) for ix in (self, other))
        return np.array_equal(self.shard, other.shard) and mine.equals(theirs)

    # -- episodes ----------------------------------------------------------------------------------

    @property
    def num_episodes(self) -> int:
        """Episodes in the index (all shards)."""
        return int(self.num_rows.shape[0])

    def key(self, episode: int) -> str:
        """Shard key of ``episode`` (its tar members' prefix, e.g. ``gr00t-e000003``)."""
        return self.keys[episode].as_py()

    def source(self, episode: int) -> str:
        """Name of the source dataset the episode was converted from."""
        return self._table.column("source")[episode].as_py()

    def task(self, episode: int) -> str:
        """The episode's instruction (its first task text; ``""`` when it has none)."""
        return self._table.column("task")[episode].as_py()

    def tasks(self) -> list[str]:
        """Every episode's instruction (``task``), ``[num_episodes]``, in episode order."""
        return self._table.column("task").to_pylist()

    def episode_tasks(self, episode: int) -> list[str]:
        """All task texts of the episode (the ``tasks`` column)."""
        return self._table.column("tasks")[episode].as_py()

    @property
    def episode_columns(self) -> list[str]:
        """Names of the per-episode index columns (``INDEX_SCHEMA``, plus any a newer writer adds)."""
        return list(self._table.column_names)

    def episode_column(self, name: str) -> list:
        """Every episode's value of index column ``name`` (Python objects, ``[num_episodes]``).

        For read-time episode selection (``stream.select``).

        Raises:
            KeyError: no such column.
        """
        if name not in self._table.column_names:
            raise KeyError(name)
        return self._table.column(name).to_pylist()

    def row(self, episode: int) -> dict:
        """The episode's index row as the format's dict (``INDEX_SCHEMA`` fields).

        O(row) Python objects: for inspection and tests; readers use the arrays and lookups.
        """
        return self._table.slice(episode, 1).to_pylist()[0]

    def camera_names(self, episode: int) -> list[str]:
        """Cameras stored for ``episode``, in stream order."""
        a, b = self.episode_cams[episode], self.episode_cams[episode + 1]
        return self.cam_names.slice(int(a), int(b - a)).to_pylist()

    # -- members -----------------------------------------------------------------------------------

    def members(self, episode: int) -> np.ndarray:
        """int64 ``[m]``: flat member numbers of the episode, in tar order."""
        return np.arange(self.episode_members[episode], self.episode_members[episode + 1], dtype=np.int64)

    @functools.cached_property
    def _data_members(self) -> np.ndarray:
        is_data = pc.ends_with(self.member_names, "." + DATA_EXT).to_numpy(zero_copy_only=False)
        hits = np.flatnonzero(is_data)
        owner = np.searchsorted(self.episode_members, hits, side="right") - 1
        out = np.full(self.num_episodes, -1, dtype=np.int64)
        out[owner[::-1]] = hits[::-1]  # the first one of each episode (check_index allows exactly one)
        return out

    def data_member(self, episodes):
        """Flat member number of each episode's table (its ``.parquet`` member: the one rule).

        ``episodes``: int or int array. Returns int64 of the same shape (-1 for an episode without
        one, which ``validate.check_index`` refuses).
        """
        return self._data_members[episodes]

    def member_ranges(self, members) -> tuple[np.ndarray, np.ndarray]:
        """Byte ranges ``[start, stop)`` in the shard of flat ``members`` (int array).

        Returns two int64 arrays of ``members``' shape: offsets of the member's data, not its tar header.
        """
        members = np.asarray(members, dtype=np.int64)
        return self.member_offset[members], self.member_offset[members] + self.member_size[members]

    # -- camera streams ----------------------------------------------------------------------------

    def camera_streams(self, name: str, episodes=None) -> np.ndarray:
        """The flat stream number of camera ``name`` in every (or each given) episode.

        Returns int64 ``[num_episodes]``, or the shape of ``episodes`` (an int array) when given.

        Raises:
            KeyError: an episode has no such camera (naming the first one, its number and key).
        """
        hits = np.flatnonzero(pc.equal(self.cam_names, name).to_numpy(zero_copy_only=False))
        out = np.full(self.num_episodes, -1, dtype=np.int64)
        out[np.searchsorted(self.episode_cams, hits, side="right") - 1] = hits
        if episodes is not None:
            episodes = np.asarray(episodes, dtype=np.int64)
            out = out[episodes]
        missing = np.flatnonzero(np.ravel(out) < 0)
        if missing.size:
            e = int(missing[0] if episodes is None else np.ravel(episodes)[missing[0]])
            raise KeyError(f"episode {e} ({self.key(e)}) has no camera {name!r}")
        return out

    def is_depth(self, name: str) -> bool:
        """True when camera ``name`` is a depth camera (kind ``depth``) in any episode."""
        names = self.cam_names.to_numpy(zero_copy_only=False)
        return bool(np.any(self.cam_depth[names == name]))

    def stream(self, episode: int, camera: int) -> int:
        """Flat camera-stream number of the episode's ``camera``-th camera (sorted by name)."""
        return int(self.episode_cams[episode] + camera)

    def time_base(self, stream: int) -> Fraction:
        """Seconds per pts tick of a camera stream, exact."""
        return Fraction(int(self.cam_time_base_num[stream]), int(self.cam_time_base_den[stream]))

    def keyframes_of(self, stream: int) -> np.ndarray:
        """int64 ``[k]``: the stream's keyframe numbers, ascending (frame 0 first)."""
        return self.keyframes[self.key_offsets[stream] : self.key_offsets[stream + 1]]

    def frames(self, streams, rows) -> np.ndarray:
        """Video frame numbers (int64) shown at table ``rows`` of camera ``streams``.

        ``streams``: an int, or an int array broadcast against ``rows`` (e.g. ``[N, 1]`` against
        ``[N, K]``); ``rows``: int array. Returns int64 of the broadcast shape: ``first_frame + row``
        for a regular stream, else ``row_to_frame[row]``.
        """
        if isinstance(streams, (int, np.integer)):  # one stream: the reader's per-window path
            start = self.r2f_offsets[streams]
            if start == self.r2f_offsets[streams + 1]:  # regular: frame = first_frame + row
                return self.cam_first_frame[streams] + rows
            return self.row_to_frame[start + rows]
        streams, rows = np.broadcast_arrays(np.asarray(streams, np.int64), np.asarray(rows, np.int64))
        start = self.r2f_offsets[streams]
        irregular = start != self.r2f_offsets[streams + 1]
        out = self.cam_first_frame[streams] + rows
        if irregular.any():
            out[irregular] = self.row_to_frame[start[irregular] + rows[irregular]]
        return out

    @functools.cached_property
    def _keyframe_axis(self) -> tuple[np.ndarray, int]:
        """Keyframes of all streams on one sorted axis, so one ``searchsorted`` serves every stream.

        Stream ``s`` is shifted by ``s * span`` (``span`` above any frame number); returns the int64
        axis and ``span``.
        """
        span = int(max(self.cam_num_frames.max(initial=0), self.keyframes.max(initial=0))) + 1
        stream_of_key = np.repeat(np.arange(self.key_offsets.size - 1, dtype=np.int64), np.diff(self.key_offsets))
        return stream_of_key * span + self.keyframes, span

    def keyframe_before(self, streams, frames):
        """Last keyframe at or before each frame: where decoding has to start.

        ``streams``: an int, or an int array broadcast against ``frames`` (int or int array).
        Returns int64 of the broadcast shape (a numpy scalar for scalar arguments). A frame before
        its stream's first keyframe (never written: frame 0 is a keyframe) counts from itself.
        """
        if isinstance(streams, (int, np.integer)):  # one stream: a slice of its keyframes
            keys = self.keyframes[self.key_offsets[streams] : self.key_offsets[streams + 1]]
            pos = np.searchsorted(keys, frames, side="right") - 1
            if isinstance(frames, (int, np.integer)):
                return keys[pos] if pos >= 0 else np.int64(frames)
            return np.where(pos >= 0, keys[np.maximum(pos, 0)] if keys.size else 0, frames)
        streams, frames = np.broadcast_arrays(np.asarray(streams, np.int64), np.asarray(frames, np.int64))
        axis, span = self._keyframe_axis
        pos = np.searchsorted(axis, streams * span + np.minimum(frames, span - 1), side="right") - 1
        valid = pos >= self.key_offsets[streams]
        return np.where(valid, self.keyframes[np.maximum(pos, 0)] if self.keyframes.size else 0, frames)

    def decoded_frames(self, streams, frames) -> np.ndarray:
        """Frames a sequential decoder decodes to return ``frames``: the decode cost.

        Counted once here for the reader's telemetry and the balancer's cost model.

        ``frames``: int64 ``[..., K]``, each row sorted ascending (duplicates cost nothing);
        ``streams``: an int, or an int array of shape ``[...]`` (the stream of each row).
        Returns int64 ``[...]`` (a numpy scalar for one row). The decoder starts at the keyframe
        at or before the first frame and decodes up to it; for each next frame it decodes forward
        from the previous one, or from a keyframe when one lies after the previous frame and at or
        before the next (a seek, as torchcodec's ``get_frames_at`` does).
        """
        frames = np.asarray(frames, dtype=np.int64)
        if frames.shape[-1] == 0:
            return np.zeros(frames.shape[:-1], dtype=np.int64)
        if not isinstance(streams, (int, np.integer)):
            streams = np.asarray(streams, dtype=np.int64)[..., None]
        key_before = np.asarray(self.keyframe_before(streams, frames), dtype=np.int64)
        first = frames[..., 0] - key_before[..., 0] + 1
        start = np.maximum(key_before[..., 1:], frames[..., :-1] + 1)
        return first + np.sum(frames[..., 1:] - start + 1, axis=-1)

    def segment_edges(self, episode: int) -> np.ndarray:
        """int64 ``[k + 2]``: ``0``, the episode's ``segment_starts`` (k recording breaks), ``num_rows``.

        Segment ``i`` is rows ``[edges[i], edges[i + 1])``.
        """
        starts = self.segment_starts[self.segment_offsets[episode] : self.segment_offsets[episode + 1]]
        return np.r_[0, starts, self.num_rows[episode]].astype(np.int64)

    def segment_bounds(self, episodes, rows) -> tuple[np.ndarray, np.ndarray]:
        """Recording segment ``[lo, hi)`` holding each row.

        The whole episode ``[0, num_rows)`` unless its timestamps reset or jump
        (``segment_starts``), where a new segment begins.

        ``episodes``, ``rows``: int arrays (or ints) broadcast together. Returns two int64 arrays
        of the broadcast shape. Windows anchored at a row stay inside that row's segment.
        """
        episodes, rows = np.broadcast_arrays(np.asarray(episodes, dtype=np.int64), np.asarray(rows, dtype=np.int64))
        n = self.num_rows[episodes]
        if self.segment_starts.size == 0:
            return np.zeros_like(rows), n
        # One sorted key per (episode, start) row: a single searchsorted finds every row's segment.
        span = int(self.num_rows.max()) + 1
        owner = np.repeat(np.arange(self.num_episodes, dtype=np.int64), np.diff(self.segment_offsets))
        keys = owner * span + self.segment_starts
        pos = np.searchsorted(keys, episodes * span + rows, side="right") - 1
        own = pos >= self.segment_offsets[episodes]
        lo = np.where(own, self.segment_starts[np.maximum(pos, 0)], 0)
        nxt = pos + 1
        later = nxt < self.segment_offsets[episodes + 1]
        hi = np.where(later, self.segment_starts[np.minimum(nxt, self.segment_starts.size - 1)], n)
        return lo, hi

    def frame_tables(self, stream: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pts, duration, keyframe flags) of every frame of a camera stream, expanded.

        int64 ``[num_frames]``, int64 ``[num_frames]`` in the stream's time base, bool ``[num_frames]``:
        what torchcodec's ``custom_frame_mappings`` needs to open a decoder without scanning the file.
        """
        n = int(self.cam_num_frames[stream])
        a, b = self.pts_offsets[stream], self.pts_offsets[stream + 1]
        step = self.cam_pts_step[stream]
        pts = self.pts[a:b] if b > a else self.cam_pts_start[stream] + step * np.arange(n, dtype=np.int64)
        a, b = self.duration_offsets[stream], self.duration_offsets[stream + 1]
        duration = self.duration[a:b] if b > a else np.full(n, step, dtype=np.int64)
        flags = np.zeros(n, dtype=bool)
        flags[self.keyframes[self.key_offsets[stream] : self.key_offsets[stream + 1]]] = True
        return pts, duration, flags

    def lookup(self, episode: int, rows: np.ndarray, camera: int = 0) -> CameraLookup:
        """Shard, byte range and frames of ``camera`` for the given rows of ``episode``."""
        s = self.stream(episode, camera)
        frames = self.frames(s, rows)
        return CameraLookup(
            shard=int(self.shard[episode]),
            offset=int(self.cam_offset[s]),
            size=int(self.cam_size[s]),
            frames=frames,
            keyframe=int(self.keyframe_before(s, int(frames.min()))),
        )


def camera_row_frames(camera: dict, num_rows: int) -> list[int]:
    """Video frame of every table row, from one camera entry of an index row (as read by pyarrow)."""
    if camera["row_to_frame"]:
        return list(camera["row_to_frame"])
    return list(range(camera["first_frame"], camera["first_frame"] + num_rows))
