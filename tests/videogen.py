"""Synthetic test episodes: videos whose frames carry their own frame number, plus parquet-like tables.

Test-support module (not a test file). Every frame ``i`` of a generated video shows the integer ``i``
as a 4x4 grid of large grey blocks (16 bits, MSB first, row-major; black = 0, white = 1), so a decoded
frame can be mapped back to its index even after lossy coding and 4:2:0 chroma subsampling.
"""

from __future__ import annotations

import os
from fractions import Fraction
from io import BytesIO
from os import PathLike

import av
import numpy as np
import pyarrow as pa

GRID = 4  # GRID x GRID blocks, one bit each
NBITS = GRID * GRID
os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 logs errors only (it prints its config banner otherwise)


def encode_frame_number(n: int, height: int = 64, width: int = 64) -> np.ndarray:
    """Image carrying ``n`` (0 <= n < 2**16).

    Returns an ``(height, width, 3)`` uint8 RGB array with R == G == B. The frame is split into a 4x4
    grid of blocks of ``height // 4`` x ``width // 4`` px (any remainder rows/columns stay black);
    block ``k`` (row-major) is 255 if bit ``15 - k`` of ``n`` is set, else 0. Sizes of 32..256 px
    (blocks of 8..64 px) survive H.264, AV1 and MPEG-4 Part 2 at moderate quality.
    """
    if not 0 <= n < 2**NBITS:
        raise ValueError(f"frame number {n} out of range [0, {2**NBITS})")
    bh, bw = height // GRID, width // GRID
    if bh < 8 or bw < 8:
        raise ValueError(f"frame {height}x{width} too small: blocks must be at least 8x8 px")
    bits = (n >> np.arange(NBITS - 1, -1, -1)) & 1  # MSB first
    grid = (bits.reshape(GRID, GRID) * 255).astype(np.uint8)
    img = np.zeros((height, width, 3), np.uint8)
    img[: GRID * bh, : GRID * bw] = np.kron(grid, np.ones((bh, bw), np.uint8))[..., None]
    return img


