"""The epishard on-disk format, defined once: names, the window-index schema, the manifest version.

Everything a reader needs to agree on with the writer lives here: file and member names, the
index's Arrow schema, the manifest (``Manifest``, its entries) and the checks of a parsed
``manifest.json``'s fields (``check_manifest``, ``plain_name``, ``declared_width``), which
``Manifest.load`` runs before it builds the typed manifest. docs/FORMAT.md is the prose version
of this module and the two change together.

Internal: import from ``epishard.format``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .errors import FormatError
from .untrusted import loads

__all__ = [
    "CAMERA_KINDS",
    "CAMERA_TYPE",
    "CHECK_LEVELS",
    "CONVERT_MARKER",
    "DATASET_INDEX_NAME",
    "DATA_EXT",
    "FINITE_STATS_PREFIXES",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_SCHEMA",
    "INDEX_SUFFIX",
    "MANIFEST_NAME",
    "MAX_MEMBER_NAME",
    "MEMBER_TYPE",
    "META_EXT",
    "PLAIN_VERSION",
    "PREFIX_RE",
    "REPORT_NAME",
    "SHARD_SUFFIX",
    "STREAMS_INDEX_SCHEMA",
    "STREAMS_VERSION",
    "STREAM_DTYPES",
    "STREAM_EXT",
    "STREAM_TYPE",
    "VERSION_KEY",
    "VIDEO_EXT",
    "CameraEntry",
    "FeatureEntry",
    "IndexFile",
    "Manifest",
    "ManifestOptions",
    "Report",
    "ReportEntry",
    "ShardEntry",
    "SourceEntry",
    "StreamEntry",
    "Totals",
    "camera_fields",
    "camera_output",
    "check_manifest",
    "check_member_name",
    "check_version",
    "declared_width",
    "episode_key",
    "index_name",
    "is_partial",
    "is_writer_file",
    "member_name",
    "plain_name",
    "policy_on_disk",
    "shard_name",
    "slug",
    "stream_fields",
    "temp_path",
]

FORMAT_NAME = "epishard"
FORMAT_VERSION = 3  # the newest this reads and writes: 2: camera `kind`, `images:` transform; 3: streams
# Version 3 adds streams at their own rate (the index's `streams` column, `<key>.<field>.arrow` members).
# Only a dataset that has streams is written as version 3; every other one stays version 2, byte for byte
# what earlier writers made (so their reruns resume and older readers read them).
STREAMS_VERSION = 3
PLAIN_VERSION = 2
VERSION_KEY = b"epishard.format_version"  # Arrow schema metadata of every index file: the version it follows

MANIFEST_NAME = "manifest.json"
REPORT_NAME = "report.json"
DATASET_INDEX_NAME = "index.arrow"  # all shard indexes + a `shard` column, Arrow IPC, memory-mappable
SHARD_SUFFIX = ".tar"
INDEX_SUFFIX = ".index.parquet"
# Written first into the (new or empty) output folder: marks it as a conversion's folder, so a
# rerun may replace what is in it. A folder without it is never written into unless empty.
CONVERT_MARKER = ".epishard-convert.json"
_PARTIAL = re.compile(r"\.partial-\d+$")  # a file being written: <final name>.partial-<pid> (temp_path)


def temp_path(final_path: str) -> str:
    """Temporary name a file is written under before it is renamed to ``final_path``.

    ``<final_path>.partial-<pid>`` (``is_partial`` recognises it; a rerun removes what a killed run left).
    """
    return f"{final_path}.partial-{os.getpid()}"


def is_partial(name: str) -> bool:
    """Whether ``name`` is a file still being written (or left by a killed run): ``<name>.partial-<pid>``."""
    return _PARTIAL.search(name) is not None


# Tar member extensions (the part after the key's first dot, webdataset-style).
DATA_EXT = "parquet"
META_EXT = "json"
VIDEO_EXT = "mp4"
STREAM_EXT = "arrow"  # a stream at its own rate: Arrow IPC file (epishard.format.streams)

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


def _camera_field(camera: str) -> str:
    """Dot-free field name of a camera's video member, e.g. ``observation.images.front`` -> ``front``.

    The full camera name is kept in the index and the episode's JSON member and restored on read.
    """
    short = camera[len("observation.images.") :] if camera.startswith("observation.images.") else camera
    return slug(short)


def camera_fields(cameras: list[str]) -> dict[str, str]:
    """Field name of each camera's video member (``cameras`` in sorted order).

    ``_camera_field``, or ``cam<i>`` (its position) when that collides with an earlier camera's or
    with ``json``/``parquet``.
    """
    fields: dict[str, str] = {}
    for i, cam in enumerate(cameras):
        name = _camera_field(cam)
        fields[cam] = name if name not in fields.values() and name not in (DATA_EXT, META_EXT) else f"cam{i}"
    return fields


def stream_fields(streams: list[str], taken: list[str]) -> dict[str, str]:
    """Field name (before ``.arrow``) of each stream's member (``streams`` in sorted order).

    The stream's name with every character outside ``[A-Za-z0-9_-]`` made ``_``
    (``observation.force`` -> ``observation_force``), or ``stream<i>`` (its position) when that
    collides with an earlier stream's or with one of ``taken`` (the episode's camera fields).
    """
    fields: dict[str, str] = {}
    for i, name in enumerate(streams):
        field = slug(name)
        clash = field in fields.values() or field in taken or field in (DATA_EXT, META_EXT)
        fields[name] = f"stream{i}" if clash else field
    return fields


def member_name(key: str, field: str) -> str:
    """Tar member name ``<key>.<field>`` (``field``: ``json``, ``parquet`` or ``<camera field>.mp4``)."""
    return f"{key}.{field}"


def check_member_name(name: str) -> None:
    """Raise ``ValueError`` when ``name`` is longer than ``MAX_MEMBER_NAME`` bytes.

    USTAR's limit: the writer emits no PAX headers.
    """
    if len(name.encode()) > MAX_MEMBER_NAME:
        raise ValueError(f"tar member name {name!r} is longer than {MAX_MEMBER_NAME} bytes")


# A shard prefix is a plain file-name stem: no path separators, no leading dot, so every file the
# writer makes stays inside the output folder.
PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


def shard_name(prefix: str, shard_id: int) -> str:
    """File name of shard ``shard_id``: ``<prefix>-<shard_id:06d>.tar``."""
    return f"{prefix}-{shard_id:06d}{SHARD_SUFFIX}"


def is_writer_file(name: str, prefix: str) -> bool:
    """Whether ``name`` (a file name in the output folder) is one the writer creates for ``prefix``.

    For shard prefix ``prefix``: a shard, a shard index, ``index.arrow``, ``manifest.json``, the marker, or
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

