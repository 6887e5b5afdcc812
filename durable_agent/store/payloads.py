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
    reasoning: str | UnsetType = UNSET  # the provider's thinking text (never sent back)
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


# -- memory (loop/memory_step.py) -----------------------------------------------------------
class MemoryFileRecord(_Payload, frozen=True):
    path: str
    sha256: str
    bytes: int


class MemoryInput(_Payload, frozen=True):
    dir: str  # the task's folder, relative to the workspace root
    files: list[MemoryFileRecord]
    sha256: str  # of `text`: the run's memory_sha256
    cut: int  # bytes left out over the cap
    text: str  # the system message's content, as sent


class MemoryOutput(_Payload, frozen=True):
    sha256: str | None
    files: list[MemoryFileRecord] | None
    message: int | None  # seq of the memory message it added (None: the text was in effect)


# -- user_message (`continue`) ---------------------------------------------------------------
class UserMessageInput(_Payload, frozen=True):
    sha256: str  # of the message as the person gave it (the key's hash)
    chars: int
    message: str  # whole up to INLINE_CHARS; beyond, a head (`cut`), the messages row is whole
    cut: bool | UnsetType = UNSET


class Window(_Payload, frozen=True):
    """The run's totals when a turn began: its budgets count from here (the totals go on)."""

    model_calls: int = 0
    tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    active_ms: int = 0
    messages: int = 0  # the history's length before the turn's first message
    cost: float = 0.0  # the steps' priced cost so far


class UserMessageOutput(_Payload, frozen=True):
    window: Window
    message_seq: int  # the messages row of the person's message
    closed_calls: list[str] | UnsetType = UNSET  # tool calls left without a result, answered


# -- hook ----------------------------------------------------------------------------------
class HookInput(_Payload, frozen=True):
    event: str
    command: str
    idempotent: bool
    tool: str | UnsetType = UNSET  # pre_tool, post_tool: the call's tool


class HookOutput(_Payload, frozen=True):
    event: str
    command: str
    exit_code: int | None  # None: timed out, cancelled, or not run again after a crash
    stdout: str
    stderr: str
    timed_out: bool | UnsetType = UNSET
    not_run: str | UnsetType = UNSET  # why it was not run (again)
    workspace_note: str | UnsetType = UNSET


StepInput = (
    ModelInput
    | ToolInput
    | VerifyInput
    | CompactInput
    | MemoryInput
    | UserMessageInput
    | HookInput
    | Unknown
)
StepOutput = (
    ModelOutput
    | ToolOutput
    | VerifyOutput
    | CompactOutput
    | MemoryOutput
    | UserMessageOutput
    | HookOutput
    | Unknown
)

_INPUTS: dict[str, type[Any]] = {
    StepKind.MODEL: ModelInput,
    StepKind.TOOL: ToolInput,
    StepKind.VERIFY: VerifyInput,
    StepKind.COMPACT: CompactInput,
    StepKind.MEMORY: MemoryInput,
    StepKind.USER_MESSAGE: UserMessageInput,
    StepKind.HOOK: HookInput,
    StepKind.DELEGATE: ToolInput,
}
_OUTPUTS: dict[str, type[Any]] = {
    StepKind.MODEL: ModelOutput,
    StepKind.TOOL: ToolOutput,
    StepKind.VERIFY: VerifyOutput,
    StepKind.COMPACT: CompactOutput,
    StepKind.MEMORY: MemoryOutput,
    StepKind.USER_MESSAGE: UserMessageOutput,
    StepKind.HOOK: HookOutput,
    StepKind.DELEGATE: ToolOutput,
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
