"""The import graph of epishard's modules: no cycles, and the packages import downwards only.

Layers (docs/ARCHITECTURE.md, "Layers"): the format contract ``epishard.format`` imports none of
the writer (``epishard.shardwriter``), the reader (``epishard.stream``), balancing
(``epishard.balance``) or the command line (``epishard.cli``); the writer imports neither the reader,
balancing nor the CLI; the reader imports neither the writer, balancing nor the CLI; balancing may
import the reader, not the writer or the CLI; nothing but the CLI (and ``epishard.__main__``, its
entry point) imports the CLI. epishard's leaf modules (``epishard.redact``, ``epishard.seeding``,
...) import none of the packages.

Files are named as the wheel installs them: pyproject.toml's ``[tool.setuptools]`` ``packages`` and
``package-dir`` map ``stream/x.py`` to ``epishard.stream.x``, ``epishard/format/x.py`` to
``epishard.format.x``. Every import statement of every module counts, read with ``ast``: at the
top, inside functions, under ``if TYPE_CHECKING:``, relative ones resolved against the module's
package. ``from pkg import name`` is an edge to the module ``pkg.name`` where that is a module, else
to ``pkg``; importing a module is not counted as importing its parent packages' ``__init__``.
Strings (``epishard/__init__.py``'s lazy ``_API`` map, ``importlib.import_module`` arguments) are
not imports. Each finding names the file and line.
"""

from __future__ import annotations

import ast
import itertools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Layer of a module -> layers it must not import.
FORBIDDEN = {
    "format": {"shardwriter", "stream", "balance", "cli"},
    "shardwriter": {"stream", "balance", "cli"},
    "stream": {"shardwriter", "balance", "cli"},
    "balance": {"shardwriter", "cli"},
    "base": {"format", "shardwriter", "stream", "balance", "cli"},
    "cli": set(),
}
ENTRY_POINTS = {"epishard.__main__": {"cli"}}  # `python -m epishard` runs the CLI
SENTINELS = {  # files the scan must read, with the module names the wheel gives them
    "epishard/format/index.py": "epishard.format.index",
    "epishard/format/manifest.py": "epishard.format.manifest",
    "epishard/format/__init__.py": "epishard.format",
    "stream/plan.py": "epishard.stream.plan",
    "shardwriter/convert.py": "epishard.shardwriter.convert",
    "shardwriter/sources/base.py": "epishard.shardwriter.sources.base",
    "balance/cost.py": "epishard.balance.cost",
    "epishard/cli/__init__.py": "epishard.cli",
}


def package_map(root: Path) -> dict[str, Path]:
    """Installed package name -> its folder (relative to ``root``), from ``root/pyproject.toml``.

    A package without its own ``package-dir`` entry lives in its parent's folder under its last name.
    """
    import tomllib

    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = setuptools.get("package-dir", {})
    out = {}
    for package in setuptools["packages"]:
        parts = package.split(".")
        for i in range(len(parts), 0, -1):
            base = ".".join(parts[:i])
            if base in dirs:
                out[package] = Path(dirs[base], *parts[i:])
                break
        else:
            out[package] = Path(*parts)
    return out


def module_files(root: Path, packages: dict[str, Path]) -> dict[str, Path]:
    """Module name -> file (relative to ``root``) for every ``*.py`` directly in each package's folder."""
    out = {}
    for package, folder in packages.items():
        for path in sorted((root / folder).glob("*.py")):
            name = package if path.name == "__init__.py" else f"{package}.{path.stem}"
            out[name] = path.relative_to(root)
    return out


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module
    path: Path  # file of the importing module
    line: int


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imports_of(module: str, path: Path, source: str, modules: set[str]) -> list[Edge]:
    """Edges from ``module`` (its file ``path``, text ``source``) to the epishard modules it imports."""

    def known(name: str) -> str | None:  # the module itself, else its closest known parent
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = []
    package = _package_of(module, path)
    for node in ast.walk(ast.parse(source, filename=str(path))):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [known(alias.name) for alias in node.names if alias.name.split(".")[0] == "epishard"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] != "epishard":
                continue
            for alias in node.names:
                sub = f"{name}.{alias.name}"
                targets.append(sub if sub in modules else known(name))
        edges += [Edge(module, t, path, node.lineno) for t in dict.fromkeys(targets) if t and t != module]
    return edges


def import_graph(root: Path, packages: dict[str, Path]) -> tuple[dict[str, Path], list[Edge]]:
    """Every module (name -> file) of ``packages`` under ``root``, and every import edge between them."""
    files = module_files(root, packages)
    edges = []
    for module, path in files.items():
        edges += imports_of(module, path, (root / path).read_text(), set(files))
    return files, edges


