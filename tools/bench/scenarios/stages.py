"""Benchmark: where one reader's time goes, and the bytes it reads, for both read paths.

Runs a ``WindowLoader`` with no DataLoader workers (every stage in this process, so the reader's
own telemetry times it) over a converted dataset, with the peer benchmark's window (9 frames over a
33-row span per camera, state at the anchor, a 16-step action chunk, padded edges, batches of 8),
once reading cameras by their packet tables (``FetchPolicy(packets=True)``, the default) and once
fetching video members whole and decoding them with torchcodec (``packets=False``), alternating
``--rounds`` times. Prints, per path: samples/s after ``--warmup`` batches, seconds per sample in
each stage (decode, post-processing, assembling, collation, waiting for bytes), frames decoded
per frame returned, decoder opens per sample, bytes read per sample and the encoded bytes of the
groups of pictures the decodes needed (``bytes_needed``; packet path only), and their ratio.
torch runs on one thread, as in a DataLoader worker.

``--loader-workers N``: instead, the default loader alone with N DataLoader workers (first batch,
warm-up, samples/s after it and sustained).

``--gop-bytes``: instead, the encoded bytes of the groups of pictures a sample's frames need,
averaged over the dataset's windows (every ``--stride``-th anchor of every episode, the benchmark's
window, edges padded): the packets the reader's runs hold (``stream.packets.plan_runs``: from each
frame's keyframe on, merged where no keyframe separates two frames), summed per camera from the
index's packet table; the denominator of "bytes read per sample / bytes the sample needs". Needs a
conversion with packet tables.

    python tools/bench/run.py stages /tmp/epishard_bench_peers/unitree_g1_bottle_av1_v30_x50.epishard
    python tools/bench/run.py stages DATASET --batches 60 --rounds 2 --dtype float32 --json
    python tools/bench/run.py stages DATASET --loader-workers 2 --batches 96   # the loader alone, 2 workers
    python tools/bench/run.py stages DATASET --gop-bytes                       # GOP bytes per sample
"""

from __future__ import annotations

import time

import measure

from epishard.stream.options import ReadOptions

FRAMES, SPAN, HORIZON, BATCH = 9, 33, 16, 8


class TimedCollate:
    """The loader's collate, timed (seconds summed in ``seconds``)."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0

    def __call__(self, samples):
        t = time.perf_counter()
        try:
            return self.inner(samples)
        finally:
            self.seconds += time.perf_counter() - t


def _source_and_spec(root: str):
    """The dataset and the benchmark's window over every camera of it."""
    from epishard.stream import WindowSpec, segment
    from epishard.stream.source import DatasetSource

    src = DatasetSource(root)
    spec = WindowSpec(
        cameras={c: segment(0, SPAN - 1, FRAMES) for c in src.cameras},
        state_offsets=(0,),
        action_horizon=HORIZON,
        boundary="pad",
    )
    return src, spec


def one_pass(
    root: str, packets: bool, batches: int, warmup: int, dtype: str, seed: int, size: tuple[int, int] | None = None
) -> dict:
    """One timed pass: the figures above for one read path (``size``: resize frames to it)."""
    import torch

    from epishard.stream import PostProcess, WindowDataset, WindowLoader
    from epishard.stream.fetch import FetchPolicy
    from epishard.stream.telemetry import summarize

    src, spec = _source_and_spec(root)
    post = PostProcess(dtype=torch.float32 if dtype == "float32" else torch.uint8, size=size)
    ds = WindowDataset(
        src, spec, seed=seed, read=ReadOptions(telemetry=True, fetch=FetchPolicy(packets=packets)), postprocess=post
    )
    loader = WindowLoader(ds, batch_size=BATCH, num_workers=0)
    timed = TimedCollate(loader.collate_fn)
    loader.collate_fn = timed
    rows, t0, collate0 = [], None, 0.0
    for i, batch in enumerate(loader):
        if i == warmup:
            t0, collate0 = time.perf_counter(), timed.seconds
            first = summarize([batch["__telemetry__"]])
        if i >= warmup:
            rows.append(batch["__telemetry__"])
        if i + 1 >= warmup + batches:
            break
    elapsed = time.perf_counter() - t0
    last = summarize(rows[-1:])
    n = last["samples"] - first["samples"]

    def per(key: str) -> float:
        return (last[key] - first[key]) / n

    out = {
        "path": "packets" if packets else "whole members (torchcodec)",
        "samples_per_s": n / elapsed,
        "decode_ms": 1e3 * per("decode_s"),
        "postprocess_ms": 1e3 * per("postprocess_s"),
        "assemble_ms": 1e3 * per("assemble_s"),
        "collate_ms": 1e3 * (timed.seconds - collate0) / n,
        "read_ms": 1e3 * per("read_s"),
        "decoded_per_returned": (last["frames_decoded"] - first["frames_decoded"])
        / max(last["frames_returned"] - first["frames_returned"], 1),
        "decoder_opens_per_sample": per("decoder_opens"),
        "bytes_read_per_sample": per("bytes_read"),
        "bytes_needed_per_sample": per("bytes_needed"),
    }
    needed = out["bytes_needed_per_sample"]
    out["read_over_needed"] = out["bytes_read_per_sample"] / needed if packets and needed else None
    return out


