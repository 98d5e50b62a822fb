"""What a reader checks before it trusts a dataset's manifest and window index.

A manifest or index is data from outside (a shared folder, a bucket), so nothing in it is used to
open a file, size an allocation or index an array until it has been checked here:

- ``plain_name``: file and member names are plain names (no path separators, not ``.``/``..``),
  so nothing outside the dataset folder is opened, locally or remotely;
- ``check_manifest``: the format and version (``manifest.check_version``: a newer version is
  refused), and every manifest field the reader, ``verify`` and ``inspect`` use has its type and
  range (names, sizes, sha256 digests, cameras, statistics); ``manifest.Manifest.load`` runs it
  before it builds the typed manifest (these two are defined in ``epishard.format.manifest``,
  beside the names they check, and exported here too);
- ``check_index_version``: an index file's stated format version is one this reader reads and
  the manifest's;
- ``check_index_table``: the index's Arrow schema is the format's, without nulls;
- ``check_index``: every index value is in bounds against the manifest (shard sizes, episode
  counts) and the rest of the row (member byte ranges, frame counts, keyframes, row-to-frame maps),
  with members that follow one another without sharing a byte, at most one frame per byte of its
  video member and at most one row per byte of its table member, so no frame table or window plan
  is larger than the bytes it describes.

Each check raises ``FormatError`` naming the file, the field and, for the index, the row, episode
key and camera. The checks are vectorised (milliseconds for tens of thousands of episodes).
Loading an index against its manifest (digest, version, schema, values) is
``epishard.format.opening``.

Internal: import from ``epishard.format``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import manifest as fmt
from .errors import FormatError
from .manifest import FINITE_STATS_PREFIXES, check_manifest, declared_width, plain_name
from .streams import STREAM_EXPANSION, sample_bytes
from .untrusted import printable

__all__ = [
    "FINITE_STATS_PREFIXES",
    "FormatError",
    "check_digest",
    "check_index",
    "check_index_table",
    "check_index_version",
    "check_manifest",
    "check_stream_packets",
    "declared_width",
    "plain_name",
    "shard_size_mismatches",
    "totals_mismatches",
]

_BLOCK = 1 << 18  # bytes scanned per step by _holds: its temporaries stay in the CPU cache
# Absent from indexes written before recording segments were kept, and (streams) from indexes of
# format version 2 (no episode of the shard had a stream at its own rate).
_OPTIONAL_COLUMNS = {"segment_starts", "streams"}

# Camera fields of format version 1; fields added since (kind, stream_index, rotation, ...) are
# absent from older indexes and the index loader takes their defaults.
_CAMERA_FIELDS_V1 = {
    "name",
    "member",
    "codec",
    "width",
    "height",
    "pix_fmt",
    "time_base_num",
    "time_base_den",
    "num_frames",
    "pts_start",
    "pts_step",
    "pts",
    "duration",
    "keyframes",
    "first_frame",
    "row_to_frame",
    "transform",
}
_MAX_DIMENSION = 1 << 16  # widest frame any codec the reader decodes can hold (AV1: 65536)
_TAR_HEADER_BYTES = 512  # a USTAR header block: between one member's data and the next's


def totals_mismatches(manifest: fmt.Manifest) -> list[str]:
    """How ``manifest.totals`` differs from its shard list (one message per field; none: they agree).

    Shards, episodes, rows, frames and bytes as the shard entries add up, ``skipped`` as the report lists.
    """
    shards = manifest.shards
    sums = {
        "shards": len(shards),
        "episodes": sum(s.episodes for s in shards),
        "rows": sum(s.rows for s in shards),
        "frames": sum(s.frames for s in shards),
        "bytes": sum(s.size for s in shards),
        "skipped": len(manifest.report.skipped),
    }
    out = []
    for field, held in sums.items():
        said = getattr(manifest.totals, field)
        if said != held:
            what = "the report lists" if field == "skipped" else "the shards add up to"
            out.append(f"totals.{field} is {said}, {what} {held}")
    return out


def check_index_table(table: pa.Table, where: str, shard_column: bool) -> None:
    """Check that an index table has the format's columns and types and no nulls at any depth.

    ``index.arrow`` has an int32 ``shard`` column besides.

    Raises:
        FormatError: names the first missing or mistyped column, or the column holding a null.
    """
    expected = list(fmt.STREAMS_INDEX_SCHEMA) + ([pa.field("shard", pa.int32())] if shard_column else [])
    for field in expected:
        if field.name not in table.schema.names:
            if field.name in _OPTIONAL_COLUMNS:
                continue
            raise FormatError(f"{where}: column {field.name!r} is missing")
        got = table.schema.field(field.name).type
        if not got.equals(field.type) and not (field.name == "cameras" and _older_cameras(got)):
            raise FormatError(f"{where}: column {field.name!r} has type {got}, the format says {field.type}")
        for chunk in table.column(field.name).chunks:
            path = _null_path(chunk, field.name)
            if path:
                raise FormatError(f"{where}: column {path} holds a null")


def _older_cameras(got: pa.DataType) -> bool:
    """Whether ``got`` is the cameras column of an index written before some optional fields."""
    if not pa.types.is_list(got) or not pa.types.is_struct(got.value_type):
        return False
    fields = {f.name: f.type for f in got.value_type}
    expected = {f.name: f.type for f in fmt.CAMERA_TYPE}
    return all(fields.get(name) == expected[name] for name in _CAMERA_FIELDS_V1) and all(
        name in expected and expected[name] == t for name, t in fields.items()
    )


def _null_path(array: pa.Array, path: str) -> str | None:
    if array.null_count:
        return path
    if isinstance(array, pa.ListArray):
        return _null_path(array.flatten(), path)
    if isinstance(array, pa.StructArray):
        for i, field in enumerate(array.type):
            found = _null_path(array.field(i), f"{path}.{field.name}")
            if found:
                return found
    return None


class _Where:
    """Names the place of a bad value: file, row, episode key, camera."""

    def __init__(self, index, where: str, first_stream: int = 0):
        self.index, self.where, self.first_stream = index, where, first_stream

    def episode(self, rows: np.ndarray, field: str, message: str, values=None) -> None:
        bad = np.flatnonzero(rows)
        if bad.size:
            e = int(bad[0])
            value = "" if values is None else f" {values[e]}"
            key = printable(self.index.key(e))  # names from the file: no raw control characters
            raise FormatError(f"{self.where}: row {e} (episode {key}): {field}{value} {message}")

    def stream(self, streams: np.ndarray, field: str, message: str, values=None) -> None:
        bad = np.flatnonzero(streams)
        if bad.size:
            s = int(bad[0])
            value = "" if values is None else f" {values[s]}"
            s += self.first_stream
            e = int(np.searchsorted(self.index.episode_cams, s, side="right") - 1)
            raise FormatError(
                f"{self.where}: row {e} (episode {printable(self.index.key(e))}), camera "
                f"{printable(self.index.cam_names[s].as_py())}: {field}{value} {message}"
            )


def _per_item(counts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` (one per group) repeated for each item of the group (``counts`` items each)."""
    return np.repeat(values, counts)


