"""Two "nodes" on loopback (two torchrun launches, --nnodes 2), two processes each, two DataLoader
workers per process, running tools/examples/train_example.py on a 3-shard dataset (8 consumers > 3 shards)
with uneven episode lengths: exactly-once windows, equal steps per rank, new order per epoch, exact
resume from a checkpoint, a clear refusal when a rank's state is missing, and elastic resume of a
2-process run with 3 processes."""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from videogen import make_episode_table, make_video

from epishard.format.manifest import Manifest
from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert
from epishard.stream import WindowDataset, WindowSpec, segment
from epishard.stream.plan import EpochInputs, global_plan

REPO = Path(__file__).resolve().parents[1]
LENGTHS = [23, 9, 31, 15, 27, 12, 40]
TRAIN = [
    "--batch-size",
    "2",
    "--workers",
    "2",
    "--frames",
    "2",
    "--span",
    "3",
    "--size",
    "32",
    "--horizon",
    "2",
    "--log-every",
    "0",
    "--seed",
    "11",
]
TIMEOUT = 300


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("mn")
    episodes = [
        Episode(
            source="mn",
            episode_index=e,
            table=make_episode_table(n, fps=20),
            fps=20,
            tasks=("t",),
            videos={"observation.images.front": CameraVideo(make_video(None, n, height=32, width=32, gop=8))},
        )
        for e, n in enumerate(LENGTHS)
    ]
    convert(
        [Source(name="mn", episodes=episodes, fps=20)],
        str(out),
        ConvertOptions(max_episodes_per_shard=3, progress=False),
    )
    assert len(Manifest.load((out / "manifest.json").read_bytes(), "manifest.json").shards) == 3
    return str(out)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nnodes: int, nproc: int, args: list[str], expect_ok: bool = True) -> list[subprocess.CompletedProcess]:
    port = _port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(nnodes),
                "--node-rank",
                str(node),
                "--nproc-per-node",
                str(nproc),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                str(REPO / "tools" / "examples" / "train_example.py"),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for node in range(nnodes)
    ]
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if expect_ok:
        for r in results:
            assert r.returncode == 0, r.stdout[-3000:]
    return results


def _keys(prefix: str, world: int) -> dict[int, list[tuple]]:
    out = {}
    for rank in range(world):
        rows = [json.loads(line) for line in Path(f"{prefix}.rank{rank}.jsonl").read_text().splitlines()]
        out[rank] = [tuple(r) for r in rows]
    return out


def _planned(dataset: str, epoch: int, consumers: int) -> collections.Counter:
    spec = WindowSpec(
        cameras={"observation.images.front": segment(0, 2, 2)}, state_offsets=(-1, 0), action_horizon=2, boundary="pad"
    )
    ds = WindowDataset(dataset, spec, seed=11)
    plan = global_plan(EpochInputs(ds.table, 1, None, 11, epoch), consumers)
    return collections.Counter((0, int(e), int(a)) for e, a in zip(plan.episode, plan.anchor, strict=False))


def _loads_in_a_plain_process(path: Path) -> None:
    """A torchrun checkpoint's model loads into the bare model in this (plain) process: no ``module.`` keys."""
    import torch

    sys.path.insert(0, str(REPO / "tools" / "examples"))
    try:
        import train_example
    finally:
        sys.path.pop(0)
    state = torch.load(path, map_location="cpu")
    assert state["model"] and not any(k.startswith("module.") for k in state["model"]), list(state["model"])[:3]
    width, state_dim = state["model"]["state.weight"].shape
    cameras = state["model"]["head.0.weight"].shape[1] // width - 1
    model = train_example.TinyPolicy(cameras, state_dim, state["model"]["head.2.weight"].shape[0], 1, width)
    model.load_state_dict(state["model"])  # strict: every key, no prefix
    # an earlier checkpoint's prefixed keys are taken too
    prefixed = {f"module.{k}": v for k, v in state["model"].items()}
    assert train_example.model_state(prefixed).keys() == state["model"].keys()


