"""Model failures: classified once, here, and retried by one tenacity policy.

Every exception a model call can raise goes through `classify`, which looks its class up
in one table (most specific class in the MRO wins; built on first use, see `_table`) and
returns a `Failure`:

    exception                               kind        reason
    openai.OpenAIError                      permanent   client_error (e.g. no API key set)
    ├── APIError                            retryable if its error type says server_error /
    │   │                                   rate_limit, else permanent api_error
    │   ├── APIConnectionError              retryable   connection
    │   │   └── APITimeoutError             retryable   timeout
    │   ├── APIResponseValidationError      permanent   invalid_response
    │   └── APIStatusError                  by status, see below
    │       ├── BadRequestError        400  permanent   bad_request | context_length
    │       ├── AuthenticationError    401  permanent   auth
    │       │   └── OAuthError         401  permanent   auth
    │       ├── PermissionDeniedError  403  permanent   permission
    │       ├── NotFoundError          404  permanent   not_found
    │       ├── ConflictError          409  retryable   conflict
    │       ├── UnprocessableEntityError 422 permanent  unprocessable
    │       ├── RateLimitError         429  retryable   rate_limit | permanent insufficient_quota
    │       └── InternalServerError    5xx  retryable   server_error
    ├── LengthFinishReasonError             permanent   length
    ├── ContentFilterFinishReasonError      permanent   content_filter
    ├── SubjectTokenProviderError           permanent   auth
    └── WebSocket*Error                     permanent   websocket
    httpx2/httpx TransportError             retryable   connection | timeout
    TimeoutError                            retryable   timeout
    ConnectionError, OSError                retryable   connection
    ModelCallError                          the failure it carries
    anything else                           permanent   unexpected

Status rule (any APIStatusError): 408, 409, 425, 429 and every 5xx are retryable, except a
429 whose code or type is `insufficient_quota`; a 4xx that says the context is too long is
permanent `context_length`; every other 4xx is permanent. `Retry-After` / `retry-after-ms`
headers are parsed into `Failure.retry_after`.

`call_with_retries` retries retryable failures with tenacity (full-jitter exponential
backoff, `Retry-After` honoured up to a cap, bounded attempts and total time) and raises
`ModelCallError` when it gives up. Build the OpenAI client with `max_retries=0`: stacked
retry layers multiply attempts and hide them from the step record.
"""

from __future__ import annotations

import email.utils
import math
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from durable_agent.errors import ModelError

if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "MAPPED_TYPES",
    "Failure",
    "FailureKind",
    "ModelCallError",
    "RetryPolicy",
    "call_with_retries",
    "classify",
    "is_classified",
    "parse_retry_after",
]

T = TypeVar("T")


class FailureKind(StrEnum):
    RETRYABLE = "retryable"
    PERMANENT = "permanent"


@dataclass(frozen=True)
class Failure:
    """One classified model failure; safe to store and print (no secrets)."""

    kind: FailureKind
    reason: str
    """Short class name: rate_limit, server_error, timeout, auth, context_length, ..."""
    message: str
    """The provider's message, with API keys redacted."""
    hint: str
    """What the user should do next."""
    status: int | None = None
    """HTTP status, when there was a response."""
    retry_after: float | None = None
    """Seconds the provider asked us to wait (Retry-After / retry-after-ms), if it did."""

    @property
    def retryable(self) -> bool:
        return self.kind is FailureKind.RETRYABLE

    def describe(self) -> str:
        """`reason (status): message. hint` — the one-line form used in errors and logs."""
        status = f" ({self.status})" if self.status is not None else ""
        message = self.message.rstrip().rstrip(".")  # providers end sentences too: no ".."
        return f"{self.reason}{status}: {message}. {self.hint}"


class ModelCallError(ModelError):
    """A model call that failed for good: a permanent failure, or retries exhausted."""

    def __init__(self, failure: Failure, attempts: int) -> None:
        plural = "attempt" if attempts == 1 else "attempts"
        super().__init__(
            f"model call failed after {attempts} {plural}: {failure.describe()}",
            attempts=attempts,
            permanent=not failure.retryable,
        )
        self.failure = failure


# --- classification ---------------------------------------------------------------------

Handler = Callable[[BaseException], Failure]

