"""A big answer is stored once: in its messages row, which the history needs whole.

An answer's text and its tool calls' arguments were also copied into the model step's
output, and each call's arguments into its tool step's input: a 50 MB answer took about
three times that in the store. Up to INLINE_CHARS they still are (readable in the step
rows, the `tool_calls` view and `show` at no real cost); beyond, those rows keep a head of
each long text and a flag, and readers that need the whole (the transcript, `export`)
take it from the messages row (`whole`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from durable_agent.messages import ToolCall
from durable_agent.status import StepKind
from durable_agent.store.records import MessageRecord, StepRecord

INLINE_CHARS = 64 * 1024
"""Text (an answer, or a call's arguments) up to this size is copied into step rows too."""
HEAD_CHARS = 2000
"""What a step row keeps of each longer text."""
IN_MESSAGE = "in_message"  # model step output: the seq of the messages row holding it whole
ARGUMENTS_IN_MESSAGE = "arguments_in_message"  # tool step input: the call's whole arguments


def model_output(output: dict[str, Any], message_seq: int) -> None:
    """Cut a model step's big `content` and tool-call arguments to heads, in place."""
    calls = output["tool_calls"]
    content = output["content"]
    big_content = isinstance(content, str) and len(content) > INLINE_CHARS
    big_calls = sum(len(c["function"]["arguments"]) for c in calls) > INLINE_CHARS
    if not big_content and not big_calls:
        return
    output[IN_MESSAGE] = message_seq
    if big_content:
        output["content"] = content[:HEAD_CHARS]
    if big_calls:
        output["tool_calls"] = [
            {
                **c,
                "function": {**c["function"], "arguments": c["function"]["arguments"][:HEAD_CHARS]},
            }
            for c in calls
        ]


def call_input(call: ToolCall) -> dict[str, Any]:
    """A tool step's input: the call's arguments, each long text cut to a head when the
    whole is big (its assistant message holds them whole)."""
    if len(call.arguments) <= INLINE_CHARS:
        return {"arguments": call.arguments_or_text()}
    return {"arguments": _heads(call.arguments_or_text()), ARGUMENTS_IN_MESSAGE: True}


def _heads(value: Any) -> Any:
    if isinstance(value, str):
        return value[:HEAD_CHARS]
    if isinstance(value, dict):
        return {k: _heads(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_heads(v) for v in value]
    return value


def needs_messages(steps: list[StepRecord]) -> bool:
    return any(
        (s.kind == StepKind.MODEL and isinstance(s.output, dict) and IN_MESSAGE in s.output)
        or (
            s.kind == StepKind.TOOL
            and isinstance(s.input, dict)
            and ARGUMENTS_IN_MESSAGE in s.input
        )
        for s in steps
    )


def whole(steps: list[StepRecord], messages: list[MessageRecord]) -> list[StepRecord]:
    """`steps` with each cut answer and call put back whole from the messages rows."""
    by_seq = {m.seq: m for m in messages}
    arguments: dict[str, Any] = {}
    for m in messages:
        for c in m.tool_calls if m.role == "assistant" and isinstance(m.tool_calls, list) else []:
            if isinstance(c, dict) and isinstance(c.get("function"), dict):
                arguments[str(c.get("id"))] = c["function"].get("arguments")
    out = []
    for step in steps:
        output = step.output if isinstance(step.output, dict) else {}
        data = step.input if isinstance(step.input, dict) else {}
        message = by_seq.get(output.get(IN_MESSAGE, -1)) if step.kind == StepKind.MODEL else None
        if message is not None:
            full = {k: v for k, v in output.items() if k != IN_MESSAGE}
            full["content"] = message.content
            full["tool_calls"] = message.tool_calls or []
            step = msgspec.structs.replace(step, output=full)
        elif (
            step.kind == StepKind.TOOL
            and data.get(ARGUMENTS_IN_MESSAGE)
            and step.call_id in arguments
        ):
            text = arguments[step.call_id]
            call = ToolCall(id=step.call_id or "", name=step.tool_name or "", arguments=text)
            rest = {k: v for k, v in data.items() if k != ARGUMENTS_IN_MESSAGE}
            step = msgspec.structs.replace(
                step, input={**rest, "arguments": call.arguments_or_text()}
            )
        out.append(step)
    return out
