"""RLDS / Open X-Embodiment sources: TFDS TFRecord files of episodes, read without TensorFlow.

A TFDS RLDS dataset folder holds ``features.json`` and ``dataset_info.json`` (what the features
are) and ``<name>-<split>.tfrecord-<i>-of-<n>`` files; each record is one episode, a
``tf.train.Example`` whose per-step features are flattened lists named ``steps/<feature path>``
(``steps/observation/image``: one JPEG or PNG per step, ``steps/action``, ``steps/is_first``, ...)
and whose episode features are ``episode_metadata/<...>``. ``sources.tfrecord`` reads the framing
and the protobuf; the source's episode list holds (file, byte offset, length) per record (the
headers are scanned when the source opens); the worker reads one record, once, for the rows and
every camera.

Default mapping (docs/sources/rlds.md): ``observation/<name>`` images (``features.json`` ``Image``,
or bytes that are PNG/JPEG) -> ``observation.images.<name>``; ``observation/state`` ->
``observation.state``; ``action`` (or every ``action/<part>``, concatenated in ``features.json``
order) -> ``action``; ``language_instruction`` (or ``observation/natural_language_instruction``)
-> the ``language_instruction`` column and the task (its first step's text); ``reward`` ->
``next.reward``; ``discount``, ``is_terminal`` and other per-step numbers kept as columns of their
name (dots for slashes); ``is_first`` / ``is_last`` are checked (the episode starts and ends where
they say) and not kept; ``episode_metadata/*`` is not kept (listed in the source's notes). 10 Hz
unless ``--fps`` (TFDS does not record the rate).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..episode import CameraFrames, Episode, FileInput, FrameReader, LazyTable, LoadedTable, Source
from ..errors import ConversionError, SourceError
from .base import (
    Mapping,
    SourceOptions,
    build_table,
    column_name,
    concat,
    file_stamp,
    kept_cameras,
    open_binary,
    size_of,
    source_files,
)
from .tfrecord import RecordError, parse_example, read_record, scan

DEFAULT_FPS = 10.0
CHUNK_FRAMES = 32
_IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8")


def _walk(node: dict, path: str, out: dict) -> None:
    """features.json (TFDS's FeaturesDict proto as JSON) -> ``{path: {"kind", "shape", "dtype"}}``."""
    if not isinstance(node, dict):
        return
    if "featuresDict" in node:
        for name, child in node["featuresDict"].get("features", {}).items():
            _walk(child, f"{path}/{name}" if path else name, out)
    elif "sequence" in node:
        _walk(node["sequence"].get("feature", {}), path, out)
    elif "image" in node:
        spec = node["image"]
        dims = [int(d) for d in spec.get("shape", {}).get("dimensions", [])]
        out[path] = {"kind": "image", "shape": dims, "dtype": spec.get("dtype", "uint8")}
    elif "tensor" in node:
        spec = node["tensor"]
        dims = [int(d) for d in spec.get("shape", {}).get("dimensions", [])]
        out[path] = {"kind": "tensor", "shape": dims, "dtype": spec.get("dtype", "float32")}
    elif "text" in node:
        out[path] = {"kind": "text", "shape": [], "dtype": "string"}


@dataclass(frozen=True)
class _Record:
    """One episode: a record of a TFRecord file."""

    file: FileInput
    offset: int
    length: int
    problem: str | None = None  # the scan stopped here: reading it is an error naming the file


@dataclass(frozen=True)
class _Spec:
    """What the worker needs to turn a record into rows (picklable, small)."""

    features: tuple[tuple[str, str, tuple[int, ...], str], ...]  # (path without steps/, kind, shape, dtype)
    state: tuple[str, ...]
    action: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    language: str | None
    fps: float

    def feature(self, key: str) -> tuple[str, tuple[int, ...], str] | None:
        for path, kind, shape, dtype in self.features:
            if path == key:
                return kind, shape, dtype
        return None


def _example(record: _Record) -> dict:
    """The record's features (read and parsed once per process: rows and cameras share it)."""
    return _example_of(record, file_stamp(record.file))


@functools.lru_cache(maxsize=1)
def _example_of(record: _Record, stamp: tuple[int, int]) -> dict:
    where = str(record.file)
    if record.problem is not None:
        raise ConversionError(record.problem, kind="unreadable_file", path=where)
    try:
        with open_binary(record.file) as f:
            data = read_record(f, record.offset, record.length)
        return parse_example(data)
    except (RecordError, OSError) as exc:
        raise ConversionError(str(exc), kind="unreadable_file", path=where) from exc


def _steps(example: dict, where: str) -> int:
    for key in ("steps/is_first", "steps/is_last", "steps/action"):
        if key in example:
            return len(example[key][1])
    raise ConversionError("no steps/is_first, steps/is_last or steps/action feature", kind="missing_key", path=where)


def _get(example: dict, key: str, where: str):
    full = f"steps/{key}"
    if full not in example:
        raise ConversionError(f"no feature {full!r} in the record", kind="missing_key", path=where)
    return example[full]


def _numbers(example: dict, key: str, spec: _Spec, steps: int, where: str) -> np.ndarray:
    """A per-step numeric feature as ``[steps, *shape]`` in its declared dtype."""
    kind, values = _get(example, key, where)
    declared = spec.feature(key)
    if declared is not None and not declared[2]:  # no features.json: the shape is inferred below
        declared = None
    shape = tuple(declared[1]) if declared else ()
    dtype = declared[2] if declared else None
    if kind == "bytes":  # a tensor stored as its bytes, one per step
        if dtype is None:
            raise ConversionError(f"steps/{key} holds bytes, not numbers", kind="bad_feature", path=where)
        array = np.stack([np.frombuffer(v, dtype=np.dtype(dtype)) for v in values]) if values else np.zeros(0)
    else:
        array = np.asarray(values)
    if declared is None:
        width = array.size // steps if steps else 0
        shape = (width,) if width != 1 else ()
    need = steps * int(np.prod(shape)) if shape else steps
    if array.size != need:
        raise ConversionError(
            f"steps/{key} holds {array.size} values; {steps} steps of {list(shape)} need {need}",
            kind="length_mismatch",
            path=where,
        )
    array = array.reshape((steps, *shape))
    if dtype and dtype != "string" and np.dtype("bool" if dtype == "bool" else dtype) != array.dtype:
        array = array.astype("bool" if dtype == "bool" else dtype)
    return array


def _check_flags(example: dict, steps: int, where: str) -> None:
    for key, row in (("steps/is_first", 0), ("steps/is_last", steps - 1)):
        if key not in example:
            continue
        flags = np.asarray(example[key][1]).astype(bool)
        bad = [r for r in range(steps) if flags[r] != (r == row)] if flags.size == steps else [0]
        if bad:
            raise ConversionError(
                f"{key} is set at rows {np.flatnonzero(flags).tolist()[:5]}: an episode's record must have it "
                f"at row {row} only (another episode inside this record?)",
                kind="bad_episode_flags",
                path=where,
                row=bad[0],
            )


@dataclass(frozen=True)
class RLDSTable(LazyTable):
    """One episode's rows from its record: state, action, kept columns, language."""

    record: _Record
    spec: _Spec
    episode: int

    def load(self) -> LoadedTable:
        """The rows. Raises ConversionError naming file and key.

        Kinds: ``missing_key``, ``length_mismatch``, ``bad_episode_flags``, ``unreadable_file``.
        """
        where = f"{self.record.file} (record {self.episode})"
        example = _example(self.record)
        steps = _steps(example, where)
        _check_flags(example, steps, where)
        columns: dict[str, np.ndarray] = {}
        keys: dict[str, str] = {}
        spec = self.spec
        for name, parts in (("observation.state", spec.state), ("action", spec.action)):
            if parts:
                columns[name] = concat([_numbers(example, k, spec, steps, where) for k in parts], parts, where)
                keys[name] = " + ".join(f"steps/{k}" for k in parts)
        for name, key in spec.columns:
            columns[name], keys[name] = _numbers(example, key, spec, steps, where), f"steps/{key}"
        notes, tasks = [], ()
        if spec.language:
            kind, values = _get(example, spec.language, where)
            texts = [v.decode("utf-8", "replace") for v in values] if kind == "bytes" else []
            if len(texts) != steps:
                raise ConversionError(
                    f"steps/{spec.language} holds {len(texts)} texts for {steps} steps",
                    kind="length_mismatch",
                    path=where,
                )
            columns["language_instruction"] = np.asarray(texts, dtype=object)
            keys["language_instruction"] = f"steps/{spec.language}"
            distinct = list(dict.fromkeys(texts))
            tasks = tuple(distinct[:1])
            if len(distinct) > 1:
                notes.append(
                    {
                        "kind": "language_varies",
                        "row": texts.index(distinct[1]),
                        "message": f"steps/{spec.language} holds {len(distinct)} texts in the episode; the task is the "
                        "first step's, the language_instruction column keeps each step's",
                    }
                )
        table = build_table(columns, spec.fps, where, keys)
        return LoadedTable(table, notes, tasks)

    def fingerprint(self) -> list:
        """File, size, record offset and the mapping."""
        r = self.record
        spec = self.spec
        return [str(r.file), size_of(r.file), r.offset, r.length, spec.state, spec.action, spec.columns, spec.fps]

    def estimated_bytes(self) -> int:
        """A tenth of the record (its images are most of it)."""
        return self.record.length // 10


@dataclass(frozen=True)
class RLDSFrames(FrameReader):
    """One camera's frames from its record: encoded images (or uint8 tensors) per step."""

    record: _Record
    key: str
    shape: tuple[int, ...] = ()
    encoded: bool = True
    episode: int = 0
    estimate: int = field(default=0, compare=False)

    def chunks(self) -> Iterator[np.ndarray | list[bytes]]:
        """``CHUNK_FRAMES`` images at a time."""
        where = f"{self.record.file} (record {self.episode})"
        example = _example(self.record)
        kind, values = _get(example, self.key, where)
        if kind != "bytes":
            raise ConversionError(f"steps/{self.key} holds numbers, not images", kind="bad_image", path=where)
        for start in range(0, len(values), CHUNK_FRAMES):
            part = values[start : start + CHUNK_FRAMES]
            if self.encoded:
                yield part
            else:
                yield np.stack([np.frombuffer(v, np.uint8).reshape(self.shape) for v in part])

    def fingerprint(self) -> list:
        """File, size, offset, key."""
        return [str(self.record.file), size_of(self.record.file), self.record.offset, self.key]

    def estimated_bytes(self) -> int:
        """Encoded images re-encoded losslessly: a guess of 4 times their share of the record."""
        return self.estimate


def _read_json(file: FileInput) -> dict:
    try:
        with open_binary(file) as f:
            return json.loads(f.read(16 << 20))
    except (OSError, ValueError) as exc:
        raise SourceError(f"{file}: cannot read it as JSON ({exc})") from exc


def _default(features: dict, example: dict) -> tuple[Mapping, dict, str | None]:
    """The default mapping, the per-step features (path without ``steps/`` -> spec), the language key."""
    steps = {k[len("steps/") :]: v for k, v in features.items() if k.startswith("steps/")}
    if not steps:  # no features.json: what the first record holds
        for name, (kind, values) in example.items():
            if name.startswith("steps/"):
                is_image = kind == "bytes" and values and values[0][:4].startswith(_IMAGE_MAGIC)
                steps[name[6:]] = {"kind": "image" if is_image else "text" if kind == "bytes" else "tensor"}
    cameras = {
        f"observation.images.{k.split('/')[-1]}": k
        for k, v in steps.items()
        if v["kind"] == "image"
        or (v["kind"] == "tensor" and len(v.get("shape", [])) == 3 and v.get("dtype") == "uint8")
    }
    state = ("observation/state",) if "observation/state" in steps else ()
    action = ("action",) if "action" in steps else tuple(k for k in steps if k.startswith("action/"))
    language = next(
        (k for k in ("language_instruction", "observation/natural_language_instruction") if k in steps), None
    )
    columns = {"next.reward": "reward"} if "reward" in steps else {}
    return (
        Mapping(
            state=state,
            action=action,
            cameras=cameras,
            depth=(),
            columns=columns,
            others=True,
            task=None,
            fps=DEFAULT_FPS,
        ),
        steps,
        language,
    )


def open_rlds(
    root: str,
    options: SourceOptions,
    cameras: tuple[str, ...] | None,
    storage_options: dict | None,
    episodes: frozenset[int] | None,
) -> Source:
    """Describe an RLDS folder (or one TFRecord file): scans the record headers, parses the first record.

    Raises:
        SourceError: no TFRecord file, an unreadable ``features.json``, a first record that does
            not parse, or a mapped key the features do not have (naming file and key).
    """
    everything = source_files(root, ("",), storage_options)
    files = [f for f in everything if ".tfrecord" in os.path.basename(str(f))]
    if not files:
        raise SourceError(f"{root}: no TFRecord file (*.tfrecord*)")
    info = [f for f in everything if os.path.basename(str(f)) == "features.json"]
    features: dict = {}
    if info:
        _walk(_read_json(info[0]), "", features)
    notes: list[str] = []
    records: list[_Record] = []
    for file in files:
        try:
            with open_binary(file) as f:
                found, problem = scan(f)
        except OSError as exc:
            raise SourceError(f"{file}: cannot be read ({exc})") from exc
        records += [_Record(file, o, n) for o, n in found]
        if problem is not None:  # the conversion names it at this episode (--on-error skip: counted)
            records.append(_Record(file, found[-1][0] if found else 0, 0, f"{problem}"))
            notes.append(f"{file}: {problem}")
    if not records:
        raise SourceError(f"{root}: the TFRecord files hold no record")
    # The default mapping comes from the first record that reads (a damaged one is its episode's error).
    first, example, failures = None, {}, []
    for record in [r for r in records if r.problem is None][:8]:
        try:
            first, example = record, _example(record)
            break
        except ConversionError as exc:
            failures.append(str(exc))
    if first is None or not example:
        raise SourceError(f"{root}: no record could be read: " + "; ".join(failures or ["none left"]))
    default, steps, language = _default(features, example)
    mapping = options.resolved(default)
    for key in [*(mapping.state or ()), *(mapping.action or ()), *(mapping.cameras or {}).values()]:
        if key not in steps:
            raise SourceError(
                f"{first.file if first else root}: no feature steps/{key} (features: "
                f"{', '.join(sorted(steps))}); see --mapping"
            )
    used = set(mapping.state or ()) | set(mapping.action or ()) | set((mapping.cameras or {}).values())
    used |= set((mapping.columns or {}).values()) | {"is_first", "is_last"} | ({language} if language else set())
    columns = list((mapping.columns or {}).items())
    for key in sorted(set(steps) - used):
        spec = steps[key]
        if mapping.others and spec["kind"] == "tensor":
            columns.append((column_name(key), key))
        else:
            notes.append(f"steps/{key} ({spec['kind']}) is not kept")
    for key in sorted({k for k in [*features, *example] if k.startswith("episode_metadata/")}):
        notes.append(f"{key} (per episode) is not kept")
    fps = float(mapping.fps or DEFAULT_FPS)
    cams = kept_cameras(mapping.cameras, cameras, str(root))
    notes.insert(
        0,
        f"rlds mapping: state = {' + '.join(mapping.state or ()) or 'none'}, action = "
        f"{' + '.join(mapping.action or ()) or 'none'}, cameras = "
        + (", ".join(f"{c} <- steps/{k}" for c, k in cams.items()) or "none")
        + (f", task <- steps/{language}" if language else "")
        + f", {fps:g} fps, {len(records)} records in {len(files)} files",
    )
    spec_features = tuple(
        (k, v["kind"], tuple(v.get("shape", ())), v.get("dtype", "")) for k, v in sorted(steps.items())
    )
    spec = _Spec(spec_features, tuple(mapping.state or ()), tuple(mapping.action or ()), tuple(columns), language, fps)
    name = _name(root)
    out = []
    for index, record in enumerate(records):
        if episodes is not None and index not in episodes:
            continue
        frames = {}
        for cam, key in cams.items():
            kind, shape, _ = spec.feature(key) or ("image", (), "")
            reader = RLDSFrames(
                record, key, tuple(shape), kind == "image", index, 4 * record.length // max(1, len(cams))
            )
            frames[cam] = CameraFrames(reader, depth=cam in (mapping.depth or ()))
        out.append(
            Episode(
                source=name,
                episode_index=index,
                table=RLDSTable(record, spec, index),
                videos={},
                fps=fps,
                tasks=(mapping.task,) if mapping.task else (),
                robot="rlds",
                frames=frames,
            )
        )
    return Source(name=name, episodes=out, fps=fps, path=root, format="rlds", notes=notes)


def _name(root: str) -> str:
    parts = [p for p in root.rstrip("/").split("/") if p]
    # TFDS puts the files under <dataset>/<version>/ (e.g. bridge/0.1.0): the dataset's name, not the version.
    if len(parts) > 1 and parts[-1].replace(".", "").isdigit():
        return parts[-2]
    stem = parts[-1] if parts else "rlds"
    return stem.split(".tfrecord")[0] if ".tfrecord" in stem else stem
