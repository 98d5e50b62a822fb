"""The ``writer --formats`` / ``writer --memory`` part of the ``writer`` scenario: converting each source
format beyond LeRobot (ALOHA, robomimic, UMI, RLDS, MCAP).

Two measurements, each conversion in a fresh process (``shardwriter.convert``, lossless frames,
``--check fast``, one worker unless ``--workers``):

- throughput (default): per format, a fixture of ``--episodes`` (40) episodes of 2 cameras of
  ``--frames`` (40) frames at ``--size`` (64x64) is written once into ``--data`` with the format's
  own writer library (h5py, zarr, tfrecord, mcap-ros2-support; frames carry their number,
  ``tests/videogen.encode_frame_number``), then converted; it reports episodes/s, wall and CPU
  seconds (the process and its workers), episodes per CPU second (the figure a busy machine does
  not distort) and the load average before and after.
- ``--memory``: per format, a fixture of at least ``--gb`` (1.0) GB of raw frames (640x480 RGB, 2
  cameras, ``--memory-frames`` (50) frames per episode; JPEG/PNG-encoded where the format stores
  encoded images: RLDS, MCAP's compressed topic) is converted and the peak resident memory of the
  converting process (``ru_maxrss``, its workers included) is reported against ``--limit`` (2 GB).

    python tools/bench/run.py writer --formats aloha robomimic umi rlds mcap [--episodes 40] [--workers 1]
    python tools/bench/run.py writer --memory [--gb 1.0] [--formats ...]

Not part of ``make test`` (the memory fixtures take minutes and gigabytes of disk).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import measure
import numpy as np

REPO = measure.REPO

FORMATS = ("aloha", "robomimic", "umi", "rlds", "mcap")

RUNNER = """
import json, resource, sys, time
from epishard.shardwriter import ConvertOptions, convert
from epishard.shardwriter.sources import SourceOptions
import torchcodec.decoders  # loaded once per process whatever the source: not timed
src, out, workers, fps = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
def cpu():
    return sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))
c, t = cpu(), time.perf_counter()
m = convert([src], out, ConvertOptions(workers=workers, progress=False, sources=SourceOptions(fps=fps)))
wall = time.perf_counter() - t
rss = max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(json.dumps({"wall_s": wall, "cpu_s": cpu() - c, "episodes": m.totals.episodes, "rows": m.totals.rows,
                  "frames": m.totals.frames, "bytes": m.totals.bytes, "peak_rss_kb": rss}))
