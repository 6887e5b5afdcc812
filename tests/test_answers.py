"""Response bodies -> ModelTurn or a classified failure (models/answers.py), and stored
tool calls of any shape (ToolCall.from_dict): nothing a provider or an old row holds may
raise anything else. The end-to-end versions, over HTTP, are in test_provider_quirks.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_agent.messages import UNNAMED_TOOL, HistoryHash, Message, ToolCall
from durable_agent.models.answers import parse_completion
from durable_agent.models.failures import FailureKind, ProviderError, scrubber

SCRUB = scrubber("sk-secret-key-0123456789")


def completion(message: Any, **extra: Any) -> bytes:
    body = {
        "id": "c",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
        **extra,
    }
    return json.dumps(body).encode()


def parse(body: bytes, content_type: str = "application/json") -> Any:
    return parse_completion(body, content_type, SCRUB)


def failure(body: bytes, content_type: str = "application/json") -> Any:
    with pytest.raises(ProviderError) as caught:
        parse(body, content_type)
    return caught.value.failure


# --- usable answers, odd shapes ----------------------------------------------------------------


def test_arguments_given_as_an_object_are_taken_as_the_object() -> None:
    turn = parse(
        completion(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": {"path": "a.txt", "limit": 2},
                        },
                    }
                ],
            }
        )
    )
    (call,) = turn.tool_calls
    assert (call.id, call.name, call.arguments) == ("c1", "read_file", '{"limit":2,"path":"a.txt"}')
    assert call.parsed_arguments() == {"path": "a.txt", "limit": 2}
    assert turn.raw is None  # accepted: nothing to keep as evidence
    assert (turn.usage.prompt_tokens, turn.usage.completion_tokens) == (3, 4)


@pytest.mark.parametrize(
    ("wire", "problem"),
    [
        (
            {"id": "c1", "type": "function", "function": {"name": None, "arguments": "{}"}},
            "no function name",
        ),
        ({"id": "c1", "type": "function", "function": {"arguments": "{}"}}, "no function name"),
        ({"id": "c1", "type": "function", "function": None}, "`function` null"),
        (
            {"id": "c1", "type": "function", "function": {"name": 7, "arguments": "{}"}},
            "no function name",
        ),
        ("read_file", "a tool call is text"),
    ],
)
def test_a_call_without_a_usable_name_is_kept_as_an_unnamed_call_with_the_raw_answer(
    wire: Any, problem: str
) -> None:
    turn = parse(completion({"role": "assistant", "content": "x", "tool_calls": [wire]}))
    (call,) = turn.tool_calls  # not dropped: the tool layer answers it with an error
    assert call.name == UNNAMED_TOOL
    assert turn.raw is not None
    raw = json.loads(turn.raw)
    assert raw["message"]["tool_calls"] == [wire]
    assert problem in raw["problems"][0]


def test_arguments_that_are_not_an_object_stay_visible_as_their_json() -> None:
    turn = parse(
        completion(
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c1", "function": {"name": "read_file", "arguments": [1, 2]}}
                ],
            }
        )
    )
    with pytest.raises(ValueError, match="JSON object"):
        turn.tool_calls[0].parsed_arguments()
    assert turn.tool_calls[0].arguments == "[1,2]"
    assert turn.raw is not None and "not an object" in turn.raw


def test_content_parts_refusals_and_legacy_function_call() -> None:
    parts = parse(
        completion(
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        )
    )
    assert parts.content == "ab"
    assert (
        parse(completion({"role": "assistant", "content": None, "refusal": "no"})).content == "no"
    )
    legacy = parse(
        completion(
            {"role": "assistant", "function_call": {"name": "list_files", "arguments": "{}"}}
        )
    )
    assert [(c.name, c.arguments) for c in legacy.tool_calls] == [("list_files", "{}")]


# --- responses with no answer: classified ------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "content_type", "kind", "reason", "says"),
    [
        (
            b'{"error": {"message": "The server had an error", "type": "server_error"}}',
            "application/json",
            FailureKind.RETRYABLE,
            "server_error",
            "The server had an error",
        ),
        (
            b'{"error": {"message": "Upstream overloaded", "code": 503}}',
            "application/json",
            FailureKind.RETRYABLE,
            "server_error",
            "Upstream overloaded",
        ),
        (
            b'{"error": {"message": "Invalid model name", "type": "invalid_request_error"}}',
            "application/json",
            FailureKind.PERMANENT,
            "api_error",
            "Invalid model name",
        ),
        (
            b'{"error": "model not loaded"}',
            "application/json",
            FailureKind.PERMANENT,
            "api_error",
            "model not loaded",
        ),
        (
            b'{"id": "x", "choices": []}',
            "application/json",
            FailureKind.PERMANENT,
            "invalid_response",
            "empty `choices`",
        ),
        (
            b'{"id": "x"}',
            "application/json",
            FailureKind.PERMANENT,
            "invalid_response",
            "no `choices`",
        ),
        (
            b'{"choices": [{"text": "hi"}]}',
            "application/json",
            FailureKind.PERMANENT,
            "invalid_response",
            "legacy completions",
        ),
        (
            b"<html><head><title>Open WebUI</title></head><body>app</body></html>",
            "text/html",
            FailureKind.PERMANENT,
            "invalid_response",
            "HTML page, not JSON: ('Open WebUI')",
        ),
        (
            b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\ndata: [DONE]\n\n',
            "text/event-stream",
            FailureKind.PERMANENT,
            "invalid_response",
            "server-sent event stream",
        ),
        (
            b'{"id": "x", "choices": [{"message": {"content": "hal',
            "application/json",
            FailureKind.RETRYABLE,
            "truncated_response",
            "ends inside its JSON",
        ),
        (b"", "application/json", FailureKind.RETRYABLE, "truncated_response", "empty"),
        (
            b"Internal error, sk-secret-key-0123456789 rejected",
            "text/plain",
            FailureKind.PERMANENT,
            "invalid_response",
            "not JSON",
        ),
        (b"[1, 2]", "application/json", FailureKind.PERMANENT, "invalid_response", "not an object"),
    ],
)
def test_a_response_without_an_answer_is_a_classified_failure(
    body: bytes, content_type: str, kind: FailureKind, reason: str, says: str
) -> None:
    found = failure(body, content_type)
    assert (found.kind, found.reason) == (kind, reason)
    assert says in found.message
    assert "sk-secret-key" not in found.describe()
    assert found.hint in found.describe()


def test_hints_name_the_base_url() -> None:
    assert "--base-url" in failure(b"<html></html>", "text/html").hint
    assert "--base-url" in failure(b'{"choices": []}').hint
    assert "--base-url" in failure(b'{"choices": [{"mess').hint


# --- no shape raises anything else ---------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(
    [
        "id",
        "type",
        "function",
        "name",
        "arguments",
        "tool_calls",
        "content",
        "message",
        "choices",
        "error",
        "usage",
        "refusal",
        "function_call",
    ]
)
# Objects built from the keys that matter, so the search reaches the deep branches.
SHAPED = st.recursive(
    JSON,
    lambda inner: st.dictionaries(KEYS, inner, max_size=4) | st.lists(inner, max_size=2),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(SHAPED)
@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_any_json_body_is_an_answer_or_a_classified_failure(value: Any) -> None:
    body = json.dumps(value).encode()
    try:
        turn = parse(body)
    except ProviderError as exc:
        assert exc.failure.reason in {
            "invalid_response",
            "api_error",
            "server_error",
            "rate_limit",
            "context_length",
            "bad_request",
            "insufficient_quota",
            "timeout",
            "conflict",
            "too_early",
            "auth",
            "permission",
            "not_found",
            "unprocessable",
            "request_too_large",
            "http_error",
        }
        exc.failure.describe()
        return
    for call in turn.tool_calls:
        assert isinstance(call.name, str) and call.name
        assert isinstance(call.arguments, str)
        call.fingerprint()


@settings(max_examples=300, deadline=None)
@given(SHAPED)
def test_any_stored_tool_call_can_be_replayed_shown_and_hashed(value: Any) -> None:
    call = ToolCall.from_dict(value)
    assert isinstance(call.id, str) and isinstance(call.arguments, str)
    assert isinstance(call.name, str) and call.name.strip()
    call.fingerprint()
    call.canonical_arguments()
    json.dumps(call.to_dict())
    history = HistoryHash()
    history.add(Message("assistant", None, (call,)))
    assert len(history.digest) == 64
    # What is stored from a call reads back as the same call.
    assert ToolCall.from_dict(call.to_dict()) == call


@given(st.text(min_size=1).filter(str.strip), st.text(), st.text())
def test_well_formed_calls_round_trip(name: str, call_id: str, arguments: str) -> None:
    call = ToolCall(call_id, name, arguments)
    assert ToolCall.from_wire(call.to_dict()) == (call, None)


def test_lone_surrogates_in_an_answer_become_replacement_characters() -> None:
    # JSON escapes: a lone high surrogate, and a proper pair (an emoji) that must survive.
    body = (
        b'{"choices": [{"message": {"content": "a\\ud800b \\ud83d\\ude00", "tool_calls": '
        b'[{"id": "c\\udc00", "function": {"name": "read_file", "arguments": {"path": "x\\ud800"}}}]}}]}'
    )
    turn = parse(body)
    assert turn.content == "a\ufffdb \U0001f600"
    (call,) = turn.tool_calls
    assert (call.id, call.parsed_arguments()) == ("c\ufffd", {"path": "x\ufffd"})
    for text in (turn.content, call.id, call.arguments):
        text.encode("utf-8")  # storable and sendable


def test_a_json_answer_under_a_wrong_content_type_is_still_read() -> None:
    assert parse(completion({"role": "assistant", "content": "ok"}), "text/html").content == "ok"
    assert (
        parse(completion({"role": "assistant", "content": "ok"}), "text/event-stream").content
        == "ok"
    )
