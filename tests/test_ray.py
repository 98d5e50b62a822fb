"""Ray: ``convert --ray`` and ``RayWindowLoader`` on a 2-node loopback cluster (one per module, in a
network namespace of its own with only ``lo``; ``raycluster``).

Conversion: a v2.1 and a v3.0 LeRobot source written to S3 (a moto server inside the namespace) by
Ray tasks (``epishard convert --ray ADDRESS``) are byte-identical, file by file, to a local
single-machine conversion, also when a worker process running a shard is killed mid-conversion.
Loader: ``RayWindowLoader`` yields exactly ``WindowLoader``'s batches (frame pixels included) over
2 epochs, with a resume in the middle, and when an actor is killed mid-epoch; a 1-worker state
loaded into 2 actors (elastic resume) yields what ``WindowLoader`` yields after loading it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import raycluster
import torch
from faultgen import SPEC
from lerobotgen import write_v2, write_v3

from epishard.cli import main
from epishard.shardwriter import ConvertOptions, convert
from epishard.stream import WindowDataset, WindowLoader

pytestmark = pytest.mark.skipif(raycluster.unavailable() is not None, reason=str(raycluster.unavailable()))

CAMERA = "observation.images.front"
OPTIONS = ConvertOptions(max_episodes_per_shard=2, progress=False)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("ray_sources")
    write_v2(str(root / "v21"), [12, 9, 10], [CAMERA], fps=10)
    write_v3(str(root / "v30"), [11, 8, 10], CAMERA, fps=10)
    return [str(root / "v21"), str(root / "v30")]


@pytest.fixture(scope="module")
def local(sources, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("ray_local") / "ds"
    convert(sources, str(out), OPTIONS)
    return {name: (out / name).read_bytes() for name in sorted(os.listdir(out))}


def _files(fs, url: str) -> dict[str, bytes]:
    fs.invalidate_cache()
    return {os.path.basename(p): fs.cat_file(p) for p in sorted(fs.ls(url, detail=False))}


def test_ray_conversion_to_s3_is_byte_identical(ray_s3, sources, local, capsys):
    import ray

    options, fs, address = ray_s3
    assert sum(node["Alive"] for node in ray.nodes()) == 2
    fs.mkdir("ray-out")
    argv = ["convert", *sources, "s3://ray-out/ds", "--max-episodes-per-shard", "2", "--quiet"]
    assert main([*argv, "--storage-options", json.dumps(options), "--ray", address]) == 0
    assert "wrote 3 shards, 6 episodes" in capsys.readouterr().out
    assert _files(fs, "ray-out/ds") == local  # shards, indexes, index.arrow, manifest, marker


def test_ray_conversion_of_an_hdf5_source_is_byte_identical(ray_s3, tmp_path, capsys):
    """A source beyond LeRobot (ALOHA HDF5, cameras as frames encoded in the tasks) through ``--ray``:
    the same files as a local conversion."""
    pytest.importorskip("h5py")
    from pathlib import Path

    from test_sources_hdf5 import write_aloha

    options, fs, address = ray_s3
    root = Path(tmp_path) / "aloha"
    write_aloha(root, [6, 5, 7], compress=True)
    out = tmp_path / "aloha_local"
    convert([str(root)], str(out), OPTIONS)
    local = {name: (out / name).read_bytes() for name in sorted(os.listdir(out))}
    fs.mkdir("ray-aloha")
    argv = ["convert", str(root), "s3://ray-aloha/ds", "--max-episodes-per-shard", "2", "--quiet"]
    assert main([*argv, "--storage-options", json.dumps(options), "--ray", address]) == 0
    assert "wrote 2 shards, 3 episodes" in capsys.readouterr().out
    assert _files(fs, "ray-aloha/ds") == local


def test_killed_worker_is_retried_and_loses_nothing(ray_s3, sources, local):
    from epishard.shardwriter.ray_convert import convert_ray

    options, fs, _ = ray_s3
    fs.mkdir("ray-kill")
    killed: list[int] = []
    stop = threading.Event()

    def kill_first_shard_task():  # SIGKILL the first worker process seen running a shard task
        while not stop.is_set() and not killed:
            for pid in raycluster.pids_titled("ray::write_shard"):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.005)

    watcher = threading.Thread(target=kill_first_shard_task, daemon=True)
    watcher.start()
    try:
        convert_ray(sources, "s3://ray-kill/ds", OPTIONS, storage_options=options)
    finally:
        stop.set()
        watcher.join()
    assert killed, "no shard task was seen running, so none was killed"
    assert _files(fs, "ray-kill/ds") == local


@pytest.fixture(scope="module")
def loader_reference(intact) -> list[list[dict]]:
    """``WindowLoader`` batches (batch 3, 2 workers, seed 5) of epochs 0, 1 and 2."""
    loader = WindowLoader(WindowDataset(intact, SPEC, seed=5), batch_size=3, num_workers=2)
    return [list(loader) for _ in range(3)]


@pytest.fixture(scope="module")
def ray_loader(ray_s3, intact):
    """One ``RayWindowLoader`` (2 actors: one CPU on each node) for the loader tests, in file order
    after the conversion tests (its actors hold both CPUs)."""
    from epishard.stream.ray_loader import RayWindowLoader

    loader = RayWindowLoader(WindowDataset(intact, SPEC, seed=5), batch_size=3, num_workers=2, prefetch=2)
    yield loader
    loader.close()


def _same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for key in w:
            if isinstance(w[key], torch.Tensor):
                assert g[key].dtype == w[key].dtype and torch.equal(g[key], w[key]), key
            else:
                assert g[key] == w[key], key


def test_ray_loader_matches_window_loader_across_resume(ray_loader, loader_reference):
    got = []
    for batch in ray_loader:
        got.append(batch)
        if len(got) == 3:
            break
    state = ray_loader.state_dict()
    assert state["epoch"] == 0 and state["consumed"] == [6, 3] and state["rotation"] == 1
    ray_loader.load_state_dict({"epoch": 0, "fresh": True})  # elsewhere meanwhile: a fresh epoch 0
    ray_loader.load_state_dict(state)
    got += list(ray_loader)  # the rest of epoch 0
    _same(got, loader_reference[0])
    _same(list(ray_loader), loader_reference[1])
    assert ray_loader.state_dict() == {**state, "epoch": 2, "consumed": [0, 0], "rotation": 0, "fresh": True}


def test_killed_actor_loses_no_window_and_duplicates_none(ray_loader, loader_reference):
    assert ray_loader.state_dict()["epoch"] == 2
    victim = ray_loader.actor_pids()[1]
    got = []
    for batch in ray_loader:
        got.append(batch)
        if len(got) == 2:
            os.kill(victim, signal.SIGKILL)  # consumer 1 has delivered 1 batch and is prefetching more
    assert ray_loader.telemetry()["actor_restarts"] == [0, 1]
    _same(got, loader_reference[2])
    windows = [(int(e), int(f)) for b in got for e, f in zip(b["episode_index"], b["frame_index"], strict=True)]
    assert len(windows) == len(set(windows)) == sum(len(b["episode_index"]) for b in loader_reference[2])


def test_ray_loader_resumes_a_state_of_another_worker_count(ray_loader, intact):
    """Elastic resume: a ``WindowLoader`` state of 1 worker, loaded into 2 actors, yields what a
    ``WindowLoader`` of 2 workers yields after loading it (and none of the windows taken before), and
    a state taken mid-way (its ``history`` carried) resumes the rest."""
    saved = WindowLoader(WindowDataset(intact, SPEC, seed=5), batch_size=3, num_workers=0)
    before = []
    for batch in saved:
        before.append(batch)
        if len(before) == 2:
            break
    state = saved.state_dict()
    reference = WindowLoader(WindowDataset(intact, SPEC, seed=5), batch_size=3, num_workers=2)
    reference.load_state_dict(state)
    ray_loader.load_state_dict([state])
    assert ray_loader.state_dict() == reference.state_dict()
    want = list(reference)
    got = []
    for batch in ray_loader:
        got.append(batch)
        if len(got) == 1:
            break
    mid = ray_loader.state_dict()
    assert mid["history"] == [{"world_size": 1, "num_workers": 1, "consumed": [6]}]
    assert (mid["epoch"], mid["num_workers"], mid["consumed"], mid["rotation"]) == (0, 2, [3, 0], 1)
    ray_loader.load_state_dict(mid)
    got += list(ray_loader)
    _same(got, want)
    windows = {(int(e), int(f)) for b in got for e, f in zip(b["episode_index"], b["frame_index"], strict=True)}
    taken = {(int(e), int(f)) for b in before for e, f in zip(b["episode_index"], b["frame_index"], strict=True)}
    assert windows and not windows & taken
