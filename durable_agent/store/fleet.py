"""The fleet tables (0010, docs/fleets.md): what the queue holds and why a run waits,
concurrency keys' limits, batches and their tasks.

Every function takes the engine and runs one short transaction (retried on transient faults
like the rest of the store); the rules that decide a claim are in store/queue.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from msgspec import Struct
from sqlalchemy import Connection, Engine, case, func, insert, select, update

from durable_agent.status import RunStatus, StepKind, StopReason
from durable_agent.store import leases, outbox, retrying
from durable_agent.store.rows import utcnow
from durable_agent.store.schema import batch_tasks, batches, queue_keys, runs, steps
from durable_agent.store.storable import storable

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
            .where(runs.c.status.in_(OPEN))
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
    waiting = [r for r in rows if r.status == RunStatus.WAITING.value]
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
        out.append(
            QueuedRun(
                r.id, r.status, r.priority, r.queue_key, name(r), r.created_at, r.lease_owner, why
            )
        )
    for r in waiting:  # claimable again once their children ended (store/waiting.py)
        out.append(
            QueuedRun(
                r.id,
                r.status,
                r.priority,
                r.queue_key,
                name(r),
                r.created_at,
                None,
                "waiting for its child runs: queued again when they ended",
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


# -- batches --------------------------------------------------------------------------------
class BatchRecord(Struct, frozen=True):
    id: str
    name: str
    status: str  # active | cancelled | finished
    max_parallel: int | None
    workdir: str
    created_at: datetime
    finished_at: datetime | None


class TaskRow(Struct, frozen=True):
    """One task of a batch with its run's figures (`batch show`, `batch export`)."""

    task_id: str
    run_id: str
    seq: int
    spec: dict[str, Any]
    status: str
    stop_reason: str | None
    model: str
    step_count: int
    tool_call_count: int
    prompt_tokens: int
    completion_tokens: int
    active_ms: int
    created_at: datetime
    finished_at: datetime | None
    settings: dict[str, Any] | None
    verify: str | None  # pass | fail | None (no verification ran)
    cost: float | None = None  # runs.cost: its steps priced (0011; None: none was)


def _batch(row: Any) -> BatchRecord:
    return BatchRecord(
        row.id, row.name, row.status, row.max_parallel, row.workdir, row.created_at, row.finished_at
    )


def open_batch(
    engine: Engine, batch_id: str, name: str, workdir: str, max_parallel: int | None
) -> tuple[BatchRecord, bool]:
    """The batch called `name`, made now if there is none: (batch, made). The name is the
    dedup key's first half: submitting to it again adds only the tasks it does not have."""

    def write(conn: Connection) -> tuple[BatchRecord, bool]:
        found = conn.execute(select(batches).where(batches.c.name == name)).first()
        if found is not None:
            return _batch(found), False
        now = utcnow()
        conn.execute(
            insert(batches).values(
                id=batch_id,
                name=name,
                status="active",
                max_parallel=max_parallel,
                workdir=workdir,
                created_at=now,
                updated_at=now,
            )
        )
        return _batch(conn.execute(select(batches).where(batches.c.id == batch_id)).one()), True

    return _write(engine, write)


def batch_named(engine: Engine, name: str) -> BatchRecord | None:
    row = _read(engine, lambda c: c.execute(select(batches).where(batches.c.name == name)).first())
    return None if row is None else _batch(row)


def find_batch(engine: Engine, id_or_name: str) -> BatchRecord | None:
    """A batch by id, by name, or by a unique id prefix."""

    def read(conn: Connection) -> Any:
        row = conn.execute(
            select(batches).where((batches.c.id == id_or_name) | (batches.c.name == id_or_name))
        ).first()
        if row is None and id_or_name:
            rows = conn.execute(
                select(batches).where(batches.c.id.startswith(id_or_name, autoescape=True)).limit(2)
            ).all()
            row = rows[0] if len(rows) == 1 else None
        return row

    row = _read(engine, read)
    return None if row is None else _batch(row)


def task_runs(engine: Engine, batch_id: str) -> dict[str, str]:
    """task id -> run id of the batch's tasks."""
    rows = _read(
        engine,
        lambda c: c.execute(
            select(batch_tasks.c.task_id, batch_tasks.c.run_id).where(
                batch_tasks.c.batch_id == batch_id
            )
        ).all(),
    )
    return {r.task_id: r.run_id for r in rows}


