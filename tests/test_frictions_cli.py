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
    from epishard.shardwriter.describe import NotConverted, describe
    from epishard.shardwriter.verify import verify
    from epishard.stream import WindowDataset, WindowSpec

    assert cli(["verify", "lerobot/svla_so101_pickplace"]) == 2
    err = capsys.readouterr().err
    assert "looks like the Hugging Face repo id of a LeRobot dataset" in err, err
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
