"""Oracle for the Zarr ReplayBuffer (UMI, Diffusion Policy): epishard's rows and frames against ``ReplayBuffer``.

The oracle is Diffusion Policy's ``ReplayBuffer``, which UMI copies: it is not pip-installable, so
``Oracle`` re-implements the methods its users read episodes with, with zarr directly:

- github.com/real-stanford/diffusion_policy, ``diffusion_policy/common/replay_buffer.py``,
  ``ReplayBuffer.get_episode(idx)``: ``idx = list(range(len(self.episode_ends)))[idx]``; rows
  ``[episode_ends[idx - 1], episode_ends[idx])`` (from 0 for ``idx == 0``) of every array of
  ``data/`` (``get_steps_slice``: ``{key: value[start:stop] for key, value in self.data.items()}``).
- ``ReplayBuffer.__init__`` (same file): every array of ``data/`` must hold ``episode_ends[-1]``
  rows (Diffusion Policy: at least, ``value[:episode_ends[-1]]``; UMI's copy in
  github.com/real-stanford/universal_manipulation_interface, same path: exactly); a store where
  one holds fewer is refused whole (an ``AssertionError``).
- The store is opened as ``zarr.open(path, 'r')`` (``create_from_path``) or, for UMI's
  ``.zarr.zip``, ``zarr.ZipStore(path, mode='r')`` (``diffusion_policy/dataset/umi_dataset.py``):
  zarr-python 2 reads each array's own ``.zarray``; consolidated metadata only through
  ``zarr.open_consolidated``, which neither calls.
- UMI's cameras (``scripts_slam_pipeline/07_generate_replay_buffer.py``): ``camera<i>_rgb`` uint8
  ``[N, H, W, 3]``, chunks ``(1, H, W, 3)``, ``JpegXl(level=99, numthreads=1)`` once
  ``register_codecs()`` ran; low-dimensional arrays uncompressed; written with ``zarr.ZipStore``.

epishard's documented mapping (docs/sources/umi.md) then turns each oracle episode into the expected
table and frames, compared exactly (the bytes of every value, frames bit-exact through the lossless
video) with the converted shards (``sourcecheck.read_back``) and the stream reader. Episodes of zero
rows are left out and counted in the notes; a store with an array cut short is read up to it, the
episodes past it refused (``length_mismatch``, counted under ``on_error="skip"``).

Variations (``variation(index)``, from seeded numpy Generators; each value list is cycled in a
seeded order, so a CI sample covers most of it): Zarr format 2 and 3; every numeric dtype in both
byte orders (Zarr 3: the ``bytes`` codec's ``endian``); blosc with each cname and shuffle, zstd,
zlib, gzip, lz4, bz2, lzma, none, filters (delta, shuffle), crc32c, transpose, numcodecs' Zarr 3
codecs; one chunk, a row per chunk, chunks not aligned with episodes, chunks across columns, Zarr 3
sharding, ``/`` chunk keys, Fortran order; consolidated metadata absent, present, or stale (the
store grown after it was consolidated, as ``add_episode`` does); chunks never written (fill
values); ``.zarr.zip`` stored or deflated; ``memory://`` and a loopback HTTP server; episodes of zero
and one row, rows past the last episode, an array cut short; UMI (one or two robots), Diffusion
Policy and a given mapping (depth, renamed cameras, ``others`` off); keys beyond the mapping (text,
times, names epishard writes itself, complex numbers, scalars); cameras of 1, 3 and 4 channels and
16-bit depth; ``workers`` 1 and 2, and Ray. CI runs ``CI_VARIATIONS``; ``EPISHARD_SWEEP=1`` runs
``SWEEP_VARIATIONS`` and the 20-run concurrency loops.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import http.server
import importlib.util
import json
import multiprocessing
import os
import re
import shutil
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pytest
from conftest import SWEEP
from remote_servers import RangeHandler, serve_http
from sourcecheck import read_back, stream_rows

from epishard.shardwriter import ConversionError, ConvertOptions, SourceError, convert
from epishard.shardwriter.sources import Mapping, SourceOptions, open_source

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")

CI_VARIATIONS = 14
SWEEP_VARIATIONS = 400
LOOPS = 20 if SWEEP else 3
SEED = 20261207
JPEGXL = importlib.util.find_spec("imagecodecs") is not None  # UMI's camera codec, when installed
OWN = ("timestamp", "frame_index", "episode_index", "index")  # epishard's own column names: kept as data.<key>
COUNTED = ("variations", "episodes", "rows", "values", "frames", "stream_frames", "skipped")
TALLY: dict[str, int] = dict.fromkeys(COUNTED, 0)  # what was compared (test_tally prints it)


# ---------------------------------------------------------------- the oracle


class Oracle:
    """Diffusion Policy's ``ReplayBuffer`` over a Zarr group, as its users read it (module docstring).

    ``refused``: the keys whose arrays hold fewer rows than ``episode_ends[-1]`` (``__init__``'s
    assertion refuses such a store). ``scalars``: 0-d arrays of ``data/``, which ``__init__``
    cannot slice (refused too); the episodes are still read from the other keys to compare with.
    """

    def __init__(self, group) -> None:
        self.data = group["data"]
        self.episode_ends = np.asarray(group["meta"]["episode_ends"][:])
        last = int(self.episode_ends[-1]) if len(self.episode_ends) else 0
        arrays = dict(self.data.arrays())
        self.scalars = sorted(k for k, v in arrays.items() if not v.shape)
        self.refused = sorted(k for k, v in arrays.items() if v.shape and v.shape[0] < last)

    @property
    def n_episodes(self) -> int:
        """``ReplayBuffer.n_episodes``."""
        return len(self.episode_ends)

    def get_episode(self, idx: int) -> dict[str, np.ndarray]:
        """``ReplayBuffer.get_episode(idx)``: rows ``[episode_ends[idx-1], episode_ends[idx])`` of every array."""
        idx = list(range(len(self.episode_ends)))[idx]
        start_idx = 0
        if idx > 0:
            start_idx = self.episode_ends[idx - 1]
        end_idx = self.episode_ends[idx]
        return self.get_steps_slice(start_idx, end_idx)

    def get_steps_slice(self, start, stop) -> dict[str, np.ndarray]:
        """``ReplayBuffer.get_steps_slice``: ``value[start:stop]`` of each array (0-d arrays left out)."""
        return {key: np.asarray(value[slice(start, stop)]) for key, value in self.data.arrays() if value.shape}


def open_oracle(path: str) -> Oracle:
    """The oracle over a local folder (``zarr.open(path, 'r')``) or ``.zarr.zip`` (``zarr.ZipStore``)."""
    if JPEGXL:  # UMI's train scripts call register_codecs() at import
        from imagecodecs.numcodecs import register_codecs

        register_codecs(verbose=False)
    if path.endswith(".zip"):
        store = zarr.storage.ZipStore(path, mode="r")
        return Oracle(zarr.open_group(store, mode="r", use_consolidated=False))
    return Oracle(zarr.open_group(path, mode="r", use_consolidated=False))


# ---------------------------------------------------------------- variations


@dataclass(frozen=True)
class Arr:
    """One array of ``data/``: its role in the mapping, dtype, shape after the row axis, codec and chunking."""

    key: str
    role: str  # state, action, camera, depth, column, dropped
    dtype: str
    inner: tuple[int, ...] = ()
    codec: str = "none"
    chunk_rows: int | None = None  # None: one chunk
    split: bool = False  # chunks across the second axis too
    shard_rows: int | None = None  # Zarr 3 sharding
    output: str = ""  # the column or camera it becomes
    values: str = "numbers"  # numbers, text, bytes, times, complex, scalar


@dataclass(frozen=True)
class Variation:
    """One generated ReplayBuffer and how it is converted."""

    index: int
    zarr_format: int
    layout: str  # umi, dp, mapped
    lengths: tuple[int, ...]
    arrays: tuple[Arr, ...]
    trailing: int = 0  # rows past episode_ends[-1]
    consolidated: str = "absent"  # absent, present, stale
    container: str = "folder"  # folder, zip, zip-deflated, memory, http
    separator: str = "."
    order: str = "C"
    ends_dtype: str = "<i8"
    holes: bool = False  # a chunk of a column never written
    short: str | None = None  # a key cut short
    workers: int = 1
    per_shard: int = 2
    mapping: Mapping | None = None

    def describe(self) -> str:
        """One line for a failure message."""
        arrays = ", ".join(f"{a.key}:{a.dtype}:{a.codec}:{a.chunk_rows}/{a.shard_rows}" for a in self.arrays)
        return (
            f"#{self.index} v{self.zarr_format} {self.layout} {self.container} lengths={list(self.lengths)} "
            f"+{self.trailing} consolidated={self.consolidated} sep={self.separator} order={self.order} "
            f"ends={self.ends_dtype} holes={self.holes} short={self.short} workers={self.workers} [{arrays}]"
        )


NUMERIC = [
    "<f4", ">f4", "<f8", ">f8", "<f2", ">f2", "<i8", ">i8", "<i4", ">i4", "<i2", ">i2", "|i1",
    "<u8", ">u8", "<u4", ">u4", "<u2", ">u2", "|u1", "|b1",
]  # fmt: skip
BLOSC_SHUFFLE = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}
CODECS_V2 = [
    "none", "zstd", "zlib", "gzip", "lz4", "bz2", "lzma", "delta+zlib", "shuffle+zstd",
    *(f"blosc-{c}-{s}" for c in ("lz4", "lz4hc", "blosclz", "zstd", "zlib") for s in (0, 1, 2, -1)),
]  # fmt: skip
CODECS_V3 = [
    "none", "zstd", "gzip", "zstd+crc32c", "transpose+zstd", "numcodecs.zlib", "numcodecs.lz4",
    "numcodecs.bz2", "numcodecs.lzma", "numcodecs.zstd",
    *(f"blosc-{c}-{s}" for c in ("lz4", "lz4hc", "blosclz", "zstd", "zlib") for s in (0, 1, 2)),
]  # fmt: skip
CONTAINERS = ["folder", "zip", "zip-deflated", "memory", "http", "folder", "zip"]
CONSOLIDATED = ["absent", "present", "stale"]


def _pick(values: list, index: int, salt: str):
    """``values`` cycled in an order of their own (seeded by ``salt``): ``len(values)`` indices see them all."""
    order = np.random.default_rng([SEED, *salt.encode()]).permutation(len(values))
    return values[int(order[index % len(values)])]


def _lengths(rng: np.random.Generator, index: int) -> tuple[int, ...]:
    count = int(rng.integers(1, 7))
    kind = _pick(["mixed", "zeros", "ones", "long", "one"], index, "lengths")
    if kind == "one":
        return (int(rng.integers(1, 9)),)
    if kind == "zeros":  # zero-row episodes first, in the middle and last
        return (0, *(int(rng.integers(1, 6)) for _ in range(count)), 0, int(rng.integers(1, 4)), 0)
    if kind == "ones":
        return tuple(int(n) for n in rng.choice([1, 1, 2], size=count + 1))
    if kind == "long":
        return tuple(int(n) for n in rng.integers(20, 40, size=2))
    lengths = tuple(int(n) for n in rng.choice([0, 1, 2, 3, 5, 8, 13], size=count + 1))
    return lengths if any(lengths) else (*lengths, 3)


def variation(index: int) -> Variation:
    """The ``index``-th generated ReplayBuffer (deterministic)."""
    rng = np.random.default_rng([SEED, index])
    fmt = _pick([2, 3], index, "format")
    codecs = CODECS_V2 if fmt == 2 else CODECS_V3
    layout = _pick(["umi", "dp", "mapped", "umi"], index, "layout")
    n_arrays = [0]

    def arr(key: str, role: str, dtype: str = "number", inner: tuple[int, ...] = (), **kw) -> Arr:
        at = (index // 2) * 6 + n_arrays[0]  # consecutive within a format: its codecs and dtypes cycle
        n_arrays[0] += 1
        dtype = _pick(NUMERIC, at, "dtype") if dtype == "number" else dtype
        chunking = _pick(["one", "row", "unaligned", "unaligned", "split"], at, "chunks")
        rows = {"one": None, "row": 1}.get(chunking, int(rng.integers(2, 8)))
        shard = None
        if fmt == 3 and rows is not None and rng.random() < 0.35:
            shard = rows * int(rng.integers(2, 4))
        codec = kw.pop("codec", None) or _pick(codecs, at, f"codec{fmt}")
        return Arr(key, role, dtype, inner, codec, rows, chunking == "split" and bool(inner), shard, **kw)

    cams = []
    n_cams = _pick([0, 1, 0, 1, 2], index, "cameras")
    size = (int(rng.integers(4, 12)) * 2, int(rng.integers(4, 12)) * 2 + int(rng.integers(0, 2)))
    arrays: list[Arr] = []
    mapping = None
    if layout == "umi":
        for robot in range(_pick([1, 1, 2], index, "robots")):
            for part, width in (("eef_pos", 3), ("eef_rot_axis_angle", 3), ("gripper_width", 1)):
                arrays.append(arr(f"robot{robot}_{part}", "state", "number", (width,)))
            arrays.append(arr(f"robot{robot}_demo_start_pose", "column", "number", (6,)))
        for c in range(n_cams):
            channels = _pick([3, 3, 1, 4], index + c, "channels")
            jpegxl = rng.random() < 0.5 and JPEGXL and fmt == 2  # the same draws with or without imagecodecs
            cams.append(arr(f"camera{c}_rgb", "camera", "|u1", (*size, channels), codec="jpegxl" if jpegxl else None))
            cams[-1] = _output(cams[-1], f"observation.images.camera{c}")
    elif layout == "dp":
        arrays += [
            arr("state", "state", "number", (5,)),
            arr("action", "action", "number", (2,)),
            arr("keypoint", "column", "number", (9, 2)),
        ]
        if n_cams:
            cams.append(_output(arr("img", "camera", "|u1", (*size, 3)), "observation.images.img"))
    else:
        others = bool(rng.random() < 0.6)
        arrays += [
            arr("joints", "state", "number", (4,)),
            arr("gripper", "state", "number", ()),
            arr("cmd", "action", "number", (3,)),
            _output(arr("aux", "column", "number", (2,)), "observation.aux"),
        ]
        cams.append(_output(arr("cam_a", "camera", "|u1", (*size, 3)), "observation.images.front"))
        depth = _pick(["<u2", ">u2"], index, "depth")
        cams.append(_output(arr("depth", "depth", depth, size), "observation.images.depth"))
        mapping = Mapping(
            state=("joints", "gripper"),
            action=("cmd",),
            cameras={"observation.images.front": "cam_a", "observation.images.depth": "depth"},
            depth=("observation.images.depth",),
            columns={"observation.aux": "aux"},
            others=others,
        )
    extras = _pick(["own", "text", "odd", "none", "numbers"], index, "extras")
    if extras == "own":  # DP's real-robot buffers keep data/timestamp
        for key in rng.choice(OWN, size=2, replace=False):
            arrays.append(_output(arr(str(key), "column", "<f8" if key == "timestamp" else "<i8"), f"data.{key}"))
    elif extras == "text":
        arrays.append(arr("label", "column", "text", (), values="text", codec="zstd" if fmt == 2 else "none"))
        arrays.append(arr("raw", "column", "|S6", (2,), values="bytes", codec="zlib" if fmt == 2 else "none"))
        arrays.append(arr("t_ns", "column", "<M8[ns]", (), values="times"))
        arrays.append(arr("dt_ms", "column", "<m8[ms]", (2,), values="times"))
    elif extras == "odd":  # ReplayBuffer reads these; epishard names them as not kept
        arrays.append(arr("cplx", "dropped", "<c8", (2,), values="complex"))
        arrays.append(arr("scale", "dropped", "<f8", (), values="scalar"))
    elif extras == "numbers":
        arrays.append(arr("stage", "column", "number", ()))
    if mapping is not None and not mapping.others:
        arrays = [a if a.role != "column" or a.key == "aux" else _output(a, "", "dropped") for a in arrays]
    if n_cams > 1 and layout == "umi" and rng.random() < 0.3:  # a camera left out by the mapping is not kept
        mapping = Mapping(cameras={"observation.images.camera0": "camera0_rgb"})
        cams = [cams[0], _output(cams[1], "", "dropped")]
    lengths = _lengths(rng, index)
    columns = [a for a in arrays if a.role == "column" and a.values == "numbers"]
    short = None
    if _pick([True, False, False, False, False], index, "short") and columns and len([n for n in lengths if n]) > 1:
        short = columns[int(rng.integers(len(columns)))].key
    container = _pick(CONTAINERS, index, "container")
    return Variation(
        index=index,
        zarr_format=fmt,
        layout=layout,
        lengths=lengths,
        arrays=tuple(arrays + cams),
        trailing=int(rng.choice([0, 0, 1, 3])),
        consolidated=_pick(CONSOLIDATED, index, "consolidated"),
        container=container,
        separator=_pick([".", "/"], index, "separator"),
        order=_pick(["C", "C", "F"], index, "order") if fmt == 2 else "C",
        ends_dtype=_pick(["<i8", ">i8", "<u4", "<i4", "<u8"], index, "ends"),
        holes=bool(rng.random() < 0.15),
        short=short,
        workers=_pick([1, 2], index, "workers"),
        per_shard=int(rng.integers(1, 4)),
        mapping=mapping,
    )


def _output(a: Arr, output: str, role: str | None = None) -> Arr:
    return Arr(a.key, role or a.role, a.dtype, a.inner, a.codec, a.chunk_rows, a.split, a.shard_rows, output, a.values)


# ---------------------------------------------------------------- writing the stores


def _values(rng: np.random.Generator, a: Arr, n: int) -> np.ndarray:
    """``n`` rows of ``a``: every bit pattern a dtype allows (NaN, infinities, -0.0, extremes) among them."""
    shape = (n, *a.inner)
    if a.values == "scalar":
        return np.asarray(rng.standard_normal(), dtype=a.dtype)
    if a.values == "text":
        words = np.array(["pick", "place", "cup", "tasse", "杯子", "", "a b"], dtype=object)
        return words[rng.integers(0, len(words), size=shape)].astype(str)
    if a.values == "bytes":
        return rng.integers(65, 91, size=(*shape, 6), dtype=np.uint8).view("S6").reshape(shape)
    if a.values == "times":
        return rng.integers(0, 1 << 62, size=shape, dtype=np.int64).astype(np.dtype(a.dtype).newbyteorder("="))
    if a.values == "complex":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(a.dtype)
    dt = np.dtype(a.dtype)
    native = dt.newbyteorder("=")
    if a.role in ("camera", "depth") or dt.kind in "iu":
        info = np.iinfo(native)
        return rng.integers(info.min, info.max, size=shape, dtype=native, endpoint=True).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    values = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, size=shape)).astype(native)
    if a.role != "column":  # epishard refuses NaN and infinities in state and action (kind "nan")
        return values.astype(dt)
    flat = values.reshape(-1)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, np.finfo(native).max, np.finfo(native).tiny], native)
    at = rng.choice(flat.size, size=min(flat.size, len(specials)), replace=False)
    flat[at] = specials[: len(at)]
    return values.astype(dt)


def _codec_kwargs(fmt: int, codec: str, dtype: np.dtype, ndim: int) -> dict:
    """``create_array`` arguments for a codec name of ``CODECS_V2`` / ``CODECS_V3``."""
    numeric = dtype.kind in "iuf"
    if codec == "jpegxl":
        from imagecodecs.numcodecs import Jpegxl, register_codecs

        register_codecs(verbose=False)  # as UMI's 07_generate_replay_buffer.py does, then its writer settings
        return {"compressors": Jpegxl(level=99, numthreads=1)}
    if fmt == 2:
        compressor, filters = codec, None
        if codec.startswith(("delta+", "shuffle+")):
            name, compressor = codec.split("+")
            if numeric:
                filters = [numcodecs.Delta(dtype=dtype.str) if name == "delta" else numcodecs.Shuffle(dtype.itemsize)]
        make = {
            "none": lambda: None,
            "zstd": numcodecs.Zstd,
            "zlib": numcodecs.Zlib,
            "gzip": numcodecs.GZip,
            "lz4": numcodecs.LZ4,
            "bz2": numcodecs.BZ2,
            "lzma": numcodecs.LZMA,
        }
        if compressor.startswith("blosc-"):
            _, cname, shuffle = compressor.split("-", 2)
            made = numcodecs.Blosc(cname=cname, clevel=5, shuffle=int(shuffle))
        else:
            made = make[compressor]()
        return {"compressors": made, "filters": filters}
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec

    out: dict = {}
    if dtype.kind in "biufcmM":
        out["serializer"] = BytesCodec(endian="big" if dtype.byteorder == ">" else "little")
    if codec == "none":
        out["compressors"] = None
    elif codec == "zstd":
        out["compressors"] = ZstdCodec()
    elif codec == "gzip":
        out["compressors"] = GzipCodec()
    elif codec == "zstd+crc32c":
        out["compressors"] = [ZstdCodec(), Crc32cCodec()]
    elif codec == "transpose+zstd":
        out["compressors"] = ZstdCodec()
        if ndim > 1:
            out["filters"] = [TransposeCodec(order=tuple(range(ndim))[::-1])]
    elif codec.startswith("numcodecs."):
        import numcodecs.zarr3 as nz3

        out["compressors"] = {"zlib": nz3.Zlib, "lz4": nz3.LZ4, "bz2": nz3.BZ2, "lzma": nz3.LZMA, "zstd": nz3.Zstd}[
            codec.split(".")[1]
        ]()
    else:
        _, cname, shuffle = codec.split("-", 2)
        out["compressors"] = BloscCodec(cname=cname, shuffle=BLOSC_SHUFFLE[int(shuffle)])
    return out


def _create(group, v: Variation, a: Arr, values: np.ndarray, rows: int):
    """``data/<key>`` of ``rows`` rows (its first rows of ``values``), chunked and compressed as ``a`` says."""
    shape = (rows, *values.shape[1:]) if values.ndim else ()
    dtype = values.dtype
    kw = _codec_kwargs(v.zarr_format, a.codec, np.dtype(a.dtype), len(shape)) if a.values != "text" else {}
    if a.values == "text" and v.zarr_format == 2:
        kw = {"compressors": numcodecs.Zstd()}
    if shape:
        chunks = [a.chunk_rows or max(len(values), 1), *values.shape[1:]]
        if a.split:
            chunks[1] = max(1, chunks[1] // 2)
        kw["chunks"] = tuple(chunks)
        if a.shard_rows:
            kw["shards"] = (a.shard_rows, *chunks[1:])
            kw["chunks"] = (a.chunk_rows, *chunks[1:])
    if v.zarr_format == 2:
        kw["chunk_key_encoding"] = {"name": "v2", "separator": v.separator}
        kw["order"] = v.order
    elif v.separator == "/":
        kw["chunk_key_encoding"] = {"name": "default", "separator": "/"}
    else:
        kw["chunk_key_encoding"] = {"name": "v2", "separator": "."}
    array = group.create_array(a.key, shape=shape, dtype=dtype, **kw)
    if not shape:
        array[...] = values
    elif rows:
        array[:rows] = values[:rows]
    return array


def write_store(v: Variation, folder: Path) -> dict[str, np.ndarray]:
    """The ReplayBuffer of ``v`` as a local folder (zarr); returns every array's values as written."""
    rng = np.random.default_rng([SEED, v.index, 1])
    ends = np.cumsum(v.lengths).astype(v.ends_dtype)
    n = int(ends[-1]) + v.trailing
    values = {a.key: _values(rng, a, n) for a in v.arrays}
    if v.short:  # cut inside the last episode that has rows
        last = max(i for i, k in enumerate(v.lengths) if k)
        values[v.short] = values[v.short][: int(ends[last]) - 1]
    g = zarr.open_group(str(folder), mode="w", zarr_format=v.zarr_format)
    data, meta = g.create_group("data"), g.create_group("meta")
    if v.consolidated != "stale":
        for a in v.arrays:
            _create(data, v, a, values[a.key], len(values[a.key]) if values[a.key].ndim else 0)
        meta.create_array("episode_ends", data=ends, chunks=(max(len(ends), 1),))
        if v.consolidated == "present":
            zarr.consolidate_metadata(str(folder))
    else:  # consolidated before the last episode was added (ReplayBuffer.add_episode resizes every array)
        before = int(ends[-2]) if len(ends) > 1 else 0
        arrays = {}
        for a in v.arrays:
            rows = min(before, len(values[a.key])) if values[a.key].ndim else 0
            arrays[a.key] = _create(data, v, a, values[a.key], rows)
        e = meta.create_array("episode_ends", shape=(len(ends) - 1,), dtype=ends.dtype, chunks=(len(ends),))
        e[:] = ends[:-1]
        zarr.consolidate_metadata(str(folder))
        g = zarr.open_group(str(folder), mode="r+", use_consolidated=False)
        for a in v.arrays:
            if values[a.key].ndim:
                array = g["data"][a.key]
                array.resize(values[a.key].shape)
                array[before:] = values[a.key][before:]
        e = g["meta"]["episode_ends"]
        e.resize((len(ends),))
        e[-1] = ends[-1]
    if v.holes:  # a chunk of one column never written: zarr reads its fill value (ReplayBuffer too)
        column = next((a for a in v.arrays if a.role == "column" and a.values == "numbers" and a.chunk_rows), None)
        if column is not None:
            path = folder / "data" / column.key
            chunks = sorted(
                p for p in path.rglob("*") if p.is_file() and p.name not in (".zarray", ".zattrs", "zarr.json")
            )
            if len(chunks) > 1:
                chunks[len(chunks) // 2].unlink()
    return values


def _zip(folder: Path, zipped: Path, deflated: bool) -> None:
    """The store as a ``.zarr.zip`` (members stored, as zarr's ``ZipStore`` writes them, or deflated)."""
    kind = zipfile.ZIP_DEFLATED if deflated else zipfile.ZIP_STORED
    with zipfile.ZipFile(zipped, "w", compression=kind) as z:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            z.write(path, path.relative_to(folder).as_posix())


class SuffixRangeHandler(RangeHandler):
    """``RangeHandler`` that also answers suffix ranges (``bytes=-N``: a Zarr 3 shard's index), as web servers do."""

    def send_head(self):
        match = re.fullmatch(r"bytes=-(\d+)", self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        if match and os.path.isfile(path):
            size = os.path.getsize(path)
            self.headers.replace_header("Range", f"bytes={max(size - int(match.group(1)), 0)}-")
        return super().send_head()


@pytest.fixture(scope="module")
def http_root(tmp_path_factory):
    """(folder, URL): a loopback HTTP server over a folder of this module's stores."""
    folder = tmp_path_factory.mktemp("zarr_http")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(SuffixRangeHandler, directory=folder))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def place(v: Variation, tmp_path: Path, http_root) -> tuple[str, str]:
    """Write ``v``'s store and put it where ``v.container`` says: (source path or URL, oracle path)."""
    name = f"v{v.index:03d}"
    if v.container == "http":
        folder = http_root[0] / f"{name}.zarr"
        shutil.rmtree(folder, ignore_errors=True)
        write_store(v, folder)
        return f"{http_root[1]}/{name}.zarr", str(folder)
    folder = tmp_path / f"{name}.zarr"
    write_store(v, folder)
    if v.container.startswith("zip"):
        zipped = tmp_path / f"{name}.zarr.zip"
        _zip(folder, zipped, v.container == "zip-deflated")
        shutil.rmtree(folder)
        return str(zipped), str(zipped)
    if v.container == "memory":
        fs = fsspec.filesystem("memory")
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            fs.pipe(f"/zarr-oracle/{name}.zarr/{path.relative_to(folder).as_posix()}", path.read_bytes())
        return f"memory://zarr-oracle/{name}.zarr", str(folder)
    return str(folder), str(folder)


# ---------------------------------------------------------------- comparing


def arrow_values(column: pa.ChunkedArray) -> np.ndarray:
    """A column's values as one flat numpy array (fixed-size lists flattened), in Arrow's type."""
    array = column.combine_chunks()
    while pa.types.is_fixed_size_list(array.type):
        array = array.flatten()
    return array.to_numpy(zero_copy_only=False)


def assert_same(ours: np.ndarray, theirs: np.ndarray, a: Arr | None, what: str) -> int:
    """Equal values, bit for bit (text: as UTF-8 text; times: the same instants); returns the count."""
    theirs = theirs.reshape(-1)
    assert ours.size == theirs.size, f"{what}: {ours.size} values, ReplayBuffer has {theirs.size}"
    if a is not None and a.values in ("text", "bytes"):  # bytes: as Arrow binary, or text of one row each (UTF-8)
        got = [o.encode() if isinstance(o, str) and a.values == "bytes" else o for o in ours.tolist()]
        assert got == theirs.tolist(), what
    elif a is not None and a.values == "times":
        native = theirs.astype(theirs.dtype.newbyteorder("="))
        assert np.array_equal(ours.astype(native.dtype).view("i8"), native.view("i8")), what
    else:
        native = theirs.astype(theirs.dtype.newbyteorder("="))
        assert ours.dtype == native.dtype, f"{what}: {ours.dtype}, ReplayBuffer's {theirs.dtype}"
        assert ours.tobytes() == native.tobytes(), f"{what}: values differ"
    return int(theirs.size)


def expected_frames(a: Arr, frames: np.ndarray) -> np.ndarray:
    """What the lossless video holds of ReplayBuffer's frames: RGB (grey repeated, alpha dropped) or uint16."""
    frames = frames.astype(frames.dtype.newbyteorder("="))
    if a.role == "depth":
        return frames
    if frames.shape[-1] == 1:
        return np.repeat(frames, 3, axis=-1)
    return frames[..., :3]


def compare(v: Variation, out: str, oracle: Oracle, manifest, cameras_checked: dict) -> None:
    """Every episode ReplayBuffer reads equals epishard's: rows, every kept value, every frame; the rest named."""
    back = read_back(out)
    name = f"v{v.index:03d}"
    notes = " | ".join(manifest.sources[0].notes)
    state = [a for a in v.arrays if a.role == "state"]
    action = [a for a in v.arrays if a.role == "action"]
    columns = [a for a in v.arrays if a.role == "column"]
    cameras = [a for a in v.arrays if a.role in ("camera", "depth")]
    for a in v.arrays:
        if a.role == "dropped":
            assert re.search(rf"data/{a.key} \[[0-9, ]*\] \S+ is not kept \(", notes), (a.key, notes)
        elif a.output.startswith("data."):
            assert f"kept as the column {a.output}" in notes, notes
    for key in oracle.scalars:  # ReplayBuffer cannot slice them (its __init__ fails); epishard names them
        assert f"data/{key} [] float64 is not kept (a scalar, not rows)" in notes, notes
    empty = sum(1 for n in v.lengths if n == 0)
    if empty:
        assert f"{empty} episodes of zero rows" in notes, notes
    ends = oracle.episode_ends
    limit = min((oracle.data[k].shape[0] for k in oracle.refused), default=None)
    seen = set()
    for idx in range(oracle.n_episodes):
        episode = oracle.get_episode(idx)
        rows = int(next(iter(episode.values())).shape[0]) if episode else 0
        if rows == 0:
            assert (name, idx) not in back, f"episode {idx} of zero rows was written"
            continue
        if limit is not None and int(ends[idx]) > limit:  # ReplayBuffer refuses the store; epishard this episode
            assert (name, idx) not in back
            TALLY["skipped"] += 1
            continue
        ep = back[(name, idx)]
        seen.add(idx)
        table = ep["table"]
        assert table.num_rows == rows, (idx, table.num_rows, rows)
        assert np.array_equal(table.column("frame_index").to_numpy(), np.arange(rows))
        for out_name, parts in (("observation.state", state), ("action", action)):
            if parts:
                expected = np.concatenate([episode[p.key].reshape(rows, -1) for p in parts], axis=1)
                got = arrow_values(table.column(out_name))
                TALLY["values"] += assert_same(got, expected, None, f"{v.describe()} episode {idx} {out_name}")
            else:
                assert out_name not in table.column_names
        for a in columns:
            output = a.output or a.key
            got = arrow_values(table.column(output))
            TALLY["values"] += assert_same(got, episode[a.key], a, f"{v.describe()} episode {idx} {output}")
        kept = {"frame_index", "timestamp", "observation.state", "action"} | {a.output or a.key for a in columns}
        assert set(table.column_names) <= kept, (set(table.column_names) - kept, v.describe())
        for a in cameras:
            frames = ep["frames"][a.output]
            expected = expected_frames(a, episode[a.key])
            assert frames.shape == expected.shape and np.array_equal(frames, expected), (
                f"{v.describe()} episode {idx} {a.output}"
            )
            TALLY["frames"] += rows
            cameras_checked.setdefault(a.output, {})[idx] = expected
        assert not set(ep["frames"]) - {a.output for a in cameras}
        TALLY["episodes"] += 1
        TALLY["rows"] += rows
    assert {i for (n, i) in back if n == name} == seen


# ---------------------------------------------------------------- the generated variations


VARIATIONS = SWEEP_VARIATIONS if SWEEP else CI_VARIATIONS


@pytest.mark.parametrize("index", range(VARIATIONS))
def test_generated_replay_buffers_read_as_replay_buffer_reads_them(index, tmp_path, http_root):
    v = variation(index)
    source, oracle_path = place(v, tmp_path, http_root)
    oracle = open_oracle(oracle_path)
    out = str(tmp_path / "out")
    options = ConvertOptions(
        progress=False,
        workers=v.workers,
        max_episodes_per_shard=v.per_shard,
        on_error="skip" if v.short else "raise",
        sources=SourceOptions(mapping=v.mapping) if v.mapping else None,
    )
    try:
        manifest = convert([source], out, options)
        cameras_checked: dict = {}
        compare(v, out, oracle, manifest, cameras_checked)
        if v.short:
            expected = sum(
                1 for i, n in enumerate(v.lengths) if n and int(oracle.episode_ends[i]) > oracle.data[v.short].shape[0]
            )
            assert dict(manifest.report.skipped_by_kind) == ({"length_mismatch": expected} if expected else {})
            assert v.short in oracle.refused
        if cameras_checked and index % 3 == 0:  # the stream reader gives the same frames
            camera, by_episode = next(iter(cameras_checked.items()))
            action = "action" if any(a.role == "action" for a in v.arrays) else None
            rows = stream_rows(out, camera, action_key=action)
            assert sorted(rows) == sorted((e, i) for e, frames in by_episode.items() for i in range(len(frames)))
            for (e, i), sample in rows.items():
                frame = np.asarray(sample[camera][0])  # [3, H, W] (depth: [H, W])
                frame = frame.transpose(1, 2, 0) if frame.ndim == 3 else frame
                assert np.array_equal(frame, by_episode[e][i]), (v.describe(), e, i)
                TALLY["stream_frames"] += 1
        TALLY["variations"] += 1
    finally:
        if v.container == "memory":
            fsspec.filesystem("memory").rm(f"/zarr-oracle/v{index:03d}.zarr", recursive=True)


def test_the_variations_cover_what_the_format_allows():
    """The generated sample (CI's or the sweep's) holds every codec of each format, dtype, container, state."""
    vs = [variation(i) for i in range(VARIATIONS)]
    seen = {(v.zarr_format, a.codec) for v in vs for a in v.arrays}
    codecs = {(2, c) for c in CODECS_V2} | {(3, c) for c in CODECS_V3}
    assert len(codecs - seen) <= (0 if SWEEP else 1), sorted(codecs - seen)
    assert set(NUMERIC) <= {a.dtype for v in vs for a in v.arrays}
    assert {v.container for v in vs} == set(CONTAINERS)
    assert {v.consolidated for v in vs} == set(CONSOLIDATED)
    assert {v.layout for v in vs} == {"umi", "dp", "mapped"}
    assert any(0 in v.lengths for v in vs) and any(1 in v.lengths for v in vs)
    assert {v.workers for v in vs} == {1, 2} and any(v.short for v in vs) and any(v.trailing for v in vs)
    assert any(a.shard_rows for v in vs for a in v.arrays) and any(a.split for v in vs for a in v.arrays)


# ---------------------------------------------------------------- disagreements found, one test each


def _small(root: Path, zarr_format: int = 2, **arrays: np.ndarray) -> None:
    g = zarr.open_group(str(root), mode="w", zarr_format=zarr_format)
    data = g.create_group("data")
    for key, values in {"state": np.arange(12, dtype="<f4").reshape(6, 2), **arrays}.items():
        data.create_array(key, data=values, **({"chunks": (2, *values.shape[1:])} if values.ndim else {}))
    g.create_group("meta").create_array("episode_ends", data=np.array([2, 6]))


def _rows(source, episode: int, column: str) -> list:
    return source.episodes[episode].table.load().table.column(column).to_pylist()


def test_big_endian_arrays_are_read_as_their_values(tmp_path):
    """Zarr 2 keeps ``>f4``; Arrow takes no byte-swapped array (it was ``unreadable_table``)."""
    _small(tmp_path / "b.zarr", state=np.arange(12, dtype=">f4").reshape(6, 2), stage=np.arange(6, dtype=">i2"))
    source = open_source(str(tmp_path / "b.zarr"), SourceOptions())
    assert _rows(source, 1, "observation.state") == np.arange(4, 12, dtype="<f4").reshape(4, 2).tolist()
    assert _rows(source, 1, "stage") == [2, 3, 4, 5]


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_stale_consolidated_metadata_is_not_read(tmp_path, zarr_format):
    """A store grown after it was consolidated: every episode and array, as ReplayBuffer reads them."""
    root = tmp_path / "grown.zarr"
    _small(root, zarr_format)
    zarr.consolidate_metadata(str(root))
    g = zarr.open_group(str(root), mode="r+", use_consolidated=False)
    g["data"]["state"].resize((9, 2))
    g["data"]["state"][6:] = np.arange(12, 18, dtype="<f4").reshape(3, 2)
    g["meta"]["episode_ends"].resize((3,))
    g["meta"]["episode_ends"][2] = 9
    g["data"].create_array("late", data=np.arange(9, dtype="<i4"))
    source = open_source(str(root), SourceOptions())
    assert [(e.episode_index, e.table.start, e.table.stop) for e in source.episodes] == [
        (0, 0, 2),
        (1, 2, 6),
        (2, 6, 9),
    ]
    assert _rows(source, 2, "late") == [6, 7, 8]
    assert open_oracle(str(root)).get_episode(2)["late"].tolist() == [6, 7, 8]


def test_arrays_named_as_epishards_own_columns_keep_their_values_under_data(tmp_path):
    """``data/timestamp`` (DP's real-robot buffers) once replaced the row clock; ``frame_index`` picked frames."""
    _small(tmp_path / "t.zarr", timestamp=1.7e9 + np.arange(6) / 10, frame_index=np.arange(6) * 5)
    source = open_source(str(tmp_path / "t.zarr"), SourceOptions())
    table = source.episodes[1].table.load().table
    assert table.column("frame_index").to_pylist() == [0, 1, 2, 3]
    assert table.column("timestamp").to_pylist() == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert table.column("data.timestamp").to_pylist() == (1.7e9 + np.arange(2, 6) / 10).tolist()
    assert table.column("data.frame_index").to_pylist() == [10, 15, 20, 25]
    assert any("data/timestamp is kept as the column data.timestamp" in n for n in source.notes)
    with pytest.raises(SourceError, match=r"mapping column timestamp <- data/state: timestamp is a column epishard"):
        open_source(str(tmp_path / "t.zarr"), SourceOptions(mapping=Mapping(columns={"timestamp": "state"})))


def test_scalars_and_complex_arrays_are_named_not_kept(tmp_path):
    """A 0-d array was an ``[internal]`` IndexError, complex numbers an Arrow error: now named in the notes."""
    _small(tmp_path / "s.zarr", scale=np.array(2.5), cplx=np.ones((6, 2), dtype="<c8"))
    out = str(tmp_path / "out")
    manifest = convert([str(tmp_path / "s.zarr")], out, ConvertOptions(progress=False))
    notes = manifest.sources[0].notes
    assert "data/scale [] float64 is not kept (a scalar, not rows)" in notes
    assert "data/cplx [6, 2] complex64 is not kept (complex64: no Arrow type holds it)" in notes
    assert manifest.totals.episodes == 2
    with pytest.raises(SourceError, match=r"s.zarr: mapping column z <- data/cplx: complex64: no Arrow type"):
        open_source(str(tmp_path / "s.zarr"), SourceOptions(mapping=Mapping(columns={"z": "cplx"})))


def test_bytes_that_are_not_utf8_text_are_a_named_error(tmp_path):
    """A column of one bytes value per row is written as text: bytes that are not UTF-8 were ``[internal]``."""
    _small(tmp_path / "n.zarr", raw=np.array([b"ok", b"a", b"b", b"\xff\xfe", b"d", b"e"], dtype="S2"))
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "n.zarr")], str(tmp_path / "out"), ConvertOptions(progress=False))
    assert (err.value.kind, err.value.episode, err.value.row) == ("bad_feature", 1, 1)
    assert "data/raw row 3 holds b'\\xff\\xfe', not UTF-8 text" in err.value.detail


