"""Benchmark: ``convert --ray`` with 1 and 2 nodes, and ``RayWindowLoader`` against ``WindowLoader``.

Runs on a loopback Ray cluster in a network namespace of its own (``tests/raycluster``; root):
nodes of one CPU each, the head first, then a second node joins.

1. Conversion of DATASET (default: the bundled sample, one episode per shard so that there are
   tasks to spread) into a local folder: single-machine ``convert`` (1 process), then Ray with 1
   node and with 2 nodes. Seconds (median of ``--rounds``), episodes/s, frames/s, MB/s of source.
2. Streaming the converted dataset (9 frames over 33, 224x224, 16-step action chunk, batch 8):
   ``WindowLoader`` with 1 and 2 workers, ``RayWindowLoader`` with 1 and 2 actors: samples/s over
   ``--batches`` batches after the first (start-up excluded), the trainer's wait per batch and the
   actors' samples per busy second; the per-batch transfer cost ``t`` (a ready batch from an actor to
   writable tensors in the trainer); and the model ``samples/s(n actors) = min(n x r, B / t)`` with
   ``r`` one actor's samples/s end to end (the 1-actor run).

    python tools/bench/run.py ray [--dataset DIR] [--rounds 1] [--batches 40] [--json]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import measure

from epishard.shardwriter import ConvertOptions, convert
from epishard.shardwriter.ray_convert import RayRunner
from epishard.stream import PostProcess, WindowDataset, WindowLoader, WindowSpec, segment


def _source_bytes(folder: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def bench_convert(dataset: str, tmp: str, rounds: int, runner) -> dict:
    times, manifest = [], None
    for r in range(rounds):
        out = f"{tmp}/conv-{r}"
        t = time.perf_counter()
        manifest = convert([dataset], out, ConvertOptions(max_episodes_per_shard=1, progress=False), runner=runner)
        times.append(time.perf_counter() - t)
        shutil.rmtree(out)
    s = statistics.median(times)
    t = manifest.totals
    return {
        "seconds": s,
        "episodes_per_s": t.episodes / s,
        "frames_per_s": t.frames / s,
        "source_MB_per_s": _source_bytes(dataset) / 1e6 / s,
    }


def bench_loader(make, batches: int) -> dict:
    """Samples/s over ``batches`` batches after the first one (actor/worker start-up excluded)."""
    loader = make()
    it = iter(loader)
    next(it)
    if hasattr(loader, "reset_telemetry"):
        loader.reset_telemetry()
    t = time.perf_counter()
    n = 0
    for _, batch in zip(range(batches), it, strict=False):
        n += len(batch["frame_index"])
    seconds = time.perf_counter() - t
    out = {"samples_per_s": n / seconds, "samples": n, "seconds": seconds}
    if hasattr(loader, "telemetry"):
        out.update(loader.telemetry())
        loader.close()
    return out


class _Replay:
    """An actor that returns the same (numpy) batch on every call: transfer cost without decoding."""

    def __init__(self, batch):
        self.batch = batch

    def next_batch(self):
        return self.batch


def bench_transfer(batch: dict, repeats: int = 30) -> dict:
    """Trainer seconds per batch to receive a ready batch from an actor (``ray.get`` from the object
    store) and make writable tensors of it, as ``RayWindowLoader`` does."""
    import ray

    from epishard.stream.ray_loader import _to_numpy, _to_torch

    actor = ray.remote(_Replay).options(num_cpus=0).remote(_to_numpy(batch))
    times = []
    for _ in range(repeats):
        ref = actor.next_batch.remote()
        ray.wait([ref])  # ready: what remains is the transfer
        t = time.perf_counter()
        _to_torch(ray.get(ref))
        times.append(time.perf_counter() - t)
    ray.kill(actor)
    nbytes = sum(v.numel() * v.element_size() for v in batch.values() if hasattr(v, "numel"))
    return {"seconds_median": statistics.median(times), "batch_MB": nbytes / 1e6}


SMOKE = {"batches": 2}


def options(ap) -> None:
    ap.add_argument("--dataset", default=str(measure.REPO / "sample" / "gr00t_robot_sim_picknplace"))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--batches", type=int, default=40)


def run(args) -> int:
    import raycluster  # tests/: here only (Ray's workers import this module without it for _Replay)

    why = raycluster.unavailable()
    if why:
        raise measure.Missing(f"no loopback Ray cluster here: {why}")
    if args.smoke:
        args.dataset = str(measure.smoke_source())
    tmp = tempfile.mkdtemp(prefix="bench_ray")
    results: dict = {"load_average_at_start": os.getloadavg()[0]}
    try:
        results["convert_local_1_process"] = bench_convert(args.dataset, tmp, args.rounds, None)
        with raycluster.loopback_namespace(), raycluster.cluster(nodes=1) as address:
            results["convert_ray_1_node"] = bench_convert(args.dataset, tmp, args.rounds, RayRunner())
            raycluster.add_node(address)
            results["convert_ray_2_nodes"] = bench_convert(args.dataset, tmp, args.rounds, RayRunner())
            root = f"{tmp}/stream"
            convert([args.dataset], root, ConvertOptions(max_episodes_per_shard=2, progress=False))
            from epishard.stream.ray_loader import RayWindowLoader

            cameras = json.loads(Path(root, "manifest.json").read_text())["cameras"]
            spec = WindowSpec(cameras={c: segment(0, 32, 9) for c in cameras}, action_horizon=16, boundary="pad")

            def dataset():
                return WindowDataset(root, spec, seed=0, postprocess=PostProcess(size=(224, 224)))

            for n in (1, 2):
                results[f"stream_window_loader_{n}_workers"] = bench_loader(
                    lambda n=n: WindowLoader(dataset(), batch_size=8, num_workers=n), args.batches
                )
            results["transfer_per_batch"] = bench_transfer(next(iter(WindowLoader(dataset(), batch_size=8))))
            for n in (1, 2):
                results[f"stream_ray_{n}_actors"] = bench_loader(
                    lambda n=n: RayWindowLoader(dataset(), batch_size=8, num_workers=n), args.batches
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # One actor's rate end to end (decode, collate, object-store put, Ray call), measured alone.
    rate = results["stream_ray_1_actors"]["samples_per_s"]
    transfer = results["transfer_per_batch"]["seconds_median"]
    results["model"] = {
        "per_actor_samples_per_s": rate,
        "per_actor_samples_per_busy_s": results["stream_ray_1_actors"]["samples_per_busy_s"],
        "transfer_s_per_batch": transfer,
        "samples_per_s_by_actors": {
            n: min(n * rate, 8 / transfer if transfer else float("inf")) for n in (1, 2, 4, 8, 16, 32)
        },
    }
    measure.emit(results)
    if not args.json:
        for name, r in results.items():
            print(name, json.dumps(r, default=float) if isinstance(r, dict) else r)
    return 0
