"""Opening a converted dataset (local path or any fsspec URL), and checking what the reader trusts.

On open, the manifest is loaded by ``epishard.format.manifest.Manifest.load``: its format and version
(a newer version is refused), then field by field (``epishard.format.validate.check_manifest``: plain
file names, sizes, sha256 digests, cameras) before any name in it is opened; the dataset index
(``index.arrow``, or the per-shard indexes when it is absent) is hashed against the manifest's
sha256 (a local one once per node: ``epishard.format.verified``), its schema checked, and every value
bounds-checked (``check_index``) before anything is allocated or indexed by it; a packet table's
values, when its stream is first read (``WindowIndex.packets``). Local files are
opened only if they are regular files; remote requests have connect and read timeouts
(``FetchPolicy``) and are retried by the reader's policy.

File handles and filesystem clients are created lazily in the process that uses them, never
before a fork: a ``DatasetSource`` pickles to its URL, options, manifest and index only.
"""

from __future__ import annotations

import mmap
import os
import stat
import warnings

import numpy as np
import pyarrow as pa

from epishard.format.errors import FormatError
from epishard.format.index import WindowIndex
from epishard.format.manifest import INDEX_SUFFIX
from epishard.format.opening import load_dataset_index, load_shard_indexes, open_manifest
from epishard.format.presigned import PresignedRanges, presigned_refusal, tls_options
from epishard.format.retry import RetryPolicy, transient
from epishard.format.storage import Location, Storage, open_regular
from epishard.format.validate import shard_size_mismatches
from epishard.format.verified import is_verified, record_verified
from epishard.redact import scrubbed

from .fetch import FetchError, FetchPolicy, fetch_failure, retryable

__all__ = [
    "DatasetSource",
]


