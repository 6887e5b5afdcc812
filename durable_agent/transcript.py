"""A run as a JSONL transcript of events (SPEC §9), rebuilt from the recorded rows.

The store keeps state (runs, steps, messages, approvals), not an event log, so the events
are derived; exporting the same run twice gives the same lines.

    type                where it comes from                                `at`
    run_started         the runs row: task, model, workspace, settings     created_at
    model_completed     a model step with an outcome: content, tool calls,  finished_at
                        usage, the provider's reasoning if any (a failed
                        one has state "failed" and error)
    tool_started        a tool or verify step's intent: arguments          started_at
    tool_completed      its outcome: the result (truncated), error, data   finished_at
    memory_loaded       a memory step with an outcome: the instruction      finished_at
                        files (path, sha256, bytes), the text's sha256
    context_compacted   a compact step with an outcome: stage (elide or     finished_at
                        summarize), tokens before → after, the boundary
    approval_requested  an approvals row, with its decision if made        requested_at
    turn_started        a user_message step (`continue`): the person's      finished_at
                        message opened a new turn (`user_turn` 2, 3, …;
                        run_started opens turn 1 with the task)
    run_resumed         a new lease epoch (a resume) began                 its first event
    run_finished        the run's end, when it has one                     finished_at

Every event has `type`, `run_id`, `seq` (0, 1, 2, … in the order printed) and `at` (UTC,
ISO 8601); the payload fields sit beside them, and `step_seq` links an event to its steps row.

Where resumes go: every step row carries the `lease_epoch` of the session that wrote its
intent, and each resume takes a new epoch, so a larger epoch on the next step means a resume
came in between. An approval request always ends its session (the run stops `blocked`), and
an `uncertain_side_effect` request is always made by a resumed session. A step that a crash
interrupted and the resumed session settled without running it again keeps the epoch of its
intent: its `tool_completed` is listed before that `run_resumed` (its `at` is exact).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from msgspec import UNSET, UnsetType, to_builtins

from durable_agent.loop import stored_once
from durable_agent.status import StepKind
from durable_agent.store.payloads import (
    CompactInput,
    CompactOutput,
    MemoryInput,
    MemoryOutput,
    ModelInput,
    ModelOutput,
    ToolInput,
    ToolOutput,
    UserMessageInput,
    UserMessageOutput,
    VerifyInput,
    VerifyOutput,
)
from durable_agent.store.records import (
    ApprovalKind,
    ApprovalRecord,
    RunRecord,
    StepRecord,
    StepState,
)
from durable_agent.store.storable import storable

if TYPE_CHECKING:  # (render.py uses this module for `show`, which reads without SQLAlchemy)
    from durable_agent.store.runs import Store

T = TypeVar("T")

EVENT_TYPES = (
    "run_started",
    "model_completed",
    "tool_started",
    "tool_completed",
    "context_compacted",
    "turn_started",
    "approval_requested",
    "run_resumed",
    "run_finished",
)

RESULT_CAP = 2000  # characters of a tool result kept in a transcript line
ENDED = {"completed", "failed", "budget_exceeded", "cancelled", "blocked"}


def iso_utc(value: datetime | None) -> str | None:
    """Times are stored as naive UTC; say so in the text."""
    return None if value is None else value.isoformat() + "Z"


def events(store: Store, run_id: str) -> Iterator[dict[str, Any]]:
    """The transcript of one run, read from `store` (a journal.Store)."""
    run = store.get_run(run_id)
    steps = store.steps(run_id)
    if stored_once.needs_messages(steps):  # a big answer is whole only in its messages rows
        steps = stored_once.whole(steps, store.messages(run_id))
    said: dict[int, str] = {}
    if any(_cut(s) for s in steps):  # a long message of a person's: whole in its row only
        said = {
            m.step_seq: m.content or ""
            for m in store.messages(run_id)
            if m.role == "user" and m.step_seq is not None
        }
    yield from build_events(run, steps, store.approvals(run_id), said)


def _cut(s: StepRecord) -> bool:
    given = s.typed_input
    return isinstance(given, UserMessageInput) and given.cut is True


def build_events(
    run: RunRecord,
    steps: list[StepRecord],
    approvals: list[ApprovalRecord],
    said: dict[int, str] | None = None,
) -> list[dict[str, Any]]:
    """Pure: rows in, numbered events out (tests call it with rows from a real store).
    `said`: the whole text of long user messages, by the seq of their step."""
    body = _merge(_step_events(run, steps, said or {}), [_approval_event(a) for a in approvals])
    body = _place_resumes(body, run)
    out = [_run_started(run), *body]
    if run.status in ENDED:
        out.append(_run_finished(run))
    for seq, event in enumerate(out):
        event["seq"] = seq
        event["run_id"] = run.id
    # Fixed key order: type, run_id, seq, at, then the payload (readable with `head`).
    return [
        {
            "type": e.pop("type"),
            "run_id": e.pop("run_id"),
            "seq": e.pop("seq"),
            "at": e.pop("at"),
            **e,
        }
        for e in out
    ]


# -- one event per row ---------------------------------------------------------------------
def _run_started(run: RunRecord) -> dict[str, Any]:
    return {
        "type": "run_started",
        "at": iso_utc(run.created_at),
        "task": run.task,
        "model": run.model,
        "workspace": run.workspace,
        "settings": run.settings,
    }


def _run_finished(run: RunRecord) -> dict[str, Any]:
    return {
        "type": "run_finished",
        "at": iso_utc(run.finished_at or run.updated_at),
        "status": run.status,
        "stop_reason": run.stop_reason,
        "answer": run.answer,
        "error": run.error,
        "model_calls": run.step_count,
        "tool_calls": run.tool_call_count,
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "messages": run.message_count,
        "active_ms": run.active_ms,
        "resume_count": run.resume_count,
    }


def _model_name(run: RunRecord, s: StepRecord) -> str:
    intent = s.typed_input
    return intent.model if isinstance(intent, ModelInput) else run.model


def _step_events(
    run: RunRecord, steps: list[StepRecord], said: dict[int, str]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    user_turn = 1  # the task's
    for s in steps:
        common = {
            "step_seq": s.seq,
            "turn": s.turn,
            "attempts": s.attempts,
            "_epoch": s.lease_epoch,
            "_time": s.started_at,
        }
        if s.kind == StepKind.MODEL:
            if s.finished_at is None:
                continue  # a call in flight (or cut off by a crash): nothing came back yet
            out.append(
                {
                    "type": "model_completed",
                    "at": iso_utc(s.finished_at),
                    **common,
                    "state": s.state,
                    "model": _model_name(run, s),
                    **_model_payload(s),
                    "duration_ms": s.duration_ms,
                    "error": s.error,
                }
            )
            continue
        if s.kind == StepKind.COMPACT:
            if s.finished_at is not None:
                out.append(_compact_event(s, common))
            continue
        if s.kind == StepKind.MEMORY:
            if s.finished_at is not None:
                out.append(_memory_event(s, common))
            continue
        if s.kind == StepKind.USER_MESSAGE:
            if s.state == StepState.COMPLETED:  # (one cut off by a crash added nothing)
                user_turn += 1
                out.append(_turn_event(s, common, user_turn, said))
            continue
        tool = {"call_id": s.call_id, "tool_name": s.tool_name, "kind": s.kind}
        out.append(
            {
                "type": "tool_started",
                "at": iso_utc(s.started_at),
                **common,
                **tool,
                "effect": s.effect,
                "arguments": _arguments(s),
            }
        )
        if s.finished_at is not None:
            out.append(
                {
                    "type": "tool_completed",
                    "at": iso_utc(s.finished_at),
                    **common,
                    **tool,
                    "_time": s.finished_at,
                    "state": s.state,
                    **_result_payload(s),
                    "error": s.error,
                    "duration_ms": s.duration_ms,
                }
            )
    return out


def as_dict(value: Any) -> dict[str, Any]:
    """A JSON column read as an object: {} when a row (written by hand, by another version)
    holds something else there. Readers never assume a stored shape."""
    return value if isinstance(value, dict) else {}


def _model_payload(step: StepRecord) -> dict[str, Any]:
    output = step.typed_output
    columns = {"prompt_tokens": step.prompt_tokens, "completion_tokens": step.completion_tokens}
    if not isinstance(output, ModelOutput):  # no outcome, or not this version's shape
        return {"content": None, "tool_calls": [], "usage": columns}
    calls = [
        {"id": c.id, "name": c.function.name, "arguments": _maybe_json(c.function.arguments)}
        for c in output.tool_calls
    ]
    usage = to_builtins(output.usage)
    payload = {"content": output.content, "tool_calls": calls, "usage": usage}
    if isinstance(output.reasoning, str):  # the provider's thinking, when it sent some
        payload["reasoning"] = output.reasoning
    return payload


def _compact_event(step: StepRecord, common: dict[str, Any]) -> dict[str, Any]:
    out, intent = step.typed_output, step.typed_input
    done = out if isinstance(out, CompactOutput) else CompactOutput(stage="")
    stage = done.stage or (intent.stage if isinstance(intent, CompactInput) else None)
    return {
        "type": "context_compacted",
        "at": iso_utc(step.finished_at),
        **common,
        "state": step.state,
        "stage": stage,
        "tokens_before": _set(done.tokens_before),
        "tokens_after": _set(done.tokens_after),
        "elided": _set(done.elided) or [],
        "summary_start": _set(done.start),
        "summary": _set(done.summary),
        "usage": {"prompt_tokens": step.prompt_tokens, "completion_tokens": step.completion_tokens},
        "duration_ms": step.duration_ms,
        "error": step.error,
    }


def _turn_event(
    step: StepRecord, common: dict[str, Any], user_turn: int, said: dict[int, str]
) -> dict[str, Any]:
    given, out = step.typed_input, step.typed_output
    text = given.message if isinstance(given, UserMessageInput) else None
    closed = out.closed_calls if isinstance(out, UserMessageOutput) else UNSET
    return {
        "type": "turn_started",
        "at": iso_utc(step.finished_at),
        **common,
        "_time": step.finished_at,
        "user_turn": user_turn,
        "message": said.get(step.seq, text),
        "sha256": given.sha256 if isinstance(given, UserMessageInput) else None,
        "closed_calls": _set(closed) or [],
    }


def _set(value: T | UnsetType) -> T | None:
    """A payload's optional key: None when the row does not have it."""
    return None if value is UNSET else value