_HINTS = {
    "rate_limit": "rate limited: wait, or lower concurrency, then resume",
    "server_error": "the provider is failing: resume the run later",
    "timeout": "the request timed out: check the network or the endpoint's load, then resume",
    "connection": "could not reach the endpoint: check --base-url and the network, then resume",
    "conflict": "the provider reported a conflict: resume the run",
    "too_early": "the provider asked to retry later: resume the run",
    "auth": "check OPENAI_API_KEY (and that --base-url is the endpoint the key belongs to)",
    "permission": "the API key may not use this model or project: check the key and --model",
    "not_found": "the model name or the endpoint is wrong: check --model and --base-url",
    "bad_request": "the provider rejected the request: see its message",
    "context_length": "the conversation is longer than the model's context: raise max context "
    "(a larger model) or shorten the task",
    "insufficient_quota": "the account is out of quota: add credit or raise the limit, then resume",
    "unprocessable": "the provider could not process the request: see its message",
    "request_too_large": "the request is too large: shorten the task or its observations",
    "http_error": "the provider rejected the request: see its message",
    "api_error": "the provider returned an error: see its message",
    "invalid_response": "the endpoint's response is not OpenAI-compatible: check --base-url",
    "client_error": "the client could not be used: check OPENAI_API_KEY and --base-url",
    "length": "the answer hit the output token limit",
    "content_filter": "the provider's content filter refused the request",
    "websocket": "the websocket transport failed (not used by chat completions)",
    "os_error": "a local network error: check the network, then resume",
    "unexpected": "an unexpected error in the model call: see the message (this may be a bug)",
}

# Statuses worth another try: the request may succeed unchanged.
_RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
_STATUS_REASON = {
    400: "bad_request",
    401: "auth",
    403: "permission",
    404: "not_found",
    408: "timeout",
    409: "conflict",
    413: "request_too_large",
    422: "unprocessable",
    425: "too_early",
    429: "rate_limit",
}
_CONTEXT_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "context window",
    "prompt is too long",
    "too many tokens",
)
_QUOTA = "insufficient_quota"

# Key shapes redacted even when we do not know the key (e.g. a provider echoing it back).
_SECRET_SHAPES = re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-*.]{6,}|\bBearer\s+\S+", re.I)


def _redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if len(secret) >= 4:  # a tiny "key" would shred the message
            text = text.replace(secret, "[REDACTED]")
    return _SECRET_SHAPES.sub("[REDACTED]", text)


def _request_secrets(exc: BaseException) -> list[str]:
    """The key the client actually sent, taken from the failed request's headers."""
    try:
        headers = getattr(getattr(exc, "request", None), "headers", None)
    except RuntimeError:  # httpx raises this when an error was built without its request
        return []
    if headers is None:
        return []
    found = []
    for name in ("authorization", "api-key", "x-api-key"):
        value = headers.get(name)
        if isinstance(value, str) and value:
            found.append(value.removeprefix("Bearer ").strip())
    return found


def _error_fields(exc: BaseException) -> tuple[str, str, str]:
    """(message, code, type) from an openai APIError body, falling back to str(exc)."""
    body = getattr(exc, "body", None)
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    if isinstance(body, dict):
        provider_message = body.get("message")
        if isinstance(provider_message, str) and provider_message:
            message = provider_message
    code = str(getattr(exc, "code", None) or "")
    kind = str(getattr(exc, "type", None) or "")
    return message, code, kind