def test_a_grey_camera_of_one_channel_is_read_as_grey(tmp_path):
    """uint8 ``[N, H, W, 1]`` was ``bad_image`` for every episode; its frames are grey (R = G = B)."""
    frames = (np.arange(6 * 8 * 10) % 251).astype(np.uint8).reshape(6, 8, 10, 1)
    _small(tmp_path / "g.zarr", camera0_rgb=frames)
    out = str(tmp_path / "out")
    convert([str(tmp_path / "g.zarr")], out, ConvertOptions(progress=False))
    got = read_back(out)[("g", 1)]["frames"]["observation.images.camera0"]
    assert np.array_equal(got, np.repeat(frames[2:], 3, axis=-1))


def test_an_array_cut_short_fails_the_episodes_past_it_by_name(tmp_path):
    """ReplayBuffer refuses such a store whole (``__init__``'s assertion); epishard refuses the episodes past it."""
    _small(tmp_path / "c.zarr", pose=np.ones((5, 3), dtype="<f8"))
    assert open_oracle(str(tmp_path / "c.zarr")).refused == ["pose"]
    with pytest.raises(ConversionError) as err:
        convert([str(tmp_path / "c.zarr")], str(tmp_path / "o1"), ConvertOptions(progress=False))
    assert (err.value.kind, err.value.episode) == ("length_mismatch", 1)
    assert "data/pose has 5 rows, meta/episode_ends needs 6" in err.value.detail and err.value.path.endswith("c.zarr")


