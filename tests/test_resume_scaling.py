"""What a resume reads does not grow with the run (issue 40, target 5: a 10,000-step run
resumes in ≤ 100 ms after imports; docs/performance.md "Long runs").

Not a timing test: the statements a resume's load and rebuild send, and the rows they read
besides the messages its requests send (the view after the last summary) and the summaries'
own outputs, are counted on two runs of different lengths and must be the same. The totals
and the answered call ids of the messages a summary replaced are counted and looked up in
the database (store/journal.py `_history`, `Journal.answered_before`), not read."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, insert

from durable_agent.config.settings import Settings
from durable_agent.loop.runner import Runner
from durable_agent.models.scripted import ScriptedModel
from durable_agent.redact import Redactor
from durable_agent.store.blobs import _tree_at, tree_at
from durable_agent.store.engine import open_store_engine
from durable_agent.store.journal import Journal
from durable_agent.store.rows import GONE
from durable_agent.store.runs import Store
from durable_agent.store.schema import runs
from durable_agent.store.schema import steps as steps_table
from durable_agent.tools import build_tools


class Reads:
    """Statements sent and rows fetched through an engine (SQLite: each row made by the
    connection's row factory; PostgreSQL: a SELECT's rowcount)."""

    def __init__(self, engine: Engine) -> None:
        self.statements = 0
        self.rows = 0
        event.listen(engine, "connect", self._connect)
        event.listen(engine, "after_cursor_execute", self._executed)
        engine.dispose()  # the connections opening the store made: new ones count their rows

    def _connect(self, dbapi_conn: Any, _record: Any) -> None:
        if type(dbapi_conn).__module__.startswith("sqlite3"):
            dbapi_conn.row_factory = self._row

    def _row(self, _cursor: Any, row: tuple[Any, ...]) -> tuple[Any, ...]:
        self.rows += 1
        return row

    def _executed(self, conn: Any, cursor: Any, *_: Any) -> None:
        self.statements += 1
        if conn.dialect.name == "postgresql" and cursor.description is not None:
            self.rows += max(cursor.rowcount, 0)


def script(reads: int) -> list[dict[str, Any]]:
    turns = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt", "offset": i % 3}}]}
        for i in range(reads)
    ]
    return [*turns, {"content": "done"}]


def resumed_reads(store_url: str, ws: Path, reads: int) -> tuple[int, int, int, int]:
    """A run of `reads` tool steps, compacted as it goes; then what a resume's load and
    rebuild (Runner.context) read: (statements, other rows, messages not read, answered
    calls counted in the store)."""
    engine = open_store_engine(store_url)
    reading = Reads(engine)
    settings = Settings(
        workspace=ws,
        model="scripted:scale",
        db=store_url,
        max_steps=reads + 10,
        max_repeats=reads + 10,
        shell="deny",
        sandbox="off",
        max_context_tokens=3000,
    )
    runner = Runner(
        store=Store(engine),
        settings=settings,
        model=ScriptedModel(script(reads), "scripted:scale"),
        tools=build_tools("deny"),
        env={},
        redactor=Redactor.from_env({}),
    )
    run_id = runner.create("read it")
    assert runner.execute(run_id).status == "completed"
    before = (reading.statements, reading.rows)
    journal = Journal(engine, run_id, "nobody", 0, 30)
    ctx = runner.context(journal, 0.0)
    loaded_messages = [m for m in ctx.state.messages if m is not GONE]
    compactions = ctx.state.view.compactions
    statements, rows = reading.statements - before[0], reading.rows - before[1]
    gone = len(ctx.state.messages) - len(loaded_messages)
    journal.close()
    engine.dispose()
    return statements, rows - len(loaded_messages) - compactions, gone, ctx.state.tool_call_count


@pytest.mark.slow
def test_what_a_resume_reads_does_not_grow_with_the_run(store_url: str, tmp_path: Path) -> None:
    measured = []
    for reads in (40, 120):
        ws = tmp_path / f"ws{reads}"
        ws.mkdir()
        (ws / "a.txt").write_text("".join(f"line {i} of a file read again\n" for i in range(60)))
        url = store_url
        if url.startswith("sqlite"):
            url = f"sqlite:///{tmp_path / f'store{reads}.db'}"
        measured.append(resumed_reads(url, ws, reads))
    (short, short_rows, short_gone, short_calls), (long, long_rows, long_gone, long_calls) = (
        measured
    )
    assert (short_calls, long_calls) == (40, 120)  # counted, though most were not read
    assert long_gone > short_gone + 100  # the longer run left many more messages unread
    assert long == short, "statements"
    assert long_rows == short_rows, "rows besides the view's messages and the summaries"


def _steps_with_trees(engine: Engine, run_id: str, steps_in_run: int) -> None:
    """A run of `steps_in_run` steps of which only the tenth and a middle one recorded a
    tree (a model call or a file read records none)."""
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(
            insert(runs).values(
                id=run_id,
                task="t",
                workspace="/w",
                model="m",
                status="running",
                created_at=now,
                updated_at=now,
            )
        )
        rows = []
        for seq in range(steps_in_run):
            rows.append(
                {
                    "run_id": run_id,
                    "seq": seq,
                    "kind": "tool",
                    "state": "completed",
                    "idempotency_key": f"k{seq}",
                    "started_at": now,
                    "tree_before": "a" * 64 if seq in (10, steps_in_run // 2) else None,
                    "tree_id": "b" * 64 if seq == steps_in_run // 2 else None,
                }
            )
        conn.execute(insert(steps_table), rows)
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("ANALYZE steps")


def test_the_last_tree_is_found_without_reading_every_step(store_url: str) -> None:
    # A resume's drift check (and restore, fork, diff) asks for the run's last tree:
    # before 0018's ix_steps_trees, a run of steps that record none (model calls, reads)
    # was read backwards step by step, twice (14 ms of a 10,000-step resume).
    engine = open_store_engine(store_url)
    _steps_with_trees(engine, "long", 3000)
    sent: list[tuple[str, Any]] = []

    def note(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "FROM steps" in statement:
            sent.append((statement, params))

    event.listen(engine, "before_cursor_execute", note)
    found = tree_at(engine, "long")
    assert found is not None and (found.tree, found.seq, found.after) == ("b" * 64, 1500, True)
    # Below the first step with a tree: the first `tree_before`, the second lookup.
    first = tree_at(engine, "long", seq=5)
    assert first is not None and (first.tree, first.seq, first.after) == ("a" * 64, 10, False)
    event.remove(engine, "before_cursor_execute", note)
    assert len(sent) == 3  # the last; the last at or below 5 (none); the first
    with engine.connect() as conn:
        for statement, params in sent:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("SET enable_seqscan = off")
                plan = conn.exec_driver_sql("EXPLAIN " + statement, params).fetchall()
            else:
                plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params).fetchall()
            assert "ix_steps_trees" in str(plan), (statement, plan)
    engine.dispose()


def test_the_tree_lookup_reads_the_same_however_long_the_run() -> None:
    # What SQLite executes for the lookups (its virtual machine's instructions, counted by
    # a progress handler called at each one) is the same for a run of 100 steps and one
    # of 5,000: the steps that record no tree are not visited.
    import sqlite3
    import tempfile

    counts = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (100, 5000):
            engine = open_store_engine(f"sqlite:///{tmp}/s{n}.db")
            _steps_with_trees(engine, f"r{n}", n)
            ops = [0]

            def tick(ops: list[int] = ops) -> int:
                ops[0] += 1
                return 0

            with engine.connect() as conn:
                raw = conn.connection.driver_connection
                assert isinstance(raw, sqlite3.Connection)
                raw.set_progress_handler(tick, 1)
                try:
                    assert _tree_at(conn, f"r{n}", [steps_table.c.run_id == f"r{n}"]) is not None
                    assert (
                        _tree_at(
                            conn,
                            f"r{n}",
                            [steps_table.c.run_id == f"r{n}", steps_table.c.seq <= 5],
                        )
                        is not None
                    )
                finally:
                    raw.set_progress_handler(None, 1)
            counts.append(ops[0])
            engine.dispose()
    assert counts[0] == counts[1], counts