# How the writer vouched for each stored video's frame table (``ConvertOptions.check``), strongest
# first: "full" decodes every frame three times (table by decode, then in order and after seeks
# through the reader's decoder), "fast" reads the table from the container and decodes keyframes and
# the last group of pictures through the reader's decoder, "off" reads it from the container only.
# The manifest's report counts the videos checked at each (``Report.checks``).
CHECK_LEVELS = ("full", "fast", "off")


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
        # Packet table (docs/FORMAT.md "Packet tables"): the frame stream's packets in file (decode)
        # order, so a reader fetches only the groups of pictures a window needs. `packet_size` empty:
        # no table (the reader fetches the whole member). Absent in older indexes: no table.
        ("packet_start", pa.int64()),  # offset in the member of packet 0 when `packet_offset` is empty
        ("packet_offset", pa.list_(pa.int64())),  # [packets] offsets in the member, or [] when contiguous
        ("packet_size", pa.list_(pa.int32())),  # [packets] bytes
        ("packet_frame", pa.list_(pa.int32())),  # [packets] frame shown (-1: none), or [] when packet i shows frame i
        ("packet_crc32", pa.list_(pa.uint32())),  # [packets] CRC-32 of each packet's bytes
        ("extradata", pa.binary()),  # the stream's codec configuration (avcC, av1C, ...), b"" if none
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
    metadata={VERSION_KEY: str(PLAIN_VERSION).encode()},
)

# Numeric types a stream's values may have (numpy names; the member stores them as they are).
STREAM_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)

STREAM_TYPE = pa.struct(
    [
        ("name", pa.string()),  # e.g. "observation.force"
        ("member", pa.int32()),  # position of its `.arrow` member in the episode's `members` list
        ("dtype", pa.string()),  # STREAM_DTYPES: the values' type, as the source gave them
        ("shape", pa.list_(pa.int32())),  # per-sample shape ([] for a scalar, [6] for a wrench)
        ("count", pa.int64()),  # samples
        ("t_first", pa.float64()),  # timestamp of the first sample, seconds (0.0 when count is 0)
        ("t_last", pa.float64()),  # timestamp of the last sample, seconds (0.0 when count is 0)
        # Smallest and largest gap between consecutive samples, seconds (0.0 with fewer than 2): a
        # reader bounds the samples of any interval of `w` seconds by floor(w / min_interval) + 1.
        ("min_interval", pa.float64()),
        ("max_interval", pa.float64()),
        ("rate", pa.float64()),  # nominal rate in Hz as the source declared it, 0.0 when none
        # Pieces: the stream is stored as consecutive members, `member` the first; piece k holds
        # samples [piece_start[k], piece_start[k+1]) (the last: to `count`), its first at piece_time[k].
        ("piece_start", pa.list_(pa.int64())),
        ("piece_time", pa.list_(pa.float64())),
        # The row clock at rows 0, row_step, 2 * row_step, ... and the last row (seconds), so a reader
        # bounds a window's anchor time from the index alone; [] when the clock goes back (read all).
        ("row_step", pa.int32()),
        ("row_time", pa.list_(pa.float64())),
    ]
)

STREAMS_INDEX_SCHEMA = pa.schema(
    [*INDEX_SCHEMA, ("streams", pa.list_(STREAM_TYPE))],
    metadata={VERSION_KEY: str(STREAMS_VERSION).encode()},
)


# --- the manifest ------------------------------------------------------------------------------------


