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
per-step array is kept as a column of its own name. 10 Hz unless ``--fps`` (UMI records at 59.94
and subsamples; the ReplayBuffer does not store its rate).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from epishard.format.storage import is_local, local_path, resolve_storage_options

from ..episode import CameraFrames, Episode, FrameReader, LazyTable, LoadedTable, Source
from ..errors import ConversionError, SourceError
from .base import Mapping, SourceOptions, build_table, concat, kept_cameras, require

CHUNK_FRAMES = 32  # frames read per chunk of a camera
DEFAULT_FPS = 10.0


@dataclass(frozen=True)
class _Store:
    """Where the ReplayBuffer is: a local folder, a ``.zip``, or a URL (with its storage options)."""

    root: str
    storage_options: dict = field(default_factory=dict, compare=False, repr=False)  # secrets: never shown

    def __hash__(self) -> int:
        return hash(self.root)


def _open(store: _Store) -> Any:
    """The root group, read-only (opened once per process and store)."""
    return _open_cached(store.root, json.dumps(store.storage_options, sort_keys=True, default=str))


@functools.lru_cache(maxsize=4)
def _open_cached(root: str, options_json: str) -> Any:
    zarr = require("zarr")
    try:
        if is_local(root) and root.endswith(".zip"):
            return zarr.open_group(zarr.storage.ZipStore(local_path(root), mode="r"), mode="r")
        if is_local(root):
            return zarr.open_group(local_path(root), mode="r")
        options = resolve_storage_options(root, json.loads(options_json))
        store = zarr.storage.FsspecStore.from_url(root, storage_options=options, read_only=True)
        return zarr.open_group(store, mode="r")
    except (FileNotFoundError, KeyError, ValueError, OSError) as exc:
        raise SourceError(f"{root}: not a readable Zarr group ({type(exc).__name__}: {exc})") from exc
    except Exception as exc:  # zarr's own errors (GroupNotFoundError, ...) have no common base across versions
        raise SourceError(f"{root}: not a readable Zarr group ({type(exc).__name__}: {exc})") from exc


def _array(group, key: str, root: str):
    try:
        return group["data"][key]
    except KeyError:
        raise ConversionError(f"no array data/{key}", kind="missing_key", path=root) from None


def _rows(group, key: str, start: int, stop: int, root: str) -> np.ndarray:
    array = _array(group, key, root)
    if array.shape[0] < stop:
        raise ConversionError(
            f"data/{key} has {array.shape[0]} rows, meta/episode_ends needs {stop}", kind="length_mismatch", path=root
        )
    try:
        return np.asarray(array[start:stop])
    except Exception as exc:  # a missing or damaged chunk, a codec not installed
        raise ConversionError(
            f"cannot read data/{key} rows {start}..{stop - 1}: {type(exc).__name__}: {exc}",
            kind="unreadable_file",
            path=root,
        ) from exc


@dataclass(frozen=True)
class ZarrTable(LazyTable):
    """One episode's rows ``[start, stop)`` of the ReplayBuffer's state, action and kept arrays."""

    store: _Store
    start: int
    stop: int
    state: tuple[str, ...]
    action: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    fps: float

    def load(self) -> LoadedTable:
        """The rows; ConversionError (``missing_key``, ``length_mismatch``, ``unreadable_file``) naming store, key."""
        group = _open(self.store)
        root = self.store.root
        columns: dict[str, np.ndarray] = {}
        keys: dict[str, str] = {}
        for name, parts in (("observation.state", self.state), ("action", self.action)):
            if parts:
                columns[name] = concat([_rows(group, k, self.start, self.stop, root) for k in parts], parts, root)
                keys[name] = " + ".join(f"data/{k}" for k in parts)
        for name, key in self.columns:
            columns[name], keys[name] = _rows(group, key, self.start, self.stop, root), f"data/{key}"
        return LoadedTable(build_table(columns, self.fps, root, keys), [])

    def fingerprint(self) -> list:
        """Store, rows and keys."""
        return [self.store.root, self.start, self.stop, self.state, self.action, self.columns, self.fps]

    def estimated_bytes(self) -> int:
        """About 64 bytes per row."""
        return 64 * (self.stop - self.start)


