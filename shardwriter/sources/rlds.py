"""RLDS / Open X-Embodiment sources: TFDS TFRecord files of episodes, read without TensorFlow.

A TFDS RLDS dataset folder holds ``features.json`` and ``dataset_info.json`` (what the features
are) and ``<name>-<split>.tfrecord-<i>-of-<n>`` files; each record is one episode, a
``tf.train.Example`` whose per-step features are flattened lists named ``steps/<feature path>``
(``steps/observation/image``: one JPEG or PNG per step, ``steps/action``, ``steps/is_first``, ...)
and whose episode features are ``episode_metadata/<...>``. ``sources.tfrecord`` reads the framing
and the protobuf; the source's episode list holds (file, byte offset, length) per record (the
headers are scanned when the source opens); the worker reads one record, once, for the rows and
every camera.

Values are read by TFDS's rules (``tensorflow_datasets/core``: ``example_serializer``,
``example_parser``, ``features/tensor_feature.Tensor``, ``features/image_feature.Image``): bools
and integers from an ``int64_list``, floats from a ``float_list``, cast to the declared dtype and
shaped ``[steps, *shape]``; a Tensor ``encoding: bytes`` or ``zlib`` from one value per step
(``np.frombuffer``, zlib-decompressed first). ``features.json`` is the ``Feature`` proto as JSON,
or its legacy ``{"type", "content"}`` form. What TFDS cannot read back or a table cannot hold (a
per-step tensor of an unknown dimension stored as numbers, two or more unknown dimensions, a
sequence inside each step, a float32 Image) is not kept (named in the notes), and refused when
mapped. GZIP- or ZLIB-compressed TFRecord files are refused by name (TFDS writes them
uncompressed; their records cannot be reached one by one).

Default mapping (docs/sources/rlds.md): ``observation/<name>`` images (``features.json`` ``Image``
of uint8 or uint16, or bytes that are PNG/JPEG; a uint8 Tensor ``[H, W, 1|3|4]``) ->
``observation.images.<name>`` (two keys of the same last name: their paths joined by ``_``);
``observation/state`` -> ``observation.state``; ``action`` (or every ``action/<part>``,
concatenated in ``features.json`` order: TFDS saves it with sorted keys) -> ``action``;
``language_instruction`` (or ``observation/natural_language_instruction``) -> the
``language_instruction`` column and the task (its first step's text); ``reward`` ->
``next.reward``; ``discount``, ``is_terminal`` and other per-step numbers kept as columns of
their name (dots for slashes); ``is_first`` / ``is_last`` are checked (the episode starts and
ends where they say) and not kept; ``episode_metadata/*`` is not kept (listed in the source's
notes), nor a feature whose column name an episode table has already (``frame_index``,
``timestamp``, ...). An episode of no step is an ``empty_episode``. 10 Hz unless ``--fps``
(TFDS does not record the rate).

Internal: import from ``epishard.shardwriter.sources``.
"""

from __future__ import annotations

import functools
import math
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from epishard.format import untrusted
from epishard.format.storage import RemoteFile, local_path

from ..episode import CameraFrames, Episode, FileInput, FrameReader, LazyTable, LoadedTable, Source
from ..errors import ConversionError, SourceError
from . import bounds
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
from .tfrecord import BytesValues, RecordError, compression, parse_example, read_record, scan

__all__ = ["open_rlds"]

_DEFAULT_FPS = 10.0
_CHUNK_FRAMES = 32
_IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8")


# TFDS tensor dtypes read as numbers; "string" is text; any other is kept out unless mapped (refused then).
_NUMERIC = frozenset(
    ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64")
)
_MAX_DIM = 1 << 31  # one dimension of a declared shape (-1: unknown)


_ENCODINGS = ("none", "bytes", "zlib")  # tensor_feature.Encoding
_IMAGE_DTYPES = ("uint8", "uint16")  # what a camera can hold (a float32 Image is the PNG of its bytes)
# Columns every episode table has (sources.base.build_table) or the format reserves: a feature of that name is not kept.
_RESERVED = frozenset(("frame_index", "timestamp", "index", "episode_index", "task_index"))


def _spec_error(where: str, at: str, what: str) -> SourceError:
    return SourceError(f"{where}: {at or '(the top)'}: {what}; not a TFDS features.json this reader can use")


def _object(node: object, where: str, at: str) -> dict:
    if not isinstance(node, dict):
        raise _spec_error(where, at, f"an object expected, found {type(node).__name__}")
    return node


def _join(at: str, name: str) -> str:
    return f"{at}.{name}" if at else name


def _dims(node: object, where: str, at: str) -> list[int]:
    """A TFDS shape (``{"dimensions": ["3", "-1"]}``; legacy: ``[null, 3]``) as ints, -1 unknown."""
    if isinstance(node, list):  # a legacy features.json: None for an unknown dimension
        dims: object = [-1 if d is None else d for d in node]
        place = at
    else:
        dims = _object(node, where, at).get("dimensions", [])
        place = _join(at, "dimensions")
    if not isinstance(dims, list):
        raise _spec_error(where, place, f"a list expected, found {type(dims).__name__}")
    out = []
    for i, d in enumerate(dims):
        try:
            if isinstance(d, bool) or not isinstance(d, (int, str)):
                raise ValueError
            n = int(d)
        except ValueError:
            raise _spec_error(where, f"{place}[{i}]", f"{str(d)[:40]!r} is not a dimension") from None
        if not -1 <= n <= _MAX_DIM:
            raise _spec_error(where, f"{place}[{i}]", f"dimension {n} is not -1 (unknown) to 2^31")
        out.append(n)
    return out


