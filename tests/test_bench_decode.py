"""``tools/bench/peers/decodelimit.py``'s GOP-aware decode limit and the ``decode`` scenario of ``tools/bench/run.py``
(decoder open cost).

The GOP count is checked against ``WindowIndex.decoded_frames`` (the reader's own count) on made-up
keyframe tables; the real-data checks skip when ../shared/data is absent.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import REPO, SHARED_DATA, shared_dataset

sys.path.insert(0, str(REPO / "tools" / "bench"))


def _reader_count(keys: np.ndarray, first: int, n: int, frames_in_video: int) -> int:
    """Frames decoded over every anchor, by ``WindowIndex.decoded_frames`` on a one-stream stub."""
    from peers.config import SPAN, STEP

    from epishard.shardwriter import WindowIndex

    stub = SimpleNamespace(keyframes=keys, key_offsets=np.array([0, keys.size]))
    stub.keyframe_before = lambda s, f: WindowIndex.keyframe_before(stub, s, f)
    total = 0
    for a in range(n):
        f = np.unique(np.minimum(first + np.minimum(a + np.arange(0, SPAN, STEP), n - 1), frames_in_video - 1))
        total += int(WindowIndex.decoded_frames(stub, 0, f))
    return total


@pytest.mark.parametrize("gop", [1, 2, 5, 12, 40, 250])
def test_gop_count_is_the_readers_decoded_frames(gop):
    from peers.decodelimit import decoded_cost

    rng = np.random.default_rng(gop)
    frames_in_video = 700
    key = np.zeros(frames_in_video, dtype=bool)
    key[::gop] = True
    key[rng.integers(0, frames_in_video, 3)] = True  # irregular keyframes too (episode starts)
    key[0] = True
    ones = np.arange(frames_in_video + 1, dtype=np.float64)
    for first, n in ((0, 300), (137, 250), (650, 50), (10, 5)):
        expect = _reader_count(np.flatnonzero(key), first, n, frames_in_video)
        assert decoded_cost(first, n, key, ones) == expect
    # weights: all-ones cumsum is the count; doubling every weight doubles the cost
    assert decoded_cost(137, 250, key, 2 * ones) == 2 * decoded_cost(137, 250, key, ones)


def test_gop_limit_on_real_mpeg4_gop12():
    from peers.decodelimit import decode_limit

    root = shared_dataset("so101_bimanual_cloth_v30")
    d = decode_limit(root, cores=2)
    assert set(d["cameras"]) == {"observation.images.cam0", "observation.images.cam1"}
    for c in d["cameras"].values():
        (kt,) = c["keyframes"].values()
        assert kt["codec"] == "mpeg4" and kt["frames"] == 1360 and kt["keyframes"] == 115
        # 9 frames over 33 rows with a 12-frame GOP: ~33 frames decoded per sample, more than 9 distinct
        assert c["distinct_frames_per_sample"] < 9 < 30 < c["gop_frames_per_sample"] < 36
        assert kt["keyframe_decode_ms"] > 0 and kt["other_decode_ms"] > 0 and kt["rgb24_ms"] > 0
        assert 0.8 < c["gop_weighted_frames_per_sample"] / c["gop_frames_per_sample"] < 1.25
    assert 0 < d["samples_per_s_gop"] < d["samples_per_s"]
    g = d["cameras"]["observation.images.cam0"]
    rates = [c["ffmpeg_frames_per_cpu_s"] for c in d["cameras"].values()]
    assert d["samples_per_s_gop"] == pytest.approx(2 / sum(g["gop_frames_per_sample"] / r for r in rates))
    assert d["samples_per_s_gop_weighted"] > 0


def test_decode_limit_table_has_gop_columns_and_reads_old_records():
    from peers import summary
    from peers.runs import Dataset

    new = {
        "samples_per_s": 500.0,
        "samples_per_s_gop": 120.0,
        "samples_per_s_gop_weighted": 110.0,
        "cores": 2,
        "cameras": {
            "cam": {
                "distinct_frames_per_sample": 8.5,
                "ffmpeg_frames_per_cpu_s": 4000.0,
                "gop_frames_per_sample": 33.0,
                "gop_weighted_frames_per_sample": 34.0,
            }
        },
    }
    old = {
        "samples_per_s": 10.0,
        "cores": 2,
        "cameras": {"c": {"distinct_frames_per_sample": 8.0, "ffmpeg_frames_per_cpu_s": 100.0}},
    }
    ds = [Dataset("new", "", "v3.0", "", decode_limit=new), Dataset("old", "", "v3.0", "", decode_limit=old)]
    meta = {
        "machine": {"cpus": 2, "cpu": "x", "memory_gib": 1, "torch": "-", "torchcodec": "-"},
        "window": {"frames": 9, "span": 33, "action_horizon": 16},
        "epishard_options_ignored": [],
        "epishard_options_given": "",
        "started": "now",
        "command": "c",
        "load_min": 0.0,
        "load_max": 0.0,
        "seconds": 0.0,
        "batch_size": 8,
        "workers": 2,
        "warmup": 2,
        "seconds_timed": 10,
        "rounds": 1,
    }
    md = summary.markdown([], [], ds, meta)
    assert "| limit samples/s | GOP frames/sample | GOP-aware limit samples/s |" in md
    assert "| new | 2 | cam | 8.50 | 4000 | 500.0 | 33.00 | 120.0 | 34.00 | 110.0 |" in md
    assert "| old | 2 | c | 8.00 | 100 | 10.0 | - | - | - | - |" in md


def test_bench_decode_prints_both_tables(capsys):
    if not (SHARED_DATA / "video_edge_cases" / "torchcodec" / "h265_video.mp4").exists():
        pytest.skip("../shared/data is absent")
    import run

    assert run.main(["decode", "--repeats", "2", "--codecs", "hevc,mpeg4"]) == 0
    out = capsys.readouterr().out
    assert "Command: `python tools/bench/run.py decode --repeats 2 --codecs hevc,mpeg4`" in out
    rows = [line for line in out.splitlines() if line.startswith("| mpeg4 |") or line.startswith("| hevc |")]
    assert len(rows) == 6  # one open row and two RGB rows (sws threads 1, auto) per codec
    assert "| mpeg4 | 224x224 | 348 |" in out
