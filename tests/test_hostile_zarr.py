"""A Zarr ReplayBuffer from a stranger: links out of the store, forged counts, shapes and chunks, bombs.

Each hostile store is built here with zarr, then edited the way a forger would (a symbolic link
put in place of a chunk or a metadata file, a ``.zarray`` claiming 10^12 rows, a chunk that
inflates past its declared size, a bomb nested behind the first codec of a chain,
``meta/episode_ends`` with 10^7 entries). All of them are converted in one child process (the
nested bombs in one of their own) under a 3 GiB address-space limit (``RLIMIT_AS``) and a timeout,
under both ``--on-error`` policies, while a thread opens each FIFO for writing with ``O_NONBLOCK``
over and over: ``ENXIO`` means no reader has it open, so a FIFO the conversion never opened is
seen as such (and a reader that did open it is let go at once, never hung).
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from epishard.shardwriter import ConversionError, SourceError
from epishard.shardwriter.sources import SourceOptions, open_source

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
LIMIT = 3 << 30  # the child's address space
EMPTY = 10_000_000  # entries of meta/episode_ends in the empty-episodes case (bounds.MAX_EPISODES)
STATE = ("robot0_eef_pos", "robot0_eef_rot_axis_angle", "robot0_gripper_width")


def _pose(n: int, width: int, scale: float) -> np.ndarray:
    return (np.arange(n * width, dtype=np.float32).reshape(n, width) * scale + 1).astype(np.float32)


def _state(n: int) -> np.ndarray:
    return np.concatenate([_pose(n, 3, 0.5), _pose(n, 3, -0.25), _pose(n, 1, 0.01)], axis=1)


def write_store(root, lengths=(4, 4, 4), zarr_format=2, camera=False, compressor="default", ends=None) -> int:
    """A UMI ReplayBuffer of chunks of 4 rows (episode ``i`` of ``(4, 4, 4)`` is chunk ``i``); its rows."""
    n = int(np.sum(lengths))
    g = zarr.open_group(str(root), mode="w", zarr_format=zarr_format)
    data, meta = g.create_group("data"), g.create_group("meta")
    kw = {} if compressor == "default" else {"compressors": compressor}
    if camera:
        frames = (np.arange(n * 16 * 16 * 3) % 251).astype(np.uint8).reshape(n, 16, 16, 3)
        data.create_array("camera0_rgb", data=frames, chunks=(4, 16, 16, 3))
    for key, width, scale in zip(STATE, (3, 3, 1), (0.5, -0.25, 0.01), strict=True):
        data.create_array(key, data=_pose(n, width, scale), chunks=(4, width), **kw)
    meta.create_array("episode_ends", data=np.cumsum(lengths).astype(np.int64) if ends is None else ends)
    return n


def _chunk(zarr_format: int, key: str, row_chunk: int) -> str:
    return f"data/{key}/{row_chunk}.0" if zarr_format == 2 else f"data/{key}/c/{row_chunk}/0"


def _edit_json(path: Path, **fields) -> None:
    meta = json.loads(path.read_text())
    meta.update(fields)
    path.write_text(json.dumps(meta))


def _zip(folder: Path, zipped: Path, replace: dict[str, bytes] | None = None) -> None:
    """The store as a ``.zarr.zip`` (stored members), ``replace``: member -> bytes written deflated."""
    replace = replace or {}
    with zipfile.ZipFile(zipped, "w") as z:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            name = path.relative_to(folder).as_posix()
            if name in replace:
                z.writestr(name, replace[name], compress_type=zipfile.ZIP_DEFLATED)
            else:
                z.write(path, name)


class FifoWatch:
    """FIFOs whose writer end is opened with ``O_NONBLOCK`` in a loop: ``ENXIO`` while no reader has it.

    ``opened[path]`` becomes True when a reader had the FIFO open (the writer end then opened, and
    is closed at once so the reader sees end of file rather than hanging).
    """

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.opened: dict[str, bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def make(self, path: Path) -> str:
        os.mkfifo(path)
        self.paths.append(str(path))
        self.opened[str(path)] = False
        return str(path)

    def _run(self) -> None:
        while not self._stop.is_set():
            for path in self.paths:
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as exc:
                    if exc.errno != errno.ENXIO:
                        raise
                    continue
                self.opened[path] = True
                os.close(fd)
            time.sleep(0.002)

    def __enter__(self) -> FifoWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------- the hostile stores, one per case


def _links(base: Path, fifos: FifoWatch) -> dict[str, dict]:
    cases: dict[str, dict] = {}

    src = base / "chunk_passwd" / "src.zarr"
    write_store(src)
    chunk = src / _chunk(2, "robot0_eef_pos", 1)
    chunk.unlink()
    chunk.symlink_to("/etc/passwd")
    cases["chunk_passwd"] = {"src": src, "names": ["data/robot0_eef_pos/1.0", "/etc/passwd"]}

    src = base / "zarray_environ" / "src.zarr"
    write_store(src)
    meta = src / "data" / "robot0_gripper_width" / ".zarray"
    meta.unlink()
    meta.symlink_to("/proc/self/environ")
    names = ["data/robot0_gripper_width/.zarray", "/proc/"]
    cases["zarray_environ"] = {"src": src, "names": names}
    cases["zarray_environ_allowed"] = {"src": src, "names": names, "allow": True}

    src = base / "zarrjson_fifo" / "src.zarr"
    write_store(src, zarr_format=3)
    fifo = fifos.make(base / "zarrjson_fifo" / "pipe")
    meta = src / "data" / "robot0_eef_pos" / "zarr.json"
    meta.unlink()
    meta.symlink_to(fifo)
    names = ["data/robot0_eef_pos/zarr.json", fifo]
    cases["zarrjson_fifo"] = {"src": src, "names": names, "fifo": fifo}
    cases["zarrjson_fifo_allowed"] = {"src": src, "names": names, "fifo": fifo, "allow": True}

    src = base / "zattrs_fifo" / "src.zarr"
    write_store(src)
    fifo = fifos.make(base / "zattrs_fifo" / "pipe")
    (src / ".zattrs").unlink()
    (src / ".zattrs").symlink_to(fifo)
    cases["zattrs_fifo"] = {"src": src, "names": [".zattrs", fifo], "fifo": fifo}

    src = base / "chunk_is_fifo" / "src.zarr"
    write_store(src)
    chunk = src / _chunk(2, "robot0_eef_pos", 0)
    chunk.unlink()
    fifo = fifos.make(chunk)
    cases["chunk_is_fifo"] = {"src": src, "names": ["data/robot0_eef_pos/0.0", "FIFO"], "fifo": fifo, "allow": True}

    # A whole array folder linked out of the store (a valid copy of it): refused, read when allowed.
    src = base / "folder_outside" / "src.zarr"
    write_store(src)
    outside = base / "folder_outside" / "outside"
    outside.mkdir()
    shutil.move(str(src / "data" / "robot0_gripper_width"), str(outside / "robot0_gripper_width"))
    (src / "data" / "robot0_gripper_width").symlink_to("../../outside/robot0_gripper_width")
    names = ["data/robot0_gripper_width", str(outside / "robot0_gripper_width")]
    cases["folder_outside"] = {"src": src, "names": names}
    cases["folder_outside_allowed"] = {"src": src, "allow": True, "rows": 12, "episodes": [0, 1, 2]}

    # A chunk linked by ../ to a copy of itself out of the store (Zarr format 3).
    src = base / "chunk_dotdot" / "src.zarr"
    write_store(src, zarr_format=3)
    key = _chunk(3, "robot0_eef_pos", 1)
    shutil.move(str(src / key), str(base / "chunk_dotdot" / "stolen"))
    (src / key).symlink_to("../../../../../stolen")
    names = [key, str(base / "chunk_dotdot" / "stolen")]
    cases["chunk_dotdot"] = {"src": src, "names": names}
    cases["chunk_dotdot_allowed"] = {"src": src, "allow": True, "rows": 12, "episodes": [0, 1, 2]}

    # A link inside the store (a deduplicated chunk): read as any chunk.
    src = base / "link_inside" / "src.zarr"
    write_store(src)
    key = _chunk(2, "robot0_eef_pos", 2)
    (src / ".dedup").mkdir()
    shutil.move(str(src / key), str(src / ".dedup" / "c2"))
    (src / key).symlink_to("../../.dedup/c2")
    cases["link_inside"] = {"src": src, "rows": 12, "episodes": [0, 1, 2]}

    # A .zarr.zip whose chunk member inflates to 64 MiB (a 48-byte chunk): refused before inflating.
    folder = base / "zip_bomb" / "src.zarr"
    write_store(folder)
    zipped = base / "zip_bomb" / "src.zarr.zip"
    _zip(folder, zipped, {_chunk(2, "robot0_eef_pos", 1): bytes(64 << 20)})
    shutil.rmtree(folder)
    cases["zip_bomb"] = {
        "src": zipped,
        "kind": "too_large",
        "episode": 1,
        "names": ["data/robot0_eef_pos/1.0"],
        "rows": 12,
        "episodes": [0, 2],
    }
    return cases


def _episodes(base: Path) -> dict[str, dict]:
    cases: dict[str, dict] = {}

    src = base / "ends_1e7" / "src.zarr"
    ends = np.zeros(EMPTY, dtype=np.int64)
    ends[-2:] = (3, 7)
    write_store(src, lengths=(3, 4), ends=ends)
    cases["ends_1e7"] = {"src": src, "rows": 7, "episodes": [EMPTY - 2, EMPTY - 1], "starts": [0, 3], "slow": True}

    src = base / "ends_count" / "src.zarr"
    write_store(src)
    _edit_json(src / "meta" / "episode_ends" / ".zarray", shape=[10**12])
    cases["ends_count"] = {"src": src, "names": ["meta/episode_ends", "1e+12"]}

    for name, ends, position in (
        ("ends_decreasing", [4, 8, 6, 12], 2),
        ("ends_negative", [-3, 4, 8, 12], 0),
        ("ends_past_the_end", [4, 8, 1000], 2),
    ):
        src = base / name / "src.zarr"
        write_store(src, ends=np.asarray(ends, dtype=np.int64))
        cases[name] = {"src": src, "names": ["meta/episode_ends", f"[{position}]"]}
    return cases


def _sizes(base: Path) -> dict[str, dict]:
    cases: dict[str, dict] = {}

    # Every array claims 10^12 rows; episode 2 spans [8, 10^12): refused, 0 and 1 converted.
    src = base / "rows_1e12" / "src.zarr"
    write_store(src, ends=np.asarray([4, 8, 10**12], dtype=np.int64))
    for key in STATE:
        meta = src / "data" / key / ".zarray"
        _edit_json(meta, shape=[10**12, json.loads(meta.read_text())["shape"][1]])
    cases["rows_1e12"] = {
        "src": src,
        "kind": "too_large",
        "episode": 2,
        "names": ["data/robot0_eef_pos"],
        "rows": 12,
        "episodes": [0, 1],
        "cli": True,
    }

    # One array whose single chunk claims 10^12 x 3 float32 (12 TB, decompressed whole to read a row).
    src = base / "huge_chunk" / "src.zarr"
    write_store(src)
    _edit_json(src / "data" / "robot0_eef_pos" / ".zarray", shape=[10**12, 3], chunks=[10**12, 3])
    cases["huge_chunk"] = {"src": src, "kind": "too_large", "episode": 0, "names": ["data/robot0_eef_pos"]}

    # A zlib chunk of 2 KiB (no larger than a chunk of 4 x 1 float32 may be stored) inflating to 2 MiB.
    src = base / "zlib_bomb" / "src.zarr"
    write_store(src, compressor=numcodecs.Zlib(level=1))
    key = _chunk(2, "robot0_gripper_width", 1)
    (src / key).write_bytes(numcodecs.Zlib(level=9).encode(bytes(2 << 20)))
    cases["zlib_bomb"] = {
        "src": src,
        "kind": "too_large",
        "episode": 1,
        "names": [key],
        "rows": 12,
        "episodes": [0, 2],
    }

    # A blosc chunk whose header claims 2^31 - 1 bytes for a chunk of 4 x 3 float32.
    src = base / "blosc_claims" / "src.zarr"
    write_store(src)
    key = _chunk(2, "robot0_eef_pos", 1)
    raw = bytearray((src / key).read_bytes())
    raw[4:8] = (2**31 - 1).to_bytes(4, "little")
    (src / key).write_bytes(bytes(raw))
    cases["blosc_claims"] = {"src": src, "kind": "too_large", "episode": 1, "names": [key]}

    # Zarr format 3 (zstd): a frame that does not state its size and inflates to 64 MiB.
    zstandard = pytest.importorskip("zstandard")
    src = base / "zstd_unsized" / "src.zarr"
    write_store(src, zarr_format=3)
    key = _chunk(3, "robot0_eef_pos", 1)
    (src / key).write_bytes(zstandard.ZstdCompressor(write_content_size=False).compress(bytes(64 << 20)))
    cases["zstd_unsized"] = {
        "src": src,
        "kind": "too_large",
        "episode": 1,
        "names": [key],
        "rows": 12,
        "episodes": [0, 2],
    }

    # Camera frames above bounds.MAX_FRAME_BYTES (lowered to 512 bytes: a frame is 16 x 16 x 3).
    src = base / "frame_too_large" / "src.zarr"
    write_store(src, camera=True)
    cases["frame_too_large"] = {
        "src": src,
        "kind": "too_large",
        "episode": 0,
        "names": ["data/camera0_rgb", "768"],
        "limits": {"MAX_FRAME_BYTES": 512},
    }
    return cases


def _frames(n: int, side: int) -> np.ndarray:
    return (np.arange(n * side * side * 3) % 251).astype(np.uint8).reshape(n, side, side, 3)


def _digest(frames: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(frames).tobytes()).hexdigest()


def _zeros_deflated(size: int) -> bytes:
    """zlib data inflating to ``size`` zero bytes (a multiple of 16 MiB) in 0.1 s: one flushed segment, repeated."""
    segment = zlib.compressobj(9, zlib.DEFLATED, -15)
    part = segment.compress(bytes(16 << 20)) + segment.flush(zlib.Z_FULL_FLUSH)  # no back-reference past it
    end = zlib.compressobj(9, zlib.DEFLATED, -15).flush()  # the final empty block
    adler = ((size % 65521) << 16) | 1  # Adler-32 of zeros: a = 1, b = size mod 65521
    return b"\x78\xda" + part * (size >> 24) + end + adler.to_bytes(4, "big")


def _nested(base: Path) -> dict[str, dict]:
    """Bombs one codec deeper than the first: each layer small enough for the stage before it (4 GiB decoded)."""
    cases: dict[str, dict] = {}
    bomb = 4 << 30  # past the child's address space: decoded, it fails as MemoryError, not as a named refusal
    camera = "observation.images.camera0"

    # Zarr 2: compressor zlib, filters [zlib, zlib]; a 305-byte chunk whose compressor makes 6.7 KB (under
    # the 24 KiB a chunk of 4 x 16 x 16 x 3 may take through filters), the first filter 4 MB, the last 4 GiB.
    src = base / "nested_filters_v2" / "src.zarr"
    write_store(src, camera=True)
    folder = src / "data" / "camera0_rgb"
    _edit_json(folder / ".zarray", compressor={"id": "zlib", "level": 1}, filters=[{"id": "zlib", "level": 1}] * 2)
    frames = _frames(12, 16)
    for c in range(3):
        raw = zlib.compress(zlib.compress(frames[4 * c : 4 * c + 4].tobytes(), 1), 1)
        (folder / f"{c}.0.0.0").write_bytes(
            zlib.compress(raw if c != 1 else zlib.compress(_zeros_deflated(bomb), 9), 9)
        )
    cases["nested_filters_v2"] = {
        "src": src,
        "kind": "too_large",
        "episode": 1,
        "names": ["data/camera0_rgb/1.0.0.0", "zlib"],
        "rows": 12,
        "episodes": [0, 2],
        "frames": {str(e): {camera: _digest(frames[4 * e : 4 * e + 4])} for e in (0, 2)},
    }

    # Zarr 3: compressors [zstd, gzip]; a chunk of 0.2 KB gunzipping to a 128 KiB zstd frame (under the
    # 192 KiB of a chunk of 4 x 128 x 128 x 3) of 4 GiB of zeros.
    zstandard = pytest.importorskip("zstandard")
    from zarr.codecs import GzipCodec, ZstdCodec

    src = base / "nested_chain_v3" / "src.zarr"
    write_store(src, zarr_format=3)
    frames = _frames(12, 128)
    data = zarr.open_group(str(src), mode="r+")["data"]
    data.create_array("camera0_rgb", data=frames, chunks=(4, 128, 128, 3), compressors=[ZstdCodec(), GzipCodec()])
    writer = zstandard.ZstdCompressor(level=1).compressobj(size=bomb)
    zeros = bytes(16 << 20)
    frame = b"".join(writer.compress(zeros) for _ in range(bomb >> 24)) + writer.flush()
    key = "data/camera0_rgb/c/1/0/0/0"
    (src / key).write_bytes(gzip.compress(frame, 9))
    cases["nested_chain_v3"] = {
        "src": src,
        "kind": "too_large",
        "episode": 1,
        "names": [key, "zstd"],
        "rows": 12,
        "episodes": [0, 2],
        "frames": {str(e): {camera: _digest(frames[4 * e : 4 * e + 4])} for e in (0, 2)},
    }
    return cases


def _types(base: Path) -> dict[str, dict]:
    cases: dict[str, dict] = {}

    src = base / "fill_only_state" / "src.zarr"
    write_store(src)
    for chunk in (src / "data" / "robot0_eef_pos").glob("[0-9]*"):
        chunk.unlink()
    cases["fill_only_state"] = {"src": src, "names": ["data/robot0_eef_pos", "no chunk"]}

    src = base / "fill_only_camera" / "src.zarr"
    write_store(src, zarr_format=3, camera=True)
    shutil.rmtree(src / "data" / "camera0_rgb" / "c")
    cases["fill_only_camera"] = {"src": src, "names": ["data/camera0_rgb", "no chunk"]}

    # Diffusion Policy's default mapping takes data/state: here text (bytes), and (format 3) strings.
    src = base / "text_state" / "src.zarr"
    g = zarr.open_group(str(src), mode="w", zarr_format=2)
    g.create_group("data").create_array("state", data=np.array([b"up", b"down", b"left", b"right"]))
    g["data"].create_array("action", data=_pose(4, 2, 1.0))
    g.create_group("meta").create_array("episode_ends", data=np.array([2, 4], dtype=np.int64))
    cases["text_state"] = {"src": src, "kind": "bad_feature", "names": ["data/state"], "at_open": True}

    src = base / "string_action" / "src.zarr"
    g = zarr.open_group(str(src), mode="w", zarr_format=3)
    g.create_group("data").create_array("state", data=_pose(4, 2, 1.0))
    g["data"].create_array("action", shape=(4,), dtype=str, chunks=(4,))[:] = np.array(["a", "bb", "ccc", "d"])
    g.create_group("meta").create_array("episode_ends", data=np.array([2, 4], dtype=np.int64))
    cases["string_action"] = {"src": src, "kind": "bad_feature", "names": ["data/action"], "at_open": True}
    return cases


def _named(base: Path) -> dict[str, dict]:
    cases: dict[str, dict] = {}

    src = base / "bad_zarray" / "src.zarr"
    write_store(src)
    (src / "data" / "robot0_eef_pos" / ".zarray").write_text("{not json")
    cases["bad_zarray"] = {"src": src, "names": ["src.zarr"]}

    src = base / "deep_zattrs" / "src.zarr"
    write_store(src)
    (src / ".zattrs").write_text("[" * 100_000)
    cases["deep_zattrs"] = {"src": src, "names": [".zattrs"]}

    src = base / "damaged_chunk" / "src.zarr"
    write_store(src)
    key = _chunk(2, "robot0_eef_pos", 1)
    (src / key).write_bytes((src / key).read_bytes()[:20])
    cases["damaged_chunk"] = {
        "src": src,
        "kind": "unreadable_file",
        "episode": 1,
        "names": ["data/robot0_eef_pos"],
        "rows": 12,
        "episodes": [0, 2],
        "cli": True,
    }

    # A valid blosc chunk of the wrong size (2 rows where the chunk holds 4).
    src = base / "short_chunk" / "src.zarr"
    write_store(src)
    key = _chunk(2, "robot0_eef_pos", 2)
    (src / key).write_bytes(numcodecs.Blosc().encode(_pose(2, 3, 7.0)))
    cases["short_chunk"] = {
        "src": src,
        "kind": "unreadable_file",
        "episode": 2,
        "names": ["data/robot0_eef_pos"],
        "rows": 12,
        "episodes": [0, 1],
    }
    return cases


_CHILD = r"""
import contextlib, hashlib, io, json, resource, sys
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import numpy as np
from sourcecheck import column, read_back
from epishard.cli import main
from epishard.shardwriter import ConvertOptions, convert
from epishard.shardwriter.sources import SourceOptions, bounds

