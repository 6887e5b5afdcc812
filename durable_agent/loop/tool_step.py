"""Executing one tool call durably, by effect class: the decisions. The protocol (intent,
snapshots, events, outcome) is the step primitive's (loop/step.py).

    read   no intent row: run, then the outcome rides with the next commit (a crash re-runs it)
    write  with a plan: intent with the file's before/after hashes, write, outcome; resume
           compares hashes. Without (idempotent): intent, write, outcome; resume runs it again
    exec   policy check (maybe `blocked`), intent, process group recorded, run, outcome;
           resume never re-runs an interrupted command without a person's approval (one
           cut off before its process group was recorded never began: it is run)

Every call ends with exactly one tool message, error or not, so the history sent to the
model stays valid. Store failures are not tool failures: they propagate and end the session.
"""

from __future__ import annotations

import json
import os
import time
from typing import cast

from msgspec import UNSET
from pydantic import BaseModel, ValidationError

from durable_agent.config.policy import Verdict
from durable_agent.config.settings import validation_text
from durable_agent.errors import (
    LeaseLost,
    LoopExit,
    StoreError,
    StoreUnavailable,
)
from durable_agent.loop import approvals, guard, hooks, stored_once
from durable_agent.loop.heartbeat import watch_cancel
from durable_agent.loop.observation import observed, refuse
from durable_agent.loop.step import EndThenRaise, StepCall, StepOutcome, StepSpec, open_step
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import HEAD, UNNAMED_TOOL, ToolCall, sha256_text
from durable_agent.status import EffectClass, StepKind
from durable_agent.store.payloads import ToolInput
from durable_agent.store.records import ApprovalKind, StepRecord, StepState
from durable_agent.store.step import Step
from durable_agent.store.storable import storable
from durable_agent.tools.base import (
    Declared,
    Tool,
    ToolContext,
    ToolFailure,
    ToolResult,
    WritePlan,
    WriteTool,
    declared,
)
from durable_agent.tools.delegate import Delegate
from durable_agent.tools.os_sandbox import for_run
from durable_agent.tools.sandbox import resolve

UNCERTAIN = ApprovalKind.UNCERTAIN_SIDE_EFFECT
PGID_FIRST = "pgid_before_start"  # a tool's declaration (ExecTool), and the intent's record of it


def tool_key(call: ToolCall) -> str:
    return f"tool:{call.id}:{sha256_text(call.name + call.canonical_arguments())[:32]}"


def over_cap(asked: int, cap: int) -> str:
    """The result of a call past max_tool_calls_per_turn."""
    return (
        f"not run: this answer asked for {asked} tool calls and at most {cap} are run per "
        "answer (max_tool_calls_per_turn); ask again for those still needed, fewer at a time"
    )