class DatasetSource:
    """One converted dataset: its manifest, its window index, and reads of shard byte ranges.

    Opened as the writer, ``verify`` and ``inspect`` open a dataset: one ``Location`` (storage
    options resolved once, one ``RetryPolicy``), a ``Storage`` over it, ``open_manifest``, then the
    index (``epishard.format.opening``).

    Args:
        url: the dataset folder (local path, ``file://``, ``s3://``, ``https://``, ...), or an
            opened ``epishard.format.storage.Location`` (its options and retry policy are used as
            they are; ``storage_options`` must then be None).
        storage_options: fsspec options (endpoint, credentials, ...), merged over the environment's
            (``epishard.format.storage.resolve_storage_options``); ``connect_timeout`` /
            ``read_timeout`` / ``retry_budget`` (seconds) override ``fetch``'s.
        fetch: the ``FetchPolicy`` whose timeouts and retries (``FetchPolicy.retry``) apply to reading
            the manifest and index here and to the shard reads of ``read_range``.

    Raises:
        epishard.format.opening.NotConverted (a FileNotFoundError): ``url`` is a LeRobot dataset or
            a Hugging Face repo id (run ``epishard convert`` first).
        epishard.format.opening.ManifestMissing (a FileNotFoundError): files but no ``manifest.json``
            (conversion unfinished or wrong path).
        FileNotFoundError: no such folder, or the URL's bucket does not exist (the message names
            it; ``filename``: the URL).
        ValueError: the storage option ``retry_budget`` is not a number >= 0.
        FormatError (a ``ValueError``): the manifest or index breaks the format, the manifest is
            larger than ``epishard.format.untrusted.MAX_JSON_BYTES``, the index's sha256 differs from
            the manifest's, or a shard file has another size than the manifest says (under
            ``on_shard_error="raise"``, else only when every shard has, or when the index claims
            more rows in the shard than its file has bytes); the message names the file and the field.
        FetchError (an ``IOError``): the manifest or index could not be read (timeouts, errors)
            within the policy's retry budget.

    ``skipped_shards``: shard number -> reason, for the shards failed under ``on_shard_error="skip"``
    because their file's size is not the manifest's (each also warned about). They stay in the index
    (so the plan depends on the manifest and index alone); the reader never fetches their episodes,
    and fills each of their windows with a substitute as for a shard that fails when read.
    """

    @scrubbed  # its exceptions and their chains name no credentials
    def __init__(self, url: str | Location, storage_options: dict | None = None, fetch: FetchPolicy | None = None):
        self.policy = fetch or FetchPolicy()
        # Opened once: the storage options resolved, their connect_timeout / read_timeout / retry_budget
        # over the fetch policy's, in the one RetryPolicy every read of this dataset retries by.
        self.location = url if isinstance(url, Location) else Location.of(url, storage_options, self.policy.retry)
        self.url, self.shown, self.local = self.location.url, self.location.shown, self.location.local
        # The client makes one attempt per call: the metadata reads are retried by the storage, the
        # shard reads by the fetcher (from the first byte not yet received), both by ``self.retry``.
        self.storage = Storage(
            self.location,
            client_retries=False,
            retryable=_metadata_retryable,
            give_up=_metadata_failure,
            pool=self.policy.max_in_flight,
        )
        self._ranges = self._presigned() if self.policy.s3_transport == "presigned" else None
        self.manifest = open_manifest(self.storage)
        self.index = self._load_index()
        self.skipped_shards = self._check_shard_files()
        self.shards = [s.shard for s in self.manifest.shards]
        self.cameras = sorted(self.manifest.cameras)

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy of every read (the fetch policy's, with the storage options' overrides)."""
        return self.location.retry

    def filesystem(self):
        """This process's fsspec filesystem, with the policy's timeouts (made again after a fork)."""
        return self.storage.fs

    def path(self, name: str) -> str:
        """Path of the dataset's file ``name`` in this process's filesystem."""
        return self.storage.path(name)

    def shard_path(self, shard: int) -> str:
        """Path of shard number ``shard`` (in the manifest's order)."""
        return self.path(self.shards[shard])

    def read_range(self, shard: int, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of a shard, one request.

        A remote server may answer with more: the caller checks the length. A local shard must be a
        regular file.
        """
        if self.local:
            with open_regular(self.shard_path(shard)) as f:
                f.seek(start)
                data = f.read(stop - start)
            if len(data) < stop - start:  # a local file does not grow on a retry
                raise FetchError(
                    f"{self.shard_path(shard)}: {len(data)} bytes at {start}, the index needs "
                    f"{stop - start}: the file is shorter than the manifest says",
                    shard,
                )
            return data
        if self._ranges is not None:
            return self._ranges.get(self.shard_path(shard), start, stop)
        return self.filesystem().cat_file(self.shard_path(shard), start=start, end=stop)

    def _presigned(self) -> PresignedRanges:
        """``FetchPolicy(s3_transport="presigned")``'s transport; ValueError where it cannot serve."""
        if self.location.protocol not in ("s3", "s3a"):
            raise ValueError(f"{self.shown}: FetchPolicy(s3_transport='presigned') reads s3:// datasets only")
        why = presigned_refusal(self.location.options)
        if why:
            raise ValueError(f"{self.shown}: FetchPolicy(s3_transport='presigned'): {why}")
        retry = self.location.retry
        # The fetcher runs max_in_flight + 1 threads: a connection for each, none discarded.
        return PresignedRanges(
            self.storage,
            retry.connect_s,
            retry.read_s,
            pool=self.policy.max_in_flight + 1,
            tls=tls_options(self.location.options),
        )

    def _check_shard_files(self) -> dict[int, str]:
        """Hold the manifest's shard sizes, which bound every index value, against the shard files.

        Local shards are stat'ed; a remote folder is listed once where it can be (a folder that
        cannot be listed, or a file listed without a size, is checked per response by the fetcher
        instead). A shard of another size than the manifest says (replaced, truncated, or forged
        with its index) is refused: ``FormatError`` under ``on_shard_error="raise"``, when every
        shard is, or when the index claims more rows in it than its file has bytes (a plan of them
        could not be held); under ``"skip"`` a warning per shard, and the shard is failed: it stays
        in the index (the plan is the manifest's and index's alone), but none of its episodes is
        fetched or decoded (no index value of it sizes anything) and its windows are substitutes.
        A missing shard is left to the reads (the shard policy). Returns shard number -> reason.
        """
        if self.local:
            sizes = {}
            for s in self.manifest.shards:
                try:
                    st = os.stat(self.path(s.shard))
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):  # a directory or FIFO is refused by the reads
                    sizes[s.shard] = st.st_size
        else:
            try:
                listing = self.filesystem().ls(self.storage.root, detail=True)
            except Exception:  # no listing (an HTTP server without one, no list permission)
                listing = []
            sizes = {
                str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: int(e["size"])
                for e in listing
                if e.get("type", "file") == "file" and e.get("size") is not None
            }
        bad = shard_size_mismatches(self.manifest.shards, sizes, self.shown)
        if bad and self.policy.on_shard_error == "raise":
            raise FormatError(next(iter(bad.values())))
        if bad and len(bad) == len(self.manifest.shards):
            raise FormatError(f"{self.shown}: every shard failed its size check; the first: {next(iter(bad.values()))}")
        for i, reason in bad.items():
            # A failed shard stays planned, so its rows are planned: rows its file cannot hold (each
            # needs a byte of its table) are an index refuted by the file, refused (never planned).
            rows = int(self.index.num_rows[self.index.shard == i].sum())
            size = sizes[self.manifest.shards[i].shard]
            if rows > size:
                raise FormatError(
                    f"{reason}; its index claims {rows} rows, more than the file's {size} bytes can hold "
                    "(each row needs at least one): a forged index, not planned"
                )
        for i, reason in bad.items():
            n = self.manifest.shards[i].episodes
            warnings.warn(
                f"epishard: skipping shard {i} ({n} episodes): {reason}; its windows are filled with substitutes",
                stacklevel=3,
            )
        return bad

    def failed_episodes(self) -> np.ndarray:
        """Bool ``[num_episodes]``: the index's episodes in a shard of ``skipped_shards`` (never fetched)."""
        return np.isin(self.index.shard, list(self.skipped_shards))

    # --- the index, checked ----------------------------------------------------------------------

    def _load_index(self) -> WindowIndex:
        """``index.arrow``, after its sha256 and every value are checked.

        Memory-mapped when local (its pages are shared by forked workers); the per-shard indexes
        when it is absent.
        """
        entry = self.manifest.index
        where = self.index_file = f"{self.shown}/{entry.file}"
        path, st = self.path(entry.file), None
        try:
            if self.local:
                with open_regular(path) as f:
                    st = os.fstat(f.fileno())
                    if st.st_size == 0:
                        raise FormatError(f"{where}: empty file")
                    data = pa.py_buffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            else:
                data = pa.py_buffer(self.storage.read(entry.file))
        except FileNotFoundError:
            self.index_file = f"{self.shown}/*{INDEX_SUFFIX}"
            return load_shard_indexes(self.manifest, self.storage.read, self.shown)
        # A local file another process of this node already hashed is not hashed again (its stamp).
        hashed = st is not None and is_verified(path, st, entry.sha256)
        index = load_dataset_index(data, self.manifest, where, hashed=hashed)
        if st is not None and not hashed:
            record_verified(path, st, entry.sha256)
        return index


def _metadata_retryable(exc: BaseException) -> bool:
    """Whether a failed metadata call (manifest, index, listing) is asked again.

    The fetcher's rule (``stream.fetch.retryable``), and fsspec's "not found" that an HTTP server's
    failure (a 503, a timeout) became (``epishard.format.retry.transient``).
    """
    return retryable(exc) or (isinstance(exc, FileNotFoundError) and transient(exc))


def _metadata_failure(exc: BaseException, where: str, attempt: int, started: float, policy: RetryPolicy):
    """The reader's ``give_up`` for metadata calls: a ``FetchError`` (shard -1) naming the file and the failure.

    A failure that is not retryable stays itself (no ``index.arrow`` means per-shard indexes).
    """
    if not _metadata_retryable(exc):
        return exc
    return fetch_failure(policy, exc, attempt, where, -1, started, _metadata_retryable)
