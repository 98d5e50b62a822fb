"""The writer's input model: an episode is a key, a per-frame table, one video per camera, metadata.

These classes are the Python API for sources other than LeRobot datasets; the LeRobot readers
produce them too. They are plain picklable values, so conversion workers receive them as they are,
and a table or video may be given lazily (a path) so that nothing is loaded before it is needed.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import TypeAlias

import pyarrow as pa
import pyarrow.parquet as pq

from .storage import RemoteFile

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


@functools.lru_cache(maxsize=4)
def _read_shared_table(path: FileInput) -> pa.Table:
    # Consecutive episodes of a LeRobot v3.0 dataset share one parquet file: read it once.
    if isinstance(path, RemoteFile):
        with path.open() as f:
            return pq.read_table(f)
    return pq.read_table(path)


@dataclass(frozen=True)
class TableSlice:
    """Rows ``[start, stop)`` of a parquet file holding many episodes (LeRobot v3.0 layout)."""

    path: FileInput
    start: int
    stop: int


TableInput: TypeAlias = pa.Table | FileInput | TableSlice
"""An episode's per-frame table: an in-memory ``pyarrow.Table``, the parquet file that
holds exactly this episode (a path or ``RemoteFile``) (its bytes are copied unchanged), or a ``TableSlice``."""


@dataclass(frozen=True)
class CameraVideo:
    """One camera's encoded video for one episode.

    ``source``: the encoded file, as bytes, a local path or a ``storage.RemoteFile`` (read through
    range requests, never copied whole to disk). ``segment``: ``(from_timestamp,
    to_timestamp)`` in seconds when the episode is only part of the file (LeRobot v3.0); the writer
    turns ``from_timestamp`` into an exact frame number once and cuts the segment by stream copy.
    Without a segment the file belongs to the episode and is copied bit-exact. ``depth``: the source
    declares the video a depth map (LeRobot's ``video.is_depth_map``); a grey one is then read at
    full precision (camera kind ``depth``, see ``format.CAMERA_KINDS``).
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

    def load_table(self) -> tuple[pa.Table, bytes | None]:
        """Return (table, original parquet bytes when the table is a whole file, else None)."""
        if isinstance(self.table, pa.Table):
            return self.table, None
        if isinstance(self.table, TableSlice):
            whole = _read_shared_table(self.table.path)
            return whole.slice(self.table.start, self.table.stop - self.table.start), None
        raw = read_file(self.table)
        # One episode's rows: read in this thread (Arrow's pools cost more than they save here).
        return pq.ParquetFile(pa.BufferReader(raw)).read(use_threads=False), raw

    def estimated_bytes(self) -> int:
        """Rough shard bytes of this episode, used only to plan shard sizes."""
        if isinstance(self.table, (str, RemoteFile)):
            table_bytes = file_size(self.table)
        elif isinstance(self.table, TableSlice):
            table_bytes = 64 * (self.table.stop - self.table.start)
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
        return table_bytes + video_bytes


@dataclass
class Source:
    """A named collection of episodes plus the dataset-level facts the manifest records.

    ``features``: feature name -> {"dtype", "shape", "names"} as declared by the source (the writer
    checks them against the tables); ``notes``: human-readable facts about the source that the
    conversion report repeats (cameras declared without files, subset copies, ...).
    """

    name: str
    episodes: list[Episode]
    fps: float
    path: str = ""
    format: str = "python"
    features: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
