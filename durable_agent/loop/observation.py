"""A tool call's one tool message: its result as the model sees it, in the history, and the
step's outcome. Ordinary tool calls (tool_step.py) and `delegate` calls (delegate_step.py)
answer through it alike: redacted, capped, a pre_tool hook's note before the result."""

from __future__ import annotations

from durable_agent.loop.step import StepCall, StepOutcome
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import Message, ToolCall
from durable_agent.tools.base import ToolResult
from durable_agent.tools.limits import cap_text


def observed(
    ctx: StepContext,
    call: ToolCall,
    result: ToolResult,
    *,
    use_approval: int | None = None,
) -> StepOutcome:
    """The call's one tool message, in the history, and the step's outcome."""
    s = ctx.state
    redact = ctx.redactor.redact
    # Redact first, then cap: a cut through the middle of a secret would leave half of it.
    text = cap_text(redact(result.for_model()), ctx.settings.output_cap)
    if note := s.hook_notes.pop(call.id, None):  # a pre_tool hook's, before the result
        text = f"{cap_text(redact(note), ctx.settings.output_cap // 4)}\n\n{text}"
    message = Message("tool", text, tool_call_id=call.id)
    s.tool_call_count += 1
    s.note_tool_call(call)
    s.append(message)
    output = {"result": text, "data": ctx.redactor.redact_json(result.data)}
    error = redact(result.error) if result.error is not None else None
    return StepOutcome(output, error, messages=[message], use_approval=use_approval)


def refuse(
    ctx: StepContext,
    call: ToolCall,
    step: StepCall,
    error: str,
    *,
    use_approval: int | None = None,
) -> None:
    """Nothing was run: the call's error observation is its outcome."""
    step.record(observed(ctx, call, ToolResult(error=error), use_approval=use_approval))
