"""Model failure classification and the retry policy, against the real openai client.

The exceptions under test are real ones: `OpenAIChatModel` (the real openai client inside)
talks HTTP to tests/fake_openai.py, which injects the faults, and maps them at its
boundary. Sleeping is injected, so no test waits for a backoff.
"""

from __future__ import annotations

import email.utils
import random
import socket
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import openai
import pytest

# tests/ is not a package: pytest puts it on sys.path (the default "prepend" import mode).
from fake_openai import FakeOpenAI, spawn_fake_openai
from provider_support import http_library

from durable_agent.config.settings import load_settings
from durable_agent.messages import Message
from durable_agent.models.failures import ProviderError
from durable_agent.models.openai_chat import (
    MAPPED_TYPES,
    OpenAIChatModel,
    is_classified,
    map_exception,
)
from durable_agent.models.retry import (
    Failure,
    FailureKind,
    ModelCallError,
    RetryPolicy,
    call_with_retries,
    classify,
)

KEY = "sk-test-0123456789abcdef"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
HI = [Message("user", "hi")]
RETRYABLE, PERMANENT = FailureKind.RETRYABLE, FailureKind.PERMANENT


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(script=[{"content": "ok"}]) as fake:
        yield fake


def make_client(server: FakeOpenAI, api_key: str = KEY, timeout: float = 5.0) -> openai.OpenAI:
    # max_retries=0: the policy under test must be the only retry layer.
    return openai.OpenAI(base_url=server.url, api_key=api_key, max_retries=0, timeout=timeout)


def make_model(server: FakeOpenAI, api_key: str = KEY, timeout: float = 5.0) -> OpenAIChatModel:
    return OpenAIChatModel(
        "m", api_key=api_key, base_url=server.url, read_timeout=timeout, connect_timeout=timeout
    )


def chat(model: OpenAIChatModel) -> Callable[[], str | None]:
    return lambda: model.complete(HI, [], 0).content


def failure_of(server: FakeOpenAI, fault: dict[str, Any], timeout: float = 5.0) -> Failure:
    server.add_faults([fault])
    with pytest.raises(ProviderError) as caught:
        chat(make_model(server, timeout=timeout))()
    # Mapped at the boundary: openai's errors, or its HTTP library's while the body is read.
    http = tuple(
        m.HTTPError for m in (sys.modules.get("httpx2"), sys.modules.get("httpx")) if m is not None
    )
    assert isinstance(caught.value.__cause__, (openai.OpenAIError, *http))
    return caught.value.failure


# --- (a) the table is exhaustive -----------------------------------------------------------


def exported_openai_errors() -> list[type[BaseException]]:
    """Every public exception class under OpenAIError that the openai package exports."""
    found: set[type[BaseException]] = set()
    stack: list[type[BaseException]] = [openai.OpenAIError]
    while stack:
        cls = stack.pop()
        if cls not in found:
            found.add(cls)
            stack.extend(cls.__subclasses__())
    return sorted(
        (
            cls
            for cls in found
            if not cls.__name__.startswith("_") and getattr(openai, cls.__name__, None) is cls
        ),
        key=lambda cls: cls.__name__,
    )


def test_every_exported_openai_error_has_its_own_entry() -> None:
    classes = exported_openai_errors()
    # Guard the walk itself: an empty walk would make the check below vacuous.
    assert {openai.APIError, openai.RateLimitError, openai.APITimeoutError} <= set(classes)
    unmapped = [cls.__name__ for cls in classes if not is_classified(cls)]
    assert unmapped == [], f"openai exception classes missing from openai_chat._TABLE: {unmapped}"
    assert set(classes) <= MAPPED_TYPES


@pytest.mark.parametrize(
    ("exc", "kind", "reason"),
    [
        (ConnectionResetError("reset by peer"), RETRYABLE, "connection"),
        (TimeoutError("timed out"), RETRYABLE, "timeout"),
        (OSError("network is unreachable"), RETRYABLE, "os_error"),
        (ValueError("bug"), PERMANENT, "unexpected"),
        (KeyboardInterrupt(), PERMANENT, "unexpected"),
    ],
)
def test_exceptions_outside_http_responses(
    exc: BaseException, kind: FailureKind, reason: str
) -> None:
    failure = classify(exc)
    assert (failure.kind, failure.reason, failure.status) == (kind, reason, None)
    assert map_exception(exc) is None  # not openai's: the boundary lets it through