def attempt(case, policy, out):
    saved = {k: getattr(bounds, k) for k in case.get("limits", {})}
    for k, v in case.get("limits", {}).items():
        setattr(bounds, k, v)
    try:
        options = ConvertOptions(
            progress=False, on_error=policy, sources=SourceOptions(allow_external=case.get("allow", False))
        )
        m = convert([case["src"]], out, options)
        back = read_back(out)
        return {
            "ok": True,
            "state": {str(e): column(ep["table"], "observation.state").tolist() for (_, e), ep in back.items()},
            "frames": {
                str(e): {c: hashlib.sha256(f.tobytes()).hexdigest() for c, f in ep["frames"].items()}
                for (_, e), ep in back.items()
            },
            "skipped": m.report.skipped_by_kind,
            "notes": list(m.sources[0].notes),
        }
    except BaseException as exc:
        return {
            "error": type(exc).__name__,
            "kind": getattr(exc, "kind", None),
            "episode": getattr(exc, "episode", None),
            "text": str(exc)[:3000],
        }
    finally:
        for k, v in saved.items():
            setattr(bounds, k, v)

for name, case in json.loads(sys.argv[1]).items():
    result = {p: attempt(case, p, f"{case['out']}-{p}") for p in ("raise", "skip")}
    if case.get("cli"):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(["convert", case["src"], case["out"] + "-cli", "-q"])
        result["cli"] = {"rc": rc, "line": err.getvalue()}
    print("RESULT " + json.dumps({name: result}, default=repr), flush=True)