def _item_to_group(bad_items: np.ndarray, offsets: np.ndarray, groups: int) -> np.ndarray:
    """Bool ``[groups]``: groups (offset-delimited) holding any of the bad items."""
    out = np.zeros(groups, dtype=bool)
    out[np.searchsorted(offsets, np.flatnonzero(bad_items), side="right") - 1] = True
    return out


def _not_ascending(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Bool per item: not strictly greater than the previous item of its group."""
    bad = np.zeros(values.size, dtype=bool)
    if values.size > 1:
        bad[1:] = np.diff(values) <= 0
        bad[offsets[:-1][offsets[:-1] < values.size]] = False  # the first item of each group
    return bad


def _decreasing(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Bool per item: less than the previous item of its group (``offsets``-delimited)."""
    bad = np.zeros(values.size, dtype=bool)
    if values.size > 1:
        bad[1:] = np.diff(values) < 0
        bad[offsets[:-1][offsets[:-1] < values.size]] = False  # the first item of each group
    return bad


def _utf8(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int64 offsets ``[n + 1]`` from 0, uint8 bytes) of a string array: views of its Arrow buffers."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if not pa.types.is_string(array.type):
        array = array.cast(pa.string())
    offsets = np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset * 4).astype(np.int64)
    raw = array.buffers()[2]
    data = (
        np.frombuffer(raw, np.uint8, int(offsets[-1] - offsets[0]), int(offsets[0])) if raw else np.zeros(0, np.uint8)
    )
    return offsets - offsets[0], data