def _legacy(obj: dict, where: str, at: str) -> dict:
    """A legacy features.json node (``{"type": "<module>.<Class>", "content": ...}``) as the proto's JSON.

    TFDS wrote this form before features.json became the ``Feature`` proto
    (``FeatureConnector.from_json``, "Legacy mode"): a FeaturesDict's content is its features by
    name (or, with ``proto_cls``, the ``FeaturesDict`` proto), a Sequence's ``{"feature", "length"}``,
    a Tensor's ``{"shape": [None, 3], "dtype", "encoding"}``, an Image's ``{"shape", "dtype",
    "encoding_format"}``. Another class is returned as an unknown feature.
    """
    cls = str(obj["type"]).rsplit(".", 1)[-1]
    content = obj.get("content")
    here = _join(at, "content")
    if cls == "FeaturesDict":
        features = _object(content, where, here)
        return {"featuresDict": features if obj.get("proto_cls") else {"features": features}}
    if cls in ("Sequence", "Dataset"):
        return {"sequence": {"feature": _object(content, where, here).get("feature", {})}}
    if cls in ("Tensor", "Scalar"):
        c = _object(content, where, here)
        return {"tensor": {k: c[k] for k in ("shape", "dtype", "encoding") if k in c}}
    if cls == "Image":
        c = _object(content, where, here)
        return {"image": {"shape": c.get("shape", [None, None, 3]), "dtype": c.get("dtype") or "uint8"}}
    if cls == "Text":
        return {"text": {}}
    if cls == "ClassLabel":
        return {"classLabel": {}}
    return {"pythonClassName": str(obj["type"])[:80]}


def _walk(node: object, path: str, out: dict, where: str, at: str = "", depth: int = 0) -> None:
    """features.json (TFDS's ``Feature`` proto as JSON, or its legacy form) -> ``{path: spec}``.

    Each spec: ``kind``, ``shape``, ``dtype``, ``encoding`` (a Tensor's ``none``, ``bytes`` or
    ``zlib``) and ``why`` (what makes an ``unsupported`` feature so, or None). ``kind``: ``image``
    (uint8 or uint16), ``tensor`` (a numeric dtype), ``text`` (Text, or a ``string`` tensor) or
    ``unsupported``: another dtype, a float32 Image (the PNG of its bytes), a Tensor of two or
    more unknown dimensions (stored as ``<path>/value`` and ``<path>/shape``), a per-step Tensor
    of an unknown dimension stored as numbers (``example_parser._to_tf_example_spec`` refuses
    it), a feature in a sequence inside each step (stored ragged), a feature of another type.
    ``depth``: the sequences around the node (``steps`` is 1). Nesting is bounded by the JSON's
    (``untrusted.loads``).

    Raises:
        SourceError: an entry of the wrong type (an object, a list, a dimension, a dtype, an
            encoding), naming ``where`` (the file) and the entry's JSON path (``at``).
    """
    obj = _object(node, where, at)
    if isinstance(obj.get("type"), str) and "content" in obj:
        obj = _legacy(obj, where, at)
    why = "a sequence inside each step (TFDS stores it ragged)" if depth > 1 else None
    if "featuresDict" in obj:
        at = _join(at, "featuresDict")
        features = _object(_object(obj["featuresDict"], where, at).get("features", {}), where, _join(at, "features"))
        for name, child in features.items():
            _walk(child, f"{path}/{name}" if path else name, out, where, _join(_join(at, "features"), name), depth)
    elif "sequence" in obj:
        at = _join(at, "sequence")
        _walk(_object(obj["sequence"], where, at).get("feature", {}), path, out, where, _join(at, "feature"), depth + 1)
    elif "image" in obj or "tensor" in obj:
        kind = "image" if "image" in obj else "tensor"
        at = _join(at, kind)
        spec = _object(obj[kind], where, at)
        dims = _dims(spec.get("shape", {}), where, _join(at, "shape"))
        dtype = spec.get("dtype", "uint8" if kind == "image" else "float32")
        if not isinstance(dtype, str):
            raise _spec_error(where, _join(at, "dtype"), f"a dtype name expected, found {type(dtype).__name__}")
        encoding = (spec.get("encoding") or "none") if kind == "tensor" else "none"  # "": none, as TFDS
        if not isinstance(encoding, str) or encoding.lower() not in _ENCODINGS:
            raise _spec_error(where, _join(at, "encoding"), f"{str(encoding)[:40]!r} is not none, bytes or zlib")
        encoding = encoding.lower()
        if kind == "tensor" and dtype not in _NUMERIC:
            kind = "text" if dtype == "string" else "unsupported"
        elif kind == "image" and dtype not in _IMAGE_DTYPES:
            kind, why = "unsupported", why or f"a {dtype[:40]} image (TFDS stores it as a PNG of its bytes)"
        elif kind == "tensor" and dims.count(-1) > 1:
            kind, why = "unsupported", why or "a tensor of two or more unknown dimensions (stored as value and shape)"
        elif kind == "tensor" and -1 in dims and encoding == "none" and depth:
            # example_parser._to_tf_example_spec: an unknown dimension besides the steps' is refused
            kind, why = (
                "unsupported",
                why or "a per-step tensor of an unknown dimension stored as numbers (TFDS cannot read it)",
            )
        out[path] = _feature(kind, dims, dtype[:40], encoding, why)
    elif "text" in obj:
        out[path] = _feature("text", [], "string", "none", why)
    elif "classLabel" in obj:  # ClassLabel: an int64 scalar (class_label_feature.ClassLabel)
        out[path] = _feature("tensor", [], "int64", "none", why)
    elif path:
        name = str(obj.get("pythonClassName", "?"))[:80]
        out[path] = _feature("unsupported", [], name, "none", why or f"a feature of type {name}")