def add_task(
    engine: Engine, batch_id: str, task_id: str, run_id: str, seq: int, spec: dict[str, Any]
) -> bool:
    """Record a task whose run exists and has none: a run made by a submit of a version
    before the two were one transaction (runner.create's `batch_task`), killed between
    them, is adopted by the next submit of its file. False: the task had its row (made by
    another submit of the file meanwhile)."""

    def write(conn: Connection) -> bool:
        there = conn.execute(
            select(batch_tasks.c.run_id).where(
                batch_tasks.c.batch_id == batch_id, batch_tasks.c.task_id == task_id
            )
        ).first()
        if there is None:
            conn.execute(
                insert(batch_tasks).values(
                    batch_id=batch_id,
                    task_id=task_id,
                    run_id=run_id,
                    seq=seq,
                    spec=storable(spec),
                    created_at=utcnow(),
                )
            )
            return True
        return False

    try:
        return _write(engine, write)
    except Exception:
        if task_id in task_runs(engine, batch_id):  # another submit's insert came first
            return False
        raise


def task_rows(engine: Engine, batch_id: str) -> list[TaskRow]:
    """The batch's tasks in submission order, with their runs and the last verification."""

    def read(conn: Connection) -> list[TaskRow]:
        rows = conn.execute(
            select(
                batch_tasks.c.task_id,
                batch_tasks.c.run_id,
                batch_tasks.c.seq,
                batch_tasks.c.spec,
                runs.c.status,
                runs.c.stop_reason,
                runs.c.model,
                runs.c.step_count,
                runs.c.tool_call_count,
                runs.c.prompt_tokens,
                runs.c.completion_tokens,
                runs.c.active_ms,
                runs.c.created_at,
                runs.c.finished_at,
                runs.c.settings,
                runs.c.cost,
            )
            .select_from(batch_tasks.join(runs, runs.c.id == batch_tasks.c.run_id))
            .where(batch_tasks.c.batch_id == batch_id)
            .order_by(batch_tasks.c.seq)
        ).all()
        last_verify: dict[str, str] = {}
        verified = conn.execute(
            select(steps.c.run_id, steps.c.state)
            .select_from(steps.join(batch_tasks, batch_tasks.c.run_id == steps.c.run_id))
            .where(batch_tasks.c.batch_id == batch_id, steps.c.kind == StepKind.VERIFY.value)
            .order_by(steps.c.run_id, steps.c.seq)
        ).all()
        for v in verified:  # the last one of each run stands
            last_verify[v.run_id] = v.state
        return [
            TaskRow(
                task_id=r.task_id,
                run_id=r.run_id,
                seq=r.seq,
                spec=dict(r.spec or {}),
                status=r.status,
                stop_reason=r.stop_reason,
                model=r.model,
                step_count=r.step_count,
                tool_call_count=r.tool_call_count,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion_tokens,
                active_ms=r.active_ms,
                created_at=r.created_at,
                finished_at=r.finished_at,
                settings=r.settings,
                verify={"completed": "pass", "failed": "fail"}.get(last_verify.get(r.run_id, "")),
                cost=None if r.cost is None else float(r.cost),
            )
            for r in rows
        ]

    return _read(engine, read)


# Not ended: queued, running, or waiting for its child runs (store/waiting.py).
OPEN = (RunStatus.PENDING.value, RunStatus.RUNNING.value, RunStatus.WAITING.value)
BATCH_CANCELLED = "cancelled"


def cancel_batch(engine: Engine, batch_id: str) -> tuple[int, int]:
    """The batch is cancelled: its queued runs end `cancelled` now, its running ones are
    asked to stop at their next step. Returns (cancelled, asked)."""

    def write(conn: Connection) -> tuple[int, int]:
        now = utcnow()
        conn.execute(
            update(batches)
            .where(batches.c.id == batch_id)
            .values(status=BATCH_CANCELLED, updated_at=now)
        )
        # The tasks' runs and every run they delegated to, at any depth (docs/delegation.md).
        # The runs too that name the batch but have no task row yet: a submit killed between
        # making a task's run and recording the task left one, queued for the workers.
        tasks = select(batch_tasks.c.run_id).where(batch_tasks.c.batch_id == batch_id)
        tree = (
            select(runs.c.id)
            .where(
                runs.c.id.in_(tasks) | ((runs.c.batch_id == batch_id) & runs.c.parent_id.is_(None))
            )
            .cte("family", recursive=True)
        )
        # UNION, not UNION ALL: a parent_id cycle made by hand ends the recursion.
        tree = tree.union(select(runs.c.id).where(runs.c.parent_id == tree.c.id))
        # Read first, then updated by id (an UPDATE led by WITH has no row count in Python's
        # sqlite3 before 3.12), a slice at a time (SQLite's limit on bound values).
        family = conn.execute(select(tree.c.id)).scalars().all()
        # Queued ones and ones waiting for their child runs hold no lease: ended at once
        # (their children too: nobody would read their answers).
        stopped = (RunStatus.PENDING.value, RunStatus.WAITING.value)
        queued = asked = 0
        for start in range(0, len(family), 500):
            some = runs.c.id.in_(family[start : start + 500])
            queued += conn.execute(
                update(runs)
                .where(some, runs.c.status.in_(stopped))
                .values(
                    status=RunStatus.CANCELLED.value,
                    stop_reason=StopReason.CANCELLED.value,
                    error="batch cancelled",
                    finished_at=now,
                    updated_at=now,
                )
            ).rowcount
            asked += conn.execute(
                update(runs)
                .where(some, runs.c.status == RunStatus.RUNNING.value)
                .values(cancel_requested=True, updated_at=now)
            ).rowcount
        return queued, asked

    return _write(engine, write)


