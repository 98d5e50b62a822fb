"""Frictions of issue 22 on the command line (and the API calls behind it), part 3.

Each test names its friction. The CLI runs in-process (``epishard.cli.main``); a LeRobot folder is
written by ``lerobotgen`` (frames carry their number, ``videogen``).
"""

from __future__ import annotations

import argparse

import pytest
from lerobotgen import write_v2

from epishard.cli import main as cli

CAM = "observation.images.front"


@pytest.fixture(scope="module")
def lerobot(tmp_path_factory) -> str:
    """A LeRobot v2.1 folder: 2 episodes (5 and 4 rows), one camera, state 4, action 3."""
    root = str(tmp_path_factory.mktemp("frcli") / "raw")
    write_v2(root, [5, 4], [CAM])
    return root


# --- 8. a LeRobot folder or repo id where a converted dataset is expected ------------------------------------


@pytest.mark.parametrize("command", ["verify", "inspect", "stream", "preview"])
def test_f8_commands_given_a_lerobot_folder_say_to_convert_it(lerobot, command, capsys, tmp_path):
    extra = {"stream": ["--batches", "1", "--workers", "0"], "preview": ["--out", str(tmp_path / "p.html")]}
    assert cli([command, lerobot, *extra.get(command, [])]) == 2  # an error, not damage (verify's 1)
    err = capsys.readouterr().err
    assert err.startswith(f"epishard {command}: error: {lerobot}: this is a LeRobot v2.1 dataset (meta/info.json)"), err
    assert f"run epishard convert {lerobot} OUT first" in err and "EpishardLeRobotDataset" in err, err


def test_f8_a_hub_repo_id_and_the_api_say_to_convert(lerobot, capsys):
    from epishard.format.opening import NotConverted
    from epishard.shardwriter.describe import describe
    from epishard.shardwriter.verify import verify
    from epishard.stream import WindowDataset, WindowSpec

    assert cli(["verify", "lerobot/svla_so101_pickplace"]) == 2
    err = capsys.readouterr().err
    said = "lerobot/svla_so101_pickplace: no such folder here; if it is the Hugging Face repo id of a LeRobot dataset"
    assert said in err, err
    assert "run epishard convert hf://datasets/lerobot/svla_so101_pickplace OUT first" in err, err
    for call in (lambda: WindowDataset(lerobot, WindowSpec()), lambda: verify(lerobot), lambda: describe(lerobot)):
        with pytest.raises(NotConverted, match=r"this is a LeRobot v2\.1 dataset"):
            call()
    # an empty folder is still "no manifest", not a LeRobot dataset
    assert not isinstance(_error(lambda: WindowDataset(lerobot + "/meta", WindowSpec())), NotConverted)


def _error(call) -> BaseException:
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("no error")


# --- 7. option prefixes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["inspect", "verify", "stream"])
def test_a_missing_local_folder_is_named_as_missing(command, tmp_path, capsys):
    """Not "no manifest.json in ...": the folder is not there (a typo), and every command says so."""
    from epishard.stream import WindowDataset, WindowSpec

    missing = str(tmp_path / "no" / "such")
    assert cli([command, missing]) == 2
    assert capsys.readouterr().err.strip().endswith(f"error: {missing}: no such dataset folder")
    with pytest.raises(FileNotFoundError, match="no such dataset folder"):
        WindowDataset(missing, WindowSpec())


@pytest.mark.parametrize("command", ["stream", "preview"])
@pytest.mark.parametrize("frames", ["0", "-3", "two"])
def test_fewer_than_one_frame_is_refused_before_anything_is_read(command, frames, tmp_path, capsys):
    """``stream --frames 0`` streamed one frame per window, silently; argparse refuses it now."""
    with pytest.raises(SystemExit) as exit_:
        cli([command, str(tmp_path / "missing"), "--frames", frames])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    want = f"{frames} frames per camera: must be >= 1"
    if frames == "two":
        want = f"{frames!r} is not a whole number of frames"
    assert f"argument --frames: {want}" in err, err


def test_stream_spec_refuses_fewer_than_one_frame():
    from epishard.stream.report import stream_spec

    with pytest.raises(ValueError, match=r"frames per camera \(--frames\) must be >= 1, not 0"):
        stream_spec(["cam"], frames=0, span=33, action_horizon=16)
    assert stream_spec(["cam"], frames=1, span=33, action_horizon=16).cameras == {"cam": (0,)}


