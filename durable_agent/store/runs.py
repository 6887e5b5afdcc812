"""Run-level reads and writes that need no lease: create, list, show, cancel, approve,
and taking a run's lease. The checkpoints written under a lease are in journal.py.

Every method returns typed records (store/records.py) and runs whole under the store's
retry policy: transient database faults are retried, and what persists comes out as the
package's `StoreUnavailable` / `StoreError`, never as a driver exception."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, ParamSpec, Protocol, TypeVar

from sqlalchemy import Connection, Engine, insert, inspect, or_, select, text, tuple_, update
from sqlalchemy.exc import SQLAlchemyError

from durable_agent.errors import RunBusy, RunNotFound, UsageError
from durable_agent.messages import Message
from durable_agent.status import RESUMABLE, RunStatus
from durable_agent.store import leases, retrying, waiting
from durable_agent.store.records import (
    ApprovalRecord,
    Decision,
    FileChange,
    MessageRecord,
    RunRecord,
    StepRecord,
)
from durable_agent.store.revision import MAX_RUN_ID_PREFIX
from durable_agent.store.rows import message_values, utcnow
from durable_agent.store.schema import approvals, batch_tasks, messages, runs, steps
from durable_agent.store.storable import is_utf8, storable, storable_text

P = ParamSpec("P")
T = TypeVar("T")

# Workspace snapshots (where the store has them): one row per file a step changed.
CHANGES_VIEW = "step_changes"


def _locked_run(conn: Connection, run_id: str) -> Any:
    """The run's status and lease, locked until the transaction ends; RunNotFound if none."""
    row = conn.execute(
        select(
            runs.c.status,
            runs.c.stop_reason,
            runs.c.answer,
            runs.c.error,
            runs.c.lease_owner,
            runs.c.lease_expires_at,
            runs.c.lease_epoch,
        )
        .where(runs.c.id == run_id)
        .with_for_update()
    ).first()
    if row is None:
        raise RunNotFound(run_id)
    return row


