"""The epishard on-disk format, defined once: names, the window-index schema, the manifest version.

Everything a reader needs to agree on with the writer lives here; docs/FORMAT.md is the prose
version of this module and the two change together.
"""

from __future__ import annotations

import re

import pyarrow as pa

FORMAT_NAME = "epishard"
FORMAT_VERSION = 2  # 2: camera `kind` (depth cameras), `images:` transform

MANIFEST_NAME = "manifest.json"
REPORT_NAME = "report.json"
DATASET_INDEX_NAME = "index.arrow"  # all shard indexes + a `shard` column, Arrow IPC, memory-mappable
SHARD_SUFFIX = ".tar"
INDEX_SUFFIX = ".index.parquet"
# Written first into the (new or empty) output folder: marks it as a conversion's folder, so a
# rerun may replace what is in it. A folder without it is never written into unless empty.
CONVERT_MARKER = ".epishard-convert.json"
_PARTIAL = re.compile(r"\.partial-\d+$")  # a file being written: <final name>.partial-<pid> (tarwriter.temp_path)


def is_partial(name: str) -> bool:
    """Whether ``name`` is a file still being written (or left by a killed run): ``<name>.partial-<pid>``."""
    return _PARTIAL.search(name) is not None


# Tar member extensions (the part after the key's first dot, webdataset-style).
DATA_EXT = "parquet"
META_EXT = "json"
VIDEO_EXT = "mp4"

_KEY_OK = re.compile(r"[^A-Za-z0-9_\-]")

# USTAR stores names of at most 100 bytes; we refuse longer ones rather than emit PAX headers.
MAX_MEMBER_NAME = 100


def slug(text: str) -> str:
    """Return ``text`` with every character outside ``[A-Za-z0-9_-]`` replaced by ``_``.

    Used for episode keys and camera member names, which must contain no dots: webdataset splits a
    member name at its first dot into sample key and field name.
    """
    return _KEY_OK.sub("_", text)


def episode_key(source: str, episode_index: int) -> str:
    """Key of one episode in the shards: ``<source slug>-e<episode_index:06d>`` (no dots)."""
    return f"{slug(source)}-e{episode_index:06d}"


def camera_field(camera: str) -> str:
    """Dot-free field name of a camera's video member, e.g. ``observation.images.front`` -> ``front``.

    The full camera name is kept in the index and the episode's JSON member and restored on read.
    """
    short = camera[len("observation.images.") :] if camera.startswith("observation.images.") else camera
    return slug(short)


# A shard prefix is a plain file-name stem: no path separators, no leading dot, so every file the
# writer makes stays inside the output folder.
PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


def shard_name(prefix: str, shard_id: int) -> str:
    """File name of shard ``shard_id``: ``<prefix>-<shard_id:06d>.tar``."""
    return f"{prefix}-{shard_id:06d}{SHARD_SUFFIX}"


def is_writer_file(name: str, prefix: str) -> bool:
    """Whether ``name`` (a file name in the output folder) is one the writer creates for shard
    prefix ``prefix``: a shard, a shard index, ``index.arrow``, ``manifest.json``, the marker, or
    one of these being written (``<name>.partial-<pid>``).
    """
    name = _PARTIAL.sub("", name)
    if name in (MANIFEST_NAME, DATASET_INDEX_NAME, CONVERT_MARKER):
        return True
    return (
        re.fullmatch(
            re.escape(prefix) + r"-\d{6,}(" + re.escape(SHARD_SUFFIX) + "|" + re.escape(INDEX_SUFFIX) + ")", name
        )
        is not None
    )


def index_name(prefix: str, shard_id: int) -> str:
    """File name of shard ``shard_id``'s window index: ``<prefix>-<shard_id:06d>.index.parquet``."""
    return f"{prefix}-{shard_id:06d}{INDEX_SUFFIX}"


