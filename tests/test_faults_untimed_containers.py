"""Containers whose packets carry no presentation timestamps, or decode-order ones.

AVI stores none (FFmpeg infers them, and its versions infer them differently: the reader's
torchcodec numbered the frames one off the writer's table), MPEG-TS seeks by scanning (with B-frames
the reader's seek landed a group of pictures late), a raw stream has no timestamps at all, and a
muxer fed packets without pts writes decode-order ones into Matroska, FLV or MP4. Each must convert
under the default check to frame tables both read paths return exactly (stored as an MP4 copy timed
in display order), or be refused naming the episode and camera.
"""

from __future__ import annotations

import io
import os
from fractions import Fraction

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from lerobotgen import write_v2_files
from videogen import (
    decode_frame_number,
    decode_order_timestamps,
    encode_frame_number,
    make_episode_table,
    make_video,
)

from epishard.cli import main as cli
from epishard.format.index import WindowIndex
from epishard.shardwriter import CameraVideo, ConversionError, ConvertOptions, Episode, Source, convert, verify
from epishard.shardwriter import prepare as prepare_module
from epishard.shardwriter import video as video_module
from epishard.shardwriter.video import ReencodeSpec
from epishard.stream import WindowDataset, WindowSpec
from epishard.stream.fetch import FetchPolicy
from epishard.stream.options import ReadOptions

FPS = 20
CAM = "observation.images.front"
SMALL = dict(height=32, width=32)
# Every anchor with one frame; windows with offsets that seek back inside and across groups.
SPECS = (
    WindowSpec(cameras={CAM: (0,)}, boundary="pad"),
    WindowSpec(cameras={CAM: (11, 5, 2, 1, 0)}, per_episode_count=3, boundary="pad"),
)


def _convert(out, videos: list, fps: int = FPS, **opts):
    """Convert one episode per video (bytes or a path: the whole file) with ``len(shown)`` rows."""
    episodes = [
        Episode(
            source="g2",
            episode_index=e,
            table=make_episode_table(len(shown), fps=fps),
            videos={CAM: CameraVideo(video)},
            fps=fps,
            tasks=("t",),
        )
        for e, (video, shown) in enumerate(videos)
    ]
    return convert([Source(name="g2", episodes=episodes, fps=fps)], str(out), ConvertOptions(progress=False, **opts))


def _assert_rows_show(out, shown: dict[int, list[int]]) -> None:
    """Under every spec and on both read paths, each sample's frames are its rows' frame numbers."""
    for spec in SPECS:
        for packets in (True, False):
            samples = list(WindowDataset(str(out), spec, seed=0, read=ReadOptions(fetch=FetchPolicy(packets=packets))))
            assert samples, (spec, packets)
            for s in samples:
                numbers = shown[int(s["episode_index"])]
                rows = np.clip(int(s["frame_index"]) + np.asarray(spec.cameras[CAM]), 0, len(numbers) - 1)
                got = [decode_frame_number(f) for f in s[CAM]]
                assert got == [numbers[r] for r in rows], (packets, int(s["episode_index"]), int(s["frame_index"]))


def _transforms(out, manifest) -> list[str]:
    return [
        r["cameras"][0]["transform"] for r in pq.read_table(os.path.join(out, manifest.shards[0].index)).to_pylist()
    ]


@pytest.mark.parametrize("bframes", [True, False], ids=["bframes", "no-bframes"])
def test_avi_h264_rows_show_their_own_frame_on_both_read_paths(tmp_path, bframes):
    """An AVI next to an MP4 in one dataset: before, the reader's torchcodec returned frame r + 1
    for row r (FFmpeg 5.1 times AVI frames by dts, PyAV's FFmpeg 8 by pts = dts + 1)."""
    avi = make_video(None, 24, fps=FPS, gop=8, bframes=bframes, container="avi", start_number=100, **SMALL)
    mp4 = make_video(None, 20, fps=FPS, gop=8, start_number=500, **SMALL)
    manifest = _convert(tmp_path, [(avi, range(24)), (mp4, range(20))])
    assert manifest.totals.episodes == 2 and manifest.report.checks == {"fast": 2}
    assert _transforms(tmp_path, manifest) == ["remux", "copy"]
    assert verify(str(tmp_path))["ok"]
    index = WindowIndex.load_dataset(str(tmp_path))
    assert index.has_packets(np.arange(2)).tolist() == [True, True]
    assert index.cam_num_frames.tolist() == [24, 20]
    _assert_rows_show(tmp_path, {0: list(range(100, 124)), 1: list(range(500, 520))})


