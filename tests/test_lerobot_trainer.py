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
    "0.6.1": (
        os.environ.get("EPISHARD_LEROBOT061_ENV", "/tmp/peer/lerobot061-env.sh"),
        os.environ.get("EPISHARD_LEROBOT061_PYTHON", "/tmp/peer/lerobot061-venv/bin/python"),
    ),
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


FIELDS_IN_PEER = """
import dataclasses, json, sys, types
sys.path.insert(0, sys.argv[2])
import train_lerobot as t
import lerobot
from lerobot.configs.default import DatasetConfig
from lerobot.policies.act.configuration_act import ACTConfig

policy = ACTConfig(device="cpu", pretrained_backbone_weights=None, push_to_hub=False)
def cfg(**dataset):
    d = DatasetConfig(**{"repo_id": "epishard", "root": sys.argv[1], "streaming": True, **dataset})
    return types.SimpleNamespace(dataset=d, policy=policy, seed=0, tolerance_s=1e-4)
out = {"lerobot": lerobot.__version__, "fields": sorted(f.name for f in dataclasses.fields(DatasetConfig))}
train, held = t.make_epishard_datasets(cfg(episodes=[3, 1]), {"image_size": (16, 16), "stride": 100})
out["episodes"] = train.episodes
out["items"] = sorted({int(x["episode_index"]) for x in train})
out["held"] = held
out["tolerance_s"] = train.tolerance_s
refused = {}
for field, value in [("revision", "v2.1"), ("video_backend", "pyav"), ("streaming", False), ("episodes", [99])]:
    try:
        t.make_epishard_datasets(cfg(**{field: value}), {"image_size": (16, 16)})
        refused[field] = None
    except (SystemExit, ValueError) as exc:
        refused[field] = str(exc)
out["refused"] = refused
print(json.dumps(out))
"""


@pytest.mark.parametrize("version", sorted(PEERS))
def test_every_dataset_field_of_lerobots_config_is_honoured_or_refused(tmp_path, version):
    """``train_lerobot.py``'s dataset line against LeRobot's own ``DatasetConfig``: every field of the installed
    LeRobot is in ``DATASET_FIELDS`` (a field added by a later LeRobot would be refused, not ignored);
    ``episodes`` reads those episodes only; revision, another video backend, no streaming and episodes
    the shards do not hold stop with a message naming them."""
    sys.path.insert(0, str(REPO / "tools" / "examples"))
    try:
        import train_lerobot
    finally:
        sys.path.pop(0)
    command = lerobot_command(PEERS[version], here=version == "0.4.4")
    shards = tmp_path / "sample"
    convert([str(SAMPLE)], str(shards), ConvertOptions(workers=1, progress=False))
    env = {**os.environ, "PYTHONPATH": peer_pythonpath()}
    run = subprocess.run(
        [*command, "-c", FIELDS_IN_PEER, str(shards), str(REPO / "tools" / "examples")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert set(out["fields"]) <= set(train_lerobot.DATASET_FIELDS), out["fields"]
    assert out["episodes"] == [1, 3] and out["items"] == [1, 3] and out["held"] is None
    assert out["tolerance_s"] == 1e-4
    refused = out["refused"]
    assert "revision=v2.1" in refused["revision"] and "video_backend=pyav" in refused["video_backend"]
    assert "--dataset.streaming=true" in refused["streaming"] and "episodes [99] are not in" in refused["episodes"]


def test_lerobot_061s_eval_split_holds_out_the_last_episodes_of_each_task():
    """``--dataset.eval_split`` as LeRobot 0.6.1's ``make_train_eval_datasets``: per task (an episode's first
    task), its last ``ceil(n * eval_split)`` episodes, in the order given."""
    sys.path.insert(0, str(REPO / "tools" / "examples"))
    try:
        import train_lerobot
    finally:
        sys.path.pop(0)
    import numpy as np

    meta = type("Meta", (), {})()
    meta.episodes = {
        "episode_index": np.array([0, 1, 2, 3, 4, 5, 6]),
        "tasks": [["pick"], ["place"], ["pick"], ["pick", "x"], ["place"], [], ["pick"]],
    }
    # pick: 4 episodes -> 2 held out; place: 2 -> 1; no task: 1 -> 1
    assert train_lerobot._eval_split(meta, 0.3) == ([0, 2, 1], [3, 6, 4, 5])
    assert train_lerobot._eval_split(meta, 0.3, [6, 0, 2, 1, 4]) == ([6, 0, 1], [2, 4])
    with pytest.raises(SystemExit, match="leaves 0 training episodes of 3"):
        train_lerobot._eval_split(meta, 0.5, [0, 1, 5])