def test_decreasing_episode_ends_are_refused_where_replay_buffer_reads_empty_slices(tmp_path):
    """``get_episode`` of a decreasing end slices ``[6:4]``: no rows, silently; epishard refuses the store."""
    _small(tmp_path / "d.zarr")
    zarr.open_group(str(tmp_path / "d.zarr"), mode="r+")["meta"]["episode_ends"][:] = [6, 4]
    assert open_oracle(str(tmp_path / "d.zarr")).get_episode(1)["state"].shape == (0, 2)
    with pytest.raises(SourceError, match=r"meta/episode_ends\[1\] = 4 is less than the entry before it \(6\)"):
        open_source(str(tmp_path / "d.zarr"), SourceOptions())


def test_a_server_that_ignores_range_requests_is_refused_for_a_sharded_store(tmp_path):
    """A shard's index asked by a suffix range and answered with the whole file was read as the index."""
    from zarr.codecs import BytesCodec, ShardingCodec

    (tmp_path / "srv").mkdir()
    g = zarr.open_group(str(tmp_path / "srv" / "s.zarr"), mode="w", zarr_format=3)
    codec = ShardingCodec(chunk_shape=(2, 2), codecs=[BytesCodec()], index_codecs=[BytesCodec()])
    a = g.create_group("data").create_array(
        "state", shape=(12, 2), dtype="<f4", chunks=(4, 2), serializer=codec, compressors=None
    )
    a[:] = np.arange(24, dtype="<f4").reshape(12, 2)
    g.create_group("meta").create_array("episode_ends", data=np.array([3, 12]))
    server, url = serve_http(str(tmp_path / "srv"), honour_range=False)
    try:
        with pytest.raises(ConversionError) as err:
            convert([f"{url}/s.zarr"], str(tmp_path / "out"), ConvertOptions(progress=False))
    finally:
        server.shutdown()
    assert (err.value.kind, err.value.episode) == ("unreadable_file", 1)  # rows 3..11: part of shard 0
    assert "'data/state/c/0/0': asked for its last 32 bytes, got 64 bytes" in err.value.detail
    assert "does not honour range requests" in err.value.detail


