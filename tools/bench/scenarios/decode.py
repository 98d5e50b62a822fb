"""Decoding costs, one part at a time (``--part``, comma-separated; default ``open``):

``open``    what opening a decoder costs per codec, and one frame's RGB24 conversion. Per codec in the
            real data (``../shared/data``) an episode's video is cut the way the converter stores it
            (``shardwriter.video.cut``: stream copy from the episode's keyframe) and opened, again and
            again, three ways, all with one FFmpeg thread: ``torchcodec`` (``VideoDecoder(bytes,
            custom_frame_mappings=..., num_ffmpeg_threads=1)``, ``open_decoder``; its first frame
            ``get_frame_at(0)`` includes the RGB24 conversion), ``codeccontext``
            (``av.CodecContext.create`` with the stream's extradata, ``thread_count=1``, ``open()``; first
            frame: pre-demuxed packets fed until a frame comes out, YUV) and ``av.open``
            (``av.open(BytesIO)`` + the stream's codec context; first frame YUV). Median over
            ``--repeats`` of wall ms and process CPU ms. Then the RGB24 conversion of one decoded frame at
            each source's size and at 224x224: a reused ``VideoReformatter`` (and with ``.to_ndarray()``)
            against ``frame.to_ndarray(format="rgb24")`` (a new SwsContext per frame), with swscale on 1
            thread and on PyAV's default (automatic).
``depth``   the PyAV full-precision depth path (``stream.decode.decode_depth``) against the torchcodec RGB
            path on the same bytes: a synthetic 320x240 scene, 120 frames, a keyframe every 30 (a sloped
            floor of 12-bit codes, a box moving across it, +-1 noise), lossless 12-bit HEVC and 16-bit
            FFV1; every frame, and 8 sparse frames; depth values checked exactly; median of ``--rounds``,
            ms per frame returned.
``gil``     how much a busy Python thread in the same process slows PyAV's decoding: the first
            ``--packets`` packets of ``--video`` (default: unitree's AV1 640x480 GOP 2 camera) with one
            kept one-thread decoder, alone and beside a thread running Python without pause. PyAV releases
            the GIL inside FFmpeg's calls but needs it back after each one, so Python work in another
            thread (s3fs's event loop, the prefetch pool) runs in series with decoding.
``resize``  how far resizing inside swscale (PyAV's ``reformat(width, height)``, torchcodec's decoder-side
            ``Resize``) lands from the reader's resize (full-size RGB, then torch's antialiased bilinear):
            for every ``--step``-th frame of ``--video`` (up to ``--frames``), each of ``--sizes`` and each
            swscale filter, the largest difference (levels) and the share of values more than 1 apart;
            ``yuv``: swscale scales while converting, ``rgb``: it scales the full-size RGB frame.

    python tools/bench/run.py decode                       # ~30 s on 2 quiet cores
    python tools/bench/run.py decode --part depth,gil
    python tools/bench/run.py decode --part resize --sizes 224x224 96x96
"""

from __future__ import annotations

import functools
import io
import statistics
import sys
import threading
import time
from pathlib import Path

import av
import measure
import numpy as np
import torch

# (codec label, source under the data folder, frames of the cut: the first episode's rows; None: whole file)
SOURCES = (
    ("h264", "gr00t_robot_sim_picknplace_v30/videos/observation.images.ego_view/chunk-000/file-000.mp4", 416),
    ("mpeg4", "so101_bimanual_cloth_v30/videos/observation.images.cam1/chunk-000/file-000.mp4", 348),
    ("av1 (libdav1d)", "unitree_g1_bottle_av1_v30/videos/observation.images.cam_high/chunk-000/file-000.mp4", 393),
    ("hevc", "video_edge_cases/torchcodec/h265_video.mp4", None),
)
RGB_FRAMES = 30  # decoded frames per conversion method (each converted once)


def episode_bytes(path: Path, frames: int | None):
    """(mp4 bytes, frame table) of the first ``frames`` frames of ``path``, cut as the converter
    stores an episode (``shardwriter.video.cut``); the whole file when ``frames`` is None."""
    from epishard.shardwriter.video import cut, frame_table, scan

    info = scan(str(path))
    if frames is None:
        data = path.read_bytes()
        return data, frame_table(data, "off")
    data, stored, _ = cut(str(path), info, 0, min(frames, info.num_frames), level="off")
    return data, stored