def _arguments(step: StepRecord) -> Any:
    intent = step.typed_input
    if step.kind == StepKind.VERIFY:
        return {"command": intent.command if isinstance(intent, VerifyInput) else None}
    return intent.arguments if isinstance(intent, ToolInput) else None


def _result_payload(step: StepRecord) -> dict[str, Any]:
    output = step.typed_output
    data: Any
    if isinstance(output, ToolOutput):
        text, data = output.result, output.data
    elif isinstance(output, VerifyOutput):  # a verify step records its check, not a tool result
        text = output.output_tail
        data = {k: v for k, v in to_builtins(output).items() if k != "output_tail"}
    else:  # no outcome, or not this version's shape
        return {"result": None, "result_chars": 0, "truncated": False, "data": None}
    kept = (
        text
        if len(text) <= RESULT_CAP
        else text[:RESULT_CAP] + f"…[truncated: {len(text)} chars in all]"
    )
    return {
        "result": kept,
        "result_chars": len(text),
        "truncated": len(text) > RESULT_CAP,
        "data": data,
    }


def _approval_event(a: ApprovalRecord) -> dict[str, Any]:
    return {
        "type": "approval_requested",
        "at": iso_utc(a.requested_at),
        "_time": a.requested_at,
        "approval_id": a.id,
        "approval_kind": a.kind,
        "call_id": a.call_id,
        "tool_name": a.tool_name,
        "command": a.command,
        "reason": a.reason,
        "decision": a.decision,
        "decided_by": a.decided_by,
        "decided_at": iso_utc(a.decided_at),
        "used_at": iso_utc(a.used_at),
    }