def test_a_zarr_3_store_over_http_lists_its_arrays(http_root):
    """An HTTP listing names folders ``state/``: every array of ``data/`` was left out, silently."""
    _small(http_root[0] / "h3.zarr", 3, stage=np.arange(6, dtype="<i8"))
    source = open_source(f"{http_root[1]}/h3.zarr", SourceOptions())
    assert _rows(source, 1, "observation.state") == np.arange(4, 12, dtype="<f4").reshape(4, 2).tolist()
    assert _rows(source, 1, "stage") == [2, 3, 4, 5]
    shutil.rmtree(http_root[0] / "h3.zarr" / "data" / "state")
    shutil.rmtree(http_root[0] / "h3.zarr" / "data" / "stage")  # no array left: refused, not converted empty
    with pytest.raises(SourceError, match=r"h3.zarr: data/ holds no array"):
        open_source(f"{http_root[1]}/h3.zarr", SourceOptions())


def test_a_zarr_zip_behind_a_url_is_refused_by_name(tmp_path, http_root):
    """UMI publishes ``.zarr.zip`` files over HTTPS; read through fsspec as a folder it held no group."""
    _small(tmp_path / "u.zarr")
    _zip(tmp_path / "u.zarr", http_root[0] / "u.zarr.zip", deflated=False)
    with pytest.raises(SourceError, match=r"u.zarr.zip: a .zarr.zip is read from a local file .* copy it here first"):
        open_source(f"{http_root[1]}/u.zarr.zip", SourceOptions())