def _mpeg4_bframes_avi(n: int, start: int) -> bytes:
    """MPEG-4 Part 2 in AVI with up to 2 B-frames between references, frame i showing start + i."""
    out = io.BytesIO()
    with av.open(out, "w", format="avi") as dst:
        stream = dst.add_stream("mpeg4", rate=FPS, options={"bf": "2", "g": "8", "qscale": "3", "threads": "1"})
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(encode_frame_number(start + i, 32, 32), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, FPS)
            dst.mux(stream.encode(frame.reformat(format="yuv420p")))
        dst.mux(stream.encode(None))
    return out.getvalue()


def test_mpeg4_part2_with_bframes_in_avi_is_frame_exact(tmp_path):
    """Before: the table listed a frame the reader's decoder never returns (``verify``: "no more
    frames"), so the last rows of every such episode were lost at read time."""
    data = _mpeg4_bframes_avi(21, 300)
    with av.open(io.BytesIO(data)) as c:
        reordered = [p.pts for p in c.demux(video=0) if p.size]
    assert reordered != sorted(reordered)  # the premise: B-frames, decode order is not display order
    manifest = _convert(tmp_path, [(data, range(21))])
    assert manifest.report.checks == {"fast": 1} and _transforms(tmp_path, manifest) == ["remux"]
    problems = verify(str(tmp_path))["problems"]
    assert problems == []
    _assert_rows_show(tmp_path, {0: list(range(300, 321))})


def _mpeg2(fmt: str, n: int, start: int) -> bytes:
    """MPEG-2 video at 25 fps (a rate MPEG-2 codes), 2 B-frames, a keyframe every 8, in muxer ``fmt``."""
    out = io.BytesIO()
    with av.open(out, "w", format=fmt) as dst:
        stream = dst.add_stream("mpeg2video", rate=25, options={"bf": "2", "g": "8", "threads": "1"})
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(encode_frame_number(start + i, 32, 32), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, 25)
            dst.mux(stream.encode(frame.reformat(format="yuv420p")))
        dst.mux(stream.encode(None))
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["mpeg", "mpegts", "avi"], ids=["program-stream", "transport-stream", "avi"])
def test_mpeg2_video_with_bframes_is_frame_exact(tmp_path, fmt):
    """DVD-style MPEG-PS, broadcast MPEG-TS and AVI with MPEG-2 B-frames. Before: the default check
    passed them and ``verify`` (or, for MPEG-TS, every read) failed: the reader's decoder did not
    return the frames the table named."""
    data = _mpeg2(fmt, 20, 400)
    manifest = _convert(tmp_path, [(data, range(20))], fps=25)
    assert manifest.totals.episodes == 1 and _transforms(tmp_path, manifest) == ["remux"]
    assert verify(str(tmp_path))["ok"]
    _assert_rows_show(tmp_path, {0: list(range(400, 420))})


def test_mpegts_with_bframes_reads_every_episode_and_gets_a_packet_table(tmp_path):
    """Before: every episode failed at read time ("frame 0 should have pts 9000, the decoder
    returned ..."): torchcodec's seek to a keyframe's pts in MPEG-TS lands by dts, a group later."""
    videos = [
        (make_video(None, 18, fps=FPS, gop=6, container="ts", start_number=100 * e, **SMALL), range(18)) for e in (1, 2)
    ]
    manifest = _convert(tmp_path, videos)
    assert manifest.totals.episodes == 2 and _transforms(tmp_path, manifest) == ["remux", "remux"]
    assert manifest.report.warnings_by_kind == {"remuxed": 2}  # said in the report, per camera
    assert all(w.camera and "stored as a stream copy in MP4" in w.message for w in manifest.report.warnings)
    assert WindowIndex.load_dataset(str(tmp_path)).has_packets(np.arange(2)).tolist() == [True, True]
    assert verify(str(tmp_path))["ok"]
    _assert_rows_show(tmp_path, {0: list(range(100, 118)), 1: list(range(200, 218))})


