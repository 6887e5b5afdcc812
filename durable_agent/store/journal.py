"""Checkpoints of one run under one lease, and the rows of its steps.

The step protocol (find or start, snapshots, events, outcome) is loop/step.py's; this is
the store side it writes through:

    step = journal.find(key, kind, turn=t)         # the recorded unfinished one, or a new one
    step.start(input, workspace=...)                # the intent row (a restart counts the attempt)
    step.complete(output, messages=[...], counters=c)   # or step.fail(error, ...)

`Journal.find` writes nothing; `Journal.step(...)` is find and start in one. A step that
ends without an intent row (reads, refusals: nothing to protect) rides along with the
next commit; a crash before it only means resume runs the read again.

Every write transaction first re-checks the lease (`lease_owner`, `lease_epoch`), so a
process that lost its lease commits nothing more. Each transaction is built as a list of
statements and run whole, with transient database faults retried on a fresh connection
(store/retrying.py); a COMMIT cut off mid-flight is settled by reading back the token the
transaction wrote into its run row. The caller's memory never runs ahead of the store: a
write that finally fails raises, and the session that made it ends without writing more.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from msgspec import Struct
from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    distinct,
    func,
    insert,
    not_,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Executable

from durable_agent.errors import LeaseLost, RunNotFound, StepMismatch
from durable_agent.messages import HEAD, Message, ToolCall
from durable_agent.status import RunStatus, StepKind
from durable_agent.store import outbox, prepared, retrying, waiting
from durable_agent.store.payloads import StepOutput, decode_output
from durable_agent.store.prepared import Prepared
from durable_agent.store.records import ApprovalRecord, Decision, RunRecord, StepRecord, StepState
from durable_agent.store.rows import (
    GONE,
    MESSAGE_COLUMNS,
    Older,
    message_from_row,
    utcnow,
)
from durable_agent.store.schema import approvals, messages, runs, steps
from durable_agent.store.step import (
    COUNTERS,
    STEP_COLUMNS,
    Counters,
    Step,
    calibrating_output,
)
from durable_agent.store.storable import storable

START_WITHIN = 0.8  # of the lease: see Journal.start_deadline

# Hot-path statements, built once: constructing a Core statement per checkpoint costs more
# CPU than the SQL it sends. Where-clause parameters are prefixed b_ so they never clash
# with the column names that the SET clause takes from the parameters.
_FENCE_WHERE = (
    runs.c.id == bindparam("b_id"),
    runs.c.lease_owner == bindparam("b_owner"),
    runs.c.lease_epoch == bindparam("b_epoch"),
)
_HEARTBEAT = Prepared(
    update(runs)
    .where(*_FENCE_WHERE)
    .values(updated_at=bindparam("b_now"), lease_expires_at=bindparam("b_expires"))
    .returning(runs.c.cancel_requested)
)
_FENCE = Prepared(
    update(runs)
    .where(*_FENCE_WHERE)
    .values(
        updated_at=bindparam("b_now"),
        lease_expires_at=bindparam("b_expires"),
        last_checkpoint=bindparam("b_token"),
    )
    .returning(runs.c.cancel_requested)
)
_FENCE_COUNTERS = Prepared(
    update(runs)
    .where(*_FENCE_WHERE)
    .values(
        updated_at=bindparam("b_now"),
        lease_expires_at=bindparam("b_expires"),
        last_checkpoint=bindparam("b_token"),
        **{c: bindparam(f"b_{c}") for c in COUNTERS},
    )
    .returning(runs.c.cancel_requested)
)
_INSERT_STEP = Prepared(insert(steps), keys=STEP_COLUMNS)
# Steps whose tokens the run paid for (a summary is a model call; a child's, rolled up):
# the WHERE of ix_steps_paid (0016), which holds their counts, written out as it is there.
PAID = text("kind IN ('model', 'compact', 'delegate')")
_INSERT_MESSAGES = Prepared(insert(messages), keys=MESSAGE_COLUMNS)

KEEP_CONNECTION_S = 5.0  # how long the writer keeps its connection between transactions

Statement = tuple[Executable | Prepared, Any]
# Test and demo hook (durable_agent/store/faults.py): called with "before_commit" when a
# checkpoint's statements have run and "after_commit" once it is durable. Empty in production.
BOUNDARY_HOOKS: list[Callable[[str], None]] = []


def _run(conn: Connection, statement: Executable | Prepared, params: Any) -> None:
    """One statement of a checkpoint, on its DBAPI transaction (a list of rows: executemany)."""
    if isinstance(statement, Prepared) and isinstance(params, list):
        statement.run_many(conn, params)
        return
    cursor = (
        statement.run(conn, params)
        if isinstance(statement, Prepared)
        else prepared.run_core(conn, statement, params)
    )
    if cursor is not None:
        cursor.close()


class Loaded(Struct, frozen=True):
    run: RunRecord
    messages: list[Message]
    open_steps: list[StepRecord]
    next_seq: int
    model_tokens: tuple[
        int, int
    ]  # prompt, completion: summed over completed model and compact steps
    compactions: list[
        Any
    ]  # outputs of the completed `compact` steps, in order (the request's shape)
    last_model_output: StepOutput  # the last completed model step's (its usage calibrates counts)
    # The run's `user_message` steps (`continue`), by seq, whatever their state: the latest
    # completed one opened the current turn (its window, where its stale steps end).
    user_turns: list[StepRecord] = []
    model_cached: int = 0  # cached prompt tokens, summed like model_tokens
    model_cost: float | None = None  # the steps' costs summed (None: no step was priced)
    older: Older = Older()  # of the messages not read (GONE in `messages`): loop/replay.py


def view_start(compactions: Sequence[Any]) -> int:
    """Where the request's messages begin after these compact outputs (context/view.py
    `ContextView.apply`: the last summary's start)."""
    start = HEAD
    for out in compactions:
        if (
            isinstance(out, dict)
            and isinstance(out.get("summary"), str)
            and isinstance(out.get("start"), int)
        ):
            start = max(HEAD, out["start"])
    return start


