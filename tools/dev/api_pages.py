"""Write the docs site's API reference pages (``docs/api/*.md``) from the packages as they are.

One page per package (``epishard.format``, ``epishard.shardwriter``, ``epishard.stream``,
``epishard.balance``), one section per public module (a name without a leading underscore; the
deprecated aliases, whose docstring starts with "Deprecated alias", are left out), and
``docs/api/index.md`` for the curated API (``epishard._API``: each name at the module that defines
it). mkdocstrings renders the docstrings when the site is built; ``tests/test_docs.py`` checks that
every public module and curated name has its entry, so run this after adding a module:

    .venv/bin/python tools/dev/api_pages.py      # rewrites docs/api/*.md
"""

from __future__ import annotations

import importlib
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


def package_page(package: str, folder: str, intro: str, homes: dict[str, str]) -> str:
    """The Markdown of one package's page: its docstring, then one section per public module.

    A curated name (``homes``: name -> defining module) is rendered on the curated API's page only,
    and its module's section links there, so every object has one page (one primary URL).
    """
    lines = [f"# `{package}`", "", intro, "", f"::: {package}", "    options:", "      members: false"]
    lines += ["      show_root_heading: false", ""]
    for module in public_modules(folder):
        lines += [f"## `{package}.{module}`", ""]
        curated = [name for name, home in homes.items() if home == f"{package}.{module}"]
        if curated:
            links = ", ".join(f"[`{name}`](index.md#{package}.{module}.{name})" for name in curated)
            lines += [f"On the curated API's page: {links}.", ""]
        lines += [f"::: {package}.{module}", "    options:", "      show_root_heading: false", "      heading_level: 3"]
        if curated:
            lines += [f'      filters: ["!^_", "!^({"|".join(curated)})$"]']
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