@pytest.mark.parametrize("bframes", [True, False], ids=["bframes", "no-bframes"])
def test_concatenated_mpegts_recordings_are_numbered_in_display_order(tmp_path, bframes):
    """Two recordings appended byte for byte (a recorder's segments): their timestamps restart.
    Before, the episode was refused ("decoded frame 12 has pts 9000 after pts 58500"); now its
    frames keep the decoder's order, timed at the episode's fps."""
    parts = [
        make_video(None, 12, fps=FPS, gop=6, bframes=bframes, container="ts", start_number=s, **SMALL)
        for s in (100, 112)
    ]
    manifest = _convert(tmp_path, [(parts[0] + parts[1], range(24))])
    assert manifest.totals.episodes == 1 and manifest.report.warnings_by_kind == {"remuxed": 1}
    index = WindowIndex.load_dataset(str(tmp_path))
    pts, _, _ = index.frame_tables(0)
    assert (pts * float(index.time_base(0))).tolist() == pytest.approx([k / FPS for k in range(24)])
    assert verify(str(tmp_path))["ok"]
    _assert_rows_show(tmp_path, {0: list(range(100, 124))})


@pytest.mark.parametrize("container", ["flv", "mp4"])
def test_decode_order_timestamps_are_retimed_in_display_order(tmp_path, container):
    """pts = dts in a container that is trusted to store pts: before, the fast check passed (it
    compared the last group's frames as a set) and the reader failed every episode."""
    data = decode_order_timestamps(make_video(None, 24, fps=FPS, gop=8, start_number=700, **SMALL), container)
    told = video_module.scan(data, vouch=True)
    assert told.disagreement is not None and "not in the order the decoder shows" in told.disagreement
    manifest = _convert(tmp_path, [(data, range(24))])
    assert manifest.totals.episodes == 1 and _transforms(tmp_path, manifest) == ["remux"]
    assert verify(str(tmp_path))["ok"]
    _assert_rows_show(tmp_path, {0: list(range(700, 724))})


def test_decode_order_timestamps_are_seen_when_no_decoded_group_reorders(tmp_path):
    """25 frames, a keyframe every 8: the last group is one keyframe, so the fast check's decodes
    (keyframes alone, the last group) see nothing out of order. Before, the default check accepted
    the decode-order table and the reader failed the episode; the codec's declared reorder delay
    with pts that never go back gives it away."""
    data = decode_order_timestamps(make_video(None, 25, fps=FPS, gop=8, start_number=800, **SMALL), "mkv")
    told = video_module.scan(data, vouch=True)
    assert told.disagreement == (
        "the codec reorders frames (B-frames) but the packets' pts increase in decode order: "
        "they may be decode-order timestamps"
    )
    manifest = _convert(tmp_path, [(data, range(25))])
    assert manifest.totals.episodes == 1 and _transforms(tmp_path, manifest) == ["remux"]
    assert verify(str(tmp_path))["ok"]
    _assert_rows_show(tmp_path, {0: list(range(800, 825))})


