"""Where a dataset lives (a local folder or any fsspec URL) and the storage options every API takes.

URLs: ``s3://``, ``gs://``, ``http(s)://``, ``hf://``, ``file://``; every command takes the options too.

A root is opened once (``Location.of``, used by the writer, the reader, ``verify`` and ``inspect``):
its storage options resolved and its ``RetryPolicy`` fixed; filesystems (``FileSystemHandle``,
one per process), folder reads and writes (``Storage``) and source files (``RemoteFile``) take the
opened ``Location``.

Storage options (``resolve_storage_options``, the one definition): the ``storage_options`` dict
of an API (CLI: ``--storage-options JSON``, ``parse_storage_options``) over the fsspec
configuration read from the environment when a root is opened (``FSSPEC_<PROTOCOL>_<OPTION>``
variables, ``FSSPEC_<PROTOCOL>`` JSON objects, files in ``FSSPEC_CONFIG_DIR``). The clients read
their own variables too: botocore (s3fs) ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``),
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``,
``AWS_DEFAULT_REGION``, ``AWS_CA_BUNDLE``; gcsfs ``GOOGLE_APPLICATION_CREDENTIALS``;
huggingface_hub ``HF_TOKEN``, ``HF_ENDPOINT``. Explicit options win over the environment.

Every write is atomic: a local file is written under a temporary name, fsync'd and renamed; an
object-store object is uploaded to its final key, which the store makes visible only when the
upload completes (an S3 multipart upload that is aborted leaves nothing). The filesystem client is
created lazily in each process (s3fs/aiohttp sessions do not survive a fork), and an S3 client is
closed on its own event loop when its handle is dropped or the process exits.

Nothing waits forever: S3 and HTTP clients get connect and read timeouts (``with_timeouts``), a
failing S3 call is retried for a time budget, not forever (``epishard.format.retry``), and
only regular local files are opened (``open_regular``: a FIFO or device in a dataset folder is an
error, not a read that blocks or never ends).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import io
import json
import os
import stat
import warnings
import weakref
from dataclasses import dataclass, field

import fsspec
import fsspec.config

from epishard.redact import guard_client_logs, redact, remember
from epishard.storage_options import parse_storage_options

from . import manifest as fmt
from .retry import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, GiveUp, RetryPolicy, S3RetryBudget, budget_exceeded, transient

__all__ = [
    "CONNECT_TIMEOUT_S",
    "READ_BLOCK_BYTES",
    "READ_TIMEOUT_S",
    "STORAGE_ENV_NAMES",
    "STORAGE_ENV_PREFIXES",
    "FileSystemHandle",
    "Location",
    "NotARegularFile",
    "RemoteFile",
    "Storage",
    "is_local",
    "local_path",
    "make_filesystem",
    "open_regular",
    "parse_storage_options",
    "protocol_of",
    "resolve_storage_options",
    "source_filesystem",
    "storage_env",
    "with_timeouts",
]


def with_timeouts(location: Location, options: dict, attempts: int) -> dict:
    """Fsspec ``options`` for ``location`` with its policy's connect and read timeouts (seconds).

    For S3 (botocore's ``config_kwargs``) and HTTP(S) (an aiohttp ``ClientTimeout`` in ``client_kwargs``, no total
    limit, so large reads still finish); what the options already set is kept.

    ``attempts``: tries per S3 request, botocore's standard retry mode (backoff with jitter).
    """
    protocol, connect_s, read_s = location.protocol, location.retry.connect_s, location.retry.read_s
    options = dict(options)
    if protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", connect_s)
        config.setdefault("read_timeout", read_s)
        config.setdefault("retries", {"mode": "standard", "total_max_attempts": attempts})
        options["config_kwargs"] = config
    elif protocol in ("http", "https"):
        import aiohttp

        client = dict(options.get("client_kwargs") or {})
        client.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=read_s))
        options["client_kwargs"] = client
    return options


def protocol_of(url: str) -> str | None:
    """The URL's fsspec protocol (``"s3"``, ``"http"``, ...), None for a plain local path."""
    return fsspec.core.split_protocol(url)[0]


def is_local(url: str) -> bool:
    """Whether ``url`` is a local path (plain, ``file://`` or ``local://``)."""
    return protocol_of(url) in (None, "file", "local")


def local_path(url: str) -> str:
    """The absolute local path of a local ``url`` (``file://`` stripped)."""
    return os.path.abspath(fsspec.core.strip_protocol(url) if protocol_of(url) else url)


