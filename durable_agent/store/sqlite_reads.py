"""`list` and `show` on an SQLite store through the standard library's `sqlite3`.

Those two commands are what people type most, often in a loop; through SQLAlchemy they
cost its import (about ten times a bare interpreter) before the first row. Here the same
rows are read with plain SQL on the same tables, converted as SQLAlchemy converts them
(the kinds of columns below; a test holds them equal to store/schema.py), into the same
records (store/records.py), for the same renderers.

Only the plain case is answered here. Anything else returns None, and the command goes
the whole way (store/runs.py), which answers or refuses in its own words: another
database, a store file that is missing (it is created there), not a regular file, not at
this version's schema revision, locked or unreadable, an id that is not found or is
ambiguous, or a value that SQLAlchemy would read in another way (a hand-edited row).
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from durable_agent.store.location import sqlite_file, sqlite_target
from durable_agent.store.records import ApprovalRecord, RunRecord, StepRecord
from durable_agent.store.revision import HEAD_REVISION, MAX_RUN_ID_PREFIX
from durable_agent.store.storable import is_utf8, lenient_text, read_json

R = TypeVar("R", RunRecord, StepRecord, ApprovalRecord)
T = TypeVar("T")

# The tables' columns, as SQLAlchemy selects them (a test holds them equal to store/schema.py):
# a store missing one is refused the whole way ("no such column"), so it is here too.
COLUMNS = {
    "runs": (
        "id",
        "task",
        "workspace",
        "model",
        "status",
        "stop_reason",
        "answer",
        "error",
        "created_at",
        "updated_at",
        "finished_at",
        "step_count",
        "tool_call_count",
        "prompt_tokens",
        "completion_tokens",
        "lease_owner",
        "lease_expires_at",
        "lease_epoch",
        "cancel_requested",
        "settings",
        "message_count",
        "active_ms",
        "resume_count",
        "last_checkpoint",
        "tool_sources",
        "forked_from",
        "fork_seq",
        "tree_start",
        "version_key",
        "batch_id",
        "priority",
        "queue_key",
        "cached_tokens",
        "cost",
        "trace_id",
        "parent_id",
        "parent_step",
    ),
    "steps": (
        "id",
        "run_id",
        "seq",
        "kind",
        "state",
        "idempotency_key",
        "call_id",
        "tool_name",
        "input",
        "output",
        "error",
        "attempts",
        "prompt_tokens",
        "completion_tokens",
        "started_at",
        "finished_at",
        "duration_ms",
        "turn",
        "effect",
        "pgid",
        "lease_epoch",
        "tree_before",
        "tree_id",
        "cached_tokens",
        "cost",
    ),
    "approvals": (
        "id",
        "run_id",
        "call_id",
        "step_seq",
        "kind",
        "tool_name",
        "command",
        "reason",
        "requested_at",
        "decision",
        "decided_by",
        "decided_at",
        "used_at",
        "restore_workspace",
    ),
}
# Columns that SQLAlchemy converts as it reads them (the rest come as sqlite3 gives them).
DATETIME_COLUMNS = {
    "runs": ("created_at", "updated_at", "finished_at", "lease_expires_at"),
    "steps": ("started_at", "finished_at"),
    "approvals": ("requested_at", "decided_at", "used_at"),
}
JSON_COLUMNS = {"runs": ("settings", "tool_sources"), "steps": ("input", "output"), "approvals": ()}
BOOLEAN_COLUMNS = {"runs": ("cancel_requested",), "steps": (), "approvals": ("restore_workspace",)}

# The text the store writes for a DateTime (store/prepared.py, Core's SQLite processor).
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{6})?")
# A failed read waits this long for a lock, then the whole way (with its retry policy) takes over.
_BUSY_TIMEOUT_S = 0.5


class _Unusual(Exception):
    """A value or a state this module leaves to the whole way."""


def list_runs(db: str, *, status: str | None, limit: int) -> list[RunRecord] | None:
    where, params = ("WHERE status = ? ", (status,)) if status else ("", ())
    return _read(
        db,
        lambda conn: _records(
            conn,
            RunRecord,
            "runs",
            f"{where}ORDER BY created_at DESC, id DESC LIMIT ?",
            (*params, limit),
        ),
    )


def show(db: str, prefix: str) -> tuple[RunRecord, list[StepRecord], list[ApprovalRecord]] | None:
    """The run with this id (or unique prefix of one), its steps and its approvals."""

    def query(conn: sqlite3.Connection) -> tuple[RunRecord, list[StepRecord], list[ApprovalRecord]]:
        run_id = _find_run_id(conn, prefix)
        runs = _records(conn, RunRecord, "runs", "WHERE id = ?", (run_id,))
        if len(runs) != 1:
            raise _Unusual
        steps = _records(conn, StepRecord, "steps", "WHERE run_id = ? ORDER BY seq", (run_id,))
        approvals = _records(
            conn, ApprovalRecord, "approvals", "WHERE run_id = ? ORDER BY id", (run_id,)
        )
        return runs[0], steps, approvals

    return _read(db, query)


def _read(db: str, query: Callable[[sqlite3.Connection], T]) -> T | None:
    """`query` in one read transaction on the store's file, or None when this module leaves it."""
    target, file = sqlite_target(db), sqlite_file(db)
    if target is None or file is None or target[1]:  # another database, in memory, URL options
        return None
    if not is_utf8(db):
        return None  # the whole way refuses such a name in one line
    if "://" in db:
        scheme, _, rest = db.partition("://")
        if scheme not in ("sqlite", "sqlite+pysqlite") or not rest.startswith("/"):
            return None  # another driver (loaded or refused the whole way), a host or user part
    try:
        if not stat.S_ISREG(os.stat(file).st_mode) or os.path.getsize(file) == 0:
            return None
        conn = _connect(Path(file))
    except (OSError, ValueError, sqlite3.Error):
        return None
    try:
        conn.text_factory = lenient_text
        conn.execute("BEGIN")  # one snapshot for every query of the command
        if conn.execute("SELECT version_num FROM alembic_version").fetchall() != [(HEAD_REVISION,)]:
            return None  # a new store, an older one (the whole way upgrades it) or a newer one
        return query(conn)
    except (_Unusual, sqlite3.Error, ValueError, TypeError):
        return None
    finally:
        conn.close()


