"""mkdocs hooks (``mkdocs.yml``'s ``hooks:``): the package tree the API reference is read from.

mkdocstrings reads the packages statically, from ``epishard/stream/...`` on disk, which the
repository does not have (pyproject.toml maps ``stream/`` to ``epishard.stream``). Before every
build this links the installed layout into ``build/api/`` (``linktree.py``), which ``mkdocs.yml``
gives the python handler as its ``paths``; ``build/`` is not committed, so a fresh clone builds it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from linktree import ROOT, build_tree  # tools/dev/linktree.py

TREE = os.path.join(ROOT, "build", "api")


def on_startup(command: str, dirty: bool, **kwargs: Any) -> None:
    """Build ``build/api/epishard`` before mkdocs reads a page (``command``: build, serve or gh-deploy)."""
    build_tree(TREE)