def layer(module: str) -> str:
    """``format``, ``shardwriter``, ``stream``, ``balance``, ``cli``, or ``base`` (epishard's own leaf modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FORBIDDEN else "base"


def layer_violations(edges: list[Edge]) -> list[str]:
    """``file:line: <module> imports <module> (<layer> must not import <layer>)`` for each edge against the layers."""
    out = []
    for e in edges:
        src, dst = layer(e.source), layer(e.target)
        if dst in FORBIDDEN[src] and dst not in ENTRY_POINTS.get(e.source, ()):
            out.append(f"{e.path}:{e.line}: {e.source} imports {e.target} ({src} must not import {dst})")
    return sorted(out)


def cycles(edges: list[Edge]) -> list[str]:
    """One line per import cycle (strongly connected component of more than one module, Tarjan).

    Each names the component's modules and the shortest path from its first module back to it,
    ``a -> b -> ... -> a``, with the file and line of each import on the path.
    """
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        graph.setdefault(e.source, {}).setdefault(e.target, e)
        graph.setdefault(e.target, {})
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for component in sorted(components):
        members, start = set(component), component[0]
        # Shortest way back to `start` inside the component (breadth first).
        came: dict[str, str] = {}
        frontier, found = [start], None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w == start:
                        found = v
                        break
                    if w in members and w not in came:
                        came[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        assert found is not None
        path = [found]
        while path[-1] != start:
            path.append(came[path[-1]])
        path = [*reversed(path), start]
        where = ", ".join(f"{graph[a][b].path}:{graph[a][b].line}" for a, b in itertools.pairwise(path))
        out.append(f"cycle of {len(component)} modules [{', '.join(component)}]: {' -> '.join(path)} ({where})")
    return out


# --- the repository ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph():
    return import_graph(REPO, package_map(REPO))


def test_the_scan_reads_every_installed_module(graph):
    files, edges = graph
    packages = package_map(REPO)
    assert {"epishard", "epishard.format", "epishard.shardwriter", "epishard.stream", "epishard.balance"} <= set(
        packages
    )
    for package, folder in packages.items():  # a moved or emptied package folder fails here
        assert (REPO / folder / "__init__.py").is_file(), f"{package}: no {folder}/__init__.py"
        assert len([p for p in files.values() if p.parent == folder]) >= 2, f"{package}: {folder} holds no module"
    # The files read are exactly the *.py files under the mapped folders (none outside a listed
    # package, which the wheel would leave out).
    roots = {Path(d) for d in {packages[p].parts[0] for p in packages}}
    on_disk = {
        Path(folder, name).relative_to(REPO)
        for root in roots
        for folder, dirs, names in os.walk(REPO / root)
        if "__pycache__" not in folder
        for name in names
        if name.endswith(".py")
    }
    assert set(files.values()) == on_disk
    by_path = {str(p): m for m, p in files.items()}
    for path, module in SENTINELS.items():
        assert by_path.get(path) == module, path
    assert len(files) > 80
    # The edges come from the files read: known imports are there, at top level and inside functions.
    pairs = {(e.source, e.target) for e in edges}
    assert ("epishard.stream.source", "epishard.format.manifest") in pairs
    assert ("epishard.shardwriter.convert", "epishard.format.index") in pairs
    assert ("epishard.format.index", "epishard.format.validate") in pairs
    assert ("epishard.cli.convert", "epishard.shardwriter.convert") in pairs  # inside a function
    assert len(edges) > 200


def test_no_import_cycles(graph):
    _, edges = graph
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(found)


def test_packages_import_downwards_only(graph):
    _, edges = graph
    bad = layer_violations(edges)
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


# The contract's own layers (epishard/format/__init__.py lists them so): each module imports only
# modules before it here.
CONTRACT_ORDER = [
    "errors",
    "untrusted",
    "retry",
    "presigned",
    "verified",
    "stats",
    "manifest",
    "streams",
    "validate",
    "index",
    "storage",
    "opening",
    "decoder",
]


def test_the_contracts_modules_import_upwards_in_their_list(graph):
    files, edges = graph
    assert sorted(m.rpartition(".")[2] for m in files if m.startswith("epishard.format.")) == sorted(CONTRACT_ORDER)
    rank = {f"epishard.format.{m}": i for i, m in enumerate(CONTRACT_ORDER)}
    bad = [
        f"{e.path}:{e.line}: {e.source} imports {e.target}, listed after it"
        for e in edges
        if e.source in rank and e.target in rank and rank[e.target] >= rank[e.source]
    ]
    assert not bad, "\n".join(bad)
    outside = {e.target for e in edges if e.source in rank and e.target not in rank}
    assert outside == {"epishard.redact", "epishard.storage_options"}  # epishard's leaf modules only


def test_the_reader_imports_nothing_of_the_writer(graph):
    _, edges = graph
    pairs = sorted(
        {(str(e.path), e.target) for e in edges if layer(e.source) == "stream" and layer(e.target) == "shardwriter"}
    )
    assert pairs == []
    assert any(layer(e.source) == "stream" and layer(e.target) == "format" for e in edges)


# --- the check fails on planted violations ----------------------------------------------------------

PLANTED = {
    "epishard/__init__.py": "",
    "epishard/redact.py": "import re\n",
    "epishard/format/__init__.py": "",
    "epishard/format/a.py": "from . import b\n",
    "epishard/format/b.py": "import os\n\n\ndef load():\n    from .a import thing\n\n    return thing\n",
    "epishard/format/c.py": "from epishard.format.d import D\n",
    "epishard/format/d.py": (
        "from __future__ import annotations\n\nfrom typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n    from epishard.format.c import C\n\nD = 1\n"
    ),
    "epishard/cli/__init__.py": "",
    "shardwriter/__init__.py": "",
    "shardwriter/video.py": "from epishard.format import a\n",
    "stream/__init__.py": "",
    "stream/plan.py": "from ..redact import redact\n",
    "stream/decode.py": "import numpy\n\n\ndef opener():\n    from epishard.shardwriter.video import open_decoder\n",
    "stream/source.py": "from ..shardwriter import video\nimport epishard.cli\n",
}
PLANTED_PYPROJECT = """
[tool.setuptools]
packages = ["epishard", "epishard.cli", "epishard.format", "epishard.shardwriter", "epishard.stream"]