def run_tool(ctx: StepContext, call: ToolCall, *, over_cap: str | None = None) -> None:
    """Check budgets and repeats, then run the call by its tool's effect class. `over_cap`:
    the call is past the answer's max_tool_calls_per_turn, answered with that text, not
    run (unless a crash cut it off after it began: then it is reconciled as ever)."""
    s = ctx.state
    tool = ctx.tools.get(call.name)
    spec = StepSpec(
        StepKind.TOOL,
        tool_key(call),
        s.turn,
        stored_once.call_input(call),
        effect=tool.effect if tool is not None else None,
        call_id=call.id,
        tool_name=call.name,
        label=call.name,
        detail=_brief(call),
    )
    # Past the cap: answered "not run", unless a crash cut it off after it began (then it
    # is reconciled below, as ever).
    opened = open_step(ctx, spec) if over_cap is not None else None
    if opened is not None and over_cap is not None and opened.prior is None:
        return refuse(ctx, call, opened, over_cap)
    streak = s.repeat_streak + 1 if call.fingerprint() == s.last_fingerprint else 1
    w = s.window  # budgets count from the turn's start (`continue`); the totals go on
    stop = guard.before_tool_call(
        ctx.limits,
        tool_calls=s.tool_call_count - w.tool_calls,
        streak_if_run=streak,
        active_ms=ctx.active_ms() - w.active_ms,
    )
    if stop is not None:
        raise LoopExit(stop[0], stop[1] + guard.since_continue(w.messages))
    if isinstance(tool, Delegate) and over_cap is None:
        from durable_agent.loop.delegate_step import delegate_call  # (it uses this module's kin)

        return delegate_call(ctx, call, tool_key(call))
    # Before its step is opened: a hook is a step of its own (run once: a resume reuses it).
    blocked = hooks.pre_tool(ctx, call) if over_cap is None and tool is not None else None
    step = opened or open_step(ctx, spec)
    prior = step.prior
    if blocked is not None and prior is None:
        return refuse(ctx, call, step, f"blocked by a pre_tool hook: {blocked}")
    if tool is None and prior is not None and prior.effect == EffectClass.EXEC:
        # A command cut off by a crash, resumed where the tool is not offered (--shell deny).
        return refuse(
            ctx,
            call,
            step,
            "the command was interrupted by a crash; its outcome is unknown and it was not run "
            "again (running commands is not allowed now)",
        )
    if tool is None:
        known = ", ".join(sorted(ctx.tools))
        if call.name == UNNAMED_TOOL:  # say what happened, not the placeholder's name
            return refuse(
                ctx,
                call,
                step,
                f"the tool call had no function name (`function` was missing, null or without a "
                f"`name`), so nothing was run; name one of the available tools: {known}",
            )
        return refuse(ctx, call, step, f"unknown tool {call.name!r}; available tools: {known}")
    try:
        args = tool.args_model.model_validate(call.parsed_arguments())
    except ValueError as exc:  # bad JSON (json.JSONDecodeError is a ValueError) or not an object
        detail = (
            validation_text(exc, "arguments")
            if isinstance(exc, ValidationError)
            else f"arguments are not valid JSON: {exc}"
            if isinstance(exc, json.JSONDecodeError)
            else str(exc)
        )
        return refuse(ctx, call, step, f"invalid arguments for {call.name}: {detail}")
    protocol = declared(tool)
    if tool.effect is EffectClass.EXEC:
        return _exec(ctx, call, step, tool, args, protocol)
    use: int | None = None
    if prior is None:  # the rules decide a fresh call; an interrupted one was decided
        decision = approvals.decide_call(ctx, call, exec_tool=False, asks=protocol.asks)
        if decision.verdict is Verdict.DENY:
            return refuse(ctx, call, step, f"not allowed by the policy: {decision.reason}")
        if decision.verdict is Verdict.ASK:
            approval = approvals.decided(
                ctx, call, ApprovalKind.APPROVAL_REQUIRED, call.arguments, decision.reason
            )
            if approvals.denied(approval):
                return refuse(
                    ctx,
                    call,
                    step,
                    f"the user denied this {call.name} call; do not make it again",
                    use_approval=approval.id,
                )
            use = approval.id
    if tool.effect is EffectClass.WRITE and protocol.planned:
        return _write(ctx, call, step, cast(WriteTool, tool), args, use)
    # A read, or an idempotent write without a postcondition to check (an MCP tool annotated
    # idempotent, a plugin's): an interrupted one is simply run again.
    step.run(
        lambda _step: observed(ctx, call, _invoke(ctx, tool, args, call), use_approval=use),
        use_approval=use,
    )