def _connect(file: Path) -> sqlite3.Connection:
    """mode=rw: never create the file (the whole way makes a new store, with its schema). A
    store we may not write is opened read-only; on a read-only filesystem (a backup, a
    snapshot) where SQLite cannot create the WAL's -shm, `immutable`: true there, as nobody
    can write it through this mount (a writer elsewhere leaves its -shm, and mode=ro reads it)."""

    def connect(query: str) -> sqlite3.Connection:
        return sqlite3.connect(
            f"{file.as_uri()}?{query}", uri=True, timeout=_BUSY_TIMEOUT_S, isolation_level=None
        )

    if os.access(file, os.W_OK) and os.access(file.parent, os.W_OK):
        return connect("mode=rw")
    conn = connect("mode=ro")
    try:
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except sqlite3.OperationalError:
        conn.close()
        if not os.statvfs(file.parent).f_flag & os.ST_RDONLY:
            raise
    return connect("mode=ro&immutable=1")


def _find_run_id(conn: sqlite3.Connection, prefix: str) -> str:
    """As Store.find_run_id, for a run that is found; anything else is the whole way's to say."""
    if not prefix or len(prefix) > MAX_RUN_ID_PREFIX:
        raise _Unusual
    prefix.encode("utf-8")  # UnicodeEncodeError (a ValueError) for an id no row can hold
    if conn.execute("SELECT 1 FROM runs WHERE id = ?", (prefix,)).fetchone():
        return prefix
    # As SQLAlchemy's startswith(autoescape=True): '/' escapes the pattern's own characters.
    pattern = prefix.replace("/", "//").replace("%", "/%").replace("_", "/_") + "%"
    ids = conn.execute(
        "SELECT id FROM runs WHERE id LIKE ? ESCAPE '/' LIMIT 3", (pattern,)
    ).fetchall()
    if len(ids) != 1 or type(ids[0][0]) is not str:
        raise _Unusual  # not found, or ambiguous: the whole way says which
    return str(ids[0][0])


def _records(
    conn: sqlite3.Connection, record: type[R], table: str, clauses: str, params: tuple[Any, ...]
) -> list[R]:
    """`record`s of the rows of `table` that `clauses` (WHERE ... ORDER BY ... LIMIT) pick."""
    names = COLUMNS[table]
    cursor = conn.execute(f"SELECT {', '.join(names)} FROM {table} {clauses}", params)
    converters = [_converter(table, n) for n in names]
    return [
        record.from_row(
            {n: v if c is None else c(v) for n, c, v in zip(names, converters, values, strict=True)}
        )
        for values in cursor
    ]


def _converter(table: str, column: str) -> Any:
    if column in DATETIME_COLUMNS[table]:
        return _datetime
    if column in JSON_COLUMNS[table]:
        return _json
    if column in BOOLEAN_COLUMNS[table]:
        return _boolean
    return None


def _datetime(value: Any) -> datetime | None:
    if value is None:
        return None
    if type(value) is not str or not _DATETIME.fullmatch(value):
        raise _Unusual
    return datetime.fromisoformat(value)


def _json(value: Any) -> Any:
    """As store/engine.py's reader: storable JSON, or the text itself when it is not JSON.
    A bare number is kept by SQLite as a number (the JSON column's NUMERIC affinity), and
    SQLAlchemy gives it as it is: so does this."""
    if value is None:
        return None
    if type(value) in (int, float):
        return value
    if type(value) is not str:
        raise _Unusual
    return read_json(value)


def _boolean(value: Any) -> bool | None:
    if value is None:
        return None
    if type(value) is not int:
        raise _Unusual
    return bool(value)
