"""``tools/bench/bench_peers.py``: the quick smoke run, the tiler, option detection, and ``--charts`` without
matplotlib.

The smoke run is the command as users run it (a subprocess), ``--quick`` on the bundled sample with
the LeRobot peers absent. Needs neither ../shared nor the peer venvs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, SAMPLE

sys.path.insert(0, str(REPO / "tools" / "bench"))

SYSTEMS = ["lerobot", "lerobot061-u8", "webdataset", "naive", "es-f32", "es-u8", "es-u8-pe4"]


def _cmd(tmp_path, *extra: str) -> list[str]:
    peers = tmp_path / "peers"
    peers.mkdir(exist_ok=True)
    return [
        sys.executable,
        str(REPO / "tools" / "bench" / "bench_peers.py"),
        "--quick",
        "--source",
        str(SAMPLE),
        "--out",
        str(tmp_path / "peers.jsonl"),
        "--markdown",
        str(tmp_path / "peers.md"),
        "--charts",
        str(tmp_path / "charts"),
        "--work",
        str(tmp_path / "work"),
        "--peers-dir",
        str(peers),
        "--timeout",
        "300",
        "--batch-size",
        "4",
        "--workers",
        "1",
        *extra,
    ]


def test_bench_peers_quick_on_sample_without_peers(tmp_path, monkeypatch):
    import peers.config as config

    for version, peer in config.LEROBOT.items():  # the venvs are looked up where the child looks
        assert peer.version == version
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    cmd = _cmd(
        tmp_path,
        "--systems",
        ",".join(SYSTEMS),
        "--epishard-opt",
        "shuffle=64",
        "--epishard-opt",
        "no_such_option=3",
    )
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=str(REPO), env={**_base_env(), **env})
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    if not (config.Path(config.LEROBOT["0.4.4"].venv) / "bin" / "python").exists():
        assert "skip LeRobot 0.4.4 peer" in out and "setup_lerobot_venv.sh" in out and "--setup-peers" in out
    assert "the LeRobot harness reads v3.0 folders only (v2.0)" in out or "skip LeRobot 0.6.1 peer" in out
    assert "epishard options NOT supported by this epishard, ignored: no_such_option" in out

    records = [json.loads(line) for line in (tmp_path / "peers.jsonl").read_text().splitlines()]
    meta = records[0]
    assert meta["record"] == "run" and meta["seconds_timed"] == 1.0 and meta["min_batches"] == 2
    assert meta["epishard_options"] == {"dataset": {"shuffle": 64}, "spec": {}}
    assert meta["epishard_options_ignored"] == ["no_such_option"]
    runs = {r["system"]: r for r in records if r["record"] == "run_result"}
    assert sorted(runs) == sorted(SYSTEMS[2:])
    for r in runs.values():
        assert r["samples"] >= 8 and r["batches"] >= 2 and r["samples_per_s"] > 0 and r["rss_peak_mb"] > 0
        assert r["worker_rss_peak_mb"] > 0
        (shape,) = r["shapes"].values()  # one camera: [batch 4, 9 frames, 3, 256, 256, dtype]
        assert shape == [4, 9, 3, 256, 256, r["dtype"]]
        assert r["dtype"] == ("uint8" if "u8" in r["system"] else "float32")
        assert 1 <= r["distinct_episodes_per_batch"] <= 4 and r["diversity_batches"] == r["batches"]
        assert r["diversity_ratio"] == pytest.approx(
            r["distinct_episodes_per_batch"] / r["distinct_episodes_per_batch_iid"]
        )
    # the i.i.d. reference comes from each policy's windows per episode, never from the run's length
    lines = (SAMPLE / "meta" / "episodes.jsonl").read_text().splitlines()
    rows = np.array([json.loads(line)["length"] for line in lines], dtype=float)  # 416, 470, 470, 412, 328
    from epishard.stream import diversity

    every_anchor = diversity.iid(rows, 4).distinct
    assert runs["naive"]["distinct_episodes_per_batch_iid"] == pytest.approx(every_anchor)
    assert runs["es-u8"]["distinct_episodes_per_batch_iid"] == pytest.approx(every_anchor)
    assert runs["es-u8-pe4"]["distinct_episodes_per_batch_iid"] == pytest.approx(
        diversity.iid(np.full(5, 4.0), 4).distinct
    )
    assert runs["webdataset"]["distinct_episodes_per_batch_iid"] == pytest.approx(diversity.iid(np.ones(5), 4).distinct)
    assert runs["es-u8"]["options"] == {"dataset": {"shuffle": 64}, "spec": {}}
    assert {(h["dtype"]) for h in records if h["record"] == "headline"} == {"uint8", "float32"}

    md = (tmp_path / "peers.md").read_text()
    assert (
        "## Headline: matched diversity" in md
        and "| epishard u8 | uint8 |" in md
        and "tools/bench/bench_peers.py --quick" in md
    )
    for name in ("peers_samples_per_s.png", "peers_diversity.png", "peers_epishard_stages.png"):
        assert (tmp_path / "charts" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "peers.jsonl.partial").exists()

    # --render redraws the same tables from the JSON lines, running nothing
    again = tmp_path / "again.md"
    cmd = [sys.executable, str(REPO / "tools" / "bench" / "bench_peers.py"), "--render", str(tmp_path / "peers.jsonl")]
    cmd += ["--out", str(tmp_path / "again.jsonl"), "--markdown", str(again), "--charts", ""]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(REPO), env={**_base_env(), **env})
    assert p.returncode == 0, p.stdout + p.stderr
    assert again.read_text() == md


def _base_env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}


def test_charts_fail_loudly_without_matplotlib_before_any_run(tmp_path):
    """A matplotlib that cannot be imported stops the command at once with the fix, instead of
    skipping the charts after the runs."""
    blocker = tmp_path / "block" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('matplotlib blocked by the test')\n")
    env = {**_base_env(), "PYTHONPATH": f"{tmp_path / 'block'}:{REPO}"}
    p = subprocess.run(_cmd(tmp_path), capture_output=True, text=True, timeout=120, cwd=str(REPO), env=env)
    assert p.returncode != 0
    assert "--charts needs matplotlib" in p.stderr and "requirements/machine.txt" in p.stderr
    assert "matplotlib blocked by the test" in p.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "peers.jsonl").exists()


def test_tiler_repeats_episodes_without_copying_video_bytes(tmp_path):
    """A tiny v3.0 dataset (2 episodes) tiled to >= 5 episodes: 3 copies, rows renumbered, the video
    folder shared; epishard converts it and every copy's frames are the original's."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from lerobotgen import write_v3
    from peers.tile import tile

    from epishard.shardwriter import ConvertOptions, WindowIndex, convert

    src = tmp_path / "src"
    write_v3(str(src), [7, 9], "observation.images.front", fps=10)
    episodes_file = src / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    meta = pq.read_table(episodes_file)  # as LeRobot writes them: each episode's row range
    meta = meta.append_column("dataset_from_index", pa.array([0, 7])).append_column(
        "dataset_to_index", pa.array([7, 16])
    )
    pq.write_table(meta, episodes_file)
    out = tile(src, tmp_path / "tiled", 5)
    assert (out / "videos").is_symlink() and (out / "videos").resolve() == (src / "videos").resolve()
    info = json.loads((out / "meta" / "info.json").read_text())
    assert (info["total_episodes"], info["total_frames"]) == (6, 48)
    data = pq.read_table(out / "data" / "chunk-000" / "file-000.parquet")
    assert data.column("index").to_pylist() == list(range(48))
    assert data.column("episode_index").to_pylist() == [0] * 7 + [1] * 9 + [2] * 7 + [3] * 9 + [4] * 7 + [5] * 9
    eps = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    assert [(e["dataset_from_index"], e["dataset_to_index"]) for e in eps] == [
        (0, 7), (7, 16), (16, 23), (23, 32), (32, 39), (39, 48)
    ]  # fmt: skip
    cam = "videos/observation.images.front/from_timestamp"
    assert [e[cam] for e in eps[2:]] == [e[cam] for e in eps[:2]] * 2
    assert tile(src, tmp_path / "tiled", 5) == out  # a finished tiling is reused

    from epishard.shardwriter.sources import SourceOptions

    # The tile links to the original's videos (outside its folder): a trusted local source.
    trusted = ConvertOptions(progress=False, sources=SourceOptions(allow_external=True))
    convert([str(out)], str(tmp_path / "es"), trusted)
    ix = WindowIndex.load_dataset(str(tmp_path / "es"))
    assert ix.num_episodes == 6 and ix.num_rows.tolist() == [7, 9] * 3
    frames = _decoded_frame_numbers(tmp_path / "es", ix)
    assert frames[2] == frames[4] == frames[0] and frames[3] == frames[5] == frames[1]


