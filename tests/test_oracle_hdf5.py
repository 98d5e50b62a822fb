"""Oracle for the HDF5 sources (issue 35): epishard's rows and frames against ACT's and robomimic's readers.

Neither reader installs without its training stack (torch, robosuite, ROS, OpenCV), so each is
re-implemented here with h5py, rule by rule, from the code its users run:

- ALOHA / ACT: https://github.com/tonyzhaozh/act utils.py ``get_norm_stats`` and
  ``EpisodicDataset.__getitem__`` (and act-plus-plus utils.py for compressed files): episode ``i``
  is the file ``episode_<i>.hdf5``; ``root['/observations/qpos'][()]``, ``root['/action'][()]``,
  ``/observations/qvel``, ``/observations/effort``, ``root[f'/observations/images/{cam}'][()]``;
  when the file's ``compress`` attribute is true (read per file: ``root.attrs.get('compress',
  False)``), each image row goes whole, zero padding and all, to ``cv2.imdecode(row, 1)``, which
  returns blue first: the very arrays ALOHA's recorder gave ``cv2.imencode`` (aloha
  ``record_episodes.py``; LeRobot's ALOHA converter reads them the same way). OpenCV is not
  installed here: ``cv2_imdecode`` decodes the row with FFmpeg's JPEG decoder (PyAV) and puts the
  channels in cv2's order. The task is the file's ``language_instruction`` attribute, per file
  (epishard's rule, docs/sources/aloha.md; ACT has none).
- robomimic: https://github.com/ARISE-Initiative/robomimic robomimic/utils/dataset.py
  ``SequenceDataset.load_demo_info`` and ``load_dataset_in_memory``: the demos are
  ``list(f["data"].keys())`` sorted by ``int(name[5:])``; a demo's length is its ``num_samples``
  attribute (absent: epishard's documented fallback, the arrays' length); ``obs/<key>``,
  ``actions``, ``rewards``, ``dones`` read with ``[()]`` (robomimic then casts the last three to
  float32 for training; epishard keeps the stored dtype, compared before that cast). LIBERO
  (https://github.com/Lifelong-Robot-Learning/LIBERO, scripts/create_dataset.py writes it, its
  loaders read it): the task is ``json.loads(f["data"].attrs["problem_info"])["language_instruction"]``.

What the oracle reads is then laid out by epishard's documented mapping (docs/sources/aloha.md,
robomimic.md: state = qpos or the concatenated state keys, ``[T]`` as ``[T, 1]``; other per-step
arrays as columns named by their path; grey frames as R == G == B, alpha dropped, uint16 exact),
and compared with the converted output read back (``sourcecheck.read_back``): every column with
its dtype and every value bit for bit, every frame pixel for pixel, the task, the episode set.

Variations (``variations``, a seeded numpy Generator; each axis value recurs, every axis fully
covered within the first 12): ALOHA, robomimic and LIBERO layouts; the numbers as float16/32/64,
int8..64, uint8..64 and bool, little- and big-endian; contiguous, compact and chunked storage, the
chunks plain, gzip 1 and 9, lzf, shuffle + gzip, fletcher32 or scale-offset; cameras RGB, grey
``[T, H, W]`` and ``[T, H, W, 1]``, RGBA, uint16 depth in either byte order, float depth maps
(robomimic: a column), ALOHA JPEG rows zero-padded and variable-length; episodes of 0, 1, and
more than 32 rows (two frame chunks); episode numbers from 0, from 1, and with gaps (``demo_2``
before ``demo_10``, created out of order); metadata full, absent, or in other types (``compress``
an integer, texts as bytes, ``num_samples`` an array of one); optional keys present, absent, or
missing from one later episode; read from a local path, ``memory://`` and a loopback HTTP server;
converted with workers=1 and 2 (and Ray, ``test_ray_conversion_equals_the_oracle_and_workers_1``).
CI runs the first ``CI_VARIATIONS``; ``EPISHARD_SWEEP=1`` all ``SWEEP_VARIATIONS``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pytest
import raycluster
from conftest import SWEEP
from sourcecheck import read_back, stream_rows

from epishard.shardwriter import ConversionError, ConvertOptions, convert
from epishard.shardwriter.sources import SourceOptions, open_source

h5py = pytest.importorskip("h5py")

SEED = 35
CI_VARIATIONS = 12
SWEEP_VARIATIONS = 144
LOOPS = 20 if SWEEP else 3  # the concurrency loop

AXES: dict[str, tuple] = {
    "layout": ("aloha", "robomimic", "libero"),
    "dtype": ("f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"),
    "order": ("<", ">"),
    "storage": ("contiguous", "compact", "chunked", "gzip1", "gzip9", "lzf", "shuffle", "fletcher32", "scaleoffset"),
    "camera": ("rgb", "grey", "grey1", "rgba", "depth", "depth_be", "jpeg", "jpeg_vlen"),
    "lengths": ("plain", "zero", "one", "long"),
    "naming": ("sequential", "from1", "gaps"),
    "meta": ("full", "bare", "odd"),
    "optional": ("all", "none", "missing_later"),
    "access": ("local", "memory", "http"),
    "workers": (1, 2),
}


def variations(n: int) -> list[dict]:
    """``n`` variations: each axis walks seeded permutations of its values (all of them every ``len`` variations)."""
    rng = np.random.default_rng(SEED)
    picks = {
        axis: np.concatenate([rng.permutation(len(values)) for _ in range(-(-n // len(values)))])[:n]
        for axis, values in AXES.items()
    }
    return [{"id": i, **{axis: AXES[axis][int(picks[axis][i])] for axis in AXES}} for i in range(n)]


VARIATIONS = variations(SWEEP_VARIATIONS)[: SWEEP_VARIATIONS if SWEEP else CI_VARIATIONS]
TALLY = {"variations": 0, "episodes": 0, "rows": 0, "values": 0, "frames": 0, "skipped": 0, "fallbacks": 0}


# --- the oracle: ACT's and robomimic's reading rules, with h5py -------------------------------------------------


def cv2_imdecode(row) -> np.ndarray:
    """``cv2.imdecode(row, cv2.IMREAD_COLOR)``: the whole row (padding and all) decoded, uint8 ``[H, W, 3]`` blue first.

    The JPEG is decoded by FFmpeg (PyAV's ``mjpeg``/``png`` decoder, as epishard compares JPEG
    everywhere), then given cv2's channel order (OpenCV's ``imdecode`` returns BGR).
    """
    data = np.asarray(row, np.uint8).tobytes()
    codec = "png" if data.startswith(b"\x89PNG") else "mjpeg"
    ctx = av.CodecContext.create(codec, "r")
    frames = ctx.decode(av.Packet(data)) + ctx.decode(None)
    return frames[0].to_ndarray(format="rgb24")[..., ::-1]


def act_episode(path: str) -> dict:
    """One ALOHA episode file as ACT reads it (utils.py ``get_norm_stats``, ``EpisodicDataset``; act-plus-plus)."""
    with h5py.File(path, "r") as root:
        compressed = bool(root.attrs.get("compress", False))
        out: dict = {"qpos": root["/observations/qpos"][()], "action": root["/action"][()], "images": {}}
        for key in ("qvel", "effort"):
            if f"/observations/{key}" in root:
                out[key] = root[f"/observations/{key}"][()]
        for cam in root["/observations/images"]:
            images = root[f"/observations/images/{cam}"][()]
            if compressed:
                images = np.stack([cv2_imdecode(row) for row in images]) if len(images) else None
            out["images"][cam] = images
        text = root.attrs.get("language_instruction")
        out["task"] = None if text is None else text.decode() if isinstance(text, bytes) else str(text)
        out["others"] = {k: root[k][()] for k in ("base_action", "observations/tick") if k in root}
    return out


def act_dataset(folder: str) -> dict[int, dict]:
    """An ALOHA folder: episode ``i`` is ``episode_<i>.hdf5`` (ACT's ``os.path.join(dir, f'episode_{i}.hdf5')``)."""
    out = {}
    for name in os.listdir(folder):
        found = re.fullmatch(r"episode_(\d+)\.hdf5", name)
        if found:
            out[int(found.group(1))] = act_episode(os.path.join(folder, name))
    return out


def robomimic_dataset(path: str, obs_keys: tuple[str, ...]) -> tuple[dict[int, dict], dict]:
    """A robomimic/LIBERO file as ``SequenceDataset`` loads it: demo number -> arrays; and the ``data`` attributes."""
    out = {}
    with h5py.File(path, "r") as f:
        demos = list(f["data"].keys())
        demos = [demos[i] for i in np.argsort([int(name[5:]) for name in demos])]  # load_demo_info
        for demo in demos:
            g = f[f"data/{demo}"]
            length = g.attrs.get("num_samples")
            arrays = {f"obs/{k}": g[f"obs/{k}"][()] for k in obs_keys if f"obs/{k}" in g}
            arrays |= {k: g[k][()] for k in ("actions", "rewards", "dones", "states") if k in g}
            if "obs" in g:
                arrays |= {f"obs/{k}": g[f"obs/{k}"][()] for k in g["obs"] if f"obs/{k}" not in arrays}
            rows = len(arrays["actions"])
            out[int(demo[5:])] = {
                "num_samples": rows if length is None else int(np.asarray(length).reshape(-1)[0]),
                "arrays": arrays,
            }
        attrs = dict(f["data"].attrs)
    return out, attrs


def libero_task(attrs: dict) -> str | None:
    """LIBERO: ``json.loads(f["data"].attrs["problem_info"])["language_instruction"]``."""
    if "problem_info" not in attrs:
        return None
    text = attrs["problem_info"]
    return json.loads(text.decode() if isinstance(text, bytes) else text).get("language_instruction")


# --- generated sources ---------------------------------------------------------------------------------------


def _values(rng, dtype: np.dtype, shape) -> np.ndarray:
    """Values spanning ``dtype`` (integers over their whole range, floats with -0.0), finite."""
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    native = dtype.newbyteorder("=")
    if dtype.kind in "iu":
        info = np.iinfo(native)
        return rng.integers(info.min, info.max, shape, dtype=native, endpoint=True).astype(dtype)
    values = rng.standard_normal(shape) * (100 if dtype.itemsize == 2 else 1e4)
    if values.size:
        values.flat[0] = -0.0
    return values.astype(dtype)


def _dataset(group, name: str, data: np.ndarray, storage: str, rng) -> None:
    """``group[name] = data`` stored as ``storage`` says (chunked with a filter where the filter applies)."""
    if storage == "compact" and data.nbytes < 60_000 and data.dtype != object:
        parent = group.require_group(os.path.dirname(name)) if "/" in name else group
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        space = h5py.h5s.create_simple(data.shape)
        dsid = h5py.h5d.create(parent.id, os.path.basename(name).encode(), h5py.h5t.py_create(data.dtype), space, dcpl)
        if data.size:
            dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(data))
        return
    if storage in ("contiguous", "compact"):
        group.create_dataset(name, data=data)
        return
    rows = int(rng.integers(1, max(1, len(data)) + 1))
    kw: dict = {"chunks": (rows, *data.shape[1:])}
    if not len(data) or rng.random() < 0.5:  # resizable, as a recorder appending rows leaves it
        kw["maxshape"] = (None, *data.shape[1:])
    kw |= {
        "chunked": {},
        "gzip1": {"compression": "gzip", "compression_opts": 1},
        "gzip9": {"compression": "gzip", "compression_opts": 9},
        "lzf": {"compression": "lzf"},
        "shuffle": {"shuffle": True, "compression": "gzip", "compression_opts": 4},
        "fletcher32": {"fletcher32": True},
        "scaleoffset": {"scaleoffset": 0 if data.dtype.kind in "iu" else 3},
    }[storage]
    try:
        group.create_dataset(name, data=data, **kw)
    except (ValueError, TypeError):  # a filter HDF5 does not take for this dtype (scale-offset on bool, float16)
        TALLY["fallbacks"] += 1
        if name in group:
            del group[name]
        group.create_dataset(name, data=data, chunks=kw["chunks"], maxshape=kw.get("maxshape"), compression="gzip")


