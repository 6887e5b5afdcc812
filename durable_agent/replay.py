"""Rebuild a run's in-memory state from its recorded rows (pure: no I/O).

The process holds nothing that cannot be rebuilt from the database: the messages, the
counters, the request hash chain, the repeat streak and the tool calls still waiting
for a result all come from what was committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from durable_agent.errors import HistoryDiverged
from durable_agent.messages import HistoryHash, Message, ToolCall
from durable_agent.store.storable import storable


@dataclass
class RunState:
    run_id: str
    messages: list[Message]
    history: HistoryHash
    next_step_seq: int
    step_count: int
    tool_call_count: int
    prompt_tokens: int
    completion_tokens: int
    active_ms: int
    last_fingerprint: str | None = None
    repeat_streak: int = 0
    used_call_ids: set[str] = field(default_factory=set)
    open_steps: dict[str, Any] = field(default_factory=dict)  # idempotency key -> step row

    @property
    def turn(self) -> int:
        """The next model call's index: one model call per step."""
        return self.step_count

    def append(self, message: Message) -> int:
        """Add a message to the history; returns its seq."""
        message = storable_message(message)
        self.messages.append(message)
        self.history.add(message)
        return len(self.messages) - 1

    def note_tool_call(self, call: ToolCall) -> None:
        fp = call.fingerprint()
        self.repeat_streak = self.repeat_streak + 1 if fp == self.last_fingerprint else 1
        self.last_fingerprint = fp

    def pending_calls(self) -> list[ToolCall]:
        """Tool calls of the last assistant message that have no result yet, in order."""
        for i in range(len(self.messages) - 1, -1, -1):
            m = self.messages[i]
            if m.role == "assistant":
                done = {r.tool_call_id for r in self.messages[i + 1:] if r.role == "tool"}
                return [c for c in m.tool_calls if c.id not in done]
        return []

    def final_answer(self) -> str | None:
        """The content of a trailing assistant message without tool calls (a finish)."""
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "assistant" and not last.tool_calls:
            return last.content or ""
        return None


def storable_message(m: Message) -> Message:
    """`m` as the store will hold it (store/storable.py): the history in memory must be the
    history a resume reads back, or the tool calls run, their keys and the request hash
    would differ after a resume. The same object when it is clean (nearly always)."""
    texts = [m.content, m.tool_call_id, *(t for c in m.tool_calls for t in (c.id, c.name, c.arguments))]
    if all(storable(t) is t for t in texts):
        return m
    calls = tuple(ToolCall(id=storable(c.id), name=storable(c.name), arguments=storable(c.arguments))
                  for c in m.tool_calls)
    return Message(m.role, storable(m.content), tool_calls=calls, tool_call_id=storable(m.tool_call_id))


def rebuild(run: Any, messages: list[Message], open_steps: list[Any], next_seq: int) -> RunState:
    state = RunState(
        run_id=run.id, messages=[], history=HistoryHash(), next_step_seq=next_seq,
        step_count=run.step_count, tool_call_count=run.tool_call_count,
        prompt_tokens=run.prompt_tokens, completion_tokens=run.completion_tokens,
        active_ms=run.active_ms,
    )
    answered: set[str] = {m.tool_call_id for m in messages if m.role == "tool" and m.tool_call_id}
    assistant_turns = 0
    for m in messages:
        state.append(m)
        if m.role == "assistant":
            assistant_turns += 1
            for call in m.tool_calls:
                state.used_call_ids.add(call.id)
                if call.id in answered:
                    state.note_tool_call(call)
    if assistant_turns != run.step_count:
        raise HistoryDiverged(
            f"run {run.id}: {assistant_turns} model answers are recorded but step_count is "
            f"{run.step_count}; the database was changed by hand, refusing to guess"
        )
    # Derived from the history, not trusted from the counter: the two always commit together,
    # and the history is what the model saw.
    state.tool_call_count = len(answered)
    state.open_steps = {s.idempotency_key: s for s in open_steps}
    return state
