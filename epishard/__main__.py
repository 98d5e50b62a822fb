"""``python -m epishard``: the same command line as ``epishard``.

Internal: the packages' shared infrastructure; users import from ``epishard`` (the curated API).
"""

from epishard.cli import main

__all__ = []

raise SystemExit(main())
