"""The finish gate (`--verify "CMD"`): a final answer is accepted only once CMD exits 0 in
the workspace, after the last edit. A failure's output goes back to the model as the next
observation (the rejected answer stays in the history) and the loop goes on within its
budgets. The evidence (command, exit code, output tail) is recorded as a `verify` step.
"""

from __future__ import annotations

from durable_agent.errors import LoopExit
from durable_agent.loop.heartbeat import watch_cancel
from durable_agent.loop.step import StepOutcome, StepSpec, invoke
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import Message
from durable_agent.status import StepKind, StopReason
from durable_agent.tools.os_sandbox import for_run
from durable_agent.tools.process import command_env, run_process

VERIFY_TAIL = 4000  # characters of the command's output kept as evidence and shown to the model


def verify(ctx: StepContext, answer: str) -> bool:
    """The finish gate: with --verify, a final answer counts only once the command exits 0."""
    command = ctx.settings.verify
    if not command:
        return True
    turn = ctx.state.turn
    shown = ctx.redactor.redact_known(command)  # recorded without a credential's value
    # A check, not a side effect: a started one is simply run again; a passed one stands
    # (it passed before a crash hit the finish). It can change files (build output, caches):
    # snapshots before and after it.
    spec = StepSpec(
        StepKind.VERIFY,
        f"verify:{turn}",
        turn,
        {"command": shown},
        tool_name="verify",
        label=shown,
        reuse=True,
    )
    outcome = invoke(ctx, spec, lambda _step: _check(ctx, command, shown, spec.key))
    if outcome.result is None:
        return True  # reused: passed before
    if outcome.result.cancelled:
        raise LoopExit(StopReason.CANCELLED, "cancelled during verification")
    return outcome.error is None


def _check(ctx: StepContext, command: str, shown: str, key: str) -> StepOutcome:
    """Run `command`; what is recorded names it as `shown` (no credential's value)."""
    with watch_cancel(ctx.cancel, ctx.journal, ctx.beat):
        out = run_process(
            command,
            cwd=ctx.settings.workspace,
            timeout_s=ctx.settings.command_timeout_s,
            env=command_env(
                ctx.env, run_id=ctx.state.run_id, call_id=key, passthrough=ctx.settings.command_env
            ),
            output_cap=ctx.settings.output_cap // 2,
            cancel=ctx.cancel,
            sandbox=for_run(ctx.settings.sandbox, ctx.settings.network, ctx.env, ctx.settings.db),
        )
    redact = ctx.redactor.redact
    # The end of a test run's output says what failed: keep the tail, not the head.
    text = redact((out.stdout + ("\n" + out.stderr if out.stderr else "")).strip())
    tail = (
        text if len(text) <= VERIFY_TAIL else "[... earlier output cut ...]\n" + text[-VERIFY_TAIL:]
    )
    passed = out.exit_code == 0
    if out.timed_out:
        failure = f"timed out after {ctx.settings.command_timeout_s:g} s"
    elif out.cancelled:
        failure = "cancelled"
    else:
        failure = f"exit code {out.exit_code}"
    output = {
        "command": shown,
        "exit_code": out.exit_code,
        "timed_out": out.timed_out,
        "output_tail": tail,
        "passed": passed,
    }
    if passed:
        return StepOutcome(output, duration_ms=out.duration_ms, result=out)
    new: list[Message] = []
    if not out.cancelled:
        # A cancelled check proved nothing about the answer: it is run again on resume
        # (the step stays open as failed), and the model is not told about it.
        new.append(
            Message(
                "user",
                f"Verification failed: `{command}` {failure}. Your final answer "
                f"was not accepted. Fix the problem, then answer again.\n{tail}",
            )
        )
        ctx.state.append(new[0])
    return StepOutcome(output, failure, messages=new, duration_ms=out.duration_ms, result=out)