@pytest.mark.parametrize(
    ("make", "kind", "reason"),
    [
        (lambda http: http.ConnectError("refused"), RETRYABLE, "connection"),
        (lambda http: http.ReadTimeout("slow"), RETRYABLE, "timeout"),
        (
            lambda http: openai.OpenAIError("The api_key client option must be set"),
            PERMANENT,
            "client_error",
        ),
    ],
)
def test_client_exceptions_are_mapped_at_the_boundary(
    make: Callable[[Any], BaseException], kind: FailureKind, reason: str
) -> None:
    # The HTTP library is whichever the installed openai uses (httpx2 or httpx).
    failure = map_exception(make(http_library()))
    assert failure is not None
    assert (failure.kind, failure.reason, failure.status) == (kind, reason, None)
    assert classify(ProviderError(failure)) is failure


def test_policy_defaults_are_the_settings_defaults(tmp_path: Any) -> None:
    settings = load_settings({"db": f"sqlite:///{tmp_path / 'x.db'}"}, {})
    assert RetryPolicy() == RetryPolicy.from_settings(settings)
    assert RetryPolicy().max_total_seconds == settings.retry_max_seconds
    custom = load_settings(
        {"db": "sqlite:///unused.db", "retry_max_seconds": 7.0, "retry_max_attempts": 2}, {}
    )
    assert (
        RetryPolicy.from_settings(custom).max_total_seconds,
        RetryPolicy.from_settings(custom).max_attempts,
    ) == (7.0, 2)


# --- (b) SPEC section 6 examples, as raised by the real client ------------------------------


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_server_errors_are_retryable(server: FakeOpenAI, status: int) -> None:
    failure = failure_of(server, {"status": status})
    assert (failure.kind, failure.reason, failure.status) == (RETRYABLE, "server_error", status)
    assert failure.message == f"fake error {status}"  # the provider's message, not a repr


@pytest.mark.parametrize(("status", "reason"), [(408, "timeout"), (409, "conflict")])
def test_other_retryable_statuses(server: FakeOpenAI, status: int, reason: str) -> None:
    failure = failure_of(server, {"status": status})
    assert (failure.kind, failure.reason, failure.status) == (RETRYABLE, reason, status)


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [({"Retry-After": "2"}, 2.0), ({"retry-after-ms": "1500"}, 1.5), ({}, None)],
)
def test_rate_limit_is_retryable_with_retry_after(
    server: FakeOpenAI, headers: dict[str, str], seconds: float | None
) -> None:
    body = {
        "error": {
            "message": "Rate limit reached",
            "type": "requests",
            "code": "rate_limit_exceeded",
        }
    }
    failure = failure_of(server, {"status": 429, "headers": headers, "body": body})
    assert (failure.kind, failure.reason, failure.status) == (RETRYABLE, "rate_limit", 429)
    assert failure.retry_after == seconds
    assert failure.message == "Rate limit reached"


def test_retry_after_as_http_date(server: FakeOpenAI) -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    header = email.utils.format_datetime(when, usegmt=True)
    failure = failure_of(server, {"status": 429, "headers": {"Retry-After": header}})
    assert failure.retry_after is not None and 25 < failure.retry_after <= 30


def test_dropped_connection_is_retryable(server: FakeOpenAI) -> None:
    # The endpoint was reached and hung up without a response: not "could not reach" (issue 17).
    failure = failure_of(server, {"drop": True})
    assert (failure.kind, failure.reason, failure.status) == (RETRYABLE, "disconnected", None)
    assert "closed the connection without answering" in failure.message
    assert "could not reach" not in failure.describe() and "was reached" in failure.describe()