def check_version(name: object, version: object, where: str) -> None:
    """Refuse a dataset this reader cannot read.

    Another ``format`` than ``"epishard"``, or a ``format_version`` outside ``1 .. FORMAT_VERSION``
    (a newer one comes from a newer epishard).

    Raises:
        FormatError: names ``where`` (the file) and both versions.
    """
    if name != FORMAT_NAME:
        raise FormatError(f"{where}: format {name!r} is not {FORMAT_NAME!r}: not an epishard dataset")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FormatError(f"{where}: format_version {version!r} is not a format version (1, 2, ...)")
    if version > FORMAT_VERSION:
        raise FormatError(
            f"{where}: format_version {version} is newer than this epishard reads (format versions 1 to "
            f"{FORMAT_VERSION}): upgrade epishard to read it"
        )


_JSON_NAMES = {int: "integer", float: "number", str: "string", list: "array", dict: "object", type(None): "null"}
_REQUIRED = object()


def _field_path(where: str, key: str) -> str:
    """``"<file>: key"`` after a file name, else ``"<where>.key"`` (how messages name a field)."""
    return f"{where} {key}" if where.endswith(":") else f"{where}.{key}"


def _json_field(obj: Any, key: str, types, where: str, default: Any = _REQUIRED) -> Any:
    """``obj[key]`` if it has one of ``types`` (a JSON bool is not an integer).

    ``default`` when the key is absent and a default is given.

    Raises:
        FormatError: "<where> <key>: missing" or "<where> <key> must be a JSON <type>, got ...".
    """
    at = _field_path(where, key)
    allowed = types if isinstance(types, tuple) else (types,)
    if isinstance(obj, dict) and key not in obj:
        if default is not _REQUIRED:
            return default
        raise FormatError(f"{at}: missing")
    value = obj.get(key) if isinstance(obj, dict) else obj
    if not isinstance(obj, dict) or not isinstance(value, types) or (isinstance(value, bool) and bool not in allowed):
        names = " or ".join(_JSON_NAMES[t] for t in allowed)
        raise FormatError(f"{at} must be a JSON {names}, got {value!r:.60}")
    return value


_NUMBER = (int, float)
_OPT_NUMBER = (int, float, type(None))
_OPT_STR = (str, type(None))
_OPT_INT = (int, type(None))


def _strings(obj: dict, key: str, where: str, default: Any = _REQUIRED) -> tuple[str, ...]:
    values = _json_field(obj, key, list, where, default)
    if values is None:
        return default
    if not all(isinstance(v, str) for v in values):
        raise FormatError(f"{_field_path(where, key)} must be a JSON array of strings")
    return tuple(values)


def _objects(obj: dict, key: str, where: str, default: Any = _REQUIRED) -> dict:
    values = _json_field(obj, key, dict, where, default)
    if values is not None and not all(isinstance(v, dict) for v in values.values()):
        raise FormatError(f"{_field_path(where, key)} must be a JSON object of name -> object")
    return values


def _to_json(value: Any) -> Any:
    """Dataclasses (their ``to_json``), tuples and mappings as the JSON values they stand for."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _to_json(v) for k, v in value.items()}
    return value


class _Entry:
    """JSON object of a frozen dataclass.

    Every field, except ``optional`` ones that are None (absent from the document they were read
    from, e.g. fields of an older format version).
    """

    optional: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            f.name: _to_json(getattr(self, f.name))
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if not (f.name in self.optional and getattr(self, f.name) is None)
        }


# On-disk spelling of the writer's ``on_error``/``timestamps`` option values. Format version 2
# records "fail" where the API now says "raise" (one vocabulary with the reader): manifests and
# plan digests stay byte-identical, so a rerun of an existing conversion still resumes it.
_POLICY_ON_DISK = {"raise": "fail"}
_POLICY_IN_API = {"fail": "raise"}


def policy_on_disk(value: str) -> str:
    """The manifest's spelling of an ``on_error``/``timestamps`` value (``"raise"`` -> ``"fail"``)."""
    return _POLICY_ON_DISK.get(value, value)


@dataclass(frozen=True)
class SourceEntry(_Entry):
    """A converted source.

    ``name`` (unique in the dataset), ``path`` (None for a Python-API source),
    ``format`` (e.g. ``lerobot-v2.1``), ``fps`` (frames per second or None), ``episodes`` converted,
    ``notes`` (facts found while reading it, e.g. cameras declared without files), ``stats``
    (the source's own normalisation statistics, a LeRobot dataset's ``meta/stats.json`` as it was
    read at conversion: feature -> statistic -> numbers; None when it had none), ``stats_from``
    (optional: the file ``stats`` came from, relative to ``path``, e.g. ``meta/episodes_stats.jsonl
    (aggregated over 50 episodes)``; None: ``meta/stats.json``, as every manifest before it was
    written; text to show, never a path a reader opens).
    """

    optional = ("stats", "stats_from")
    name: str
    path: str | None
    format: str
    fps: float | None
    episodes: int
    notes: tuple[str, ...] = ()
    stats: Mapping[str, Mapping[str, Any]] | None = None
    stats_from: str | None = None

    @classmethod
    def from_json(cls, obj: dict, where: str) -> SourceEntry:
        """From its JSON object in the manifest, each field checked (``FormatError`` naming ``where`` and the field)."""
        return cls(
            name=_json_field(obj, "name", str, where),
            path=_json_field(obj, "path", _OPT_STR, where, None),
            format=_json_field(obj, "format", str, where),
            fps=_json_field(obj, "fps", _OPT_NUMBER, where),
            episodes=_json_field(obj, "episodes", int, where),
            notes=_strings(obj, "notes", where, ()),
            stats=_objects(obj, "stats", where, None),
            stats_from=_json_field(obj, "stats_from", _OPT_STR, where, None),
        )