def _jpeg(rgb: np.ndarray) -> bytes:
    """What ALOHA's recorder stores: ``cv2.imencode('.jpg', rgb)``, which takes the array for BGR."""
    bgr = np.ascontiguousarray(rgb[..., ::-1])
    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height, ctx.pix_fmt, ctx.time_base = bgr.shape[1], bgr.shape[0], "yuvj420p", Fraction(1, 50)
    frame = av.VideoFrame.from_ndarray(bgr, format="rgb24").reformat(format="yuvj420p")
    return b"".join(bytes(p) for p in [*ctx.encode(frame), *ctx.encode(None)])


def _frames(rng, kind: str, t: int, size: tuple[int, int]) -> np.ndarray:
    """A camera's frames as a recorder writes them; JPEG kinds give the recorded RGB (encoded by ``_camera``)."""
    h, w = size
    if kind in ("jpeg", "jpeg_vlen"):  # smooth colours, so that JPEG keeps them: red, green, blue apart
        colours = rng.integers(20, 236, (t, 1, 1, 3))
        ramp = np.linspace(0, 16, w, dtype=np.int64)[None, None, :, None]
        return np.clip(colours + ramp, 0, 255).astype(np.uint8) if t else np.zeros((0, h, w, 3), np.uint8)
    shape = {"rgb": (t, h, w, 3), "grey": (t, h, w), "grey1": (t, h, w, 1), "rgba": (t, h, w, 4)}.get(kind)
    if shape is not None:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    depth = rng.integers(0, 65536, (t, h, w), dtype=np.uint16)
    if kind == "depth":
        return depth
    if kind == "depth_be":
        return depth.astype(">u2")[..., None]
    return rng.standard_normal((t, h, w, 1)).astype(np.float32)  # "depth_float": robomimic's depth maps


