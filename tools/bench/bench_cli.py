"""Benchmark: how long the `epishard` command takes to answer `--help` and an argument error.

Each case runs `python -m epishard ARGS` in a fresh interpreter (what a user waits for: interpreter
start, imports, parsing, exit), N times, alternating the cases within a round; prints the median
and the spread per case, and the heavy modules the command imported (there should be none). The
target: under 0.5 s for `--help` and argument errors.

    .venv/bin/python tools/bench/bench_cli.py [--runs 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = {
    "--help": ["--help"],
    "convert --help": ["convert", "--help"],
    "stream --help": ["stream", "--help"],
    "argument error (convert, no OUT)": ["convert", "src"],
    "argument error (stream --frames nine)": ["stream", "ds", "--frames", "nine"],
}
HEAVY = ("torch", "torchcodec", "pyarrow", "av", "numpy", "matplotlib", "fsspec")
PROBE = (
    "import atexit, sys\n"
    f"atexit.register(lambda: sys.stderr.write('HEAVY ' + ','.join(m for m in {HEAVY!r} if m in sys.modules)"
    " + '\\n'))\n"
    "from epishard.cli import main\nsys.exit(main())\n"
)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _time(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "epishard", *args], capture_output=True, env=_env(), check=False)
    return time.perf_counter() - start


def _heavy(args: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=_env(), check=False)
    line = next(x for x in done.stderr.splitlines() if x.startswith("HEAVY "))
    return [m for m in line[len("HEAVY ") :].split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs per case")
    parser.add_argument("--json", action="store_true", help="one JSON line per case")
    args = parser.parse_args()
    _time(["--help"])  # warm the page cache and .pyc files
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for r in range(args.runs):
        order = list(CASES) if r % 2 == 0 else list(reversed(CASES))
        for name in order:
            times[name].append(_time(CASES[name]))
    baseline = _time_python()
    print(f"python -c pass (interpreter start alone): median {baseline * 1000:.0f} ms")
    for name, values in times.items():
        row = {
            "case": name,
            "command": "python -m epishard " + " ".join(CASES[name]),
            "runs": len(values),
            "median_s": statistics.median(values),
            "min_s": min(values),
            "max_s": max(values),
            "heavy_imports": _heavy(CASES[name]),
        }
        if args.json:
            print(json.dumps(row))
        else:
            print(
                f"{name:40s} median {row['median_s'] * 1000:4.0f} ms (min {row['min_s'] * 1000:.0f}, "
                f"max {row['max_s'] * 1000:.0f}) heavy imports: {row['heavy_imports'] or 'none'}"
            )


def _time_python(runs: int = 5) -> float:
    values = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=False)
        values.append(time.perf_counter() - start)
    return statistics.median(values)


if __name__ == "__main__":
    main()
