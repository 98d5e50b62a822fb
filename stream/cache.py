"""An optional local disk cache of fetched shard byte ranges, bounded in bytes.

The least recently used ranges go out first.

Entries are keyed by the shard's sha256 from the manifest plus the byte range, so a shard that
changed (re-converted, hence a new manifest) is never served from an old entry; member checksums
are still verified after a cache hit. Several worker processes may share one cache folder: writes
go through a temporary file and a rename, and eviction tolerates files that vanished meanwhile.

Internal: import from ``epishard.stream``.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["RangeCache"]


class RangeCache:
    """``folder``: where entries live (created); ``max_bytes``: total size kept after each insert."""

    def __init__(self, folder: str, max_bytes: int):
        self.folder, self.max_bytes = folder, max_bytes
        os.makedirs(folder, exist_ok=True)

    def _path(self, shard_sha256: str, start: int, stop: int) -> str:
        return os.path.join(self.folder, f"{shard_sha256}-{start}-{stop}.bin")

    def get(self, shard_sha256: str, start: int, stop: int) -> bytes | None:
        """The cached bytes, or None. A hit refreshes the entry's recency."""
        path = self._path(shard_sha256, start, stop)
        try:
            with open(path, "rb") as f:
                data = f.read()
            os.utime(path)
        except FileNotFoundError:
            return None
        return data if len(data) == stop - start else None

    def put(self, shard_sha256: str, start: int, stop: int, data: bytes) -> None:
        """Store an entry, then evict least recently used entries beyond ``max_bytes``."""
        if len(data) > self.max_bytes:
            return
        path = self._path(shard_sha256, start, stop)
        tmp = f"{path}.partial-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        self._evict()

    def _evict(self) -> None:
        entries = []
        for name in os.listdir(self.folder):
            if not name.endswith(".bin"):
                continue
            try:
                st = os.stat(os.path.join(self.folder, name))
            except FileNotFoundError:
                continue
            entries.append((st.st_mtime, st.st_size, name))
        total = sum(size for _, size, _ in entries)
        for _, size, name in sorted(entries):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):  # another worker evicted it first
                os.remove(os.path.join(self.folder, name))
            total -= size