def _decoded_frame_numbers(root, ix) -> list[list[int]]:
    """Per episode, the frame numbers written into its frames (tests/videogen.py), read back."""
    from videogen import decode_frame_number

    from epishard.stream import WindowDataset, WindowSpec

    spec = WindowSpec(cameras={"observation.images.front": (0,)}, boundary="inside")
    out: dict[int, list[int]] = {}
    for s in WindowDataset(str(root), spec):
        out.setdefault(int(s["episode_index"]), []).append(decode_frame_number(s["observation.images.front"][0]))
    return [sorted(out[e]) for e in range(ix.num_episodes)]


def test_epishard_options_are_split_by_feature_detection():
    from peers.cli import epishard_options

    opts, ignored = epishard_options(["shuffle=32", "stride=2", "shuffle_episodes=None", "hook=abc"])
    assert opts["dataset"]["shuffle"] == 32 and opts["spec"] == {"stride": 2}
    import inspect

    from epishard.stream import WindowDataset

    has = "shuffle_episodes" in inspect.signature(WindowDataset.__init__).parameters
    assert ("shuffle_episodes" in opts["dataset"]) == has and ("shuffle_episodes" in ignored) == (not has)
    assert "hook" in ignored
    with pytest.raises(SystemExit, match="not KEY=VALUE"):
        epishard_options(["shuffle"])
