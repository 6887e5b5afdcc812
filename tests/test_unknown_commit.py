"""A checkpoint whose COMMIT went through but whose answer was lost (the connection died
between the server's commit and the client's reading of it) is settled by reading the
checkpoint back, never by writing it twice (issue 10, item 2).

At each checkpoint of a small run in turn, on both stores: the real COMMIT runs, then the
client sees the connection fail (PostgreSQL: its backend is really terminated; SQLite:
the driver's "disk I/O error"). The run must go on in the same session and end as an
uninterrupted run does: every command once, no step or message written twice.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Result
from sqlalchemy import Connection, text

from durable_agent.store import faults as fault_injection
from durable_agent.store import prepared
from durable_agent.store.engine import open_store_engine

SCRIPT = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "one\n"}}]},
    {
        "tool_calls": [
            {
                "name": "run_command",
                "arguments": {"command": "echo $DURABLE_AGENT_CALL_ID >> ledger"},
            }
        ]
    },
    {
        "tool_calls": [
            {"name": "read_file", "arguments": {"path": "a.txt"}},
            {
                "name": "edit_file",
                "arguments": {"path": "a.txt", "old_string": "one", "new_string": "two"},
            },
        ]
    },
    {"content": "done"},
]


def lose_the_answer(conn: Connection) -> None:
    """After a real COMMIT: the client loses the connection before it hears the outcome."""
    if conn.dialect.name == "postgresql":
        import psycopg

        fault_injection._terminate(conn)
        raise psycopg.OperationalError(
            "consuming input failed: server closed the connection unexpectedly"
        )
    error = sqlite3.OperationalError("disk I/O error")
    error.sqlite_errorname = "SQLITE_IOERR"
    raise error


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], list[int]]:
    """Count the run's COMMITs; the `at`-th one lands, then its answer is lost."""

    def arm(at: int) -> list[int]:
        seen = [0, 0]  # commits, faults
        original = prepared._driver_call
        me = threading.current_thread()

        def driver_call(
            conn: Connection,
            sql: str,
            call: Callable[[], Any],
            params: Any = None,
            cursor: Any = None,
        ) -> None:
            if sql != "COMMIT" or threading.current_thread() is not me:
                return original(conn, sql, call, params, cursor)
            seen[0] += 1
            if seen[0] != at:
                return original(conn, sql, call, params, cursor)

            def landed_then_lost() -> None:
                call()
                seen[1] += 1
                lose_the_answer(conn)

            return original(conn, sql, landed_then_lost, params, cursor)

        monkeypatch.setattr(prepared, "_driver_call", driver_call)
        return seen

    return arm


def rows(url: str, statement: str) -> list[Any]:
    engine = open_store_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(statement))]
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "every", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["some", "every"]
)
def test_a_commit_whose_answer_was_lost_is_read_back_not_written_twice(
    every: bool,
    store_url: str,
    cli_inproc: Callable[..., Result],
    write_script: Callable[..., str],
    commits: Callable[[int], list[int]],
    tmp_path: Path,
    env: dict[str, str],
) -> None:
    model = write_script(SCRIPT)

    def one(at: int, run_id: str) -> tuple[list[int], Path]:
        ws = tmp_path / run_id
        ws.mkdir()
        seen = commits(at)
        r = cli_inproc(
            "start",
            "t",
            "--model",
            model,
            "--shell",
            "allow",
            "--run-id",
            run_id,
            "--workspace",
            str(ws),
            "--db",
            store_url,
            "--quiet",
        )
        assert r.code == 0, (at, r.stderr)  # settled in place: the run never stopped
        return seen, ws

    (total, _), reference = one(0, "ref")
    assert total > 5
    places = (
        range(1, total + 1) if every else (1, total // 2, total)
    )  # the fast lane: first, middle, last
    for at in places:
        run_id = f"r{at}"
        seen, ws = one(at, run_id)
        assert seen == [total, 1], (at, seen)  # the same checkpoints, one answer lost
        assert (ws / "a.txt").read_text() == "two\n"
        assert Counter((ws / "ledger").read_text().split()) == Counter(["call_1_0"])  # once
        where = f"run_id = '{run_id}'"
        assert rows(store_url, f"SELECT status FROM runs WHERE id = '{run_id}'") == [("completed",)]
        assert (
            rows(
                store_url,
                f"SELECT idempotency_key FROM steps WHERE {where} GROUP BY idempotency_key "
                "HAVING COUNT(*) > 1",
            )
            == []
        )
        assert rows(store_url, f"SELECT COUNT(*) FROM steps WHERE {where}") == rows(
            store_url, "SELECT COUNT(*) FROM steps WHERE run_id = 'ref'"
        )
        assert rows(
            store_url, f"SELECT role, content FROM messages WHERE {where} ORDER BY seq"
        ) == rows(store_url, "SELECT role, content FROM messages WHERE run_id = 'ref' ORDER BY seq")
        (run,) = rows(
            store_url,
            f"SELECT step_count, tool_call_count, message_count FROM runs WHERE id = '{run_id}'",
        )
        assert run == (4, 4, len(rows(store_url, f"SELECT seq FROM messages WHERE {where}")))
    print(
        f"{store_url.split(':')[0]}: {total} checkpoints, {len(places)} commits with a lost answer, "
        f"{len(places)} runs completed in place, 0 duplicates"
    )
