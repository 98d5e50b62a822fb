"""Benchmark: streaming the same shards from local disk and from an S3 server with 0, 20 and 100 ms
added per request, side by side, in steady state; bytes read per sample and batch diversity.

The S3 server is moto in server mode on loopback (as in the tests); the latency is added by
tests/remote_servers.FaultProxy in front of it (every request waits that long before it is
forwarded). Each configuration runs one long epoch (the dataset listed ``--copies`` times): the
time to the first batch (worker start, the shuffle buffers filling) and the next ``--warmup-s``
seconds are discarded, then the next ``--seconds`` seconds are timed and the run stops. Rounds
alternate between configurations (A B C D, A B C D, ...); medians are reported with the ratio to
local disk.

    python tools/bench_remote.py [--per-episode 4 | 0.25] [--seconds 10] [--warmup-s 4]
        [--latency-ms 0,20,100] [--rounds 1] [--workers 2] [--mode stream|ranged] [--fixed-depth 4] [--json]

``--per-episode``: windows per episode per epoch: an integer is a count (``per_episode_count``), a
number with a decimal point a share of its anchors (``per_episode_fraction``); default all.

Diversity: distinct episodes per batch of 8, next to what i.i.d. uniform sampling over the epoch's
windows would give (``sum_e 1 - (1 - p_e)**8``, ``p_e`` the episode's share of the windows).

Data: the real 2-camera so101_bimanual_cloth from ../shared/data when present, else generated
3-camera episodes (``--episodes``, ``--frames``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from remote_servers import FaultProxy
from videogen import make_episode_table, make_video

from epishard.shardwriter import CameraVideo, ConvertOptions, Episode, Source, convert
from epishard.stream import PostProcess, WindowDataset, WindowSpec, segment
from epishard.stream.fetch import FetchPolicy
from epishard.stream.source import DatasetSource
from epishard.stream.telemetry import FIELDS

CAMS = ("observation.images.front", "observation.images.left", "observation.images.wrist")
BATCH = 8


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


def rate(url: str, options: dict | None, policy: FetchPolicy, args, cams, sampling: dict) -> dict:
    """Samples/s over ``args.seconds`` after ``args.warmup_s`` of warm-up, with telemetry and diversity."""
    spec = WindowSpec(cameras={c: segment(0, 32, 9) for c in cams}, action_horizon=16, **sampling)
    source = DatasetSource(url, options, policy)  # one manifest and index read, listed many times
    ds = WindowDataset(
        [source] * args.copies,
        spec,
        seed=0,
        shuffle_windows=args.shuffle_windows,
        telemetry=True,
        fetch=policy,
        postprocess=PostProcess(size=(96, 96)),
        stratify=False,
    )
    loader = DataLoader(ds, batch_size=BATCH, num_workers=args.workers)
    warm, timed, distinct = [], [], []
    n, start, first = 0, None, None
    for batch in loader:
        now = time.perf_counter()
        first = first or now  # the shuffle buffers are full: from here on, steady state after the warm-up
        if start is None and now - first >= args.warmup_s:
            start = now
        if start is None:
            warm.append(batch["__telemetry__"].numpy())
            continue
        timed.append(batch["__telemetry__"].numpy())
        distinct.append(len(set(zip(batch["dataset"].tolist(), batch["episode_index"].tolist(), strict=True))))
        n += len(batch["frame_index"])
        if now - start >= args.seconds:
            break
    else:
        raise SystemExit(f"bench_remote: the epoch ended before {args.warmup_s}+{args.seconds} s: raise --copies")
    wall = time.perf_counter() - start
    # Counters are cumulative per worker: the timed region's are the last minus the first seen in it.
    first_seen = {**_per_worker(timed, earliest=True), **_per_worker(warm)}
    last = _per_worker(warm + timed)
    after = {k: sum(last[w][k] - first_seen[w][k] for w in last) for k in FIELDS[1:]}
    before = dict.fromkeys(FIELDS[1:], 0.0)
    samples = after["samples"]
    return {
        "load_average": os.getloadavg()[0],
        "samples_per_s": n / wall,
        "samples": n,
        "seconds": wall,
        "bytes_read_per_sample": (after["bytes_read"] - before["bytes_read"]) / max(samples, 1),
        "requests_per_sample": (after["requests"] - before["requests"]) / max(samples, 1),
        "read_wait_s": after["read_s"] - before["read_s"],
        "distinct_per_batch": float(np.mean(distinct)),
        "iid_distinct_per_batch": iid_distinct(ds, sampling),
    }


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


def real_or_generated(episodes: int, frames: int, generated: bool) -> tuple[list, list[str], str]:
    """The real 2-camera so101_bimanual_cloth from ../shared/data when present, else generated episodes."""
    real = REPO.parent / "shared" / "data" / "so101_bimanual_cloth"
    if not generated and (real / "meta" / "info.json").exists():
        return (
            [str(real)],
            ["observation.images.cam0", "observation.images.cam1"],
            "so101_bimanual_cloth (real, 2 cameras, MPEG-4 224x224)",
        )
    return [make_source(episodes, frames)], list(CAMS), "generated (3 cameras, H.264 128x128, GOP 30)"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--per-episode", type=per_episode, default={}, help="windows per episode: 4 (count), 0.25 (share), all"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="timed steady state per run")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="discarded seconds after the first batch")
    parser.add_argument("--latency-ms", default="0,20,100", help="added per S3 request, comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--shuffle-windows", type=int, default=128, help="per worker; 128 (32 episodes at 4 each) gives ~0.9 of i.i.d."
    )
    parser.add_argument(
        "--copies", type=int, default=None, help="the dataset listed this many times (default: 60 real, 1 generated)"
    )
    parser.add_argument("--generated", action="store_true", help="generated episodes even when the real data is there")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mode", choices=("stream", "ranged"), default="stream")
    parser.add_argument("--prefetch-mb", type=int, default=None, help="FetchPolicy.prefetch_bytes in MiB")
    parser.add_argument(
        "--fixed-depth",
        type=int,
        default=None,
        help="also run the largest latency with this fixed depth (the old fetcher's 4)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.copies is None:
        args.copies = 1 if args.generated else 60
    return args


def main() -> int:
    args = parse()
    try:
        import s3fs
        from moto.server import ThreadedMotoServer
    except ImportError:
        print("bench_remote: needs moto[server] and s3fs (pip install 's3fs' 'moto[server]')")
        return 0
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    direct = {"endpoint_url": f"http://{host}:{port}"}
    s3fs.S3FileSystem(**direct).mkdir("bench")
    inputs, cams, what = real_or_generated(args.episodes, args.frames, args.generated)
    sampling = args.per_episode
    print(
        f"data: {what}; x{args.copies} copies; {args.workers} workers, batch {BATCH}, 9 frames over 33 per camera; "
        f"{sampling or 'all windows'}; mode {args.mode}; warm-up {args.warmup_s} s, timed {args.seconds} s; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    latencies = [int(x) for x in args.latency_ms.split(",") if x.strip()]
    proxies = {ms: FaultProxy((host, port), latency_s=ms / 1000) for ms in latencies}
    kw = {"mode": args.mode} | ({"prefetch_bytes": args.prefetch_mb << 20} if args.prefetch_mb is not None else {})
    policy = FetchPolicy(**kw)
    with tempfile.TemporaryDirectory() as local:
        opts = ConvertOptions(max_episodes_per_shard=2, progress=False)
        convert(inputs, local, opts)
        convert(inputs, "s3://bench/ds", opts, storage_options=direct)
        configs: dict[str, tuple] = {"local disk": (local, None, policy)}
        fixed = FetchPolicy(**kw, threads=args.fixed_depth or 1, max_in_flight=args.fixed_depth or 1)
        for ms, proxy in proxies.items():
            via = {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}
            configs[f"s3 +{ms} ms/request"] = ("s3://bench/ds", via, policy)
            if args.fixed_depth and ms == max(proxies):
                configs[f"s3 +{ms} ms, depth {args.fixed_depth}"] = ("s3://bench/ds", via, fixed)
        runs: dict[str, list[dict]] = {name: [] for name in configs}
        for _ in range(args.rounds):
            for name, (url, options, config_policy) in configs.items():
                runs[name].append(rate(url, options, config_policy, args, cams, sampling))
                r = runs[name][-1]
                print(f"  ran {name}: {r['samples_per_s']:.1f} samples/s (load {r['load_average']:.0f})", flush=True)
        base = float(np.median([r["samples_per_s"] for r in runs["local disk"]]))
        for name, rs in runs.items():
            row = {"config": name} | {key: float(np.median([r[key] for r in rs])) for key in rs[0]}
            row["vs_local"] = row["samples_per_s"] / base
            print(
                json.dumps(row)
                if args.json
                else f"{name:<24} {row['samples_per_s']:7.1f} samples/s  x{row['vs_local']:.2f} of local  "
                f"{row['bytes_read_per_sample'] / 1e3:7.1f} kB and {row['requests_per_sample']:.2f} requests/sample  "
                f"wait for bytes {row['read_wait_s']:.2f} s  distinct/batch {row['distinct_per_batch']:.2f} "
                f"(i.i.d. {row['iid_distinct_per_batch']:.2f})  "
                f"over {row['seconds']:.1f} s, {int(row['samples'])} samples, load {row['load_average']:.0f}"
            )
    for proxy in proxies.values():
        proxy.close()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
