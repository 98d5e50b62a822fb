"""Write-time check levels (``convert --check full|fast|off``): same shards, counted in the report,
and a table the container mis-tells is caught at ``fast`` and redone as at ``full``."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from lerobotgen import write_v2
from videogen import cut_by_stream_copy, decode_frame_number, make_episode_table, make_video

from epishard.cli import main as cli
from epishard.format.errors import FormatError
from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Manifest, Source, convert, verify
from epishard.shardwriter import video as video_module
from epishard.stream import WindowDataset, WindowSpec

FPS = 20
CAMS = ("observation.images.front", "observation.images.wrist")


@pytest.fixture(scope="module")
def videos() -> list[tuple[bytes, list[int]]]:
    """(file bytes, frame number each displayed frame shows): B-frames, a mid-GOP cut whose edit list
    hides 7 packets, a 90-degree rotation."""
    cut, first = cut_by_stream_copy(make_video(None, 30, fps=FPS, gop=10, start_number=200), 17)
    return [
        (make_video(None, 24, fps=FPS, gop=8, start_number=100), list(range(100, 124))),
        (cut, list(range(200 + first, 230))),
        (make_video(None, 20, fps=FPS, gop=8, rotation=90, height=64, width=48), list(range(20))),
    ]


def _convert(out, videos, **opts):
    episodes = [
        Episode(
            source="lv",
            episode_index=e,
            table=make_episode_table(len(shown), fps=FPS),
            videos={cam: CameraVideo(data) for cam in CAMS},
            fps=FPS,
            tasks=("t",),
        )
        for e, (data, shown) in enumerate(videos)
    ]
    return convert([Source(name="lv", episodes=episodes, fps=FPS)], str(out), ConvertOptions(progress=False, **opts))


def _files(out) -> dict[str, object]:
    """Shards and index.arrow as bytes; each shard index's rows (its metadata records the check level)."""
    return {
        os.path.basename(p): pq.read_table(p).to_pylist() if p.endswith(".parquet") else Path(p).read_bytes()
        for p in sorted(glob.glob(f"{out}/*"))
        if "manifest" not in p
    }


def test_every_level_writes_the_same_shards_and_the_report_counts_its_videos(videos, tmp_path):
    for level in ("full", "fast", "off"):
        manifest = _convert(tmp_path / level, videos, check=level)
        assert manifest.report.checks == {level: 6}
        assert Manifest.load((tmp_path / level / "manifest.json").read_bytes(), "m").report.checks == {level: 6}
    assert _files(tmp_path / "full") == _files(tmp_path / "fast") == _files(tmp_path / "off")
    assert verify(str(tmp_path / "fast"))["ok"]
    for s in WindowDataset(str(tmp_path / "fast"), WindowSpec(cameras={CAMS[1]: (0,)}, boundary="pad"), seed=0):
        shown = videos[int(s["episode_index"])][1]
        assert decode_frame_number(s[CAMS[1]][0]) == shown[int(s["frame_index"])]


def _longer(real):
    """A container model that lists one frame more than the decoder shows (at the end)."""

    def model(rows, first_pts):
        pts, duration, keyflags, packet_pts, packet_key = real(rows, first_pts)
        return (
            np.append(pts, pts[-1] + duration[-1]),
            np.append(duration, duration[-1]),
            np.append(keyflags, False),
            (packet_pts),
            packet_key,
        )

    return model


def test_the_fast_check_sees_a_frame_the_decoder_does_not_show(videos, monkeypatch):
    data, shown = videos[0]
    assert video_module.scan(data, vouch=True).disagreement is None
    monkeypatch.setattr(video_module, "_packet_model", _longer(video_module._packet_model))
    told = video_module.scan(data, vouch=True)
    assert told.num_frames == len(shown) + 1
    assert "last group of pictures" in told.disagreement and f"the table lists {len(shown) + 1 - 16}" in (
        told.disagreement
    )
    assert video_module.scan(data).disagreement is None  # off: nothing decoded, nothing seen


def test_a_disagreement_at_fast_redoes_the_video_as_at_full(videos, tmp_path, monkeypatch):
    full = _convert(tmp_path / "full", videos[:1], check="full")
    monkeypatch.setattr(video_module, "_packet_model", _longer(video_module._packet_model))
    fast = _convert(tmp_path / "fast", videos[:1], check="fast")
    assert fast.report.checks == {"full": 2} and full.report.checks == {"full": 2}
    assert _files(tmp_path / "full") == _files(tmp_path / "fast")
    off = _convert(tmp_path / "off", videos[:1], check="off")  # trusted as told: verify finds the extra frame
    assert off.report.checks == {"off": 2}
    problems = verify(str(tmp_path / "off"))["problems"]
    assert len(problems) == 2  # one per camera: the extra frame, which the container does not list either
    assert all(
        p["message"] == "the index's num_frames 25 is more than the 24 frames the video's container lists"
        for p in problems
    )


def test_the_cli_takes_and_prints_the_level(tmp_path, capsys):
    write_v2(str(tmp_path / "src"), [12, 9], [CAMS[0]], fps=10)
    assert cli(["convert", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    assert "frame tables checked: fast x2" in capsys.readouterr().out
    assert cli(["convert", str(tmp_path / "src"), str(tmp_path / "out2"), "--check", "full"]) == 0
    assert "frame tables checked: full x2" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        cli(["convert", str(tmp_path / "src"), str(tmp_path / "out3"), "--check", "quick"])
    assert stop.value.code == 2
    assert "invalid choice: 'quick'" in capsys.readouterr().err


def test_decode_check_is_a_deprecated_spelling_of_a_level():
    with pytest.warns(DeprecationWarning, match="check='off'"):
        assert ConvertOptions(decode_check=False).check == "off"
    with pytest.warns(DeprecationWarning, match="check='full'"):
        assert ConvertOptions(decode_check=True).check == "full"
    with pytest.raises(ValueError, match="'full', 'fast', 'off'"):
        ConvertOptions(check="quick")  # type: ignore[arg-type]


def test_a_manifest_with_an_unknown_level_is_refused(videos, tmp_path):
    _convert(tmp_path, videos[:1])
    obj = json.loads((tmp_path / "manifest.json").read_text())
    assert obj["report"]["checks"] == {"fast": 2}
    obj["report"]["checks"] = {"quick": 2}
    with pytest.raises(FormatError, match="unknown check level 'quick'"):
        Manifest.load(json.dumps(obj).encode(), "manifest.json")
