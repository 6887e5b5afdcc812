"""Hooks (`[[hooks]]`): a command run at an event of the run, each run a durable step.

    session_start   a session takes the run (start, resume, a worker's claim)
    resume          a session continues a run that had one before (`fire_resume`)
    pre_tool        before a tool call runs; exit 2 blocks it, stderr is the model's reason
    post_tool       after the calls of one model answer ran (their results are in the input)
    pre_compact     before the context is compacted
    stop            before a final answer is accepted; exit 2 asks the model to go on

The hook gets a JSON document on stdin (the run, the event, the tool, its arguments and
result where there is one) and runs in the sandbox like a command. Exit 0: its stdout (if
any) is a note for the model. Exit 2: it blocks (see above). Any other exit, or a timeout,
is the hook's failure: shown, and the run goes on.

Each run of a hook is a step of kind `hook` under its own idempotency key (event, where,
which hook), recorded completed whatever the hook's exit: a crash after it finished never
runs it again (its recorded outcome is used). One cut off while it ran is run again only
when declared `idempotent = true`; otherwise the run asks a person first, as for an
interrupted command (`durable-agent approve RUN`, or `--deny`: not run again).
"""

from __future__ import annotations

import fnmatch
import json
import shlex
from typing import Any

from durable_agent.config.policy import Hook, HookEvent
from durable_agent.loop import approvals
from durable_agent.loop.heartbeat import watch_cancel
from durable_agent.loop.step import StepOutcome, StepSpec, open_step
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import Message, ToolCall
from durable_agent.status import StepKind
from durable_agent.store.records import ApprovalKind, StepState
from durable_agent.tools.base import ToolFailure
from durable_agent.tools.os_sandbox import for_run
from durable_agent.tools.process import command_env, run_process

MAX_INPUT = 64_000  # characters of a tool's arguments or result in the document
BLOCK = 2


class Fired(dict[str, Any]):
    """A hook's recorded outcome (HookOutput as stored)."""

    @property
    def exit_code(self) -> int | None:
        code = self.get("exit_code")
        return code if isinstance(code, int) else None


def hooks_for(
    ctx: StepContext, event: HookEvent, tool: str | None = None
) -> list[tuple[int, Hook]]:
    return [
        (i, h)
        for i, h in enumerate(ctx.settings.hooks)
        if h.event is event and (tool is None or fnmatch.fnmatchcase(tool, h.tool))
    ]


def fire(
    ctx: StepContext,
    event: HookEvent,
    where: str,
    *,
    call: ToolCall | None = None,
    result: str | None = None,
    extra: dict[str, Any] | None = None,
) -> list[Fired]:
    """Run the hooks of `event` (for `call`'s tool) once each at `where`: their outcomes."""
    fired = []
    for index, hook in hooks_for(ctx, event, call.name if call is not None else None):
        fired.append(_run_hook(ctx, hook, index, event, where, call, result, extra or {}))
    return fired


