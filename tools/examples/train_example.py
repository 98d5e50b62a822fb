"""A small but real DDP training loop fed by epishard's streaming reader.

A tiny policy (a conv encoder per camera frame, an MLP on the state, a head predicting the action
chunk) trains on windows streamed from a converted dataset. Rank, world size and local rank come
from the torchrun environment; gloo on CPU, NCCL on GPUs. Per rank it logs step time and *data
wait* (time the step spent waiting for the next batch), checkpoints model, optimiser and loader
state, and resumes from a checkpoint exactly where the loader stopped.

One machine:
    torchrun --nproc-per-node 2 tools/examples/train_example.py out/demo --epochs 1 --checkpoint out/ckpt
Two nodes (run on each, NODE = 0 or 1):
    torchrun --nnodes 2 --node-rank NODE --nproc-per-node 2 --master-addr HOST --master-port 29500 \\
        tools/examples/train_example.py s3://bucket/dataset --checkpoint /shared/ckpt
An S3-compatible store (MinIO, Ceph, ...): ``--storage-options '{"endpoint_url": "http://minio:9000"}'``
(the options of ``epishard --storage-options``), or the same through the environment that every rank
inherits from torchrun: ``AWS_ENDPOINT_URL=http://minio:9000`` (botocore), or any fsspec option as
``FSSPEC_S3_ENDPOINT_URL=...`` (``FSSPEC_<PROTOCOL>_<OPTION>``); credentials from ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` or ``AWS_PROFILE``. Explicit options win over the environment.
Resume: the same command with ``--resume``. Each rank saves its loader state
(``loader.rank<R>.pt``); on resume every rank loads the states of **all** ranks of the run that
saved them, so the number of processes (or ``--workers``) may change (elastic resume): the windows
of the interrupted epoch that no rank consumed are dealt to the new ranks, each yielded once, the
same number of steps on every rank, and the following epochs are the new layout's own plans:
    torchrun --nproc-per-node 2 tools/examples/train_example.py out/demo --checkpoint out/ckpt --stop-after 5
    torchrun --nproc-per-node 3 tools/examples/train_example.py out/demo --checkpoint out/ckpt --resume

Balancing (``--balance``): the reader is ``balance.streaming.BalancedWindowDataset``; each rank
reorders its own stream in chunks of ``--chunk-batches`` batches so that every step's batches have
similar cost on all ranks (cost: ``balance.cost.CostModel`` sequence tokens = instruction tokens +
vision tokens + action steps, known from the index before decoding). Every step the batches' costs
are gathered from all ranks (one small ``all_gather``) into ``balance.telemetry.StepTelemetry``;
rank 0 prints a summary per epoch and for the run (max/mean rank cost, padded and packed step cost,
padding fraction). ``--balance --chunk-batches 1`` keeps the plain reader's batches (it only sorts
inside each batch) and so gives the telemetry of the unbalanced run for comparison.
``--balance --balance-scope global`` deals every step's windows to ranks by cost from the global
window list instead (``balance.globaldeal``; each rank reads the episodes it is dealt with ranged reads).
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import re
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from epishard.balance.telemetry import StepTelemetry
from epishard.cli.stream import add_per_episode_arguments, per_episode_options
from epishard.format.storage import parse_storage_options
from epishard.stream import DatasetSource, PostProcess, WindowDataset, WindowLoader, WindowSpec, segment


class TinyPolicy(nn.Module):
    """images ``[B, T, C, H, W]`` per camera + state ``[B, T_s, D_s]`` -> actions ``[B, H, D_a]``."""

    def __init__(self, cameras: int, state_dim: int, action_dim: int, horizon: int, width: int = 32):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, width, 5, stride=4),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.state = nn.Linear(state_dim, width)
        self.head = nn.Sequential(
            nn.Linear(width * (cameras + 1), 4 * width), nn.ReLU(), nn.Linear(4 * width, horizon * action_dim)
        )
        self.horizon, self.action_dim = horizon, action_dim

    def forward(self, images: list[torch.Tensor], state: torch.Tensor) -> torch.Tensor:
        feats = []
        for x in images:
            b, t = x.shape[:2]
            feats.append(self.encoder(x.flatten(0, 1).float() / 255).view(b, t, -1).mean(1))
        feats.append(self.state(state[:, -1]))
        return self.head(torch.cat(feats, -1)).view(-1, self.horizon, self.action_dim)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dataset", help="converted dataset: a folder or any fsspec URL (s3://, gs://, https://, hf://)")
    p.add_argument(
        "--storage-options",
        type=parse_storage_options,
        default=None,
        metavar="JSON",
        help='fsspec options for the dataset URL, e.g. \'{"endpoint_url": "http://minio:9000"}\' '
        "(merged over FSSPEC_<PROTOCOL>_<OPTION> variables; AWS_ENDPOINT_URL etc. are read by the client)",
    )
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per process")
    p.add_argument("--frames", type=int, default=3, help="frames per camera over --span rows")
    p.add_argument("--span", type=int, default=9)
    p.add_argument("--horizon", type=int, default=8)
    p.add_argument("--size", type=int, default=64, help="frames resized to size x size")
    add_per_episode_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--checkpoint", help="folder for checkpoints (written every --save-every steps and at epoch ends)")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --checkpoint")
    p.add_argument(
        "--stop-after", type=int, default=0, help="exit after this many steps (simulates a crash; for tests)"
    )
    p.add_argument(
        "--dump-keys", help="write this rank's (epoch, step, episode, frame) sample keys to DUMP.rank<R>.jsonl"
    )
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument(
        "--balance",
        action="store_true",
        help="cost-balanced batches (balance.streaming.BalancedWindowDataset) and per-step cost telemetry",
    )
    p.add_argument(
        "--chunk-batches",
        type=int,
        default=None,
        help="with --balance: balancing horizon (local: batches per worker, default 16, 1: the plain reader's "
        "batches; global: steps per chunk, default 64)",
    )
    p.add_argument(
        "--balance-scope",
        choices=("local", "global"),
        default="local",
        help="with --balance: local (each rank reorders its own shards' windows) or global (every step dealt to "
        "ranks by cost from the global window list; ranged reads)",
    )
    return p.parse_args()


def setup() -> tuple[int, int, torch.device]:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}") if torch.cuda.is_available() else torch.device("cpu")
    torch.set_num_threads(1)
    return rank, world, device


def bare(model: nn.Module) -> nn.Module:
    """The model inside a ``DistributedDataParallel`` wrapper (or the model itself)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def model_state(state: dict) -> dict:
    """A checkpoint's model weights without DDP's ``module.`` prefix (as checkpoints of earlier versions hold)."""
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    state = dict(state)
    consume_prefix_in_state_dict_if_present(state, "module.")
    return state