def _jpegxl_store(root: Path, codec: dict) -> np.ndarray:
    """A UMI store whose camera's .zarray names ``codec`` (written uncompressed, then the codec declared)."""
    frames = (np.arange(6 * 8 * 8 * 3) % 251).astype(np.uint8).reshape(6, 8, 8, 3)
    _small(root, camera0_rgb=frames)
    meta = json.loads((root / "data" / "camera0_rgb" / ".zarray").read_text())
    meta["compressor"] = codec
    (root / "data" / "camera0_rgb" / ".zarray").write_text(json.dumps(meta))
    return frames


@pytest.mark.parametrize("codec", ["imagecodecs_jpegxl", "imagecodecs_nonesuch"])
def test_an_image_codec_not_installed_is_refused_by_name(tmp_path, codec):
    if codec == "imagecodecs_jpegxl" and JPEGXL:
        pytest.skip("imagecodecs is installed: its JPEG-XL is read (test_umi_jpegxl_cameras_...)")
    _jpegxl_store(tmp_path / "j.zarr", {"id": codec, "level": 99})
    with pytest.raises(SourceError) as err:
        open_source(str(tmp_path / "j.zarr"), SourceOptions())
    message = str(err.value)
    assert "j.zarr: data/camera0_rgb cannot be opened" in message and codec in message
    assert "pip install imagecodecs" in message


