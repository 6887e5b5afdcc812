"""Any OpenAI-compatible chat-completions endpoint, with native tool calling.

This module is the boundary to `openai` (the httpx `map_httpcore_exceptions` habit):
nothing leaves `complete` but a `ModelTurn` or a `ProviderError` carrying a classified
`Failure`. The response body is read by `answers.parse_completion`, not by the SDK's
models, so odd answers are classified too. Exceptions are mapped by one table, `_TABLE`
(most specific class in the MRO wins):

    exception                               kind        reason
    openai.OpenAIError                      permanent   client_error (e.g. no API key set)
    ├── APIError                            retryable if its error type says server_error /
    │   │                                   rate_limit, else permanent api_error
    │   ├── APIConnectionError              retryable   connection
    │   │   └── APITimeoutError             retryable   timeout
    │   ├── APIResponseValidationError      permanent   invalid_response
    │   └── APIStatusError                  by status (failures.failure_for_status)
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
    httpx2 / httpx TransportError           retryable   connection | timeout
    httpx2 / httpx DecodingError            retryable   undecodable (a body its encoding cannot undo)
    anything else                           not caught: a bug, `unexpected` (failures.classify)

tests/test_retry.py walks every exception class openai exports and fails if one has no
entry here. The client is built with max_retries=0: retries belong to retry.py alone.
"""

from __future__ import annotations

import email.utils
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import openai

from durable_agent.config.settings import mask_url_password
from durable_agent.errors import ConfigError
from durable_agent.messages import Message, ModelTurn
from durable_agent.models import bodies, deadline
from durable_agent.models.answers import completion_turn, parse_completion
from durable_agent.models.failures import (
    Failure,
    FailureKind,
    ProviderError,
    failure_for_status,
    scrubber,
)
from durable_agent.models.streaming import Assembler, Delta, listener
from durable_agent.observer import DeltaKind

__all__ = ["MAPPED_TYPES", "OpenAIChatModel", "is_classified", "map_exception", "parse_retry_after"]

Scrub = Callable[[str], str]
Handler = Callable[[BaseException, Scrub], Failure]
RETRYABLE, PERMANENT = FailureKind.RETRYABLE, FailureKind.PERMANENT
MAX_ANSWER_BYTES = 64 << 20  # of one chat completion, decoded: no real answer comes near it


_AZURE_URL = re.compile(r"^(?P<endpoint>[^?#]*?)/openai/deployments/(?P<deployment>[^/?#]+)")


def azure_target(base_url: str | None) -> tuple[str, str | None, str | None] | None:
    """(endpoint, deployment, api-version) of an Azure OpenAI deployment URL such as
    `https://NAME.openai.azure.com/openai/deployments/DEPLOYMENT?api-version=2024-10-21`
    (a trailing `/chat/completions` is allowed); None for any other URL."""
    if not base_url:
        return None
    match = _AZURE_URL.match(base_url)
    if match is None:
        return None
    versions = parse_qs(urlsplit(base_url).query).get("api-version")
    return match["endpoint"], match["deployment"], versions[0] if versions else None


