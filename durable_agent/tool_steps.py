"""Executing one tool call durably, by effect class.

    read   no intent row: run, then intent+outcome in one transaction (a crash re-runs it)
    write  intent with the file's before/after hashes, write, outcome; resume compares hashes
    exec   policy check (maybe `blocked`), intent with the process group, run, outcome;
           resume never re-runs an interrupted command without a person's approval

Every call ends with exactly one tool message, error or not, so the history sent to the
model stays valid.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from durable_agent import guard
from durable_agent.errors import LoopExit
from durable_agent.messages import Message, ToolCall, sha256_text
from durable_agent.observer import StepEvent
from durable_agent.status import EffectClass, StepKind, StopReason
from durable_agent.store.rows import utcnow
from durable_agent.tools.base import ToolContext, ToolFailure, ToolResult, WritePlan
from durable_agent.tools.limits import cap_text
from durable_agent.tools.os_sandbox import resolve_sandbox

if TYPE_CHECKING:
    from durable_agent.runner import _Drive
    from durable_agent.store.journal import Journal

APPROVAL = "approval_required"
UNCERTAIN = "uncertain_side_effect"
CANCEL_POLL_S = 0.5  # how soon a running command notices `durable-agent cancel`


@contextlib.contextmanager
def watch_cancel(cancel: threading.Event, journal: Journal) -> Iterator[None]:
    """While a command runs: turn `durable-agent cancel` (a database flag) into the cancel
    event at once. The lease heartbeat notices it too, but only every lease_seconds/3."""
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(CANCEL_POLL_S) and not cancel.is_set():
            try:
                if journal.cancel_requested():
                    cancel.set()
            except Exception:  # noqa: BLE001 - a busy database is asked again next time
                continue

    watcher = threading.Thread(target=poll, name="cancel-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def tool_key(call: ToolCall) -> str:
    return f"tool:{call.id}:{sha256_text(call.name + call.canonical_arguments())[:32]}"


class ToolSteps:
    def __init__(self, drive: _Drive) -> None:
        self.d = drive
        self.journal = drive.journal
        self.state = drive.state
        self.settings = drive.settings
        self.tools = drive.r.tools

    # -- entry -------------------------------------------------------------------------------
    def run(self, call: ToolCall) -> None:
        s = self.state
        fp = call.fingerprint()
        streak = s.repeat_streak + 1 if fp == s.last_fingerprint else 1
        stop = guard.before_tool_call(self.d.r.limits, tool_calls=s.tool_call_count,
                                      streak_if_run=streak, active_ms=self.d.active_ms())
        if stop is not None:
            raise LoopExit(*stop)
        self.d.check_cancel()
        key = tool_key(call)
        prior = s.open_steps.pop(key, None)
        tool = self.tools.get(call.name)
        if tool is None and prior is not None and prior.effect == EffectClass.EXEC:
            # A command cut off by a crash, resumed where the tool is not offered (--shell deny):
            # say what is true, not "unknown tool".
            return self._record(call, prior.seq, prior.started_at, ToolResult(
                error="the command was interrupted by a crash; its outcome is unknown and it was not run "
                      "again (running commands is not allowed now)"))
        if tool is None:
            known = ", ".join(sorted(self.tools))
            return self._reject(call, key, f"unknown tool {call.name!r}; available tools: {known}", prior=prior)
        try:
            args = tool.args_model.model_validate(call.parsed_arguments())
        except ValueError as exc:  # bad JSON (json.JSONDecodeError is a ValueError) or not an object
            detail = _validation_text(exc) if isinstance(exc, ValidationError) else f"arguments are not valid JSON: {exc}"
            return self._reject(call, key, f"invalid arguments for {call.name}: {detail}", prior=prior)
        if tool.effect is EffectClass.READ:
            return self._read(call, key, tool, args, prior)
        if tool.effect is EffectClass.WRITE:
            return self._write(call, key, tool, args, prior)
        return self._exec(call, key, tool, args, prior)

    # -- by effect class ---------------------------------------------------------------------
    def _read(self, call: ToolCall, key: str, tool: Any, args: Any, prior: Any) -> None:
        started = utcnow()
        self._event(call, "started")
        result = self._invoke(tool, args, call)
        if prior is not None:  # an intent left by a crash: finish that row
            return self._record(call, prior.seq, started, result, attempts=prior.attempts + 1)
        self._record(call, self.d.next_seq(), started, result, defer=True,
                     intent=self._intent(call, key, tool.effect, {"arguments": _args_json(call)}))

    def _write(self, call: ToolCall, key: str, tool: Any, args: Any, prior: Any) -> None:
        if prior is None:
            try:
                plan = tool.plan(args, self._ctx(call))
            except (ToolFailure, OSError, ValueError) as exc:  # nothing was written: an observation
                message = str(exc) if isinstance(exc, ToolFailure) else f"{type(exc).__name__}: {exc}"
                return self._reject(call, key, message, effect=tool.effect)
            seq = self.d.next_seq()
            started = self.journal.start_step(
                seq=seq, kind=StepKind.TOOL, key=key, turn=self.state.turn, call_id=call.id,
                tool_name=call.name, effect=tool.effect,
                input={"arguments": _args_json(call), "plan": plan.__dict__})
            self._event(call, "started")
            return self._record(call, seq, started, self._invoke(tool, args, call))
        # Interrupted write: did it land? The recorded hashes decide, not a guess.
        plan = WritePlan(**prior.input["plan"])
        try:
            current = tool.current_sha(plan, self._ctx(call))
        except (ToolFailure, OSError) as exc:  # unreadable now: neither before nor after, so drift
            current = f"unreadable: {exc}"
        if current == plan.after_sha:
            result = ToolResult(output=f"{plan.path} already has the intended content "
                                       "(the write completed before the interruption)")
            return self._record(call, prior.seq, prior.started_at, result, attempts=prior.attempts)
        approval = None
        if current != plan.before_sha:
            approval = self._approval(call, UNCERTAIN, None,
                                      f"{plan.path} changed since the interrupted write (drift): it has "
                                      "neither the content before nor the content after the write",
                                      step_seq=prior.seq)
            if approval.decision == "denied":
                return self._record(call, prior.seq, prior.started_at, ToolResult(
                    error=f"the write to {plan.path} was interrupted and the file changed since; "
                          "the user chose not to apply it again"), use_approval=approval.id)
        started = self.journal.restart_step(prior.seq, attempts=prior.attempts + 1,
                                            use_approval=approval.id if approval else None)
        self._event(call, "started")
        self._record(call, prior.seq, started, self._invoke(tool, args, call))

    def _exec(self, call: ToolCall, key: str, tool: Any, args: Any, prior: Any) -> None:
        command = getattr(args, "command", None) or _args_json(call)
        if prior is not None:
            # The crash hit while it ran: its outcome is unknown and it is not idempotent.
            if self.settings.on_uncertain_exec == "tell_model":
                return self._record(call, prior.seq, prior.started_at, ToolResult(
                    error="the command was interrupted by a crash; its outcome is unknown and it was "
                          "not run again. Check the workspace before relying on it."))
            approval = self._approval(call, UNCERTAIN, command,
                                      "it was interrupted by a crash and may have partly or fully run; "
                                      "running it again may repeat its side effects", step_seq=prior.seq)
            if approval.decision == "denied":
                return self._record(call, prior.seq, prior.started_at, ToolResult(
                    error="the command was interrupted by a crash; its outcome is unknown and the user "
                          "chose not to run it again"), use_approval=approval.id)
            started = self.journal.restart_step(prior.seq, attempts=prior.attempts + 1, use_approval=approval.id)
            seq = prior.seq
        else:
            use = None
            verdict, why = self._policy(call.name, command)
            if verdict == "deny":
                return self._reject(call, key, f"{call.name} is not allowed (--shell deny)", effect=tool.effect)
            if verdict == "ask":
                approval = self._approval(call, APPROVAL, command, why)
                if approval.decision == "denied":
                    return self._reject(call, key, "the user denied this command; do not run it again",
                                        effect=tool.effect, use_approval=approval.id)
                use = approval.id
            else:
                use = self._settle_by_policy(call)
            seq = self.d.next_seq()
            started = self.journal.start_step(
                seq=seq, kind=StepKind.TOOL, key=key, turn=self.state.turn, call_id=call.id,
                tool_name=call.name, effect=tool.effect, input={"arguments": _args_json(call)},
                use_approval=use)
        self._event(call, "started")
        try:
            with watch_cancel(self.d.r.cancel, self.journal):
                result = self._invoke(tool, args, call, seq=seq)
        except KeyboardInterrupt:
            # The second Ctrl-C ("stop now"): run_process has killed the group on its way out.
            # Record that before stopping, so the history stays valid and resume does not have
            # to ask a person about a command we know was cut short.
            self._record(call, seq, started, ToolResult(
                error="interrupted by the user (Ctrl-C): the command was killed and may have partly run"))
            raise
        self._record(call, seq, started, result)

    def _settle_by_policy(self, call: ToolCall) -> int | None:
        """A question asked under `--shell ask` that the policy now answers (resumed with
        `--shell allow`): record it as approved by the policy, not left pending forever."""
        pending = self.journal.approval_for(call.id, APPROVAL)
        if pending is None or pending.decision is not None:
            return None
        self.d.r.store.decide_approval(pending.id, approved=True, by=f"policy (--shell {self.settings.shell})")
        return int(pending.id)

    def _policy(self, tool_name: str, command: str) -> tuple[str, str]:
        mode = self.settings.shell
        if tool_name != "run_command":
            return ("allow", "") if mode == "allow" else ("ask", f"{tool_name} runs a side effect")
        from durable_agent.tools.shell_policy import DEFAULT_DESTRUCTIVE, decide

        destructive = (*DEFAULT_DESTRUCTIVE, *self.settings.shell_always_ask)
        verdict, why = decide(command, mode, self.settings.shell_allowlist, destructive)
        return verdict.value, why

    def _approval(self, call: ToolCall, kind: str, command: str | None, reason: str,
                  step_seq: int | None = None) -> Any:
        """A decided approval of this call, or record the request and stop the run `blocked`."""
        approval = self.journal.approval_for(call.id, kind)
        if approval is not None and approval.decision is not None:
            return approval
        # The command comes from the model and is shown to people: stored as it will run
        # (the harness's own secrets were replaced already, see Runner._call_ids).
        redact = self.d.r.redactor.redact
        command = self.d.r.redactor.redact_known(command) if command else command
        reason = redact(reason)
        self.journal.request_approval(call_id=call.id, kind=kind, tool_name=call.name,
                                      command=command, reason=reason, step_seq=step_seq)
        stop = StopReason.APPROVAL_REQUIRED if kind == APPROVAL else StopReason.UNCERTAIN_SIDE_EFFECT
        what = f"`{command}`" if command else call.name
        if what in reason:  # the policy's reason names the command already
            what = call.name
        raise LoopExit(stop, f"{what} needs approval: {reason}. "
                             f"Run `durable-agent approve {self.state.run_id}` (or --deny), then resume.")

    # -- recording ------------------------------------------------------------------------------
    def _reject(self, call: ToolCall, key: str, error: str, *, effect: EffectClass | None = None,
                use_approval: int | None = None, prior: Any = None) -> None:
        """A call that ran nothing (unknown tool, bad arguments, refused): one row, one message."""
        if prior is not None:  # recorded as started under other settings: close that row
            return self._record(call, prior.seq, prior.started_at, ToolResult(error=error))
        # Nothing ran, so like a read it may ride along with the next commit.
        self._record(call, self.d.next_seq(), utcnow(), ToolResult(error=error), use_approval=use_approval,
                     intent=self._intent(call, key, effect, {"arguments": _args_json(call)}),
                     defer=use_approval is None)

    def _intent(self, call: ToolCall, key: str, effect: EffectClass | None, input: Any) -> dict[str, Any]:
        return {"kind": StepKind.TOOL.value, "idempotency_key": key, "call_id": call.id,
                "tool_name": call.name, "input": input, "turn": self.state.turn,
                "effect": effect.value if effect else None}

    def _record(self, call: ToolCall, seq: int, started: Any, result: ToolResult, *,
                intent: dict[str, Any] | None = None, attempts: int | None = None,
                use_approval: int | None = None, defer: bool = False) -> None:
        s = self.state
        redact = self.d.r.redactor.redact
        # Redact first, then cap: a cut through the middle of a secret would leave half of it.
        text = cap_text(redact(result.for_model()), self.settings.output_cap)
        message = Message("tool", text, tool_call_id=call.id)
        s.tool_call_count += 1
        s.note_tool_call(call)
        mseq = s.append(message)
        state = "completed" if result.error is None else "failed"
        error = redact(result.error) if result.error else None
        self.journal.finish_step(seq=seq, state=state, started_at=started,
                                 output={"result": text, "data": self.d.r.redactor.redact_json(result.data)},
                                 error=error,
                                 counters=self.d.counters(), new_messages=[(mseq, message)],
                                 attempts=attempts, intent=intent, use_approval=use_approval, defer=defer)
        self._event(call, state, started=started, error=error, seq=seq)

    def _ctx(self, call: ToolCall, seq: int | None = None) -> ToolContext:
        on_start = None
        if seq is not None:
            journal = self.journal

            def on_start(pgid: int) -> None:
                journal.set_pgid(seq, pgid)  # before the command starts: resume can find its group

        return ToolContext(workspace=self.settings.workspace, run_id=self.state.run_id, call_id=call.id,
                           output_cap=self.settings.output_cap, env=self.d.r.env,
                           command_timeout_s=self.settings.command_timeout_s, cancel=self.d.r.cancel,
                           on_process_start=on_start,
                           sandbox=resolve_sandbox(self.settings.sandbox, self.settings.network, self.d.r.env))

    def _invoke(self, tool: Any, args: Any, call: ToolCall, seq: int | None = None) -> ToolResult:
        try:
            result: ToolResult = tool.run(args, self._ctx(call, seq))
            return result
        except ToolFailure as exc:
            return ToolResult(error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a tool's failure is an observation, never a crash
            return ToolResult(error=f"{type(exc).__name__}: {exc}")

    def _event(self, call: ToolCall, state: str, *, started: Any = None, error: str | None = None,
               seq: int = -1) -> None:
        duration = None
        if started is not None:
            duration = int((utcnow() - started).total_seconds() * 1000)
        self.d.r.observer.step(StepEvent(seq, self.state.turn, "tool", call.name, detail=_brief(call),
                                         state=state, duration_ms=duration, error=error))

    # -- processes and the finish gate ---------------------------------------------------------
    def stop_leftover_processes(self) -> None:
        """Before reconciling: nothing of a command recorded as started may still run."""
        from durable_agent.tools.process import kill_process_group, process_group_alive

        for step in self.state.open_steps.values():
            # Only with the call id to match: a bare number may name someone else's group by now
            # (after a reboot), and our own group is never the command's.
            if (step.state != "started" or not step.pgid or not step.call_id or step.pgid <= 1
                    or step.pgid == os.getpgrp()):
                continue
            if process_group_alive(step.pgid, call_id=step.call_id, run_id=step.run_id):
                kill_process_group(step.pgid, call_id=step.call_id, run_id=step.run_id)
                self.d.r.observer.note(f"killed the leftover process group {step.pgid} of call {step.call_id}")


def _args_json(call: ToolCall) -> Any:
    try:
        return call.parsed_arguments()
    except ValueError:
        return call.arguments


def _validation_text(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors())


def _brief(call: ToolCall) -> str:
    try:
        args = call.parsed_arguments()
    except ValueError:
        return call.arguments[:60]
    first = next(iter(args.values()), "") if args else ""
    text = str(first).replace("\n", " ")
    return text[:60] + ("…" if len(text) > 60 else "")