# Camera kinds. "rgb": decoded to uint8 RGB [3, H, W] (8 bits per sample; deeper colour video is
# reduced to 8 bits, stated in the manifest). "depth": a grey video (a depth map, or any grey video of
# more than 8 bits) decoded at full precision to uint16 [1, H, W] in the stored units, never scaled.
CAMERA_KINDS = ("rgb", "depth")


def camera_output(kind: str) -> tuple[str, int]:
    """(numpy dtype name, channels) of the frames the reader returns for a camera of ``kind``."""
    return ("uint16", 1) if kind == "depth" else ("uint8", 3)


MEMBER_TYPE = pa.struct(
    [
        ("name", pa.string()),  # full tar member name, e.g. "gr00t-e000003.ego_view.mp4"
        ("offset", pa.int64()),  # byte offset of the member's data (not header) in the tar
        ("size", pa.int64()),  # data size in bytes
        ("sha256", pa.string()),  # hex digest of the data
    ]
)

CAMERA_TYPE = pa.struct(
    [
        ("name", pa.string()),  # full camera name, e.g. "observation.images.ego_view"
        ("member", pa.int32()),  # position of its video in the episode's `members` list
        ("codec", pa.string()),
        ("width", pa.int32()),  # size of the frames a decoder returns: after `rotation`
        ("height", pa.int32()),
        ("rotation", pa.int32()),  # degrees from the stream's display matrix (0, 90, 180, 270)
        ("stream_index", pa.int32()),  # container stream holding the frames (cover art etc. skipped)
        ("pix_fmt", pa.string()),
        ("time_base_num", pa.int64()),
        ("time_base_den", pa.int64()),
        ("num_frames", pa.int32()),  # frames a decoder displays from the stored video (not packets)
        # Frame tables, compact when regular (the common case; keeps 10^4+ episodes small in memory):
        # pts of frame i = pts_start + i * pts_step when `pts` is empty, else pts[i] (stream time base).
        ("pts_start", pa.int64()),
        ("pts_step", pa.int64()),
        ("pts", pa.list_(pa.int64())),  # [num_frames] presentation order, or [] when regular
        # duration of frame i = pts_step when `duration` is empty, else duration[i].
        ("duration", pa.list_(pa.int64())),
        ("keyframes", pa.list_(pa.int32())),  # ascending frame numbers that are keyframes
        # Video frame shown at table row r = first_frame + r when `row_to_frame` is empty, else row_to_frame[r].
        ("first_frame", pa.int32()),
        ("row_to_frame", pa.list_(pa.int32())),  # [num_rows] or []
        ("transform", pa.string()),  # "copy" | "cut" | "reencode:<json>" | "images:<json>": what the writer did
        ("kind", pa.string()),  # CAMERA_KINDS: how the reader decodes it
    ]
)

INDEX_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("source", pa.string()),
        ("episode_index", pa.int64()),  # episode index in its source dataset
        ("num_rows", pa.int32()),  # table rows = frames of the episode
        ("fps", pa.float64()),
        ("task", pa.string()),  # first task text ("" if none)
        ("tasks", pa.list_(pa.string())),
        ("robot", pa.string()),
        ("members", pa.list_(MEMBER_TYPE)),  # tar order; contiguous in the shard
        ("cameras", pa.list_(CAMERA_TYPE)),
        # Rows in [window_start, window_stop) have a frame in every camera: anchors are drawn there.
        ("window_start", pa.int32()),
        ("window_stop", pa.int32()),
        # Rows where a new recording segment starts inside the episode (timestamps reset or jump:
        # recording paused and resumed), ascending, each in (0, num_rows); [] for the common case.
        # Windows never cross one: readers treat it like an episode boundary. Absent in indexes
        # written before it existed, which readers take as [].
        ("segment_starts", pa.list_(pa.int32())),
    ],
    metadata={b"epishard.format_version": str(FORMAT_VERSION).encode()},
)
