"""Deprecated alias of ``epishard.format.manifest``, kept for one release.

Importing it warns (``DeprecationWarning``); it holds the objects of ``epishard.format.manifest``,
public and private names alike (the same objects, not copies).
"""

import warnings

from epishard.format import manifest as _new
from epishard.format.manifest import *  # noqa: F403  (the public names, for type checkers)

warnings.warn(
    "epishard.shardwriter.format is deprecated; import epishard.format.manifest", DeprecationWarning, stacklevel=2
)
globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__")})