def _camera(group, key: str, frames: np.ndarray, kind: str, storage: str, rng) -> None:
    if kind == "jpeg":  # rows zero-padded to the longest image (and more), ALOHA's compress
        encoded = [_jpeg(f) for f in frames]
        width = max([len(b) for b in encoded], default=16) + int(rng.integers(0, 40))
        rows = np.zeros((len(encoded), width), np.uint8)
        for i, b in enumerate(encoded):
            rows[i, : len(b)] = np.frombuffer(b, np.uint8)
        _dataset(group, key, rows, storage if storage != "compact" else "contiguous", rng)
    elif kind == "jpeg_vlen":
        ds = group.create_dataset(key, (len(frames),), dtype=h5py.vlen_dtype(np.uint8))
        for i, f in enumerate(frames):
            ds[i] = np.frombuffer(_jpeg(f), np.uint8)
    else:
        _dataset(group, key, frames, storage, rng)


@dataclass
class Expected:
    """What epishard should give for one variation."""

    episodes: dict[tuple[str, int], dict] = field(default_factory=dict)  # (source, index) -> columns, frames, tasks
    skipped: dict[str, int] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # texts the source's notes must hold


def _lengths(spec: dict, rng, n: int) -> list[int]:
    lengths = [int(x) for x in rng.integers(2, 12, n)]
    special = {"plain": None, "zero": 0, "one": 1, "long": int(rng.integers(33, 41))}[spec["lengths"]]
    if special is not None:
        lengths[int(rng.integers(0, n))] = special
    return lengths


def _numbers(spec: dict, n: int) -> list[int]:
    return {"sequential": list(range(n)), "from1": list(range(1, n + 1)), "gaps": [2, 10, 11, 100][:n]}[spec["naming"]]


def _frames_out(images: np.ndarray) -> np.ndarray:
    """Frames as epishard represents them: RGB (grey repeated, alpha dropped) or uint16 ``[T, H, W]``."""
    images = images.astype(images.dtype.newbyteorder("="))
    if images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]
    if images.dtype == np.uint16:
        return images
    if images.ndim == 3:
        return np.repeat(images[..., None], 3, axis=-1)
    return images[..., :3]


def _rows(values: np.ndarray) -> np.ndarray:
    return values.reshape(len(values), -1) if values.ndim != 2 else values


