"""Rebuild a run's in-memory state from its recorded rows (pure: no I/O).

The process holds nothing that cannot be rebuilt from the database: the messages, the
counters, the request hash chain, the repeat streak and the tool calls still waiting
for a result all come from what was committed. (The step rows themselves — which step
is open, the next seq — are the Journal's.)

A long run does not keep its whole history in memory: once a summary replaced the
messages before the view's start, its tool results and the assistant messages that asked
for them (`droppable`) are never sent again, and their places hold `GONE` (seqs stay
indices into `messages`). A resume reads them neither (store/journal.py `Journal.load`):
what the state needs of them, it gets as `Older` (counted by the store).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from msgspec import UNSET, Struct, field

from durable_agent.context.budget import calibrate, count_message
from durable_agent.context.view import ContextView, request_hash
from durable_agent.messages import (
    CUT_NUDGE,
    HEAD,
    HistoryHash,
    Message,
    ToolCall,
    without_reasoning,
)
from durable_agent.store.payloads import ModelOutput, StepOutput, Window
from durable_agent.store.rows import GONE, Older, droppable
from durable_agent.store.storable import storable


class RunState(Struct):
    run_id: str
    messages: list[Message]
    history: HistoryHash  # of the request messages (the view below), kept as messages come
    step_count: int
    tool_call_count: int
    prompt_tokens: int
    completion_tokens: int
    active_ms: int
    cached_tokens: int = 0  # of prompt_tokens, served from the provider's cache
    cost: float | None = None  # the paid steps' costs summed; None while none was priced
    last_fingerprint: str | None = None
    repeat_streak: int = 0
    used_call_ids: set[str] = field(default_factory=set)
    # The ids of the calls answered before this seq are not in used_call_ids: a resume left
    # them in the store (Older), where a new call's id is looked up (model_step._call_ids).
    ids_below: int = HEAD
    # pre_tool hooks' notes (stdout) for calls about to run: put before their results
    hook_notes: dict[str, str] = field(default_factory=dict)
    hooks_done: set[str] = field(default_factory=set)  # hook steps seen completed this session
    session: int = 0  # the run's sessions before this one (runs.resume_count): hook keys
    view: ContextView = field(default_factory=ContextView)
    calibration: float = 1.0  # provider's prompt tokens / the harness's count, at the last call
    # Where the current turn's budget window began (`continue`): budgets count from here.
    window: Window = field(default_factory=Window)
    # Messages below this seq that `droppable` holds are GONE (the view's start, once a
    # summary moved it).
    dropped: int = HEAD
    # (counter, compactions, messages counted, tokens): the request's count, kept as messages
    # come. Between compactions the request only grows, so each message is counted once
    # instead of the whole history before every call.
    _tally: tuple[object, int, int, int] | None = None

    def request_tokens(self, counter: Callable[[str], int]) -> int:
        """The uncalibrated count of `request()` (context_budget.count_message per message)."""
        tally = self._tally
        if (
            tally is None
            or tally[0] is not counter
            or tally[1] != self.view.compactions
            or tally[2] > len(self.messages)
        ):
            total = sum(count_message(m, counter) for m in self.request())
        else:
            total = tally[3] + sum(count_message(m, counter) for m in self.messages[tally[2] :])
        self._tally = (counter, self.view.compactions, len(self.messages), total)
        return total

    def request(self) -> list[Message]:
        """The messages the next model call sends (the history, as compacted)."""
        return self.view.request(self.messages) if self.view.compactions else list(self.messages)

    def compacted(self, output: dict[str, Any]) -> None:
        """A compaction's boundary took effect: the request (and its hash) start over from it."""
        self.view.apply(output, self.messages)
        self.drop_replaced()
        self.history = request_hash(self.request())

    def drop_replaced(self) -> None:
        """What the summaries replaced and no request sends again leaves memory (a resume
        does not read it either): a 10,000-step run holds about what a 1,000-step one does."""
        ms = self.messages
        for i in range(self.dropped, self.view.start):
            if droppable(ms[i]):
                ms[i] = GONE
        self.dropped = max(self.dropped, self.view.start)

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
                done = {r.tool_call_id for r in self.messages[i + 1 :] if r.role == "tool"}
                return [c for c in m.tool_calls if c.id not in done]
        return []

    def calls_over(self, cap: int) -> tuple[int, set[str]]:
        """How many tool calls the last assistant message asked for, and the ids of those
        past its first `cap` (max_tool_calls_per_turn): answered without being run."""
        for m in reversed(self.messages):
            if m.role == "assistant":
                return len(m.tool_calls), {c.id for c in m.tool_calls[cap:]}
        return 0, set()

    def final_answer(self) -> str | None:
        """The content of a trailing assistant message without tool calls (a finish).

        An empty one is not a finish (the model step nudges, or stops the run as
        `empty_answer`), nor is one followed by a nudge (a cut-off answer: the model goes on).
        An answer that continues cut-off ones (each followed by CUT_NUDGE) is their whole
        text, joined: the model was told to go on exactly where it stopped.
        """
        ms = self.messages
        last = ms[-1] if ms else None
        if (
            last is None
            or last.role != "assistant"
            or last.tool_calls
            or not without_reasoning(last.content or "").strip()
        ):  # only a <think> block: no answer
            return None
        parts, i = [last.content or ""], len(ms) - 2
        while (
            i >= 1
            and ms[i].role == "user"
            and ms[i].content == CUT_NUDGE
            and ms[i - 1].role == "assistant"
            and not ms[i - 1].tool_calls
        ):
            parts.append(ms[i - 1].content or "")
            i -= 2
        return "".join(reversed(parts))