def parse_retry_after(headers: Any) -> float | None:
    """Seconds from `retry-after-ms` or `Retry-After` (seconds or an HTTP date), else None."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            seconds = float(raw) / scale
        except ValueError:
            if scale != 1.0:
                continue
            try:
                when = email.utils.parsedate_to_datetime(raw)
            except (TypeError, ValueError):
                continue
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            seconds = (when - datetime.now(UTC)).total_seconds()
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None


def _failure(exc: BaseException, kind: FailureKind, reason: str, **extra: Any) -> Failure:
    message, _, _ = _error_fields(exc)
    return Failure(
        kind=kind,
        reason=reason,
        message=_redact(message, _request_secrets(exc)),
        hint=_HINTS[reason],
        **extra,
    )


def _fixed(kind: FailureKind, reason: str) -> Handler:
    return lambda exc: _failure(exc, kind, reason)


def _from_transport(exc: BaseException) -> Failure:
    is_timeout = "Timeout" in type(exc).__name__  # httpx(2).TimeoutException and subclasses
    return _failure(exc, FailureKind.RETRYABLE, "timeout" if is_timeout else "connection")


def _from_status(exc: BaseException) -> Failure:
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        return _failure(exc, FailureKind.PERMANENT, "http_error")
    message, code, kind = _error_fields(exc)
    response = getattr(exc, "response", None)
    retry_after = parse_retry_after(getattr(response, "headers", None))
    extra: dict[str, Any] = {"status": status, "retry_after": retry_after}

    if status == 429 and (_QUOTA in (code, kind) or "exceeded your current quota" in message):
        # Looks like a rate limit but waiting never fixes it: fail at once.
        return _failure(exc, FailureKind.PERMANENT, "insufficient_quota", **extra)
    if 400 <= status < 500 and status != 429:
        text = f"{code} {kind} {message}".lower()
        if any(marker in text for marker in _CONTEXT_MARKERS):
            return _failure(exc, FailureKind.PERMANENT, "context_length", **extra)
    if status in _RETRYABLE_STATUS or status >= 500:
        reason = _STATUS_REASON.get(status, "server_error")
        return _failure(exc, FailureKind.RETRYABLE, reason, **extra)
    return _failure(exc, FailureKind.PERMANENT, _STATUS_REASON.get(status, "http_error"), **extra)


def _from_api_error(exc: BaseException) -> Failure:
    # A bare APIError comes from an error event inside a 200 response (streaming); its
    # type is the only hint whether the provider was overloaded or the request was bad.
    _, code, kind = _error_fields(exc)
    if {"server_error", "rate_limit_exceeded", "overloaded_error"} & {code, kind}:
        return _failure(exc, FailureKind.RETRYABLE, "server_error")
    return _failure(exc, FailureKind.PERMANENT, "api_error")


def _from_model_call_error(exc: BaseException) -> Failure:
    assert isinstance(exc, ModelCallError)
    return exc.failure


def _optional_openai(openai: ModuleType, *names: str) -> list[type[BaseException]]:
    """Exception classes that only some openai versions define (we support >=1.40)."""
    found = (getattr(openai, name, None) for name in names)
    return [cls for cls in found if isinstance(cls, type) and issubclass(cls, BaseException)]


def _transport_errors() -> dict[type[BaseException], Handler]:
    # Only the HTTP library that is loaded can raise: importing openai loaded its own
    # (httpx2 for openai 3.x, httpx before), so we never import one just to map it.
    table: dict[type[BaseException], Handler] = {}
    for name in ("httpx2", "httpx"):
        module = sys.modules.get(name)
        if module is not None:
            table[module.TransportError] = _from_transport
    return table


RETRYABLE, PERMANENT = FailureKind.RETRYABLE, FailureKind.PERMANENT

# The one mapping table. `classify` takes the first class of the exception's MRO found
# here, so a subclass entry overrides its base. tests/test_retry.py checks that every
# exception class the openai package exports has its own entry.
#
# It is built on first use, not at import: `import openai` costs ~0.4 s, and a scripted
# (offline) run must not pay it. Until something has imported openai, no openai
# exception can exist, so the stdlib part of the table is enough to classify anything.
_BASE_TABLE: dict[type[BaseException], Handler] = {
    TimeoutError: _fixed(RETRYABLE, "timeout"),
    ConnectionError: _fixed(RETRYABLE, "connection"),
    OSError: _fixed(RETRYABLE, "os_error"),
    ModelCallError: _from_model_call_error,
}
_full_table: dict[type[BaseException], Handler] | None = None

MAPPED_TYPES: frozenset[type[BaseException]]
"""Every class with its own entry; computed on access by `__getattr__` (imports openai)."""


def _openai_table() -> dict[type[BaseException], Handler]:
    """The whole table, openai classes included (imports openai on the first call)."""
    global _full_table
    if _full_table is None:
        import openai

        _full_table = {
            openai.OpenAIError: _fixed(PERMANENT, "client_error"),
            openai.APIError: _from_api_error,
            openai.APIConnectionError: _fixed(RETRYABLE, "connection"),
            openai.APITimeoutError: _fixed(RETRYABLE, "timeout"),
            openai.APIResponseValidationError: _fixed(PERMANENT, "invalid_response"),
            openai.APIStatusError: _from_status,
            openai.BadRequestError: _from_status,
            openai.AuthenticationError: _from_status,
            openai.PermissionDeniedError: _from_status,
            openai.NotFoundError: _from_status,
            openai.ConflictError: _from_status,
            openai.UnprocessableEntityError: _from_status,
            openai.RateLimitError: _from_status,
            openai.InternalServerError: _from_status,
            openai.LengthFinishReasonError: _fixed(PERMANENT, "length"),
            openai.ContentFilterFinishReasonError: _fixed(PERMANENT, "content_filter"),
            **{cls: _from_status for cls in _optional_openai(openai, "OAuthError")},
            **{cls: _fixed(PERMANENT, "auth")
               for cls in _optional_openai(openai, "SubjectTokenProviderError")},
            **{
                cls: _fixed(PERMANENT, "websocket")
                for cls in _optional_openai(
                    openai, "WebSocketConnectionClosedError", "WebSocketQueueFullError")
            },
            **_transport_errors(),  # after `import openai`, so its HTTP library is loaded
            **_BASE_TABLE,
        }
    return _full_table


def _table() -> dict[type[BaseException], Handler]:
    if _full_table is None and "openai" not in sys.modules:
        return _BASE_TABLE
    return _openai_table()


def __getattr__(name: str) -> Any:
    # MAPPED_TYPES stays importable by name without importing openai at module import.
    if name == "MAPPED_TYPES":
        return frozenset(_openai_table())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_classified(exc_type: type[BaseException]) -> bool:
    """True when `exc_type` has its own entry in the table (not only through a base class)."""
    return exc_type in _openai_table()


def classify(exc: BaseException) -> Failure:
    """Classify any exception raised by a model call. Never raises."""
    table = _table()
    for cls in type(exc).__mro__:
        handler = table.get(cls)
        if handler is not None:
            return handler(exc)
    return _failure(exc, PERMANENT, "unexpected")


# --- retrying -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How long a model call keeps trying; the defaults suit a hosted API."""

    max_attempts: int = 6
    """Tries in all, the first included."""
    max_total_seconds: float = 120.0
    """No retry is started whose wait would end past this many seconds since the first try."""
    initial_wait: float = 1.0
    """Upper bound of the first random backoff, in seconds; it doubles per retry."""
    max_wait: float = 30.0
    """Largest backoff window, in seconds (without a Retry-After)."""
    max_retry_after: float = 60.0
    """A provider's Retry-After is honoured up to this many seconds."""


