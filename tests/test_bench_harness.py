"""``tools/bench/run.py``, the benchmark harness: ``--list`` names every scenario, and each fast scenario
runs under ``--smoke`` (the tiniest inputs) and writes its results as JSON lines and a markdown table.

A scenario whose input is absent (``../shared/data``, moto, a peer venv) says ``skip:`` and exits 0;
the slow or privileged ones (``peers``: ``tests/test_bench_peers.py`` runs its smoke run; ``ray``:
root and a Ray cluster; ``lerobot-default``: the LeRobot 0.6.1 venv) are only checked to parse.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

RUN = REPO / "tools" / "bench" / "run.py"
sys.path.insert(0, str(REPO / "tools" / "bench"))

from scenarios import SCENARIOS  # noqa: E402

PARSE_ONLY = ("peers", "ray", "lerobot-default")


def _run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RUN), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False
    )


def test_list_names_every_scenario():
    done = _run("--list")
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == list(SCENARIOS)
    assert _run("no-such-scenario").returncode == 2


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n not in PARSE_ONLY])
def test_scenario_smoke(name, tmp_path):
    out, md = tmp_path / "out.jsonl", tmp_path / "out.md"
    done = _run(name, "--smoke", "--out", str(out), "--markdown", str(md))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    if done.stdout.startswith("skip:"):
        pytest.skip(done.stdout.strip())
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records and all(r["scenario"] == name for r in records)


@pytest.mark.parametrize("name", PARSE_ONLY)
def test_slow_scenarios_parse(name):
    done = _run(name, "--help", timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()