def _retried(method: Callable[P, T]) -> Callable[P, T]:
    """Run the whole method again on a transient fault; each is one transaction or one read."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        store = args[0]
        assert isinstance(store, Store)
        return retrying.run(lambda: method(*args, **kwargs), store.policy)

    return wrapper


class Store:
    """Run-level reads and the few writes that need no lease."""

    def __init__(self, engine: Engine, policy: retrying.StorePolicy | None = None) -> None:
        self.engine = engine
        self.policy = policy or retrying.StorePolicy()
        self._changes_view: bool | None = None  # the store has `step_changes` (asked once)

    def _read(self) -> Connection:
        return self.engine.connect().execution_options(readonly=True)

    # -- runs ---------------------------------------------------------------------------
    @_retried
    def create_run(
        self,
        run_id: str,
        *,
        task: str,
        workspace: str,
        model: str,
        settings: dict[str, Any],
        first_messages: Sequence[Message],
        lease: tuple[str, float] | None = None,
        tree_start: str | None = None,
        version_key: str | None = None,
        queue: Mapping[str, Any] | None = None,
        batch_task: Mapping[str, Any] | None = None,
    ) -> None:
        """A new run: `pending` for the workers' queue, or with `lease` (owner, seconds)
        already `running` under that owner at epoch 1, so no worker can claim a run that a
        foreground `start` is about to execute. `queue`: its batch_id, priority, queue_key
        (0010), set in the same transaction so no claim sees the run without them; and so
        is its task of the batch (`batch_task`), so no batch has a run it does not list."""
        with self.engine.begin() as conn:
            for statement, params in new_run_statements(
                run_id,
                task=task,
                workspace=workspace,
                model=model,
                settings=settings,
                first_messages=first_messages,
                lease=lease,
                tree_start=tree_start,
                version_key=version_key,
                queue=queue,
                batch_task=batch_task,
            ):
                conn.execute(statement, params)

    @_retried
    def run_exists(self, run_id: str) -> bool:
        with self._read() as conn:
            return conn.execute(select(runs.c.id).where(runs.c.id == run_id)).first() is not None

    @_retried
    def get_run(self, run_id: str) -> RunRecord:
        if "\x00" in run_id:  # no id holds one, and PostgreSQL refuses it in a parameter
            raise RunNotFound(run_id)
        with self._read() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).first()
        if row is None:
            raise RunNotFound(run_id)
        return RunRecord.from_row(row)

    @_retried
    def find_run_id(self, prefix: str) -> str:
        """A full id, or a unique prefix of one (ids are long; people type the start).

        An id that no row can hold is not looked up: an empty one (an unset shell variable
        would otherwise be the prefix of every run) and one that is not UTF-8 (argv bytes);
        one longer than any prefix a person types is matched whole (SQLite refuses a long
        LIKE pattern)."""
        if (
            not isinstance(prefix, str) or not prefix or not is_utf8(prefix) or "\x00" in prefix
        ):  # (None from the API; PostgreSQL refuses NUL in a parameter: no id holds one)
            raise RunNotFound(prefix if isinstance(prefix, str) else repr(prefix))
        with self._read() as conn:
            if conn.execute(select(runs.c.id).where(runs.c.id == prefix)).first():
                return prefix
            if len(prefix) > MAX_RUN_ID_PREFIX:
                raise RunNotFound(prefix)
            ids = (
                conn.execute(
                    select(runs.c.id).where(runs.c.id.startswith(prefix, autoescape=True)).limit(3)
                )
                .scalars()
                .all()
            )
        if len(ids) == 1:
            return str(ids[0])
        if ids:
            raise UsageError(
                f"run id prefix {prefix!r} is ambiguous: {', '.join(ids)}"
                f"{', …' if len(ids) > 2 else ''}; type more of it"
            )
        raise RunNotFound(prefix)

    @_retried
    def last_run_id(self, workspace: str, *, within: Sequence[str] = ()) -> str:
        """`--last`: the newest run whose workspace is `workspace`, else the newest of the
        nearest of `within` (the folders that hold it: a run started in a subfolder with
        `-w ..`) that has one (UsageError if none)."""
        with self._read() as conn:
            for folder in (workspace, *within):  # the nearest first
                found = conn.execute(
                    select(runs.c.id)
                    .where(runs.c.workspace == folder)
                    .order_by(runs.c.created_at.desc(), runs.c.id.desc())
                    .limit(1)
                ).scalar()
                if found is not None:
                    return str(found)
        raise UsageError(f"no run in this store was started in {workspace} (--last)")

    @_retried
    def list_runs(self, *, status: str | None = None, limit: int = 50) -> list[RunRecord]:
        query = select(runs).order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
        if status:
            query = query.where(runs.c.status == status)
        with self._read() as conn:
            return [RunRecord.from_row(r) for r in conn.execute(query)]

    @_retried
    def children(self, run_id: str) -> list[RunRecord]:
        """The runs `run_id` delegated to (docs/delegation.md), in the order they were made."""
        query = (
            select(runs).where(runs.c.parent_id == run_id).order_by(runs.c.parent_step, runs.c.id)
        )
        with self._read() as conn:
            return [RunRecord.from_row(r) for r in conn.execute(query)]

    def cancel_children(self, run_id: str) -> list[str]:
        """Cancel the run's descendants that have not ended, depth first (one executing stops
        at its next step; one that is not is marked cancelled at once): `cancel` of a parent,
        in the CLI and the web view (docs/delegation.md)."""
        going = {RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.BLOCKED}
        done = []
        for child in self.children(run_id):
            if RunStatus(child.status) in going:
                self.cancel(child.id)
                done.append(child.id)
            done.extend(self.cancel_children(child.id))
        return done

    @_retried
    def depth(self, run_id: str) -> int:
        """How many parents `run_id` has (0: a run nobody delegated), from the view run_tree."""
        with self._read() as conn:
            found = conn.execute(
                text("SELECT depth FROM run_tree WHERE run_id = :id"), {"id": run_id}
            ).first()
        return int(found[0]) if found else 0

    def show(self, run_id: str) -> tuple[RunRecord, list[StepRecord], list[ApprovalRecord]]:
        """The run with this id (or unique prefix of one), its steps and its approvals
        (store/reads.py's `RunReads`, as `show` prints them)."""
        found = self.find_run_id(run_id)
        return self.get_run(found), self.steps(found), self.approvals(found)

    @_retried
    def steps(self, run_id: str) -> list[StepRecord]:
        with self._read() as conn:
            return [
                StepRecord.from_row(r)
                for r in conn.execute(
                    select(steps).where(steps.c.run_id == run_id).order_by(steps.c.seq)
                )
            ]

    @_retried
    def messages(self, run_id: str) -> list[MessageRecord]:
        with self._read() as conn:
            return [
                MessageRecord.from_row(r)
                for r in conn.execute(
                    select(messages).where(messages.c.run_id == run_id).order_by(messages.c.seq)
                )
            ]

    @_retried
    def approvals(self, run_id: str) -> list[ApprovalRecord]:
        with self._read() as conn:
            return [
                ApprovalRecord.from_row(r)
                for r in conn.execute(
                    select(approvals).where(approvals.c.run_id == run_id).order_by(approvals.c.id)
                )
            ]

    @_retried
    def cancel(self, run_id: str) -> str:
        """Flag a live run ("requested": it stops at its next boundary); end any other at once."""
        now = utcnow()
        with self.engine.begin() as conn:
            row = _locked_run(conn, run_id)
            if row.status == RunStatus.COMPLETED:
                raise UsageError(f"run {run_id} is already completed")
            if leases.is_executing(row, now):
                conn.execute(
                    update(runs)
                    .where(runs.c.id == run_id)
                    .values(cancel_requested=True, updated_at=now)
                )
                return "requested"
            conn.execute(
                update(runs)
                .where(runs.c.id == run_id)
                .values(
                    status=RunStatus.CANCELLED.value,
                    stop_reason="cancelled",
                    finished_at=now,
                    updated_at=now,
                    cancel_requested=False,
                    lease_owner=None,
                    lease_expires_at=None,
                )
            )
            # A child cancelled before a worker ran it: its waiting parent goes on (waiting.py).
            for statement, _ in waiting.wake_parent(run_id, now):
                conn.execute(statement)
            return "cancelled"

    @_retried
    def requeue(
        self, run_id: str, *, settings: dict[str, Any] | None = None, if_status: str | None = None
    ) -> None:
        """Put a stopped run back in the workers' queue (`pending`, no lease), with new
        recorded `settings` if given (written only once the run is known not to be live).
        `if_status`: only if the run is still what the caller checked it was (UsageError
        otherwise): a run completed or cancelled meanwhile by another process is not
        queued again, its cancel undone. A run found `pending` is queued already (by
        another process, or by this call's own commit whose answer was lost and which is
        tried again): that is what was asked, not a refusal."""
        now = utcnow()
        with self.engine.begin() as conn:
            row = _locked_run(conn, run_id)
            if leases.is_live(row.lease_owner, row.lease_expires_at, now):
                raise RunBusy(run_id, row.lease_owner)
            if if_status is not None and row.status not in (if_status, RunStatus.PENDING):
                raise UsageError(
                    f"run {run_id} is {row.status} now ({if_status} when it was checked): "
                    "it was not queued"
                )
            extra = {} if settings is None else {"settings": storable(settings)}
            conn.execute(
                update(runs)
                .where(runs.c.id == run_id)
                .values(
                    status=RunStatus.PENDING.value,
                    stop_reason=None,
                    error=None,
                    finished_at=None,
                    cancel_requested=False,
                    lease_owner=None,
                    lease_expires_at=None,
                    updated_at=now,
                    **extra,
                )
            )

    @_retried
    def pending_approval(self, run_id: str) -> ApprovalRecord | None:
        with self._read() as conn:
            row = conn.execute(
                select(approvals)
                .where(approvals.c.run_id == run_id, approvals.c.decision.is_(None))
                .order_by(approvals.c.id.desc())
            ).first()
        return None if row is None else ApprovalRecord.from_row(row)

    @_retried
    def decide_once(
        self,
        run_id: str,
        approval_id: int,
        *,
        approved: bool,
        by: str,
        restore: bool = False,
        while_blocked: bool = False,
    ) -> bool:
        """Decide the run's approval if nobody has (False: it was answered already): a
        one-time link used twice at once decides it once, and a person's answer (the
        command line, the view's form, the API) never writes over one made meanwhile.
        `while_blocked`: only while the run is `blocked` (False once it moved on)."""
        blocked = (
            select(runs.c.id)
            .where(runs.c.id == run_id, runs.c.status == RunStatus.BLOCKED.value)
            .exists()
        )
        with self.engine.begin() as conn:
            done = conn.execute(
                update(approvals)
                .where(
                    approvals.c.id == approval_id,
                    approvals.c.run_id == run_id,
                    approvals.c.decision.is_(None),
                    *([blocked] if while_blocked else []),
                )
                .values(
                    decision=(Decision.APPROVED if approved else Decision.DENIED).value,
                    decided_by=storable(by),
                    decided_at=utcnow(),
                    restore_workspace=restore or None,
                )
            )
            return bool(done.rowcount == 1)

    def answered_meanwhile(self, run_id: str, approval_id: int) -> str:
        """What to say when `decide_once` lost: who answered the question instead, or
        that the run no longer waits for it (`while_blocked`)."""
        from durable_agent.visible import approval_subject

        found = [a for a in self.approvals(run_id) if a.id == approval_id]
        if not found or found[0].decision is None:
            status = self.get_run(run_id).status
            if status != RunStatus.BLOCKED:
                return moved_on(run_id, status)
            return f"run {run_id}: its question was answered meanwhile"
        a = found[0]
        return (
            f"run {run_id}: {approval_subject(a.tool_name, a.command)} (call {a.call_id}) is "
            f"already {a.decision} by {a.decided_by or 'someone'}; a question is answered once"
        )

    @_retried
    def decide_approval(
        self, approval_id: int, *, approved: bool, by: str, restore: bool = False
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(approvals)
                .where(approvals.c.id == approval_id)
                .values(
                    decision=(Decision.APPROVED if approved else Decision.DENIED).value,
                    decided_by=storable(by),
                    decided_at=utcnow(),
                    restore_workspace=restore or None,
                )
            )

    @_retried
    def update_settings(self, run_id: str, settings: dict[str, Any]) -> None:
        settings = storable(settings)
        with self.engine.begin() as conn:
            conn.execute(
                update(runs)
                .where(runs.c.id == run_id)
                .values(settings=settings, updated_at=utcnow())
            )

    @_retried
    def record_tool_sources(self, run_id: str, sources: dict[str, Any]) -> dict[str, Any]:
        """Record the run's tool sources once (the first session that lists them wins) and
        return what is recorded: a resume offers these, not what the servers offer now."""
        with self.engine.begin() as conn:
            conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.tool_sources.is_(None))
                .values(tool_sources=storable(sources))
            )
            recorded = conn.execute(select(runs.c.tool_sources).where(runs.c.id == run_id)).scalar()
        return dict(recorded or {})

    @_retried
    def tool_sources(self, run_id: str) -> dict[str, Any] | None:
        """The tool sources recorded with the run (None: none recorded yet)."""
        with self._read() as conn:
            value = conn.execute(select(runs.c.tool_sources).where(runs.c.id == run_id)).scalar()
        return dict(value) if value is not None else None

    # -- the web view's reads -----------------------------------------------------------------
    @_retried
    def run_page(
        self,
        *,
        status: str | None = None,
        needle: str | None = None,
        after: tuple[datetime, str] | None = None,
        limit: int,
    ) -> list[RunRecord]:
        """Up to `limit` runs, newest first, after the (created_at, id) `after`: a keyset page
        on the order that the `ix_runs_created_id` and `ix_runs_status_created_id` indexes
        serve, so a far page costs what the first costs (OFFSET would read every row before
        it). `needle` matches the id or the task case-insensitively (a scan, stopped by
        LIMIT as soon as the page is full)."""
        query = select(runs).order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
        if status:
            query = query.where(runs.c.status == status)
        if needle:  # as the store keeps text: NUL written `\x00` (storable.py)
            pattern = _like(storable_text(needle).lower())
            query = query.where(
                or_(runs.c.id.ilike(pattern, escape="\\"), runs.c.task.ilike(pattern, escape="\\"))
            )
        if after is not None:
            # A row-value comparison: both backends walk the (created_at, id) index from there.
            query = query.where(tuple_(runs.c.created_at, runs.c.id) < tuple_(*after))
        with self._read() as conn:
            return [RunRecord.from_row(r) for r in conn.execute(query)]

    @_retried
    def steps_from(self, run_id: str, first_seq: int, limit: int | None = None) -> list[StepRecord]:
        """The run's steps with seq >= first_seq, by seq (at most `limit` of them)."""
        query = (
            select(steps)
            .where(steps.c.run_id == run_id, steps.c.seq >= first_seq)
            .order_by(steps.c.seq)
            .limit(limit)
        )
        with self._read() as conn:
            return [StepRecord.from_row(r) for r in conn.execute(query)]

    def has_step_changes(self) -> bool:
        """The store has the `step_changes` view (stores with workspace snapshots)."""
        if self._changes_view is None:
            try:
                self._changes_view = CHANGES_VIEW in inspect(self.engine).get_view_names()
            except SQLAlchemyError:
                self._changes_view = False
        return self._changes_view

    def step_changes(self, run_id: str) -> dict[int, list[FileChange]]:
        """The files each step of the run changed, by seq (paths in order), read from the
        `step_changes` view; empty where the store has none, or one of another shape."""
        if not self.has_step_changes():
            return {}
        found: dict[int, list[FileChange]] = {}
        try:
            with self.engine.connect() as conn:
                rows: Any = conn.execute(
                    text(
                        f"SELECT seq, path, change, bytes FROM {CHANGES_VIEW} "
                        "WHERE run_id = :run_id ORDER BY seq, path"
                    ),
                    {"run_id": run_id},
                )
                for row in rows:
                    found.setdefault(int(row.seq), []).append(
                        FileChange(
                            str(row.path),
                            str(row.change),
                            None if row.bytes is None else int(row.bytes),
                        )
                    )
        except SQLAlchemyError:  # a view of another shape: no files rather than a failed page
            return {}
        return found

    # -- leases -------------------------------------------------------------------------
    def acquire_lease(self, run_id: str, owner: str, lease_seconds: float) -> int:
        """Take the run's lease and return the new epoch; RunBusy if a live owner holds it."""
        return self.take_over(run_id, owner, lease_seconds)[0]

    @_retried
    def take_over(
        self,
        run_id: str,
        owner: str,
        lease_seconds: float,
        *,
        statuses: frozenset[str] | None = None,
        keep_status: bool = False,
    ) -> tuple[int, tuple[str, str | None, str | None, str | None]]:
        """`acquire_lease`, also returning how the run stood just before, read under the same
        lock (status, stop_reason, answer, error): what a `compact` puts back when it is done,
        and what `continue` decides its turn by. `keep_status`: only the lease is taken, the
        run keeps its status (`compact`, which puts it back as it found it: killed half way,
        the run is still as it was, not `running`)."""
        now = utcnow()
        with self.engine.begin() as conn:
            row = _locked_run(conn, run_id)
            stood = (row.status, row.stop_reason, row.answer, row.error)
            if row.lease_owner == owner:  # a retry after a COMMIT whose answer was lost: it landed
                return int(row.lease_epoch), stood
            if leases.is_live(row.lease_owner, row.lease_expires_at, now):
                raise RunBusy(run_id, row.lease_owner)
            # Read again under the lock: a run that completed since the caller looked (its
            # owner finished while a `resume` started) is never taken, reopened and replayed.
            if statuses is not None:  # `continue`: the statuses it takes a run from
                if row.status not in statuses:
                    raise UsageError(f"run {run_id} is {row.status} now; it cannot be continued")
            elif row.status not in RESUMABLE:
                raise UsageError(f"run {run_id} is {row.status}; nothing to resume")
            return leases.take(
                conn,
                run_id,
                previous_epoch=row.lease_epoch,
                owner=owner,
                lease_seconds=lease_seconds,
                now=now,
                clear_cancel=True,
                # `continue` of an ended run: it stays ended until its message is recorded
                # (turns.open_turn sets `running` in that commit), so a crash before that
                # leaves it as it was, and the same `continue` again knows a new turn from
                # an unfinished one by it.
                keep_status=keep_status or (statuses is not None and row.status in ENDED),
            ), stood

    # -- SQL written for people --------------------------------------------------------------
    @_retried
    def query(
        self, statement: str, params: dict[str, Any] | None = None
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """One read-only statement as a user would type it (the demo's proof, docs/queries.md):
        its column names and rows. Not for the package's own reads: those are typed methods."""

        with self._read() as conn:
            result = conn.execute(text(statement), params or {})
            return list(result.keys()), [tuple(row) for row in result]


# The ends a `continue` takes a run from (loop/turns.py).
ENDED = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.BUDGET_EXCEEDED, RunStatus.CANCELLED}
)


