"""What the non-LeRobot source readers share: the mapping onto LeRobot keys, files, tables, extras.

Every reader (``hdf5``, ``replay_buffer``, ``rlds``, ``mcap_bag``) maps its format's arrays onto the
keys the stream reader uses: ``observation.state`` and ``action`` (the arrays named by the mapping,
concatenated along their last axis, in the source's dtype), ``observation.images.<cam>`` (cameras,
encoded to video by the conversion worker: ``episode.CameraFrames``), other per-step arrays as
columns of their own, and the task text. Each format has a default ``Mapping``; a mapping file
(``--mapping FILE``, JSON or TOML) replaces any of its fields.

Internal: import from ``epishard.shardwriter.sources``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import pyarrow as pa

from epishard.format.storage import Location, RemoteFile, is_local, local_path, source_filesystem

from ..episode import FileInput
from ..errors import ConversionError, SourceError
from . import bounds

__all__ = [
    "EXTRAS",
    "Mapping",
    "SourceOptions",
    "build_table",
    "column_name",
    "concat",
    "episode_numbers",
    "file_stamp",
    "kept_cameras",
    "natural_key",
    "open_binary",
    "require",
    "size_of",
    "source_files",
]

# Python module -> the extra of epishard that installs it.
EXTRAS = {
    "h5py": "hdf5",
    "zarr": "zarr",
    "crc32c": "rlds",
    "mcap": "mcap",
    "mcap_ros2": "mcap",
}


def require(module: str) -> ModuleType:
    """Import an optional library, or raise ``SourceError`` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = EXTRAS.get(module.split(".")[0], module)
        raise SourceError(
            f"reading this format needs the Python package {module.split('.')[0]!r}, which is not installed: "
            f"pip install 'epishard[{extra}]' ({exc})"
        ) from exc


