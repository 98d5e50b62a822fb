"""Deprecated alias of ``epishard.format.stats``, kept for one release.

Importing it warns (``DeprecationWarning``); it holds the objects of ``epishard.format.stats``,
public and private names alike (the same objects, not copies).
"""

import warnings

from epishard.format import stats as _new
from epishard.format.stats import *  # noqa: F403  (the public names, for type checkers)

warnings.warn(
    "epishard.shardwriter.stats is deprecated; import epishard.format.stats", DeprecationWarning, stacklevel=2
)
globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__")})