def write_aloha(spec: dict, root: Path) -> None:
    """An ALOHA folder for ``spec``: episode_<n>.hdf5 files, written in a shuffled order."""
    rng = np.random.default_rng(1000 + spec["id"])
    dtype = np.dtype(spec["order"] + spec["dtype"] if spec["dtype"] != "b1" else "?")
    n = int(rng.integers(2, 4))
    numbers, lengths = _numbers(spec, n), _lengths(spec, rng, n)
    dim = int(rng.integers(1, 9))
    size = ((32, 32), (32, 48))[int(rng.integers(0, 2))]
    compressed = spec["camera"] in ("jpeg", "jpeg_vlen")
    root.mkdir(parents=True)
    for e in rng.permutation(n):
        number, t = numbers[e], lengths[e]
        with h5py.File(root / f"episode_{number}.hdf5", "w") as f:
            if spec["meta"] == "full":
                f.attrs["sim"] = False
                f.attrs["language_instruction"] = f"fold towel {number % 2}"
            if compressed:
                f.attrs["compress"] = np.int64(1) if spec["meta"] == "odd" else True
            elif spec["meta"] == "odd":
                f.attrs["compress"] = np.False_
            if spec["meta"] == "odd":
                f.attrs["language_instruction"] = np.bytes_(f"stack cups {number}".encode())
            st = spec["storage"]
            _dataset(f, "observations/qpos", _values(rng, dtype, (t, dim)), st, rng)
            action_shape = (t,) if dim == 1 else (t, dim)  # a one-joint arm's action: [T]
            _dataset(f, "action", _values(rng, dtype, action_shape), st, rng)
            if spec["optional"] == "all" or (spec["optional"] == "missing_later" and e != n - 1):
                _dataset(f, "observations/qvel", _values(rng, dtype, (t, dim)), st, rng)
                _dataset(f, "observations/effort", _values(rng, dtype, (t, dim)), st, rng)
                _dataset(f, "base_action", _values(rng, dtype, (t, 2)), st, rng)
                _dataset(f, "observations/tick", _values(rng, dtype, (t,)), st, rng)
            kinds = (spec["camera"], spec["camera"] if compressed else "rgb")
            for cam, kind in zip(("cam_high", "cam_left_wrist"), kinds, strict=True):
                _camera(f, f"observations/images/{cam}", _frames(rng, kind, t, size), kind, st, rng)
            if compressed:
                f.create_dataset("compress_len", data=np.zeros((2, t), np.float32))


def expect_aloha(spec: dict, root: Path, sources: list[str], names: dict[int, str], per_file: bool) -> Expected:
    """The oracle's reading of the folder, laid out by docs/sources/aloha.md (``per_file``: each file a source,
    whose own keys make its mapping: a file without ``qvel`` is then read without it, not refused)."""
    want = Expected(sources=sources)
    episodes = act_dataset(str(root))
    last = max(episodes)
    for number, ep in sorted(episodes.items()):
        t = len(ep["qpos"])
        if spec["optional"] == "missing_later" and number == last and not per_file:
            want.skipped["missing_key"] = want.skipped.get("missing_key", 0) + 1
            continue
        if t == 0:
            want.skipped["empty_episode"] = want.skipped.get("empty_episode", 0) + 1
            continue
        columns = {"observation.state": _rows(ep["qpos"]), "action": _rows(ep["action"])}
        if "qvel" in ep:
            columns |= {"observation.velocity": ep["qvel"], "observation.effort": ep["effort"]}
        columns |= {k.replace("/", "."): v for k, v in ep["others"].items()}
        frames = {f"observation.images.{cam}": _frames_out(v) for cam, v in ep["images"].items()}
        tasks = [ep["task"]] if ep["task"] else []
        want.episodes[(names[number], number)] = {"columns": columns, "frames": frames, "tasks": tasks}
    if spec["camera"] in ("jpeg", "jpeg_vlen"):
        want.notes.append("compress_len")
    return want


ROBOMIMIC_STATE = ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")
LIBERO_STATE = ("joint_states", "gripper_states")
ROBOMIMIC_CAMERAS = {  # camera axis -> (key under obs/, frames kind)
    "rgb": ("agentview_image", "rgb"),
    "grey": ("agentview_image", "grey"),
    "grey1": ("agentview_image", "grey1"),
    "rgba": ("agentview_image", "rgba"),
    "depth": ("agentview_depth", "depth"),
    "depth_be": ("agentview_depth", "depth_be"),
    "jpeg": ("agentview_depth", "depth_float"),
    "jpeg_vlen": ("agentview_rgb", "rgb"),
}


