"""Count each package's public surface: its face, its modules' public names, and the ones nobody uses.

Per package (``epishard``, ``epishard.format``, ``epishard.cli``, ``epishard.shardwriter``,
``epishard.shardwriter.sources``, ``epishard.stream``, ``epishard.balance``):

- modules: its ``.py`` files (the ``__init__`` included), and how many are private (``_name.py``);
- face: the names of its ``__init__``'s ``__all__`` (what users import from the package);
- public names: the module-level names of its other modules that have no leading underscore and are
  not imported (a module with an ``__all__``: exactly its ``__all__``);
- unused elsewhere: those of them no other module reads (package code, ``tools/``, ``tests/``).

A use is found with ``ast`` only, so this runs on any checkout (``--root``): ``from m import name``
(relative ones resolved), ``alias.name`` on an imported module, a dotted string (``mock.patch``,
``monkeypatch.setattr("epishard.stream.fetch.name", ...)``), ``getattr``/``setattr`` on a module with a
constant name, a ``{"name": "epishard.x"}`` map (``epishard._API``), ``"module:function"`` openers
(``shardwriter/sources``), and attributes of a module imported by an f-string
(``import_module(f"epishard.cli.{name}")``: a use in every module of that package).

    .venv/bin/python tools/dev/api_surface.py [--root PATH] [--names]

``tests/test_architecture.py`` uses ``modules``, ``bound_names`` and ``imports`` for its ``__all__`` rules.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Package -> folder relative to the repository root (pyproject.toml's package-dir mapping).
PACKAGES = {
    "epishard": "epishard",
    "epishard.format": "epishard/format",
    "epishard.cli": "epishard/cli",
    "epishard.shardwriter": "shardwriter",
    "epishard.shardwriter.sources": "shardwriter/sources",
    "epishard.stream": "stream",
    "epishard.balance": "balance",
}
USERS = ("tools", "tests")  # folders whose files use the packages without being part of them


@dataclass
class Module:
    name: str  # dotted, as installed: epishard.stream.plan
    package: str  # epishard.stream
    path: Path  # relative to the root
    tree: ast.Module
    is_init: bool
    all: list[str] | None  # its __all__, None if it has none
    defined: set[str] = field(default_factory=set)  # bound at module level, not by an import
    imported: set[str] = field(default_factory=set)  # bound at module level by an import

    @property
    def public(self) -> set[str]:
        """Its public names: ``__all__`` if it has one, else what it defines without a leading underscore."""
        if self.all is not None:
            return set(self.all)
        return {n for n in self.defined if not n.startswith("_")}


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for e in node.elts for n in _targets(e)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


def _top_level(body: list[ast.stmt]):
    """The module-level statements, entering ``if``/``try``/``with`` blocks (not functions or classes)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            yield from _top_level(node.body)


def bound_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names a module binds at its top level itself, names it binds by importing)."""
    defined: set[str] = set()
    imported: set[str] = set()
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(n for t in node.targets for n in _targets(t))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, (ast.For, ast.With)):
            targets = [node.target] if isinstance(node, ast.For) else [i.optional_vars for i in node.items]
            defined.update(n for t in targets if t is not None for n in _targets(t))
        elif isinstance(node, ast.Import):
            imported.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.update(a.asname or a.name for a in node.names if a.name != "*")
    return defined - imported, imported


def declared_all(tree: ast.Module) -> list[str] | None:
    """The strings of a module's ``__all__ = [...]`` (or tuple), None if it has none."""
    for node in _top_level(tree.body):
        value = None
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            value = node.value  # type: ignore[union-attr]
        if value is not None:
            return _strings(value, tree)
    return None


