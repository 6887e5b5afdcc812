"""A parent `waiting` on its child runs (docs/delegation.md, "Waiting in the workers' queue").

A parent executed by a worker that reaches a `delegate` call whose child has not ended
stops `waiting`: no lease, no process. It becomes `pending` again, for any worker, once
none of its children is pending, running or waiting itself. Two writes make sure of that,
so no crash between a child's end and its parent's wake leaves the parent waiting forever:

    the child's end    its final status commit (Journal.finish_run, a cancel) wakes the
                       parent in the same transaction, when it was the last child not ended
    the claim          each worker's claim wakes every waiting run none of whose children
                       is still going (a sweep: the end's wake was lost, or raced)

Races between a parent going `waiting` and its last child ending are closed by the
parent's row lock: the parent's own commit holds it (its fence), and a child's end takes
it before it looks at its siblings, so whichever commits second sees the other's write.
(On SQLite every write transaction is serialized already.)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, case, exists, or_, select, update

from durable_agent.status import RunStatus
from durable_agent.store.schema import runs

# A child in one of these has not stopped: its parent waits on.
NOT_ENDED = (RunStatus.PENDING.value, RunStatus.RUNNING.value, RunStatus.WAITING.value)


def _children_going(parent: Any) -> Any:
    kid = runs.alias("kid")
    # (Equalities, not IN: a checkpoint's statements are compiled without expanding IN.)
    return exists().where(kid.c.parent_id == parent, or_(*(kid.c.status == s for s in NOT_ENDED)))


def wait_values() -> dict[str, Any]:
    """The parent's row as it stops for its children (in its fenced commit): `waiting`
    without a lease, or `pending` at once when every child ended since it looked."""
    return {
        "status": case(
            (_children_going(runs.c.id), RunStatus.WAITING.value),
            else_=RunStatus.PENDING.value,
        ),
        "stop_reason": None,
        "error": None,
        "lease_owner": None,
        "lease_expires_at": None,
    }


def wake_parent(run_id: str, now: datetime) -> list[tuple[Any, dict[str, Any]]]:
    """Statements for the transaction that ends run `run_id`: its parent, if waiting and no
    other child is going, becomes `pending`. The parent's row is locked first (PostgreSQL),
    so the check of the siblings reads what a sibling ending at the same time committed."""
    me = runs.alias("me")
    parent = select(me.c.parent_id).where(me.c.id == run_id).scalar_subquery()
    lock = select(runs.c.id).where(runs.c.id == parent).with_for_update()
    wake = (
        update(runs)
        .where(
            runs.c.id == parent,
            runs.c.status == RunStatus.WAITING.value,
            ~_children_going(runs.c.id),
        )
        .values(status=RunStatus.PENDING.value, updated_at=now)
    )
    return [(lock, {}), (wake, {})]


def sweep(conn: Connection, now: datetime) -> list[str]:
    """Wake every waiting run none of whose children is going (in a claim's transaction).
    Rows another claimer has locked are skipped: that one wakes them."""
    ready = conn.execute(
        select(runs.c.id)
        .where(runs.c.status == RunStatus.WAITING.value, ~_children_going(runs.c.id))
        .with_for_update(skip_locked=True, of=runs)
    ).scalars()
    ids = list(ready)
    if ids:
        conn.execute(
            update(runs)
            .where(
                runs.c.id.in_(ids),
                runs.c.status == RunStatus.WAITING.value,
                ~_children_going(runs.c.id),
            )
            .values(status=RunStatus.PENDING.value, updated_at=now)
        )
    return ids
