"""Benchmark: float32 batches out of DataLoader workers, fresh shared memory vs reused buffers vs uint8.

Three ways to get float32 frames in [0, 1] to the training step, side by side in one run, rounds
alternating (A B C A B C ...), every timed region at least ``--seconds`` (10) long after a warm-up:

  f32 fresh   today: ``FloatCollate`` writes each float32 batch into fresh shared memory in the
              worker (``default_collate``'s way); the main process maps it.
  f32 reused  ``BufferedCollate`` + ``HeldBatches`` (``WindowLoader(..., reuse_buffers=k)``): the
              worker writes into a ring of pre-faulted shared buffers, the main process keeps them mapped.
  f32 reused, unheld  (part 1 only) the same rings, but the main process drops each batch before
              the next arrives and keeps no reference: torch's ``shared_cache`` then maps the slot again
              every time (what ``HeldBatches`` avoids).
  u8+device   frames stay uint8 through the loader (``default_collate``, a quarter of the bytes); the
              conversion is ``to_device``'s fused multiply (uint8 in, float32 out).
  u8 reused+device  both: uint8 batches in reused buffers, converted as u8+device.

The consumer stands in for the host-to-device copy, with this CPU as the device: it writes the batch's
frames as float32 into a destination allocated once (a device's caching allocator reuses its memory):
a copy for f32, ``float_frames`` (``to_device``'s conversion) for u8, so u8+device pays its conversion
here, on the CPU; on an accelerator it is one fused elementwise kernel there (not measured: no GPU here).

Part 0, where the cost is, one process: a float32 batch (8 samples of ``[9, 3, H, W]``) converted from
uint8 into fresh private memory (malloc: an mmap per batch at these sizes), fresh shared memory (as a
worker's collate does) and memory allocated and touched once; wall ms of the allocation and of the
conversion, minor page faults per batch (``getrusage``), the systems alternating, each at least
``--seconds`` in all.

Part 1, collate alone: a synthetic dataset yields the same pre-made uint8 frames (no decoding), 9
frames ``[9, 3, H, W]`` per sample at the unitree (480x640) and gr00t (256x256) sizes, batch 8,
2 persistent workers. Reported per system: samples/s, float32 GB/s delivered, ms per sample; per batch
the worker's collate ms and minor page faults (``getrusage`` in the worker, around the collate) and
the main process's CPU ms and minor faults (``getrusage`` around the draw and the consumer).

Part 2, end to end: ``WindowLoader`` (2 persistent workers, batch 8, every anchor, 9 frames over a
33-frame span, 16-step action chunk) over the bundled sample (gr00t, 256x256) and, when present,
``../shared/data/unitree_g1_bottle_av1_v30`` (AV1 640x480), each converted once under ``--work``.

Command: ``python tools/bench/bench_collate.py [--seconds 10] [--rounds 2] [--k 2] [--part 0|1|2|all]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate

from epishard.stream.buffers import HeldBatches, ring_slots
from epishard.stream.collate import BufferedCollate, FloatCollate, float_frames

REPO = Path(__file__).resolve().parents[2]
CAM = "observation.images.cam"
FRAMES, BATCH, WORKERS = 9, 8, 2
SYSTEMS = ("f32 fresh", "f32 reused", "u8+device", "u8 reused+device")
SIZES = (("unitree 480x640", (480, 640)), ("gr00t 256x256", (256, 256)))
UNHELD = "f32 reused, unheld"  # part 1 only: the main process does not keep the slots mapped


def _usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


class Frames(IterableDataset):
    """Endless samples of pre-made uint8 frames (no decoding: the collate and the transfer alone)."""

    def __init__(self, height: int, width: int):
        self.height, self.width = height, width

    def __iter__(self):
        pool = [torch.randint(0, 256, (FRAMES, 3, self.height, self.width), dtype=torch.uint8) for _ in range(4)]
        i = 0
        while True:
            yield {
                CAM: pool[i % 4],
                f"{CAM}_is_pad": torch.zeros(FRAMES, dtype=torch.bool),
                "action": torch.zeros(16, 32),
                "episode_index": i,
                "task": "pick",
            }
            i += 1


class Measured:
    """Wraps a collate: the worker's wall ms and minor page faults of each call, as ``__collate__``."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, samples: list[dict]) -> dict:
        t0, (_, f0) = time.perf_counter(), _usage()
        batch = self.inner(samples)
        batch["__collate__"] = torch.tensor([(time.perf_counter() - t0) * 1e3, _usage()[1] - f0], dtype=torch.float64)
        return batch


