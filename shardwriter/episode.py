"""The writer's input model: an episode is a key, a per-frame table, one video per camera, metadata.

These classes are the Python API for sources other than LeRobot datasets; the LeRobot readers
produce them too. They are plain picklable values, so conversion workers receive them as they are,
and a table or video may be given lazily (a path) so that nothing is loaded before it is needed.

Internal: import from ``epishard.shardwriter``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from epishard.format.storage import RemoteFile

from .errors import ConversionError

__all__ = [
    "CameraFrames",
    "CameraVideo",
    "Episode",
    "FileInput",
    "FrameReader",
    "LazyTable",
    "LoadedTable",
    "Source",
    "Stream",
    "TableInput",
    "TableSlice",
    "bounded_parquet",
    "file_size",
    "read_file",
]

FileInput = str | RemoteFile
"""A file given by reference: a local path, or a ``storage.RemoteFile`` (any fsspec URL)."""


def read_file(file: FileInput) -> bytes:
    """The whole file's bytes."""
    if isinstance(file, RemoteFile):
        return file.read()
    with open(file, "rb") as f:
        return f.read()


def file_size(file: FileInput) -> int:
    """The file's size in bytes (a ``RemoteFile`` asks its filesystem unless a listing gave it)."""
    return file.size() if isinstance(file, RemoteFile) else os.path.getsize(file)


def bounded_parquet(
    source, where: str, error: type[Exception] = ConversionError, columns: list[str] | None = None, threads: bool = True
) -> pa.Table:
    """The Parquet table in ``source`` (a path, a file object, a buffer), read if its footer's claims are bounded.

    The footer states the rows and the uncompressed bytes of every row group; a file claiming more
    than ``sources.bounds.MAX_ROWS`` rows or ``MAX_ARRAY_BYTES`` bytes (15 MB of Parquet can claim
    300 M rows) is refused before a page is decompressed. ``columns``: only those (None: all).

    Raises:
        ConversionError(kind="too_large") (or ``error``, e.g. ``SourceError`` at open): naming ``where``.
    """
    from .sources import bounds  # (the sources package imports this module)

    parquet = pq.ParquetFile(source)
    meta = parquet.metadata
    rows = meta.num_rows
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if not 0 <= rows <= bounds.MAX_ROWS or size > bounds.MAX_ARRAY_BYTES:
        message = (
            f"a Parquet file claiming {rows} rows and {size} bytes uncompressed, more than the {bounds.MAX_ROWS} "
            f"rows or {bounds.MAX_ARRAY_BYTES} bytes a source may (epishard.shardwriter.sources.bounds): refused "
            "before reading"
        )
        if error is ConversionError:
            raise ConversionError(message, kind="too_large", path=where)
        raise error(f"{where}: {message}")
    return parquet.read(columns=columns, use_threads=threads)


@functools.lru_cache(maxsize=4)
def _read_shared_table(path: FileInput) -> pa.Table:
    # Consecutive episodes of a LeRobot v3.0 dataset share one parquet file: read it once.
    if isinstance(path, RemoteFile):
        with path.open() as f:
            return bounded_parquet(f, str(path))
    return bounded_parquet(path, str(path))


@dataclass(frozen=True)
class TableSlice:
    """Rows ``[start, stop)`` of a parquet file holding many episodes (LeRobot v3.0 layout)."""

    path: FileInput
    start: int
    stop: int


@dataclass(frozen=True)
class Stream:
    """A numeric signal at its own rate (force-torque, IMU, tactile, events), stored as it is (format version 3).

    Args:
        timestamps: float64 (or integer) ``[n]`` seconds on the episode's clock, the clock of the
            table's ``timestamp`` column (row ``r`` at ``timestamp[r]``, or ``r / fps`` without
            one); finite and non-decreasing (equal times allowed: events). Samples before the
            first row or after the last are kept.
        values: ``[n, *shape]`` of a numeric type (``manifest.STREAM_DTYPES``: bool, int8..int64,
            uint8..uint64, float16/32/64), stored bit for bit; floats must be finite.
        rate: the nominal rate in Hz where the source declares one (recorded in the index and the
            manifest, never used to resample); None: none.

    Windows read it by time (``stream.WindowSpec(streams=...)``: ``span`` / ``at``).
    """

    timestamps: np.ndarray
    values: np.ndarray
    rate: float | None = None