def write_robomimic(spec: dict, path: Path) -> None:
    """One robomimic (or LIBERO) file for ``spec``: data/demo_<n> groups, created in a shuffled order."""
    rng = np.random.default_rng(2000 + spec["id"])
    dtype = np.dtype(spec["order"] + spec["dtype"] if spec["dtype"] != "b1" else "?")
    libero = spec["layout"] == "libero"
    n = int(rng.integers(2, 5))
    numbers, lengths = _numbers(spec, n), _lengths(spec, rng, n)
    size = ((32, 32), (32, 48))[int(rng.integers(0, 2))]
    st = spec["storage"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        data = f.create_group("data", track_order=True)  # keys() in creation order: robomimic sorts them
        if libero and spec["meta"] != "bare":
            info = json.dumps({"problem_name": "libero_tabletop", "language_instruction": "put the bowl on the plate"})
            data.attrs["problem_info"] = np.bytes_(info.encode()) if spec["meta"] == "odd" else info
        if spec["meta"] == "full":
            data.attrs["total"] = sum(lengths)
            data.attrs["env_args"] = json.dumps({"env_name": "Lift", "type": 1})
        for d in rng.permutation(n):
            t = lengths[d]
            g = data.create_group(f"demo_{numbers[d]}")
            if spec["meta"] == "full":
                g.attrs["num_samples"] = t
            elif spec["meta"] == "odd":
                g.attrs["num_samples"] = np.array([t], np.int32)
            dims = (7, 2) if libero else (3, 4, 2)
            for key, dim in zip(LIBERO_STATE if libero else ROBOMIMIC_STATE, dims, strict=True):
                _dataset(g, f"obs/{key}", _values(rng, dtype, (t, dim)), st, rng)
            _dataset(g, "actions", _values(rng, dtype, (t, 7)), st, rng)
            if spec["optional"] == "all" or (spec["optional"] == "missing_later" and d != n - 1):
                _dataset(g, "rewards", _values(rng, dtype, (t,)), st, rng)
                _dataset(g, "dones", _values(rng, dtype, (t,)), st, rng)
                _dataset(g, "obs/object", _values(rng, dtype, (t, 5)), st, rng)
                _dataset(g, "states", _values(rng, dtype, (t, 9)), st, rng)
            key, kind = ROBOMIMIC_CAMERAS[spec["camera"]]
            _camera(g, f"obs/{key}", _frames(rng, kind, t, size), kind, st, rng)
            _camera(g, "obs/robot0_eye_in_hand_image", _frames(rng, "rgb", t, size), "rgb", st, rng)


def expect_robomimic(spec: dict, path: Path, source: str) -> Expected:
    """The oracle's reading of the file, laid out by docs/sources/robomimic.md."""
    want = Expected(sources=[source])
    libero_file = spec["layout"] == "libero"
    demos, attrs = robomimic_dataset(str(path), LIBERO_STATE if libero_file else ROBOMIMIC_STATE)
    libero = "problem_info" in attrs  # a LIBERO file without it is read as robomimic (docs)
    task = libero_task(attrs)
    state_keys = [f"obs/{k}" for k in (LIBERO_STATE if libero else ROBOMIMIC_STATE)]
    last = max(demos)
    for number, demo in demos.items():
        arrays, t = demo["arrays"], demo["num_samples"]
        assert all(len(v) == t for v in arrays.values()), "the generator writes num_samples rows"
        if spec["optional"] == "missing_later" and number == last:
            want.skipped["missing_key"] = want.skipped.get("missing_key", 0) + 1
            continue
        if t == 0:
            want.skipped["empty_episode"] = want.skipped.get("empty_episode", 0) + 1
            continue
        columns, frames = {}, {}
        present = [k for k in state_keys if k in arrays]
        if present:
            columns["observation.state"] = np.concatenate([_rows(arrays[k]) for k in present], axis=1)
        columns["action"] = _rows(arrays["actions"])
        for key, name in (("rewards", "next.reward"), ("dones", "next.done")):
            if key in arrays:
                columns[name] = arrays[key]
        for key, values in arrays.items():
            stem = key.removeprefix("obs/")
            camera = key.startswith("obs/") and stem.endswith(("_image", "_rgb", "_depth"))
            if camera and values.dtype.newbyteorder("=") in (np.uint8, np.uint16):
                name = re.sub(r"_(image|rgb)$", "", stem)
                frames[f"observation.images.{name}"] = _frames_out(values)
            elif key not in present and key not in ("actions", "rewards", "dones"):
                columns[key.replace("/", ".")] = values
        want.episodes[(source, number)] = {"columns": columns, "frames": frames, "tasks": [task] if task else []}
    if ROBOMIMIC_CAMERAS[spec["camera"]][1] == "depth_float":
        want.notes.append("kept as a column")
    return want


# --- comparing -------------------------------------------------------------------------------------------------


def arrow_numpy(table: pa.Table, name: str) -> np.ndarray:
    """A column as numpy with its Arrow element type kept: ``[T, d1, d2, ...]`` from nested fixed-size lists."""
    column = table.column(name).combine_chunks()
    shape, kind, flat = [], column.type, column
    while pa.types.is_fixed_size_list(kind):
        shape.append(kind.list_size)
        kind, flat = kind.value_type, flat.flatten()
    return flat.to_numpy(zero_copy_only=False).reshape(len(column), *shape)


def compare(out: str, want: Expected, manifest) -> None:
    """The converted output equals the oracle's episodes: columns bit for bit with dtypes, frames, tasks, episodes."""
    back = read_back(out)
    assert sorted(back) == sorted(want.episodes), (sorted(back), sorted(want.episodes))
    assert dict(manifest.report.skipped_by_kind) == want.skipped
    notes = " ".join(n for s in manifest.sources for n in s.notes)
    for text in want.notes:
        assert text in notes, (text, notes)
    for key, exp in want.episodes.items():
        ep = back[key]
        table = ep["table"]
        t = len(next(iter(exp["columns"].values())))
        assert table.num_rows == t and table.column("frame_index").to_pylist() == list(range(t)), key
        assert set(table.column_names) - {"frame_index", "timestamp"} == set(exp["columns"]), key
        for name, values in exp["columns"].items():
            got, native = arrow_numpy(table, name), values.astype(values.dtype.newbyteorder("="))
            assert got.dtype == native.dtype and got.shape == native.shape, (key, name, got.dtype, native.dtype)
            assert got.tobytes() == native.tobytes(), (key, name)  # bit for bit (-0.0 too)
            TALLY["values"] += native.size
        assert set(ep["frames"]) == set(exp["frames"]), (key, set(ep["frames"]), set(exp["frames"]))
        for camera, frames in exp["frames"].items():
            got = ep["frames"][camera]
            assert got.shape == frames.shape and got.dtype == frames.dtype, (key, camera, got.shape, frames.shape)
            assert np.array_equal(got, frames), (key, camera)
            TALLY["frames"] += len(frames)
        assert ep["tasks"] == exp["tasks"], (key, ep["tasks"], exp["tasks"])
        TALLY["episodes"] += 1
        TALLY["rows"] += t
    TALLY["skipped"] += sum(want.skipped.values())


@contextlib.contextmanager
def served(spec: dict, tmp: Path, local: str):
    """The source's URL(s) for ``spec["access"]``: the local path, ``memory://`` or a loopback HTTP server."""
    if spec["access"] == "local":
        yield [local]
        return
    rel = os.path.relpath(local, tmp)
    files = [local] if os.path.isfile(local) else sorted(str(p) for p in Path(local).iterdir())
    if spec["access"] == "memory":
        import fsspec

        fs = fsspec.filesystem("memory")
        base = f"/oracle-hdf5-{spec['id']}-{os.getpid()}"
        for path in files:
            fs.pipe(f"{base}/{os.path.relpath(path, tmp)}", Path(path).read_bytes())
        try:
            yield [f"memory://{base}/{rel}"]
        finally:
            fs.rm(base, recursive=True)
        return
    from remote_servers import serve_http

    server, url = serve_http(str(tmp))
    try:  # an HTTP folder cannot be listed: ALOHA episodes are given file by file (one source each)
        yield [f"{url}/{os.path.relpath(p, tmp)}" for p in files]
    finally:
        server.shutdown()


def run_variation(
    spec: dict, tmp: Path, workers: int | None = None, runner=None, out: str | None = None
) -> tuple[str, Expected]:
    """Write (once), read with the oracle, convert (into ``out``), compare; returns the output and the oracle's."""
    fmt = "aloha" if spec["layout"] == "aloha" else "robomimic"
    local = tmp / "aloha" if fmt == "aloha" else tmp / f"{spec['layout']}_demo.hdf5"
    if not local.exists():
        (write_aloha if fmt == "aloha" else write_robomimic)(spec, local)
    out = out or str(tmp / f"out-{workers or spec['workers']}-{'ray' if runner else 'local'}")
    with served(spec, tmp, str(local)) as urls:
        if fmt == "aloha":
            per_file = spec["access"] == "http"  # one source per file, named by it
            names = {int(p.stem.split("_")[1]): p.stem if per_file else "aloha" for p in local.iterdir()}
            want = expect_aloha(spec, local, urls, names, per_file)
        else:
            want = expect_robomimic(spec, local, local.stem)
        on_error = "skip" if want.skipped else "raise"
        options = ConvertOptions(
            progress=False,
            workers=workers or spec["workers"],
            max_episodes_per_shard=1,
            on_error=on_error,
            sources=SourceOptions(format=fmt),
        )
        manifest = convert(urls, out, options, runner=runner) if runner else convert(urls, out, options)
    compare(out, want, manifest)
    return out, want


@pytest.fixture(scope="module", autouse=True)
def tally():
    """Counts what the module compared; printed at its end (``pytest -s``)."""
    yield TALLY
    print(f"\nHDF5 oracle: {TALLY}")


def stream_check(out: str) -> None:
    """Each episode's first camera and state read through ``WindowDataset``: what ``read_back`` found, row by row."""
    back = read_back(out)
    if not back:
        return
    first = next(iter(back.values()))
    camera = sorted(first["frames"])[0]
    state = "observation.state" in first["table"].column_names
    rows = stream_rows(out, camera, **({} if state else {"state_key": None}))
    assert len(rows) == sum(ep["table"].num_rows for ep in back.values())
    for (_, index), ep in back.items():
        frames = ep["frames"][camera]
        states = arrow_numpy(ep["table"], "observation.state") if state else None
        for i in range(ep["table"].num_rows):
            sample = rows[(index, i)]
            want = frames[i].transpose(2, 0, 1) if frames.ndim == 4 else frames[i]  # CHW
            assert np.array_equal(sample[camera][0].numpy().reshape(want.shape), want), (index, i)
            if states is not None:  # the stream reader's float32 of the stored values
                assert np.array_equal(sample["observation.state"][0].numpy(), states[i].astype(np.float32)), (index, i)


@pytest.mark.parametrize("spec", VARIATIONS, ids=lambda s: f"v{s['id']}-{s['layout']}-{s['dtype']}-{s['camera']}")
def test_every_variation_reads_what_the_reference_reader_reads(spec, tmp_path):
    out, _ = run_variation(spec, tmp_path)
    if spec["id"] % 4 == 0:  # through the stream reader too
        stream_check(out)
    TALLY["variations"] += 1


def _spec(**kw) -> dict:
    """A variation by hand: a plain ALOHA folder unless ``kw`` says otherwise."""
    base = {axis: values[0] for axis, values in AXES.items()}
    return {**base, "id": 900, "dtype": "f8", **kw}


# --- disagreements found, each kept as a test -----------------------------------------------------------------


def test_aloha_jpeg_rows_give_the_arrays_the_recorder_stored(tmp_path):
    """ALOHA's recorder hands its RGB arrays to ``cv2.imencode`` and its readers decode with ``cv2.imdecode``:
    the frames are the recorded RGB, not the JPEG's colours as a standard decoder shows them (red would be blue)."""
    from epishard.shardwriter.images import decode_image

    recorded = np.zeros((3, 32, 32, 3), np.uint8)
    recorded[..., 0] = 230  # red
    recorded[:, :, 16:, 2] = 120  # and some blue on the right
    root = tmp_path / "aloha"
    root.mkdir()
    encoded = [_jpeg(f) for f in recorded]
    with h5py.File(root / "episode_0.hdf5", "w") as f:
        f.attrs["compress"] = True
        f.create_dataset("observations/qpos", data=np.zeros((3, 14)))
        f.create_dataset("action", data=np.zeros((3, 14)))
        rows = np.zeros((3, max(map(len, encoded)) + 9), np.uint8)
        for i, b in enumerate(encoded):
            rows[i, : len(b)] = np.frombuffer(b, np.uint8)
        f.create_dataset("observations/images/cam_high", data=rows)
    out = str(tmp_path / "out")
    convert([str(root)], out, ConvertOptions(progress=False))
    frames = read_back(out)[("aloha", 0)]["frames"]["observation.images.cam_high"]
    oracle = act_episode(str(root / "episode_0.hdf5"))["images"]["cam_high"]
    assert np.array_equal(frames, oracle)  # cv2.imdecode's arrays, exactly
    assert np.abs(frames.astype(int) - recorded).max() <= 8  # the recorded colours, to JPEG's loss
    standard = decode_image(encoded[0])[0]  # what a viewer shows: red and blue swapped
    assert standard[..., 2].mean() > 200 and frames[0][..., 0].mean() > 200


def test_big_endian_numbers_and_frames_read_as_their_values(tmp_path):
    """Before: ``>f8`` state was refused as unreadable (Arrow takes no byte-swapped arrays), ``>u2`` depth
    as ``bad_feature``, and ``[T, H, W, 1]`` grey frames as ``bad_image``. Now each is its values."""
    root = tmp_path / "aloha"
    root.mkdir()
    qpos = np.arange(20, dtype=">f8").reshape(5, 4) / 7
    depth = (np.arange(5 * 32 * 32).reshape(5, 32, 32) * 61 % 65536).astype(">u2")
    grey = (np.arange(5 * 32 * 32).reshape(5, 32, 32, 1) % 251).astype(np.uint8)
    with h5py.File(root / "episode_0.hdf5", "w") as f:
        f.create_dataset("observations/qpos", data=qpos)
        f.create_dataset("action", data=qpos.astype(">i4"), chunks=(2, 4), compression="gzip")
        f.create_dataset("observations/images/depth", data=depth)
        f.create_dataset("observations/images/grey", data=grey)
    out = str(tmp_path / "out")
    convert([str(root)], out, ConvertOptions(progress=False))
    ep = read_back(out)[("aloha", 0)]
    assert arrow_numpy(ep["table"], "observation.state").tobytes() == qpos.astype("<f8").tobytes()
    assert arrow_numpy(ep["table"], "action").dtype == np.int32
    assert np.array_equal(ep["frames"]["observation.images.depth"], depth.astype("<u2"))
    assert np.array_equal(ep["frames"]["observation.images.grey"], np.repeat(grey, 3, axis=-1))


def test_an_episode_without_rows_is_refused_naming_file_and_key_or_counted(tmp_path):
    """Before: an ALOHA file of one-joint ``action [0]`` was an ``unreadable_file`` (a reshape error), and an
    empty episode's refusal named no file. Now ``empty_episode`` names file and keys; skip counts it."""
    root = tmp_path / "aloha"
    root.mkdir()
    for e, t in enumerate((4, 0, 3)):
        with h5py.File(root / f"episode_{e}.hdf5", "w") as f:
            f.create_dataset("observations/qpos", data=np.ones((t, 1)))
            f.create_dataset("action", data=np.ones(t))
            f.create_dataset("observations/images/cam", data=np.zeros((t, 32, 32, 3), np.uint8))
    with pytest.raises(ConversionError) as err:
        convert([str(root)], str(tmp_path / "o1"), ConvertOptions(progress=False))
    e = err.value
    assert (e.kind, e.episode) == ("empty_episode", 1) and "episode_1.hdf5" in e.path
    assert "'action' [0]" in e.detail and "'observations/qpos' [0, 1]" in e.detail, e.detail
    manifest = convert([str(root)], str(tmp_path / "o2"), ConvertOptions(progress=False, on_error="skip"))
    assert manifest.report.skipped_by_kind == {"empty_episode": 1}
    back = read_back(str(tmp_path / "o2"))
    assert sorted(back) == [("aloha", 0), ("aloha", 2)] and back[("aloha", 2)]["table"].num_rows == 3


def test_a_num_samples_other_than_the_rows_is_refused(tmp_path):
    """robomimic reads ``num_samples`` rows of a demo; a file whose attribute and arrays disagree is refused
    (``length_mismatch`` naming the attribute), not read as either. Before: the arrays were read silently."""
    path = tmp_path / "lift.hdf5"
    with h5py.File(path, "w") as f:
        for d, (t, claimed) in enumerate(((5, 5), (6, 4))):
            g = f.create_group(f"data/demo_{d}")
            g.attrs["num_samples"] = claimed
            g.create_dataset("obs/robot0_eef_pos", data=np.ones((t, 3)))
            g.create_dataset("actions", data=np.ones((t, 7)))
    with pytest.raises(ConversionError) as err:
        convert([str(path)], str(tmp_path / "o"), ConvertOptions(progress=False))
    e = err.value
    assert (e.kind, e.episode) == ("length_mismatch", 1) and e.path.endswith("lift.hdf5:data/demo_1")
    assert "num_samples says 4 rows, the arrays have 6" in e.detail, e.detail
    assert robomimic_dataset(str(path), ("robot0_eef_pos",))[0][1]["num_samples"] == 4  # what robomimic would use


def test_each_aloha_file_keeps_its_own_compress_attribute_and_task(tmp_path):
    """act-plus-plus reads ``compress`` per file; ``language_instruction`` is per file too. Before: the first
    file's were applied to every episode (a raw episode after a JPEG one was refused, every task the first's)."""
    root = tmp_path / "aloha"
    root.mkdir()
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    smooth = _frames(rng, "jpeg", 4, (32, 32))
    for e, compressed in enumerate((True, False, True)):
        with h5py.File(root / f"episode_{e}.hdf5", "w") as f:
            f.attrs["language_instruction"] = f"task {e}"
            f.create_dataset("observations/qpos", data=np.full((4, 2), e, np.float32))
            f.create_dataset("action", data=np.full((4, 2), e, np.float32))
            if compressed:
                f.attrs["compress"] = True
                ds = f.create_dataset("observations/images/cam", (4,), dtype=h5py.vlen_dtype(np.uint8))
                for i in range(4):
                    ds[i] = np.frombuffer(_jpeg(smooth[i]), np.uint8)
            else:
                f.create_dataset("observations/images/cam", data=raw)
    out = str(tmp_path / "out")
    manifest = convert([str(root)], out, ConvertOptions(progress=False, workers=2, max_episodes_per_shard=1))
    back = read_back(out)
    for e in range(3):
        oracle = act_episode(str(root / f"episode_{e}.hdf5"))
        assert np.array_equal(back[("aloha", e)]["frames"]["observation.images.cam"], oracle["images"]["cam"])
        assert back[("aloha", e)]["tasks"] == [f"task {e}"]
    assert set(manifest.tasks) == {"task 0", "task 1", "task 2"}


def test_robomimic_float_depth_maps_are_columns_not_a_refused_camera(tmp_path):
    """robosuite's depth observations are float32 ``[T, H, W, 1]``: robomimic reads them as any obs key.
    Before: the default mapping made them a camera and the whole source was refused (``bad_feature``)."""
    spec = _spec(layout="robomimic", camera="jpeg", dtype="f4")  # "jpeg" is the float depth map for robomimic
    _, want = run_variation(spec, tmp_path)  # the oracle's float depth maps are the columns, value for value
    assert want.episodes and "kept as a column" in want.notes
    for episode in want.episodes.values():
        assert episode["columns"]["obs.agentview_depth"].dtype == np.float32
        assert (
            episode["columns"]["obs.agentview_depth"].ndim == 4
            and episode["columns"]["obs.agentview_depth"].shape[-1] == 1
        )
        assert set(episode["frames"]) == {"observation.images.robot0_eye_in_hand"}


# --- concurrency: nothing opened in the parent reaches a worker; runs are byte-identical --------------------


def _files(out: str) -> dict[str, bytes]:
    return {name: (Path(out) / name).read_bytes() for name in sorted(os.listdir(out))}


def test_the_parent_holds_no_open_hdf5_file_and_episodes_carry_names_only(tmp_path):
    """After the source opens (as the parent does before forking its workers), no HDF5 file is open, and
    each episode pickles to a few kB: file names, groups and keys, no h5py object."""
    for spec in (_spec(camera="jpeg"), _spec(layout="libero", id=901)):
        if spec["layout"] == "aloha":
            write_aloha(spec, tmp_path / "aloha")
            root = str(tmp_path / "aloha")
        else:
            write_robomimic(spec, tmp_path / "libero.hdf5")
            root = str(tmp_path / "libero.hdf5")
        source = open_source(root)
        assert h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE) == []
        for episode in source.episodes:
            assert len(pickle.dumps(episode)) < 8192
            pickle.loads(pickle.dumps(episode)).table.load()  # a copy reads by itself, opening its own file
        assert h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE) == []


