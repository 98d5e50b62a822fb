"""The command line people meet: help that answers at once (no heavy import), says every default in
plain text, -q/-v, summaries, `stream`'s steps per epoch and time to the first batch, `stream --plot`."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys

import pytest
from lerobotgen import write_v2

from epishard.cli import COMMANDS, build_parser, main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAMERA = "observation.images.front"
HEAVY = ("torch", "torchcodec", "pyarrow", "av", "numpy", "matplotlib", "fsspec")


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> str:
    """3 episodes of 12, 9, 10 rows at 10 fps, one 32x32 camera, converted into 2 shards."""
    src = str(tmp_path_factory.mktemp("src") / "toy")
    write_v2(src, [12, 9, 10], [CAMERA], fps=10)
    out = str(tmp_path_factory.mktemp("converted") / "ds")
    assert main(["convert", src, out, "--quiet", "--max-episodes-per-shard", "2"]) == 0
    return out


def _imported_by(*argv: str) -> tuple[int, list[str], str]:
    """Exit status, the heavy modules loaded and stderr of `epishard ARGV` in a fresh interpreter."""
    code = (
        "import sys\nfrom epishard.cli import main\n"
        f"try:\n    rc = main({list(argv)!r})\nexcept SystemExit as exc:\n    rc = exc.code\n"
        f"print(rc, [m for m in {HEAVY!r} if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=60
    )
    rc, _, heavy = done.stdout.strip().splitlines()[-1].partition(" ")
    return int(rc), eval(heavy), done.stderr


@pytest.mark.parametrize(
    "argv, rc",
    [
        (["--help"], 0),
        (["--version"], 0),
        *[([name, "--help"], 0) for name in COMMANDS],
        (["convert"], 2),  # missing SRC and OUT
        (["stream", "ds", "--frames", "nine"], 2),
        (["verify", "ds", "--storage-options", "{not json"], 2),
        (["no-such-command"], 2),
    ],
)
def test_help_and_argument_errors_import_nothing_heavy(argv, rc):
    got, heavy, stderr = _imported_by(*argv)
    assert (got, heavy) == (rc, []), stderr
    if rc == 2:
        assert stderr.splitlines()[-1].startswith("epishard"), stderr


def _actions(parser):
    sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    yield "epishard", parser
    yield from sub.choices.items()


def test_every_option_has_plain_help_that_shows_its_default():
    for name, parser in _actions(build_parser()):
        text = parser.format_help()
        assert not re.search(r"``|:\w+:`|`_", text), f"{name}: reStructuredText markup in help:\n{text}"
        for action in parser._actions:
            if action.help == "==SUPPRESS==" or action.dest in ("help", "version", "command"):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest}: no help text"
            if not action.option_strings or action.nargs == 0:
                continue  # positionals and flags have no default to show
            shown = parser._get_formatter()._get_help_string(action) % {"default": action.default}
            assert "default" in shown, f"{name} {action.option_strings}: default not shown: {shown!r}"
            if action.default is not None:
                assert str(action.default) in shown, f"{name} {action.option_strings}: {shown!r}"


def test_convert_help_lists_defaults_as_plain_text(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for said in (
        "episodes per shard at most (default: 64)",
        "bytes per shard at most, e.g. 512MiB (default: 1GiB)",
        "parallel processes (default: 1)",
        "-q, --quiet",
        "-v, --verbose",
    ):
        assert said in text, text


def test_summary_lines_and_verbose_logging(converted, tmp_path, capsys):
    assert main(["verify", converted, "-v"]) == 0
    out, err = capsys.readouterr()
    assert re.fullmatch(rf"{re.escape(converted)}: 2 shards, 3 episodes, checked in [\d.]+ s: OK\n", out)
    assert err.splitlines() == [
        "epishard verify: shard-000000.tar: ok",
        "epishard verify: shard-000001.tar: ok",
    ]
    assert main(["-q", "verify", converted]) == 0
    assert capsys.readouterr().err == ""


def test_stream_says_steps_per_epoch_and_time_to_first_batch_and_plots(converted, tmp_path, capsys):
    png = tmp_path / "telemetry.png"
    argv = ["stream", converted, "--frames", "2", "--span", "3", "--action-horizon", "2", "--batch-size", "2"]
    assert main([*argv, "--batches", "3", "--workers", "0", "-v", "--plot", str(png)]) == 0
    out, err = capsys.readouterr()
    # Anchors: every row whose offsets 0..2 stay inside the episode: 10 + 7 + 8 = 25 windows, 13 batches of 2.
    assert "epishard stream: 13 steps per epoch (25 windows, batch size 2); running 3" in err.splitlines()
    assert any(
        re.fullmatch(r"epishard stream: first batch after [\d.]+ s \(setup [\d.]+ s\)", x) for x in err.splitlines()
    )
    lines = out.splitlines()
    assert "  epoch: 13 steps, 25 windows; 0 workers" in lines
    assert re.fullmatch(rf"{re.escape(converted)}: 6 samples in 3 batches, .* first batch after [\d.]+ s .*", lines[-1])
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", header[16:24]) == (1200, 360)
    assert main([*argv, "--batches", "0", "--workers", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["batches"], report["samples"], report["steps_per_epoch"]) == (13, 25, 13)


def test_package_progress_bars(converted, capsys):
    """The packages draw the bars the CLI turns on (on a terminal): verify, inspect and stream."""
    from epishard.shardwriter.describe import describe
    from epishard.shardwriter.verify import verify
    from epishard.stream.report import StreamRun, run

    verify(converted, decode=False, progress=True)
    assert "verify: 100%" in capsys.readouterr().err
    describe(converted, progress=True)
    assert "inspect: 100%" in capsys.readouterr().err
    run(StreamRun(converted, frames=2, span=3, action_horizon=2, batch_size=2, batches=2, workers=0), progress=True)
    err = capsys.readouterr().err
    assert "stream: 100%" in err and "13 steps per epoch" in err and "first batch after" in err


def test_rank_cost_plot(tmp_path):
    pytest.importorskip("matplotlib")
    import numpy as np

    from epishard.balance.plots import plot_rank_costs

    costs = np.random.default_rng(0).uniform(1, 10, size=(20, 4, 2))
    png = tmp_path / "ranks.png"
    plot_rank_costs({"random": costs, "sorted": np.sort(costs, axis=1)}, str(png), "test")
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", header[16:24]) == (1200, 640)
