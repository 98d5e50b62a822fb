"""An episode's parts for the reader: its table columns, its decoded frames, and windows cut from them.

``stream.lookahead`` schedules which frames are decoded when (one call per (episode, camera) per
chunk of windows) and ``stream.dataset`` keeps them in its cache; this module reads a table into
columns (``read_columns``), decodes one camera's frames (``decode_camera``) and assembles a sample
(``window_sample``) with the window semantics of the format: rows clamped into the anchor's
recording segment, ``_is_pad`` flags for the rows clamped.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from epishard.format.decoder import container_frames
from epishard.format.errors import FormatError
from epishard.format.index import WindowIndex, read_table_bytes
from epishard.format.stats import numeric_matrix
from epishard.format.streams import read_pieces

from .decode import DecodeError, decode, decode_depth
from .multirate import Span, clock_tolerance, reach, stream_window
from .packets import Run, decode_runs, run_bytes
from .spec import WindowSpec
from .telemetry import Telemetry
from .transform import PostProcess

__all__ = [
    "COARSE",
    "COVER",
    "PIECES",
    "TIMES",
    "VALUES",
    "EpisodeInfo",
    "Normalizer",
    "columns_nbytes",
    "cover_of",
    "covered",
    "decode_camera",
    "decode_camera_packets",
    "read_columns",
    "read_signals",
    "window_rows",
    "window_sample",
]


@dataclass
class Normalizer:
    """``(x - shift) / scale`` per dimension, from manifest statistics.

    ``mode``: ``"mean_std"`` (shift mean, scale max(std, eps)) or ``"min_max"`` (to [-1, 1]).
    """

    shift: np.ndarray
    scale: np.ndarray

    @classmethod
    def from_stats(
        cls,
        stats: Mapping[str, Any],
        mode: str,
        eps: float = 1e-8,
        where: str = "manifest.json: stats['?']",
        width: int | None = None,
    ) -> Normalizer:
        """From a feature's manifest statistics: ``mode`` ``"mean_std"`` or ``"min_max"`` (to [-1, 1]).

        A std of 0 (a constant dimension) divides by ``eps``. ``where`` names the entry in messages
        (``"<path>/manifest.json: stats['action']"``); ``width``: the feature's values per row, where known.

        Raises:
            FormatError: a statistic the mode uses is missing, not finite (``std``: or negative), or
                of another length than ``width`` or the other statistic.
        """
        if mode not in ("mean_std", "min_max"):
            raise ValueError(f"normalisation mode must be 'mean_std' or 'min_max', not {mode!r}")
        names = ("mean", "std") if mode == "mean_std" else ("min", "max")
        a, b = (_stat(stats, name, where, width) for name in names)
        if a.shape != b.shape:
            raise FormatError(f"{where}: {names[0]} has {a.size} values, {names[1]} {b.size}")
        if mode == "mean_std":
            if (b < 0).any():
                i = int(np.flatnonzero(b < 0)[0])
                raise FormatError(f"{where}.std[{i}] is {b[i]}; must be finite and >= 0")
            return cls(a, np.maximum(b, eps))
        return cls((a + b) / 2, np.maximum((b - a) / 2, eps))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``x`` (float32 ``[..., D]``) normalised: ``(x - shift) / scale``."""
        return (x - self.shift) / self.scale


