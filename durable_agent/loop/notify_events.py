"""The notifications a run's end makes: one outbox row per `[[notify]]` entry that wants the
event, written by `finish` in the transaction that records the end (store/outbox.py)."""

from __future__ import annotations

import os
from typing import Any

from durable_agent.loop.step_context import StepContext
from durable_agent.store import outbox
from durable_agent.store.links import approval_links
from durable_agent.store.outbox import Outbox
from durable_agent.store.rows import utcnow

ANSWER_CAP = 4000  # characters of the answer or error a notification carries


def event_for(status: str, stop_reason: str | None) -> str:
    """The event name of an end: its status, or the stop reason that says more."""
    if stop_reason == "changed_since_checkpoint":
        return stop_reason
    return status


def event_rows(
    ctx: StepContext, status: str, stop_reason: str | None, answer: str | None, error: str | None
) -> list[dict[str, Any]]:
    event = event_for(status, stop_reason)
    wanted = ctx.settings.notify_targets(event)
    if not wanted:
        return []
    s, run = ctx.state, ctx.journal.run_id
    payload: dict[str, Any] = {
        "event": event,
        "run_id": run,
        "status": status,
        "stop_reason": stop_reason,
        "model": ctx.settings.model,
        "answer": answer[:ANSWER_CAP] if answer else answer,
        "error": error[:ANSWER_CAP] if error else error,
        "model_calls": s.step_count,
        "tool_calls": s.tool_call_count,
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "cost": s.cost,
        "at": utcnow().isoformat() + "Z",
    }
    if event == "blocked":
        payload["approvals"] = _approvals(ctx, run)
    # Unique per end of the run (a run blocked, approved and blocked again sends twice) and
    # the same on every retry of the commit: made once, here.
    base = f"{event}:{run}:{os.urandom(8).hex()}"
    return outbox.event_rows(base, event, run, payload, wanted)


def _approvals(ctx: StepContext, run: str) -> list[dict[str, Any]]:
    """The questions the run waits on, with signed approve/deny links when the web view
    has a public address (`ui --public-url`)."""
    journal = ctx.journal
    url, secret = Outbox(journal.engine, journal.policy).links()
    out = []
    for a in journal.pending_approvals():
        item: dict[str, Any] = {
            "id": a.id,
            "kind": a.kind,
            "tool_name": a.tool_name,
            "command": a.command,
            "reason": a.reason,
        }
        if url and secret:
            item["links"] = approval_links(url, secret, run, a.id, ctx.settings.notify_link_ttl_s)
        out.append(item)
    return out