def _write(
    ctx: StepContext,
    call: ToolCall,
    step: StepCall,
    tool: WriteTool,
    args: BaseModel,
    use: int | None = None,
) -> None:
    prior = step.prior
    run = lambda _step: observed(ctx, call, _invoke(ctx, tool, args, call))  # noqa: E731
    if prior is None:
        try:
            planned = tool.plan(args, _tool_ctx(ctx, call))
        except (ToolFailure, OSError, ValueError) as exc:  # nothing was written: an observation
            message = str(exc) if isinstance(exc, ToolFailure) else f"{type(exc).__name__}: {exc}"
            return refuse(ctx, call, step, message)
        # Its fields, not the object: a plugin's plan may be any object that has them.
        recorded = {
            "path": planned.path,
            "before_sha": planned.before_sha,
            "after_sha": planned.after_sha,
        }
        step.run(
            run,
            input={**stored_once.call_input(call), "plan": recorded},
            use_approval=use,
            writes=_written(ctx, planned.path),
        )
        return None
    # Interrupted write: did it land? The recorded hashes decide, not a guess.
    plan = _recorded_plan(prior)
    current: str | None
    if plan is None:  # an intent without a readable plan (a hand-written row): ask
        current, path = "unknown: no readable plan on record", getattr(args, "path", call.name)
    else:
        path = plan.path
        try:
            current = tool.current_sha(plan, _tool_ctx(ctx, call))
        except (ToolFailure, OSError) as exc:  # unreadable now: neither before nor after: drift
            current = f"unreadable: {exc}"
        if current == plan.after_sha:
            step.record(
                observed(
                    ctx,
                    call,
                    ToolResult(
                        output=f"{plan.path} already has the intended content (the write completed before the interruption)"
                    ),
                )
            )
            return None
    if plan is None or current != plan.before_sha:
        approval = approvals.decided(
            ctx,
            call,
            UNCERTAIN,
            None,
            f"{path} changed since the interrupted write (drift): it has "
            "neither the content before nor the content after the write"
            if plan is not None
            else f"the interrupted write to {path} recorded no readable plan: "
            "whether it landed is unknown",
            step_seq=prior.seq,
        )
        if approvals.denied(approval):
            return refuse(
                ctx,
                call,
                step,
                f"the write to {path} was interrupted and the file changed since; "
                "the user chose not to apply it again",
                use_approval=approval.id,
            )
        use = approval.id
    step.run(run, use_approval=use, writes=_written(ctx, plan.path) if plan else None)
    return None


def _written(ctx: StepContext, path: str) -> list[bytes] | None:
    """The workspace-relative path a plan names (a file tool writes that file alone: the
    snapshots look at it, not at the whole tree); None when it does not name one."""
    workspace = ctx.settings.workspace
    try:
        real = resolve(workspace, path, for_write=True, store=ctx.settings.db)
        rel = os.path.relpath(real, os.path.realpath(workspace))
    except (ToolFailure, OSError, ValueError):
        return None
    if rel == "." or rel.startswith(".." + os.sep) or rel == "..":
        return None
    return [os.fsencode(rel)]


def _recorded_plan(prior: StepRecord) -> WritePlan | None:
    """The postcondition the interrupted write's intent recorded (None: none readable)."""
    intent = prior.typed_input
    if not isinstance(intent, ToolInput) or intent.plan is UNSET:
        return None
    return WritePlan(intent.plan.path, intent.plan.before_sha, intent.plan.after_sha)


def _exec(
    ctx: StepContext,
    call: ToolCall,
    step: StepCall,
    tool: Tool,
    args: BaseModel,
    protocol: Declared,
) -> None:
    command = getattr(args, "command", None) or call.arguments
    prior = step.prior
    use: int | None = None
    if prior is not None and prior.state == StepState.STARTED and not _never_began(ctx, call, step):
        # The crash hit while it ran: its outcome is unknown and it is not idempotent.
        if ctx.settings.on_uncertain_exec == "tell_model":
            return refuse(
                ctx,
                call,
                step,
                "the command was interrupted by a crash; its outcome is unknown and it was "
                "not run again. Check the workspace before relying on it.",
            )
        approval = approvals.decided(
            ctx,
            call,
            UNCERTAIN,
            command,
            "it was interrupted by a crash and may have partly or fully run; "
            "running it again may repeat its side effects" + step.changed_since_prior(),
            step_seq=prior.seq,
        )
        if approvals.denied(approval):
            return refuse(
                ctx,
                call,
                step,
                "the command was interrupted by a crash; its outcome is unknown and the user "
                "chose not to run it again",
                use_approval=approval.id,
            )
        if approval.restore_workspace:
            step.put_back_prior()  # `approve --restore`: from where it started
        use = approval.id
    else:
        decision = approvals.decide_call(ctx, call, exec_tool=True, asks=protocol.asks)
        if decision.verdict is Verdict.DENY:
            return refuse(ctx, call, step, f"not allowed by the policy: {decision.reason}")
        if (
            decision.verdict is Verdict.ASK
        ):  # (an approval the attempt that never began used still stands)
            approval = approvals.decided(
                ctx,
                call,
                ApprovalKind.APPROVAL_REQUIRED,
                command,
                decision.reason,
                used_too=prior is not None,
            )
            if approvals.denied(approval):
                return refuse(
                    ctx,
                    call,
                    step,
                    "the user denied this command; do not run it again",
                    use_approval=approval.id,
                )
            use = approval.id
        else:
            use = approvals.settle_by_policy(ctx, call)
    # The attempt's own evidence that its command waits for its process group (_never_began).
    # The spec's input, not the row's: a stored one of another shape must not stop a resume.
    intent = {**step.spec.input, PGID_FIRST: True} if protocol.pgid_before_start else None

    def run(attempt: Step) -> StepOutcome:
        try:
            with watch_cancel(ctx.cancel, ctx.journal, ctx.beat):
                result = _invoke(ctx, tool, args, call, step=attempt)
        except KeyboardInterrupt as exc:
            # The second Ctrl-C ("stop now"): run_process has killed the group on its way out.
            # Recorded before stopping, so the history stays valid and resume does not have
            # to ask a person about a command we know was cut short.
            cut = ToolResult(
                error="interrupted by the user (Ctrl-C): the command was killed and may have partly run"
            )
            raise EndThenRaise(observed(ctx, call, cut), exc) from None
        return observed(ctx, call, result)

    step.run(run, input=intent, use_approval=use)
    return None


