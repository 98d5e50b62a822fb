"""What every scenario of ``tools/bench/run.py`` measures with: paths, inputs, timers, statistics,
memory, child processes, other git trees, and the results (JSON lines and markdown tables).

Output: ``emit(record)`` writes one JSON object per line to ``--out FILE`` (appended, with the
scenario's name) and, with ``--json``, to stdout; ``table(head, rows)`` prints a markdown table
(unless ``--json``) and appends it to ``--markdown FILE``. ``say`` is a progress line on stderr.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parents[1]
TESTS = REPO / "tests"
RUN = BENCH / "run.py"


class Missing(Exception):
    """An input a scenario needs is absent (data, a peer venv, a tool, root): the message says which and how."""


# --- inputs -----------------------------------------------------------------------------------------------


def shared_data() -> Path:
    """``EPISHARD_SHARED_DATA``, else ``../shared/data`` beside the repository (the real datasets)."""
    return Path(os.environ.get("EPISHARD_SHARED_DATA", REPO.parent / "shared" / "data"))


def need(path: str | Path, what: str = "") -> Path:
    """``path`` if it exists, else ``Missing`` naming it (and ``what`` it is)."""
    p = Path(path)
    if not p.exists():
        raise Missing(
            f"{what or 'input'} not found: {p}" + ("" if shared_data().exists() else " (../shared/data is absent)")
        )
    return p


def need_module(name: str, how: str = "") -> None:
    """``Missing`` unless ``name`` imports."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        raise Missing(f"python module {name!r} is not installed" + (f" ({how})" if how else ""))


SMOKE_DIR = Path(tempfile.gettempdir()) / "epishard_bench_smoke"


def smoke_source(episodes: int = 4, rows: int = 40) -> Path:
    """A tiny generated LeRobot v3.0 dataset (one 32x32 H.264 camera, frames numbered), made once and kept."""
    root = SMOKE_DIR / f"lerobot_v30_{episodes}x{rows}"
    if not (root / "meta" / "info.json").exists():
        from lerobotgen import write_v3

        tmp = Path(tempfile.mkdtemp(dir=SMOKE_DIR.mkdir(parents=True, exist_ok=True) or SMOKE_DIR))
        write_v3(str(tmp), [rows] * episodes, "observation.images.front", per_file=2)
        tmp.rename(root)
    return root


def smoke_dataset(episodes: int = 4, rows: int = 40) -> Path:
    """``smoke_source`` converted (two episodes per shard), made once and kept: ``--smoke``'s dataset."""
    root = SMOKE_DIR / f"epishard_{episodes}x{rows}"
    if not (root / "manifest.json").exists():
        from epishard.shardwriter import ConvertOptions, convert

        tmp = SMOKE_DIR / f".tmp_{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        convert([str(smoke_source(episodes, rows))], str(tmp), ConvertOptions(max_episodes_per_shard=2, progress=False))
        tmp.rename(root)
    return root


# --- statistics and timing --------------------------------------------------------------------------------


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def iqr(values: Iterable[float]) -> float:
    """Inter-quartile range (0 for fewer than 2 values)."""
    v = sorted(values)
    if len(v) < 2:
        return 0.0
    q = statistics.quantiles(v, n=4, method="inclusive")
    return float(q[2] - q[0])


def summary(values: Iterable[float]) -> dict:
    """Median, IQR, min, max and count of ``values``."""
    v = list(values)
    return {"median": median(v), "iqr": iqr(v), "min": min(v), "max": max(v), "n": len(v)}


def cpu_s(children: bool = False) -> float:
    """User + system CPU seconds of this process (and of its waited-for children with ``children``)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    s = r.ru_utime + r.ru_stime
    if children:
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        s += c.ru_utime + c.ru_stime
    return s


def timed(fn: Callable[[], object]) -> tuple[object, float, float]:
    """``(fn(), wall seconds, CPU seconds of this process)``."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def repeat(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[tuple[float, float]]:
    """``(wall, CPU)`` seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    return [timed(fn)[1:] for _ in range(repeats)]


def alternate(sides: Sequence, rounds: int, mirror: bool = False) -> Iterator[tuple[int, object]]:
    """``(round, side)`` for ``rounds`` rounds of every side (A B C A B C ...; with ``mirror`` every
    other round reversed, A B C C B A ...): load changes hit every side alike."""
    for r in range(rounds):
        order = list(sides)
        if mirror and r % 2:
            order.reverse()
        for side in order:
            yield r, side


def loadavg() -> float:
    """The one-minute load average."""
    return os.getloadavg()[0]


# --- memory -----------------------------------------------------------------------------------------------


def peak_rss_mb(children: bool = False) -> float:
    """This process's (or its waited-for children's largest) peak resident set, MB (``ru_maxrss``)."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return resource.getrusage(who).ru_maxrss / 1024


