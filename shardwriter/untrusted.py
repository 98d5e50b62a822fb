"""Deprecated alias of ``epishard.format.untrusted``, kept for one release.

Importing it warns (``DeprecationWarning``); it holds the objects of ``epishard.format.untrusted``,
public and private names alike (the same objects, not copies).
Also ``container_frames``, now in ``epishard.format.decoder``.
"""

import warnings

from epishard.format import untrusted as _new
from epishard.format.decoder import container_frames  # noqa: F401
from epishard.format.untrusted import *  # noqa: F403  (the public names, for type checkers)

warnings.warn(
    "epishard.shardwriter.untrusted is deprecated; import epishard.format.untrusted", DeprecationWarning, stacklevel=2
)
globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__")})
