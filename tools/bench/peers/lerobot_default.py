"""Generate a LeRobot v3.0 dataset recorded with LeRobot 0.6.1's default video settings.

Written through LeRobot's own API (``LeRobotDataset.create`` / ``add_frame`` / ``save_episode``),
run in the LeRobot 0.6.1 peer venv (``../shared/peers/setup_lerobot061_venv.sh``; this file
(``tools/bench/peers/lerobot_default.py``, the ``lerobot-default`` scenario) re-executes itself there
when ``lerobot`` 0.6.1 is not importable), with what ``lerobot-record``
does by default: ``rgb_encoder_defaults()`` (``RGBEncoderConfig()``: ``vcodec="libsvtav1"``,
``pix_fmt="yuv420p"``, ``g=2``, ``crf=30``, ``preset=12`` (``LIBSVTAV1_DEFAULT_PRESET``),
``fast_decode=0``), ``encoder_threads=None``, ``streaming_encoding=False`` (PNG frames, then
``encode_video_frames`` per episode) and 4 PNG writer threads per camera. The codec options LeRobot
hands to PyAV's ``add_stream("libsvtav1", fps, options=...)`` are therefore
``{"g": "2", "crf": "30", "preset": "12", "svtav1-params": "fast-decode=0"}``; the encoder is the
libsvtav1 inside PyAV's bundled FFmpeg (the wheel LeRobot installs), which is what a LeRobot user's
recordings go through. Episodes are concatenated into ``videos/<cam>/chunk-000/file-000.mp4`` by
LeRobot (a new file past 200 MB, LeRobot's default).

Content: one camera ``observation.images.cam_high`` (default 1280x720, 30 fps): a panning textured
scene (multi-scale noise, so AV1 works as on a real camera rather than on a flat image), two moving
objects, light sensor noise, and two rows of 32x32 black/white blocks (smaller below 768 px wide) at
the top left: row 0 the global frame index (24 bits, most significant first), row 1 the episode index
(16 bits); ``read_barcode`` recovers both from a decoded RGB frame. ``observation.state`` and ``action``:
14-dim float32 smooth trajectories (action = the next step's state). One task string.

    python tools/bench/run.py lerobot-default                          # 20 episodes x 120 frames, 720p:
                                                                  # 7 min on 2 busy cores (425 s CPU), 108 MiB
    python tools/bench/run.py lerobot-default --episodes 4 --frames 60 --size 640x360 --out /tmp/x --overwrite
    python tools/bench/run.py lerobot-default --encoder ffmpeg --out /work/gen/lerobot_default_720p_v30_ffmpeg

PyAV's SVT-AV1 v3.0.0 logs "Preset M12 is mapped to M10." and encodes at preset 10 (info.json still
records ``video.preset: 12``); Debian's SVT-AV1 v1.4.1 (``--encoder ffmpeg``) runs preset 12.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PEER_PYTHON = "/tmp/peer/lerobot061-venv/bin/python"
PEER_ENV = "/tmp/peer/lerobot061-env.sh"
CAMERA = "observation.images.cam_high"
TASK = "Pick up the bottle and place it in the bin."
DIM = 14
GLOBAL_BITS, EPISODE_BITS = 24, 16


def block_size(width: int) -> int:
    """The barcode's block side: 32 px, smaller (a multiple of 8, at least 8) when 24 blocks do not fit."""
    return max(8, min(32, width // GLOBAL_BITS // 8 * 8))


def barcode(frame, global_index: int, episode_index: int) -> None:
    """Draw the frame's global index (row 0) and episode index (row 1) as black/white blocks, in place."""
    block = block_size(frame.shape[1])
    for row, (value, bits) in enumerate(((global_index, GLOBAL_BITS), (episode_index, EPISODE_BITS))):
        y = row * block
        for b in range(bits):
            on = (value >> (bits - 1 - b)) & 1
            frame[y : y + block, b * block : (b + 1) * block] = 255 if on else 0


def read_barcode(frame) -> tuple[int, int]:
    """``(global_index, episode_index)`` from a decoded HxWx3 (or 3xHxW) uint8 frame."""
    import numpy as np

    f = np.asarray(frame)
    if f.ndim == 3 and f.shape[0] == 3 and f.shape[-1] != 3:
        f = f.transpose(1, 2, 0)
    block, out = block_size(f.shape[1]), []
    for row, bits in enumerate((GLOBAL_BITS, EPISODE_BITS)):
        y = row * block + block // 4
        value = 0
        for b in range(bits):
            x = b * block + block // 4
            value = value << 1 | int(f[y : y + block // 2, x : x + block // 2].mean() > 127)
        out.append(value)
    return out[0], out[1]


class Scene:
    """The synthetic camera: a textured world twice the frame's size, panned along a per-episode path."""

    def __init__(self, width: int, height: int, seed: int):
        import numpy as np
        from PIL import Image

        self.w, self.h = width, height
        rng = np.random.default_rng(seed)
        world = np.zeros((2 * height, 2 * width, 3), np.float32)
        for scale, amp in ((64, 110.0), (16, 60.0), (4, 24.0), (2, 6.0)):  # coarse blobs to fine grain
            small = rng.integers(0, 256, (max(2, 2 * height // scale), max(2, 2 * width // scale), 3), np.uint8)
            up = Image.fromarray(small).resize((2 * width, 2 * height), Image.BILINEAR)
            world += (np.asarray(up, np.float32) - 128.0) * (amp / 128.0)
        yy, xx = np.mgrid[0 : 2 * height, 0 : 2 * width]
        world += (40 * np.sin(xx / 37.0)[..., None] * np.cos(yy / 53.0)[..., None]) * np.array([1.0, 0.6, 0.3])
        self.world = np.clip(world + 128.0, 0, 255).astype(np.uint8)
        self.rng = rng
        # sensor noise: a bank of noise fields cycled through (drawing one per frame costs more than the rest)
        self.noise = [rng.integers(-1, 2, (height, width, 1), dtype=np.int8) for _ in range(7)]
        r = height // 10
        yy, xx = np.mgrid[-r : r + 1, -r : r + 1]
        self.disc = xx**2 + yy**2 < r**2

    def frame(self, episode: int, t: int, n: int, global_index: int):
        """Frame ``t`` of ``n`` of ``episode`` (HxWx3 uint8)."""
        import numpy as np

        w, h = self.w, self.h
        phase = episode * 0.7
        u = t / max(n - 1, 1)
        ox = int((0.5 + 0.45 * np.sin(2 * np.pi * (u + phase))) * w)
        oy = int((0.5 + 0.45 * np.sin(2 * np.pi * (0.5 * u + phase) + 1.0)) * h)
        f = self.world[oy : oy + h, ox : ox + w].astype(np.int16)
        f += self.noise[global_index % len(self.noise)]
        np.clip(f, 0, 255, out=f)
        f = f.astype(np.uint8)
        # a moving disc (the object, keeping a quarter of the texture) and a bar (the gripper)
        r = self.disc.shape[0] // 2
        cx = int(w * (0.2 + 0.6 * u)), int(h * (0.5 + 0.3 * np.sin(4 * np.pi * u + phase)))
        y0, x0 = min(max(cx[1] - r, 0), h - 2 * r - 1), min(max(cx[0] - r, 0), w - 2 * r - 1)
        patch = f[y0 : y0 + 2 * r + 1, x0 : x0 + 2 * r + 1]
        patch[self.disc] = patch[self.disc] // 4 + np.array([180, 40, 30], np.uint8)
        gx = int(w * (0.8 - 0.5 * u))
        gy = int(h * (0.2 + 0.5 * abs(np.sin(3 * np.pi * u))))
        f[gy : gy + h // 6, max(gx, 0) : gx + w // 20] = (200, 200, 210)
        barcode(f, global_index, episode)
        return f


def trajectory(episode: int, n: int):
    """``(state, action)``: (n, 14) float32 joint-like curves; action = the next step's state."""
    import numpy as np

    t = np.arange(n + 1, dtype=np.float64)[:, None] / 30.0
    j = np.arange(DIM, dtype=np.float64)[None, :]
    q = 0.6 * np.sin(0.8 * t * (1 + 0.1 * j) + episode * 0.37 + j) + 0.05 * j
    return q[:-1].astype(np.float32), q[1:].astype(np.float32)


def use_ffmpeg_cli(binary: str = "ffmpeg") -> None:
    """Make LeRobot encode each episode with the ``ffmpeg`` command (Debian's: FFmpeg 5.1, SVT-AV1 1.4)
    instead of PyAV's bundled FFmpeg, with the very options LeRobot would pass to PyAV
    (``get_codec_options(encoder_threads, as_strings=True)``), codec and pixel format; everything else
    (PNG frames, concatenation into the camera's file, metadata) stays LeRobot's."""
    import lerobot.datasets.dataset_writer as writer
    from lerobot.configs.video import rgb_encoder_defaults

    def encode(imgs_dir, video_path, fps, video_encoder=None, encoder_threads=None, *, log_level=None, overwrite=False):
        enc = video_encoder or rgb_encoder_defaults()
        cmd = [binary, "-hide_banner", "-loglevel", "error", "-y" if overwrite else "-n"]
        cmd += ["-framerate", str(fps), "-i", str(Path(imgs_dir) / "frame-%06d.png")]
        cmd += ["-c:v", enc.vcodec, "-pix_fmt", enc.pix_fmt]
        for key, value in enc.get_codec_options(encoder_threads, as_strings=True).items():
            cmd += [f"-{key}", value]
        Path(video_path).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*cmd, str(video_path)], check=True)

    writer.encode_video_frames = encode


def generate(args) -> None:
    """Write the dataset with LeRobot's API (inside the 0.6.1 peer venv)."""
    from lerobot.configs.video import rgb_encoder_defaults
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    w, h = (int(v) for v in args.size.lower().split("x"))
    out = Path(args.out)
    if out.exists():
        if not args.overwrite:
            raise SystemExit(f"{out} exists (give --overwrite to replace it)")
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    names = [f"joint_{i}" for i in range(DIM)]
    features = {
        CAMERA: {"dtype": "video", "shape": (h, w, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (DIM,), "names": names},
        "action": {"dtype": "float32", "shape": (DIM,), "names": names},
    }
    enc = rgb_encoder_defaults()
    if args.encoder == "ffmpeg":
        use_ffmpeg_cli()
        version = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True).stdout.split("\n")[0]
        print(f"encoding with the ffmpeg command ({version}) instead of PyAV", flush=True)
    print(
        f"encoder: {enc.vcodec} pix_fmt={enc.pix_fmt} options={enc.get_codec_options(None, as_strings=True)} "
        f"(encoder_threads=None, streaming_encoding=False)",
        flush=True,
    )
    ds = LeRobotDataset.create(
        repo_id=f"local/{out.name}",
        fps=args.fps,
        features=features,
        root=out,
        robot_type="synthetic_bimanual",
        use_videos=True,
        image_writer_threads=4,  # lerobot-record: num_image_writer_threads_per_camera=4, 0 processes
        rgb_encoder=enc,
    )
    scene = Scene(w, h, args.seed)
    g = 0
    t_frames = t_save = 0.0
    t_all = time.perf_counter()
    for e in range(args.episodes):
        n = args.frames
        state, action = trajectory(e, n)
        t = time.perf_counter()
        for i in range(n):
            ds.add_frame(
                {
                    CAMERA: scene.frame(e, i, n, g),
                    "observation.state": state[i],
                    "action": action[i],
                    "task": TASK,
                }
            )
            g += 1
        t_frames += time.perf_counter() - t
        t = time.perf_counter()
        ds.save_episode()  # waits for the PNGs, encodes the episode, appends it to the camera's mp4
        t_save += time.perf_counter() - t
        print(f"episode {e + 1}/{args.episodes}: {n} frames (save+encode {time.perf_counter() - t:.1f} s)", flush=True)
    ds.finalize()
    total = time.perf_counter() - t_all
    videos = sorted((out / "videos").rglob("*.mp4"))
    size = sum(p.stat().st_size for p in videos)
    print(
        f"wrote {out}: {args.episodes} episodes, {g} frames, {w}x{h} @ {args.fps} fps; {len(videos)} mp4 "
        f"({size / 2**20:.1f} MiB, {size * 8 / (g / args.fps) / 1e6:.2f} Mbit/s); total {total:.1f} s "
        f"(frames+PNG {t_frames:.1f} s, save+encode {t_save:.1f} s)",
        flush=True,
    )
    if not args.no_check:
        check(out, g)


def check(out: Path, frames: int) -> None:
    """Decode a few frames of the camera's first file with torchcodec and read their barcodes back."""
    import pyarrow.parquet as pq
    from torchcodec.decoders import VideoDecoder

    ep = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    files = sorted((out / "videos" / CAMERA).rglob("*.mp4"))
    dec = VideoDecoder(str(files[0]))
    n = min(len(dec), frames)
    picks = sorted({0, 1, n // 3, n // 2, n - 2, n - 1})
    got = [read_barcode(dec[i].numpy()) for i in picks]
    per_ep = {r["episode_index"]: r for r in ep}
    wrong = []
    for i, (gi, ei) in zip(picks, got, strict=True):
        r = per_ep.get(ei)
        if gi != i or r is None or not (r["dataset_from_index"] <= gi < r["dataset_to_index"]):
            wrong.append((i, gi, ei))
    meta = dec.metadata
    print(
        f"check: {files[0].name} {meta.codec} {meta.width}x{meta.height} {len(dec)} frames; barcodes at {picks} "
        + ("OK" if not wrong else f"WRONG {wrong}"),
        flush=True,
    )
    if wrong:
        raise SystemExit(1)


class Missing(SystemExit):
    """No LeRobot 0.6.1 here nor in the peer venv (the harness reports it as an absent input)."""


def in_peer() -> bool:
    """Whether this interpreter has LeRobot 0.6.1."""
    try:
        import lerobot
    except ImportError:
        return False
    return lerobot.__version__ == "0.6.1"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="/work/gen/lerobot_default_720p_v30", help="dataset folder to write")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--frames", type=int, default=120, help="frames per episode (4 s)")
    p.add_argument("--size", default="1280x720", help="WIDTHxHEIGHT")
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument(
        "--encoder",
        choices=("pyav", "ffmpeg"),
        default="pyav",
        help="pyav: LeRobot's own encode (PyAV's bundled FFmpeg 7.1 / SVT-AV1 3.0, what lerobot-record does); "
        "ffmpeg: the ffmpeg command on PATH (Debian 12: FFmpeg 5.1.9, SVT-AV1 1.4.1) with the same options",
    )
    p.add_argument("--no-check", action="store_true", help="skip decoding a few frames' barcodes afterwards")
    p.add_argument("--peer-python", default=PEER_PYTHON, help="the LeRobot 0.6.1 venv's python")
    p.add_argument("--peer-env", default=PEER_ENV, help="its environment file (offline settings)")
    args = p.parse_args(argv)
    if not in_peer():
        if not Path(args.peer_python).exists() or not Path(args.peer_env).exists():
            raise Missing(
                f"LeRobot 0.6.1 not importable here and no peer venv at {args.peer_python}: build it with "
                "`bash ../shared/peers/setup_lerobot061_venv.sh` (or `python tools/bench/bench_peers.py --setup-peers`)"
            )
        cmd = f". {args.peer_env} && exec {args.peer_python} {Path(__file__).resolve()} " + " ".join(
            f"'{a}'" for a in (sys.argv[1:] if argv is None else argv)
        )
        return subprocess.run(["bash", "-c", cmd], env=dict(os.environ)).returncode
    generate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