@pytest.mark.skipif(not JPEGXL, reason="imagecodecs is not installed (UMI's JPEG-XL camera codec)")
def test_umi_jpegxl_cameras_in_a_zip_read_as_umi_reads_them(tmp_path):
    """UMI's own writer settings: JpegXl(level=99), a frame per chunk, in a ``.zarr.zip``; workers=2."""
    from imagecodecs.numcodecs import Jpegxl

    root = tmp_path / "umi.zarr"
    rng = np.random.default_rng(SEED)
    frames = rng.integers(0, 256, size=(9, 16, 24, 3), dtype=np.uint8)
    g = zarr.open_group(str(root), mode="w", zarr_format=2)
    g.create_group("data").create_array(
        "camera0_rgb", data=frames, chunks=(1, 16, 24, 3), compressors=Jpegxl(level=99, numthreads=1)
    )
    g["data"].create_array("robot0_eef_pos", data=rng.standard_normal((9, 3)).astype("f4"), compressors=None)
    g.create_group("meta").create_array("episode_ends", data=np.array([4, 9]))
    _zip(root, tmp_path / "umi.zarr.zip", deflated=False)
    out = str(tmp_path / "out")
    convert([str(tmp_path / "umi.zarr.zip")], out, ConvertOptions(progress=False, workers=2, max_episodes_per_shard=1))
    oracle = open_oracle(str(tmp_path / "umi.zarr.zip"))
    back = read_back(out)
    for e in range(2):
        assert np.array_equal(
            back[("umi", e)]["frames"]["observation.images.camera0"], oracle.get_episode(e)["camera0_rgb"]
        )