class LoadedTable(NamedTuple):
    """What a ``LazyTable`` gives: the rows, report entries about them, and task texts found in them.

    ``notes``: ``{"kind", "row", "message"}`` dicts (rows dropped, repeated or reinterpreted while
    reading; they reach the manifest's report as warnings of the episode). ``tasks``: task texts the
    rows carry (e.g. RLDS ``language_instruction``), used when the ``Episode`` names none.
    ``streams``: name -> ``Stream`` read with the rows at their own rate (an MCAP topic kept at its
    native rate), added to the ``Episode``'s own.
    """

    table: pa.Table
    notes: list[dict]
    tasks: tuple[str, ...] = ()
    streams: Mapping[str, Stream] = MappingProxyType({})


class LazyTable:
    """An episode's rows read only when the conversion worker prepares it (``shardwriter.sources``).

    Subclasses are small picklable values (file references, keys, row ranges, never the rows), so a
    ``Source`` of many episodes holds little and conversion workers receive them as they are.
    """

    def load(self) -> LoadedTable:
        """Read the rows (one row per frame). Raises ``ConversionError`` naming file and key."""
        raise NotImplementedError

    @property
    def path(self) -> str | None:
        """The file (or store) the rows come from, for error messages (None when not one file)."""
        return None

    def fingerprint(self) -> list:
        """JSON-ready facts that identify the input (file, size, keys, mapping): part of the plan digest."""
        raise NotImplementedError

    def estimated_bytes(self) -> int:
        """Rough stored bytes of the rows, for shard-size planning only."""
        return 0


TableInput: TypeAlias = pa.Table | FileInput | TableSlice | LazyTable
"""An episode's per-frame table: an in-memory ``pyarrow.Table``, the parquet file that
holds exactly this episode (a path or ``RemoteFile``) (its bytes are copied unchanged), a ``TableSlice``,
or a ``LazyTable`` read by the conversion worker."""


class FrameReader:
    """A camera's frames for one episode, read in the conversion worker (``CameraFrames``).

    A small picklable value (file, key, range). ``chunks`` yields the frames in order, in chunks, so
    that an episode's camera never has to be in memory whole: each chunk is uint8 RGB ``[n, H, W, 3]``,
    uint16 grey ``[n, H, W]`` (depth) or a list of ``n`` encoded images (PNG/JPEG bytes).
    """

    def chunks(self) -> Iterator[np.ndarray | list[bytes]]:
        """The frames in order, in chunks (see the class). Raises ``ConversionError`` naming file and key."""
        raise NotImplementedError

    def fingerprint(self) -> list:
        """JSON-ready facts that identify the input: part of the plan digest."""
        raise NotImplementedError

    def estimated_bytes(self) -> int:
        """Rough stored bytes of the encoded video, for shard-size planning only."""
        return 0


@dataclass(frozen=True)
class CameraFrames:
    """One camera given as frames (arrays or encoded images), encoded to video at convert time.

    Encoded in the conversion worker, chunk by chunk, with ``images.IMAGE_SPEC`` (lossless
    all-intra RGB: bit-exact frames) or ``ConvertOptions.reencode`` when given (a stated codec, GOP
    and quality, recorded as the camera's ``transform``); uint16 frames (``depth``) always with
    ``images.GREY_IMAGE_SPEC`` (FFV1, values exact). Frame ``r`` is row ``r``'s.
    """

    reader: FrameReader
    depth: bool = False


@dataclass(frozen=True)
class CameraVideo:
    """One camera's encoded video for one episode.

    ``source``: the encoded file, as bytes, a local path or a ``storage.RemoteFile`` (read through
    range requests, never copied whole to disk). ``segment``: ``(from_timestamp,
    to_timestamp)`` in seconds when the episode is only part of the file (LeRobot v3.0); the writer
    turns ``from_timestamp`` into an exact frame number once and cuts the segment by stream copy.
    Without a segment the file belongs to the episode and is copied bit-exact. ``depth``: the source
    declares the video a depth map (LeRobot's ``video.is_depth_map``); a grey one is then read at
    full precision (camera kind ``depth``, see ``manifest.CAMERA_KINDS``).
    """

    source: bytes | FileInput
    segment: tuple[float, float] | None = None
    file_seconds: float | None = None  # duration of the whole file, for shard-size planning only
    depth: bool = False

    def size(self) -> int:
        """Size in bytes of the whole source file (an upper bound for a segment)."""
        if isinstance(self.source, (bytes, bytearray)):
            return len(self.source)
        return file_size(self.source)


