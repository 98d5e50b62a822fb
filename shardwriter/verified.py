"""Deprecated alias of ``epishard.format.verified``, kept for one release.

Importing it warns (``DeprecationWarning``); it holds the objects of ``epishard.format.verified``,
public and private names alike (the same objects, not copies).
"""

import warnings

from epishard.format import verified as _new
from epishard.format.verified import *  # noqa: F403  (the public names, for type checkers)

warnings.warn(
    "epishard.shardwriter.verified is deprecated; import epishard.format.verified", DeprecationWarning, stacklevel=2
)
globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__")})
