"""Benchmark: the same ranged reads through a thread pool of blocking ``cat_file`` calls (the
Fetcher's way) and through fsspec's async ``cat_ranges`` (one coroutine batch), against moto S3
on loopback behind a proxy adding ``--latency-ms`` per request; same concurrency for both.

    python tools/bench/bench_fetch_transport.py [--requests 256] [--size-kb 128] [--concurrency 32] [--latency-ms 100]

Reports requests/s (wall) and CPU seconds per request of this process, per transport, rounds
alternating.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from remote_servers import FaultProxy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--size-kb", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency-ms", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    try:
        import s3fs
        from moto.server import ThreadedMotoServer
    except ImportError:
        print("bench_fetch_transport: needs moto[server] and s3fs")
        return 0
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    size = args.size_kb << 10
    direct = s3fs.S3FileSystem(endpoint_url=f"http://{host}:{port}")
    direct.mkdir("bench")
    direct.pipe("bench/blob", os.urandom(size * 64))
    proxy = FaultProxy((host, port), latency_s=args.latency_ms / 1000)
    fs = s3fs.S3FileSystem(
        endpoint_url=f"http://127.0.0.1:{proxy.port}",
        skip_instance_cache=True,
        config_kwargs={"max_pool_connections": args.concurrency},
    )
    starts = [(i % 64) * size for i in range(args.requests)]

    def threads() -> list[bytes]:
        with ThreadPoolExecutor(args.concurrency) as pool:
            return list(pool.map(lambda a: fs.cat_file("bench/blob", start=a, end=a + size), starts))

    def coroutines() -> list[bytes]:
        n = len(starts)
        return fs.cat_ranges(["bench/blob"] * n, starts, [a + size for a in starts], batch_size=args.concurrency)

    print(
        f"{args.requests} requests of {args.size_kb} kB, {args.concurrency} at once, +{args.latency_ms} ms each; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    threads()  # warm-up: connections opened
    for r in range(args.rounds):
        for name, run in (("threads + cat_file", threads), ("async cat_ranges", coroutines)):
            wall, cpu = time.perf_counter(), time.process_time()
            out = run()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            assert all(len(b) == size for b in out)
            print(
                f"round {r}  {name:<20} {args.requests / wall:7.1f} requests/s  "
                f"{1e3 * cpu / args.requests:6.2f} ms CPU per request"
            )
    proxy.close()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
