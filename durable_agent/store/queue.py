"""The queue of runs that `durable-agent worker` drains: claim, global limit, release.

There is no coordinator process: the database is the queue. A run is claimable when it is
`pending` (created with `start --detach`, or given back by a worker that shut down) or
`running` under a lease that has expired or was dropped (its worker crashed, stalled or
was cut off), or under a lease of a process of this host that is gone (proved at claim
time: same host, boot and PID namespace, pid gone or a zombie). Orphans come first, oldest
first, then pending runs, oldest first. One transaction locks the chosen row with
`SELECT … FOR UPDATE SKIP LOCKED` and takes its lease with a new `lease_epoch`, so two
workers never get the same run, and the previous holder, if it still lives, is fenced out:
every Journal write checks (`lease_owner`, `lease_epoch`).

On SQLite the same code runs: `FOR UPDATE SKIP LOCKED` is dropped by SQLAlchemy, and the
write transaction (`BEGIN IMMEDIATE`) already serializes every claimer.

Queue controls (0010, docs/fleets.md): pending runs go by `priority` (higher first), then
age; orphans still come before every pending run. A run with a `queue_key` is claimed only
while fewer than the key's limit (queue_keys.max_running, else 1) of its key hold live
leases, and a batch's run only while fewer than the batch's `max_parallel` do. The count
and the take happen in one transaction that holds the key's (the batch's) advisory lock
on PostgreSQL (tried, never waited for: a claimer that cannot have it skips the run, as
SKIP LOCKED skips a row), and BEGIN IMMEDIATE on SQLite, so two workers cannot both take
the last slot.

Lease times use the workers' clocks (naive UTC, like the Journal's fence): keep the
machines' clocks in sync (NTP) and `lease_seconds` well above their skew.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any

from msgspec import Struct, field
from sqlalchemy import Connection, Engine, and_, func, or_, select, text, update

from durable_agent.status import RunStatus
from durable_agent.store import leases, retrying, waiting
from durable_agent.store.rows import utcnow
from durable_agent.store.schema import runs
from durable_agent.store.storable import storable

# Key of the PostgreSQL advisory lock that serializes claims only while a global limit is
# set: counting live leases and taking one must be atomic, and under READ COMMITTED two
# concurrent claimers would both see "one slot left". Without a limit, claims never wait
# for each other (SKIP LOCKED).
CLAIM_LOCK_KEY = 727_275

# How many claimable rows one claim looks at before giving up when this worker rejects
# them (workspace not reachable here); the rejected ones are excluded next time.
MAX_CANDIDATES = 16

CLAIMABLE = (RunStatus.PENDING.value, RunStatus.RUNNING.value)

# Namespaces of the advisory locks (two-int form) of a queue key and of a batch's slots.
QUEUE_KEY_LOCK = 727_276
BATCH_LOCK = 727_277

_CANDIDATE_COLUMNS = (
    runs.c.id,
    runs.c.status,
    runs.c.workspace,
    runs.c.settings,
    runs.c.lease_owner,
    runs.c.lease_epoch,
    runs.c.batch_id,  # 0010: queue controls
    runs.c.queue_key,
)


class Claim(Struct, frozen=True):
    """A run whose lease this worker now holds, with what it needs to execute it."""

    run_id: str
    owner: str
    epoch: int
    workspace: str
    settings: dict[str, Any]
    takeover: bool  # it was `running`: a lease that expired or was dropped, not a queued run
    previous_owner: str | None
    batch_id: str | None = None  # 0010: the batch it is a task of


class Rejected(Struct, frozen=True):
    run_id: str
    workspace: str


class _Orphan(Struct, frozen=True):
    id: str
    epoch: int
    dead: bool  # its lease has not expired: its owner, a process of this host, is gone


def _orphaned(owner: str | None, expires_at: datetime | None, now: datetime) -> bool:
    return (
        expires_at is None
        or expires_at <= now
        or (owner is not None and leases.owner_is_dead(owner))
    )


class ClaimResult(Struct, frozen=True):
    claim: Claim | None = None
    rejected: list[Rejected] = field(default_factory=list)
    at_limit: bool = False  # the global limit of running runs is reached: try again later


def claimable(now: datetime) -> Any:
    """The SQL condition of a claimable run (kept in step with the ix_runs_claimable index)."""
    return and_(
        runs.c.status.in_(CLAIMABLE),
        or_(runs.c.lease_expires_at.is_(None), runs.c.lease_expires_at <= now),
    )


class Queue:
    """Claims and releases runs for workers. Only leases change here; the loop is Journal's."""

    def __init__(self, engine: Engine, policy: retrying.StorePolicy | None = None) -> None:
        self.engine = engine
        self.policy = policy or retrying.StorePolicy(max_attempts=3, max_seconds=5.0)
        # Mixed fleets (docs/versions.md): a worker sets its version key and claims only the
        # runs it continues without consent: that key, or none recorded. None: every run
        # (`worker --accept-changes all`). The one filter, in SQL, on orphans and queued runs.
        self.version_key: str | None = None

    def _mine(self, query: Any) -> Any:
        if self.version_key is None:
            return query
        from durable_agent.store.versions import claim_filter

        return query.where(claim_filter(self.version_key))

    def claim(
        self,
        owner: str,
        lease_seconds: float,
        *,
        max_running: int | None = None,
        exclude: Collection[str] = (),
        accept: Callable[[str], bool] = lambda _workspace: True,
        batch: str | None = None,
    ) -> ClaimResult:
        """Take the lease of the oldest orphan (running, its owner gone or its lease
        expired), else of the oldest pending run, that `accept`s its workspace.

        `exclude`: run ids this worker already turned down. `accept` is called inside the
        transaction, with the candidate row locked: keep it cheap (a stat of a path).
        `batch`: only that batch's runs (`batch submit --run`, 0010).
        Database faults come out as StoreError / StoreUnavailable (retried briefly first).
        """
        return retrying.run(
            lambda: self._claim(owner, lease_seconds, max_running, exclude, accept, batch),
            self.policy,
        )

    def _claim(
        self,
        owner: str,
        lease_seconds: float,
        max_running: int | None,
        exclude: Collection[str],
        accept: Callable[[str], bool],
        batch: str | None = None,
    ) -> ClaimResult:
        now = utcnow()
        skipped = set(exclude)
        rejected: list[Rejected] = []
        controls = _Controls(batch)  # 0010: concurrency keys, max_parallel, one batch only
        with self.engine.begin() as conn:
            # Parents whose children all ended become claimable (`pending`), whatever
            # crashed between a child's end and its parent's wake (store/waiting.py).
            waiting.sweep(conn, now)
            live = self._live_leases(conn, now) if max_running is not None else 0
            orphans = self._orphans(conn, now, self._mine, batch)
            # A dead owner's lease is counted live until it expires, yet taking it over adds
            # no running run: only a claim that adds one waits for a free slot.
            full = max_running is not None and live - sum(o.dead for o in orphans) >= max_running
            if full and not any(o.dead for o in orphans):
                return ClaimResult(at_limit=True)
            # Orphans first, oldest first: each was running for someone who waits on it, and a
            # queued run may wait a little longer (docs/scale-out.md, "Claim").
            for orphan in orphans:
                if orphan.id in skipped or (full and not orphan.dead):
                    continue
                held = conn.execute(
                    select(*_CANDIDATE_COLUMNS, runs.c.lease_expires_at)
                    .where(
                        runs.c.id == orphan.id,
                        runs.c.status == RunStatus.RUNNING.value,
                        runs.c.lease_epoch == orphan.epoch,
                    )
                    .with_for_update(skip_locked=True)
                ).first()
                # Gone to another claimer, or its owner renewed the lease since the read above.
                if held is None or not _orphaned(held.lease_owner, held.lease_expires_at, now):
                    continue
                if not accept(held.workspace):
                    skipped.add(held.id)
                    rejected.append(Rejected(held.id, held.workspace))
                    continue
                if controls.full(conn, held, now):  # its key or batch has no free slot
                    skipped.add(held.id)
                    continue
                return ClaimResult(
                    claim=self._take(conn, held, owner, lease_seconds, now), rejected=rejected
                )
            if full:
                return ClaimResult(rejected=rejected, at_limit=True)
            for _ in range(MAX_CANDIDATES):
                query = (
                    select(*_CANDIDATE_COLUMNS)
                    .where(claimable(now), runs.c.status == RunStatus.PENDING.value)
                    # 0010 queue controls: higher priority first, FIFO within a priority.
                    .order_by(runs.c.priority.desc(), runs.c.created_at, runs.c.id)
                    .limit(1)
                    .with_for_update(skip_locked=True)
                )
                query = self._mine(query)  # (versions)
                if skipped:
                    query = query.where(runs.c.id.not_in(skipped))
                query = controls.not_blocked(query)  # 0010: keys and batches found full
                row = conn.execute(query).first()
                if row is None:
                    break
                if not accept(row.workspace):
                    skipped.add(row.id)
                    rejected.append(Rejected(row.id, row.workspace))
                    continue
                if controls.full(conn, row, now):  # 0010: no slot for its key or batch
                    skipped.add(row.id)
                    continue
                return ClaimResult(
                    claim=self._take(conn, row, owner, lease_seconds, now), rejected=rejected
                )
        return ClaimResult(rejected=rejected)

    @staticmethod
    def _orphans(
        conn: Connection,
        now: datetime,
        mine: Callable[[Any], Any] = lambda q: q,
        batch: str | None = None,
    ) -> list[_Orphan]:
        """Running runs nobody executes, oldest first: a lease expired or dropped, or held by
        a process of this host that is gone (proved at once, as `resume` does, instead of
        after the lease). Read without locks: holding the rows of live runs would stall their
        checkpoints; each orphan is locked and checked again before it is taken."""
        host = f"{socket.gethostname()}:"
        rows = conn.execute(
            mine(select(runs.c.id, runs.c.lease_owner, runs.c.lease_epoch, runs.c.lease_expires_at))
            .where(
                runs.c.status == RunStatus.RUNNING.value,
                or_(
                    runs.c.lease_expires_at.is_(None),
                    runs.c.lease_expires_at <= now,
                    runs.c.lease_owner.startswith(host, autoescape=True),
                ),
            )
            .where(*([runs.c.batch_id == batch] if batch is not None else []))  # 0010
            .order_by(runs.c.priority.desc(), runs.c.created_at, runs.c.id)
        ).all()
        found = []
        for row in rows:
            expired = row.lease_expires_at is None or row.lease_expires_at <= now
            dead = (
                not expired
                and row.lease_owner is not None
                and leases.owner_is_dead(row.lease_owner)
            )
            if expired or dead:
                found.append(_Orphan(row.id, row.lease_epoch, dead))
        return found

    @staticmethod
    def _take(conn: Connection, row: Any, owner: str, lease_seconds: float, now: datetime) -> Claim:
        """Take the locked candidate's lease with a new epoch."""
        epoch = leases.take(
            conn,
            row.id,
            previous_epoch=row.lease_epoch,
            owner=owner,
            lease_seconds=lease_seconds,
            now=now,
            clear_cancel=False,
        )
        return Claim(
            run_id=row.id,
            owner=owner,
            epoch=epoch,
            workspace=row.workspace,
            settings=dict(row.settings or {}),
            takeover=row.status == RunStatus.RUNNING,
            previous_owner=row.lease_owner,
            batch_id=row.batch_id,
        )

    def _live_leases(self, conn: Connection, now: datetime) -> int:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": CLAIM_LOCK_KEY})
        return int(
            conn.execute(
                select(func.count())
                .select_from(runs)
                .where(
                    runs.c.status == RunStatus.RUNNING.value,
                    runs.c.lease_owner.is_not(None),
                    runs.c.lease_expires_at > now,
                )
            ).scalar_one()
        )

    def release(self, run_id: str, owner: str, epoch: int, *, note: str | None = None) -> bool:
        """Give a run back to the queue (`pending`, no lease) without ending it.

        For a worker that stops between two steps (SIGTERM) or cannot execute the run here.
        Fenced like every Journal write: False when the lease was no longer ours.
        `note` goes to `runs.error` so `show` says why the run is waiting.
        """
        return retrying.run(lambda: self._release(run_id, owner, epoch, note), self.policy)

    def _release(self, run_id: str, owner: str, epoch: int, note: str | None) -> bool:
        with self.engine.begin() as conn:
            res = conn.execute(
                update(runs)
                .where(
                    runs.c.id == run_id,
                    runs.c.lease_owner == owner,
                    runs.c.lease_epoch == epoch,
                    runs.c.status == RunStatus.RUNNING.value,
                )
                .values(
                    status=RunStatus.PENDING.value,
                    lease_owner=None,
                    lease_expires_at=None,
                    error=storable(note),
                    updated_at=utcnow(),
                )
            )
            return res.rowcount == 1


