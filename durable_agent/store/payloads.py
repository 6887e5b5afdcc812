"""Typed step payloads: `steps.input` and `steps.output` as one struct per step kind.

The loop writes these columns as JSON objects; users' queries and the SQL views read that
JSON, so its text stays as it is. Code above the store reads a step's payload through
`StepRecord.typed_input` / `typed_output` (decoded once, on first use), by attribute.

Decoding never fails (SPEC §5: no stored value may make a run unresumable, or `show` and
`export` fail): a value that does not match its kind's struct (a row written by hand, by
another version, a kind this version does not know) decodes to `Unknown`, which keeps the
value as it was stored. Optional keys are `UNSET` when absent, so a decoded payload encodes
back to the same JSON text the loop wrote (the order of the fields is the writers' order).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType, field

from durable_agent.status import StepKind


class _Payload(Struct, frozen=True, omit_defaults=True):
    pass


class Unknown(_Payload, frozen=True):
    """A stored value that is not its kind's shape (or NULL: no outcome yet), as stored."""

    value: Any = None


# -- model ---------------------------------------------------------------------------------
class ModelInput(_Payload, frozen=True):
    turn: int
    request_hash: str
    messages: int
    model: str
    sent_messages: int | UnsetType = UNSET  # after a compaction: how many were sent


class FunctionRecord(_Payload, frozen=True):
    name: str
    arguments: str


class CallRecord(_Payload, frozen=True):
    id: str
    type: str
    function: FunctionRecord


class UsageRecord(_Payload, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | UnsetType = UNSET  # of prompt_tokens, from the provider's cache
    estimated: bool | UnsetType = UNSET  # true: the harness's count, none was reported


class ContextCount(_Payload, frozen=True):
    counted: int  # the harness's count of the request, to calibrate the next one


class OverBudget(_Payload, frozen=True):
    tokens: int
    budget: int


class Nudge(_Payload, frozen=True):
    reason: str
    message: str


class ModelOutput(_Payload, frozen=True):
    content: str | None
    tool_calls: list[CallRecord]
    usage: UsageRecord
    context: ContextCount | UnsetType = UNSET
    over_budget: OverBudget | UnsetType = UNSET
    finish_reason: str | UnsetType = UNSET
    nudge: Nudge | UnsetType = UNSET
    raw: str | UnsetType = UNSET


# -- tool ----------------------------------------------------------------------------------
class PlanRecord(_Payload, frozen=True):
    """A write's postcondition (tools.base.WritePlan), recorded in its intent."""

    path: str
    before_sha: str | None
    after_sha: str


class ToolInput(_Payload, frozen=True):
    arguments: Any  # the call's arguments: an object, or the text when it was not JSON
    plan: PlanRecord | UnsetType = UNSET
    pgid_before_start: bool | UnsetType = UNSET  # the exec protocol the intent ran under


class ToolOutput(_Payload, frozen=True):
    result: str
    data: Any = None
    workspace_note: str | UnsetType = UNSET  # what the after snapshot left out, and why


# -- verify --------------------------------------------------------------------------------
class VerifyInput(_Payload, frozen=True):
    command: str


class VerifyOutput(_Payload, frozen=True):
    command: str
    exit_code: int | None
    timed_out: bool
    output_tail: str
    passed: bool
    workspace_note: str | UnsetType = UNSET


# -- compact -------------------------------------------------------------------------------
class CompactInput(_Payload, frozen=True):
    stage: str  # "elide" or "summarize"
    elided: int | UnsetType = UNSET
    start: int | UnsetType = UNSET
    from_: int | UnsetType = field(default=UNSET, name="from")
    tokens_before: int | UnsetType = UNSET
    model: str | UnsetType = UNSET
    request_hash: str | UnsetType = UNSET


class CompactOutput(_Payload, frozen=True):
    stage: str
    turn: int | UnsetType = UNSET
    elided: list[int] | UnsetType = UNSET
    start: int | UnsetType = UNSET
    summary: str | UnsetType = UNSET
    tokens_before: int | UnsetType = UNSET
    tokens_after: int | UnsetType = UNSET
    then: str | UnsetType = UNSET  # "summarize": decided with the elision, made next


StepInput = ModelInput | ToolInput | VerifyInput | CompactInput | Unknown
StepOutput = ModelOutput | ToolOutput | VerifyOutput | CompactOutput | Unknown

_INPUTS: dict[str, type[Any]] = {
    StepKind.MODEL: ModelInput,
    StepKind.TOOL: ToolInput,
    StepKind.VERIFY: VerifyInput,
    StepKind.COMPACT: CompactInput,
}
_OUTPUTS: dict[str, type[Any]] = {
    StepKind.MODEL: ModelOutput,
    StepKind.TOOL: ToolOutput,
    StepKind.VERIFY: VerifyOutput,
    StepKind.COMPACT: CompactOutput,
}


def decode_input(kind: Any, value: Any) -> StepInput:
    """`steps.input` of a step of `kind`, typed; `Unknown` when it is not that shape."""
    return _decode(_INPUTS, kind, value)  # type: ignore[no-any-return]


def decode_output(kind: Any, value: Any) -> StepOutput:
    """`steps.output` of a step of `kind`, typed; `Unknown` when it is not that shape."""
    return _decode(_OUTPUTS, kind, value)  # type: ignore[no-any-return]


def _decode(types: dict[str, type[Any]], kind: Any, value: Any) -> Any:
    struct = types.get(kind) if isinstance(kind, str) and isinstance(value, dict) else None
    if struct is None:
        return Unknown(value)
    try:
        return msgspec.convert(value, struct, strict=True)
    except Exception:  # noqa: BLE001 - any stored value reads (a mismatch, a value too deep)
        return Unknown(value)


def encode(payload: StepInput | StepOutput) -> bytes:
    """The JSON text of a payload (an `Unknown` is its value as stored)."""
    return msgspec.json.encode(payload.value if isinstance(payload, Unknown) else payload)