class OpenAIChatModel:
    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str | None,
        read_timeout: float,
        connect_timeout: float,
        temperature: float | None = None,
        api_type: str = "auto",
        api_version: str | None = None,
        stream: bool = True,
        stream_memo: Path | None = None,
    ) -> None:
        self.name = model
        # Streamed unless turned off or this endpoint is known not to stream (streaming.py).
        self._memo = StreamMemo(stream_memo, f"{base_url or 'https://api.openai.com/v1'} {model}")
        self.streams = stream and not self._memo.refused()
        self.temperature = temperature
        self.whole = read_timeout  # also the longest one answer may take to arrive, as a whole
        timeout = openai.Timeout(read_timeout, connect=connect_timeout)
        try:
            azure = azure_target(base_url)
            if api_type == "azure" or (api_type == "auto" and azure is not None):
                # Azure OpenAI: the deployment is in the path, the version in the query and the
                # key in an `api-key` header, all of which the openai package's client builds.
                endpoint, deployment, version = azure or ((base_url or "").rstrip("/"), None, None)
                version = api_version or version
                if not endpoint or not version:
                    raise ConfigError(
                        "Azure OpenAI needs the resource endpoint (--base-url "
                        "https://NAME.openai.azure.com or a deployment URL) and an API version "
                        "(`?api-version=...` in the URL, api_version in the config, or "
                        "OPENAI_API_VERSION)"
                    )
                self.client: openai.OpenAI = openai.AzureOpenAI(
                    api_key=api_key,
                    azure_endpoint=endpoint,
                    azure_deployment=deployment,
                    api_version=version,
                    max_retries=0,
                    timeout=timeout,
                )
            else:
                self.client = openai.OpenAI(
                    api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout
                )
        except ImportError as exc:  # ALL_PROXY=socks5://... without the package httpx needs for it
            raise ConfigError(
                f"cannot use the proxy the environment names (ALL_PROXY, HTTPS_PROXY, HTTP_PROXY): {exc}"
            ) from None
        except Exception as exc:  # the client's URL parser is stricter than urlsplit (settings.py)
            if type(exc).__name__ != "InvalidURL":
                raise
            raise ConfigError(
                f"invalid settings: base_url: not a URL: {mask_url_password(base_url or '')!r} "
                f"({exc})"
            ) from None
        self._scrub = scrubber(api_key)  # some servers echo the key back in their errors
        self._hooked = deadline.hook(self.client)
        bodies.read_error_bodies_capped(self.client)

    def complete(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], turn: int
    ) -> ModelTurn:
        kwargs: dict[str, Any] = {"model": self.name, "messages": [m.to_api() for m in messages]}
        if tools:
            kwargs["tools"] = list(tools)
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.streams:
            try:
                return self._call(kwargs, streamed=True)
            except ProviderError as exc:
                if not refuses_streaming(exc.failure):
                    raise
                # Rejected before any answer (nothing paid): asked again at once, unstreamed.
                self._no_stream()
        return self._call(kwargs, streamed=False)

    def _no_stream(self) -> None:
        self.streams = False
        self._memo.remember()

    def _call(self, kwargs: dict[str, Any], *, streamed: bool) -> ModelTurn:
        if streamed:
            kwargs = {**kwargs, "stream": True, "stream_options": {"include_usage": True}}
        on_delta = listener() if streamed else None
        # request_timeout_s bounds the whole exchange, each socket operation of it (deadline.py);
        # httpx alone bounds each wait, so a server sending a byte a second held a call, and
        # its run's cancel and time budget, for as long as it liked. Streamed or not: a stream
        # that stalls longer than one read may wait is a timeout too, retried as any other.
        ends = time.monotonic() + self.whole
        with (
            mapped_errors(self._scrub, self.whole),
            deadline.deadline(self.whole),
            self.client.chat.completions.with_streaming_response.create(**kwargs) as answer,
        ):
            response = answer.http_response  # the raw body is ours to read, whatever its shape
            content_type = response.headers.get("content-type", "")
            events = (
                Assembler(self._scrub, on_delta)
                if streamed and "text/event-stream" in content_type.lower()
                else None
            )
            if events is not None and on_delta is not None:
                on_delta(Delta(DeltaKind.START, ""))  # a retry's pieces replace the failed try's
            body = bytearray()
            fed = 0

            def each() -> None:  # after every piece read (an openai of another shape: timed here)
                nonlocal fed
                if not self._hooked and time.monotonic() > ends:
                    raise ProviderError(_late(self.whole))
                if events is not None and len(body) > fed:
                    events.feed(bytes(body[fed:]))
                    fed = len(body)

            bodies.read_capped(response, MAX_ANSWER_BYTES + 1, body, each)
            if len(body) > MAX_ANSWER_BYTES:  # decoded: a small gzip bomb is a large body
                raise ProviderError(
                    Failure(
                        PERMANENT,
                        "invalid_response",
                        f"the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB: not read further",
                    )
                )
        if events is None and streamed and bytes(body[:64]).lstrip().startswith(b"data:"):
            events = Assembler(self._scrub, on_delta)  # an event stream under another type
            events.feed(bytes(body))
        if events is not None:
            data = events.finish()
            return completion_turn(data, json.dumps(data, ensure_ascii=False), self._scrub)
        turn = parse_completion(bytes(body), content_type, self._scrub)
        if streamed:  # asked to stream, it answered whole: the next calls do not ask again
            self._no_stream()
        return turn


