"""Cameras that are not 8-bit RGB video: depth maps, image features, odd sizes and deep colour,
and the re-encoder's handling of them. Inputs are built here (videogen), values checked exactly."""

from __future__ import annotations

import json
from fractions import Fraction
from io import BytesIO

import av
import numpy as np
import pyarrow as pa
import pytest
import torch
from lerobotgen import write_v2_files
from videogen import decode_frame_number, make_episode_table, make_grey_video, make_video

from epishard.shardwriter import CameraVideo, ConversionError, ConvertOptions, Episode, ReencodeSpec, Source, convert
from epishard.shardwriter.images import decode_image
from epishard.stream import PostProcess, WindowDataset, WindowSpec
from epishard.stream.dataset import WindowLoader

FPS = 20
RGB, DEPTH, IMAGE = "observation.images.front", "observation.images.depth", "observation.image"


def _opts(**kw) -> ConvertOptions:
    return ConvertOptions(progress=False, **kw)


def _depth_values(episode: int, rows: int, top: int, h: int = 32, w: int = 32) -> np.ndarray:
    """uint16 [rows, h, w]: frame r holds (1000 e + 37 r + 3 x + 5 y) mod (top + 1), so values use the
    high bits (an 8-bit squeeze cannot keep them) and differ between neighbours (resize must not mix)."""
    r, y, x = np.meshgrid(np.arange(rows), np.arange(h), np.arange(w), indexing="ij")
    return ((1000 * episode + 37 * r + 3 * x + 5 * y) % (top + 1)).astype(np.uint16)


def _iterate(url, spec, **kw):
    return list(WindowDataset(url, spec, shuffle=2, seed=3, **kw))


# --- depth ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec,pix_fmt,top", [("ffv1", "gray16le", 65535), ("hevc", "gray12le", 4095)])
def test_depth_round_trips_exactly_beside_rgb(codec, pix_fmt, top, tmp_path):
    rows = 12
    depth = [_depth_values(e, rows, top) for e in range(2)]
    src = write_v2_files(
        tmp_path / "src",
        [make_episode_table(rows, fps=FPS) for _ in range(2)],
        fps=FPS,
        videos={
            RGB: [make_video(None, rows, fps=FPS, height=32, width=32, start_number=100 * e) for e in range(2)],
            DEPTH: [make_grey_video(d, codec=codec, pix_fmt=pix_fmt, fps=FPS, gop=4) for d in depth],
        },
        features={DEPTH: {"info": {"video.is_depth_map": True}}},
    )
    manifest = convert([str(src)], str(tmp_path / "out"), _opts())
    cam = manifest.cameras[DEPTH]
    assert (cam.kind, cam.dtype, cam.channels, cam.pix_fmt) == ("depth", "uint16", 1, pix_fmt)
    assert list(manifest.features[DEPTH].shape) == [32, 32, 1] and manifest.features[DEPTH].kind == "depth"
    assert manifest.cameras[RGB].kind == "rgb" and list(manifest.report.warnings) == []

    spec = WindowSpec(cameras={DEPTH: (0, 2, 5), RGB: (0, 1)})
    samples = _iterate(str(tmp_path / "out"), spec)
    assert len(samples) == 2 * (rows - 5)
    for s in samples:
        e, r = s["episode_index"], s["frame_index"]
        got = s[DEPTH]
        assert got.dtype == torch.uint16 and tuple(got.shape) == (3, 1, 32, 32)
        assert np.array_equal(got[:, 0].numpy(), depth[e][[r, r + 2, r + 5]])
        assert [decode_frame_number(f) for f in s[RGB]] == [100 * e + r, 100 * e + r + 1]

    # Batches with float RGB and a resize: depth stays uint16, resized by nearest neighbour only.
    post = PostProcess(dtype=torch.float32, size=(16, 24))
    loader = WindowLoader(WindowDataset(str(tmp_path / "out"), spec, shuffle=0, postprocess=post), batch_size=4)
    batch = next(iter(loader))
    pick_y, pick_x = (np.arange(16) * 2 + 1), np.floor((np.arange(24) + 0.5) * 32 / 24).astype(int)
    assert batch[DEPTH].dtype == torch.uint16 and tuple(batch[DEPTH].shape) == (4, 3, 1, 16, 24)
    assert batch[RGB].dtype == torch.float32 and float(batch[RGB].max()) <= 1.0
    for i in range(4):
        e, r = int(batch["episode_index"][i]), int(batch["frame_index"][i])
        want = depth[e][[r, r + 2, r + 5]][:, pick_y][:, :, pick_x]
        assert np.array_equal(batch[DEPTH][i, :, 0].numpy(), want)


