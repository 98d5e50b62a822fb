"""Type-check the packages as the wheel installs them: ``epishard``, ``epishard.shardwriter``, ...

The folders stay at the repository top level (shardwriter/, stream/, balance/) and pyproject.toml maps
them under ``epishard``; mypy knows no package-dir mapping, so checking the folders directly would
see ``stream.plan`` and leave every ``from epishard.stream... import`` unresolved (typed as Any), and
it does not follow an editable install's import hook either (so ``mypy -p epishard`` in the venv
cannot see them). Hence this script, kept as a development tool: it builds that layout as a tree
of symlinks in ``build/typecheck/`` (``linktree.py``, regenerated every run), runs mypy on it with
pyproject.toml's ``[tool.mypy]`` settings and prints each error under its real path (``stream/plan.py``),
so editors and the gate agree.

    python tools/dev/typecheck.py        # exit status: mypy's (0 = no errors)
"""

from __future__ import annotations

import os
import sys

from linktree import PACKAGES, ROOT, build_tree  # tools/dev/linktree.py: this script's folder is sys.path[0]
from mypy import api

TREE = os.path.join(ROOT, "build", "typecheck")


def real_path(line: str) -> str:
    """``epishard/stream/plan.py:3: ...`` -> ``stream/plan.py:3: ...`` (``epishard/cli.py`` stays)."""
    for package in PACKAGES:
        prefix = f"epishard/{package}/"
        if line.startswith(prefix):
            return line[len("epishard/") :]
    return line


def main() -> int:
    """Run mypy on the linked tree; print its report with real paths; return its exit status."""
    build_tree(TREE)
    config = os.path.join(ROOT, "pyproject.toml")
    cache = os.path.join(ROOT, ".mypy_cache")
    cwd = os.getcwd()
    os.chdir(TREE)
    try:
        stdout, stderr, status = api.run(["--config-file", config, "--cache-dir", cache, "-p", "epishard"])
    finally:
        os.chdir(cwd)
    sys.stdout.write("".join(real_path(line) + "\n" for line in stdout.splitlines()))
    sys.stderr.write(stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