def resolve_storage_options(url: str, storage_options: dict | None = None) -> dict:
    """The options a filesystem for ``url`` is made with (explicit ``storage_options`` win).

    The fsspec configuration for its protocol, read now from ``FSSPEC_CONFIG_DIR`` files and
    ``FSSPEC_<PROTOCOL>[_<OPTION>]`` environment variables (values as fsspec parses them), updated
    by ``storage_options``. Client variables such as ``AWS_ENDPOINT_URL`` are read by the client itself (see
    the module docstring) and apply when no option sets the same thing.

    The secrets of ``url`` and of the options are remembered for ``epishard.redact.redact``, so
    that nothing this process writes or prints shows them; the storage clients' log records are
    redacted from then on (``epishard.redact.guard_client_logs``).
    """
    conf: dict = {}
    fsspec.config.set_conf_files(fsspec.config.conf_dir, conf)
    fsspec.config.set_conf_env(conf)
    options = {**conf.get(protocol_of(url) or "file", {}), **(storage_options or {})}
    remember(url, options)
    guard_client_logs()
    return options


@dataclass(frozen=True)
class Location:
    """A dataset folder or source root, opened once: its URL, its storage options resolved, its retry policy.

    The one way a root is opened, by the writer (``Storage``, source trees), the reader
    (``stream.source.DatasetSource``), ``verify`` and ``inspect``: ``Location.of`` merges the
    storage options with the environment's (``resolve_storage_options``) and takes epishard's own
    options (``connect_timeout``, ``read_timeout``, ``retry_budget``, seconds) into ``retry``, once;
    every filesystem, read and retry of that root then uses the result.

    ``url``: the root (local path or fsspec URL, no trailing ``/``); ``options``: the fsspec
    client's options (never shown: they hold secrets); ``retry``: ``RetryPolicy``. Picklable: a
    worker or Ray task gets the options already resolved.
    """

    url: str
    options: dict = field(default_factory=dict, compare=False, repr=False)
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def of(cls, url: str | Location, storage_options: dict | None = None, retry: RetryPolicy | None = None) -> Location:
        """``url`` opened with ``storage_options`` over the environment's, and ``retry`` (default ``RetryPolicy()``).

        A ``Location`` is returned as it is (``storage_options`` and ``retry`` must then be None).

        Raises:
            ValueError: ``connect_timeout``, ``read_timeout`` or ``retry_budget`` is not a number >= 0.
            TypeError: a ``Location`` with options or a policy besides.
        """
        if isinstance(url, Location):
            if storage_options or retry is not None:
                raise TypeError(f"{url.shown}: an opened Location takes no storage options or retry policy besides")
            return url
        url = url.rstrip("/") or url
        options = resolve_storage_options(url, storage_options)
        policy, client = (retry or RetryPolicy()).with_storage_options(options, redact(url))
        return cls(url, client, policy)

    def __repr__(self) -> str:  # the URL's credentials redacted; the options never shown
        return f"Location({self.shown!r}, retry={self.retry!r})"

    @functools.cached_property
    def protocol(self) -> str | None:
        """The fsspec protocol (``"s3"``, ``"https"``, ...), None for a plain local path."""
        return protocol_of(self.url)

    @property
    def local(self) -> bool:
        """Whether the root is a local folder (a plain path, ``file://`` or ``local://``)."""
        return self.protocol in (None, "file", "local")

    @property
    def shown(self) -> str:
        """The URL as messages name it: credentials redacted."""
        return redact(self.url)

    def child(self, url: str) -> Location:
        """A location under this one (a file of the folder): the same options and policy."""
        return dataclasses.replace(self, url=url)