def test_grey_video_over_8_bits_is_depth_even_undeclared_and_never_reencoded(tmp_path):
    rows = 8
    values = _depth_values(0, rows, 1023)
    ep = Episode(
        source="g",
        episode_index=0,
        table=make_episode_table(rows, fps=FPS),
        fps=FPS,
        videos={
            DEPTH: CameraVideo(make_grey_video(values, pix_fmt="gray10le", fps=FPS)),
            RGB: CameraVideo(make_video(None, rows, fps=FPS, height=32, width=32)),
        },
    )
    manifest = convert([Source("g", [ep], FPS)], str(tmp_path), _opts(reencode=ReencodeSpec(gop=2)))
    assert manifest.cameras[DEPTH].kind == "depth" and manifest.cameras[DEPTH].bit_depth == 10
    assert [(w.kind, w.camera) for w in manifest.report.warnings] == [("depth_not_reencoded", DEPTH)]
    s = _iterate(str(tmp_path), WindowSpec(cameras={DEPTH: (0,), RGB: (0,)}))[0]
    assert np.array_equal(s[DEPTH][0, 0].numpy(), values[s["frame_index"]])


@pytest.mark.parametrize("key", ["info", "video_info"])
def test_8_bit_depth_declared_under_either_lerobot_key_stays_depth_through_reencode(key, tmp_path):
    # LeRobot v2.0 (and many converted v2.1/v3.0 datasets) put the flag under "video_info".
    rows = 8
    values = _depth_values(0, rows, 255)
    src = write_v2_files(
        tmp_path / "src",
        [make_episode_table(rows, fps=FPS)],
        fps=FPS,
        videos={DEPTH: [make_grey_video(values, pix_fmt="gray", fps=FPS)]},
        features={DEPTH: {key: {"video.is_depth_map": True}}},
    )
    manifest = convert([str(src)], str(tmp_path / "out"), _opts(reencode=ReencodeSpec(gop=2)))
    assert (manifest.cameras[DEPTH].kind, manifest.cameras[DEPTH].channels) == ("depth", 1)
    assert [w.kind for w in manifest.report.warnings] == ["depth_not_reencoded"]
    for s in _iterate(str(tmp_path / "out"), WindowSpec(cameras={DEPTH: (0, 1)})):
        r = s["frame_index"]
        assert s[DEPTH].dtype == torch.uint16 and np.array_equal(s[DEPTH][:, 0].numpy(), values[[r, r + 1]])


def test_declared_depth_in_a_colour_format_is_read_as_rgb_with_a_warning(tmp_path):
    rows = 6
    ep = Episode(
        source="d",
        episode_index=0,
        table=make_episode_table(rows, fps=FPS),
        fps=FPS,
        videos={DEPTH: CameraVideo(make_video(None, rows, fps=FPS, height=32, width=32), depth=True)},
    )
    manifest = convert([Source("d", [ep], FPS)], str(tmp_path), _opts())
    assert manifest.cameras[DEPTH].kind == "rgb"
    assert [w.kind for w in manifest.report.warnings] == ["depth_not_grey"]