def _lengths(array: pa.Array) -> np.ndarray:
    """int64 ``[n]``: bytes of each string."""
    return np.diff(_utf8(array)[0])


def _holds(array: pa.Array, bad: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Bool ``[n]``: the string holding the first byte for which ``bad`` (uint8 array -> bool array) is true.

    Literal byte tests over the string data, a block at a time, instead of a regular expression
    per string (``tools/bench/run.py firstbatch`` measures it); the first bad string is the one an error names.
    """
    offsets, data = _utf8(array)
    out = np.zeros(len(array), dtype=bool)
    for start in range(0, data.size, _BLOCK):
        hits = bad(data[start : start + _BLOCK])
        if hits.any():
            out[np.searchsorted(offsets, start + int(np.argmax(hits)), side="right") - 1] = True
            break
    return out


def _path_byte(block: np.ndarray) -> np.ndarray:
    r"""``/``, ``\\`` or NUL (never part of a multi-byte UTF-8 character)."""
    return (block == ord("/")) | (block == ord("\\")) | (block == 0)


def _control_byte(block: np.ndarray) -> np.ndarray:
    """An ASCII control character (below 0x20, or DEL): never in a key, member or camera name the writer makes."""
    return (block < 0x20) | (block == 0x7F)


def _not_lower_hex(block: np.ndarray) -> np.ndarray:
    """Not ``0-9`` or ``a-f`` (uint8 arithmetic wraps, so one comparison tests each range)."""
    return ((block - np.uint8(ord("0"))) > 9) & ((block - np.uint8(ord("a"))) > 5)


def _short_in(array: pa.Array, values: tuple[str, ...]) -> np.ndarray:
    """Bool ``[n]``: strings equal to one of ``values`` (only strings as short as the longest are compared)."""
    out = np.zeros(len(array), dtype=bool)
    short = np.flatnonzero(_lengths(array) <= max(len(v.encode()) for v in values))
    if short.size:
        out[short] = pc.is_in(array.take(pa.array(short)), value_set=pa.array(values)).to_numpy(zero_copy_only=False)
    return out


def check_index(
    index,
    shards: Sequence[fmt.ShardEntry],
    camera_episodes: Mapping[str, int | None],
    where: str,
    packets: bool = True,
) -> None:
    """Bounds-check every value of a ``WindowIndex`` before use.

    Against a checked manifest's ``shards`` (sizes, episodes per shard) and cameras
    (``camera_episodes``: name -> episodes that have it, or None where that is not checked).
    ``packets=False`` leaves the packet tables' values to ``check_stream_packets``, which
    ``WindowIndex.packets`` runs on each stream at its first use (a reader opening a dataset: the
    cost of this check then grows with episodes and cameras, not with packets).

    Raises:
        FormatError: the first value out of range, naming ``where``, the row, episode and camera.
    """
    w = _Where(index, where)
    _check_episodes(index, shards, w)
    _check_members(index, shards, w)
    _check_cameras(index, camera_episodes, w)
    _check_signals(index, w)
    if packets:
        _check_packets(_Packets(index, 0, index.cam_num_frames.size), w)


def _check_episodes(index, shards: Sequence[fmt.ShardEntry], w: _Where) -> None:
    n = index.num_episodes
    w.episode(
        (index.shard < 0) | (index.shard >= len(shards)),
        "shard",
        f"is not a shard of the manifest ({len(shards)} shards)",
        index.shard,
    )
    counts = np.bincount(index.shard, minlength=len(shards))
    if counts.tolist() != [s.episodes for s in shards]:
        raise FormatError(
            f"{w.where}: episodes per shard {counts.tolist()} differ from the manifest's {[s.episodes for s in shards]}"
        )
    w.episode(index.num_rows < 1, "num_rows", "is not positive", index.num_rows)
    w.episode(~np.isfinite(index.fps) | (index.fps <= 0), "fps", "is not a positive number", index.fps)
    w.episode(
        (index.window_start < 0) | (index.window_start > index.window_stop) | (index.window_stop > index.num_rows),
        "window_start/window_stop",
        "are not inside [0, num_rows]",
    )
    starts = np.diff(index.segment_offsets)
    bad = (index.segment_starts <= 0) | (index.segment_starts >= _per_item(starts, index.num_rows))
    bad |= _not_ascending(index.segment_starts, index.segment_offsets)
    w.episode(
        _item_to_group(bad, index.segment_offsets, n), "segment_starts", "are not ascending rows in (0, num_rows)"
    )


def _check_members(index, shards: Sequence[fmt.ShardEntry], w: _Where) -> None:
    """Members inside the shard, plain names, sha256 digests, one table member per episode."""
    n = index.num_episodes
    member_counts = np.diff(index.episode_members)
    w.episode(member_counts < 1, "members", "is empty")
    shard_size = np.array([s.size for s in shards], dtype=np.int64)
    end = index.member_offset + index.member_size
    bad = (
        (index.member_offset < 0) | (index.member_size < 0) | (end > _per_item(member_counts, shard_size[index.shard]))
    )
    w.episode(_item_to_group(bad, index.episode_members, n), "members.offset/size", "lie outside the shard")
    if not n:
        return
    # Members follow one another in the tar, each after its predecessor's data and its own
    # 512-byte header: no two share a byte, so the sizes of a shard's members (and all that is
    # bounded by them: frames, packets, rows) add up to at most the shard's size.
    owner = _per_item(member_counts, index.shard)
    same = owner[1:] == owner[:-1]
    overlap = np.zeros(index.member_offset.size, dtype=bool)
    overlap[:-1] = same & (end[:-1] + _TAR_HEADER_BYTES > index.member_offset[1:])
    w.episode(
        _item_to_group(overlap, index.episode_members, n),
        "members.offset/size",
        "run into the next member of the shard (members follow one another in the tar)",
    )
    w.episode(_holds(index.keys, _control_byte), "key", "holds a control character")
    names = index.member_names
    bad_name = _holds(names, _path_byte) | _holds(names, _control_byte) | _short_in(names, ("", ".", ".."))
    w.episode(_item_to_group(bad_name, index.episode_members, n), "members.name", "is not a plain file name")
    sha = index.member_sha256
    bad_sha = (_lengths(sha) != 64) | _holds(sha, _not_lower_hex)
    w.episode(_item_to_group(bad_sha, index.episode_members, n), "members.sha256", "is not a sha256 hex digest")
    data = pc.ends_with(names, "." + fmt.DATA_EXT).to_numpy(zero_copy_only=False)
    w.episode(
        np.add.reduceat(data, index.episode_members[:-1]) != 1,
        "members",
        f"do not hold exactly one .{fmt.DATA_EXT} table",
    )
    table_bytes = index.member_size[index.data_member(np.arange(n))]
    w.episode(
        index.num_rows > table_bytes,
        "num_rows",
        f"is more than the bytes of its .{fmt.DATA_EXT} table member (a row needs at least one)",
        index.num_rows,
    )
    video = pc.ends_with(names, "." + fmt.VIDEO_EXT).to_numpy(zero_copy_only=False)
    episode_of_stream = np.repeat(np.arange(n), np.diff(index.episode_cams))
    w.stream(
        (index.cam_member < 0) | (index.cam_member >= member_counts[episode_of_stream]),
        "member",
        "is not a member of the episode",
        index.cam_member,
    )
    member = np.clip(index.episode_members[episode_of_stream] + index.cam_member, 0, video.size - 1)
    w.stream(~video[member], "member", f"is not a .{fmt.VIDEO_EXT} member", index.cam_member)


def _check_signals(index, w: _Where) -> None:
    """Streams at their own rate (the ``streams`` column): member, dtype, shape, counts and times in bounds."""
    if not index.has_signals:
        return
    n = index.num_episodes
    counts = np.diff(index.episode_signals)
    owner = np.repeat(np.arange(n), counts)
    member_counts = np.diff(index.episode_members)

    def fail(bad: np.ndarray, field: str, message: str, values=None) -> None:
        hit = np.flatnonzero(bad)
        if hit.size:
            s = int(hit[0])
            e = int(owner[s])
            value = "" if values is None else f" {values[s]}"
            raise FormatError(
                f"{w.where}: row {e} (episode {printable(index.key(e))}), stream "
                f"{printable(index.signal_names[s].as_py())}: {field}{value} {message}"
            )

    fail(_holds(index.signal_names, _control_byte) | (_lengths(index.signal_names) == 0), "name", "is not a name")
    ids = pc.dictionary_encode(index.signal_names).indices.to_numpy(zero_copy_only=False).astype(np.int64)
    pairs = owner * (int(ids.max(initial=0)) + 1) + ids
    _, first, seen = np.unique(pairs, return_index=True, return_counts=True)
    repeated = np.zeros(owner.size, dtype=bool)
    repeated[first[seen > 1]] = True
    fail(repeated, "name", "is twice in the episode")
    known = pc.is_in(index.signal_dtype, value_set=pa.array(fmt.STREAM_DTYPES)).to_numpy(zero_copy_only=False)
    fail(~known, "dtype", f"is not one of {', '.join(fmt.STREAM_DTYPES)}", index.signal_dtype.to_pylist())
    dims = index.signal_shape_values
    bad_dim = (dims < 1) | (dims > 1 << 20)
    fail(_item_to_group(bad_dim, index.signal_shape_offsets, owner.size), "shape", "holds a size outside 1 .. 2**20")
    ndim = np.diff(index.signal_shape_offsets)
    fail(ndim > 8, "shape", "has more than 8 dimensions", ndim)
    c = index.signal_count
    fail(c < 0, "count", "is negative", c)
    # Pieces: consecutive .arrow members of the episode, their first samples ascending from 0.
    pieces = np.diff(index.piece_offsets)
    fail(pieces < 1, "piece_start", "is empty (a stream has at least one piece)")
    pos = index.signal_member_pos
    fail(
        (pos < 0) | (pos + pieces > member_counts[owner]),
        "member",
        "and its pieces are not members of the episode",
        pos,
    )
    arrow = pc.ends_with(index.member_names, "." + fmt.STREAM_EXT).to_numpy(zero_copy_only=False)
    piece_owner = np.repeat(np.arange(owner.size), pieces)
    piece_index = np.arange(piece_owner.size) - np.repeat(index.piece_offsets[:-1], pieces)
    piece_member = np.clip(
        np.repeat(index.episode_members[owner] + pos, pieces) + piece_index, 0, max(arrow.size - 1, 0)
    )
    fail(_item_to_group(~arrow[piece_member], index.piece_offsets, owner.size), "member", "is not a .arrow member")
    start = index.piece_start
    first_ok = np.zeros(owner.size, dtype=bool)
    has = pieces >= 1
    first_ok[has] = start[index.piece_offsets[:-1][has]] == 0
    fail(has & ~first_ok, "piece_start", "does not start at sample 0")
    bad = _not_ascending(start, index.piece_offsets) | (start < 0) | (start >= np.maximum(np.repeat(c, pieces), 1))
    fail(_item_to_group(bad, index.piece_offsets, owner.size), "piece_start", "are not ascending samples of the stream")
    width = np.ones(owner.size, dtype=np.float64)
    np.multiply.at(width, np.repeat(np.arange(owner.size), ndim), np.clip(dims, 1, None).astype(np.float64))
    fail(width > 1 << 20, "shape", "holds more than 2**20 values per sample", width)
    dtypes = index.signal_dtype.to_pylist()
    per_sample = np.array([sample_bytes(d if d in fmt.STREAM_DTYPES else "float64", 1) - 8 for d in dtypes])
    sample_size = 8 + width * per_sample
    ends = np.append(start[1:], 0)
    last = np.zeros(start.size, dtype=bool)
    last[index.piece_offsets[1:][has] - 1] = True
    ends[last] = np.repeat(c, pieces)[last]
    per_piece = np.maximum(ends - start, 0) * np.repeat(sample_size, pieces)
    size = index.member_size[piece_member].astype(np.float64)
    fail(
        _item_to_group(per_piece > STREAM_EXPANSION * size + 4096, index.piece_offsets, owner.size),
        "count",
        "claims more samples than its pieces' bytes can hold (pieces are stored uncompressed: "
        f"{STREAM_EXPANSION} byte of samples per byte of member, streams.STREAM_EXPANSION)",
        c,
    )
    if not np.array_equal(index.piece_time_offsets, index.piece_offsets):
        e = int(owner[int(np.flatnonzero(np.diff(index.piece_time_offsets) != pieces)[0])])
        raise FormatError(f"{w.where}: row {e} (episode {printable(index.key(e))}): piece_time and piece_start differ")
    piece_times = index.piece_time
    bad_time = ~np.isfinite(piece_times) | _decreasing(piece_times, index.piece_offsets)
    nonempty = np.repeat(c > 0, pieces)
    t_first, t_last = np.repeat(index.signal_t_first, pieces), np.repeat(index.signal_t_last, pieces)
    bad_time |= nonempty & ((piece_times < t_first) | (piece_times > t_last))
    fail(
        _item_to_group(bad_time, index.piece_offsets, owner.size),
        "piece_time",
        "are not ascending times between t_first and t_last",
    )
    step = index.signal_row_step
    fail(step < 1, "row_step", "is not positive", step)
    rows = np.repeat(index.num_rows, counts)
    expected = (rows - 1 + np.maximum(step, 1) - 1) // np.maximum(step, 1) + 1
    held = np.diff(index.row_time_offsets)
    fail((held != 0) & (held != expected), "row_time", "does not hold one time per row_step rows and the last", held)
    bad_clock = ~np.isfinite(index.row_time) | _decreasing(index.row_time, index.row_time_offsets)
    fail(_item_to_group(bad_clock, index.row_time_offsets, owner.size), "row_time", "is not a non-decreasing clock")


def _check_cameras(index, camera_episodes: Mapping[str, int | None], w: _Where) -> None:
    """Known names and kinds, per-camera episode counts, sizes, frame tables within the video."""
    n = index.num_episodes
    w.stream(_holds(index.cam_names, _control_byte), "name", "holds a control character")
    known = pc.is_in(index.cam_names, value_set=pa.array(sorted(camera_episodes), pa.string()))
    w.stream(~known.to_numpy(zero_copy_only=False), "name", "is not a camera of the manifest")
    found = {c["values"]: c["counts"] for c in (pc.value_counts(index.cam_names).to_pylist() if n else [])}
    for name, episodes in camera_episodes.items():
        if episodes is not None and found.get(name, 0) != episodes:
            raise FormatError(
                f"{w.where}: {found.get(name, 0)} episodes have camera {name}, the manifest's "
                f"cameras.{name}.episodes says {episodes}"
            )
    kinds = pc.is_in(index.cam_kind, value_set=pa.array(fmt.CAMERA_KINDS)).to_numpy(zero_copy_only=False)
    w.stream(~kinds, "kind", f"is not one of {fmt.CAMERA_KINDS}")
    w.stream(index.cam_stream_index < -1, "stream_index", "is not a stream number", index.cam_stream_index)
    w.stream(
        (index.cam_width < 1)
        | (index.cam_width > _MAX_DIMENSION)
        | (index.cam_height < 1)
        | (index.cam_height > _MAX_DIMENSION),
        "width/height",
        f"are not in [1, {_MAX_DIMENSION}]",
    )
    w.stream(~np.isfinite(index.cam_time_base) | (index.cam_time_base <= 0), "time_base", "is not positive")
    frames = index.cam_num_frames
    w.stream(
        (frames < 1) | (frames > index.cam_size),
        "num_frames",
        "is not between 1 and the video member's size in bytes",
        frames,
    )
    for name, offsets in (("pts", index.pts_offsets), ("duration", index.duration_offsets)):
        lengths = np.diff(offsets)
        w.stream((lengths != 0) & (lengths != frames), name, "does not list num_frames values", lengths)
    w.stream(
        (np.diff(index.pts_offsets) == 0) & (index.cam_pts_step <= 0), "pts_step", "is not positive", index.cam_pts_step
    )
    w.stream(
        _item_to_group(_not_ascending(index.pts, index.pts_offsets), index.pts_offsets, frames.size),
        "pts",
        "is not strictly increasing",
    )
    w.stream(_item_to_group(index.duration < 0, index.duration_offsets, frames.size), "duration", "is negative")
    key_counts = np.diff(index.key_offsets)
    w.stream(key_counts < 1, "keyframes", "is empty")
    bad = (index.keyframes < 0) | (index.keyframes >= _per_item(key_counts, frames))
    bad |= _not_ascending(index.keyframes, index.key_offsets)
    w.stream(
        _item_to_group(bad, index.key_offsets, frames.size),
        "keyframes",
        "are not ascending frame numbers below num_frames",
    )
    r2f_counts = np.diff(index.r2f_offsets)
    rows = index.num_rows[np.repeat(np.arange(n), np.diff(index.episode_cams))]
    w.stream((r2f_counts != 0) & (r2f_counts != rows), "row_to_frame", "does not list num_rows values", r2f_counts)
    bad = (index.row_to_frame < 0) | (index.row_to_frame >= _per_item(r2f_counts, frames))
    w.stream(_item_to_group(bad, index.r2f_offsets, frames.size), "row_to_frame", "holds frames outside the video")
    first = index.cam_first_frame
    w.stream(
        (r2f_counts == 0) & ((first < 0) | (first + rows > frames)),
        "first_frame",
        "+ num_rows runs outside the video's frames",
        first,
    )


class _Packets:
    """The packet arrays of camera streams ``[first, stop)`` of an index, their offsets from 0.

    Views, not copies: ``_check_packets`` reads a whole index's tables (``verify``) or one stream's
    (``check_stream_packets``, at the stream's first use) through the same code.
    """

    def __init__(self, index, first: int, stop: int):
        def part(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            at = offsets[first : stop + 1]
            return values[int(at[0]) : int(at[-1])], at - at[0]

        self.packet_size, self.psize_offsets = part(index.packet_size, index.psize_offsets)
        self.packet_offset, self.poffset_offsets = part(index.packet_offset, index.poffset_offsets)
        self.packet_frame, self.pframe_offsets = part(index.packet_frame, index.pframe_offsets)
        self.packet_crc32, self.pcrc_offsets = part(index.packet_crc32, index.pcrc_offsets)
        self.packet_start = index.packet_start[first:stop]
        self.cam_size = index.cam_size[first:stop]
        self.frames = index.cam_num_frames[first:stop]


def check_stream_packets(index, stream: int, where: str) -> None:
    """Check one camera stream's packet table (docs/FORMAT.md "Packet tables") before its first use.

    ``check_index(..., packets=False)`` (how a reader opens a dataset) leaves the per-packet values
    to this: their cost grows with the packets of the whole dataset (hundreds of millions at a
    million episodes), a stream's with its own (~1 ms per thousand packets). The same rules as
    ``check_index`` with ``packets=True`` (``epishard verify``): one value per packet in each list,
    sizes positive, bytes inside the video member in ascending order, each frame shown once.

    Raises:
        FormatError: names ``where`` (the index file), the row, the episode and the camera.
    """
    _check_packets(_Packets(index, stream, stream + 1), _Where(index, where, first_stream=stream))


def _check_packets(index: _Packets, w: _Where) -> None:
    """Packet tables (docs/FORMAT.md "Packet tables"): lengths, bytes inside the member, frames one to one."""
    frames = index.frames
    packets = np.diff(index.psize_offsets)
    for name, offsets in (("packet_offset", index.poffset_offsets), ("packet_frame", index.pframe_offsets)):
        lengths = np.diff(offsets)
        w.stream((lengths != 0) & (lengths != packets), name, "does not list one value per packet", lengths)
    crcs = np.diff(index.pcrc_offsets)
    w.stream(crcs != packets, "packet_crc32", "does not list one value per packet", crcs)
    has = packets > 0
    w.stream(has & (packets < frames), "packet_size", "lists fewer packets than num_frames", packets)
    if not has.any():
        return
    w.stream(_item_to_group(index.packet_size < 1, index.psize_offsets, frames.size), "packet_size", "is not positive")
    size_sum = np.add.reduceat(np.append(index.packet_size, 0), index.psize_offsets[:-1], dtype=np.int64) * has
    contiguous = np.diff(index.poffset_offsets) == 0
    w.stream(
        has & contiguous & ((index.packet_start < 0) | (index.packet_start + size_sum > index.cam_size)),
        "packet_start/packet_size",
        "run past the video member",
    )
    per = _per_item(packets, index.cam_size)
    explicit = np.diff(index.poffset_offsets) > 0
    if explicit.any():
        sizes = index.packet_size[np.repeat(explicit, packets)]
        end = index.packet_offset + sizes
        bad = (index.packet_offset < 0) | (end > per[np.repeat(explicit, packets)])
        bad |= _not_ascending(index.packet_offset, index.poffset_offsets)
        w.stream(
            _item_to_group(bad, index.poffset_offsets, frames.size),
            "packet_offset",
            "lies outside the video member or is not after the packet before it",
        )
    explicit_frames = np.diff(index.pframe_offsets) > 0
    if explicit_frames.any():
        limit = _per_item(np.diff(index.pframe_offsets), frames)
        bad = (index.packet_frame < -1) | (index.packet_frame >= limit)
        w.stream(
            _item_to_group(bad, index.pframe_offsets, frames.size), "packet_frame", "holds frames outside the video"
        )
        stream_of = np.repeat(np.arange(packets.size), np.diff(index.pframe_offsets))
        shown = index.packet_frame >= 0
        counts = np.bincount(stream_of[shown], minlength=packets.size)
        w.stream(explicit_frames & (counts != frames), "packet_frame", "does not show each frame once", counts)
        # Distinct frames per stream, in linear time: every shown value is in [0, num_frames) here,
        # so (stream's first frame slot + frame) numbers each (stream, frame) pair once.
        base = np.concatenate([[0], np.cumsum(frames * explicit_frames)]).astype(np.int64)
        slots = base[stream_of[shown]] + index.packet_frame[shown]
        seen = np.bincount(slots, minlength=int(base[-1])) > 0
        distinct = np.add.reduceat(np.append(seen, False), base[:-1]) * explicit_frames
        w.stream(explicit_frames & (distinct != frames), "packet_frame", "does not show each frame once", distinct)
    w.stream(has & ~explicit_frames & (packets != frames), "packet_size", "lists a packet per frame but not num_frames")


def check_index_version(schema: pa.Schema, manifest_version: int | None, where: str) -> None:
    """Check the format version an index file's schema metadata states (``manifest.VERSION_KEY``).

    Against this reader and the manifest's (None: not compared). Indexes written before
    ``index.arrow`` kept it have none (the manifest's version applies).

    Raises:
        FormatError: a newer version than this reader reads (naming both), or another than the manifest's.
    """
    stated = (schema.metadata or {}).get(fmt.VERSION_KEY)
    if stated is None:
        return
    try:
        version = int(stated)
    except ValueError:
        raise FormatError(
            f"{where}: schema metadata {fmt.VERSION_KEY.decode()} {stated!r:.40} is not a version"
        ) from None
    fmt.check_version(fmt.FORMAT_NAME, version, where)
    # A version-3 dataset (streams) keeps the shards none of whose episodes has a stream in the
    # version-2 layout: a shard's index may be older than its manifest, never newer.
    older = manifest_version == fmt.STREAMS_VERSION and version == fmt.PLAIN_VERSION
    if manifest_version is not None and version != manifest_version and not older:
        raise FormatError(
            f"{where}: format_version {version} in its schema metadata, "
            f"the manifest's format_version is {manifest_version}"
        )


def check_digest(data, expected: str, where: str, field: str) -> None:
    """``FormatError`` unless ``data`` (bytes or buffer) has the sha256 the manifest's ``field`` gives."""
    if hashlib.sha256(memoryview(data)).hexdigest() != expected:
        raise FormatError(
            f"{where}: sha256 differs from the manifest's {field} (changed or damaged after "
            "conversion; `epishard verify` names what differs)"
        )


def shard_size_mismatches(shards: Sequence[fmt.ShardEntry], sizes: Mapping[str, int], url: str) -> dict[int, str]:
    """Shards whose file holds another number of bytes than the manifest's ``size`` says.

    ``check_index`` bounds every index value by the manifest's shard sizes (a member inside its
    shard, a frame per byte of its video member, a row per byte of its table); this holds those
    sizes against the files themselves, so a forged manifest and index (digests recomputed) cannot
    claim bytes that are not there. ``sizes``: shard file name -> bytes on storage (shards missing
    from it are not checked: their reads fail instead). ``url`` names the dataset folder.

    Returns:
        shard number -> the reason, naming the file, both sizes and the field.
    """
    out = {}
    for i, entry in enumerate(shards):
        size = sizes.get(entry.shard)
        if size is not None and size != entry.size:
            out[i] = (
                f"{url}/{entry.shard}: {size} bytes, the manifest's shards[{i}].size says {entry.size} "
                "(replaced, truncated or forged after conversion; `epishard verify` names what differs)"
            )
    return out
