"""`fork`: a new run whose history is another's up to and including one step.

Copied: the messages up to the first one a later step produced, the steps up to `at`
(a copied step that was still `started` is closed as failed: it did not run in the fork),
and their workspace changes. Tool calls left without a result get one, "not run in this
fork", so the history is valid for the next model call. The new run is `pending`, holds
no lease, and records its lineage (`forked_from`, `fork_seq`); the original is only read.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, insert, select

from durable_agent.messages import Message
from durable_agent.status import RunStatus, StepKind
from durable_agent.store.records import StepState
from durable_agent.store.rows import message_values, utcnow
from durable_agent.store.schema import messages, runs, steps, workspace_changes
from durable_agent.store.storable import storable

NOT_RUN = "not run in this fork"


def fork_run(
    engine: Engine,
    source: str,
    at: int,
    new_id: str,
    *,
    workspace: str,
    settings: dict[str, Any] | None,
    task: str | None,
) -> None:
    now = utcnow()
    with engine.begin() as conn:
        run = conn.execute(select(runs).where(runs.c.id == source)).mappings().one()
        step_rows = [
            dict(r)
            for r in conn.execute(
                select(steps)
                .where(steps.c.run_id == source, steps.c.seq <= at)
                .order_by(steps.c.seq)
            ).mappings()
        ]
        msg_rows = [
            dict(r)
            for r in conn.execute(
                select(messages).where(messages.c.run_id == source).order_by(messages.c.seq)
            ).mappings()
        ]
        change_rows = [
            dict(r)
            for r in conn.execute(
                select(workspace_changes).where(
                    workspace_changes.c.run_id == source, workspace_changes.c.seq <= at
                )
            ).mappings()
        ]
        kept: list[dict[str, Any]] = []
        for m in msg_rows:
            if m["step_seq"] is not None and m["step_seq"] > at:
                break
            kept.append(m)
        asked: list[str] = []
        answered: set[str] = set()
        for m in kept:
            for call in m["tool_calls"] or []:
                asked.append(str(call.get("id")))
            if m["role"] == "tool" and m["tool_call_id"]:
                answered.add(m["tool_call_id"])
        extra = [
            Message("tool", f"error: {NOT_RUN}", tool_call_id=c) for c in asked if c not in answered
        ]
        if task:
            extra.append(Message("user", task))
        for i, m in enumerate(kept):
            m.update(run_id=new_id, seq=i)
        kept += [message_values(new_id, len(kept) + i, m, at, now) for i, m in enumerate(extra)]
        for s in step_rows:
            s.pop("id", None)
            s["run_id"] = new_id
            s["pgid"] = None
            if s["state"] == StepState.STARTED.value:
                s.update(state=StepState.FAILED.value, error=NOT_RUN, finished_at=now)
        for c in change_rows:
            c.pop("id", None)
            c["run_id"] = new_id
        models = [s for s in step_rows if s["kind"] == StepKind.MODEL.value]
        conn.execute(
            insert(runs).values(
                storable(
                    {
                        "id": new_id,
                        "task": task or run["task"],
                        "workspace": workspace,
                        "model": run["model"],
                        "status": RunStatus.PENDING.value,
                        "created_at": now,
                        "updated_at": now,
                        "step_count": len(models),
                        "tool_call_count": sum(1 for m in kept if m["role"] == "tool"),
                        "prompt_tokens": sum(s["prompt_tokens"] or 0 for s in models),
                        "completion_tokens": sum(s["completion_tokens"] or 0 for s in models),
                        "cached_tokens": sum(s["cached_tokens"] or 0 for s in models),
                        "cost": _cost_sum(models),
                        "lease_epoch": 0,
                        "cancel_requested": False,
                        "settings": settings,
                        "message_count": len(kept),
                        "active_ms": 0,
                        "resume_count": 0,
                        "forked_from": source,
                        "fork_seq": at,
                    }
                )
            )
        )
        if step_rows:
            conn.execute(insert(steps), step_rows)
        conn.execute(insert(messages), kept)
        if change_rows:
            conn.execute(insert(workspace_changes), change_rows)


def _cost_sum(models: list[Any]) -> float | None:
    """The kept model steps' costs summed (None: none was priced), as a run's own are."""
    costs = [s["cost"] for s in models if s["cost"] is not None]
    return sum(costs) if costs else None