def test_two_nodes_exactly_once_equal_steps_and_exact_resume(dataset, tmp_path):
    world = 4
    full = str(tmp_path / "full")
    _torchrun(2, 2, [dataset, "--epochs", "2", "--dump-keys", full, *TRAIN])
    keys = _keys(full, world)
    for epoch in range(2):
        per_rank = {r: [k for k in ks if k[0] == epoch] for r, ks in keys.items()}
        steps = {r: len({k[1] for k in ks}) for r, ks in per_rank.items()}
        assert len(set(steps.values())) == 1, steps  # every rank the same number of steps
        seen = collections.Counter(tuple(k[2:]) for ks in per_rank.values() for k in ks)
        planned = _planned(dataset, epoch, consumers=world * 2)
        assert seen == planned  # each planned window exactly once over all ranks and workers
        assert sum(planned.values()) > sum(LENGTHS) - world * 2
    assert [k[2:] for k in keys[0] if k[0] == 0] != [k[2:] for k in keys[0] if k[0] == 1]

    # Interrupted after 7 steps (checkpoint at step 6), restarted: the same keys as uninterrupted.
    ckpt, part = str(tmp_path / "ckpt"), str(tmp_path / "part")
    _torchrun(
        2,
        2,
        [
            dataset,
            "--epochs",
            "2",
            "--checkpoint",
            ckpt,
            "--save-every",
            "3",
            "--stop-after",
            "7",
            "--dump-keys",
            part,
            *TRAIN,
        ],
    )
    shutil.copytree(ckpt, tmp_path / "ckpt_mid")
    _loads_in_a_plain_process(Path(ckpt) / "model.pt")
    before = _keys(part, world)
    for rank in range(world):  # drop what ran after the last checkpoint (step 7): it is redone
        Path(f"{part}.rank{rank}.jsonl").write_text(
            "".join(json.dumps(list(k)) + "\n" for k in before[rank] if k[1] <= 6)
        )
    _torchrun(2, 2, [dataset, "--epochs", "2", "--checkpoint", ckpt, "--resume", "--dump-keys", part, *TRAIN])
    assert _keys(part, world) == keys

    # Another number of processes resumes only from every rank's state: one missing is refused clearly.
    (tmp_path / "ckpt_mid" / "loader.rank3.pt").unlink()
    results = _torchrun(
        1,
        2,
        [dataset, "--epochs", "2", "--checkpoint", str(tmp_path / "ckpt_mid"), "--resume", *TRAIN],
        expect_ok=False,
    )
    assert results[0].returncode != 0
    assert "cannot resume: the state was saved with world_size=4, this run has world_size=2" in results[0].stdout
    assert "needs the states of all 4 ranks (a list; got ranks [0, 1, 2])" in results[0].stdout


def test_resume_with_another_process_count_yields_each_remaining_window_once(dataset, tmp_path):
    """Elastic resume: train with 2 processes x 2 workers, stop mid-epoch (checkpoint at step 4),
    resume with 3 processes without workers: consumed-before plus yielded-after is the epoch's plan
    for 4 consumers, each window once, minus the (R mod 3) windows the resume leaves out; every new
    rank the same number of steps; the next epoch is the plan for 3 consumers."""
    ckpt, before, after = str(tmp_path / "ckpt"), str(tmp_path / "before"), str(tmp_path / "after")
    common = [dataset, "--epochs", "2", "--checkpoint", ckpt, *TRAIN]
    _torchrun(1, 2, [*common, "--save-every", "4", "--stop-after", "4", "--dump-keys", before])
    _torchrun(1, 3, [*common, "--resume", "--dump-keys", after, "--workers", "0"])
    consumed = [k for ks in _keys(before, 2).values() for k in ks]
    assert len(consumed) == 2 * 4 * 2  # 2 ranks x 4 steps x batch 2, all in epoch 0
    resumed = _keys(after, 3)
    planned = _planned(dataset, 0, consumers=4)
    seen = collections.Counter(tuple(k[2:]) for k in consumed)
    seen.update(tuple(k[2:]) for ks in resumed.values() for k in ks if k[0] == 0)
    assert max(seen.values()) == 1 and not seen - planned  # each window at most once, all planned
    left_out = planned - seen
    assert left_out.total() == (planned.total() - len(consumed)) % 3
    for epoch in (0, 1):
        steps = {r: len({k[1] for k in ks if k[0] == epoch}) for r, ks in resumed.items()}
        assert len(set(steps.values())) == 1 and steps[0] > 0, steps
    epoch1 = collections.Counter(tuple(k[2:]) for ks in resumed.values() for k in ks if k[0] == 1)
    assert epoch1 == _planned(dataset, 1, consumers=3)
