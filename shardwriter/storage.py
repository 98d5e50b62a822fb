"""Deprecated alias of ``epishard.format.storage``, kept for one release.

Importing it warns (``DeprecationWarning``); it holds the objects of ``epishard.format.storage``,
public and private names alike (the same objects, not copies).
"""

import warnings

from epishard.format import storage as _new
from epishard.format.storage import *  # noqa: F403  (the public names, for type checkers)

warnings.warn(
    "epishard.shardwriter.storage is deprecated; import epishard.format.storage", DeprecationWarning, stacklevel=2
)
globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__")})
