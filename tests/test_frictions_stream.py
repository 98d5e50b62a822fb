"""Frictions of issue 22 on the reader side: what ``WindowDataset(...)`` refuses when it is made.

Each test names its friction (issue 22, part 3). Frames carry their number (``videogen``).
"""

from __future__ import annotations

import pytest
from videogen import convert_numbered, decode_frame_number

from epishard.stream import PostProcess, WindowDataset, WindowLoader, WindowSpec
from epishard.stream.select import Selection

CAM = "observation.images.cam"


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    """2 episodes (6 and 7 rows), one 32x32 camera; frame i of episode e shows 100 e + i."""
    return convert_numbered(tmp_path_factory.mktemp("fr") / "small", [6, 7], {CAM: dict(gop=2, height=32, width=32)})


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> str:
    """One episode of 5 rows, the camera 32 high and 48 wide; frame i shows i."""
    root = tmp_path_factory.mktemp("fr")
    return convert_numbered(root / "wide", [5], {CAM: dict(gop=2, height=32, width=48)}, step=100, name="wide")


# --- 5. an unknown column in delta_timestamps ------------------------------------------------------------


def test_f5_unknown_delta_timestamps_column_is_refused_at_construction_naming_key_and_columns(small):
    spec = WindowSpec.from_delta_timestamps({"next.reward": [0.0], "action": [0.0]}, 20)
    with pytest.raises(KeyError) as err:
        WindowDataset(small, spec)
    message = str(err.value)
    assert "column_offsets asks for column 'next.reward', which the dataset does not have" in message
    assert (
        "['action', 'episode_index', 'frame_index', 'index', 'observation.state', 'task_index', 'timestamp']" in message
    )
    # a camera named without the observation.images. prefix is a column to from_delta_timestamps: say so
    other = convert_numbered(small + "_cam", [3], {"cam": dict(gop=2, height=32, width=32)}, name="c")
    with pytest.raises(KeyError, match=r"'cam'.* it is a camera of the dataset .*camera_keys="):
        WindowDataset(other, WindowSpec.from_delta_timestamps({"cam": [0.0]}, 20))
    ok = WindowDataset(other, WindowSpec.from_delta_timestamps({"cam": [0.0]}, 20, camera_keys=("cam",)), seed=0)
    assert sorted(decode_frame_number(s["cam"][0]) for s in ok) == [0, 1, 2]


# --- 4. one camera of several sizes ----------------------------------------------------------------------


def test_f4_a_camera_of_several_sizes_without_size_is_refused_naming_camera_and_sizes(small, wide):
    spec = WindowSpec(cameras={CAM: (0,)})
    with pytest.raises(ValueError) as err:
        WindowLoader(WindowDataset([small, wide], spec), batch_size=4)
    with pytest.raises(ValueError, match="has frames of several sizes"):
        WindowDataset([small, wide], spec, batch_size=4)
    # Unbatched, samples of both sizes come out as they are.
    shapes = {(int(s["dataset"]), tuple(s[CAM].shape[-2:])) for s in WindowDataset([small, wide], spec, seed=0)}
    assert shapes == {(0, (32, 32)), (1, (32, 48))}
    message = str(err.value)
    assert f"camera {CAM!r} has frames of several sizes" in message, message
    assert "32x32 (episode gen-e000000 of " in message and "32x48 (episode wide-e000000 of " in message, message
    assert "PostProcess(size=(height, width))" in message
    ds = WindowDataset([small, wide], spec, postprocess=PostProcess(size=(32, 32)), seed=0)
    got = sorted((int(s["dataset"]), decode_frame_number(s[CAM][0])) for s in ds)
    assert got == sorted(
        [(0, 100 * e + i) for e, n in enumerate([6, 7]) for i in range(n)] + [(1, i) for i in range(5)]
    )


# --- 6. a Selection that matches nothing -------------------------------------------------------------------


def test_f6_a_selection_that_matches_nothing_is_refused_naming_it(small, wide):
    spec = WindowSpec(cameras={CAM: (0,)})
    with pytest.raises(ValueError) as err:
        WindowDataset(small, spec, select=Selection(tasks="task 7", min_rows=7))
    message = str(err.value)
    assert message.startswith(f"select= matches no episode: {small}: Selection(tasks=['task 7'], min_rows=7)"), message
    assert "keeps none of its 2 episodes (tasks=['task 7']: 0; min_rows=7: 1)" in message, message
    with pytest.raises(
        ValueError, match=r"episodes=\[5, 6\], split='val', val_fraction=0.1\) keeps none .*episodes=\[5, 6\]: 0"
    ):
        WindowDataset(small, spec, select=Selection(episodes=[5, 6], split="val"))
    with pytest.raises(ValueError, match=r"all of them together: 2, none left in the 'val' split"):
        WindowDataset(small, spec, select=Selection(split="val", val_fraction=0.1))  # round(0.2) = 0 in val
    # per dataset (a list): each must keep an episode; one selection for a mix: warned where it keeps none
    sizes = PostProcess(size=(32, 32))
    with pytest.raises(ValueError, match=r"wide: Selection\(tasks=\['task 1'\]\) keeps none of its 1 episodes"):
        WindowDataset([small, wide], spec, postprocess=sizes, select=[None, Selection(tasks="task 1")])
    with pytest.warns(UserWarning, match=r"keeps no episode of a dataset of the mix.*wide: Selection\(tasks="):
        ds = WindowDataset([small, wide], spec, postprocess=sizes, select=Selection(tasks="task 1"), seed=0)
    assert sorted((int(s["dataset"]), decode_frame_number(s[CAM][0])) for s in ds) == [(0, 100 + i) for i in range(7)]