@dataclass(frozen=True)
class ZarrFrames(FrameReader):
    """One camera's frames: rows ``[start, stop)`` of ``data/<key>``, uint8 ``[n, H, W, 3]`` or uint16 ``[n, H, W]``."""

    store: _Store
    key: str
    start: int
    stop: int
    estimate: int = 0

    def chunks(self) -> Iterator[np.ndarray | list[bytes]]:
        """``CHUNK_FRAMES`` frames at a time."""
        group = _open(self.store)
        for a in range(self.start, self.stop, CHUNK_FRAMES):
            try:
                yield _rows(group, self.key, a, min(a + CHUNK_FRAMES, self.stop), self.store.root)
            except ConversionError as exc:
                raise exc.with_context(row=a - self.start) from None

    def fingerprint(self) -> list:
        """Store, key, rows."""
        return [self.store.root, self.key, self.start, self.stop]

    def estimated_bytes(self) -> int:
        """Raw bytes of the frames over 4 (a guess at lossless H.264 on camera frames)."""
        return self.estimate


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
        state=tuple(state), action=action, cameras=cameras, depth=(), columns={}, others=True, fps=DEFAULT_FPS
    )


def detect(group) -> bool:
    """A ReplayBuffer: a ``data`` group and ``meta/episode_ends``."""
    try:
        return "data" in group and "episode_ends" in group["meta"]
    except KeyError:
        return False


def open_replay_buffer(
    root: str,
    options: SourceOptions,
    cameras: tuple[str, ...] | None,
    storage_options: dict | None,
    episodes: frozenset[int] | None,
) -> Source:
    """Describe a ReplayBuffer: reads ``meta/episode_ends`` and the arrays' shapes (no rows).

    Raises:
        SourceError: not a Zarr group, no ``data`` or ``meta/episode_ends``, ``episode_ends`` not
            increasing or past an array's end, a mapped key that is not an array of ``data``.
    """
    store = _Store(root.rstrip("/"), dict(storage_options or {}))
    group = _open(store)
    if not detect(group):
        raise SourceError(f"{root}: not a ReplayBuffer (needs a data group and meta/episode_ends)")
    ends = np.asarray(group["meta"]["episode_ends"][:], dtype=np.int64)
    if ends.size and (ends[0] < 0 or np.any(np.diff(ends) < 0)):
        raise SourceError(f"{root}: meta/episode_ends is not increasing ({ends[:8].tolist()}...)")
    data = group["data"]
    arrays = {k: (tuple(data[k].shape), data[k].dtype) for k in sorted(data.array_keys())}
    short = {k: s[0] for k, (s, _) in arrays.items() if ends.size and s[0] < ends[-1]}
    mapping = options.resolved(_default(arrays))
    for key in [*(mapping.state or ()), *(mapping.action or ()), *(mapping.cameras or {}).values()]:
        if key not in arrays:
            raise SourceError(f"{root}: no array data/{key} (arrays: {', '.join(arrays) or 'none'}); see --mapping")
    used = set(mapping.state or ()) | set(mapping.action or ()) | set((mapping.cameras or {}).values())
    used |= set((mapping.columns or {}).values())
    columns = list((mapping.columns or {}).items())
    notes = [f"{k}: {n} rows, meta/episode_ends says {int(ends[-1])}; episodes past it fail" for k, n in short.items()]
    for key in sorted(set(arrays) - used):
        if mapping.others and not _is_camera(*arrays[key]):
            columns.append((key, key))
        else:
            notes.append(f"data/{key} {list(arrays[key][0])} is not kept")
    if not mapping.action:
        notes.append("no action array mapped: the shards have no action column (UMI derives actions from poses)")
    fps = float(mapping.fps or DEFAULT_FPS)
    cams = kept_cameras(mapping.cameras, cameras, str(root))
    notes.insert(
        0,
        f"umi mapping: state = {' + '.join(mapping.state or ()) or 'none'}, action = "
        f"{' + '.join(mapping.action or ()) or 'none'}, cameras = "
        + (", ".join(f"{c} <- data/{k}" for c, k in cams.items()) or "none")
        + f", {fps:g} fps",
    )
    name = root.rstrip("/").rsplit("/", 1)[-1].removesuffix(".zip").removesuffix(".zarr") or "zarr"
    out = []
    starts = np.concatenate([[0], ends[:-1]]) if ends.size else ends
    for index, (start, stop) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        if episodes is not None and index not in episodes:
            continue
        frames = {}
        for cam, key in cams.items():
            shape = arrays[key][0]
            estimate = (stop - start) * int(np.prod(shape[1:])) // 4
            frames[cam] = CameraFrames(
                ZarrFrames(store, key, start, stop, estimate), depth=cam in (mapping.depth or ())
            )
        table = ZarrTable(
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
