"""Stream matrix: codecs x containers x the stream quirks that shift frames, each converted and read
back under every access pattern of the reader; each decoded frame must carry its row's frame number.

Every case is a tiny frame-numbered video (tests/videogen.py). The expected number of row ``r`` is
the ``r``-th frame a player displays: for a stream-copy cut into MP4, the frames the edit list
hides are not displayed; Matroska/WebM cuts show every copied frame.
"""

from __future__ import annotations

import io
from dataclasses import replace
from fractions import Fraction

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from videogen import cut_by_stream_copy, decode_frame_number, decode_order_timestamps, make_episode_table, make_video

from epishard.format.index import WindowIndex
from epishard.shardwriter import CameraVideo, ConversionError, ConvertOptions, Episode, Source, convert, verify
from epishard.shardwriter import video as video_module
from epishard.shardwriter.describe import describe
from epishard.shardwriter.video import VideoProbe, probe, restamp, scan
from epishard.stream import WindowDataset, WindowSpec
from epishard.stream.fetch import FetchPolicy
from epishard.stream.lookahead import Lookahead
from epishard.stream.options import ReadOptions
from epishard.stream.select import Selection

FPS = 20
CAM = "observation.images.front"
N = 24  # frames per generated video


def _encoder(name: str) -> bool:
    try:
        av.codec.Codec(name, "w")
        return True
    except Exception:  # PyAV raises UnknownCodecError or ValueError by version
        return False


DECODED_PROBE = video_module._decoded_probe  # before a test replaces it
ENCODERS = {"h264": "libx264", "hevc": "libx265", "av1": "libsvtav1", "mpeg4": "mpeg4", "vp9": "libvpx-vp9"}
VFR = [0, 3, 5, 6, 10, 11, 12, 20, 21, 22, 23, 24, 30, 31, 32, 40, 41, 42, 43, 44, 50, 57, 58, 60]

# name -> (make_video arguments, stream-copy cut at this frame, or -k: the first k frames have
# negative pts, or None)
CASES = {
    "h264-bframes-mp4": (dict(gop=8), None),
    "h264-gop250-mp4": (dict(gop=250), None),
    "h264-open-gop-mkv": (dict(gop=8, open_gop=True, container="mkv"), None),
    "hevc-bframes-mp4": (dict(codec="hevc", gop=8), None),
    "hevc-open-gop-mkv": (dict(codec="hevc", gop=8, open_gop=True, container="mkv"), None),
    "av1-mp4": (dict(codec="av1", gop=8), None),
    "av1-webm": (dict(codec="av1", gop=8, container="webm"), None),
    "mpeg4-mkv": (dict(codec="mpeg4", gop=6, container="mkv"), None),
    "vp9-altref-webm": (dict(codec="vp9", gop=8, container="webm"), None),
    "vp9-mp4": (dict(codec="vp9", gop=8), None),
    "h264-cut-mid-gop-mp4": (dict(gop=10), 13),
    "hevc-cut-mid-gop-mp4": (dict(codec="hevc", gop=10), 7),
    "h264-cut-mid-gop-mkv": (dict(gop=10, container="mkv"), 13),
    # Frames with negative pts are hidden by the edit list FFmpeg's MP4 muxer writes (as for a
    # cut); Matroska shifts all timestamps to start at 0 instead.
    "h264-negative-start-mp4": (dict(gop=8, pts=[i - 3 for i in range(N)]), -3),
    "h264-negative-start-mkv": (dict(gop=8, pts=[i - 3 for i in range(N)], container="mkv"), None),
    "h264-positive-start-mp4": (dict(gop=8, pts=[i + 7 for i in range(N)]), None),
    "h264-vfr-mp4": (dict(gop=8, pts=VFR, time_base=Fraction(1, 100)), None),
    "h264-rotated-90-mp4": (dict(gop=8, rotation=90, height=64, width=48), None),
    "h264-cover-art-mp4": (dict(gop=8, cover=True), None),
    "h264-audio-mp4": (dict(gop=8, audio=True), None),
    "vp9-audio-webm": (dict(codec="vp9", gop=8, container="webm", audio=True), None),
    "h264-odd-size-444-mp4": (dict(gop=8, height=47, width=63, pix_fmt="yuv444p"), None),
    "hevc-10bit-mp4": (dict(codec="hevc", gop=8, pix_fmt="yuv420p10le"), None),  # decoded by torchcodec
    # LeRobot's default recording: SVT-AV1 with a keyframe every 2 frames (each other packet a few
    # bytes: shows a frame decoded before); a longer GOP has SVT-AV1's hidden (alt-ref) frames.
    "av1-gop2-mp4": (dict(codec="av1", gop=2), None),
    "av1-gop2-mkv": (dict(codec="av1", gop=2, container="mkv"), None),
    "av1-gop16-hidden-mp4": (dict(codec="av1", gop=16), None),
    # Containers without a stored pts on every packet (AVI: none; FFmpeg infers them, version by
    # version otherwise) or that seek by scanning (MPEG-TS, FLV), and decode-order timestamps in a
    # Matroska file (a muxer fed packets without pts): stored as an MP4 copy timed in display order.
    "h264-bframes-avi": (dict(gop=8, container="avi", height=32, width=32), None),
    "h264-avi": (dict(gop=8, bframes=False, container="avi", height=32, width=32), None),
    "mpeg4-avi": (dict(codec="mpeg4", gop=6, container="avi", height=32, width=32), None),
    "h264-bframes-ts": (dict(gop=8, container="ts", height=32, width=32), None),
    "mpeg4-ts": (dict(codec="mpeg4", gop=6, container="ts", height=32, width=32), None),
    "h264-bframes-flv": (dict(gop=8, container="flv", height=32, width=32), None),
    "h264-decode-order-pts-mkv": (dict(gop=8, container="mkv", height=32, width=32, decode_order_pts=True), None),
}

