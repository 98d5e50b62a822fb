"""``python -m epishard.cli``: the same command line as ``epishard``.

Internal: the command line's own module (``epishard.cli``).
"""

from epishard.cli import main

__all__ = []

raise SystemExit(main())