# ---------------------------------------------------------------- concurrency


def _output_digest(out: str) -> dict[str, str]:
    """sha256 of every shard and index file of a conversion (the manifest holds times of its own)."""
    files = sorted(glob.glob(os.path.join(out, "*.tar")) + glob.glob(os.path.join(out, "*.idx*")))
    files += sorted(glob.glob(os.path.join(out, "index", "*")))
    assert any(f.endswith(".tar") for f in files)
    return {os.path.relpath(f, out): hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files}


def _concurrency_store(tmp_path: Path, zarr_format: int) -> str:
    """A UMI ``.zarr.zip``: a camera of a frame per chunk, per-row state chunks (Zarr 3: sharded), 16 episodes."""
    rng = np.random.default_rng([SEED, zarr_format])
    root = tmp_path / f"c{zarr_format}.zarr"
    lengths = rng.integers(1, 7, size=16)
    n = int(lengths.sum())
    g = zarr.open_group(str(root), mode="w", zarr_format=zarr_format)
    data = g.create_group("data")
    shards = {"shards": (4, 3)} if zarr_format == 3 else {}
    data.create_array("camera0_rgb", data=rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8), chunks=(1, 8, 8, 3))
    for key in ("robot0_eef_pos", "robot0_eef_rot_axis_angle"):
        data.create_array(key, data=rng.standard_normal((n, 3)).astype("f4"), chunks=(1, 3), **shards)
    data.create_array("robot0_gripper_width", data=rng.random((n, 1)).astype("f4"), chunks=(1, 1))
    g.create_group("meta").create_array("episode_ends", data=np.cumsum(lengths))
    _zip(root, tmp_path / f"c{zarr_format}.zarr.zip", deflated=zarr_format == 3)
    return str(tmp_path / f"c{zarr_format}.zarr.zip")


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_zip_opened_in_the_parent_is_not_shared_by_forked_workers(tmp_path, zarr_format):
    """workers=2, ``LOOPS`` times, byte-identical to workers=1 (forked workers once read the parent's zip handle)."""
    source = _concurrency_store(tmp_path, zarr_format)
    open_source(source, SourceOptions())  # the parent holds the store open before the workers fork
    options = {"progress": False, "max_episodes_per_shard": 1}
    convert([source], str(tmp_path / "one"), ConvertOptions(workers=1, **options))
    expected = _output_digest(str(tmp_path / "one"))
    oracle = open_oracle(source)
    back = read_back(str(tmp_path / "one"))
    for e in range(oracle.n_episodes):
        episode = oracle.get_episode(e)
        assert np.array_equal(
            back[(f"c{zarr_format}", e)]["frames"]["observation.images.camera0"], episode["camera0_rgb"]
        )
    for run in range(LOOPS):
        out = str(tmp_path / f"two{run}")
        convert([source], out, ConvertOptions(workers=2, **options))
        assert _output_digest(out) == expected, f"run {run}"
        shutil.rmtree(out)