def test_an_unreachable_endpoint_says_why() -> None:
    # openai's own words are only "Connection error."; the cause names what happened.
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", max_retries=0)
    with pytest.raises(openai.APIConnectionError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    failure = map_exception(caught.value)
    assert failure is not None and failure.reason == "connection"
    assert failure.message.startswith("Connection error (") and "refused" in failure.message.lower()


def test_a_body_cut_mid_stream_says_so_not_check_base_url(server: FakeOpenAI) -> None:
    # The headers came, with a Content-Length the body never reached: the endpoint was
    # reached, so "could not reach the endpoint: check --base-url" would send the user astray.
    failure = failure_of(server, {"short_body": 40})
    assert (failure.kind, failure.reason) == (RETRYABLE, "truncated_response")
    assert "cut off" in failure.describe() and "could not reach" not in failure.describe()


def test_timeout_is_retryable(server: FakeOpenAI) -> None:
    # The server answers after 2 s (it is woken early on stop); the client gives up at 0.2 s.
    failure = failure_of(server, {"delay": 2.0}, timeout=0.2)
    assert (failure.kind, failure.reason) == (RETRYABLE, "timeout")


@pytest.mark.parametrize(
    "fault",
    [
        {"trickle": 0.05},  # the answer, a byte every 0.05 s: ~15 s in all
        {"status": 500, "trickle": 0.05},  # an error body, read by openai itself
        {"stall": "headers", "every": 0.05},  # headers that never end
        {"stall": "hints", "every": 0.05},  # 103 Early Hints forever (skipped by the HTTP library)
        {"stall": "deflate", "every": 0.05},  # empty deflate blocks: bytes that decode to nothing
    ],
    ids=["body", "error-body", "headers", "early-hints", "empty-deflate"],
)
@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_a_server_that_keeps_sending_cannot_hold_a_call_past_request_timeout_s(
    server: FakeOpenAI, fault: dict[str, Any]
) -> None:
    # Each read gets bytes in time, so the read timeout alone let these calls run for as
    # long as the server liked (the run's cancel and time budget waiting on them).
    started = time.monotonic()
    failure = failure_of(server, fault, timeout=1.0)
    took = time.monotonic() - started
    assert (failure.kind, failure.reason) == (RETRYABLE, "timeout")
    assert "no whole answer within 1s (request_timeout_s)" in failure.describe()
    assert took < 5, took


@pytest.mark.slow  # over 2 s on 2 cores
def test_through_a_proxy_the_deadline_still_holds(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With HTTP_PROXY set, httpx sends everything through the proxy's own transport and pool:
    # only the default pool was bounded, so a trickled answer ran its 15 s, stalled headers
    # for ever.
    from forward_proxy import ForwardProxy

    proxy = ForwardProxy()
    try:
        for name in (
            "NO_PROXY",
            "no_proxy",
            "ALL_PROXY",
            "all_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "http_proxy",
        ):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        model = make_model(server, timeout=1.0)
        assert (
            chat(model)() and proxy.lines and b"/chat/completions" in proxy.lines[0]
        )  # it goes by the proxy
        for fault in ({"trickle": 0.05}, {"stall": "headers", "every": 0.05}):
            server.add_faults([fault])
            started = time.monotonic()
            with pytest.raises(ProviderError) as caught:
                chat(model)()
            assert caught.value.failure.reason == "timeout" and time.monotonic() - started < 5, (
                fault
            )
    finally:
        proxy.close()


def test_a_keep_alive_connection_obeys_the_next_calls_deadline(server: FakeOpenAI) -> None:
    # The deadline belongs to the call, not to the connection: one kept alive from an
    # answered call is bounded by the next call's request_timeout_s, and after a timeout
    # the same model answers again.
    model = make_model(server, timeout=1.0)
    first = chat(model)()
    assert first
    server.add_faults([{"trickle": 0.05}])
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        chat(model)()
    assert caught.value.failure.reason == "timeout" and time.monotonic() - started < 5
    assert chat(model)() == first


def test_an_answer_larger_than_the_cap_is_not_read_further(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A few KiB of gzip on the wire, many MiB decoded: it was read whole into memory.
    import durable_agent.models.openai_chat as openai_chat

    monkeypatch.setattr(openai_chat, "MAX_ANSWER_BYTES", 1 << 20)
    server.add_faults([{"gzip_bomb": 16}])
    with pytest.raises(ProviderError) as caught:
        chat(make_model(server))()
    failure = caught.value.failure
    assert (failure.kind, failure.reason) == (PERMANENT, "invalid_response")
    assert "larger than 1 MiB" in failure.message


def test_an_error_body_is_read_in_pieces_and_capped(server: FakeOpenAI) -> None:
    # openai reads an error's body itself, whole: 256 MiB of decoded spaces behind a 500 were
    # all in memory at once (a 512 MiB one peaked at 1.6 GB).
    import tracemalloc

    server.add_faults([{"gzip_bomb": 256, "status": 500}])
    tracemalloc.start()
    try:
        with pytest.raises(ProviderError) as caught:
            # A test of memory, not of time: traced, the 256 MiB take seconds on a busy machine.
            chat(make_model(server, timeout=120))()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (caught.value.failure.reason, caught.value.failure.status) == ("server_error", 500)
    assert peak < 16 << 20, peak


@pytest.mark.parametrize(
    ("status", "reason"), [(401, "auth"), (429, "rate_limit"), (500, "server_error")]
)
def test_an_error_whose_body_is_cut_short_keeps_its_status(
    server: FakeOpenAI, status: int, reason: str
) -> None:
    # It became a retryable `truncated_response`: a 401 was retried, a 429's Retry-After lost.
    failure = failure_of(
        server, {"status": status, "short_body": 12, "headers": {"Retry-After": "7"}}
    )
    assert (failure.reason, failure.status) == (reason, status)
    if status == 429:
        assert failure.retry_after == 7


@pytest.mark.parametrize(
    ("status", "reason"), [(401, "auth"), (429, "rate_limit"), (500, "server_error")]
)
def test_an_error_whose_body_cannot_be_decoded_keeps_its_status(
    server: FakeOpenAI, status: int, reason: str
) -> None:
    # It became a retryable `undecodable`: a 401 was retried, a 429's Retry-After lost.
    failure = failure_of(
        server, {"status": status, "headers": {"Content-Encoding": "gzip", "Retry-After": "7"}}
    )
    assert (failure.reason, failure.status) == (reason, status)
    if status == 429:
        assert failure.retry_after == 7


def test_a_body_its_content_encoding_cannot_undo_is_retryable_not_a_bug(server: FakeOpenAI) -> None:
    # Read by us, not inside openai, so openai does not wrap the decoding error.
    failure = failure_of(server, {"headers": {"Content-Encoding": "gzip"}})
    assert (failure.kind, failure.reason) == (RETRYABLE, "undecodable")
    assert "Content-Encoding" in failure.message and "may be a bug" not in failure.describe()


def _error(message: str, code: str | None = None, kind: str = "invalid_request_error") -> Any:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


_TOO_LONG = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."


@pytest.mark.parametrize(
    "fault",
    [
        {
            "body": _error(_TOO_LONG, "context_length_exceeded"),
            "encode": "raw-deflate",
        },  # decoded like httpx does
        {"body": _error(_TOO_LONG + " " + "x" * (2 << 20))},  # JSON cut at the error-body cap
        {"body": _TOO_LONG, "content_type": "text/plain"},  # not JSON at all
    ],
    ids=["raw-deflate", "over-the-cap", "plain-text"],
)
def test_an_error_body_says_what_it_says_however_it_comes(
    server: FakeOpenAI, fault: dict[str, Any]
) -> None:
    # "maximum context length" is what starts a compaction: each of these was a bad_request.
    failure = failure_of(server, {"status": 400, **fault})
    assert (failure.kind, failure.reason) == (PERMANENT, "context_length"), failure.message[:300]


@pytest.mark.parametrize(
    ("status", "body", "reason", "hint_mentions"),
    [
        (401, _error("Incorrect API key provided", "invalid_api_key"), "auth", "OPENAI_API_KEY"),
        (403, _error("You are not allowed to use this model"), "permission", "--model"),
        (404, _error("The model `nope` does not exist", "model_not_found"), "not_found", "--model"),
        (422, _error("Unprocessable entity"), "unprocessable", "message"),
        (400, _error("Invalid value for 'tool_choice'"), "bad_request", "message"),
        (
            400,
            _error(
                "This model's maximum context length is 8192 tokens. However, your messages "
                "resulted in 9000 tokens.",
                "context_length_exceeded",
            ),
            "context_length",
            "context",
        ),
        # Some compatible servers say it only in words, without the code.
        (
            400,
            _error("prompt is too long: 9000 tokens > 8192 maximum"),
            "context_length",
            "context",
        ),
        (
            429,
            _error("You exceeded your current quota", "insufficient_quota", "insufficient_quota"),
            "insufficient_quota",
            "quota",
        ),
    ],
)
def test_permanent_failures(
    server: FakeOpenAI, status: int, body: Any, reason: str, hint_mentions: str
) -> None:
    failure = failure_of(server, {"status": status, "body": body})
    assert (failure.kind, failure.reason, failure.status) == (PERMANENT, reason, status)
    assert failure.message == body["error"]["message"]
    assert hint_mentions in failure.hint


# --- (c) call_with_retries ------------------------------------------------------------------


class FakeSleep:
    """Records the waits instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def test_retries_until_success_and_counts_attempts(server: FakeOpenAI) -> None:
    server.add_faults([{"status": 503}, {"status": 503}])
    sleep, seen = FakeSleep(), []
    result, attempts = call_with_retries(
        chat(make_model(server)),
        RetryPolicy(),
        sleep=sleep,
        on_attempt=lambda n, failure: seen.append((n, failure and failure.reason)),
    )
    assert (result, attempts) == ("ok", 3)
    assert len(server.requests) == 3
    assert len(sleep.delays) == 2
    assert seen == [(1, "server_error"), (2, "server_error"), (3, None)]


@pytest.mark.parametrize(("header", "expected"), [("7", 7.0), ("500", 60.0)])
def test_retry_after_is_honoured_up_to_the_cap(
    server: FakeOpenAI, header: str, expected: float
) -> None:
    server.add_faults([{"status": 429, "headers": {"Retry-After": header}}])
    sleep = FakeSleep()
    policy = RetryPolicy(max_retry_after=60.0, max_total_seconds=120.0)
    result, attempts = call_with_retries(chat(make_model(server)), policy, sleep=sleep)
    assert (result, attempts) == ("ok", 2)
    assert sleep.delays == [expected]


def test_gives_up_after_max_attempts(server: FakeOpenAI) -> None:
    server.add_faults([{"status": 500, "times": 10}])
    sleep = FakeSleep()
    with pytest.raises(ModelCallError) as caught:
        call_with_retries(chat(make_model(server)), RetryPolicy(max_attempts=3), sleep=sleep)
    err = caught.value
    assert (err.attempts, err.failure.reason, err.failure.retryable) == (3, "server_error", True)
    assert len(server.requests) == 3
    assert len(sleep.delays) == 2
    assert str(err).startswith("model call failed after 3 attempts: server_error (500): ")
    assert isinstance(err.__cause__, ProviderError)
    assert isinstance(err.__cause__.__cause__, openai.InternalServerError)


def test_gives_up_before_a_wait_that_passes_the_total_time(server: FakeOpenAI) -> None:
    server.add_faults([{"status": 429, "headers": {"Retry-After": "4"}, "times": 10}])
    sleep = FakeSleep()
    policy = RetryPolicy(max_attempts=10, max_total_seconds=10.0)
    with pytest.raises(ModelCallError) as caught:
        call_with_retries(chat(make_model(server)), policy, sleep=sleep)
    # waits 4 and 4; a third wait would end at 12 s > 10 s, so it stops after 3 attempts
    assert sleep.delays == [4.0, 4.0]
    assert caught.value.attempts == 3 == len(server.requests)


def always_timing_out() -> None:
    raise TimeoutError("timed out")


def test_backoff_grows_exponentially_up_to_max_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pin the jitter to the top of its window to see the window itself.
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    sleep = FakeSleep()
    policy = RetryPolicy(max_attempts=6, initial_wait=0.5, max_wait=3.0)
    with pytest.raises(ModelCallError):
        call_with_retries(always_timing_out, policy, sleep=sleep)
    assert sleep.delays == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_backoff_is_jittered_within_its_window() -> None:
    sleep = FakeSleep()
    policy = RetryPolicy(max_attempts=12, initial_wait=1.0, max_wait=8.0, max_total_seconds=1e6)
    with pytest.raises(ModelCallError) as caught:
        call_with_retries(always_timing_out, policy, sleep=sleep)
    assert caught.value.attempts == 12
    windows = [min(1.0 * 2**i, 8.0) for i in range(11)]
    assert all(0 <= d <= w for d, w in zip(sleep.delays, windows, strict=True)), sleep.delays
    assert len(set(sleep.delays)) > 1  # random, not a fixed schedule


def test_permanent_failure_is_not_retried(server: FakeOpenAI) -> None:
    server.add_faults([{"status": 401, "body": _error("Incorrect API key", "invalid_api_key")}])
    sleep, seen = FakeSleep(), []
    with pytest.raises(ModelCallError) as caught:
        call_with_retries(
            chat(make_model(server)),
            RetryPolicy(),
            sleep=sleep,
            on_attempt=lambda n, failure: seen.append(n),
        )
    assert len(server.requests) == 1
    assert (caught.value.attempts, caught.value.failure.retryable, sleep.delays, seen) == (
        1,
        False,
        [],
        [1],
    )
    assert str(caught.value) == (
        "model call failed after 1 attempt: auth (401): Incorrect API key. "
        + caught.value.failure.hint
    )


@pytest.mark.parametrize("key", [KEY, "local-deployment-secret-987654"])
def test_the_api_key_never_appears_in_the_error(server: FakeOpenAI, key: str) -> None:
    # A provider that echoes the whole key back, as some compatible servers do.
    echo = _error(f"Incorrect API key provided: {key}", "invalid_api_key")
    server.add_faults([{"status": 401, "body": echo}])
    with pytest.raises(ModelCallError) as caught:
        call_with_retries(chat(make_model(server, api_key=key)), RetryPolicy(), sleep=FakeSleep())
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {key}"  # it was sent
    failure = caught.value.failure
    for text in (str(caught.value), failure.message, failure.hint, repr(failure)):
        assert key not in text
    assert "[REDACTED]" in failure.message


def test_key_shaped_strings_are_redacted_even_when_not_the_one_sent(server: FakeOpenAI) -> None:
    other = "sk-proj-Abc123Def456Ghi789"
    failure = failure_of(server, {"status": 401, "body": _error(f"Key {other} was revoked")})
    assert other not in failure.message
    assert failure.message == "Key [REDACTED] was revoked"


def test_keyboard_interrupt_is_not_wrapped() -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        call_with_retries(interrupted, RetryPolicy(), sleep=FakeSleep())


# --- the fake server itself -----------------------------------------------------------------


def test_fake_turn_comes_from_the_request_and_faults_key_on_turn_and_attempt() -> None:
    script: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "a.txt"}},
                {"name": "run_command", "arguments": "{not json"},
            ]
        },
        {"content": "done"},
    ]
    with FakeOpenAI(script, [{"turn": 1, "attempt": 1, "status": 503}]) as fake:
        client = make_client(fake)
        first = client.chat.completions.create(model="m", messages=MESSAGES)
        calls = first.choices[0].message.tool_calls or []
        assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
            ("call_0_0", "read_file", '{"path": "a.txt"}'),
            ("call_0_1", "run_command", "{not json"),
        ]
        assert first.choices[0].finish_reason == "tool_calls"
        assert first.usage is not None and first.usage.completion_tokens == 5

        history: list[Any] = [*MESSAGES, first.choices[0].message.model_dump(exclude_none=True)]
        history += [{"role": "tool", "tool_call_id": c.id, "content": "x"} for c in calls]
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=history)
        second = client.chat.completions.create(model="m", messages=history)
        assert second.choices[0].message.content == "done"
        # Replaying turn 0 (a resumed client) gets turn 0 again; past the end it is exhausted.
        again = client.chat.completions.create(model="m", messages=MESSAGES)
        assert again.choices[0].message.tool_calls is not None
        beyond = history + [
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "?"},
        ]
        exhausted = client.chat.completions.create(model="m", messages=beyond)
        assert exhausted.choices[0].message.content == "script exhausted"
    assert [(r["turn"], r["attempt"]) for r in fake.requests] == [
        (0, 1),
        (1, 1),
        (1, 2),
        (0, 2),
        (2, 1),
    ]


def test_fake_runs_as_a_separate_process(tmp_path: Any) -> None:
    with spawn_fake_openai(tmp_path, [{"content": "from the child"}], [{"status": 502}]) as fake:
        model = OpenAIChatModel(
            "m", api_key=KEY, base_url=fake.url, read_timeout=5.0, connect_timeout=5.0
        )
        result, attempts = call_with_retries(chat(model), RetryPolicy(), sleep=FakeSleep())
        assert (result, attempts) == ("from the child", 2)
        log = fake.requests()
    assert [(r["attempt"], (r["fault"] or {}).get("status")) for r in log] == [(1, 502), (2, None)]
    assert fake.proc.returncode is not None  # stopped on exit


def test_a_socks_proxy_without_its_package_is_one_line_of_configuration(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ALL_PROXY=socks5://... without socksio: an ImportError traceback, exit 1.
    import importlib.util

    from durable_agent.errors import ConfigError

    if importlib.util.find_spec("socksio") is not None:
        pytest.skip("socksio is installed here: the proxy would be used")
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:9")
    with pytest.raises(ConfigError, match="cannot use the proxy the environment names.*socksio"):
        make_model(server)


@pytest.mark.parametrize("timeout", [0.2500001, 0.25001, 0.2501])
def test_a_read_sliced_for_cancel_that_runs_out_is_a_timeout_not_a_connection_error(
    timeout: float,
) -> None:
    # Read in slices (models/deadline.py `stopping`), a wait that ran out inside the loop's
    # own overhead asked the socket for a read with timeout 0: non-blocking, which fails as
    # a read error (classified "connection"), not as the timeout it is.
    import threading

    from durable_agent.models import deadline

    class Inner:  # a socket read as httpcore makes it: timeout 0 is a non-blocking read
        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            if timeout == 0:
                raise BlockingIOError(11, "Resource temporarily unavailable")
            threading.Event().wait(timeout)
            raise TimeoutError("timed out")

    stream = deadline._Stream(Inner(), TimeoutError)
    with deadline.stopping(threading.Event()), pytest.raises(TimeoutError):
        stream.read(10, timeout)


def test_a_retry_the_process_dies_in_still_counts_as_a_try(
    tmp_path: Any, env: dict[str, str], workspace: Any, sql: Any
) -> None:
    # A 503, then a retry the process was killed in: the server saw 3 requests in all, the
    # step said 2 (a try was recorded only once it had failed). SPEC §5: every try counts.
    import subprocess
    import sys

    from scale_helpers import wait_for
    from side_effects_support import run_cli

    (tmp_path / "config.toml").write_text("retry_initial_wait_s = 0.01\nretry_max_wait_s = 0.01\n")
    e = {**env, "OPENAI_API_KEY": "sk-test", "DURABLE_AGENT_CONFIG": str(tmp_path / "config.toml")}
    with spawn_fake_openai(
        tmp_path / "fake", [{"content": "done"}], [{"status": 503}, {"delay": 60}]
    ) as fake:
        args = ["start", "t", "--model", "m", "--base-url", fake.url, "--run-id", "a", "--quiet"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "durable_agent", *args],
            cwd=workspace,
            env=e,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: len(fake.requests()) >= 2, 30, "the retry to reach the server")
        finally:
            proc.kill()
            proc.wait()
        assert sql("SELECT attempts FROM steps WHERE kind = 'model'") == [
            (2,)
        ]  # the one it died in, too
        done = run_cli(e, workspace, "resume", "a", "--quiet")
        assert done.code == 0, done.stderr
        assert len(fake.requests()) == 3
    assert sql("SELECT attempts FROM steps WHERE kind = 'model'") == [(3,)]


def test_a_store_that_fails_while_a_retry_is_recorded_ends_the_session_as_the_stores_fault(
    tmp_path: Any, env: dict[str, str], cli_inproc: Any, sql: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Recording a retry's try is the store's work: its failure is exit 7 (resumable), never
    # a model error that fails the run.
    from durable_agent.errors import StoreUnavailable
    from durable_agent.store.step import Step

    (tmp_path / "config.toml").write_text("retry_initial_wait_s = 0.01\nretry_max_wait_s = 0.01\n")
    env.update(
        {"DURABLE_AGENT_CONFIG": str(tmp_path / "config.toml"), "OPENAI_API_KEY": "sk-test"}
    )  # (cli_inproc's)
    with FakeOpenAI(script=[{"content": "ok"}], faults=[{"status": 503}]) as fake:
        real = Step.set_attempts

        def store_gone(self: Step, attempts: int, error: str | None) -> None:
            if attempts == 2:  # the retry, before it goes out
                raise StoreUnavailable("disk I/O error", "r")
            real(self, attempts, error)

        monkeypatch.setattr(Step, "set_attempts", store_gone)
        r = cli_inproc(
            "start", "t", "--model", "m", "--base-url", fake.url, "--run-id", "r", "--quiet"
        )
        assert r.code == 7 and "the store is unavailable: disk I/O error" in r.stderr, r.stderr
        assert len(fake.requests) == 1  # the retry was not sent unrecorded
        monkeypatch.setattr(Step, "set_attempts", real)
    assert sql("SELECT status FROM runs") != [("failed",)]