def test_f7_an_abbreviated_option_is_refused_on_every_command(lerobot, tmp_path, capsys):
    from epishard.cli import build_parser

    out = str(tmp_path / "out")
    with pytest.raises(SystemExit) as exit_:
        cli(["convert", lerobot, out, "--max-episodes", "2"])  # ran as --max-episodes-per-shard 2
    assert exit_.value.code == 2 and "unrecognized arguments: --max-episodes 2" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    checked = 0
    for name, command in subparsers.choices.items():
        options = {o for a in command._actions for o in a.option_strings if o.startswith("--")}
        for option in sorted(options):
            prefix = option[:-1]
            if any(o.startswith(prefix) for o in options - {option}) or len(prefix) < 4:
                continue  # ambiguous either way, or too short to be a prefix someone types
            positionals = {"convert": [lerobot, out], "stream": [out], "inspect": [out], "verify": [out]}
            with pytest.raises(SystemExit):
                parser.parse_args([name, *positionals.get(name, [out]), prefix])
            assert f"unrecognized arguments: {prefix}" in capsys.readouterr().err, (name, prefix)
            checked += 1
    assert checked > 40  # every command's options (convert alone has more than 15)


# --- 9. inspect lists the state and action features and their widths -----------------------------------------


def _robots(out: str, cameras: dict[str, list[str]], dims: dict[str, tuple[int, int]], fps: int = 20) -> str:
    """One 5-row episode per source (name -> cameras), state/action widths per source; returns ``out``."""
    from videogen import make_episode_table, make_video

    from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert

    sources = [
        Source(
            name=name,
            episodes=[
                Episode(
                    source=name,
                    episode_index=0,
                    table=make_episode_table(5, fps=fps, state_dim=dims[name][0], action_dim=dims[name][1]),
                    videos={c: CameraVideo(make_video(None, 5, fps=fps, height=32, width=32, gop=2)) for c in cams},
                    fps=fps,
                )
            ],
            fps=fps,
        )
        for name, cams in cameras.items()
    ]
    convert(sources, out, ConvertOptions(progress=False))
    return out


def test_f9_inspect_lists_the_columns_and_their_widths_per_source(tmp_path, capsys):
    out = _robots(str(tmp_path / "two"), {"arm": [CAM], "g1": [CAM]}, {"arm": (4, 3), "g1": (6, 5)})
    assert cli(["inspect", out]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  column observation.state: float [4], width by source: arm 4, g1 6" in lines, lines
    assert "  column action: float [3], width by source: arm 3, g1 5" in lines, lines
    assert "  column frame_index: int64 []" in lines, lines
    assert cli(["inspect", out, "--json"]) == 0
    import json

    columns = json.loads(capsys.readouterr().out)["columns"]
    assert columns["observation.state"] == {
        "dtype": "float",
        "shape": [4],
        "names": None,
        "widths": {"arm": 4, "g1": 6},
    }
    assert CAM not in columns and columns["timestamp"]["shape"] == []


# --- 3. two robots converted into one output --------------------------------------------------------------------


def test_f3_two_robots_in_one_output_are_warned_at_convert_and_named_when_streamed(tmp_path, capsys):
    from epishard.format.manifest import Manifest
    from epishard.stream import WindowDataset, WindowSpec

    raw = tmp_path / "raw"
    cams = {"arm": [CAM, "observation.images.wrist"], "g1": ["observation.images.head"]}
    out = _robots(str(tmp_path / "two"), cams, {"arm": (4, 3), "g1": (6, 5)})
    manifest = Manifest.load((tmp_path / "two" / "manifest.json").read_bytes(), "manifest.json")
    assert dict(manifest.report.warnings_by_kind) == {"sources_cameras_differ": 1}
    (warning,) = manifest.report.warnings
    want = "arm: observation.images.front, observation.images.wrist; g1: observation.images.head"
    assert f"the sources have different cameras ({want})" in warning.message
    with pytest.raises(KeyError) as err:  # was "index.arrow: episode 1 (g1-e000000) has no camera ...": damage
        WindowDataset(out, WindowSpec(cameras={CAM: (0,)}))
    assert f"reads camera {CAM!r}, but this dataset holds sources with different cameras ({want})" in str(err.value)
    # the CLI prints the counted warning; sources of one robot (same cameras and rate) get none
    write_v2(str(raw / "a"), [4], [CAM])
    write_v2(str(raw / "b"), [3], [CAM], fps=30)
    assert cli(["convert", str(raw / "a"), str(raw / "b"), str(tmp_path / "ab"), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "warning x1 sources_fps_differ: the sources have different frame rates (a: 20 fps; b: 30 fps)" in printed
    assert "sources_cameras_differ" not in printed
    same = _robots(str(tmp_path / "same"), {"x": [CAM], "y": [CAM]}, {"x": (4, 3), "y": (6, 5)})
    assert Manifest.load((tmp_path / "same" / "manifest.json").read_bytes(), same).report.warnings == ()


# --- 12. black or constant cameras ---------------------------------------------------------------------------


def _solid(n: int, value: int, fps: int = 20) -> bytes:
    """An H.264 MP4 of ``n`` 32x32 frames, every pixel grey ``value`` (0: black), a keyframe every 2 frames."""
    import io
    from fractions import Fraction

    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps, options={"g": "2", "bf": "0"})
        stream.width = stream.height = 32
        stream.pix_fmt = "yuv420p"
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), value, np.uint8), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buf.getvalue()


