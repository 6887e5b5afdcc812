"""Odd answers from OpenAI-compatible servers, end to end (issue 10, items 3 and 4).

The real CLI and the real openai client against tests/fake_openai.py, which sends each
shape seen in the wild. Two families:

- an answer that is there but partly unusable (arguments as an object, a tool call with
  no name or `function: null`): paid for, so kept. The run goes on with an error
  observation, the raw answer stays in the model step's output, a resume never buys it
  again, and `show` / `export` read it;
- a response with no answer (HTTP 200 with an error body, `choices: []`, HTML, an SSE
  stream, a body cut off without Content-Length): a classified failure with the
  provider's own words and a hint, retried where transient, failed fast otherwise, and
  resumable. Never "unexpected ... (this may be a bug)".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from provider_support import Endpoint, serve

from durable_agent.messages import UNNAMED_TOOL

SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "list_files", "arguments": {}}]},
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
    {"content": "All done."},
]
BUG = "may be a bug"


@pytest.fixture
def api(
    cli: Callable[..., Any], env: dict[str, str], workspace: Path, tmp_path: Path
) -> Iterator[Endpoint]:
    with serve(cli, env, workspace, tmp_path, SCRIPT) as endpoint:
        yield endpoint


def the_run(sql: Callable[..., list[Any]]) -> tuple[Any, ...]:
    rows = sql("SELECT id, status, stop_reason, error, step_count FROM runs")
    assert len(rows) == 1, rows
    return rows[0]


def readable(api: Endpoint, run_id: str) -> list[dict[str, Any]]:
    """`show`, `show --json`, `list` and `export` all work on the run; returns the export."""
    for args in (("show", run_id), ("show", run_id, "--json"), ("list",)):
        result = api.cli(*args)
        assert result.code == 0, (args, result.stderr)
        assert "Traceback" not in result.stderr
    exported = api.cli("export", run_id)
    assert exported.code == 0, exported.stderr
    return [json.loads(line) for line in exported.stdout.splitlines()]


# --- answers that are partly unusable: kept, observed, never bought twice ------------------------


def test_arguments_sent_as_an_object_are_used_as_the_object(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.server.add_faults(
        [
            {
                "turn": 1,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_obj",
                            "type": "function",
                            "function": {"name": "read_file", "arguments": {"path": "notes.txt"}},
                        }
                    ],
                },
            }
        ]
    )
    result = api.start("--json")
    assert result.code == 0, result.stderr
    assert result.json()["status"] == "completed"
    assert api.answered() == {0: 1, 2: 1} and len(api.server.requests) == 3  # turn 1 once
    stored = sql(
        "SELECT tool_calls FROM messages WHERE role = 'assistant' AND tool_calls LIKE '%call_obj%'"
    )
    (call,) = json.loads(stored[0][0])
    assert call["function"] == {"name": "read_file", "arguments": '{"path":"notes.txt"}'}
    (observation,) = sql("SELECT content FROM messages WHERE tool_call_id = 'call_obj'")
    assert "remember the milk" in observation[0]  # the tool really ran with those arguments
    # What goes back to the provider is the wire form again: arguments as a string.
    sent = api.server.requests[-1]["body"]["messages"]
    assert any(
        c["function"]["arguments"] == '{"path":"notes.txt"}'
        for m in sent
        for c in m.get("tool_calls") or []
    )


def test_a_tool_call_id_longer_than_the_store_holds_is_replaced(
    api: Endpoint, store_url: str
) -> None:
    """The stores hold a call id of up to 200 characters (PostgreSQL enforces it): a longer
    one from the provider failed the call's checkpoint, and every resume with it."""
    from sqlalchemy import text

    from durable_agent.store.engine import open_store_engine

    call = {"id": "c" * 300, "type": "function"}
    call["function"] = {"name": "read_file", "arguments": '{"path": "notes.txt"}'}
    api.server.add_faults(
        [{"turn": 1, "message": {"role": "assistant", "content": None, "tool_calls": [call]}}]
    )
    api.env["DURABLE_AGENT_DB"] = store_url
    result = api.start("--json")
    assert result.code == 0, result.stderr
    assert result.json()["status"] == "completed"
    engine = open_store_engine(store_url)
    with engine.connect() as conn:
        (observation,) = conn.execute(
            text("SELECT content FROM messages WHERE tool_call_id = 'call_1_0'")
        ).all()
    engine.dispose()
    assert "remember the milk" in observation[0]  # run, under an id derived from its place


