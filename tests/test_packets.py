"""The packet read path (stream/packets.py): runs cover every packet a frame depends on, only those
bytes are fetched, damaged packets are refused, and one decoder serves every episode of a setting."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from videogen import decode_frame_number, make_episode_table, make_video

from epishard.format.index import WindowIndex
from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert
from epishard.stream import WindowDataset, WindowSpec, packets
from epishard.stream.fetch import FetchPolicy
from epishard.stream.lookahead import Lookahead
from epishard.stream.options import ReadOptions
from epishard.stream.packets import plan_runs, run_bytes
from epishard.stream.telemetry import summarize

FPS = 20
CAM = "observation.images.front"


def _random_stream(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(frame_packet, keyframes) of a random stream with B-frame reordering and open-GOP leading frames.

    Display order is 0..n-1. Each group of pictures starts at a keyframe; in decode order its key
    packet comes first and the group's other frames follow in a random order (reordering inside a
    group); with an open GOP, up to 2 frames displayed just before a keyframe are decoded right after
    its packet (leading pictures that reference the group before).
    """
    n = int(rng.integers(2, 60))
    keys = np.unique(np.r_[0, rng.choice(np.arange(1, n), size=int(rng.integers(0, max(1, n // 3))), replace=False)])
    groups = [list(range(a, b)) for a, b in zip(keys, [*keys[1:], n], strict=True)]
    open_gop = bool(rng.integers(0, 2))
    order: list[int] = []
    for g, frames in enumerate(groups):
        key, rest = frames[0], frames[1:]
        leading: list[int] = []
        if open_gop and g > 0:  # the previous group's last frames decode after this key
            prev = [f for f in groups[g - 1][1:] if f not in order][-2:]
            leading = prev
        order += [key, *leading]
        tail = [f for f in rest if f not in order]
        if g + 1 < len(groups) and open_gop:
            tail = tail[:-2] if len(tail) > 2 else tail  # the last two lead into the next group
        order += list(rng.permutation(tail)) if tail else []
    order += [f for f in range(n) if f not in order]
    frame_packet = np.empty(n, dtype=np.int64)
    frame_packet[np.asarray(order)] = np.arange(n)
    return frame_packet, keys.astype(np.int64)


@pytest.mark.parametrize("seed", range(200))
def test_runs_cover_every_packet_each_frame_depends_on(seed):
    """A frame depends on the packets, in decode order, from its keyframe's packet (the last keyframe
    displayed at or before it) to its own, and on every frame shown between that keyframe and it
    (decoders emit in display order). Each wanted frame lies in exactly one run, whose packets hold
    all of those; a run starts at a keyframe's packet (or packet 0)."""
    rng = np.random.default_rng(seed)
    frame_packet, keys = _random_stream(rng)
    n = frame_packet.size
    wanted = np.unique(rng.integers(0, n, size=int(rng.integers(1, 10))))
    runs = plan_runs(frame_packet, keys, wanted)
    assert np.array_equal(np.concatenate([r.frames for r in runs]), wanted)
    key_packets = set(frame_packet[keys].tolist()) | {0}
    for run in runs:
        assert run.first in key_packets
        for f in run.frames.tolist():
            key = int(keys[np.searchsorted(keys, f, side="right") - 1])
            needed = frame_packet[key : f + 1]
            assert run.first <= min(int(frame_packet[key]), int(needed.min())), (f, key)
            assert run.stop > int(needed.max()), (f, key)
    for a, b in itertools.pairwise(runs):  # a new run only where a keyframe separates frames
        key = int(keys[np.searchsorted(keys, b.frames[0], side="right") - 1])
        assert key > a.frames[-1]


def test_run_bytes_counts_each_runs_packets():
    sizes = np.array([100, 5, 90, 6, 80, 7], dtype=np.int64)
    frame_packet, keys = np.arange(6), np.array([0, 2, 4])
    runs = plan_runs(frame_packet, keys, np.array([1, 5]))
    assert [(r.first, r.stop) for r in runs] == [(0, 2), (4, 6)]
    assert run_bytes(sizes, runs) == 100 + 5 + 80 + 7


def _dataset(tmp_path, episodes: int = 3, frames: int = 90, gop: int = 2, codec: str = "av1"):
    eps = [
        Episode(
            source="packets",
            episode_index=e,
            table=make_episode_table(frames, fps=FPS),
            videos={CAM: CameraVideo(make_video(None, frames, fps=FPS, codec=codec, gop=gop, start_number=1000 * e))},
            fps=FPS,
            tasks=("t",),
        )
        for e in range(episodes)
    ]
    out = str(tmp_path / "ds")
    convert([Source(name="packets", episodes=eps, fps=FPS)], out, ConvertOptions(progress=False))
    return out


SPEC = WindowSpec(cameras={CAM: (0, 4, 8, 12)}, per_episode_count=2, boundary="pad")


def test_only_the_needed_groups_of_pictures_are_read_and_one_decoder_serves_all_episodes(tmp_path, monkeypatch):
    monkeypatch.setattr(packets, "POOL", packets.DecoderPool())  # none kept from earlier tests
    root = _dataset(tmp_path, episodes=4, frames=120)
    index = WindowIndex.load_dataset(root)
    assert index.has_packets(np.arange(4)).all()
    video_bytes = int(index.cam_size.sum())
    exact = FetchPolicy(coalesce_bytes=0)  # no gaps read between ranges: what is read is what is asked
    samples = list(WindowDataset(root, SPEC, seed=3, read=ReadOptions(telemetry=True, fetch=exact)))
    for s in samples:  # frame identity
        rows = np.clip(int(s["frame_index"]) + np.array([0, 4, 8, 12]), 0, 119)
        assert [decode_frame_number(f) for f in s[CAM]] == (1000 * int(s["episode_index"]) + rows).tolist()
    t = summarize([s["__telemetry__"] for s in samples])
    assert t["decoder_opens"] == 1  # one encoder setting: one decoder for the worker's life
    tables = int(index.member_size[index.data_member(np.arange(4))].sum())
    # The groups of pictures the decodes needed and each episode's table, not the videos.
    assert t["bytes_needed"] > 0 and t["bytes_read"] == t["bytes_needed"] + tables
    assert t["bytes_needed"] < 0.5 * video_bytes
    whole = summarize(
        [
            s["__telemetry__"]
            for s in WindowDataset(
                root, SPEC, seed=3, read=ReadOptions(telemetry=True, fetch=FetchPolicy(packets=False))
            )
        ]
    )
    assert whole["bytes_read"] >= video_bytes  # the members whole, as before


def _damage_packet(root: str, stream: int, packet: int) -> None:
    index = WindowIndex.load_dataset(root)
    table = index.packets(stream)
    at = int(index.cam_offset[stream] + table.offset[packet] + table.size[packet] // 2)
    shard = f"{root}/shard-{int(index.shard[index.stream_episode(stream)]):06d}.tar"
    with open(shard, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_damaged_packet_is_an_error_never_a_frame(tmp_path):
    root = _dataset(tmp_path, episodes=2, frames=40, gop=8, codec="h264")
    _damage_packet(root, 0, 3)
    spec = WindowSpec(cameras={CAM: (0,)}, boundary="pad")
    with pytest.raises(Exception, match="CRC-32"):
        list(WindowDataset(root, spec, seed=0, read=ReadOptions(fetch=FetchPolicy(on_shard_error="raise"))))
    with pytest.warns(UserWarning, match="CRC-32"):
        samples = list(WindowDataset(root, spec, seed=0))
    for s in samples:  # every frame returned is its row's; episode 0's windows are flagged substitutes
        if s["substitute"]:
            continue
        assert int(s["episode_index"]) == 1
        assert decode_frame_number(s[CAM][0]) == 1000 + int(s["frame_index"])
    assert any(s["substitute"] for s in samples)


def test_both_read_paths_give_the_same_pixels_resized(tmp_path):
    from epishard.stream import PostProcess

    root = _dataset(tmp_path, episodes=2, frames=60, gop=4, codec="h264")
    post = PostProcess(size=(48, 40))
    a = [s[CAM] for s in WindowDataset(root, SPEC, seed=1, postprocess=post)]
    b = [
        s[CAM]
        for s in WindowDataset(root, SPEC, seed=1, postprocess=post, read=ReadOptions(fetch=FetchPolicy(packets=False)))
    ]
    assert torch.equal(torch.stack(a), torch.stack(b))


def _intra_video(codec: str, n: int, start: int) -> bytes:
    """An intra-only video (every packet a key packet) in MP4 whose frame ``i`` shows ``start + i``."""
    import io

    import av
    from videogen import encode_frame_number

    pix_fmt = {"png": "rgb24", "mjpeg": "yuvj444p", "qtrle": "rgb24"}[codec]
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4" if codec != "qtrle" else "mov") as out:
        stream = out.add_stream(codec, rate=FPS)
        stream.width = stream.height = 64
        stream.pix_fmt = pix_fmt
        for i in range(n):
            image = av.VideoFrame.from_ndarray(encode_frame_number(start + i), format="rgb24").reformat(format=pix_fmt)
            image.pts = i
            out.mux(stream.encode(image))
        out.mux(stream.encode(None))
    return buf.getvalue()


@pytest.mark.parametrize("codec", ["png", "mjpeg"])
def test_key_packets_are_flagged_so_intra_codecs_decode_each_frame_alone(tmp_path, codec):
    """FFmpeg's PNG decoder blends a packet not flagged key onto the previous picture (frame 2 came
    back as 1|2 = 3): the packet path flags each keyframe's packet as a demuxer does, so every read
    pattern returns each frame itself, as the whole-member path does."""
    eps = [
        Episode(
            source="intra",
            episode_index=e,
            table=make_episode_table(40, fps=FPS),
            videos={CAM: CameraVideo(_intra_video(codec, 40, 100 * e))},
            fps=FPS,
            tasks=("t",),
        )
        for e in range(3)
    ]
    root = str(tmp_path / "ds")
    convert([Source(name="intra", episodes=eps, fps=FPS)], root, ConvertOptions(progress=False))
    assert WindowIndex.load_dataset(root).has_packets(np.arange(3)).all()
    offsets = (0, 3, 7)
    spec = WindowSpec(cameras={CAM: offsets}, boundary="pad")
    for packets_path in (True, False):
        samples = list(
            WindowDataset(
                root, spec, seed=1, read=ReadOptions(fetch=FetchPolicy(packets=packets_path, on_shard_error="raise"))
            )
        )
        assert len(samples) == 120
        for s in samples:
            rows = np.clip(int(s["frame_index"]) + np.array(offsets), 0, 39)
            assert [decode_frame_number(f) for f in s[CAM]] == (100 * int(s["episode_index"]) + rows).tolist()


def test_a_codec_outside_the_tested_set_is_read_whole(tmp_path, monkeypatch):
    """Only codecs proven frame-exact on the packet path use it; another is read whole by torchcodec."""
    root = _dataset(tmp_path, episodes=2, frames=30, codec="h264")
    index = WindowIndex.load_dataset(root)
    assert packets.readable(index, np.arange(2)).all()
    monkeypatch.setattr(packets, "PACKET_CODECS", frozenset({"av1"}))
    assert not packets.readable(index, np.arange(2)).any()
    samples = list(WindowDataset(root, SPEC, seed=3, read=ReadOptions(telemetry=True)))
    for s in samples:
        rows = np.clip(int(s["frame_index"]) + np.array([0, 4, 8, 12]), 0, 29)
        assert [decode_frame_number(f) for f in s[CAM]] == (1000 * int(s["episode_index"]) + rows).tolist()
    t = summarize([s["__telemetry__"] for s in samples])
    assert t["bytes_read"] >= int(index.cam_size.sum())  # the members whole


def _colour_video(codec: str, pix_fmt: str, n: int, start: int) -> bytes:
    """A video of ``n`` frames whose channels differ: R carries ``start + i``, G its inverse, B a ramp."""
    import io

    import av
    from videogen import encode_frame_number

    options = {"libsvtav1": {"g": "2", "crf": "30"}, "libx264": {"g": "4", "bf": "2"}, "mpeg4": {"g": "4"}}[codec]
    ramp = np.tile(np.linspace(0, 255, 64, dtype=np.uint8), (64, 1))
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream(codec, rate=FPS, options=options)
        stream.width = stream.height = 64
        stream.pix_fmt = pix_fmt
        for i in range(n):
            image = encode_frame_number(start + i)
            image[..., 1] = 255 - image[..., 0]
            image[..., 2] = ramp
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format=pix_fmt)
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


@pytest.mark.parametrize(
    ("codec", "pix_fmt"),
    [
        ("libsvtav1", "yuv420p"),
        ("libx264", "yuv420p"),
        ("libx264", "yuv444p"),
        ("libx264", "yuvj420p"),
        ("mpeg4", "yuv420p"),
    ],
)
def test_full_size_colour_frames_equal_torchcodecs(tmp_path, monkeypatch, codec, pix_fmt):
    """Without post-processing the packet path converts to planar RGB, at decode time or from kept
    pictures when a window takes them; each channel equals torchcodec's packed RGB."""
    eps = [
        Episode(
            source="colour",
            episode_index=e,
            table=make_episode_table(24, fps=FPS),
            videos={CAM: CameraVideo(_colour_video(codec, pix_fmt, 24, 100 * e))},
            fps=FPS,
            tasks=("t",),
        )
        for e in range(2)
    ]
    root = str(tmp_path / "ds")
    convert([Source(name="colour", episodes=eps, fps=FPS)], root, ConvertOptions(progress=False))
    assert packets.readable(WindowIndex.load_dataset(root), np.arange(2)).all()
    spec = WindowSpec(cameras={CAM: (0, 3, 5)}, boundary="pad")
    written = []
    real = packets.Picture.write
    monkeypatch.setattr(packets.Picture, "write", lambda self, out: written.append(1) or real(self, out))
    got = {}
    for path, pictures in (("rgb", False), ("pictures", True), ("whole", None)):
        read = ReadOptions(
            fetch=FetchPolicy(packets=path != "whole", on_shard_error="raise"), lookahead=Lookahead(pictures=pictures)
        )
        before = len(written)
        got[path] = torch.stack([s[CAM] for s in WindowDataset(root, spec, seed=2, read=read)])
        assert (len(written) > before) == (path == "pictures")  # frames kept as pictures only when asked
    a = got["whole"]
    assert a.shape[2] == 3 and not torch.equal(a[:, :, 0], a[:, :, 1])  # the channels differ
    assert torch.equal(got["rgb"], a) and torch.equal(got["pictures"], a)


def test_a_kept_picture_is_counted_with_its_padding_and_kept_only_where_smaller_than_rgb():
    from epishard.stream.lookahead import PICTURE_SHARE

    assert packets.picture_bytes("yuv420p", 640, 480) == 640 * 512 * 3 // 2  # rows padded to 128
    assert packets.picture_bytes("yuv444p", 1280, 720) == 1280 * 768 * 3
    assert packets.picture_bytes("yuv420p", 640, 480) <= PICTURE_SHARE * 3 * 640 * 480  # kept (None)
    assert packets.picture_bytes("yuv420p", 1280, 720) <= PICTURE_SHARE * 3 * 1280 * 720
    assert packets.picture_bytes("yuv420p", 64, 64) > PICTURE_SHARE * 3 * 64 * 64  # RGB kept (None)
    assert packets.picture_bytes("yuv444p", 640, 480) > PICTURE_SHARE * 3 * 640 * 480