[tool.setuptools.package-dir]
"epishard" = "epishard"
"epishard.shardwriter" = "shardwriter"
"epishard.stream" = "stream"
"""


@pytest.fixture
def planted(tmp_path):
    for name, text in PLANTED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "pyproject.toml").write_text(PLANTED_PYPROJECT)
    return tmp_path


def test_the_check_reports_planted_cycles_by_file_and_line(planted):
    files, edges = import_graph(planted, package_map(planted))
    assert files["epishard.stream.decode"] == Path("stream/decode.py")
    assert cycles(edges) == [
        # hidden in a function-local import (b.py line 5)
        "cycle of 2 modules [epishard.format.a, epishard.format.b]: epishard.format.a -> epishard.format.b -> "
        "epishard.format.a "
        "(epishard/format/a.py:1, epishard/format/b.py:5)",
        # hidden under `if TYPE_CHECKING:` (d.py line 6)
        "cycle of 2 modules [epishard.format.c, epishard.format.d]: epishard.format.c -> epishard.format.d -> "
        "epishard.format.c "
        "(epishard/format/c.py:1, epishard/format/d.py:6)",
    ]


def test_the_check_reports_planted_layer_violations_by_file_and_line(planted):
    _, edges = import_graph(planted, package_map(planted))
    assert layer_violations(edges) == [
        "stream/decode.py:5: epishard.stream.decode imports epishard.shardwriter.video (stream must not import "
        "shardwriter)",
        "stream/source.py:1: epishard.stream.source imports epishard.shardwriter.video (stream must not import "
        "shardwriter)",
        "stream/source.py:2: epishard.stream.source imports epishard.cli (stream must not import cli)",
    ]


def test_the_check_reports_a_planted_longer_cycle_and_format_importing_the_writer(planted):
    (planted / "epishard/format/a.py").write_text("from . import b\nfrom epishard.shardwriter import video\n")
    (planted / "epishard/format/b.py").write_text("x = 1\n")
    _, edges = import_graph(planted, package_map(planted))
    assert cycles(edges)[0] == (
        "cycle of 2 modules [epishard.format.a, epishard.shardwriter.video]: epishard.format.a -> "
        "epishard.shardwriter.video -> epishard.format.a "
        "(epishard/format/a.py:2, shardwriter/video.py:1)"
    )
    assert layer_violations(edges)[0] == (
        "epishard/format/a.py:2: epishard.format.a imports epishard.shardwriter.video (format must not import "
        "shardwriter)"
    )


# --- the old paths of the contract's modules are gone -----------------------------------------------

OLD_PATHS = {
    "epishard.shardwriter.format": "epishard.format.manifest",
    "epishard.shardwriter.index": "epishard.format.index",
    "epishard.shardwriter.validate": "epishard.format.validate",
    "epishard.shardwriter.storage": "epishard.format.storage",
    "epishard.shardwriter.verified": "epishard.format.verified",
    "epishard.shardwriter.stats": "epishard.format.stats",
    "epishard.shardwriter.retry": "epishard.format.retry",
    "epishard.shardwriter.untrusted": "epishard.format.untrusted",
}


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_an_old_writer_path_of_a_contract_module_is_gone(old):
    """The deprecation aliases lived one release (CHANGELOG: what to import instead)."""
    import importlib

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
    assert importlib.import_module(OLD_PATHS[old]).__name__ == OLD_PATHS[old]


def test_the_writer_and_the_top_level_export_the_contracts_objects_without_a_warning():
    import subprocess

    code = (
        "import warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import epishard, epishard.shardwriter as w\n"
        "from epishard.format.index import WindowIndex\n"
        "from epishard.format.manifest import Manifest\n"
        "from epishard.format.errors import FormatError\n"
        "assert w.WindowIndex is WindowIndex is epishard.WindowIndex\n"
        "assert w.Manifest is Manifest is epishard.Manifest\n"
        "assert epishard.FormatError is FormatError\n"
        "import sys\n"
        "print(sorted(m for m in sys.modules if m.startswith('epishard.shardwriter.') and m.rsplit('.', 1)[1] in "
        "('format', 'index', 'validate', 'storage', 'verified', 'stats', 'retry', 'untrusted')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"  # the writer itself imports no shim