def decode_frame_number(frame) -> int:
    """Inverse of :func:`encode_frame_number`.

    ``frame``: uint8 numpy array or torch tensor, ``(H, W, 3)`` (HWC) or ``(3, H, W)`` (CHW, as torchcodec
    returns by default). The mean of the central half (in each direction) of every block, over all
    channels, is thresholded at 128. Returns the frame number as a Python int.
    """
    a = np.asarray(frame.numpy() if hasattr(frame, "numpy") else frame)
    if a.ndim != 3:
        raise ValueError(f"expected a 3-D frame, got shape {a.shape}")
    if a.shape[0] == 3 and a.shape[-1] != 3:
        a = a.transpose(1, 2, 0)  # CHW -> HWC
    bh, bw = a.shape[0] // GRID, a.shape[1] // GRID
    n = 0
    for r in range(GRID):
        for c in range(GRID):
            blk = a[r * bh + bh // 4 : r * bh + bh - bh // 4, c * bw + bw // 4 : c * bw + bw - bw // 4]
            n = (n << 1) | int(blk.mean() >= 128)
    return n


def _stream_options(codec: str, gop: int, bframes: bool, open_gop: bool) -> tuple[str, dict[str, str]]:
    if codec == "h264":
        # asm=0: with x264's AVX-512 path the first encode in a process (torch imported) differed in
        # ~1 of 4 processes by a few bytes in one IDR frame; capped at AVX2 or with no asm it never did.
        # x264's C path is bit-exact with its asm and fast enough at test sizes (~3x slower at 256x256).
        params = (
            f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={2 if bframes else 0}:asm=0:open-gop={int(open_gop)}"
        )
        return "libx264", {"x264-params": params, "preset": "medium", "threads": "1"}
    if codec == "hevc":
        params = (
            f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={2 if bframes else 0}:open-gop={int(open_gop)}"
            ":log-level=error:pools=1:frame-threads=1:wpp=0"
        )
        return "libx265", {"x265-params": params, "preset": "fast", "crf": "20"}
    if codec == "av1":
        # lp=1: single-threaded (deterministic); crf 20 keeps 8x8 px blocks legible.
        return "libsvtav1", {"preset": "8", "crf": "20", "g": str(gop), "svtav1-params": f"keyint={gop}:lp=1"}
    if codec == "mpeg4":
        # No B-frames: with them the mpeg4 encoder inserts extra I-frames off the gop grid.
        return "mpeg4", {"qscale": "3", "g": str(gop), "bf": "0", "threads": "1", "sc_threshold": "1000000000"}
    if codec == "vp9":
        # lag-in-frames > 0 lets libvpx emit hidden alt-ref frames (packets that display nothing).
        lag = "16" if bframes else "0"
        return "libvpx-vp9", {
            "g": str(gop),
            "crf": "20",
            "b": "0",
            "deadline": "good",
            "cpu-used": "8",
            "threads": "1",
            "lag-in-frames": lag,
            "auto-alt-ref": "1" if bframes else "0",
        }
    raise ValueError(f"unknown codec {codec!r} (expected 'h264', 'hevc', 'av1', 'mpeg4' or 'vp9')")


# Container name -> FFmpeg muxer. AVI stores no presentation timestamps (FFmpeg infers them on
# reading); MPEG-TS and FLV store them per packet.
CONTAINERS = {"mp4": "mp4", "mkv": "matroska", "webm": "webm", "avi": "avi", "ts": "mpegts", "flv": "flv"}


def _boxes(data: bytes, start: int, end: int) -> list[tuple[bytes, int, int]]:
    """(type, offset, size) of the ISO-BMFF boxes in ``data[start:end]`` (32-bit sizes only)."""
    out = []
    while start < end:
        size = int.from_bytes(data[start : start + 4], "big")
        out.append((data[start + 4 : start + 8], start, size))
        start += size
    return out


def _udta_first(data: bytes) -> bytes:
    """Move the moov's ``udta`` box (which holds the cover art) in front of its ``trak`` boxes, so
    FFmpeg's demuxer lists the cover as stream 0. The moov is the file's last box (FFmpeg's MP4
    muxer writes it last), so no chunk offset moves."""
    _, moov, size = next(b for b in _boxes(data, 0, len(data)) if b[0] == b"moov")
    assert moov + size == len(data), "moov must be the last box"
    children = _boxes(data, moov + 8, moov + size)
    order = sorted(children, key=lambda b: {b"mvhd": 0, b"udta": 1}.get(b[0], 2))
    return data[: moov + 8] + b"".join(data[o : o + n] for _, o, n in order)


def make_video(
    path: str | PathLike | None,
    num_frames: int,
    *,
    codec: str = "h264",
    fps: int = 20,
    height: int = 64,
    width: int = 64,
    gop: int | None = None,
    bframes: bool = True,
    start_number: int = 0,
    container: str = "mp4",
    pix_fmt: str = "yuv420p",
    pts: list[int] | None = None,
    time_base: Fraction | None = None,
    open_gop: bool = False,
    rotation: int = 0,
    audio: bool = False,
    cover: bool = False,
) -> bytes:
    """Encode a video whose displayed frame ``i`` (0-based) shows the number ``start_number + i``.

    ``codec``: ``"h264"`` (libx264), ``"hevc"`` (libx265), ``"av1"`` (libsvtav1), ``"mpeg4"`` (MPEG-4
    Part 2) or ``"vp9"`` (libvpx-vp9). ``gop``: keyframe interval in frames (default 30); for h264,
    hevc and mpeg4 keyframes are at exactly the multiples of ``gop``. ``bframes``: allow B-frames
    (h264/hevc: up to 2 consecutive; vp9: hidden alt-ref frames; av1 uses its own hierarchical
    mini-GOP regardless and mpeg4 never uses B-frames). ``open_gop``: h264/hevc open GOPs.
    ``container``: ``"mp4"``, ``"mkv"``, ``"webm"``, ``"avi"``, ``"ts"`` (MPEG-TS) or ``"flv"`` (h264
    only). ``pix_fmt``: e.g. ``yuv420p``, ``yuv444p`` (odd
    sizes), ``yuv420p10le`` (10-bit). ``pts``: pts of each frame in ``time_base`` (default
    ``1/fps``; frame ``i`` at pts ``i``), for variable frame rates and start offsets.
    ``rotation``: display-matrix rotation in degrees (90 or 270: frames are stored turned, so a
    decoder that honours the matrix shows them upright, ``height`` x ``width``). ``audio``: add a
    silent audio stream (AAC, Opus in webm). ``cover``: add a 1-frame MJPEG cover (attached picture)
    as stream 0 (mp4 only). Returns the file bytes and also writes them to ``path`` when given.
    Output is byte-deterministic for identical arguments with the h264, av1 and mpeg4 encoders
    (single-threaded; x264 runs without asm, see ``_stream_options``); checked across 80 encodes in
    40 fresh processes with torch imported.
    """
    gop = 30 if gop is None else gop
    time_base = time_base or Fraction(1, fps)
    pts = list(range(num_frames)) if pts is None else list(pts)
    enc, options = _stream_options(codec, gop, bframes, open_gop)
    coded_h, coded_w = (width, height) if rotation % 180 else (height, width)
    buf = BytesIO()
    with av.open(buf, "w", format=CONTAINERS[container]) as out:
        if cover:
            art = out.add_stream("mjpeg")
            art.width, art.height, art.pix_fmt = 64, 64, "yuvj420p"
            art.disposition = av.stream.Disposition.attached_pic
        stream = out.add_stream(enc, rate=fps, options=options)
        stream.width, stream.height, stream.pix_fmt = coded_w, coded_h, pix_fmt
        stream.time_base = stream.codec_context.time_base = time_base
        stream.codec_context.gop_size = gop
        if rotation:
            stream.set_display_rotation(rotation)
        sound = out.add_stream("libopus" if container == "webm" else "aac", rate=48000) if audio else None
        if cover:
            image = av.VideoFrame.from_ndarray(encode_frame_number(0xA5A5), format="rgb24").reformat(format="yuvj420p")
            out.mux(art.encode(image) + art.encode(None))
        for i in range(num_frames):
            image = np.rot90(
                encode_frame_number(start_number + i, height, width), -(rotation // 90)
            )  # the matrix turns it back
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24").reformat(format=pix_fmt)
            frame.pts, frame.time_base = pts[i], time_base
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
        if sound is not None:
            seconds = float((pts[-1] + 1) * time_base)
            for k in range(int(seconds * 48000) // 960 + 1):
                samples = av.AudioFrame.from_ndarray(np.zeros((1, 960), np.float32), format="fltp", layout="mono")
                samples.sample_rate, samples.pts = 48000, k * 960
                out.mux(sound.encode(samples))
            out.mux(sound.encode(None))
    data = _udta_first(buf.getvalue()) if cover else buf.getvalue()
    if path is not None:
        with open(path, "wb") as f:
            f.write(data)
    return data


def cut_by_stream_copy(data: bytes, start: int, container: str = "mp4") -> tuple[bytes, int]:
    """Cut a video at frame ``start`` by stream copy, as ``ffmpeg -ss T -c copy`` and editing tools do.

    Packets are copied from the keyframe at or before ``start`` with timestamps shifted so frame
    ``start`` has pts 0: the frames before it get negative pts. In MP4 the muxer writes an edit list
    that hides them (the file holds more packets than it displays); Matroska/WebM shift all
    timestamps to start at 0 and show them. Returns (bytes, index in ``data`` of the first displayed
    frame).
    """
    out = BytesIO()
    with av.open(BytesIO(data)) as src, av.open(out, "w", format=CONTAINERS[container]) as dst:
        stream = src.streams.video[0]
        target = dst.add_stream_from_template(stream)
        packets = [p for p in src.demux(stream) if p.size]
        shift = sorted(int(p.pts) for p in packets)[start]
        key = max(int(p.pts) for p in packets if p.is_keyframe and p.pts <= shift)
        first = next(i for i, p in enumerate(packets) if p.pts == key)
        shown = start if container == "mp4" else sorted(int(p.pts) for p in packets).index(key)
        for packet in packets[first:]:
            packet.pts -= shift
            packet.dts -= shift
            packet.stream = target
            dst.mux(packet)
    return out.getvalue(), shown


def decode_order_timestamps(data: bytes, container: str = "mkv") -> bytes:
    """Remux ``data``'s first video stream into ``container`` with each packet's pts set to its dts.

    As a muxer writes packets that carry no pts (read from AVI and written with no ``-fflags
    +genpts``): packet ``q`` in decode order gets timestamp ``q`` frame periods (the smallest pts
    step of the source), so with B-frames the timestamps are in decode order, not display order.
    Returns the file bytes.
    """
    out = BytesIO()
    with av.open(BytesIO(data)) as src, av.open(out, "w", format=CONTAINERS[container]) as dst:
        stream = src.streams.video[0]
        target = dst.add_stream_from_template(stream)
        packets = [p for p in src.demux(stream) if p.size]
        times = sorted(int(p.pts) for p in packets)
        step = min(np.diff(times))
        for q, packet in enumerate(packets):
            packet.pts = packet.dts = q * int(step)
            packet.stream = target
            dst.mux(packet)
    return out.getvalue()


def make_episode_table(
    num_rows: int,
    *,
    state_dim: int = 4,
    action_dim: int = 3,
    fps: int = 20,
    with_frame_index: bool = True,
    start_frame: int = 0,
) -> pa.Table:
    """LeRobot-style per-frame table for one episode (episode 0), ``num_rows`` rows.

    Columns: ``observation.state`` fixed_size_list<float32>[state_dim] with ``state[r][j] = r + 0.01*j``;
    ``action`` fixed_size_list<float32>[action_dim] with ``action[r][j] = r + 0.5 + 0.01*j``;
    ``timestamp`` float32 seconds ``= (start_frame + r) / fps``; ``frame_index`` int64 ``start_frame + r``
    (only when ``with_frame_index``); ``episode_index`` int64 0; ``index`` int64 ``r``; ``task_index`` int64 0.
    """
    r = np.arange(num_rows, dtype=np.float64)[:, None]

    def vec(offset: float, dim: int) -> pa.FixedSizeListArray:
        vals = (r + offset + 0.01 * np.arange(dim)).astype(np.float32).ravel()
        return pa.FixedSizeListArray.from_arrays(pa.array(vals, pa.float32()), dim)

    frames = np.arange(start_frame, start_frame + num_rows, dtype=np.int64)
    cols = {
        "observation.state": vec(0.0, state_dim),
        "action": vec(0.5, action_dim),
        "timestamp": pa.array((frames / fps).astype(np.float32), pa.float32()),
    }
    if with_frame_index:
        cols["frame_index"] = pa.array(frames, pa.int64())
    cols["episode_index"] = pa.array(np.zeros(num_rows, np.int64), pa.int64())
    cols["index"] = pa.array(np.arange(num_rows, dtype=np.int64), pa.int64())
    cols["task_index"] = pa.array(np.zeros(num_rows, np.int64), pa.int64())
    return pa.table(cols)


def make_grey_video(
    values: np.ndarray, *, codec: str = "ffv1", pix_fmt: str = "gray16le", fps: int = 20, gop: int = 4
) -> bytes:
    """Lossless MP4 of grey frames holding exactly ``values`` (uint16 ``[T, H, W]``), e.g. a depth map.

    ``codec``: ``"ffv1"`` (intra coding, but its coder state carries over until the next keyframe;
    ``gray16le``, ``gray12le``, ``gray10le`` or ``gray``) or ``"hevc"`` (libx265 lossless; ``gray12le``,
    ``gray10le`` or ``gray``); a keyframe every ``gop`` frames. Frames are
    made directly in ``pix_fmt``, so no scaling happens: a 12-bit value 285 is stored as 285.

    libx265 (Debian's 3.5) is not deterministic on small pictures (<= 64 px) once a process has
    encoded a few: later encodes are no longer lossless. So hevc is encoded in a fresh interpreter,
    and every video is decoded back and compared with ``values`` before it is returned.

    Raises:
        AssertionError: the encoded video does not decode to ``values`` exactly (after 3 tries).
    """
    for _ in range(3):
        if codec == "hevc":
            data = _in_fresh_process(values, codec, pix_fmt, fps, gop)
        else:
            data = _encode_grey(values, codec, pix_fmt, fps, gop)
        with av.open(BytesIO(data)) as container:
            back = [f.to_ndarray().copy() for f in container.decode(video=0)]
        if len(back) == len(values) and all(np.array_equal(b, v) for b, v in zip(back, values, strict=True)):
            return data
    raise AssertionError(f"{codec} {pix_fmt}: the encoded test video does not hold the values exactly")


def _in_fresh_process(values: np.ndarray, codec: str, pix_fmt: str, fps: int, gop: int) -> bytes:
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        np.save(os.path.join(tmp, "v.npy"), values)
        code = (
            "import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import videogen; "
            "open(sys.argv[3], 'wb').write(videogen._encode_grey(np.load(sys.argv[2]), *sys.argv[4:6], "
            "int(sys.argv[6]), int(sys.argv[7])))"
        )
        out = os.path.join(tmp, "v.mp4")
        args = [os.path.dirname(os.path.abspath(__file__)), os.path.join(tmp, "v.npy"), out, codec, pix_fmt]
        subprocess.run([sys.executable, "-c", code, *args, str(fps), str(gop)], check=True)
        with open(out, "rb") as f:
            return f.read()


def _encode_grey(values: np.ndarray, codec: str, pix_fmt: str, fps: int, gop: int) -> bytes:
    enc, options = {
        "ffv1": ("ffv1", {"g": str(gop)}),
        "hevc": (
            "libx265",
            {
                "x265-params": f"lossless=1:keyint={gop}:min-keyint={gop}:scenecut=0:bframes=0:log-level=error:"
                "frame-threads=1:pools=none"
            },
        ),
    }[codec]
    buf = BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream(enc, rate=fps, options=options)
        stream.width, stream.height, stream.pix_fmt = int(values.shape[2]), int(values.shape[1]), pix_fmt
        stream.codec_context.thread_count = 1
        for i, plane in enumerate(values):
            data = plane.astype(np.uint8 if pix_fmt == "gray" else np.uint16)
            frame = av.VideoFrame.from_ndarray(data, format=pix_fmt)
            frame.pts, frame.time_base = i, Fraction(1, fps)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buf.getvalue()


def convert_numbered(
    out: str | PathLike,
    lengths: list[int],
    cameras: dict[str, dict],
    *,
    fps: int = 20,
    step: int = 100,
    per_shard: int = 64,
    tasks: list[str] | None = None,
    name: str = "gen",
) -> str:
    """Convert generated episodes into an epishard dataset at ``out``; return ``out`` as a string.

    Episode ``e`` has ``lengths[e]`` rows (``make_episode_table``) and, on every camera of ``cameras``
    (name -> ``make_video`` keyword arguments, e.g. ``dict(gop=4, height=32, width=32)``), frame ``i``
    shows ``step * e + i``. ``tasks``: one task text per episode (default ``"task {e}"``);
    ``per_shard``: episodes per shard at most; ``name``: the source's name.
    """
    from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert

    episodes = [
        Episode(
            source=name,
            episode_index=e,
            table=make_episode_table(n, fps=fps),
            videos={
                cam: CameraVideo(make_video(None, n, fps=fps, start_number=step * e, **kw))
                for cam, kw in cameras.items()
            },
            fps=fps,
            tasks=(tasks[e] if tasks else f"task {e}",),
        )
        for e, n in enumerate(lengths)
    ]
    convert(
        [Source(name=name, episodes=episodes, fps=fps)],
        str(out),
        ConvertOptions(max_episodes_per_shard=per_shard, progress=False),
    )
    return str(out)
