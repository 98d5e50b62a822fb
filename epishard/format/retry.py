"""Retries as a time budget: how long a failing request to S3 or an HTTP server keeps being asked again.

One rule for the writer (every S3 call of ``convert``, ``verify``, ``inspect`` and of remote LeRobot
sources, through botocore's ``needs-retry`` event: ``S3RetryBudget``) and the reader (its own loop
over ranged reads, ``stream.fetch.wait_or_raise``):

- Retryable: throttling (HTTP 429, 503 ``SlowDown`` and botocore's other throttling error codes),
  5xx (500, 502, 503, 504), ``RequestTimeout``, and failures without an answer (connection refused
  or reset, connect or read timeouts). Anything else (403, 404, a bad request) fails at once.
- A retryable failure is asked again after a full-jitter backoff (a uniform draw from 0 to
  ``min(backoff_max_s, backoff_s * 2**attempt)``, as in the AWS Architecture Blog's "Exponential
  Backoff And Jitter"), or after the server's ``Retry-After`` (seconds or an HTTP date) when that
  is longer, for as long as the request's budget (``budget_s`` seconds, counted from when the
  request was first sent) lasts. After it the request fails with ``RetryBudgetExceeded`` (writer) or
  ``FetchError`` (reader), naming the URL, the status and the time spent. A ``Retry-After`` longer
  than what is left of the budget fails at once.
- A request that gets no answer costs at most its connect and read timeouts plus the budget.

``RetryPolicy`` is the one object that holds these numbers (the budget, the backoff, an optional
retry count, the connect and read timeouts). Each opened location carries one
(``epishard.format.storage.Location``: the storage options ``connect_timeout``, ``read_timeout`` and
``retry_budget`` override its defaults, read once when the location is opened), and every retry loop
takes it: ``S3RetryBudget`` (botocore's S3 calls), ``RetryPolicy.call`` (the fsspec calls no client
retries: HTTP(S), whose aiohttp client has no retries of its own, and every metadata call of the
reader) and the reader's shard fetches (``stream.fetch``).
"""

from __future__ import annotations

import dataclasses
import email.utils
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BACKOFF_MAX_S",
    "BACKOFF_S",
    "CONNECT_TIMEOUT_S",
    "READ_TIMEOUT_S",
    "RETRYABLE_STATUS",
    "RETRY_BUDGET_S",
    "STORAGE_OPTIONS",
    "GiveUp",
    "RetryBudgetExceeded",
    "RetryPolicy",
    "S3RetryBudget",
    "backoff",
    "budget_exceeded",
    "describe_failure",
    "http_status_of",
    "next_delay",
    "retry_after_s",
    "transient",
]

RETRY_BUDGET_S = 60.0  # default seconds a failing request keeps being retried (a 30 s burst of 503s is survived)
BACKOFF_S = 0.05  # first backoff ceiling, seconds; doubles per attempt
BACKOFF_MAX_S = 2.0  # largest backoff ceiling, seconds
RETRYABLE_STATUS = (429, 500, 502, 503, 504)
CONNECT_TIMEOUT_S = 10.0  # default seconds to open a connection to S3 or an HTTP server
READ_TIMEOUT_S = 30.0  # default seconds a request may wait for the next bytes of a response