# -- 0010: queue controls (concurrency keys, batches' max_parallel) ------------------------
class _Controls:
    """The limits one claim checks, and the keys and batches it found full (skipped for the
    rest of the claim: the candidate query leaves their runs out)."""

    def __init__(self, batch: str | None = None) -> None:
        self.batch = batch  # claim only this batch's runs
        self.full_keys: set[str] = set()
        self.full_batches: set[str] = set()

    def not_blocked(self, query: Any) -> Any:
        if self.batch is not None:
            query = query.where(runs.c.batch_id == self.batch)
        if self.full_keys:
            query = query.where(
                or_(runs.c.queue_key.is_(None), runs.c.queue_key.not_in(self.full_keys))
            )
        if self.full_batches:
            query = query.where(
                or_(runs.c.batch_id.is_(None), runs.c.batch_id.not_in(self.full_batches))
            )
        return query

    def full(self, conn: Connection, row: Any, now: datetime) -> bool:
        """Would taking `row` (locked) put its key or its batch over the limit?"""
        if row.queue_key is not None:
            if not _slot_lock(conn, QUEUE_KEY_LOCK, row.queue_key):
                return True  # another claim is counting this key right now: skip it
            limit = key_limit(conn, row.queue_key)
            if _live(conn, now, runs.c.queue_key == row.queue_key, row.id) >= limit:
                self.full_keys.add(row.queue_key)
                return True
        if row.batch_id is not None:
            cap = batch_limit(conn, row.batch_id)
            if cap is not None:
                if not _slot_lock(conn, BATCH_LOCK, row.batch_id):
                    return True
                if _live(conn, now, runs.c.batch_id == row.batch_id, row.id) >= cap:
                    self.full_batches.add(row.batch_id)
                    return True
        return False


