"""`continue`: a person's message opens a new turn of a run's history, as one durable step.

The step is of kind `user_message`; its key is `user_message:<turn>:<sha256 of the message>`,
where `turn` is the run's model calls so far (the number every step of the turn carries).
Which key a `continue` uses is decided from what the run holds when it is taken:

    the run had ended (completed, failed, budget_exceeded, cancelled)
        a new turn at the current model-call count. The same message sent again with no
        model call since (the call failed) finds its completed step: not added twice.
    the run is interrupted (running, its process gone) or queued (pending)
        if the run's latest user_message carries this message, it is that `continue`,
        unfinished: its step is gone on with (a crash in it is run again under its key; a
        completed one stands) and the turn is driven on like `resume`. Any other message
        opens a new turn, as above.

So a crash anywhere in a `continue`, then the same `continue` again, adds the message once;
the same message sent deliberately after its turn ended is a new turn.

In the step's one commit: an honest error result for each tool call the last turn left
without one (the history stays valid), the message, and the turn's budget window (the run's
totals as the turn began: budgets count from there, the totals go on). Its snapshots measure
from the run's last snapshot, so the step records the files as the person left them and
what they changed between the turns (`diff --step SEQ`); no drift stop follows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from msgspec import UNSET, to_builtins

from durable_agent.loop import stored_once
from durable_agent.loop.step import StepOutcome, StepSpec, open_step
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import Message
from durable_agent.status import RunStatus, StepKind
from durable_agent.store import leases
from durable_agent.store.blobs import tree_at
from durable_agent.store.payloads import UserMessageInput, UserMessageOutput, Window
from durable_agent.store.records import RunRecord, StepRecord, StepState
from durable_agent.store.rows import utcnow
from durable_agent.store.runs import ENDED, Store
from durable_agent.store.step import Step

NOT_RUN = "not run: the run was continued with a new message from the user instead"
CUT_OFF = (
    "cut off before it finished (its outcome is unknown); the run was continued with a new "
    "message from the user instead"
)

# What `continue` takes a run from (read again under the run's lock when it is taken):
# an ended run; an interrupted one (`running`, its process gone); a queued one only for
# the same message again (a `continue --detach` not yet run by a worker).
TAKEN_FROM = ENDED | {RunStatus.RUNNING, RunStatus.PENDING}


def digest(message: str) -> str:
    return hashlib.sha256(message.encode("utf-8", "surrogatepass")).hexdigest()


def turn_key(ctx: StepContext, message: str, stood: str) -> str:
    """The key of this `continue`'s message step (see the module docstring)."""
    sha = digest(message)
    turns = ctx.journal.user_turns
    latest = turns[-1] if turns else None
    if latest is not None and stood in (RunStatus.RUNNING, RunStatus.PENDING):
        given = latest.typed_input
        if isinstance(given, UserMessageInput) and given.sha256 == sha:
            return latest.idempotency_key
    return f"{StepKind.USER_MESSAGE.value}:{ctx.state.turn}:{sha}"