def make_filesystem(location: Location, attempts: int = 3, client_retries: bool = True, pool: int = 0):
    """(fsspec filesystem, root path) for ``location`` with its timeouts and, on S3, its retry budget.

    Timeouts: ``location.retry``'s ``connect_s`` and ``read_s``. ``client_retries`` (the writer):
    on S3 each call that is throttled (429, 503 ``SlowDown``), fails with a 5xx or gets no answer
    (reset, refused, timed out) is retried with full-jitter backoff, honouring ``Retry-After``,
    for the policy's budget from when it was first sent (``epishard.format.retry``), then fails
    with ``RetryBudgetExceeded`` naming the URL, status and time spent. A budget of 0, or a
    ``retries`` entry of the options' ``config_kwargs`` (botocore's own setting, then kept), gives
    botocore's standard retry mode with ``attempts`` tries instead. ``client_retries=False`` (the
    reader, whose own loop retries every call by the same policy): one try per call. s3fs's own
    retry loops are turned off because they nest (5 x 5 x botocore's 5 tries by default: one stuck
    endpoint became minutes of silence). ``pool``: an S3 client keeps at least this many pooled
    connections (botocore keeps 10), so requests in flight are not queued in the client; what the
    options set is kept. The filesystem is this caller's own (not fsspec's shared instance for the
    same options).
    """
    remember(location.url, location.options)  # this process's redaction knows the secrets (a spawned worker too)
    guard_client_logs()
    retry, options = location.retry, dict(location.options)
    own = "retries" in (options.get("config_kwargs") or {})
    s3 = location.protocol in ("s3", "s3a")
    budgeted = client_retries and retry.budget_s > 0 and not own and s3
    if s3 and pool:
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("max_pool_connections", max(10, pool))
        options["config_kwargs"] = config
    tries = 1 if budgeted or not client_retries else attempts
    options = with_timeouts(location, options, tries)
    fs, root = fsspec.core.url_to_fs(location.url, skip_instance_cache=True, **options)
    if hasattr(fs, "retries") and hasattr(fs, "set_session"):  # s3fs
        fs.retries = 1
        if budgeted:  # the handlers go on the session its clients are made from, kept when they are remade
            import aiobotocore.session

            session = aiobotocore.session.AioSession(**fs.kwargs)
            S3RetryBudget(retry).install(session)
            fs.session, fs._session_is_owned = session, False
    return fs, root


class FileSystemHandle:
    """This process's fsspec filesystem for a ``Location``, made on first use and again after a fork.

    s3fs/aiohttp sessions do not survive a fork, so a handle pickles (to DataLoader workers, to
    writer processes) without its filesystem, and a forked child makes its own.

    ``location``: a ``Location`` (or a URL and ``storage_options``, opened here with ``Location.of``);
    ``attempts``, ``client_retries``, ``pool``: as ``make_filesystem``.
    """

    def __init__(
        self,
        location: Location | str,
        storage_options: dict | None = None,
        attempts: int = 3,
        client_retries: bool = True,
        pool: int = 0,
    ):
        self.location = location if isinstance(location, Location) else Location.of(location, storage_options)
        self.attempts, self.client_retries, self.pool = attempts, client_retries, pool
        self._fs = None
        self._pid: int | None = None
        self._root: str | None = None

    def __getstate__(self):
        return {**self.__dict__, "_fs": None, "_pid": None}

    def get(self):
        """The filesystem of this process."""
        if self._fs is None or self._pid != os.getpid():
            self._fs, self._root = make_filesystem(self.location, self.attempts, self.client_retries, self.pool)
            self._pid = os.getpid()
            _close_when_dropped(self, self._fs)
        return self._fs

    @property
    def root(self) -> str:
        """The dataset's root path inside the filesystem (``url`` without its protocol)."""
        if self._root is None:
            self.get()
        return self._root  # type: ignore[return-value]


CLOSE_TIMEOUT_S = 5.0  # seconds the close of one S3 client may wait for its connections


def _close_when_dropped(handle: FileSystemHandle, fs) -> None:
    """Close ``fs``'s S3 client on its own event loop when ``handle`` is dropped or the process exits.

    s3fs's own finalizer gives the close 0.1 s on fsspec's loop, then closes the connector from
    the collecting thread, whose futures belong to no running loop: aiohttp then reports "Unclosed
    client session" or "Task exception was never retrieved ... attached to a different loop"
    whenever the loop was busy (a DataLoader worker dropping its dataset, any exit). This close runs
    first (it holds the filesystem until then) and waits up to ``CLOSE_TIMEOUT_S``.
    """
    if type(fs).__module__.startswith("s3fs"):
        weakref.finalize(handle, _close_client, fs, os.getpid())


def _close_client(fs, pid: int) -> None:
    import fsspec.asyn

    creator, loop = getattr(fs, "_s3creator", None), getattr(fs, "loop", None)
    if pid != os.getpid() or creator is None or loop is None or not loop.is_running():
        return  # another process's (inherited by a fork), never used, or its loop is gone
    with contextlib.suppress(Exception):  # on the loop's own thread, or failing: left to s3fs's finalizer
        fsspec.asyn.sync(loop, creator.__aexit__, None, None, None, timeout=CLOSE_TIMEOUT_S)
        fs._s3creator = fs._s3 = None  # closed: s3fs's finalizer has nothing left to wait for