def _stream_setup(data: bytes):
    """Codec name, extradata and the first packets (bytes, pts, dts, key) of the first video stream."""
    import av

    with av.open(io.BytesIO(data)) as c:
        s = c.streams.video[0]
        name, extradata = s.codec_context.name, s.codec_context.extradata
        packets = []
        for p in c.demux(s):
            if p.size:
                packets.append((bytes(p), p.pts, p.dts, p.is_keyframe))
            if len(packets) >= 64:
                break
    return name, extradata, packets


def bench_torchcodec(data: bytes, table) -> tuple[tuple, tuple]:
    """One open (``open_decoder``) and first frame, each (wall s, CPU s)."""
    from epishard.format.decoder import open_decoder

    dec, ow, oc = measure.timed(
        lambda: open_decoder(data, table.pts, table.duration, table.keyflags(), table.stream_index)
    )
    _, fw, fc = measure.timed(lambda: dec.get_frame_at(0))
    return (ow, oc), (fw, fc)


def bench_codeccontext(name: str, extradata, packets) -> tuple[tuple, tuple]:
    """``CodecContext.create`` + extradata + ``thread_count=1`` + ``open()``; then the first frame."""
    import av

    def open_():
        cc = av.CodecContext.create(name, "r")
        if extradata:
            cc.extradata = extradata
        cc.thread_count = 1
        cc.open()
        return cc

    fresh = []
    for raw, pts, dts, _key in packets:  # made before the timing: the reader would have them demuxed
        p = av.Packet(raw)
        p.pts, p.dts = pts, dts
        fresh.append(p)

    cc, ow, oc = measure.timed(open_)

    def first():
        for p in fresh:
            out = cc.decode(p)
            if out:
                return out[0]
        out = cc.decode(None)
        return out[0] if out else None

    frame, fw, fc = measure.timed(first)
    if frame is None:
        raise RuntimeError(f"{name}: no frame out of {len(fresh)} packets")
    return (ow, oc), (fw, fc)


def bench_avopen(data: bytes) -> tuple[tuple, tuple]:
    """``av.open(BytesIO)`` + the stream's codec context (``thread_count=1``) opened; then the first frame."""
    import av

    def open_():
        c = av.open(io.BytesIO(data))
        s = c.streams.video[0]
        s.codec_context.thread_count = 1
        s.codec_context.open()
        return c, s

    (c, s), ow, oc = measure.timed(open_)
    _, fw, fc = measure.timed(lambda: next(c.decode(s)))
    c.close()
    return (ow, oc), (fw, fc)


def _median_ms(runs: list[tuple[tuple, tuple]]) -> dict:
    pick = {"open_wall": (0, 0), "open_cpu": (0, 1), "first_wall": (1, 0), "first_cpu": (1, 1)}
    return {k: 1e3 * statistics.median(r[i][j] for r in runs) for k, (i, j) in pick.items()}


def bench_rgb(data: bytes, threads: int) -> dict:
    """Median (wall, CPU) ms to convert one decoded frame to RGB24: reused reformatter (VideoFrame
    out, and numpy out) vs ``frame.to_ndarray(format="rgb24")``, at the source size and at 224x224;
    ``threads``: swscale threads (PyAV's default, 0, is automatic)."""
    import av
    from av.video.reformatter import VideoReformatter

    def frames(k: int):
        with av.open(io.BytesIO(data)) as c:
            s = c.streams.video[0]
            s.codec_context.thread_count = 1
            out = []
            for f in c.decode(s):
                out.append(f)
                if len(out) >= k:
                    break
            return out

    cases = {
        "reformatter": lambda r, f, kw: r.reformat(f, format="rgb24", **kw),
        "reformatter + to_ndarray": lambda r, f, kw: r.reformat(f, format="rgb24", **kw).to_ndarray(),
        "to_ndarray": lambda r, f, kw: f.to_ndarray(format="rgb24", **kw),
    }
    out = {}
    for size, kw in (("source", {"threads": threads}), ("224x224", {"width": 224, "height": 224, "threads": threads})):
        for name, fn in cases.items():
            fs = frames(RGB_FRAMES + 1)
            r = VideoReformatter()
            fn(r, fs[0], kw)  # the reused reformatter's SwsContext made once, untimed
            runs = []
            for f in fs[1:]:
                runs.append(measure.timed(functools.partial(fn, r, f, kw))[1:])
            out[(size, name)] = tuple(1e3 * statistics.median(x[i] for x in runs) for i in (0, 1))
        out[("source", "pix_fmt")] = fs[0].format.name
    return out


