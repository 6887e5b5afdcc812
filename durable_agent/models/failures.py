"""Model failures: the one type a model client raises, and the one classified value it carries.

Foreign exceptions are translated where they arise, in the client that knows them (the
httpx `map_httpcore_exceptions` habit): `openai_chat.py` maps every openai / HTTP
exception and every unusable response body to a `ProviderError` carrying a `Failure`.
Nothing here imports openai, so an offline (scripted) run never pays for it.

    Exception
    ├── ProviderError          one failed try, already classified (raised by model clients)
    └── ModelError (errors.py)
        └── ModelCallError     the call failed for good: permanent, or retries exhausted

`classify(exc)` turns anything a model call raised into a `Failure`: the failure a
`ProviderError` / `ModelCallError` carries, the stdlib's network errors as retryable,
anything else as permanent `unexpected` (a bug in a client: it should have mapped it).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from msgspec import Struct

from durable_agent.errors import ModelError
from durable_agent.redact import Redactor

__all__ = [
    "HINTS",
    "Failure",
    "FailureKind",
    "ModelCallError",
    "ProviderError",
    "classify",
    "failure_for_status",
    "scrubber",
]


class FailureKind(StrEnum):
    RETRYABLE = "retryable"
    PERMANENT = "permanent"


HINTS = {
    "rate_limit": "rate limited: wait, or lower concurrency, then resume",
    "server_error": "the provider is failing: resume the run later",
    "timeout": "the request timed out: check the network or the endpoint's load, then resume",
    "connection": "could not reach the endpoint: check --base-url and the network, then resume",
    "disconnected": "the endpoint was reached but hung up before answering: resume the run; if it "
    "keeps happening, check the server's log and any proxy in between",
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
    "truncated_response": "the response was cut off before its end: resume the run; if it "
    "keeps happening, check --base-url and any proxy in between",
    "undecodable": "the response body is not what its Content-Encoding says: resume the run; if it "
    "keeps happening, check --base-url and any proxy in between",
    "client_error": "the client could not be used: check OPENAI_API_KEY and --base-url",
    "length": "the answer hit the output token limit",
    "content_filter": "the provider's content filter refused the request",
    "websocket": "the websocket transport failed (not used by chat completions)",
    "os_error": "a local network error: check the network, then resume",
    "unexpected": "an unexpected error in the model call: see the message (this may be a bug)",
}


class Failure(Struct, frozen=True):
    """One classified model failure; safe to store and print (no secrets)."""

    kind: FailureKind
    reason: str
    """Short class name, a key of HINTS: rate_limit, server_error, timeout, auth, ..."""
    message: str
    """The provider's own message, with API keys redacted."""
    status: int | None = None
    """HTTP status, when there was a response."""
    retry_after: float | None = None
    """Seconds the provider asked us to wait (Retry-After / retry-after-ms), if it did."""

    @property
    def hint(self) -> str:
        """What the user should do next."""
        return HINTS[self.reason]

    @property
    def retryable(self) -> bool:
        return self.kind is FailureKind.RETRYABLE

    def describe(self) -> str:
        """`reason (status): message. hint` — the one-line form used in errors and logs."""
        status = f" ({self.status})" if self.status is not None else ""
        message = self.message.rstrip().rstrip(".")  # providers end sentences too: no ".."
        return f"{self.reason}{status}: {message}. {self.hint}"


class ProviderError(Exception):
    """One failed try of a model call, classified where it happened (see the module doc)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


class ModelCallError(ModelError):
    """A model call that failed for good: a permanent failure, or retries exhausted."""

    def __init__(self, failure: Failure, attempts: int) -> None:
        plural = "attempt" if attempts == 1 else "attempts"
        super().__init__(
            f"model call failed after {attempts} {plural}: {failure.describe()}",
            attempts=attempts,
        )
        self.failure = failure


RETRYABLE, PERMANENT = FailureKind.RETRYABLE, FailureKind.PERMANENT

# Statuses worth another try: the request may succeed unchanged (with every 5xx).
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


def failure_for_status(
    status: int, message: str, code: str = "", kind: str = "", retry_after: float | None = None
) -> Failure:
    """The status rule, shared by HTTP errors and the error bodies some servers send with 200.

    408, 409, 425, 429 and every 5xx are retryable, except a 429 that says
    `insufficient_quota` (waiting never fixes it); a 4xx that says the context is too long
    is permanent `context_length`; every other status is permanent.
    """

    def made(kind_: FailureKind, reason: str) -> Failure:
        return Failure(kind_, reason, message, status=status, retry_after=retry_after)

    if status == 429 and (_QUOTA in (code, kind) or "exceeded your current quota" in message):
        return made(PERMANENT, "insufficient_quota")
    if 400 <= status < 500 and status != 429:
        text = f"{code} {kind} {message}".lower()
        if any(marker in text for marker in _CONTEXT_MARKERS):
            return made(PERMANENT, "context_length")
    if status in _RETRYABLE_STATUS or status >= 500:
        return made(RETRYABLE, _STATUS_REASON.get(status, "server_error"))
    return made(PERMANENT, _STATUS_REASON.get(status, "http_error"))


_SHAPES = Redactor()  # key shapes only: a provider may echo a key we never sent


def scrubber(*secrets: str) -> Callable[[str], str]:
    """Redacts `secrets` (the key a client sends) and every key shape, as `[REDACTED]`."""
    known = [s for s in secrets if len(s) >= 4]  # a tiny "key" would shred the message

    def scrub(text: str) -> str:
        for secret in known:
            text = text.replace(secret, "[REDACTED]")
        return _SHAPES.redact(text)

    return scrub


def classify(exc: BaseException) -> Failure:
    """The `Failure` of anything a model call raised. Never raises."""
    if isinstance(exc, ProviderError | ModelCallError):
        return exc.failure
    message = _SHAPES.redact(str(exc) or type(exc).__name__)
    # Subclasses first: ConnectionError and TimeoutError are OSErrors too.
    if isinstance(exc, TimeoutError):
        return Failure(RETRYABLE, "timeout", message)
    if isinstance(exc, ConnectionError):
        return Failure(RETRYABLE, "connection", message)
    if isinstance(exc, OSError):
        return Failure(RETRYABLE, "os_error", message)
    return Failure(PERMANENT, "unexpected", message)
