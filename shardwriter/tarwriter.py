"""Deterministic, atomic tar shards: same members in, same bytes out; never half-written.

Members are written as USTAR entries with fixed metadata (mtime 0, uid/gid 0, mode 0644, empty
owner names), the layout webdataset reads. The shard is written under a temporary name in the same
folder and renamed over its final name only after its data reached the disk.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile

from .format import MAX_MEMBER_NAME


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


def temp_path(final_path: str) -> str:
    """Temporary name a file is written under before being renamed to ``final_path``."""
    return f"{final_path}.partial-{os.getpid()}"


class TarShardWriter:
    """Write one tar shard atomically; report where each member's data lies.

    Usage::

        with TarShardWriter("out/data-000000.tar") as w:
            offset, size, sha = w.add("key.json", b"{}")
        w.sha256, w.size  # of the finished shard

    ``add`` returns ``(offset, size, sha256)``: byte offset of the member's data in the tar (header
    excluded), its size in bytes and its hex sha256, so a range read ``[offset, offset + size)``
    returns the member. On an exception inside the ``with`` block the temporary file is removed and
    nothing appears under the final name.

    Raises:
        ValueError: a member name longer than 100 bytes (USTAR's limit).
    """

    def __init__(self, path: str):
        self.path = path
        self._tmp = temp_path(path)
        self._file = open(self._tmp, "wb")
        self._hash = _HashingFile(self._file)
        try:
            self._tar = tarfile.open(fileobj=self._hash, mode="w", format=tarfile.USTAR_FORMAT)
        except BaseException:
            self.abort()
            raise
        self.sha256 = ""
        self.size = 0

    def add(self, name: str, data: bytes) -> tuple[int, int, str]:
        if len(name.encode()) > MAX_MEMBER_NAME:
            raise ValueError(f"tar member name {name!r} is longer than {MAX_MEMBER_NAME} bytes")
        info = _member_info(name, len(data))
        offset = self._tar.offset + len(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"))
        self._tar.addfile(info, io.BytesIO(data))
        return offset, len(data), hashlib.sha256(data).hexdigest()

    def close(self) -> None:
        self._tar.close()
        self.sha256 = self._hash.sha256.hexdigest()
        self.size = self._hash.position
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._file.close()
        if os.path.exists(self._tmp):
            os.remove(self._tmp)

    def __enter__(self) -> "TarShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (fsync'd)."""
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def sha256_file(path: str) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
