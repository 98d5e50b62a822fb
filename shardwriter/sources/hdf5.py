"""HDF5 sources: ALOHA / ACT (one file per episode) and robomimic / LIBERO (``data/demo_<i>`` groups).

Read with h5py (``epishard[hdf5]``) on file objects (local, or any fsspec URL through range
requests), one episode at a time in the conversion worker: the source's episode list holds file
names and group paths only.

ALOHA (docs/sources/aloha.md): ``/observations/images/<cam>`` uint8 ``[T, H, W, 3]``, or JPEG bytes
(``compress`` attribute on the file: rows of zero-padded bytes ``[T, N]``, or variable-length
bytes); ``/observations/qpos`` -> ``observation.state``, ``/action`` -> ``action``,
``/observations/qvel`` -> ``observation.velocity``, ``/observations/effort`` -> ``observation.effort``;
50 Hz.

robomimic / LIBERO (docs/sources/robomimic.md): ``data/demo_<i>/obs/<key>``, ``data/demo_<i>/actions``;
image keys (``*_image``, ``*_rgb``: uint8 ``[T, H, W, 3]``) are cameras (``*_depth``: depth
cameras), ``actions`` -> ``action``, ``rewards`` -> ``next.reward``, ``dones`` -> ``next.done``,
state: robomimic ``robot0_eef_pos + robot0_eef_quat + robot0_gripper_qpos``, LIBERO
``joint_states + gripper_states``; the task: LIBERO's ``problem_info`` attribute
(``language_instruction``), or a ``language_instruction`` attribute; 20 Hz.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..episode import CameraFrames, Episode, FileInput, FrameReader, LazyTable, LoadedTable, Source
from ..errors import ConversionError, SourceError
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

SUFFIXES = (".hdf5", ".h5", ".hdf")
CHUNK_FRAMES = 32  # frames read per chunk: what a camera holds in memory at once (32 x 921.6 kB at 640x480)
ALOHA_FPS = 50.0
ROBOMIMIC_FPS = 20.0


@dataclass(frozen=True)
class _Layout:
    """What the worker needs to read one episode: file, group, keys (picklable, small)."""

    file: FileInput
    group: str  # "" for ALOHA (the file is the episode), "data/demo_3" for robomimic
    state: tuple[str, ...]
    action: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]  # (output column, key)
    fps: float

    def where(self) -> str:
        return f"{self.file}" + (f":{self.group}" if self.group else "")


class _Opened:
    """An open HDF5 file (h5py on a file object) as a context manager; errors name the file."""

    def __init__(self, file: FileInput) -> None:
        self.file = file
        self._f: Any = None
        self._h5: Any = None

    def __enter__(self):
        h5py = require("h5py")
        self._f = open_binary(self.file)
        handle = self._f.__enter__()
        try:
            self._h5 = h5py.File(handle, "r")
        except OSError as exc:
            self._f.__exit__(None, None, None)
            raise ConversionError(
                f"not a readable HDF5 file (truncated or damaged?): {exc}", kind="unreadable_file", path=str(self.file)
            ) from exc
        return self._h5

    def __exit__(self, *exc):
        if self._h5 is not None:
            self._h5.close()
        if self._f is not None:
            self._f.__exit__(*exc)


def _dataset(h5, group: str, key: str, file: FileInput):
    path = f"{group}/{key}" if group else key
    try:
        node = h5[path]
    except KeyError:
        raise ConversionError(f"no key {path!r} in the file", kind="missing_key", path=str(file)) from None
    if not hasattr(node, "shape"):
        raise ConversionError(f"{path!r} is a group, not an array", kind="missing_key", path=str(file))
    return node


def _read(h5, group: str, key: str, file: FileInput) -> np.ndarray:
    try:
        return np.asarray(_dataset(h5, group, key, file)[()])
    except OSError as exc:  # a chunk past the end of a truncated file
        raise ConversionError(
            f"cannot read {key!r} (truncated file?): {exc}", kind="unreadable_file", path=str(file)
        ) from exc


@dataclass(frozen=True)
class HDF5Table(LazyTable):
    """An episode's rows from HDF5 arrays (see the module): state, action and kept columns."""

    layout: _Layout

    def load(self) -> LoadedTable:
        """The rows; ConversionError (``missing_key``, ``length_mismatch``, ``unreadable_file``) naming file and key."""
        lay = self.layout
        with _Opened(lay.file) as h5:
            columns: dict[str, np.ndarray] = {}
            keys: dict[str, str] = {}
            for name, parts in (("observation.state", lay.state), ("action", lay.action)):
                if parts:
                    columns[name] = concat([_read(h5, lay.group, k, lay.file) for k in parts], parts, lay.where())
                    keys[name] = " + ".join(parts)
            for name, key in lay.columns:
                columns[name], keys[name] = _read(h5, lay.group, key, lay.file), key
        table = build_table(columns, lay.fps, lay.where(), keys)
        return LoadedTable(table, [])

    def fingerprint(self) -> list:
        """File, size, group and keys."""
        lay = self.layout
        return [str(lay.file), size_of(lay.file), lay.group, lay.state, lay.action, lay.columns, lay.fps]

    def estimated_bytes(self) -> int:
        """A guess: 1 kB per episode plus what ``build_table`` adds (the rows are small next to frames)."""
        return 1 << 10