def part_open(args) -> int:
    """Decoder opens and first frames per codec, then the RGB24 conversion of one frame."""
    root = Path(args.data)
    chosen = [s for s in SOURCES if not args.codecs or s[0].split()[0] in args.codecs.split(",")]
    rows: list[dict] = []
    rgb: list[dict] = []
    for label, rel, frames in chosen:
        path = root / rel
        if not path.exists():
            measure.say(f"skip {label}: {path} not found")
            continue
        data, table = episode_bytes(path, frames)
        name, extradata, packets = _stream_setup(data)
        bench_torchcodec(data, table)  # warm-up: imports, first-use costs
        bench_codeccontext(name, extradata, packets)
        bench_avopen(data)
        res = {
            "torchcodec": _median_ms([bench_torchcodec(data, table) for _ in range(args.repeats)]),
            "codeccontext": _median_ms([bench_codeccontext(name, extradata, packets) for _ in range(args.repeats)]),
            "av.open": _median_ms([bench_avopen(data) for _ in range(args.repeats)]),
        }
        rows.append(
            {
                "codec": label,
                "decoder": name,
                "source": rel,
                "frames": table.num_frames,
                "keyframes": len(table.keyframes),
                "bytes": len(data),
                "size": f"{table.width}x{table.height}",
                "ms": res,
            }
        )
        for threads in (1, 0):
            rgb.append(
                {
                    "codec": label,
                    "size": f"{table.width}x{table.height}",
                    "sws_threads": threads,
                    "ms": bench_rgb(data, threads),
                }
            )
        print(f"{label}: done", file=sys.stderr, flush=True)

    if not rows:
        raise measure.Missing(f"none of the videos of {args.codecs or 'every codec'} under {root}")
    cmd = ("python tools/bench/run.py decode " + " ".join(args.argv)).rstrip()
    print(f"Command: `{cmd}`  ")
    print(f"Median of {args.repeats} repeats, ms: wall (process CPU). One FFmpeg thread everywhere.\n")
    head = ["codec", "size", "episode frames", "bytes"]
    head += [f"{m} {w}" for m in ("torchcodec", "CodecContext", "av.open") for w in ("open", "first frame")]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for r in rows:
        cells = [r["codec"], r["size"], r["frames"], r["bytes"]]
        for m in ("torchcodec", "codeccontext", "av.open"):
            x = r["ms"][m]
            cells += [f"{x['open_wall']:.2f} ({x['open_cpu']:.2f})", f"{x['first_wall']:.2f} ({x['first_cpu']:.2f})"]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print(
        "\ntorchcodec's first frame includes its RGB24 conversion; CodecContext's and av.open's are YUV "
        "(add the conversion below).\n"
    )
    methods = ("reformatter", "reformatter + to_ndarray", "to_ndarray")
    head = ["codec", "source size", "pix_fmt", "sws threads"]
    head += [f"{m} @source" for m in methods] + [f"{m} @224x224" for m in methods]
    print(f"RGB24 conversion of one decoded frame, median ms over {RGB_FRAMES} frames: wall (process CPU).")
    print("sws threads: 1, or 0 = PyAV's default (automatic: several threads).\n")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for r in rgb:
        ms = r["ms"]
        cells = [r["codec"], r["size"], ms[("source", "pix_fmt")], str(r["sws_threads"])]
        cells += [f"{ms[(s, m)][0]:.3f} ({ms[(s, m)][1]:.3f})" for s in ("source", "224x224") for m in methods]
        print("| " + " | ".join(cells) + " |")
    for r in rgb:
        r["ms"] = {" ".join(k): v for k, v in r["ms"].items()}  # (wall, CPU) ms; "source pix_fmt": a name
    for r in rows:
        measure.emit({"part": "open", "command": cmd, **r})
    for r in rgb:
        measure.emit({"part": "rgb24", "command": cmd, **r})
    return 0


# --- depth ------------------------------------------------------------------------------------------------