def test_a_camera_depth_in_some_episodes_and_rgb_in_others_is_refused_by_the_reader(tmp_path):
    rows = 6
    table = make_episode_table(rows, fps=FPS)
    grey = CameraVideo(make_grey_video(_depth_values(0, rows, 4095), pix_fmt="gray16le", fps=FPS), depth=True)
    colour = CameraVideo(make_video(None, rows, fps=FPS, height=32, width=32), depth=True)
    rgb = CameraVideo(make_video(None, rows, fps=FPS, height=32, width=32))
    eps = [
        Episode(source="m", episode_index=e, table=table, fps=FPS, videos={DEPTH: video, RGB: rgb})
        for e, video in enumerate((grey, colour))
    ]
    convert([Source("m", eps, FPS)], str(tmp_path / "mixed"), _opts())
    convert([Source("d", eps[:1], FPS)], str(tmp_path / "depth"), _opts())
    convert([Source("c", eps[1:], FPS)], str(tmp_path / "colour"), _opts())
    # Batching uint16 [T, 1, H, W] with uint8 [T, 3, H, W] cannot work: refused up front, both named.
    with pytest.raises(
        ValueError,
        match=r"'observation.images.depth' is a depth camera .* in episode m-e000000 of "
        r".*mixed but RGB .* in episode m-e000001 of .*mixed",
    ):
        WindowDataset(str(tmp_path / "mixed"), WindowSpec(cameras={DEPTH: (0,)}))
    with pytest.raises(
        ValueError, match=r"in episode d-e000000 of .*depth but RGB .* in episode c-e000001 of .*colour"
    ):
        WindowDataset([str(tmp_path / "depth"), str(tmp_path / "colour")], WindowSpec(cameras={DEPTH: (0,), RGB: (0,)}))
    # Without that camera the episodes stream as usual.
    samples = _iterate(str(tmp_path / "mixed"), WindowSpec(cameras={RGB: (0,)}))
    assert sorted((s["episode_index"], decode_frame_number(s[RGB][0])) for s in samples) == [
        (e, r) for e in range(2) for r in range(rows)
    ]


def test_ten_bit_colour_states_its_8_bit_conversion(tmp_path):
    rows = 6
    ep = Episode(
        source="t",
        episode_index=0,
        table=make_episode_table(rows, fps=FPS),
        fps=FPS,
        videos={RGB: CameraVideo(make_video(None, rows, fps=FPS, height=32, width=32, pix_fmt="yuv420p10le"))},
    )
    manifest = convert([Source("t", [ep], FPS)], str(tmp_path), _opts())
    cam = manifest.cameras[RGB]
    assert (cam.kind, cam.dtype, cam.bit_depth) == ("rgb", "uint8", 10)
    assert "8-bit RGB" in cam.conversion and "yuv420p10le" in cam.conversion
    s = _iterate(str(tmp_path), WindowSpec(cameras={RGB: (0,)}))[0]
    assert s[RGB].dtype == torch.uint8 and decode_frame_number(s[RGB][0]) == s["frame_index"]


# --- image features -------------------------------------------------------------------------------


def _encode_image(image: np.ndarray, codec: str) -> bytes:
    """PNG (rgb24 or grey) or JPEG bytes of ``image`` with FFmpeg's encoders."""
    grey, deep = image.ndim == 2, image.dtype == np.uint16  # deep: a 16-bit grey PNG (a depth map)
    ctx = av.CodecContext.create(codec, "w")
    ctx.width, ctx.height = image.shape[1], image.shape[0]
    ctx.pix_fmt = {"png": ("gray16be" if deep else "gray") if grey else "rgb24", "mjpeg": "yuvj444p"}[codec]
    ctx.time_base = ctx.framerate = 1
    if codec == "mjpeg":
        ctx.qmin, ctx.qmax = 1, 2
    frame = av.VideoFrame.from_ndarray(image, format=("gray16le" if deep else "gray") if grey else "rgb24")
    frame = frame.reformat(format=ctx.pix_fmt)
    return b"".join(bytes(p) for p in ctx.encode(frame) + ctx.encode(None))