def _tool_ctx(ctx: StepContext, call: ToolCall, step: Step | None = None) -> ToolContext:
    # Before the command starts: resume can then find its group (and knows it started).
    on_start = step.set_pgid if step is not None else None
    return ToolContext(
        workspace=ctx.settings.workspace,
        run_id=ctx.state.run_id,
        call_id=call.id,
        output_cap=ctx.settings.output_cap,
        env=ctx.env,
        command_env=tuple(ctx.settings.command_env),
        command_timeout_s=ctx.settings.command_timeout_s,
        cancel=ctx.cancel,
        on_process_start=on_start,
        sandbox=for_run(ctx.settings.sandbox, ctx.settings.network, ctx.env, ctx.settings.db),
        stored_output=lambda call_id: _stored_output(ctx, call_id),
        store=ctx.settings.db,
        before_rename=lambda: _still_ours(ctx),
    )


def _still_ours(ctx: StepContext) -> None:
    """Before a file tool's write lands: past the point where the lease its intent wrote
    surely holds (a freeze, a very slow disk), a fenced checkpoint proves the run is still
    ours and renews the lease, or raises LeaseLost and the write is never made."""
    if time.clock_gettime(time.CLOCK_BOOTTIME) > ctx.journal.start_deadline():
        ctx.journal.commit()


def _stored_output(ctx: StepContext, call_id: str) -> str | None:
    """The result recorded for `call_id` (as stored: what the model saw before any elision);
    one a summary replaced is no longer in memory (loop/replay.py): read from the store.
    The model's `call_id` is looked up as the ids are held, storable (PostgreSQL refuses a
    NUL in a statement, either driver a lone surrogate: the call would fail on each resume)."""
    call_id = storable(call_id)
    for m in reversed(ctx.state.messages):
        if m.role == "tool" and m.tool_call_id == call_id:
            return m.content or ""
    return ctx.journal.tool_result(call_id) if ctx.state.dropped > HEAD else None


def _invoke(
    ctx: StepContext,
    tool: Tool,
    args: BaseModel,
    call: ToolCall,
    step: Step | None = None,
    *,
    late_before: bool = False,
) -> ToolResult:
    from durable_agent.tools.process import StartTooLate

    try:
        result: object = tool.run(args, _tool_ctx(ctx, call, step))
    except ToolFailure as exc:
        return ToolResult(error=str(exc))
    except (StoreError, LeaseLost):
        raise  # the store failed (recording the process group): not the tool's result
    except StartTooLate as exc:
        return _started_too_late(ctx, tool, args, call, step, exc, again=not late_before)
    except Exception as exc:  # noqa: BLE001 - a tool's failure is an observation, never a crash
        return ToolResult(error=f"{type(exc).__name__}: {exc}")
    except SystemExit as exc:  # a plugin's sys.exit() would end the harness, "successfully"
        return ToolResult(error=f"the tool called sys.exit({exc.code!r})")
    return _checked(result)