def resume_batch(engine: Engine, batch_id: str) -> int:
    """Queue again every task whose run stopped short of `completed` (failed, cancelled,
    over budget, blocked): each continues from its last step. Returns how many."""

    def write(conn: Connection) -> int:
        now = utcnow()
        ids = select(batch_tasks.c.run_id).where(batch_tasks.c.batch_id == batch_id)
        queued = int(
            conn.execute(
                update(runs)
                .where(
                    runs.c.id.in_(ids),
                    runs.c.status.not_in((*OPEN, RunStatus.COMPLETED.value)),
                )
                .values(
                    status=RunStatus.PENDING.value,
                    lease_owner=None,
                    lease_expires_at=None,
                    cancel_requested=False,
                    updated_at=now,
                )
            ).rowcount
        )
        # Open again, unless it finished and nothing was queued (its batch_done stands).
        reopen = update(batches).where(batches.c.id == batch_id)
        if not queued:
            reopen = reopen.where(batches.c.finished_at.is_(None))
        conn.execute(reopen.values(status="active", finished_at=None, updated_at=now))
        return queued

    return _write(engine, write)


def done_unfinished(engine: Engine) -> list[str]:
    """The batches not marked finished none of whose runs is open any more: their last run
    ended where nobody asked `finish_if_done` (a worker killed right after the run's end, a
    task's run cancelled or resumed on its own)."""

    def read(conn: Connection) -> list[str]:
        still = (
            select(batch_tasks.c.batch_id)
            .select_from(batch_tasks.join(runs, runs.c.id == batch_tasks.c.run_id))
            .where(runs.c.status.in_(OPEN))
        )
        return list(
            conn.execute(
                select(batches.c.id).where(
                    batches.c.finished_at.is_(None),
                    batches.c.id.in_(select(batch_tasks.c.batch_id)),  # (one being submitted: not)
                    batches.c.id.not_in(still),
                )
            )
            .scalars()
            .all()
        )

    return _read(engine, read)


def finish_if_done(engine: Engine, batch_id: str, targets: Sequence[tuple[int, str]] = ()) -> bool:
    """Mark the batch finished when none of its runs is pending or running. True exactly
    once per batch (a compare-and-set on finished_at): the one place a batch finishes.
    `targets`: the [[notify]] entries (index, target) that want `batch_done`: their outbox
    rows go in the same transaction, keyed by the batch, so each is sent once."""

    def write(conn: Connection) -> bool:
        ids = select(batch_tasks.c.run_id).where(batch_tasks.c.batch_id == batch_id)
        left = conn.execute(
            select(func.count())
            .select_from(runs)
            .where(runs.c.id.in_(ids), runs.c.status.in_(OPEN))
        ).scalar_one()
        if left:
            return False
        now = utcnow()
        done = conn.execute(
            update(batches)
            .where(batches.c.id == batch_id, batches.c.finished_at.is_(None))
            .values(
                finished_at=now,
                updated_at=now,
                status=case(
                    (batches.c.status == BATCH_CANCELLED, BATCH_CANCELLED), else_="finished"
                ),
            )
        )
        if done.rowcount != 1:
            return False
        for statement, params in outbox.insert_statements(
            _batch_done_rows(conn, batch_id, ids, targets, now)
        ):
            conn.execute(statement, params)
        return True

    return _write(engine, write)


