"""The packages import downwards only (docs/ARCHITECTURE.md, "Layers").

``shardwriter`` (writer and format) imports neither the reader nor balancing; ``stream`` (reader)
may import ``shardwriter``; ``balance`` may import both; no package imports the command line
(``epishard.cli``), which stands above them all. Checked on the import statements of every module
(AST, so imports inside functions count too), with each violation named by file and line.
"""

from __future__ import annotations

import ast
import os

from conftest import REPO

# Package -> the epishard packages it may import (besides itself and epishard's own leaf modules).
ALLOWED = {"shardwriter": set(), "stream": {"shardwriter"}, "balance": {"shardwriter", "stream"}}
PACKAGES = set(ALLOWED)


def imported_packages(source: str, package: str) -> list[tuple[int, str]]:
    """(line, imported name) of every ``epishard.<name>`` import in a module of ``package``.

    Relative imports are resolved against ``package`` (``from .x`` stays inside it; ``from ..x``
    names ``epishard.x``).
    """
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                names = [f"epishard.{package}"]
            elif node.level > 1:
                names = [f"epishard.{node.module or ''}".rstrip(".")]
            else:
                names = [node.module or ""]
        else:
            continue
        out += [(node.lineno, name) for name in names if name.startswith("epishard.")]
    return out


def violations(source: str, package: str, path: str) -> list[str]:
    """``path:line: <package> imports epishard.<name>`` for each import against the layers."""
    bad = []
    for line, name in imported_packages(source, package):
        top = name.split(".")[1]
        if top == "cli" or (top in PACKAGES and top != package and top not in ALLOWED[package]):
            bad.append(f"{path}:{line}: {package} imports {name}")
    return bad


def test_packages_import_downwards_only():
    bad = []
    for package in sorted(PACKAGES):
        for folder, _, files in os.walk(REPO / package):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path) as f:
                        bad += violations(f.read(), package, os.path.relpath(path, REPO))
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_the_check_sees_upward_and_cli_imports():
    source = (
        "import numpy\n"
        "from epishard.shardwriter.index import WindowIndex\n"
        "from .plan import World\n"
        "def f():\n"
        "    from epishard.balance.cost import CostModel\n"
        "    import epishard.cli\n"
    )
    assert violations(source, "stream", "stream/x.py") == [
        "stream/x.py:5: stream imports epishard.balance.cost",
        "stream/x.py:6: stream imports epishard.cli",
    ]
    assert violations("from ..stream import plan\n", "shardwriter", "shardwriter/x.py") == [
        "shardwriter/x.py:1: shardwriter imports epishard.stream"
    ]
    assert violations("from epishard.seeding import rng_for\n", "balance", "balance/x.py") == []