class _wait_retry_after(wait_base):
    """The provider's Retry-After when it sent one (capped), else the fallback backoff."""

    def __init__(self, fallback: wait_base, cap: float) -> None:
        self.fallback = fallback
        self.cap = cap

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        if exc is not None:
            retry_after = classify(exc).retry_after
            if retry_after is not None:
                return min(retry_after, self.cap)
        return self.fallback(retry_state)


class _stop_before_total(stop_base):
    """Stop when the time spent plus the next wait would pass the budget.

    Like tenacity's `stop_before_delay`, but the waits are counted from `idle_for`, so the
    budget also holds with an injected (fake) sleep that takes no wall-clock time.
    """

    def __init__(self, max_total: float) -> None:
        self.max_total = max_total

    def __call__(self, retry_state: RetryCallState) -> bool:
        spent = max(retry_state.seconds_since_start or 0.0, retry_state.idle_for)
        return spent + retry_state.upcoming_sleep >= self.max_total


def call_with_retries(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    on_attempt: Callable[[int, Failure | None], None] | None = None,
) -> tuple[T, int]:
    """Call `fn` until it succeeds, a permanent failure, or the policy is exhausted.

    Returns `(result, attempts)`, attempts counting the successful try. `on_attempt` is
    called after every try with its number and its `Failure` (None for the success), so
    the caller can record attempts on the step. Raises `ModelCallError` on giving up.
    Exceptions that are not `Exception` (KeyboardInterrupt) propagate untouched.
    """
    attempts = 0

    def attempt() -> T:
        nonlocal attempts
        attempts += 1
        try:
            result = fn()
        except Exception as exc:
            if on_attempt is not None:
                on_attempt(attempts, classify(exc))
            raise
        if on_attempt is not None:
            on_attempt(attempts, None)
        return result

    retrying = Retrying(
        stop=stop_after_attempt(policy.max_attempts) | _stop_before_total(policy.max_total_seconds),
        wait=_wait_retry_after(
            wait_random_exponential(multiplier=policy.initial_wait, max=policy.max_wait),
            policy.max_retry_after,
        ),
        retry=retry_if_exception(lambda exc: classify(exc).retryable),
        sleep=sleep,
        reraise=True,  # give up with the provider's exception, not tenacity's RetryError
    )
    try:
        return retrying(attempt), attempts
    except Exception as exc:
        raise ModelCallError(classify(exc), attempts) from exc