_DROPPABLE = or_(
    messages.c.role == "tool",
    and_(messages.c.role == "assistant", messages.c.tool_calls.is_not(None)),
)
# ix_messages_tool_call's WHERE (0016), as it is written there.
_TOOL = text("role = 'tool'")
# A tool result with a call id.
_ANSWER = and_(
    _TOOL,
    messages.c.tool_call_id.is_not(None),
    messages.c.tool_call_id != "",
)


def _history(conn: Connection, run_id: str, start: int) -> tuple[list[Message], Older]:
    """The run's messages as a rebuild needs them: all of them from `start` on, and before it
    those `droppable` does not hold (GONE in their places); what the rebuild needs of the
    rest, counted here in the database (loop/replay.py). A resume of a long run reads what
    its requests send, not its whole history, and counts the rest in two index-only passes
    (the primary key's, and ix_messages_tool_call's: 0016), not reading the rows."""
    of_run = messages.c.run_id == run_id
    total, first, last = conn.execute(
        select(func.count(), func.min(messages.c.seq), func.max(messages.c.seq)).where(of_run)
    ).one()
    if last is not None and (first != 0 or last + 1 != total):
        # Seqs with gaps (rows deleted by hand; a row moved below 0 leaves one too, with as
        # many rows as seqs up to the last): read in order, as they are.
        start = HEAD
    elif start >= total:
        # (a start at or past the history's end, its last messages deleted by hand: no view
        # to read from, and no message at the start for the rebuild to begin the calls
        # below it at: loop/replay.py)
        start = HEAD
    if start <= HEAD:
        every = [
            message_from_row(r)
            for r in conn.execute(
                select(
                    messages.c.role,
                    messages.c.content,
                    messages.c.tool_calls,
                    messages.c.tool_call_id,
                )
                .where(of_run)
                .order_by(messages.c.seq)
            )
        ]
        return every, Older()
    history: list[Message] = [GONE] * total
    read = select(
        messages.c.seq,
        messages.c.role,
        messages.c.content,
        messages.c.tool_calls,
        messages.c.tool_call_id,
    ).where(of_run, or_(messages.c.seq >= start, messages.c.seq < HEAD, not_(_DROPPABLE)))
    kept_below = 0  # messages read in [HEAD, start): those droppable does not hold
    for row in conn.execute(read.order_by(messages.c.seq)):
        history[row.seq] = message_from_row(row)
        kept_below += HEAD <= row.seq < start
    results, answered = conn.execute(
        select(
            func.count(),
            func.count(distinct(messages.c.tool_call_id)).filter(messages.c.tool_call_id != ""),
        ).where(of_run, _TOOL)
    ).one()
    read_results = [m for m in history if m is not GONE and m.role == "tool"]
    # Every place in [HEAD, start) not read holds a droppable message: a tool result (all of
    # them but the ones read) or an assistant message that asked for tools.
    assistants = (start - HEAD) - kept_below - (results - len(read_results))
    read_ids = {m.tool_call_id for m in read_results if m.tool_call_id}
    below = and_(of_run, messages.c.seq < start, messages.c.seq >= HEAD, _DROPPABLE)
    fingerprint, seqs = _older_streak(conn, run_id, below, start)
    asked = {
        c.id
        for m in history[start:]
        if m is not GONE and m.role == "assistant"
        for c in m.tool_calls
    }
    return history, Older(
        answered_below=frozenset(_answered_among(conn, run_id, asked - read_ids, start)),
        start=start,
        assistants=assistants,
        answered=int(answered or 0) - len(read_ids),
        streak_fingerprint=fingerprint,
        streak_seqs=seqs,
    )