def test_f12_black_and_constant_cameras_are_counted_notes_at_convert_and_in_verify(tmp_path, capsys):
    from videogen import make_episode_table, make_video

    from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert

    videos = {"black": _solid(6, 0), "grey": _solid(6, 128), "moving": make_video(None, 6, height=32, width=32, gop=2)}
    episodes = [
        Episode(
            source="s", episode_index=0, table=make_episode_table(6), videos={CAM: CameraVideo(videos["black"])}, fps=20
        ),
        Episode(
            source="s", episode_index=1, table=make_episode_table(6), videos={CAM: CameraVideo(videos["grey"])}, fps=20
        ),
        Episode(
            source="s",
            episode_index=2,
            table=make_episode_table(6),
            videos={CAM: CameraVideo(videos["moving"])},
            fps=20,
        ),
    ]
    out = str(tmp_path / "ds")
    manifest = convert([Source(name="s", episodes=episodes, fps=20)], out, ConvertOptions(progress=False))
    assert dict(manifest.report.warnings_by_kind) == {"camera_black": 1, "camera_constant": 1}
    got = {(w.kind, w.episode, w.camera) for w in manifest.report.warnings}
    assert got == {("camera_black", 0, CAM), ("camera_constant", 1, CAM)}
    black = next(w for w in manifest.report.warnings if w.kind == "camera_black")
    assert black.message == "every frame sampled (frames 0, 2, 4, 5) is black: did the camera record?"
    off = convert(
        [Source(name="s", episodes=episodes, fps=20)],
        str(tmp_path / "off"),
        ConvertOptions(progress=False, check="off"),
    )
    assert off.report.warnings == ()  # check "off" decodes nothing
    assert cli(["verify", out]) == 0  # notes, not damage
    printed = capsys.readouterr().out
    assert "  note x1 camera_black: e.g. shard=shard-000000.tar episode=s-e000000 camera=" in printed, printed
    assert "  note x1 camera_constant: e.g. shard=shard-000000.tar episode=s-e000001 camera=" in printed, printed
    assert printed.rstrip().endswith(": OK")


def test_f12_the_real_cloth_dataset_episode_0_cam0_is_black(tmp_path):
    from conftest import shared_dataset

    from epishard.shardwriter import ConvertOptions, convert

    root = shared_dataset("so101_bimanual_cloth_v30")
    manifest = convert([str(root)], str(tmp_path / "cloth"), ConvertOptions(progress=False, episodes=frozenset({0, 1})))
    blank = {(w.kind, w.episode, w.camera) for w in manifest.report.warnings if w.kind.startswith("camera_")}
    assert blank == {("camera_black", 0, "observation.images.cam0")}


# --- 10. a v3.0 source over HTTP from a server that ignores Range -----------------------------------------------


def test_f10_v3_over_a_server_that_ignores_range_is_read_whole_with_a_note(tmp_path, monkeypatch):
    from lerobotgen import write_v3
    from remote_servers import serve_http

    from epishard.format import storage
    from epishard.shardwriter import ConvertOptions, convert

    write_v3(str(tmp_path / "v30"), [5, 4, 6], CAM)
    local = convert([str(tmp_path / "v30")], str(tmp_path / "local"), ConvertOptions(progress=False))
    monkeypatch.setattr(storage, "READ_BLOCK_BYTES", 512)  # files larger than a block, as real ones are
    server, base = serve_http(str(tmp_path), honour_range=False)  # python -m http.server's behaviour
    try:
        with pytest.warns(UserWarning, match=r"file-000\.mp4: the server ignores Range requests .* read whole"):
            got = convert([f"{base}/v30"], str(tmp_path / "http"), ConvertOptions(progress=False))
    finally:
        server.shutdown()
    (note,) = [n for n in got.sources[0].notes if "Range" in n]
    assert note.startswith("the server ignores Range requests (e.g. python -m http.server): 3 file(s) read whole"), note
    assert "meta/episodes/chunk-000/file-000.parquet" in note, note
    for shard in local.shards:  # the same shards, byte for byte, as from the local folder
        assert (tmp_path / "http" / shard.shard).read_bytes() == (tmp_path / "local" / shard.shard).read_bytes()