def refuses_streaming(failure: Failure) -> bool:
    """An endpoint's refusal of `stream` / `stream_options` (not of the request as a whole):
    e.g. 400 "Unrecognized request argument supplied: stream_options", 422 "stream: extra
    fields not permitted", 501 "streaming is not supported"."""
    return (
        failure.status in (400, 415, 422, 501)
        and failure.reason != "context_length"
        and _STREAM_WORD.search(failure.message) is not None
    )


# `stream`, `stream_options`, "streaming", "Streaming": not "upstream" nor "downstream".
_STREAM_WORD = re.compile(r"(?<![a-z])stream(?:_options|ing|s)?\b", re.I)


class StreamMemo:
    """Endpoints (base URL and model) found not to stream, in a small JSON file shared by
    this user's runs (next to the default store): the next process asks them unstreamed at
    once. An entry is trusted for MEMO_DAYS (a server upgraded may stream by then); a file
    that cannot be read or written is no memo (the answer is the same either way, only one
    request more)."""

    MEMO_DAYS = 7

    def __init__(self, path: Path | None, key: str) -> None:
        self.path, self.key = path, key

    def _read(self) -> dict[str, float]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, int | float)}

    def refused(self) -> bool:
        since = self._read().get(self.key)
        return since is not None and time.time() - since < self.MEMO_DAYS * 86400

    def remember(self) -> None:
        if self.path is None:
            return
        found = self._read()
        found[self.key] = time.time()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(found, sort_keys=True), encoding="utf-8")
            tmp.replace(self.path)  # whole or not at all, whoever reads it at the same time
        except OSError:
            pass


def _late(seconds: float) -> Failure:
    return Failure(RETRYABLE, "timeout", f"no whole answer within {seconds:g}s (request_timeout_s)")


@contextmanager
def mapped_errors(scrub: Scrub, whole: float | None = None) -> Iterator[None]:
    """Re-raise every mapped exception as a `ProviderError`; let the rest (bugs) through.
    A timeout once `whole` seconds have passed says it was the whole request's."""
    started = time.monotonic()
    try:
        yield
    except Exception as exc:
        failure = map_exception(exc, scrub)
        if failure is None:
            raise
        if (
            failure.reason == "timeout"
            and whole is not None
            and time.monotonic() - started >= whole
        ):
            failure = _late(whole)
        raise ProviderError(failure) from exc


def map_exception(exc: BaseException, scrub: Scrub | None = None) -> Failure | None:
    """The failure for an exception of openai or its HTTP library; None when not one of them."""
    scrub = scrub or scrubber()
    for cls in type(exc).__mro__:
        handler = _TABLE.get(cls)
        if handler is not None:
            return handler(exc, scrub)
    return None


def is_classified(exc_type: type[BaseException]) -> bool:
    """True when `exc_type` has its own entry in the table (not only through a base class)."""
    return exc_type in _TABLE


# --- handlers -----------------------------------------------------------------------------


def _error_fields(exc: BaseException) -> tuple[str, str, str]:
    """(message, code, type) from an openai APIError body, falling back to str(exc)."""
    body = getattr(exc, "body", None)
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    if isinstance(body, dict) and isinstance(body.get("message"), str) and body["message"]:
        message = body["message"]
    elif isinstance(body, str) and body.strip() and body.strip()[:200] not in message:
        # Not JSON (text, or JSON cut at the error-body cap): its words still classify it
        # ("maximum context length" is what starts a compaction), their beginning shown.
        message = f"{message.rstrip('.')}: {body.strip()[:4096]}"
    return message, str(getattr(exc, "code", None) or ""), str(getattr(exc, "type", None) or "")


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


def _fixed(kind: FailureKind, reason: str) -> Handler:
    return lambda exc, scrub: Failure(kind, reason, scrub(_error_fields(exc)[0]))


def _from_transport(exc: BaseException, scrub: Scrub) -> Failure:
    cut = _cut_body(exc)
    if cut is not None:
        return Failure(RETRYABLE, "truncated_response", scrub(cut))
    is_timeout = "Timeout" in type(exc).__name__  # httpx(2).TimeoutException and subclasses
    return Failure(
        RETRYABLE, "timeout" if is_timeout else "connection", scrub(str(exc) or type(exc).__name__)
    )