def storable_message(m: Message) -> Message:
    """`m` as the store will hold it (store/storable.py): the history in memory must be the
    history a resume reads back, or the tool calls run, their keys and the request hash
    would differ after a resume. The same object when it is clean (nearly always)."""
    texts = [
        m.content,
        m.tool_call_id,
        *(t for c in m.tool_calls for t in (c.id, c.name, c.arguments)),
    ]
    if all(storable(t) is t for t in texts):
        return m
    calls = tuple(
        ToolCall(id=storable(c.id), name=storable(c.name), arguments=storable(c.arguments))
        for c in m.tool_calls
    )
    return Message(
        m.role, storable(m.content), tool_calls=calls, tool_call_id=storable(m.tool_call_id)
    )


def rebuild(
    run_id: str,
    messages: list[Message],
    *,
    active_ms: int,
    model_tokens: tuple[int, int],
    compactions: Sequence[Any] = (),
    last_model_output: StepOutput | None = None,
    window: Window | None = None,
    paid: tuple[int, float | None] = (0, None),
    older: Older | None = None,
) -> RunState:
    """The state after the recorded messages. Totals are derived from the rows, never
    trusted from the run's counters: those are a cache for people's queries, and a counter
    written from memory after a failed commit must not make a run unresumable.

    `messages` may hold GONE below `older.start` (the messages the store did not read):
    `older` is what the state needs of them, counted from their rows."""
    state = RunState(
        run_id=run_id,
        messages=[],
        history=HistoryHash(),
        step_count=0,
        tool_call_count=0,
        prompt_tokens=model_tokens[0],
        completion_tokens=model_tokens[1],
        active_ms=active_ms,
        window=window or Window(),
        cached_tokens=paid[0],
        cost=paid[1],
    )
    older = older or Older()
    answered: set[str] = {
        m.tool_call_id for m in messages if m is not GONE and m.role == "tool" and m.tool_call_id
    }
    state.ids_below = max(HEAD, older.start)
    state.step_count = older.assistants
    kept = state.messages
    kept.extend(messages)  # every seq in its place; those read are made storable below
    # Only the places that hold a message, and where the window or the view starts: a long
    # run's resume has tens of thousands of GONE places and reads a few thousand messages.
    marks = {i for i in (state.window.messages, older.start) if i < len(messages)}
    for i in sorted(marks.union(i for i, m in enumerate(messages) if m is not GONE)):
        m = messages[i]
        if i == state.window.messages and i:  # a person spoke: "in a row" starts over
            state.last_fingerprint, state.repeat_streak = None, 0
        if i == older.start and older.start > HEAD:
            # The streak the calls before here ended with, as far as it counts in this window.
            streak = sum(1 for seq in older.streak_seqs if seq >= state.window.messages)
            state.last_fingerprint = older.streak_fingerprint if streak else None
            state.repeat_streak = streak
        if m is GONE:
            continue
        kept[i] = storable_message(m)
        if m.role == "assistant":
            state.step_count += 1  # one model call per assistant message
            for call in m.tool_calls:
                state.used_call_ids.add(call.id)
                if call.id in answered or call.id in older.answered_below:
                    state.note_tool_call(call)
    # The calls the results not read answer, counted by the store apart from these.
    state.tool_call_count = len(answered) + older.answered
    for output in compactions:
        if isinstance(output, dict):
            state.view.apply(output, state.messages)
    state.dropped = max(HEAD, older.start)  # the store left those out already
    state.drop_replaced()
    # Hashed once, as sent (the view's messages): not message by message and then again.
    state.history = request_hash(state.request())
    state.calibration = 1.0 if last_model_output is None else calibration_of(last_model_output)
    return state


def calibration_of(out: StepOutput) -> float:
    """The calibration a model step's output implies: reported prompt tokens / our count."""
    if not isinstance(out, ModelOutput) or out.context is UNSET or out.usage.estimated is True:
        return 1.0
    return calibrate(out.context.counted, out.usage.prompt_tokens)
