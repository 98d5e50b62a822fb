"""Frictions of issue 22 with Ray (part 3, items 1 and 2), on the loopback 2-node cluster of
``raycluster`` (one CPU per node, in a network namespace of its own; skipped where it cannot run).
"""

from __future__ import annotations

import os
import pickle
import time

import pytest
import raycluster
from lerobotgen import write_v2

from epishard.cli import main
from epishard.shardwriter import ConvertOptions, convert

pytestmark = pytest.mark.skipif(raycluster.unavailable() is not None, reason=str(raycluster.unavailable()))

CAM = "observation.images.front"


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("frray") / "src")
    write_v2(root, [5, 4, 6], [CAM])
    return root


# --- 1. RayWindowLoader actors that cannot be placed -------------------------------------------------------------


def test_f1_ray_loader_times_out_naming_what_it_asked_and_what_the_cluster_has(ray_s3, src, tmp_path):
    import ray

    from epishard.stream import WindowDataset, WindowSpec
    from epishard.stream.ray_loader import RayWindowLoader

    out = str(tmp_path / "ds")
    convert([src], out, ConvertOptions(progress=False))
    ds = WindowDataset(out, WindowSpec(cameras={CAM: (0,)}))
    with pytest.raises(TimeoutError) as err:  # 3 workers, each reserving a CPU, on a cluster of 2 CPUs
        RayWindowLoader(ds, num_workers=3, placement_timeout_s=2)
    message = str(err.value)
    assert (
        "actors (num_workers=3) could not be placed within 2 s: each asks for {'CPU': 1} (3 x that in all)" in message
    )
    assert "the cluster has {'CPU': 2} in all" in message and "fewer CPU in all than asked" in message, message
    with pytest.raises(
        TimeoutError, match=r"asks for \{'CPU': 1, 'decode': 1\}.* has \{'CPU': 2, 'decode': 0\} in all"
    ):
        RayWindowLoader(ds, num_workers=1, placement_timeout_s=2, actor_options={"resources": {"decode": 1}})

    @ray.remote(num_cpus=1)
    class Hold:  # stands for another loader's actors, not closed: one CPU on each node
        def ready(self) -> bool:
            return True

    holds = [Hold.remote() for _ in range(2)]
    assert ray.get([h.ready.remote() for h in holds], timeout=120) == [True, True]
    with pytest.raises(TimeoutError) as err:
        RayWindowLoader(ds, num_workers=1, placement_timeout_s=2)
    message = str(err.value)
    assert "in all, {'CPU': 0} free now (the rest is held by other actors or tasks" in message, message
    assert "until close()" in message, message
    for h in holds:
        ray.kill(h)
    # the actors of a loader that timed out were ended: the whole cluster is free again
    for _ in range(300):
        if ray.available_resources().get("CPU", 0) == 2:
            break
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) == 2


# --- 2. convert --ray: the driver's storage settings, and task errors -------------------------------------------


def test_f2_convert_ray_passes_the_driver_storage_environment_to_its_tasks(ray_s3, src, tmp_path, capsys, monkeypatch):
    options, fs, address = ray_s3
    local = str(tmp_path / "local")
    convert([src], local, ConvertOptions(max_episodes_per_shard=2, progress=False))
    fs.mkdir("fr-env")
    # docs/guide/ray.md's pattern: the endpoint in the driver's environment only (the nodes started without it)
    monkeypatch.setenv("AWS_ENDPOINT_URL", options["endpoint_url"])
    argv = ["convert", src, "s3://fr-env/ds", "--max-episodes-per-shard", "2", "--quiet", "--ray", address]
    assert main(argv) == 0, capsys.readouterr().err
    assert "wrote 2 shards, 3 episodes" in capsys.readouterr().out
    fs.invalidate_cache()
    got = {os.path.basename(p): fs.cat_file(p) for p in fs.ls("fr-env/ds", detail=False)}
    assert got == {name: (tmp_path / "local" / name).read_bytes() for name in os.listdir(local)}


def test_ray_loader_actors_get_the_driver_storage_environment(ray_s3, src, tmp_path, monkeypatch):
    """The endpoint only in the driver's environment (the nodes started without it): the actors read the
    bucket as the driver does, and yield exactly the windows the dataset plans."""
    from epishard.stream import WindowDataset, WindowLoader, WindowSpec
    from epishard.stream.ray_loader import RayWindowLoader

    options, fs, _ = ray_s3
    fs.mkdir("fr-loader")
    two = ConvertOptions(max_episodes_per_shard=2, progress=False)
    convert([src], "s3://fr-loader/ds", two, storage_options=options)
    monkeypatch.setenv("AWS_ENDPOINT_URL", options["endpoint_url"])
    ds = WindowDataset("s3://fr-loader/ds", WindowSpec(cameras={CAM: (0,)}), seed=3)  # no storage options

    def keys(loader) -> list[tuple[int, int]]:
        return [(int(e), int(f)) for b in loader for e, f in zip(b["episode_index"], b["frame_index"], strict=True)]

    expected = keys(WindowLoader(ds, batch_size=2, num_workers=2))  # the same consumers, here
    with RayWindowLoader(ds, batch_size=2, num_workers=2) as loader:
        assert keys(loader) == expected and len(expected) >= 14


def test_f2_a_task_error_reaches_the_driver_saying_what_failed(ray_s3, src, tmp_path):
    from epishard.format.retry import RetryBudgetExceeded
    from epishard.format.storage import Storage
    from epishard.shardwriter import read_lerobot
    from epishard.shardwriter.ray_convert import RayRunner, portable

    *_, address = ray_s3

    class Refusing(Storage):  # a store that throttles every upload until the budget is spent
        def writer(self, name):
            raise RetryBudgetExceeded(
                f"PUT {self.url}/{name}: 503 SlowDown (gave up after 3 attempts in 0.1 s)", 503, 0.1
            )

    episodes = read_lerobot(src).episodes[:1]
    out = str(tmp_path / "refused")
    with pytest.raises(RetryBudgetExceeded) as err:  # was Ray's UnserializableException and a page of traceback
        RayRunner(address)([(0, episodes, "0" * 64)], Refusing(out, {}), ConvertOptions(progress=False), 1, {})
    assert type(err.value) is RetryBudgetExceeded and (err.value.status, err.value.elapsed_s) == (503, 0.1)
    assert str(err.value) == f"PUT {out}/shard-000000.tar: 503 SlowDown (gave up after 3 attempts in 0.1 s)"
    assert err.value.__notes__[0].startswith(f"shard 0 of {out} (a Ray task on "), err.value.__notes__

    class Unpicklable(OSError):  # another library's class that cannot be rebuilt from its pickle
        def __init__(self, message, code):
            super().__init__(message)

    plain = portable(Unpicklable("x", 3), "shard 1")
    assert type(plain) is OSError and str(pickle.loads(pickle.dumps(plain))) == "shard 1: Unpicklable: x"
    kept = ValueError("a portable error")
    assert portable(kept, "shard 1") is kept and kept.__notes__ == ["shard 1"]