class NotARegularFile(OSError):
    """A local path that should be a file is a FIFO, a directory or a device."""


def open_regular(path: str):
    """Open a local file for reading if it is a regular file.

    Opened without blocking and checked with ``fstat`` before any read, so a FIFO (whose open or
    read would wait for a writer), a directory or a device (``/dev/zero`` never ends) is refused.

    Raises:
        FileNotFoundError: no such file.
        NotARegularFile: not a regular file (names the path and what it is).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or special file"
        raise NotARegularFile(f"{path} is {kind}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


_BUCKET_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs")


def _missing_bucket(fs, url: str, root: str) -> str | None:
    """The bucket of ``url`` if it is on an object store and that bucket does not exist, else None.

    ``fs``: the URL's filesystem; ``root``: the URL's path in it (``bucket/prefix``). For the message
    after a FileNotFoundError: "bucket 'x' does not exist", not "no manifest.json".
    """
    bucket = root.split("/")[0]
    if protocol_of(url) not in _BUCKET_STORES or not bucket:
        return None
    fs.invalidate_cache(bucket)
    return None if fs.exists(bucket) else bucket


class Storage:
    """A dataset folder: the files of one ``Location``, read and written.

    ``location``: a ``Location`` (or a URL and ``storage_options``, opened here with
    ``Location.of``: fsspec options, plus epishard's ``connect_timeout``, ``read_timeout`` and
    ``retry_budget`` in seconds).

    Who retries a failing call, by the location's one ``RetryPolicy``: with ``client_retries``
    (the writer, ``verify``, ``inspect``) the S3 client (``make_filesystem``) and, over HTTP(S),
    whose client does not retry, this class: ``exists``, ``size``, ``names`` and ``read`` are asked
    again (``RetryPolicy.call``): a throttled or failing server is waited out, or named with its
    status (``RetryBudgetExceeded``), never taken for a missing file. Without (the reader, one try
    per client call): this class retries every remote call, classified by ``retryable`` and ended
    by ``give_up`` (the reader's ``FetchError``). ``pool``: S3 pooled connections (``make_filesystem``).
    """

    def __init__(
        self,
        location: Location | str,
        storage_options: dict | None = None,
        *,
        client_retries: bool = True,
        retryable=transient,
        give_up: GiveUp = budget_exceeded,
        pool: int = 0,
    ):
        self.location = location if isinstance(location, Location) else Location.of(location, storage_options)
        self.url = self.location.url
        self.local = self.location.local
        self._handle = FileSystemHandle(self.location, client_retries=client_retries, pool=pool)
        self._retry_here = not self.local and (not client_retries or self.location.protocol in ("http", "https"))
        self._retryable, self._give_up = retryable, give_up
        if self.local:
            self._root = local_path(self.url)
        else:  # the filesystem made for the root path is kept for this process
            self._root = self._handle.root

    @property
    def retry(self) -> RetryPolicy:
        """The location's retry policy."""
        return self.location.retry

    @property
    def root(self) -> str:
        """The folder's path: absolute when local, else inside this process's filesystem (no protocol)."""
        return self._root

    @property
    def fs(self):
        """This process's fsspec filesystem (``FileSystemHandle``)."""
        return self._handle.get()

    def path(self, name: str) -> str:
        """Path of ``name`` in the folder, as the filesystem (``fs``, or ``os`` when local) takes it."""
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
            raise PermissionError(errno.EACCES, redact(f"access denied ({exc})"), redact(self.url)) from exc

    def makedirs(self) -> None:
        """Create the local folder (object stores have no folders to create)."""
        if self.local:
            os.makedirs(self._root, exist_ok=True)

    def exists(self, name: str) -> bool:
        """Whether ``name`` exists in the folder."""
        if self.local:
            return os.path.exists(self.path(name))
        if self.location.protocol in ("http", "https"):  # strict: a failing answer raises (and is retried)
            return self._retried(lambda: self.fs.exists(self.path(name), strict=True), name)
        with self._named_denial():
            return self._retried(lambda: self.fs.exists(self.path(name)), name)

    def _retried(self, call, name: str):
        """``call()``, retried here by the location's policy where no client retries (the class docstring)."""
        if not self._retry_here:
            return call()
        where = redact(f"{self.url}/{name}" if name else self.url)
        return self.location.retry.call(call, where, self._retryable, self._give_up)

    def size(self, name: str) -> int:
        """Size of ``name`` in bytes."""
        if self.local:
            return os.path.getsize(self.path(name))
        return int(self._retried(lambda: self.fs.size(self.path(name)), name))

    def remove(self, name: str) -> None:
        """Delete ``name`` if it exists.

        That one file: the path is never a pattern (``fs.rm`` would expand ``[``, ``*``, ``?`` in
        the folder's name and delete the files of other folders that the pattern matches).
        """
        if not self.exists(name):
            return
        if self.local:
            os.remove(self.path(name))
        else:
            self.fs.rm_file(self.path(name))

    def names(self) -> list[str]:
        """File names directly in the folder; [] if the folder does not exist.

        Fresh: an object store's listing cache is dropped.

        Raises:
            FileNotFoundError: the object store's bucket does not exist (``filename``: the URL).
            PermissionError: the store refuses to list it (``filename``: the URL).
        """
        if self.local:
            return sorted(os.listdir(self._root)) if os.path.isdir(self._root) else []
        self.fs.invalidate_cache(self._root)
        try:
            with self._named_denial():
                listed = self._retried(lambda: self.fs.ls(self._root, detail=False), "")
                return sorted(os.path.basename(p.rstrip("/")) for p in listed)
        except FileNotFoundError:
            bucket = _missing_bucket(self.fs, self.url, self._root)
            if bucket is not None:
                raise FileNotFoundError(errno.ENOENT, f"bucket {bucket!r} does not exist", redact(self.url)) from None
            return []
        finally:
            # Worker processes write here too: a cached listing would hide their files from this one.
            self.fs.invalidate_cache(self._root)

    def read(self, name: str, start: int | None = None, stop: int | None = None) -> bytes:
        """Bytes ``[start, stop)`` of a file (all of it by default)."""
        if self.local:
            with open_regular(self.path(name)) as f:
                f.seek(start or 0)
                return f.read() if stop is None else f.read(stop - (start or 0))
        return self._retried(lambda: self.fs.cat_file(self.path(name), start=start, end=stop), name)

    def open(self, name: str):
        """A seekable binary file to read ``name`` (range requests on object stores)."""
        return open_regular(self.path(name)) if self.local else self.fs.open(self.path(name), "rb")

    @contextlib.contextmanager
    def writer(self, name: str):
        """A binary file to write ``name`` through.

        It appears under its name only if the block exits without an exception. On an object store an
        upload that fails (in the block or when it completes) is aborted; if the abort fails too (the
        store is still down), the incomplete multipart upload stays invisible until the bucket's
        lifecycle rule removes it, and the upload's own error is raised.
        """
        if self.local:
            final = self.path(name)
            tmp = fmt.temp_path(final)
            f = open(tmp, "wb")  # noqa: SIM115 - closed below, errors suppressed: a full disk fails the flush again
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
                f.close()  # the last part, then the upload completes: the object appears
            except BaseException:
                # Abort the multipart upload (nothing appears under the key), after a failed close too. A
                # store still failing may refuse the abort as well: then the upload's own error is raised.
                with contextlib.suppress(Exception):
                    f.discard()
                f.closed = True  # never completed later (fsspec closes, so uploads, an open file when it is collected)
                raise

    def write(self, name: str, data: bytes) -> None:
        """Write ``data`` to ``name`` atomically."""
        with self.writer(name) as f:
            f.write(data)

    def remove_partials(self) -> None:
        """Remove temporary files a killed local run left behind (object stores keep none)."""
        if self.local:
            for name in self.names():
                if fmt.is_partial(name):
                    os.remove(self.path(name))


READ_BLOCK_BYTES = 1 << 20  # bytes a remote source file is read ahead by: what one open file holds in memory
_source_handles: dict[tuple, FileSystemHandle] = {}  # (protocol, options, policy) -> handle


def source_filesystem(location: Location):
    """This process's fsspec filesystem for source files under ``location`` (its protocol, options, policy).

    One ``FileSystemHandle`` per protocol, options and policy, shared by every file (remade after a fork).
    """
    key = (location.protocol, json.dumps(location.options, sort_keys=True, default=str), location.retry)
    if key not in _source_handles:
        _source_handles[key] = FileSystemHandle(location)
    return _source_handles[key].get()


@dataclass(frozen=True)
class RemoteFile:
    """A source file behind an fsspec URL, read through without a local copy.

    E.g. a LeRobot dataset in S3, behind HTTP, on the Hub. ``open`` gives a seekable file that
    holds at most ``READ_BLOCK_BYTES`` read ahead (range requests), ``read`` the whole file.

    ``url``: the file's URL. ``known_size``: its size in bytes when a listing gave it (else asked
    on first use). ``location``: the opened root it was found under (``Location``: its options
    and retry policy; never shown, it holds secrets). Picklable: each process makes its own
    client (``source_filesystem``). Equal and hashed by ``url`` and ``known_size``. Over HTTP(S)
    ``read`` and ``size`` are retried by the location's policy (as ``Storage``'s); S3 calls have
    it from botocore.
    """

    url: str
    known_size: int | None = None
    location: Location | None = field(default=None, compare=False, repr=False)  # None: the URL's own

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:  # the URL's credentials redacted
        return f"RemoteFile({redact(self.url)!r}, known_size={self.known_size!r})"

    @functools.cached_property
    def _opened(self) -> Location:  # opened once per file, not per read
        return self.location if self.location is not None else Location.of(self.url)

    def _fs(self):
        fs = source_filesystem(self._opened)
        return fs, fs._strip_protocol(self.url)

    def open(self):
        """A seekable binary file (range requests, ``READ_BLOCK_BYTES`` read ahead).

        A server that ignores ``Range`` (``python -m http.server``: fsspec's "doesn't appear to
        support range requests") gets one whole read instead: the file's bytes in memory, with a
        ``UserWarning`` (the source's notes say so too, ``lerobot``).
        """
        fs, path = self._fs()
        f = fs.open(path, "rb", block_size=READ_BLOCK_BYTES)
        if protocol_of(self.url) not in ("http", "https"):
            return f
        try:
            if f.size > 1:  # a range that is not the whole file (one that is would be answered): refused here
                f.seek(f.size - 1)
                f.read(1)
                f.seek(0)
            return f
        except ValueError as exc:
            if "range requests" not in str(exc):
                raise
            f.close()
        warnings.warn(
            f"{redact(self.url)}: the server ignores Range requests (e.g. python -m http.server): read whole",
            stacklevel=2,
        )
        return io.BytesIO(self.read())

    def _retried(self, call):
        if protocol_of(self.url) not in ("http", "https"):
            return call()
        return self._opened.retry.call(call, redact(self.url))

    def read(self) -> bytes:
        """The whole file's bytes (one request); raises what the filesystem raises (e.g. FileNotFoundError).

        Raises:
            RetryBudgetExceeded: over HTTP(S), the server still failed (429, 5xx, no answer) after the budget.
        """
        fs, path = self._fs()
        return self._retried(lambda: fs.cat_file(path))

    def size(self) -> int:
        """The file's size in bytes: ``known_size``, else asked of the filesystem once (cached)."""
        return self.known_size if self.known_size is not None else _remote_size(self)


@functools.lru_cache(maxsize=4096)
def _remote_size(file: RemoteFile) -> int:
    fs, path = file._fs()
    return int(file._retried(lambda: fs.size(path)))


# The driver's environment variables that configure storage clients (botocore's AWS_ENDPOINT_URL and
# credentials, fsspec's FSSPEC_*, gcsfs, adlfs, the Hugging Face hub, proxies, CA bundles): a Ray task
# or actor on another node has its node's environment, so ``convert --ray`` and ``RayWindowLoader``
# pass these with every task and actor.
STORAGE_ENV_PREFIXES = ("AWS_", "FSSPEC_", "GOOGLE_", "GCSFS_", "AZURE_", "HF_", "HUGGING_FACE_")
STORAGE_ENV_NAMES = frozenset(
    {"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"}
)


def storage_env(environ=None) -> dict[str, str]:
    """The storage settings of ``environ`` (default ``os.environ``): ``STORAGE_ENV_PREFIXES`` and ``_NAMES``.

    Secrets among them travel as Ray objects (``ray.put``), never in a ``runtime_env`` (which Ray's
    dashboard and logs show).
    """
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(STORAGE_ENV_PREFIXES) or k.upper() in STORAGE_ENV_NAMES}
