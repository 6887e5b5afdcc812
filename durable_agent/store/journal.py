"""Checkpoints: intent and outcome rows, messages, approvals, written under a lease.

`Journal` writes for one run under one lease, and every write transaction first re-checks
that lease (`lease_owner`, `lease_epoch`) in the same transaction, so a process that lost
its lease commits nothing more. Run-level reads and writes without a lease are in runs.py.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Row, bindparam, func, insert, select, update

from durable_agent.errors import LeaseLost, RunNotFound
from durable_agent.messages import Message
from durable_agent.store.rows import message_from_row, message_values, utcnow
from durable_agent.store.schema import approvals, messages, runs, steps
from durable_agent.store.storable import storable

# Hot-path statements, built once: constructing a Core statement per checkpoint costs more
# CPU than the SQL it sends. Where-clause parameters are prefixed b_ so they never clash
# with the column names that the SET clause takes from the parameters.
_COUNTERS = ("step_count", "tool_call_count", "prompt_tokens", "completion_tokens", "message_count", "active_ms")
_FENCE_WHERE = (runs.c.id == bindparam("b_id"), runs.c.lease_owner == bindparam("b_owner"),
                runs.c.lease_epoch == bindparam("b_epoch"))
_FENCE = (update(runs).where(*_FENCE_WHERE)
          .values(updated_at=bindparam("b_now"), lease_expires_at=bindparam("b_expires"))
          .returning(runs.c.cancel_requested))
_FENCE_COUNTERS = (update(runs).where(*_FENCE_WHERE)
                   .values(updated_at=bindparam("b_now"), lease_expires_at=bindparam("b_expires"),
                           **{c: bindparam(f"b_{c}") for c in _COUNTERS})
                   .returning(runs.c.cancel_requested))
_UPDATE_STEP = update(steps).where(steps.c.run_id == bindparam("b_run"), steps.c.seq == bindparam("b_seq"))
_INSERT_STEP = insert(steps)
_INSERT_MESSAGES = insert(messages)
# A decided approval is acted on once: marked used in the transaction that acts on it.
_USE_APPROVAL = update(approvals).where(approvals.c.id == bindparam("b_id"))
# Every step row names the same columns, so the rows of one transaction (a deferred read
# and the next intent) go in one executemany. Not id (generated) nor pgid (set_pgid sets it).
_STEP_COLUMNS = tuple(c.name for c in steps.c if c.name not in ("id", "pgid"))

KEEP_CONNECTION_S = 5.0  # how long the writer keeps its connection between transactions


def _step_row(**values: Any) -> dict[str, Any]:
    row = dict.fromkeys(_STEP_COLUMNS)
    row.update(storable(values))  # no value may fail the write on either dialect
    return row


@dataclass(frozen=True)
class Counters:
    """Run totals, written as absolute values with every checkpoint (replay rebuilds them)."""

    step_count: int
    tool_call_count: int
    prompt_tokens: int
    completion_tokens: int
    message_count: int
    active_ms: int

    def as_params(self) -> dict[str, int]:
        """The parameters of the fence that writes them."""
        return {
            "b_step_count": self.step_count,
            "b_tool_call_count": self.tool_call_count,
            "b_prompt_tokens": self.prompt_tokens,
            "b_completion_tokens": self.completion_tokens,
            "b_message_count": self.message_count,
            "b_active_ms": self.active_ms,
        }


@dataclass(frozen=True)
class Loaded:
    run: Row[Any]
    messages: list[Message]
    open_steps: list[Row[Any]]
    next_seq: int


class Journal:
    """Writes for one run under one lease. Every transaction is fenced on the epoch.

    The thread that drives the run writes through one connection of its own (`close` gives
    it back); the heartbeat and the cancel watcher take theirs from the pool.
    """

    def __init__(self, engine: Engine, run_id: str, owner: str, epoch: int, lease_seconds: float,
                 *, crash_after_commits: int | None = None) -> None:
        self.engine = engine
        self.run_id = run_id
        self.owner = owner
        self.epoch = epoch
        self.lease = timedelta(seconds=lease_seconds)
        self.crash_after = crash_after_commits
        self._ticks = 0
        self._conn: Connection | None = None
        self._last_used = 0.0  # time.monotonic() at the end of our last transaction
        # Finished read steps and their messages that ride along with the next commit, and
        # the run totals that go with them.
        self._deferred_steps: list[dict[str, Any]] = []
        self._deferred_messages: list[dict[str, Any]] = []
        self._deferred_counters: Counters | None = None
        self.cancel_seen = False  # runs.cancel_requested as of our last checkpoint

    def close(self) -> None:
        """Give the writing connection back to the pool (the session is over)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> Connection:
        # A pool checkout per checkpoint (and its reset on return) costs more CPU than the
        # statements; keep one while the loop is busy. After a longer pause go through the
        # pool again, whose pre-ping (PostgreSQL) replaces a connection the server or a
        # firewall dropped while a slow model call or command ran.
        if self._conn is not None and time.monotonic() - self._last_used > KEEP_CONNECTION_S:
            self.close()
        if self._conn is None:
            self._conn = self.engine.connect()
        return self._conn

    @contextmanager
    def _tx(self, now: datetime, counters: Counters | None = None, *,
            step_rows: Iterable[dict[str, Any]] = (),
            message_rows: Iterable[dict[str, Any]] = ()) -> Iterator[Connection]:
        """A fenced write transaction, with the crash points that tests and the demo use.

        The fence comes first; then the new step and message rows, the deferred ones with
        them (one executemany per table); then whatever the body executes.
        """
        conn = self._connection()
        try:
            with conn.begin():
                self._fence(conn, now, counters or self._deferred_counters)
                all_steps = [*self._deferred_steps, *step_rows]
                if all_steps:
                    conn.execute(_INSERT_STEP, all_steps)
                all_messages = [*self._deferred_messages, *message_rows]
                if all_messages:
                    conn.execute(_INSERT_MESSAGES, all_messages)
                yield conn
                self._crash_point()  # the effect happened, its record is not committed
        except BaseException:
            self.close()  # it may be broken (a dropped server connection): the next write starts afresh
            raise
        finally:
            self._last_used = time.monotonic()
        self.discard_deferred()  # committed now
        self._crash_point()  # committed, the next effect has not started

    def discard_deferred(self) -> None:
        """Forget writes not yet committed (the loop stops without them: resume re-runs reads)."""
        self._deferred_steps.clear()
        self._deferred_messages.clear()
        self._deferred_counters = None

    def _crash_point(self) -> None:
        # Set by DURABLE_AGENT_CRASH_AFTER (see wiring.py): a real SIGKILL of this process at
        # the Nth checkpoint boundary, so crash tests can hit every window deterministically.
        if self.crash_after is not None:
            self._ticks += 1
            if self._ticks >= self.crash_after:
                os.kill(os.getpid(), signal.SIGKILL)

    def _fence(self, conn: Connection, now: datetime, counters: Counters | None = None) -> None:
        # The first statement of every write: extends the lease and proves we still own it.
        # On SQLite the transaction already holds the write lock (BEGIN IMMEDIATE); on
        # PostgreSQL the UPDATE locks the run row until commit. Either way no other owner
        # can slip in between this check and our commit.
        params: dict[str, Any] = {"b_id": self.run_id, "b_owner": self.owner, "b_epoch": self.epoch,
                                  "b_now": now, "b_expires": now + self.lease}
        statement = _FENCE
        if counters is not None:  # run totals, written with the rows that change them
            statement = _FENCE_COUNTERS
            params.update(counters.as_params())
        row = conn.execute(statement, params).first()
        if row is None:
            raise LeaseLost(self.run_id)
        self.cancel_seen = bool(row[0])

    # -- reads for replay -------------------------------------------------------------------
    def load(self) -> Loaded:
        """The run row, its messages and the steps that matter for resume (not completed)."""
        with self.engine.connect().execution_options(readonly=True) as conn:
            run = conn.execute(select(runs).where(runs.c.id == self.run_id)).first()
            if run is None:
                raise RunNotFound(self.run_id)
            msgs = [message_from_row(r) for r in conn.execute(
                select(messages.c.role, messages.c.content, messages.c.tool_calls, messages.c.tool_call_id)
                .where(messages.c.run_id == self.run_id).order_by(messages.c.seq))]
            open_steps = list(conn.execute(
                select(steps).where(steps.c.run_id == self.run_id,
                                    steps.c.state != "completed")).all())
            max_seq = conn.execute(select(func.max(steps.c.seq)).where(steps.c.run_id == self.run_id)).scalar()
        return Loaded(run=run, messages=msgs, open_steps=open_steps,
                      next_seq=0 if max_seq is None else max_seq + 1)

    def verify_result(self, turn: int) -> Row[Any] | None:
        with self.engine.connect().execution_options(readonly=True) as conn:
            return conn.execute(select(steps).where(
                steps.c.run_id == self.run_id, steps.c.kind == "verify", steps.c.turn == turn,
                steps.c.state == "completed")).first()

    def cancel_requested(self) -> bool:
        with self.engine.connect().execution_options(readonly=True) as conn:
            return bool(conn.execute(select(runs.c.cancel_requested).where(runs.c.id == self.run_id)).scalar())

    def approval_for(self, call_id: str, kind: str) -> Row[Any] | None:
        """The latest decided, not yet used approval of this call, or a pending one."""
        with self.engine.connect().execution_options(readonly=True) as conn:
            return conn.execute(
                select(approvals).where(approvals.c.run_id == self.run_id, approvals.c.call_id == call_id,
                                        approvals.c.kind == kind, approvals.c.used_at.is_(None))
                .order_by(approvals.c.id.desc())
            ).first()

    # -- writes ----------------------------------------------------------------------------
    def start_step(self, *, seq: int, kind: str, key: str, turn: int, input: Any,
                   call_id: str | None = None, tool_name: str | None = None,
                   effect: str | None = None, attempts: int = 1,
                   use_approval: int | None = None) -> datetime:
        """The intent row, committed before the effect."""
        now = utcnow()
        row = _step_row(run_id=self.run_id, seq=seq, kind=kind, state="started", idempotency_key=key,
                        call_id=call_id, tool_name=tool_name, input=input, attempts=attempts,
                        started_at=now, turn=turn, effect=effect, lease_epoch=self.epoch)
        with self._tx(now, step_rows=[row]) as conn:
            if use_approval is not None:
                conn.execute(_USE_APPROVAL, {"b_id": use_approval, "used_at": now})
        return now

    def restart_step(self, seq: int, *, attempts: int, input: Any | None = None,
                     use_approval: int | None = None) -> datetime:
        """An unfinished or failed step tried again: same row, one more attempt."""
        now = utcnow()
        values: dict[str, Any] = {"state": "started", "attempts": attempts, "started_at": now,
                                  "finished_at": None, "error": None, "lease_epoch": self.epoch}
        if input is not None:
            values["input"] = storable(input)
        with self._tx(now) as conn:
            conn.execute(update(steps).where(steps.c.run_id == self.run_id, steps.c.seq == seq).values(**values))
            if use_approval is not None:
                conn.execute(_USE_APPROVAL, {"b_id": use_approval, "used_at": now})
        return now

    def set_attempts(self, seq: int, attempts: int, error: str | None) -> None:
        error = storable(error)
        with self._tx(utcnow()) as conn:
            conn.execute(update(steps).where(steps.c.run_id == self.run_id, steps.c.seq == seq)
                         .values(attempts=attempts, error=error))

    def set_pgid(self, seq: int, pgid: int) -> None:
        with self._tx(utcnow()) as conn:
            conn.execute(update(steps).where(steps.c.run_id == self.run_id, steps.c.seq == seq).values(pgid=pgid))

    def finish_step(self, *, seq: int, state: str, started_at: datetime, output: Any, error: str | None,
                    counters: Counters, new_messages: Iterable[tuple[int, Message]] = (),
                    attempts: int | None = None, prompt_tokens: int | None = None,
                    completion_tokens: int | None = None, intent: dict[str, Any] | None = None,
                    use_approval: int | None = None, defer: bool = False) -> None:
        """The outcome and the messages it produces, in one transaction.

        With `intent` the step row is inserted here already finished: for read-only tools,
        whose intent row would protect nothing (resume simply runs them again). With
        `defer` (which needs `intent`) the write waits for the next commit (the next step's
        intent): a crash before then loses only a read, which resume runs again.
        """
        now = utcnow()
        duration = int((now - started_at).total_seconds() * 1000)
        outcome: dict[str, Any] = {"state": state, "output": output, "error": error, "finished_at": now,
                                   "duration_ms": duration, "prompt_tokens": prompt_tokens,
                                   "completion_tokens": completion_tokens}
        outcome = storable(outcome)
        rows = [message_values(self.run_id, mseq, m, seq, now) for mseq, m in new_messages]
        if defer:
            if intent is None or use_approval is not None:
                raise ValueError("only a finished step without an approval can wait for the next commit")
            self._deferred_steps.append(_step_row(run_id=self.run_id, seq=seq, started_at=started_at,
                                                  lease_epoch=self.epoch, attempts=attempts or 1,
                                                  **intent, **outcome))
            self._deferred_messages.extend(rows)
            self._deferred_counters = counters
            return
        step_rows = []
        if intent is not None:
            step_rows.append(_step_row(run_id=self.run_id, seq=seq, started_at=started_at,
                                       lease_epoch=self.epoch, attempts=attempts or 1, **intent, **outcome))
        elif attempts is not None:
            outcome["attempts"] = attempts
        with self._tx(now, counters, step_rows=step_rows, message_rows=rows) as conn:
            if intent is None:
                conn.execute(_UPDATE_STEP, {"b_run": self.run_id, "b_seq": seq, **outcome})
            if use_approval is not None:
                conn.execute(_USE_APPROVAL, {"b_id": use_approval, "used_at": now})

    def add_messages(self, new_messages: Iterable[tuple[int, Message]], counters: Counters) -> None:
        now = utcnow()
        with self._tx(now, counters, message_rows=[message_values(self.run_id, s, m, None, now)
                                                   for s, m in new_messages]):
            pass

    def request_approval(self, *, call_id: str, kind: str, tool_name: str, command: str | None,
                         reason: str, step_seq: int | None) -> None:
        command, reason = storable((command, reason))
        now = utcnow()
        with self._tx(now) as conn:
            pending = conn.execute(select(approvals.c.id).where(
                approvals.c.run_id == self.run_id, approvals.c.call_id == call_id,
                approvals.c.kind == kind, approvals.c.decision.is_(None))).first()
            if pending is None:
                conn.execute(insert(approvals).values(
                    run_id=self.run_id, call_id=call_id, kind=kind, tool_name=tool_name,
                    command=command, reason=reason, step_seq=step_seq, requested_at=now))

    def finish_run(self, *, status: str, stop_reason: str, answer: str | None, error: str | None,
                   counters: Counters) -> None:
        """The run's end: status, reason, answer; the lease is released in the same write."""
        answer, error = storable((answer, error))
        now = utcnow()
        with self._tx(now, counters) as conn:
            conn.execute(update(runs).where(runs.c.id == self.run_id).values(
                status=status, stop_reason=stop_reason, answer=answer, error=error,
                finished_at=now, lease_owner=None, lease_expires_at=None))

    def heartbeat(self) -> bool:
        """Extend the lease; returns cancel_requested so the heartbeat can stop a running command."""
        now = utcnow()
        # Its own pooled connection, not the writer's: it runs on another thread, and is not a
        # crash point (it runs on its own thread's clock).
        with self.engine.begin() as conn:
            self._fence(conn, now)  # also reads cancel_requested
        return self.cancel_seen
