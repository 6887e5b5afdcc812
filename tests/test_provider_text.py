"""`--tool-protocol text`: tools described in the prompt, TOOL_CALL lines parsed into calls."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI
from provider_support import Endpoint

from durable_agent.messages import Message, ModelTurn, ToolCall, Usage
from durable_agent.models.text_protocol import (
    FORMAT_HINT,
    UNPARSED,
    TextProtocolModel,
    parse_tool_calls,
    to_text_messages,
)

READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}
LIST = {
    "type": "function",
    "function": {
        "name": "list_files",
        "description": "List files.",
        "parameters": {"type": "object"},
    },
}


# --- parsing ----------------------------------------------------------------------------------


def test_one_call_per_line_with_ids_from_turn_and_position() -> None:
    text = (
        "I will look first.\n"
        'TOOL_CALL {"name": "list_files", "input": {}}\n'
        'TOOL_CALL {"name": "read_file", "input": {"path": "a.txt"}}\n'
    )
    assert parse_tool_calls(text, 3) == (
        ToolCall("call_3_0", "list_files", "{}"),
        ToolCall("call_3_1", "read_file", '{"path": "a.txt"}'),
    )


def test_pretty_printed_json_in_a_code_fence_and_arguments_spelling() -> None:
    text = (
        '```\nTOOL_CALL {\n  "name": "read_file",\n  "input": {"path": "b.txt"}\n}\n```\n'
        '- TOOL_CALL: {"name": "read_file", "arguments": "{\\"path\\": \\"c.txt\\"}"}'
    )
    calls = parse_tool_calls(text, 0)
    assert [(c.name, c.parsed_arguments()) for c in calls] == [
        ("read_file", {"path": "b.txt"}),
        ("read_file", {"path": "c.txt"}),
    ]


def test_a_final_answer_has_no_calls_even_when_it_mentions_the_marker() -> None:
    assert parse_tool_calls("Done. I used TOOL_CALL lines to read files.", 1) == ()
    assert parse_tool_calls("TOOL_CALLS are fun", 1) == ()


@pytest.mark.parametrize(
    ("line", "name"),
    [
        ('TOOL_CALL {"name": "read_file", "input": {"path": "a.txt"', "read_file"),  # cut short
        ("TOOL_CALL read_file a.txt", UNPARSED),  # not JSON
        ('TOOL_CALL {"input": {"path": "a.txt"}}', UNPARSED),  # no name
        ('TOOL_CALL ["read_file"]', UNPARSED),  # not an object
    ],
)
def test_unparsable_calls_become_calls_the_runner_rejects(line: str, name: str) -> None:
    (call,) = parse_tool_calls(line, 2)
    assert (call.id, call.name) == ("call_2_0", name)
    if name == UNPARSED:
        return  # "unknown tool" from the runner
    with pytest.raises(ValueError):
        call.parsed_arguments()  # "arguments are not valid JSON" from the runner


# --- the history sent to a text-only model -----------------------------------------------------


def test_history_is_plain_text_with_results_as_one_user_message() -> None:
    calls = (ToolCall("call_0_0", "list_files", "{}"), ToolCall("call_0_1", "nope", "{}"))
    history = [
        Message("system", "You are an agent."),
        Message("user", "fix it"),
        Message("assistant", None, tool_calls=calls),  # e.g. recorded under native calling
        Message("tool", "a.txt", tool_call_id="call_0_0"),
        Message("tool", "Error: unknown tool 'nope'", tool_call_id="call_0_1"),
    ]
    sent = to_text_messages(history, [READ, LIST])
    assert [m.role for m in sent] == ["system", "user", "assistant", "user"]
    assert all(not m.tool_calls and m.tool_call_id is None for m in sent)
    system = sent[0].content or ""
    assert system.startswith("You are an agent.") and "TOOL_CALL" in system
    assert "- read_file: Read a file." in system and '"path":{"type":"string"}' in system
    assert sent[2].content == (
        'TOOL_CALL {"name": "list_files", "input": {}}\nTOOL_CALL {"name": "nope", "input": {}}'
    )
    results = sent[3].content or ""
    assert "TOOL_CALL result (list_files call_0_0):\na.txt" in results
    assert results.endswith(f"Error: unknown tool 'nope'\n({FORMAT_HINT})")  # how to do it right
    assert results.count(FORMAT_HINT) == 1  # only after the malformed call


class Recorder:
    name = "inner"

    def __init__(self, content: str) -> None:
        self.content = content
        self.seen: list[tuple[list[Message], list[dict[str, Any]]]] = []

    def complete(self, messages: Any, tools: Any, turn: int) -> ModelTurn:
        self.seen.append((list(messages), list(tools)))
        return ModelTurn(self.content, usage=Usage(7, 3))


def test_the_wrapper_sends_no_tools_and_keeps_text_and_usage() -> None:
    inner = Recorder('Reading.\nTOOL_CALL {"name": "read_file", "input": {"path": "x"}}')
    model = TextProtocolModel(inner)
    turn = model.complete([Message("system", "s"), Message("user", "u")], [READ], 4)
    assert model.name == "inner"
    assert inner.seen[0][1] == []
    assert turn.tool_calls == (ToolCall("call_4_0", "read_file", '{"path": "x"}'),)
    assert turn.content == inner.content and turn.usage == Usage(7, 3)


# --- through the real CLI -------------------------------------------------------------------------

TEXT_SCRIPT: list[dict[str, Any]] = [
    {"content": 'Let me read it.\nTOOL_CALL {"name": "read_file", "input": {"path": "notes.txt"}}'},
    {"content": 'TOOL_CALL {"name": "write_file", "input": {"path": "out.txt", "content": "ok"'},
    {"content": 'TOOL_CALL {"name": "write_file", "input": {"path": "out.txt", "content": "ok"}}'},
    {"content": "Wrote out.txt."},
]


@pytest.fixture
def api(
    cli: Callable[..., Any], env: dict[str, str], workspace: Path, tmp_path: Path
) -> Iterator[Endpoint]:
    (workspace / "notes.txt").write_text("remember the milk\n")
    with FakeOpenAI(script=TEXT_SCRIPT) as server:
        yield Endpoint(cli, server, env, workspace, tmp_path / "config.toml")


def test_text_protocol_end_to_end(api: Endpoint, sql: Callable[..., list[Any]]) -> None:
    result = api.start("--json", "--tool-protocol", "text")
    assert result.code == 0, result.stderr
    out = result.json()
    assert (out["status"], out["answer"], out["steps"], out["tool_calls"]) == (
        "completed",
        "Wrote out.txt.",
        4,
        3,
    )
    bodies = [r["body"] for r in api.server.requests]
    assert [r["turn"] for r in api.server.requests] == [0, 1, 2, 3]
    assert all("tools" not in b for b in bodies)  # described in the prompt instead
    for body in bodies:
        roles = [m["role"] for m in body["messages"]]
        assert "tool" not in roles and all("tool_calls" not in m for m in body["messages"])
    assert "write_file" in bodies[0]["messages"][0]["content"]  # the system prompt lists tools
    # Turn 1 saw the file content as a user message after its own TOOL_CALL text.
    last = bodies[1]["messages"][-1]
    assert last["role"] == "user" and "remember the milk" in last["content"]
    # Turn 2 saw the broken call rejected, with the format reminder, and the run went on.
    last = bodies[2]["messages"][-1]
    assert "invalid arguments for write_file" in last["content"] and FORMAT_HINT in last["content"]

    steps = sql(
        "SELECT call_id, tool_name, error IS NOT NULL FROM steps WHERE kind = 'tool' ORDER BY seq"
    )
    assert steps == [
        ("call_0_0", "read_file", 0),
        ("call_1_0", "write_file", 1),
        ("call_2_0", "write_file", 0),
    ]
    assert (api.workspace / "out.txt").read_text() == "ok"
    # Stored canonically (assistant tool_calls + tool results), whatever went over the wire.
    stored = sql(
        "SELECT json_extract(tool_calls, '$[0].function.arguments') FROM messages "
        "WHERE role = 'assistant' AND tool_calls IS NOT NULL ORDER BY seq LIMIT 1"
    )
    assert json.loads(stored[0][0]) == {"path": "notes.txt"}
    assert sql("SELECT json_extract(settings, '$.tool_protocol') FROM runs") == [("text",)]


def test_a_call_nested_past_pythons_recursion_limit_is_a_broken_call_not_a_failed_run() -> None:
    # raw_decode raises RecursionError, not ValueError: the run ended "model_error".
    deep = "[" * 3000 + "]" * 3000
    (call,) = parse_tool_calls('TOOL_CALL {"name": "write_file", "input": ' + deep + "}", 0)
    assert call.name == "write_file"
    with pytest.raises(ValueError):
        call.parsed_arguments()