def _feature(kind: str, shape: list, dtype: str, encoding: str, why: str | None) -> dict:
    """One feature's entry (``_walk``): ``kind`` is ``"unsupported"`` whenever there is a ``why``."""
    return {"kind": "unsupported" if why else kind, "shape": shape, "dtype": dtype, "encoding": encoding, "why": why}


@dataclass(frozen=True)
class _Record:
    """One episode: a record of a TFRecord file."""

    file: FileInput
    offset: int
    length: int
    index: int = 0  # the record's number in its file
    problem: str | None = None  # the scan stopped here: reading it is an error naming the file


@dataclass(frozen=True)
class _Spec:
    """What the worker needs to turn a record into rows (picklable, small)."""

    # (path without steps/, kind, shape, dtype, encoding); dtype "" where no features.json declares it
    features: tuple[tuple[str, str, tuple[int, ...], str, str], ...]
    state: tuple[str, ...]
    action: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    language: str | None
    fps: float

    def feature(self, key: str) -> tuple[str, tuple[int, ...], str, str] | None:
        """``(kind, shape, dtype, encoding)`` of the per-step feature ``key``, or None."""
        for path, kind, shape, dtype, encoding in self.features:
            if path == key:
                return kind, shape, dtype, encoding
        return None


def _example(record: _Record) -> dict:
    """The record's features (read and parsed once per process: rows and cameras share it)."""
    return _example_of(record, file_stamp(record.file))


@functools.lru_cache(maxsize=1)
def _example_of(record: _Record, stamp: tuple[int, int]) -> dict:
    where = str(record.file)
    if record.problem is not None:
        raise ConversionError(record.problem, kind="unreadable_file", path=where)
    at = f"record {record.index} at byte {record.offset}"
    with bounds.reading(where, at):  # OSError, MemoryError: named, skippable
        try:
            with open_binary(record.file) as f:
                data = read_record(f, record.offset, record.length)
            return parse_example(data)
        except RecordError as exc:  # names the feature where one is concerned
            raise ConversionError(f"{at}: {exc}", kind=exc.kind, path=where) from exc


def _count_steps(example: dict) -> int | None:
    for key in ("steps/is_first", "steps/is_last", "steps/action"):
        if key in example:
            return len(example[key][1])
    return None


def _steps(example: dict, where: str) -> int:
    steps = _count_steps(example)
    if steps is None:
        raise ConversionError(
            "no steps/is_first, steps/is_last or steps/action feature", kind="missing_key", path=where
        )
    key = next(k for k in ("steps/is_first", "steps/is_last", "steps/action") if k in example)
    bounds.check_count("steps", steps, bounds.MAX_ROWS, where, key)
    return steps


def _get(example: dict, key: str, where: str):
    full = f"steps/{key}"
    if full not in example:
        raise ConversionError(f"no feature {full!r} in the record", kind="missing_key", path=where)
    return example[full]


def _inflate(values, name: str, per: int | None, where: str, first: int = 0, kind: str = "length_mismatch") -> list:
    """Each step's zlib-compressed bytes (TFDS ``encoding: zlib``) decompressed, within bounds.

    ``per``: the bytes a step must hold (None: the shape has an unknown dimension; then the steps
    together may hold ``bounds.MAX_ARRAY_BYTES``). Decompression stops one byte past the limit, so
    a small value claiming a huge tensor is refused, not inflated. ``first``: the step number of
    ``values[0]`` (for messages).

    Raises ConversionError: ``unreadable_file`` (not zlib, or cut short), ``kind`` (a step of more
    or fewer bytes than ``per``), ``too_large`` (past ``MAX_ARRAY_BYTES``); naming the step.
    """
    out, total = [], 0
    for i, data in enumerate(values):
        row = first + i
        limit = per if per is not None else bounds.MAX_ARRAY_BYTES - total
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(data, limit + 1)
        except zlib.error as exc:
            raise ConversionError(
                f"{name} is declared zlib-encoded; step {row} is not zlib data ({exc})",
                kind="unreadable_file",
                path=where,
                row=row,
            ) from None
        if len(raw) > limit:
            if per is None:
                raise bounds.too_large("zlib-encoded steps of", total + len(raw), bounds.MAX_ARRAY_BYTES, where, name)
            raise ConversionError(
                f"{name} holds more than {per} bytes at step {row} once decompressed (its declared shape's)",
                kind=kind,
                path=where,
                row=row,
            )
        if not inflater.eof:
            raise ConversionError(
                f"{name}: step {row}'s zlib data is cut short", kind="unreadable_file", path=where, row=row
            )
        total += len(raw)
        out.append(raw)
    return out