def open_turn(ctx: StepContext, message: str, *, stood: str) -> StepRecord | None:
    """Record the person's message as a new turn (or find it recorded). Returns the recorded
    step when it was there already (nothing was added), None when this call added it."""
    s = ctx.state
    key = turn_key(ctx, message, stood)
    turn = int(key.split(":")[1])
    sha = digest(message)  # of the words as given: the same `continue` again finds its step
    # Redacted before anything is written or shown, as `start` does the task: a key pasted
    # into the message (or piped in with `git diff`) reaches neither the store nor the model.
    said = ctx.redactor.redact(message)
    cut = len(said) > stored_once.INLINE_CHARS
    given = UserMessageInput(
        sha256=sha,
        chars=len(message),
        message=said[: stored_once.HEAD_CHARS] if cut else said,
        cut=True if cut else UNSET,
    )
    last = tree_at(ctx.journal.engine, ctx.journal.run_id, policy=ctx.journal.policy)
    head = " ".join(said.split())
    spec = StepSpec(
        StepKind.USER_MESSAGE,
        key,
        turn,
        to_builtins(given),
        label="you:",
        detail=head[:80] + ("…" if len(head) > 80 else ""),
        reuse=True,
        supersede=True,
        tree_before=last.tree if last is not None else None,
    )
    call = open_step(ctx, spec)
    if call.reused is not None:
        if stood in ENDED:  # (taken with its status kept: store.take_over)
            ctx.journal.commit([leases.running_again(ctx.journal.run_id)])
        return call.reused
    if ctx.journal.open_approvals():
        ctx.journal.retire_approvals(by="continue")  # the person answered with a message

    def add(step: Step) -> StepOutcome:
        start = len(s.messages)
        cut_off = {
            st.call_id
            for st in ctx.journal.open_steps.values()
            if st.kind == StepKind.TOOL and st.state == StepState.STARTED and st.call_id
        }
        written: list[Message] = []
        closed: list[str] = []
        for pending in s.pending_calls():
            why = CUT_OFF if pending.id in cut_off else NOT_RUN
            written.append(Message("tool", f"error: {why}", tool_call_id=pending.id))
            closed.append(pending.id)
        written.append(Message("user", said))
        for m in written:
            seq = s.append(m)
        s.tool_call_count += len(closed)
        window = Window(
            model_calls=s.step_count,
            tool_calls=s.tool_call_count,
            prompt_tokens=s.prompt_tokens,
            completion_tokens=s.completion_tokens,
            active_ms=ctx.active_ms(),
            messages=start,
            cost=s.cost or 0.0,
        )
        s.window = window
        out = UserMessageOutput(window=window, message_seq=seq, closed_calls=closed or UNSET)
        return StepOutcome(
            to_builtins(out),
            messages=written,
            duration_ms=None,
            # The run was taken with its status kept (store.take_over): it runs again from
            # the commit that holds its message, not before.
            statements=[leases.running_again(ctx.journal.run_id)],
        )

    call.run(add, input=spec.input)
    return None


def opened_by_message(ctx: StepContext) -> int | None:
    """The turn, when the latest completed user_message opened it and no model call was made
    since: a `continue` cut off before its turn began, which `resume` goes on with (project
    memory is read again for it, as the same `continue` again would)."""
    for t in reversed(ctx.journal.user_turns):
        if t.state == StepState.COMPLETED:
            if ctx.forked_at is not None and t.seq <= ctx.forked_at:
                return None  # copied from the run a fork was made of: the fork reads its own
            return t.turn if t.turn == ctx.state.turn else None
    return None


def window_of(turns: Sequence[StepRecord]) -> Window | None:
    """The budget window of the current turn: the latest completed user_message's."""
    for t in reversed(turns):
        if t.state == StepState.COMPLETED:
            out = t.typed_output
            return out.window if isinstance(out, UserMessageOutput) else None
    return None


def refusal(run: RunRecord, store: Store, message: str) -> str | None:
    """Why this run cannot be continued now (one line that says what to do), or None."""
    rid = run.id
    if run.status == RunStatus.BLOCKED:
        return (
            f"run {rid} is blocked ({run.stop_reason}): answer it with `durable-agent approve "
            f"{rid}` (or --deny), then `durable-agent resume {rid}`; continue it once it has ended"
        )
    if leases.is_executing(run, utcnow()):
        return (
            f"run {rid} is running in another process: wait for it to end (or `durable-agent "
            f"cancel {rid}`), then continue it"
        )
    if run.status == RunStatus.PENDING and not _latest_turn_is(store, rid, digest(message)):
        return (
            f"run {rid} is pending (queued, not run yet): run it with `durable-agent resume "
            f"{rid}` (or a worker), then continue it"
        )
    if run.status == RunStatus.WAITING:
        return (
            f"run {rid} is waiting for its child runs: a worker goes on with it once they "
            f"ended (`durable-agent resume {rid}` runs them here); continue it once it has ended"
        )
    if run.status not in TAKEN_FROM:
        return f"run {rid} is {run.status}; it cannot be continued"
    return None


def _latest_turn_is(store: Store, run_id: str, sha: str) -> bool:
    turns = [s for s in store.steps(run_id) if s.kind == StepKind.USER_MESSAGE]
    given = turns[-1].typed_input if turns else None
    return isinstance(given, UserMessageInput) and given.sha256 == sha