@dataclass(frozen=True)
class ManifestOptions(_Entry):
    """The conversion's options.

    Shard ``prefix``; ``cameras`` kept (None: all; ``()``: none);
    ``on_error`` and ``timestamps`` policies (``"raise"``/``"skip"``, ``"warn"``/``"raise"``; written
    as ``"fail"`` for ``"raise"``, the format's spelling); ``video``: ``"copy"`` or the re-encode spec.
    """

    prefix: str
    cameras: tuple[str, ...] | None
    on_error: str
    timestamps: str
    video: str

    def to_json(self) -> dict:
        """Its JSON object in the manifest."""
        out = super().to_json()
        out["on_error"], out["timestamps"] = policy_on_disk(self.on_error), policy_on_disk(self.timestamps)
        return out

    @classmethod
    def from_json(cls, obj: dict, where: str) -> ManifestOptions:
        """From its JSON object in the manifest, each field checked (``FormatError`` naming ``where`` and the field)."""
        on_error, timestamps = _json_field(obj, "on_error", str, where), _json_field(obj, "timestamps", str, where)
        return cls(
            prefix=_json_field(obj, "prefix", str, where),
            cameras=_strings(obj, "cameras", where, None) if obj.get("cameras") is not None else None,
            on_error=_POLICY_IN_API.get(on_error, on_error),
            timestamps=_POLICY_IN_API.get(timestamps, timestamps),
            video=_json_field(obj, "video", str, where),
        )


@dataclass(frozen=True)
class FeatureEntry(_Entry):
    """A column or camera.

    ``dtype`` (Arrow value type, or ``"video"``), ``shape`` (list widths, None
    where they vary; ``[h, w, c]`` for a camera), ``names`` (as the source declares them, or None),
    ``kind`` (cameras only: ``rgb`` or ``depth``).
    """

    optional = ("kind",)
    dtype: str
    shape: tuple[int | None, ...]
    names: Any
    kind: str | None = None

    @classmethod
    def from_json(cls, obj: dict, where: str) -> FeatureEntry:
        """From its JSON object in the manifest, each field checked (``FormatError`` naming ``where`` and the field)."""
        shape = _json_field(obj, "shape", list, where)
        if not all(isinstance(n, _OPT_INT) and not isinstance(n, bool) for n in shape):
            raise FormatError(f"{_field_path(where, 'shape')} must be a JSON array of integers or nulls")
        return cls(
            dtype=_json_field(obj, "dtype", str, where),
            shape=tuple(shape),
            names=obj.get("names"),
            kind=_json_field(obj, "kind", str, where, None),
        )


@dataclass(frozen=True)
class StreamEntry(_Entry):
    """A stream at its own rate (format version 3), summed over the episodes that have it.

    ``dtype`` (``STREAM_DTYPES``) and ``shape`` (per sample, ``[]`` for a scalar) of its values;
    ``episodes`` that have it; ``samples`` in all; ``rate``: samples per second over all its
    episodes (samples less one, over the time from first to last sample; None with fewer than two);
    ``nominal_rate``: what the source declared (None: nothing); ``min_interval`` and
    ``max_interval``: the smallest and largest gap between consecutive samples, seconds;
    ``gaps``: intervals longer than 1.5 nominal periods (the nominal rate's, else the stream's
    median interval in its episode), the dropouts a user should know of.
    """

    dtype: str
    shape: tuple[int, ...]
    episodes: int
    samples: int
    rate: float | None
    nominal_rate: float | None
    min_interval: float
    max_interval: float
    gaps: int

    @classmethod
    def from_json(cls, obj: dict, where: str) -> StreamEntry:
        """From its JSON object in the manifest, each field checked (``FormatError`` naming ``where`` and the field)."""
        dtype = _json_field(obj, "dtype", str, where)
        if dtype not in STREAM_DTYPES:
            raise FormatError(f"{_field_path(where, 'dtype')} is {dtype!r}, not one of {', '.join(STREAM_DTYPES)}")
        shape = _json_field(obj, "shape", list, where)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape):
            raise FormatError(f"{_field_path(where, 'shape')} must be a JSON array of integers >= 1")
        return cls(
            dtype=dtype,
            shape=tuple(shape),
            episodes=_json_field(obj, "episodes", int, where),
            samples=_json_field(obj, "samples", int, where),
            rate=_json_field(obj, "rate", _OPT_NUMBER, where),
            nominal_rate=_json_field(obj, "nominal_rate", _OPT_NUMBER, where),
            min_interval=_json_field(obj, "min_interval", _NUMBER, where),
            max_interval=_json_field(obj, "max_interval", _NUMBER, where),
            gaps=_json_field(obj, "gaps", int, where),
        )