@dataclass(frozen=True)
class Episode:
    """One episode to write.

    Args:
        source: name of the dataset it comes from (part of the shard key; keys must be unique).
        episode_index: index of the episode in its source (int >= 0).
        table: per-frame rows (see ``TableInput``); row ``r`` is frame ``r`` of the episode unless
            the table has a ``frame_index`` column, which then gives the frame.
        videos: camera name (e.g. ``"observation.images.front"``) -> ``CameraVideo``.
        fps: frames per second of the table rows and videos.
        tasks: task texts; the first is the instruction.
        robot: robot type (free text).
        key: shard key; default ``<source>-e<episode_index:06d>``.
        images: table columns holding one encoded image per row (LeRobot's ``image`` dtype: PNG or
            JPEG bytes); each becomes a camera of that name (see ``shardwriter.images``) and leaves
            the stored table.
        frames: camera name -> ``CameraFrames``: cameras given as arrays or encoded images (HDF5,
            Zarr, RLDS, MCAP sources), encoded to video by the conversion worker; one frame per row.
        streams: name (e.g. ``"observation.force"``) -> ``Stream``: signals at their own rate,
            stored with their own timestamps, never resampled (a dataset with any is written as
            format version 3). A name may not be a table column or a camera.
    """

    source: str
    episode_index: int
    table: TableInput
    videos: dict[str, CameraVideo]
    fps: float
    tasks: tuple[str, ...] = ()
    robot: str = ""
    key: str | None = None
    extra: dict = field(default_factory=dict)
    images: tuple[str, ...] = ()
    frames: dict[str, CameraFrames] = field(default_factory=dict)
    streams: dict[str, Stream] = field(default_factory=dict)

    def load_table(self) -> tuple[pa.Table, bytes | None]:
        """Return (table, original parquet bytes when the table is a whole file, else None)."""
        if isinstance(self.table, pa.Table):
            return self.table, None
        if isinstance(self.table, LazyTable):
            return self.table.load().table, None
        if isinstance(self.table, TableSlice):
            whole = _read_shared_table(self.table.path)
            return whole.slice(self.table.start, self.table.stop - self.table.start), None
        raw = read_file(self.table)
        # One episode's rows: read in this thread (Arrow's pools cost more than they save here).
        return bounded_parquet(pa.BufferReader(raw), str(self.table), threads=False), raw

    def estimated_bytes(self) -> int:
        """Rough shard bytes of this episode, used only to plan shard sizes."""
        if isinstance(self.table, (str, RemoteFile)):
            table_bytes = file_size(self.table)
        elif isinstance(self.table, TableSlice):
            table_bytes = 64 * (self.table.stop - self.table.start)
        elif isinstance(self.table, LazyTable):
            table_bytes = self.table.estimated_bytes()
        else:
            table_bytes = self.table.nbytes
        video_bytes = 0
        for video in self.videos.values():
            if video.segment is None:
                video_bytes += video.size()
            else:  # a share of the file proportional to the segment's length
                start, stop = video.segment
                share = (stop - start) / video.file_seconds if video.file_seconds else 1.0
                video_bytes += int(video.size() * min(max(share, 0.0), 1.0))
        video_bytes += sum(f.reader.estimated_bytes() for f in self.frames.values())
        stream_bytes = sum(np.asarray(s.values).nbytes + 8 * len(s.timestamps) for s in self.streams.values())
        return table_bytes + video_bytes + stream_bytes


@dataclass
class Source:
    """A named collection of episodes plus the dataset-level facts the manifest records.

    ``features``: feature name -> {"dtype", "shape", "names"} as declared by the source (the writer
    checks them against the tables); ``notes``: human-readable facts about the source that the
    conversion report repeats (cameras declared without files, subset copies, ...). ``stats``: the
    source's own normalisation statistics (a LeRobot dataset's ``meta/stats.json``: feature ->
    statistic -> nested lists of numbers), stored in the manifest (``sources[].stats``) so a reader
    never has to fetch them from the path a manifest records; None when the source has none.
    ``stats_from``: where ``stats`` came from, relative to ``path`` (e.g. ``meta/stats.json``,
    ``meta/episodes_stats.jsonl (aggregated over 50 episodes)``; ``sources[].stats_from``); None
    when unrecorded or there are none. ``warnings``: the source's counted report entries (what
    the reader fell back to or left out: ``{"kind", "message", "file"}``), added to the manifest's
    report (``report.warnings``, with the source's name as ``dataset``) and printed by ``convert``.
    """

    name: str
    episodes: list[Episode]
    fps: float
    path: str = ""
    format: str = "python"
    features: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    stats: dict | None = None
    stats_from: str | None = None
    warnings: list[dict] = field(default_factory=list)