def _tensor_bytes(
    values, name: str, shape: tuple[int, ...] | None, dtype: str, steps: int, where: str, encoding: str = "none"
) -> np.ndarray:
    """A tensor stored as its bytes, one value per step (TFDS ``encoding: bytes`` or ``zlib``), flat.

    ``zlib``: each step's value is decompressed first (``_inflate``). Each step's bytes must be
    the declared shape's (or, the shape unknown, all the same size, a multiple of the dtype's):
    TFDS reads each step with ``np.frombuffer(data, dtype).reshape(shape)``
    (``tensor_feature.Tensor.decode_example_np``). Raises ConversionError ``length_mismatch``
    naming the step.
    """
    item = np.dtype(dtype).itemsize
    full = shape if shape is not None and -1 not in shape else None  # the declared shape, when complete
    if encoding == "zlib":
        if len(values) != steps:
            raise ConversionError(
                f"{name} holds {len(values)} values for {steps} steps", kind="length_mismatch", path=where
            )
        values = _inflate(values, name, item * math.prod(full) if full is not None else None, where)
    sizes = values.sizes() if isinstance(values, BytesValues) else np.asarray([len(v) for v in values], np.int64)
    if len(sizes) != steps:
        raise ConversionError(f"{name} holds {len(sizes)} values for {steps} steps", kind="length_mismatch", path=where)
    if not steps:
        return np.zeros(0, dtype)
    per = item * math.prod(full) if full is not None else int(sizes[0])
    bad = np.flatnonzero(sizes != per)
    if len(bad) or per % item:
        row = int(bad[0]) if len(bad) else 0
        said = (
            f"{list(full)} of {dtype} is {per} bytes"
            if full is not None
            else f"step 0 holds {per} ({dtype}: {item} bytes each)"
        )
        raise ConversionError(
            f"{name} holds {int(sizes[row])} bytes at step {row}; {said}", kind="length_mismatch", path=where, row=row
        )
    bounds.check_bytes((steps, per), 1, where, name)
    return np.frombuffer(b"".join(values), dtype=dtype)


def _list_kind(dtype: str) -> str:
    """The ``tf.train.Example`` list TFDS stores a dtype in (``example_parser._to_tf_example_spec``)."""
    return "float" if np.dtype(dtype).kind == "f" else "int64"