def _slot_lock(conn: Connection, namespace: int, name: str) -> bool:
    """PostgreSQL: the transaction's advisory lock on (namespace, name), if free. Tried, not
    waited for, so two claims locking two keys in opposite orders cannot deadlock. SQLite:
    the write transaction already serializes every claim."""
    if conn.dialect.name != "postgresql":
        return True
    return bool(
        conn.execute(
            text("SELECT pg_try_advisory_xact_lock(:ns, hashtext(:name))"),
            {"ns": namespace, "name": name},
        ).scalar_one()
    )


def _live(conn: Connection, now: datetime, where: Any, other_than: str) -> int:
    """Runs matching `where` under a live lease, the candidate itself left out (an orphan
    whose dead owner's lease has not expired yet is still counted: taking it adds none)."""
    return int(
        conn.execute(
            select(func.count())
            .select_from(runs)
            .where(
                where,
                runs.c.id != other_than,
                runs.c.status == RunStatus.RUNNING.value,
                runs.c.lease_owner.is_not(None),
                runs.c.lease_expires_at > now,
            )
        ).scalar_one()
    )


def key_limit(conn: Connection, key: str) -> int:
    """A key's limit: its queue_keys row, else 1 (one run at a time per key)."""
    from durable_agent.store.schema import queue_keys

    found = conn.execute(
        select(queue_keys.c.max_running).where(queue_keys.c.key == key)
    ).scalar_one_or_none()
    return 1 if found is None else int(found)


def batch_limit(conn: Connection, batch_id: str) -> int | None:
    from durable_agent.store.schema import batches

    found = conn.execute(
        select(batches.c.max_parallel).where(batches.c.id == batch_id)
    ).scalar_one_or_none()
    return None if found is None else int(found)