"""


def _in_child(cases: dict[str, dict]) -> dict[str, dict]:
    """Convert every case in one child under ``LIMIT`` bytes of address space; its results per case."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, REPO])}
    wire = {n: {k: str(v) if isinstance(v, Path) else v for k, v in c.items()} for n, c in cases.items()}
    argv = [sys.executable, "-c", _CHILD, json.dumps(wire), str(LIMIT)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=400)
        stdout, stderr = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:  # the cases done before it are still reported
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        stderr = "timed out"
    results: dict[str, dict] = {}
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            results.update(json.loads(line[len("RESULT ") :]))
    missing = sorted(set(cases) - set(results))
    for name in missing:
        results[name] = {"raise": {"error": "child", "text": stderr[-3000:]}, "skip": {}}
    return results


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict[str, tuple[dict, dict, FifoWatch]]:
    """Each case's description and what the memory-limited child made of it, with the FIFO watcher."""
    base = tmp_path_factory.mktemp("hostile_zarr")
    fifos = FifoWatch()
    cases = {**_links(base, fifos), **_sizes(base), **_types(base), **_named(base), **_episodes(base)}
    cases = dict(sorted(cases.items(), key=lambda kv: bool(kv[1].get("slow"))))  # the 10^7 case last
    for name, case in cases.items():
        case["out"] = str(base / "out" / name)
    with fifos:
        results = _in_child(cases)
    return {name: (case, results[name], fifos) for name, case in cases.items()}


