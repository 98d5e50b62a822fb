"""Where a dataset is written: a local folder or any fsspec URL (``s3://``, ``gs://``, ...).

Every write is atomic: a local file is written under a temporary name, fsync'd and renamed; an
object-store object is uploaded to its final key, which the store makes visible only when the
upload completes (an S3 multipart upload that is aborted leaves nothing). The filesystem client is
created lazily in each process (s3fs/aiohttp sessions do not survive a fork).
"""

from __future__ import annotations

import contextlib
import errno
import os

import fsspec

from .tarwriter import temp_path


_BUCKET_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs")


class Storage:
    """A dataset folder. ``url``: local path or fsspec URL; ``storage_options``: passed to fsspec."""

    def __init__(self, url: str, storage_options: dict | None = None):
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        protocol = fsspec.core.split_protocol(self.url)[0]
        self.local = protocol in (None, "file", "local")
        self._fs = None
        self._pid = None
        self._root = fsspec.core.url_to_fs(self.url, **self.storage_options)[1] if not self.local else os.path.abspath(
            fsspec.core.strip_protocol(self.url) if protocol else self.url)

    def __getstate__(self):
        return {**self.__dict__, "_fs": None, "_pid": None}

    @property
    def fs(self):
        if self._fs is None or self._pid != os.getpid():
            self._fs = fsspec.core.url_to_fs(self.url, **self.storage_options)[0]
            self._pid = os.getpid()
        return self._fs

    def path(self, name: str) -> str:
        return f"{self._root}/{name}"

    def is_file(self) -> bool:
        """Whether the dataset path itself is a file (a dataset is a folder or an object prefix)."""
        if self.local:
            return os.path.isfile(self._root)
        with self._named_denial():
            return self.fs.isfile(self._root)

    @contextlib.contextmanager
    def _named_denial(self):
        try:
            yield
        except PermissionError as exc:  # s3fs: "Access Denied" or "Forbidden", naming nothing
            raise PermissionError(errno.EACCES, f"access denied ({exc})", self.url) from exc

    def makedirs(self) -> None:
        if self.local:
            os.makedirs(self._root, exist_ok=True)

    def exists(self, name: str) -> bool:
        if self.local:
            return os.path.exists(self.path(name))
        with self._named_denial():
            return self.fs.exists(self.path(name))

    def size(self, name: str) -> int:
        return os.path.getsize(self.path(name)) if self.local else int(self.fs.size(self.path(name)))

    def remove(self, name: str) -> None:
        if self.exists(name):
            self.fs.rm(self.path(name)) if not self.local else os.remove(self.path(name))

    def names(self) -> list[str]:
        """File names directly in the folder (fresh: an object store's listing cache is dropped); [] if
        the folder does not exist.

        Raises:
            FileNotFoundError: the object store's bucket does not exist (``filename``: the URL).
            PermissionError: the store refuses to list it (``filename``: the URL).
        """
        if self.local:
            return sorted(os.listdir(self._root)) if os.path.isdir(self._root) else []
        self.fs.invalidate_cache(self._root)
        try:
            with self._named_denial():
                return sorted(os.path.basename(p.rstrip("/")) for p in self.fs.ls(self._root, detail=False))
        except FileNotFoundError:
            bucket = self._root.split("/")[0]
            if fsspec.core.split_protocol(self.url)[0] in _BUCKET_STORES and not self.fs.exists(bucket):
                raise FileNotFoundError(errno.ENOENT, f"bucket {bucket!r} does not exist", self.url) from None
            return []
        finally:
            # Worker processes write here too: a cached listing would hide their files from this one.
            self.fs.invalidate_cache(self._root)

    def read(self, name: str, start: int | None = None, stop: int | None = None) -> bytes:
        """Bytes ``[start, stop)`` of a file (all of it by default)."""
        if self.local:
            with open(self.path(name), "rb") as f:
                f.seek(start or 0)
                return f.read() if stop is None else f.read(stop - (start or 0))
        return self.fs.cat_file(self.path(name), start=start, end=stop)

    def open(self, name: str):
        """A seekable binary file to read ``name`` (range requests on object stores)."""
        return open(self.path(name), "rb") if self.local else self.fs.open(self.path(name), "rb")

    @contextlib.contextmanager
    def writer(self, name: str):
        """A binary file to write ``name`` through; it appears under its name only if the block exits
        without an exception."""
        if self.local:
            final = self.path(name)
            tmp = temp_path(final)
            f = open(tmp, "wb")
            try:
                yield f
                f.flush()
                os.fsync(f.fileno())
                f.close()
                os.replace(tmp, final)
            except OSError as exc:
                if exc.filename is None:  # a failed write (ENOSPC, EIO) names no file: name the one written
                    raise OSError(exc.errno, exc.strerror or str(exc), final) from exc
                raise
            finally:
                with contextlib.suppress(OSError):  # closing flushes, which fails again when the disk is full
                    f.close()
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
        else:
            f = self.fs.open(self.path(name), "wb")
            try:
                yield f
            except BaseException:
                f.discard()  # abort the multipart upload: nothing appears under the key
                raise
            f.close()

    def write(self, name: str, data: bytes) -> None:
        """Write ``data`` to ``name`` atomically."""
        with self.writer(name) as f:
            f.write(data)

    def remove_partials(self) -> None:
        """Remove temporary files a killed local run left behind (object stores keep none)."""
        if self.local:
            for name in self.names():
                if ".partial-" in name:
                    os.remove(self.path(name))
