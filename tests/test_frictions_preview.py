"""Friction 11 of issue 22: ``preview`` draws the windows ``stream`` trains on, with named curves.

Frames carry their number (``videogen``); the dataset is 2 episodes of 12 and 9 rows.
"""

from __future__ import annotations

import numpy as np
import pytest
from videogen import convert_numbered, decode_frame_number

from epishard.cli import main as cli

pytest.importorskip("matplotlib")

CAM = "observation.images.cam"


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    return convert_numbered(tmp_path_factory.mktemp("frprev") / "ds", [12, 9], {CAM: dict(gop=3, height=32, width=32)})


def test_f11_preview_draws_the_stream_window_with_named_curves(small, tmp_path, capsys):
    import matplotlib.pyplot as plt

    from epishard.stream.preview import PreviewWindow, _curves, preview
    from epishard.stream.report import stream_spec

    spec = stream_spec([CAM], frames=3, span=5, action_horizon=4, state_history=2, boundary="pad")
    result = preview(small, str(tmp_path / "p.html"), windows=4, spec=spec)
    assert len(result.shown) == 4
    for w in result.shown:
        e, n = int(w.sample["episode_index"]), (12, 9)[int(w.sample["episode_index"])]
        rows = np.clip(w.anchor + np.array([0, 2, 4]), 0, n - 1)  # stream's frames: from the anchor on
        assert w.rows[CAM].tolist() == rows.tolist()
        assert [decode_frame_number(f) for f in w.sample[CAM]] == (100 * e + rows).tolist()
        assert w.sample["observation.state"].shape == (2, 4) and w.sample["action"].shape == (4, 3)
    # the CLI takes the stream's options
    argv = ["preview", small, "--window", "stream", "--frames", "3", "--span", "5", "--state-history", "2"]
    assert cli([*argv, "--windows", "2", "--out", str(tmp_path / "q.html")]) == 0
    assert "2 windows of" in capsys.readouterr().out
    # each dimension is a named curve (manifest names, else its index)
    w = result.shown[0]
    fig, ax = plt.subplots()
    names = {"observation.state": ["j1", "j2", "j3", "j4"]}
    _curves(ax, PreviewWindow(w.key, w.anchor, w.sample, w.rows, w.frames), spec, names)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["state[0] j1", "state[1] j2", "state[2] j3", "state[3] j4", "action[0]", "action[1]", "action[2]"]
    plt.close(fig)


def test_f11_the_training_windows_export_to_a_rerun_recording(small, tmp_path):
    pytest.importorskip("rerun")
    from rerun.chunk import RrdReader

    from epishard.stream.preview import export_rerun
    from epishard.stream.report import stream_spec

    spec = stream_spec([CAM], frames=3, span=5, action_horizon=4, state_history=2, boundary="pad")
    result = export_rerun(small, str(tmp_path / "w.rrd"), spec, windows=4)
    assert len(result.shown) == 4
    chunks = RrdReader(result.rrd).stream().to_chunks()
    images: dict[str, list] = {}
    for chunk in chunks:
        if chunk.entity_path.startswith(f"/window/{CAM}/"):
            batch = chunk.to_record_batch()
            windows = batch.column("window").to_pylist()
            buffers = batch.column(
                batch.schema.names[[n.endswith("Image:buffer") for n in batch.schema.names].index(True)]
            )
            for t, buf in zip(windows, buffers.to_pylist(), strict=True):
                frame = np.frombuffer(bytes(buf[0]), np.uint8).reshape(32, 32, 3)
                images.setdefault(chunk.entity_path, []).append((t, decode_frame_number(frame)))
    for j in range(3):  # each frame position of each window holds the frame the reader returned there
        want = [(n, decode_frame_number(w.sample[CAM][j])) for n, w in enumerate(result.shown)]
        assert sorted(images[f"/window/{CAM}/{j}"]) == want
    entities = {c.entity_path for c in chunks}
    assert {"/state/0", "/state/3", "/action/0", "/action/2", "/window/info"} <= entities, entities


def test_f11_preview_rrd_on_the_command_line(small, tmp_path, capsys):
    pytest.importorskip("rerun")
    from rerun.chunk import RrdReader

    rrd = str(tmp_path / "cli.rrd")
    argv = ["preview", small, "--windows", "2", "--frames", "3", "--span", "5", "--out", str(tmp_path / "c.html")]
    assert cli([*argv, "--rrd", rrd]) == 0
    assert f"2 training windows in the Rerun recording {rrd}" in capsys.readouterr().out
    assert any(c.entity_path == f"/window/{CAM}/2" for c in RrdReader(rrd).stream().to_chunks())


@pytest.mark.parametrize("how", [["--window", "stream"], ["--rrd"]], ids=["window-stream", "rrd"])
def test_the_stream_window_works_with_the_default_options(small, tmp_path, capsys, how):
    """``preview DS --window stream`` and ``--rrd FILE`` with no other option draw ``epishard stream``'s window
    (9 frames over 33 rows); 6 frames without a span take the next span they spread over (36 rows)."""
    from epishard.cli.preview import stream_window_size

    if how == ["--rrd"]:
        pytest.importorskip("rerun")
        how = ["--rrd", str(tmp_path / "d.rrd")]
    assert cli(["preview", small, *how, "--windows", "2", "--out", str(tmp_path / "d.html")]) == 0
    assert "2 windows of" in capsys.readouterr().out
    assert stream_window_size(None, None) == (9, 33) and stream_window_size(6, None) == (6, 36)
    assert stream_window_size(1, None) == (1, 33) and stream_window_size(3, 5) == (3, 5)


def test_stream_and_preview_take_a_dataset_without_action(tmp_path, capsys):
    """A UMI conversion has no ``action`` column (its default mapping): ``stream`` and ``preview`` draw the
    window without it (not ``action_key asks for column 'action'``)."""
    pytest.importorskip("zarr")
    from test_sources_zarr import write_umi

    from epishard.shardwriter import ConvertOptions, convert
    from epishard.stream.report import stream_spec

    write_umi(tmp_path / "umi.zarr", [6, 5])
    out = str(tmp_path / "out")
    convert([str(tmp_path / "umi.zarr")], out, ConvertOptions(progress=False))
    manifest = __import__("json").loads((tmp_path / "out" / "manifest.json").read_text())
    assert "action" not in manifest["stats"]  # the case: no action column
    argv = ["stream", out, "--frames", "2", "--span", "3", "--batches", "2", "--batch-size", "2", "--workers", "0"]
    assert cli([*argv, "--quiet"]) == 0, capsys.readouterr().err
    assert cli(["preview", out, "--window", "stream", "--windows", "2", "--out", str(tmp_path / "p.html")]) == 0
    assert cli(["preview", out, "--windows", "2", "--out", str(tmp_path / "q.html")]) == 0
    spec = stream_spec(["c"], 2, 3, 4, columns={"observation.state"})
    assert (spec.action_key, spec.action_horizon, spec.state_key) == (None, 0, "observation.state")