@dataclass(frozen=True)
class HDF5Frames(FrameReader):
    """A camera's frames: uint8 ``[T, H, W, 3]`` (or uint16 ``[T, H, W]``), or JPEG bytes per row."""

    file: FileInput
    group: str
    key: str
    encoded: bool
    estimate: int = 0

    def chunks(self) -> Iterator[np.ndarray | list[bytes]]:
        """``CHUNK_FRAMES`` frames at a time; encoded rows as bytes (zero padding after the image removed)."""
        with _Opened(self.file) as h5:
            ds = _dataset(h5, self.group, self.key, self.file)
            for start in range(0, int(ds.shape[0]), CHUNK_FRAMES):
                try:
                    rows = ds[start : start + CHUNK_FRAMES]
                except OSError as exc:
                    raise ConversionError(
                        f"cannot read {self.key!r} frames {start}.. (truncated file?): {exc}",
                        kind="unreadable_file",
                        path=str(self.file),
                        row=start,
                    ) from exc
                if self.encoded:
                    yield [_image_bytes(r) for r in rows]
                else:
                    yield rows

    def fingerprint(self) -> list:
        """File, size, group, key."""
        return [str(self.file), size_of(self.file), self.group, self.key, self.encoded]

    def estimated_bytes(self) -> int:
        """The bytes the arrays take in the file (lossless video is smaller, a re-encode far smaller)."""
        return self.estimate


def _image_bytes(row) -> bytes:
    """One row of an encoded-image array: ``uint8 [N]`` (zero-padded, ALOHA) or a variable-length cell."""
    if isinstance(row, np.ndarray) and row.dtype == np.uint8:
        return row.tobytes().rstrip(b"\0")  # a JPEG ends with FFD9, a PNG with its IEND CRC: zeros after are padding
    if isinstance(row, np.void):
        return row.tobytes()
    if isinstance(row, np.ndarray):  # vlen uint8
        return np.asarray(row, np.uint8).tobytes()
    return bytes(row)


