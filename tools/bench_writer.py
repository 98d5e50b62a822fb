"""Benchmark: writer throughput (no re-encode) against copying the same source files, in one run.

For each dataset, alternating rounds (A B C D A B C D ...) of:
  A  ``epishard convert`` with default settings (validation + the full frame check),
  B  the same without the decode check (``decode_check=False``),
  C  ``shutil.copytree`` of the dataset folder (what a plain copy to local disk costs),
  D  the same copy with every file fsync'd (the durability the writer gives its shards).
Reports the median seconds and MB/s (source bytes / time) of each and the ratios to the copy.

    python tools/bench_writer.py [DATASET ...] [--rounds 3] [--workers 1] [--json]

Default datasets: the bundled sample and every LeRobot dataset in ../shared/data that exists.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from epishard.shardwriter import ConvertOptions, convert

REPO = Path(__file__).resolve().parents[1]


def default_datasets() -> list[str]:
    found = [str(REPO / "sample" / "gr00t_robot_sim_picknplace")]
    shared = REPO.parent / "shared" / "data"
    for name in sorted(os.listdir(shared)) if shared.exists() else []:
        if (shared / name / "meta" / "info.json").exists() and (shared / name / "videos").exists():
            found.append(str(shared / name))
    return found


def _bytes(folder: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def _copy_durable(src: str, dst: str) -> None:
    """copytree, then fsync every file: what the writer guarantees (data on disk before rename)."""
    shutil.copytree(src, dst)
    for path in Path(dst).rglob("*"):
        if path.is_file():
            with open(path, "rb+") as f:
                os.fsync(f.fileno())


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench(dataset: str, rounds: int, workers: int) -> dict:
    size = _bytes(dataset)
    systems = {
        "convert": lambda out: convert([dataset], out, ConvertOptions(progress=False, workers=workers)),
        "convert_no_decode_check": lambda out: convert(
            [dataset], out, ConvertOptions(progress=False, workers=workers, decode_check=False)
        ),
        "copy": lambda out: shutil.copytree(dataset, os.path.join(out, "copy")),
        "copy_fsync": lambda out: _copy_durable(dataset, os.path.join(out, "copy")),
    }
    times: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(rounds):
        for name, run in systems.items():
            with tempfile.TemporaryDirectory() as out:
                times[name].append(_timed(functools.partial(run, out)))
    result = {"dataset": os.path.basename(dataset), "source_mb": size / 1e6}
    copy = float(np.median(times["copy"]))
    for name, ts in times.items():
        med = float(np.median(ts))
        result[name] = {"median_s": med, "mb_per_s": size / 1e6 / med, "time_vs_copy": med / copy}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("datasets", nargs="*")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for dataset in args.datasets or default_datasets():
        r = bench(dataset, args.rounds, args.workers)
        if args.json:
            print(json.dumps(r))
            continue
        parts = [
            f"{name} {r[name]['median_s'] * 1e3:7.0f} ms {r[name]['mb_per_s']:7.1f} MB/s "
            f"(x{r[name]['time_vs_copy']:.1f} copy time)"
            for name in ("convert", "convert_no_decode_check", "copy", "copy_fsync")
        ]
        print(f"{r['dataset']:<32} {r['source_mb']:5.1f} MB | " + " | ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