def _like(needle: str) -> str:
    escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class StoreSettings(Protocol):
    """What opening a store needs: `Settings`, or `store_settings.StoreOptions` for the
    commands that only read or answer the store."""

    @property
    def db(self) -> str | None: ...
    @property
    def durability(self) -> str: ...
    @property
    def store_retry_attempts(self) -> int: ...
    @property
    def store_retry_seconds(self) -> float: ...
    @property
    def lease_seconds(self) -> float: ...


def store_policy(settings: StoreSettings) -> retrying.StorePolicy:
    return retrying.StorePolicy(
        max_attempts=settings.store_retry_attempts, max_seconds=settings.store_retry_seconds
    )


def open_store(settings: StoreSettings) -> Store:
    """The store at `settings.db`, its schema brought to head (engine.open_store_engine)."""
    from durable_agent.store.engine import open_store_engine

    assert settings.db is not None
    policy = store_policy(settings)
    return Store(
        open_store_engine(
            settings.db,
            durability=settings.durability,
            policy=policy,
            lease_seconds=settings.lease_seconds,
        ),
        policy,
    )


def new_run_statements(
    run_id: str,
    *,
    task: str,
    workspace: str,
    model: str,
    settings: dict[str, Any],
    first_messages: Sequence[Message],
    lease: tuple[str, float] | None = None,
    tree_start: str | None = None,
    parent: tuple[str, int] | None = None,
    version_key: str | None = None,
    queue: Mapping[str, Any] | None = None,
    batch_task: Mapping[str, Any] | None = None,
) -> list[tuple[Any, Any]]:
    """The statements that create a run (`create_run`), or a child run in its parent's
    `delegate` intent (`parent`: the parent's id and step seq; loop/delegate_step.py).
    `batch_task`: the batch_tasks row (task_id, seq, spec) of the run of `queue`'s batch."""
    task, workspace, model, settings = storable((task, workspace, model, settings))
    now = utcnow()
    leased: dict[str, Any] = {"status": RunStatus.PENDING.value, "lease_epoch": 0}
    if lease is not None:
        leased = {
            "status": RunStatus.RUNNING.value,
            "lease_epoch": 1,
            "lease_owner": lease[0],
            "lease_expires_at": now + timedelta(seconds=lease[1]),
        }
    if parent is not None:
        leased.update(parent_id=parent[0], parent_step=parent[1])
    row = dict(
        id=run_id,
        task=task,
        workspace=workspace,
        model=model,
        created_at=now,
        updated_at=now,
        step_count=0,
        tool_call_count=0,
        prompt_tokens=0,
        completion_tokens=0,
        cancel_requested=False,
        settings=settings,
        message_count=len(first_messages),
        active_ms=0,
        resume_count=0,
        tree_start=tree_start,
        version_key=version_key,
        priority=0,  # (a child's row is made in its parent's commit: no Core default there)
        **leased,
    )
    row.update({k: v for k, v in (queue or {}).items() if v is not None})
    made = [
        (insert(runs), row),
        (
            insert(messages),
            [
                storable(message_values(run_id, i, m, None, now))
                for i, m in enumerate(first_messages)
            ],
        ),
    ]
    if batch_task is not None:
        task_row = {**batch_task, "spec": storable(batch_task.get("spec"))}
        task_row.update(batch_id=row["batch_id"], run_id=run_id, created_at=now)
        made.append((insert(batch_tasks), task_row))
    return made


def moved_on(run_id: str, status: str) -> str:
    """Why an answer to a question of a run that is no longer `blocked` is refused."""
    return (
        f"run {run_id} is {status}: it no longer waits for this answer "
        "(`durable-agent approve` still records one for a later resume)"
    )