H, W, N, GOP = 240, 320, 120, 30
PATTERNS = {"all 120": np.arange(N), "sparse 8": np.arange(0, N, 15) + 7}


def _scene() -> np.ndarray:
    """uint16 [N, H, W] 12-bit depth codes: floor sloping away, a nearer box moving right, noise."""
    rng = np.random.RandomState(0)
    y = np.arange(H, dtype=np.int64)[:, None]
    floor = np.broadcast_to(3800 - 10 * y, (H, W))
    frames = np.repeat(floor[None], N, axis=0).copy()
    for i in range(N):
        x0 = 20 + 2 * i
        frames[i, 80:160, x0 : x0 + 60] = 900 + i
    return (frames + rng.randint(-1, 2, frames.shape)).clip(0, 4095).astype(np.uint16)


def _ms_per_frame(fn, frames: np.ndarray, rounds: int) -> float:
    return 1e3 * measure.median(w for w, _ in measure.repeat(lambda: fn(frames), rounds, warmup=0)) / frames.size


def part_depth(args) -> int:
    """Depth path against the RGB path, HEVC gray12le and FFV1 gray16le."""
    from videogen import make_grey_video

    from epishard.shardwriter.video import probe
    from epishard.stream.decode import decode, decode_depth

    depth = _scene()
    for codec, pix_fmt in (("hevc", "gray12le"), ("ffv1", "gray16le")):
        data = make_grey_video(depth, codec=codec, pix_fmt=pix_fmt, gop=GOP)
        info = probe(data)
        keys = info.keyframes.astype(np.int64)

        def run(frames, data=data, info=info, keys=keys):
            out = decode_depth(data, frames, info.pts, keys, where="bench").frames
            assert np.array_equal(out[:, 0].numpy(), depth[frames])

        flags = np.zeros(info.num_frames, bool)
        flags[info.keyframes] = True
        tables = (info.pts, info.duration, flags)

        def run_rgb(frames, data=data, tables=tables):
            out = decode(data, frames, tables, where="bench").frames
            assert tuple(out.shape) == (frames.size, 3, H, W)

        for name, frames in PATTERNS.items():
            row = {
                "part": "depth",
                "codec": codec,
                "pix_fmt": pix_fmt,
                "mb": len(data) / 1e6,
                "pattern": name,
                "depth_ms_per_frame": _ms_per_frame(run, frames, args.rounds),
                "rgb_ms_per_frame": _ms_per_frame(run_rgb, frames, args.rounds),
            }
            measure.emit(row)
            if not measure.json_mode():
                print(
                    f"{codec} {pix_fmt} {row['mb']:.2f} MB, {name}: depth path (PyAV, uint16) "
                    f"{row['depth_ms_per_frame']:.1f} ms/frame; RGB path (torchcodec, uint8) "
                    f"{row['rgb_ms_per_frame']:.1f} ms/frame"
                )
    return 0


# --- the GIL ----------------------------------------------------------------------------------------------

UNITREE_CAMERA = "unitree_g1_bottle_av1_v30/videos/observation.images.cam_high/chunk-000/file-000.mp4"
DECODERS = {"av1": "libdav1d"}  # FFmpeg's own AV1 decoder needs a hardware accelerator


def decode_seconds(packets: list, codec: str, extradata: bytes | None) -> tuple[float, int]:
    """Seconds to decode ``packets`` with a fresh one-thread decoder, and the frames it returned."""
    ctx = av.CodecContext.create(DECODERS.get(codec, codec), "r")
    ctx.extradata = extradata
    ctx.thread_count = 1
    started, frames = time.perf_counter(), 0
    for packet in packets:
        frames += len(ctx.decode(packet))
    frames += len(ctx.decode(None))
    return time.perf_counter() - started, frames