def _answered_among(conn: Connection, run_id: str, ids: Collection[str], end: int) -> set[str]:
    """Which of `ids` tool results among messages [HEAD, end) answer. Looked up by call id
    (ix_messages_tool_call, 0016); the seqs are checked here, as a bound on them in the
    query could make SQLite walk the run's messages by seq instead."""
    found: set[str] = set()
    wanted = sorted(ids)
    for start in range(0, len(wanted), 500):  # SQLite's bound on a statement's values
        query = select(messages.c.tool_call_id, messages.c.seq).where(
            messages.c.run_id == run_id,
            _ANSWER,
            messages.c.tool_call_id.in_(wanted[start : start + 500]),
        )
        found.update(cid for cid, seq in conn.execute(query) if HEAD <= seq < end)
    return found


def _older_streak(
    conn: Connection, run_id: str, below: Any, start: int
) -> tuple[str | None, list[int]]:
    """The answered calls the messages below the start end with that share one fingerprint,
    by the seq of the message that asked for each: newest first, a page at a time until a
    call differs (one or two messages, unless the model repeated itself)."""
    fingerprint: str | None = None
    seqs: list[int] = []
    before: int | None = None
    while True:
        query = select(
            messages.c.seq,
            messages.c.role,
            messages.c.content,
            messages.c.tool_calls,
            messages.c.tool_call_id,
        ).where(below, messages.c.role == "assistant")
        if before is not None:
            query = query.where(messages.c.seq < before)
        page = [
            (row.seq, message_from_row(row))
            for row in conn.execute(query.order_by(messages.c.seq.desc()).limit(16))
        ]
        ids = {c.id for _, m in page for c in m.tool_calls}
        answered = _answered_among(conn, run_id, ids, start)
        for seq, message in page:
            for call in reversed(message.tool_calls):
                if call.id not in answered:
                    continue
                fp = call.fingerprint()
                if fingerprint is not None and fp != fingerprint:
                    return fingerprint, seqs
                fingerprint = fp
                seqs.append(seq)
        if len(page) < 16:
            return fingerprint, seqs
        before = page[-1][0]