def _batch_done_rows(
    conn: Connection,
    batch_id: str,
    ids: Any,
    targets: Sequence[tuple[int, str]],
    finished: datetime,
) -> list[dict[str, Any]]:
    if not targets:
        return []
    counts = {
        str(status): int(n)
        for status, n in conn.execute(
            select(runs.c.status, func.count()).where(runs.c.id.in_(ids)).group_by(runs.c.status)
        )
    }
    cost = conn.execute(select(func.sum(runs.c.cost)).where(runs.c.id.in_(ids))).scalar()
    name, status = conn.execute(
        select(batches.c.name, batches.c.status).where(batches.c.id == batch_id)
    ).one()
    payload = {
        "event": "batch_done",
        "batch_id": batch_id,
        "name": name,
        "status": status,
        "tasks": sum(counts.values()),
        "by_status": counts,
        "cost": None if cost is None else float(cost),
        "at": finished.isoformat() + "Z",
    }
    # One per finish (a batch resumed and finished again is told again), per target.
    base = f"batch_done:{batch_id}:{finished:%Y%m%dT%H%M%S%f}"
    return outbox.event_rows(base, "batch_done", None, payload, targets)


# -- rate limits ------------------------------------------------------------------------------
class Want(Struct, frozen=True):
    """Capacity one model call asks of one limit: `amount` (1 request, or its tokens) out of
    `limit` per window, under `key` (e.g. "rpm:gpt-4.1-mini")."""

    key: str
    amount: int
    limit: int


def take_capacity(
    engine: Engine,
    wants: list[Want],
    window_s: float,
    now: datetime,
    run_id: str | None = None,
    *,
    hold_s: float = 0.0,
) -> tuple[float, list[int]]:
    """A sliding window shared by every worker: record the wants if each fits in its limit
    over the last `window_s` seconds, all or none. Returns (0, event ids) when taken, else
    (seconds until the oldest events that must leave the window have left, []).

    The rate_limits row of each key is locked first (FOR UPDATE on PostgreSQL; SQLite's BEGIN
    IMMEDIATE holds the whole store), in key order, so two takers count and insert one after
    the other: the window is never overfilled by a race. A want larger than its limit is let
    through alone in an empty window (it could never fit otherwise).

    `hold_s`: the events are stamped that far ahead of `now`, the latest the request can
    reach the provider; `settle_capacity` moves the stamp back to when it answered. So a
    request in flight never leaves the window before it has arrived, however late it goes
    out, and one whose session died holds its place until then (it may have been sent)."""
    from datetime import timedelta

    from durable_agent.store.schema import rate_events, rate_limits

    for want in wants:  # made once per key, outside the counting transaction
        _ensure_limit_row(engine, want.key, now)

    def write(conn: Connection) -> tuple[float, list[int]]:
        since = now - timedelta(seconds=window_s)
        wait = 0.0
        for want in sorted(wants, key=lambda w: w.key):
            locked = conn.execute(
                select(rate_limits.c.key).where(rate_limits.c.key == want.key).with_for_update()
            ).first()
            if locked is None:  # (deleted by hand since): counted unlocked, as on SQLite
                pass
            events = conn.execute(
                select(rate_events.c.at, rate_events.c.amount)
                .where(rate_events.c.key == want.key, rate_events.c.at > since)
                .order_by(rate_events.c.at)
            ).all()
            used = sum(e.amount for e in events)
            if used and used + want.amount > want.limit:
                for e in events:  # when enough of the oldest have left the window
                    used -= e.amount
                    if used + want.amount <= want.limit or used == 0:
                        wait = max(wait, (e.at - since).total_seconds())
                        break
        if wait > 0:
            return wait, []
        ids = []
        for want in wants:
            res = conn.execute(
                insert(rate_events).values(key=want.key, at=now, amount=want.amount, run_id=run_id)
            )
            ids.append(int(res.inserted_primary_key[0]))  # type: ignore[index]
        conn.execute(
            rate_events.delete().where(rate_events.c.at <= since - timedelta(seconds=window_s))
        )
        return 0.0, ids

    return _write(engine, write)


def settle_capacity(
    engine: Engine, event_ids: list[int], at: datetime, amounts: dict[int, int] | None = None
) -> None:
    """A call answered (or failed) at `at`: its events are stamped then, and `amounts` (its
    real tokens, by event id) replace the estimates."""
    from durable_agent.store.schema import rate_events

    def write(conn: Connection) -> None:
        for event_id in event_ids:
            values: dict[str, Any] = {"at": at}
            if amounts and event_id in amounts:
                values["amount"] = amounts[event_id]
            conn.execute(update(rate_events).where(rate_events.c.id == event_id).values(values))

    _write(engine, write)


def _ensure_limit_row(engine: Engine, key: str, now: datetime) -> None:
    from sqlalchemy.exc import IntegrityError

    from durable_agent.store.schema import rate_limits

    def write(conn: Connection) -> None:
        if conn.execute(select(rate_limits.c.key).where(rate_limits.c.key == key)).first() is None:
            conn.execute(insert(rate_limits).values(key=key, updated_at=now))

    with contextlib.suppress(IntegrityError):  # another worker made it first
        _write(engine, write)