def _child_opens_its_own(source: str, parent_id: int, queue) -> None:
    from epishard.shardwriter.sources import replay_buffer

    group = replay_buffer._open(replay_buffer._Store(source))
    queue.put((id(group) != parent_id, np.asarray(group["data"]["robot0_gripper_width"][:]).tobytes()))


def test_a_forked_child_opens_the_store_anew(tmp_path):
    """The group a parent opened (a zip's file handle in it) stays the parent's; a forked child opens its own."""
    from epishard.shardwriter.sources import replay_buffer

    source = _concurrency_store(tmp_path, 2)
    parent = replay_buffer._open(replay_buffer._Store(source))
    assert replay_buffer._open(replay_buffer._Store(source)) is parent  # one per process
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_opens_its_own, args=(source, id(parent), queue))
    child.start()
    assert queue.get(timeout=60) == (True, np.asarray(parent["data"]["robot0_gripper_width"][:]).tobytes())
    child.join(60)
    assert child.exitcode == 0


def test_a_zip_rewritten_in_place_is_opened_anew(tmp_path):
    """A zip read through its old central directory would give the old file's offsets in the new one."""
    _small(tmp_path / "r.zarr", stage=np.arange(6, dtype="<i8"))
    _zip(tmp_path / "r.zarr", tmp_path / "r.zarr.zip", deflated=False)
    assert _rows(open_source(str(tmp_path / "r.zarr.zip"), SourceOptions()), 1, "stage") == [2, 3, 4, 5]
    _small(tmp_path / "r.zarr", stage=np.arange(6, dtype="<i8") * 100, other=np.zeros((6, 40), dtype="<f8"))
    os.unlink(tmp_path / "r.zarr.zip")
    _zip(tmp_path / "r.zarr", tmp_path / "r.zarr.zip", deflated=True)
    assert _rows(open_source(str(tmp_path / "r.zarr.zip"), SourceOptions()), 1, "stage") == [200, 300, 400, 500]


# ---------------------------------------------------------------- Ray (last: the module then runs in its namespace)


@pytest.fixture(scope="module")
def ray_address(netns):
    import raycluster

    if raycluster.unavailable():
        pytest.skip(str(raycluster.unavailable()))
    with raycluster.cluster() as address:
        yield address


def test_ray_tasks_read_zips_and_folders_as_workers_1(tmp_path, ray_address):
    """Ray tasks (each its own process) convert byte-identically to workers=1, and as the oracle reads."""
    from epishard.shardwriter.ray_convert import RayRunner

    sources = [_concurrency_store(tmp_path, 3), str(tmp_path / "folder.zarr")]
    v = variation(1)
    write_store(Variation(**{**v.__dict__, "container": "folder", "short": None}), Path(sources[1]))
    for run in range(LOOPS if SWEEP else 1):
        for s, source in enumerate(sources):
            options = ConvertOptions(
                progress=False,
                max_episodes_per_shard=1,
                sources=SourceOptions(mapping=v.mapping) if s and v.mapping else None,
            )
            one = str(tmp_path / f"one{s}")
            if run == 0:
                convert([source], one, options)
            out = str(tmp_path / f"ray{s}_{run}")
            convert([source], out, options, runner=RayRunner(ray_address))
            assert _output_digest(out) == _output_digest(one), (source, run)
    oracle = open_oracle(sources[0])
    back = read_back(str(tmp_path / "ray0_0"))
    for e in range(oracle.n_episodes):
        assert np.array_equal(
            back[("c3", e)]["frames"]["observation.images.camera0"], oracle.get_episode(e)["camera0_rgb"]
        )


def test_tally(capsys):
    """What was compared (printed with -s; the report quotes it)."""
    if not TALLY["variations"]:
        pytest.skip("no generated variation ran in this session")
    with capsys.disabled():
        print(f"\nzarr oracle: {TALLY}")