@dataclass(frozen=True)
class CameraEntry(_Entry):
    """A camera.

    Stream facts of its first episode as a reader returns them (``width``, ``height``
    after rotation, ``codec``, ``fps``), ``episodes`` that have it, and (format version 2) its
    ``kind``, stored ``pix_fmt`` and ``bit_depth``, what a reader returns (``dtype``, ``channels``)
    and the ``conversion`` applied when that holds fewer bits than are stored (None: none).
    ``sizes``: ``"<height>x<width>"`` -> episodes, only where episodes differ in size.
    """

    optional = ("kind", "pix_fmt", "bit_depth", "dtype", "channels", "sizes")
    codec: str
    width: int
    height: int
    fps: float
    episodes: int
    kind: str | None = None
    pix_fmt: str | None = None
    bit_depth: int | None = None
    dtype: str | None = None
    channels: int | None = None
    conversion: str | None = None
    sizes: Mapping[str, int] | None = None

    def to_json(self) -> dict:
        """Its JSON object in the manifest."""
        out = super().to_json()
        if self.kind is None:  # a version-1 entry: none of the version-2 fields
            out.pop("conversion")
        return out

    @classmethod
    def from_json(cls, obj: dict, where: str) -> CameraEntry:
        """From its JSON object in the manifest, each field checked (``FormatError`` naming ``where`` and the field)."""
        return cls(
            codec=_json_field(obj, "codec", str, where),
            width=_json_field(obj, "width", int, where),
            height=_json_field(obj, "height", int, where),
            fps=_json_field(obj, "fps", _NUMBER, where),
            episodes=_json_field(obj, "episodes", int, where),
            kind=_json_field(obj, "kind", str, where, None),
            pix_fmt=_json_field(obj, "pix_fmt", str, where, None),
            bit_depth=_json_field(obj, "bit_depth", int, where, None),
            dtype=_json_field(obj, "dtype", str, where, None),
            channels=_json_field(obj, "channels", int, where, None),
            conversion=_json_field(obj, "conversion", _OPT_STR, where, None),
            sizes=_json_field(obj, "sizes", dict, where, None),
        )


@dataclass(frozen=True)
class IndexFile(_Entry):
    """The dataset index: ``file`` (``index.arrow``) and its ``sha256`` (hex)."""

    file: str
    sha256: str

    @classmethod
    def from_json(cls, obj: dict, where: str) -> IndexFile:
        """From its JSON object in the manifest, each field checked (``FormatError`` naming ``where`` and the field)."""
        return cls(file=_json_field(obj, "file", str, where), sha256=_json_field(obj, "sha256", str, where))


@dataclass(frozen=True)
class ShardEntry(_Entry):
    """One shard.

    File names of its tar (``shard``) and window index (``index``), ``episodes``,
    ``rows`` and camera ``frames`` it holds, the tar's ``size`` (bytes) and ``sha256``, the index's
    ``index_sha256``.
    """

    shard: str
    index: str
    episodes: int
    rows: int
    frames: int
    size: int
    sha256: str
    index_sha256: str

    @classmethod
    def from_json(cls, obj: dict, where: str) -> ShardEntry:
        """From its JSON object in the manifest, each field checked (``FormatError`` naming ``where`` and the field)."""
        return cls(
            shard=_json_field(obj, "shard", str, where),
            index=_json_field(obj, "index", str, where),
            episodes=_json_field(obj, "episodes", int, where),
            rows=_json_field(obj, "rows", int, where),
            frames=_json_field(obj, "frames", int, where),
            size=_json_field(obj, "size", int, where),
            sha256=_json_field(obj, "sha256", str, where),
            index_sha256=_json_field(obj, "index_sha256", str, where),
        )


