"""Batch diversity figures (``stream.diversity``): exact values on tiny cases."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from epishard.stream import diversity


def test_measured_counts_distinct_episodes_and_shared_pairs():
    d = diversity.measured([[0, 0, 1, 1]])
    assert d.distinct == 2 and d.batches == 1 and d.batch_size == 4
    assert d.share == pytest.approx(4 / 12, abs=1e-15)  # 2 of the 6 pairs share an episode

    d = diversity.measured([[0, 1, 2, 3], [5, 5, 5, 5]])
    assert d.distinct == 2.5 and d.share == 0.5  # (0 + 1) / 2


def test_measured_takes_tuples_and_2d_rows_as_episode_ids():
    by_tuple = diversity.measured([[(0, 7), (1, 7), (0, 7)]])  # (dataset, episode): datasets 0 and 1 differ
    by_rows = diversity.measured([np.array([[0, 7], [1, 7], [0, 7]])])
    assert by_tuple == by_rows
    assert by_tuple.distinct == 2 and by_tuple.share == pytest.approx(1 / 3, abs=1e-15)


def test_measured_leaves_single_sample_batches_out_of_the_pair_mean():
    d = diversity.measured([[3], [1, 1]])
    assert d.distinct == 1.0 and d.share == 1.0 and d.batches == 2 and d.batch_size == 1.5
    assert math.isnan(diversity.measured([[3]]).share)


def test_iid_closed_form_on_tiny_cases():
    d = diversity.iid([1, 1], 2)  # (0,0) (0,1) (1,0) (1,1): 1, 2, 2, 1 distinct
    assert d.distinct == pytest.approx(1.5, abs=1e-15) and d.share == 0.5 and d.batches == 0

    d = diversity.iid([3, 1], 3)  # (1 - 1/4^3) + (1 - (3/4)^3), 9/16 + 1/16
    assert d.distinct == pytest.approx(2 - 28 / 64, abs=1e-15)
    assert d.share == pytest.approx(10 / 16, abs=1e-15)

    single = diversity.iid([5, 0], 8)  # an episode without windows never appears
    assert single.distinct == 1.0 and single.share == 1.0


def test_iid_equals_the_mean_over_every_equally_likely_batch():
    """Enumerate all 4^3 sequences of 3 windows drawn from 4 (episodes 0, 0, 1, 2): measuring them
    all gives the closed form exactly."""
    episode_of_window = [0, 0, 1, 2]
    batches = [[episode_of_window[w] for w in seq] for seq in itertools.product(range(4), repeat=3)]
    enumerated = diversity.measured(batches)
    closed = diversity.iid([2, 1, 1], 3)
    assert enumerated.distinct == pytest.approx(closed.distinct, abs=1e-12)
    assert enumerated.share == pytest.approx(closed.share, abs=1e-12)
    assert closed.distinct == pytest.approx((1 - 0.5**3) + 2 * (1 - 0.75**3), abs=1e-12)  # 2.03125


def test_iid_on_many_small_episodes_stays_exact():
    c = np.full(1_000_000, 2.0)  # p = 1e-6: 1 - (1 - p)^8 computed without cancellation
    d = diversity.iid(c, 8)
    assert d.distinct == pytest.approx(8 - 28e-6, rel=1e-9)  # B - C(B,2) p + O(p^2) per episode
    assert d.share == pytest.approx(1e-6, rel=1e-12)


def test_ratio_summary_and_merged_counts():
    m = diversity.measured([[0, 0, 1, 1]])
    ref = diversity.iid([1, 1, 1, 1], 4)  # 4 (1 - (3/4)^4) = 175/64
    assert diversity.ratio(m, ref) == pytest.approx(2 / (175 / 64), abs=1e-15)
    s = diversity.summary(m, ref)
    assert s["distinct_episodes_per_batch"] == 2 and s["distinct_episodes_per_batch_iid"] == pytest.approx(175 / 64)
    assert s["same_episode_pair_probability_iid"] == 0.25 and s["diversity_batches"] == 1
    assert diversity.merge_counts([(0, 1), (0, 2), (0, 1)], [3, 4, 5]).tolist() == [8.0, 4.0]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: diversity.measured([]), "no batch"),
        (lambda: diversity.measured([[]]), "empty batch"),
        (lambda: diversity.iid([0, 0], 8), "no window"),
        (lambda: diversity.iid([1, -1], 8), "negative"),
        (lambda: diversity.iid([1, 1], 0), "batch size"),
    ],
)
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_epishard_stream_reports_diversity_against_iid(tmp_path, capsys):
    """4 episodes, one window each per epoch, batches of 2: every batch holds 2 distinct episodes
    (share 0); i.i.d. draws of 2 from 4 equally likely windows give 4 (1 - (3/4)^2) = 1.75 and 1/4."""
    from lerobotgen import write_v2

    from epishard.cli import main

    src, out = str(tmp_path / "toy"), str(tmp_path / "ds")
    write_v2(src, [6, 7, 6, 8], ["observation.images.front"], fps=10)
    assert main(["convert", src, out, "--quiet"]) == 0
    capsys.readouterr()
    argv = ["stream", out, "--frames", "2", "--span", "3", "--action-horizon", "2", "--per-episode-count", "1"]
    assert main([*argv, "--batch-size", "2", "--batches", "0", "--workers", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["batches"] == 2 and report["diversity_batches"] == 2
    assert report["distinct_episodes_per_batch"] == 2 and report["same_episode_pair_probability"] == 0
    assert report["distinct_episodes_per_batch_iid"] == pytest.approx(1.75, abs=1e-12)
    assert report["same_episode_pair_probability_iid"] == pytest.approx(0.25, abs=1e-12)
    assert report["diversity_ratio"] == pytest.approx(2 / 1.75, abs=1e-12)
    assert main([*argv, "--batch-size", "2", "--batches", "0", "--workers", "0"]) == 0
    assert (
        "  batch diversity: 2.00 distinct episodes per batch (i.i.d. sampling: 1.75; ratio 1.14), "
        "two samples share an episode with p=0.000 (i.i.d.: 0.250)" in capsys.readouterr().out.splitlines()
    )