# The cases stored as a ``restamp`` copy (transform "remux").
RESTAMPED = {name for name, (kwargs, _) in CASES.items() if kwargs.get("container") in ("avi", "ts", "flv")}
RESTAMPED.add("h264-decode-order-pts-mkv")


# The cases whose video gets a packet table (read by its GOPs' packets); the others are fetched
# whole: rotated streams (torchcodec applies the display matrix).
WITH_PACKETS = {name for name in CASES if "rotated" not in name}


def _video(name: str) -> tuple[bytes, list[int]]:
    """(file bytes, frame number each displayed frame shows)."""
    kwargs, cut_at = CASES[name]
    kwargs = dict(kwargs)
    decode_order = kwargs.pop("decode_order_pts", False)
    codec = kwargs.get("codec", "h264")
    if not _encoder(ENCODERS[codec]):
        pytest.skip(f"FFmpeg in PyAV has no {ENCODERS[codec]} encoder")
    data = make_video(None, N, fps=FPS, start_number=100, **kwargs)
    if decode_order:
        data = decode_order_timestamps(data, kwargs["container"])
    if cut_at is None or cut_at < 0:
        hidden = 0 if cut_at is None else -cut_at
        return data, list(range(100 + hidden, 100 + N))
    data, first = cut_by_stream_copy(data, cut_at, kwargs.get("container", "mp4"))
    return data, list(range(100 + first, 100 + N))


def _convert(out, videos: list[bytes], **opts) -> dict:
    episodes = [
        Episode(
            source="matrix",
            episode_index=e,
            table=make_episode_table(len(shown), fps=FPS),
            videos={CAM: CameraVideo(data)},
            fps=FPS,
            tasks=("t",),
        )
        for e, (data, shown) in enumerate(videos)
    ]
    return convert(
        [Source(name="matrix", episodes=episodes, fps=FPS)], str(out), ConvertOptions(progress=False, **opts)
    )


# Access patterns of the reader: every anchor with one frame; one random window per episode; single
# frames; offsets in descending order; two windows of one episode decoded in one call.
PATTERNS = {
    "all-anchors": WindowSpec(cameras={CAM: (0,)}, boundary="pad"),
    "one-window-per-episode": WindowSpec(cameras={CAM: (0, 3, 6, 9)}, per_episode_count=1, boundary="pad"),
    "single-frame": WindowSpec(cameras={CAM: (0,)}, per_episode_count=1, boundary="pad"),
    "descending": WindowSpec(cameras={CAM: (11, 5, 2, 1, 0)}, per_episode_count=3, boundary="pad"),
    "two-windows-one-call": WindowSpec(cameras={CAM: (-4, 0, 4)}, per_episode_count=2, boundary="pad"),
}