def proc_mb(pid: int | None = None, key: str = "VmRSS:", file: str = "status") -> float:
    """A kB line of ``/proc/<pid>/<file>`` in MB (``VmRSS:``, ``VmHWM:``; ``Pss:`` of ``smaps_rollup``);
    0 if unreadable."""
    try:
        with open(f"/proc/{pid or os.getpid()}/{file}") as f:
            return next((int(line.split()[1]) / 1024 for line in f if line.startswith(key)), 0.0)
    except OSError:
        return 0.0


def mem_sampler(**kw):
    """``peers.memory.MemSampler``: peak RSS / PSS of this process tree sampled every 50 ms (a thread)."""
    from peers.memory import MemSampler

    return MemSampler(**kw)


# --- processes and trees ----------------------------------------------------------------------------------


def env_with(tree: str | Path = REPO, **extra: str) -> dict:
    """``os.environ`` with ``tree`` (this checkout, or another) first on ``PYTHONPATH``, plus ``extra``."""
    path = os.pathsep.join(p for p in (str(tree), str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "EPISHARD_BENCH_TREE": str(tree), **extra}


def run_child(
    scenario: str, args: Sequence[str], tree: str | Path = REPO, timeout: float | None = None, env: dict | None = None
) -> dict | None:
    """Run ``run.py SCENARIO --child ARGS`` in a fresh interpreter (the code of ``tree``: this checkout
    or ``git_tree(ref)``) and return the JSON object of its last stdout line (``None`` if it failed,
    its stderr shown)."""
    cmd = [sys.executable, str(RUN), scenario, "--child", *map(str, args)]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, env=env or env_with(tree), timeout=timeout, cwd=str(REPO), check=False
        )
    except subprocess.TimeoutExpired:
        say(f"child {' '.join(map(str, args))}: timed out after {timeout} s")
        return None
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not lines:
        say(f"child {' '.join(map(str, args))} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return None
    return json.loads(lines[-1])


def child_result(obj: dict) -> int:
    """A child's answer to ``run_child``: one JSON line on stdout."""
    print(json.dumps(obj), flush=True)
    return 0


_TREES: dict[str, Path] = {}


def git_tree(ref: str) -> Path:
    """This repository at git revision ``ref``, extracted once per process (``git archive``) into a
    temporary folder removed at exit: the "before" side of a before/after comparison."""
    if ref not in _TREES:
        out = Path(tempfile.mkdtemp(prefix=f"epishard_tree_{ref.replace('/', '_')}_"))
        atexit.register(shutil.rmtree, out, True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True, check=True).stdout
        subprocess.run(["tar", "x", "-C", str(out)], input=archive, check=True)
        _TREES[ref] = out
    return _TREES[ref]


# --- output -----------------------------------------------------------------------------------------------

_OUT: dict = {"scenario": "", "json": False, "out": None, "markdown": None}


def configure(scenario: str, json_lines: bool = False, out: str | None = None, markdown: str | None = None) -> None:
    """Where ``emit`` and ``table`` write (the harness sets it from the shared options)."""
    _OUT.update(scenario=scenario, json=json_lines, out=out, markdown=markdown)


def json_mode() -> bool:
    """``--json``: stdout carries JSON lines, not tables."""
    return bool(_OUT["json"])


def emit(record: dict) -> None:
    """One result: a JSON line in ``--out`` (with the scenario) and on stdout under ``--json``."""
    line = json.dumps(record, default=str)
    if _OUT["json"]:
        print(line, flush=True)
    if _OUT["out"]:
        with open(_OUT["out"], "a") as f:
            f.write(json.dumps({"scenario": _OUT["scenario"], **record}, default=str) + "\n")


def table(head: Sequence[str], rows: Iterable[Sequence], title: str = "") -> str:
    """A markdown table: printed (unless ``--json``) and appended to ``--markdown``; returned."""
    lines = ([title, ""] if title else []) + ["| " + " | ".join(map(str, head)) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    text = "\n".join(lines) + "\n"
    if not _OUT["json"]:
        print(text, flush=True)
    if _OUT["markdown"]:
        with open(_OUT["markdown"], "a") as f:
            f.write(text + "\n")
    return text


def say(msg: str) -> None:
    """A progress line on stderr (stdout carries the results)."""
    print(msg, file=sys.stderr, flush=True)
