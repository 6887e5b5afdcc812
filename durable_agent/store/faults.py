"""Real faults on purpose, for the crash and fault suites and for `durable-agent demo`.

Nothing in the loop or the journal knows about this module: `install` hangs hooks on the
journal's commit boundaries and on SQLAlchemy's statement execution, and the CLI calls it
only when one of these variables is set (the demo's crashing child sets the first):

    DURABLE_AGENT_CRASH_AFTER=N        SIGKILL this process at the N-th checkpoint boundary
                                       (each checkpoint has two: its statements ran but
                                       are not committed; it is committed)
    DURABLE_AGENT_STOP_AFTER=N         SIGSTOP this process at the N-th checkpoint boundary (a
                                       frozen owner: an odd N freezes it inside the checkpoint's
                                       transaction, its locks held)
    DURABLE_AGENT_NOTIFY_CRASH=POINT   SIGKILL this process when its notification deliverer
                                       has claimed a row (`claimed`) or the target accepted
                                       it, not yet marked delivered (`posted`)
    DURABLE_AGENT_FAULT_AT=N           at the N-th statement the run's thread executes:
    DURABLE_AGENT_FAULT=KIND             terminate   PostgreSQL: kill this connection's server
                                                     backend (pg_terminate_backend) right after
                                                     the statement, so the next one finds it dead
                                         io_error    SQLite: the statement fails with
                                                     "disk I/O error" (SQLITE_IOERR)
                                         full        SQLite: "database or disk is full"
                                         locked      SQLite: "database is locked"
    DURABLE_AGENT_FAULT_REPEAT=K       the fault hits K statements in a row (default 1): a
                                       store that stays away longer than the retries last
    DURABLE_AGENT_FAULT_LOG=PATH       append "fault N" for each fault injected and, at exit,
                                       "statements N": how many the run's thread executed

Only the thread that drives the run counts statements (heartbeats run on their own clock),
so the N-th statement is the same one in every run of the same script.
"""

from __future__ import annotations

import atexit
import os
import signal
import sqlite3
import threading
from collections.abc import Mapping
from typing import Any

_SQLITE_ERRORS = {
    "io_error": ("disk I/O error", "SQLITE_IOERR"),
    "full": ("database or disk is full", "SQLITE_FULL"),
    "locked": ("database is locked", "SQLITE_BUSY"),
}


def install(env: Mapping[str, str]) -> None:
    crash = env.get("DURABLE_AGENT_CRASH_AFTER", "")
    if crash.isdigit():
        _signal_after(int(crash), signal.SIGKILL)
    stop = env.get("DURABLE_AGENT_STOP_AFTER", "")
    if stop.isdigit():
        _signal_after(int(stop), signal.SIGSTOP)
    notify = env.get("DURABLE_AGENT_NOTIFY_CRASH", "")
    if notify in ("claimed", "posted"):
        _crash_at_notify(notify)
    at = env.get("DURABLE_AGENT_FAULT_AT", "")
    if at.isdigit():
        kind = env.get("DURABLE_AGENT_FAULT", "terminate")
        repeat = env.get("DURABLE_AGENT_FAULT_REPEAT", "1")
        _statement_fault(
            int(at),
            kind,
            int(repeat) if repeat.isdigit() else 1,
            env.get("DURABLE_AGENT_FAULT_LOG"),
        )


def _signal_after(n: int, signum: int) -> None:
    from durable_agent.store.journal import BOUNDARY_HOOKS

    ticks = [0]

    def boundary(_where: str) -> None:
        ticks[0] += 1
        if ticks[0] == n:
            os.kill(os.getpid(), signum)

    BOUNDARY_HOOKS.append(boundary)


def _crash_at_notify(point: str) -> None:
    """SIGKILL when the deliverer reaches `point`: "claimed" (nothing sent) or "posted"
    (the target has it, not yet marked delivered)."""
    from durable_agent.store.outbox import NOTIFY_HOOKS

    def hook(where: str) -> None:
        if where == point:
            os.kill(os.getpid(), signal.SIGKILL)

    NOTIFY_HOOKS.append(hook)


def _statement_fault(at: int, kind: str, repeat: int, log: str | None) -> None:
    from sqlalchemy import Engine, event

    from durable_agent.store.prepared import CURSOR_HOOKS

    count = [0]
    main = threading.main_thread()

    def note(line: str) -> None:
        if log:
            with open(log, "a") as f:
                f.write(line + "\n")

    def hit() -> bool:
        if threading.current_thread() is not main:
            return False
        count[0] += 1
        if at <= count[0] < at + repeat:
            note(f"fault {count[0]}")
            return True
        return False

    atexit.register(lambda: note(f"statements {count[0]}"))

    # Every statement: Core's (cursor events) and the journal's prepared ones (their hook).
    if kind == "terminate":

        def after(conn: Any, *_: Any) -> None:
            if conn.dialect.name == "postgresql" and hit():
                _terminate(conn)

        event.listen(Engine, "after_cursor_execute", after)
        CURSOR_HOOKS.append(lambda when, conn: after(conn) if when == "after" else None)
        return
    message, name = _SQLITE_ERRORS[kind]

    def before(conn: Any, *_: Any) -> None:
        if conn.dialect.name == "sqlite" and hit():
            error = sqlite3.OperationalError(message)
            error.sqlite_errorname = name
            raise error

    # Raised as the driver's own error: SQLAlchemy (or prepared.py) wraps it like a real one.
    event.listen(Engine, "before_cursor_execute", before)
    CURSOR_HOOKS.append(lambda when, conn: before(conn) if when == "before" else None)


def _terminate(conn: Any) -> None:
    """Kill the server side of `conn` from a second connection: a real dropped connection."""
    import psycopg

    pid = conn.connection.dbapi_connection.info.backend_pid
    url = conn.engine.url.set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as side:
        side.execute("SELECT pg_terminate_backend(%s)", (pid,))
