"""Benchmark: streaming the same shards from local disk, from an S3 server, and from the S3 server
behind a proxy that adds 20 ms and 100 ms per request, with and without prefetch; and bytes read
per sample in ranged mode against stream mode when one camera is read.

The S3 server is moto in server mode on loopback (as in the tests); the proxy is
tests/remote_servers.FaultProxy. Rounds alternate between configurations (A B C ... A B C ...);
medians are reported with the ratio to local disk. Rates run from the first batch to the end of one
epoch over the dataset listed six times (a longer epoch, so the steady state dominates).

    python tools/bench_remote.py [--rounds 3] [--workers 2] [--per-episode-fraction F] [--json]

Data: the real 2-camera so101_bimanual_cloth from ../shared/data when present, else generated
3-camera episodes (``--episodes``, ``--frames``).
"""

from __future__ import annotations

import argparse
import json
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
from epishard.stream.telemetry import summarize

CAMS = ("observation.images.front", "observation.images.left", "observation.images.wrist")
COPIES = 6  # the dataset listed this many times in one WindowDataset: a longer epoch


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
                    make_video(None, frames, fps=30, height=128, width=128, gop=30, start_number=1000 * e + 300 * i)
                )
                for i, c in enumerate(CAMS)
            },
        )
        for e in range(episodes)
    ]
    return Source(name="bench", episodes=eps, fps=30)


def rate(url: str, options: dict | None, policy: FetchPolicy, workers: int, cams, per_episode) -> dict:
    """Samples/s from the first batch to the end of one epoch over ``COPIES`` copies of the dataset
    (so the steady state dominates), and the reader's telemetry."""
    spec = WindowSpec(cameras={c: segment(0, 32, 9) for c in cams}, action_horizon=16, per_episode_fraction=per_episode)
    ds = WindowDataset(
        [url] * COPIES,
        spec,
        seed=0,
        telemetry=True,
        storage_options=options,
        fetch=policy,
        postprocess=PostProcess(size=(96, 96)),
        stratify=False,
    )
    loader = DataLoader(ds, batch_size=8, num_workers=workers)
    tel, n, t = [], 0, None
    for batch in loader:
        tel.append(batch["__telemetry__"].numpy())
        if t is None:
            t = time.perf_counter()
        else:
            n += len(batch["frame_index"])
    wall = time.perf_counter() - t
    total = summarize(tel)
    return {
        "samples_per_s": n / wall,
        "samples": n,
        "bytes_read_per_sample": total["bytes_read_per_sample"],
        "read_wait_s": total["read_s"],
    }


def real_or_generated(episodes: int, frames: int) -> tuple[list, list[str], str]:
    """The real 2-camera so101_bimanual_cloth from ../shared/data when present, else generated episodes."""
    real = REPO.parent / "shared" / "data" / "so101_bimanual_cloth"
    if (real / "meta" / "info.json").exists():
        return (
            [str(real)],
            ["observation.images.cam0", "observation.images.cam1"],
            "so101_bimanual_cloth (real, 2 cameras, MPEG-4 224x224)",
        )
    return [make_source(episodes, frames)], list(CAMS), "generated (3 cameras, H.264 128x128, GOP 30)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--per-episode-fraction",
        type=float,
        default=None,
        help="share of each episode's windows per epoch (default all)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        import s3fs
        from moto.server import ThreadedMotoServer
    except ImportError:
        print("bench_remote: needs moto[server] and s3fs (pip install 's3fs' 'moto[server]')")
        return 0
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    direct = {"endpoint_url": f"http://{host}:{port}"}
    s3fs.S3FileSystem(**direct).mkdir("bench")
    inputs, cams, what = real_or_generated(args.episodes, args.frames)
    print(f"data: {what}; {args.workers} workers, batch 8, 9 frames over 33 per camera, rounds alternate")
    proxies = {ms: FaultProxy((host, port), latency_s=ms / 1000) for ms in (20, 100)}
    with tempfile.TemporaryDirectory() as local:
        opts = ConvertOptions(max_episodes_per_shard=2, progress=False)
        convert(inputs, local, opts)
        convert(inputs, "s3://bench/ds", opts, storage_options=direct)
        on, off = FetchPolicy(), FetchPolicy(prefetch_bytes=0, threads=1)
        configs = {
            "local disk": (local, None, on),
            "s3 direct, prefetch": ("s3://bench/ds", direct, on),
            "s3 direct, no prefetch": ("s3://bench/ds", direct, off),
        }
        for ms, proxy in proxies.items():
            via = {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}
            configs[f"s3 +{ms} ms/request, prefetch"] = ("s3://bench/ds", via, on)
            configs[f"s3 +{ms} ms/request, no prefetch"] = ("s3://bench/ds", via, off)
        rate(local, None, on, args.workers, cams, args.per_episode_fraction)  # warm-up (page cache, imports), discarded
        runs: dict[str, list[dict]] = {name: [] for name in configs}
        for _ in range(args.rounds):
            for name, (url, options, policy) in configs.items():
                runs[name].append(rate(url, options, policy, args.workers, cams, args.per_episode_fraction))
        base = float(np.median([r["samples_per_s"] for r in runs["local disk"]]))
        for name, rs in runs.items():
            sps = float(np.median([r["samples_per_s"] for r in rs]))
            row = {
                "config": name,
                "samples_per_s": sps,
                "vs_local": sps / base,
                "read_wait_s": float(np.median([r["read_wait_s"] for r in rs])),
                "samples": rs[0]["samples"],
            }
            print(
                json.dumps(row)
                if args.json
                else f"{name:<32} {sps:7.1f} samples/s  x{sps / base:.2f} of local  (worker wait for bytes "
                f"{row['read_wait_s']:.2f} s over {row['samples']} samples)"
            )
        for mode in ("stream", "ranged"):
            r = rate("s3://bench/ds", direct, FetchPolicy(mode=mode), args.workers, cams[:1], args.per_episode_fraction)
            row = {
                "config": f"one camera of {len(cams)}, {mode} mode",
                "bytes_read_per_sample": r["bytes_read_per_sample"],
            }
            print(
                json.dumps(row)
                if args.json
                else f"one camera of {len(cams)}, {mode:<6} mode: "
                f"{r['bytes_read_per_sample'] / 1e3:8.1f} kB read per sample"
            )
    for proxy in proxies.values():
        proxy.close()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
