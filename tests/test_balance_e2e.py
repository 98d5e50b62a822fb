"""tools/examples/train_example.py --balance under torchrun (one node, two processes, gloo on loopback): it
trains, every rank runs the same number of steps, and rank 0 prints the balance telemetry (per epoch
and for the run); ``--balance --chunk-batches 1`` keeps the plain reader's batches step by step."""

from __future__ import annotations

import collections
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from videogen import make_episode_table, make_video

from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert

REPO = Path(__file__).resolve().parents[1]
LENGTHS = [14, 9, 17, 12, 15, 11]
TASKS = [
    "pick",
    "pick the red cube and place it in the blue bowl on the left",
    "open the drawer",
    "stack " + "the small green block on the large one, then " * 6 + "stop",
    "push",
    "wipe the table",
]
TRAIN = [
    "--batch-size",
    "2",
    "--workers",
    "1",
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
    "5",
    "--epochs",
    "2",
]
TIMEOUT = 120


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("bal_e2e")
    episodes = [
        Episode(
            source="be",
            episode_index=e,
            table=make_episode_table(n, fps=20),
            fps=20,
            tasks=(TASKS[e],),
            videos={"observation.images.front": CameraVideo(make_video(None, n, height=32, width=32, gop=8))},
        )
        for e, n in enumerate(LENGTHS)
    ]
    convert(
        [Source(name="be", episodes=episodes, fps=20)],
        str(out),
        ConvertOptions(max_episodes_per_shard=2, progress=False),
    )
    return str(out)


def _torchrun(args: list[str]) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
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
        timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    return r.stdout


def _steps(prefix: str) -> dict[int, dict[tuple, collections.Counter]]:
    """rank -> (epoch, step) -> multiset of (episode, frame) in that step's batch."""
    out = {}
    for rank in range(2):
        steps = collections.defaultdict(collections.Counter)
        for line in Path(f"{prefix}.rank{rank}.jsonl").read_text().splitlines():
            epoch, step, _, e, f = json.loads(line)
            steps[(epoch, step)][(e, f)] += 1
        out[rank] = dict(steps)
    return out


def test_balance_flag_trains_and_prints_telemetry(dataset, tmp_path):
    out = _torchrun([dataset, "--balance", "--chunk-batches", "3", "--dump-keys", str(tmp_path / "bal"), *TRAIN])
    rows = [
        json.loads(line.split("balance telemetry json ", 1)[1])
        for line in out.splitlines()
        if line.startswith("balance telemetry json ")
    ]
    labels = [r["label"] for r in rows]
    assert labels == ["epoch 0", "epoch 1", "run"], out[-3000:]
    run = rows[-1]
    assert run["steps"] == rows[0]["steps"] + rows[1]["steps"] > 0
    assert run["imbalance_mean"] >= 1.0 and 0.0 <= run["padding"] < 1.0
    assert run["step_time_padded"] >= run["step_time_packed"] > 0
    assert "balance telemetry run:" in out
    keys = _steps(str(tmp_path / "bal"))
    assert len(keys[0]) == len(keys[1]) == run["steps"]  # every rank ran every step

    # chunk_batches=1 only sorts inside each batch: the same batches as the plain reader.
    _torchrun([dataset, "--balance", "--chunk-batches", "1", "--dump-keys", str(tmp_path / "one"), *TRAIN])
    _torchrun([dataset, "--dump-keys", str(tmp_path / "plain"), *TRAIN])
    assert _steps(str(tmp_path / "one")) == _steps(str(tmp_path / "plain"))
    assert _steps(str(tmp_path / "bal")) != _steps(str(tmp_path / "plain"))
