"""Stamps of local files whose sha256 was checked, so the ranks of a node hash a file once.

Every rank (and every process that opens the dataset) checks ``index.arrow`` against the
manifest's sha256 before trusting it: at a million episodes that is ~0.8 GB hashed per process
(1.5 s of CPU each). Once one process has hashed a local file, it writes a stamp: a small file in
the cache folder naming the file's real path, size, mtime (ns), inode, device and the sha256 it
matched. A process whose file has all of these keys equal skips the hash; any other difference
(the file rewritten, replaced, touched, moved, or another expected sha256) hashes again.

What a stamp cannot see (the keys stay equal while the bytes change): a write that restores the
mtime afterwards (``touch -d``, ``os.utime``), an in-place write within one mtime tick on a file
system with coarse timestamps, and damage below the file system (bit rot). The index values are
still bounds-checked on every load (``validate.check_index``; a packet table at its stream's first
read, ``validate.check_stream_packets``), so such a file cannot make a reader index outside its
arrays, and each member's bytes are still checked against its sha256 when
fetched. Remote files have none of these keys and are always hashed.

The cache folder is ``$EPISHARD_CACHE/verified`` (default ``~/.cache/epishard/verified``);
``EPISHARD_CACHE=off`` turns stamps off (every process hashes). A stamp that cannot be written
(read-only home) only costs the next process a hash.

Internal: import from ``epishard.format``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

__all__ = ["cache_dir", "is_verified", "record_verified"]

_OFF = "off"


def cache_dir() -> str | None:
    """The folder of stamps, or None when ``EPISHARD_CACHE=off``.

    ``$EPISHARD_CACHE/verified``; default ``~/.cache/epishard/verified``.
    """
    root = os.environ.get("EPISHARD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "epishard")
    return None if root == _OFF else os.path.join(root, "verified")


def _key(path: str, st: os.stat_result, sha256: str) -> bytes:
    return json.dumps(
        {
            "path": os.path.realpath(path),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "inode": st.st_ino,
            "device": st.st_dev,
            "sha256": sha256,
        },
        sort_keys=True,
    ).encode()


def _stamp(key: bytes, folder: str) -> str:
    return os.path.join(folder, hashlib.sha256(key).hexdigest())


def is_verified(path: str, st: os.stat_result, sha256: str) -> bool:
    """Whether a stamp says the file at ``path`` (``st``: its ``os.fstat``) was found to hash to ``sha256``.

    ``sha256``: hex digest. Every key must match: real path, size (bytes), mtime (ns), inode, device,
    digest (module docstring). Never raises: stamps off or an unreadable stamp is False (hash the file).
    """
    folder = cache_dir()
    if folder is None:
        return False
    key = _key(path, st, sha256)
    try:
        with open(_stamp(key, folder), "rb") as f:
            return f.read() == key  # the whole key, not only its digest in the stamp's name
    except OSError:
        return False


def record_verified(path: str, st: os.stat_result, sha256: str) -> None:
    """Stamp the file at ``path`` (``st``: its ``os.fstat`` taken before it was hashed) as hashing to ``sha256``.

    Written atomically (a temporary file renamed), so a concurrent reader sees a whole stamp or none.
    No stamp when the file's keys changed while it was hashed (``st`` against a fresh ``os.stat``).
    Never raises ``OSError``: a stamp that cannot be written is left out (the next process hashes).
    """
    folder = cache_dir()
    if folder is None:
        return
    key = _key(path, st, sha256)
    try:
        if _key(path, os.stat(path), sha256) != key:  # changed while it was hashed: the hash vouches for neither
            return
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".stamp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(key)
            os.replace(tmp, _stamp(key, folder))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # no stamp: the next process hashes the file again, nothing else changes
