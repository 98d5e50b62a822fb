"""Deterministic tar shards: same members in, same bytes out.

Members are written as USTAR entries with fixed metadata (mtime 0, uid/gid 0, mode 0644, empty
owner names), the layout webdataset reads. Atomicity (nothing half-written under a final name) is
the job of ``storage.Storage.writer``, which this writes into.

Internal: import from ``epishard.shardwriter``.
"""

from __future__ import annotations

import hashlib
import io
import tarfile

from epishard.format.manifest import check_member_name

__all__ = ["TarShardWriter"]


class _HashingFile(io.RawIOBase):
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, f):
        self._f = f
        self.sha256 = hashlib.sha256()
        self.position = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def write(self, data) -> int:
        self._f.write(data)
        self.sha256.update(data)
        self.position += len(data)
        return len(data)


def _member_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


class TarShardWriter:
    """Write one tar shard into a binary file object; report where each member's data lies.

    Usage (``Storage.writer`` makes the file appear under its name only when complete)::

        with storage.writer("shard-000000.tar") as f:
            tar = TarShardWriter(f)
            offset, size, sha = tar.add("key.json", b"{}")
            tar.close()
        tar.sha256, tar.size  # of the finished shard

    ``add`` returns ``(offset, size, sha256)``: byte offset of the member's data in the tar (header
    excluded), its size in bytes and its hex sha256, so a range read ``[offset, offset + size)``
    returns the member.

    Raises:
        ValueError: a member name longer than 100 bytes (USTAR's limit).
    """

    def __init__(self, fileobj):
        self._hash = _HashingFile(fileobj)
        self._tar = tarfile.open(fileobj=self._hash, mode="w", format=tarfile.USTAR_FORMAT)  # noqa: SIM115 - closed by close()
        self.sha256 = ""
        self.size = 0

    def add(self, name: str, data: bytes) -> tuple[int, int, str]:
        """Append member ``name`` holding ``data``; returns ``(offset, size, sha256)`` (see the class)."""
        check_member_name(name)
        info = _member_info(name, len(data))
        offset = self._tar.offset + len(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"))
        self._tar.addfile(info, io.BytesIO(data))
        return offset, len(data), hashlib.sha256(data).hexdigest()

    def close(self) -> None:
        """Write the end-of-archive blocks; ``sha256`` and ``size`` then describe the whole shard."""
        self._tar.close()
        self.sha256 = self._hash.sha256.hexdigest()
        self.size = self._hash.position
