"""Shared test fixtures: where the workplace's real datasets are, and small helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("EPISHARD_SHARED_DATA", REPO.parent / "shared" / "data"))
SAMPLE = REPO / "sample" / "gr00t_robot_sim_picknplace"
# The long sweeps (every generated variation, the 20-run concurrency loops) run with EPISHARD_SWEEP=1
# (docs/development.md); CI runs a seeded sample of each.
SWEEP = os.environ.get("EPISHARD_SWEEP") == "1"


@pytest.fixture(autouse=True, scope="session")
def _verification_cache(tmp_path_factory):
    """Stamps of hashed index files (``epishard.format.verified``) go to the session's temporary folder.

    Not to ~/.cache.
    """
    os.environ["EPISHARD_CACHE"] = str(tmp_path_factory.mktemp("epishard-cache"))


def shared_dataset(name: str) -> Path:
    """Path of a dataset in ../shared/data; skips the test when it is absent (a user's fresh clone)."""
    path = SHARED_DATA / name
    if not (path / "meta" / "info.json").exists():
        pytest.skip(f"{path} is absent (real test data lives in ../shared/data)")
    return path


@pytest.fixture(scope="module")
def moto_s3():
    """A loopback S3 server (moto) with test credentials in the environment; yields
    ``(storage_options, s3fs filesystem)``. Skips when s3fs or moto is not installed."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    import s3fs

    options = {"endpoint_url": f"http://{host}:{port}"}
    yield options, s3fs.S3FileSystem(**options, skip_instance_cache=True)
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def intact(tmp_path_factory) -> str:
    """The tiny generated dataset the fault tests damage copies of (``faultgen.make_dataset``):
    6 episodes in 3 shards, generated once per session. Tests must not modify it."""
    from faultgen import make_dataset

    return make_dataset(str(tmp_path_factory.mktemp("fault_dataset")))


@pytest.fixture(scope="session")
def reference(intact) -> list[dict]:
    """Every sample of ``intact`` read with ``faultgen.SPEC`` and seed 5, in read order; decoded once
    per session. Tests must not modify the samples."""
    from faultgen import SPEC

    from epishard.stream import WindowDataset

    return list(WindowDataset(intact, SPEC, seed=5))


@pytest.fixture(scope="session")
def keyed_reference(reference) -> dict[tuple[int, int], dict]:
    """``reference`` keyed by (episode_index, frame_index)."""
    return {(int(s["episode_index"]), int(s["frame_index"])): s for s in reference}


@pytest.fixture(scope="module")
def netns():
    """The test module runs in a loopback-only network namespace (``raycluster.loopback_namespace``)."""
    import raycluster

    with raycluster.loopback_namespace():
        yield


@pytest.fixture(scope="module")
def ray_s3(netns, moto_s3):
    """(storage options, s3fs, Ray address): a moto server and a 2-node Ray cluster, both in the namespace."""
    import raycluster

    with raycluster.cluster() as address:
        yield (*moto_s3, address)