def _run_hook(
    ctx: StepContext,
    hook: Hook,
    index: int,
    event: HookEvent,
    where: str,
    call: ToolCall | None,
    result: str | None,
    extra: dict[str, Any],
) -> Fired:
    key = f"hook:{event.value}:{where}:{index}"
    state = ctx.state
    shown = ctx.redactor.redact_known(hook.command)  # recorded without a credential's value
    recorded_input: dict[str, Any] = {
        "event": event.value,
        "command": shown,
        "idempotent": hook.idempotent,
    }
    if call is not None:
        recorded_input["tool"] = call.name
    spec = StepSpec(
        StepKind.HOOK,
        key,
        state.turn,
        recorded_input,
        call_id=key,  # its own place: hooks of one turn are not each other's attempts
        tool_name="hook",
        label=f"hook {event.value}",
        detail=shown,
        reuse=True,
    )
    step = open_step(ctx, spec)
    if step.reused is not None:
        state.hooks_done.add(key)
        return Fired(step.reused.output if isinstance(step.reused.output, dict) else {})
    use: int | None = None
    prior = step.prior
    if prior is not None and prior.state == StepState.STARTED and not hook.idempotent:
        # Cut off while it ran: it may have done part of its work. Not run again unasked.
        asked = ToolCall(key, "hook", json.dumps({"event": event.value, "command": shown}))
        approval = approvals.decided(
            ctx,
            asked,
            ApprovalKind.UNCERTAIN_SIDE_EFFECT,
            shown,
            f"the {event.value} hook was interrupted by a crash and may have partly run; "
            "it is not declared idempotent, so running it again may repeat its effects",
            step_seq=prior.seq,
        )
        if approvals.denied(approval):
            output = {
                **recorded_input,
                "exit_code": None,
                "stdout": "",
                "stderr": "",
                "not_run": "interrupted by a crash; the user chose not to run it again",
            }
            del output["idempotent"]
            step.record(StepOutcome(output, use_approval=approval.id))
            ctx.observer.note(f"hook {event.value} `{shown}` was not run again (denied)")
            state.hooks_done.add(key)
            return Fired(output)
        use = approval.id
    document = {
        "event": event.value,
        "run_id": state.run_id,
        "turn": state.turn,
        "step": ctx.journal.next_seq,
        "hook_key": key,
        **extra,
    }
    if call is not None:
        document["tool"] = call.name
        document["call_id"] = call.id
        try:
            document["arguments"] = call.parsed_arguments()
        except ValueError:
            document["arguments"] = call.arguments[:MAX_INPUT]
    if result is not None:
        document["result"] = result[:MAX_INPUT]
    outcome = step.run(
        lambda _step: _execute(ctx, hook, key, event, document, recorded_input, prior is not None),
        input=spec.input,
        use_approval=use,
    )
    state.hooks_done.add(key)
    fired = Fired(outcome.output)
    _report(ctx, event, fired)
    return fired


def _execute(
    ctx: StepContext,
    hook: Hook,
    key: str,
    event: HookEvent,
    document: dict[str, Any],
    recorded_input: dict[str, Any],
    again: bool,
) -> StepOutcome:
    settings = ctx.settings
    env = command_env(
        ctx.env, run_id=ctx.state.run_id, call_id=key, passthrough=settings.command_env
    )
    # The document on stdin: run_process gives commands /dev/null there, so it is piped in.
    # It is part of the command, not a variable (one exec string holds 128 KiB), and the
    # command goes to the shell in a sealed file: the tool's arguments and result are in
    # no command line another user of the host could list.
    line = f"printf '%s' {shlex.quote(json.dumps(document))} | (\n{hook.command}\n)"
    try:
        with watch_cancel(ctx.cancel, ctx.journal, ctx.beat):
            out = run_process(
                line,
                cwd=settings.workspace,
                timeout_s=hook.timeout_s,
                env=env,
                output_cap=settings.output_cap // 2,
                cancel=ctx.cancel,
                sandbox=for_run(settings.sandbox, settings.network, ctx.env, settings.db),
                private=True,
            )
    except (ToolFailure, OSError) as exc:
        # Not started (no sandbox, an environment too large, the workspace gone): the hook
        # failed, as a command that cannot start is the model's error result, not the end
        # of the run. 127: the shell's "cannot run it".
        why = str(exc) if isinstance(exc, ToolFailure) else f"{type(exc).__name__}: {exc}"
        output = _output(ctx, hook, event, CANNOT_START, "", f"the hook could not start: {why}")
        return StepOutcome(output, messages=_tell(ctx, event, hook, output), duration_ms=0)
    output = _output(ctx, hook, event, out.exit_code, out.stdout, out.stderr)
    if out.timed_out:
        output["timed_out"] = True
    return StepOutcome(
        output, messages=_tell(ctx, event, hook, output), duration_ms=out.duration_ms
    )


CANNOT_START = 127


def _output(
    ctx: StepContext, hook: Hook, event: HookEvent, code: int | None, stdout: str, stderr: str
) -> dict[str, Any]:
    redact = ctx.redactor.redact
    return {
        "event": event.value,
        "command": ctx.redactor.redact_known(hook.command),
        "exit_code": code,
        "stdout": redact(stdout.strip()),
        "stderr": redact(stderr.strip()),
    }


