"""The benchmark harness: every benchmark is a named scenario.

    python tools/bench/run.py --list                 # the scenarios, one line each
    python tools/bench/run.py SCENARIO [options]     # run one (SCENARIO --help: its options)
    python tools/bench/run.py SCENARIO --smoke       # the tiniest run that proves it works

Options every scenario takes: ``--json`` (JSON lines on stdout instead of tables), ``--out FILE``
(append each result as a JSON line), ``--markdown FILE`` (append the tables), ``--smoke``. An input
that is absent (``../shared/data``, a peer venv, a tool) stops a run with a line saying which; under
``--smoke`` that line starts with ``skip:`` and the exit status is 0. The shared measurement code is
``tools/bench/measure.py``; the scenarios live in ``tools/bench/scenarios/``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# epishard from this checkout (or from the tree a before/after child runs: EPISHARD_BENCH_TREE), test helpers
for _p in (os.environ.get("EPISHARD_BENCH_TREE", BENCH.parents[1]), BENCH.parents[1] / "tests", BENCH):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import measure
from scenarios import SCENARIOS


def listing() -> str:
    width = max(map(len, SCENARIOS))
    return "\n".join(f"{name:<{width}}  {summary}" for name, (_, summary) in SCENARIOS.items())


def parser_for(name: str, module) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"run.py {name}", description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = p.add_argument_group("shared options")
    g.add_argument("--json", action="store_true", help="JSON lines on stdout instead of tables")
    g.add_argument("--out", metavar="FILE", help="append every result to FILE as a JSON line")
    g.add_argument("--markdown", metavar="FILE", help="append the tables to FILE")
    g.add_argument("--smoke", action="store_true", help="the tiniest inputs: proves the scenario runs (seconds)")
    module.options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("--list", "-l", "-h", "--help"):
        print(__doc__.split("\n\n")[0] + "\n\n" + listing() if argv[:1] != ["--list"] else listing())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SCENARIOS:
        print(f"run.py: no scenario {name!r}; the scenarios:\n{listing()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"scenarios.{SCENARIOS[name][0]}")
    smoke = "--smoke" in rest
    if hasattr(module, "main"):  # a scenario with its own command line (peers, lerobot-default)
        try:
            return int(module.main(rest) or 0)
        except measure.Missing as e:
            print(f"{'skip: ' if smoke else ''}{name}: {e}", file=sys.stderr if not smoke else sys.stdout)
            return 0 if smoke else 2
    p = parser_for(name, module)
    if smoke:
        p.set_defaults(**getattr(module, "SMOKE", {}))
    args = p.parse_args(rest)
    args.argv = [a for a in rest if a != "--smoke"]
    measure.configure(name, args.json, args.out, args.markdown)
    try:
        return int(module.run(args) or 0)
    except measure.Missing as e:
        print(f"{'skip: ' if smoke else ''}{name}: {e}", file=sys.stdout if smoke else sys.stderr)
        return 0 if smoke else 2


if __name__ == "__main__":
    sys.exit(main())
