"""Object storage, one part at a time (``--part``): ``reader`` (the default): local disk against S3 with
latency added per request, same settings, steady state; ``source``: converting a LeRobot dataset read
from local disk and through a loopback HTTP server; ``transport``: what a ranged request costs the
client, per transport.

    python tools/bench/run.py remote [--copies 150 | --generated --episodes 400 --frames 150] [--per-episode 4]
        [--latency-ms 0,20,100] [--rounds 2] [--seconds 30] [--workers 2]
        [--mode stream|ranged] [--prefetch-mb N] [--fixed-depth 4] [--presigned] [--keep DIR] [--json]
    python tools/bench/run.py remote --part source [--source FOLDER] [--rounds 2]
    python tools/bench/run.py remote --part transport [--requests 256] [--size-kb 128] [--concurrency 32]
        [--latency-ms 100]

``reader``:

What it does:
- One dataset: the real so101_bimanual_cloth (2 cameras, MPEG-4 224x224, ~2.8 MB per episode) from
  ../shared/data converted ``--copies`` times into ONE dataset (copy ``c`` of episode ``i`` is
  episode ``1000 c + i``; the default 150 copies make 750 episodes, 2.1 GB), or ``--generated``
  episodes (3 cameras, H.264 128x128; their videos are tiny, so they test decoding more than
  fetching). Converted once to a local folder (reused with ``--keep DIR``) and uploaded to S3.
- The S3 server is moto in server mode on loopback, in its own process with one latency proxy
  per ``--latency-ms`` value (``tests/remote_servers.FaultProxy``: each request waits that long
  before it is forwarded). The server's CPU seconds and the bytes it sends are read from that
  process around each timed region, so its cost on the shared cores is visible.
- Every configuration reads the same dataset with the same sampling (``--per-episode`` windows
  per episode, the default shuffle pool for batches of 8: diversity >= 0.94 of i.i.d.), the same
  decoding and post-processing, ``--workers`` DataLoader workers. Rounds interleave the sides
  (local, S3 +0, +20, +100, ...; the next round in reverse order).
- Timed region: the same batches in every run (the plan is seeded, so every run does the same
  work in it). The look-ahead reader decodes a chunk of ``Lookahead.horizon`` windows and then
  yields them in a burst, so the region is whole chunks: the warm-up is the first chunk and one
  full chunk of every worker; the timed region the next batches, whole chunks of every worker,
  as many as the first run needs to last ``--seconds``. Inside it: samples/s, bytes the workers
  read (and the server sent), the episodes first seen in it and the bytes they hold (the run is
  in steady state when it read at least 0.8 of the bytes of the episodes first seen in it:
  ``steady``), seconds the workers waited for bytes (``read_s``, and its share of the
  workers' time) and episodes they had to wait for (``fetch_waits``), requests in flight allowed
  (``depth``), decode seconds, the server's CPU seconds, distinct episodes per batch against
  i.i.d. sampling, the load average at its start and end.
- Result per configuration: the median samples/s, and the median over rounds of the ratio to
  the local run of the same round (the figure the goal is stated in).

Diversity: distinct episodes per batch of 8, next to what i.i.d. uniform sampling over the epoch's
windows would give (``sum_e 1 - (1 - p_e)**8``, ``p_e`` the episode's share of the windows).

``source``: the remote-source conversion path (fsspec listing, range requests): ``--source`` (a LeRobot
v2.x or v3.0 folder), else the real so101_bimanual_cloth_v30 from ../shared/data when present, else a
generated v3.0 dataset (12 episodes of 60 frames, 6 per file), converted from local disk and through a
loopback HTTP server behind a byte-counting proxy, rounds alternating: the time of each (medians) and
the bytes the server sent per byte of source data (1.0: every byte read once). Every HTTP conversion's
shards are checked byte-identical to the local one's.

``transport``: the same ranged reads through a thread pool of blocking ``cat_file`` calls (the
Fetcher's way), through fsspec's async ``cat_ranges`` (one coroutine batch), and through the same
thread pool with one presigned URL for the object (``S3FileSystem.url``, signed once) fetched by
urllib3 (botocore's own HTTP library), against moto S3 on loopback (kept-alive connections, as
the ``reader`` part serves it) behind a proxy adding the largest ``--latency-ms`` per request; same
concurrency for all. The third shows what a request costs the client without botocore's work per
request (parameter handling, signing, response parsing) and s3fs's hand-over to its event loop.
Reports requests/s (wall) and CPU seconds per request of this process (the client: the server and
the proxy run in their own process), per transport, rounds alternating.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import measure
import numpy as np
from remote_servers import FaultProxy, serve_http
from s3server import CREDENTIALS, Server, need_s3, upload
from torch.utils.data import DataLoader
from videogen import make_episode_table, make_video

from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert
from epishard.shardwriter.lerobot import read_lerobot
from epishard.stream import PostProcess, WindowDataset, WindowSpec, segment
from epishard.stream.fetch import FetchPolicy
from epishard.stream.lookahead import Lookahead
from epishard.stream.options import Mixing, ReadOptions
from epishard.stream.source import DatasetSource
from epishard.stream.telemetry import FIELDS

CAMS = ("observation.images.front", "observation.images.left", "observation.images.wrist")
SHARED = measure.shared_data()
REAL = SHARED / "so101_bimanual_cloth"  # --real chooses another dataset of ../shared/data
BATCH = 8
COUNTERS = (
    "samples",
    "bytes_read",
    "requests",
    "read_s",
    "fetch_waits",
    "episodes_loaded",
    "decode_s",
    "frames_decoded",
)


def make_source(episodes: int, frames: int) -> Source:
    """Generated 3-camera episodes: 128x128 H.264 with B-frames, a keyframe every 30 frames, 30 fps."""
    eps = [
        Episode(
            source="bench",
            episode_index=e,
            table=make_episode_table(frames, fps=30),
            fps=30,
            tasks=("t",),
            videos={
                c: CameraVideo(
                    make_video(
                        None,
                        frames,
                        fps=30,
                        height=128,
                        width=128,
                        gop=30,
                        start_number=(1000 * e + 300 * i) % (65536 - frames),
                    )
                )
                for i, c in enumerate(CAMS)
            },
        )
        for e in range(episodes)
    ]
    return Source(name="bench", episodes=eps, fps=30)


def per_episode(text: str) -> dict:
    """``"4"`` -> a count of 4 windows per episode; ``"0.25"`` -> a quarter of its anchors; ``"all"``."""
    if text == "all":
        return {}
    if "." in text or "e" in text.lower():
        return {"per_episode_fraction": float(text)}
    return {"per_episode_count": int(text)}


def iid_distinct(ds: WindowDataset, sampling: dict) -> float:
    """Expected distinct episodes in a batch of ``BATCH`` windows drawn i.i.d. from the epoch's windows."""
    anchors = (ds.table.hi - ds.table.lo).astype(np.float64)
    if "per_episode_count" in sampling:
        windows = np.minimum(anchors, sampling["per_episode_count"])
    else:
        windows = anchors * sampling.get("per_episode_fraction", 1.0)
    p = windows / windows.sum()
    return float(np.sum(1.0 - (1.0 - p) ** BATCH))