def save(folder: str, rank: int, model, optimizer, loader: WindowLoader, step: int) -> None:
    """Model and optimiser from rank 0 (identical on all ranks under DDP); loader state per rank.

    The model's weights are the bare model's (no DDP ``module.`` prefix): the checkpoint loads into
    ``TinyPolicy`` in a plain process as well as under torchrun.
    """
    os.makedirs(folder, exist_ok=True)

    def atomic(obj, name):
        tmp = os.path.join(folder, f".{name}.tmp")
        torch.save(obj, tmp)
        os.replace(tmp, os.path.join(folder, name))

    if dist.is_initialized():
        dist.barrier()
    if rank == 0:
        atomic({"model": bare(model).state_dict(), "optimizer": optimizer.state_dict(), "step": step}, "model.pt")
    atomic(loader.state_dict(), f"loader.rank{rank}.pt")
    if dist.is_initialized():
        dist.barrier()


def loader_states(folder: str) -> list[dict]:
    """Every rank's loader state of the last checkpoint in ``folder`` (``loader.rank<R>.pt``).

    Files of ranks beyond the saving run's world size (left by an earlier, larger run) are ignored.
    """
    states = {}
    for path in glob.glob(os.path.join(glob.escape(folder), "loader.rank*.pt")):  # a folder, not a pattern
        found = re.fullmatch(r"loader\.rank(\d+)\.pt", os.path.basename(path))
        if found:
            states[int(found.group(1))] = torch.load(path)
    world = states[0]["world_size"] if 0 in states else len(states)
    return [states[r] for r in sorted(states) if r < world]


def gather_costs(costs: torch.Tensor, world: int) -> np.ndarray:
    """float64 ``[world, batch]``: this step's per-sample costs (``__cost__``) on every rank.

    Every rank's batch has the same size in every step (the reader's guarantee), so a plain
    ``all_gather`` works; on NCCL the tensor goes through the device.
    """
    costs = costs.to(torch.float64)
    if not dist.is_initialized():
        return costs.numpy()[None]
    if dist.get_backend() == "nccl":
        costs = costs.cuda()
    parts = [torch.empty_like(costs) for _ in range(world)]
    dist.all_gather(parts, costs)
    return torch.stack(parts).cpu().numpy()


def report_balance(s: dict, label: str, world: int) -> None:
    """Print one telemetry summary (a line for people, a JSON line for tools)."""
    if not s["steps"]:
        print(f"balance telemetry {label}: no steps", flush=True)
        return
    print(
        f"balance telemetry {label}: {s['steps']} steps over {world} ranks, max/mean rank cost "
        f"{s['imbalance_mean']:.3f} mean (p95 {s['imbalance_p95']:.3f}, max {s['imbalance_max']:.3f}, "
        f"whole {s['imbalance_total']:.3f}), step cost padded {s['step_time_padded']:.1f} / packed "
        f"{s['step_time_packed']:.1f}, padding {100 * s['padding']:.1f}%",
        flush=True,
    )
    print("balance telemetry json " + json.dumps({"label": label, "world_size": world, **s}), flush=True)


def main() -> int:
    args = parse()
    rank, world, device = setup()
    try:
        return train(args, rank, world, device)
    finally:
        leave_process_group()


