"""The fleet tables (0010, docs/fleets.md): what the queue holds and why a run waits,
concurrency keys' limits, batches and their tasks.

Every function takes the engine and runs one short transaction (retried on transient faults
like the rest of the store); the rules that decide a claim are in store/queue.py.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from msgspec import Struct
from sqlalchemy import Connection, Engine, func, insert, select, update

from durable_agent.status import RunStatus
from durable_agent.store import leases, retrying
from durable_agent.store.rows import utcnow
from durable_agent.store.schema import batches, queue_keys, runs

T = TypeVar("T")
_POLICY = retrying.StorePolicy(max_attempts=3, max_seconds=5.0)


def _write(engine: Engine, fn: Callable[[Connection], T]) -> T:
    def attempt() -> T:
        with engine.begin() as conn:
            return fn(conn)

    return retrying.run(attempt, _POLICY)


def _read(engine: Engine, fn: Callable[[Connection], T]) -> T:
    return retrying.read(engine, fn, _POLICY)


# -- the queue ------------------------------------------------------------------------------
class QueuedRun(Struct, frozen=True):
    id: str
    status: str
    priority: int
    queue_key: str | None
    batch: str | None  # the batch's name
    created_at: datetime
    owner: str | None
    why: str  # running: "running"; waiting: why it is not running yet


def set_key_limit(engine: Engine, key: str, max_running: int) -> None:
    def write(conn: Connection) -> None:
        now = utcnow()
        done = conn.execute(
            update(queue_keys)
            .where(queue_keys.c.key == key)
            .values(max_running=max_running, updated_at=now)
        )
        if done.rowcount == 0:
            conn.execute(
                insert(queue_keys).values(key=key, max_running=max_running, updated_at=now)
            )

    _write(engine, write)


def key_limits(engine: Engine) -> dict[str, int]:
    rows = _read(engine, lambda c: c.execute(select(queue_keys)).all())
    return {r.key: r.max_running for r in rows}


def queue_overview(
    engine: Engine, *, max_running: int | None = None, now: datetime | None = None
) -> list[QueuedRun]:
    """Running runs, then waiting ones in the order a claim takes them (orphans first, then
    by priority, then age), each waiting one with the reason it waits (store/queue.py)."""
    now = now or utcnow()

    def read(conn: Connection) -> tuple[list[Any], dict[str, int], dict[str, Any]]:
        rows = conn.execute(
            select(
                runs.c.id,
                runs.c.status,
                runs.c.priority,
                runs.c.queue_key,
                runs.c.batch_id,
                runs.c.created_at,
                runs.c.lease_owner,
                runs.c.lease_expires_at,
                runs.c.error,
            )
            .where(runs.c.status.in_((RunStatus.PENDING.value, RunStatus.RUNNING.value)))
            .order_by(runs.c.priority.desc(), runs.c.created_at, runs.c.id)
        ).all()
        limits = {r.key: r.max_running for r in conn.execute(select(queue_keys)).all()}
        found = {r.id: r for r in conn.execute(select(batches)).all()}
        return list(rows), limits, found

    rows, limits, found_batches = _read(engine, read)

    def live(r: Any) -> bool:
        return (
            r.status == RunStatus.RUNNING.value
            and r.lease_owner is not None
            and r.lease_expires_at is not None
            and r.lease_expires_at > now
            and not leases.owner_is_dead(r.lease_owner)
        )

    running = [r for r in rows if live(r)]
    orphans = [r for r in rows if r.status == RunStatus.RUNNING.value and not live(r)]
    pending = [r for r in rows if r.status == RunStatus.PENDING.value]
    per_key: dict[str, int] = {}
    per_batch: dict[str, int] = {}
    for r in running:
        if r.queue_key:
            per_key[r.queue_key] = per_key.get(r.queue_key, 0) + 1
        if r.batch_id:
            per_batch[r.batch_id] = per_batch.get(r.batch_id, 0) + 1

    def name(r: Any) -> str | None:
        b = found_batches.get(r.batch_id) if r.batch_id else None
        return str(b.name) if b is not None else r.batch_id

    out = [
        QueuedRun(
            r.id, r.status, r.priority, r.queue_key, name(r), r.created_at, r.lease_owner, "running"
        )
        for r in running
    ]
    first = True
    for r in orphans + pending:
        why = _why(r, per_key, per_batch, limits, found_batches, len(running), max_running)
        if why is None:
            if r.status == RunStatus.RUNNING.value:
                why = "orphaned (its worker is gone or its lease expired): taken over first"
            else:
                why = "next for a free worker" if first else "waiting for a free worker"
            first = False
        elif r.error and r.status == RunStatus.PENDING.value and why == "":
            why = r.error
        out.append(
            QueuedRun(
                r.id, r.status, r.priority, r.queue_key, name(r), r.created_at, r.lease_owner, why
            )
        )
    return out


def _why(
    r: Any,
    per_key: dict[str, int],
    per_batch: dict[str, int],
    limits: dict[str, int],
    found_batches: dict[str, Any],
    running: int,
    max_running: int | None,
) -> str | None:
    if r.queue_key is not None:
        limit = limits.get(r.queue_key, 1)
        if per_key.get(r.queue_key, 0) >= limit:
            return (
                f"queue_key {r.queue_key!r} at its limit ({per_key[r.queue_key]}/{limit} running)"
            )
    b = found_batches.get(r.batch_id) if r.batch_id else None
    if b is not None and b.max_parallel is not None and per_batch.get(b.id, 0) >= b.max_parallel:
        return f"batch {b.name!r} at max_parallel ({per_batch[b.id]}/{b.max_parallel} running)"
    if max_running is not None and running >= max_running and r.status == RunStatus.PENDING.value:
        return f"global limit reached ({running}/{max_running} running)"
    if r.error and r.status == RunStatus.PENDING.value:
        return f"left by a worker: {r.error.splitlines()[0][:120]}"
    return None


def live_counts(engine: Engine, where: Any, now: datetime | None = None) -> int:
    """Runs matching `where` under a live lease (tests, `batch show`)."""
    now = now or utcnow()
    return int(
        _read(
            engine,
            lambda c: c.execute(
                select(func.count())
                .select_from(runs)
                .where(
                    where,
                    runs.c.status == RunStatus.RUNNING.value,
                    runs.c.lease_expires_at > now,
                )
            ).scalar_one(),
        )
    )
