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

HTTP(S) clients (aiohttp through fsspec) have no retries of their own: ``call_with_budget`` wraps
the calls ``storage.Storage`` and ``storage.RemoteFile`` make over HTTP by the same rules.
"""

from __future__ import annotations

import email.utils
import random
import time

RETRY_BUDGET_S = 60.0  # default seconds a failing request keeps being retried (a 30 s burst of 503s is survived)
BACKOFF_S = 0.05  # first backoff ceiling, seconds; doubles per attempt
BACKOFF_MAX_S = 2.0  # largest backoff ceiling, seconds
RETRYABLE_STATUS = (429, 500, 502, 503, 504)


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

    def __init__(self, budget_s: float, backoff_s: float = BACKOFF_S, backoff_max_s: float = BACKOFF_MAX_S):
        from botocore.retries.standard import (
            RetryEventAdapter,
            ThrottledRetryableChecker,
            TransientRetryableChecker,
        )

        self.budget_s, self.backoff_s, self.backoff_max_s = budget_s, backoff_s, backoff_max_s
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
        delay = next_delay(
            started,
            attempts - 1,
            self.budget_s,
            retry_after_s(headers.get("retry-after")),
            self.backoff_s,
            self.backoff_max_s,
        )
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


def call_with_budget(
    call, where: str, budget_s: float, backoff_s: float = BACKOFF_S, backoff_max_s: float = BACKOFF_MAX_S
):
    """``call()``, asked again after each ``transient`` failure for ``budget_s`` seconds (the module's rules).

    For the fsspec calls no client retries (HTTP). ``where``: what the message names (the URL).
    Returns what ``call`` returns; a failure that is not transient is raised as it is.

    Raises:
        RetryBudgetExceeded: still failing when the budget is spent (or a ``Retry-After`` is past it);
            names ``where``, the status or exception, the attempts and the seconds spent.
    """
    started, attempt = time.monotonic(), 0
    while True:
        try:
            return call()
        except Exception as exc:
            if not transient(exc):
                raise
            status, code, headers = http_status_of(exc)
            retry_after = retry_after_s(headers.get("retry-after"))
            delay = next_delay(started, attempt, budget_s, retry_after, backoff_s, backoff_max_s)
            if delay is None:
                elapsed = time.monotonic() - started
                after = f"; Retry-After {headers['retry-after']}" if retry_after is not None else ""
                raise RetryBudgetExceeded(
                    f"{where}: {describe_failure(status, code, exc)} (gave up after {attempt + 1} attempts in "
                    f"{elapsed:.1f} s: retry budget {budget_s:g} s{after})",
                    status,
                    elapsed,
                ) from exc
            time.sleep(delay)
            attempt += 1
