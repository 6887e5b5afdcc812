"""What a resume reads does not grow with the run (issue 40, target 5: a 10,000-step run
resumes in ≤ 100 ms after imports; docs/performance.md "Long runs").

Not a timing test: the statements a resume's load and rebuild send, and the rows they read
besides the messages its requests send (the view after the last summary) and the summaries'
own outputs, are counted on two runs of different lengths and must be the same. The totals
and the answered call ids of the messages a summary replaced are counted and looked up in
the database (store/journal.py `_history`, `Journal.answered_before`), not read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event

from durable_agent.config.settings import Settings
from durable_agent.loop.runner import Runner
from durable_agent.models.scripted import ScriptedModel
from durable_agent.redact import Redactor
from durable_agent.store.engine import open_store_engine
from durable_agent.store.journal import Journal
from durable_agent.store.rows import GONE
from durable_agent.store.runs import Store
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