def part_gil(args) -> int:
    """Decoding alone, then beside a busy Python thread."""
    import av

    video = measure.need(args.video or measure.shared_data() / UNITREE_CAMERA, "video (give --video)")
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        codec, extradata = stream.codec_context.name, stream.codec_context.extradata
        packets = [p for _, p in zip(range(args.packets), container.demux(stream), strict=False) if p.size]
    alone, frames = decode_seconds(packets, codec, extradata)

    stop = threading.Event()
    spins = [0]

    def spin() -> None:
        while not stop.is_set():
            spins[0] += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        beside, _ = decode_seconds(packets, codec, extradata)
    finally:
        stop.set()
        spinner.join()
    measure.emit(
        {
            "part": "gil",
            "video": str(video),
            "packets": len(packets),
            "frames": frames,
            "alone_s": alone,
            "beside_s": beside,
        }
    )
    if not measure.json_mode():
        print(
            f"{Path(video).name}: {len(packets)} packets, {frames} frames ({codec}, one decoder thread): "
            f"{alone:.3f} s alone, {beside:.3f} s beside a busy Python thread ({beside / alone:.1f}x)"
        )
    return 0


# --- resizing inside swscale ------------------------------------------------------------------------------

FILTERS = ("BILINEAR", "AREA", "BICUBIC", "GAUSS", "LANCZOS", "X")


def reader_resize(frame: av.VideoFrame, size: tuple[int, int]) -> np.ndarray:
    """uint8 ``[h, w, 3]``: the reader's frame, full-size RGB resized by ``PostProcess``'s kernel."""
    rgb = torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1)[None]
    out = torch.nn.functional.interpolate(
        rgb.contiguous(memory_format=torch.channels_last), size=size, mode="bilinear", antialias=True
    )
    return out[0].permute(1, 2, 0).numpy()


def part_resize(args) -> int:
    """Largest difference and share > 1 of swscale's resizes against the reader's."""
    import av

    video = str(measure.need(args.video or measure.shared_data() / UNITREE_CAMERA, "video (give --video)"))
    with av.open(video) as container:
        stream = container.streams.video[0]
        frames = [f for i, f in enumerate(container.decode(stream)) if i % args.step == 0][: args.frames]
    height, width = frames[0].height, frames[0].width
    rows = []
    for text in args.sizes:
        size = tuple(int(v) for v in text.split("x"))
        want = [reader_resize(f, size).astype(np.int16) for f in frames]
        for path in ("yuv", "rgb"):
            for name in FILTERS:
                worst, share = 0, 0.0
                for frame, ref in zip(frames, want, strict=True):
                    src = frame if path == "yuv" else av.VideoFrame.from_ndarray(frame.to_ndarray(format="rgb24"))
                    got = src.reformat(width=size[1], height=size[0], format="rgb24", interpolation=name)
                    diff = np.abs(got.to_ndarray().astype(np.int16) - ref)
                    worst, share = max(worst, int(diff.max())), share + float((diff > 1).mean()) / len(frames)
                measure.emit(
                    {
                        "part": "resize",
                        "size": text,
                        "path": path,
                        "filter": name,
                        "max_diff": worst,
                        "share_over_1": share,
                    }
                )
                rows.append((text, path, name, worst, f"{share:.2%}"))
    title = f"{video}: {len(frames)} frames of {width}x{height} {frames[0].format.name}"
    measure.table(("size", "path", "filter", "max diff", "share > 1"), rows, title=title)
    return 0


# --- the command ------------------------------------------------------------------------------------------

PARTS = {"open": part_open, "depth": part_depth, "gil": part_gil, "resize": part_resize}
SMOKE = {"repeats": 1, "codecs": "mpeg4", "rounds": 1, "packets": 20, "frames": 2, "sizes": ["96x96"]}


def options(p) -> None:
    p.add_argument("--part", default="open", help="comma-separated: " + ", ".join(PARTS))
    p.add_argument("--repeats", type=int, default=20, help="open: opens per method and codec (median)")
    p.add_argument("--data", default=str(measure.shared_data()), help="open: the shared data folder")
    p.add_argument("--codecs", default="", help="open: comma-separated labels to run (default: all)")
    p.add_argument("--rounds", type=int, default=5, help="depth: rounds per pattern (median)")
    p.add_argument(
        "--video", default=None, help="gil, resize: a video file (default: unitree's camera in ../shared/data)"
    )
    p.add_argument("--packets", type=int, default=300, help="gil: packets decoded")
    p.add_argument("--sizes", nargs="+", default=["224x224", "96x96", "256x256", "240x320"], help="resize: HxW")
    p.add_argument("--frames", type=int, default=12, help="resize: frames compared")
    p.add_argument("--step", type=int, default=7, help="resize: every STEP-th frame")


def run(args) -> int:
    for part in args.part.split(","):
        PARTS[part](args)
    return 0
