"""One step of a run, from intent to outcome: the row the step primitive (loop/step.py)
writes through (see journal.py).

A `Step` is made by `Journal.find` / `Journal.step`; it writes through its journal, so every
one of its writes is fenced on the lease and retried like any checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from msgspec import Struct
from sqlalchemy import (
    Connection,
    bindparam,
    select,
    text,
    update,
)

from durable_agent.messages import Message
from durable_agent.status import StepKind
from durable_agent.store.blobs import WorkspaceWrite
from durable_agent.store.prepared import Prepared
from durable_agent.store.records import StepRecord, StepState
from durable_agent.store.rows import message_values, utcnow
from durable_agent.store.schema import approvals, steps

if TYPE_CHECKING:
    from durable_agent.store.journal import Journal, Statement

COUNTERS = (
    "step_count",
    "tool_call_count",
    "prompt_tokens",
    "completion_tokens",
    "message_count",
    "active_ms",
    "cached_tokens",
    "cost",
)
UPDATE_STEP = Prepared(
    update(steps).where(steps.c.run_id == bindparam("b_run"), steps.c.seq == bindparam("b_seq"))
)
# A decided approval is acted on once: marked used in the transaction that acts on it.
USE_APPROVAL = Prepared(update(approvals).where(approvals.c.id == bindparam("b_id")))
# Every step row names the same columns, so the rows of one transaction (a deferred read
# and the next intent) go in one executemany. Not id (generated).
STEP_COLUMNS = tuple(c.name for c in steps.c if c.name != "id")


class Counters(Struct, frozen=True):
    """Run totals, written as absolute values with every checkpoint (replay rebuilds them)."""

    step_count: int
    tool_call_count: int
    prompt_tokens: int
    completion_tokens: int
    message_count: int
    active_ms: int
    cached_tokens: int = 0  # 0011: of prompt_tokens, from the provider's cache
    cost: float | None = None  # 0011: the sum of the steps' costs; None: none was priced

    def as_params(self) -> dict[str, int | float | None]:
        return {f"b_{name}": getattr(self, name) for name in COUNTERS}


class Step:
    """One step of the run: its row, from intent to outcome. Made by `Journal.find`/`step`."""

    def __init__(
        self,
        journal: Journal,
        *,
        key: str,
        kind: str,
        turn: int,
        prior: StepRecord | None,
        call_id: str | None,
        tool_name: str | None,
        effect: str | None,
    ) -> None:
        self.journal, self.key, self.kind, self.turn, self.prior = journal, key, kind, turn, prior
        self.call_id, self.tool_name, self.effect = call_id, tool_name, effect
        self.seq = prior.seq if prior is not None else -1
        self.attempts = prior.attempts if prior is not None else 0
        self.started_at = prior.started_at if prior is not None else utcnow()
        self.input: Any = prior.input if prior is not None else None
        self._has_row = prior is not None
        self._ended = False
        self.tree_before: str | None = prior.tree_before if prior is not None else None

    # -- intent ------------------------------------------------------------------------------
    @property
    def has_row(self) -> bool:
        """An intent was committed: an effect may have run (and may need a snapshot)."""
        return self._has_row

    def start(
        self,
        input: Any = None,
        *,
        use_approval: int | None = None,
        durable: bool = True,
        workspace: WorkspaceWrite | None = None,
        also: Callable[[int], Sequence[Statement]] | None = None,
    ) -> Step:
        """Begin an attempt. `durable`: commit the intent row before the effect (a new row,
        or the recorded one restarted); otherwise only count the attempt (reads)."""
        j = self.journal
        self.attempts += 1
        self.started_at = utcnow()
        if input is not None:
            self.input = input
        if not durable:
            return self
        if self.seq < 0:
            self.seq = j.take_seq()
        columns = workspace.columns if workspace is not None else {}
        if self._has_row:
            # pgid: the new attempt's own is recorded when its command starts (tool_step.py)
            values: dict[str, Any] = {
                "state": StepState.STARTED.value,
                "attempts": self.attempts,
                "started_at": self.started_at,
                "finished_at": None,
                "error": None,
                "lease_epoch": j.epoch,
                "input": self.input,
                "pgid": None,
                **columns,
            }
            statements: list[Statement] = [
                (UPDATE_STEP, {"b_run": j.run_id, "b_seq": self.seq, **values})
            ]
            rows: list[dict[str, Any]] = []
        else:
            statements, rows = [], [self._row(state=StepState.STARTED.value, **columns)]
        if use_approval is not None:
            statements.append((USE_APPROVAL, {"b_id": use_approval, "used_at": self.started_at}))
        if also is not None:  # rows the intent creates with it (a delegate step's child run)
            statements.extend(also(self.seq))
        j.commit(
            statements, step_rows=rows, raw=workspace.statements if workspace is not None else ()
        )
        self._has_row = True
        if workspace is not None and workspace.committed is not None:
            workspace.committed()
        return self

    def defer(self) -> Step:
        """Begin a read: count the attempt, commit nothing. Its outcome rides with the next
        commit (a read lost to a crash is simply run again on resume)."""
        return self.start(durable=False)

    def set_attempts(self, attempts: int, error: str | None) -> None:
        """A retry inside the step (model call): visible on the row while it goes on."""
        self.attempts = attempts
        self.journal.commit(
            [
                (
                    UPDATE_STEP,
                    {
                        "b_run": self.journal.run_id,
                        "b_seq": self.seq,
                        "attempts": attempts,
                        "error": error,
                    },
                )
            ]
        )

    def clear_pgid(self) -> None:
        """The recorded command never started (process.StartTooLate): fenced, like every write."""
        self.journal.commit(
            [(UPDATE_STEP, {"b_run": self.journal.run_id, "b_seq": self.seq, "pgid": None})]
        )

    def set_pgid(self, pgid: int) -> float:
        """The command's process group, committed before the command starts. Returns the
        time (CLOCK_BOOTTIME) by which the command must start, still inside our lease."""
        self.journal.commit(
            [(UPDATE_STEP, {"b_run": self.journal.run_id, "b_seq": self.seq, "pgid": pgid})]
        )
        return self.journal.start_deadline()

    # -- outcome -----------------------------------------------------------------------------
    def complete(
        self,
        output: Any,
        *,
        counters: Counters,
        messages: Sequence[Message] = (),
        tokens: tuple[int, int] | None = None,
        use_approval: int | None = None,
        workspace: WorkspaceWrite | None = None,
        extra: Sequence[Statement] = (),
        cached_tokens: int | None = None,
        cost: float | None = None,
    ) -> None:
        self._end(
            StepState.COMPLETED,
            output,
            None,
            messages,
            counters,
            tokens,
            use_approval,
            workspace,
            extra,
            paid=(cached_tokens, cost),
        )

    def fail(
        self,
        error: str,
        *,
        counters: Counters,
        output: Any = None,
        messages: Sequence[Message] = (),
        use_approval: int | None = None,
        workspace: WorkspaceWrite | None = None,
        extra: Sequence[Statement] = (),
    ) -> None:
        self._end(
            StepState.FAILED,
            output,
            error,
            messages,
            counters,
            None,
            use_approval,
            workspace,
            extra,
        )

    def _end(
        self,
        state: StepState,
        output: Any,
        error: str | None,
        new_messages: Sequence[Message],
        counters: Counters,
        tokens: tuple[int, int] | None,
        use_approval: int | None,
        workspace: WorkspaceWrite | None = None,
        extra: Sequence[Statement] = (),
        paid: tuple[int | None, float | None] = (None, None),
    ) -> None:
        j = self.journal
        now = utcnow()
        if self.seq < 0:
            self.seq = j.take_seq()
        outcome: dict[str, Any] = {
            "state": state.value,
            "output": output,
            "error": error,
            "finished_at": now,
            "duration_ms": int((now - self.started_at).total_seconds() * 1000),
            "prompt_tokens": tokens[0] if tokens else None,
            "completion_tokens": tokens[1] if tokens else None,
            "cached_tokens": paid[0],
            "cost": paid[1],
            "attempts": max(self.attempts, 1),
            **(workspace.columns if workspace is not None else {}),
        }
        first = j.message_count + len(j.pending_messages)
        message_rows = [
            message_values(j.run_id, first + i, m, self.seq, now)
            for i, m in enumerate(new_messages)
        ]
        statements: list[Statement] = []
        step_rows: list[dict[str, Any]] = []
        if self._has_row:
            statements.append((UPDATE_STEP, {"b_run": j.run_id, "b_seq": self.seq, **outcome}))
        else:
            step_rows.append(self._row(**outcome))
        if use_approval is not None:
            statements.append((USE_APPROVAL, {"b_id": use_approval, "used_at": now}))
        statements.extend(extra)  # e.g. a `version` step's run_versions row
        self._ended = True
        j.forget_open(self.key)
        if state is StepState.FAILED:
            j.failed_keys.add(self.key)
        raw = workspace.statements if workspace is not None else []
        if not self._has_row and not statements and not raw:
            j.defer(step_rows, message_rows, counters)  # nothing ran that needs protecting
            return
        j.commit(
            statements, step_rows=step_rows, message_rows=message_rows, counters=counters, raw=raw
        )
        if workspace is not None and workspace.committed is not None:
            workspace.committed()

    def _row(self, **values: Any) -> dict[str, Any]:
        j = self.journal
        row: dict[str, Any] = dict.fromkeys(STEP_COLUMNS)
        row.update(
            run_id=j.run_id,
            seq=self.seq,
            kind=self.kind,
            idempotency_key=self.key,
            call_id=self.call_id,
            tool_name=self.tool_name,
            input=self.input,
            attempts=self.attempts,
            started_at=self.started_at,
            turn=self.turn,
            effect=self.effect,
            lease_epoch=j.epoch,
        )
        row.update(values)
        return row

    # -- `with journal.step(...) as step:` ------------------------------------------------------
    def __enter__(self) -> Step:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # On an exception the row stays as it is (`started`): resume reconciles it. Leaving
        # the block normally without an outcome is a bug that would leave the step open.
        if kind is None and not self._ended:
            raise RuntimeError(f"step {self.key} left without complete() or fail()")


# A model step's output that holds a count to calibrate by (a script's never do), told in
# the database: the WHERE of the partial index ix_steps_counted (0016), written out the same
# way (a partial index serves a query whose WHERE has its terms as constants, not as bound
# parameters), so a resume finds the newest without reading every model step.
COUNTED_SQLITE = "output LIKE '%\"context\"%'"  # JSON text (a match is checked below)
COUNTED_POSTGRESQL = "jsonb_typeof(output -> 'context') = 'object'"


def calibrating_output(conn: Connection, done: tuple[Any, ...]) -> Any:
    """The output of the last completed model step whose prompt count the provider reported
    (the one a live run calibrates by): a step with estimated counts, or a script's, leaves
    the calibration as it was, live and on resume alike. Newest first, a page at a time
    (one row, unless its counts were estimated)."""
    before: int | None = None
    counted = text(COUNTED_POSTGRESQL if conn.dialect.name == "postgresql" else COUNTED_SQLITE)
    while True:
        query = select(steps.c.seq, steps.c.output).where(
            *done, steps.c.kind == StepKind.MODEL.value, counted
        )
        if before is not None:
            query = query.where(steps.c.seq < before)
        page = conn.execute(query.order_by(steps.c.seq.desc()).limit(64)).all()
        for _seq, output in page:
            usage = output.get("usage") if isinstance(output, dict) else None
            if (
                isinstance(usage, dict)
                and not usage.get("estimated")
                and isinstance(output.get("context"), dict)
            ):
                return output
        if len(page) < 64:
            return None
        before = page[-1][0]
