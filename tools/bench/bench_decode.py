"""Benchmark: what opening a decoder costs per codec, and what one frame's RGB24 conversion costs.

The reader opens a fresh decoder on an episode's video bytes for every window it decodes (one per
camera), so at a few frames per window the open and the first frame weigh like the decoding itself.
Per codec in the real data (``../shared/data``) an episode's video is cut the way the converter
stores it (``shardwriter.video.cut``: stream copy from the episode's keyframe) and opened, again and
again, three ways, all with one FFmpeg thread:

``torchcodec``    ``VideoDecoder(bytes, custom_frame_mappings=..., num_ffmpeg_threads=1)``
                  (``epishard.format.decoder.open_decoder``: the reader's way today); first frame:
                  ``get_frame_at(0)`` (RGB24 uint8 tensor: the conversion is included).
``codeccontext``  ``av.CodecContext.create(name, "r")`` with the stream's extradata,
                  ``thread_count=1``, ``open()``; first frame: packets (demuxed beforehand, outside
                  the timing) fed until a frame comes out (YUV: no conversion).
``av.open``       ``av.open(BytesIO(bytes))`` (probes the stream) + the stream's codec context
                  (``thread_count=1``), opened; first frame: ``next(container.decode(stream))`` (YUV).

Each figure is the median over ``--repeats`` of wall milliseconds (``perf_counter``) and of the
process's CPU milliseconds (``process_time``; less distorted by other load on a shared machine).

Then the RGB24 conversion of one decoded frame at each source's size, and resized to 224x224: a
reused ``av.video.reformatter.VideoReformatter`` (``reformat(frame, format="rgb24")``, and with
``.to_ndarray()`` of its output: a numpy array like the next) against
``frame.to_ndarray(format="rgb24")`` (a fresh frame's own reformatter: a new SwsContext per frame).
Each conversion runs on a different decoded frame (a frame caches its reformatter); median ms, with
one swscale thread and with PyAV's default (``threads=0``: automatic, several threads).

Commands (repository root):

    python tools/bench/bench_decode.py                       # ~30 s on 2 quiet cores
    python tools/bench/bench_decode.py --repeats 50 --json out.json
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# (codec label, source under the data folder, frames of the cut: the first episode's rows; None: whole file)
SOURCES = (
    ("h264", "gr00t_robot_sim_picknplace_v30/videos/observation.images.ego_view/chunk-000/file-000.mp4", 416),
    ("mpeg4", "so101_bimanual_cloth_v30/videos/observation.images.cam1/chunk-000/file-000.mp4", 348),
    ("av1 (libdav1d)", "unitree_g1_bottle_av1_v30/videos/observation.images.cam_high/chunk-000/file-000.mp4", 393),
    ("hevc", "video_edge_cases/torchcodec/h265_video.mp4", None),
)
RGB_FRAMES = 30  # decoded frames per conversion method (each converted once)


def data_dir() -> Path:
    """``EPISHARD_SHARED_DATA``, else ``../shared/data`` beside the repository."""
    return Path(os.environ.get("EPISHARD_SHARED_DATA", REPO.parent / "shared" / "data"))


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


def _timed(fn):
    """(result, wall s, CPU s) of ``fn()``."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


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

    dec, ow, oc = _timed(lambda: open_decoder(data, table.pts, table.duration, table.keyflags(), table.stream_index))
    _, fw, fc = _timed(lambda: dec.get_frame_at(0))
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

    cc, ow, oc = _timed(open_)

    def first():
        for p in fresh:
            out = cc.decode(p)
            if out:
                return out[0]
        out = cc.decode(None)
        return out[0] if out else None

    frame, fw, fc = _timed(first)
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

    (c, s), ow, oc = _timed(open_)
    _, fw, fc = _timed(lambda: next(c.decode(s)))
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
                runs.append(_timed(functools.partial(fn, r, f, kw))[1:])
            out[(size, name)] = tuple(1e3 * statistics.median(x[i] for x in runs) for i in (0, 1))
        out[("source", "pix_fmt")] = fs[0].format.name
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=20, help="opens per method and codec (median)")
    p.add_argument("--data", default=str(data_dir()), help="the shared data folder")
    p.add_argument("--codecs", default="", help="comma-separated labels to run (default: all)")
    p.add_argument("--json", default="", help="also write the figures here")
    args = p.parse_args(argv)
    root = Path(args.data)
    chosen = [s for s in SOURCES if not args.codecs or s[0].split()[0] in args.codecs.split(",")]
    rows: list[dict] = []
    rgb: list[dict] = []
    for label, rel, frames in chosen:
        path = root / rel
        if not path.exists():
            print(f"skip {label}: {path} not found", file=sys.stderr)
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

    cmd = "python tools/bench/bench_decode.py" + (f" {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
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
    if args.json:
        for r in rgb:
            r["ms"] = {" ".join(k): v for k, v in r["ms"].items()}  # (wall, CPU) ms; "source pix_fmt": a name
        Path(args.json).write_text(json.dumps({"command": cmd, "open": rows, "rgb24": rgb}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
