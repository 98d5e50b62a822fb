"""Tests for the synthetic-episode helpers in tests/videogen.py."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from torchcodec.decoders import VideoDecoder
from videogen import decode_frame_number, encode_frame_number, make_episode_table, make_video

# (codec, num_frames, gop, bframes)
CASES = [
    ("h264", 60, 30, True),
    ("h264", 300, 250, True),
    ("av1", 60, 30, True),
    ("mpeg4", 60, 30, False),
]


@pytest.mark.parametrize("height,width", [(32, 32), (64, 64), (48, 80), (256, 256)])
def test_frame_number_roundtrip_raw(height, width):
    for n in [0, 1, 2, 255, 256, 12345, 2**16 - 1]:
        img = encode_frame_number(n, height, width)
        assert img.shape == (height, width, 3) and img.dtype == np.uint8
        assert (img[..., 0] == img[..., 1]).all() and (img[..., 1] == img[..., 2]).all()
        assert decode_frame_number(img) == n
        assert decode_frame_number(torch.from_numpy(img).permute(2, 0, 1).contiguous()) == n  # CHW tensor


def test_frame_number_out_of_range():
    with pytest.raises(ValueError):
        encode_frame_number(2**16, 64, 64)
    with pytest.raises(ValueError):
        encode_frame_number(0, 16, 16)


@pytest.mark.parametrize("codec,num_frames,gop,bframes", CASES)
def test_make_video_decodes(codec, num_frames, gop, bframes, tmp_path):
    path = tmp_path / "v.mp4"
    data = make_video(path, num_frames, codec=codec, gop=gop, bframes=bframes)
    assert path.read_bytes() == data
    assert make_video(None, num_frames, codec=codec, gop=gop, bframes=bframes) == data  # deterministic

    dec = VideoDecoder(data)
    assert dec.metadata.num_frames == num_frames
    batch = dec.get_frames_at(list(range(num_frames)))
    assert [decode_frame_number(f) for f in batch.data] == list(range(num_frames))
    np.testing.assert_allclose(batch.pts_seconds.numpy(), np.arange(num_frames) / 20, atol=1e-6)
    assert dec._get_key_frame_indices().tolist() == list(range(0, num_frames, gop))


def test_make_video_has_bframes():
    import io

    import av

    def reordered(data):
        with av.open(io.BytesIO(data)) as c:
            pts = [p.pts for p in c.demux(video=0) if p.pts is not None]
        return pts != sorted(pts)

    assert reordered(make_video(None, 30, codec="h264", bframes=True))
    assert not reordered(make_video(None, 30, codec="h264", bframes=False))


@pytest.mark.parametrize("codec", ["h264", "av1", "mpeg4"])
def test_make_video_options(codec):
    data = make_video(None, 25, codec=codec, fps=10, height=32, width=48, gop=10, start_number=500)
    dec = VideoDecoder(data)
    assert (dec.metadata.height, dec.metadata.width) == (32, 48)
    batch = dec.get_frames_at(list(range(25)))
    assert [decode_frame_number(f) for f in batch.data] == list(range(500, 525))
    np.testing.assert_allclose(batch.pts_seconds.numpy(), np.arange(25) / 10, atol=1e-6)
    assert dec._get_key_frame_indices().tolist() == [0, 10, 20]


def test_make_video_unknown_codec():
    with pytest.raises(ValueError):
        make_video(None, 5, codec="vp8")


def test_make_episode_table():
    t = make_episode_table(5, state_dim=4, action_dim=3, fps=20, start_frame=10)
    assert t.column_names == [
        "observation.state",
        "action",
        "timestamp",
        "frame_index",
        "episode_index",
        "index",
        "task_index",
    ]
    assert t.schema.field("observation.state").type == pa.list_(pa.float32(), 4)
    assert t.schema.field("action").type == pa.list_(pa.float32(), 3)
    assert t.schema.field("timestamp").type == pa.float32()
    for name in ["frame_index", "episode_index", "index", "task_index"]:
        assert t.schema.field(name).type == pa.int64()
    state = np.array(t["observation.state"].to_pylist(), np.float32)
    action = np.array(t["action"].to_pylist(), np.float32)
    r = np.arange(5, dtype=np.float32)[:, None]
    np.testing.assert_allclose(state, r + 0.01 * np.arange(4), rtol=0, atol=1e-6)
    np.testing.assert_allclose(action, r + 0.5 + 0.01 * np.arange(3), rtol=0, atol=1e-6)
    assert t["frame_index"].to_pylist() == list(range(10, 15))
    np.testing.assert_allclose(t["timestamp"].to_numpy(), np.arange(10, 15) / 20, atol=1e-6)
    assert t["index"].to_pylist() == list(range(5))
    assert set(t["episode_index"].to_pylist()) == {0} and set(t["task_index"].to_pylist()) == {0}

    t2 = make_episode_table(3, with_frame_index=False)
    assert "frame_index" not in t2.column_names and t2.num_rows == 3
