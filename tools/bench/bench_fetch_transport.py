"""Benchmark: the same ranged reads through a thread pool of blocking ``cat_file`` calls (the
Fetcher's way), through fsspec's async ``cat_ranges`` (one coroutine batch), and through the same
thread pool with one presigned URL for the object (``S3FileSystem.url``, signed once) fetched by
urllib3 (botocore's own HTTP library), against moto S3 on loopback (kept-alive connections, as
``tools/bench/bench_remote.py`` serves it) behind a proxy adding ``--latency-ms`` per request; same
concurrency for all. The third shows what a request costs the client without botocore's work per
request (parameter handling, signing, response parsing) and s3fs's hand-over to its event loop.

    python tools/bench/bench_fetch_transport.py [--requests 256] [--size-kb 128] [--concurrency 32] [--latency-ms 100]

Reports requests/s (wall) and CPU seconds per request of this process (the client: the server and
the proxy run in their own process), per transport, rounds alternating.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))


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
        import urllib3
        from bench_remote import Server
    except ImportError:
        print("bench_fetch_transport: needs moto[server], waitress and s3fs")
        return 0
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    server = Server([args.latency_ms])  # moto and the proxy in their own process: CPU here is the client's
    size = args.size_kb << 10
    direct = s3fs.S3FileSystem(endpoint_url=server.endpoint)
    direct.mkdir("bench")
    direct.pipe("bench/blob", os.urandom(size * 64))
    fs = s3fs.S3FileSystem(
        endpoint_url=f"http://127.0.0.1:{server.proxies[args.latency_ms]}",
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

    print(
        f"{args.requests} requests of {args.size_kb} kB, {args.concurrency} at once, +{args.latency_ms} ms each; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    threads()  # warm-up: connections opened
    for r in range(args.rounds):
        runs = (
            ("threads + cat_file", threads),
            ("async cat_ranges", coroutines),
            ("presigned + urllib3", presigned),
        )
        for name, run in runs:
            wall, cpu = time.perf_counter(), time.process_time()
            out = run()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            assert all(len(b) == size for b in out)
            print(
                f"round {r}  {name:<20} {args.requests / wall:7.1f} requests/s  "
                f"{1e3 * cpu / args.requests:6.2f} ms CPU per request"
            )
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
