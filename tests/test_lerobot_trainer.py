"""LeRobot's own factories build and train ACT and Diffusion on ``EpishardLeRobotDataset`` batches.

In the LeRobot 0.4.4 peer venv (``make test`` builds it when ``../shared/peers`` exists: its
``setup_lerobot_venv.sh``, then ``tools/bench/peers/setup_lerobot_train.sh`` for the policies' imports), or in
this venv when it has lerobot: ``make_policy(cfg, ds_meta=ds.meta)``,
``make_pre_post_processors(cfg, dataset_stats=ds.meta.stats)``, the policy's optimizer preset and
LeRobot's ``resolve_delta_timestamps`` from the drop-in's meta; 20 updates each from a plain
``DataLoader`` with 2 workers over the bundled sample (``tests/lerobot_train_check.py``). The loss is
finite and every trainable parameter changes. And the drop-in reads packets inside LeRobot's own
environment (PyAV < 16). Skips cleanly where lerobot is not importable.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE

from epishard.shardwriter import ConvertOptions, convert
from epishard.stream.lerobot_dataset import peer_pythonpath

PEER_ENV = os.environ.get("EPISHARD_LEROBOT_ENV", "/tmp/peer/env.sh")
PEER_PYTHON = os.environ.get("EPISHARD_LEROBOT_PYTHON", "/tmp/peer/lerobot-venv/bin/python")
# LeRobot 0.6.1 too where its peer venv is (../shared/peers/setup_lerobot061_venv.sh) and imports the policies
# (it needs opencv-python-headless and diffusers besides): not built by make test, skipped otherwise.
PEERS = {
    "0.4.4": (PEER_ENV, PEER_PYTHON),
    "0.6.1": ("/tmp/peer/lerobot061-env.sh", "/tmp/peer/lerobot061-venv/bin/python"),
}
CHECK = (
    "import lerobot.policies.factory, lerobot.policies.act.modeling_act, lerobot.policies.diffusion.modeling_diffusion"
)
STEPS = 20


def lerobot_command(peer: tuple[str, str] = (PEER_ENV, PEER_PYTHON), here: bool = True) -> list[str]:
    """The command prefix that runs a script beside an importable lerobot (this venv's, else the peer's).

    Skips the test when neither imports LeRobot's policies.
    """
    PEER_ENV, PEER_PYTHON = peer
    if here and importlib.util.find_spec("lerobot") is not None:
        return [sys.executable]
    if not Path(PEER_PYTHON).is_file():
        pytest.skip(
            f"lerobot is not importable here and {PEER_PYTHON} is absent (make test builds it from ../shared/peers)"
        )
    env = f". {PEER_ENV} && " if Path(PEER_ENV).is_file() else ""
    probe = subprocess.run(["bash", "-c", f"{env}exec {PEER_PYTHON} -c '{CHECK}'"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(
            f"{PEER_PYTHON} cannot import LeRobot's policies (bash tools/bench/peers/setup_lerobot_train.sh): "
            f"{probe.stderr.strip().splitlines()[-1:]}"
        )
    return ["bash", "-c", f'{env}exec {PEER_PYTHON} "$@"', "lerobot"]


@pytest.mark.parametrize("version", sorted(PEERS))
def test_act_and_diffusion_train_through_lerobots_factories(tmp_path, version):
    command = lerobot_command(PEERS[version], here=version == "0.4.4")
    shards = tmp_path / "sample"
    convert([str(SAMPLE)], str(shards), ConvertOptions(workers=1, max_episodes_per_shard=2, progress=False))
    script = REPO / "tests" / "lerobot_train_check.py"
    args = [str(script), str(shards), "--steps", str(STEPS), "--workers", "2", "--shuffle-episodes", "1"]
    args += ["--image-size", "48", "--batch-size", "4"]  # small: both train in about 30 s on 2 cores (48: a 2x2 map for
    # Diffusion's spatial softmax after its 40-pixel crop; at 32 it is 1x1 and the backbone gets no gradient)
    env = {**os.environ, "PYTHONPATH": peer_pythonpath()}
    run = subprocess.run([*command, *args], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    results = {r["policy"]: r for r in map(json.loads, run.stdout.splitlines())}
    assert sorted(results) == ["act", "diffusion"]
    for name, r in results.items():
        print(name, f"loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}", f"{r['seconds']} s", r["lerobot"])
        assert r["lerobot"] == version or command[0] == sys.executable
        assert r["steps"] == STEPS and r["workers"] == 2, r
        assert r["finite"] and len(r["losses"]) == STEPS, r["losses"]
        assert r["params_changed"] == r["params_trainable"] > 0, (r["params_changed"], r["params_trainable"])
        assert r["stats_from"] == f"source (stored at conversion): {SAMPLE}/meta/stats.json"
        assert r["batch_shapes"]["observation.images.ego_view"][1] == "torch.float32"
    # The windows LeRobot's resolve_delta_timestamps asked for, from the drop-in's meta (20 fps).
    act, diffusion = results["act"]["batch_shapes"], results["diffusion"]["batch_shapes"]
    assert act["action"][0] == [4, 10, 44] and act["observation.images.ego_view"][0] == [4, 3, 48, 48]
    assert diffusion["observation.state"][0] == [4, 2, 44] and diffusion["action"][0] == [4, 16, 44]
    assert diffusion["observation.images.ego_view"][0] == [4, 2, 3, 48, 48]
    assert results["diffusion"]["delta_timestamps"]["observation.state"] == [-0.05, 0.0]


READ_IN_PEER = """
import sys, av
from epishard.shardwriter import WindowIndex
from epishard.stream.lerobot_dataset import EpishardLeRobotDataset
index = WindowIndex.load_dataset(sys.argv[1])
assert index.has_packets([0]).all(), "expected a camera read by packets"
items = list(EpishardLeRobotDataset(sys.argv[1], {"action": [0.0, 0.05]}, stride=97, return_uint8=True))
print(av.__version__, len(items), tuple(items[0]["observation.images.cam0"].shape))
"""


def test_the_drop_in_reads_packets_inside_lerobots_own_environment(tmp_path):
    """LeRobot 0.4.4 pins PyAV < 16; epishard's packet decode path runs there too (so101 cloth: MPEG-4, GOP 12)."""
    from conftest import shared_dataset

    command = lerobot_command()
    if command[0] == sys.executable:
        pytest.skip("lerobot is in this venv: LeRobot's own environment is not a separate one here")
    shards = tmp_path / "cloth"
    convert([str(shared_dataset("so101_bimanual_cloth_v30"))], str(shards), ConvertOptions(progress=False))
    env = {**os.environ, "PYTHONPATH": peer_pythonpath()}
    run = subprocess.run(
        [*command, "-c", READ_IN_PEER, str(shards)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    version, count, shape = run.stdout.split(maxsplit=2)
    assert int(version.split(".")[0]) < 16  # PyAV 15: no reformat(threads=)
    assert int(count) == 16 and shape.strip() == "(3, 224, 224)"
