"""The Ray Data peer of tools/bench/bench_peers.py (tools/bench/peers/raydata.py): registration, the overlay that
puts this venv's Ray beside the LeRobot 0.6.1 peer's lerobot, and the skip / failure messages.

Fast (no Ray cluster is started: ``ray.init`` alone takes 5-30 s on 2 cores); tests that need Ray
installed here skip without it.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "bench"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from peers import config, runs  # noqa: E402
from peers.raydata import OVERLAY_DISTRIBUTIONS, RAY_VERSION, overlay  # noqa: E402


def _ray_version() -> str | None:
    try:
        return md.version("ray")
    except md.PackageNotFoundError:
        return None


def test_raydata_systems_are_registered():
    u8, f32 = config.SYSTEMS["raydata-u8"], config.SYSTEMS["raydata"]
    assert (u8.kind, u8.dtype, f32.dtype) == ("raydata", "uint8", "float32")
    assert (u8.label, f32.label) == ("Ray Data 2.60 u8", "Ray Data 2.60 f32")
    assert u8.lerobot == "0.6.1"  # read_lerobot imports that peer's lerobot: skipped with it
    assert "raydata-u8" in config.DEFAULT and "raydata" not in config.DEFAULT
    assert {"raydata", "raydata-u8"} <= set(config.PEERS)
    assert not any(s.startswith("raydata") for s in config.QUICK)  # Ray's start-up alone exceeds a smoke run


@pytest.mark.skipif(_ray_version() != RAY_VERSION, reason=f"needs ray {RAY_VERSION} in this venv")
def test_overlay_links_ray_and_only_what_the_peer_lacks(tmp_path):
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "msgpack-1.0.0.dist-info").mkdir()  # the peer has its own msgpack: not linked
    out = overlay(tmp_path / "overlay", site)
    names = {p.name for p in out.iterdir()}
    assert "ray" in names and (out / "ray").resolve() == Path(md.distribution("ray").locate_file("ray")).resolve()
    assert "msgpack" not in names
    assert all((out / n).is_symlink() for n in names)
    again = overlay(tmp_path / "overlay", site)  # rebuilt, not appended to
    assert {p.name for p in again.iterdir()} == names
    assert set(OVERLAY_DISTRIBUTIONS) >= {"ray", "pydantic"}


def test_overlay_refuses_a_missing_peer(tmp_path):
    if _ray_version() != RAY_VERSION:
        with pytest.raises(RuntimeError, match="ray"):
            overlay(tmp_path / "overlay", tmp_path / "nowhere")
    else:
        with pytest.raises(RuntimeError, match=r"no LeRobot 0\.6\.1 site-packages"):
            overlay(tmp_path / "overlay", tmp_path / "nowhere")


def test_ray_status_names_the_missing_peer(tmp_path, monkeypatch):
    peer = config.Peer("0.6.1", str(tmp_path / "venv"), str(tmp_path / "env.sh"), "setup_lerobot061_venv.sh")
    monkeypatch.setitem(runs.LEROBOT, "0.6.1", peer)
    msg = runs.ray_status(argparse.Namespace(peers_dir=str(tmp_path)))
    if _ray_version() is None:
        assert "Ray is not installed" in msg
    elif _ray_version() != RAY_VERSION:
        assert RAY_VERSION in msg
    else:
        assert "setup_lerobot061_venv.sh" in msg and "not found" in msg


def test_a_failed_ray_run_raises_with_its_error_text(tmp_path, monkeypatch):
    """The harness's exit status and stderr tail become the RuntimeError the benchmark prints as FAILED."""
    if _ray_version() != RAY_VERSION:
        pytest.skip(f"needs ray {RAY_VERSION} in this venv")
    venv = tmp_path / "venv"
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (venv / "bin").mkdir()
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\necho 'Ray Data read_lerobot could not read X: ValueError: boom' >&2\nexit 1\n")
    python.chmod(0o755)
    env = tmp_path / "env.sh"
    env.write_text("export HF_HUB_OFFLINE=1\n")
    monkeypatch.setitem(runs.LEROBOT, "0.6.1", config.Peer("0.6.1", str(venv), str(env), "x.sh"))
    args = argparse.Namespace(
        work=str(tmp_path / "work"),
        workers=2,
        batch_size=8,
        warmup=1,
        seconds=1.0,
        min_batches=1,
        timeout=30,
        env=[],
    )
    d = runs.Dataset("x", str(tmp_path), "v3.0", str(tmp_path))
    with pytest.raises(RuntimeError, match="could not read X: ValueError: boom"):
        runs.run_raydata(args, d, config.SYSTEMS["raydata-u8"], seed=0)
