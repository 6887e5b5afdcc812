"""What a person does from the run page, written exactly as the CLI writes it: the same
Store calls as `approve`, `cancel` and `resume --detach` (commands.py), so a decision
made in the browser is the same row as one made in a terminal. Approve and deny also put
the run back on the workers' queue: in the browser, answering is asking it to go on."""

from __future__ import annotations

from msgspec import Struct

from durable_agent.errors import UsageError
from durable_agent.status import RESUMABLE, RunStatus
from durable_agent.store.runs import Store

NOTICES = {
    "approved": "approved; the run is back on the worker queue",
    "denied": "denied (the model is told); the run is back on the worker queue",
    "requested": "cancellation requested: the run stops at its next step boundary",
    "cancelled": "cancelled; resume continues it",
    "queued": "queued: a worker (`durable-agent worker`) continues it",
}


class Done(Struct, frozen=True):
    run_id: str
    notice: str  # a key of NOTICES


def decided_by(name: str | None, *, default: str) -> str:
    """`ui:<name>`: the name typed into the form, else who holds the view (its token, or
    the local user who started it). The `ui:` prefix tells it from a terminal's answer."""
    name = " ".join((name or "").split())[:60]
    return f"ui:{name or default}"


def answer(store: Store, run_id: str, *, approved: bool, by: str) -> Done:
    pending = store.pending_approval(run_id)
    if pending is None:
        raise UsageError(f"run {run_id} has no pending approval")
    store.decide_approval(pending.id, approved=approved, by=by)
    if store.get_run(run_id).status == RunStatus.BLOCKED:
        store.requeue(run_id)
    return Done(run_id, "approved" if approved else "denied")


def cancel(store: Store, run_id: str) -> Done:
    return Done(run_id, store.cancel(run_id))


def resume(store: Store, run_id: str) -> Done:
    """`durable-agent resume --detach`: the same checks, the run back to `pending`."""
    run = store.get_run(run_id)
    if run.status == RunStatus.COMPLETED:
        raise UsageError(f"run {run_id} is completed; nothing to resume")
    if run.status not in RESUMABLE:
        raise UsageError(f"run {run_id} is {run.status}; it cannot be resumed")
    if store.pending_approval(run_id) is not None:
        raise UsageError(f"run {run_id} waits for an answer: approve or deny it first")
    store.requeue(run_id)
    return Done(run_id, "queued")
