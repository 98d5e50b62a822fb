"""Keep a DataLoader worker's memory flat across epochs (glibc malloc, Linux).

Each epoch a worker starts new fetch threads (``stream.fetch``) that allocate the fetched bytes,
which the worker's main thread frees later. glibc gives threads their own malloc arenas (up to 8 per
core) and rarely returns an arena's freed memory to the system, so with new threads every epoch the
freed memory spreads over ever more arenas and the worker's RSS ratchets up epoch after epoch
(measured in docs/BENCHMARKS.md, "Worker memory across epochs"). One arena per worker process plus
``malloc_trim`` at each epoch's end keeps it flat. No-op where glibc is absent.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Literal

__all__ = ["limit_worker_arenas", "release_free_memory"]

_M_ARENA_MAX = -8  # <malloc.h>
_libc: ctypes.CDLL | Literal[False] | None = None  # None: not looked up yet; False: not glibc


def _glibc() -> ctypes.CDLL | Literal[False]:
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            for name in ("mallopt", "malloc_trim"):
                getattr(libc, name)  # AttributeError when this C library lacks it
        except (OSError, AttributeError):
            _libc = False
        else:
            libc.mallopt(_M_ARENA_MAX, 1)  # before this process starts its own threads: one arena
            _libc = libc
    return _libc


def limit_worker_arenas() -> None:
    """In a DataLoader worker, before it starts threads: one malloc arena for the process."""
    _glibc()


def release_free_memory() -> None:
    """Return the memory freed so far (all arenas) to the system; a few ms."""
    libc = _glibc()
    if libc:
        libc.malloc_trim(0)
