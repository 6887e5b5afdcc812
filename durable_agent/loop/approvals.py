"""Who decides: the shell policy for commands, and the questions a run asks a person.

A question is a row in `approvals`; asking stops the run `blocked` with a `LoopExit` that
says how to answer. An answered question is used once, in the transaction of the step that
acts on it. The shell policy decides only which commands need a person; it is not what
contains them.
"""

from __future__ import annotations

from durable_agent.errors import LoopExit
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import ToolCall
from durable_agent.status import StopReason
from durable_agent.store.records import ApprovalKind, ApprovalRecord, Decision
from durable_agent.visible import approval_subject, call_arguments


def policy(ctx: StepContext, tool_name: str, command: str, *, asks: bool = True) -> tuple[str, str]:
    """("allow" | "ask" | "deny", why) for an exec tool call under `--shell`. `asks` False:
    a tool that declares itself not destructive (an MCP tool's destructiveHint) runs unasked."""
    mode = ctx.settings.shell
    if tool_name != "run_command":
        return (
            ("allow", "")
            if mode == "allow" or not asks
            else ("ask", f"{tool_name} runs a side effect")
        )
    from durable_agent.config.shell_policy import DEFAULT_DESTRUCTIVE, decide

    destructive = (*DEFAULT_DESTRUCTIVE, *ctx.settings.shell_always_ask)
    verdict, why = decide(command, mode, ctx.settings.shell_allowlist, destructive)
    return verdict.value, why


def decided(
    ctx: StepContext,
    call: ToolCall,
    kind: ApprovalKind,
    command: str | None,
    reason: str,
    step_seq: int | None = None,
    *,
    used_too: bool = False,
) -> ApprovalRecord:
    """A decided approval of this call, or record the question and stop the run `blocked`.
    `used_too`: one used by an attempt that never began counts (it was never acted on)."""
    approval = ctx.journal.approval_for(call.id, kind, used_too=used_too)
    if approval is not None and approval.decision is not None:
        return approval
    # The command comes from the model and is shown to people: stored as it will run (the
    # harness's own secrets were replaced already, see model_step._call_ids).
    command = ctx.redactor.redact_known(command) if command else command
    reason = ctx.redactor.redact(reason)
    ctx.journal.request_approval(
        call_id=call.id,
        kind=kind,
        tool_name=call.name,
        command=command,
        reason=reason,
        step_seq=step_seq,
    )
    stop = (
        StopReason.APPROVAL_REQUIRED
        if kind is ApprovalKind.APPROVAL_REQUIRED
        else StopReason.UNCERTAIN_SIDE_EFFECT
    )
    # Named by its tool (and MCP server), its arguments readable (as presentation.py shows it).
    what = approval_subject(call.name, command)
    if command and call_arguments(command, width=10**9) in reason:
        what = approval_subject(call.name, None)  # the policy's reason names the command
    raise LoopExit(
        stop,
        f"{what} needs approval: {reason}. "
        f"Run `durable-agent approve {ctx.state.run_id}` (or --deny), then resume.",
    )


def denied(approval: ApprovalRecord | None) -> bool:
    return approval is not None and approval.decision == Decision.DENIED


def settle_by_policy(ctx: StepContext, call: ToolCall) -> int | None:
    """A question asked under `--shell ask` that the policy now answers (resumed with
    `--shell allow`): record it as approved by the policy, not left pending forever."""
    pending = ctx.journal.approval_for(call.id, ApprovalKind.APPROVAL_REQUIRED)
    if pending is None or pending.decision is not None:
        return None
    ctx.journal.settle_approval(pending.id, by=f"policy (--shell {ctx.settings.shell})")
    return pending.id
