"""Deprecated alias of ``epishard.format.retry``, kept for one release.

Importing it warns (``DeprecationWarning``); it holds the objects of ``epishard.format.retry``,
public and private names alike (the same objects, not copies).
"""

import warnings

from epishard.format import retry as _new
from epishard.format.retry import *  # noqa: F403  (the public names, for type checkers)

warnings.warn(
    "epishard.shardwriter.retry is deprecated; import epishard.format.retry", DeprecationWarning, stacklevel=2
)
globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__")})