def _collate(system: str, k: int, keys: list[str]):
    if system == "f32 fresh":
        return FloatCollate(keys)
    if system in ("f32 reused", UNHELD, "u8 reused+device"):
        return BufferedCollate(keys, slots=ring_slots(k, WORKERS, None))
    return default_collate


def _drain(batches, keys: list[str], seconds: float, warmup: int, held: HeldBatches | None) -> dict:
    """Draw ``warmup`` batches, then time at least ``seconds`` of draws plus the stand-in consumer."""
    dest: dict[str, torch.Tensor] = {}
    it = iter(batches)
    stats: dict[str, list] = {"collate_ms": [], "collate_faults": []}
    samples = n = 0
    t0 = c0 = f0 = 0.0
    while True:
        if n == warmup:
            t0, (c0, f0), samples = time.perf_counter(), _usage(), 0
        batch = next(it)
        if held is not None:
            held.received(batch)
        for key in keys:
            frames = batch[key]
            out = dest.get(key)
            if out is None or out.shape != frames.shape:
                out = dest[key] = torch.zeros(frames.shape, dtype=torch.float32)
            if frames.dtype == torch.uint8:
                float_frames(frames, out)  # to_device's conversion, with this CPU as the device
            else:
                out.copy_(frames)  # the host-to-device copy's stand-in
        if n >= warmup:
            stats["collate_ms"].append(float(batch["__collate__"][0]))
            stats["collate_faults"].append(float(batch["__collate__"][1]))
            samples += len(batch["episode_index"])
        n += 1
        elapsed = time.perf_counter() - t0
        if n > warmup and elapsed >= seconds:
            cpu, faults = _usage()
            batches = n - warmup
            return {
                "samples_s": samples / elapsed,
                "main_cpu_ms": (cpu - c0) * 1e3 / batches,
                "main_faults": (faults - f0) / batches,
                "collate_ms": statistics.median(stats["collate_ms"]),
                "collate_faults": statistics.median(stats["collate_faults"]),
                "f32_bytes": sum(batch[key][0].numel() * 4 for key in keys),  # per sample
                "batches": batches,
                "seconds": elapsed,
            }


def _makers(shape: tuple[int, ...], touched: torch.Tensor) -> dict:
    return {
        "fresh private memory": lambda: torch.empty(shape),
        "fresh shared memory": lambda: torch.empty(0).new(torch.UntypedStorage._new_shared(touched.nbytes)).view(shape),
        "memory touched once": lambda: touched,
    }


def part0(args) -> None:
    print("\npart 0: one process, a float32 batch converted from uint8 frames into ...")
    for name, (h, w) in SIZES:
        frames = [torch.randint(0, 256, (FRAMES, 3, h, w), dtype=torch.uint8) for _ in range(BATCH)]
        shape = (BATCH, FRAMES, 3, h, w)
        touched = torch.zeros(shape)
        makers = _makers(shape, touched)
        times: dict[str, list] = {m: [] for m in makers}
        while min(sum(a + c for a, c, _ in t) for t in times.values()) < args.seconds:
            for m, make in makers.items():
                t0, (_, f0) = time.perf_counter(), _usage()
                out = make()
                t1 = time.perf_counter()
                for i, f in enumerate(frames):
                    out[i].copy_(f)
                out.mul_(1.0 / 255.0)
                times[m].append((t1 - t0, time.perf_counter() - t1, _usage()[1] - f0))
                del out
        for m, t in times.items():
            alloc, fill, faults = (statistics.median(x[j] for x in t) for j in range(3))
            print(
                f"  {name:16s} {m:22s} alloc {alloc * 1e3:6.1f} ms, convert {fill * 1e3:7.1f} ms = "
                f"{touched.nbytes / (alloc + fill) / 1e9:5.2f} GB/s, {faults:6.0f} minor faults "
                f"({touched.nbytes // 4096} pages; median of {len(t)}, load {os.getloadavg()[0]:.1f})",
                flush=True,
            )


def part1(args) -> list[dict]:
    rows = []
    for name, (h, w) in SIZES:
        for rnd in range(args.rounds):
            for system in (*SYSTEMS, UNHELD):
                collate = Measured(_collate(system, args.k, [] if system.startswith("u8") else [CAM]))
                loader = DataLoader(
                    Frames(h, w), batch_size=BATCH, num_workers=WORKERS, persistent_workers=True, collate_fn=collate
                )
                slots = ring_slots(args.k, WORKERS, None)
                held = HeldBatches(slots * WORKERS, args.k) if system in ("f32 reused", "u8 reused+device") else None
                r = _drain(loader, [CAM], args.seconds, slots * WORKERS + 4, held)
                del loader
                r.update(part=1, dataset=name, system=system, round=rnd, load=os.getloadavg()[0])
                r["gb_s"] = r["samples_s"] * r["f32_bytes"] / 1e9
                rows.append(r)
                _say(r)
    return rows


