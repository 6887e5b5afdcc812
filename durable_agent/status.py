"""The fixed vocabulary users script against (SPEC §3, §5): statuses, stop reasons, kinds."""

import re
from enum import StrEnum

# A run id: also a folder's name (`worker --workspace-root ROOT` runs it in ROOT/RUN_ID), so
# never `.` or `..`.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class RunStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    BUDGET_EXCEEDED = "budget_exceeded"
    CANCELLED = "cancelled"
    BLOCKED = "blocked"
    # A parent run a worker executed stopped for its child runs: no lease, no process; it is
    # `pending` again once none of its children is going (store/waiting.py). Not an end.
    WAITING = "waiting"


class StopReason(StrEnum):
    FINISHED = "finished"
    MAX_STEPS = "max_steps"
    MAX_TOOL_CALLS = "max_tool_calls"
    MAX_TOKENS = "max_tokens"
    MAX_SECONDS = "max_seconds"
    REPEATED_ACTION = "repeated_action"
    CANCELLED = "cancelled"
    MODEL_ERROR = "model_error"
    TOOL_ERROR = "tool_error"
    APPROVAL_REQUIRED = "approval_required"
    UNCERTAIN_SIDE_EFFECT = "uncertain_side_effect"
    VERIFICATION_FAILED = "verification_failed"
    STEP_MISMATCH = "step_mismatch"  # a recorded step differs from the one resume would run
    EMPTY_ANSWER = "empty_answer"  # the model answered with nothing twice in a row
    WORKSPACE_DRIFT = "workspace_drift"  # the workspace differs from the last snapshot
    # What the run runs with (release, prompt, tools, model) changed in a way that needs a
    # person's consent (loop/versions.py): `resume --accept-changes`, or `--pin`.
    CHANGED_SINCE_CHECKPOINT = "changed_since_checkpoint"


class StepKind(StrEnum):
    MODEL = "model"
    TOOL = "tool"
    VERIFY = "verify"
    COMPACT = "compact"  # the context was compacted (elided outputs, or a summary: one model call)
    MEMORY = "memory"  # project memory (AGENTS.md...) read into the history (loop/memory_step.py)
    USER_MESSAGE = "user_message"  # `continue`: a person's message opens a new turn of the history
    HOOK = "hook"  # a configured hook's command ([[hooks]], loop/hooks.py)
    VERSION = "version"  # consent to go on after what the run runs with changed (loop/versions.py)
    WORKSPACE = "workspace"  # a batch task's workspace made from its repo (docs/fleets.md)
    DELEGATE = "delegate"  # a child run made and run for a `delegate` call (loop/delegate_step.py)


class EffectClass(StrEnum):
    """How a tool touches the world; decides what resume does with an unfinished call."""

    READ = "read"
    WRITE = "write"
    EXEC = "exec"


# Status a stop reason ends the run with.
STATUS_FOR_REASON: dict[StopReason, RunStatus] = {
    StopReason.FINISHED: RunStatus.COMPLETED,
    StopReason.MAX_STEPS: RunStatus.BUDGET_EXCEEDED,
    StopReason.MAX_TOOL_CALLS: RunStatus.BUDGET_EXCEEDED,
    StopReason.MAX_TOKENS: RunStatus.BUDGET_EXCEEDED,
    StopReason.MAX_SECONDS: RunStatus.BUDGET_EXCEEDED,
    StopReason.REPEATED_ACTION: RunStatus.BUDGET_EXCEEDED,
    StopReason.CANCELLED: RunStatus.CANCELLED,
    StopReason.MODEL_ERROR: RunStatus.FAILED,
    StopReason.TOOL_ERROR: RunStatus.FAILED,
    StopReason.APPROVAL_REQUIRED: RunStatus.BLOCKED,
    StopReason.UNCERTAIN_SIDE_EFFECT: RunStatus.BLOCKED,
    StopReason.VERIFICATION_FAILED: RunStatus.FAILED,
    StopReason.STEP_MISMATCH: RunStatus.FAILED,
    StopReason.EMPTY_ANSWER: RunStatus.FAILED,
    StopReason.WORKSPACE_DRIFT: RunStatus.BLOCKED,
    StopReason.CHANGED_SINCE_CHECKPOINT: RunStatus.BLOCKED,
}

# Process exit code for each final status (SPEC §2).
EXIT_CODES: dict[RunStatus, int] = {
    RunStatus.COMPLETED: 0,
    RunStatus.FAILED: 1,
    RunStatus.BUDGET_EXCEEDED: 3,
    RunStatus.CANCELLED: 4,
    RunStatus.BLOCKED: 5,
    RunStatus.PENDING: 0,
    RunStatus.RUNNING: 6,
    RunStatus.WAITING: 0,  # queued, as `pending`: the workers go on with it
}
EXIT_USAGE = 2  # bad flag, bad configuration, unknown run id, nothing to resume
EXIT_BUSY = 6  # another live process holds the run's lease
EXIT_STORE = 7  # the store is unavailable (connection lost, disk full, I/O error): resumable

RESUMABLE = {
    RunStatus.PENDING,
    RunStatus.RUNNING,
    RunStatus.FAILED,
    RunStatus.BUDGET_EXCEEDED,
    RunStatus.CANCELLED,
    RunStatus.BLOCKED,
    RunStatus.WAITING,
}