def test_a_lerobot_dataset_of_avi_videos_converts_by_the_cli_with_the_default_check(tmp_path, capsys):
    """A v2.1 dataset whose video files hold AVI (FFmpeg reads the content, not the name)."""
    videos = [
        make_video(None, n, fps=FPS, gop=8, container="avi", start_number=1000 * e, **SMALL)
        for e, n in enumerate((14, 11))
    ]
    tables = [make_episode_table(n, fps=FPS) for n in (14, 11)]
    write_v2_files(str(tmp_path / "src"), tables, fps=FPS, videos={CAM: videos})
    assert cli(["convert", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    assert "frame tables checked: fast x2" in capsys.readouterr().out
    assert verify(str(tmp_path / "out"))["ok"]
    _assert_rows_show(tmp_path / "out", {0: list(range(0, 14)), 1: list(range(1000, 1011))})


def test_an_avi_is_re_encoded_from_the_frames_it_displays(tmp_path):
    """``--reencode`` decodes the source through the reader's decoder with its frame table: before,
    an AVI's table (PyAV's inferred pts) named a frame torchcodec never returns and the episode was
    refused ("no more frames"); now the copy timed in display order is what gets decoded."""
    data = make_video(None, 20, fps=FPS, gop=8, container="avi", start_number=900, **SMALL)
    manifest = _convert(tmp_path, [(data, range(20))], reencode=ReencodeSpec(codec="libx264", gop=4))
    assert manifest.totals.episodes == 1 and _transforms(tmp_path, manifest)[0].startswith("reencode:")
    assert WindowIndex.load_dataset(str(tmp_path)).keyframes_of(0).tolist() == [0, 4, 8, 12, 16]
    _assert_rows_show(tmp_path, {0: list(range(900, 920))})


def _avi_of(codec: str, pix_fmt: str, n: int, start: int) -> bytes:
    """An AVI of FFmpeg encoder ``codec`` at its defaults, frame i showing start + i."""
    out = io.BytesIO()
    with av.open(out, "w", format="avi") as dst:
        stream = dst.add_stream(codec, rate=FPS)
        stream.width, stream.height, stream.pix_fmt = 32, 32, pix_fmt
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(encode_frame_number(start + i, 32, 32), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, FPS)
            dst.mux(stream.encode(frame.reformat(format=pix_fmt)))
        dst.mux(stream.encode(None))
    return out.getvalue()


@pytest.mark.parametrize(
    "codec,pix_fmt", [("huffyuv", "yuv422p"), ("rawvideo", "bgr24"), ("utvideo", "yuv420p"), ("h263p", "yuv420p")]
)
def test_an_avi_codec_no_container_takes_is_kept_as_it_is_and_checked_in_full(tmp_path, codec, pix_fmt):
    """Neither MP4 nor Matroska takes these AVI codecs, so the AVI is stored as it is, its table
    from a full decode and checked through the reader's decoder, read whole (no packet table).
    Before, raw video and Ut Video got a packet table the packet path cannot decode (every read
    failed) and H.263+ one it decoded to other frames (row 2 showed frame 0)."""
    data = _avi_of(codec, pix_fmt, 12, 600)
    with pytest.raises(video_module.CodecNotCopied, match="no container takes the stream's codec"):
        video_module.restamp(data, FPS)
    manifest = _convert(tmp_path, [(data, range(12))])
    assert manifest.report.checks == {"full": 1} and _transforms(tmp_path, manifest) == ["copy"]
    assert not WindowIndex.load_dataset(str(tmp_path)).has_packets(0)
    assert verify(str(tmp_path))["ok"]
    _assert_rows_show(tmp_path, {0: list(range(600, 612))})


def _raw_h264(data: bytes) -> bytes:
    """The Annex B elementary stream of an MP4's H.264 track: no container, no timestamps."""
    out = io.BytesIO()
    with av.open(io.BytesIO(data)) as src, av.open(out, "w", format="h264") as dst:
        stream = src.streams.video[0]
        target = dst.add_stream_from_template(stream)
        for packet in src.demux(stream):
            if packet.size:
                packet.stream = target
                dst.mux(packet)
    return out.getvalue()


def test_a_raw_h264_stream_is_timed_at_the_episode_rate(tmp_path):
    """Before: refused ("decoded frame 0 has neither pts nor dts"); its frames are in the stream."""
    data = _raw_h264(make_video(None, 22, fps=FPS, gop=8, start_number=40, **SMALL))
    with av.open(io.BytesIO(data)) as c:
        assert all(p.pts is None and p.dts is None for p in c.demux(video=0) if p.size)  # the premise
    manifest = _convert(tmp_path, [(data, range(22))])
    assert manifest.totals.episodes == 1 and _transforms(tmp_path, manifest) == ["remux"]
    index = WindowIndex.load_dataset(str(tmp_path))
    pts, _, _ = index.frame_tables(0)
    assert float(index.time_base(0)) * (pts[1] - pts[0]) == pytest.approx(1 / FPS)
    _assert_rows_show(tmp_path, {0: list(range(40, 62))})


def test_segments_of_one_avi_file_are_cut_from_one_copy(tmp_path, monkeypatch):
    """LeRobot v3.0 style: three episodes cut by from_timestamp out of one AVI file. Before, the
    first segment was refused: no frame at t=0 (PyAV's FFmpeg puts frame 0 at 1/fps)."""
    path = str(tmp_path / "file.avi")
    make_video(path, 60, fps=FPS, gop=10, container="avi", start_number=100, **SMALL)
    calls = []
    real = video_module.restamp
    monkeypatch.setattr(prepare_module, "restamp", lambda *a: calls.append(a[0]) or real(*a))
    bounds = [(0, 17), (17, 39), (39, 60)]
    episodes = [
        Episode(
            source="v30",
            episode_index=e,
            table=make_episode_table(b - a, fps=FPS),
            videos={CAM: CameraVideo(path, segment=(a / FPS, b / FPS))},
            fps=FPS,
            tasks=("t",),
        )
        for e, (a, b) in enumerate(bounds)
    ]
    manifest = convert(
        [Source(name="v30", episodes=episodes, fps=FPS)], str(tmp_path / "out"), ConvertOptions(progress=False)
    )
    assert manifest.totals.episodes == 3 and calls == [path]  # the file is copied once for its episodes
    assert verify(str(tmp_path / "out"))["ok"]
    _assert_rows_show(tmp_path / "out", {e: list(range(100 + a, 100 + b)) for e, (a, b) in enumerate(bounds)})


def _avi_with_a_chunk_that_is_no_picture(data: bytes, after: int) -> bytes:
    """Remux an AVI's H.264 packets, adding after packet ``after`` a chunk holding only an access
    unit delimiter (no picture: the decoder refuses it)."""
    out = io.BytesIO()
    with av.open(io.BytesIO(data)) as src, av.open(out, "w", format="avi") as dst:
        stream = src.streams.video[0]
        target = dst.add_stream_from_template(stream)
        packets = [p for p in src.demux(stream) if p.size]
        n = 0
        for q, packet in enumerate(packets):
            packet.stream, packet.pts, packet.dts = target, None, n
            dst.mux(packet)
            n += 1
            if q == after:
                extra = av.Packet(b"\x00\x00\x00\x01\x09\xf0")
                extra.stream, extra.dts, extra.time_base = target, n, packet.time_base
                dst.mux(extra)
                n += 1
    return out.getvalue()


def test_an_avi_that_cannot_be_timed_is_refused_naming_episode_and_camera(tmp_path):
    """Before: the default check accepted a 25-frame table for 24 pictures and the reader failed
    every episode; now the conversion stops (or skips and counts it) at convert time."""
    good = make_video(None, 12, fps=FPS, gop=6, start_number=10, **SMALL)
    bad = _avi_with_a_chunk_that_is_no_picture(make_video(None, 24, fps=FPS, gop=8, container="avi", **SMALL), 5)
    with pytest.raises(ConversionError) as info:
        _convert(tmp_path / "stop", [(good, range(12)), (bad, range(24))])
    err = info.value
    assert (err.kind, err.dataset, err.episode, err.camera) == ("unreadable_video", "g2", 1, CAM)
    assert "container (avi) does not store a presentation timestamp" in str(err)
    assert "no copy timed as its decoder shows it can be made" in str(err)
    manifest = _convert(tmp_path / "skip", [(good, range(12)), (bad, range(24))], on_error="skip")
    assert manifest.report.skipped_by_kind == {"unreadable_video": 1} and manifest.totals.episodes == 1
    _assert_rows_show(tmp_path / "skip", {0: list(range(10, 22))})


def test_a_table_the_container_does_not_tell_is_checked_through_the_reader_at_fast(tmp_path, monkeypatch):
    """Where ``scan`` falls back to PyAV's full decode, no decode of the reader's decoder had vouched
    for that table at the default level; now the level does what ``full`` does (counted so)."""
    data = make_video(None, 16, fps=FPS, gop=8, start_number=60, **SMALL)
    monkeypatch.setattr(video_module, "_packet_model", lambda rows, first_pts: None)
    told = video_module.scan(data, vouch=True)
    assert (
        told.disagreement
        == "the container does not tell the frames (the packets' pts do not tell the displayed frames)"
    )
    assert video_module.scan(data).disagreement is None  # off: trusted, nothing checked
    manifest = _convert(tmp_path, [(data, range(16))])
    assert manifest.report.checks == {"full": 1} and _transforms(tmp_path, manifest) == ["copy"]
    _assert_rows_show(tmp_path, {0: list(range(60, 76))})


def test_a_timestamp_jump_in_a_reordering_stream_is_checked_in_full(tmp_path):
    """Packets from the 12th on shifted by 10^6 ticks in an H.264 stream with B-frames: B-frames
    decoded after the jump sort after frames the decoder shows later, in a middle group of pictures
    that the fast check's decodes do not look at. Before, the default check accepted the table and
    the reader refused every read of the episode (pts out of order); now the jump sends the file
    to the full check, and every row shows its frame."""
    import io

    import av

    src = make_video(None, 24, fps=FPS, gop=6, bframes=True, start_number=100, **SMALL)
    out = io.BytesIO()
    with av.open(io.BytesIO(src)) as inp, av.open(out, "w", format="matroska") as dst:
        stream = inp.streams.video[0]
        copy = dst.add_stream_from_template(stream)
        for q, packet in enumerate(p for p in inp.demux(stream) if p.size):
            shift = 10**6 if q > 10 else 0
            packet.pts = packet.pts + shift
            packet.dts = None if packet.dts is None else packet.dts + shift
            packet.stream = copy
            dst.mux(packet)
    manifest = _convert(tmp_path, [(out.getvalue(), range(24))])
    assert manifest.report.checks == {"full": 1}
    assert verify(str(tmp_path))["ok"]
    _assert_rows_show(tmp_path, {0: list(range(100, 124))})