@dataclass(frozen=True)
class Totals(_Entry):
    """Dataset totals.

    ``shards``, ``episodes``, ``rows``, camera ``frames`` (rows x cameras), ``bytes``
    of the tars, ``skipped`` episodes.
    """

    shards: int
    episodes: int
    rows: int
    frames: int
    bytes: int
    skipped: int

    @classmethod
    def from_json(cls, obj: dict, where: str) -> Totals:
        """From its JSON object in the manifest, each field checked (``FormatError`` naming ``where`` and the field)."""
        return cls(**{f.name: _json_field(obj, f.name, int, where) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class ReportEntry(_Entry):
    """A skipped episode or a warning.

    ``kind`` (e.g. ``nan``, ``timestamps_offset``), ``message``,
    and where (None where it does not apply): ``dataset``, ``episode``, ``camera``, ``row``, ``file``,
    and for a skipped episode the ``shard`` it would have been in.
    """

    kind: str
    message: str
    dataset: str | None = None
    episode: int | None = None
    camera: str | None = None
    row: int | None = None
    file: str | None = None
    shard: str | None = None

    def to_json(self, skipped: bool = True) -> dict:
        """Warnings name no file or shard unless they have one; skipped entries always list both."""
        out = super().to_json()
        for key in ("file", "shard"):
            if not skipped and out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_json(cls, obj: dict, where: str) -> ReportEntry:
        """From its JSON object in the manifest, each field checked (``FormatError`` naming ``where`` and the field)."""
        return cls(
            kind=_json_field(obj, "kind", str, where),
            message=_json_field(obj, "message", str, where),
            dataset=_json_field(obj, "dataset", _OPT_STR, where, None),
            episode=_json_field(obj, "episode", _OPT_INT, where, None),
            camera=_json_field(obj, "camera", _OPT_STR, where, None),
            row=_json_field(obj, "row", _OPT_INT, where, None),
            file=_json_field(obj, "file", _OPT_STR, where, None),
            shard=_json_field(obj, "shard", _OPT_STR, where, None),
        )


def _count_kinds(entries: tuple[ReportEntry, ...]) -> dict[str, int]:
    """Entries per ``kind``, kinds in sorted order (the report's ``*_by_kind``)."""
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.kind] = counts.get(entry.kind, 0) + 1
    return dict(sorted(counts.items()))


@dataclass(frozen=True)
class Report(_Entry):
    """What the writer dropped or flagged: ``skipped`` episodes and ``warnings``, and their counts per kind.

    ``checks``: check level (``CHECK_LEVELS``) -> number of stored videos (episode x camera) whose
    frame table was vouched for at that level; None in manifests written before check levels (every
    table then was checked as ``full`` is now, unless the Python API turned the check off).
    """

    skipped_by_kind: Mapping[str, int]
    warnings_by_kind: Mapping[str, int]
    skipped: tuple[ReportEntry, ...] = ()
    warnings: tuple[ReportEntry, ...] = ()
    checks: Mapping[str, int] | None = None

    @classmethod
    def of(
        cls,
        skipped: tuple[ReportEntry, ...],
        warnings: tuple[ReportEntry, ...],
        checks: Mapping[str, int] | None = None,
    ) -> Report:
        """The report of these entries, with their counts per kind (``checks``: see the class)."""
        return cls(_count_kinds(skipped), _count_kinds(warnings), skipped, warnings, checks)

    def to_json(self) -> dict:
        """Its JSON object in the manifest (``checks`` only where recorded)."""
        out = {
            "skipped_by_kind": dict(self.skipped_by_kind),
            "warnings_by_kind": dict(self.warnings_by_kind),
            "skipped": [e.to_json(skipped=True) for e in self.skipped],
            "warnings": [e.to_json(skipped=False) for e in self.warnings],
        }
        if self.checks is not None:
            out["checks"] = {level: int(self.checks[level]) for level in CHECK_LEVELS if level in self.checks}
        return out

    @classmethod
    def from_json(cls, obj: dict, where: str) -> Report:
        """From its JSON object in the manifest, each field checked (``FormatError`` naming ``where`` and the field)."""
        lists = {
            key: tuple(
                ReportEntry.from_json(e, f"{where}.{key}[{i}]")
                for i, e in enumerate(_json_field(obj, key, list, where, []))
            )
            for key in ("skipped", "warnings")
        }
        checks = _json_field(obj, "checks", dict, where, None)
        unknown = [level for level in checks or {} if level not in CHECK_LEVELS]
        if unknown:
            raise FormatError(f"{where}.checks: unknown check level {unknown[0]!r} (known: {', '.join(CHECK_LEVELS)})")
        return cls(
            skipped_by_kind=_json_field(obj, "skipped_by_kind", dict, where),
            warnings_by_kind=_json_field(obj, "warnings_by_kind", dict, where),
            **lists,
            checks=checks,
        )


# --- the checks of a parsed manifest.json ----------------------------------------------------------

_SHA256 = re.compile(r"[0-9a-f]{64}")


def plain_name(name, where: str) -> str:
    r"""``name`` if it is a plain file name, else ``FormatError`` naming ``where``.

    Plain: no ``/`` or ``\\``, no NUL, not empty, ``.`` or ``..``.
    """
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0") or len(name) > 255:
        raise FormatError(f"{where}: {name!r} is not a plain file name (no path separators, not '.' or '..')")
    return name


def _count(obj: dict, key: str, where: str) -> int:
    value = _json_field(obj, key, int, where)
    if not 0 <= value < 1 << 62:
        raise FormatError(f"{_field_path(where, key)}: {value} is out of range")
    return value


def _sha(obj: dict, key: str, where: str) -> str:
    value = _json_field(obj, key, str, where)
    if not _SHA256.fullmatch(value):
        raise FormatError(f"{_field_path(where, key)}: {value!r:.80} is not a sha256 hex digest")
    return value


def _numbers(value, where: str) -> None:
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        raise FormatError(f"{where} must be a JSON number or an array of numbers")


# Columns whose non-finite values the writer refuses (``prepare.CHECKED_PREFIXES``): their
# statistics are finite in every manifest it writes. Another column holding NaN or inf gets NaN or
# inf statistics (``stats.FeatureStats``), so those are kept, and refused only when a reader
# normalises with them (``stream.episode.Normalizer.from_stats``).
FINITE_STATS_PREFIXES = ("observation.state", "action")


def declared_width(features: Mapping, column: str) -> int | None:
    """Values per row of ``column`` as ``features`` declares it (``[]``: 1, ``[3]``: 3); None where not known.

    Only scalar and one-level list shapes count: deeper shapes of variable lists are not exact.
    """
    entry = features.get(column)
    shape = entry.get("shape") if isinstance(entry, Mapping) else getattr(entry, "shape", None)
    if not isinstance(shape, (list, tuple)) or len(shape) > 1:
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        return None
    return int(shape[0]) if shape else 1


def _check_stats(stats: dict, features: Mapping, mixed: set, where: str) -> None:
    """Check each feature's statistics in ``stats`` (``FormatError`` naming ``where``, the feature and the statistic).

    Numbers or arrays of numbers of one length (``count`` aside), the feature's declared width
    (``declared_width`` of ``features``, for a column not in ``mixed``); ``std`` not negative; all
    finite for the columns in ``FINITE_STATS_PREFIXES``.
    """
    for column, entry in stats.items():
        at = f"{where}[{column!r}]"
        if not isinstance(entry, dict):
            raise FormatError(f"{at} must be a JSON object")
        width = None if column in mixed else declared_width(features, column)
        lengths = {}
        for name, value in entry.items():
            _numbers(value, f"{at}.{name}")
            if isinstance(value, list) and name != "count":  # rows counted: a number (a list in some)
                lengths[name] = len(value)
                if width is not None and len(value) != width:
                    shape = list(features[column]["shape"])
                    raise FormatError(
                        f"{at}.{name} has {len(value)} values; features[{column!r}].shape is {shape} ({width} per row)"
                    )
        if len(set(lengths.values())) > 1:
            raise FormatError(f"{at}: its statistics differ in length ({lengths})")
        finite = column.startswith(FINITE_STATS_PREFIXES)
        for name, value in entry.items():
            if name == "count":
                continue
            values = np.asarray(value if isinstance(value, list) else [value], np.float64)
            bad = ~np.isfinite(values) if finite else np.zeros(values.shape, bool)
            if name == "std":
                bad |= values < 0
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                must = "finite and >= 0" if name == "std" else "finite"
                item = f"[{i}]" if isinstance(value, list) else ""
                raise FormatError(f"{at}.{name}{item} is {values[i]}; must be {must}")


def check_manifest(manifest, where: str) -> None:
    """Check the fields of a parsed ``manifest.json`` that readers use (``where``: its path).

    Raises:
        FormatError: the first field with a wrong type, a missing key or an out-of-range value.
    """
    if not isinstance(manifest, dict):
        raise FormatError(f"{where}: the document must be a JSON object, got {manifest!r:.60}")
    at = f"{where}:"  # fields follow: "<file>: shards[1].size"
    check_version(_json_field(manifest, "format", str, at), _json_field(manifest, "format_version", int, at), where)
    where = at
    index = _json_field(manifest, "index", dict, where)
    plain_name(_json_field(index, "file", str, f"{where} index"), f"{where} index.file")
    _sha(index, "sha256", f"{where} index")
    seen: set[str] = set()
    for i, shard in enumerate(_json_field(manifest, "shards", list, where)):
        at = f"{where} shards[{i}]"
        for key, suffix in (("shard", SHARD_SUFFIX), ("index", INDEX_SUFFIX)):
            name = plain_name(_json_field(shard, key, str, at), f"{at}.{key}")
            if not name.endswith(suffix) or name in seen:
                raise FormatError(f"{at}.{key}: {name!r} does not end with {suffix!r} or is listed twice")
            seen.add(name)
        for key in ("size", "episodes"):
            _count(shard, key, at)
        _sha(shard, "sha256", at)
        _sha(shard, "index_sha256", at)
    cameras = _json_field(manifest, "cameras", dict, where)  # empty when a conversion kept no camera
    if not all(isinstance(c, dict) for c in cameras.values()):
        raise FormatError(f"{where} cameras must be a JSON object of camera name -> object")
    features = _json_field(manifest, "features", dict, where, None) or {}
    mixed = set(_json_field(manifest, "stats_mixed_widths", list, where, None) or ())
    _check_stats(_json_field(manifest, "stats", dict, where), features, set(), f"{where} stats")
    for source, by_source in (_json_field(manifest, "stats_by_source", dict, where, None) or {}).items():
        if not isinstance(by_source, dict):
            raise FormatError(f"{where} stats_by_source[{source!r}] must be a JSON object")
        _check_stats(by_source, features, mixed, f"{where} stats_by_source[{source!r}]")
    _count(_json_field(manifest, "totals", dict, where), "episodes", f"{where} totals")
    _json_field(manifest, "tasks", list, where)
    for i, source in enumerate(_json_field(manifest, "sources", list, where)):
        at = f"{where} sources[{i}]"
        _json_field(source, "name", str, at), _json_field(source, "format", str, at), _count(source, "episodes", at)
        _json_field(source, "fps", (int, float, type(None)), at)
    report = _json_field(manifest, "report", dict, where)
    for key in ("skipped_by_kind", "warnings_by_kind"):
        _json_field(report, key, dict, f"{where} report")


@dataclass(frozen=True)
class Manifest(_Entry):
    """``manifest.json``: what a dataset holds and how it was made (docs/FORMAT.md, "Manifest").

    Built by ``convert``; read with ``Manifest.load`` (every reader: the stream reader, ``verify``,
    ``inspect``), written with ``dump``. Mappings keep the document's order; statistics
    (``stats``: column -> ``{count, mean, std, min, max, q01, q99}`` lists, one value per
    dimension; ``stats_by_source``: source -> the same) stay plain JSON values. ``plan_digest``,
    ``options``, ``features``, ``stats_by_source`` and ``stats_mixed_widths`` are None when the
    document has none (hand-made or older manifests); readers do not need them.
    """

    optional = ("plan_digest", "options", "features", "stats_by_source", "stats_mixed_widths", "streams")
    format: str
    format_version: int
    index: IndexFile
    shards: tuple[ShardEntry, ...]
    cameras: Mapping[str, CameraEntry]
    stats: Mapping[str, Mapping[str, Any]]
    totals: Totals
    tasks: tuple[str, ...]
    sources: tuple[SourceEntry, ...]
    report: Report
    fps: float | None = None
    plan_digest: str | None = None
    options: ManifestOptions | None = None
    features: Mapping[str, FeatureEntry] | None = None
    stats_by_source: Mapping[str, Mapping[str, Any]] | None = None
    stats_mixed_widths: tuple[str, ...] | None = None
    streams: Mapping[str, StreamEntry] | None = None  # format version 3: streams at their own rate

    def dump(self) -> bytes:
        """``manifest.json``'s bytes: sorted keys, one space of indent (what every version wrote)."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode()

    @classmethod
    def load(cls, data: bytes, where: str) -> Manifest:
        """The manifest in ``data`` (``manifest.json``'s bytes; ``where``: its path or URL).

        First the format and version (``check_version``: a newer version is refused, naming both),
        then every field readers use (``check_manifest``: types, ranges, plain file names,
        sha256 digests), then the typed fields. Nothing the manifest names is opened here.

        Raises:
            FormatError: not JSON, larger than ``untrusted.MAX_JSON_BYTES`` or nested deeper than
                ``untrusted.MAX_JSON_DEPTH``, another format, a newer version, or a field that
                breaks the format; the message names ``where`` and the field.
        """
        obj = loads(data, where, FormatError)  # bounded size and nesting (epishard.format.untrusted)
        if not isinstance(obj, dict):
            raise FormatError(f"{where}: the document must be a JSON object, got {obj!r:.60}")
        at = f"{where}:"  # fields follow: "<file>: shards[1].size"
        check_version(_json_field(obj, "format", str, at), _json_field(obj, "format_version", int, at), where)
        check_manifest(obj, where)
        return cls.from_json(obj, at)

    @classmethod
    def from_json(cls, obj: dict, where: str) -> Manifest:
        """The typed manifest of a parsed document (``where``: ``"<file>:"``).

        Types are checked here, value ranges by ``Manifest.load``.
        """
        sub = _field_path
        options = _json_field(obj, "options", dict, where, None)
        features = _objects(obj, "features", where, None)
        return cls(
            format=_json_field(obj, "format", str, where),
            format_version=_json_field(obj, "format_version", int, where),
            index=IndexFile.from_json(_json_field(obj, "index", dict, where), sub(where, "index")),
            shards=tuple(
                ShardEntry.from_json(s, f"{sub(where, 'shards')}[{i}]")
                for i, s in enumerate(_json_field(obj, "shards", list, where))
            ),
            cameras={
                name: CameraEntry.from_json(c, f"{sub(where, 'cameras')}.{name}")
                for name, c in _objects(obj, "cameras", where).items()
            },
            stats=_objects(obj, "stats", where),
            totals=Totals.from_json(_json_field(obj, "totals", dict, where), sub(where, "totals")),
            tasks=_strings(obj, "tasks", where),
            sources=tuple(
                SourceEntry.from_json(s, f"{sub(where, 'sources')}[{i}]")
                for i, s in enumerate(_json_field(obj, "sources", list, where))
            ),
            report=Report.from_json(_json_field(obj, "report", dict, where), sub(where, "report")),
            fps=_json_field(obj, "fps", _OPT_NUMBER, where, None),
            plan_digest=_json_field(obj, "plan_digest", str, where, None),
            options=None if options is None else ManifestOptions.from_json(options, sub(where, "options")),
            features=None
            if features is None
            else {name: FeatureEntry.from_json(f, f"{sub(where, 'features')}.{name}") for name, f in features.items()},
            stats_by_source=_objects(obj, "stats_by_source", where, None),
            stats_mixed_widths=_strings(obj, "stats_mixed_widths", where, None),
            streams=None
            if _objects(obj, "streams", where, None) is None
            else {
                name: StreamEntry.from_json(entry, f"{sub(where, 'streams')}.{name}")
                for name, entry in _objects(obj, "streams", where).items()
            },
        )

    def camera_episodes(self) -> dict[str, int]:
        """Camera name -> episodes that have it."""
        return {name: camera.episodes for name, camera in self.cameras.items()}