# --- the S3 server, in its own process ------------------------------------------------------------


# --- one run ---------------------------------------------------------------------------------------


def timed_run(url: str, options: dict | None, policy: FetchPolicy, args, cams, server: Server, proxy_ms) -> dict:
    """Samples/s over ``args.seconds`` after the first batch and ``args.warmup_s``; what was read in that time."""
    spec = WindowSpec(cameras={c: segment(0, 32, 9) for c in cams}, action_horizon=16, **args.per_episode)
    source = DatasetSource(url, options, policy)
    ds = WindowDataset(
        source,
        spec,
        seed=0,
        read=ReadOptions(telemetry=True, fetch=policy),
        postprocess=PostProcess(size=(96, 96)),
        mix=Mixing(stratify=False),
        batch_size=BATCH,  # the default shuffle pool for batches of 8, and a first chunk of one batch
    )
    loader = DataLoader(ds, batch_size=BATCH, num_workers=args.workers)
    rows_warm, rows_timed, distinct = [], [], []
    seen_warm: set[int] = set()
    seen_timed: set[int] = set()
    n, start, last, end, gaps = 0, 0.0, 0.0, 0.0, []
    batches = iter(loader)
    workers = [w.pid for w in getattr(batches, "_workers", [])]
    for i, batch in enumerate(batches):
        now = time.perf_counter()
        episodes = batch["episode_index"].tolist()
        if i < args.warm_batches:
            rows_warm.append(batch["__telemetry__"].numpy())
            seen_warm.update(episodes)
            if i == args.warm_batches - 1:  # the timed region starts as the last warm-up batch arrives
                start, s0, load0, cpu0 = now, server.stats(), os.getloadavg()[0], _cpu_s(workers)
            last = now
            continue
        gaps.append(now - last)
        last = now
        rows_timed.append(batch["__telemetry__"].numpy())
        seen_timed.update(e for e in episodes if e not in seen_warm)
        distinct.append(len(set(episodes)))
        n += len(episodes)
        done = i + 1 - args.warm_batches
        if args.timed_batches is None and now - start >= args.seconds and done % args.cycle == 0:
            args.timed_batches = done  # the first run's: whole look-ahead chunks of every worker
        if done == args.timed_batches:
            end, cpu1 = now, _cpu_s(workers)
            break
    else:
        raise SystemExit("remote: the epoch ended before the timed region did: more --copies or --episodes")
    wall = end - start
    s1 = server.stats()
    # Counters are cumulative per worker: the timed region's are the last minus the first seen in it.
    before = {**_per_worker(rows_timed, earliest=True), **_per_worker(rows_warm)}
    after = _per_worker(rows_warm + rows_timed)
    timed = {k: sum(after[w][k] - before[w][k] for w in after) for k in COUNTERS}
    mean_episode = sum(s.size for s in source.manifest.shards) / max(len(source.index.shard), 1)
    new_bytes = len(seen_timed) * mean_episode
    read = timed["bytes_read"]
    return {
        "samples_per_s": n / wall,
        "samples": n,
        "seconds": wall,
        "load_start": load0,
        "load_end": os.getloadavg()[0],
        "mb_read": read / 1e6,
        "mb_server": (s1["bytes_out"][proxy_ms] - s0["bytes_out"][proxy_ms]) / 1e6 if proxy_ms is not None else 0.0,
        "server_cpu_s": s1["cpu_s"] - s0["cpu_s"],
        "worker_cpu_ms_per_sample": 1e3 * (cpu1 - cpu0) / max(n, 1),
        "server_cpu_ms_per_sample": 1e3 * (s1["cpu_s"] - s0["cpu_s"]) / max(n, 1),
        "new_episodes": len(seen_timed),
        "mb_new_episodes": new_bytes / 1e6,
        # The timed region fetched what it consumed: its new episodes' bytes were read in it, not before.
        "steady": bool(seen_timed) and read >= 0.8 * new_bytes,
        "kb_per_sample": read / 1e3 / max(timed["samples"], 1),
        "kb_per_request": read / 1e3 / max(timed["requests"], 1),
        "requests": timed["requests"],
        "read_s": timed["read_s"],
        "wait_share": timed["read_s"] / (wall * args.workers),
        "fetch_waits": timed["fetch_waits"],
        "episodes_loaded": timed["episodes_loaded"],
        "decode_s": timed["decode_s"],
        "max_gap_s": max(gaps),
        "depth": max(after[w]["fetch_depth"] for w in after),
        "distinct_per_batch": float(np.mean(distinct)),
        "iid_distinct_per_batch": iid_distinct(ds, args.per_episode),
    }


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` have used (Linux ``/proc``; 0 elsewhere)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    return total / os.sysconf("SC_CLK_TCK")


def _per_worker(rows: list, earliest: bool = False) -> dict[int, dict]:
    """Each worker's latest (or ``earliest``) cumulative counters among ``rows``, by name."""
    data = np.concatenate([np.atleast_2d(r) for r in rows]) if rows else np.zeros((0, len(FIELDS)))
    out = {}
    for w in np.unique(data[:, 0]):
        mine = data[data[:, 0] == w]
        pick = np.argmin if earliest else np.argmax
        row = mine[pick(mine[:, FIELDS.index("samples")])]
        out[int(w)] = dict(zip(FIELDS, row.tolist(), strict=True))
    return out


# --- data --------------------------------------------------------------------------------------------


def prepare(args, server: Server) -> tuple[str, list[str], str]:
    """Convert the dataset to a local folder (or reuse ``--keep``'s), upload it; (local path, cameras, what)."""

    real = SHARED / args.real
    if args.generated or not (real / "meta" / "info.json").exists():
        what, cams = f"generated: {args.episodes} episodes x {args.frames} frames, 3 cameras, H.264 128x128", CAMS
    else:
        names = tuple(sorted(read_lerobot(str(real)).episodes[0].videos))
        what, cams = f"{args.real} x{args.copies} (real, {len(names)} cameras)", names
    local = os.path.join(args.keep, "local")
    stamp = os.path.join(args.keep, "what.txt")
    if not (os.path.exists(stamp) and Path(stamp).read_text() == what):
        convert([tiled(args)], local, ConvertOptions(max_episodes_per_shard=8, progress=False, overwrite=True))
        Path(stamp).write_text(what)
    size = upload(server.endpoint, local, "s3://bench/ds")
    return local, list(cams), f"{what}; {size / 1e6:.0f} MB"


def tiled(args) -> Source:
    """The source converted: generated episodes, or the real ones ``--copies`` times, numbered apart.

    Copy ``c`` of episode ``i`` becomes episode ``1000 c + i``, so batches tell the copies apart.
    """
    real = SHARED / args.real
    if args.generated or not (real / "meta" / "info.json").exists():
        return make_source(args.episodes, args.frames)
    src = read_lerobot(str(real))
    episodes = [
        dataclasses.replace(e, episode_index=1000 * c + e.episode_index)
        for c in range(args.copies)
        for e in src.episodes
    ]
    return dataclasses.replace(src, episodes=episodes)


SMOKE = {
    "generated": True,
    "episodes": 8,
    "frames": 40,
    "latency_ms": "0",
    "rounds": 1,
    "seconds": 0.5,
    "warm_batches": 1,
    "timed_batches": 2,
    "workers": 1,
    "requests": 8,
    "concurrency": 4,
}


def options(parser) -> None:
    parser.add_argument("--part", choices=("reader", "source", "transport"), default="reader")
    parser.add_argument(
        "--per-episode", type=per_episode, default=per_episode("4"), help="windows per episode: 4 (count), 0.25, all"
    )
    parser.add_argument(
        "--seconds", type=float, default=30.0, help="timed steady state per run (>= 10; several look-ahead chunks)"
    )
    parser.add_argument("--latency-ms", default="0,20,100", help="added per S3 request, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--warm-batches", type=int, default=None, help="default: the first chunk and one full chunk of every worker"
    )
    parser.add_argument(
        "--timed-batches", type=int, default=None, help="default: whole chunks, >= --seconds in the first run"
    )
    parser.add_argument("--copies", type=int, default=150, help="real data: its episodes converted this many times")
    parser.add_argument(
        "--real",
        default=REAL.name,
        help="the dataset of ../shared/data to tile (e.g. unitree_g1_bottle_av1: AV1 GOP 2)",
    )
    parser.add_argument("--generated", action="store_true", help="generated episodes even when the real data is there")
    parser.add_argument("--episodes", type=int, default=400)
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mode", choices=("stream", "ranged"), default="stream")
    parser.add_argument("--prefetch-mb", type=int, default=None, help="FetchPolicy.prefetch_bytes in MiB")
    parser.add_argument("--fixed-depth", type=int, default=None, help="also S3 at the largest latency, fixed depth")
    parser.add_argument(
        "--presigned",
        action="store_true",
        help="also S3 at the largest latency through FetchPolicy(s3_transport='presigned')",
    )
    parser.add_argument("--keep", default=None, help="folder for the converted dataset, reused by the next run")
    parser.add_argument(
        "--stock-moto",
        action="store_true",
        help="moto's own server and ranged GET: a connection per request (see start_moto), the whole object "
        "read per request (see serve_ranges_from_buffer)",
    )
    parser.add_argument("--source", help="source: a LeRobot folder (default: so101_bimanual_cloth_v30, else generated)")
    parser.add_argument("--requests", type=int, default=256, help="transport: ranged GETs per round")
    parser.add_argument("--size-kb", type=int, default=128, help="transport: bytes per request")
    parser.add_argument("--concurrency", type=int, default=32, help="transport: requests at once")


def line(name: str, r: dict) -> str:
    return (
        f"{name:<22} {r['samples_per_s']:6.1f} samples/s {r['vs_local']:5.2f}x local | timed {r['seconds']:.1f} s, "
        f"read {r['mb_read']:.1f} MB (server sent {r['mb_server']:.1f}), new episodes {r['new_episodes']:.0f} "
        f"({r['mb_new_episodes']:.1f} MB), steady {'yes' if r['steady'] else 'NO'} | "
        f"{r['kb_per_sample']:.0f} kB/sample, "
        f"{r['kb_per_request']:.0f} kB/request | waited {r['read_s']:.2f} s ({100 * r['wait_share']:.1f}%), "
        f"fetch_waits {r['fetch_waits']:.0f}/{r['episodes_loaded']:.0f}, depth {r['depth']:.0f}, "
        f"longest gap between batches {r['max_gap_s']:.1f} s | "
        f"decode {r['decode_s']:.1f} s, CPU per sample: workers {r['worker_cpu_ms_per_sample']:.0f} ms, "
        f"server {r['server_cpu_ms_per_sample']:.1f} ms | distinct/batch "
        f"{r['distinct_per_batch']:.2f} (i.i.d. {r['iid_distinct_per_batch']:.2f}) | load {r['load_start']:.1f}"
        f"-{r['load_end']:.1f}"
    )


def run_reader(args) -> int:
    horizon = Lookahead().horizon
    args.cycle = args.workers * horizon // BATCH  # batches of one look-ahead chunk of every worker
    if args.warm_batches is None:
        args.warm_batches = args.workers * (BATCH + horizon) // BATCH
    need_s3()
    os.environ.update(CREDENTIALS)
    latencies = [int(x) for x in args.latency_ms.split(",") if x.strip()]
    server = Server(latencies, args.stock_moto)
    tmp = None
    if args.keep is None:
        tmp = tempfile.TemporaryDirectory()
        args.keep = tmp.name
    os.makedirs(args.keep, exist_ok=True)
    local, cams, what = prepare(args, server)
    kw = {"mode": args.mode} | ({"prefetch_bytes": args.prefetch_mb << 20} if args.prefetch_mb is not None else {})
    policy = FetchPolicy(**kw)
    configs: dict[str, tuple] = {"local disk": (local, None, policy, None)}
    for ms, port in server.proxies.items():
        via = {"endpoint_url": f"http://127.0.0.1:{port}"}
        configs[f"s3 +{ms} ms"] = ("s3://bench/ds", via, policy, ms)
        if args.fixed_depth and ms == max(latencies):
            fixed = FetchPolicy(**kw, threads=args.fixed_depth, max_in_flight=args.fixed_depth)
            configs[f"s3 +{ms} ms, depth {args.fixed_depth}"] = ("s3://bench/ds", via, fixed, ms)
        if args.presigned and ms == max(latencies):
            signed = FetchPolicy(**kw, s3_transport="presigned")
            configs[f"s3 +{ms} ms, presigned"] = ("s3://bench/ds", via, signed, ms)
    print(
        f"data: {what}; {args.workers} workers, batch {BATCH}, 9 frames over 33 per camera, 96x96; "
        f"{args.per_episode}; fetch {policy.mode}, prefetch {policy.prefetch_bytes >> 20} MiB per worker; "
        f"look-ahead chunks of {horizon} windows; cores {os.cpu_count()}; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    print("timed region: the same batches in every run (the plan is seeded): the first run sets them", flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for r in range(args.rounds):
        names = list(configs) if r % 2 == 0 else list(reversed(configs))
        for name in names:
            url, options, config_policy, ms = configs[name]
            runs[name].append(timed_run(url, options, config_policy, args, cams, server, ms))
            if r == 0 and name == names[0]:
                print(
                    f"warm-up: batches 0-{args.warm_batches - 1} (the first chunk and one of {horizon} windows per "
                    f"worker); timed: the next {args.timed_batches} batches (whole chunks)",
                    flush=True,
                )
        for name in configs:
            res = runs[name][-1] | {
                "vs_local": runs[name][-1]["samples_per_s"] / runs["local disk"][-1]["samples_per_s"]
            }
            runs[name][-1] = res
            measure.emit({"round": r, "config": name} | res)
            if not args.json:
                print(f"round {r}  {line(name, res)}")
        sys.stdout.flush()
    print("medians over rounds (x local: the median of each round's ratio to that round's local run):")
    for name, rs in runs.items():
        row = {key: float(np.median([x[key] for x in rs])) for key in rs[0]} | {"steady": all(x["steady"] for x in rs)}
        measure.emit({"config": name, "median": True} | row)
        if not args.json:
            print(f"median   {line(name, row)}")
    server.stop()
    if tmp is not None:
        tmp.cleanup()
    return 0


def run(args) -> int:
    return {"reader": run_reader, "source": run_source, "transport": run_transport}[args.part](args)


# --- converting from a remote source (--part source) ------------------------------------------------------


def source_folder(given: str | None, tmp: str) -> str:
    if given:
        return os.path.abspath(given)
    real = measure.shared_data() / "so101_bimanual_cloth_v30"
    if (real / "meta" / "info.json").exists():
        return str(real)
    from lerobotgen import write_v3

    write_v3(f"{tmp}/generated_v30", [60] * 12, "observation.images.front", per_file=6)
    return f"{tmp}/generated_v30"


def tree_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def shards(folder: str) -> dict[str, bytes]:
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder)) if n.endswith(".tar")}


def run_source(args) -> int:
    """Local and HTTP conversions alternating; the bytes sent per source byte."""
    import statistics

    from epishard.shardwriter import ConvertOptions, convert

    with tempfile.TemporaryDirectory() as tmp:
        src = source_folder(args.source or (str(measure.smoke_source()) if args.smoke else None), tmp)
        parent, name = os.path.split(src)
        server, _ = serve_http(parent)
        proxy = FaultProxy(server.server_address)
        url = f"http://127.0.0.1:{proxy.port}/{name}"
        options = ConvertOptions(progress=False)
        times: dict[str, list[float]] = {"local": [], "http": []}
        ratios, reference = [], None
        try:
            for r, (kind, where) in measure.alternate((("local", src), ("http", url)), args.rounds):
                out, before = f"{tmp}/{kind}{r}", proxy.bytes_out
                t = time.perf_counter()
                convert([where], out, options)
                times[kind].append(time.perf_counter() - t)
                reference = reference or shards(out)
                assert shards(out) == reference, f"{kind} round {r}: shards differ from the first conversion"
                if kind == "http":
                    ratios.append((proxy.bytes_out - before) / tree_bytes(src))
        finally:
            proxy.close()
            server.shutdown()
    result = {
        "source": src,
        "source_bytes": tree_bytes(src),
        "local_s": round(statistics.median(times["local"]), 2),
        "http_s": round(statistics.median(times["http"]), 2),
        "http_bytes_per_source_byte": round(statistics.median(ratios), 3),
    }
    measure.emit(result)
    if not args.json:
        print(
            f"{result['source']} ({result['source_bytes'] / 1e6:.1f} MB): local {result['local_s']} s, "
            f"HTTP {result['http_s']} s, {result['http_bytes_per_source_byte']} bytes sent per source byte "
            "(shards byte-identical)"
        )
    return 0


# --- what a request costs the client (--part transport) ---------------------------------------------------


def run_transport(args) -> int:
    """The same ranged reads through three transports, rounds alternating."""
    need_s3()
    import s3fs
    import urllib3

    latency = max(int(x) for x in args.latency_ms.split(",") if x.strip())
    os.environ.update(CREDENTIALS)
    server = Server([latency])  # moto and the proxy in their own process: CPU here is the client's
    size = args.size_kb << 10
    direct = s3fs.S3FileSystem(endpoint_url=server.endpoint)
    direct.mkdir("bench")
    direct.pipe("bench/blob", os.urandom(size * 64))
    fs = s3fs.S3FileSystem(
        endpoint_url=f"http://127.0.0.1:{server.proxies[latency]}",
        skip_instance_cache=True,
        config_kwargs={"max_pool_connections": args.concurrency},
    )
    starts = [(i % 64) * size for i in range(args.requests)]

    def threads() -> list[bytes]:
        with ThreadPoolExecutor(args.concurrency) as pool:
            return list(pool.map(lambda a: fs.cat_file("bench/blob", start=a, end=a + size), starts))

    url = fs.url("bench/blob", expires=3600)
    http = urllib3.PoolManager(maxsize=args.concurrency, retries=False)

    def presigned_get(a: int) -> bytes:
        r = http.request("GET", url, headers={"Range": f"bytes={a}-{a + size - 1}"})
        if r.status != 206:
            raise OSError(f"presigned GET: HTTP {r.status}")
        return r.data

    def presigned() -> list[bytes]:
        with ThreadPoolExecutor(args.concurrency) as pool:
            return list(pool.map(presigned_get, starts))

    def coroutines() -> list[bytes]:
        n = len(starts)
        return fs.cat_ranges(["bench/blob"] * n, starts, [a + size for a in starts], batch_size=args.concurrency)

    measure.say(
        f"{args.requests} requests of {args.size_kb} kB, {args.concurrency} at once, +{latency} ms each; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    threads()  # warm-up: connections opened
    sides = (("threads + cat_file", threads), ("async cat_ranges", coroutines), ("presigned + urllib3", presigned))
    for r, (name, fetch) in measure.alternate(sides, args.rounds):
        out, wall, cpu = measure.timed(fetch)
        assert all(len(b) == size for b in out)
        row = {
            "round": r,
            "transport": name,
            "requests_per_s": args.requests / wall,
            "cpu_ms_per_request": 1e3 * cpu / args.requests,
        }
        measure.emit(row)
        if not args.json:
            print(
                f"round {r}  {name:<20} {row['requests_per_s']:7.1f} requests/s  "
                f"{row['cpu_ms_per_request']:6.2f} ms CPU per request"
            )
    server.stop()
    return 0