@dataclass(frozen=True)
class Mapping:
    """How a source's arrays become the episode's columns and cameras.

    Keys are the source's own names (an HDF5 path inside the episode's group, a Zarr ``data/``
    array, an RLDS feature path such as ``observation/state``, an MCAP topic). ``None`` in a field:
    the format's default (see its docs page).

    ``state`` / ``action``: keys concatenated, in order, along the last axis into
    ``observation.state`` / ``action`` (``()``: no such column). ``cameras``: output camera name
    (``observation.images.<cam>``) -> key. ``depth``: camera names whose uint16 frames are depth.
    ``columns``: output column -> key, for other arrays kept. ``others``: keep the per-step arrays
    no other field names as columns of their own name (dots for slashes); False drops them (each
    dropped key is listed in the source's notes). ``task``: the task text (overrides what the
    source records). ``fps``: rows per second (overrides the source's or the format's default).
    ``tolerance``: seconds (MCAP resampling: a topic's message farther than this from a row's time
    leaves the row without it, which is an error naming the row). ``streams``: output stream name ->
    key, kept at its own rate with its own timestamps (``episode.Stream``), never resampled: an MCAP
    topic (``"all"``: every numeric topic that is not a camera), or for HDF5 ``{"values": key,
    "timestamps": key, "rate": Hz}`` (``rate`` optional); see each format's page.
    """

    state: tuple[str, ...] | None = None
    action: tuple[str, ...] | None = None
    cameras: dict[str, str] | None = None
    depth: tuple[str, ...] | None = None
    columns: dict[str, str] | None = None
    others: bool | None = None
    task: str | None = None
    fps: float | None = None
    tolerance: float | None = None
    streams: str | dict[str, str | dict] | None = None

    @classmethod
    def from_dict(cls, data: dict, where: str = "mapping") -> Mapping:
        """Build from a dict (a mapping file's content). Raises SourceError naming ``where`` and the field."""
        if not isinstance(data, dict):
            raise SourceError(f"{where}: a mapping is a table of fields, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise SourceError(f"{where}: unknown field(s) {', '.join(unknown)} (fields: {', '.join(sorted(names))})")
        out: dict = {}
        for name, value in data.items():
            if name in ("state", "action", "depth"):
                value = [value] if isinstance(value, str) else value
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise SourceError(f"{where}: {name} must be a key or a list of keys, got {value!r}")
                out[name] = tuple(value)
            elif name in ("cameras", "columns"):
                if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                    raise SourceError(f"{where}: {name} must map output names to keys, got {value!r}")
                out[name] = dict(value)
            elif name == "others":
                if not isinstance(value, bool):
                    raise SourceError(f"{where}: others must be true or false, got {value!r}")
                out[name] = value
            elif name == "streams":
                out[name] = _streams_field(value, where)
            elif name == "task":
                if not isinstance(value, str):
                    raise SourceError(f"{where}: task must be a text, got {value!r}")
                out[name] = value
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise SourceError(f"{where}: {name} must be a positive number, got {value!r}")
                out[name] = float(value)
        return cls(**out)

    @classmethod
    def load(cls, path: str) -> Mapping:
        """Read a mapping file: JSON (``.json``) or TOML (``.toml``). Raises SourceError naming the file."""
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise SourceError(f"{path}: cannot read the mapping file ({exc})") from exc
        try:
            if path.endswith(".toml"):
                try:
                    import tomllib  # type: ignore[import-not-found, unused-ignore]
                except ImportError:  # Python 3.10
                    raise SourceError(
                        f"{path}: TOML mapping files need Python 3.11 or later; write it as JSON"
                    ) from None
                data = tomllib.loads(raw.decode())
            else:
                data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            kind = "TOML" if path.endswith(".toml") else "JSON"
            raise SourceError(f"{path}: not a valid {kind} mapping file ({exc})") from exc
        return cls.from_dict(data, path)

    def over(self, default: Mapping) -> Mapping:
        """This mapping's fields where given, ``default``'s elsewhere."""
        return dataclasses.replace(
            default,
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None},
        )

    def describe(self) -> dict:
        """JSON-ready fields (part of the plan digest and the source's notes)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


_STREAM_KEYS = ("values", "timestamps", "rate")


def _streams_field(value, where: str) -> str | dict[str, str | dict]:
    """A mapping's ``streams``: ``"all"``, or name -> key, or name -> ``{"values", "timestamps"[, "rate"]}``.

    Raises:
        SourceError: any other shape, naming ``where`` and the stream.
    """
    if value == "all":
        return value
    if not isinstance(value, dict):
        raise SourceError(f'{where}: streams must be "all" or map stream names to keys, got {value!r}')
    out: dict[str, str | dict] = {}
    for name, spec in value.items():
        if not isinstance(name, str) or not name:
            raise SourceError(f"{where}: streams: {name!r} is not a stream name")
        if isinstance(spec, str):
            out[name] = spec
            continue
        if not isinstance(spec, dict) or set(spec) - set(_STREAM_KEYS) or not {"values", "timestamps"} <= set(spec):
            raise SourceError(
                f"{where}: streams: {name!r} must be a key, or a table of values, timestamps (keys) and an optional "
                f"rate, got {spec!r}"
            )
        if not isinstance(spec["values"], str) or not isinstance(spec["timestamps"], str):
            raise SourceError(f"{where}: streams: {name!r}: values and timestamps must be keys, got {spec!r}")
        rate = spec.get("rate")
        number = isinstance(rate, (int, float)) and not isinstance(rate, bool)
        if rate is not None and not (number and 0 < rate < math.inf):
            raise SourceError(f"{where}: streams: {name!r}: rate must be a positive number of Hz, got {rate!r}")
        out[name] = {"values": spec["values"], "timestamps": spec["timestamps"]} | (
            {"rate": float(rate)} if rate is not None else {}
        )
    return out


@dataclass(frozen=True)
class SourceOptions:
    """How ``epishard convert`` reads a source that is not LeRobot (``sources.open_source``).

    ``format``: one of ``sources.FORMATS`` (None: recognised from the files, ``detect_format``).
    ``mapping``: fields replacing the format's default mapping. ``fps``: rows per second (as
    ``mapping.fps``; MCAP: the rate topics are resampled to). ``allow_external``: read files the
    source names outside itself (HDF5 external storage, external links and virtual datasets,
    symbolic links out of the source's folder); False (the default) refuses them at open, naming
    file, key and target (``bounds``). Only for a trusted local source; special files (FIFOs,
    devices, ``/proc``, ``/sys``) are refused either way. Raises ValueError for an fps <= 0.
    """

    format: str | None = None
    mapping: Mapping = field(default_factory=Mapping)
    fps: float | None = None
    allow_external: bool = False

    def __post_init__(self):
        if self.fps is not None and not self.fps > 0:
            raise ValueError(f"--fps must be a positive number of rows per second, got {self.fps}")

    def resolved(self, default: Mapping) -> Mapping:
        """The mapping to read with: ``default`` overridden by the options."""
        mapping = self.mapping.over(default)
        return dataclasses.replace(mapping, fps=self.fps) if self.fps is not None else mapping


def column_name(key: str) -> str:
    """A source key as a column name: ``observations/qvel`` -> ``observations.qvel``."""
    return key.strip("/").replace("/", ".")


def natural_key(text: str) -> list:
    """Sort key putting ``demo_2`` before ``demo_10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def _number_in(name: str) -> int | None:
    """The last number in a file or group name (``episode_12.hdf5`` -> 12), or None."""
    found = re.findall(r"\d+", os.path.basename(name).split(".")[0])
    return int(found[-1]) if found else None


def episode_numbers(names: list[str]) -> list[int]:
    """Episode indices of sorted names: the number in each name when they are unique, else positions."""
    numbers = [_number_in(n) for n in names]
    if None not in numbers and len(set(numbers)) == len(numbers):
        return [int(n) for n in numbers if n is not None]
    return list(range(len(names)))


def source_files(
    root: str, suffixes: tuple[str, ...], storage_options: dict | None, allow_external: bool = False
) -> list[FileInput]:
    """The files under ``root`` (or ``root`` itself, a file) whose names end with one of ``suffixes``.

    Local paths, or ``RemoteFile``s for an fsspec URL; sorted by natural order of their paths.
    Hidden files (leading dot) are left out; folders linked in are not followed. A local file must
    be a regular file (``bounds.check_local_file``: a FIFO, a device, ``/proc`` are refused unread)
    and, unless ``allow_external``, resolve inside ``root`` (a symbolic link out of the folder is
    refused, ``bounds.confine``).

    Raises:
        SourceError: ``root`` does not exist, or a file is refused (naming it and its target).
    """
    if is_local(root):
        path = local_path(root)
        if os.path.isfile(path) or (os.path.exists(path) and not os.path.isdir(path)):
            bounds.check_local_file(path)
            return [path]
        if not os.path.isdir(path):
            raise SourceError(f"{root}: no such file or folder")
        found = []
        for folder, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            found += [os.path.join(folder, n) for n in files if n.endswith(suffixes) and not n.startswith(".")]
        folder = bounds.source_folder(path)
        for f in found:
            if allow_external:
                bounds.check_local_file(f)
            elif os.path.commonpath([folder, os.path.realpath(f)]) != folder:
                try:
                    bounds.confine(f, path, f)
                except SourceError as exc:
                    outside = "outside the source" in str(exc)  # (a special file has no way out)
                    hint = "; for a trusted local source pass --allow-external" if outside else ""
                    raise SourceError(f"{exc}{hint}") from None
            else:
                bounds.check_local_file(f)
        if len(found) > bounds.MAX_EPISODES:
            limit = bounds.MAX_EPISODES
            raise SourceError(f"{root}: {len(found)} files, more than the {limit} episodes a source may list")
        return sorted(found, key=lambda f: natural_key(str(f)))
    location = Location.of(root, storage_options)  # the options resolved, the retry policy: once
    fs = source_filesystem(location)
    base = fs._strip_protocol(root).rstrip("/")
    protocol = root.split("://", 1)[0]
    # Over HTTP a folder's URL answers with its listing page, which isfile takes for a file: there a
    # root is a file only when its name says so (one of ``suffixes``, no trailing slash), or, for a
    # format whose files have no suffix (TFRecord shards), when the server does not answer with HTML.
    named = not root.endswith("/") and any(s and root.endswith(s) for s in suffixes)
    listing_page = protocol in ("http", "https") and not named and ("" not in suffixes or _html(fs, base))
    if not listing_page and fs.isfile(base):
        return [RemoteFile(root, None, location)]
    listing = fs.find(base, detail=True)
    out = []
    for path, entry in listing.items():
        rel = path[len(base) :].strip("/")
        if entry.get("type", "file") != "file" or any(p.startswith(".") for p in rel.split("/")):
            continue
        if rel.endswith(suffixes):
            size = entry.get("size")
            out.append(RemoteFile(f"{root.rstrip('/')}/{rel}" if rel else f"{protocol}://{path}", size, location))
    if not out and not fs.exists(base):
        raise SourceError(f"{root}: no such file or folder")
    return sorted(out, key=lambda f: natural_key(str(f)))


def _html(fs, path: str) -> bool:
    """Whether an HTTP server answers ``path`` with an HTML page (a folder's listing), as far as ``info`` says."""
    try:
        return str(fs.info(path).get("mimetype") or "").startswith("text/html")
    except OSError:
        return False


@contextlib.contextmanager
def open_binary(file: FileInput) -> Iterator:
    """A seekable binary file object for a local path or ``RemoteFile`` (range requests)."""
    if isinstance(file, RemoteFile):
        with file.open() as f:
            yield f
    else:
        with open(file, "rb") as f:
            yield f


def size_of(file: FileInput) -> int:
    """Size in bytes of a local path or ``RemoteFile`` (0 when it cannot be asked)."""
    try:
        return file.size() if isinstance(file, RemoteFile) else os.path.getsize(file)
    except OSError:
        return 0


def file_stamp(file: FileInput) -> tuple[int, int]:
    """(size, mtime in ns) of a local file, (size, 0) of a ``RemoteFile``.

    A cache keyed by it never serves a file rewritten in place.
    """
    if isinstance(file, RemoteFile):
        return size_of(file), 0
    try:
        st = os.stat(file)
    except OSError:
        return 0, 0
    return st.st_size, st.st_mtime_ns


def _arrow(values: np.ndarray) -> pa.Array:
    """Rows ``[T, ...]`` as an Arrow column: scalars plain, ``[T, D]`` fixed-size lists, deeper nested.

    Big-endian numbers (``>f4``, as HDF5 and Zarr may store them) become the same values in this
    machine's order (Arrow takes native order only).
    """
    if values.dtype.kind in "biuf" and not values.dtype.isnative:
        values = values.astype(values.dtype.newbyteorder("="))
    if values.ndim == 1:
        if values.dtype.kind in ("S", "O", "U"):
            return pa.array([v.decode() if isinstance(v, bytes) else str(v) for v in values.tolist()], pa.string())
        return pa.array(values)
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    for size in reversed(values.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, int(size))
    return flat


def build_table(
    columns: dict[str, np.ndarray], fps: float, file: str, keys: dict[str, str], times: np.ndarray | None = None
) -> pa.Table:
    """The episode's table from per-step arrays (all ``[T, ...]``): ``frame_index``, ``timestamp``, columns.

    ``timestamp`` is ``times`` (seconds from the first row) or ``frame_index / fps`` (float32); the
    arrays keep their dtypes (``observation.state`` of float64 joints stays float64). ``keys``:
    column -> the source key(s) it came from, for messages.

    Raises:
        ConversionError(kind="length_mismatch"): arrays of different lengths, naming file and keys.
        ConversionError(kind="bad_feature"): a column named ``frame_index`` or ``timestamp`` (it would
            replace the table's own), or text that is not UTF-8, naming file and key.
    """
    for name in ("frame_index", "timestamp"):
        if name in columns:
            raise ConversionError(
                f"{keys.get(name, name)!r} would become the column {name!r}, which the table makes itself: map "
                "it to another name",
                kind="bad_feature",
                path=file,
            )
    lengths = {name: int(v.shape[0]) for name, v in columns.items()}
    if len(set(lengths.values())) > 1:
        desc = ", ".join(f"{keys.get(name, name)} {n} rows" for name, n in lengths.items())
        raise ConversionError(
            f"arrays of different lengths: {desc}",
            kind="length_mismatch",
            path=file,
        )
    n = next(iter(lengths.values()), 0)
    arrays = {
        "frame_index": pa.array(np.arange(n, dtype=np.int64)),
        "timestamp": pa.array(
            (np.arange(n, dtype=np.float64) / fps if times is None else np.asarray(times, np.float64)).astype(
                np.float32
            )
        ),
    }
    for name, v in columns.items():
        try:
            arrays[name] = _arrow(v)
        except UnicodeDecodeError as exc:
            raise ConversionError(
                f"{keys.get(name, name)!r}: bytes that are not UTF-8 text ({exc})", kind="bad_feature", path=file
            ) from None
    return pa.table(arrays)


def concat(parts: list[np.ndarray], keys: tuple[str, ...], file: str) -> np.ndarray:
    """Arrays ``[T, ...]`` concatenated along the last axis (``[T]`` counts as ``[T, 1]``).

    Raises ConversionError(kind="length_mismatch") naming the keys when their lengths differ.
    """
    parts = [p.reshape(p.shape[0], math.prod(p.shape[1:])) if p.ndim != 2 else p for p in parts]  # (0 rows too)
    if len({p.shape[0] for p in parts}) > 1:
        desc = ", ".join(f"{k} {p.shape[0]} rows" for k, p in zip(keys, parts, strict=True))
        raise ConversionError(f"arrays of different lengths: {desc}", kind="length_mismatch", path=file)
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def kept_cameras(cameras: dict[str, str] | None, wanted: tuple[str, ...] | None, root: str) -> dict[str, str]:
    """The mapping's cameras (output name -> source key) that ``--cameras`` keeps (``None``: all).

    Raises:
        SourceError: ``wanted`` names a camera the source's mapping does not have (a typo would
            otherwise surface as every episode missing that camera), listing the ones it has.
    """
    have = dict(cameras or {})
    if wanted is None:
        return have
    unknown = [c for c in wanted if c not in have]
    if unknown:
        raise SourceError(
            f"{root}: camera {', '.join(unknown)} is not in this source (--cameras takes the output names); "
            f"its cameras: {', '.join(have) or 'none'}"
        )
    return {c: k for c, k in have.items() if c in wanted}