def _image_dataset(root, kind: str, rows: int = 10, broken_row: int | None = None):
    """LeRobot v2.1 folder with image feature ``observation.image`` (struct<bytes, path>) and an RGB video."""
    tables, originals = [], []
    for e in range(2):
        images = [make_video_frame(100 * e + r, kind) for r in range(rows)]
        cells = [
            {"bytes": _encode_image(im, "mjpeg" if kind == "jpeg" else "png"), "path": f"f{r}.png"}
            for r, im in enumerate(images)
        ]
        if broken_row is not None and e == 1:
            cells[broken_row]["bytes"] = cells[broken_row]["bytes"][:40]
        image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        tables.append(make_episode_table(rows, fps=FPS).append_column(IMAGE, pa.array(cells, image_type)))
        originals.append(images)
    src = write_v2_files(
        root,
        tables,
        fps=FPS,
        videos={RGB: [make_video(None, rows, fps=FPS, height=32, width=32)] * 2},
        features={IMAGE: {"dtype": "image", "shape": [48, 40, 3], "names": ["height", "width", "channel"]}},
    )
    return src, originals, tables


def make_video_frame(n: int, kind: str) -> np.ndarray:
    """A 48x40 frame-numbered image (odd-free but not square); grey for ``kind == "grey"``."""
    from videogen import encode_frame_number

    rgb = encode_frame_number(n, 48, 40)
    rgb[:, :, 1] = (rgb[:, :, 1] // 2 + np.arange(40, dtype=np.uint8)[None, :]).astype(np.uint8)  # not grey
    return rgb[:, :, 0] if kind == "grey" else rgb


@pytest.mark.parametrize("kind", ["png", "grey", "jpeg"])
def test_image_feature_becomes_a_camera_with_its_exact_pixels(kind, tmp_path):
    src, originals, tables = _image_dataset(tmp_path / "src", kind)
    manifest = convert([str(src)], str(tmp_path / "out"), _opts())
    cam = manifest.cameras[IMAGE]
    assert (cam.kind, cam.width, cam.height, cam.episodes) == ("rgb", 40, 48, 2)
    assert any(IMAGE in note and "camera" in note for note in manifest.sources[0].notes)
    spec = WindowSpec(cameras={IMAGE: (0, 3), RGB: (0,)})
    samples = _iterate(str(tmp_path / "out"), spec)
    assert len(samples) == 2 * 7
    for s in samples:
        e, r = s["episode_index"], s["frame_index"]
        got = s[IMAGE].permute(0, 2, 3, 1).numpy()
        for k, row in enumerate((r, r + 3)):
            if kind == "jpeg":  # equal to FFmpeg's decode of the JPEG, and still the right frame
                cell = tables[e].column(IMAGE)[row].as_py()["bytes"]
                assert np.array_equal(got[k], decode_image(cell)[0])
                assert decode_frame_number(got[k][..., [0, 0, 0]]) == 100 * e + row
            else:  # PNG is lossless: the very pixels the images were made from
                want = originals[e][row]
                assert np.array_equal(got[k], np.repeat(want[..., None], 3, -1) if kind == "grey" else want)
    # The stored table no longer carries the images; everything else is kept.
    with open(tmp_path / "out" / "manifest.json") as f:
        assert IMAGE not in json.load(f)["stats"]
    columns = {n for n in manifest.features if n not in manifest.cameras}
    assert columns == set(tables[0].column_names) - {IMAGE}


def test_image_feature_left_out_by_cameras_is_not_said_to_be_converted(tmp_path):
    src, originals, _ = _image_dataset(tmp_path / "src", "png", rows=6)
    manifest = convert([str(src)], str(tmp_path / "rgb"), _opts(cameras=(RGB,)))
    assert list(manifest.cameras) == [RGB] and list(manifest.sources[0].notes) == []
    manifest = convert([str(src)], str(tmp_path / "img"), _opts(cameras=(IMAGE,), episodes=frozenset({1})))
    assert list(manifest.cameras) == [IMAGE] and [IMAGE in n for n in manifest.sources[0].notes] == [True]
    samples = _iterate(str(tmp_path / "img"), WindowSpec(cameras={IMAGE: (0,)}))
    assert sorted(s["frame_index"] for s in samples) == list(range(6))
    for s in samples:
        assert s["episode_index"] == 1
        assert np.array_equal(s[IMAGE][0].permute(1, 2, 0).numpy(), originals[1][s["frame_index"]])


def test_broken_image_names_row_and_camera_and_can_be_skipped(tmp_path):
    src, _, _ = _image_dataset(tmp_path / "src", "png", broken_row=4)
    with pytest.raises(ConversionError) as err:
        convert([str(src)], str(tmp_path / "out"), _opts())
    assert (err.value.kind, err.value.episode, err.value.camera, err.value.row) == ("bad_image", 1, IMAGE, 4)
    manifest = convert([str(src)], str(tmp_path / "out2"), _opts(on_error="skip"))
    assert manifest.totals.episodes == 1 and manifest.report.skipped_by_kind == {"bad_image": 1}


def test_16_bit_grey_images_become_a_depth_camera_with_exact_values(tmp_path):
    rows, image_type = 6, pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    depth = [_depth_values(e, rows, 65535, h=24, w=20) for e in range(2)]
    cells = [[{"bytes": _encode_image(d, "png"), "path": None} for d in values] for values in depth]
    tables = [make_episode_table(rows, fps=FPS).append_column(IMAGE, pa.array(c, image_type)) for c in cells]
    features = {IMAGE: {"dtype": "image", "shape": [24, 20, 1], "names": ["height", "width", "channel"]}}
    src = write_v2_files(
        tmp_path / "src",
        tables,
        fps=FPS,
        features=features,
        videos={RGB: [make_video(None, rows, fps=FPS, height=32, width=32)] * 2},
    )
    manifest = convert([str(src)], str(tmp_path / "out"), _opts(reencode=ReencodeSpec(gop=2)))
    cam = manifest.cameras[IMAGE]
    assert (cam.kind, cam.pix_fmt, cam.dtype, cam.channels) == ("depth", "gray16le", "uint16", 1)
    assert [(w.kind, w.camera) for w in manifest.report.warnings] == [("depth_not_reencoded", IMAGE)] * 2
    samples = _iterate(str(tmp_path / "out"), WindowSpec(cameras={IMAGE: (0, 1), RGB: (0,)}))
    assert len(samples) == 2 * (rows - 1)
    for s in samples:
        e, r = s["episode_index"], s["frame_index"]
        assert s[IMAGE].dtype == torch.uint16 and np.array_equal(s[IMAGE][:, 0].numpy(), depth[e][[r, r + 1]])
    # A row of another kind is named, with both kinds.
    cells[1][3]["bytes"] = _encode_image(make_video_frame(3, "png")[:24, :20].copy(), "png")
    tables[1] = make_episode_table(rows, fps=FPS).append_column(IMAGE, pa.array(cells[1], image_type))
    src = write_v2_files(tmp_path / "src2", tables, fps=FPS, features=features)
    with pytest.raises(ConversionError, match="image is 20x24 8-bit RGB, row 0's is 20x24 16-bit grey") as err:
        convert([str(src)], str(tmp_path / "out2"), _opts())
    assert (err.value.kind, err.value.episode, err.value.camera, err.value.row) == ("bad_image", 1, IMAGE, 3)


# --- re-encoding ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "codec,pix_fmt,stored_fmt",
    [
        ("libx264", "yuv444p", "yuv444p"),  # odd size: x264 refuses 4:2:0, gets 4:4:4
        ("libx265", "yuv444p", "yuv444p"),
        ("mpeg4", "yuv444p", "yuv420p"),  # offers 4:2:0 only and pads odd sizes itself
        ("libx264", "yuv420p10le", "yuv420p"),  # 10-bit source, 8-bit re-encode
    ],
)
def test_reencode_handles_odd_sizes_and_deep_colour(codec, pix_fmt, stored_fmt, tmp_path):
    rows, (h, w) = 10, ((47, 63) if pix_fmt == "yuv444p" else (32, 32))
    eps = [
        Episode(
            source="o",
            episode_index=e,
            table=make_episode_table(rows, fps=FPS),
            fps=FPS,
            videos={
                RGB: CameraVideo(
                    make_video(None, rows, fps=FPS, height=h, width=w, pix_fmt=pix_fmt, start_number=50 * e)
                )
            },
        )
        for e in range(2)
    ]
    manifest = convert([Source("o", eps, FPS)], str(tmp_path), _opts(reencode=ReencodeSpec(codec=codec, gop=4)))
    cam = manifest.cameras[RGB]
    assert (cam.width, cam.height, cam.pix_fmt) == (w, h, stored_fmt) and manifest.totals.skipped == 0
    for s in _iterate(str(tmp_path), WindowSpec(cameras={RGB: (0, 2)})):
        e, r = s["episode_index"], s["frame_index"]
        assert tuple(s[RGB].shape) == (2, 3, h, w)
        assert [decode_frame_number(f) for f in s[RGB]] == [50 * e + r, 50 * e + r + 2]


