"""Write the docs site's API reference pages (``docs/api/*.md``) from the packages as they are.

One page per package (``epishard.format``, ``epishard.shardwriter``, ``epishard.stream``,
``epishard.balance``): first its face (the package's ``__all__``, each name linked to its entry), then
"Implementation modules (internal)", one section per module (a name without a leading underscore; the
deprecated aliases, whose docstring starts with "Deprecated alias", are left out) showing only the names
of its ``__all__`` (read statically by ``tools/dev/api_surface.py``), and
``docs/api/index.md`` for the curated API (``epishard._API``: each name at the module that defines
it). mkdocstrings renders the docstrings when the site is built; ``tests/test_docs.py`` checks that
every public module and curated name has its entry, so run this after adding a module:

    .venv/bin/python tools/dev/api_pages.py      # rewrites docs/api/*.md
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = {  # page -> (package, folder, introduction)
    "format.md": (
        "epishard.format",
        "epishard/format",
        "The contract between the writer and the reader: names and constants, the manifest, the window "
        "index, validation of untrusted files, the errors, storage, retries and the decoder glue. The "
        "writer, the reader and `epishard.balance` import it; it imports none of them. See "
        "[Format](../FORMAT.md).",
    ),
    "shardwriter.md": (
        "epishard.shardwriter",
        "shardwriter",
        "The writer: sources (LeRobot, HDF5, Zarr, RLDS, MCAP, your own episodes), conversion into "
        "window-indexed shards, verification and description. See [Converting](../guide/converting.md). "
        "`epishard.shardwriter.{format,index,validate,storage,verified,stats,retry,untrusted}` are "
        "deprecated aliases of the `epishard.format` modules (importing one warns).",
    ),
    "stream.md": (
        "epishard.stream",
        "stream",
        "The reader: window specs, options, the epoch plan, shuffling and stages, fetching, look-ahead "
        "decoding, the dataset and loader, mixing, selection, telemetry, the LeRobot drop-in and the Ray "
        "loader. See [Streaming](../guide/streaming.md).",
    ),
    "balance.md": (
        "epishard.balance",
        "balance",
        "Cost models, balanced steps across ranks and the balanced streaming dataset. See "
        "[Distributed](../guide/distributed.md#balancing-ranks-by-cost).",
    ),
}
GROUPS = (("epishard.format", "Format"), ("epishard.shardwriter", "Writer"), ("epishard.stream", "Reader"))


def is_alias(path: str) -> bool:
    """Whether the module at ``path`` is a deprecated alias (its docstring starts "Deprecated alias")."""
    with open(path, encoding="utf-8") as f:
        return f.read(200).lstrip('"\n ').startswith("Deprecated alias")


def public_modules(folder: str) -> list[str]:
    """The public modules and subpackages of ``folder`` (relative to the repository root), sorted."""
    names = []
    for name in sorted(os.listdir(os.path.join(ROOT, folder))):
        path = os.path.join(ROOT, folder, name)
        if name.startswith("_"):
            continue
        if name.endswith(".py") and not is_alias(path):
            names.append(name[:-3])
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            names.append(name)
    return names


def curated_homes() -> dict[str, str]:
    """Each curated name of ``epishard._API`` -> the module that defines it (imports the packages)."""
    sys.path.insert(0, ROOT)
    import epishard

    return {name: getattr(importlib.import_module(module), name).__module__ for name, module in epishard._API.items()}


def _surface():
    """tools/dev/api_surface.py (the static reading of each module's ``__all__``), loaded once."""
    if "api_surface" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "api_surface", os.path.join(ROOT, "tools", "dev", "api_surface.py")
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["api_surface"] = module
        spec.loader.exec_module(module)
    return sys.modules["api_surface"]


def _page_of(module: str) -> str:
    """The page a module's section is on: the longest package of PACKAGES that holds it."""
    return max(
        ((page, spec[0]) for page, spec in PACKAGES.items() if module.startswith(spec[0] + ".")),
        key=lambda x: len(x[1]),
    )[0]


def face_links(package: str, homes: dict[str, str]) -> list[str]:
    """One Markdown line per name of ``package``'s face (its ``__init__.__all__``): the name, linked to where
    it is documented (the curated API's page, else its module's section)."""
    from pathlib import Path

    known = _surface().modules(Path(ROOT))
    lines = []
    for name in known[package].all or []:
        if name in homes:
            target = f"index.md#{homes[name]}.{name}"
        else:
            homes_of = [m for m in sorted(known) if name in known[m].defined and not known[m].is_init]
            home = next((m for m in homes_of if name in (known[m].all or ())), homes_of[0])
            target = f"{'' if _page_of(home) == _page_of(package + '.x') else _page_of(home)}#{home}.{name}"
        lines.append(f"- [`{name}`]({target})")
    return lines


def package_page(package: str, folder: str, intro: str, homes: dict[str, str]) -> str:
    """The Markdown of one package's page: its docstring and its face, then one section per module.

    The face is the package's ``__all__``: the names users import from it, each linked to its entry. The
    modules behind it are internal; each section renders the names of its module's ``__all__`` that the module
    defines (not the ones it re-exports). A curated name (``homes``: name -> defining module) is rendered on the
    curated API's page only, and its module's section links there, so every object has one page (one
    primary URL).
    """
    from pathlib import Path

    known = _surface().modules(Path(ROOT))
    lines = [f"# `{package}`", "", intro, "", f"::: {package}", "    options:", "      members: false"]
    lines += ["      show_root_heading: false", ""]
    lines += [f"## The face: `from {package} import ...`", "", *face_links(package, homes), ""]
    lines += ["## Implementation modules (internal)", ""]
    lines += [f"Code inside `{package}` imports these names from their modules; users import the face above.", ""]
    for module in public_modules(folder):
        dotted = f"{package}.{module}"
        lines += [f"### `{dotted}`", ""]
        curated = [name for name, home in homes.items() if home == dotted]
        if curated:
            links = ", ".join(f"[`{name}`](index.md#{dotted}.{name})" for name in curated)
            lines += [f"On the curated API's page: {links}.", ""]
        own = known[dotted]
        members = [n for n in own.all or [] if n in own.defined and n not in curated]
        lines += [f"::: {dotted}", "    options:", "      show_root_heading: false", "      heading_level: 4"]
        if own.all is not None:  # a module without one (yet) shows its names without a leading underscore
            lines += [f"      members: [{', '.join(members)}]" if members else "      members: false"]
        lines += [""]
    return "\n".join(lines)


def curated_page(homes: dict[str, str]) -> str:
    """The Markdown of the curated API's page: each name of ``epishard._API`` at its defining module."""
    import epishard

    lines = ["# `epishard`: the curated API", ""]
    lines += ["`from epishard import ...` gives these names; each is imported on first use, so `import epishard`"]
    lines += ["stays fast. The packages' pages hold the rest.", ""]
    lines += ["::: epishard", "    options:", "      members: false", "      show_root_heading: false", ""]
    group = None
    for name, module in epishard._API.items():
        title = next((t for prefix, t in GROUPS if module.startswith(prefix)), "Balancing")
        if title != group:
            group = title
            lines += [f"## {title}", ""]
        lines += [f"::: {homes[name]}.{name}", "    options:", "      show_root_full_path: false"]
        lines += ["      heading_level: 3", ""]
    return "\n".join(lines)


def main() -> int:
    """Write every page into ``docs/api/``; print each path; return 0."""
    homes = curated_homes()
    pages = {name: package_page(*spec, homes) for name, spec in PACKAGES.items()}
    pages["index.md"] = curated_page(homes)
    for name, text in pages.items():
        path = os.path.join(ROOT, "docs", "api", name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