"""


def frame(n: int, height: int, width: int) -> np.ndarray:
    """Frame ``n``: its number in blocks (``encode_frame_number``) over a gradient that moves with ``n``."""
    from videogen import encode_frame_number

    image = encode_frame_number(n % 65536, height, width)
    ramp = ((np.arange(width)[None, :] + 3 * n) % 64).astype(np.uint8)
    image[..., 1] = np.maximum(image[..., 1], np.broadcast_to(ramp, (height, width)))
    return image


def encoded(image: np.ndarray, codec: str = "mjpeg") -> bytes:
    import av

    ctx = av.CodecContext.create(codec, "w")
    ctx.width, ctx.height = image.shape[1], image.shape[0]
    ctx.pix_fmt, ctx.time_base = ("rgb24" if codec == "png" else "yuvj420p"), Fraction(1, 20)
    f = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format=ctx.pix_fmt)
    return b"".join(bytes(p) for p in [*ctx.encode(f), *ctx.encode(None)])


def _rows(t: int, width: int, e: int) -> np.ndarray:
    return (np.arange(t * width, dtype=np.float64).reshape(t, width) * 0.01 + e).astype(np.float32)


def write_aloha(root: Path, episodes: int, frames: int, h: int, w: int) -> str:
    import h5py

    root.mkdir(parents=True)
    for e in range(episodes):
        with h5py.File(root / f"episode_{e}.hdf5", "w") as f:
            f.create_dataset("observations/qpos", data=_rows(frames, 14, e))
            f.create_dataset("observations/qvel", data=_rows(frames, 14, -e))
            f.create_dataset("action", data=_rows(frames, 14, 2 * e))
            for c, cam in enumerate(("cam_high", "cam_wrist")):
                ds = f.create_dataset(f"observations/images/{cam}", (frames, h, w, 3), np.uint8, chunks=(1, h, w, 3))
                for i in range(frames):
                    ds[i] = frame(1000 * e + 100 * c + i, h, w)
    return str(root)


def write_robomimic(root: Path, episodes: int, frames: int, h: int, w: int) -> str:
    import h5py

    root.mkdir(parents=True)
    path = root / "demo.hdf5"
    with h5py.File(path, "w") as f:
        data = f.require_group("data")
        data.attrs["problem_info"] = json.dumps({"language_instruction": "pick up the bench"})
        for d in range(episodes):
            g = data.create_group(f"demo_{d}")
            g.create_dataset("obs/joint_states", data=_rows(frames, 7, d))
            g.create_dataset("obs/gripper_states", data=_rows(frames, 2, d))
            g.create_dataset("actions", data=_rows(frames, 7, -d))
            for c, cam in enumerate(("agentview_rgb", "eye_in_hand_rgb")):
                ds = g.create_dataset(f"obs/{cam}", (frames, h, w, 3), np.uint8, chunks=(1, h, w, 3))
                for i in range(frames):
                    ds[i] = frame(1000 * d + 100 * c + i, h, w)
    return str(path)


def write_umi(root: Path, episodes: int, frames: int, h: int, w: int) -> str:
    import zarr

    n = episodes * frames
    g = zarr.open_group(str(root), mode="w", zarr_format=2)
    data = g.create_group("data")
    for c in range(2):
        a = data.create_array(f"camera{c}_rgb", shape=(n, h, w, 3), dtype=np.uint8, chunks=(1, h, w, 3))
        for k in range(n):
            a[k] = frame(c * 30000 + k, h, w)
    data.create_array("robot0_eef_pos", data=_rows(n, 3, 0))
    data.create_array("robot0_eef_rot_axis_angle", data=_rows(n, 3, 1))
    data.create_array("robot0_gripper_width", data=_rows(n, 1, 2))
    g.create_group("meta").create_array("episode_ends", data=np.arange(1, episodes + 1, dtype=np.int64) * frames)
    return str(root)


def write_rlds(root: Path, episodes: int, frames: int, h: int, w: int) -> str:
    import tfrecord

    root.mkdir(parents=True)
    writer = tfrecord.TFRecordWriter(str(root / "bench-train.tfrecord-00000-of-00001"))
    for e in range(episodes):
        writer.write(
            {
                "steps/observation/image": ([encoded(frame(1000 * e + i, h, w)) for i in range(frames)], "byte"),
                "steps/observation/wrist_image": (
                    [encoded(frame(1000 * e + 100 + i, h, w)) for i in range(frames)],
                    "byte",
                ),
                "steps/observation/state": (_rows(frames, 8, e).reshape(-1).tolist(), "float"),
                "steps/action": (_rows(frames, 7, -e).reshape(-1).tolist(), "float"),
                "steps/is_first": ([int(i == 0) for i in range(frames)], "int"),
                "steps/is_last": ([int(i == frames - 1) for i in range(frames)], "int"),
                "steps/language_instruction": ([b"pick up the bench"] * frames, "byte"),
            }
        )
    writer.close()
    return str(root)


def write_mcap(root: Path, episodes: int, frames: int, h: int, w: int) -> str:
    from mcap_ros2.writer import Writer
    from test_sources_mcap import COMPRESSED, IMAGE, JOINTS, _header

    root.mkdir(parents=True)
    ms = 1_000_000
    for e in range(episodes):
        with open(root / f"run_{e}.mcap", "wb") as f:
            writer = Writer(f)
            image = writer.register_msgdef("sensor_msgs/msg/Image", IMAGE)
            compressed = writer.register_msgdef("sensor_msgs/msg/CompressedImage", COMPRESSED)
            joints = writer.register_msgdef("sensor_msgs/msg/JointState", JOINTS)
            t0 = 1_700_000_000_000_000_000 + e * 10**12
            for i in range(frames):  # 20 Hz raw camera, 20 Hz JPEG camera (+5 ms), 40 Hz joints
                t = t0 + i * 50 * ms
                msg = {"header": _header(t), "height": h, "width": w, "encoding": "rgb8", "is_bigendian": 0}
                data = frame(1000 * e + i, h, w).tobytes()
                writer.write_message("/cam_high/image_raw", image, {**msg, "step": 3 * w, "data": data}, t, t)
                jpeg = encoded(frame(1000 * e + 100 + i, h, w))
                c = {"header": _header(t + 5 * ms), "format": "jpeg", "data": jpeg}
                writer.write_message("/cam_wrist/image_raw/compressed", compressed, c, t + 5 * ms, t + 5 * ms)
                for j in range(2):
                    tj = t + j * 25 * ms
                    js = {
                        "header": _header(tj),
                        "name": ["a"] * 7,
                        "position": [float(i)] * 7,
                        "velocity": [],
                        "effort": [],
                    }
                    writer.write_message("/joint_states", joints, js, tj, tj)
            writer.finish()
    return str(root)


WRITERS = {"aloha": write_aloha, "robomimic": write_robomimic, "umi": write_umi, "rlds": write_rlds, "mcap": write_mcap}


def fixture(data: Path, fmt: str, episodes: int, frames: int, h: int, w: int) -> str:
    """The fixture's path, written once (a ``.done`` marker says it is complete)."""
    root = data / f"{fmt}-{episodes}x{frames}-{h}x{w}"
    done = root.with_suffix(".done")
    if not done.exists():
        shutil.rmtree(root, ignore_errors=True)
        path = WRITERS[fmt](root, episodes, frames, h, w)
        done.write_text(path)
    return done.read_text()


