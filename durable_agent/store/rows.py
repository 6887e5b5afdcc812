"""Small helpers shared by the store modules: the clock and message rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from msgspec import Struct

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


# The place of a message that is neither kept in memory nor read back (loop/replay.py): one
# shared object, so that seqs stay indices into the history.
GONE = Message("user", None)


def droppable(message: Message) -> bool:
    """Once below the view's start (a summary replaced it), never sent again: a tool result,
    or an assistant message that asked for tools. Kept: the system prompt and project
    memory, the person's messages and plain answers (a cut-off answer goes on across them)."""
    return message.role == "tool" or (message.role == "assistant" and bool(message.tool_calls))


class Older(Struct, frozen=True):
    """What a rebuild needs of the messages a resume did not read (those below `start` that
    `droppable` holds): counted by the store from their rows."""

    start: int = 0
    assistants: int = 0  # assistant messages with tool calls: one model call each
    # How many distinct call ids their tool results answer that no result read answers. The
    # ids stay in the store (9,000 at 10,000 steps): a new call's id is looked up there
    # (RunState.ids_below).
    answered: int = 0
    # The answered calls the history ended with before `start` that share one fingerprint,
    # by the seq of the message that asked for each (the repeat streak, window by window).
    streak_fingerprint: str | None = None
    streak_seqs: list[int] = []
    # Calls asked at or after `start` whose result is below it (an order only a hand edit
    # makes): answered, as a resume that read every message would find them.
    answered_below: frozenset[str] = frozenset()