def _strings(value: ast.expr, tree: ast.Module) -> list[str]:
    """The strings of a list or tuple literal; ``*NAME`` or ``*sorted(NAME)`` adds those of a top-level literal
    (a dict's keys: ``["__version__", *sorted(_API)]``)."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") in ("sorted", "list", "tuple") and value.args:
        value = value.args[0]
    if isinstance(value, ast.Name):
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == value.id for t in node.targets):
                return _strings(node.value, tree)
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == value.id and node.value:
                return _strings(node.value, tree)
        return []
    if isinstance(value, ast.Dict):
        return [k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    if isinstance(value, ast.BinOp):
        return _strings(value.left, tree) + _strings(value.right, tree)
    out: list[str] = []
    for e in value.elts if isinstance(value, (ast.List, ast.Tuple)) else []:
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
            out.append(e.value)
        elif isinstance(e, ast.Starred):
            out += _strings(e.value, tree)
    return out


def lazy_names(tree: ast.Module) -> set[str]:
    """Names a module with a PEP 562 ``__getattr__`` serves lazily: the string keys of its top-level dicts."""
    if not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
        return set()
    out: set[str] = set()
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Dict):
            out.update(k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return out


def modules(root: Path) -> dict[str, Module]:
    """Every module of the packages under ``root``, by dotted name (packages whose folder is absent: none)."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted((root / folder).glob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            is_init = path.name == "__init__.py"
            name = package if is_init else f"{package}.{path.stem}"
            defined, imported = bound_names(tree)
            out[name] = Module(
                name, package, path.relative_to(root), tree, is_init, declared_all(tree), defined, imported
            )
    return out


@dataclass(frozen=True)
class Use:
    path: Path  # the file that uses it, relative to the root
    line: int
    module: str  # the module it is read from
    name: str
    statement: bool  # an import statement (``from module import name``), not an attribute or a string


def _module_of(path: Path) -> tuple[str, bool] | None:
    """(dotted module name, is a package's __init__) of a package file, None for other files."""
    for package, folder in PACKAGES.items():
        if path.parent == Path(folder):
            return (package, True) if path.name == "__init__.py" else (f"{package}.{path.stem}", False)
    return None


def _dotted(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def imports(path: Path, tree: ast.Module, known: dict[str, Module]) -> list[Use]:
    """What the file at ``path`` (relative to the root) reads from the known modules, with ``ast`` only."""
    me = _module_of(path)
    here = (me[0] if me[1] else me[0].rpartition(".")[0]) if me else ""
    aliases: dict[str, str] = {}  # local name -> module it names
    dynamic: dict[str, str] = {}  # local name -> package whose modules an f-string import names
    out: list[Use] = []
    _mark_parents(tree)

    def use(line: int, module: str, name: str, statement: bool = False) -> None:
        if module in known and module != (me[0] if me else None) and not name.startswith("__"):
            out.append(Use(path, line, module, name, statement))

    def split(dotted: str) -> tuple[str, str] | None:
        """``epishard.stream.plan.SALT`` -> (``epishard.stream.plan``, ``SALT``): the longest module prefix."""
        parts = dotted.split(".")
        for i in range(len(parts) - 1, 0, -1):
            if ".".join(parts[:i]) in known:
                return ".".join(parts[:i]), parts[i]
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(parts) + (f".{base}" if base else "")
            for a in node.names:
                if f"{base}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
                else:
                    use(node.lineno, base, a.name, statement=True)
        elif isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value.args:
            first = node.value.args[0]
            if isinstance(first, ast.JoinedStr) and first.values and isinstance(first.values[0], ast.Constant):
                prefix = str(first.values[0].value).rstrip(".")
                if prefix in known and known[prefix].is_init:
                    dynamic.update((n, prefix) for t in node.targets for n in _targets(t))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "_parent", None), ast.Attribute):
            parts = _dotted(node)
            if parts and parts[0] in dynamic and len(parts) > 1:
                for m in known.values():
                    if m.package == dynamic[parts[0]] and not m.path.stem.startswith("_"):
                        use(node.lineno, m.name, parts[1])
            elif parts and parts[0] in aliases:
                found = split(".".join([aliases[parts[0]], *parts[1:]]))
                if found:
                    use(node.lineno, *found)
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            target, name = node.args[0], node.args[1]
            if func in ("getattr", "setattr", "hasattr", "delattr") and isinstance(name, ast.Constant):
                parts = _dotted(target)
                if parts and parts[0] in aliases and isinstance(name.value, str):
                    module = ".".join([aliases[parts[0]], *parts[1:]])
                    use(node.lineno, module, name.value)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if re.fullmatch(r"epishard(\.\w+)+", text):
                found = split(text)
                if found:
                    use(node.lineno, *found)
            elif m := re.fullmatch(r"([\w.]+):(\w+)", text):
                for module in (m.group(1), f"epishard.shardwriter.{m.group(1)}"):
                    use(node.lineno, module, m.group(2))
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(k, ast.Constant)
                    and isinstance(v, ast.Constant)
                    and str(k.value).isidentifier()
                    and isinstance(v.value, str)
                ):
                    use(node.lineno, v.value, str(k.value))
    return out