def _maybe_json(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return storable(json.loads(text))  # JSON text may spell a lone surrogate or NUL
    except (ValueError, RecursionError):
        return text  # malformed (or too deep) arguments are part of the story: kept as written


# -- ordering ------------------------------------------------------------------------------
def _merge(
    step_events: list[dict[str, Any]], approval_events: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Steps keep their seq order (the truth); each approval goes before the first step event
    that happened after it was requested."""
    out: list[dict[str, Any]] = []
    pending = sorted(approval_events, key=lambda e: (e["_time"], e["approval_id"]))
    for event in step_events:
        while pending and pending[0]["_time"] <= event["_time"]:
            out.append(pending.pop(0))
        out.append(event)
    return out + pending


def _place_resumes(body: list[dict[str, Any]], run: RunRecord) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    epoch = 1  # the session the walk is in; the first lease is epoch 1
    fresh = False  # a run_resumed was just emitted and nothing of its session followed yet
    blocked = False  # an approval request ended the session

    def resume() -> None:
        nonlocal epoch, fresh, blocked
        epoch += 1
        out.append(
            {
                "type": "run_resumed",
                "at": None,
                "lease_epoch": epoch,
                "resume": epoch - 1,
                "after_step_seq": _last_step_seq(out),
            }
        )
        fresh, blocked = True, False

    for event in body:
        if event["type"] == "approval_requested":
            if (
                event["approval_kind"] == ApprovalKind.UNCERTAIN_SIDE_EFFECT
                and not fresh
                and epoch < run.lease_epoch
            ):
                resume()  # only a resume finds a crash's unfinished step
            blocked, fresh = True, False
        else:
            row_epoch = event.get("_epoch") or epoch
            if blocked and epoch < run.lease_epoch:
                resume()
            while epoch < row_epoch:
                resume()
            fresh = False
        out.append(event)
    while epoch < run.lease_epoch:  # resumes that wrote no step of their own
        resume()
    # A resume happened just before the first thing its session recorded: date it by that
    # (a step's start, not its end), or by the run's last write when it recorded no step.
    next_at = iso_utc(run.finished_at or run.updated_at)
    for event in reversed(out):
        if event["type"] == "run_resumed" and event["at"] is None:
            event["at"] = next_at
        began = event.pop("_time", None)
        next_at = iso_utc(began) if began is not None else event["at"]
        event.pop("_epoch", None)
    return out


def _last_step_seq(events_so_far: list[dict[str, Any]]) -> int | None:
    for event in reversed(events_so_far):
        if "step_seq" in event:
            return int(event["step_seq"])
    return None


def _memory_event(s: StepRecord, common: dict[str, Any]) -> dict[str, Any]:
    loaded = s.typed_input
    out = s.typed_output
    return {
        "type": "memory_loaded",
        "at": iso_utc(s.finished_at),
        **common,
        "_time": s.finished_at,
        "dir": loaded.dir if isinstance(loaded, MemoryInput) else None,
        "files": to_builtins(loaded.files) if isinstance(loaded, MemoryInput) else None,
        "sha256": loaded.sha256 if isinstance(loaded, MemoryInput) else None,
        "added_message": out.message if isinstance(out, MemoryOutput) else None,
    }