def _numbers(example: dict, key: str, spec: _Spec, steps: int, where: str) -> np.ndarray:
    """A per-step numeric feature as ``[steps, *shape]`` in its declared dtype.

    TFDS's rules (``example_serializer._item_to_tf_feature``, ``example_parser``): bools and
    integers are stored in an ``int64_list``, floats (16, 32, 64 bits) in a ``float_list``
    (float32), both flattened; reading reshapes to ``[steps, *shape]`` (one unknown dimension
    from the count: the writer stacked every step, so each holds as many) and casts to the dtype
    (``tf.cast``: integers wrap, bools are "not zero"; uint64 is the int64's bits). A tensor
    encoded ``bytes`` or ``zlib`` is ``_tensor_bytes``.

    Raises ConversionError: ``bad_feature`` (bytes without a declared numeric dtype; a list of
    the other kind than the declared dtype is stored in), ``length_mismatch`` (values that do not
    fill ``steps`` x the declared shape).
    """
    kind, values = _get(example, key, where)
    name = f"steps/{key}"
    declared = spec.feature(key)
    if declared is not None and not declared[2]:  # no features.json: the shape is inferred below
        declared = None
    shape = tuple(declared[1]) if declared else None
    dtype = declared[2] if declared else None
    encoding = declared[3] if declared else "none"
    if dtype is not None and dtype not in _NUMERIC:
        raise ConversionError(f"{name} is declared {dtype}, not numbers", kind="bad_feature", path=where)
    if kind == "bytes":  # a tensor stored as its bytes, one per step
        if dtype is None:
            raise ConversionError(f"{name} holds bytes, not numbers", kind="bad_feature", path=where)
        array = _tensor_bytes(values, name, shape, dtype, steps, where, encoding)
    else:
        if dtype is not None and len(values) and kind != _list_kind(dtype):
            raise ConversionError(
                f"{name} holds a {kind} list; features.json declares {dtype}, which TFDS stores in a "
                f"{_list_kind(dtype)} list",
                kind="bad_feature",
                path=where,
            )
        array = np.asarray(values)
    if shape is None:
        width = array.size // steps if steps else 0
        shape = (width,) if width != 1 else ()
    if -1 in shape:  # one unknown dimension: from the count (as numpy's reshape)
        known = steps * math.prod(d for d in shape if d != -1)
        if shape.count(-1) == 1 and known and array.size % known == 0:
            shape = tuple(array.size // known if d == -1 else d for d in shape)
        elif shape.count(-1) == 1 and not steps and not array.size:
            shape = tuple(0 if d == -1 else d for d in shape)
    need = steps * math.prod(shape)
    if array.size != need or -1 in shape:
        raise ConversionError(
            f"{name} holds {array.size} values; {steps} steps of {list(shape)} need {need}",
            kind="length_mismatch",
            path=where,
        )
    array = array.reshape((steps, *shape))
    if dtype and np.dtype(dtype) != array.dtype:
        array = array.view(np.uint64) if dtype == "uint64" and array.dtype == np.int64 else array.astype(dtype)
    return array


def _check_flags(example: dict, steps: int, where: str) -> None:
    for key, row in (("steps/is_first", 0), ("steps/is_last", steps - 1)):
        if key not in example:
            continue
        kind, values = example[key]
        if kind == "bytes":
            raise ConversionError(f"{key} holds bytes, not flags", kind="bad_feature", path=where)
        flags = np.asarray(values).astype(bool)
        expected = np.arange(steps) == row
        bad = np.flatnonzero(flags != expected).tolist()[:1] if flags.size == steps else [0]
        if bad:
            raise ConversionError(
                f"{key} is set at rows {np.flatnonzero(flags).tolist()[:5]}: an episode's record must have it "
                f"at row {row} only (another episode inside this record?)",
                kind="bad_episode_flags",
                path=where,
                row=bad[0],
            )


@dataclass(frozen=True)
class _RLDSTable(LazyTable):
    """One episode's rows from its record: state, action, kept columns, language."""

    record: _Record
    spec: _Spec
    episode: int

    def load(self) -> LoadedTable:
        """The rows. Raises ConversionError naming file and key.

        Kinds: ``missing_key``, ``length_mismatch``, ``bad_episode_flags``, ``bad_feature``,
        ``too_large``, ``unreadable_file`` (also any library error while the record is read:
        ``bounds.reading``).
        """
        where = f"{self.record.file} (record {self.episode})"
        with bounds.reading(where):
            return self._rows(where)

    def _rows(self, where: str) -> LoadedTable:
        example = _example(self.record)
        steps = _steps(example, where)
        if not steps:  # an empty episode: no row to read (the conversion names it, empty_episode)
            return LoadedTable(build_table({}, self.spec.fps, where, {}), [], ())
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
            if kind != "bytes" or len(values) != steps:
                raise ConversionError(
                    f"steps/{spec.language} holds {len(values) if kind == 'bytes' else 0} texts for {steps} steps",
                    kind="length_mismatch",
                    path=where,
                )
            raw = list(values)
            texts = [v.decode("utf-8", "replace") for v in raw]
            bad = next((i for i, v in enumerate(raw) if texts[i].encode("utf-8") != v), None)
            if bad is not None:  # TFDS's Text is bytes; a string column holds UTF-8 only
                notes.append(
                    {
                        "kind": "text_not_utf8",
                        "row": bad,
                        "message": f"steps/{spec.language} holds bytes that are not UTF-8 at step {bad}: the "
                        "language_instruction column and the task hold them with U+FFFD for each bad byte",
                    }
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

    @property
    def path(self) -> str:
        """The TFRecord file."""
        return str(self.record.file)

    def fingerprint(self) -> list:
        """File, size, record offset and the mapping."""
        r = self.record
        spec = self.spec
        return [str(r.file), size_of(r.file), r.offset, r.length, spec.state, spec.action, spec.columns, spec.fps]

    def estimated_bytes(self) -> int:
        """A tenth of the record (its images are most of it)."""
        return self.record.length // 10


@dataclass(frozen=True)
class _RLDSFrames(FrameReader):
    """One camera's frames from its record: encoded images (or raw tensors of ``shape``) per step."""

    record: _Record
    key: str
    shape: tuple[int, ...] = ()
    encoded: bool = True
    episode: int = 0
    estimate: int = field(default=0, compare=False)
    dtype: str = "uint8"
    encoding: str = "none"  # a raw tensor's TFDS encoding: none (numbers, or bytes), bytes or zlib

    def chunks(self) -> Iterator[np.ndarray | list[bytes]]:
        """``_CHUNK_FRAMES`` images at a time: encoded bytes, or ``[n, *shape]`` arrays of raw tensors.

        A raw tensor is read as TFDS reads it: an ``int64_list`` of every step's values (encoding
        ``none``), cast to the dtype; or one value of bytes per step (``bytes``; ``zlib``
        decompressed first). A uint8 frame of one channel is ``[H, W]`` (grey).

        Raises ConversionError: ``bad_image`` (numbers where images are mapped, a raw frame whose
        bytes are not its shape's, naming the row), or the record's errors (``_example``).
        """
        where = f"{self.record.file} (record {self.episode})"
        name = f"steps/{self.key}"
        with bounds.reading(where, name):
            example = _example(self.record)
            kind, values = _get(example, self.key, where)
            if self.encoded:
                if kind != "bytes":
                    raise ConversionError(f"{name} holds numbers, not images", kind="bad_image", path=where)
                for start in range(0, len(values), _CHUNK_FRAMES):
                    yield values[start : start + _CHUNK_FRAMES]
                return
            frame = (
                self.shape[:-1]
                if self.dtype == "uint8" and len(self.shape) == 3 and self.shape[-1] == 1
                else self.shape
            )
            if kind != "bytes":  # numbers: every step's values, flattened (TFDS encoding none)
                if len(values) and kind != _list_kind(self.dtype):
                    raise ConversionError(
                        f"{name} holds a {kind} list; TFDS stores {self.dtype} in a {_list_kind(self.dtype)} list",
                        kind="bad_image",
                        path=where,
                    )
                array = np.asarray(values)
                if array.size % max(1, math.prod(self.shape)):
                    raise ConversionError(
                        f"{name} holds {array.size} values: not whole frames of {list(self.shape)}",
                        kind="bad_image",
                        path=where,
                    )
                array = array.reshape((-1, *frame))
                for start in range(0, len(array), _CHUNK_FRAMES):
                    yield array[start : start + _CHUNK_FRAMES].astype(self.dtype)
                return
            per = math.prod(self.shape) * np.dtype(self.dtype).itemsize
            if self.encoding != "zlib":
                sizes = values.sizes() if isinstance(values, BytesValues) else np.asarray([len(v) for v in values])
                bad = np.flatnonzero(sizes != per)
                if len(bad):
                    row = int(bad[0])
                    raise ConversionError(
                        f"{name} holds {int(sizes[row])} bytes at step {row}; a frame of {list(self.shape)} "
                        f"{self.dtype} is {per}",
                        kind="bad_image",
                        path=where,
                        row=row,
                    )
            for start in range(0, len(values), _CHUNK_FRAMES):
                part = values[start : start + _CHUNK_FRAMES]
                if self.encoding == "zlib":
                    part = _inflate(part, name, per, where, first=start, kind="bad_image")
                    short = next((i for i, v in enumerate(part) if len(v) != per), None)
                    if short is not None:
                        raise ConversionError(
                            f"{name} holds {len(part[short])} bytes at step {start + short} once decompressed; a "
                            f"frame of {list(self.shape)} {self.dtype} is {per}",
                            kind="bad_image",
                            path=where,
                            row=start + short,
                        )
                yield np.stack([np.frombuffer(v, self.dtype).reshape(frame) for v in part])

    def fingerprint(self) -> list:
        """File, size, offset, key."""
        return [str(self.record.file), size_of(self.record.file), self.record.offset, self.key]

    def estimated_bytes(self) -> int:
        """Encoded images re-encoded losslessly: a guess of 4 times their share of the record."""
        return self.estimate


def _read_json(file: FileInput, root: str) -> object:
    """A metadata file of the source (``features.json``), confined to its folder, parsed within bounds.

    ``untrusted`` bounds its size and nesting.

    Raises:
        SourceError: a link out of the folder or to a special file (refused unread, even with
            ``allow_external``), a file too large, not JSON, or nested too deep; naming the file.
    """
    where = str(file)
    try:
        if isinstance(file, RemoteFile):
            with open_binary(file) as f:
                data = f.read(untrusted.MAX_JSON_BYTES + 1)
        else:
            path = bounds.confine(str(file), local_path(root), where)
            data = untrusted.read_local(path, where, SourceError)
    except OSError as exc:
        raise SourceError(f"{file}: cannot be read ({exc.strerror or exc})") from None
    return untrusted.loads(data, where, SourceError)


def _raw_camera(spec: dict) -> bool:
    """A per-step uint8 tensor that is a picture: ``[H, W, C]``, C 1 (grey), 3 (RGB) or 4 (RGBA)."""
    shape = spec.get("shape") or []
    return (
        spec["kind"] == "tensor"
        and spec.get("dtype") == "uint8"
        and len(shape) == 3
        and shape[-1] in (1, 3, 4)
        and all(d >= 1 for d in shape)
    )


def _camera_names(keys: list[str]) -> dict[str, str]:
    """Camera name -> key: ``observation.images.<last part of the key>``.

    Keys sharing their last part (``observation/left/image``, ``observation/right/image``) each
    take their path after ``observation/`` (``observation.images.left_image``): no camera hides
    another.
    """
    last = [k.split("/")[-1] for k in keys]
    out: dict[str, str] = {}
    for key, part in zip(keys, last, strict=True):
        if last.count(part) > 1:
            part = (key[len("observation/") :] if key.startswith("observation/") else key).replace("/", "_")
        name, n = f"observation.images.{part}", 2
        while name in out:
            name, n = f"observation.images.{part}_{n}", n + 1
        out[name] = key
    return out


def _inferred(example: dict) -> dict:
    """Per-step features from a record alone (no features.json).

    Bytes starting as PNG/JPEG are images, other bytes text, numbers tensors (their shape from the
    count).
    """
    steps = {}
    for name, (kind, values) in example.items():
        if name.startswith("steps/"):
            is_image = kind == "bytes" and len(values) and values[0][:4].startswith(_IMAGE_MAGIC)
            steps[name[6:]] = {"kind": "image" if is_image else "text" if kind == "bytes" else "tensor"}
    return steps


def _default(features: dict, example: dict) -> tuple[Mapping, dict, str | None]:
    """The default mapping, the per-step features (path without ``steps/`` -> spec), the language key."""
    steps = {k[len("steps/") :]: v for k, v in features.items() if k.startswith("steps/")}
    if not steps:  # no features.json: what the first record holds
        steps = _inferred(example)
    cameras = _camera_names([k for k, v in steps.items() if v["kind"] == "image" or _raw_camera(v)])
    numbers = [k for k, v in steps.items() if v["kind"] == "tensor"]  # in features.json order
    state = ("observation/state",) if "observation/state" in numbers else ()
    action = ("action",) if "action" in numbers else tuple(k for k in numbers if k.startswith("action/"))
    language = next(
        (
            k
            for k in ("language_instruction", "observation/natural_language_instruction")
            if steps.get(k, {}).get("kind") == "text"
        ),
        None,
    )
    columns = {"next.reward": "reward"} if "reward" in numbers else {}
    return (
        Mapping(
            state=state,
            action=action,
            cameras=cameras,
            depth=(),
            columns=columns,
            others=True,
            task=None,
            fps=_DEFAULT_FPS,
        ),
        steps,
        language,
    )


def _what(spec: dict) -> str:
    """A feature's kind in words, for messages."""
    if spec.get("why"):
        return spec["why"]
    return {"text": "text", "image": "images"}.get(spec["kind"], f"a tensor of {spec.get('dtype')}")


def _check_mapped(mapping: Mapping, steps: dict, where: str, declared: bool) -> None:
    """Refuse at open what cannot be what it is mapped as.

    Text, images or a non-numeric tensor as state, action or a column; text or an unsupported
    feature (declared in ``features.json``) as a camera; a raw camera tensor without a full shape,
    of a dtype other than uint8 or uint16, or whose frame is above ``bounds.MAX_FRAME_BYTES``.

    Raises ConversionError (``bad_feature``, ``too_large``) naming ``where`` and the key.
    """
    numbers = [("state", k) for k in mapping.state or ()] + [("action", k) for k in mapping.action or ()]
    numbers += [(f"column {c}", k) for c, k in (mapping.columns or {}).items()]
    for role, key in numbers:
        spec = steps.get(key)
        if spec is None:  # a column the first record lacks: missing_key at its episode
            continue
        if spec["kind"] != "tensor":
            source = "features.json" if declared else "the first record"
            raise ConversionError(
                f"steps/{key} holds {_what(spec)} ({source}), mapped as {role}: state, action and columns must be "
                "numbers",
                kind="bad_feature",
                path=where,
            )
    for column in mapping.columns or {}:
        if column in _RESERVED:
            raise ConversionError(
                f"column {column} is mapped from steps/{(mapping.columns or {})[column]}: every episode table has its "
                f"own {column}; map it under another name",
                kind="bad_feature",
                path=where,
            )
    for camera, key in (mapping.cameras or {}).items():
        spec = steps.get(key, {})
        if declared and spec.get("kind") in ("text", "unsupported"):
            raise ConversionError(
                f"steps/{key} is declared {spec.get('dtype')} in features.json ({_what(spec)}), mapped as camera "
                f"{camera}",
                kind="bad_feature",
                path=where,
            )
        if spec.get("kind") == "tensor":  # raw frames: their size is known before any is read
            shape = tuple(spec.get("shape", ()))
            dtype = spec.get("dtype") or "uint8"
            if len(shape) not in (2, 3) or any(d < 1 for d in shape) or dtype not in _IMAGE_DTYPES:
                raise ConversionError(
                    f"steps/{key} (camera {camera}) is a raw tensor of {dtype} of shape {list(shape)}: a camera needs "
                    "uint8 or uint16 frames of [height, width] or [height, width, channels]",
                    kind="bad_feature",
                    path=where,
                )
            item = np.dtype(dtype).itemsize
            bounds.check_bytes(shape, item, where, f"steps/{key}", limit=bounds.MAX_FRAME_BYTES)


def open_rlds(
    root: str,
    options: SourceOptions,
    cameras: tuple[str, ...] | None,
    storage_options: dict | None,
    episodes: frozenset[int] | None,
) -> Source:
    """Describe an RLDS folder (or one TFRecord file): scans the record headers, parses the first record.

    The files come from ``source_files`` (``options.allow_external``: TFRecord files linked in from
    outside the folder are read; special files never). ``features.json`` is read only from inside
    the folder, whatever ``allow_external`` says (``bounds.confine``), within ``untrusted``'s
    bounds; ``dataset_info.json`` is not read.

    Raises:
        SourceError: no TFRecord file, a file refused (a link out of the folder, a FIFO, a device,
            ``/proc``), a ``features.json`` that is not JSON, too large or deep, or of mistyped
            entries (naming its JSON path), more records than ``bounds.MAX_EPISODES``, no first
            record that parses, or a mapped key the features do not have (naming file and key).
        ConversionError: ``bad_feature`` for text, images or a non-numeric tensor mapped as
            state, action or a column (or text as a camera), ``too_large`` for a raw camera frame
            above ``bounds.MAX_FRAME_BYTES``; naming the file (``features.json``, or the first
            record's) and the key.
    """
    everything = source_files(root, ("",), storage_options, options.allow_external)
    files = [f for f in everything if ".tfrecord" in os.path.basename(str(f))]
    if not files:
        raise SourceError(f"{root}: no TFRecord file (*.tfrecord*)")
    info = [f for f in everything if os.path.basename(str(f)) == "features.json"]
    if len(info) > 1:  # e.g. a dataset folder holding two versions (<dataset>/1.0.0/, <dataset>/1.1.0/)
        raise SourceError(
            f"{root}: {len(info)} features.json files ({', '.join(str(f) for f in info[:3])}): each is a TFDS "
            "dataset of its own (<dataset>/<version>/); convert one folder"
        )
    features: dict = {}
    if info:
        _walk(_read_json(info[0], root), "", features, str(info[0]))
    notes: list[str] = []
    records: list[_Record] = []
    for file in files:
        try:
            with open_binary(file) as f:
                found, problem = scan(f, bounds.MAX_EPISODES - len(records))
                if problem is not None and not found:
                    f.seek(0)
                    packed = compression(f.read(2))
                    if packed:
                        raise SourceError(
                            f"{file}: a {packed}-compressed TFRecord file (tf.io.TFRecordOptions(compression_type="
                            f"{packed!r})): not read, as its records cannot be reached without decompressing all "
                            "before them; TFDS writes TFRecord files uncompressed. Decompress it first (gzip: "
                            "`gzip -dc FILE > FILE.tfrecord`)"
                        )
        except OSError as exc:
            raise SourceError(f"{file}: cannot be read ({exc})") from exc
        records += [_Record(file, o, n, i) for i, (o, n) in enumerate(found)]
        if len(records) > bounds.MAX_EPISODES:
            raise SourceError(
                f"{file}: more than {bounds.MAX_EPISODES} records (episodes) in the source, more than a source may "
                "list (bounds.MAX_EPISODES): refused"
            )
        if problem is not None:  # the conversion names it at this episode (--on-error skip: counted)
            records.append(_Record(file, found[-1][0] if found else 0, 0, len(found), f"{problem}"))
            notes.append(f"{file}: {problem}")
    if not records:
        raise SourceError(f"{root}: the TFRecord files hold no record")
    declared = any(k.startswith("steps/") for k in features)
    # The default mapping comes from the first record that reads (a damaged one is its episode's error);
    # without features.json, from the first of them with a step (an empty one tells nothing of its features).
    first, example, failures = None, {}, []
    for record in [r for r in records if r.problem is None][:8]:
        try:
            parsed = _example(record)
        except ConversionError as exc:
            failures.append(str(exc))
            continue
        if first is None:
            first, example = record, parsed
        if declared or _count_steps(parsed):
            first, example = record, parsed
            break
    if first is None or not example:
        raise SourceError(f"{root}: no record could be read: " + "; ".join(failures or ["none left"]))
    default, steps, language = _default(features, example)
    mapping = options.resolved(default)
    if mapping.streams:
        raise SourceError(
            f"{root}: the mapping's streams: RLDS steps share one clock, so there is no stream at its own rate to keep "
            "(MCAP and HDF5 sources read streams); map the feature as a column"
        )
    for key in [*(mapping.state or ()), *(mapping.action or ()), *(mapping.cameras or {}).values()]:
        if key not in steps:
            raise SourceError(
                f"{first.file if first else root}: no feature steps/{key} (features: "
                f"{', '.join(sorted(steps))}); see --mapping"
            )
    _check_mapped(mapping, steps, str(info[0]) if declared else str(first.file), declared)
    used = set(mapping.state or ()) | set(mapping.action or ()) | set((mapping.cameras or {}).values())
    used |= set((mapping.columns or {}).values()) | {"is_first", "is_last"} | ({language} if language else set())
    columns = list((mapping.columns or {}).items())
    taken = {c for c, _ in columns} | _RESERVED | {"observation.state", "action", "language_instruction"}
    for key in sorted(set(steps) - used):
        spec = steps[key]
        if mapping.others and spec["kind"] == "tensor" and column_name(key) not in taken:
            columns.append((column_name(key), key))
            taken.add(column_name(key))
        elif mapping.others and spec["kind"] == "tensor":
            notes.append(f"steps/{key} (tensor) is not kept: its column name {column_name(key)} is taken")
        else:
            notes.append(f"steps/{key} ({spec['kind']}) is not kept" + (f": {spec['why']}" if spec.get("why") else ""))
    if declared:  # what the records hold beyond features.json (TFDS reads only what it declares)
        unknown = sorted(
            k
            for k in example
            if k.startswith("steps/") and k[6:] not in steps and not any(k.startswith(f"steps/{s}/") for s in steps)
        )
        notes += [f"{k} is in the records but not in features.json: not kept" for k in unknown]
    for key in sorted({k for k in [*features, *example] if k.startswith("episode_metadata/")}):
        notes.append(f"{key} (per episode) is not kept")
    fps = float(mapping.fps or _DEFAULT_FPS)
    cams = kept_cameras(mapping.cameras, cameras, str(root))
    notes.insert(
        0,
        f"rlds mapping: state = {' + '.join(mapping.state or ()) or 'none'}, action = "
        f"{' + '.join(mapping.action or ()) or 'none'}, cameras = "
        + (", ".join(f"{c} <- {k}" for c, k in cams.items()) or "none")
        + (f", task <- steps/{language}" if language else "")
        + f", {fps:g} fps, {len(records)} records in {len(files)} files",
    )
    spec_features = tuple(
        (k, v["kind"], tuple(v.get("shape", ())), v.get("dtype", ""), v.get("encoding", "none"))
        for k, v in sorted(steps.items())
    )
    spec = _Spec(spec_features, tuple(mapping.state or ()), tuple(mapping.action or ()), tuple(columns), language, fps)
    name = _name(root)
    out = []
    for index, record in enumerate(records):
        if episodes is not None and index not in episodes:
            continue
        frames = {}
        for cam, key in cams.items():
            kind, shape, dtype, encoding = spec.feature(key) or ("image", (), "", "none")
            reader = _RLDSFrames(
                record,
                key,
                tuple(shape),
                kind != "tensor",
                index,
                4 * record.length // max(1, len(cams)),
                dtype if kind == "tensor" and dtype else "uint8",
                encoding,
            )
            frames[cam] = CameraFrames(reader, depth=cam in (mapping.depth or ()))
        out.append(
            Episode(
                source=name,
                episode_index=index,
                table=_RLDSTable(record, spec, index),
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
