"""Zarr ReplayBuffer sources: UMI and Diffusion Policy (``data/<key>`` over all steps, ``meta/episode_ends``).

Read with zarr (``epishard[zarr]``; Zarr format 2 or 3) from a local folder, a ``.zarr.zip`` file
or any fsspec URL (zarr's ``FsspecStore``), one episode's rows at a time in the conversion
worker: episode ``i`` is rows ``[episode_ends[i-1], episode_ends[i])`` of every array, and the
source's episode list holds those two numbers only.

Default mapping (docs/sources/umi.md): arrays uint8 ``[N, H, W, 3]`` are cameras
(``camera0_rgb`` -> ``observation.images.camera0``, Diffusion Policy's ``img`` ->
``observation.images.img``); ``observation.state`` is, per robot ``k``, ``robot<k>_eef_pos +
robot<k>_eef_rot_axis_angle + robot<k>_gripper_width`` (UMI) or ``state`` (Diffusion Policy);
``action`` is ``action`` when present (UMI stores none: its policies derive actions from future
poses, so the shards have no ``action`` column, and the source's notes say so); every other
per-step array is kept as a column of its own name (``data.<key>`` when the name is one epishard
writes itself: ``_OWN_COLUMNS``). 10 Hz unless ``--fps`` (UMI records at 59.94 and subsamples; the
ReplayBuffer does not store its rate).

Read as Diffusion Policy's ``ReplayBuffer.get_episode`` reads it (checked against a
re-implementation of it: tests/test_oracle_zarr.py): each array from its own metadata document,
never consolidated metadata (stale once a buffer grew after it was consolidated); values in
either byte order, returned in this machine's; UMI's JPEG-XL cameras through ``imagecodecs`` when
installed. Every process opens the store itself (``_open``): a forked worker never reads through
its parent's ``.zarr.zip`` handle.

A store from elsewhere is trusted for nothing (``sources.bounds``, docs/sources/umi.md):

- a local folder is walked once at open: a symbolic link out of it (a chunk, a metadata document,
  a whole array's folder) is refused naming file, key and target unless
  ``SourceOptions.allow_external``; a FIFO, socket, device, ``/proc``, ``/sys`` or ``/dev`` path is
  refused either way, from ``stat`` alone (never opened). A ``.zarr.zip`` is read in place; its
  members' sizes come from its central directory, checked before a member is inflated;
- every read goes through ``_Guarded``: a metadata document is bounded in size and depth
  (``untrusted.loads``) before zarr parses it; a chunk's stored size, then every stage of its
  decoding (``_check_decoded``: the compressor, each filter, each Zarr 3 codec, each chunk of a
  shard), each before it runs, are refused past what the array's chunk can need (a decompression
  bomb): the size a blosc, zstd or lz4 header states, zlib, gzip, bz2 and lzma inflated into a
  bounded buffer, a filter's input times what it may widen it by, the items a variable-length
  codec states; a codec none of these bounds (an image codec) is read only as the first stage;
- ``meta/episode_ends`` is read in slices: more than ``bounds.MAX_EPISODES`` entries, an entry
  negative, decreasing or past every array's end is refused at open naming the position; episodes
  of zero rows are counted in the notes, not listed;
- per episode, before a row is read: at most ``bounds.MAX_ROWS`` rows and ``bounds.MAX_ARRAY_BYTES``
  per array, chunks (read whole to read one row) at most ``bounds.MAX_ARRAY_BYTES``, a camera frame
  at most ``bounds.MAX_FRAME_BYTES`` (``too_large``); a zarr or codec failure is ``unreadable_file``
  (``bounds.reading``), so ``--on-error skip`` applies;
- a mapped state, action or camera array of text, bytes or objects is ``bad_feature``, one with no
  chunk written (every row its fill value) is refused, at open.

Internal: import from ``epishard.shardwriter.sources``.
"""

from __future__ import annotations

import bz2
import contextlib
import functools
import importlib
import json
import lzma
import math
import os
import stat
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from epishard.format import untrusted
from epishard.format.storage import Location, is_local, local_path

from ..episode import CameraFrames, Episode, FrameReader, LazyTable, LoadedTable, Source
from ..errors import ConversionError, SourceError
from . import bounds
from .base import Mapping, SourceOptions, build_table, concat, kept_cameras, require

__all__ = ["open_replay_buffer"]

_CHUNK_FRAMES = 32  # frames read per chunk of a camera
_DEFAULT_FPS = 10.0
_ENDS_STEP = 1 << 20  # entries of meta/episode_ends read at a time (8 MiB)
_METADATA = (".zarray", ".zgroup", ".zattrs", ".zmetadata", "zarr.json")  # Zarr's JSON documents
_EXPANDING = 8  # how much filters (v2) or array-to-array codecs (v3) may grow a chunk's bytes (AsType u1 -> f8)


@dataclass(frozen=True)
class _Store:
    """Where the ReplayBuffer is: a local folder, a ``.zip``, or a URL (with its storage options)."""

    root: str
    storage_options: dict = field(default_factory=dict, compare=False, repr=False)  # secrets: never shown

    def __hash__(self) -> int:
        return hash(self.root)


# ------------------------------------------------------------------ what the store's files may be


def _check_local_store(path: str, allow_external: bool) -> None:
    """Refuse a local store holding a path that resolves outside it or to a special file; nothing is opened.

    One walk (``os.scandir``: a symbolic link, a folder or a file is told from the directory entry,
    no ``stat`` per chunk file); only links are resolved and ``stat``-ed. A link to a regular file
    or folder inside the store is read as the store's own; one out of it is refused unless
    ``allow_external`` (then its target is walked too, once); a FIFO, socket, device, ``/proc``,
    ``/sys`` or ``/dev`` path is refused either way (``bounds.check_local_file``: from ``stat``
    alone, never opened).

    Raises:
        SourceError: naming the store's file, its Zarr key and the target.
    """
    base = os.path.realpath(path)
    walked = {base}
    stack = [(base, "")]
    while stack:
        folder, prefix = stack.pop()
        for entry in _entries(folder, path):
            key = prefix + entry.name
            where = f"{os.path.join(path, key)} (Zarr key {key})"
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                inside = os.path.commonpath([base, target]) == base
                if not os.path.lexists(target):
                    if not inside:
                        bounds.check_external_target(target, where, allow_external)
                    continue  # a dangling link inside: read as a missing key
                if os.path.isdir(target) and not _special(target):
                    if not inside:
                        if not allow_external:
                            bounds.check_external_target(target, where, False)  # raises, naming the target
                        if target not in walked:  # allowed: its files are checked as the store's
                            walked.add(target)
                            stack.append((target, key + "/"))
                    continue  # inside: walked as its own folder
                if inside:
                    bounds.check_local_file(target, where)
                else:
                    bounds.check_external_target(target, where, allow_external)
            elif entry.is_dir(follow_symlinks=False):
                stack.append((entry.path, key + "/"))
            elif not entry.is_file(follow_symlinks=False):
                bounds.check_local_file(entry.path, where)  # a FIFO, socket or device: refused unread


