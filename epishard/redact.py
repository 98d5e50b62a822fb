"""Credentials out of everything epishard writes or prints (the one redaction helper).

Secrets ride along with the places data lives: URL userinfo (``s3://KEY:SECRET@bucket/...``,
``https://user:password@host/...``), query strings (``?X-Amz-Signature=...``, ``?token=``,
``?sig=``, ``access_token``: presigned and SAS URLs) and storage options (``key``, ``secret``,
``token``, ``password``, ``client_kwargs={"aws_secret_access_key": ...}``, ``headers``). The
manifest, the index, log lines, warnings, error messages, progress and status lines, reports,
telemetry plots and preview pages pass what they show through ``redact``:

- the userinfo of a URL becomes ``***`` (``https://***@host/path``);
- the value of a query parameter whose name looks secret becomes ``***`` (``?X-Amz-Signature=***``);
- the quoted value of an ``Authorization``, ``X-Amz-Security-Token``, ``X-Amz-Signature`` or
  ``Cookie`` header in a printed mapping becomes ``***`` (a client's DEBUG log of a signed request);
- a value this process was given as a secret (``remember``: storage options under secret-looking
  names, a URL's password) becomes ``***`` wherever it appears, e.g. inside a client's exception.

Only what is shown is redacted: the URLs and options that open files keep their credentials.
Exceptions leaving the public entry points (``scrubbed``: ``convert``, ``read_lerobot``,
``verify``, ``describe``, ``DatasetSource``, iterating a ``WindowDataset`` or ``WindowLoader``,
``preview``) are redacted in place with their whole chain (``_scrub``), so a traceback a program
prints or logs (a DataLoader worker's included) shows no secret either. The log records of the
storage clients (``_CLIENT_LOGGERS`` and the loggers below them: fsspec's HTTP client logs every
URL it requests at DEBUG, botocore its endpoint and the headers it signs) are redacted too
(``guard_client_logs``).
Imports only the standard library, so the command line uses it before loading the writer.

Internal: the packages' shared infrastructure; users import from ``epishard`` (the curated API).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

__all__ = [
    "MASK",
    "guard_client_logs",
    "redact",
    "redact_optional",
    "redact_options",
    "remember",
    "scrubbed",
    "scrubbing",
]

MASK = "***"
_MIN_SECRET_CHARS = 6  # a remembered value shorter than this is not searched for in free text

# Names of options and query parameters whose values are secrets (case-insensitive substrings):
# key, secret, token, password/passwd/pwd, signature/sig, credential, auth(orization), session, cookie.
_SECRET_NAME = re.compile(r"(?i)(key|secret|token|pass|pwd|sig|credential|auth|session|cookie|private)")
# A URL as it appears in text: scheme:// and everything up to whitespace, a quote or a bracket.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")
# ?name=value or &name=value (also ';'), the name looking secret.
_QUERY = re.compile(r"(?P<name>[?&;][^=&#\s'\"<>?;]*=)(?P<value>[^&#\s'\"<>;]*)")
# A quoted header value in a printed mapping (a client's log of the request it signs and sends, an
# aiohttp ``CIMultiDictProxy``): ``'Authorization': b'AWS4-HMAC-SHA256 ...'``, ``"X-Amz-Security-Token": "..."``.
_HEADER = re.compile(
    r"(?i)(?P<name>['\"](?:authorization|proxy-authorization|x-amz-security-token|x-amz-signature|cookie)['\"]"
    r"\s*[:=]\s*b?)(?P<quote>['\"])(?P<value>.*?)(?P=quote)"
)
# The same headers as a signer's canonical request lists them, a line each: ``x-amz-security-token:...``.
_HEADER_LINE = re.compile(r"(?im)^(?P<name>(?:authorization|x-amz-security-token|x-amz-signature):)(?P<value>.+)$")

_known: set[str] = set()
_lock = threading.Lock()


def _userinfo_end(rest: str) -> int:
    """Where the userinfo of a URL's part after ``scheme://`` ends (its ``@``), or -1 for none.

    As URL parsers do: the last ``@`` before the first ``/``, ``?`` or ``#``. Also a raw
    ``user:pass/word@host`` (an unescaped secret holding ``/``, as AWS secret keys do): a ``:``
    not followed by a port number, then an ``@`` further on.
    """
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority = rest[:cut]
    if "@" in authority:
        return authority.rindex("@")
    if "@" in rest[cut:] and ":" in authority and not authority.rsplit(":", 1)[1].isdigit():
        return rest.index("@", cut)
    return -1


def _userinfo(match: re.Match) -> str:
    url = match.group(0)
    start = url.index("://") + 3
    end = _userinfo_end(url[start:])
    return url if end < 0 else f"{url[:start]}{MASK}{url[start + end :]}"


def _query(match: re.Match) -> str:
    name = match.group("name")
    if not _SECRET_NAME.search(name[1:-1]) or not match.group("value"):
        return match.group(0)
    return f"{name}{MASK}"


def redact(text: object) -> str:
    """``text`` (any object, as ``str``) with credentials replaced by ``***``.

    URL userinfo, the values of secret-looking query parameters and every value ``remember`` was
    given; the rest of the text is kept character for character. ``None`` stays ``"None"``.
    """
    out = str(text)
    if "@" in out:
        out = _URL.sub(_userinfo, out)
    if "=" in out:
        out = _QUERY.sub(_query, out)
    if ":" in out or "=" in out:
        out = _HEADER.sub(lambda m: f"{m.group('name')}{m.group('quote')}{MASK}{m.group('quote')}", out)
        if "\n" in out:
            out = _HEADER_LINE.sub(lambda m: f"{m.group('name')}{MASK}", out)
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for secret in known:
        if secret in out:
            out = out.replace(secret, MASK)
    return out


def redact_optional(text: str | None) -> str | None:
    """``redact(text)``, or None for None (for optional fields such as a manifest's ``path``)."""
    return None if text is None else redact(text)


def _is_secret_name(name: object) -> bool:
    """Whether an option or parameter name looks like it holds a secret (``key``, ``secret``, ``token``...)."""
    return isinstance(name, str) and _SECRET_NAME.search(name) is not None


def _secret_values(options: object, secret: bool = False) -> Iterable[str]:
    if isinstance(options, Mapping):
        for name, value in options.items():
            yield from _secret_values(value, secret or _is_secret_name(name))
    elif isinstance(options, (list, tuple)):
        for value in options:
            yield from _secret_values(value, secret)
    elif isinstance(options, str) and secret:
        yield options
        if " " in options:  # "Bearer <token>", "Basic <base64>": the part after the scheme alone too
            yield options.split(" ", 1)[1]


def redact_options(options: Mapping | None) -> dict:
    """A copy of storage options with every secret-looking value (nested too) replaced by ``***``."""

    def clean(value: object, secret: bool) -> object:
        if isinstance(value, Mapping):
            return {k: clean(v, secret or _is_secret_name(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(clean(v, secret) for v in value)
        return MASK if secret and value is not None else value

    return {k: clean(v, _is_secret_name(k)) for k, v in (options or {}).items()}


def remember(url: str | None = None, options: Mapping | None = None) -> None:
    """Remember the secrets of ``url`` and ``options`` for ``redact``, in this process from now on.

    ``url``: its userinfo's password, raw and percent-decoded; ``options``: string values under
    secret-looking names, at any depth. ``redact`` then masks them in any text, e.g. a client's
    exception quoting a header.

    Values shorter than ``_MIN_SECRET_CHARS`` are not searched for (they would mask ordinary words);
    a URL's userinfo is masked whatever its length.
    """
    found = list(_secret_values(options or {}))
    if url and "@" in url:
        for match in _URL.finditer(url):
            rest = match.group(0)[match.group(0).index("://") + 3 :]
            info = rest[: max(_userinfo_end(rest), 0)]
            if ":" in info:
                password = info.split(":", 1)[1]
                found += [password, urllib.parse.unquote(password)]
    with _lock:
        _known.update(s for s in found if len(s) >= _MIN_SECRET_CHARS)


def _masked_headers(headers: Any) -> Any:
    """A copy of a header mapping with the values of secret-looking names ``***`` and the rest redacted.

    The same type where it can be rebuilt from pairs (aiohttp's ``CIMultiDictProxy`` from a
    ``CIMultiDict``), else a ``dict``.
    """
    pairs = [(k, MASK if _is_secret_name(k) else redact(v) if isinstance(v, str) else v) for k, v in headers.items()]
    try:
        import multidict

        if isinstance(headers, multidict.CIMultiDictProxy):
            return multidict.CIMultiDictProxy(multidict.CIMultiDict(pairs))
        if isinstance(headers, multidict.MultiDictProxy):
            return multidict.MultiDictProxy(multidict.MultiDict(pairs))
    except ImportError:
        pass
    try:
        return type(headers)(pairs)
    except Exception:
        return dict(pairs)


def _clean(value: Any, deep: bool = True) -> Any:
    """``value`` with its shown credentials masked: the value itself when it shows none.

    A string: ``redact``-ed. A request description with ``headers`` (aiohttp's ``RequestInfo``, a
    named tuple): a copy with masked headers and redacted URLs. A plain tuple or list: each item.
    With ``deep`` (an exception's ``args``), any other value whose ``repr`` shows a secret becomes
    its redacted ``repr`` (the exception's texts are what matter there).
    """
    if isinstance(value, str):
        return redact(value)
    fields = getattr(value, "_fields", None)
    if isinstance(value, tuple) and fields and "headers" in fields:
        changes: dict[str, Any] = {}
        for name in fields:
            item = getattr(value, name)
            if name == "headers" and hasattr(item, "items"):
                changes[name] = _masked_headers(item)
            elif name.endswith("url") and item is not None and redact(item) != str(item):
                try:
                    changes[name] = type(item)(redact(item))
                except Exception:
                    changes[name] = redact(item)
        try:
            return value._replace(**changes)  # type: ignore[attr-defined]
        except Exception:
            return redact(repr(value)) if deep else value
    if type(value) in (tuple, list):
        return type(value)(_clean(v, deep) for v in value)
    if deep and not isinstance(value, (int, float, bool, bytes, type(None))):
        try:
            shown = repr(value)
        except Exception:
            return value
        if redact(shown) != shown:
            return redact(shown)
    return value


def _scrub(exc: BaseException | None) -> None:
    """Redact, in place, the texts of ``exc`` and of every exception it chains (cause, context).

    What ``str``, ``repr`` and ``traceback.format_exception`` show of each: its ``args`` (strings
    redacted, a request description's secret headers masked, any other argument whose ``repr``
    shows a secret replaced by its redacted ``repr``), an ``OSError``'s ``strerror``/``filename``/
    ``filename2``, a formatted remote traceback (``tb``: a process pool's ``_RemoteTraceback``) and
    string or request-description attributes (aiohttp's ``ClientResponseError.request_info``,
    ``message``); the type and traceback stay.
    """
    pending, seen = [exc], set()
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        with contextlib.suppress(AttributeError, TypeError):  # an exception type whose fields are read-only
            e.args = tuple(_clean(a) for a in e.args)
        names = {"strerror", "filename", "filename2", "tb", *getattr(e, "__dict__", {})}
        for name in names:
            try:
                value = getattr(e, name, None)
                clean = _clean(value, deep=False)
                if clean is not value and clean != value:
                    setattr(e, name, clean)
            except Exception:  # a read-only field, a property that refuses
                pass
        pending += [e.__cause__, e.__context__]


F = TypeVar("F", bound=Callable[..., Any])


def scrubbed(func: F) -> F:
    """Decorator of a public entry point: an exception leaving it is ``_scrub``-bed first.

    Works for functions, methods and generator functions (an error raised while iterating).
    """
    if inspect.isgeneratorfunction(func):

        @functools.wraps(func)
        def generator(*args: Any, **kwargs: Any) -> Any:
            try:
                return (yield from func(*args, **kwargs))
            except BaseException as exc:
                _scrub(exc)
                raise

        return cast(F, generator)

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except BaseException as exc:
            _scrub(exc)
            raise

    return cast(F, call)


@scrubbed
def scrubbing(iterable: Iterable[Any]) -> Any:
    """``iterable``'s items, in order; an exception raised while iterating them is ``_scrub``-bed first.

    For an entry point that returns an iterator it made (``__iter__`` returning a generator runs no
    code of the generator's, so ``scrubbed`` on it would see no error).
    """
    return (yield from iterable)


# Loggers of the storage clients that put request URLs (botocore: endpoints, signed headers) into
# their records; each name with every logger below it (``botocore.endpoint``, ``urllib3.connectionpool``).
_CLIENT_LOGGERS = (
    "fsspec",
    "s3fs",
    "gcsfs",
    "adlfs",
    "botocore",
    "aiobotocore",
    "boto3",
    "s3transfer",
    "urllib3",
    "aiohttp",
    "requests",
    "huggingface_hub",
)


def _is_client_logger(name: str) -> bool:
    """Whether ``name`` is one of ``_CLIENT_LOGGERS`` or a logger below one."""
    return any(name == client or name.startswith(client + ".") for client in _CLIENT_LOGGERS)


def _redact_record(record: logging.LogRecord) -> None:
    """Redact ``record``'s formatted message in place (its ``msg`` becomes the text, ``args`` empty)."""
    try:
        text = record.getMessage()
    except Exception:  # arguments that do not format: logging reports that itself when it emits
        return
    clean = redact(text)
    if record.name == "botocore.auth" and clean.startswith("Signature:"):  # a request's signature, alone
        clean = f"Signature: {MASK}"
    if clean != text:
        record.msg, record.args = clean, ()


class _RedactingFilter(logging.Filter):
    """A logging filter that rewrites a record's message with ``redact`` (it drops no record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact ``record``'s message in place; True: the record is always kept."""
        _redact_record(record)
        return True


_FILTER = _RedactingFilter()
_factory_installed = False


def _client_record_factory(previous: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if _is_client_logger(record.name):
            _redact_record(record)
        return record

    return factory


def guard_client_logs() -> None:
    """Redact the records of ``_CLIENT_LOGGERS`` and of every logger below them (once).

    A logger's filter sees only that logger's own records, and the clients log from one logger
    per module, some made when a client is first used; so the records are redacted where they are
    made (a log record factory wrapping the one in place) and ``_RedactingFilter`` is added to the
    named loggers too (in case a program replaces the factory later).
    """
    global _factory_installed
    with _lock:
        if not _factory_installed:
            logging.setLogRecordFactory(_client_record_factory(logging.getLogRecordFactory()))
            _factory_installed = True
    existing = [name for name in list(logging.root.manager.loggerDict) if _is_client_logger(name)]
    for name in {*_CLIENT_LOGGERS, *existing}:
        client = logging.getLogger(name)
        if _FILTER not in client.filters:
            client.addFilter(_FILTER)
