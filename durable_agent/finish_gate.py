"""The finish gate (`--verify "CMD"`): a final answer is accepted only once CMD exits 0 in
the workspace, after the last edit. A failure's output goes back to the model as the next
observation (the rejected answer stays in the history) and the loop goes on within its
budgets. The evidence (command, exit code, output tail) is recorded as a `verify` step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_agent.errors import LoopExit
from durable_agent.messages import Message
from durable_agent.observer import StepEvent
from durable_agent.status import StepKind, StopReason
from durable_agent.tool_steps import watch_cancel
from durable_agent.tools.os_sandbox import resolve_sandbox
from durable_agent.tools.process import command_env, run_process

if TYPE_CHECKING:
    from durable_agent.runner import _Drive

VERIFY_TAIL = 4000  # characters of the command's output kept as evidence and shown to the model


def verified(d: _Drive, answer: str) -> bool:
    """The finish gate: with --verify, a final answer counts only once the command exits 0."""
    command = d.settings.verify
    if not command:
        return True
    turn = d.state.turn
    if d.journal.verify_result(turn) is not None:
        return True  # it passed before a crash hit the finish

    key = f"verify:{turn}"
    prior = d.state.open_steps.pop(key, None)
    if prior is not None:  # a check, not a side effect: running it again is safe
        seq = prior.seq
        started = d.journal.restart_step(seq, attempts=prior.attempts + 1)
    else:
        seq = d.next_seq()
        started = d.journal.start_step(seq=seq, kind=StepKind.VERIFY, key=key, turn=turn,
                                          input={"command": command}, tool_name="verify")
    obs = d.r.observer
    obs.step(StepEvent(seq, turn, "verify", command))
    with watch_cancel(d.r.cancel, d.journal):
        out = run_process(command, cwd=d.settings.workspace, timeout_s=d.settings.command_timeout_s,
                          env=command_env(d.r.env, run_id=d.state.run_id, call_id=key),
                          output_cap=d.settings.output_cap // 2, cancel=d.r.cancel,
                          sandbox=resolve_sandbox(d.settings.sandbox, d.settings.network, d.r.env))
    redact = d.r.redactor.redact
    # The end of a test run's output says what failed: keep the tail, not the head.
    text = redact((out.stdout + ("\n" + out.stderr if out.stderr else "")).strip())
    tail = text if len(text) <= VERIFY_TAIL else "[... earlier output cut ...]\n" + text[-VERIFY_TAIL:]
    passed = out.exit_code == 0
    if out.timed_out:
        failure = f"timed out after {d.settings.command_timeout_s:g} s"
    elif out.cancelled:
        failure = "cancelled"
    else:
        failure = f"exit code {out.exit_code}"
    output = {"command": command, "exit_code": out.exit_code, "timed_out": out.timed_out,
              "output_tail": tail, "passed": passed}
    new: list[tuple[int, Message]] = []
    if not passed and not out.cancelled:
        # A cancelled check proved nothing about the answer: it is run again on resume
        # (the step stays open as failed), and the model is not told about it.
        note = (f"Verification failed: `{command}` {failure}. Your final answer was not "
                f"accepted. Fix the problem, then answer again.\n{tail}")
        msg = Message("user", note)
        new.append((d.state.append(msg), msg))
    d.journal.finish_step(seq=seq, state="completed" if passed else "failed", started_at=started,
                             output=output, error=None if passed else failure,
                             counters=d.counters(), new_messages=new)
    obs.step(StepEvent(seq, turn, "verify", command, state="completed" if passed else "failed",
                       duration_ms=out.duration_ms, error=None if passed else failure))
    if out.cancelled:
        raise LoopExit(StopReason.CANCELLED, "cancelled during verification")
    return passed