def test_encoder_failure_names_episode_and_camera_and_skip_honours_it(tmp_path):
    eps = [
        Episode(
            source="f",
            episode_index=e,
            table=make_episode_table(6, fps=FPS),
            fps=FPS,
            videos={RGB: CameraVideo(make_video(None, 6, fps=FPS, height=32, width=32))},
        )
        for e in range(2)
    ]
    bad = ReencodeSpec(codec="libsvtav1", gop=4, crf=99)  # SVT-AV1 refuses crf > 63 when it opens
    with pytest.raises(ConversionError) as err:
        convert([Source("f", eps, FPS)], str(tmp_path / "a"), _opts(reencode=bad))
    assert (err.value.kind, err.value.dataset, err.value.episode, err.value.camera) == ("encode_failed", "f", 0, RGB)
    assert "libsvtav1" in str(err.value)
    manifest = convert([Source("f", eps, FPS)], str(tmp_path / "b"), _opts(reencode=bad, on_error="skip"))
    assert manifest.report.skipped_by_kind == {"encode_failed": 2} and manifest.totals.episodes == 0
    with pytest.raises(ConversionError, match="no FFmpeg video encoder named 'nope'"):
        convert([Source("f", eps, FPS)], str(tmp_path / "c"), _opts(reencode=ReencodeSpec(codec="nope")))


