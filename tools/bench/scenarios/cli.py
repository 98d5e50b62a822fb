"""Benchmark: how long the `epishard` command takes to answer `--help` and an argument error.

Each case runs `python -m epishard ARGS` in a fresh interpreter (what a user waits for: interpreter
start, imports, parsing, exit), N times, alternating the cases within a round; prints the median
and the spread per case, and the heavy modules the command imported (there should be none). The
target: under 0.5 s for `--help` and argument errors.

    python tools/bench/run.py cli [--runs 15] [--json]
"""

from __future__ import annotations

import subprocess
import sys
import time

import measure

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


def _time(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "epishard", *args], capture_output=True, env=measure.env_with(), check=False)
    return time.perf_counter() - start


def _heavy(args: list[str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=measure.env_with(), check=False
    )
    line = next(x for x in done.stderr.splitlines() if x.startswith("HEAVY "))
    return [m for m in line[len("HEAVY ") :].split(",") if m]


SMOKE = {"runs": 1}


def options(p) -> None:
    p.add_argument("--runs", type=int, default=15, help="runs per case")


def run(args) -> int:
    _time(["--help"])  # warm the page cache and .pyc files
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for r in range(args.runs):
        order = list(CASES) if r % 2 == 0 else list(reversed(CASES))
        for name in order:
            times[name].append(_time(CASES[name]))
    baseline = _time_python(1 if args.smoke else 5)
    measure.say(f"python -c pass (interpreter start alone): median {baseline * 1000:.0f} ms")
    rows = []
    for name, values in times.items():
        row = {
            "case": name,
            "command": "python -m epishard " + " ".join(CASES[name]),
            "runs": len(values),
            "median_s": measure.median(values),
            "min_s": min(values),
            "max_s": max(values),
            "heavy_imports": _heavy(CASES[name]),
        }
        measure.emit(row)
        ms = [f"{row[k] * 1000:.0f} ms" for k in ("median_s", "min_s", "max_s")]
        rows.append((f"`{row['command']}`", *ms, ", ".join(row["heavy_imports"]) or "none"))
    measure.table(("case", "median", "min", "max", "heavy imports"), rows)
    return 0


def _time_python(runs: int = 5) -> float:
    values = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=False)
        values.append(time.perf_counter() - start)
    return measure.median(values)