def _tell(ctx: StepContext, event: HookEvent, hook: Hook, output: dict[str, Any]) -> list[Message]:
    """The note the model gets of a hook's run, appended to the history (none: [])."""
    messages: list[Message] = []
    text = _for_model(event, hook, Fired(output))
    quiet = (HookEvent.PRE_TOOL, HookEvent.PRE_COMPACT)  # a result's note; mid-compaction
    if text is not None and event not in quiet and not ctx.state.pending_calls():
        # A note after the calls' results (never between them: the history stays valid).
        messages.append(Message("user", text))
        ctx.state.append(messages[0])
    return messages


def _for_model(event: HookEvent, hook: Hook, fired: Fired) -> str | None:
    """What the model is told of a hook's run (None: nothing)."""
    code = fired.exit_code
    if code == 0 and fired.get("stdout"):
        return f"[{event.value} hook] {fired['stdout']}"
    if code == BLOCK and event is HookEvent.STOP:
        why = fired.get("stderr") or "a stop hook asked to go on"
        return f"Your final answer was not accepted yet ({event.value} hook): {why}"
    if code == BLOCK and event is not HookEvent.PRE_TOOL:
        return f"[{event.value} hook] {fired.get('stderr') or 'exit 2'}"
    return None


def _report(ctx: StepContext, event: HookEvent, fired: Fired) -> None:
    code = fired.exit_code
    if code in (0, BLOCK) and not fired.get("timed_out"):
        return
    how = "timed out" if fired.get("timed_out") else f"exit code {code}"
    tail = str(fired.get("stderr") or "")[-300:]
    ctx.observer.note(
        f"hook {event.value} `{fired.get('command')}` failed ({how}){': ' + tail if tail else ''}"
    )


# -- the events -------------------------------------------------------------------------------
def session_start(ctx: StepContext, session: int) -> None:
    """At the start of every session of the run (`session`: the run's resume count)."""
    if ctx.settings.hooks:
        fire(ctx, HookEvent.SESSION_START, f"s{session}")


def fire_resume(ctx: StepContext, session: int) -> None:
    """A session continues a run that had one before (resume, continue, a worker's claim):
    the `resume` hooks, once for `session` (the run's resume count)."""
    if ctx.settings.hooks and session > 0:
        fire(ctx, HookEvent.RESUME, f"s{session}")


def pre_tool(ctx: StepContext, call: ToolCall) -> str | None:
    """The pre_tool hooks of `call`: the reason it is blocked (exit 2), else None. Their
    notes go before the call's result."""
    if not ctx.settings.hooks:
        return None
    notes = []
    for fired in fire(ctx, HookEvent.PRE_TOOL, call.id, call=call):
        if fired.exit_code == BLOCK:
            return str(fired.get("stderr") or "blocked by a pre_tool hook (exit 2)")
        if fired.exit_code == 0 and fired.get("stdout"):
            notes.append(f"[pre_tool hook] {fired['stdout']}")
    if notes:
        ctx.state.hook_notes[call.id] = "\n".join(notes)
    return None


def post_tools(ctx: StepContext) -> None:
    """The post_tool hooks of the last answer's calls, once all of them have results; on a
    resume, those a crash cut off (the others stand as recorded)."""
    if not any(h.event is HookEvent.POST_TOOL for h in ctx.settings.hooks):
        return
    state = ctx.state
    for i in range(len(state.messages) - 1, -1, -1):
        m = state.messages[i]
        if m.role != "assistant":
            continue
        results = {r.tool_call_id: r.content for r in state.messages[i + 1 :] if r.role == "tool"}
        for call in m.tool_calls:
            keys = [
                f"hook:{HookEvent.POST_TOOL.value}:{call.id}:{n}"
                for n, _ in hooks_for(ctx, HookEvent.POST_TOOL, call.name)
            ]
            if all(k in state.hooks_done for k in keys):
                continue
            fire(ctx, HookEvent.POST_TOOL, call.id, call=call, result=results.get(call.id) or "")
        return


def pre_compact(ctx: StepContext) -> None:
    if ctx.settings.hooks:
        fire(ctx, HookEvent.PRE_COMPACT, f"t{ctx.state.turn}")


def stop(ctx: StepContext, answer: str) -> bool:
    """Before a final answer is accepted: False when a stop hook asks the model to go on."""
    if not ctx.settings.hooks:
        return True
    fired = fire(ctx, HookEvent.STOP, f"t{ctx.state.turn}", extra={"answer": answer[:MAX_INPUT]})
    return not any(f.exit_code == BLOCK for f in fired)