def _crash_on_encode():
    """Encoder-process initializer: every encode aborts the process, as a native encoder fault does."""
    import os

    import epishard.shardwriter.video

    epishard.shardwriter.video._encode = lambda *args: os.abort()


def test_an_encoder_that_crashes_its_process_is_an_error_skip_honours_and_the_next_encode_works(tmp_path, monkeypatch):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import epishard.shardwriter.video as video

    def crashing_pool():
        return ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_crash_on_encode
        )

    eps = [
        Episode(
            source="f",
            episode_index=e,
            table=make_episode_table(6, fps=FPS),
            fps=FPS,
            videos={RGB: CameraVideo(make_video(None, 6, fps=FPS, height=32, width=32))},
        )
        for e in range(2)
    ]
    spec = ReencodeSpec(codec="libx264", gop=2)
    monkeypatch.setattr(video, "_encoder_pool", crashing_pool())
    with pytest.raises(ConversionError) as err:
        convert([Source("f", eps, FPS)], str(tmp_path / "a"), _opts(reencode=spec))
    assert (err.value.kind, err.value.dataset, err.value.episode, err.value.camera) == ("encode_failed", "f", 0, RGB)
    assert "crashed" in str(err.value) and video._encoder_pool is None
    monkeypatch.setattr(video, "_encoder_pool", crashing_pool())
    manifest = convert([Source("f", eps, FPS)], str(tmp_path / "b"), _opts(reencode=spec, on_error="skip"))
    assert manifest.report.skipped_by_kind == {"encode_failed": 1} and manifest.totals.episodes == 1
    samples = _iterate(str(tmp_path / "b"), WindowSpec(cameras={RGB: (0, 5)}))
    assert [decode_frame_number(s[RGB][i].permute(1, 2, 0).numpy()) for s in samples for i in (0, 1)] == [0, 5]