# -- schedules --------------------------------------------------------------------------------
class ScheduleRecord(Struct, frozen=True):
    name: str
    cron: str
    tz: str
    task: str
    settings: dict[str, Any]
    catch_up: str  # none | one
    paused: bool
    next_tick: datetime  # naive UTC
    last_tick: datetime | None
    last_run_id: str | None
    created_at: datetime


def _schedule(row: Any) -> ScheduleRecord:
    return ScheduleRecord(
        row.name,
        row.cron,
        row.tz,
        row.task,
        dict(row.settings or {}),
        row.catch_up,
        bool(row.paused),
        row.next_tick,
        row.last_tick,
        row.last_run_id,
        row.created_at,
    )


def add_schedule(engine: Engine, record: ScheduleRecord) -> bool:
    """False when a schedule of that name exists (nothing changed)."""
    from durable_agent.store.schema import schedules

    def write(conn: Connection) -> bool:
        if conn.execute(select(schedules.c.name).where(schedules.c.name == record.name)).first():
            return False
        conn.execute(
            insert(schedules).values(
                name=record.name,
                cron=record.cron,
                tz=record.tz,
                task=storable(record.task),
                settings=storable(record.settings),
                catch_up=record.catch_up,
                paused=record.paused,
                next_tick=record.next_tick,
                created_at=record.created_at,
                updated_at=record.created_at,
            )
        )
        return True

    return _write(engine, write)


def list_schedules(engine: Engine, *, due_by: datetime | None = None) -> list[ScheduleRecord]:
    """Every schedule by name; with `due_by`, only the active ones whose next tick has come."""
    from durable_agent.store.schema import schedules

    query = select(schedules).order_by(schedules.c.name)
    if due_by is not None:
        query = query.where(schedules.c.paused.is_(False), schedules.c.next_tick <= due_by)
    return [_schedule(r) for r in _read(engine, lambda c: c.execute(query).all())]


def update_schedule(engine: Engine, name: str, **values: Any) -> bool:
    from durable_agent.store.schema import schedules

    values["updated_at"] = utcnow()
    return bool(
        _write(
            engine,
            lambda c: (
                c.execute(
                    update(schedules).where(schedules.c.name == name).values(**values)
                ).rowcount
            ),
        )
    )


def remove_schedule(engine: Engine, name: str) -> bool:
    from durable_agent.store.schema import schedule_ticks, schedules

    def write(conn: Connection) -> bool:
        conn.execute(schedule_ticks.delete().where(schedule_ticks.c.schedule == name))
        return bool(conn.execute(schedules.delete().where(schedules.c.name == name)).rowcount)

    return _write(engine, write)


def tick_done(
    engine: Engine,
    name: str,
    was_next: datetime,
    tick: datetime | None,
    run_id: str | None,
    next_tick: datetime,
) -> bool:
    """Move the schedule past a tick: record (schedule, tick) -> run (its idempotency key:
    a second record of one tick is a no-op) and the next tick, compare-and-set on the next
    tick as read, so two workers handling the same tick move it once. True: this call did."""
    from durable_agent.store.schema import schedule_ticks, schedules

    def write(conn: Connection) -> bool:
        now = utcnow()
        if tick is not None and run_id is not None:
            there = conn.execute(
                select(schedule_ticks.c.run_id).where(
                    schedule_ticks.c.schedule == name, schedule_ticks.c.tick == tick
                )
            ).first()
            if there is None:
                conn.execute(
                    insert(schedule_ticks).values(
                        schedule=name, tick=tick, run_id=run_id, created_at=now
                    )
                )
        values: dict[str, Any] = {"next_tick": next_tick, "updated_at": now}
        if tick is not None:
            values |= {"last_tick": tick, "last_run_id": run_id}
        moved = conn.execute(
            update(schedules)
            .where(schedules.c.name == name, schedules.c.next_tick == was_next)
            .values(**values)
        )
        return moved.rowcount == 1

    return _write(engine, write)


def schedule_runs(engine: Engine, name: str) -> list[tuple[datetime, str]]:
    from durable_agent.store.schema import schedule_ticks

    rows = _read(
        engine,
        lambda c: c.execute(
            select(schedule_ticks.c.tick, schedule_ticks.c.run_id)
            .where(schedule_ticks.c.schedule == name)
            .order_by(schedule_ticks.c.tick)
        ).all(),
    )
    return [(r.tick, r.run_id) for r in rows]
