"""HDF5 sources: ALOHA / ACT (one file per episode) and robomimic / LIBERO (``data/demo_<i>`` groups).

Read with h5py (``epishard[hdf5]``) on file objects (local, or any fsspec URL through range
requests), one episode at a time in the conversion worker: the source's episode list holds file
names and group paths only.

A file from elsewhere is not trusted (docs/sources/aloha.md, "Files from elsewhere"): before any
array of an episode is read, every key it maps is checked (``_check_array``): each link on its
path (``_resolve``: external links refused, soft links followed inside the file), where its values
live (``_check_storage``: external raw storage and virtual datasets refused unless
``SourceOptions.allow_external``, and even then only regular local files), its dtype, whether its
values were ever written, and what it claims against ``bounds`` (rows, bytes read whole, bytes of
a frame, of a chunk).

ALOHA (docs/sources/aloha.md): ``/observations/images/<cam>`` uint8 ``[T, H, W, 3]``, or JPEG bytes
(``compress`` attribute on the file: rows of zero-padded bytes ``[T, N]``, or variable-length
bytes; decoded here, channels in the order ``cv2.imdecode`` gives them, as ALOHA's recorder and
readers do: ``_decode_rows``); ``/observations/qpos`` -> ``observation.state``, ``/action`` -> ``action``,
``/observations/qvel`` -> ``observation.velocity``, ``/observations/effort`` -> ``observation.effort``;
50 Hz.

robomimic / LIBERO (docs/sources/robomimic.md): ``data/demo_<i>/obs/<key>``, ``data/demo_<i>/actions``;
image keys (``*_image``, ``*_rgb``: uint8 ``[T, H, W, 3]``) are cameras (``*_depth``: depth
cameras), ``actions`` -> ``action``, ``rewards`` -> ``next.reward``, ``dones`` -> ``next.done``,
state: robomimic ``robot0_eef_pos + robot0_eef_quat + robot0_gripper_qpos``, LIBERO
``joint_states + gripper_states``; the task: LIBERO's ``problem_info`` attribute
(``language_instruction``), or a ``language_instruction`` attribute; 20 Hz. A demo's ``num_samples``
attribute (robomimic's ``SequenceDataset`` reads that many rows) must equal its arrays' rows.

Values are read as the file holds them: any dtype of numbers kept, big-endian ones in this
machine's byte order (the same values); an episode without rows is refused (``empty_episode``).

Streams at their own rate (the mapping's ``streams``: name -> ``{"values": key, "timestamps": key,
"rate": Hz}``): a values array ``[n, ...]`` and a float timestamps array ``[n]`` (seconds on the
row clock: row ``r`` is at ``r / fps``, the table's ``timestamp``), checked as a column's arrays
are (``_check_array``, counted in the episode's bytes read whole), stored as they are
(``_read_stream``); timestamps that decrease are refused, not sorted.
Checked against re-implementations of ACT's and robomimic's readers: tests/test_oracle_hdf5.py.

Internal: import from ``epishard.shardwriter.sources``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from epishard.format.storage import RemoteFile

from ..episode import CameraFrames, Episode, FileInput, FrameReader, LazyTable, LoadedTable, Source, Stream
from ..errors import ConversionError, SourceError
from . import bounds
from .base import (
    Mapping,
    SourceOptions,
    build_table,
    column_name,
    concat,
    episode_numbers,
    kept_cameras,
    natural_key,
    open_binary,
    require,
    size_of,
    source_files,
)

__all__ = ["SUFFIXES", "detect", "open_hdf5"]

SUFFIXES = (".hdf5", ".h5", ".hdf")
_CHUNK_FRAMES = 32  # frames read per chunk: what a camera holds in memory at once (32 x 921.6 kB at 640x480)
_ALOHA_FPS = 50.0
_ROBOMIMIC_FPS = 20.0
_MAX_LINK_HOPS = 16  # soft links followed for one key (HDF5's own limit, H5L_NUM_LINKS)
_MAX_OTHER_FILES = 16  # files opened for one episode to follow external links / check VDS sources (allow_external)
_NOTED_LINKS = 20  # unmapped external links named in the source's notes
_MAX_TEXT_BYTES = 1 << 20  # an attribute read as text (a task)


@dataclass(frozen=True)
class _Layout:
    """What the worker needs to read one episode: file, group, keys (picklable, small)."""

    file: FileInput
    group: str  # "" for ALOHA (the file is the episode), "data/demo_3" for robomimic
    state: tuple[str, ...]
    action: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]  # (output column, key)
    fps: float
    cameras: tuple[tuple[str, str], ...] = ()  # (key, "camera" | "encoded"): checked before anything is read
    allow_external: bool = False  # SourceOptions.allow_external
    aloha: bool = False  # the file is the episode: its own compress and language_instruction attributes apply
    streams: tuple[tuple[str, str, str, float | None], ...] = ()  # (name, values key, timestamps key, rate)

    def where(self) -> str:
        return _where(self.file, self.group)


def _where(file: FileInput, group: str) -> str:
    return f"{file}" + (f":{group}" if group else "")


class _File:
    """An open HDF5 file (a context manager) and the checks on what its keys may reach.

    Read with h5py on a Python file object (local, or an fsspec ``RemoteFile`` through range
    requests): HDF5 then cannot open another file through an external link or a virtual dataset
    (it would reopen this one). With ``allow_external`` on a local file, the file is opened by its
    path, so that external links and virtual datasets whose targets passed the checks are read;
    external links are followed by ``resolve`` itself, opening the target (a regular file) here.
    """

    def __init__(self, file: FileInput, allow_external: bool = False) -> None:
        self.file = file
        self.remote = isinstance(file, RemoteFile)
        self.allow = allow_external and not self.remote
        self.folder = "" if self.remote else os.path.dirname(os.path.abspath(str(file)))
        self.h5: Any = None
        self._stack = contextlib.ExitStack()
        self._others = 0

    def __enter__(self) -> _File:
        h5py = require("h5py")
        try:
            with bounds.reading(str(self.file)):
                try:
                    if self.allow:
                        self.h5 = self._stack.enter_context(h5py.File(str(self.file), "r", locking=False))
                    else:
                        handle = self._stack.enter_context(open_binary(self.file))
                        self.h5 = self._stack.enter_context(h5py.File(handle, "r"))
                except OSError as exc:
                    raise ConversionError(
                        f"not a readable HDF5 file (truncated or damaged?): {exc}",
                        kind="unreadable_file",
                        path=str(self.file),
                    ) from exc
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def folder_of(self, node) -> str:
        """The folder of the file holding ``node`` (this file's, or an external link's target's)."""
        if node.file.filename == self.h5.filename:
            return self.folder
        return os.path.dirname(os.path.abspath(node.file.filename))

    def other(self, path: str, where: str, key: str, what: str):
        """Open another local HDF5 file (``allow_external``: a regular file, checked), kept open with this one."""
        self._others += 1
        if self._others > _MAX_OTHER_FILES:
            raise ConversionError(
                f"{key!r}: {what} reaches more than {_MAX_OTHER_FILES} other files: refused",
                kind="outside_source",
                path=where,
            )
        _check_target(path, where, key, what)
        h5py = require("h5py")
        return self._stack.enter_context(h5py.File(os.path.realpath(path), "r", locking=False))

    def refused(self, where: str, key: str, what: str) -> ConversionError:
        """The error for a key that names another file, which this source may not read."""
        if self.remote:
            why = (
                "refused unread: a remote source cannot name files of the machine converting it "
                "(--allow-external is for a trusted local source only)"
            )
        else:
            why = (
                "refused unread (a dataset from elsewhere could read this machine's files this way); "
                "for a trusted local source pass --allow-external"
            )
        return ConversionError(f"{key!r}: {what}: {why}", kind="outside_source", path=where)


class _Missing(ConversionError):
    """A key absent from the file (no link on its path is dangling or followed): ``missing_key``."""


def _resolve(fh: _File, path: str, where: str, key: str, start=None):
    """The object at ``path``, reached link by link: no link is followed before it is checked.

    ``start``: the open file whose root ``path`` starts from (default: ``fh``'s). Hard links are
    walked; soft links are followed inside the file (at most ``_MAX_LINK_HOPS``); an external link
    is refused (``outside_source``, naming it and its target) unless ``fh.allow``, when its
    target, a regular local file, is opened here and the walk goes on there.

    Raises:
        ConversionError: ``missing_key`` (no such key, a dangling soft link, a loop of soft links,
            a path through an array), ``outside_source`` (an external link, a link kind HDF5
            plugins define).
    """
    h5py = require("h5py")
    h5l = h5py.h5l
    node = (fh.h5 if start is None else start)["/"]
    parts = [p for p in path.split("/") if p not in ("", ".")]
    walked: list[str] = []
    soft: list[str] = []  # the soft links followed, "link -> target", for messages
    hops = 0
    while parts:
        name = parts.pop(0)
        here = "/".join([*walked, name])
        bname = name.encode()
        if not node.id.links.exists(bname):
            if soft:
                raise ConversionError(
                    f"{key!r}: no {here!r} in the file, reached through the soft link {soft[-1]} (dangling)",
                    kind="missing_key",
                    path=where,
                )
            raise _Missing(f"no key {path!r} in the file", kind="missing_key", path=where)
        kind = node.id.links.get_info(bname).type
        if kind == h5l.TYPE_SOFT:
            hops += 1
            target = node.id.links.get_val(bname).decode("utf-8", "replace")
            soft.append(f"{here!r} -> {target!r}")
            if hops > _MAX_LINK_HOPS:
                raise ConversionError(
                    f"{key!r}: more than {_MAX_LINK_HOPS} soft links in a chain ({', '.join(soft[:3])}, ...: a loop?)",
                    kind="missing_key",
                    path=where,
                )
            if target.startswith("/"):
                node, walked = node.file["/"], []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        if kind == h5l.TYPE_EXTERNAL:
            hops += 1
            raw_file, raw_path = node.id.links.get_val(bname)
            target_file, target_path = os.fsdecode(raw_file), raw_path.decode("utf-8", "replace")
            what = f"passes through the external link {here!r} to {target_file!r} (object {target_path!r})"
            if not fh.allow or hops > _MAX_LINK_HOPS:
                raise fh.refused(where, key, what)
            found = _existing(_candidates(target_file, fh.folder_of(node), "HDF5_EXT_PREFIX"), where, key, what)
            node, walked = fh.other(found[0], where, key, what)["/"], []
            parts = [p for p in target_path.split("/") if p not in ("", ".")] + parts
            continue
        if kind != h5l.TYPE_HARD:
            raise fh.refused(where, key, f"passes through {here!r}, a link of a kind HDF5 plugins define")
        node = node[name]
        walked.append(name)
        if parts and not isinstance(node, h5py.Group):
            raise ConversionError(f"{key!r}: {here!r} is an array, not a group", kind="missing_key", path=where)
    return node


def _candidates(name: str, folder: str, env: str) -> list[str]:
    """Every path HDF5 may open for a file ``name`` that a dataset names.

    ``env``: ``HDF5_EXTFILE_PREFIX`` (external storage), ``HDF5_VDS_PREFIX`` (a virtual dataset's
    source) or ``HDF5_EXT_PREFIX`` (an external link's target). An absolute name that exists:
    itself; else the name (its last part, when absolute) under the prefixes of ``env``
    (``${ORIGIN}``: the file's folder), the file's folder and the working folder (a superset of
    what HDF5 tries; ``_existing`` checks every one that exists).
    """
    if os.path.isabs(name) and os.path.lexists(name):
        return [name]
    rest = os.path.basename(name) if os.path.isabs(name) else name
    prefixes = [p for p in os.environ.get(env, "").split(os.pathsep) if p]
    out = []
    for prefix in [*prefixes, folder, os.getcwd()]:
        path = os.path.join(prefix.replace("${ORIGIN}", folder), rest)
        if path not in out:
            out.append(path)
    return ([name] if os.path.isabs(name) else []) + out


def _check_target(path: str, where: str, key: str, what: str) -> None:
    """``bounds.check_external_target`` (allowed) with the key named: a regular file, nothing special."""
    try:
        bounds.check_external_target(path, where, True, ConversionError)
    except ConversionError as exc:
        raise ConversionError(f"{key!r}: {what}: {exc.detail}", kind="outside_source", path=where) from None


def _existing(names: list[str], where: str, key: str, what: str) -> list[str]:
    """The candidates that exist, in order, each checked (``_check_target``); refused when none does."""
    found = [c for c in names if os.path.lexists(c)]
    if not found:
        raise ConversionError(
            f"{key!r}: {what}: no such file (looked for {', '.join(names)})",
            kind="outside_source",
            path=where,
        )
    for path in found:
        _check_target(path, where, key, what)
    return found


def _check_storage(fh: _File, ds, where: str, key: str, depth: int = 0) -> None:
    """Refuse a dataset whose values live in other files (external raw storage, a virtual dataset).

    Unless ``fh.allow``; with it, every file HDF5 may open for it must exist and be a regular file
    (``_existing``), and a virtual dataset's sources are checked in turn (links, storage).
    """
    h5py = require("h5py")
    plist = ds.id.get_create_plist()
    folder = fh.folder_of(ds)
    if plist.get_layout() == h5py.h5d.VIRTUAL:
        sources = ds.virtual_sources()
        named = ", ".join(
            sorted({f"{'this file' if s.file_name == '.' else repr(s.file_name)} ({s.dset_name!r})" for s in sources})
        )
        what = f"is a virtual dataset whose values come from {named[:400] or 'nowhere'}"
        if not fh.allow:
            raise fh.refused(where, key, what)
        if depth >= _MAX_LINK_HOPS:
            raise ConversionError(f"{key!r}: virtual datasets nested too deep", kind="outside_source", path=where)
        for source in sources:
            if source.file_name == ".":
                other = ds.file
            elif "%" in source.file_name:
                raise fh.refused(where, key, f"{what}, a file-name pattern")
            else:
                found = _existing(_candidates(source.file_name, folder, "HDF5_VDS_PREFIX"), where, key, what)
                other = fh.other(found[0], where, key, what)
            inner = _resolve(fh, source.dset_name, where, key, start=other)
            if not hasattr(inner, "shape"):
                raise ConversionError(f"{key!r}: {what}: not an array", kind="outside_source", path=where)
            _check_storage(fh, inner, where, key, depth + 1)
    if plist.get_external_count():
        for name, _offset, _size in ds.external or ():
            name = os.fsdecode(name)
            shown = repr(name) if os.path.isabs(name) else f"{name!r} (relative: read from {os.path.abspath(name)})"
            what = f"external storage (its raw data in another file) names {shown}"
            if not fh.allow:
                raise fh.refused(where, key, what)
            _existing(_candidates(name, folder, "HDF5_EXTFILE_PREFIX"), where, key, what)


def _check_array(fh: _File, group: str, key: str, role: str, where: str, bounded: bool = True):
    """The dataset at ``group/key``, checked before anything of it is read; returns it.

    ``role``: ``"column"`` (numbers: state, action, a column; read whole), ``"camera"`` (uint8 or
    uint16 frames ``[T, H, W(, C)]``) or ``"encoded"`` (encoded images: uint8 rows ``[T, N]`` or
    variable-length bytes). ``bounded``: also check what it claims against ``bounds`` (rows, bytes
    read whole, bytes of a frame, of a chunk decompressed whole) and that every chunk was written.

    Raises:
        ConversionError: ``outside_source`` (``_resolve``, ``_check_storage``), ``missing_key``,
            ``bad_feature`` (not numbers, frames of another dtype, a scalar, values never written:
            fill values only), ``too_large``; each naming ``where`` and ``key``.
    """
    h5py = require("h5py")
    node = _resolve(fh, f"{group}/{key}" if group else key, where, key)
    if not isinstance(node, h5py.Dataset):
        raise ConversionError(f"{key!r} is a group, not an array", kind="missing_key", path=where)
    _check_storage(fh, node, where, key)
    shape, dtype = tuple(int(n) for n in node.shape), node.dtype
    if not shape:
        raise ConversionError(f"{key!r} is a scalar, not rows (one per step)", kind="bad_feature", path=where)
    if role == "column":  # numbers, or fixed-size arrays of numbers per cell (read as more axes)
        bounds.check_numeric(dtype.subdtype[0] if dtype.subdtype else dtype, where, key)
    elif role == "camera" and not _frame_dtype(dtype):
        raise ConversionError(
            f"{key!r} holds {dtype} frames; a camera's frames are uint8 (RGB, grey) or uint16 (depth) "
            "(--cameras leaves a camera out)",
            kind="bad_feature",
            path=where,
        )
    elif role == "encoded" and not _encoded_dtype(shape, dtype):
        raise ConversionError(
            f"{key!r} holds {dtype} {list(shape)}; encoded images (the file's compress attribute) are uint8 rows "
            "[T, N] or variable-length bytes",
            kind="bad_feature",
            path=where,
        )
    if bounded:
        bounds.check_count("rows", shape[0], bounds.MAX_ROWS, where, key)
        if role == "column":
            bounds.check_bytes(shape, dtype.itemsize, where, key)
        else:
            frame = dtype.itemsize * math.prod(shape[1:])
            if frame > bounds.MAX_FRAME_BYTES:
                what = f"a frame of {list(shape[1:])} x {dtype.itemsize} bytes ="
                raise bounds.too_large(what, frame, bounds.MAX_FRAME_BYTES, where, key)
        if node.chunks:
            chunk = dtype.itemsize * math.prod(node.chunks)
            if chunk > bounds.MAX_ARRAY_BYTES:  # HDF5 decompresses a whole chunk to read one row of it
                what = f"a chunk of {list(node.chunks)} x {dtype.itemsize} bytes ="
                raise bounds.too_large(what, chunk, bounds.MAX_ARRAY_BYTES, where, key)
    if math.prod(shape) and not node.is_virtual:
        written = node.id.get_storage_size()
        missing = 0
        if written and bounded and node.chunks:
            expected = math.prod(-(-n // c) for n, c in zip(shape, node.chunks, strict=True))
            missing = expected - node.id.get_num_chunks()
        if not written or missing > 0:
            part = "no value" if not written else f"{missing} of its chunks"
            raise ConversionError(
                f"{key!r} {list(shape)}: {part} never written; its rows would be the fill value",
                kind="bad_feature",
                path=where,
            )
    return node


def _frame_dtype(dtype) -> bool:
    """Frames a camera takes: uint8 or uint16, in either byte order (``>u2`` depth is read as ``uint16``)."""
    dtype = np.dtype(dtype)
    return dtype.fields is None and dtype.newbyteorder("=") in (np.dtype(np.uint8), np.dtype(np.uint16))


def _native(values: np.ndarray) -> np.ndarray:
    """``values`` in this machine's byte order (the same numbers; Arrow and the encoders take no other)."""
    return values if values.dtype.isnative else values.astype(values.dtype.newbyteorder("="))


def _encoded_dtype(shape: tuple[int, ...], dtype) -> bool:
    """Encoded image rows: uint8 ``[T, N]``, or ``[T]`` of variable-length bytes, fixed bytes or opaque cells."""
    h5py = require("h5py")
    if len(shape) == 2:
        return dtype == np.uint8
    if len(shape) != 1:
        return False
    vlen = h5py.check_vlen_dtype(dtype)
    if vlen is not None:
        return vlen == np.uint8 or vlen in (bytes, str)
    return dtype.kind in "SV" and dtype.fields is None


def _read(ds, where: str, key: str) -> np.ndarray:
    """A checked dataset read whole, in native byte order; a library's error named (``bounds.reading``)."""
    with bounds.reading(where, key):
        return _native(np.asarray(ds[()]))


def _num_samples(fh: _File, group: str, where: str, rows: int, keys: str) -> list[dict]:
    """Check a robomimic demo's ``num_samples`` attribute against its ``rows``; the notes about it.

    robomimic's ``SequenceDataset.load_demo_info`` takes the demo's length from this attribute
    (robomimic/utils/dataset.py) and reads that many rows of each array; its writers set it to the
    arrays' length. An integer that differs is refused; one of another type is noted and ignored.

    Raises:
        ConversionError(kind="length_mismatch"): ``num_samples`` is an integer other than ``rows``.
    """
    h5py = require("h5py")
    node = _resolve(fh, group, where, group)
    if "num_samples" not in node.attrs:
        return []
    with bounds.reading(where, "num_samples"):
        attr = h5py.h5a.open(node.id, b"num_samples")
        shape, dtype = attr.shape, attr.dtype
        if dtype.kind not in "iu" or math.prod(shape or ()) != 1:
            message = f"the attribute num_samples ({dtype} {list(shape or ())}) is not an integer: ignored"
            return [{"kind": "num_samples_ignored", "row": None, "message": message}]
        claimed = int(np.asarray(node.attrs["num_samples"]).reshape(-1)[0])
    if claimed != rows:
        raise ConversionError(
            f"the attribute num_samples says {claimed} rows, the arrays have {rows} ({keys}); robomimic would "
            f"read {claimed} rows of each: refused (a damaged or edited file?)",
            kind="length_mismatch",
            path=where,
        )
    return []


def _read_stream(values_ds, times_ds, name: str, values: str, times: str, rate: float | None, where: str) -> Stream:
    """Stream ``name``: the checked arrays ``values`` ``[n, ...]`` and ``times`` (float seconds ``[n]``), read whole.

    Timestamps are seconds on the row clock (row ``r`` at ``r / fps``), as the file holds them:
    finite, non-decreasing (equal times kept), within ``bounds.MAX_SPAN_S`` of the first row. A
    decrease is refused, not sorted: an array is one recorder's samples in the order taken, so a
    time going back is a clock that jumped or a damaged file, which sorting would hide.

    Raises:
        ConversionError: ``bad_feature`` (timestamps not one float per value, not finite; a time
            before the one before it), ``too_large`` (a time beyond ``bounds.MAX_SPAN_S``: not
            seconds from the first row), ``length_mismatch``; each naming the stream and both keys.
    """
    what = f"stream {name!r} ({values} at {times})"
    if times_ds.dtype.kind != "f" or len(times_ds.shape) != 1:
        raise ConversionError(
            f"{what}: the timestamps are {times_ds.dtype} {list(times_ds.shape)}; a stream's timestamps are float "
            "seconds [n] on the row clock (row r at r / fps)",
            kind="bad_feature",
            path=where,
        )
    if times_ds.shape[0] != values_ds.shape[0]:
        raise ConversionError(
            f"{what}: {times_ds.shape[0]} timestamps for {values_ds.shape[0]} values",
            kind="length_mismatch",
            path=where,
        )
    stamps = _read(times_ds, where, times).astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(stamps))
    if bad.size:
        i = int(bad[0])
        raise ConversionError(f"{what}: sample {i}'s timestamp is {stamps[i]}", kind="bad_feature", path=where)
    far = np.flatnonzero(np.abs(stamps) > bounds.MAX_SPAN_S)
    if far.size:
        i = int(far[0])
        raise ConversionError(
            f"{what}: sample {i}'s timestamp is {stamps[i]:.9g} s, more than {bounds.MAX_SPAN_S:g} s from the first "
            "row (bounds.MAX_SPAN_S): timestamps are seconds on the row clock (row r at r / fps), not a date",
            kind="too_large",
            path=where,
        )
    back = np.flatnonzero(np.diff(stamps) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise ConversionError(
            f"{what}: sample {i}'s timestamp {stamps[i]:.9g} s is before sample {i - 1}'s ({stamps[i - 1]:.9g} s): "
            "a stream's timestamps must not decrease (refused, not sorted: a clock that jumped or a damaged file?)",
            kind="bad_feature",
            path=where,
        )
    return Stream(stamps, _read(values_ds, where, values), rate)


@dataclass(frozen=True)
class _HDF5Table(LazyTable):
    """An episode's rows from HDF5 arrays (see the module): state, action and kept columns."""

    layout: _Layout

    def load(self) -> LoadedTable:
        """The rows, after every key of the episode (cameras too) is checked (``_check_array``).

        Raises:
            ConversionError: naming file and key: ``missing_key``, ``length_mismatch``,
                ``unreadable_file``, ``outside_source``, ``bad_feature``, ``too_large`` (the arrays
                read whole together above ``bounds.MAX_ARRAY_BYTES`` too).
        """
        lay = self.layout
        where = lay.where()
        with bounds.reading(where), _File(lay.file, lay.allow_external) as fh:
            datasets, total = {}, 0
            stream_keys = [k for _, values, times, _ in lay.streams for k in (values, times)]
            for key in dict.fromkeys([*lay.state, *lay.action, *(k for _, k in lay.columns), *stream_keys]):
                datasets[key] = ds = _check_array(fh, lay.group, key, "column", where)
                total += ds.dtype.itemsize * math.prod(ds.shape)
                if total > bounds.MAX_ARRAY_BYTES:
                    what = "the episode's arrays read whole, up to this one, take"
                    raise bounds.too_large(what, total, bounds.MAX_ARRAY_BYTES, where, key)
            encoded = lay.aloha and _compressed(fh, where)
            for key, role in lay.cameras:
                role = ("encoded" if encoded else "camera") if lay.aloha else role
                _check_array(fh, lay.group, key, role, where)
            columns: dict[str, np.ndarray] = {}
            keys: dict[str, str] = {}
            for name, parts in (("observation.state", lay.state), ("action", lay.action)):
                if parts:
                    read = [_read(datasets[k], where, k) for k in parts]
                    read = [r.reshape(len(r), math.prod(r.shape[1:])) for r in read]  # [T, D], also when T is 0
                    with bounds.reading(where, " + ".join(parts)):
                        columns[name] = concat(read, parts, where)
                    keys[name] = " + ".join(parts)
            for name, key in lay.columns:
                columns[name], keys[name] = _read(datasets[key], where, key), key
            table = build_table(columns, lay.fps, where, keys)
            shapes = ", ".join(f"{k!r} {list(ds.shape)}" for k, ds in list(datasets.items())[:3])
            if not table.num_rows:
                raise ConversionError(
                    f"the episode has no rows ({shapes or 'no array mapped'}): an episode needs one at least",
                    kind="empty_episode",
                    path=where,
                )
            notes = _num_samples(fh, lay.group, where, table.num_rows, shapes) if lay.group else []
            tasks: tuple[str, ...] = ()
            if lay.aloha and "language_instruction" in fh.h5.attrs:
                tasks = (_text_attribute(fh.h5, "language_instruction", where),)
            streams = {
                name: _read_stream(datasets[values], datasets[times], name, values, times, rate, where)
                for name, values, times, rate in lay.streams
            }
        return LoadedTable(table, notes, tasks, streams)

    @property
    def path(self) -> str:
        """The HDF5 file."""
        return str(self.layout.file)

    def fingerprint(self) -> list:
        """File, size, group and keys (the streams' when there are any)."""
        lay = self.layout
        out = [str(lay.file), size_of(lay.file), lay.group, lay.state, lay.action, lay.columns, lay.fps]
        return [*out, lay.streams] if lay.streams else out

    def estimated_bytes(self) -> int:
        """A guess: 1 kB per episode plus what ``build_table`` adds (the rows are small next to frames)."""
        return 1 << 10


@dataclass(frozen=True)
class _HDF5Frames(FrameReader):
    """A camera's frames: uint8 ``[T, H, W(, C)]``, uint16 ``[T, H, W(, 1)]`` (either byte order), or JPEG rows."""

    file: FileInput
    group: str
    key: str
    encoded: bool
    estimate: int = 0
    allow_external: bool = False
    aloha: bool = False  # encoded or not: the file's own compress attribute says

    def chunks(self) -> Iterator[np.ndarray | list[bytes]]:
        """``_CHUNK_FRAMES`` frames at a time, uint8 ``[n, H, W(, C)]`` or uint16 ``[n, H, W]``, native byte order.

        A channel axis of 1 is dropped (grey, depth); encoded rows (ALOHA: the file's own ``compress``
        attribute) are decoded here (``_decode_rows``: zero padding removed, cv2's channel order).
        The array is checked first (``_check_array``: links, storage, dtype, frame and chunk bytes).
        Raises ConversionError naming file and key (``row``: the first row of a chunk that cannot be
        read, or the image that cannot be decoded).
        """
        where = _where(self.file, self.group)
        with _File(self.file, self.allow_external) as fh:
            encoded = _compressed(fh, where) if self.aloha else self.encoded
            with bounds.reading(where, self.key):
                ds = _check_array(fh, self.group, self.key, "encoded" if encoded else "camera", where)
            n = int(ds.shape[0])
            for start in range(0, n, _CHUNK_FRAMES):
                try:
                    with bounds.reading(where, self.key):
                        rows = ds[start : start + _CHUNK_FRAMES]
                except ConversionError as exc:
                    raise exc.with_context(row=start) from exc.__cause__
                if encoded:
                    yield _decode_rows(rows, start)
                elif rows.ndim == 4 and rows.shape[-1] == 1:  # grey or depth with a channel axis
                    yield _native(rows[..., 0])
                else:
                    yield _native(rows)

    def fingerprint(self) -> list:
        """File, size, group, key (and, for encoded rows, the channel order they are decoded in)."""
        return [str(self.file), size_of(self.file), self.group, self.key, self.encoded, "cv2 channel order"]

    def estimated_bytes(self) -> int:
        """The bytes the arrays take in the file (lossless video is smaller, a re-encode far smaller)."""
        return self.estimate


def _decode_rows(rows, start: int) -> np.ndarray:
    """Encoded image rows (JPEG, PNG) decoded: uint8 ``[n, H, W, 3]`` (uint16 ``[n, H, W]`` for 16-bit grey).

    Decoded by FFmpeg (``images.decode_image``), channels then in the order ``cv2.imdecode(row,
    IMREAD_COLOR)`` returns them (blue first): ALOHA's recorder stores its RGB arrays with
    ``cv2.imencode`` (aloha ``record_episodes.py``, act-plus-plus), which takes them for BGR, and
    its readers decode with ``cv2.imdecode`` (act-plus-plus ``utils.py`` ``EpisodicDataset``,
    LeRobot's ALOHA converter), so the arrays read are the arrays recorded. An image with alpha
    comes back with an opaque alpha channel (the writer drops it and reports it).

    Raises:
        ConversionError: ``bad_image`` (no bytes, undecodable; ``row`` names it),
            ``frame_size_changed`` (an image of another size or kind than the chunk's first).
    """
    from ..images import decode_image

    images: list[np.ndarray] = []
    alpha = False
    for i, row in enumerate(rows):
        data = _image_bytes(row)
        if not data:
            raise ConversionError("image holds no bytes (a row of zeros)", kind="bad_image", row=start + i)
        try:
            image, has_alpha = decode_image(data)
        except ValueError as exc:
            raise ConversionError(str(exc), kind="bad_image", row=start + i) from exc
        if image.ndim == 3:
            image = image[..., ::-1]
        if images and (image.shape != images[0].shape or image.dtype != images[0].dtype):
            raise ConversionError(
                f"image is {image.dtype} {list(image.shape)}, "
                f"row {start}'s is {images[0].dtype} {list(images[0].shape)}",
                kind="frame_size_changed",
                row=start + i,
            )
        images.append(image)
        alpha |= has_alpha
    frames = np.stack(images)
    if alpha and frames.ndim == 4:
        frames = np.concatenate([frames, np.full((*frames.shape[:-1], 1), 255, np.uint8)], axis=-1)
    return frames


def _text_attribute(node, name: str, where: str) -> str:
    """The text of ``node``'s attribute ``name``, its stored size bounded (``_MAX_TEXT_BYTES``) before it is read.

    Raises:
        ConversionError: ``too_large`` (naming the attribute), ``unreadable_file`` (h5py's errors).
    """
    h5py = require("h5py")
    with bounds.reading(where, name):
        size = h5py.h5a.open(node.id, name.encode()).get_storage_size()
        if size > _MAX_TEXT_BYTES:
            raise bounds.too_large("the attribute's stored bytes", size, _MAX_TEXT_BYTES, where, name)
        return _attr_text(node.attrs[name])


def _compressed(fh: _File, where: str) -> bool:
    """An ALOHA file's ``compress`` attribute: its cameras are encoded image rows (act-plus-plus reads it per file)."""
    with bounds.reading(where, "compress"):
        return bool(fh.h5.attrs.get("compress", False))


def _image_bytes(row) -> bytes:
    """One row of an encoded-image array: ``uint8 [N]`` (zero-padded, ALOHA) or a variable-length cell."""
    if isinstance(row, np.ndarray) and row.dtype == np.uint8:
        return row.tobytes().rstrip(b"\0")  # a JPEG ends with FFD9, a PNG with its IEND CRC: zeros after are padding
    if isinstance(row, np.void):
        return row.tobytes()
    if isinstance(row, np.ndarray):  # vlen uint8
        return np.asarray(row, np.uint8).tobytes()
    return bytes(row)


def _arrays(node) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Every array under the group ``node`` reached by hard links (recursively): relative key -> (shape, dtype).

    Soft and external links are not followed (HDF5's object visit walks hard links only).
    """
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}

    def visit(name, obj):
        if hasattr(obj, "shape"):
            out[name] = (tuple(obj.shape), obj.dtype)

    node.visititems(visit)
    return out


def _external_links(node) -> list[str]:
    """The external links under the group ``node`` (hard-linked groups walked), as ``'name' -> file:object``."""
    h5py = require("h5py")
    found: list[str] = []
    if not hasattr(node, "visititems_links"):  # h5py < 3.11
        return found

    def visit(name, link):
        if isinstance(link, h5py.ExternalLink):
            found.append(f"{name!r} -> {link.filename}:{link.path}")

    node.visititems_links(visit)
    return found


def _is_image(shape: tuple[int, ...], dtype) -> bool:
    return len(shape) == 4 and shape[-1] in (1, 3, 4) and np.dtype(dtype) == np.uint8


def _attr_text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def detect(first: FileInput) -> str | None:
    """``"robomimic"`` (a ``data`` group of ``demo_*``), ``"aloha"`` (``observations`` and ``action``), or None.

    Reads link names only; a ``data`` that is an external link is refused, never followed.

    Raises:
        ConversionError: the file cannot be read, or ``data`` links out of it (naming the target).
    """
    h5py = require("h5py")
    where = str(first)
    with bounds.reading(where), _File(first) as fh:
        links = fh.h5.id.links
        if links.exists(b"data"):
            data = _resolve(fh, "data", where, "data")
            if isinstance(data, h5py.Group) and any(str(k).startswith("demo") for k in data):
                return "robomimic"
        if links.exists(b"observations") or links.exists(b"action"):
            return "aloha"
    return None


def _aloha_default(arrays: dict, compressed: bool) -> Mapping:
    cameras = {
        f"observation.images.{k.split('/')[-1]}": k
        for k, (shape, dtype) in sorted(arrays.items())
        if k.startswith("observations/images/") and (compressed or (len(shape) in (3, 4) and _frame_dtype(dtype)))
    }
    columns = {
        name: key
        for name, key in (("observation.velocity", "observations/qvel"), ("observation.effort", "observations/effort"))
        if key in arrays
    }
    return Mapping(
        state=("observations/qpos",),
        action=("action",),
        cameras=cameras,
        depth=(),
        columns=columns,
        others=True,
        fps=_ALOHA_FPS,
    )


def _robomimic_default(arrays: dict, libero: bool) -> Mapping:
    cameras, depth = {}, []
    for key, (shape, dtype) in sorted(arrays.items()):
        if not key.startswith("obs/") or not _frame_dtype(dtype):  # float depth maps stay columns (_plan)
            continue
        stem = key[4:]
        for suffix in ("_image", "_rgb", "_depth"):
            if stem.endswith(suffix) and len(shape) >= 3:
                name = f"observation.images.{stem[: -len(suffix)]}" + ("_depth" if suffix == "_depth" else "")
                cameras[name] = key
                if suffix == "_depth":
                    depth.append(name)
    wanted = (
        ("joint_states", "gripper_states") if libero else ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")
    )
    state = tuple(f"obs/{k}" for k in wanted if f"obs/{k}" in arrays)
    columns = {name: key for name, key in (("next.reward", "rewards"), ("next.done", "dones")) if key in arrays}
    return Mapping(
        state=state,
        action=("actions",),
        cameras=cameras,
        depth=tuple(depth),
        columns=columns,
        others=True,
        fps=_ROBOMIMIC_FPS,
    )


def _stream_specs(mapping: Mapping, where: str) -> tuple[tuple[str, str, str, float | None], ...]:
    """(name, values key, timestamps key, rate) of the mapping's ``streams``, sorted by name.

    Raises:
        SourceError: ``"all"``, or a stream given as a key alone (an HDF5 stream names its
            timestamps), naming the stream.
    """
    given = mapping.streams
    if given is None:
        return ()
    if not isinstance(given, dict):
        raise SourceError(
            f"{where}: mapping: streams {given!r}: an HDF5 stream names its arrays: "
            '{"<name>": {"values": key, "timestamps": key, "rate": Hz}}'
        )
    out = []
    for name, spec in sorted(given.items()):
        if not isinstance(spec, dict):
            raise SourceError(
                f"{where}: mapping: stream {name!r} is {spec!r}; an HDF5 stream is "
                '{"values": key, "timestamps": key, "rate": Hz} (rate optional): its own timestamps'
            )
        out.append((name, spec["values"], spec["timestamps"], spec.get("rate")))
    return tuple(out)


def _plan(
    arrays: dict, mapping: Mapping, where: str, never: tuple[str, ...] = ()
) -> tuple[tuple[tuple[str, str], ...], list[str]]:
    """Kept columns (mapped, then others) and the notes naming what is dropped.

    ``never``: keys not per step whatever their shape (ALOHA's ``compress_len`` ``[cameras, T]``,
    which an episode of as many rows as cameras would otherwise take for a column).
    """
    used = set(mapping.state or ()) | set(mapping.action or ()) | set((mapping.cameras or {}).values())
    used |= set((mapping.columns or {}).values())
    used |= {k for spec in _stream_specs(mapping, where) for k in spec[1:3]}
    columns = list((mapping.columns or {}).items())
    notes = []
    lengths = {k: s[0] for k, (s, _) in arrays.items() if s}
    length = lengths.get((mapping.action or ("",))[0])
    rest = sorted(k for k in arrays if k not in used)
    for key in rest:
        shape, dtype = arrays[key]
        per_step = bool(shape) and shape[0] == length and np.dtype(dtype).kind in "biuf"
        if key in never:
            notes.append(f"{where}: {key} {list(shape)} {np.dtype(dtype)} is not kept (not per step)")
        elif key.startswith("observations/images/"):  # ALOHA's camera folder: frames of a camera or nothing
            notes.append(f"{where}: {key} {list(shape)} {np.dtype(dtype)} is not kept (not a mapped camera)")
        elif mapping.others and per_step and not _is_image(shape, dtype):
            columns.append((column_name(key), key))
            if len(shape) >= 3 and np.dtype(dtype).kind == "f":
                notes.append(
                    f"{where}: {key} {list(shape)} {np.dtype(dtype)}: kept as a column (a camera is uint8 or uint16)"
                )
        else:
            why = "not per-step numbers" if not per_step else "others = false"
            notes.append(f"{where}: {key} {list(shape)} {np.dtype(dtype)} is not kept ({why})")
    return tuple(columns), notes


def open_hdf5(
    root: str,
    kind: str,
    options: SourceOptions,
    cameras: tuple[str, ...] | None,
    storage_options: dict | None,
    episodes: frozenset[int] | None,
    name: str | None = None,
) -> Source:
    """Describe an ALOHA folder (``kind="aloha"``) or a robomimic/LIBERO file (``"robomimic"``).

    Reads the first episode's structure (names, shapes, dtypes: no frames) for the default
    mapping, and checks every key the mapping reads there (``_check_array``; its claims against
    ``bounds`` are checked by the worker, where a refusal is a skippable episode). Every episode is
    read by the conversion worker (``_HDF5Table``, ``_HDF5Frames``), each key checked first.
    ``cameras``: as ``ConvertOptions.cameras``. ``episodes``: indices to describe (None: all).
    ``options.allow_external``: read external storage, external links and virtual datasets whose
    targets are regular local files (never for a remote source; never a FIFO, device, /proc, /sys).

    Raises:
        SourceError: no HDF5 file, a file that is not HDF5, no episode, or, in the first episode,
            a mapped key that is absent, names a file outside the source (external storage, an
            external link, a virtual dataset), holds no numbers where numbers are mapped, frames of
            another dtype, or fill values only (naming file, key and target).
    """
    h5py = require("h5py")
    allow = options.allow_external
    files = source_files(root, SUFFIXES, storage_options, allow)
    if not files:
        raise SourceError(f"{root}: no HDF5 file ({', '.join(SUFFIXES)})")
    name = name or _source_name(root)
    notes: list[str] = []
    out: list[Episode] = []
    first = str(files[0])
    try:
        with bounds.reading(first), _File(files[0], allow) as fh:
            if kind == "aloha":
                node, group = fh.h5["/"], ""
                arrays = _arrays(node)
                compressed = bool(fh.h5.attrs.get("compress", False))
                task, libero = None, False  # each file's language_instruction: HDF5Table.load
            else:
                if len(files) != 1:
                    raise SourceError(f"{root}: a robomimic/LIBERO source is one HDF5 file, found {len(files)}")
                data = _resolve(fh, "data", first, "data")
                if not isinstance(data, h5py.Group):
                    raise SourceError(f"{first}: 'data' is an array, not a group of demo_* groups")
                demos = sorted((k for k in data if k.startswith("demo")), key=natural_key)
                if not demos:
                    raise SourceError(f"{first}: no data/demo_* group")
                bounds.check_count("demo groups", len(demos), bounds.MAX_EPISODES, first, "data")
                group = f"data/{demos[0]}"
                node = _resolve(fh, group, first, group)
                if not isinstance(node, h5py.Group):
                    raise SourceError(f"{first}: {group!r} is an array, not a group")
                arrays = _arrays(node)
                attrs = dict(data.attrs)
                compressed, task = False, None
                libero = "problem_info" in attrs
                if libero:
                    try:
                        task = json.loads(_attr_text(attrs["problem_info"])).get("language_instruction")
                    except (ValueError, AttributeError):
                        notes.append(f"{first}: data attribute problem_info is not JSON; no task text")
                if "language_instruction" in attrs:
                    task = _attr_text(attrs["language_instruction"])
            where = _where(files[0], group)
            default = _aloha_default(arrays, compressed) if kind == "aloha" else _robomimic_default(arrays, libero)
            mapping = options.resolved(default)
            streams = _stream_specs(mapping, where)
            stream_keys = [k for _, values, times, _ in streams for k in (values, times)]
            mapped = [*(mapping.state or ()), *(mapping.action or ()), *(mapping.cameras or {}).values(), *stream_keys]
            for key in [*mapped, *(mapping.columns or {}).values()]:
                if key not in arrays:  # absent, or reached through a soft link
                    try:
                        found = _resolve(fh, f"{group}/{key}" if group else key, where, key)
                    except _Missing:
                        if key not in mapped:
                            continue
                        keys = ", ".join(sorted(arrays)) or "none"
                        raise SourceError(f"{where}: no key {key!r} (keys: {keys}); see --mapping") from None
                    if hasattr(found, "shape"):
                        arrays[key] = (tuple(found.shape), found.dtype)
            columns, dropped = _plan(arrays, mapping, where, ("compress_len",) if kind == "aloha" else ())
            cams = kept_cameras(mapping.cameras, cameras, str(where))
            role = "encoded" if compressed else "camera"
            table_keys = [*(mapping.state or ()), *(mapping.action or ()), *(k for _, k in columns), *stream_keys]
            taken = {"frame_index", "timestamp", "observation.state", "action", *(c for c, _ in columns), *cams}
            for stream, *_ in streams:
                if stream in taken:
                    raise SourceError(
                        f"{where}: mapping: stream {stream!r} has the name of a column or camera; choose another"
                    )
            for key in dict.fromkeys(table_keys):
                _check_array(fh, group, key, "column", where, bounded=False)
            for key in cams.values():
                _check_array(fh, group, key, role, where, bounded=False)
            linked = _external_links(node)
    except ConversionError as exc:
        raise SourceError(str(exc)) from None
    notes += dropped
    notes += [
        f"{where}: {link}: an external link, not followed (refused where a mapped key passes through it)"
        for link in linked[:_NOTED_LINKS]
    ]
    if len(linked) > _NOTED_LINKS:
        notes.append(f"{where}: {len(linked) - _NOTED_LINKS} more external links, not followed")
    task = mapping.task or task
    fps = float(mapping.fps or (_ALOHA_FPS if kind == "aloha" else _ROBOMIMIC_FPS))
    notes.append(
        f"{kind} mapping: state = {' + '.join(mapping.state or ()) or 'none'}, action = "
        f"{' + '.join(mapping.action or ()) or 'none'}, cameras = "
        + (", ".join(f"{c} <- {k}" for c, k in cams.items()) or "none")
        + (" (JPEG bytes, decoded)" if compressed else "")
        + "".join(f", stream {n} <- {v} at {t}" + (f" ({r:g} Hz)" if r else "") for n, v, t, r in streams)
        + f", {fps:g} fps"
    )
    if kind == "aloha":
        groups = [(f, "") for f in files]
        indices = episode_numbers([str(f) for f in files])
        robot = "aloha"
    else:
        groups = [(files[0], f"data/{d}") for d in demos]
        indices = episode_numbers(demos)
        robot = "libero" if libero else "robomimic"
    per_file = size_of(files[0]) // max(1, len(groups)) if kind != "aloha" else 0
    camera_keys = tuple((key, role) for key in cams.values())
    for index, (file, group) in zip(indices, groups, strict=True):
        if episodes is not None and index not in episodes:
            continue
        aloha = kind == "aloha"
        layout = _Layout(
            file,
            group,
            tuple(mapping.state or ()),
            tuple(mapping.action or ()),
            columns,
            fps,
            camera_keys,
            allow,
            aloha,
            streams,
        )
        estimate = (size_of(file) if kind == "aloha" else per_file) // max(1, len(cams))
        frames = {
            cam: CameraFrames(
                _HDF5Frames(file, group, key, compressed, estimate, allow, aloha), depth=cam in (mapping.depth or ())
            )
            for cam, key in cams.items()
        }
        out.append(
            Episode(
                source=name,
                episode_index=index,
                table=_HDF5Table(layout),
                videos={},
                fps=fps,
                tasks=(task,) if task else (),
                robot=robot,
                frames=frames,
            )
        )
    return Source(name=name, episodes=out, fps=fps, path=root, format=kind, notes=notes)


def _source_name(root: str) -> str:
    stem = root.rstrip("/").rsplit("/", 1)[-1]
    for suffix in SUFFIXES:
        stem = stem.removesuffix(suffix)
    return stem or "hdf5"