def _checked(result: object) -> ToolResult:
    """What a tool returned, as the record can take it (every tool's: none is trusted by
    where it comes from). Anything else is an error
    observation: raised at recording time, it failed the run, and every resume ran the tool
    again."""
    if not isinstance(result, ToolResult):
        return ToolResult(error=f"the tool returned {type(result).__name__}, not a ToolResult")
    if not isinstance(result.output, str) or not isinstance(result.error, str | None):
        return ToolResult(error="the tool returned a ToolResult whose output or error is not text")
    try:
        if not isinstance(result.data, dict):
            raise TypeError(f"a {type(result.data).__name__}, not a dict")
        json.dumps(storable(result.data))
    except (TypeError, ValueError, RecursionError) as exc:
        why = str(exc)[:200]
        return ToolResult(
            result.output, result.error, {"data_dropped": f"not storable as JSON: {why}"}
        )
    return result


def _started_too_late(
    ctx: StepContext,
    tool: Tool,
    args: BaseModel,
    call: ToolCall,
    step: Step | None,
    exc: Exception,
    *,
    again: bool,
) -> ToolResult:
    """This process stalled between recording the command's pgid and starting it, past the
    point where its lease surely held: the command never began. For run_command, a fenced
    write says so on its row (no pgid): it raises LeaseLost when the run is another's by now.
    If it lands the run is still ours, and the command gets one more try with a fresh
    deadline; a store too slow for that twice ends the session (resume then runs the
    command: it never began)."""
    if step is None or not declared(tool).pgid_before_start:
        # Another tool's `run` may have started commands before this one: never run it again.
        raise LeaseLost(
            ctx.state.run_id, f"{exc}; another process may have taken the run over"
        ) from None
    try:
        step.clear_pgid()
    except LeaseLost:
        raise LeaseLost(ctx.state.run_id, f"{exc}; another process took it over") from None
    if again:
        return _invoke(ctx, tool, args, call, step, late_before=True)
    raise StoreUnavailable(
        f"{exc} twice: recording a command took most of the lease "
        "(raise lease_seconds, or look at the store's latency)",
        ctx.state.run_id,
    ) from None


def _never_began(ctx: StepContext, call: ToolCall, step: StepCall) -> bool:
    """An exec attempt cut off before its process group was committed, by a tool whose
    command starts only after that commit (run_command: the guard waits for it, process.py):
    it never began, and is run now without a question. Only on the attempt's own row (its
    intent names the protocol; an older row does not), with power-loss durability (`fast`
    may lose the pgid's commit after the command started), no question about it asked yet,
    and the workspace as the attempt found it."""
    prior = step.prior
    return (
        prior is not None
        and prior.pgid is None
        and isinstance(prior.typed_input, ToolInput)
        and prior.typed_input.pgid_before_start is True
        and ctx.settings.durability == "full"
        and ctx.journal.approval_for(call.id, UNCERTAIN) is None
        and step.unchanged_since_prior()
    )


def stop_leftover_processes(ctx: StepContext) -> None:
    """Before reconciling: nothing of a command recorded as started may still run."""
    from durable_agent.tools.process import kill_process_group, process_group_alive

    for step in ctx.journal.open_steps.values():
        # Only with the call id to match: a bare number may name someone else's group by now
        # (after a reboot), and our own group is never the command's.
        if (
            step.state != StepState.STARTED
            or not step.pgid
            or not step.call_id
            or step.pgid <= 1
            or step.pgid == os.getpgrp()
        ):
            continue
        if process_group_alive(step.pgid, call_id=step.call_id, run_id=step.run_id):
            kill_process_group(step.pgid, call_id=step.call_id, run_id=step.run_id)
            ctx.observer.note(
                f"killed the leftover process group {step.pgid} of call {step.call_id}"
            )


def _brief(call: ToolCall) -> str:
    args = call.arguments_or_text()
    if not isinstance(args, dict):
        return call.arguments[:60]
    first = next(iter(args.values()), "") if args else ""
    text = str(first).replace("\n", " ")
    return text[:60] + ("…" if len(text) > 60 else "")