def _from_decoding(exc: BaseException, scrub: Scrub) -> Failure:
    return Failure(
        RETRYABLE,
        "undecodable",
        scrub(f"the answer could not be decoded as its Content-Encoding says ({exc})"),
    )


def _from_connection(exc: BaseException, scrub: Scrub) -> Failure:
    cut = _cut_body(exc)
    if cut is not None:
        return Failure(RETRYABLE, "truncated_response", scrub(cut))
    causes = _chain(exc)[1:]
    for cause in causes:
        if "without sending a response" in str(cause).lower():  # reached, and it hung up
            return Failure(
                RETRYABLE,
                "disconnected",
                scrub(f"the endpoint closed the connection without answering ({cause})"),
            )
    # openai says only "Connection error.": the cause says which ("Connection refused"...).
    why = next((str(c) for c in reversed(causes) if str(c)), "")
    text = str(exc) or type(exc).__name__
    return Failure(
        RETRYABLE,
        "connection",
        scrub(f"{text.rstrip('.')} ({why})" if why and why not in text else text),
    )


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes: openai's APIConnectionError <- httpx <- httpcore <- h11."""
    found: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(found) < 8:
        found.append(seen)
        seen = seen.__cause__ or seen.__context__
    return found


# What h11/httpcore say when the headers came but the body stopped short of its length.
_CUT_WORDS = ("without sending complete message body", "incomplete chunked read", "incompleteread")


def _cut_body(exc: BaseException) -> str | None:
    """The cause's words when the connection closed in the middle of the response body:
    the endpoint was reached and answered, so this is not a connection problem."""
    for seen in _chain(exc):
        text = f"{type(seen).__name__}: {seen}"
        if any(word in text.lower() for word in _CUT_WORDS):
            return f"the connection closed in the middle of the response body ({seen})"
    return None


def _from_status(exc: BaseException, scrub: Scrub) -> Failure:
    status = getattr(exc, "status_code", None)
    message, code, kind = _error_fields(exc)
    if not isinstance(status, int):
        return Failure(PERMANENT, "http_error", scrub(message))
    retry_after = parse_retry_after(getattr(getattr(exc, "response", None), "headers", None))
    return failure_for_status(status, scrub(message), code, kind, retry_after)


def _from_api_error(exc: BaseException, scrub: Scrub) -> Failure:
    # A bare APIError comes from an error event inside a 200 response (streaming); its
    # type is the only hint whether the provider was overloaded or the request was bad.
    message, code, kind = _error_fields(exc)
    if {"server_error", "rate_limit_exceeded", "overloaded_error"} & {code, kind}:
        return Failure(RETRYABLE, "server_error", scrub(message))
    return Failure(PERMANENT, "api_error", scrub(message))


def _optional(*names: str) -> list[type[BaseException]]:
    """Exception classes that only some openai versions define (we support >= 1.55.3)."""
    found = (getattr(openai, name, None) for name in names)
    return [cls for cls in found if isinstance(cls, type) and issubclass(cls, BaseException)]


def _transport_errors() -> dict[type[BaseException], Handler]:
    # The HTTP library openai loaded (httpx2 for openai 3.x, httpx before; 3.x also accepts
    # an httpx client): we never import one just to map it.
    modules = [
        module
        for module in (sys.modules.get(name) for name in ("httpx2", "httpx"))
        if module is not None
    ]
    return {
        **{module.TransportError: _from_transport for module in modules},
        # A body its Content-Encoding cannot undo (read by us, so openai does not wrap it)
        **{module.DecodingError: _from_decoding for module in modules},
    }


# The one mapping table; a subclass entry overrides its base (see `map_exception`).
_TABLE: dict[type[BaseException], Handler] = {
    openai.OpenAIError: _fixed(PERMANENT, "client_error"),
    openai.APIError: _from_api_error,
    openai.APIConnectionError: _from_connection,
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
    **dict.fromkeys(_optional("OAuthError"), _from_status),
    **dict.fromkeys(_optional("SubjectTokenProviderError"), _fixed(PERMANENT, "auth")),
    **dict.fromkeys(
        _optional("WebSocketConnectionClosedError", "WebSocketQueueFullError"),
        _fixed(PERMANENT, "websocket"),
    ),
    **_transport_errors(),
}

MAPPED_TYPES: frozenset[type[BaseException]] = frozenset(_TABLE)
"""Every class with its own entry in the table."""
