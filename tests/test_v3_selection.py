"""A selection of a LeRobot v3.0 dataset (``--episodes``) is opened at the cost of the selection.

Only the selected rows of ``meta/episodes`` become Python objects (episodes, filled paths); the
rest is checked and looked up column by column. Counted here, not timed: a file of 2,000 episodes,
5 selected, builds 5 episodes through ``read_lerobot``, ``convert`` and the CLI alike, with the
whole dataset's notes and refusals.
"""

from __future__ import annotations

import pytest
from lerobotgen import write_v3

from epishard.cli import main as cli
from epishard.shardwriter import ConvertOptions, SourceError, convert, lerobot, read_lerobot

CAM = "observation.images.front"
PICK = frozenset({0, 7, 500, 1998, 1999})


@pytest.fixture(scope="module")
def two_thousand(tmp_path_factory) -> str:
    """A v3.0 dataset of 2,000 one-frame episodes, all in one data file and one video file."""
    src = str(tmp_path_factory.mktemp("v3-2000") / "src")
    write_v3(src, [1] * 2000, CAM, per_file=2000)
    return src


@pytest.fixture
def built(monkeypatch) -> dict[str, int]:
    """How many episodes and per-row video paths the v3.0 reader makes (counting wrappers)."""
    counts = {"episodes": 0, "video_paths": 0}
    episode, video_path = lerobot.Episode, lerobot._video_path

    def counting_episode(*args, **kwargs):
        counts["episodes"] += 1
        return episode(*args, **kwargs)

    def counting_video_path(*args, **kwargs):
        counts["video_paths"] += 1
        return video_path(*args, **kwargs)

    monkeypatch.setattr(lerobot, "Episode", counting_episode)
    monkeypatch.setattr(lerobot, "_video_path", counting_video_path)
    return counts


def test_reading_a_selection_builds_only_its_rows(two_thousand, built):
    source = read_lerobot(two_thousand, episodes=PICK | {5000})  # 5000: not in the dataset, left out
    assert built == {"episodes": 5, "video_paths": 1}  # one video file: its path is filled in once
    everything = read_lerobot(two_thousand)
    assert built["episodes"] == 5 + 2000
    assert source.episodes == [e for e in everything.episodes if e.episode_index in PICK]
    assert source.notes == everything.notes
    assert source.episodes[-1].table.start == 1999 and source.episodes[-1].videos[CAM].file_seconds == 2000 / 20


def test_convert_and_the_cli_open_only_the_selection(two_thousand, tmp_path, built):
    manifest = convert([two_thousand], str(tmp_path / "api"), ConvertOptions(progress=False, episodes=PICK))
    assert manifest.totals.episodes == 5 and built["episodes"] == 5
    assert cli(["convert", two_thousand, str(tmp_path / "cli"), "--quiet", "--episodes", "0-4"]) == 0
    assert built["episodes"] == 10
    assert (tmp_path / "api" / "shard-000000.tar").exists() and (tmp_path / "cli" / "manifest.json").exists()


def test_a_selection_of_none_of_its_episodes_names_them_all(two_thousand, tmp_path):
    with pytest.raises(SourceError) as info:
        convert([two_thousand], str(tmp_path / "out"), ConvertOptions(progress=False, episodes=frozenset({2000})))
    assert str(info.value) == (
        "no episodes to convert: none of --episodes is in the sources (episode indices src: 0-1999)"
    )