def _entries(folder: str, path: str) -> Iterator[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            yield from entries
    except OSError as exc:
        raise SourceError(f"{path}: cannot list {folder} ({exc.strerror or exc})") from None


def _special(real: str) -> bool:
    return any(real == r or real.startswith(r + os.sep) for r in bounds.SPECIAL_ROOTS)


def _check_zip(path: str) -> dict[str, int]:
    """The members of a ``.zarr.zip`` and their sizes (from its central directory), refused when too large.

    Members are read from the archive only (never extracted). A metadata document may hold at most
    ``untrusted.MAX_JSON_BYTES`` bytes, any other member ``bounds.MAX_ARRAY_BYTES``; each chunk is
    checked again, against what its array's chunk can hold, before it is inflated (``_Guarded``).

    Raises:
        SourceError: the file is not a regular file or not a zip, or a member is too large (named).
    """
    bounds.check_local_file(path)
    try:
        with zipfile.ZipFile(path) as archive:
            sizes = {info.filename: info.file_size for info in archive.infolist()}
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise SourceError(f"{path}: not a readable zip ({type(exc).__name__}: {exc})") from None
    for name, size in sizes.items():
        limit = untrusted.MAX_JSON_BYTES if name.rsplit("/", 1)[-1] in _METADATA else bounds.MAX_ARRAY_BYTES
        if size > limit:
            raise SourceError(
                f"{path}: member {name} inflates to {size} bytes (its central directory says), more than the "
                f"{limit} a {'metadata document' if limit != bounds.MAX_ARRAY_BYTES else 'member'} may have: "
                "refused before inflating"
            )
    return sizes


# ------------------------------------------------------------------ what a chunk may decode to


@dataclass(frozen=True)
class _Stage:
    """One step of decoding a stored chunk, and what bounds its output before it runs.

    ``kind``: ``sized`` (a compressor whose data states, or is counted to, the bytes it decodes to:
    ``_DECODED_SIZE``), ``scaled`` (its output is its input's size times ``scale``: shuffle, delta,
    a checksum taken off, Zarr 3's ``bytes`` and ``transpose``, ...), ``items`` (numcodecs'
    variable-length codecs: their data states a count of items, at most the chunk's), ``shard``
    (Zarr 3 sharding: each chunk of the shard checked as ``_Chunks.shard.inner``), ``opaque`` (any
    other, image codecs: nothing here bounds it, so it is read only as the first stage). ``cap``:
    the most bytes its output may have (``_chain``). ``decode``: the stage run here on bytes, when
    a stage after it must read what it makes to be bounded (None: not run here).
    """

    name: str
    kind: str
    cap: int = 0
    scale: float = 1.0
    size: Callable[[memoryview, int], int] | None = field(default=None, compare=False, repr=False)
    decode: Callable[[memoryview], Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class _Shard:
    """A Zarr 3 shard's layout: ``count`` chunks (``inner``), indexed by ``index`` bytes at its start or end.

    The index is ``count`` pairs of uint64 (offset, length; both 2^64 - 1 for a chunk not written)
    in ``order`` (``<``, ``>``), then a crc32c of 4 bytes when its codecs end with one; ``index`` is
    0 when its codecs are other than ``bytes`` and ``crc32c`` (not read here: the shard is refused).
    """

    inner: _Chunks
    count: int
    index: int
    at_end: bool
    order: str


@dataclass(frozen=True)
class _Chunks:
    """How large one array's stored chunks may be: ``stored`` bytes as a file, ``decoded`` once decompressed.

    ``stages``: its codecs in the order they decode (Zarr 2: the compressor, then the filters last
    to first; Zarr 3: the bytes-to-bytes codecs last to first, the array-to-bytes codec, the
    array-to-array codecs last to first), each bounded before it runs (``_check_decoded``).
    ``shape``: the stored unit (a chunk, or a shard of Zarr v3 sharding: ``shard``).
    """

    key: str
    shape: tuple[int, ...]
    itemsize: int
    stored: int
    decoded: int
    stages: tuple[_Stage, ...]
    shard: _Shard | None = None

    @classmethod
    def of(cls, array) -> _Chunks:
        """Read from a zarr array's metadata (Zarr format 2 or 3)."""
        meta = array.metadata
        shape = tuple(int(n) for n in (getattr(array, "shards", None) or array.chunks))
        if meta.zarr_format == 2:
            return cls._of_v2(str(array.path), meta, shape, np.dtype(array.dtype))
        return cls._of_v3(str(array.path), tuple(meta.codecs), shape, np.dtype(array.dtype))

    @staticmethod
    def _sizes(shape: tuple[int, ...], dtype: np.dtype, expands: bool, sharded: bool) -> tuple[int, int]:
        """(stored, decoded): the most bytes a chunk of ``shape`` takes encoded, and at any stage of decoding."""
        if dtype.kind in "OT" or dtype.hasobject:
            return bounds.MAX_ARRAY_BYTES, bounds.MAX_ARRAY_BYTES
        raw = int(dtype.itemsize)
        for n in shape:
            raw *= n
        decoded = raw * (_EXPANDING if expands else 1)
        stored = decoded + decoded // 64 + 4096  # codecs' worst growth
        if sharded:  # a shard's index and its chunks' codec headers
            stored += decoded // 8
        return stored, decoded

    @classmethod
    def _of_v2(cls, key: str, meta, shape: tuple[int, ...], dtype: np.dtype) -> _Chunks:
        filters = list(meta.filters or ())
        stored, decoded = cls._sizes(shape, dtype, bool(filters), False)
        chain = ([meta.compressor] if meta.compressor is not None else []) + filters[::-1]
        return cls(key, shape, int(dtype.itemsize), stored, decoded, _chain(chain, decoded, stored))

    @classmethod
    def _of_v3(cls, key: str, codecs: tuple, shape: tuple[int, ...], dtype: np.dtype) -> _Chunks:
        from zarr.abc.codec import ArrayArrayCodec, BytesBytesCodec
        from zarr.codecs import ShardingCodec

        arrays = [c for c in codecs if isinstance(c, ArrayArrayCodec)]
        to_bytes = [c for c in codecs if not isinstance(c, (ArrayArrayCodec, BytesBytesCodec))]
        sharding = next((c for c in to_bytes if isinstance(c, ShardingCodec)), None)
        expands = any(_codec_name(c) != "transpose" for c in arrays)
        stored, decoded = cls._sizes(shape, dtype, expands, sharding is not None)
        chain = [c for c in codecs if isinstance(c, BytesBytesCodec)][::-1] + to_bytes + arrays[::-1]
        shard = None
        if sharding is not None:
            inner_shape = tuple(int(n) for n in sharding.chunk_shape)
            count = 1
            for whole, part in zip(shape, inner_shape, strict=True):
                count *= max(whole // max(part, 1), 1)
            index_codecs = [_codec_name(c) for c in sharding.index_codecs]
            endian = getattr(sharding.index_codecs[0], "endian", None)
            order = ">" if getattr(endian, "value", endian) == "big" else "<"
            index = 0
            if index_codecs[:1] == ["bytes"] and set(index_codecs[1:]) <= {"crc32c"} and len(index_codecs) <= 2:
                index = 16 * count + 4 * (len(index_codecs) - 1)
            at_end = str(getattr(sharding.index_location, "value", sharding.index_location)) == "end"
            inner = cls._of_v3(key, tuple(sharding.codecs), inner_shape, dtype)
            shard = _Shard(inner, count, index, at_end, order)
        return cls(key, shape, int(dtype.itemsize), stored, decoded, _chain(chain, decoded, stored), shard)


def _codec_name(codec) -> str:
    name = getattr(codec, "codec_id", None) or codec.to_dict().get("name", "")
    return str(name).removeprefix("numcodecs.")


def _numcodec(codec, name: str) -> Any:
    """The numcodecs codec that decodes ``codec`` as zarr does (None: none here)."""
    if hasattr(codec, "codec_id") and hasattr(codec, "decode"):  # numcodecs' own (Zarr 2, imagecodecs)
        return codec
    config = getattr(codec, "codec_config", None)  # numcodecs' Zarr 3 codecs (``numcodecs.zlib``, ...)
    numcodecs = require("numcodecs")
    if isinstance(config, dict):
        return numcodecs.get_codec(dict(config))
    native = {"zstd": "Zstd", "gzip": "GZip", "blosc": "Blosc"}.get(name)  # Zarr 3's own: self-describing data
    return getattr(numcodecs, native)() if native else None


def _without_crc32c(data: memoryview) -> memoryview:
    return data[:-4]


def _raw_lzma_size(filters, data: memoryview, limit: int) -> int:
    """``_inflated`` for raw LZMA (no header: its filters are the codec's configuration)."""
    return _inflated(functools.partial(lzma.LZMADecompressor, lzma.FORMAT_RAW, filters=filters), data, limit)


def _as_bytes(out: Any) -> memoryview:
    """A codec's output as bytes; refused (TypeError) when it holds objects (nothing after it reads bytes)."""
    if isinstance(out, (bytes, bytearray, memoryview)):
        return memoryview(out).cast("B")
    values = np.asarray(out)
    if values.dtype.hasobject:
        raise TypeError("it makes objects, not bytes")
    return np.ascontiguousarray(values).reshape(-1).view(np.uint8).data


# Filters whose output is no larger than their input: shuffles, checksums taken off, Zarr 3's
# ``bytes`` (a view of the data) and ``transpose``; base64 shrinks.
_KEEPS_SIZE = frozenset(
    {
        "shuffle",
        "bitround",
        "crc32",
        "crc32c",
        "adler32",
        "fletcher32",
        "jenkins_lookup3",
        "base64",
        "bytes",
        "transpose",
    }
)
# Filters that decode one dtype to another: (attribute of the decoded dtype, of the encoded one)
_RETYPES = {
    "delta": ("dtype", "astype"),
    "fixedscaleoffset": ("dtype", "astype"),
    "quantize": ("dtype", "astype"),
    "categorize": ("dtype", "astype"),
    "astype": ("decode_dtype", "encode_dtype"),
}
_ITEMS = frozenset({"vlen-utf8", "vlen-bytes", "vlen-array"})  # their data starts with its count of items


def _chain(codecs: list, decoded: int, shard: int) -> tuple[_Stage, ...]:
    """The stages of ``codecs`` (in decode order), each capped at what the stages after it can take.

    The last makes at most ``decoded`` bytes; a compressor's input (the stage before it) may be
    larger than its output by a codec's worst growth (incompressible data and its header:
    ``_Chunks._sizes``), a shard's by its index and headers (``shard``, the shard's stored bound);
    the other stages are bounded with ``decoded`` (it allows for filters that widen their input).
    """
    cap, stages = decoded, []
    for stage in reversed([_stage(c) for c in codecs]):
        stages.append(replace(stage, cap=cap))
        if stage.kind == "sized":
            cap = cap + cap // 64 + 4096
        elif stage.kind == "shard":
            cap = shard
    return tuple(stages[::-1])


_RUNS_CODE = frozenset({"pickle"})  # numcodecs.Pickle: pickle.loads of a chunk runs what the store wrote


def _stage(codec) -> _Stage:
    """How ``codec`` is bounded as one stage of decoding (``_Stage``; its cap is set by ``_chain``)."""
    from zarr.codecs import ShardingCodec

    name = _codec_name(codec)
    if name in _RUNS_CODE:
        raise ConversionError(
            f"a chunk codec {name!r} decodes by running code the store carries (Python's pickle): refused",
            kind="bad_feature",
        )
    if isinstance(codec, ShardingCodec):
        return _Stage(name, "shard")
    try:
        numcodec = _numcodec(codec, name)
    except Exception:  # a codec numcodecs cannot make: read by zarr as it is, bounded by nothing here
        numcodec = None
    decode = numcodec.decode if numcodec is not None else None
    if name == "crc32c" and numcodec is None:  # Zarr 3's: 4 bytes after the data
        decode = _without_crc32c
    if name in _DECODED_SIZE:
        size = _DECODED_SIZE[name]
        if name == "lzma" and getattr(numcodec, "format", lzma.FORMAT_XZ) == lzma.FORMAT_RAW:  # states no format
            size = functools.partial(_raw_lzma_size, getattr(numcodec, "filters", None))
        return _Stage(name, "sized", size=size, decode=decode)
    if name in _ITEMS:
        return _Stage(name, "items", decode=decode)
    if name in _KEEPS_SIZE:
        return _Stage(name, "scaled", decode=decode)
    if name == "packbits":
        return _Stage(name, "scaled", scale=8.0, decode=decode)
    if name in _RETYPES and numcodec is not None:
        wide, narrow = (np.dtype(getattr(numcodec, a)).itemsize for a in _RETYPES[name])
        return _Stage(name, "scaled", scale=wide / max(narrow, 1), decode=decode)
    return _Stage(name, "opaque", decode=decode)


def _blosc(data: memoryview, limit: int) -> int:
    if len(data) < 16:
        raise ValueError("shorter than a blosc header")
    cbytes = int.from_bytes(data[12:16], "little")
    if cbytes != len(data):  # blosc would read past the buffer
        raise ValueError(f"blosc header says {cbytes} bytes, the chunk has {len(data)}")
    return int.from_bytes(data[4:8], "little")


def _zstd(data: memoryview, limit: int) -> int:
    head = bytes(data[:18])
    if len(head) < 6 or head[:4] != b"\x28\xb5\x2f\xfd":
        raise ValueError("not a zstd frame")
    descriptor = head[4]
    single = (descriptor >> 5) & 1
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    size = (1 if single else 0, 2, 4, 8)[descriptor >> 6]
    if size == 0:  # the frame does not state its size: inflate it into at most limit + 1 bytes
        try:
            out = require("numcodecs").Zstd().decode(data, out=np.empty(limit, np.uint8))
            return len(memoryview(out).cast("B"))
        except RuntimeError as exc:
            if "too small" in str(exc):
                return limit + 1
            raise
    if len(head) < at + size:
        raise ValueError("a truncated zstd frame header")
    return int.from_bytes(head[at : at + size], "little") + (256 if size == 2 else 0)


def _lz4(data: memoryview, limit: int) -> int:
    if len(data) < 4:
        raise ValueError("shorter than numcodecs' LZ4 size prefix")
    return int.from_bytes(data[:4], "little")


def _inflated(make, data: memoryview, limit: int) -> int:
    """Bytes ``data`` inflates to, counted up to ``limit + 1``: its streams in turn, as the codec reads them."""
    total, rest = 0, bytes(data)
    while rest and total <= limit:
        decompressor = make()
        total += len(decompressor.decompress(rest, limit + 1 - total))
        if total > limit or not decompressor.eof:  # past the limit, or a truncated stream (the codec fails on it)
            break
        rest = decompressor.unused_data.lstrip(b"\0")  # gzip members may be padded with zeros
    return total


# codec name -> (stored bytes, limit) -> the bytes it decodes to (more than limit: refused), read from its header
_DECODED_SIZE = {
    "blosc": _blosc,
    "zstd": _zstd,
    "lz4": _lz4,
    "zlib": lambda d, n: _inflated(zlib.decompressobj, d, n),
    "gzip": lambda d, n: _inflated(lambda: zlib.decompressobj(31), d, n),
    "bz2": lambda d, n: _inflated(bz2.BZ2Decompressor, d, n),
    "lzma": lambda d, n: _inflated(lzma.LZMADecompressor, d, n),
}


def _check_decoded(chunks: _Chunks, data: memoryview, where: str, key: str, part: str = "") -> None:
    """Refuse a stored chunk any stage of whose decoding would make more than the chunk can need (a bomb).

    The stages (``_Chunks.stages``) are bounded in the order they decode, each before it runs: a
    compressor by the size its header states or its data inflates to (counted into at most its cap
    + 1 bytes), a filter by its input's size times what it may widen it by, a variable-length codec
    by the count of items its data states, a shard by each of its chunks. A stage whose output a
    later stage must read to be bounded (a compressor used as a filter) is decoded here, once it is
    known to fit. A codec nothing here bounds (an image codec) is read only as the first stage.

    Raises:
        ConversionError: ``too_large`` (naming file, key, the stage, the claim and the chunk's shape),
            or ``unreadable_file`` for a chunk whose header is damaged.
    """
    stages = chunks.stages
    chain = " -> ".join(s.name for s in stages)
    unit = f"a chunk of {list(chunks.shape)} x {chunks.itemsize} bytes"

    def at(i: int) -> str:
        return "" if len(stages) == 1 else f" (stage {i + 1} of its codec chain {chain})"

    for i, stage in enumerate(stages[1:], 1):
        if stage.kind == "opaque":
            raise ConversionError(
                f"{key!r}{part}: its {stage.name} data{at(i)} cannot be bounded before it is decoded (no size "
                "is known for what it makes), and only a first stage may be such a codec: refused before decoding",
                kind="too_large",
                path=where,
            )
    last = max((i for i, s in enumerate(stages) if s.kind in ("sized", "items", "shard")), default=-1)
    buf, size = data, len(data)
    for i, stage in enumerate(stages):
        try:
            if stage.kind == "opaque":  # the first stage (an image codec): its output is the decoder's
                if last < 0:
                    return
                made = -1
            elif stage.size is not None:  # sized
                made = stage.size(buf, stage.cap)
            elif stage.kind == "items":
                _check_items(chunks, stage, buf, where, f"{key!r}{part}", at(i))
                made = len(buf)
            elif stage.kind == "shard":
                _check_shard(chunks, buf, where, key)
                made = stage.cap
            else:
                made = math.ceil(size * stage.scale)
        except ConversionError:
            raise
        except Exception as exc:  # zlib.error, lzma.LZMAError, OSError (bz2), a damaged header
            raise ConversionError(
                f"{key!r}{part}: a damaged {stage.name} chunk{at(i)} ({_short(exc)}); refused before decoding",
                kind="unreadable_file",
                path=where,
            ) from None
        if made > stage.cap:
            claim = f"{made} bytes" if made != stage.cap + 1 else f"more than {stage.cap} bytes"
            raise ConversionError(
                f"{key!r}{part}: its {stage.name} data{at(i)} decodes to {claim}, past the {stage.cap} bytes {unit} "
                "can need there (a decompression bomb): refused before decoding",
                kind="too_large",
                path=where,
            )
        if i < last:  # a later stage reads what this one makes: made here, known to fit
            if stage.decode is None:
                raise ConversionError(
                    f"{key!r}{part}: its {stage.name} data{at(i)} is not decoded here, and the stage after it "
                    "can only be bounded on its output: refused before decoding",
                    kind="too_large",
                    path=where,
                )
            try:
                buf = _as_bytes(stage.decode(buf))
            except Exception as exc:
                raise ConversionError(
                    f"{key!r}{part}: a damaged {stage.name} chunk{at(i)} ({_short(exc)}); refused before decoding",
                    kind="unreadable_file",
                    path=where,
                ) from None
            if len(buf) > stage.cap:  # more than its header said: the codec's own check failed
                raise ConversionError(
                    f"{key!r}{part}: its {stage.name} data{at(i)} decoded to {len(buf)} bytes, past the "
                    f"{stage.cap} bytes {unit} can need there (a decompression bomb)",
                    kind="too_large",
                    path=where,
                )
            size = len(buf)
        else:
            size = made


def _check_items(chunks: _Chunks, stage: _Stage, data: memoryview, where: str, named: str, at: str) -> None:
    """Refuse variable-length data (numcodecs' ``vlen-*``) stating more items than the chunk holds (each allocated).

    Raises:
        ConversionError: ``too_large``, naming the count; ValueError for data shorter than its count.
    """
    if len(data) < 4:
        raise ValueError("shorter than its count of items")
    items = int.from_bytes(data[:4], "little")
    holds = 1
    for n in chunks.shape:
        holds *= n
    if items > holds:
        raise ConversionError(
            f"{named}: its {stage.name} data{at} states {items} items, more than the {holds} a chunk of "
            f"{list(chunks.shape)} holds (each is allocated before it is read): refused before decoding",
            kind="too_large",
            path=where,
        )


_SHARD_EMPTY = 2**64 - 1  # a shard index's offset and length of a chunk not written


def _shard_entries(shard: _Shard, data: memoryview, where: str, key: str) -> np.ndarray:
    """A shard's index, ``[count, 2]`` uint64 (offset, length), from the shard's bytes (or the index's alone).

    Raises:
        ConversionError: ``too_large`` for index codecs not read here, ``unreadable_file`` for data
            shorter than the index.
    """
    if not shard.index:
        raise ConversionError(
            f"{key!r}: its shard index has codecs other than bytes and crc32c: its chunks cannot be bounded "
            "before they are decoded: refused before decoding",
            kind="too_large",
            path=where,
        )
    if len(data) < shard.index:
        raise ConversionError(
            f"{key!r}: {len(data)} bytes, shorter than its shard index ({shard.index} bytes)",
            kind="unreadable_file",
            path=where,
        )
    raw = data[len(data) - shard.index :] if shard.at_end else data[: shard.index]
    return np.frombuffer(raw, dtype=f"{shard.order}u8", count=2 * shard.count).reshape(-1, 2)


def _check_shard(chunks: _Chunks, data: memoryview, where: str, key: str) -> None:
    """Check each chunk of a whole shard (``_check_decoded`` with the shard's inner chunk) before zarr decodes any.

    Raises:
        ConversionError: as ``_check_decoded`` for a chunk; ``unreadable_file`` for one past the shard's end.
    """
    shard = chunks.shard
    if shard is None:
        return
    for offset, length in _shard_entries(shard, data, where, key).tolist():
        if offset == _SHARD_EMPTY and length == _SHARD_EMPTY:
            continue
        if offset + length > len(data):
            raise ConversionError(
                f"{key!r}: its shard index puts a chunk at bytes {offset}..{offset + length - 1}, past the shard's "
                f"{len(data)} bytes",
                kind="unreadable_file",
                path=where,
            )
        inner = data[offset : offset + length]
        _check_decoded(shard.inner, inner, where, key, f" (its chunk at bytes {offset}..{offset + length - 1})")


def _check_shard_part(chunks: _Chunks, byte_range, data: memoryview, where: str, key: str) -> None:
    """Check a range read of a shard (zarr reads a shard's index, then the chunks it needs, by ranges).

    A suffix range, or bytes ``0..index - 1`` of a shard indexed at its start, is the index: a chunk
    there (its bytes would be the index's, never checked as a chunk) is refused; any other range is
    one chunk, checked as ``_check_decoded`` checks the shard's inner chunk.

    Raises:
        ConversionError: as ``_check_decoded``; ``unreadable_file`` for a chunk indexed over the index.
    """
    shard = chunks.shard
    if shard is None or not hasattr(byte_range, "end"):
        return  # a suffix: the index at the end of the shard (its size checked by _check_range)
    start, end = int(byte_range.start), int(byte_range.end)
    if not shard.at_end and start == 0 and end == shard.index:
        entries = _shard_entries(shard, data, where, key)
        written = entries[~((entries[:, 0] == _SHARD_EMPTY) & (entries[:, 1] == _SHARD_EMPTY))]
        if written.size and int(written[:, 0].min()) < shard.index:
            raise ConversionError(
                f"{key!r}: its shard index puts a chunk inside the index itself (bytes 0..{shard.index - 1})",
                kind="unreadable_file",
                path=where,
            )
        return
    _check_decoded(shard.inner, data, where, key, f" (its chunk at bytes {start}..{end - 1})")


_READ_ONLY = "a source store is read-only: writing or deleting is refused"


def _check_range(byte_range, got: int, where: str, key: str) -> None:
    """Refuse more bytes than a range read asked for (a Zarr 3 shard's index or chunk).

    A server that ignores ``Range`` (or a suffix range, ``bytes=-N``) answers with the whole
    file: read as the shard's index or one chunk it would be garbage, or wrong values.

    Raises:
        ConversionError(kind="unreadable_file"): naming the key, the range and the size received.
    """
    if hasattr(byte_range, "suffix"):
        asked, what = int(byte_range.suffix), f"its last {byte_range.suffix} bytes"
    elif hasattr(byte_range, "end"):
        asked, what = int(byte_range.end) - int(byte_range.start), f"bytes {byte_range.start}..{byte_range.end - 1}"
    else:
        return  # from an offset to the end: how many is not known here
    if got > asked:
        raise ConversionError(
            f"{key!r}: asked for {what}, got {got} bytes: the store does not honour range requests "
            "(a Zarr 3 shard is read by ranges); refused rather than read from the wrong bytes",
            kind="unreadable_file",
            path=where,
        )


@functools.cache
def _guarded_store_class():
    """``_Guarded``, defined once zarr is imported (zarr is an optional extra)."""
    from zarr.abc.store import Store

    class _Guarded(Store):
        """A zarr store whose reads are checked before anything is decoded or allocated.

        A metadata document (``.zarray``, ``zarr.json``, ...): at most ``untrusted.MAX_JSON_BYTES``
        bytes and ``untrusted.MAX_JSON_DEPTH`` levels (``untrusted.loads``) before zarr parses it. A
        chunk of an array in ``arrays`` (its ``_Chunks``): its stored size (a local file's ``stat``, a
        zip member's central directory; a URL's bytes once fetched) and what each stage of its
        decoding makes (``_check_decoded``), refused above what the chunk can need; a range of a
        shard (its index, one of its chunks) as ``_check_shard_part``. A local file is read only
        when it is a regular file (the store was walked at open: ``_check_local_store``).

        It implements ``Store``'s public API over ``wrapped`` (an opened zarr store), not
        ``WrapperStore``'s: zarr's own helpers (``_get_many``, ``_get_bytes``, ``_get_json``,
        ``getsize``, ...) are ``Store``'s, written over ``self.get``, so no read reaches ``wrapped``
        but through ``get`` and ``get_partial_values`` (the listing and ``exists`` read no value).
        Read-only: every write or delete is refused.
        """

        def __init__(
            self,
            store: Store,
            root: str = "",
            folder: str | None = None,
            sizes: dict | None = None,
            arrays: dict[str, _Chunks] | None = None,
        ) -> None:
            super().__init__(read_only=True)
            self.wrapped = store
            self.root, self.folder, self.sizes = root, folder, sizes
            self.arrays: dict[str, _Chunks] = {} if arrays is None else arrays

        def with_read_only(self, read_only: bool = False) -> Store:
            if not read_only:
                raise ValueError(f"{self.root}: {_READ_ONLY}")
            return type(self)(self.wrapped, self.root, self.folder, self.sizes, self.arrays)

        def __eq__(self, value: object) -> bool:
            return type(self) is type(value) and self.wrapped == value.wrapped

        __hash__ = None  # type: ignore[assignment]  # equal by the store it wraps, as zarr's stores are

        def __str__(self) -> str:
            return f"wrapping-{self.wrapped}"

        def __repr__(self) -> str:
            return f"_Guarded({type(self.wrapped).__name__}, '{self.wrapped}')"

        def close(self) -> None:
            super().close()
            self.wrapped.close()

        # ------------------------------------------------------------ writes: refused

        @property
        def supports_writes(self) -> bool:
            return False

        @property
        def supports_deletes(self) -> bool:
            return False

        async def set(self, key, value) -> None:
            raise ValueError(f"{self.root}: {_READ_ONLY} ({key})")

        async def set_if_not_exists(self, key, value) -> None:
            raise ValueError(f"{self.root}: {_READ_ONLY} ({key})")

        async def delete(self, key) -> None:
            raise ValueError(f"{self.root}: {_READ_ONLY} ({key})")

        async def delete_dir(self, prefix) -> None:
            raise ValueError(f"{self.root}: {_READ_ONLY} ({prefix})")

        async def clear(self) -> None:
            raise ValueError(f"{self.root}: {_READ_ONLY}")

        # ------------------------------------------------------------ listing: the wrapped store's

        @property
        def supports_listing(self) -> bool:
            return self.wrapped.supports_listing

        async def exists(self, key: str) -> bool:
            return await self.wrapped.exists(key)

        def list(self):
            return self.wrapped.list()

        def list_prefix(self, prefix: str):
            return self.wrapped.list_prefix(prefix)

        def list_dir(self, prefix: str):
            return self.wrapped.list_dir(prefix)

        # ------------------------------------------------------------ reads: checked

        def _array(self, key: str) -> _Chunks | None:
            parts = key.split("/")
            for n in range(1, len(parts)):
                found = self.arrays.get("/".join(parts[:n]))
                if found is not None:
                    return found
            return None

        def _stored_size(self, key: str) -> tuple[int | None, str]:
            if self.sizes is not None:
                return self.sizes.get(key), "its size in the zip's central directory"
            if self.folder is not None:
                path = os.path.join(self.folder, key)
                try:
                    st = os.stat(path)
                except OSError:
                    return None, ""
                if not stat.S_ISREG(st.st_mode):
                    bounds.check_local_file(path, f"{path} (Zarr key {key})", ConversionError)
                return st.st_size, "the file's size"
            return None, ""

        async def get(self, key, prototype, byte_range=None):
            where = self.root
            if key.rsplit("/", 1)[-1] in _METADATA:
                size, how = self._stored_size(key)
                untrusted.check_size(size, f"{where}: {key}", SourceError, untrusted.MAX_JSON_BYTES)
                buf = await self.wrapped.get(key, prototype, byte_range)
                if buf is not None:
                    untrusted.loads(buf.to_bytes(), f"{where}: {key}", SourceError, max_bytes=untrusted.MAX_JSON_BYTES)
                return buf
            chunks = self._array(key)
            limit = chunks.stored if chunks is not None else bounds.MAX_ARRAY_BYTES
            size, how = self._stored_size(key)
            if size is not None and size > limit:
                raise ConversionError(
                    f"{key!r}: {size} bytes stored ({how}), more than the {limit} bytes "
                    + (
                        f"a chunk of {list(chunks.shape)} x {chunks.itemsize} bytes can take once encoded"
                        if chunks is not None
                        else "a member may have"
                    )
                    + ": refused before reading or inflating it",
                    kind="too_large",
                    path=where,
                )
            buf = await self.wrapped.get(key, prototype, byte_range)
            if buf is not None and byte_range is not None:
                _check_range(byte_range, len(buf), where, key)
                if chunks is not None and chunks.shard is not None:
                    _check_shard_part(chunks, byte_range, buf.as_numpy_array().data.cast("B"), where, key)
            if buf is not None and chunks is not None and byte_range is None:
                data = buf.as_numpy_array().data.cast("B")
                if len(data) > chunks.stored:
                    raise ConversionError(
                        f"{key!r}: {len(data)} bytes, more than the {chunks.stored} its chunk can take once encoded",
                        kind="too_large",
                        path=where,
                    )
                _check_decoded(chunks, data, where, key)
            return buf

        async def get_partial_values(self, prototype, key_ranges):
            return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    return _Guarded


_OPEN_STORES = 4  # groups one process keeps open (the stores it read last)
_opened: dict[tuple, Any] = {}  # (root, storage options, stamp) -> the group this process opened
_inherited: list = []  # groups a forked child got from its parent: kept, never read (see _forget_after_fork)


def _open(store: _Store) -> Any:
    """The root group, read-only, over a ``_Guarded`` store: opened once per process, store and stamp.

    Each process opens its own: a forked conversion worker never reads through the group (a
    ``.zarr.zip``'s file handle, whose offset parent and children would share; an fsspec
    session) its parent opened (``_forget_after_fork``). A local store rewritten since (its
    ``_stamp`` changed) is opened anew, never read through a zip's old central directory.

    Raises:
        SourceError: not a readable Zarr group, or a metadata document refused, naming the store.
    """
    key = (store.root, json.dumps(store.storage_options, sort_keys=True, default=str), _stamp(store.root))
    group = _opened.get(key)
    if group is None:
        group = _open_group(store.root, key[1])
        while len(_opened) >= _OPEN_STORES:  # the oldest is let go (closed once nothing reads through it)
            _opened.pop(next(iter(_opened)))
        _opened[key] = group
    return group


def _stamp(root: str) -> tuple[int, ...]:
    """A local store's identity now: its file's or folder's inode, size and modification time (() for a URL)."""
    if not is_local(root):
        return ()
    try:
        st = os.stat(local_path(root))
    except OSError:
        return ()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _forget_after_fork() -> None:
    """In a forked child: open every store anew. The parent's groups are kept referenced, never used or closed.

    Closing them would run their finalizers against the parent's event loops and sessions, which
    the child does not have; reading through them would share the parent's file offsets.
    """
    _inherited.extend(_opened.values())
    _opened.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _open_group(root: str, options_json: str) -> Any:
    zarr = require("zarr")
    from zarr.core.sync import sync

    guarded = _guarded_store_class()
    try:  # the wrapped store is opened here (``_Guarded`` opens only itself)
        if is_local(root) and root.endswith(".zip"):
            path = local_path(root)
            sizes = _check_zip(path)
            inner = sync(zarr.storage.ZipStore.open(path, mode="r"))
            store = guarded(inner, root, sizes=sizes)
        elif is_local(root):
            path = local_path(root)
            store = guarded(sync(zarr.storage.LocalStore.open(path, read_only=True)), root, folder=path)
        elif root.endswith(".zip"):
            raise SourceError(
                f"{root}: a .zarr.zip is read from a local file (its members by the central directory); "
                "copy it here first, or give the URL of the unzipped .zarr folder"
            )
        else:  # an FsspecStore opens itself on its first read
            options = Location.of(root, json.loads(options_json)).options  # the fsspec client's options
            inner = zarr.storage.FsspecStore.from_url(root, storage_options=options, read_only=True)
            store = guarded(inner, root)
        # Each array's own metadata document, never consolidated metadata (.zmetadata, or zarr.json's
        # consolidated_metadata): a ReplayBuffer grown after it was consolidated (add_episode resizes
        # data/* and meta/episode_ends) would read as its older, shorter self.
        group = zarr.open_group(store, mode="r", use_consolidated=False)
        if _detect(group):  # the arrays read: their chunks' bounds, known before a chunk is read
            for key in [*(f"data/{k}" for k in _children(group, "data")), "meta/episode_ends"]:
                try:
                    array = _node(group, key)
                except Exception:  # a codec not installed, damaged metadata: refused by name when described
                    continue
                if isinstance(array, zarr.Array):
                    store.arrays[array.path] = _Chunks.of(array)
        return group
    except (SourceError, ConversionError) as exc:
        text = exc.detail if isinstance(exc, ConversionError) else str(exc)
        raise SourceError(text if text.startswith(root) else f"{root}: {text}") from None
    except Exception as exc:  # zarr's own errors (GroupNotFoundError, ...) have no common base across versions
        raise SourceError(f"{root}: not a readable Zarr group ({_short(exc)})") from exc


def _node(group, key: str) -> Any:
    """``group[key]``; a codec of ``imagecodecs`` (UMI's JPEG-XL cameras) is registered first when installed.

    UMI writes its cameras with ``imagecodecs_jpegxl``, which numcodecs knows only once
    ``imagecodecs.numcodecs.register_codecs()`` ran in this process; it is run here (once per
    process, conversion workers included) when the package is installed. Otherwise zarr's
    ``UnknownCodecError`` names the codec (``_describe`` refuses the source with it).
    """
    try:
        return group[key]
    except ValueError as exc:  # numcodecs' UnknownCodecError is a ValueError
        if "imagecodecs_" not in str(exc) or not _image_codecs():
            raise
    return group[key]


@functools.cache
def _image_codecs() -> bool:
    """Register ``imagecodecs``' numcodecs codecs in this process; False when the package is not installed."""
    try:
        module = importlib.import_module("imagecodecs.numcodecs")
    except ImportError:
        return False
    module.register_codecs(verbose=False)
    return True


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:500] + "..."


def _in_worker(store: _Store) -> Any:
    """``_open`` for a worker reading an episode: a refusal is the episode's ``unreadable_file`` error."""
    try:
        return _open(store)
    except SourceError as exc:
        raise ConversionError(str(exc), kind="unreadable_file", path=store.root) from None


def _array(group, key: str, root: str):
    with bounds.reading(root, f"data/{key}"):
        try:
            return _node(group["data"], key)
        except KeyError:
            raise ConversionError(f"no array data/{key}", kind="missing_key", path=root) from None


def _checked(group, key: str, start: int, stop: int, root: str, frames: bool = False):
    """``data/<key>``, once the rows ``[start, stop)`` of it are known to fit the bounds (nothing read).

    Raises:
        ConversionError: ``too_large`` (more than ``bounds.MAX_ROWS`` rows, more than
            ``bounds.MAX_ARRAY_BYTES`` for the rows, a chunk above ``bounds.MAX_ARRAY_BYTES``: zarr
            decodes a whole chunk to read one row; a camera frame above ``bounds.MAX_FRAME_BYTES``),
            ``length_mismatch`` (the array ends before ``stop``), ``missing_key``; naming file and key.
    """
    name = f"data/{key}"
    array = _array(group, key, root)
    itemsize = np.dtype(array.dtype).itemsize
    bounds.check_count("rows", stop - start, bounds.MAX_ROWS, root, name)
    unit = tuple(int(n) for n in (getattr(array, "shards", None) or array.chunks))
    chunk_bytes = itemsize * int(np.prod(unit, dtype=object))
    if chunk_bytes > bounds.MAX_ARRAY_BYTES:
        raise bounds.too_large(
            f"a chunk (read whole to read any of its rows) of {list(unit)} x {itemsize} bytes =",
            chunk_bytes,
            bounds.MAX_ARRAY_BYTES,
            root,
            name,
        )
    if frames:
        frame = itemsize * int(np.prod(array.shape[1:], dtype=object))
        if frame > bounds.MAX_FRAME_BYTES:
            what = f"a frame of {list(array.shape[1:])} x {itemsize} bytes ="
            raise bounds.too_large(what, frame, bounds.MAX_FRAME_BYTES, root, name)
    else:
        bounds.check_bytes((stop - start, *array.shape[1:]), itemsize, root, name)
    if array.shape[0] < stop:
        raise ConversionError(
            f"data/{key} has {array.shape[0]} rows, meta/episode_ends needs {stop}", kind="length_mismatch", path=root
        )
    return array


def _read(array, key: str, start: int, stop: int, root: str) -> np.ndarray:
    """Rows ``[start, stop)``, in this machine's byte order; a zarr or codec failure is ``unreadable_file``.

    Zarr format 2 keeps an array's byte order (``>f4``): its values are returned the same, as
    native numbers (Arrow and the video encoders take no other). A chunk refused by ``_Guarded``
    keeps its kind (``too_large``, ``unreadable_file``), its message led by the key and rows.
    """
    rows = f"data/{key} rows {start}..{stop - 1}"
    with bounds.reading(root, rows):
        try:
            values = np.asarray(array[start:stop])
        except ConversionError as exc:
            raise ConversionError(f"{rows}: {exc.detail}", kind=exc.kind, path=exc.path or root) from None
        return values if values.dtype.isnative else values.astype(values.dtype.newbyteorder("="))


def _rows(group, key: str, start: int, stop: int, root: str) -> np.ndarray:
    """A kept column's rows ``[start, stop)``; a column of one bytes value per row must be UTF-8 text.

    Raises:
        ConversionError: as ``_checked`` and ``_read``; ``bad_feature`` for such bytes that are not
            UTF-8 (the column is written as text), naming the key and the row.
    """
    values = _read(_checked(group, key, start, stop, root), key, start, stop, root)
    if values.dtype.kind == "S" and values.ndim == 1:
        for row, value in enumerate(values.tolist()):
            try:
                value.decode()
            except UnicodeDecodeError:
                raise ConversionError(
                    f"data/{key} row {start + row} holds {value[:16]!r}, not UTF-8 text (a column of one bytes "
                    "value per row is written as text); see --mapping to leave it out",
                    kind="bad_feature",
                    path=root,
                    row=row,
                ) from None
    return values


@dataclass(frozen=True)
class _ZarrTable(LazyTable):
    """One episode's rows ``[start, stop)`` of the ReplayBuffer's state, action and kept arrays."""

    store: _Store
    start: int
    stop: int
    state: tuple[str, ...]
    action: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    fps: float

    def load(self) -> LoadedTable:
        """The rows.

        Raises:
            ConversionError: ``missing_key``, ``length_mismatch``, ``too_large`` (rows, bytes or a
                chunk past ``bounds``; refused before reading), ``unreadable_file`` (a zarr or codec
                failure, a chunk refused by ``_Guarded``), naming store and key.
        """
        group = _in_worker(self.store)
        root = self.store.root
        columns: dict[str, np.ndarray] = {}
        keys: dict[str, str] = {}
        for name, parts in (("observation.state", self.state), ("action", self.action)):
            if parts:
                arrays = [_checked(group, k, self.start, self.stop, root) for k in parts]  # all before any read
                rows = [_read(a, k, self.start, self.stop, root) for a, k in zip(arrays, parts, strict=True)]
                columns[name] = concat(rows, parts, root)
                keys[name] = " + ".join(f"data/{k}" for k in parts)
        for name, key in self.columns:
            columns[name], keys[name] = _rows(group, key, self.start, self.stop, root), f"data/{key}"
        return LoadedTable(build_table(columns, self.fps, root, keys), [])

    @property
    def path(self) -> str:
        """The Zarr store."""
        return str(self.store.root)

    def fingerprint(self) -> list:
        """Store, rows and keys."""
        return [self.store.root, self.start, self.stop, self.state, self.action, self.columns, self.fps]

    def estimated_bytes(self) -> int:
        """About 64 bytes per row."""
        return 64 * (self.stop - self.start)


@dataclass(frozen=True)
class _ZarrFrames(FrameReader):
    """One camera's frames: rows ``[start, stop)`` of ``data/<key>``, uint8 ``[n, H, W, 3]`` or uint16 ``[n, H, W]``."""

    store: _Store
    key: str
    start: int
    stop: int
    estimate: int = 0

    def chunks(self) -> Iterator[np.ndarray | list[bytes]]:
        """``_CHUNK_FRAMES`` frames at a time (each at most ``bounds.MAX_FRAME_BYTES``).

        uint8 ``[n, H, W, 1]`` is given as grey ``[n, H, W]`` (encoded as R = G = B, exact).

        Raises:
            ConversionError: as ``_ZarrTable.load``, with the row of the first frame not read.
        """
        group = _in_worker(self.store)
        array = _checked(group, self.key, self.start, self.stop, self.store.root, frames=True)
        for a in range(self.start, self.stop, _CHUNK_FRAMES):
            try:
                frames = _read(array, self.key, a, min(a + _CHUNK_FRAMES, self.stop), self.store.root)
            except ConversionError as exc:
                raise exc.with_context(row=a - self.start) from None
            yield frames[..., 0] if frames.ndim == 4 and frames.shape[-1] == 1 else frames

    def fingerprint(self) -> list:
        """Store, key, rows."""
        return [self.store.root, self.key, self.start, self.stop]

    def estimated_bytes(self) -> int:
        """Raw bytes of the frames over 4 (a guess at lossless H.264 on camera frames)."""
        return self.estimate


# Columns epishard writes itself, or that its stream reader puts in a sample: a ``data/`` array of
# one of these names is kept as ``data.<name>`` (``_columns``). DP's real-robot buffers hold
# ``data/timestamp`` (wall-clock seconds); read as ``timestamp`` it would replace the row clock, and
# a ``frame_index`` would pick the camera frame of each row.
_OWN_COLUMNS = frozenset(
    {"frame_index", "timestamp", "episode_index", "index", "task_index", "task", "dataset", "substitute"}
    | {"observation.state", "action"}
)


def _columns(
    arrays: dict[str, tuple[tuple[int, ...], Any]],
    mapping: Mapping,
    cams: dict[str, str],
    used: set[str],
    root: str,
    notes: list[str],
) -> list[tuple[str, str]]:
    """The columns kept (output name, ``data/`` key): the mapping's, then every other per-step array.

    An array not mapped is kept under its own name, or ``data.<key>`` when that name is one
    epishard writes itself (``_OWN_COLUMNS``, a camera's or a mapped column's name); not kept, and
    named in ``notes``: cameras not mapped, scalars (no row axis), and values Arrow cannot hold
    (complex numbers, compound records).

    Raises:
        SourceError: a mapped column that is not an array of ``data/``, a scalar, of values Arrow
            cannot hold, or named as one of epishard's own columns.
    """
    mapped = dict(mapping.columns or {})
    taken = set(_OWN_COLUMNS) | set(cams) | set(mapped)
    for name, key in mapped.items():
        why = _unkept(*arrays[key]) if key in arrays else f"no array data/{key}"
        if name in _OWN_COLUMNS or name in cams:
            why = f"{name} is a column epishard writes itself"
        if why:
            raise SourceError(f"{root}: mapping column {name} <- data/{key}: {why}; see --mapping")
    columns = list(mapped.items())
    for key in sorted(set(arrays) - used):
        shape, dtype = arrays[key]
        why = "others = false" if not mapping.others else _unkept(shape, dtype)
        why = why or ("a camera not mapped" if _is_camera(shape, dtype) else "")
        if why:
            notes.append(f"data/{key} {list(shape)} {np.dtype(dtype)} is not kept ({why})")
        elif key in taken or key.startswith(("observation.images.", "__")):
            columns.append((f"data.{key}", key))
            notes.append(f"data/{key} is kept as the column data.{key} ({key} is a column epishard writes itself)")
        else:
            columns.append((key, key))
    return columns


def _unkept(shape: tuple[int, ...], dtype) -> str:
    """Why an array cannot be a column ('' when it can): a scalar, or values Arrow has no type for."""
    dt = np.dtype(dtype)
    base = dt.subdtype[0] if dt.subdtype is not None else dt
    if not shape:
        return "a scalar, not rows"
    if base.kind in "cV" or base.fields is not None:
        return f"{dt}: no Arrow type holds it"
    return ""


def _is_camera(shape: tuple[int, ...], dtype) -> bool:
    return len(shape) == 4 and shape[-1] in (1, 3, 4) and np.dtype(dtype) == np.uint8


def _default(arrays: dict[str, tuple[tuple[int, ...], Any]]) -> Mapping:
    cameras = {}
    for key, (shape, dtype) in sorted(arrays.items()):
        if _is_camera(shape, dtype):
            cameras[f"observation.images.{key.removesuffix('_rgb')}"] = key
    state: list[str] = []
    robots = sorted({k.split("_")[0] for k in arrays if k.startswith("robot") and k.split("_")[0][5:].isdigit()})
    for robot in robots:
        state += [
            k for k in (f"{robot}_eef_pos", f"{robot}_eef_rot_axis_angle", f"{robot}_gripper_width") if k in arrays
        ]
    if not state and "state" in arrays:
        state = ["state"]
    action = ("action",) if "action" in arrays else ()
    return Mapping(
        state=tuple(state), action=action, cameras=cameras, depth=(), columns={}, others=True, fps=_DEFAULT_FPS
    )


def _detect(group) -> bool:
    """A ReplayBuffer: a ``data`` group and ``meta/episode_ends``."""
    try:
        return "data" in group and "episode_ends" in group["meta"]
    except KeyError:
        return False


def _children(group, path: str) -> list[str]:
    """The names under ``path`` in the store, sorted, read from its listing (no member's metadata parsed)."""
    from zarr.core.sync import sync

    async def names() -> list[str]:
        return [n async for n in group.store.list_dir(path)]

    # an fsspec listing over HTTP names folders with a trailing slash (``state/``)
    return sorted({n.rstrip("/") for n in sync(names())} - {"", *_METADATA})


def _has_chunk(group, path: str) -> bool:
    """Whether the store holds at least one chunk of the array at ``path`` (a listing; nothing is read)."""
    from zarr.core.sync import sync

    async def first() -> bool:
        async with contextlib.aclosing(group.store.list_prefix(path + "/")) as keys:
            async for key in keys:
                if key.rsplit("/", 1)[-1] not in _METADATA:
                    return True
        return False

    return sync(first())


def _fill_only(group, array, root: str, key: str) -> None:
    """Refuse an array that declares rows but has no chunk written: zarr would read its fill value for each row.

    Raises:
        SourceError: naming the store, the key and the fill value.
    """
    if array.shape and array.shape[0] > 0 and not _has_chunk(group, array.path):
        raise SourceError(
            f"{root}: {key} declares {array.shape[0]} rows but has no chunk written: every row would read as its "
            f"fill value ({getattr(array.fill_value, 'item', lambda: array.fill_value)()!r}); refused rather than "
            "converted as that"
        )


@dataclass
class _Ends:
    """The episodes of ``meta/episode_ends`` that hold rows: their indices, first rows and ends (int64)."""

    index: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    empty: int


def _episode_ends(group, root: str, longest: int) -> _Ends:
    """``meta/episode_ends`` read ``_ENDS_STEP`` entries at a time: episodes of zero rows counted, not kept.

    ``longest``: the rows of the longest array of ``data/``.

    Raises:
        SourceError: not a 1-D integer array, more than ``bounds.MAX_EPISODES`` entries, no chunk
            written, a chunk above ``bounds.MAX_ARRAY_BYTES``, or an entry negative, decreasing or past
            the end of every array of ``data/``: naming the store and the position.
    """
    name = "meta/episode_ends"
    array = group["meta"]["episode_ends"]
    dtype = np.dtype(array.dtype)
    if len(array.shape) != 1 or dtype.kind not in "iu":
        raise SourceError(f"{root}: {name} is {dtype} {list(array.shape)}; a ReplayBuffer's is a 1-D integer array")
    count = int(array.shape[0])
    if count > bounds.MAX_EPISODES:
        raise SourceError(
            f"{root}: {name} lists {count:g} episodes, more than the {bounds.MAX_EPISODES:g} a source may list "
            "(bounds.MAX_EPISODES): refused before reading it"
        )
    chunk = dtype.itemsize * int(np.prod(array.chunks, dtype=object))
    if chunk > bounds.MAX_ARRAY_BYTES:
        raise SourceError(f"{root}: {name} has chunks of {list(array.chunks)} entries ({chunk} bytes): refused")
    _fill_only(group, array, root, name)
    index, start, stop = [], [], []
    empty, previous = 0, 0
    for a in range(0, count, _ENDS_STEP):
        part = np.asarray(array[a : a + _ENDS_STEP])
        if dtype.kind == "u" and part.size and int(part.max()) > np.iinfo(np.int64).max:
            raise SourceError(f"{root}: {name}[{a + int(np.argmax(part))}] = {int(part.max())} is past any array's end")
        part = part.astype(np.int64)
        before = np.concatenate([[previous], part[:-1]]).astype(np.int64)
        bad = np.flatnonzero(part < before)
        if bad.size:
            at = int(bad[0])
            what = "negative" if part[at] < 0 else f"less than the entry before it ({int(before[at])})"
            raise SourceError(
                f"{root}: {name}[{a + at}] = {int(part[at])} is {what}: episode ends must increase (or repeat)"
            )
        if part.size and part[-1] > longest:
            at = int(np.flatnonzero(part > longest)[0])
            raise SourceError(
                f"{root}: {name}[{a + at}] = {int(part[at])} is past the end of every array of data/ "
                f"(the longest has {longest} rows)"
            )
        held = np.flatnonzero(part > before)
        empty += int(part.size - held.size)
        index.append(held + a)
        start.append(before[held])
        stop.append(part[held])
        previous = int(part[-1]) if part.size else previous
    join = (lambda parts: np.concatenate(parts)) if index else (lambda parts: np.zeros(0, np.int64))
    return _Ends(join(index), join(start), join(stop), empty)


def open_replay_buffer(
    root: str,
    options: SourceOptions,
    cameras: tuple[str, ...] | None,
    storage_options: dict | None,
    episodes: frozenset[int] | None,
) -> Source:
    """Describe a ReplayBuffer: reads ``meta/episode_ends`` and the arrays' metadata (no rows).

    A local store is walked once first (``_check_local_store``: links out of it, special files), a
    ``.zarr.zip``'s central directory checked (``_check_zip``); every read after goes through
    ``_Guarded``. Episodes of zero rows are left out and counted in the notes (their indices stay
    the others').

    Raises:
        SourceError: not a Zarr group, no ``data`` or ``meta/episode_ends``, a path out of the
            store (unless ``options.allow_external``) or to a special file, ``episode_ends``
            refused (``_episode_ends``), a mapped key that is not an array of ``data`` or that has
            no chunk written; any zarr failure, naming the store.
        ConversionError: ``bad_feature``, a mapped state, action or camera array that does not
            hold numbers (text, bytes, objects), naming store and key.
    """
    store = _Store(root.rstrip("/"), dict(storage_options or {}))
    if is_local(store.root) and not store.root.endswith(".zip"):
        path = local_path(store.root)
        if not os.path.isdir(path):
            raise SourceError(f"{root}: no such Zarr folder")
        _check_local_store(path, options.allow_external)
    try:
        return _describe(store, options, cameras, episodes)
    except (SourceError, ConversionError):
        raise
    except Exception as exc:  # zarr's errors for a damaged store (a member's metadata, a chunk of episode_ends)
        raise SourceError(f"{store.root}: cannot read the Zarr store ({_short(exc)})") from exc


def _describe(
    store: _Store, options: SourceOptions, cameras: tuple[str, ...] | None, episodes: frozenset[int] | None
) -> Source:
    root = store.root
    group = _open(store)
    try:
        if not _detect(group):
            raise SourceError(f"{root}: not a ReplayBuffer (needs a data group and meta/episode_ends)")
        data = group["data"]
        members = {}
        for key in _children(group, "data"):
            try:
                member = _node(data, key)
            except KeyError:  # a file or folder that is no Zarr node: not part of the ReplayBuffer
                continue
            except Exception as exc:  # UnknownCodecError (a codec not installed), bad metadata
                hint = (
                    "; UMI's JPEG-XL cameras need the package imagecodecs (pip install imagecodecs)"
                    if "imagecodecs_" in str(exc)
                    else ""
                )
                raise SourceError(f"{root}: data/{key} cannot be opened ({_short(exc)}){hint}") from None
            if hasattr(member, "chunks"):  # an array (a group inside data/ is not read)
                members[key] = member
        if not members:
            raise SourceError(f"{root}: data/ holds no array (a ReplayBuffer keeps its per-step arrays there)")
        arrays = {k: (tuple(a.shape), a.dtype) for k, a in members.items()}
        longest = max((s[0] for s, _ in arrays.values() if s), default=0)
        ends = _episode_ends(group, root, longest)
    except ConversionError as exc:  # refused by _Guarded while the store is described
        raise SourceError(f"{root}: {exc.detail}") from None
    last = int(ends.stop[-1]) if ends.stop.size else 0
    short = {k: s[0] for k, (s, _) in arrays.items() if s and s[0] < last}
    mapping = options.resolved(_default(arrays))
    if mapping.streams:
        raise SourceError(
            f"{root}: the mapping's streams: a replay buffer's arrays share one clock, so there is no stream at its "
            "own rate to keep (MCAP and HDF5 sources read streams); map the array as a column"
        )
    for key in [*(mapping.state or ()), *(mapping.action or ()), *(mapping.cameras or {}).values()]:
        if key not in arrays:
            raise SourceError(f"{root}: no array data/{key} (arrays: {', '.join(arrays) or 'none'}); see --mapping")
    used = set(mapping.state or ()) | set(mapping.action or ()) | set((mapping.cameras or {}).values())
    used |= set((mapping.columns or {}).values())
    cams = kept_cameras(mapping.cameras, cameras, str(root))
    for key in [*(mapping.state or ()), *(mapping.action or ()), *cams.values()]:
        bounds.check_numeric(arrays[key][1], root, f"data/{key}")
        if not arrays[key][0]:
            raise SourceError(f"{root}: data/{key} is a scalar, not rows (one per step); see --mapping")
        _fill_only(group, members[key], root, f"data/{key}")
    notes = [f"{k}: {n} rows, meta/episode_ends says {last}; episodes past it fail" for k, n in short.items()]
    if ends.empty:
        notes.append(
            f"{ends.empty} episodes of zero rows in meta/episode_ends left out (the others keep their indices)"
        )
    columns = _columns(arrays, mapping, cams, used, root, notes)
    if not mapping.action:
        notes.append("no action array mapped: the shards have no action column (UMI derives actions from poses)")
    fps = float(mapping.fps or _DEFAULT_FPS)
    notes.insert(
        0,
        f"umi mapping: state = {' + '.join(mapping.state or ()) or 'none'}, action = "
        f"{' + '.join(mapping.action or ()) or 'none'}, cameras = "
        + (", ".join(f"{c} <- {k}" for c, k in cams.items()) or "none")
        + f", {fps:g} fps",
    )
    name = root.rstrip("/").rsplit("/", 1)[-1].removesuffix(".zip").removesuffix(".zarr") or "zarr"
    chosen = np.arange(ends.index.size)
    if episodes is not None:
        chosen = np.flatnonzero(np.isin(ends.index, np.fromiter(episodes, np.int64, len(episodes))))
    out = []
    for at in chosen.tolist():
        index, start, stop = int(ends.index[at]), int(ends.start[at]), int(ends.stop[at])
        frames = {}
        for cam, key in cams.items():
            shape = arrays[key][0]
            estimate = (stop - start) * int(np.prod(shape[1:], dtype=object)) // 4
            frames[cam] = CameraFrames(
                _ZarrFrames(store, key, start, stop, estimate), depth=cam in (mapping.depth or ())
            )
        table = _ZarrTable(
            store, start, stop, tuple(mapping.state or ()), tuple(mapping.action or ()), tuple(columns), fps
        )
        out.append(
            Episode(
                source=name,
                episode_index=index,
                table=table,
                videos={},
                fps=fps,
                tasks=(mapping.task,) if mapping.task else (),
                robot="umi",
                frames=frames,
            )
        )
    return Source(name=name, episodes=out, fps=fps, path=root, format="umi", notes=notes)