def test_concurrent_conversions_are_byte_identical_to_workers_1(tmp_path):
    """JPEG ALOHA episodes and a LIBERO file converted together by 2 workers, ``LOOPS`` times (20 under SWEEP):
    every file of the output equals the workers=1 conversion's, byte for byte."""
    write_aloha(_spec(camera="jpeg", lengths="long", id=902), tmp_path / "aloha")
    write_robomimic(_spec(layout="libero", camera="depth_be", meta="full", id=903), tmp_path / "libero.hdf5")
    sources = [str(tmp_path / "aloha"), str(tmp_path / "libero.hdf5")]

    def run(out: str, workers: int) -> dict[str, bytes]:
        convert(sources, out, ConvertOptions(progress=False, workers=workers, max_episodes_per_shard=1))
        return _files(out)

    reference = run(str(tmp_path / "one"), 1)
    assert sum(name.endswith(".tar") for name in reference) >= 5
    for loop in range(LOOPS):
        assert run(str(tmp_path / f"two-{loop}"), 2) == reference, loop


# --- Ray: the same conversions as Ray tasks on the loopback cluster ---------------------------------------------


@pytest.fixture(scope="module")
def ray_address(netns):
    """A 2-node Ray cluster on loopback (``raycluster``), once for the module."""
    with raycluster.cluster() as address:
        yield address


@pytest.mark.skipif(raycluster.unavailable() is not None, reason=str(raycluster.unavailable()))
def test_ray_conversion_equals_the_oracle_and_workers_1(ray_address, tmp_path):
    """A JPEG ALOHA variation (and, under SWEEP, a robomimic one) through ``RayRunner``: the oracle's values,
    and the same files as workers=1, ``LOOPS`` times under SWEEP (once in CI)."""
    from epishard.shardwriter.ray_convert import RayRunner

    specs = [_spec(camera="jpeg_vlen", order=">", dtype="i2", lengths="long", id=904)]
    if SWEEP:
        specs.append(_spec(layout="robomimic", camera="depth", storage="gzip9", naming="gaps", id=905))
    for spec in specs:
        work = tmp_path / f"v{spec['id']}"
        work.mkdir()
        local, _ = run_variation(spec, work, workers=1)
        for loop in range(LOOPS if SWEEP else 1):
            ray_out, _ = run_variation(spec, work, runner=RayRunner(ray_address), out=str(work / f"ray-{loop}"))
            assert _files(ray_out) == _files(local), (spec["id"], loop)
