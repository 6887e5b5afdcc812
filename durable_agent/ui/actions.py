"""What a person does from the run page, written exactly as the CLI writes it: the same
Store calls as `approve`, `cancel` and `resume --detach` (commands.py), so a decision
made in the browser is the same row as one made in a terminal.

In the browser, answering is asking the run to go on, so approve and deny continue it:
on an SQLite store the view resumes it itself (a `durable-agent resume RUN --quiet` process
it starts, which takes the run's lease as any resume does); on PostgreSQL, the store that
workers share, the run goes back on the workers' queue (docs/ui.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from msgspec import Struct

from durable_agent.errors import UsageError
from durable_agent.status import RESUMABLE, RunStatus
from durable_agent.store.runs import Store

HERE = "resuming in the view's process"
QUEUED = "queued: a worker (`durable-agent worker`) will continue it"
NOTICES = {
    "approved": f"approved; {QUEUED}",
    "denied": f"denied (the model is told); {QUEUED}",
    "approved-here": f"approved; {HERE}",
    "denied-here": f"denied (the model is told); {HERE}",
    "requested": "cancellation requested: the run stops at its next step boundary",
    "cancelled": "cancelled; resume continues it",
    "queued": "queued: a worker (`durable-agent worker`) continues it",
    "continued-here": "message sent: the new turn runs in the view's process",
    "continued": "message sent: recorded, then queued for a worker (`durable-agent worker`)",
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
    store.get_run(run_id)  # 404 for no such run, not "no pending approval"
    pending = store.pending_approval(run_id)
    if pending is None:
        raise UsageError(f"run {run_id} has no pending approval")
    # Only while the run waits for it: a page shown before a cancel offers the question
    # still, and answering it there would promise a resume that the view does not start.
    if not store.decide_once(run_id, pending.id, approved=approved, by=by, while_blocked=True):
        raise UsageError(store.answered_meanwhile(run_id, pending.id))
    notice = "approved" if approved else "denied"
    run = store.get_run(run_id)
    if run.status != RunStatus.BLOCKED:  # (already on its way: nothing to start)
        return Done(run_id, notice)
    # Pending first, in both cases: the run page then follows it live from the redirect on
    # (a blocked run's page ends its stream at once), and a worker may take it as well: the
    # run's lease lets one of them execute it, the other is refused.
    store.requeue(run_id, if_status=RunStatus.BLOCKED.value)
    if not resumes_here(store):
        return Done(run_id, notice)
    _start_resume(store, run_id, run.workspace)
    return Done(run_id, f"{notice}-here")


def continue_answered(store: Store, run_id: str, notice: str) -> Done:
    """After a decision made from a notification's link: the run goes on as after one
    made on its page (resumed here on SQLite, queued for a worker on PostgreSQL)."""
    run = store.get_run(run_id)
    if run.status != RunStatus.BLOCKED or store.pending_approval(run_id) is not None:
        return Done(run_id, notice)  # on its way already, or another question still open
    store.requeue(run_id, if_status=RunStatus.BLOCKED.value)
    if not resumes_here(store):
        return Done(run_id, notice)
    _start_resume(store, run_id, run.workspace)
    return Done(run_id, f"{notice}-here")


def resumes_here(store: Store) -> bool:
    """The rule: the view continues runs of an SQLite store itself (one machine, usually no
    worker); a PostgreSQL store is the one workers share, so its runs are queued for them."""
    return bool(store.engine.dialect.name == "sqlite")


def _start_resume(store: Store, run_id: str, workspace: str) -> None:
    _start_cli(store, workspace, ["resume", run_id, "--quiet"])


def _start_cli(store: Store, workspace: str, args: list[str], stdin: str | None = None) -> None:
    """`durable-agent ARGS` in a process of its own session (stopping the view does not stop
    the run), on the view's store; its errors go to the view's stderr. A thread waits for it
    (feeding `stdin` first), so no finished command is left a zombie."""
    url = store.engine.url.render_as_string(hide_password=False)
    cwd = workspace if Path(workspace).is_dir() else None  # (a project's own config)
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent", *args],
        env={**os.environ, "DURABLE_AGENT_DB": url},
        cwd=cwd,
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )

    def wait() -> None:
        if stdin is not None:
            proc.communicate(stdin.encode("utf-8", "surrogatepass"))
        proc.wait()

    threading.Thread(target=wait, name=f"durable-agent {args[0]} {args[1]}", daemon=True).start()


def continue_run(store: Store, run_id: str, message: str) -> Done:
    """`durable-agent continue RUN -` from the run page: the same checks first (a refusal is
    the page's answer), then the command in a process of its own, as a resume is (the turn
    needs the run's model, tools and sandbox); on PostgreSQL with `--detach`: it records the
    message and queues the run for the workers."""
    from durable_agent.loop.turns import refusal

    if not message.strip():
        raise UsageError("the message is empty: say what the agent should do next")
    run = store.get_run(run_id)
    why = refusal(run, store, message)
    if why:
        raise UsageError(why)
    here = resumes_here(store)
    args = ["continue", run_id, "-", "--quiet", *([] if here else ["--detach"])]
    _start_cli(store, run.workspace, args, message)
    return Done(run_id, "continued-here" if here else "continued")


def cancel(store: Store, run_id: str) -> Done:
    """As `durable-agent cancel`: the run and its children that have not ended."""
    done = Done(run_id, store.cancel(run_id))
    store.cancel_children(run_id)
    return done


def resume(store: Store, run_id: str) -> Done:
    """`durable-agent resume --detach`: the same checks, the run back to `pending`."""
    run = store.get_run(run_id)
    if run.status == RunStatus.COMPLETED:
        raise UsageError(f"run {run_id} is completed; nothing to resume")
    if run.status not in RESUMABLE:
        raise UsageError(f"run {run_id} is {run.status}; it cannot be resumed")
    if store.pending_approval(run_id) is not None:
        raise UsageError(f"run {run_id} waits for an answer: approve or deny it first")
    store.requeue(run_id, if_status=run.status)
    return Done(run_id, "queued")