UNNAMED = [
    pytest.param(
        {"name": None, "arguments": '{"path": "notes.txt"}'}, "no function name", id="name-null"
    ),
    pytest.param({"arguments": '{"path": "notes.txt"}'}, "no function name", id="name-missing"),
    pytest.param(None, "`function` null", id="function-null"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("function", "problem"), UNNAMED)
def test_a_tool_call_without_a_name_is_an_error_observation_and_never_bought_twice(
    api: Endpoint, sql: Callable[..., list[Any]], function: Any, problem: str
) -> None:
    wire = {"id": "call_odd", "type": "function", "function": function}
    api.server.add_faults(
        [
            {
                "turn": 0,
                "message": {"role": "assistant", "content": "let me look", "tool_calls": [wire]},
            }
        ]
    )
    first = api.start("--max-steps", "1", "--json")
    assert first.code == 3, first.stderr  # stopped by the budget, after the observation
    run_id = first.json()["run_id"]
    assert BUG not in first.stderr

    # The paid answer is recorded, with what came, and the call is answered with an error.
    (output,) = sql(
        "SELECT output FROM steps WHERE kind = 'model' AND turn = 0 AND state = 'completed'"
    )
    raw = json.loads(json.loads(output[0])["raw"])
    assert raw["message"]["tool_calls"] == [wire]
    assert problem in raw["problems"][0]
    (observation,) = sql("SELECT content FROM messages WHERE tool_call_id = 'call_odd'")
    # It says what happened, not "unknown tool" with the placeholder's name (issue 17).
    assert "the tool call had no function name" in observation[0]
    assert UNNAMED_TOOL not in observation[0] and "unknown tool" not in observation[0]
    events = readable(api, run_id)
    assert "model_completed" in {e["type"] for e in events}

    second = api.resume(run_id, "--max-steps", "5", "--json")
    assert second.code == 0, second.stderr
    assert second.json()["status"] == "completed"
    assert [r["turn"] for r in api.server.requests] == [0, 1, 2]  # turn 0 was not re-bought
    # The history sent back holds the call under a valid name, with its error result.
    history = api.server.requests[1]["body"]["messages"]
    calls = [c for m in history for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in calls] == [UNNAMED_TOOL]
    assert any(m.get("tool_call_id") == "call_odd" for m in history)
    readable(api, run_id)


@pytest.mark.slow
def test_stored_tool_calls_of_any_shape_never_break_show_export_or_resume(
    api: Endpoint, sql: Callable[..., list[Any]], db_path: Path
) -> None:
    first = api.start("--max-steps", "1", "--json")
    assert first.code == 3, first.stderr
    run_id = first.json()["run_id"]
    # Rows as an older version (or a hand edit) left them: name null, arguments an object,
    # function null. The ids stay, so the results still pair with their calls.
    (call_id,) = sql("SELECT tool_call_id FROM messages WHERE role = 'tool'")[0]
    odd = [{"id": call_id, "type": "function", "function": {"name": None, "arguments": {"a": 1}}}]
    import sqlite3

    with sqlite3.connect(db_path) as db:
        db.execute(
            "UPDATE messages SET tool_calls = ? WHERE role = 'assistant'", (json.dumps(odd),)
        )
    readable(api, run_id)
    second = api.resume(run_id, "--max-steps", "5", "--json")
    assert "Traceback" not in second.stderr and BUG not in second.stderr
    assert second.code == 0, second.stderr
    assert second.json()["status"] == "completed"
    readable(api, run_id)


# --- responses with no answer: classified, retried where transient --------------------------------


TRANSIENT = [
    pytest.param(
        {
            "status": 200,
            "body": {
                "error": {
                    "message": "The server had an error while processing your request.",
                    "type": "server_error",
                }
            },
        },
        id="200-with-server-error",
    ),
    pytest.param({"truncate": 60}, id="truncated-without-content-length"),
    pytest.param({"short_body": 60}, id="cut-short-of-its-content-length"),
]


@pytest.mark.parametrize("fault", TRANSIENT)
def test_transient_bad_responses_are_retried(
    api: Endpoint, sql: Callable[..., list[Any]], fault: dict[str, Any]
) -> None:
    api.server.add_faults([{"turn": 1, "attempt": 1, **fault}])
    result = api.start("--json")
    assert result.code == 0, result.stderr
    assert result.json()["status"] == "completed"
    assert [(t, a) for t, a, _ in api.turns()] == [(0, 1), (1, 1), (1, 2), (2, 1)]
    assert sql("SELECT state, attempts FROM steps WHERE kind = 'model' AND turn = 1") == [
        ("completed", 2)
    ]


def test_a_truncated_body_that_stays_truncated_fails_resumable(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.configure(retry_max_attempts=2)
    api.server.add_faults([{"turn": 0, "truncate": 60, "times": 2}])
    result = api.start()
    assert result.code == 1, result.stderr
    _, status, reason, error, _ = the_run(sql)
    assert (status, reason) == ("failed", "model_error")
    assert error.startswith("model call failed after 2 attempts: truncated_response: ")
    assert "--base-url" in error and BUG not in error


def test_a_body_cut_mid_stream_says_what_happened(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # The headers came, the body stopped short: the endpoint was reached (issue 17).
    api.configure(retry_max_attempts=2)
    api.server.add_faults([{"turn": 0, "short_body": 60, "times": 2}])
    result = api.start()
    assert result.code == 1, result.stderr
    _, _, reason, error, _ = the_run(sql)
    assert error.startswith("model call failed after 2 attempts: truncated_response: "), error
    assert "closed in the middle of the response body" in error and "was cut off" in error
    assert "could not reach the endpoint" not in error and BUG not in error


PERMANENT = [
    pytest.param(
        {
            "status": 200,
            "body": {
                "error": {
                    "message": "Model qwen-9 is not loaded",
                    "type": "invalid_request_error",
                    "code": None,
                }
            },
        },
        "api_error",
        "Model qwen-9 is not loaded",
        "see its message",
        id="200-with-request-error",
    ),
    pytest.param(
        {"status": 200, "body": {"id": "chatcmpl-1", "object": "chat.completion", "choices": []}},
        "invalid_response",
        "empty `choices`",
        "--base-url",
        id="empty-choices",
    ),
    pytest.param(
        {
            "status": 200,
            "content_type": "text/html; charset=utf-8",
            "body": "<!doctype html><html><head><title>Open WebUI</title></head></html>",
        },
        "invalid_response",
        "HTML page, not JSON: ('Open WebUI')",
        "--base-url",
        id="html",
    ),
    pytest.param(
        {
            "status": 200,
            "content_type": "text/event-stream",
            "body": 'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n',
        },
        "invalid_response",
        "server-sent event stream",
        "--base-url",
        id="sse",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "reason", "says", "hint"), PERMANENT)
def test_bad_responses_fail_fast_with_the_providers_words_and_resume(
    api: Endpoint,
    sql: Callable[..., list[Any]],
    fault: dict[str, Any],
    reason: str,
    says: str,
    hint: str,
) -> None:
    api.server.add_faults([{"turn": 1, **fault}])
    first = api.start()
    assert first.code == 1, first.stderr
    run_id, status, stop_reason, error, step_count = the_run(sql)
    assert (status, stop_reason, step_count) == ("failed", "model_error", 1)
    assert [t for t, _, _ in api.turns()] == [0, 1]  # one request for turn 1: no retry
    assert error.startswith(f"model call failed after 1 attempt: {reason}: ")
    assert says in error and hint in error
    assert says in first.stderr and BUG not in first.stderr
    readable(api, run_id)

    second = api.resume(run_id, "--json")  # the fault was used once: the server is fine now
    assert second.code == 0, second.stderr
    assert second.json()["status"] == "completed"
    assert [t for t, _, _ in api.turns()] == [0, 1, 1, 2]  # turn 0 was not asked again
    assert sql("SELECT state, attempts FROM steps WHERE kind = 'model' AND turn = 1") == [
        ("completed", 2)
    ]


def test_an_endpoint_that_hangs_up_without_answering_is_not_called_unreachable(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.configure(retry_max_attempts=2)
    api.server.add_faults([{"turn": 0, "drop": True, "times": 2}])
    result = api.start()
    assert result.code == 1, result.stderr
    _, _, reason, error, _ = the_run(sql)
    assert error.startswith("model call failed after 2 attempts: disconnected: "), error
    assert (
        "closed the connection without answering" in error and "hung up before answering" in error
    )
    assert "could not reach the endpoint" not in result.stderr and BUG not in error
