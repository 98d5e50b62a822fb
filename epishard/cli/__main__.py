"""``python -m epishard.cli``: the same command line as ``epishard``."""

from epishard.cli import main

raise SystemExit(main())
