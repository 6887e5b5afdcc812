"""The real CLI against a fake OpenAI-compatible server: retries, failures, cost-safe resume.

Every test runs `python -m durable_agent` as a user would (`--base-url`, `--model`,
`OPENAI_API_KEY`), reads what the server saw from its request log and what the harness
recorded with plain SQL. Retry waits come from a config file and are tiny.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from provider_support import KEY, MODEL, Endpoint, database_bytes, http_library, serve
from scale_helpers import wait_for

from durable_agent.config.settings import load_settings
from durable_agent.models.openai_chat import OpenAIChatModel
from durable_agent.wiring import build_model

SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "list_files", "arguments": {}}]},
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "done\n"}}]},
    {"content": "All done."},
]


@pytest.fixture
def api(
    cli: Callable[..., Any], env: dict[str, str], workspace: Path, tmp_path: Path
) -> Iterator[Endpoint]:
    with serve(cli, env, workspace, tmp_path, SCRIPT) as endpoint:
        yield endpoint


def model_step(sql: Callable[..., list[Any]], turn: int) -> tuple[str, int, str | None]:
    """(state, attempts, error) of the model step of `turn`."""
    rows = sql("SELECT state, attempts, error FROM steps WHERE kind = 'model' AND turn = ?", turn)
    assert len(rows) == 1, rows  # a retried or resumed call stays one step
    return rows[0]


def the_run(sql: Callable[..., list[Any]]) -> tuple[Any, ...]:
    rows = sql("SELECT id, status, stop_reason, error, step_count, tool_call_count FROM runs")
    assert len(rows) == 1, rows
    return rows[0]


# --- 1. retries happen and succeed ------------------------------------------------------------


def test_rate_limit_then_server_error_are_retried_and_counted(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.server.add_faults(
        [
            {
                "turn": 1,
                "attempt": 1,
                "status": 429,
                "headers": {"Retry-After": "0"},
                "body": {
                    "error": {
                        "message": "Rate limit reached",
                        "type": "requests",
                        "code": "rate_limit_exceeded",
                    }
                },
            },
            {"turn": 1, "attempt": 2, "status": 503},
        ]
    )
    result = api.start("--json")
    assert result.code == 0, result.stderr
    assert result.json()["status"] == "completed"
    assert api.turns() == [
        (0, 1, None),
        (1, 1, 429),
        (1, 2, 503),
        (1, 3, None),
        (2, 1, None),
        (3, 1, None),
    ]
    state, attempts, _ = model_step(sql, 1)
    assert (state, attempts) == ("completed", 3)
    assert model_step(sql, 0)[:2] == ("completed", 1)
    assert the_run(sql)[1:3] == ("completed", "finished")
    assert (api.workspace / "out.txt").read_text() == "done\n"


def test_dropped_connection_is_retried(api: Endpoint, sql: Callable[..., list[Any]]) -> None:
    api.server.add_faults([{"turn": 0, "attempt": 1, "drop": True}])
    result = api.start("--json")
    assert result.code == 0, result.stderr
    assert api.turns()[:2] == [(0, 1, None), (0, 2, None)]
    assert api.server.requests[0]["fault"] == {"turn": 0, "attempt": 1, "drop": True}
    assert model_step(sql, 0)[:2] == ("completed", 2)


# --- 7. a read timeout is a retryable timeout -------------------------------------------------


@pytest.mark.slow
def test_a_response_slower_than_the_read_timeout_is_retried(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.configure(request_timeout_s=1.5)  # far below the delay, far above a normal answer
    api.server.add_faults([{"turn": 0, "attempt": 1, "delay": 30.0}])
    began = time.monotonic()
    result = api.start("--json")
    elapsed = time.monotonic() - began
    assert result.code == 0, result.stderr
    assert api.turns()[:2] == [(0, 1, None), (0, 2, None)]
    assert model_step(sql, 0)[:2] == ("completed", 2)
    assert elapsed < 20, "the client waited for the slow response instead of timing out"


def test_timeouts_that_exhaust_the_policy_fail_as_timeouts(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.configure(request_timeout_s=0.3, retry_max_attempts=2)
    api.server.add_faults([{"turn": 0, "delay": 30.0, "times": 2}])
    result = api.start()
    assert result.code == 1, result.stderr
    _, status, reason, error, *_ = the_run(sql)
    assert (status, reason) == ("failed", "model_error"), result.stderr
    assert error.startswith("model call failed after 2 attempts: timeout: ")
    assert model_step(sql, 0)[:2] == ("failed", 2)


def test_both_timeouts_reach_the_client_and_the_sdk_does_not_retry(env: dict[str, str]) -> None:
    settings = load_settings(
        {
            "model": MODEL,
            "base_url": "http://127.0.0.1:9/v1",
            "request_timeout_s": 7.5,
            "connect_timeout_s": 1.5,
        },
        {**env, "OPENAI_API_KEY": KEY},
    )
    model = build_model(settings)
    assert isinstance(model, OpenAIChatModel)
    timeout = model.client.timeout
    assert isinstance(timeout, http_library().Timeout)
    assert (timeout.connect, timeout.read, timeout.write) == (1.5, 7.5, 7.5)
    assert model.client.max_retries == 0  # one retry layer: ours


def test_an_unreachable_endpoint_is_retried_then_fails_with_a_hint(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api.configure(retry_max_attempts=3)
    result = api.cli(
        "start",
        "task",
        "--base-url",
        f"http://127.0.0.1:{port}/v1",
        "--model",
        MODEL,
        extra_env=api.cli_env(),
    )
    assert result.code == 1, result.stderr
    error = the_run(sql)[3]
    assert error.startswith("model call failed after 3 attempts: connection: ")
    assert "check --base-url" in error
    assert model_step(sql, 0)[:2] == ("failed", 3)


# --- 2. permanent errors fail fast after one request ------------------------------------------


def _error(message: str, code: str | None, kind: str = "invalid_request_error") -> Any:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


PERMANENT = [
    pytest.param(
        401,
        _error(f"Incorrect API key provided: {KEY}.", "invalid_api_key"),
        "auth (401)",
        "OPENAI_API_KEY",
        id="401-auth",
    ),
    pytest.param(
        429,
        _error(
            "You exceeded your current quota, please check your plan.",
            "insufficient_quota",
            "insufficient_quota",
        ),
        "insufficient_quota (429)",
        "add credit",
        id="429-insufficient-quota",
    ),
    pytest.param(
        400,
        _error(
            "This model's maximum context length is 8192 tokens. However, your "
            "messages resulted in 9001 tokens.",
            "context_length_exceeded",
        ),
        "context_length (400)",
        "context",
        id="400-context-length",
    ),
    pytest.param(
        404,
        _error(
            "The model `fake-model` does not exist or you do not have access.", "model_not_found"
        ),
        "not_found (404)",
        "check --model",
        id="404-model",
    ),
]


@pytest.mark.parametrize(("status", "body", "reason", "hint"), PERMANENT)
def test_permanent_errors_fail_after_one_request_and_never_leak_the_key(
    api: Endpoint,
    sql: Callable[..., list[Any]],
    db_path: Path,
    status: int,
    body: Any,
    reason: str,
    hint: str,
) -> None:
    api.server.add_faults([{"turn": 0, "status": status, "body": body, "times": 99}])
    result = api.start()
    assert result.code == 1, result.stderr
    assert len(api.server.requests) == 1  # no retry
    assert api.server.requests[0]["headers"]["authorization"] == f"Bearer {KEY}"  # it was sent
    _, run_status, stop_reason, error, step_count, _ = the_run(sql)
    assert (run_status, stop_reason, step_count) == ("failed", "model_error", 0)
    provider_message = body["error"]["message"].replace(KEY, "[REDACTED]")
    assert error.startswith(f"model call failed after 1 attempt: {reason}: {provider_message}")
    assert hint in error and ".. " not in error
    assert provider_message in result.stderr and hint in result.stderr
    assert model_step(sql, 0)[:2] == ("failed", 1)
    for where, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        assert KEY not in text, f"the API key leaked to {where}"
    assert KEY.encode() not in database_bytes(db_path), "the API key reached the database"


def test_no_api_key_for_a_hosted_model_is_a_usage_error(cli: Callable[..., Any]) -> None:
    result = cli("start", "task", "--model", "gpt-4.1-mini")
    assert result.code == 2
    assert "OPENAI_API_KEY" in result.stderr


# --- 3. retries exhausted: failed, then resumable from that step ------------------------------


@pytest.mark.slow
def test_exhausted_retries_fail_then_resume_continues_from_that_step(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.configure(retry_max_attempts=3)
    api.server.add_faults([{"turn": 2, "status": 502, "times": 3}])
    first = api.start()
    assert first.code == 1, first.stderr
    run_id, status, reason, error, step_count, tool_calls = the_run(sql)
    assert (status, reason, step_count, tool_calls) == ("failed", "model_error", 2, 2)
    assert error.startswith("model call failed after 3 attempts: server_error (502): ")
    assert "resume" in error  # the hint says what to do next
    assert model_step(sql, 2)[:2] == ("failed", 3)

    second = api.resume(run_id, "--json")  # the server is healthy now: the faults are used up
    assert second.code == 0, second.stderr
    assert second.json()["status"] == "completed"
    assert api.answered() == {0: 1, 1: 1, 2: 1, 3: 1}  # each turn answered exactly once
    assert [t for t, _, _ in api.turns()] == [0, 1, 2, 2, 2, 2, 3]  # earlier turns not re-asked
    assert model_step(sql, 2)[:2] == ("completed", 4)  # the failed tries are counted too
    assert the_run(sql)[1:6] == ("completed", "finished", None, 4, 3)


# --- 4. cost-safe resume after kill -9 during a model call ------------------------------------


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_kill_during_a_slow_model_call_then_resume_requests_only_that_turn_again(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    slow_turn = 2
    api.server.add_faults([{"turn": slow_turn, "attempt": 1, "delay": 60.0}])
    proc = api.popen("--run-id", "killed-run", "--quiet")
    try:
        wait_for(
            lambda: any(r["turn"] == slow_turn for r in api.server.requests),
            what=f"the request of turn {slow_turn}",
        )
        # The intent row is committed before the request is sent: the step is in flight.
        assert model_step(sql, slow_turn)[:2] == ("started", 1)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.communicate()  # close the pipes

    result = api.resume("killed-run", "--json")
    assert result.code == 0, result.stderr
    assert result.json()["status"] == "completed"
    turns = [t for t, _, _ in api.turns()]
    assert turns == [0, 1, 2, 2, 3]  # earlier turns once, the killed turn twice
    killed, again = (r for r in api.server.requests if r["turn"] == slow_turn)
    assert killed["body"]["messages"] == again["body"]["messages"]  # the very same request
    assert model_step(sql, slow_turn)[:2] == ("completed", 2)
    _, status, reason, _, step_count, tool_calls = the_run(sql)
    assert (status, reason, step_count, tool_calls) == ("completed", "finished", len(SCRIPT), 3)
    assert sql("SELECT count(*) FROM steps WHERE kind = 'tool' AND tool_name = 'write_file'") == [
        (1,)
    ]
    assert (api.workspace / "out.txt").read_text() == "done\n"