class RetryBudgetExceeded(OSError):
    """A request still failed (throttled, 5xx, no answer) when its retry budget was spent.

    An ``OSError``, not a ``TimeoutError``: fsspec turns every ``TimeoutError`` out of its event
    loop into a bare ``FSTimeoutError``, which would lose the message.

    The message names the method and URL, the HTTP status and error code (or the exception), the
    attempts and the seconds spent. ``status``: the last HTTP status (None: no answer);
    ``elapsed_s``: seconds since the request was first sent.
    """

    def __init__(self, message: str, status: int | None, elapsed_s: float):
        super().__init__(message)
        self.status, self.elapsed_s = status, elapsed_s

    def __reduce__(self):  # to a DataLoader worker's parent, a Ray driver: the same class and fields
        return type(self), (self.args[0], self.status, self.elapsed_s), self.__dict__


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header value asks a client to wait, at least 0.

    ``value``: delta-seconds (``"3"``, ``"1.5"``) or an HTTP date (``"Wed, 21 Oct 2026 07:28:00
    GMT"``); ``now``: the current POSIX time (default: ``time.time()``). None when absent or
    unreadable (the backoff applies then).
    """
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def backoff(attempt: int, backoff_s: float = BACKOFF_S, backoff_max_s: float = BACKOFF_MAX_S) -> float:
    """Full-jitter backoff before retry ``attempt`` (from 0): uniform in ``[0, min(cap, base * 2**attempt)]`` s."""
    return random.uniform(0.0, min(backoff_max_s, backoff_s * 2 ** min(attempt, 60)))


def next_delay(
    started: float,
    attempt: int,
    budget_s: float,
    retry_after: float | None = None,
    backoff_s: float = BACKOFF_S,
    backoff_max_s: float = BACKOFF_MAX_S,
) -> float | None:
    """Seconds to wait before asking again, or None when the budget does not allow another try.

    ``started``: ``time.monotonic()`` when the request was first sent; ``attempt``: failed tries so
    far minus one (0 after the first failure); ``retry_after``: the server's ``Retry-After`` in
    seconds. The wait is the jittered ``backoff``, at least ``retry_after``, at most what is left of
    ``budget_s``; None when nothing is left or ``retry_after`` is longer than what is left.
    """
    left = budget_s - (time.monotonic() - started)
    if left <= 0 or (retry_after is not None and retry_after > left):
        return None
    return max(min(backoff(attempt, backoff_s, backoff_max_s), left), retry_after or 0.0)


def http_status_of(exc: BaseException) -> tuple[int | None, str, dict]:
    """``(status, error code, lower-cased headers)`` of the HTTP answer behind an exception.

    Looks through ``exc`` and its causes for aiohttp's ``ClientResponseError`` (fsspec HTTP) or
    botocore's ``ClientError`` (s3fs); ``(None, "", {})`` when there was no answer.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        response = getattr(e, "response", None)
        if isinstance(response, dict) and "ResponseMetadata" in response:  # botocore ClientError
            meta = response["ResponseMetadata"]
            headers = {k.lower(): v for k, v in (meta.get("HTTPHeaders") or {}).items()}
            return meta.get("HTTPStatusCode"), str((response.get("Error") or {}).get("Code", "")), headers
        status = getattr(e, "status", None)
        if isinstance(status, int) and hasattr(e, "request_info"):  # aiohttp ClientResponseError
            headers = {k.lower(): v for k, v in (getattr(e, "headers", None) or {}).items()}
            return status, "", headers
        e = e.__cause__ or e.__context__
    return None, "", {}


def describe_failure(status: int | None, code: str, exc: BaseException | None) -> str:
    """What the last try got, for an error message: ``HTTP 503 SlowDown`` or ``ReadTimeoutError: ...``."""
    if status is not None:
        return f"HTTP {status}{' ' + code if code else ''}"
    return f"{type(exc).__name__}: {exc}" if exc is not None else "no answer"


class S3RetryBudget:
    """botocore event handlers that retry an S3 call for ``budget_s`` seconds (the module's rules).

    Registered on the session an s3fs filesystem makes its clients from (``install``), with
    botocore's own retries set to one attempt, so this is the only retry loop. Throttling and
    transient failures are recognised by botocore's own checkers (``ThrottledRetryableChecker``,
    ``TransientRetryableChecker``: codes such as ``SlowDown``, statuses 500-504, connection errors
    and timeouts), plus HTTP 429. After the budget the handler raises ``RetryBudgetExceeded``.
    """

    _START = "epishard_retry_started"

    def __init__(self, policy: RetryPolicy):
        from botocore.retries.standard import (
            RetryEventAdapter,
            ThrottledRetryableChecker,
            TransientRetryableChecker,
        )

        self.policy = policy
        self.budget_s = policy.budget_s
        self._adapter = RetryEventAdapter()
        self._checkers = (TransientRetryableChecker(), ThrottledRetryableChecker())

    def install(self, session) -> None:
        """Register on a botocore/aiobotocore ``session``: clients made from it retry by this budget."""
        session.register("before-call.s3", self.start)
        session.register("needs-retry.s3", self.needs_retry)

    def start(self, context=None, **_) -> None:
        """``before-call``: the call's clock starts."""
        if context is not None:
            context[self._START] = time.monotonic()

    def needs_retry(self, **kwargs) -> float | None:
        """``needs-retry``: seconds to wait before the next attempt, None for no retry.

        Raises:
            RetryBudgetExceeded: the failure is retryable and the budget is spent.
        """
        response, exc = kwargs.get("response"), kwargs.get("caught_exception")
        context = self._adapter.create_retry_context(**kwargs)
        status = context.http_response.status_code if context.http_response is not None else None
        if response is None and exc is None:
            return None
        if not (status == 429 or any(c.is_retryable(context) for c in self._checkers)):
            return None
        request = kwargs.get("request_dict") or {}
        started = request.get("context", {}).get(self._START)
        if started is None:  # no before-call seen (a client made elsewhere): count from the first failure
            started = request.setdefault("context", {}).setdefault(self._START, time.monotonic())
        headers = (context.parsed_response or {}).get("ResponseMetadata", {}).get("HTTPHeaders", {}) or {}
        attempts = int(kwargs.get("attempts") or 1)
        delay = self.policy.next_delay(started, attempts - 1, retry_after_s(headers.get("retry-after")))
        if delay is not None:
            return delay
        elapsed = time.monotonic() - started
        what = describe_failure(status, context.get_error_code() or "", exc)
        after = f"; Retry-After {headers['retry-after']}" if headers.get("retry-after") else ""
        raise RetryBudgetExceeded(
            f"{request.get('method', '')} {request.get('url', '?')}: {what} (gave up after {attempts} attempts in "
            f"{elapsed:.1f} s: retry budget {self.budget_s:g} s{after})".lstrip(),
            status,
            elapsed,
        ) from exc


def transient(exc: BaseException) -> bool:
    """Whether a failed fsspec call (HTTP) may succeed when asked again.

    An answer with a status of ``RETRYABLE_STATUS`` (429, 5xx), a connection error or a timeout;
    also fsspec's ``FileNotFoundError`` when its cause is one of those (fsspec's HTTP ``info``
    calls every failure "not found"). A 4xx answer, a real 404 and anything else: False.
    """
    status, _, _ = http_status_of(exc)
    if status is not None:
        return status in RETRYABLE_STATUS
    if isinstance(exc, FileNotFoundError):
        return exc.__cause__ is not None and transient(exc.__cause__)
    if isinstance(exc, PermissionError | IsADirectoryError | NotADirectoryError | RetryBudgetExceeded):
        return False
    try:
        import aiohttp

        if isinstance(exc, aiohttp.ClientError):  # refused, reset, disconnected (answers were handled above)
            return True
    except ImportError:
        pass
    return isinstance(exc, ConnectionError | TimeoutError)


GiveUp = Callable[[BaseException, str, int, float, "RetryPolicy"], BaseException]
"""``give_up(exc, where, attempt, started, policy)``: the exception raised when a retry loop stops."""


def budget_exceeded(exc: BaseException, where: str, attempt: int, started: float, policy: RetryPolicy):
    """The writer's ``give_up``: ``RetryBudgetExceeded`` naming ``where``, the status, attempts and seconds.

    A failure that is not transient is raised as it is (returned unchanged).
    """
    if not transient(exc):
        return exc
    status, code, headers = http_status_of(exc)
    elapsed = time.monotonic() - started
    after = f"; Retry-After {headers['retry-after']}" if headers.get("retry-after") is not None else ""
    return RetryBudgetExceeded(
        f"{where}: {describe_failure(status, code, exc)} (gave up after {attempt + 1} attempts in "
        f"{elapsed:.1f} s: retry budget {policy.budget_s:g} s{after})",
        status,
        elapsed,
    )


STORAGE_OPTIONS = {"connect_timeout": "connect_s", "read_timeout": "read_s", "retry_budget": "budget_s"}
"""epishard's own storage options (seconds) -> the ``RetryPolicy`` field each sets."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long a failing remote request is asked again, and how long one try may wait (the module's rules).

    Args:
        budget_s: seconds a failing request keeps being retried, counted from when it was first
            sent (the reader's shard fetches: from its last progress). Default ``RETRY_BUDGET_S``.
        backoff_s / backoff_max_s: the full-jitter backoff's first and largest ceiling, seconds.
        retries: also a limit on the number of retries per request; None: the budget alone.
        connect_s / read_s: seconds to open a connection, and to wait for the next bytes of a
            response (S3 and HTTP clients; ``epishard.format.storage.with_timeouts``).

    Raises:
        ValueError: a value below 0 (or NaN), naming it.
    """

    budget_s: float = RETRY_BUDGET_S
    backoff_s: float = BACKOFF_S
    backoff_max_s: float = BACKOFF_MAX_S
    retries: int | None = None
    connect_s: float = CONNECT_TIMEOUT_S
    read_s: float = READ_TIMEOUT_S

    def __post_init__(self):
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        bad = {k: v for k, v in values.items() if v is not None and not (0 <= v < math.inf)}
        if bad:  # NaN and infinity too: nothing waits forever
            raise ValueError(
                "RetryPolicy: " + ", ".join(f"{k} ({v})" for k, v in bad.items()) + " must be a finite number >= 0"
            )

    def with_storage_options(self, options: dict, where: str) -> tuple[RetryPolicy, dict]:
        """``(policy, client options)``: epishard's storage options over this policy, and the rest.

        ``connect_timeout``, ``read_timeout`` and ``retry_budget`` (seconds, ``STORAGE_OPTIONS``)
        set ``connect_s``, ``read_s`` and ``budget_s``; the other options are the fsspec client's.

        Raises:
            ValueError: one of them is not a finite number of seconds >= 0 (names ``where`` and the option).
        """
        rest, values = dict(options), dict[str, Any]()
        for option, name in STORAGE_OPTIONS.items():
            if option not in rest:
                continue
            given = rest.pop(option)
            try:
                value = float("nan") if isinstance(given, bool) else float(given)
            except (TypeError, ValueError):
                value = float("nan")
            if not 0 <= value < math.inf:  # NaN and infinity too: nothing waits forever
                raise ValueError(f"{where}: storage option {option} ({given}) must be a number of seconds >= 0")
            values[name] = value
        return dataclasses.replace(self, **values), rest

    def next_delay(self, started: float, attempt: int, retry_after: float | None = None) -> float | None:
        """Seconds to wait before retry ``attempt`` (from 0), or None when no retry is left.

        ``started``: ``time.monotonic()`` when the request was sent; ``retry_after``: the server's
        ``Retry-After`` in seconds. None when ``retries`` are spent, else as ``next_delay``.
        """
        if self.retries is not None and attempt >= self.retries:
            return None
        return next_delay(started, attempt, self.budget_s, retry_after, self.backoff_s, self.backoff_max_s)

    def call(
        self,
        call: Callable,
        where: str,
        retryable: Callable[[BaseException], bool] = transient,
        give_up: GiveUp = budget_exceeded,
    ):
        """``call()``, asked again after each ``retryable`` failure while this policy allows.

        For the fsspec calls no client retries (HTTP, and the reader's metadata reads). ``where``:
        what messages name (the URL). Returns what ``call`` returns. When the policy stops (a
        failure that is not retryable, the budget or the retries spent, a ``Retry-After`` past the
        budget) ``give_up(exc, where, attempt, started, policy)`` is raised from the failure.

        Raises:
            RetryBudgetExceeded: (the default ``give_up``) a transient failure outlasted the budget;
                a failure that is not transient is raised as it is.
        """
        started, attempt = time.monotonic(), 0
        while True:
            try:
                return call()
            except Exception as exc:
                delay = None
                if retryable(exc):
                    headers = http_status_of(exc)[2]
                    delay = self.next_delay(started, attempt, retry_after_s(headers.get("retry-after")))
                if delay is None:
                    raised = give_up(exc, where, attempt, started, self)
                    if raised is exc:
                        raise
                    raise raised from exc
                time.sleep(delay)
                attempt += 1