def _arrays(h5, group: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Every array under ``group`` (recursively): relative key -> (shape, dtype)."""
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    node = h5[group] if group else h5

    def visit(name, obj):
        if hasattr(obj, "shape"):
            out[name] = (tuple(obj.shape), obj.dtype)

    node.visititems(visit)
    return out


def _is_image(shape: tuple[int, ...], dtype) -> bool:
    return len(shape) == 4 and shape[-1] in (1, 3, 4) and np.dtype(dtype) == np.uint8


def _attr_text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def detect(first: FileInput) -> str | None:
    """``"robomimic"`` (a ``data`` group of ``demo_*``), ``"aloha"`` (``observations`` and ``action``), or None."""
    with _Opened(first) as h5:
        if "data" in h5 and any(k.startswith("demo") for k in h5["data"]):
            return "robomimic"
        if "observations" in h5 or "action" in h5:
            return "aloha"
    return None


def _aloha_default(arrays: dict, compressed: bool) -> Mapping:
    cameras = {
        f"observation.images.{k.split('/')[-1]}": k
        for k, (shape, dtype) in sorted(arrays.items())
        if k.startswith("observations/images/") and (compressed or _is_image(shape, dtype) or len(shape) == 3)
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
        fps=ALOHA_FPS,
    )


def _robomimic_default(arrays: dict, libero: bool) -> Mapping:
    cameras, depth = {}, []
    for key, (shape, _) in sorted(arrays.items()):
        if not key.startswith("obs/"):
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
        fps=ROBOMIMIC_FPS,
    )


def _plan(arrays: dict, mapping: Mapping, where: str) -> tuple[tuple[tuple[str, str], ...], list[str]]:
    """Kept columns (mapped, then others) and the notes naming what is dropped."""
    used = set(mapping.state or ()) | set(mapping.action or ()) | set((mapping.cameras or {}).values())
    used |= set((mapping.columns or {}).values())
    columns = list((mapping.columns or {}).items())
    notes = []
    lengths = {k: s[0] for k, (s, _) in arrays.items() if s}
    length = lengths.get((mapping.action or ("",))[0])
    rest = sorted(k for k in arrays if k not in used and not k.startswith("observations/images/"))
    for key in rest:
        shape, dtype = arrays[key]
        per_step = bool(shape) and shape[0] == length and np.dtype(dtype).kind in "biuf"
        if mapping.others and per_step and not _is_image(shape, dtype):
            columns.append((column_name(key), key))
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
    mapping; every other episode is read by the conversion worker (``HDF5Table``, ``HDF5Frames``).
    ``cameras``: as ``ConvertOptions.cameras``. ``episodes``: indices to describe (None: all).

    Raises:
        SourceError: no HDF5 file, a file that is not HDF5, no episode, or a mapped key absent from
            the first episode (naming file and key).
    """
    files = source_files(root, SUFFIXES, storage_options)
    if not files:
        raise SourceError(f"{root}: no HDF5 file ({', '.join(SUFFIXES)})")
    name = name or _source_name(root)
    notes: list[str] = []
    out: list[Episode] = []
    if kind == "aloha":
        try:
            with _Opened(files[0]) as h5:
                arrays = _arrays(h5, "")
                compressed = bool(h5.attrs.get("compress", False))
                task = _attr_text(h5.attrs["language_instruction"]) if "language_instruction" in h5.attrs else None
        except ConversionError as exc:
            raise SourceError(str(exc)) from None
        mapping = options.resolved(_aloha_default(arrays, compressed))
        groups = [(f, "") for f in files]
        indices = episode_numbers([str(f) for f in files])
        robot = "aloha"
    else:
        if len(files) != 1:
            raise SourceError(f"{root}: a robomimic/LIBERO source is one HDF5 file, found {len(files)}")
        try:
            with _Opened(files[0]) as h5:
                demos = sorted((k for k in h5["data"] if k.startswith("demo")), key=natural_key)
                if not demos:
                    raise SourceError(f"{files[0]}: no data/demo_* group")
                arrays = _arrays(h5, f"data/{demos[0]}")
                attrs = dict(h5["data"].attrs)
                compressed = False
        except ConversionError as exc:
            raise SourceError(str(exc)) from None
        task = None
        libero = "problem_info" in attrs
        if libero:
            try:
                task = json.loads(_attr_text(attrs["problem_info"])).get("language_instruction")
            except (ValueError, AttributeError):
                notes.append(f"{files[0]}: data attribute problem_info is not JSON; no task text")
        if "language_instruction" in attrs:
            task = _attr_text(attrs["language_instruction"])
        mapping = options.resolved(_robomimic_default(arrays, libero))
        groups = [(files[0], f"data/{d}") for d in demos]
        indices = episode_numbers(demos)
        robot = "libero" if libero else "robomimic"
    where = f"{files[0]}" + (f":{groups[0][1]}" if groups[0][1] else "")
    for key in [*(mapping.state or ()), *(mapping.action or ()), *(mapping.cameras or {}).values()]:
        if key not in arrays:
            raise SourceError(f"{where}: no key {key!r} (keys: {', '.join(sorted(arrays)) or 'none'}); see --mapping")
    columns, dropped = _plan(arrays, mapping, where)
    notes += dropped
    task = mapping.task or task
    fps = float(mapping.fps or (ALOHA_FPS if kind == "aloha" else ROBOMIMIC_FPS))
    cams = kept_cameras(mapping.cameras, cameras, str(where))
    notes.append(
        f"{kind} mapping: state = {' + '.join(mapping.state or ()) or 'none'}, action = "
        f"{' + '.join(mapping.action or ()) or 'none'}, cameras = "
        + (", ".join(f"{c} <- {k}" for c, k in cams.items()) or "none")
        + (" (JPEG bytes, decoded)" if compressed else "")
        + f", {fps:g} fps"
    )
    per_file = size_of(files[0]) // max(1, len(groups)) if kind != "aloha" else 0
    for index, (file, group) in zip(indices, groups, strict=True):
        if episodes is not None and index not in episodes:
            continue
        layout = _Layout(file, group, tuple(mapping.state or ()), tuple(mapping.action or ()), columns, fps)
        estimate = (size_of(file) if kind == "aloha" else per_file) // max(1, len(cams))
        frames = {
            cam: CameraFrames(HDF5Frames(file, group, key, compressed, estimate), depth=cam in (mapping.depth or ()))
            for cam, key in cams.items()
        }
        out.append(
            Episode(
                source=name,
                episode_index=index,
                table=HDF5Table(layout),
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
