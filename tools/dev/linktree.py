"""The installed layout of the packages, as a tree of symlinks, for tools that know no package-dir mapping.

pyproject.toml maps the top-level folders ``shardwriter/``, ``stream/`` and ``balance/`` under
``epishard`` (``epishard.shardwriter``, ...). Static tools (mypy, the docs site's mkdocstrings) look
for ``epishard/stream/`` on disk and do not follow that mapping, nor the import hook of an editable
install; the tree this module builds holds exactly the wheel's layout:
``DEST/epishard/{<epishard/'s modules and subpackages>, shardwriter, stream, balance}``.
"""

from __future__ import annotations

import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("shardwriter", "stream", "balance")


def build_tree(dest: str) -> str:
    """Link ``epishard/``'s modules and subpackages and the three package folders into ``dest/epishard``.

    ``dest`` is emptied first (regenerated every run, so a removed module leaves no link behind).
    Returns the path of ``dest/epishard``. Raises ``OSError`` if ``dest`` cannot be written.
    """
    shutil.rmtree(dest, ignore_errors=True)
    top = os.path.join(dest, "epishard")
    os.makedirs(top)
    for name in os.listdir(os.path.join(ROOT, "epishard")):
        if name.endswith((".py", ".typed")) or os.path.isfile(os.path.join(ROOT, "epishard", name, "__init__.py")):
            os.symlink(os.path.join(ROOT, "epishard", name), os.path.join(top, name))
    for package in PACKAGES:
        os.symlink(os.path.join(ROOT, package), os.path.join(top, package))
    return top