def _mark_parents(tree: ast.Module) -> None:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child._parent = node  # type: ignore[attr-defined]


def user_files(root: Path) -> list[Path]:
    """Every Python file that may use the packages: the packages' own, ``tools/`` and ``tests/``."""
    files = {p for folder in PACKAGES.values() for p in (root / folder).glob("*.py")}
    files |= {p for folder in USERS for p in (root / folder).rglob("*.py")}
    return sorted(p.relative_to(root) for p in files)


def all_uses(root: Path, known: dict[str, Module]) -> list[Use]:
    out = []
    for path in user_files(root):
        try:
            text = (root / path).read_text(encoding="utf-8")
        except FileNotFoundError:  # removed since the listing (someone is editing the checkout)
            continue
        out += imports(path, ast.parse(text, filename=str(path)), known)
    return out


def surface(root: Path) -> list[dict]:
    """One row per package: its modules, face, public names and those unused elsewhere."""
    known = modules(root)
    used: dict[str, set[str]] = {}
    for u in all_uses(root, known):
        used.setdefault(u.module, set()).add(u.name)
    rows = []
    for package in PACKAGES:
        mods = [m for m in known.values() if m.package == package]
        if not mods:
            continue
        init = next((m for m in mods if m.is_init), None)
        impl = [m for m in mods if not m.is_init]
        public = {(m.name, n) for m in impl for n in m.public}
        unused = sorted(f"{mod}.{n}" for mod, n in public if n not in used.get(mod, set()))
        rows.append(
            {
                "package": package,
                "modules": len(mods),
                "private": sum(m.path.stem.startswith("_") and not m.path.stem.startswith("__") for m in mods),
                "with_all": sum(m.all is not None for m in mods),
                "face": len(init.all) if init and init.all is not None else None,
                "public": len(public),
                "unused": unused,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the table for the checkout at ``--root`` (default: this one); ``--names`` lists the unused ones."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--names", action="store_true", help="list the public names no other module uses")
    args = parser.parse_args(argv)
    rows = surface(args.root.resolve())
    print("| package | modules (private) | with `__all__` | face (`__init__` `__all__`) | public names |", end="")
    print(" unused elsewhere |")
    print("|---|---|---|---|---|---|")
    total = {"modules": 0, "private": 0, "with_all": 0, "face": 0, "public": 0, "unused": 0}
    for r in rows:
        face = "none" if r["face"] is None else r["face"]
        cells = [f"`{r['package']}`", f"{r['modules']} ({r['private']})", r["with_all"], face, r["public"]]
        print("| " + " | ".join(map(str, [*cells, len(r["unused"])])) + " |")
        for key in ("modules", "private", "with_all", "public"):
            total[key] += r[key]
        total["face"] += r["face"] or 0
        total["unused"] += len(r["unused"])
    cells = [
        f"{total['modules']} ({total['private']})",
        total["with_all"],
        total["face"],
        total["public"],
        total["unused"],
    ]
    print("| **all** | " + " | ".join(map(str, cells)) + " |")
    if args.names:
        for r in rows:
            for name in r["unused"]:
                print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
