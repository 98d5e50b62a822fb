"""Smoke run of ``tools/bench_peers.py`` on the bundled sample with the LeRobot peer absent.

Runs the command as users do (a subprocess), tiny: 2 timed batches, 1 warm-up, 1 round. Checks
that the missing peer is skipped with a line saying how to install it, that every other system
ran and returned the same window (frames, dtype, shape), and that the JSON lines and (with
matplotlib) the charts are written. Needs neither ../shared nor the peer venv.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from conftest import REPO, SAMPLE

SYSTEMS = ["lerobot", "webdataset", "naive", "es-f32", "es-u8"]


def test_bench_peers_smoke_on_sample_without_peers(tmp_path):
    peers = tmp_path / "peers"
    peers.mkdir()
    (peers / "lerobot_windows.py").write_text("")  # the harness is there, its venv is not
    out = tmp_path / "peers.jsonl"
    cmd = [
        sys.executable,
        str(REPO / "tools" / "bench_peers.py"),
        "--source",
        str(SAMPLE),
        "--systems",
        ",".join(SYSTEMS),
        "--batches",
        "2",
        "--warmup",
        "1",
        "--rounds",
        "1",
        "--out",
        str(out),
        "--charts",
        str(tmp_path / "charts"),
        "--work",
        str(tmp_path / "work"),
        "--peers-dir",
        str(peers),
        "--peer-venv",
        str(tmp_path / "no-venv"),
        "--timeout",
        "120",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=str(REPO))
    assert p.returncode == 0, p.stdout + p.stderr

    assert (
        "skip LeRobotDataset peer" in p.stdout and "setup_lerobot_venv.sh" in p.stdout and "--setup-peers" in p.stdout
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[0]["record"] == "run" and records[0]["batches"] == 2
    runs = {r["system"]: r for r in records if r["record"] == "run_result"}
    assert sorted(runs) == sorted(SYSTEMS[1:])
    for r in runs.values():
        assert r["samples"] > 0 and r["samples_per_s"] > 0 and r["rss_peak_mb"] > 0 and r["pss_peak_mb"] > 0
        (shape,) = r["shapes"].values()  # one camera: [batch, 9 frames, 3, 256, 256, dtype]
        assert shape[1:5] == [9, 3, 256, 256]
        assert shape[5] == ("uint8" if r["system"] == "es-u8" else "float32")
    assert runs["es-f32"]["timed"] == "one epoch" and runs["es-f32"]["frames_decoded_per_returned"] > 0
    ratios = {(r["system"], r["peer"]) for r in records if r["record"] == "ratio"}
    assert ("es-f32", "webdataset") in ratios and ("es-u8", "naive") in ratios
    assert "samples/s" in p.stdout and "ratio epishard / peer" in p.stdout

    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "charts" / "peers_samples_per_s.png").stat().st_size > 0
        assert (tmp_path / "charts" / "peers_epishard_stages.png").stat().st_size > 0
    else:
        assert "charts skipped" in p.stdout
