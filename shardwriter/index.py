"""Deprecated alias of ``epishard.format.index``, kept for one release.

Importing it warns (``DeprecationWarning``); it holds the objects of ``epishard.format.index``,
public and private names alike (the same objects, not copies).
"""

import warnings

from epishard.format import index as _new
from epishard.format.index import *  # noqa: F403  (the public names, for type checkers)

warnings.warn(
    "epishard.shardwriter.index is deprecated; import epishard.format.index", DeprecationWarning, stacklevel=2
)
globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__")})
