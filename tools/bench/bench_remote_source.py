"""Benchmark: converting a LeRobot dataset read from local disk and read through a loopback HTTP
server (the remote-source path: fsspec listing, range requests), with the bytes the server sent
per byte of source data (1.0: every byte read once) and the time of each.

    python tools/bench/bench_remote_source.py [--source FOLDER] [--rounds 2] [--json]

Data: ``--source`` (a LeRobot v2.x or v3.0 folder), else the real so101_bimanual_cloth_v30 from
../shared/data when present, else a generated v3.0 dataset (12 episodes of 60 frames, 6 per file).
Rounds alternate local and HTTP; medians are reported. Every HTTP conversion's shards are checked
byte-identical to the local one's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from remote_servers import FaultProxy, serve_http

from epishard.shardwriter import ConvertOptions, convert

SHARED = Path(os.environ.get("EPISHARD_SHARED_DATA", REPO.parent / "shared" / "data"))


def source_folder(given: str | None, tmp: str) -> str:
    if given:
        return os.path.abspath(given)
    real = SHARED / "so101_bimanual_cloth_v30"
    if (real / "meta" / "info.json").exists():
        return str(real)
    from lerobotgen import write_v3

    write_v3(f"{tmp}/generated_v30", [60] * 12, "observation.images.front", per_file=6)
    return f"{tmp}/generated_v30"


def tree_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def shards(folder: str) -> dict[str, bytes]:
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder)) if n.endswith(".tar")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = source_folder(args.source, tmp)
        parent, name = os.path.split(src)
        server, _ = serve_http(parent)
        proxy = FaultProxy(server.server_address)
        url = f"http://127.0.0.1:{proxy.port}/{name}"
        options = ConvertOptions(progress=False)
        times: dict[str, list[float]] = {"local": [], "http": []}
        ratios, reference = [], None
        try:
            for r in range(args.rounds):
                for kind, where in (("local", src), ("http", url)):
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
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['source']} ({result['source_bytes'] / 1e6:.1f} MB): local {result['local_s']} s, "
            f"HTTP {result['http_s']} s, {result['http_bytes_per_source_byte']} bytes sent per source byte "
            "(shards byte-identical)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