def _converted(src: Path, work: Path) -> str:
    from epishard.shardwriter import ConvertOptions, convert

    out = work / src.name
    if not (out / "manifest.json").exists():
        convert([str(src)], str(out), ConvertOptions(max_episodes_per_shard=2, progress=False))
    return str(out)


def part2(args) -> list[dict]:
    from epishard.stream import DatasetSource, PostProcess, WindowDataset, WindowLoader, WindowSpec, segment

    sources = [REPO / "sample" / "gr00t_robot_sim_picknplace"]
    unitree = (
        Path(os.environ.get("EPISHARD_SHARED_DATA", REPO.parent / "shared" / "data")) / "unitree_g1_bottle_av1_v30"
    )
    if (unitree / "meta" / "info.json").exists():
        sources.append(unitree)
    rows = []
    for src in sources:
        root = _converted(src, Path(args.work))
        cams = list(DatasetSource(root).cameras)
        spec = WindowSpec(cameras={c: segment(0, 32, FRAMES) for c in cams}, action_horizon=16, boundary="pad")
        for rnd in range(args.rounds):
            for system in SYSTEMS:
                dtype = torch.uint8 if system.startswith("u8") else torch.float32
                ds = WindowDataset(root, spec, seed=rnd, postprocess=PostProcess(dtype=dtype))
                loader = WindowLoader(
                    ds,
                    batch_size=BATCH,
                    num_workers=WORKERS,
                    persistent_workers=True,
                    reuse_buffers=args.k if "reused" in system else 0,
                )
                loader.collate_fn = Measured(loader.collate_fn)  # before the workers start
                r = _drain(_epochs(loader), cams, args.seconds, ring_slots(args.k, WORKERS, None) * WORKERS + 4, None)
                del loader
                r.update(part=2, dataset=src.name, system=system, round=rnd, load=os.getloadavg()[0])
                r["gb_s"] = r["samples_s"] * r["f32_bytes"] / 1e9
                rows.append(r)
                _say(r)
    return rows


def _epochs(loader):
    while True:
        yield from loader


def _say(r: dict) -> None:
    print(
        f"  {r['dataset']:32s} {r['system']:18s} round {r['round']}: {r['samples_s']:7.1f} samples/s "
        f"{r['gb_s']:5.2f} GB/s {1e3 / r['samples_s']:6.1f} ms/sample | worker collate {r['collate_ms']:6.1f} ms "
        f"{r['collate_faults']:7.0f} faults/batch | main {r['main_cpu_ms']:6.1f} cpu ms {r['main_faults']:7.0f} "
        f"faults/batch ({r['batches']} batches in {r['seconds']:.1f} s, load {r['load']:.1f})",
        flush=True,
    )


def _table(rows: list[dict]) -> None:
    print("\n| part | dataset | system | samples/s | f32 GB/s | ms/sample | worker faults/batch | main faults/batch |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for part in (1, 2):
        names = dict.fromkeys(r["dataset"] for r in rows if r["part"] == part)
        for name in names:
            base = None
            for system in (*SYSTEMS, UNHELD):
                mine = [r for r in rows if r["part"] == part and r["dataset"] == name and r["system"] == system]
                if not mine:
                    continue
                med = {k: statistics.median(r[k] for r in mine) for k in ("samples_s", "gb_s", "collate_faults")}
                main_faults = statistics.median(r["main_faults"] for r in mine)
                base = base or med["samples_s"]
                print(
                    f"| {part} | {name} | {system} | {med['samples_s']:.1f} ({med['samples_s'] / base:.2f}x) | "
                    f"{med['gb_s']:.2f} | {1e3 / med['samples_s']:.1f} | {med['collate_faults']:.0f} | "
                    f"{main_faults:.0f} |"
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per system and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, systems alternating in each")
    parser.add_argument("--k", type=int, default=2, help="reuse_buffers: batches a batch stays valid for")
    parser.add_argument("--part", choices=("0", "1", "2", "all"), default="all")
    parser.add_argument("--work", default="/tmp/epishard-bench-collate", help="where part 2 converts its datasets")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"bench_collate: batch {BATCH}, {WORKERS} workers (persistent), {FRAMES} frames per camera, k={args.k}, "
        f"{args.rounds} rounds x {args.seconds:.0f} s per system; torch {torch.__version__}; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rows = []
    if args.part in ("0", "all"):
        part0(args)
    if args.part in ("1", "all"):
        rows += part1(args)
    if args.part in ("2", "all"):
        rows += part2(args)
    _table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
