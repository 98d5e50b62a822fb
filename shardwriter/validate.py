"""Deprecated alias of ``epishard.format.validate``, kept for one release.

Importing it warns (``DeprecationWarning``); it holds the objects of ``epishard.format.validate``,
public and private names alike (the same objects, not copies).
Also ``load_dataset_index``, ``load_shard_indexes``, now in ``epishard.format.opening``.
"""

import warnings

from epishard.format import validate as _new
from epishard.format.opening import load_dataset_index, load_shard_indexes  # noqa: F401
from epishard.format.validate import *  # noqa: F403  (the public names, for type checkers)

warnings.warn(
    "epishard.shardwriter.validate is deprecated; import epishard.format.validate", DeprecationWarning, stacklevel=2
)
globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__")})
