"""The ``balance --e2e`` scenario (end to end): DDP training steps per second without, with local and with
global cost balancing.

``torchrun`` (gloo backend, 2 processes on this machine) trains a toy VLA-like transformer fed by the
real streaming reader (``stream.WindowLoader``, 1 DataLoader worker per process), alternating the
variants round by round (plain, local, global, plain, local, global, ...); steps per second are
medians over rounds, and only their ratios count (machines are noisy).

- plain: ``stream.WindowDataset``, the reader's own order (its pool shuffle).
- local: ``balance.streaming.BalancedWindowDataset`` (``scope="local"``) with ``chunk_batches``
  (default 16) and ``cost = WindowCost.from_dataset(ds, CostModel.transformer(d_model))``: each rank
  sorts chunks of its own stream by cost into blocks of similar cost and every rank puts its blocks
  in the same shared order, so step t carries the k-th heaviest block of the chunk on every rank.
  Nothing moves between ranks: each rank still reads only its own shards (``FetchPolicy`` stream mode).
- global: ``BalancedWindowDataset(scope="global", chunk_batches=--global-chunk)``: every step's
  windows are dealt to ranks by cost from the global window list (``balance.globaldeal``), and each
  rank fetches the members it is dealt with ranged reads, whichever shard they sit in.

Round r runs epoch r of the plan for every variant: the same windows are processed (the global deal
keeps the plain plan's windows), only dealt and batched differently. Per variant the bench also
reports bytes read per sample and frames decoded per frame returned (the reader's telemetry, all
ranks), and the batch diversity (distinct episodes per batch).

Data (generated here, written with ``shardwriter.convert``; ``--keep DIR`` keeps it): ``--episodes``
(24) episodes of 40-100 frames at 20 fps, one camera, H.264 56x56 (``tests/videogen.make_video``,
keyframe every 10 frames), 8-dim state, 7-dim action, 3 episodes per shard (8 shards; each rank
reads about half of them, 12 episodes, a new split every epoch). Each episode has its own task
instruction whose length is long-tailed, as in VLM/VLA SFT mixes where most instructions are short
and a few carry multi-step plans: tokens of ``lognormal(ln 40, 0.9)`` taken at the evenly spaced
quantiles ``(i + 0.5) / episodes`` (so 24 episodes show the tail rather than a lucky draw), rounded,
clipped to [6, 480], in random order: 6 ... 250, median 40, mean 58. Each is written as text of
``4 * tokens`` characters, so ``balance.cost.estimate_tokens`` (ceil(chars / 4)) counts exactly them.
Window: 2 frames (rows 0 and +8), state at row 0, a 16-step action chunk, pad mode, every
``--stride`` (1) anchor: about 1700 windows per epoch, about 107 steps of 8 per rank.

Toy model (``ToyVLA``): a pre-LN transformer (``--d-model`` 192, ``--layers`` 2, 4 heads, MLP 4x) over
the sample's sequence: instruction tokens (4-character pieces, hashed into a 512-entry embedding),
vision tokens (14x14-pixel patches of both frames: 2 * 16 = 32) and one query token per action step
(16, plus a state projection); it regresses the normalised action chunk (MSE). A batch is padded to
its longest instruction (key padding mask), so compute per step is ``batch * longest sequence`` on
each rank and DDP's gradient all-reduce makes every rank wait for the slowest. The per-sample cost
is that sequence length ``L`` through ``CostModel.transformer(d_model)``: ``L + L^2 / (12 d_model)``;
the bench checks that the cost the reader attached before decoding (``__cost__``) equals the cost
recomputed from the decoded batch.

Telemetry per step (rank 0, ``balance.telemetry``): every rank's batch costs gathered with
``all_gather``; max/mean rank cost (packed), the padded step cost (slowest rank's
``batch * max cost``, the model's step time in cost units) and the padding fraction (share of the
padded compute that is padding). The summary gives, per variant, the speed-up over plain (medians
and per round), the ratio the telemetry predicts (padded step cost, plain / variant), bytes read
and requests per sample, frames decoded per frame returned and distinct episodes per batch (batch
diversity: what cost-sorting trades for speed when cost depends on the episode).

    python tools/bench/run.py balance --e2e                  # generate data, run torchrun, print a table (~3-5 min)
    python tools/bench/run.py balance --e2e --json           # JSON lines instead
    python tools/bench/run.py balance --e2e --rounds 3 --chunk-batches 8 --keep /tmp/bal_e2e
    python tools/bench/run.py balance --e2e --variants plain,global --global-chunk 0   # 0: the whole epoch
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

import measure
import numpy as np

REPO = measure.REPO

CAMERA = "observation.images.front"
SIZE = 56  # stored frame size (no resize): 4 x 4 patches of 14 x 14 pixels per frame
PATCH = 14
FPS = 20
STATE_DIM, ACTION_DIM = 8, 7
HORIZON = 16
FRAME_OFFSETS = (0, 8)
VOCAB = 512
PHRASES = [
    "pick up the red cube",
    "place it in the blue bowl",
    "open the top drawer",
    "move the gripper left",
    "avoid the mug on the right",
    "then wipe the table with the sponge",
    "close the drawer slowly",
    "rotate the bottle upright",
    "push the tray to the edge",
    "hand the cup to the person",
    "if the bowl is full use the plate",
    "keep the lid level",
]


# --- data ------------------------------------------------------------------------------------------


def instruction(tokens: int, rng: np.random.Generator) -> str:
    """An instruction of exactly ``4 * tokens`` characters (``estimate_tokens`` gives ``tokens``)."""
    words = []
    while sum(len(w) + 2 for w in words) < 4 * tokens:
        words.append(PHRASES[int(rng.integers(len(PHRASES)))])
    return ", ".join(words)[: 4 * tokens]


def make_dataset(out: str, episodes: int, per_shard: int, seed: int) -> dict:
    from videogen import make_episode_table, make_video

    from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert

    rng = np.random.default_rng(seed)
    lengths = rng.integers(40, 101, episodes)
    # Long-tailed instruction lengths: lognormal(ln 40, 0.9) at evenly spaced quantiles (so 24 episodes
    # show the tail, not a lucky draw), in random order.
    q = (np.arange(episodes) + 0.5) / episodes
    z = np.array([statistics.NormalDist().inv_cdf(float(x)) for x in q])
    tokens = rng.permutation(np.clip(np.round(40 * np.exp(0.9 * z)), 6, 480).astype(int))
    eps = []
    for e, (n, t) in enumerate(zip(lengths.tolist(), tokens.tolist(), strict=False)):
        video = make_video(None, n, height=SIZE, width=SIZE, gop=10, fps=FPS, start_number=100 * e)
        eps.append(
            Episode(
                source="bal",
                episode_index=e,
                fps=FPS,
                tasks=(instruction(t, rng),),
                table=make_episode_table(n, state_dim=STATE_DIM, action_dim=ACTION_DIM, fps=FPS),
                videos={CAMERA: CameraVideo(video)},
            )
        )
    convert(
        [Source(name="bal", episodes=eps, fps=FPS)],
        out,
        ConvertOptions(max_episodes_per_shard=per_shard, progress=False),
    )
    return {"episodes": episodes, "frames": lengths.tolist(), "tokens": tokens.tolist()}


# --- the distributed part (one process per rank, under torchrun) --------------------------------------


def toy_model(d: int, layers: int, heads: int):
    import torch
    from torch import nn

    class ToyVLA(nn.Module):
        """Instruction tokens + image patches + action queries -> one transformer -> action chunk."""

        def __init__(self):
            super().__init__()
            self.text = nn.Embedding(VOCAB, d)
            self.patch = nn.Linear(3 * PATCH * PATCH, d)
            self.state = nn.Linear(STATE_DIM, d)
            self.query = nn.Parameter(torch.randn(HORIZON, d) * 0.02)
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
            self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d, ACTION_DIM)

        def forward(self, ids, pad, frames, state):
            b, _, c, _, _ = frames.shape
            p = frames.float().div(255).unfold(3, PATCH, PATCH).unfold(4, PATCH, PATCH)  # b t c H W p p
            p = p.permute(0, 1, 3, 4, 2, 5, 6).reshape(b, -1, c * PATCH * PATCH)
            vision = self.patch(p)
            actions = self.query.expand(b, -1, -1) + self.state(state[:, -1])[:, None]
            x = torch.cat([self.text(ids), vision, actions], 1)
            mask = torch.cat([pad, torch.zeros(b, vision.shape[1] + HORIZON, dtype=torch.bool)], 1)
            return self.head(self.body(x, src_key_padding_mask=mask)[:, -HORIZON:])

    return ToyVLA()


class Tokens:
    """4-character pieces hashed into ``VOCAB`` ids: ``len(ids) == estimate_tokens(text)``; cached per text."""

    def __init__(self):
        self.cache: dict[str, list[int]] = {}

    def __call__(self, texts):
        import torch

        ids = [
            self.cache.setdefault(t, [zlib.crc32(t[i : i + 4].encode()) % VOCAB for i in range(0, len(t), 4)])
            for t in texts
        ]
        longest = max(len(i) for i in ids)
        out = torch.zeros(len(ids), longest, dtype=torch.long)
        pad = torch.ones(len(ids), longest, dtype=torch.bool)
        for k, i in enumerate(ids):
            out[k, : len(i)] = torch.tensor(i, dtype=torch.long)
            pad[k, : len(i)] = False
        return out, pad, np.array([len(i) for i in ids], dtype=np.float64)


def summarize(steps: list[np.ndarray]) -> dict:
    """``epoch_summary`` of per-step ``[world, batch]`` costs."""
    from epishard.balance import StepTelemetry

    telemetry = StepTelemetry()
    for c in steps:
        telemetry.add(c)
    return telemetry.summary()


def worker(args) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn

    from epishard.balance import CostModel, WindowCost
    from epishard.balance.streaming import BalancedWindowDataset
    from epishard.stream import DatasetSource, WindowDataset, WindowLoader, WindowSpec
    from epishard.stream.options import ReadOptions
    from epishard.stream.telemetry import summarize as telemetry_totals

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = WindowSpec(
        cameras={CAMERA: FRAME_OFFSETS}, state_offsets=(0,), action_horizon=HORIZON, boundary="pad", stride=args.stride
    )
    cost_model = CostModel.transformer(args.d_model)
    cost_fn = WindowCost(DatasetSource(args.dataset).index, spec, cost_model)  # stored frame size: no resize
    model = nn.parallel.DistributedDataParallel(toy_model(args.d_model, args.layers, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = Tokens()
    vision = len(FRAME_OFFSETS) * (SIZE // PATCH) ** 2

    def run(variant: str, epoch: int) -> dict:
        kw = dict(
            seed=args.seed,
            normalize={"action": "mean_std", "observation.state": "mean_std"},
            read=ReadOptions(telemetry=True),
        )
        if variant == "local":
            ds = BalancedWindowDataset(
                args.dataset, spec, batch_size=args.batch_size, chunk_batches=args.chunk_batches, cost=cost_fn, **kw
            )
        elif variant == "global":
            ds = BalancedWindowDataset(
                args.dataset,
                spec,
                batch_size=args.batch_size,
                chunk_batches=args.global_chunk or 1 << 30,  # 0: one chunk, the whole epoch
                cost=cost_fn,
                scope="global",
                **kw,
            )
        else:
            ds = WindowDataset(args.dataset, spec, **kw)
        ds.set_epoch(epoch)
        loader = WindowLoader(ds, batch_size=args.batch_size, num_workers=args.workers)
        costs_seen, mismatch, wait, steps, tele, distinct = [], 0.0, 0.0, 0, [], []
        start = time.perf_counter()
        it = iter(loader)
        batch = next(it)
        first = time.perf_counter() - start
        dist.barrier()
        t0 = time.perf_counter()
        while batch is not None:
            ids, pad, n_text = tokens(batch["task"])
            length = n_text + vision + HORIZON
            cost = length + cost_model.quadratic * length**2  # == CostModel.transformer(d) on the features
            if "__cost__" in batch:
                mismatch = max(mismatch, float(np.max(np.abs(batch["__cost__"].numpy() - cost) / cost)))
            tele.append(batch["__telemetry__"])
            distinct.append(len(set(batch["episode_index"].tolist())))
            pred = model(ids, pad, batch[CAMERA], batch["observation.state"])
            loss = ((pred - batch["action"]) ** 2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            gathered = [torch.empty(len(cost), dtype=torch.float64) for _ in range(world)]
            dist.all_gather(gathered, torch.from_numpy(cost))
            costs_seen.append(torch.stack(gathered).numpy())
            tick = time.perf_counter()
            batch = next(it, None)
            wait += time.perf_counter() - tick
        dist.barrier()
        elapsed = time.perf_counter() - t0
        del it, loader
        waits = [torch.zeros(2) for _ in range(world)]
        dist.all_gather(waits, torch.tensor([wait, first]))
        totals = telemetry_totals(tele)
        mine = torch.tensor(
            [totals[k] for k in ("bytes_read", "samples", "frames_decoded", "frames_returned", "requests")]
            + [float(np.sum(distinct)), float(len(distinct))],
            dtype=torch.float64,
        )
        counts = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(counts, mine)
        read, samples, decoded, returned, requests, distinct_sum, batches = torch.stack(counts).sum(0).tolist()
        return {
            "variant": variant,
            "epoch": epoch,
            "steps": steps,
            "seconds": elapsed,
            "steps_per_s": steps / elapsed,
            "samples_per_s": sum(int(c.shape[1]) for c in costs_seen) * world / elapsed,
            "data_wait_s": [float(w[0]) for w in waits],
            "first_batch_s": [float(w[1]) for w in waits],
            "cost_mismatch": mismatch,
            "bytes_per_sample": read / samples,
            "requests_per_sample": requests / samples,
            "decoded_per_returned": decoded / returned,
            "distinct_episodes_per_batch": distinct_sum / batches,
            **summarize(costs_seen),
        }

    for r in range(args.rounds):
        for variant in args.variants.split(","):
            out = run(variant, r)
            if rank == 0:
                print("BENCH " + json.dumps(out), flush=True)
    # Free DDP's Reducer while the group is still registered, then destroy the group: a group whose
    # last reference goes with the Reducer is destroyed with the GIL held and can deadlock against
    # gloo's threads at exit (pytorch/pytorch#56297; see tools/examples/train_example.py).
    model = optimizer = None  # the cells run() shares: their last references
    gc.collect()
    dist.destroy_process_group()
    return 0


# --- the driver --------------------------------------------------------------------------------------


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def emit(args, record: dict, line: str | None = None) -> None:
    measure.emit(record)
    if not args.json and line is not None:
        print(line, flush=True)


def driver(args) -> int:
    tmp = None
    data = args.keep
    if data is None:
        tmp = tempfile.mkdtemp(prefix="bench_balance_e2e_")
        data = os.path.join(tmp, "ds")
    try:
        t = time.perf_counter()
        if not os.path.exists(os.path.join(data, "manifest.json")):
            info = make_dataset(data, args.episodes, args.per_shard, args.seed)
            with open(os.path.join(data, "bench_info.json"), "w") as f:
                json.dump(info, f)
        with open(os.path.join(data, "bench_info.json")) as f:
            info = json.load(f)
        tok = np.array(info["tokens"])
        print(
            f"data: {info['episodes']} episodes, {sum(info['frames'])} frames, instruction tokens median "
            f"{np.median(tok):.0f} mean {tok.mean():.0f} max {tok.max()} (sorted: {sorted(tok.tolist())}); "
            f"{time.perf_counter() - t:.1f}s",
            file=sys.stderr,
            flush=True,
        )
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(args.nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_port()),
            str(measure.RUN),
            "balance",
            "--e2e",
            "--worker",
            "--dataset",
            data,
            *args.passthrough,
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1",
        }
        print("running: torchrun " + " ".join(cmd[3:]), file=sys.stderr, flush=True)
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        results, log = [], []
        for line in proc.stdout:
            log.append(line)
            if line.startswith("BENCH "):
                results.append(json.loads(line[6:]))
                r = results[-1]
                print(
                    f"  round {r['epoch']} {r['variant']:8s} {r['steps_per_s']:.3f} steps/s",
                    file=sys.stderr,
                    flush=True,
                )
        if proc.wait() != 0:
            sys.stderr.write("".join(log[-80:]))
            return proc.returncode
        print(f"torchrun: {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    report(args, info, results)
    return 0


METRICS = (
    "steps_per_s",
    "imbalance_mean",
    "step_time_padded",
    "step_time_packed",
    "padding",
    "bytes_per_sample",
    "requests_per_sample",
    "decoded_per_returned",
    "distinct_episodes_per_batch",
)


def report(args, info: dict, results: list[dict]) -> None:
    variants = args.variants.split(",")
    emit(
        args,
        {
            "bench": "balance_e2e",
            "kind": "config",
            "nproc": args.nproc,
            "workers": args.workers,
            "batch_size": args.batch_size,
            "chunk_batches": args.chunk_batches,
            "global_chunk": args.global_chunk,
            "variants": variants,
            "d_model": args.d_model,
            "layers": args.layers,
            "stride": args.stride,
            "rounds": args.rounds,
            "episodes": info["episodes"],
            "tokens": info["tokens"],
            "load_average": os.getloadavg(),
        },
    )
    if not args.json:
        print(
            f"\nDDP on {args.nproc} processes (gloo), {args.workers} DataLoader worker each, batch {args.batch_size} "
            f"per rank, local chunk_batches {args.chunk_batches}, global chunk {args.global_chunk or 'epoch'} steps, "
            f"toy transformer d={args.d_model} x {args.layers} layers, load average {os.getloadavg()[0]:.1f}\n"
        )
        print(
            "| round | variant | steps | steps/s | first batch s | data wait s (per rank) | max/mean rank cost "
            "| padded step cost | packed step cost | padding | bytes read/sample | frames decoded/returned "
            "| episodes/batch |"
        )
        print("|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        emit(
            args,
            {"bench": "balance_e2e", "kind": "phase", **r},
            f"| {r['epoch']} | {r['variant']} | {r['steps']} | {r['steps_per_s']:.3f} | "
            f"{max(r['first_batch_s']):.1f} | "
            f"{' / '.join(f'{w:.1f}' for w in r['data_wait_s'])} | {r['imbalance_mean']:.3f} | "
            f"{r['step_time_padded']:.0f} | {r['step_time_packed']:.0f} | {100 * r['padding']:.1f}% | "
            f"{r['bytes_per_sample']:.0f} | {r['decoded_per_returned']:.2f} | {r['distinct_episodes_per_batch']:.2f} |",
        )
    by = {v: [r for r in results if r["variant"] == v] for v in variants}
    med = {v: {k: statistics.median(r[k] for r in rs) for k in METRICS} for v, rs in by.items()}
    summary: dict = {"bench": "balance_e2e", "kind": "summary", **med}
    lines = []
    if not args.json:
        print(
            "\n| variant | steps/s (median) | speed-up over plain (per round) | predicted (padded cost) "
            "| max/mean rank cost | padding | bytes read/sample | requests/sample | frames decoded/returned "
            "| episodes/batch |"
        )
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for v in variants:
        m = med[v]
        ratio = m["steps_per_s"] / med["plain"]["steps_per_s"] if "plain" in med else float("nan")
        rounds = [x["steps_per_s"] / p["steps_per_s"] for p, x in zip(by.get("plain", []), by[v], strict=False)]
        predicted = med["plain"]["step_time_padded"] / m["step_time_padded"] if "plain" in med else float("nan")
        summary[f"ratio_{v}"], summary[f"ratio_per_round_{v}"], summary[f"predicted_{v}"] = ratio, rounds, predicted
        lines.append(
            f"| {v} | {m['steps_per_s']:.3f} | **{ratio:.2f}x** ({', '.join(f'{x:.2f}' for x in rounds)}) | "
            f"{predicted:.2f}x | {m['imbalance_mean']:.3f} | {100 * m['padding']:.1f}% | {m['bytes_per_sample']:.0f} | "
            f"{m['requests_per_sample']:.3f} | {m['decoded_per_returned']:.2f} | "
            f"{m['distinct_episodes_per_batch']:.2f} |"
        )
    summary["cost_mismatch"] = max((r["cost_mismatch"] for r in results if r["variant"] != "plain"), default=0.0)
    emit(
        args,
        summary,
        "\n".join(lines)
        + f"\n__cost__ (from the index, before decoding) vs cost from the decoded batch: max relative difference "
        f"{summary['cost_mismatch']:.1e}",
    )


def e2e_options(p) -> None:
    p.add_argument("--e2e", action="store_true", help="measure DDP training end to end instead of simulating")
    p.add_argument("--keep", help="dataset folder: generated there if absent, kept (default: a temporary folder)")
    p.add_argument("--episodes", type=int, default=24)
    p.add_argument("--per-shard", type=int, default=3, help="episodes per shard")
    p.add_argument("--nproc", type=int, default=2, help="torchrun processes")
    p.add_argument("--rounds", type=int, default=2, help="rounds of the variants; round r runs epoch r")
    p.add_argument("--variants", default="plain,local,global", help="comma-separated: plain, local, global")
    p.add_argument(
        "--global-chunk", type=int, default=64, help="global scope: steps per balancing chunk (0: the whole epoch)"
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--chunk-batches", type=int, default=16)
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per process")
    p.add_argument("--stride", type=int, default=1)
    p.add_argument("--d-model", type=int, default=192)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dataset", help=argparse.SUPPRESS)


def e2e(args) -> int:
    if args.worker:
        return worker(args)
    args.passthrough = [
        f"--{k.replace('_', '-')}={getattr(args, k)}"
        for k in (
            "rounds",
            "variants",
            "global_chunk",
            "batch_size",
            "chunk_batches",
            "workers",
            "stride",
            "d_model",
            "layers",
            "seed",
        )
    ]
    return driver(args)