def _stat(stats: Mapping[str, Any], name: str, where: str, width: int | None) -> np.ndarray:
    """``stats[name]`` as float32 ``[D]``, finite and ``width`` long where given (``FormatError`` naming ``where``)."""
    if not isinstance(stats, Mapping) or name not in stats:
        raise FormatError(f"{where} has no {name!r} (normalising needs it)")
    value = stats[name]
    items = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        raise FormatError(f"{where}.{name} must be a JSON number or an array of numbers")
    if width is not None and len(items) != width:
        raise FormatError(f"{where}.{name} has {len(items)} values; the feature has {width} per row")
    values = np.asarray(items, np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        must = "finite and >= 0" if name == "std" else "finite"
        raise FormatError(f"{where}.{name}[{i}] is {values[i]}; must be {must}")
    return values.astype(np.float32)


def _clamped(rows: np.ndarray, lo, hi) -> tuple[np.ndarray, np.ndarray]:
    """Rows clamped into the anchor's recording segment ``[lo, hi)``, and pad flags.

    The segment is the episode unless its timestamps reset or jump; the pad flags mark the rows that
    fell outside it.
    """
    pad = (rows < lo) | (rows >= hi)
    return np.clip(rows, lo, hi - 1), pad


def _is_text(kind: pa.DataType) -> bool:
    """True for an Arrow text type (string, large string, string view, or a dictionary of strings)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or getattr(pa.types, "is_string_view", bool)(kind)


def _row_shape(kind: pa.DataType, width: int) -> tuple[int, ...]:
    """The per-row shape of a numeric column of Arrow type ``kind`` holding ``width`` numbers per row.

    Nested fixed-size lists keep their sizes (``[2, 3]``); a scalar column and any other list column
    are ``(width,)`` (a scalar is ``(1,)``, as LeRobot declares it).
    """
    sizes = []
    while pa.types.is_fixed_size_list(kind):
        sizes.append(kind.list_size)
        kind = kind.value_type
    if len(sizes) > 1 and int(np.prod(sizes)) == width and not pa.types.is_list(kind):
        return tuple(sizes)
    return (width,)


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _check_ragged(name: str, column: pa.ChunkedArray) -> None:
    """Refuse a list column whose rows hold lists of different lengths (or a null list) at any nesting level.

    Flattened, such rows could still divide evenly into ``rows x width`` and give values of the wrong rows.

    Raises:
        ValueError: naming the column, the first bad row and the lengths found.
    """
    array, depth = column.combine_chunks(), 0
    while _is_list(array.type):
        what = "row" if depth == 0 else f"inner list (level {depth})"
        if array.null_count:
            row = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"column {name!r}: {what} {row} is null (a list of numbers expected)")
        if not pa.types.is_fixed_size_list(array.type):
            lengths = array.value_lengths().to_numpy(zero_copy_only=False)
            if lengths.size and (lengths != lengths[0]).any():
                row = int(np.flatnonzero(lengths != lengths[0])[0])
                raise ValueError(
                    f"column {name!r}: {what} {row} holds {int(lengths[row])} values, the first {int(lengths[0])} "
                    f"(lists of one length per column expected; lengths {sorted(set(lengths.tolist()))[:8]})"
                )
        array, depth = array.flatten(), depth + 1


def _integers(name: str, column: pa.ChunkedArray) -> np.ndarray | None:
    """An integer column without nulls as int64 ``[rows, width]``, exactly; None for any other column.

    Raises:
        ValueError: a uint64 value above the int64 range (naming the column).
    """
    values = column.combine_chunks()
    rows = len(values)
    while _is_list(values.type):
        values = values.flatten()
    if not pa.types.is_integer(values.type) or values.null_count or rows == 0 or len(values) % rows:
        return None
    flat = values.to_numpy(zero_copy_only=False)
    if pa.types.is_uint64(values.type) and flat.size and int(flat.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"column {name!r} holds uint64 values above the int64 range ({int(flat.max())})")
    return flat.astype(np.int64).reshape(rows, -1)


def _columns(table: pa.Table, n: int, fps: float, spec: WindowSpec, normalizers: dict[str, Normalizer]) -> dict:
    """The columns windows need, ``n`` rows each.

    Numeric columns as float32 ``[n, *shape]`` (``_row_shape``; normalised before the reshape);
    integer columns (not state or action, not normalised, no nulls) as int64, exactly; text columns
    of ``extra_columns`` as object arrays of ``str`` (a null as ``""``).
    """
    if table.num_rows != n:
        raise ValueError(f"{table.num_rows} rows, the index says {n}")
    columns: dict = {}
    for name in {spec.state_key, spec.action_key, *spec.extra_columns, *spec.column_offsets} - {None}:
        column = table.column(name)
        if name in spec.extra_columns and _is_text(column.type):
            values = column.to_pylist()
            columns[name] = np.array(["" if v is None else v for v in values] if values else [], dtype=object)
            continue
        _check_ragged(str(name), column)
        exact = None
        if name not in (spec.state_key, spec.action_key) and name not in normalizers:
            exact = _integers(str(name), column)  # int64, exactly (float32 rounds integers above 2**24)
        if exact is not None:
            columns[name] = exact.reshape(n, *_row_shape(column.type, exact.shape[1]))
            continue
        matrix = numeric_matrix(column)
        if matrix is None:
            raise ValueError(f"column {name!r} is not numeric ({column.type})")
        matrix = matrix.astype(np.float32)
        matrix = normalizers[name](matrix) if name in normalizers else matrix
        columns[name] = matrix.reshape(n, *_row_shape(column.type, matrix.shape[1]))
    columns["frame_index"] = (
        table.column("frame_index").to_numpy() if "frame_index" in table.column_names else np.arange(n)
    )
    columns["timestamp"] = (
        table.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64)
        if "timestamp" in table.column_names
        else np.arange(n) / fps
    )
    if spec.streams:  # how finely the row clock is stored: a float32 clock (LeRobot's) rounds times
        coarse = "timestamp" in table.column_names and table.column("timestamp").type in (pa.float32(), pa.float16())
        columns[COARSE] = np.array([coarse])
    return columns


def read_columns(
    index: WindowIndex, episode: int, data: bytes, spec: WindowSpec, normalizers: dict[str, Normalizer]
) -> dict[str, np.ndarray]:
    """The columns windows need from the episode's table member ``data`` (``num_rows`` rows each).

    State, action and other numeric columns as float32 ``[n, *shape]`` (normalised by
    ``normalizers``; ``shape``: ``_row_shape``, ``[D]`` for a 1-D or scalar column; an integer column
    other than state and action, not normalised, as int64), text columns of
    ``spec.extra_columns`` as object ``[n]`` of ``str``, ``frame_index`` int64 ``[n]``, ``timestamp``
    float64 ``[n]`` seconds.

    Raises:
        DecodeError: the table does not read as the index describes (naming the episode key).
    """
    n, fps = int(index.num_rows[episode]), float(index.fps[episode])
    try:
        return _columns(read_table_bytes(data), n, fps, spec, normalizers)
    except (pa.ArrowException, KeyError, ValueError, TypeError) as exc:
        raise DecodeError(
            f"episode {index.key(episode)}: its table does not read as the index describes: {type(exc).__name__}: {exc}"
        ) from exc


# Keys of a stream's arrays among an episode's columns (no column has them): its samples' times and
# values (the pieces read, concatenated in piece order), and which of its pieces they hold (bool [P]).
TIMES, VALUES, PIECES = "\x00t:", "\x00v:", "\x00p:"
COARSE = "\x00coarse"  # bool [1]: the row clock is stored as float32 (its times are rounded)
COVER = "\x00c:"  # float64 [3]: the times the held pieces surely cover (``cover_of``)


def cover_of(index: WindowIndex, signal: int, present: np.ndarray, times: np.ndarray) -> np.ndarray:
    """float64 ``[3]``: ``(after, before, last)`` where the held pieces of a stream surely hold every sample.

    ``present``: bool ``[P]``, the pieces held; ``times``: their samples' times, concatenated. When
    the held pieces are consecutive, every sample of ``(after, before)`` is among them (``after``:
    the first held piece's first time, ``-inf`` for piece 0; ``before``: the next piece's first
    time, ``inf`` after the last piece) and ``last`` is the last held sample's time; else NaN
    (``covered`` then always says no).
    """
    held = np.flatnonzero(present)
    if not held.size or held[-1] - held[0] + 1 != held.size:
        return np.full(3, np.nan)
    firsts = index.signal_piece_times(signal)
    after = -np.inf if held[0] == 0 else float(firsts[held[0]])
    before = np.inf if held[-1] == firsts.size - 1 else float(firsts[held[-1] + 1])
    last = float(times[-1]) if times.size else -np.inf
    return np.array([after, before, last])


def covered(columns: dict, name: str, read, t0: float) -> bool:
    """Whether the held pieces of stream ``name`` surely hold what a window at ``t0`` reads (``cover_of``).

    A span needs its interval strictly inside ``(after, before)``; values at times (``at``) also a
    held sample after each time (the next sample, for ``nearest`` and ``linear``). A stream the
    episode lacks is covered (its windows are padding).
    """
    cover = columns.get(COVER + name)
    if cover is None:
        return True
    lo, hi = reach(read)
    tol = clock_tolerance(t0, True)
    a, b = t0 + lo - tol, t0 + hi + tol
    if isinstance(read, Span):
        return bool(cover[0] < a and b < cover[1])
    return bool(cover[0] < a and b < cover[2])


def read_signals(index: WindowIndex, episode: int, blobs: Mapping[int, bytes], spec: WindowSpec) -> dict:
    """The spec's streams at their own rate of ``episode``, as arrays to keep beside its columns.

    ``blobs``: flat member number -> bytes (the episode's fetched members: the pieces of its streams
    its windows reach come with its table, ``reader.EpochReader._signal_pieces``). Per stream the
    episode has, the samples of the pieces fetched, concatenated: timestamps (float64 ``[n]``) and
    values (``[n, *shape]`` in the dtype windows return: ``multirate``), under keys of their own; a
    stream it lacks is absent (its windows are padding).

    Raises:
        DecodeError: a piece does not read as the index describes (naming episode and stream).
    """
    out: dict = {}
    mine = index.signals(episode)
    for name, read in spec.streams.items():
        s = mine.get(name)
        if s is None:
            continue
        members = index.signal_pieces(s)[0]
        present = [k for k, m in enumerate(members.tolist()) if m in blobs]
        try:
            data = read_pieces(index, s, blobs, f"episode {index.key(episode)} stream {name}", present)
        except FormatError as exc:
            raise DecodeError(str(exc)) from exc
        out[TIMES + name] = data.timestamps
        dtype = read.resolved[2] if read.resolved is not None else data.values.dtype
        out[VALUES + name] = data.values.astype(dtype, copy=False)
        held = np.zeros(members.size, dtype=bool)
        held[present] = True
        out[PIECES + name] = held
        out[COVER + name] = cover_of(index, s, held, data.timestamps)
    return out


def columns_nbytes(columns: dict[str, np.ndarray]) -> int:
    """Bytes the arrays of ``read_columns`` hold (a text column: its pointers and its UTF-8 bytes)."""
    text = sum(len(s.encode()) for a in columns.values() if a.dtype == object for s in a)
    return sum(int(a.nbytes) for a in columns.values()) + text


@dataclass(frozen=True)
class EpisodeInfo:
    """What every window of an episode shares.

    Its ``task`` text, source ``episode_index``, ``key``, ``fps``, the index stream of each window
    camera (``streams``: camera -> stream number) and its recording-segment edges (``segments``:
    int64 ``[S + 1]`` rows, ``WindowIndex.segment_edges``).
    """

    task: str
    episode_index: int
    key: str
    fps: float
    streams: dict[str, int]
    segments: np.ndarray

    @classmethod
    def of(cls, index: WindowIndex, episode: int, cameras) -> EpisodeInfo:
        """The info of ``episode`` for the window cameras ``cameras`` (names the episode stores)."""
        names = index.camera_names(episode)
        return cls(
            task=index.task(episode),
            episode_index=int(index.episode_index[episode]),
            key=index.key(episode),
            fps=float(index.fps[episode]),
            streams={cam: index.stream(episode, names.index(cam)) for cam in cameras},
            segments=index.segment_edges(episode),
        )


def window_rows(index: WindowIndex, episodes: np.ndarray, anchors: np.ndarray, offsets) -> np.ndarray:
    """Rows (int64 ``[n, T]``) windows at ``anchors`` of ``episodes`` read at ``offsets``.

    Clamped into each anchor's recording segment (``WindowIndex.segment_bounds``), as
    ``window_sample`` does: the frames a window camera returns are ``index.frames(stream, rows)``.
    """
    lo, hi = index.segment_bounds(episodes, anchors)
    rows, _ = _clamped(anchors[:, None] + np.asarray(offsets, dtype=np.int64)[None, :], lo[:, None], hi[:, None])
    return rows


# Streams whose frame count was held against their container, per index: a member's bytes are
# checked against the index's sha256 on every fetch (``FetchPolicy.verify``, the default), so one
# check per worker and stream is enough.
_COUNTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _check_frame_count(index: WindowIndex, stream: int, data: bytes, where: str) -> None:
    """Raise ``DecodeError`` when the index claims more frames for ``stream`` than its container lists.

    Once per worker, index and stream (``decoder.container_frames`` parses the container's header).
    """
    counted = _COUNTED.setdefault(index, set())
    if stream in counted:
        return
    stated = container_frames(data, int(index.cam_stream_index[stream]))
    if stated is not None and index.cam_num_frames[stream] > stated:
        raise DecodeError(
            f"{where}: the index's num_frames {int(index.cam_num_frames[stream])} is more than the "
            f"{stated} frames its video's container lists (index forged or for another video)"
        )
    counted.add(stream)


def decode_camera(
    index: WindowIndex,
    stream: int,
    frames: np.ndarray,
    data: bytes,
    post: PostProcess,
    where: str,
    telemetry: Telemetry,
    kept: tuple[object, int] | None = None,
    max_bytes: int = 256 << 20,
) -> tuple[torch.Tensor, tuple[object, int] | None]:
    """Decode ``frames`` (sorted unique int64) of camera ``stream`` from its member bytes, post-processed.

    One decoder and one ``get_frames_at`` call (``stream.decode``; PyAV for depth). Returns uint8
    ``[U, 3, h, w]`` (uint16 ``[U, 1, h, w]`` for a depth camera) after ``post.prepare``
    (``prepare_depth``), and ``(decoder, last frame returned)`` to pass as ``kept`` to the next call
    on the same camera (None for depth): frames after the last one and before the next keyframe
    are then decoded on, not from the keyframe again. ``max_bytes``: RGB bytes per ``get_frames_at``
    call at most (``stream.decode.decode``; the look-ahead reader's ``Lookahead.decode_bytes``).
    Counts decode time, post-processing time, opens, calls, frames decoded
    (``WindowIndex.decoded_frames``, from the kept position where the decoder goes on from it) and
    frames requested into ``telemetry``.

    Raises:
        DecodeError: naming ``where`` (episode key and camera); also when the index claims more
            frames than the video's container lists (``decoder.container_frames``), before a
            frame table of that size is built.
    """
    t1 = time.perf_counter()
    if kept is None:  # a decoder is opened on these bytes: hold the index's frame count against them
        _check_frame_count(index, stream, data, where)
    if index.cam_depth[stream]:
        decoded = decode_depth(
            data,
            frames,
            index.frame_tables(stream)[0],
            index.keyframes_of(stream),
            where=where,
            stream_index=int(index.cam_stream_index[stream]),
            post=post.prepare_depth,
        )
    else:
        decoded = decode(
            data,
            frames,
            index.frame_tables(stream),
            where=where,
            stream_index=int(index.cam_stream_index[stream]),
            time_base=float(index.cam_time_base[stream]),
            post=post.prepare,
            height=int(index.cam_height[stream]),
            width=int(index.cam_width[stream]),
            decoder=None if kept is None else kept[0],
            max_bytes=max_bytes,
            rotation=int(index.cam_rotation[stream]),
        )
    work = int(index.decoded_frames(stream, frames))
    if kept is not None and kept[1] < frames[0]:  # decoded on from the kept position (torchcodec seeks
        # only when a keyframe lies after it and at or before the next frame): cost counted from there
        work = int(index.decoded_frames(stream, np.r_[kept[1], frames])) - int(
            index.decoded_frames(stream, np.array([kept[1]]))
        )
    telemetry.add(
        decode_s=time.perf_counter() - t1 - decoded.post_s,
        postprocess_s=decoded.post_s,
        decoder_opens=int(kept is None),
        decode_calls=decoded.calls,
        frames_decoded=work,
        frames_unique=frames.size,
    )
    return decoded.frames, None if decoded.decoder is None else (decoded.decoder, int(frames[-1]))


def decode_camera_packets(
    index: WindowIndex,
    stream: int,
    runs: list[Run],
    starts: list[int],
    pieces: list[bytes],
    post: PostProcess,
    where: str,
    telemetry: Telemetry,
    max_bytes: int = 256 << 20,
    alloc=None,
    pictures: bool = False,
) -> torch.Tensor | list:
    """Decode the ``runs`` (``stream.packets.plan_runs``) of camera ``stream`` from their fetched bytes.

    ``pieces[i]``: the bytes of run ``i``'s range, which starts at byte ``starts[i]`` of the video
    member (``stream.packets.run_ranges``). Returns uint8 ``[U, 3, h, w]`` after ``post.prepare``,
    the runs' frames in order; when ``post`` prepares nothing, a list of ``U`` standalone
    ``[3, H, W]`` frames instead, written into ``alloc(shape)`` (``Store.alloc``; default new
    tensors), which ``Store.put_frames`` keeps without a copy, or with ``pictures`` a list of
    ``stream.packets.Picture`` (converted when a window takes them). Counts as
    ``decode_camera`` does; a decoder is opened only when the
    worker's pool has none for the stream's codec, extradata and size.

    Raises:
        DecodeError: naming ``where`` (episode key and camera).
    """
    t1 = time.perf_counter()
    table = index.packets(stream)
    decoded, opened = decode_runs(
        pieces,
        starts,
        runs,
        table.offset,
        table.size,
        table.crc32,
        table.frame,
        index.frame_tables(stream)[0],
        keyframes=index.keyframes_of(stream),
        codec=index.cam_codec[stream].as_py(),
        extradata=table.extradata,
        width=int(index.cam_width[stream]),
        height=int(index.cam_height[stream]),
        where=where,
        post=None if post.prepares_nothing else post.prepare,
        max_bytes=max_bytes,
        alloc=alloc,
        pictures=pictures,
    )
    frames = np.concatenate([r.frames for r in runs])
    work = sum(int(index.decoded_frames(stream, r.frames)) for r in runs)
    telemetry.add(
        decode_s=time.perf_counter() - t1 - decoded.post_s,
        postprocess_s=decoded.post_s,
        decoder_opens=int(opened),
        decode_calls=decoded.calls,
        frames_decoded=work,
        frames_unique=frames.size,
        bytes_needed=run_bytes(table.size, runs),
    )
    return decoded.frames


def window_sample(
    index: WindowIndex,
    info: EpisodeInfo,
    columns: dict[str, np.ndarray],
    anchor: int,
    spec: WindowSpec,
    cam_offsets: dict[str, np.ndarray],
    frames: dict[str, torch.Tensor],
    finish=None,
) -> dict:
    """The sample of the window anchored at row ``anchor`` (see ``WindowDataset`` for keys).

    ``frames``: camera -> its frames at the window's rows (``[T, C, h, w]``, prepared), as
    ``window_rows`` and ``index.frames`` give them. ``finish``: applied to each RGB camera's frames
    (``PostProcess.finish``); None leaves them as stored (uint8, for a collate that converts them).
    Depth stays uint16: never scaled as an image.
    """
    edges = info.segments
    k = int(np.searchsorted(edges, anchor, side="right")) - 1
    lo, hi = int(edges[k]), int(edges[k + 1])
    sample: dict = {}
    for cam, offsets in cam_offsets.items():
        _, pad = _clamped(anchor + offsets, lo, hi)
        depth = index.cam_depth[info.streams[cam]]
        sample[cam] = finish(frames[cam]) if finish is not None and not depth else frames[cam]
        sample[f"{cam}_is_pad"] = torch.from_numpy(pad)
    if spec.state_key:
        rows, pad = _clamped(anchor + np.asarray(spec.state_offsets), lo, hi)
        sample[spec.state_key] = torch.from_numpy(columns[spec.state_key][rows])
        sample[f"{spec.state_key}_is_pad"] = torch.from_numpy(pad)
    windows = {name: np.asarray(offsets, dtype=np.int64) for name, offsets in spec.column_offsets.items()}
    if spec.action_key and spec.action_horizon:
        windows[spec.action_key] = spec.action_rows
    for name, offsets in windows.items():
        rows, pad = _clamped(anchor + offsets, lo, hi)
        sample[name] = torch.from_numpy(columns[name][rows])
        sample[f"{name}_is_pad"] = torch.from_numpy(pad)
    for name in spec.extra_columns:
        value = columns[name][anchor]
        sample[name] = value if isinstance(value, str) else torch.from_numpy(value)
    if spec.streams:
        times = columns["timestamp"]
        t_lo = float(times[lo]) if lo > 0 else -np.inf  # a window's samples stay in its recording segment
        t_hi = float(times[hi]) if hi < times.size else np.inf
        t0 = float(times[anchor])
        tol = clock_tolerance(t0, bool(columns[COARSE][0]) if COARSE in columns else False)
        for name, read in spec.streams.items():
            values, stamps, pad = stream_window(
                columns.get(TIMES + name),
                columns.get(VALUES + name),
                t0,
                read,
                (t_lo, t_hi),
                f"episode {info.key} stream {name}",
                tol,
            )
            sample[name] = torch.from_numpy(values)
            sample[f"{name}_timestamp"] = torch.from_numpy(stamps)
            sample[f"{name}_is_pad"] = torch.from_numpy(pad)
    sample["task"] = info.task
    sample["episode_index"] = info.episode_index
    sample["frame_index"] = int(columns["frame_index"][anchor])
    sample["timestamp"] = float(columns["timestamp"][anchor])
    return sample
