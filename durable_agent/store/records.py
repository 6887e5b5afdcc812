"""Typed records: what crosses the `store/` boundary instead of SQLAlchemy rows.

Frozen structs (msgspec) with the column names as fields, built once from a row (`from_row`),
so code above the store never handles `Row[Any]` and a misspelt column is a type error.
The string enums compare equal to the text stored in the columns users query.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import Any, Self

from msgspec import Struct

from durable_agent.store.payloads import StepInput, StepOutput, decode_input, decode_output


class StepState(StrEnum):
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"


class Decision(StrEnum):
    APPROVED = "approved"
    DENIED = "denied"


class ApprovalKind(StrEnum):
    """Why a person is asked: a command the policy will not run alone, or an effect cut off."""

    APPROVAL_REQUIRED = "approval_required"
    UNCERTAIN_SIDE_EFFECT = "uncertain_side_effect"
    WORKSPACE_DRIFT = "workspace_drift"  # resume found the files differ from the last snapshot
    CHANGED_SINCE_CHECKPOINT = "changed_since_checkpoint"  # loop/versions.py: consent to go on


class _Record(Struct, frozen=True):
    @classmethod
    def from_row(cls, row: Any) -> Self:
        """Build from a row (or any object) that has at least the record's columns."""
        mapping = row._mapping if hasattr(row, "_mapping") else row
        return cls(**{name: _get(mapping, name) for name in cls.__struct_fields__})


def _get(mapping: Any, name: str) -> Any:
    try:
        return mapping[name]
    except (KeyError, TypeError):
        return getattr(mapping, name, None)


class RunRecord(_Record, frozen=True):
    id: str
    task: str
    workspace: str
    model: str
    status: str
    stop_reason: str | None
    answer: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    step_count: int
    tool_call_count: int
    prompt_tokens: int
    completion_tokens: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    lease_epoch: int
    cancel_requested: bool
    settings: dict[str, Any] | None
    message_count: int
    active_ms: int
    resume_count: int
    forked_from: str | None = None  # 0006: `fork` lineage
    fork_seq: int | None = None
    tree_start: str | None = None  # 0006: workspace snapshot at creation
    version_key: str | None = None  # 0009: what a worker must share to claim it
    batch_id: str | None = None  # 0010: fleets (docs/fleets.md)
    priority: int = 0
    queue_key: str | None = None
    cached_tokens: int | None = None  # 0011: costs and the run's trace
    cost: float | None = None
    trace_id: str | None = None
    parent_id: str | None = None  # 0014: the run that delegated this one
    parent_step: int | None = None  # 0014: ... in its step with this seq


class StepRecord(_Record, frozen=True, dict=True):
    """A step's row. `input`/`output` are the JSON as stored (shown, exported, written
    back); `typed_input`/`typed_output` are the same values as their kind's struct
    (store/payloads.py), decoded on first use and kept: never a field, never raises."""

    run_id: str
    seq: int
    kind: str
    state: str
    idempotency_key: str
    call_id: str | None
    tool_name: str | None
    input: Any
    output: Any
    error: str | None
    attempts: int
    prompt_tokens: int | None
    completion_tokens: int | None
    started_at: datetime
    finished_at: datetime | None
    duration_ms: int | None
    turn: int | None
    effect: str | None
    pgid: int | None
    lease_epoch: int | None
    tree_before: str | None = None  # 0006: workspace snapshots (workspace/)
    tree_id: str | None = None
    cached_tokens: int | None = None  # 0011: of prompt_tokens, from the provider's cache
    cost: float | None = None

    @cached_property
    def typed_input(self) -> StepInput:
        return decode_input(self.kind, self.input)

    @cached_property
    def typed_output(self) -> StepOutput:
        return decode_output(self.kind, self.output)


class ApprovalRecord(_Record, frozen=True):
    id: int
    run_id: str
    call_id: str
    step_seq: int | None
    kind: str
    tool_name: str | None
    command: str | None
    reason: str | None
    requested_at: datetime
    decision: str | None
    decided_by: str | None
    decided_at: datetime | None
    used_at: datetime | None
    restore_workspace: bool | None = None  # 0006: `approve --restore`


class MessageRecord(_Record, frozen=True):
    run_id: str
    seq: int
    role: str
    content: str | None
    tool_calls: Any
    tool_call_id: str | None
    step_seq: int | None
    created_at: datetime


class FileChange(Struct, frozen=True):
    """One file a step changed (a row of the `step_changes` view)."""

    path: str
    change: str
    bytes: int | None