def _check_patterns(out: str, shown: dict[int, list[int]]) -> None:
    """Every pattern, every read path: packets of the GOPs a decode needs (where the index has a
    packet table), their frames kept as RGB or as decoded pictures, and whole members through
    torchcodec; the same frames, each its row's number."""
    for pattern, spec in PATTERNS.items():
        for seed in (0, 1):
            by_path = []
            for packets, pictures in ((True, False), (True, True), (False, None)):
                read = ReadOptions(fetch=FetchPolicy(packets=packets), lookahead=Lookahead(pictures=pictures))
                samples = list(WindowDataset(out, spec, seed=seed, read=read))
                for s in samples:
                    numbers = shown[int(s["episode_index"])]
                    rows = np.clip(int(s["frame_index"]) + np.asarray(spec.cameras[CAM]), 0, len(numbers) - 1)
                    got = [decode_frame_number(f) for f in s[CAM]]
                    assert got == [numbers[r] for r in rows], (
                        pattern,
                        seed,
                        packets,
                        pictures,
                        int(s["episode_index"]),
                    )
                by_path.append(torch.stack([s[CAM] for s in samples]))
            for other in by_path[1:]:
                assert torch.equal(by_path[0], other), (pattern, seed)  # pixel for pixel


#: Cases whose timestamps jump (variable frame rate) in a stream with B-frames: checked in full.
JUMPING = {"h264-vfr-mp4"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_access_pattern_returns_the_displayed_frame_of_each_row(name, tmp_path):
    data, shown = _video(name)
    manifest = _convert(tmp_path, [(data, shown)])
    assert manifest.totals.rows == len(shown)
    # The default level vouched for it without a full check, except where its timestamps jump in a
    # stream that reorders frames (video._jump_hint: a group its few decodes miss could be misordered).
    assert manifest.report.checks == ({"full": 1} if name in JUMPING else {"fast": 1})
    result = verify(str(tmp_path))
    assert result["ok"], result["problems"]
    index = WindowIndex.load_dataset(str(tmp_path))
    assert bool(index.has_packets(0)) == (name in WITH_PACKETS), (
        "packet table written" if name in WITH_PACKETS else name
    )
    cam = pq.read_table(tmp_path / manifest.shards[0].index).to_pylist()[0]["cameras"][0]
    assert cam["transform"] == ("remux" if name in RESTAMPED else "copy")
    _check_patterns(str(tmp_path), {0: shown})


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_container_tells_the_table_a_full_decode_builds(name):
    """``scan`` (container packets outside the edit list, in pts order, one frame decoded) gives
    ``probe``'s table (every frame decoded) on every kind of video of the matrix, as stored (a
    ``restamp`` copy where the source's container does not time the frames as displayed)."""
    data, shown = _video(name)
    if name in RESTAMPED:
        data = restamp(data)
    told, decoded = scan(data), probe(data)
    for name_ in ("pts", "duration", "keyframes", "packet_pts", "packet_key"):
        assert np.array_equal(getattr(told, name_), getattr(decoded, name_)), name_
    facts = ("codec", "width", "height", "pix_fmt", "time_base", "stream_index", "rotation", "average_fps")
    assert [getattr(told, f) for f in facts] == [getattr(decoded, f) for f in facts]
    assert told.num_frames == len(shown)


V30_FILES = {
    "edit-listed": lambda: cut_by_stream_copy(make_video(None, 60, fps=FPS, gop=10, start_number=100), 13),
    "cover-art-and-audio": lambda: (make_video(None, 60, fps=FPS, gop=10, start_number=100, cover=True, audio=True), 0),
    "rotated": lambda: (make_video(None, 60, fps=FPS, gop=10, start_number=100, rotation=270, height=64, width=48), 0),
    # LeRobot v3.0's default: one SVT-AV1 file, a keyframe every 2 frames, episodes cut at odd frames.
    "av1-gop2": lambda: (make_video(None, 60, fps=FPS, codec="av1", gop=2, start_number=100), 0),
}


@pytest.mark.parametrize("kind", sorted(V30_FILES))
def test_v30_segments_of_a_shared_file_show_their_rows(kind, tmp_path):
    """A v3.0-style shared file split into episodes by from_timestamp, where the file itself starts
    with hidden frames (an MP4 cut mid-GOP), lists cover art first, or is rotated: each segment's
    stream-copy cut must describe its displayed frames."""
    data, first = V30_FILES[kind]()
    numbers = list(range(100 + first, 160))
    bounds = [(0, 17), (17, 39), (39, len(numbers))]  # rows of each episode, in displayed frames
    info = probe(data)
    episodes = []
    for e, (a, b) in enumerate(bounds):
        t0 = float(info.seconds(np.array([a]))[0])
        t1 = float(info.seconds(np.array([b - 1]))[0]) + 1 / FPS
        episodes.append(
            Episode(
                source="v30",
                episode_index=e,
                table=make_episode_table(b - a, fps=FPS),
                videos={CAM: CameraVideo(data, segment=(t0, t1))},
                fps=FPS,
                tasks=("t",),
            )
        )
    convert([Source(name="v30", episodes=episodes, fps=FPS)], str(tmp_path), ConvertOptions(progress=False))
    assert verify(str(tmp_path))["ok"]
    index = WindowIndex.load_dataset(str(tmp_path))
    assert index.has_packets(np.arange(3)).tolist() == [kind != "rotated"] * 3
    _check_patterns(str(tmp_path), {e: numbers[a:b] for e, (a, b) in enumerate(bounds)})


# --- The kinds of ../shared/cases, built with the project's own generators -----------------------


def test_hidden_frames_of_a_mid_gop_cut_are_not_frames(tmp_path):
    """hidden_frames_cut kind: the MP4 holds more packets than it displays; rows map to the
    displayed frames only, under every access pattern."""
    source = make_video(None, 60, fps=FPS, gop=20, start_number=0)
    data, first = cut_by_stream_copy(source, 27)
    with av.open(io.BytesIO(data)) as c:
        packets = sum(1 for p in c.demux(c.streams.video[0]) if p.size)
    shown = list(range(first, 60))
    assert first == 27 and packets == 40 and len(shown) == 33  # cut mid-GOP: packets from keyframe 20, 7 hidden
    manifest = _convert(tmp_path, [(data, shown)])
    cam = pq.read_table(tmp_path / manifest.shards[0].index).to_pylist()[0]["cameras"][0]
    assert cam["num_frames"] == 33 and cam["keyframes"][0] == 0
    assert verify(str(tmp_path))["ok"]
    _check_patterns(str(tmp_path), {0: shown})


def _packet_table(source) -> VideoProbe:
    """What the writer used to index: frame i = the packet with the i-th smallest pts."""
    info = DECODED_PROBE(source)
    pts = np.sort(info.packet_pts)
    keys = np.flatnonzero(np.isin(pts, info.packet_pts[info.packet_key])).astype(np.int32)
    return VideoProbe(
        codec=info.codec,
        width=info.width,
        height=info.height,
        pix_fmt=info.pix_fmt,
        time_base=info.time_base,
        pts=pts,
        duration=np.full(pts.size, pts[1] - pts[0]),
        keyframes=keys,
        packet_pts=info.packet_pts,
        packet_key=info.packet_key,
        average_fps=info.average_fps,
        stream_index=info.stream_index,
    )


@pytest.mark.parametrize("check", ["full", "fast"])
def test_a_table_that_disagrees_with_the_decoder_is_never_written(tmp_path, monkeypatch, check):
    """The write-time check decodes what vouches for the table: a packet-based table of a cut with
    hidden frames stops the conversion (naming dataset, episode and camera), or is skipped and
    counted, at ``full`` and at ``fast`` (whose decodes disagree, so the video is redone as at
    ``full``); a shard written with ``check="off"`` is flagged by ``verify``."""
    data, first = cut_by_stream_copy(make_video(None, 60, fps=FPS, gop=30), 14)

    def told(source, vouch=False):  # the packet table; at fast, its decodes see where it is wrong
        table = _packet_table(source)
        wrong = vouch and table.num_frames != DECODED_PROBE(source).num_frames
        return replace(table, disagreement="the first decoded frame is not frame 0" if wrong else None)

    monkeypatch.setattr(video_module, "_decoded_probe", _packet_table)
    monkeypatch.setattr(video_module, "scan", told)
    good = make_video(None, 20, fps=FPS, gop=10)
    videos = [(good, list(range(20))), (data, list(range(first, 60)))]
    with pytest.raises(ConversionError) as info:
        _convert(tmp_path / "stop", videos, check=check)
    assert info.value.kind == "frame_mismatch" and (info.value.dataset, info.value.episode) == ("matrix", 1)
    assert info.value.camera == CAM and "frame" in str(info.value)
    manifest = _convert(tmp_path / "skip", videos, on_error="skip", check=check)
    assert manifest.report.skipped_by_kind == {"frame_mismatch": 1} and manifest.totals.episodes == 1
    assert manifest.report.checks == {check: 1}  # the good episode's video
    unchecked = _convert(tmp_path / "unchecked", videos, check="off")
    assert unchecked.report.checks == {"off": 2}
    problems = verify(str(tmp_path / "unchecked"))["problems"]
    assert len(problems) == 1 and problems[0]["camera"] == CAM and problems[0]["episode"].endswith("e000001")
    assert "disagrees" in problems[0]["message"]


def test_cover_art_as_stream_0_is_skipped_and_the_stream_is_recorded(tmp_path):
    """cover_art_stream0 kind: episode 1's file lists an attached picture first; the video stream
    holding the frames is used and named in the index."""
    plain = make_video(None, 20, fps=FPS, gop=10, start_number=0)
    covered = make_video(None, 20, fps=FPS, gop=10, start_number=20, cover=True)
    with av.open(io.BytesIO(covered)) as c:
        assert c.streams[0].disposition & av.stream.Disposition.attached_pic  # the generator's premise
    manifest = _convert(tmp_path, [(plain, list(range(20))), (covered, list(range(20, 40)))])
    rows = pq.read_table(tmp_path / manifest.shards[0].index).to_pylist()
    assert [r["cameras"][0]["stream_index"] for r in rows] == [0, 1]
    assert verify(str(tmp_path))["ok"]
    _check_patterns(str(tmp_path), {0: list(range(20)), 1: list(range(20, 40))})


def test_rotated_episode_reports_the_size_the_reader_returns(tmp_path):
    """rotated_video kind: episode 0 stored 64 wide x 48 high with a 90-degree display matrix,
    episode 1 stored upright 48x64; both come back upright 64 high x 48 wide, and the index,
    manifest and ``inspect`` say so."""
    turned = make_video(None, 20, fps=FPS, gop=10, height=64, width=48, rotation=90)
    upright = make_video(None, 20, fps=FPS, gop=10, height=64, width=48, start_number=20)
    with av.open(io.BytesIO(turned)) as c:
        assert (c.streams.video[0].width, c.streams.video[0].height) == (64, 48)  # stored sideways
    manifest = _convert(tmp_path, [(turned, list(range(20))), (upright, list(range(20, 40)))])
    rows = pq.read_table(tmp_path / manifest.shards[0].index).to_pylist()
    assert [(r["cameras"][0]["height"], r["cameras"][0]["width"], r["cameras"][0]["rotation"]) for r in rows] == [
        (64, 48, 90),
        (64, 48, 0),
    ]
    assert (manifest.cameras[CAM].height, manifest.cameras[CAM].width) == (64, 48)
    assert list(manifest.features[CAM].shape) == [64, 48, 3] and manifest.cameras[CAM].sizes is None
    assert (describe(str(tmp_path))["cameras"][CAM]["height"], describe(str(tmp_path))["cameras"][CAM]["width"]) == (
        64,
        48,
    )
    for s in WindowDataset(str(tmp_path), PATTERNS["all-anchors"], seed=0):
        assert tuple(s[CAM].shape) == (1, 3, 64, 48)
    _check_patterns(str(tmp_path), {0: list(range(20)), 1: list(range(20, 40))})


def test_a_rotated_episode_is_refused_where_torchcodec_would_return_it_unturned(tmp_path, monkeypatch):
    """torchcodec before 0.11 (LeRobot 0.4.4's pin) returns a display-matrix stream as stored: the
    reader refuses that episode's camera, naming it and the fix, and still reads the upright one."""
    from epishard.format import decoder
    from epishard.stream.decode import DecodeError
    from epishard.stream.fetch import FetchError

    turned = make_video(None, 12, fps=FPS, gop=6, height=64, width=48, rotation=180)
    upright = make_video(None, 12, fps=FPS, gop=6, height=64, width=48, start_number=12)
    _convert(tmp_path, [(turned, list(range(12))), (upright, list(range(12, 24)))])
    assert WindowIndex.load_dataset(str(tmp_path)).cam_rotation.tolist() == [180, 0]
    monkeypatch.setattr(decoder, "torchcodec_rotates", lambda: False)
    spec = PATTERNS["all-anchors"]
    with pytest.raises(
        (DecodeError, FetchError),
        match=r"e000000 camera observation.images.front.*stored turned \(180 degrees.*torchcodec >= 0\.11",
    ):
        list(WindowDataset(str(tmp_path), spec, seed=0, select=Selection(episodes=[0])))
    shown = [
        decode_frame_number(s[CAM][0].permute(1, 2, 0).numpy())
        for s in WindowDataset(str(tmp_path), spec, seed=0, select=Selection(episodes=[1]))
    ]
    assert sorted(shown) == list(range(12, 24))


def test_episodes_of_other_sizes_are_listed_per_size(tmp_path):
    small = make_video(None, 12, fps=FPS, gop=6, height=32, width=32)
    large = make_video(None, 12, fps=FPS, gop=6, height=64, width=48)
    manifest = _convert(tmp_path, [(small, list(range(12))), (large, list(range(12))), (large, list(range(12)))])
    assert manifest.cameras[CAM].sizes == {"32x32": 1, "64x48": 2}