def throughput(root: str, workers: int, batches: int, warmup: int, seed: int) -> dict:
    """The loader alone with DataLoader ``workers``: first batch, warm-up, samples/s after it and sustained."""
    from epishard.stream import WindowDataset, WindowLoader

    src, spec = _source_and_spec(root)
    loader = WindowLoader(WindowDataset(src, spec, seed=seed), batch_size=BATCH, num_workers=workers)
    t0 = time.perf_counter()
    first = warm = 0.0
    for i, _ in enumerate(loader):
        if i == 0:
            first = time.perf_counter() - t0
        if i == warmup:
            warm = time.perf_counter() - t0
        if i + 1 >= warmup + batches:
            break
    total = time.perf_counter() - t0
    return {
        "workers": workers,
        "first_batch_s": first,
        "warmup_s": warm,
        "samples_per_s_after_warmup": batches * BATCH / (total - warm),
        "samples_per_s_sustained": (warmup + batches) * BATCH / total,
    }


def gop_bytes_per_sample(root: str, frames: int = FRAMES, span: int = SPAN, stride: int = 1) -> float:
    """Mean bytes per window (every ``stride``-th anchor of every episode), over all cameras."""
    import numpy as np

    from epishard.shardwriter import WindowIndex
    from epishard.stream.packets import plan_runs, run_bytes

    index = WindowIndex.load_dataset(root)
    offsets = np.linspace(0, span - 1, frames).round().astype(np.int64)
    total, windows = 0, 0
    for e in range(index.num_episodes):
        n = int(index.num_rows[e])
        anchors = np.arange(0, n, stride)
        for c in range(int(index.episode_cams[e + 1] - index.episode_cams[e])):
            s = index.stream(e, c)
            table = index.packets(s)
            keys = index.keyframes_of(s)
            for a in anchors.tolist():
                wanted = np.unique(index.frames(s, np.clip(a + offsets, 0, n - 1)))
                total += run_bytes(table.size, plan_runs(table.frame_packet, keys, wanted))
        windows += anchors.size
    return total / max(windows, 1)


SMOKE = {"batches": 2, "warmup": 1}


def options(p) -> None:
    p.add_argument("dataset", nargs="?", help="a converted dataset (folder or URL); --smoke: a generated one")
    p.add_argument("--batches", type=int, default=40, help="timed batches per pass")
    p.add_argument("--warmup", type=int, default=4, help="batches before the timed ones")
    p.add_argument("--rounds", type=int, default=1, help="passes per path, alternating")
    p.add_argument("--dtype", choices=("uint8", "float32"), default="uint8")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--loader-workers", type=int, default=0, help="instead: the default loader with this many DataLoader workers"
    )
    p.add_argument("--gop-bytes", action="store_true", help="instead: the bytes of the GOPs a sample needs")
    p.add_argument("--stride", type=int, default=7, help="--gop-bytes: every STRIDE-th anchor")


def run(args) -> int:
    if args.dataset is None:
        if not args.smoke:
            raise measure.Missing("give a converted dataset")
        args.dataset = str(measure.smoke_dataset())
    if args.gop_bytes:
        b = gop_bytes_per_sample(args.dataset, stride=args.stride)
        measure.emit({"dataset": args.dataset, "stride": args.stride, "gop_bytes_per_sample": b})
        if not measure.json_mode():
            print(f"{args.dataset}: {b / 1e3:.1f} kB per sample (anchor stride {args.stride})")
        return 0
    if args.loader_workers:
        res = throughput(args.dataset, args.loader_workers, args.batches, args.warmup, args.seed)
        measure.emit(res)
        measure.table(list(res), [list(res.values())])
        return 0
    import torch

    torch.set_num_threads(1)  # as in a DataLoader worker (torch sets 1 thread there)
    results = []
    for r, packets in measure.alternate((True, False), args.rounds, mirror=True):
        res = one_pass(args.dataset, packets, args.batches, args.warmup, args.dtype, args.seed + r)
        results.append(res)
        measure.emit(res)
    cols = [
        ("samples/s", "samples_per_s", "{:.1f}"),
        ("decode ms", "decode_ms", "{:.2f}"),
        ("post ms", "postprocess_ms", "{:.2f}"),
        ("assemble ms", "assemble_ms", "{:.2f}"),
        ("collate ms", "collate_ms", "{:.2f}"),
        ("wait ms", "read_ms", "{:.2f}"),
        ("dec/ret", "decoded_per_returned", "{:.2f}"),
        ("opens/sample", "decoder_opens_per_sample", "{:.3f}"),
        ("kB read/sample", "bytes_read_per_sample", "{:.0f}"),
        ("kB GOPs/sample", "bytes_needed_per_sample", "{:.0f}"),
    ]
    rows = []
    for res in results:
        cells = [res["path"]]
        for _, key, f in cols:
            v = res[key] / 1e3 if key.startswith("bytes") else res[key]
            cells.append(f.format(v))
        rows.append(cells)
    title = f"{args.dataset} ({args.dtype}, {args.batches} batches of {BATCH} after {args.warmup}, no workers)"
    measure.table(["path"] + [c[0] for c in cols], rows, title=title)
    return 0
