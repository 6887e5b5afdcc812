"""Who decides: the policy (config/policy.py) for calls, and the questions a run asks a person.

A question is a row in `approvals`; asking stops the run `blocked` with a `LoopExit` that
says how to answer. An answered question is used once, in the transaction of the step that
acts on it. The shell policy decides only which commands need a person; it is not what
contains them.
"""

from __future__ import annotations

from durable_agent.config.policy import PolicyDecision, PolicyInput, decide
from durable_agent.config.settings import Settings
from durable_agent.errors import LoopExit
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import ToolCall
from durable_agent.status import StopReason
from durable_agent.store.records import ApprovalKind, ApprovalRecord, Decision
from durable_agent.visible import approval_subject, call_arguments


def policy_input(settings: Settings, *, exec_tool: bool, asks: bool = True) -> PolicyInput:
    """What config/policy.py decides a call with: the rules in force, `--shell` as the
    default rule of commands, the allowlist and the always-ask patterns."""
    return PolicyInput(
        rules=settings.rules,
        shell=settings.shell,
        allowlist=settings.shell_allowlist,
        always_ask=settings.shell_always_ask,
        exec_tool=exec_tool,
        asks=asks,
        workspace=str(settings.workspace),
    )


def decide_call(ctx: StepContext, call: ToolCall, *, exec_tool: bool, asks: bool) -> PolicyDecision:
    """The policy's decision for `call`. `asks` False: an exec tool that declares itself not
    destructive (an MCP tool's destructiveHint) runs unasked unless a rule says otherwise."""
    try:
        arguments: object = call.parsed_arguments()
    except ValueError:
        arguments = call.arguments
    return decide(policy_input(ctx.settings, exec_tool=exec_tool, asks=asks), call.name, arguments)


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
