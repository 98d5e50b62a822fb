"""``WindowIndex`` lookups on a hand-made index (no videos): the vectorised forms agree with the
one-stream forms and with values worked out by hand.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from epishard.format.index import WindowIndex


def _camera(name: str, member: int, keyframes: list[int], row_to_frame: list[int], first_frame: int = 0) -> dict:
    return {
        "name": name,
        "member": member,
        "codec": "h264",
        "width": 32,
        "height": 24,
        "rotation": 0,
        "stream_index": 0,
        "pix_fmt": "yuv420p",
        "time_base_num": 1,
        "time_base_den": 15360,
        "num_frames": 20,
        "pts_start": 0,
        "pts_step": 512,
        "pts": [],
        "duration": [],
        "keyframes": keyframes,
        "first_frame": first_frame,
        "row_to_frame": row_to_frame,
        "transform": "copy",
        "kind": "rgb",
    }


def _episode(key: str, members: list[str], cameras: list[dict], task: str) -> dict:
    offset, listed = 512, []
    for i, name in enumerate(members):
        listed.append({"name": f"{key}.{name}", "offset": offset, "size": 100 + i, "sha256": f"{i:064x}"})
        offset += 1024
    return {
        "key": key,
        "source": "hand",
        "episode_index": int(key[-1]) + 10,
        "num_rows": 10,
        "fps": 30.0,
        "task": task,
        "tasks": [task, "other"],
        "robot": "",
        "members": listed,
        "cameras": cameras,
        "window_start": 0,
        "window_stop": 10,
        "segment_starts": [],
    }


@pytest.fixture(scope="module")
def index() -> WindowIndex:
    shifted = list(range(3, 13))  # a cut: row r shows frame r + 3, written as an explicit map
    return WindowIndex.from_rows(
        [
            # Episode 0: the table member after the videos (any position: the name decides).
            _episode("hand-e0", ["json", "front.mp4", "parquet"], [_camera("front", 1, [0, 5, 9], [])], "pick"),
            _episode(
                "hand-e1",
                ["json", "parquet", "front.mp4", "wrist.mp4"],
                [_camera("front", 2, [0, 4], shifted), _camera("wrist", 3, [0, 8], [], first_frame=2)],
                "place",
            ),
        ]
    )


def test_episode_columns_and_members(index):
    assert index.episode_index.tolist() == [10, 11] and index.tasks() == ["pick", "place"]
    assert index.task(1) == "place" and index.episode_tasks(0) == ["pick", "other"] and index.source(1) == "hand"
    assert index.data_member(0) == 2 and index.data_member(np.array([1, 0])).tolist() == [4, 2]
    assert index.members(1).tolist() == [3, 4, 5, 6]
    start, stop = index.member_ranges(np.array([2, 4]))
    assert start.tolist() == [512 + 2048, 512 + 1024] and (stop - start).tolist() == [102, 101]
    assert index.member_sha256.take([4]).to_pylist() == [f"{1:064x}"]
    assert index.stream_member.tolist() == [1, 5, 6]  # flat members of the three video streams
    assert index.time_base(2) == Fraction(1, 15360) and index.keyframes_of(2).tolist() == [0, 8]
    assert index.row(1)["cameras"][0]["row_to_frame"] == list(range(3, 13))


def test_camera_streams_of_all_or_some_episodes(index):
    assert index.camera_streams("front").tolist() == [0, 1]
    assert index.camera_streams("wrist", np.array([1, 1])).tolist() == [2, 2]
    with pytest.raises(KeyError, match=r"episode 0 \(hand-e0\) has no camera 'wrist'"):
        index.camera_streams("wrist")


def test_frames_and_keyframes_vectorised_equal_one_stream_at_a_time(index):
    streams = np.array([0, 1, 2])
    rows = np.array([[0, 4, 9], [0, 1, 6], [0, 5, 7]])
    frames = index.frames(streams[:, None], rows)
    assert frames.tolist() == [[0, 4, 9], [3, 4, 9], [2, 7, 9]]
    assert frames.tolist() == [index.frames(int(s), r).tolist() for s, r in zip(streams, rows, strict=True)]
    keys = index.keyframe_before(streams[:, None], frames)
    assert keys.tolist() == [[0, 0, 9], [0, 4, 4], [0, 0, 8]]
    assert keys.tolist() == [index.keyframe_before(int(s), f).tolist() for s, f in zip(streams, frames, strict=True)]
    assert index.keyframe_before(0, 8) == 5 and index.keyframe_before(0, 9) == 9
    # 0..0 from key 0; 4 decoded on from 1 (no keyframe in 1..4); 9 is a keyframe: a seek, 1 frame.
    assert index.decoded_frames(streams, frames).tolist() == [1 + 4 + 1, 4 + 1 + 5, 3 + 5 + 2]
    assert int(index.decoded_frames(0, np.array([6, 6, 7]))) == 3  # from keyframe 5; a duplicate costs nothing
    assert index.decoded_frames(streams, np.zeros((3, 0), np.int64)).tolist() == [0, 0, 0]