@pytest.fixture(scope="module")
def nested(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """The nested bombs (``_nested``) and what a child of their own made of them (their cameras are encoded:
    the encoder's threads take address space the 10^7-episode case of ``hostile`` needs)."""
    base = tmp_path_factory.mktemp("nested_zarr")
    cases = _nested(base)
    for name, case in cases.items():
        case["out"] = str(base / "out" / name)
    results = _in_child(cases)
    return {name: (case, results[name]) for name, case in cases.items()}


def _refused_at_open(case: dict, result: dict) -> None:
    for policy in ("raise", "skip"):
        got = result[policy]
        assert got.get("error") == "SourceError", (policy, got)
        for name in case["names"]:
            assert name in got["text"], (name, got["text"])


def _converted(case: dict, got: dict) -> None:
    """The episodes ``case["episodes"]`` were written with exactly the source's state rows."""
    assert got.get("ok"), got
    state = _state(case["rows"])
    starts = case.get("starts") or [4 * e for e in case["episodes"]]
    assert sorted(int(e) for e in got["state"]) == case["episodes"]
    for e, start in zip(case["episodes"], starts, strict=True):
        rows = np.asarray(got["state"][str(e)], dtype=np.float32)
        assert np.array_equal(rows, state[start : start + len(rows)]) and len(rows) > 0


def _episode_error(case: dict, result: dict) -> None:
    """Under raise: the named ConversionError; under skip: that episode counted, the others exact."""
    got = result["raise"]
    assert (got.get("error"), got.get("kind")) == ("ConversionError", case["kind"]), got
    if not case.get("at_open"):
        assert got["episode"] == case["episode"], got
    for name in case["names"]:
        assert name in got["text"], (name, got["text"])
    if "episodes" in case:
        skipped = result["skip"]
        _converted(case, skipped)
        assert skipped["skipped"] == {case["kind"]: 3 - len(case["episodes"])}, skipped


LINKS = [
    "chunk_passwd",
    "zarray_environ",
    "zarray_environ_allowed",
    "zarrjson_fifo",
    "zarrjson_fifo_allowed",
    "zattrs_fifo",
    "chunk_is_fifo",
    "folder_outside",
    "chunk_dotdot",
]


@pytest.mark.parametrize("name", LINKS)
def test_paths_out_of_the_store_are_refused_at_open_unread(hostile, name):
    case, result, fifos = hostile[name]
    _refused_at_open(case, result)
    if "fifo" in case:
        assert fifos.opened[case["fifo"]] is False  # never opened, not even to be refused


@pytest.mark.parametrize("name", ["folder_outside_allowed", "chunk_dotdot_allowed", "link_inside"])
def test_links_to_regular_files_are_read_when_allowed_or_inside(hostile, name):
    case, result, _ = hostile[name]
    _converted(case, result["raise"])


def test_a_zip_member_larger_than_its_chunk_is_refused_before_inflating(hostile):
    case, result, _ = hostile["zip_bomb"]
    _episode_error(case, result)
    assert "central directory" in result["raise"]["text"]


def test_ten_million_empty_episodes_are_a_counted_note(hostile):
    case, result, _ = hostile["ends_1e7"]
    for policy in ("raise", "skip"):
        _converted(case, result[policy])
        assert f"{EMPTY - 2} episodes of zero rows" in " ".join(result[policy]["notes"])


@pytest.mark.parametrize("name", ["ends_count", "ends_decreasing", "ends_negative", "ends_past_the_end"])
def test_forged_episode_ends_are_refused_at_open(hostile, name):
    case, result, _ = hostile[name]
    _refused_at_open(case, result)


@pytest.mark.parametrize(
    "name", ["rows_1e12", "huge_chunk", "zlib_bomb", "blosc_claims", "zstd_unsized", "frame_too_large"]
)
def test_claims_beyond_the_bounds_are_refused_before_allocation(hostile, name):
    case, result, _ = hostile[name]
    _episode_error(case, result)


@pytest.mark.parametrize("name", ["nested_filters_v2", "nested_chain_v3"])
def test_every_stage_of_a_codec_chain_is_bounded_before_it_decodes(nested, name):
    """A bomb behind the first codec (Zarr 2 filters, a Zarr 3 chain): too_large, skipped, the rest exact."""
    case, result = nested[name]
    _episode_error(case, result)
    assert "decompression bomb" in result["raise"]["text"], result["raise"]["text"]
    assert result["skip"]["frames"] == case["frames"]


@pytest.mark.parametrize("name", ["fill_only_state", "fill_only_camera"])
def test_arrays_of_fill_value_only_are_refused(hostile, name):
    case, result, _ = hostile[name]
    _refused_at_open(case, result)


@pytest.mark.parametrize("name", ["text_state", "string_action"])
def test_text_where_numbers_are_mapped_is_refused_at_open(hostile, name):
    case, result, _ = hostile[name]
    _episode_error(case, result)
    assert result["skip"].get("kind") == "bad_feature"  # the source as a whole: not an episode to skip


@pytest.mark.parametrize("name", ["bad_zarray", "deep_zattrs"])
def test_unreadable_metadata_is_a_source_error_naming_the_file(hostile, name):
    case, result, _ = hostile[name]
    _refused_at_open(case, result)


@pytest.mark.parametrize("name", ["damaged_chunk", "short_chunk"])
def test_library_errors_while_reading_are_named(hostile, name):
    case, result, _ = hostile[name]
    _episode_error(case, result)


@pytest.mark.parametrize("name", ["rows_1e12", "damaged_chunk"])
def test_the_cli_line_is_named_not_unexpected(hostile, name):
    case, result, _ = hostile[name]
    cli = result["cli"]
    assert cli["rc"] == 2 and f"[{case['kind']}]" in cli["line"] and "unexpected" not in cli["line"], cli


# ---------------------------------------------------------------- in process


def test_camera_frames_are_read_32_at_a_time_and_equal(tmp_path):
    src = tmp_path / "cam.zarr"
    n = write_store(src, lengths=(70, 6), camera=True)
    source = open_source(str(src), SourceOptions())
    frames = source.episodes[0].frames["observation.images.camera0"].reader
    chunks = list(frames.chunks())
    assert [len(c) for c in chunks] == [32, 32, 6]
    expected = (np.arange(n * 16 * 16 * 3) % 251).astype(np.uint8).reshape(n, 16, 16, 3)
    assert np.array_equal(np.concatenate(chunks), expected[:70])


def test_a_store_of_thousands_of_files_is_checked_fast(tmp_path):
    src = tmp_path / "many.zarr"
    write_store(src)
    folder = src / "data" / "robot0_eef_pos"
    for i in range(10_000):  # chunk files of rows no episode reads
        (folder / f"{i + 100}.0").touch()
    (folder / "9999.9").symlink_to("/etc/passwd")
    began = time.perf_counter()
    with pytest.raises(SourceError, match=r"data/robot0_eef_pos/9999.9.*/etc/passwd"):
        open_source(str(src), SourceOptions())
    assert time.perf_counter() - began < 3.0
    os.unlink(folder / "9999.9")
    assert len(open_source(str(src), SourceOptions()).episodes) == 3


def test_zero_length_episodes_are_left_out_and_counted(tmp_path):
    src = tmp_path / "z.zarr"
    write_store(src, lengths=(4, 4), ends=np.asarray([0, 4, 4, 4, 8], dtype=np.int64))
    source = open_source(str(src), SourceOptions())
    assert [e.episode_index for e in source.episodes] == [1, 4]
    assert any("3 episodes of zero rows" in n for n in source.notes)


def _v2_codecs() -> dict[str, dict]:
    lzma_raw = numcodecs.LZMA(format=1 + 2, filters=[{"id": 33}])  # lzma.FORMAT_RAW, FILTER_LZMA2
    return {
        "blosc": {},
        "none": {"compressors": None},
        "zlib": {"compressors": numcodecs.Zlib()},
        "gzip": {"compressors": numcodecs.GZip()},
        "bz2": {"compressors": numcodecs.BZ2()},
        "lzma": {"compressors": numcodecs.LZMA()},
        "lzma_raw": {"compressors": lzma_raw},
        "lz4": {"compressors": numcodecs.LZ4()},
        "zstd": {"compressors": numcodecs.Zstd()},
        "delta_zlib": {"compressors": numcodecs.Zlib(), "filters": [numcodecs.Delta(dtype="<f4")]},
    }


def _v3_codecs() -> dict[str, dict]:
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

    return {
        "v3_zstd": {},
        "v3_gzip": {"compressors": GzipCodec()},
        "v3_blosc": {"compressors": BloscCodec()},
        "v3_crc32c": {"compressors": [ZstdCodec(), Crc32cCodec()]},
        "v3_sharded": {"shards": (4, 1), "chunks": (2, 1)},
    }


@pytest.mark.parametrize("codec", [*_v2_codecs(), *_v3_codecs()])
def test_honest_chunks_of_every_codec_read_unchanged(tmp_path, codec):
    """The checks before decoding refuse nothing an honest writer stores: each episode's rows exact."""
    kw = {**_v2_codecs(), **_v3_codecs()}[codec]
    src = tmp_path / "c.zarr"
    g = zarr.open_group(str(src), mode="w", zarr_format=3 if codec.startswith("v3") else 2)
    width = _pose(12, 1, 0.01)
    g.create_group("data").create_array("state", data=width, **{"chunks": (4, 1), **kw})
    g.create_group("meta").create_array("episode_ends", data=np.array([4, 8, 12], dtype=np.int64))
    source = open_source(str(src), SourceOptions())
    for e, episode in enumerate(source.episodes):
        rows = np.asarray(episode.table.load().table.column("observation.state").to_pylist(), dtype=np.float32)
        assert np.array_equal(rows, width[4 * e : 4 * e + 4])


def test_an_honest_zstd_frame_that_does_not_state_its_size_is_read(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    src = tmp_path / "u.zarr"
    write_store(src, zarr_format=3)
    key = src / _chunk(3, "robot0_eef_pos", 1)
    key.write_bytes(zstandard.ZstdCompressor(write_content_size=False).compress(_pose(12, 3, 0.5)[4:8].tobytes()))
    source = open_source(str(src), SourceOptions())
    rows = source.episodes[1].table.load().table.column("observation.state").to_pylist()
    assert np.array_equal(np.asarray(rows, dtype=np.float32), _state(12)[4:8])


def test_a_codec_that_runs_code_is_refused():
    """``numcodecs.Pickle`` decodes a chunk with ``pickle.loads``: a store from elsewhere would run its own code.

    zarr 3.1 itself takes no pickle object codec; the reader refuses it in any chain as well."""
    import numcodecs

    from epishard.shardwriter.sources.replay_buffer import _stage

    with pytest.raises(ConversionError, match="running code the store carries"):
        _stage(numcodecs.Pickle())
