"""Architecture rules, checked on the source code (issue 15's acceptance: "grep proves it").

Each rule is a function ``rule(path, tree) -> list[Violation]`` over one parsed module of the
scanned packages, plus a test that runs it over every module (failing with ``file:line: why`` for
each violation) and a test that it catches a known-bad snippet (so a rule that cannot fail is
noticed). To add a rule: write its function, add it to the ``test_packages_follow`` parametrisation
with its bad snippet in ``test_rule_catches_a_bad_snippet``.

Scanned: every ``*.py`` file under ``shardwriter/``, ``stream/``, ``balance/``, ``epishard/`` and
``tools/`` (not ``tests/``: tests forge damaged indexes on purpose).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("shardwriter", "stream", "balance", "epishard", "tools")
INDEX_MODULE = Path("epishard/format/index.py")
STREAMS_MODULE = Path("epishard/format/streams.py")


@dataclass(frozen=True)
class Violation:
    path: Path  # relative to the repository root
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}"


def source_files() -> list[Path]:
    """Every scanned module, relative to the repository root, sorted."""
    return sorted(p.relative_to(ROOT) for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


@functools.cache
def parse(path: Path) -> ast.Module:
    return ast.parse((ROOT / path).read_text(), filename=str(path))


def _last_name(node: ast.expr) -> str:
    """The identifier an expression ends in: ``index`` for ``self.sources[0].index``, else ``""``."""
    while isinstance(node, (ast.Subscript, ast.Call)):
        node = node.value if isinstance(node, ast.Subscript) else node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


# --- rule 1: WindowIndex is the only view of the index ----------------------------------------------


@functools.cache
def window_index_private_names() -> frozenset[str]:
    """Private attributes and methods of ``WindowIndex`` (``_table``, ``_from_dataset_table``, ...),
    read from ``epishard/format/index.py``: methods defined in the class, attributes assigned on ``self``.
    """
    cls = next(n for n in parse(INDEX_MODULE).body if isinstance(n, ast.ClassDef) and n.name == "WindowIndex")
    names = {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


# Names taken for an index (a ``WindowIndex``, an index file or its bytes): ``index``, ``ix``, ``idx``,
# ``index_file``, ``dataset_index``, ``shard_ix``, ... but not the format's ``*_index`` columns.
INDEX_NAME = re.compile(r"^(index|ix|idx)(_\w+)?$|^\w+_(index|ix)$|\.index\.parquet$|^index\.arrow$")
COLUMNS = {"episode_index", "frame_index", "task_index", "stream_index"}
ARROW_IPC_READERS = {
    ("ipc", "open_file"),
    ("ipc", "open_stream"),
    ("feather", "read_table"),
    ("feather", "read_feather"),
}
PARQUET_READERS = {"read_table_bytes", "read_table", "ParquetFile", "read_schema", "read_metadata"}


def _is_index_name(name: str) -> bool:
    return bool(INDEX_NAME.search(name)) and name not in COLUMNS


def _source_names(node: ast.expr) -> set[str]:
    """Identifiers and string keys an expression reads from: ``{"storage", "read", "entry", "index"}``
    for ``storage.read(entry["index"])``; computed subscripts (``blobs[member]``) are not followed.
    """
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr} | _source_names(node.value)
    if isinstance(node, ast.Subscript):
        key = node.slice
        return _source_names(node.value) | (
            {key.value} if isinstance(key, ast.Constant) and isinstance(key.value, str) else set()
        )
    if isinstance(node, ast.Call):
        return _source_names(node.func).union(*map(_source_names, node.args))
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    return set()


def index_table_access(path: Path, tree: ast.Module) -> list[Violation]:
    """Outside ``epishard/format/index.py``, nothing reaches the index's Arrow table:

    - no private attribute or method of ``WindowIndex`` (``x._table``, ``x._from_dataset_table``, ...);
    - no ``.table`` of an index (a receiver named ``index``, ``ix``, ``idx``, ``*_index``, ``*_ix``);
    - no ``WindowIndex(...)`` call (its constructor takes the Arrow table);
    - no Arrow IPC read (``pa.ipc.open_file``/``open_stream``, ``feather.read_table``/``read_feather``):
      ``index.arrow`` is the format's only other Arrow IPC file than a stream's member, which
      ``epishard/format/streams.py`` alone reads;
    - no Parquet read (``read_table_bytes``, ``pq.read_table``, ``ParquetFile``, ``read_schema``,
      ``read_metadata``) of something named as an index (``read_table_bytes(index_file)``,
      ``pq.read_table(entry["index"])``).
    """
    if path == INDEX_MODULE:
        return []
    private = window_index_private_names()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr in private:
                out.append(Violation(path, node.lineno, f"private WindowIndex member .{node.attr}"))
            elif node.attr == "table" and _is_index_name(_last_name(node.value)):
                out.append(Violation(path, node.lineno, f"the index's Arrow table: {ast.unparse(node)}"))
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        owner = _last_name(func.value) if isinstance(func, ast.Attribute) else ""
        if called == "WindowIndex":
            out.append(Violation(path, node.lineno, "WindowIndex(table, ...) built from an Arrow table"))
        elif (owner, called) in ARROW_IPC_READERS and path != STREAMS_MODULE:
            out.append(Violation(path, node.lineno, f"Arrow IPC read (index.arrow's format): {ast.unparse(func)}"))
        elif called in PARQUET_READERS and node.args and any(map(_is_index_name, _source_names(node.args[0]))):
            out.append(Violation(path, node.lineno, f"Parquet read of an index: {ast.unparse(node)[:80]}"))
    return sorted(out, key=lambda v: v.line)


# --- rule 3: a module reads no other module's private attributes -----------------------------------


def _is_protocol(cls: ast.ClassDef) -> bool:
    return any(_last_name(b) == "Protocol" for b in cls.bases)


def _owned_private(tree: ast.Module) -> set[str]:
    """Private names a module's classes own: methods and class attributes defined in a class body, and
    attributes assigned on ``self``/``cls`` (a ``Protocol`` that declares one owns nothing)."""
    out: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and not _is_protocol(n)):
        for b in cls.body:
            if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(b.name):
                out.add(b.name)
            elif isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name) and _private(b.target.id):
                out.add(b.target.id)
            elif isinstance(b, ast.Assign):
                out |= {t.id for t in b.targets if isinstance(t, ast.Name) and _private(t.id)}
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
                and _private(node.attr)
            ):
                out.add(node.attr)
    return out


@functools.cache
def private_owners() -> dict[str, frozenset[Path]]:
    """Private attribute name -> the scanned modules whose classes own it."""
    owners: dict[str, set[Path]] = {}
    for path in source_files():
        for name in _owned_private(parse(path)):
            owners.setdefault(name, set()).add(path)
    return {name: frozenset(paths) for name, paths in owners.items()}


def private_reach_in(path: Path, tree: ast.Module, owners: dict[str, frozenset[Path]] | None = None) -> list[Violation]:
    """A module reads or writes no private attribute (``x._name``, ``x`` not ``self``/``cls``) that a class of
    another module owns, and no ``Protocol`` declares one (typing another class's private members).

    Each part owns its state: what another part needs is a public attribute, a method or an object
    passed in (``stream.reader.ReadContext``, ``stream.resume.Cursor``). Private members of other
    libraries (torch's, fsspec's) are not ours to rule: only names a scanned class owns count.
    """
    owners = private_owners() if owners is None else owners
    mine = _owned_private(tree)
    out = []
    for node in ast.walk(tree):
        outside = (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and node.attr in owners
            and node.attr not in mine
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        )
        if outside:
            theirs = ", ".join(str(p) for p in sorted(owners[node.attr]))
            out.append(Violation(path, node.lineno, f"{ast.unparse(node)}: private to {theirs}"))
        if isinstance(node, ast.ClassDef) and _is_protocol(node):
            for b in node.body:
                target = b.target if isinstance(b, ast.AnnAssign) else None
                name = getattr(b, "name", None) or (target.id if isinstance(target, ast.Name) else None)
                if name and _private(name):
                    out.append(
                        Violation(path, b.lineno, f"Protocol {node.name} declares another class's private {name}")
                    )
    return sorted(out, key=lambda v: v.line)


# --- the tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", [index_table_access, private_reach_in], ids=lambda r: r.__name__)
def test_packages_follow(rule):
    files = source_files()
    assert INDEX_MODULE in files and len(files) > 40  # the scan sees the packages
    found = [str(v) for path in files for v in rule(path, parse(path))]
    assert not found, f"{rule.__name__}: {(rule.__doc__ or '').strip().splitlines()[0]}\n" + "\n".join(found)


BAD_SNIPPETS = {
    index_table_access: (
        "import pyarrow as pa\n"
        "task = index.table.column('task')\n"  # 2
        "rows = source.index._table.to_pylist()\n"  # 3
        "ix = WindowIndex(table, shards)\n"  # 4
        "t = pa.ipc.open_file(data).read_all()\n"  # 5
        "rows = read_table_bytes(index_file)\n"  # 6
        "t = pq.read_table(storage.read(entry['index']))\n"  # 7
        "ok = self.table.lo\n"  # not an index: EpisodeTable
        "t = read_table_bytes(blobs[member])\n"  # an episode's table, not the index
        "key = index.key(0)\n"
        "t = pq.read_table(path, columns=['episode_index'])\n",
        [2, 3, 4, 5, 6, 7],
    ),
}


BAD_SNIPPETS[private_reach_in] = (
    "from typing import Protocol\n"
    "class Readable(Protocol):\n"
    "    _failed: object\n"  # 3: a Protocol typing another class's private attribute
    "class Mine:\n"
    "    def __init__(self, ds):\n"
    "        self._mine = ds._costs\n"  # 6: WindowDataset's (stream/dataset.py)
    "        ds._first_chunk = 3\n"  # 7: written from outside
    "        self._own = self._mine\n"
    "        other = Mine(ds)._mine\n"  # this module's own class
    "        torch._C._storage_Use_Count(1)\n",  # another library's
    [3, 6, 7],
)


@pytest.mark.parametrize("rule", list(BAD_SNIPPETS), ids=lambda r: r.__name__)
def test_rule_catches_a_bad_snippet(rule):
    source, lines = BAD_SNIPPETS[rule]
    found = rule(Path("stream/bad.py"), ast.parse(source))
    assert sorted(v.line for v in found) == lines, [str(v) for v in found]
    assert all(str(v).startswith(f"stream/bad.py:{v.line}: ") for v in found)


# --- rule 2: no subclass overrides a private method of another package's class ---------------------


def _imported_names(tree: ast.Module, package: str) -> dict[str, str]:
    """Local name -> dotted module path of what it names (``from x import Name`` and ``import x``)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: inside this package
                base = "epishard" if package == "epishard" else f"epishard.{package}"
                module = base + (f".{module}" if module else "")
            for alias in node.names:
                names[alias.asname or alias.name] = f"{module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:  # ``import a.b`` binds ``a``; ``import a.b as c`` binds ``c`` to ``a.b``
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    names[alias.name.split(".")[0]] = alias.name.split(".")[0]
    return names


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return inner and f"{inner}.{node.attr}"
    return None


def _resolve(path: str):
    """The class a dotted path names (``epishard.stream.dataset.WindowDataset``), or None."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def _package_of(module: str) -> str:
    """``epishard.stream.dataset`` -> ``stream``; ``torch.utils.data`` -> ``torch``."""
    parts = module.split(".")
    return parts[1] if parts[0] == "epishard" and len(parts) > 1 else parts[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_subclass_overrides_a_private_method_of_another_package():
    """A private method (``_name``) is its class's own business: a subclass in another package that
    overrides one patches a stage in instead of using a declared hook (issue 15, item 3)."""
    violations, checked = [], 0
    for path in source_files():
        package = path.parts[0]
        tree = parse(path)
        names = _imported_names(tree, package)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            own = {
                f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(f.name)
            }
            for base_node in cls.bases:
                dotted = _dotted(base_node)
                if dotted is None or dotted.split(".")[0] not in names:
                    continue  # a class of this module, or not a plain name
                head, _, rest = dotted.partition(".")
                base = _resolve(names[head] + (f".{rest}" if rest else ""))
                if not isinstance(base, type) or _package_of(base.__module__) == package:
                    continue
                checked += 1
                theirs = {n for k in base.__mro__ if k is not object for n in vars(k) if _private(n)}
                violations += [f"{path}: {cls.name}.{n} overrides {base.__name__}.{n}" for n in own & theirs]
    assert checked >= 3  # BalancedWindowDataset, WindowDataset(IterableDataset), WindowLoader(DataLoader) at least
    assert not violations, "\n".join(violations)


# --- rule 4: faces and __all__ (issue 41: each package lists its public names) ---------------------
#
# Every module of the packages defines ``__all__``, and every name in it is bound there (defined, imported,
# or served by the module's PEP 562 ``__getattr__``). A package's ``__init__.__all__`` is its face; in an
# implementation module it lists the names other modules use. Package code that imports a name from
# another module (``from epishard.stream.plan import deal``, or relatively) imports one in that module's
# ``__all__`` (or a submodule). Read with tools/dev/api_surface.py's parser, on any folder.


@functools.cache
def _api_surface():
    spec = importlib.util.spec_from_file_location("api_surface", ROOT / "tools" / "dev" / "api_surface.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def all_violations(root: Path, pending: frozenset[str] = frozenset()) -> list[str]:
    """``file:line: why`` for each module without ``__all__``, each ``__all__`` name not bound in its module,
    and each import in package code of a name outside the ``__all__`` of the module it comes from."""
    surface = _api_surface()
    known = surface.modules(root)
    out = []
    for name, module in sorted(known.items()):
        if module.all is None:
            if name not in pending:
                out.append(f"{module.path}:1: {name} has no __all__")
            continue
        bound = module.defined | module.imported | surface.lazy_names(module.tree)
        out += [
            f"{module.path}:1: __all__ names {n!r}, which {name} does not bind" for n in module.all if n not in bound
        ]
    for path in surface.user_files(root):
        if path.parts[0] in surface.USERS:
            continue  # tests and tools may reach into a module (a private helper, a monkeypatched name)
        tree = ast.parse((root / path).read_text(encoding="utf-8"), filename=str(path))
        for use in surface.imports(path, tree, known):
            source = known[use.module]
            if not use.statement or use.module in pending or use.name in source.public:
                continue
            out.append(f"{path}:{use.line}: imports {use.name} from {use.module}, not in its __all__")
    return out


def test_every_module_lists_its_public_names_and_is_imported_by_them():
    assert {"epishard.format", "epishard.stream", "epishard.shardwriter.sources"} <= set(_api_surface().modules(ROOT))
    found = all_violations(ROOT, frozenset())
    assert not found, (
        "__all__: every module lists the names other modules use, and package code imports only those "
        "(add the name to the module's __all__, or import it from where it is defined):\n" + "\n".join(found)
    )


def test_all_rule_catches_a_bad_package(tmp_path):
    files = {
        "stream/__init__.py": '__all__ = ["Face"]\nfrom .a import Face\n',
        "stream/a.py": '__all__ = ["Face", "Gone"]\nclass Face: ...\ndef helper(): ...\n',  # 1: Gone unbound
        "stream/b.py": "from .a import helper\n",  # 1: no __all__; 1: helper is not in a's __all__
        "stream/c.py": "__all__ = []\nfrom epishard.stream.a import Face\nfrom epishard.stream import a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = all_violations(tmp_path)
    assert found == [
        "stream/a.py:1: __all__ names 'Gone', which epishard.stream.a does not bind",
        "stream/b.py:1: epishard.stream.b has no __all__",
        "stream/b.py:1: imports helper from epishard.stream.a, not in its __all__",
    ], found