def train(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> int:
    """The training loop; returns the exit status. Its model (DDP's Reducer) is freed on return."""
    source = DatasetSource(args.dataset, args.storage_options)
    cams = source.cameras
    spec = WindowSpec(
        cameras={c: segment(0, args.span - 1, args.frames) for c in cams},
        state_offsets=(-1, 0),
        action_horizon=args.horizon,
        boundary="pad",
        **per_episode_options(args),
    )
    kw = dict(
        seed=args.seed,
        postprocess=PostProcess(size=(args.size, args.size)),
        normalize={"action": "mean_std", "observation.state": "mean_std"},
    )
    if args.balance:
        from epishard.balance.streaming import BalancedWindowDataset

        ds = BalancedWindowDataset(
            source, spec, batch_size=args.batch_size, chunk_batches=args.chunk_batches, scope=args.balance_scope, **kw
        )
    else:
        ds = WindowDataset(source, spec, **kw)
    loader = WindowLoader(ds, batch_size=args.batch_size, num_workers=args.workers, persistent_workers=args.workers > 0)
    features = source.manifest.features or {}
    model = TinyPolicy(len(cams), features["observation.state"].shape[0], features["action"].shape[0], args.horizon).to(
        device
    )
    if dist.is_initialized():
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step = 0
    if args.resume:
        state = torch.load(os.path.join(args.checkpoint, "model.pt"), map_location=device)
        bare(model).load_state_dict(model_state(state["model"]))
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        try:  # every rank's state: the saving run may have had another number of processes or workers
            loader.load_state_dict(loader_states(args.checkpoint))
        except ValueError as exc:  # a rank's state missing, or another seed: refused, say why
            print(f"[rank {rank}] {exc}", file=sys.stderr, flush=True)
            return 1
    first_epoch = loader.epoch
    keys = None
    if args.dump_keys:  # written through the whole run (flushed per step), closed at exit
        keys = open(f"{args.dump_keys}.rank{rank}.jsonl", "a" if args.resume else "w")  # noqa: SIM115
    data_wait = compute = 0.0
    steps_run = 0
    telemetry = (StepTelemetry(), StepTelemetry()) if args.balance else None  # this epoch, the whole run
    for epoch in range(first_epoch, args.epochs):
        tick = time.perf_counter()
        for batch in loader:
            got = time.perf_counter()
            data_wait += got - tick
            images = [batch[c].to(device) for c in cams]
            pred = model(images, batch["observation.state"].to(device))
            mask = ~batch["action_is_pad"].to(device)
            loss = ((pred - batch["action"].to(device)) ** 2).mean(-1)[mask].mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            steps_run += 1
            if telemetry is not None:  # one small all_gather per step (after DDP's own sync in backward)
                step_costs = gather_costs(batch["__cost__"], world)
                if rank == 0:
                    for t in telemetry:
                        t.add(step_costs)
            tick = time.perf_counter()
            compute += tick - got
            if keys:
                for e, f in zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=False):
                    keys.write(json.dumps([epoch, step, int(batch["dataset"][0]), e, f]) + "\n")
                keys.flush()
            if args.log_every and step % args.log_every == 0:
                print(
                    f"[rank {rank}] epoch {epoch} step {step} loss {loss.item():.4f} "
                    f"data wait {data_wait:.2f}s compute {compute:.2f}s",
                    flush=True,
                )
            if args.checkpoint and args.save_every and step % args.save_every == 0:
                save(args.checkpoint, rank, model, optimizer, loader, step)
            if args.stop_after and steps_run >= args.stop_after:
                print(f"[rank {rank}] stopping after {steps_run} steps (--stop-after)", flush=True)
                return 0
        if args.checkpoint:
            save(args.checkpoint, rank, model, optimizer, loader, step)
        if telemetry is not None and rank == 0:
            report_balance(telemetry[0].summary(), f"epoch {epoch}", world)
    summary = torch.tensor([data_wait, compute, float(steps_run)])
    if dist.is_initialized():
        gathered = [torch.zeros(3) for _ in range(world)]
        dist.all_gather(gathered, summary)
    else:
        gathered = [summary]
    if rank == 0:
        for r, (wait, comp, n) in enumerate(t.tolist() for t in gathered):
            print(
                f"rank {r}: {int(n)} steps, data wait {wait:.2f}s ({100 * wait / max(wait + comp, 1e-9):.0f}% of "
                f"step time), compute {comp:.2f}s",
                flush=True,
            )
        if telemetry is not None:
            report_balance(telemetry[1].summary(reset=False), "run", world)
    return 0


def leave_process_group() -> None:
    """Destroy the process group after the model that used it is gone (call once ``train`` returned).

    DDP's Reducer holds the process group; if the group's last reference were dropped from the
    Reducer's destructor (at interpreter exit), ``~ProcessGroupGloo`` would join gloo's threads with
    the GIL held while one of them needs the GIL to free a finished collective's tensors
    (pytorch/pytorch#56297): the process hung after its last step, on one rank in a few runs. Here
    the Reducer is already freed, and ``destroy_process_group`` releases the GIL.
    """
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
