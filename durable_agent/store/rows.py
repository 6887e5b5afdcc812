"""Small helpers shared by the store modules: the clock and message rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from durable_agent.messages import Message, ToolCall


def utcnow() -> datetime:
    """The time in UTC, naive (as the columns hold it). Ten of these a step: combining the
    aware time's parts costs a third of `replace(tzinfo=None)` and its keyword."""
    now = datetime.now(UTC)
    return datetime.combine(now.date(), now.time())


def message_from_row(row: Any) -> Message:
    calls = tuple(ToolCall.from_dict(c) for c in (row.tool_calls or ()))
    return Message(
        role=row.role, content=row.content, tool_calls=calls, tool_call_id=row.tool_call_id
    )


MESSAGE_COLUMNS = (
    "run_id",
    "seq",
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "step_seq",
    "created_at",
)


def message_values(
    run_id: str, seq: int, message: Message, step_seq: int | None, now: datetime
) -> dict[str, Any]:
    # Not yet storable: the journal's prepared insert cleans them as it writes them.
    return {
        "run_id": run_id,
        "seq": seq,
        "role": message.role,
        "content": message.content,
        "tool_calls": [c.to_dict() for c in message.tool_calls] or None,
        "tool_call_id": message.tool_call_id,
        "step_seq": step_seq,
        "created_at": now,
    }
