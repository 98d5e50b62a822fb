"""Oracle for RLDS / Open X-Embodiment TFDS TFRecords: what TFDS reads, re-implemented, beside ours.

TensorFlow is not installable here, so the oracle is TFDS's documented decoding re-implemented on
an implementation of the file format other than ours: the ``tfrecord`` package's framing
(``tfrecord.reader.tfrecord_iterator``, which also reads GZIP) and Google's protobuf runtime
(``tfrecord.example_pb2``; the package's own ``process_feature`` is not used: it turns a
``bytes_list`` into ``np.array(..., dtype=bytes)``, which drops trailing NUL bytes). The rules,
from https://github.com/tensorflow/datasets (``tensorflow_datasets/core/``):

- ``example_serializer._item_to_tf_feature``: bools and integers are written to an ``int64_list``
  (bool as 0/1, uint64 as the int64 of its bits), floats (16, 32, 64 bits) to a ``float_list``
  (float32), strings to a ``bytes_list``; a ``Sequence``/``Dataset`` (``steps``) stacks every
  step and flattens (``sequence_feature``, ``dataset_feature.Dataset``), so ``steps/<path>`` holds
  all steps' values; an empty episode is empty lists (``build_empty_np``).
- ``example_parser._to_tf_example_spec`` / ``_deserialize_single_field``: the values are read
  back as int64 or float32, reshaped to ``[steps, *shape]`` and cast (``tf.cast``) to the
  declared dtype; a per-step tensor with an unknown dimension is refused
  ("unknown dimension not at the first position").
- ``features/tensor_feature.Tensor`` (``encode_example``, ``decode_example_np``,
  ``_bytes_to_np_array``): ``encoding: bytes`` stores each step as ``array.tobytes()``, ``zlib``
  as ``zlib.compress`` of it; read back ``np.frombuffer(data, dtype).reshape(shape)``. Two or
  more unknown dimensions are stored as ``<path>/value`` and ``<path>/shape``.
- ``features/image_feature.Image`` (``_ImageEncoder.decode_image``): PNG or JPEG bytes decoded
  with ``channels=shape[-1]`` as uint8 or uint16; a float32 Image is the RGBA PNG of its bytes
  (``_FloatImageEncoder``). JPEG is compared as FFmpeg decodes it (the converter's decoder), PNG
  as Pillow decodes it.
- ``features/feature.FeatureConnector.from_json``: features.json is the ``Feature`` proto as
  JSON (``featuresDict``, ``sequence``, ``tensor``, ``image``, ``text``, ``classLabel``), or the
  legacy ``{"type", "content"}`` form.
- ``file_adapters.TfRecordFileAdapter.write_examples``: TFDS writes TFRecord files uncompressed.

Then epishard's documented mapping (docs/sources/rlds.md) turns the oracle's episodes into the
expected table and frames, compared exactly with the converted shards (``sourcecheck.read_back``)
and the stream reader. Variations come from a seeded numpy Generator: every dtype TFDS writes,
scalar and tensor shapes, encodings none/bytes/zlib, PNG/JPEG/raw cameras of 1, 3 and 4
channels and 16-bit grey, nested FeaturesDicts, proto and legacy features.json with and without
dataset_info.json (or none), several shards and splits, episodes of zero and one step, local
folders and ``memory://`` (and a TFRecord file behind a loopback HTTP server), ``workers`` 1 and 2,
and Ray. CI runs a seeded sample; ``EPISHARD_SWEEP=1`` runs them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import os
import shutil
import zlib
from dataclasses import dataclass, field

import av
import fsspec
import numpy as np
import pyarrow as pa
import pytest
from conftest import SWEEP
from PIL import Image as PILImage
from remote_servers import serve_http
from sourcecheck import read_back, stream_rows

from epishard.shardwriter import ConversionError, ConvertOptions, SourceError, convert
from epishard.shardwriter.sources import Mapping, SourceOptions

tfrecord = pytest.importorskip("tfrecord")
from tfrecord import example_pb2  # noqa: E402
from tfrecord.reader import tfrecord_iterator  # noqa: E402

TFDS = "tensorflow_datasets.core.features."
SEED = 35
VARIATIONS = 48 if SWEEP else 6
LOOPS = 20 if SWEEP else 3
FPS = 10.0
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
FLOAT_DTYPES = ("float16", "float32", "float64")
DTYPES = (*INT_DTYPES, *FLOAT_DTYPES, "bool")
RESERVED = {"frame_index", "timestamp", "index", "episode_index", "task_index"}
TOTALS = {"variations": 0, "rows": 0, "values": 0, "frames": 0, "refused": 0}


# --- the plan of a dataset: per-step features, as a TFDS builder declares them


@dataclass
class Feat:
    """One per-step feature (``steps/<path>``) as a TFDS ``_info()`` would declare it."""

    path: str
    cls: str  # tensor, image, text, float_image, dynamic, ragged
    dtype: str = "float32"
    shape: tuple = ()  # declared, -1 for an unknown dimension
    encoding: str = "none"
    fmt: str = "png"  # image encoding
    actual: tuple = ()  # the shape every step has in this dataset (TFDS stacks the steps)


@dataclass
class Plan:
    feats: list[Feat]
    lengths: list[list[int]]  # per file, per episode: steps
    splits: list[str]
    meta: str  # proto, legacy or none (features.json)
    info: bool  # dataset_info.json beside it
    texts: str = "same"  # same, varies, latin1
    where: str = "local"  # local or memory
    workers: int = 1
    name: str = "toy"
    extra: list[str] = field(default_factory=list)  # record features features.json does not declare


def _values(rng: np.random.Generator, feat: Feat, steps: int) -> object:
    """One episode's values of ``feat``: ``[steps, *actual]`` arrays, or texts."""
    if feat.cls in ("text", "flag"):
        return None  # texts: _texts; is_first, is_last: write_plan
    shape = (steps, *feat.actual)
    dtype = np.dtype(feat.dtype)
    if feat.cls == "ragged":
        return [rng.random((int(rng.integers(0, 3)), 2), dtype=np.float32) for _ in range(steps)]
    if feat.cls == "dynamic":
        return [rng.random((1 + i % 2, 2), dtype=np.float32) for i in range(steps)]
    if feat.cls == "float_image":
        return rng.random(shape, dtype=np.float32)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = (0, 255) if feat.cls == "image" and dtype == np.uint8 else (info.min, info.max)
        extremes = np.array([info.min, info.max, 0], dtype)
        out = rng.integers(lo, hi, size=shape, dtype=dtype, endpoint=True)
        if out.size and feat.cls == "tensor":
            out.reshape(-1)[: min(3, out.size)] = extremes[: min(3, out.size)]
        return out
    values = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4)
    if out_size := values.size:
        values.reshape(-1)[: min(2, out_size)] = [0.0, -0.0][: min(2, out_size)]
    return values.astype(dtype)


