"""Run-level reads and writes that need no lease: create, list, show, cancel, approve,
and taking a run's lease. The checkpoints written under a lease are in journal.py."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Row, insert, select, text, update

from durable_agent.errors import RunBusy, RunNotFound, UsageError
from durable_agent.messages import Message
from durable_agent.status import RunStatus
from durable_agent.store.rows import message_values, owner_is_dead, utcnow
from durable_agent.store.schema import approvals, messages, runs, steps
from durable_agent.store.storable import storable


def lease_is_live(row: Any, now: datetime) -> bool:
    """Held and not expired, by an owner not proven dead (same host, pid gone)."""
    return (row.lease_owner is not None and row.lease_expires_at is not None
            and row.lease_expires_at > now and not owner_is_dead(row.lease_owner))


def _locked_run(conn: Connection, run_id: str) -> Any:
    """The run's status and lease, locked until the transaction ends; RunNotFound if none."""
    row = conn.execute(select(runs.c.status, runs.c.lease_owner, runs.c.lease_expires_at)
                       .where(runs.c.id == run_id).with_for_update()).first()
    if row is None:
        raise RunNotFound(run_id)
    return row


class Store:
    """Run-level reads and the few writes that need no lease."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _read(self) -> Connection:
        return self.engine.connect().execution_options(readonly=True)

    # -- runs ---------------------------------------------------------------------------
    def create_run(self, run_id: str, *, task: str, workspace: str, model: str,
                   settings: dict[str, Any], first_messages: Sequence[Message],
                   lease: tuple[str, float] | None = None) -> None:
        """A new run: `pending` for the workers' queue, or with `lease` (owner, seconds)
        already `running` under that owner at epoch 1, so no worker can claim a run that a
        foreground `start` is about to execute."""
        task, workspace, model, settings = storable((task, workspace, model, settings))
        now = utcnow()
        leased: dict[str, Any] = {"status": RunStatus.PENDING.value, "lease_epoch": 0}
        if lease is not None:
            leased = {"status": RunStatus.RUNNING.value, "lease_epoch": 1, "lease_owner": lease[0],
                      "lease_expires_at": now + timedelta(seconds=lease[1])}
        with self.engine.begin() as conn:
            conn.execute(insert(runs).values(
                id=run_id, task=task, workspace=workspace, model=model,
                created_at=now, updated_at=now,
                step_count=0, tool_call_count=0, prompt_tokens=0, completion_tokens=0,
                cancel_requested=False, settings=settings,
                message_count=len(first_messages), active_ms=0, resume_count=0, **leased,
            ))
            conn.execute(insert(messages), [
                message_values(run_id, i, m, None, now) for i, m in enumerate(first_messages)
            ])

    def run_exists(self, run_id: str) -> bool:
        with self._read() as conn:
            return conn.execute(select(runs.c.id).where(runs.c.id == run_id)).first() is not None

    def get_run(self, run_id: str) -> Row[Any]:
        with self._read() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).first()
        if row is None:
            raise RunNotFound(run_id)
        return row

    def find_run_id(self, prefix: str) -> str:
        """A full id, or a unique prefix of one (ids are long; people type the start)."""
        with self._read() as conn:
            if conn.execute(select(runs.c.id).where(runs.c.id == prefix)).first():
                return prefix
            ids = conn.execute(
                select(runs.c.id).where(runs.c.id.startswith(prefix, autoescape=True)).limit(3)
            ).scalars().all()
        if len(ids) == 1:
            return str(ids[0])
        if ids:
            raise UsageError(f"run id prefix {prefix!r} is ambiguous: {', '.join(ids)}"
                             f"{', …' if len(ids) > 2 else ''}; type more of it")
        raise RunNotFound(prefix)

    def list_runs(self, *, status: str | None = None, limit: int = 50) -> list[Row[Any]]:
        query = select(runs).order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
        if status:
            query = query.where(runs.c.status == status)
        with self._read() as conn:
            return list(conn.execute(query).all())

    def steps(self, run_id: str) -> list[Row[Any]]:
        with self._read() as conn:
            return list(conn.execute(select(steps).where(steps.c.run_id == run_id).order_by(steps.c.seq)).all())

    def messages(self, run_id: str) -> list[Row[Any]]:
        with self._read() as conn:
            return list(conn.execute(
                select(messages).where(messages.c.run_id == run_id).order_by(messages.c.seq)).all())

    def approvals(self, run_id: str) -> list[Row[Any]]:
        with self._read() as conn:
            return list(conn.execute(
                select(approvals).where(approvals.c.run_id == run_id).order_by(approvals.c.id)).all())

    def request_cancel(self, run_id: str) -> Row[Any]:
        with self.engine.begin() as conn:
            res = conn.execute(update(runs).where(runs.c.id == run_id)
                               .values(cancel_requested=True, updated_at=utcnow()))
            if res.rowcount != 1:
                raise RunNotFound(run_id)
        return self.get_run(run_id)

    def cancel(self, run_id: str) -> str:
        """Flag a live run ("requested": it stops at its next boundary); end any other at once."""
        now = utcnow()
        with self.engine.begin() as conn:
            row = _locked_run(conn, run_id)
            if row.status == RunStatus.COMPLETED:
                raise UsageError(f"run {run_id} is already completed")
            if row.status == RunStatus.RUNNING and lease_is_live(row, now):
                conn.execute(update(runs).where(runs.c.id == run_id).values(cancel_requested=True, updated_at=now))
                return "requested"
            conn.execute(update(runs).where(runs.c.id == run_id).values(
                status=RunStatus.CANCELLED.value, stop_reason="cancelled", finished_at=now, updated_at=now,
                cancel_requested=False, lease_owner=None, lease_expires_at=None))
            return "cancelled"

    def requeue(self, run_id: str, *, settings: dict[str, Any] | None = None) -> None:
        """Put a stopped run back in the workers' queue (`pending`, no lease), with new
        recorded `settings` if given (written only once the run is known not to be live)."""
        now = utcnow()
        with self.engine.begin() as conn:
            row = _locked_run(conn, run_id)
            if lease_is_live(row, now):
                raise RunBusy(run_id, row.lease_owner)
            extra = {} if settings is None else {"settings": storable(settings)}
            conn.execute(update(runs).where(runs.c.id == run_id).values(
                status=RunStatus.PENDING.value, stop_reason=None, error=None, finished_at=None,
                cancel_requested=False, lease_owner=None, lease_expires_at=None, updated_at=now, **extra))

    def pending_approval(self, run_id: str) -> Row[Any] | None:
        with self._read() as conn:
            return conn.execute(
                select(approvals).where(approvals.c.run_id == run_id, approvals.c.decision.is_(None))
                .order_by(approvals.c.id.desc())
            ).first()

    def decide_approval(self, approval_id: int, *, approved: bool, by: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(approvals).where(approvals.c.id == approval_id).values(
                decision="approved" if approved else "denied", decided_by=storable(by), decided_at=utcnow()))

    def update_settings(self, run_id: str, settings: dict[str, Any]) -> None:
        settings = storable(settings)
        with self.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.id == run_id).values(settings=settings, updated_at=utcnow()))

    # -- leases -------------------------------------------------------------------------
    def acquire_lease(self, run_id: str, owner: str, lease_seconds: float) -> int:
        """Take the run's lease and return the new epoch; RunBusy if a live owner holds it."""
        now = utcnow()
        with self.engine.begin() as conn:
            row = conn.execute(
                select(runs.c.lease_owner, runs.c.lease_expires_at, runs.c.lease_epoch)
                .where(runs.c.id == run_id).with_for_update()
            ).first()
            if row is None:
                raise RunNotFound(run_id)
            if lease_is_live(row, now):
                raise RunBusy(run_id, row.lease_owner)
            epoch = row.lease_epoch + 1
            conn.execute(update(runs).where(runs.c.id == run_id).values(
                lease_owner=owner, lease_epoch=epoch,
                lease_expires_at=now + timedelta(seconds=lease_seconds),
                status=RunStatus.RUNNING.value, stop_reason=None, error=None,
                finished_at=None, cancel_requested=False, updated_at=now,
                resume_count=runs.c.resume_count + (1 if row.lease_epoch > 0 else 0),
            ))
        return int(epoch)

    # -- SQL written for people --------------------------------------------------------------
    def query(self, statement: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        """One read-only statement as a user would type it (the demo's proof, docs/queries.md):
        its column names and rows. Not for the package's own reads: those are typed methods."""

        with self._read() as conn:
            result = conn.execute(text(statement), params or {})
            return list(result.keys()), [tuple(row) for row in result]