class Journal:
    """Writes for one run under one lease. Every transaction is fenced on the epoch.

    The thread that drives the run writes through one connection of its own (`close` gives
    it back); the heartbeat and the cancel watcher take theirs from the pool.
    """

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        owner: str,
        epoch: int,
        lease_seconds: float,
        *,
        policy: retrying.StorePolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.engine, self.run_id, self.owner, self.epoch = engine, run_id, owner, epoch
        self.lease = timedelta(seconds=lease_seconds)
        # CLOCK_BOOTTIME (it goes on through a suspend) read just before the `now` of our last
        # checkpoint: the lease it wrote runs out `lease` after that, on the store's side
        # (start_deadline). Not the heartbeat's renewals: a checkpoint that lands after one
        # writes its own, earlier expiry over it. Before the first: no effect may start.
        self.lease_clock = -math.inf
        self.policy = policy or retrying.StorePolicy()
        self.sleep = sleep
        self._conn: Connection | None = None
        self._last_used = 0.0  # time.monotonic() at the end of our last transaction
        # Finished reads and refusals, their messages and totals: they ride with the next commit.
        self._deferred_steps: list[dict[str, Any]] = []
        self.pending_messages: list[dict[str, Any]] = []
        self._deferred_counters: Counters | None = None
        # Rows that need no checkpoint of their own (a run_versions row): the next commit's.
        self._deferred_statements: list[Statement] = []
        self.message_count = 0  # messages committed: the next one's seq follows them
        self.cancel_seen = False  # runs.cancel_requested as of our last checkpoint
        self.next_seq = 0
        self.open_steps: dict[str, StepRecord] = {}
        self.failed_keys: set[str] = set()
        self.user_turns: list[StepRecord] = []  # the run's user_message steps, as loaded
        # Has the run a parent (loop/delegate_step.py)? None until loaded: its end then
        # wakes a waiting parent as a child's would (store/waiting.py).
        self.is_child: bool | None = None

    # -- steps ---------------------------------------------------------------------------------
    def find(
        self,
        key: str,
        kind: str,
        *,
        turn: int,
        call_id: str | None = None,
        tool_name: str | None = None,
        effect: str | None = None,
    ) -> Step:
        """The step with this key: the recorded unfinished one (`step.prior`), or a new one.

        A recorded unfinished step of the same kind in the same place (turn, call) under
        another key means the history differs from the recorded one: `StepMismatch`.
        """
        prior = self.open_steps.get(key)
        if prior is None and key in self.failed_keys:
            # Failed earlier in this session: tried again on its own row, as a resume would
            # (one row a key; a second insert would be refused by the store).
            prior = self.recorded(key)
        if prior is None:
            for other in self.open_steps.values():
                if other.kind == kind and other.turn == turn and other.call_id == call_id:
                    raise StepMismatch(self.run_id, other.seq, key, other.idempotency_key)
        return Step(
            self,
            key=key,
            kind=kind,
            turn=turn,
            prior=prior,
            call_id=call_id,
            tool_name=tool_name,
            effect=effect,
        )

    def step(
        self, key: str, kind: str, input: Any, *, turn: int, tool_name: str | None = None
    ) -> Step:
        """Find or start: the intent is committed (a restart counts the attempt)."""
        return self.find(key, kind, turn=turn, tool_name=tool_name).start(input)

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def forget_open(self, key: str) -> None:
        self.open_steps.pop(key, None)

    def forget_superseded(self, kind: str, turn: int, key: str) -> None:
        """Recorded unfinished steps of this kind and turn under another key (failed, or cut
        off by a crash) stop counting as the place's step: a compaction changed the request,
        so that call is not the one made now. One under `key` is this call: it is made again."""
        for other, st in list(self.open_steps.items()):
            if st.kind == kind and st.turn == turn and other != key:
                del self.open_steps[other]

    def step_failed(self, key: str) -> bool:
        """A step with this key ended failed (in this session or a recorded one)."""
        return key in self.failed_keys

    # -- transactions --------------------------------------------------------------------------
    def close(self) -> None:
        """Give the writing connection back to the pool (the session is over, or it broke)."""
        if self._conn is not None:
            with contextlib.suppress(
                Exception
            ):  # a dead connection may fail to close: it is dropped
                self._conn.close()
            self._conn = None

    def _connection(self) -> Connection:
        # A pool checkout per checkpoint (and its reset on return) costs more CPU than the
        # statements; keep one while the loop is busy. After a longer pause go through the
        # pool again, whose pre-ping (PostgreSQL) replaces a connection the server dropped.
        if self._conn is not None and time.monotonic() - self._last_used > KEEP_CONNECTION_S:
            self.close()
        if self._conn is None:
            self._conn = self.engine.connect()
        return self._conn

    def defer(
        self,
        step_rows: list[dict[str, Any]],
        message_rows: list[dict[str, Any]],
        counters: Counters,
    ) -> None:
        # Rows of the prepared inserts: made storable as they are written (store/prepared.py).
        self._deferred_steps.extend(step_rows)
        self.pending_messages.extend(message_rows)
        self._deferred_counters = counters

    def defer_statements(self, statements: Iterable[Statement]) -> None:
        """Write `statements` with the next commit, whatever it is: a record of the session
        (what it runs with) that is lost with it if nothing else is written, and made again."""
        self._deferred_statements.extend(statements)

    def discard_deferred(self) -> None:
        """Forget writes not yet committed (the loop stops without them: resume re-runs reads)."""
        self._deferred_statements.clear()
        self._deferred_steps.clear()
        self.pending_messages.clear()
        self._deferred_counters = None

    def commit(
        self,
        statements: Iterable[Statement] = (),
        *,
        step_rows: Sequence[dict[str, Any]] = (),
        message_rows: Sequence[dict[str, Any]] = (),
        counters: Counters | None = None,
        raw: Sequence[Statement] = (),
    ) -> None:
        """One fenced checkpoint: the fence, the deferred and new rows, then `statements`.

        Retried whole on transient faults. Raises LeaseLost (fenced out), StoreUnavailable
        (faults persisted) or StoreError (refused); after any of them nothing of it is
        committed, and the deferred rows are kept for the caller to drop with the session.
        `raw` statements run first, as they are: binary workspace blobs, not cleaned text.
        """
        # storable: no value (a NUL, a lone surrogate, a non-finite number) may fail the write
        # on either dialect; it returns the same object when there is nothing to change.
        # (Prepared statements, the step and message inserts among them, clean their own values.)
        statements = [
            (statement, params if isinstance(statement, Prepared) else storable(params))
            for statement, params in (*self._deferred_statements, *statements)
        ]
        counters = counters or self._deferred_counters
        all_steps = [*self._deferred_steps, *step_rows]
        all_messages = [*self.pending_messages, *message_rows]
        token = os.urandom(16).hex()  # a uuid4's randomness, without building a UUID
        clock = time.clock_gettime(time.CLOCK_BOOTTIME)  # first: the lease below runs from `now`
        now = utcnow()

        def attempt() -> None:
            conn = self._connection()
            in_commit = False
            try:
                # On the DBAPI connection: Core's per-statement machinery cost more CPU
                # than the SQL (store/prepared.py).
                with prepared.transaction(conn):
                    self._fence(conn, now, counters, token)
                    for statement, params in raw:
                        _run(conn, statement, params)
                    if all_steps:
                        _INSERT_STEP.run_many(conn, all_steps)
                    if all_messages:
                        _INSERT_MESSAGES.run_many(conn, all_messages)
                    for statement, params in statements:
                        _run(conn, statement, params)
                    for hook in BOUNDARY_HOOKS:
                        hook("before_commit")
                    in_commit = True
            except DBAPIError:
                self.close()  # it may be broken: the next try starts on a fresh connection
                if in_commit and self._landed(token):
                    return  # the COMMIT went through before the connection died
                raise
            except BaseException:
                self.close()
                raise
            finally:
                self._last_used = time.monotonic()

        retrying.run(attempt, self.policy, run_id=self.run_id, sleep=self.sleep)
        self.lease_clock = clock
        self.message_count += len(all_messages)
        self._deferred_statements.clear()
        self._deferred_steps.clear()
        self.pending_messages.clear()
        self._deferred_counters = None
        for hook in BOUNDARY_HOOKS:
            hook("after_commit")

    def start_deadline(self) -> float:
        """The CLOCK_BOOTTIME by which an effect must have started to be surely inside the
        lease our last checkpoint wrote: START_WITHIN of it, the rest for the clocks of other
        hosts (which judge its expiry) running ahead of ours, and for a heartbeat that read
        its time just before that checkpoint and wrote its lease just after."""
        return self.lease_clock + self.lease.total_seconds() * START_WITHIN

    def _landed(self, token: str) -> bool:
        """Did the transaction that wrote `token` commit? Read it back on a new connection."""
        return bool(
            self._read(
                lambda conn: (
                    conn.execute(
                        select(runs.c.last_checkpoint).where(runs.c.id == self.run_id)
                    ).scalar()
                    == token
                )
            )
        )

    def _fence(
        self, conn: Connection, now: datetime, counters: Counters | None, token: str | None
    ) -> None:
        # The first statement of every write: extends the lease and proves we still own it.
        # On SQLite the transaction already holds the write lock (BEGIN IMMEDIATE); on
        # PostgreSQL the UPDATE locks the run row until commit. Either way no other owner
        # can slip in between this check and our commit.
        params: dict[str, Any] = {
            "b_id": self.run_id,
            "b_owner": self.owner,
            "b_epoch": self.epoch,
            "b_now": now,
            "b_expires": now + self.lease,
        }
        statement = _HEARTBEAT
        if token is not None:
            statement = _FENCE
            params["b_token"] = token
        if counters is not None:  # run totals, written with the rows that change them
            statement = _FENCE_COUNTERS
            params.update(counters.as_params())
        cursor = statement.run(conn, params)
        row = prepared.fetch_one(conn, cursor)
        cursor.close()
        if row is None:
            raise LeaseLost(self.run_id)
        self.cancel_seen = bool(row[0])

    def _read(
        self, query: Callable[[Connection], Any], policy: retrying.StorePolicy | None = None
    ) -> Any:
        return retrying.read(
            self.engine, query, policy or self.policy, run_id=self.run_id, sleep=self.sleep
        )

    # -- reads ---------------------------------------------------------------------------------
    def load(self) -> Loaded:
        """The run row, its messages and the steps that matter for resume (not completed)."""

        def query(conn: Connection) -> Loaded:
            run = conn.execute(select(runs).where(runs.c.id == self.run_id)).first()
            if run is None:
                raise RunNotFound(self.run_id)
            done = (steps.c.run_id == self.run_id, steps.c.state == StepState.COMPLETED.value)
            compactions = [
                r[0]
                for r in conn.execute(
                    select(steps.c.output)
                    .where(*done, steps.c.kind == StepKind.COMPACT.value)
                    .order_by(steps.c.seq)
                )
            ]
            msgs, older = _history(conn, self.run_id, view_start(compactions))
            open_steps = [
                StepRecord.from_row(r)
                for r in conn.execute(
                    select(steps).where(
                        steps.c.run_id == self.run_id, steps.c.state != StepState.COMPLETED.value
                    )
                )
            ]
            # The totals, derived from the rows (never trusted from the run row:
            # loop/replay.py), summed in the database from ix_steps_paid alone; the last
            # seq from the (run_id, seq) index.
            last_seq = select(func.max(steps.c.seq)).where(steps.c.run_id == self.run_id)
            max_seq, prompt, completion, cached, cost = conn.execute(
                select(
                    last_seq.scalar_subquery(),
                    func.sum(steps.c.prompt_tokens),
                    func.sum(steps.c.completion_tokens),
                    func.sum(steps.c.cached_tokens),
                    func.sum(steps.c.cost),
                ).where(steps.c.run_id == self.run_id, PAID)
            ).one()
            last_model = calibrating_output(conn, done)
            user_turns = [
                StepRecord.from_row(r)
                for r in conn.execute(
                    select(steps)
                    .where(
                        steps.c.run_id == self.run_id,
                        steps.c.kind == StepKind.USER_MESSAGE.value,
                    )
                    .order_by(steps.c.seq)
                )
            ]
            # Steps the latest turn's message superseded (a failed model call, a call cut
            # off by a crash, under the history before the message) are not this turn's:
            # they are neither gone on with nor a mismatch for the steps of the new history.
            opened = max((t.seq for t in user_turns if t.state == StepState.COMPLETED), default=-1)
            open_steps = [s for s in open_steps if s.seq > opened]
            return Loaded(
                run=RunRecord.from_row(run),
                messages=msgs,
                open_steps=open_steps,
                next_seq=0 if max_seq is None else max_seq + 1,
                model_tokens=(int(prompt or 0), int(completion or 0)),
                compactions=compactions,
                last_model_output=decode_output(StepKind.MODEL, last_model),
                user_turns=user_turns,
                model_cached=int(cached or 0),
                model_cost=None if cost is None else float(cost),
                older=older,
            )

        loaded: Loaded = self._read(query)
        self.next_seq = loaded.next_seq
        self.open_steps = {s.idempotency_key: s for s in loaded.open_steps}
        self.user_turns = loaded.user_turns
        self.failed_keys = {
            s.idempotency_key for s in loaded.open_steps if s.state == StepState.FAILED
        }
        self.message_count = len(loaded.messages)  # (GONE included: every seq has its place)
        self.cancel_seen = bool(loaded.run.cancel_requested)  # a worker keeps a cancel it took over
        self.is_child = loaded.run.parent_id is not None
        self.discard_deferred()
        return loaded

    def completed(self, key: str) -> StepRecord | None:
        """The completed step with this key, if one was recorded (e.g. a passed verification)."""
        found = self.recorded(key)
        return found if found is not None and found.state == StepState.COMPLETED else None

    def recorded(self, key: str) -> StepRecord | None:
        """The step with this key, in whatever state it was recorded, if it was."""
        row = self._read(
            lambda conn: conn.execute(
                select(steps).where(steps.c.run_id == self.run_id, steps.c.idempotency_key == key)
            ).first()
        )
        return None if row is None else StepRecord.from_row(row)

    def tool_result(self, call_id: str) -> str | None:
        """The content of the last tool result for `call_id` (one no longer in memory)."""
        query = (
            select(messages.c.content)
            .where(
                messages.c.run_id == self.run_id,
                messages.c.role == "tool",
                messages.c.tool_call_id == call_id,
            )
            .order_by(messages.c.seq.desc())
            .limit(1)
        )
        row = self._read(lambda conn: conn.execute(query).first())
        return None if row is None else (row[0] or "")

    def tool_result_ids(self, first: int, end: int) -> list[str]:
        """The call ids of the tool results among messages [first, end), newest first."""
        query = (
            select(messages.c.tool_call_id)
            .where(
                messages.c.run_id == self.run_id,
                messages.c.seq >= first,
                messages.c.seq < end,
                messages.c.role == "tool",
                messages.c.tool_call_id.is_not(None),
                messages.c.tool_call_id != "",
            )
            .order_by(messages.c.seq.desc())
        )
        return list(self._read(lambda conn: conn.execute(query).scalars().all()))

    def answered_before(self, call_id: str, end: int) -> bool:
        """Did a tool result among messages [HEAD, end) answer `call_id`? (The ids a resume
        did not read: loop/replay.py `RunState.ids_below`.)"""
        return bool(self._read(lambda conn: _answered_among(conn, self.run_id, [call_id], end)))

    def tool_names_below(self, start: int) -> set[str]:
        """The names of the tools the messages before `start` called (those no longer in
        memory: loop/replay.py)."""
        query = select(messages.c.tool_calls).where(
            messages.c.run_id == self.run_id,
            messages.c.seq < start,
            messages.c.role == "assistant",
            messages.c.tool_calls.is_not(None),
        )
        rows = self._read(lambda conn: conn.execute(query).all())
        return {ToolCall.from_dict(c).name for (calls,) in rows for c in calls or ()}

    def cancel_requested(self, *, once: bool = False) -> bool:
        """`once`: one try, for the heartbeat (its renewal must not wait behind a minute of retries)."""
        return bool(
            self._read(
                lambda conn: conn.execute(
                    select(runs.c.cancel_requested).where(runs.c.id == self.run_id)
                ).scalar(),
                retrying.StorePolicy(max_attempts=1) if once else None,
            )
        )

    def open_approvals(self) -> bool:
        """Any question of the run still without an answer."""
        query = select(approvals.c.id).where(
            approvals.c.run_id == self.run_id, approvals.c.decision.is_(None)
        )
        return bool(self._read(lambda conn: conn.execute(query.limit(1)).first()))

    # -- the run's trace (loop/telemetry.py) ------------------------------------------------
    def trace_id(self, candidate: str) -> str:
        """The run's trace id: the recorded one, else `candidate`, recorded now (fenced)."""
        found = self._read(
            lambda c: c.execute(select(runs.c.trace_id).where(runs.c.id == self.run_id)).scalar()
        )
        if found:
            return str(found)
        self.commit(
            [
                (
                    update(runs)
                    .where(runs.c.id == self.run_id, runs.c.trace_id.is_(None))
                    .values(trace_id=candidate),
                    {},
                )
            ]
        )
        return candidate

    def sessions(self) -> dict[int, tuple[datetime, datetime]]:
        """Per lease epoch that wrote steps: (its first step's start, its last step's end or
        start): what a later session knows of one that died."""
        query = (
            select(
                steps.c.lease_epoch,
                func.min(steps.c.started_at),
                func.max(func.coalesce(steps.c.finished_at, steps.c.started_at)),
            )
            .where(steps.c.run_id == self.run_id, steps.c.lease_epoch.is_not(None))
            .group_by(steps.c.lease_epoch)
        )
        rows = self._read(lambda c: c.execute(query).all())
        return {int(r[0]): (r[1], r[2]) for r in rows}

    def decided_unused(self) -> list[ApprovalRecord]:
        """Answers this session is about to act on (their wait is over)."""
        query = (
            select(approvals)
            .where(
                approvals.c.run_id == self.run_id,
                approvals.c.decision.is_not(None),
                approvals.c.used_at.is_(None),
            )
            .order_by(approvals.c.id)
        )
        return [ApprovalRecord.from_row(r) for r in self._read(lambda c: c.execute(query).all())]

    def pending_approvals(self) -> list[ApprovalRecord]:
        """The run's questions still waiting for a decision, oldest first."""
        query = (
            select(approvals)
            .where(approvals.c.run_id == self.run_id, approvals.c.decision.is_(None))
            .order_by(approvals.c.id)
        )
        return [ApprovalRecord.from_row(r) for r in self._read(lambda c: c.execute(query).all())]

    def approval_for(
        self, call_id: str, kind: str, *, used_too: bool = False
    ) -> ApprovalRecord | None:
        """The latest decided, not yet used approval of this call, or a pending one (`used_too`:
        one used already counts as well)."""
        query = select(approvals).where(
            approvals.c.run_id == self.run_id,
            approvals.c.call_id == call_id,
            approvals.c.kind == kind,
        )
        if not used_too:
            query = query.where(approvals.c.used_at.is_(None))
        row = self._read(lambda conn: conn.execute(query.order_by(approvals.c.id.desc())).first())
        return None if row is None else ApprovalRecord.from_row(row)

    # -- run-level writes ----------------------------------------------------------------------
    def request_approval(
        self,
        *,
        call_id: str,
        kind: str,
        tool_name: str,
        command: str | None,
        reason: str,
        step_seq: int | None,
    ) -> None:
        pending = self.approval_for(call_id, kind)
        if pending is not None and pending.decision is None:
            return
        command, reason = storable((command, reason))
        self.commit(
            [
                (
                    insert(approvals).values(
                        run_id=self.run_id,
                        call_id=call_id,
                        kind=kind,
                        tool_name=tool_name,
                        command=command,
                        reason=reason,
                        step_seq=step_seq,
                        requested_at=utcnow(),
                    ),
                    {},
                )
            ]
        )

    def retire_approvals(self, *, by: str) -> None:
        """`continue`: questions still open (a blocked run that was cancelled) are not asked
        any more, the person sent a message instead. Recorded as denied and used, so no later
        session acts on them (a drift answered "deny" would put old files back)."""
        now = utcnow()
        self.commit(
            [
                (
                    update(approvals)
                    .where(approvals.c.run_id == self.run_id, approvals.c.decision.is_(None))
                    .values(
                        decision=Decision.DENIED.value, decided_by=by, decided_at=now, used_at=now
                    ),
                    {},
                )
            ]
        )

    def settle_approval(self, approval_id: int, *, by: str) -> None:
        """A pending question that the policy now answers: approved, by the policy."""
        self.commit(
            [
                (
                    update(approvals)
                    .where(approvals.c.id == approval_id)
                    .values(decision=Decision.APPROVED.value, decided_by=by, decided_at=utcnow()),
                    {},
                )
            ]
        )

    def finish_run(
        self,
        *,
        status: str,
        stop_reason: str | None,
        answer: str | None,
        error: str | None,
        counters: Counters,
        notifications: Sequence[dict[str, Any]] = (),
    ) -> None:
        """The run's end: status, reason, answer; the lease is released in the same write,
        and the notifications of the end are queued in it (the outbox: store/outbox.py)."""
        answer, error = storable((answer, error))
        now = utcnow()
        self.commit(
            [
                *outbox.insert_statements(notifications),
                (
                    update(runs)
                    .where(runs.c.id == self.run_id)
                    .values(
                        status=status,
                        stop_reason=stop_reason,
                        answer=answer,
                        error=error,
                        finished_at=now,
                        lease_owner=None,
                        lease_expires_at=None,
                    ),
                    {},
                ),
                # A child's end wakes its waiting parent in the same write, after its own
                # status (the wake counts its siblings still going): store/waiting.py.
                *(waiting.wake_parent(self.run_id, now) if self.is_child is not False else []),
            ],
            counters=counters,
        )

    def wait_for_children(self) -> str:
        """A worker's run stops for its child runs (store/waiting.py): `waiting`, its lease
        released in the same write; `pending` at once when every child ended meanwhile.
        Returns the status it was left in."""
        self.commit(
            [(update(runs).where(runs.c.id == self.run_id).values(**waiting.wait_values()), {})]
        )
        return str(
            self._read(
                lambda conn: conn.execute(
                    select(runs.c.status).where(runs.c.id == self.run_id)
                ).scalar()
            )
        )

    def hand_to_queue(self) -> None:
        """`continue --detach`: the run, its message recorded, goes back to the workers' queue
        (`pending`, no lease), fenced on our lease like every checkpoint."""
        self.commit(
            [
                (
                    update(runs)
                    .where(runs.c.id == self.run_id)
                    .values(
                        status=RunStatus.PENDING.value, lease_owner=None, lease_expires_at=None
                    ),
                    {},
                )
            ]
        )

    def release_lease(self) -> None:
        """Best effort, one try: after a store failure let the next owner in without waiting
        for the lease to expire. The run keeps its status; resume takes it from there."""
        with (
            contextlib.suppress(Exception),
            self.engine.begin() as conn,
        ):  # down: the lease runs out
            conn.execute(
                update(runs).where(*_FENCE_WHERE).values(lease_expires_at=utcnow()),
                {"b_id": self.run_id, "b_owner": self.owner, "b_epoch": self.epoch},
            )

    def heartbeat(self) -> bool:
        """Extend the lease; returns cancel_requested so the heartbeat can stop a running command."""
        # Its own pooled connection, not the writer's: it runs on another thread. Not retried
        # here: a failed renewal is tried again at the next beat.
        with self.engine.begin() as conn:
            self._fence(conn, utcnow(), None, None)
        return self.cancel_seen