def _texts(plan: Plan, e: int, steps: int) -> list[bytes]:
    base = f"pick block {e} ünd place".encode()
    if plan.texts == "varies":
        return [base if i < steps // 2 + 1 else f"place block {e}".encode() for i in range(steps)]
    if plan.texts == "latin1":
        return [base if i != steps - 1 else f"stapel {e} \xfc".encode("latin-1") for i in range(steps)]
    return [base] * steps


def _png(image: np.ndarray) -> bytes:
    pil = PILImage.fromarray(np.ascontiguousarray(image[..., 0] if image.shape[-1] == 1 else image))
    buf = io.BytesIO()
    pil.save(buf, format="PNG")
    return buf.getvalue()


def _jpeg(image: np.ndarray) -> bytes:
    pil = PILImage.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
    buf = io.BytesIO()
    pil.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _serialize(feat: Feat, values, texts: list[bytes], steps: int) -> dict:
    """``tfrecord`` writer datum entries (name -> (values, list kind)) of one feature, TFDS's way."""
    key = f"steps/{feat.path}"
    if feat.cls == "flag":
        return {}
    if feat.cls == "text":
        return {key: (texts, "byte")}
    if feat.cls == "image":
        encode = _png if feat.fmt == "png" else _jpeg
        return {key: ([encode(v) for v in values], "byte")}
    if feat.cls == "float_image":  # _FloatImageEncoder: the float32 bits as a 4-channel uint8 PNG
        return {key: ([_png(np.ascontiguousarray(v).view(np.uint8)) for v in values], "byte")}
    if feat.cls == "dynamic":  # Tensor of 2+ unknown dimensions, encoded: {value, shape}
        shapes = [s for v in values for s in v.shape]
        return {f"{key}/value": ([v.tobytes() for v in values], "byte"), f"{key}/shape": (shapes, "int")}
    if feat.cls == "ragged":  # a Sequence inside the step: ragged_flat_values + row lengths
        flat = np.concatenate([v.reshape(-1) for v in values]) if values else np.zeros(0, np.float32)
        return {
            f"{key}/ragged_flat_values": (flat.tolist(), "float"),
            f"{key}/ragged_row_lengths_0": ([len(v) for v in values], "int"),
        }
    array = np.asarray(values)
    if feat.encoding != "none":  # Tensor.encode_example: tobytes (zlib-compressed)
        raw = [np.ascontiguousarray(v).tobytes() for v in array]
        return {key: ([zlib.compress(r) for r in raw] if feat.encoding == "zlib" else raw, "byte")}
    if array.dtype == np.bool_:
        array = array.astype(np.int64)
    if array.dtype.kind in "iu":
        flat = array.reshape(-1).astype(np.uint64).view(np.int64) if array.dtype == np.uint64 else array.reshape(-1)
        return {key: ([int(v) for v in flat], "int")}
    return {key: (array.reshape(-1).astype(np.float32).tolist(), "float")}


# --- features.json, as TFDS writes it (FeatureConnector.save_config) and in its legacy form


def _proto_leaf(feat: Feat) -> dict:
    dims = {"dimensions": [str(d) for d in feat.shape]} if feat.shape else {}
    if feat.cls == "text":
        return {"pythonClassName": TFDS + "text_feature.Text", "text": {}}
    if feat.cls in ("image", "float_image"):
        dtype = "float32" if feat.cls == "float_image" else feat.dtype
        return {
            "pythonClassName": TFDS + "image_feature.Image",
            "image": {"shape": dims, "dtype": dtype, "encodingFormat": feat.fmt},
        }
    if feat.cls == "ragged":
        inner = {"tensor": {"shape": {"dimensions": ["2"]}, "dtype": "float32", "encoding": "none"}}
        return {"pythonClassName": TFDS + "sequence_feature.Sequence", "sequence": {"feature": inner, "length": "-1"}}
    dtype, encoding = (feat.dtype, feat.encoding) if feat.cls in ("tensor", "flag") else ("float32", "bytes")
    cls = "scalar.Scalar" if not feat.shape else "tensor_feature.Tensor"
    return {"pythonClassName": TFDS + cls, "tensor": {"shape": dims, "dtype": dtype, "encoding": encoding}}


def _legacy_leaf(feat: Feat) -> dict:
    shape = [None if d == -1 else d for d in feat.shape]
    if feat.cls == "text":
        return {"type": TFDS + "text_feature.Text", "content": {}}
    if feat.cls in ("image", "float_image"):
        dtype = "float32" if feat.cls == "float_image" else feat.dtype
        return {
            "type": TFDS + "image_feature.Image",
            "content": {"shape": shape, "dtype": dtype, "encoding_format": feat.fmt},
        }
    if feat.cls == "ragged":
        inner = {"type": TFDS + "feature.Tensor", "content": {"shape": [2], "dtype": "float32"}}
        return {"type": TFDS + "sequence_feature.Sequence", "content": {"feature": inner, "length": None}}
    dtype, encoding = (feat.dtype, feat.encoding) if feat.cls in ("tensor", "flag") else ("float32", "bytes")
    return {"type": TFDS + "feature.Tensor", "content": {"shape": shape, "dtype": dtype, "encoding": encoding}}


def _nest(feats: list[Feat], leaf) -> dict:
    tree: dict = {}
    for feat in feats:
        node = tree
        parts = feat.path.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = leaf(feat)
    return tree


def features_json(plan: Plan) -> dict:
    legacy = plan.meta == "legacy"
    leaf = _legacy_leaf if legacy else _proto_leaf

    def as_dict(tree: dict) -> dict:
        features = {k: (v if ("type" in v or "pythonClassName" in v) else as_dict(v)) for k, v in tree.items()}
        if legacy:
            return {"type": TFDS + "features_dict.FeaturesDict", "content": features}
        return {"pythonClassName": TFDS + "features_dict.FeaturesDict", "featuresDict": {"features": features}}

    steps = as_dict(_nest(plan.feats, leaf))
    meta = {"file_path": leaf(Feat("file_path", "text"))}
    if legacy:
        return as_dict(
            {"steps": {"type": TFDS + "dataset_feature.Dataset", "content": {"feature": steps, "length": None}}}
            | {"episode_metadata": as_dict(meta)}
        )
    dataset = {"pythonClassName": TFDS + "dataset_feature.Dataset", "sequence": {"feature": steps, "length": "-1"}}
    return as_dict({"steps": dataset, "episode_metadata": as_dict(meta)})


def write_plan(plan: Plan, root: str, seed: int, compress: str | None = None) -> list[str]:
    """The TFDS folder of ``plan`` (features.json and shards); returns the TFRecord paths."""
    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    if plan.meta != "none":
        with open(os.path.join(root, "features.json"), "w") as f:
            json.dump(features_json(plan), f, indent=4, sort_keys=True)
    if plan.info:
        with open(os.path.join(root, "dataset_info.json"), "w") as f:
            json.dump({"name": plan.name, "fileFormat": "tfrecord", "splits": [{"name": s} for s in plan.splits]}, f)
    paths, e = [], 0
    counts = {s: plan.splits.count(s) for s in plan.splits}
    seen: dict[str, int] = {}
    for lengths, split in zip(plan.lengths, plan.splits, strict=True):
        i = seen[split] = seen.get(split, -1) + 1
        path = os.path.join(root, f"{plan.name}-{split}.tfrecord-{i:05d}-of-{counts[split]:05d}")
        writer = tfrecord.TFRecordWriter(path)
        for steps in lengths:
            datum: dict = {}
            texts = _texts(plan, e, steps)
            for feat in plan.feats:
                datum.update(_serialize(feat, _values(rng, feat, steps), texts, steps))
            datum["steps/is_first"] = ([int(i == 0) for i in range(steps)], "int")
            datum["steps/is_last"] = ([int(i == steps - 1) for i in range(steps)], "int")
            for extra in plan.extra:
                datum[f"steps/{extra}"] = ([float(i) for i in range(steps)], "float")
            datum["episode_metadata/file_path"] = ([f"/raw/ep{e}.npz".encode()], "byte")
            writer.write(datum)
            e += 1
        writer.close()
        if compress == "GZIP":
            with open(path, "rb") as f:
                data = f.read()
            with gzip.open(path, "wb") as f:
                f.write(data)
        elif compress == "ZLIB":
            with open(path, "rb") as f:
                data = f.read()
            with open(path, "wb") as f:
                f.write(zlib.compress(data))
        paths.append(path)
    return paths


# --- the oracle: TFDS's decoding, on the tfrecord package's framing and Google's protobuf


def _oracle_specs(node: dict, path: str = "", depth: int = 0, out: dict | None = None) -> dict:
    """features.json -> {steps path: (class, dtype, shape with None, encoding)} (feature.from_json)."""
    out = {} if out is None else out
    if "type" in node and "content" in node:  # legacy: class name and content
        cls, content = node["type"].rsplit(".", 1)[-1], node["content"]
        if cls == "FeaturesDict":
            for k, v in content.items():
                _oracle_specs(v, f"{path}/{k}" if path else k, depth, out)
        elif cls in ("Sequence", "Dataset"):
            _oracle_specs(content["feature"], path, depth + 1, out)
        elif cls == "Text":
            out[path] = ("Text" if depth == 1 else "Ragged", "string", (), "none")
        elif cls == "Image":
            out[path] = ("Image", content["dtype"], tuple(content["shape"]), "none")
        else:
            cls = "Tensor" if depth == 1 else "Ragged"
            shape = tuple(content["shape"])
            out[path] = (cls, content["dtype"], shape, content.get("encoding", "none"))
        return out
    if "featuresDict" in node:
        for k, v in node["featuresDict"]["features"].items():
            _oracle_specs(v, f"{path}/{k}" if path else k, depth, out)
    elif "sequence" in node:
        _oracle_specs(node["sequence"]["feature"], path, depth + 1, out)
    elif "text" in node:
        out[path] = ("Text" if depth == 1 else "Ragged", "string", (), "none")
    elif "image" in node:
        dims = tuple(None if int(d) == -1 else int(d) for d in node["image"]["shape"].get("dimensions", []))
        out[path] = ("Image", node["image"]["dtype"], dims, "none")
    elif "tensor" in node:
        t = node["tensor"]
        dims = tuple(None if int(d) == -1 else int(d) for d in t.get("shape", {}).get("dimensions", []))
        out[path] = ("Tensor" if depth == 1 else "Ragged", t["dtype"], dims, t.get("encoding") or "none")
    return out


def _decode_image(data: bytes, dtype: str, channels: int) -> np.ndarray:
    """``tf.image.decode_image(data, channels, dtype)``: PNG with Pillow, JPEG as FFmpeg decodes it."""
    if data[:2] == b"\xff\xd8":
        ctx = av.CodecContext.create("mjpeg", "r")
        frame = (ctx.decode(av.Packet(data)) + ctx.decode(None))[0]
        rgb = frame.to_ndarray(format="rgb24")
        return rgb[..., :1] if channels == 1 else rgb
    with PILImage.open(io.BytesIO(data)) as pil:
        array = np.asarray(pil)
    if dtype == "uint16":
        return array.astype(np.uint16)[..., None]
    return array[..., None] if array.ndim == 2 else array


def oracle_episodes(paths: list[str], spec_json: dict | None, compression: str | None = None) -> list[dict]:
    """Every record of ``paths`` (in order) decoded as TFDS decodes it: {steps path: values}.

    Tensors: ``[steps, *shape]`` in the declared dtype; Images: decoded arrays ``[steps, H, W, C]``;
    Text: bytes. A feature TFDS cannot read back is ``("refused", why)``. Without features.json
    (TFDS cannot read such a folder), each list's raw values: int64, float32 or bytes.
    """
    specs = {k[6:]: v for k, v in _oracle_specs(spec_json).items() if k.startswith("steps/")} if spec_json else None
    out = []
    for path in paths:
        for data in tfrecord_iterator(path, compression_type=compression.lower() if compression else None):
            features = example_pb2.Example.FromString(bytes(data)).features.feature
            steps = len(features["steps/is_first"].int64_list.value)
            episode: dict = {"__steps__": steps}
            for name, feature in features.items():
                if not name.startswith("steps/"):
                    continue
                which = feature.WhichOneof("kind")
                raw = list(getattr(feature, which).value) if which else []
                if specs is None:
                    kinds = {"bytes_list": list, "int64_list": lambda r: np.array(r, np.int64)}
                    episode[name[6:]] = kinds.get(which, lambda r: np.array(r, np.float32))(raw)
                    continue
                if name[6:] not in specs:
                    continue
                episode[name[6:]] = _oracle_decode(specs[name[6:]], which, raw, steps)
            for key, spec in (specs or {}).items():  # declared, stored under other names
                if key not in episode:
                    episode[key] = ("refused", spec[0])
            out.append(episode)
    return out


def _oracle_decode(spec: tuple, which: str | None, raw: list, steps: int):
    cls, dtype, shape, encoding = spec
    if cls == "Ragged":
        return ("refused", "ragged")
    if cls == "Text":
        return raw
    if cls == "Image":
        if dtype == "float32":  # _FloatImageEncoder.decode_image: tf.bitcast to float32
            return ("refused", "float32 image")
        return np.stack([_decode_image(v, dtype, shape[-1]) for v in raw]) if raw else None
    if shape.count(None) > 1:
        return ("refused", "dynamic")
    if encoding != "none":  # Tensor.decode_example_np
        per = [zlib.decompress(v) if encoding == "zlib" else v for v in raw]
        items = [np.frombuffer(v, dtype).reshape([-1 if d is None else d for d in shape]) for v in per]
        return np.stack(items) if items else np.zeros((0, *[d or 0 for d in shape]), dtype)
    if None in shape:  # _to_tf_example_spec: unknown dimension not at the first position
        return ("refused", "unknown dimension")
    expected = "float_list" if np.dtype(dtype).kind == "f" else "int64_list"
    assert which in (expected, None), (which, expected)  # tf.io.parse_single_example would refuse
    array = np.array(raw, np.float32 if expected == "float_list" else np.int64).reshape((steps, *shape))
    if dtype == "uint64":
        return array.view(np.uint64)
    return array != 0 if dtype == "bool" else array.astype(dtype)


# --- what epishard must return for the oracle's episodes (docs/sources/rlds.md)


def _frames(image: np.ndarray) -> np.ndarray:
    """The camera's frames as the shards hold them: uint8 RGB (grey repeated, alpha dropped), uint16 grey."""
    if image.dtype == np.uint16:
        return image[..., 0]
    if image.shape[-1] == 1:
        return np.repeat(image, 3, axis=-1)
    return image[..., :3]


def expected_episode(plan: Plan, episode: dict, order: list[str]) -> dict:
    """{"columns": {name: array}, "frames": {camera: array}, "texts", "steps"} of one episode.

    ``order``: the per-step features in features.json's order (without it: the record's).
    """
    feats = {f.path: f for f in plan.feats}
    steps = episode["__steps__"]
    columns: dict[str, np.ndarray] = {}
    frames: dict[str, np.ndarray] = {}
    numeric = {
        k: v for k, v in episode.items() if k in feats and feats[k].cls == "tensor" and isinstance(v, np.ndarray)
    }
    if plan.meta == "none":  # from the record alone: numbers [T, width], int64 and float32
        numeric = {k: v.reshape(steps, -1) if steps and v.size // steps != 1 else v for k, v in numeric.items()}
    cams = [
        f.path
        for f in plan.feats
        if (f.cls == "image" and (plan.meta != "none" or f.dtype == "uint8"))
        or (
            f.cls == "tensor"
            and f.dtype == "uint8"
            and len(f.shape) == 3
            and f.shape[-1] in (1, 3, 4)
            and -1 not in f.shape
        )
    ]
    if plan.meta == "none":
        cams = [c for c in cams if feats[c].cls == "image"]
    last = [c.split("/")[-1] for c in cams]
    for cam, part in zip(cams, last, strict=True):
        if last.count(part) > 1:
            part = cam.removeprefix("observation/").replace("/", "_")
        value = episode.get(cam)
        if plan.meta == "none" and steps:  # raw bytes: decoded as the declared-less reader does (RGB)
            value = np.stack([_decode_image(v, "uint8", 3) for v in value])
        frames[f"observation.images.{part}"] = _frames(value) if steps else None

    def flat(a):
        return a.reshape(a.shape[0], -1)

    if "observation/state" in numeric:
        columns["observation.state"] = flat(numeric.pop("observation/state"))
    # features.json order (TFDS saves it with sorted keys: save_config's json.dumps(sort_keys=True))
    action = [k for k in order if k in numeric and (k == "action" or k.startswith("action/"))]
    if "action" in action:
        action = ["action"]
    if action:
        columns["action"] = np.concatenate([flat(numeric.pop(k)) for k in action], axis=1)
    if "reward" in numeric:
        columns["next.reward"] = numeric.pop("reward")
    language = next(
        (k for k in ("language_instruction", "observation/natural_language_instruction") if k in feats), None
    )
    for key in sorted(numeric):
        if key in cams or key in ("is_first", "is_last"):
            continue
        name = key.replace("/", ".")
        if name in columns or name in RESERVED or name == "language_instruction":
            continue
        columns[name] = numeric[key]
    texts = [t.decode("utf-8", "replace") for t in episode[language]] if language else None
    return {"columns": columns, "frames": frames, "texts": texts, "steps": steps}


# --- generation of the variations


def plan_variation(rng: np.random.Generator, index: int) -> Plan:
    """A random TFDS RLDS dataset: features, episode lengths, files, metadata, where it is read.

    The metadata (proto, legacy, none) and where it is read from (a folder, ``memory://``) cycle
    with ``index``, so that the CI sample has each; the rest is drawn from ``rng``.
    """
    meta = ["proto", "legacy", "none", "proto"][index % 4]
    h, w = 2 * int(rng.integers(3, 9)), 2 * int(rng.integers(3, 9))
    feats: list[Feat] = []
    if meta == "none":  # only what the record alone tells: float32 vectors, int flags, PNG/JPEG images
        feats += [
            Feat("observation/state", "tensor", "float32", (int(rng.integers(1, 6)),)),
            Feat("action", "tensor", "float32", (int(rng.integers(2, 8)),)),
            Feat("reward", "tensor", "float32", ()),
            Feat("observation/image", "image", "uint8", (h, w, 3), fmt=str(rng.choice(["png", "jpeg"]))),
            Feat("language_instruction", "text", "string"),
        ]
        for f in feats:
            f.actual = f.shape
    else:
        nested = rng.random() < 0.5
        feats.append(Feat("observation/state", "tensor", str(rng.choice(DTYPES)), _shape(rng)))
        if rng.random() < 0.5:
            feats.append(Feat("action", "tensor", str(rng.choice(["float32", "float64", "int32"])), _shape(rng)))
        else:  # RT-1 style: action parts concatenated in features.json order
            for part in ("world_vector", "rotation_delta", "gripper_closedness_action"):
                feats.append(Feat(f"action/{part}", "tensor", "float32", (int(rng.integers(1, 4)),)))
        feats += [
            Feat("is_first", "flag", "bool", ()),
            Feat("is_last", "flag", "bool", ()),
            Feat("reward", "tensor", str(rng.choice(["float32", "float64"])), ()),
            Feat("discount", "tensor", "float32", ()),
            Feat("is_terminal", "tensor", "bool", ()),
        ]
        for i in range(int(rng.integers(2, 6))):  # every dtype, scalar and tensor shapes, every encoding
            dtype = str(rng.choice(DTYPES))
            shape = _shape(rng, unknown=True)
            encoding = str(rng.choice(["none", "bytes", "zlib"]))
            where = "observation/robot" if nested and i % 2 else "observation"
            feats.append(Feat(f"{where}/x{i}_{dtype}", "tensor", dtype, shape, encoding))
        cams = int(rng.integers(1, 4))
        collide = cams >= 2 and rng.random() < 0.3
        for c in range(cams):
            name = f"observation/{['left', 'right', 'top'][c]}/image" if collide else f"observation/cam{c}"
            kind = str(rng.choice(["png", "jpeg", "raw", "png16"]))
            channels = int(rng.choice([1, 3, 4])) if kind in ("png", "raw") else int(rng.choice([1, 3]))
            if kind == "raw":
                feats.append(
                    Feat(name, "tensor", "uint8", (h, w, channels), str(rng.choice(["none", "bytes", "zlib"])))
                )
            elif kind == "png16":
                feats.append(Feat(name, "image", "uint16", (h, w, 1), fmt="png"))
            else:
                feats.append(Feat(name, "image", "uint8", (h, w, channels), fmt=kind))
        feats.append(
            Feat(
                str(rng.choice(["language_instruction", "observation/natural_language_instruction"])), "text", "string"
            )
        )
        for cls in ("float_image", "dynamic", "ragged"):  # what TFDS stores that a table cannot hold
            if rng.random() < 0.3:
                shape = (h, w, 1) if cls == "float_image" else (-1, -1) if cls == "dynamic" else ()
                feats.append(Feat(f"observation/{cls}", cls, "float32", shape))
        for f in feats:
            f.actual = tuple(int(rng.integers(1, 4)) if d == -1 else d for d in f.shape)
    files = int(rng.integers(1, 4))
    lengths = [[int(rng.choice([0, 1, 2, 3, 5, 8])) for _ in range(int(rng.integers(1, 4)))] for _ in range(files)]
    if not any(n for ls in lengths for n in ls):
        lengths[0][0] = 4
    if meta == "none" and lengths[0][0]:
        lengths[0].insert(0, 0) if rng.random() < 0.5 else None  # the first record empty: the mapping from the next
    splits = sorted(str(rng.choice(["train", "train", "val"])) for _ in range(files))
    return Plan(
        feats=feats,
        lengths=lengths,
        splits=splits,
        meta=meta,
        info=bool(rng.random() < 0.5),
        texts=str(rng.choice(["same", "varies", "latin1"])),
        where=["local", "memory", "local"][index % 3],
        workers=int(rng.choice([1, 2])),
        extra=["undeclared"] if meta != "none" and rng.random() < 0.3 else [],
    )


def _shape(rng: np.random.Generator, unknown: bool = False) -> tuple:
    choices = [(), (int(rng.integers(1, 5)),), (2, 3)]
    if unknown:
        choices.append((-1,))
    return choices[int(rng.integers(0, len(choices)))]


# --- comparing the converted shards with the oracle


def _flat(column) -> tuple[np.ndarray, list[int]]:
    """A table column's values, flattened, and the sizes of its fixed-size list levels."""
    array = column.combine_chunks()
    sizes = []
    while pa.types.is_fixed_size_list(array.type) or pa.types.is_list(array.type):
        if pa.types.is_fixed_size_list(array.type):
            sizes.append(array.type.list_size)
        array = array.flatten()
    return array.to_numpy(zero_copy_only=False), sizes


def _equal_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Same dtype, same values bit for bit (-0.0 is not 0.0; NaN payloads count)."""
    if got.dtype != want.dtype or got.size != want.size:
        return False
    return (
        np.ascontiguousarray(got).view(np.uint8).tobytes()
        == np.ascontiguousarray(want).reshape(-1).view(np.uint8).tobytes()
    )


def source_url(plan: Plan, root: str, key: str) -> tuple[str, object]:
    """Where the converter reads ``root`` from (the folder or a ``memory://`` copy) and how to clean up."""
    if plan.where == "memory":
        fs = fsspec.filesystem("memory")
        base = f"/oracle-rlds-{key}/{plan.name}/1.0.0"
        for name in os.listdir(root):
            with open(os.path.join(root, name), "rb") as f:
                fs.pipe(f"{base}/{name}", f.read())
        return f"memory://{base.lstrip('/')}", lambda: fs.rm(f"/oracle-rlds-{key}", recursive=True)
    return root, lambda: None


def compare(plan: Plan, oracle: list[dict], manifest, out: str, order: list[str], source: str | None = None) -> dict:
    """The converted episodes equal the oracle's, exactly; returns what was compared."""
    counts = {"rows": 0, "values": 0, "frames": 0, "refused": 0}
    empty = {i for i, ep in enumerate(oracle) if ep["__steps__"] == 0}
    skipped = {s.episode: s.kind for s in manifest.report.skipped}
    assert skipped == dict.fromkeys(empty, "empty_episode"), skipped  # zero steps: refused by name, counted
    counts["refused"] += len(empty)
    back = read_back(out)
    assert sorted(i for _, i in back) == [i for i in range(len(oracle)) if i not in empty]
    notes = manifest.sources[0].notes
    for f in plan.feats:
        if plan.meta != "none" and f.cls in ("float_image", "dynamic", "ragged"):
            assert any(n.startswith(f"steps/{f.path} (unsupported) is not kept: ") for n in notes), (f, notes)
        if plan.meta != "none" and f.cls == "tensor" and -1 in f.shape and f.encoding == "none":
            assert any(n.startswith(f"steps/{f.path} (unsupported) is not kept: ") for n in notes), (f, notes)
    for f in plan.feats:  # a column every table has: the feature is not kept, and said so
        if f.cls == "tensor" and f.path.replace("/", ".") in RESERVED and plan.meta != "none":
            name_ = f.path.replace("/", ".")
            assert f"steps/{f.path} (tensor) is not kept: its column name {name_} is taken" in notes, notes
    for f in plan.feats:  # a column every table has: the feature is not kept, and said so
        if f.cls == "tensor" and f.path.replace("/", ".") in RESERVED and plan.meta != "none":
            name_ = f.path.replace("/", ".")
            assert f"steps/{f.path} (tensor) is not kept: its column name {name_} is taken" in notes, notes
    for extra in plan.extra:
        assert f"steps/{extra} is in the records but not in features.json: not kept" in notes, notes
    warnings = {}
    for w in manifest.report.warnings:
        warnings.setdefault(w.episode, set()).add(w.kind)
    for i, ep in enumerate(oracle):
        if i in empty:
            continue
        want = expected_episode(plan, ep, order or [k for k in ep if k != "__steps__"])
        got = back[(source or plan.name, i)]
        table, steps = got["table"], want["steps"]
        assert table.num_rows == steps
        assert table.column("frame_index").to_pylist() == list(range(steps))
        assert _equal_bits(_flat(table.column("timestamp"))[0], (np.arange(steps) / FPS).astype(np.float32))
        kept = set(table.column_names) - {"frame_index", "timestamp", "language_instruction"}
        assert kept == set(want["columns"]), (i, sorted(kept), sorted(want["columns"]))
        for name, values in want["columns"].items():
            flat, sizes = _flat(table.column(name))
            assert sizes == list(values.shape[1:]) or (sizes == [] and values.ndim == 1), (name, sizes, values.shape)
            assert _equal_bits(flat, values), (i, name, flat[:8], values.reshape(-1)[:8])
            counts["values"] += values.size
        assert set(got["frames"]) == set(want["frames"]), (i, set(got["frames"]), set(want["frames"]))
        for cam, frames in want["frames"].items():
            assert _equal_bits(got["frames"][cam], frames), (i, cam, got["frames"][cam].shape, frames.shape)
            counts["frames"] += len(frames)
        if want["texts"] is not None:
            assert table.column("language_instruction").to_pylist() == want["texts"]
            assert got["tasks"] == want["texts"][:1]
            if len(set(want["texts"])) > 1:
                assert "language_varies" in warnings.get(i, set()), warnings
            if plan.texts == "latin1":
                assert "text_not_utf8" in warnings.get(i, set()), warnings
        counts["rows"] += steps
    return counts


def prepare(plan: Plan, seed: int, tmp: str) -> tuple[str, list[dict], list[str], list[str]]:
    """Write ``plan`` under ``tmp`` and read it with the oracle: (root, episodes, features order, paths)."""
    root = os.path.join(tmp, "src", plan.name, "1.0.0")
    paths = write_plan(plan, root, seed)
    spec = None
    if plan.meta != "none":
        with open(os.path.join(root, "features.json")) as f:
            spec = json.load(f)  # as written: TFDS sorts its keys
    order = [k[6:] for k in _oracle_specs(spec) if k.startswith("steps/")] if spec else []
    return root, oracle_episodes(paths, spec), order, paths


def _options(plan: Plan, remote: bool = False, workers: int | None = None) -> ConvertOptions:
    return ConvertOptions(
        progress=False,
        workers=plan.workers if workers is None else workers,
        on_error="skip",
        max_episodes_per_shard=2,
        sources=SourceOptions(format="rlds") if remote else None,  # a URL: named (detect_format judges its name)
    )


def _tally(counts: dict) -> dict:
    for k, v in counts.items():
        TOTALS[k] += v
    TOTALS["variations"] += 1
    return counts


def run_variation(plan: Plan, seed: int, tmp: str, runner=None) -> tuple[dict, list[dict], str]:
    """Write, read with the oracle, convert, compare; returns what was compared, the oracle's
    episodes and the output folder."""
    root, oracle, order, _ = prepare(plan, seed, tmp)
    url, cleanup = source_url(plan, root, str(seed))
    out = os.path.join(tmp, "out")
    try:
        manifest = convert([url], out, _options(plan, plan.where != "local"), runner=runner)
    finally:
        cleanup()
    return _tally(compare(plan, oracle, manifest, out, order)), oracle, out


@pytest.mark.parametrize("index", range(VARIATIONS))
def test_generated_variations_read_as_tfds_reads_them(index, tmp_path):
    seed = SEED * 1000 + index
    plan = plan_variation(np.random.default_rng(seed), index)
    counts, _, _ = run_variation(plan, seed, str(tmp_path))
    print(f"variation {index}: {plan.meta} {plan.where} workers={plan.workers} {counts}")


# --- targeted variations: each disagreement found, always run


H, W = 8, 10
FLAGS = [Feat("is_first", "flag", "bool", ()), Feat("is_last", "flag", "bool", ())]


def _finish(plan: Plan) -> Plan:
    for f in plan.feats:
        f.actual = tuple(2 if d == -1 else d for d in f.shape)
    return plan


def _base() -> list[Feat]:
    return [
        Feat("observation/state", "tensor", "float32", (3,)),
        Feat("action", "tensor", "float32", (2,)),
        *[Feat(f.path, f.cls, f.dtype, f.shape) for f in FLAGS],
        Feat("language_instruction", "text", "string"),
    ]


def _cameras() -> list[Feat]:
    return [
        Feat("observation/png_grey", "image", "uint8", (H, W, 1)),
        Feat("observation/png_rgb", "image", "uint8", (H, W, 3)),
        Feat("observation/png_rgba", "image", "uint8", (H, W, 4)),
        Feat("observation/jpeg_grey", "image", "uint8", (H, W, 1), fmt="jpeg"),
        Feat("observation/jpeg_rgb", "image", "uint8", (H, W, 3), fmt="jpeg"),
        Feat("observation/depth", "image", "uint16", (H, W, 1)),
        Feat("observation/raw_grey", "tensor", "uint8", (H, W, 1), "none"),  # an int64_list of pixels
        Feat("observation/raw_rgb", "tensor", "uint8", (H, W, 3), "bytes"),
        Feat("observation/raw_rgba", "tensor", "uint8", (H, W, 4), "zlib"),
        Feat("observation/left/image", "image", "uint8", (H, W, 3)),  # two cameras named "image"
        Feat("observation/right/image", "image", "uint8", (H, W, 3), fmt="jpeg"),
    ]


TARGETED = {
    # every dtype with every encoding (none, bytes, zlib), scalar, [2], [-1] and [2, 3]
    "dtypes": lambda: Plan(
        [
            *_base(),
            *[
                Feat(f"observation/{enc}/{dt}", "tensor", dt, shape, enc)
                for dt in DTYPES
                for enc, shape in (("none", ()), ("none", (2,)), ("bytes", (-1,)), ("zlib", (2, 3)), ("zlib", (-1,)))
            ],
        ],
        [[3, 1], [0, 5]],
        ["train", "val"],
        "proto",
        True,
        texts="varies",
        workers=2,
    ),
    # PNG of 1, 3, 4 channels, JPEG of 1, 3, 16-bit grey PNG, raw uint8 frames in each encoding
    "cameras": lambda: Plan(_base() + _cameras(), [[4], [1, 2]], ["train", "train"], "proto", False, where="memory"),
    # what a table cannot hold, and what features.json does not declare: named in the notes
    "unsupported": lambda: Plan(
        [
            *_base(),
            Feat("observation/float_image", "float_image", "float32", (H, W, 1)),
            Feat("observation/dynamic", "dynamic", "float32", (-1, -1)),
            Feat("observation/ragged", "ragged", "float32", ()),
            Feat("observation/unknown", "tensor", "float32", (-1,), "none"),  # TFDS cannot read it back
            Feat("frame_index", "tensor", "int64", ()),  # a column every table has
        ],
        [[2, 3]],
        ["train"],
        "proto",
        True,
        extra=["undeclared"],
    ),
    "legacy": lambda: Plan(
        [
            *_base(),
            *_cameras()[:3],
            Feat("observation/dynamic", "dynamic", "float32", (-1, -1)),
            Feat("observation/bits", "tensor", "uint64", (2,), "zlib"),
            Feat("is_terminal", "tensor", "bool", ()),
        ],
        [[2], [3]],
        ["train", "train"],
        "legacy",
        False,
        workers=2,
    ),
    # no features.json, the first record empty: the mapping comes from the next (its images)
    "no_features": lambda: Plan(
        [
            Feat("observation/state", "tensor", "float32", (3,)),
            Feat("action", "tensor", "float32", (1,)),
            Feat("observation/image", "image", "uint8", (H, W, 3)),
            Feat("observation/wrist", "image", "uint8", (H, W, 3), fmt="jpeg"),
            Feat("language_instruction", "text", "string"),
        ],
        [[0, 3, 2]],
        ["train"],
        "none",
        False,
        texts="latin1",
    ),
}


@pytest.mark.parametrize("name", sorted(TARGETED))
def test_targeted_variations_read_as_tfds_reads_them(name, tmp_path):
    plan = _finish(TARGETED[name]())
    counts, oracle, out = run_variation(plan, SEED, str(tmp_path))
    print(f"targeted {name}: {counts}")
    if name == "cameras":  # through the stream reader too: the frames a trainer gets
        rows = stream_rows(out, "observation.images.left_image")
        assert sorted(rows) == [(e, i) for e, ep in enumerate(oracle) for i in range(ep["__steps__"])]
        for (e, i), sample in rows.items():
            frame = np.asarray(sample["observation.images.left_image"][0])  # [3, H, W]
            assert np.array_equal(frame.transpose(1, 2, 0), oracle[e]["observation/left/image"][i])


@pytest.mark.parametrize("packed", ["GZIP", "ZLIB"])
def test_compressed_tfrecord_files_are_refused_by_name(packed, tmp_path):
    """TFDS writes TFRecord files uncompressed; TensorFlow can write GZIP or ZLIB ones. Their
    records cannot be reached without decompressing all before them: refused, naming the file."""
    plan = _finish(Plan(_base(), [[2, 3], [1]], ["train", "train"], "proto", True))
    root = str(tmp_path / "src" / "toy" / "1.0.0")
    paths = write_plan(plan, root, SEED, compress=packed)
    if packed == "GZIP":  # the oracle reads them (tfrecord_iterator(compression_type="gzip"))
        assert [ep["__steps__"] for ep in oracle_episodes(paths, None, "GZIP")] == [2, 3, 1]
    with pytest.raises(SourceError) as err:
        convert([root], str(tmp_path / "out"), _options(plan))
    assert f"{paths[0]}: a {packed}-compressed TFRecord file" in str(err.value), err.value
    TOTALS["refused"] += 1


def test_an_http_tfrecord_file_reads_as_tfds_reads_it(tmp_path):
    plan = _finish(TARGETED["no_features"]())
    plan.lengths = [[2, 3]]
    root, oracle, order, paths = prepare(plan, SEED, str(tmp_path))
    server, url = serve_http(root)
    try:
        out = str(tmp_path / "out")
        manifest = convert([f"{url}/{os.path.basename(paths[0])}"], out, _options(plan, remote=True))
    finally:
        server.shutdown()
    _tally(compare(plan, oracle, manifest, out, order, source="toy-train"))


def test_an_http_folder_reads_as_tfds_reads_it(tmp_path):
    """A folder's URL over HTTP (the server answers with its listing page) is listed, not taken for a file."""
    plan = _finish(TARGETED["no_features"]())
    _, oracle, order, _ = prepare(plan, SEED, str(tmp_path))
    server, url = serve_http(str(tmp_path / "src"))
    try:
        out = str(tmp_path / "out")
        manifest = convert([f"{url}/toy/1.0.0"], out, _options(plan, remote=True))
    finally:
        server.shutdown()
    _tally(compare(plan, oracle, manifest, out, order))


def test_what_tfds_cannot_read_is_refused_naming_file_episode_and_key(tmp_path):
    """A list of the other kind than the declared dtype (``tf.io.parse_single_example`` refuses
    it), and features that cannot be what ``--mapping`` makes them: refused, named."""
    plan = _finish(
        Plan(
            [*_base(), Feat("observation/count", "tensor", "int32", (2,)), *_cameras()[:1]],
            [[2, 3]],
            ["train"],
            "proto",
            False,
        )
    )
    root = str(tmp_path / "src" / "toy" / "1.0.0")
    write_plan(plan, root, SEED)
    # the same records, but steps/observation/count written as floats (TFDS writes int32 to an int64_list)
    path = os.path.join(root, "toy-train.tfrecord-00000-of-00001")
    records = [example_pb2.Example.FromString(bytes(r)) for r in tfrecord_iterator(path)]
    writer = tfrecord.TFRecordWriter(path)
    for i, ex in enumerate(records):
        datum = {}
        for name, feature in ex.features.feature.items():
            which = feature.WhichOneof("kind")
            kind = {"bytes_list": "byte", "float_list": "float", "int64_list": "int"}[which]
            datum[name] = (list(getattr(feature, which).value), kind)
        if i == 1:
            datum["steps/observation/count"] = ([float(v) for v in datum["steps/observation/count"][0]], "float")
        writer.write(datum)
    writer.close()
    manifest = convert([root], str(tmp_path / "o1"), _options(plan))
    (skip,) = manifest.report.skipped
    assert (skip.kind, skip.episode) == ("bad_feature", 1) and "steps/observation/count" in skip.message, skip
    assert "declares int32" in skip.message and skip.file.startswith(path)
    refusals = {
        "timestamp": ({"columns": {"timestamp": "reward"}}, "every episode table has its own timestamp"),
        "text": ({"action": ["language_instruction"]}, "steps/language_instruction holds text"),
        "image": ({"columns": {"pixels": "observation/png_grey"}}, "steps/observation/png_grey holds images"),
    }
    for name, (mapping, message) in refusals.items():
        options = dataclasses.replace(_options(plan), sources=SourceOptions(mapping=Mapping.from_dict(mapping)))
        with pytest.raises(ConversionError, match=message) as err:
            convert([root], str(tmp_path / f"o_{name}"), options)
        assert err.value.kind == "bad_feature" and err.value.path.endswith("features.json"), (name, err.value)
    # a dataset folder of two versions: two TFDS datasets, not one
    shutil.copytree(root, str(tmp_path / "src" / "toy" / "1.1.0"))
    with pytest.raises(SourceError, match=r"2 features\.json files .*convert one folder"):
        convert([str(tmp_path / "src" / "toy")], str(tmp_path / "o_versions"), _options(plan))


# --- concurrency: workers of their own, the same bytes every time


def _digests(out: str) -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(out):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, out)] = hashlib.sha256(f.read()).hexdigest()
    return found


def _loop_plan() -> Plan:
    return _finish(
        Plan(
            _base()
            + _cameras()[:2]
            + [
                Feat("observation/raw", "tensor", "uint8", (H, W, 3), "zlib"),
                Feat("observation/joints", "tensor", "float64", (7,), "bytes"),
                Feat("is_terminal", "tensor", "bool", ()),
            ],
            [[3, 2], [4, 0], [1, 5, 2]],
            ["train", "train", "val"],
            "proto",
            True,
        )
    )


@pytest.fixture(scope="module")
def loop_source(tmp_path_factory) -> dict:
    """The loop's dataset, its oracle reading and its workers=1 conversion (the reference bytes)."""
    tmp = str(tmp_path_factory.mktemp("loop"))
    plan = _loop_plan()
    root, oracle, order, _ = prepare(plan, SEED, tmp)
    out = os.path.join(tmp, "w1")
    manifest = convert([root], out, _options(plan, workers=1))
    _tally(compare(plan, oracle, manifest, out, order))
    return {"plan": plan, "root": root, "oracle": oracle, "order": order, "digests": _digests(out), "tmp": tmp}


def test_workers_2_repeatedly_write_the_bytes_of_workers_1(loop_source, tmp_path):
    """Each worker opens its own files (nothing opened in the parent is shared by forked workers):
    the concurrent conversion, repeated, is byte-identical to the one-process conversion."""
    src = loop_source
    for run in range(LOOPS):
        out = str(tmp_path / f"w2_{run}")
        manifest = convert([src["root"]], out, _options(src["plan"], workers=2))
        assert _digests(out) == src["digests"], run
        if run == 0:
            _tally(compare(src["plan"], src["oracle"], manifest, out, src["order"]))
    print(f"workers=2: {LOOPS} runs, byte-identical to workers=1")


# --- Ray: the conversion's tasks on a 2-node loopback cluster (last: the fixture keeps the
# module in a network namespace of its own until the module ends)


@pytest.fixture(scope="module")
def ray_address():
    import raycluster

    why = raycluster.unavailable()
    if why:
        pytest.skip(why)
    with raycluster.loopback_namespace(), contextlib.ExitStack() as stack:
        for attempt in range(2):  # a node waits 30 s for its raylet: a loaded machine may need another try
            try:
                address = stack.enter_context(raycluster.cluster())
                break
            except (RuntimeError, ConnectionError):  # `ray start` failed; ray.init found no node
                if attempt:
                    raise
        yield address


def test_ray_conversion_reads_as_tfds_and_writes_the_bytes_of_workers_1(loop_source, ray_address, tmp_path):
    from epishard.shardwriter.ray_convert import RayRunner

    src = loop_source
    runs = LOOPS if SWEEP else 1
    for run in range(runs):
        out = str(tmp_path / f"ray_{run}")
        manifest = convert([src["root"]], out, _options(src["plan"]), runner=RayRunner(ray_address))
        assert _digests(out) == src["digests"], run
        if run == 0:
            _tally(compare(src["plan"], src["oracle"], manifest, out, src["order"]))
    print(f"ray: {runs} runs, byte-identical to workers=1; compared in all: {TOTALS}")