def test_depth_decode_seeks_only_where_a_keyframe_is_closer():
    from epishard.shardwriter.video import probe
    from epishard.stream.decode import decode_depth

    values = _depth_values(2, 20, 4095, 16, 16)
    data = make_grey_video(values, codec="hevc", pix_fmt="gray12le", gop=4)
    info = probe(data)
    pts, keys = info.pts, info.keyframes.astype(np.int64)
    assert keys.tolist() == [0, 4, 8, 12, 16]
    for frames, seeks in (([1, 9, 10, 17], 3), ([5, 6, 7, 8], 1), ([19], 1)):
        decoded = decode_depth(data, np.asarray(frames), pts, keys, where="ep cam")
        got, calls = decoded.frames, decoded.calls
        assert got.dtype == torch.uint16 and np.array_equal(got[:, 0].numpy(), values[frames]) and calls == seeks


def test_depth_segments_of_a_shared_file_are_cut_and_read_exactly(tmp_path):
    """LeRobot v3.0 layout: two episodes in one 12-bit HEVC depth file (keyframe every 4), starts off-keyframe."""
    lengths, starts = [9, 11], [0, 9]
    values = _depth_values(1, sum(lengths), 4095)
    video = make_grey_video(values, codec="hevc", pix_fmt="gray12le", fps=FPS, gop=4)
    eps = [
        Episode(
            source="v3",
            episode_index=i,
            table=make_episode_table(n, fps=FPS),
            fps=FPS,
            videos={DEPTH: CameraVideo(video, segment=(s / FPS, (s + n) / FPS), depth=True)},
        )
        for i, (n, s) in enumerate(zip(lengths, starts, strict=False))
    ]
    manifest = convert([Source("v3", eps, FPS)], str(tmp_path), _opts())
    assert manifest.cameras[DEPTH].kind == "depth"
    samples = _iterate(str(tmp_path), WindowSpec(cameras={DEPTH: (0, 1, 4)}))
    assert len(samples) == sum(n - 4 for n in lengths)
    for s in samples:
        first = starts[s["episode_index"]] + s["frame_index"]
        assert np.array_equal(s[DEPTH][:, 0].numpy(), values[[first, first + 1, first + 4]])


def test_depth_decode_reads_the_stream_the_index_names():
    """A file whose first video stream is not the depth one (e.g. a preview or cover): the index's
    ``stream_index`` decides, never ``streams.video[0]``."""
    import av

    from epishard.stream.decode import decode_depth

    values = _depth_values(3, 12, 4095, 8, 8)
    buf = BytesIO()
    with av.open(buf, "w", format="matroska") as container:
        decoy = container.add_stream("ffv1", rate=FPS)
        decoy.width, decoy.height, decoy.pix_fmt = 8, 8, "gray16le"
        depth = container.add_stream("ffv1", rate=FPS, options={"g": "4"})
        depth.width, depth.height, depth.pix_fmt = 8, 8, "gray16le"
        for i, plane in enumerate(values):
            for stream, image in ((decoy, np.full_like(plane, 7)), (depth, plane)):
                frame = av.VideoFrame.from_ndarray(image.astype(np.uint16), format="gray16le")
                frame.pts, frame.time_base = i, Fraction(1, FPS)
                container.mux(stream.encode(frame))
        for stream in (decoy, depth):
            container.mux(stream.encode(None))
    data = buf.getvalue()
    with av.open(BytesIO(data)) as container:
        pts = np.asarray([f.pts for f in container.decode(container.streams[1])], dtype=np.int64)
    keys = np.arange(0, values.shape[0], 4, dtype=np.int64)
    got = decode_depth(data, np.asarray([2, 5, 11]), pts, keys, where="ep cam", stream_index=1).frames
    assert np.array_equal(got[:, 0].numpy(), values[[2, 5, 11]])
