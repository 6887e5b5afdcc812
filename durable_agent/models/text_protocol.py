"""`--tool-protocol text`: tool use for models without function calling.

Many local models (and some OpenAI-compatible servers) have no `tools` parameter, or
reject one. For them `TextProtocolModel` wraps any `ModelClient` and, on every call:

- describes the tools in the system prompt instead of sending `tools`;
- turns the model's lines `TOOL_CALL {"name": "read_file", "input": {"path": "a.txt"}}`
  into ordinary `ToolCall`s, with ids `call_<turn>_<position>` (stable across a resume);
- rewrites the history into plain user/assistant text (see `to_text_messages`).

The runner does not know any of this: it stores and replays the same canonical messages
as for native tool calling (an assistant message with `tool_calls`, then `tool` results),
so the request hash, the idempotency keys and resume work unchanged, and a run may even
switch protocol on resume. A TOOL_CALL line that cannot be parsed still becomes a tool
call, one the runner rejects with an error observation (unknown tool, or arguments that
are not JSON), so the model learns what was wrong instead of the run crashing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from msgspec.structs import replace

from durable_agent.messages import REASONING_BLOCK, Message, ModelTurn, ToolCall
from durable_agent.models import ModelClient

MARKER = "TOOL_CALL"
UNPARSED = "TOOL_CALL"
"""Tool name given to a TOOL_CALL line without a usable name: the runner answers
"unknown tool" with the list of tools, and the history adds a format reminder."""

# A call starts a line; quote marks, list bullets or a stray backtick before it are
# tolerated. "TOOL_CALL" in the middle of a sentence is prose, not a call.
_CALL = re.compile(rf"^[ \t>*`-]*{MARKER}\b[ \t:]*", re.MULTILINE)
_NAME = re.compile(r'"name"\s*:\s*"([^"\\]+)"')
_DECODER = json.JSONDecoder()
# A reasoning block is thinking, not action: a TOOL_CALL line inside one is not a call.
_REASONING = REASONING_BLOCK

FORMAT_HINT = (
    f'Write each tool call on its own line as: {MARKER} {{"name": "<tool>", "input": {{...}}}}'
)


def parse_tool_calls(text: str, turn: int) -> tuple[ToolCall, ...]:
    """The TOOL_CALL lines of a model's answer, in order (empty: a final answer).

    The JSON may span several lines (models pretty-print). `input` may also be spelled
    `arguments`, and may be a JSON string holding the object (the native wire form).
    Lines inside `<think>…</think>` or `<reasoning>…</reasoning>` are not calls.
    """
    calls = []
    text = _REASONING.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for i, match in enumerate(_CALL.finditer(text)):
        call_id = f"call_{turn}_{i}"
        start = match.end()
        line = text[start:].split("\n", 1)[0].strip()
        try:
            obj, _ = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            # Broken JSON: keep the name if it can be seen, so the error names the tool,
            # and pass the raw text on as the arguments, which the runner rejects.
            name = _NAME.search(line)
            calls.append(ToolCall(call_id, name.group(1) if name else UNPARSED, line))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            calls.append(ToolCall(call_id, UNPARSED, json.dumps(obj)))
            continue
        args = obj.get("input", obj.get("arguments", {}))
        raw = args if isinstance(args, str) else json.dumps(args)
        calls.append(ToolCall(call_id, obj["name"], raw))
    return tuple(calls)


def render_call(call: ToolCall) -> str:
    """One call as the protocol line (for history that came from native tool calling)."""
    try:
        args: Any = call.parsed_arguments()
    except ValueError:
        args = call.arguments
    return f"{MARKER} " + json.dumps({"name": call.name, "input": args})


def tools_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """The tool descriptions and the protocol, appended to the system prompt."""
    functions = [t.get("function", t) for t in tools]
    names = [f["name"] for f in functions]
    example = (
        {"name": "read_file", "input": {"path": "README.md"}}
        if "read_file" in names
        else {"name": names[0] if names else "tool_name", "input": {}}
    )
    lines = [
        "",
        "Tools: this endpoint has no function-calling API. To use a tool, write a line that",
        f"starts with {MARKER} followed by one JSON object with the tool's name and its input:",
        f"{MARKER} {json.dumps(example)}",
        f"You may write several {MARKER} lines in one message; they run in order and their",
        "results come back in the next user message. When the task is done, answer without",
        f"any {MARKER} line: that answer is final.",
        "",
        "Available tools (input is a JSON object matching the schema):",
    ]
    for f in functions:
        schema = json.dumps(f.get("parameters") or {}, separators=(",", ":"))
        lines.append(f"- {f['name']}: {f.get('description', '').strip()}\n  input schema: {schema}")
    return "\n".join(lines)


def to_text_messages(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> list[Message]:
    """The history as plain system/user/assistant text that any chat template accepts.

    Tool results go back as *user* messages, not `tool` messages: servers and chat templates
    for models without function calling often reject the `tool` role, or drop a tool
    message whose assistant turn carries no `tool_calls` (which we do not send). Several
    results of one turn are merged into one user message, because some templates (Llama 2,
    Mistral) require strict user/assistant alternation.
    """
    known = {t.get("function", t)["name"] for t in tools}
    names: dict[str, ToolCall] = {}  # call id -> the call, to label its result
    out: list[Message] = []

    def add_user(text: str) -> None:
        if out and out[-1].role == "user":
            out[-1] = Message("user", f"{out[-1].content}\n\n{text}")
        else:
            out.append(Message("user", text))

    for m in messages:
        if m.role == "system" and out:
            # A later system message (project memory): templates that take one system
            # message, first, get it as the user's words.
            add_user(m.content or "")
        elif m.role == "system":
            out.append(
                Message("system", (m.content or "") + ("\n" + tools_prompt(tools) if tools else ""))
            )
        elif m.role == "assistant":
            text = m.content or ""
            if m.tool_calls and MARKER not in text:
                text = "\n".join([text, *map(render_call, m.tool_calls)]).strip()
            names.update((call.id, call) for call in m.tool_calls)
            out.append(Message("assistant", text))
        elif m.role == "tool":
            asked = names.get(m.tool_call_id or "")
            label = f"{asked.name} {m.tool_call_id}" if asked else m.tool_call_id
            text = f"{MARKER} result ({label}):\n{m.content or ''}"
            if asked is not None and not _well_formed(asked, known):
                text += f"\n({FORMAT_HINT})"
            add_user(text)
        else:
            add_user(m.content or "")
    return out


def _well_formed(call: ToolCall, known: set[str]) -> bool:
    if call.name not in known:
        return False
    try:
        call.parsed_arguments()
    except ValueError:
        return False
    return True


class TextProtocolModel:
    """Wraps a ModelClient: tools described in text, TOOL_CALL lines parsed into calls."""

    def __init__(self, inner: ModelClient) -> None:
        self.inner = inner
        self.name = inner.name  # prices and the recorded model are those of the real model

    def complete(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], turn: int
    ) -> ModelTurn:
        answer = self.inner.complete(to_text_messages(messages, tools), (), turn)
        text = answer.content or ""
        # A model that does have function calling may still use it: keep those calls.
        calls = answer.tool_calls or parse_tool_calls(text, turn)
        return replace(answer, tool_calls=calls)