def convert_in_process(src: str, workers: int, fps: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-sources-") as scratch:
        before = os.getloadavg()[0]
        env = measure.env_with()
        done = subprocess.run(
            [sys.executable, "-c", RUNNER, src, os.path.join(scratch, "out"), str(workers), str(fps)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result.update(load_before=before, load_after=os.getloadavg()[0])
        return result


def run_formats(args) -> int:
    """Per format: a fixture written once, converted in a fresh process; throughput, or peak memory."""
    args.formats = args.formats or list(FORMATS)
    args.episodes = args.episodes or 40
    args.data = args.data or os.path.join(tempfile.gettempdir(), "epishard-bench-sources")
    workers = args.workers[0]
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    failed = False
    for fmt in args.formats:
        if args.memory:
            h, w = 480, 640
            per_episode = 2 * args.memory_frames * h * w * 3
            episodes = int(np.ceil(args.gb * 1e9 / per_episode))
            episodes += 1 if fmt == "mcap" else 0  # resampling leaves out a row at each end where topics start apart
            src = fixture(data, fmt, episodes, args.memory_frames, h, w)
        else:
            episodes, h, w = args.episodes, args.size, args.size
            src = fixture(data, fmt, episodes, args.frames, h, w)
        r = convert_in_process(src, workers, 20.0)
        raw = r["frames"] * h * w * 3
        r.update(format=fmt, raw_frame_gb=raw / 1e9, episodes_per_s=r["episodes"] / r["wall_s"])
        r["episodes_per_cpu_s"] = r["episodes"] / r["cpu_s"] if r["cpu_s"] else 0.0
        measure.emit(r)
        if args.json:
            continue
        line = (
            f"{fmt:10s} {r['episodes']:5d} ep {r['frames']:7d} frames ({r['raw_frame_gb']:.2f} GB raw) "
            f"{r['episodes_per_s']:7.2f} ep/s ({r['episodes_per_cpu_s']:.1f} per CPU s)  wall {r['wall_s']:7.1f} s  "
            f"cpu {r['cpu_s']:7.1f} s  "
            f"peak {r['peak_rss_kb'] / 1e6:.2f} GB  load {r['load_before']:.1f} -> {r['load_after']:.1f}"
        )
        if args.memory:
            ok = r["peak_rss_kb"] / 1e6 < args.limit and r["raw_frame_gb"] >= args.gb
            failed |= not ok
            line += "  OK" if ok else f"  OVER {args.limit} GB (or under {args.gb} GB raw)"
        print(line, flush=True)
    return 1 if failed else 0
