"""`epishard preview`: the windows drawn are the reader's (frame identity read back from the pixels),
labelled with the right rows, frame numbers and pad masks; the page inlines every contact sheet and
loads in a real headless Chromium without console errors."""

from __future__ import annotations

import base64
import os
import re
import struct

import numpy as np
import pytest
from chromium import find_browser, load_page
from conftest import SAMPLE
from lerobotgen import write_v2
from videogen import decode_frame_number

from epishard.cli import main
from epishard.shardwriter import ConvertOptions, convert

pytest.importorskip("matplotlib")
from epishard.stream.preview import preview

CAMERA = "observation.images.front"
BROWSER = find_browser()
needs_browser = pytest.mark.skipif(
    BROWSER is None, reason="no headless Chromium (Debian: apt-get install chromium; `make setup` installs it)"
)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> str:
    """3 episodes of 12, 9, 20 rows at 10 fps, one 32x32 camera; episode e's frame i shows 1000 e + i."""
    src = str(tmp_path_factory.mktemp("src") / "toy")
    write_v2(src, [12, 9, 20], [CAMERA], fps=10)
    out = str(tmp_path_factory.mktemp("converted") / "ds")
    convert([src], out, ConvertOptions(max_episodes_per_shard=2, progress=False))
    return out


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_windows_show_the_frames_rows_and_pads_they_say(converted, tmp_path):
    result = preview(converted, str(tmp_path / "p.html"), windows=6, frames=4, span=10, action_horizon=5)
    # Round robin over the 3 episodes: 2 windows each.
    assert sorted(w.key[-7:] for w in result.shown) == [
        "e000000",
        "e000000",
        "e000001",
        "e000001",
        "e000002",
        "e000002",
    ]
    offsets = np.array([-9, -6, -3, 0])  # 4 frames spread over the 10 rows ending at the anchor
    for w in result.shown:
        episode = int(w.key[-6:])
        rows, frames, pad = w.rows[CAMERA], w.frames[CAMERA], w.sample[f"{CAMERA}_is_pad"].numpy()
        np.testing.assert_array_equal(pad, w.anchor + offsets < 0)  # boundary="pad": rows before 0 repeat row 0
        np.testing.assert_array_equal(rows, np.maximum(w.anchor + offsets, 0))
        np.testing.assert_array_equal(frames, rows)  # v2 videos: frame i is row i
        shown = [decode_frame_number(frame) for frame in w.sample[CAMERA]]
        assert shown == [1000 * episode + int(f) for f in frames]
        assert w.sample["observation.state"].shape[0] == 10 and w.sample["action"].shape[0] == 5
    assert len(result.sheets) == 6 and result.sheets_dir == str(tmp_path / "p_sheets")
    with open(result.html, encoding="utf-8") as f:
        page = f.read()
    inlined = [base64.b64decode(b) for b in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]
    assert inlined == [_read(p) for p in result.sheets]  # the page is self-contained
    assert all(_png_size(png)[0] > 300 for png in inlined)


def test_episode_selection(converted, tmp_path):
    result = preview(converted, str(tmp_path / "p.html"), episodes=frozenset({1}), windows=3, frames=2, span=4)
    assert [w.key[-7:] for w in result.shown] == ["e000001"] * 3
    assert len({w.anchor for w in result.shown}) == 3
    with pytest.raises(ValueError, match="--episodes selects no episode"):
        preview(converted, str(tmp_path / "q.html"), episodes=frozenset({7}))


@needs_browser
def test_the_page_check_sees_errors_and_broken_images(tmp_path):
    """The Chromium check itself: a page with a console error, an exception and a broken image fails it."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
        '<img src="data:image/png;base64,AAAA"><script>console.error("boom"); missing();</script></body></html>'
    )
    seen = load_page(str(bad), BROWSER)
    assert seen["images"] == [{"complete": True, "width": 0, "height": 0}]
    assert seen["problems"][0] == "console.error: boom" and "missing is not defined" in seen["problems"][1]


@needs_browser
def test_preview_of_the_bundled_sample_in_headless_chromium(tmp_path):
    out = str(tmp_path / "ds")
    convert([str(SAMPLE)], out, ConvertOptions(episodes=frozenset({0, 1}), progress=False))
    page = str(tmp_path / "report.html")
    assert main(["preview", out, "--windows", "3", "--out", page, "-q"]) == 0
    sheets = sorted(os.listdir(tmp_path / "report_sheets"))
    assert sheets == ["window-000.png", "window-001.png", "window-002.png"]
    sizes = [_png_size(_read(tmp_path / "report_sheets" / s)) for s in sheets]
    seen = load_page(page, BROWSER)
    assert seen["problems"] == []
    assert seen["title"] == f"epishard preview: {out}"
    assert seen["images"] == [{"complete": True, "width": w, "height": h} for w, h in sizes]


def test_cli_errors_are_one_line(converted, tmp_path, capsys):
    page = str(tmp_path / "p.html")
    assert main(["preview", converted, "--episodes", "7", "--out", page]) == 2
    assert capsys.readouterr().err == (
        f"epishard preview: error: {converted}: --episodes selects no episode of the dataset (3 episodes)\n"
    )
    assert main(["preview", converted, "--windows", "0", "--out", page]) == 2
    assert capsys.readouterr().err.endswith("--windows, --frames and --span must be >= 1, got 0, 6, 30\n")
    assert not os.path.exists(page)
