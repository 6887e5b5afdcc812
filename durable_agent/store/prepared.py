"""The hot path's statements, rendered once per dialect and run without a compile step.

Every step makes two checkpoints of the same few statements (the fence, a step row,
messages). Sent through Core, each execution rebuilds its parameters (`construct_params`,
processors, a result set-up) and that cost more CPU than SQLite's own work. A `Prepared`
statement is still built from the one schema (store/schema.py) and rendered by SQLAlchemy's
compiler for the dialect at hand; its bind processors (JSON, DateTime) are looked up once;
it runs on the DBAPI cursor of the SQLAlchemy connection, inside that connection's
transaction. Driver errors are wrapped as SQLAlchemy wraps them (`DBAPIError`, with
`connection_invalidated` and the connection invalidated on a disconnect), so the retry
policy (store/retrying.py) reads them the same. Everything else in the store stays Core.

SQLAlchemy's cursor events do not see these statements; the fault suites reach them
through `CURSOR_HOOKS` (durable_agent/store/faults.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from msgspec import Struct
from sqlalchemy import JSON, Connection, DateTime, String
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import TypeDecorator, TypeEngine

from durable_agent.store import retrying
from durable_agent.store.engine import SAME_FILE
from durable_agent.store.storable import has_bad_text, storable, storable_text

Processor = Callable[[Any], Any] | None
# Test hook (fault injection): called as hook("before" | "after", connection) around every
# prepared statement (on PostgreSQL, around each message). Empty in production.
CURSOR_HOOKS: list[Callable[[str, Connection], None]] = []
SEND_AT = 1 << 20  # characters of statements waiting (a snapshot's blobs) sent at once


class _Waiting(Struct):
    """Statements of an open PostgreSQL `transaction` not yet sent, bound into their text."""

    texts: list[str]
    size: int = 0

    def add(self, text: str) -> None:
        self.texts.append(text)
        self.size += len(text)

    def take(self, last: str | None) -> str:
        text = ";\n".join([*self.texts, last] if last else self.texts)
        self.texts.clear()
        self.size = 0
        return text


# By id() of the transaction's DBAPI connection (not on `conn.info`: reading that
# revalidates a connection invalidated by a disconnect).
_WAITING: dict[int, _Waiting] = {}
_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE (not imported: psycopg is optional)


class Rendered(Struct, frozen=True):
    """One statement for one dialect and one set of parameter names."""

    sql: str
    names: tuple[str, ...]  # parameter order for positional paramstyles (SQLite's qmark)
    processors: tuple[Processor, ...]  # in `names` order
    positional: bool

    def params(self, values: Mapping[str, Any]) -> tuple[Any, ...] | dict[str, Any]:
        # None is SQL NULL for every processor: a step row is mostly NULLs.
        out = [
            v if (v := values[n]) is None or p is None else p(v)
            for n, p in zip(self.names, self.processors, strict=True)
        ]
        return tuple(out) if self.positional else dict(zip(self.names, out, strict=True))


class Prepared:
    """A Core statement executed through its pre-rendered SQL.

    `keys`, when given, are the columns every execution sets (an INSERT of whole rows);
    otherwise the SET/VALUES columns are the parameters that are not bind names of the
    statement itself, and each distinct set of them is rendered once.
    """

    def __init__(self, statement: Executable, keys: Sequence[str] | None = None) -> None:
        self.statement = statement
        self.keys = tuple(keys) if keys is not None else None
        self._rendered: dict[tuple[str, tuple[str, ...]], Rendered] = {}

    def render(self, dialect: Dialect, keys: Iterable[str]) -> Rendered:
        column_keys = self.keys if self.keys is not None else tuple(sorted(keys))
        cache_key = (dialect.name, column_keys)
        found = self._rendered.get(cache_key)
        if found is None:
            found = self._rendered[cache_key] = _render(self.statement, dialect, column_keys)
        return found

    def run(self, conn: Connection, values: Mapping[str, Any]) -> Any:
        """Execute with one row of parameters; returns the DBAPI cursor (for RETURNING)."""
        rendered = self.render(conn.dialect, values.keys())
        return _execute(conn, rendered.sql, rendered.params(values), many=False)

    def run_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """One executemany for rows that all name the same columns."""
        if rows:
            rendered = self.render(conn.dialect, rows[0].keys())
            _execute(conn, rendered.sql, [rendered.params(r) for r in rows], many=True).close()


def fetch_one(conn: Connection, cursor: Any) -> Any:
    """The next row of the answer to the statement last run, on its cursor, the driver's
    errors wrapped as everywhere. On PostgreSQL inside `transaction` the statements waiting
    are sent first (see there): read an answer before running the next statement."""

    def call() -> Any:
        waiting = _WAITING.get(id(cursor.connection))
        if waiting is not None and waiting.texts:
            _send(conn, cursor.connection, cursor)
        return cursor.fetchone()

    return _driver_call(conn, "FETCH", call, cursor=cursor)


def fetch_all(conn: Connection, cursor: Any) -> list[Any]:
    """Every row of the answer, as fetch_one reads one."""

    def call() -> Any:
        waiting = _WAITING.get(id(cursor.connection))
        if waiting is not None and waiting.texts:
            _send(conn, cursor.connection, cursor)
        return cursor.fetchall()

    return list(_driver_call(conn, "FETCH", call, cursor=cursor))


def run_core(
    conn: Connection, statement: Executable, params: Mapping[str, Any] | Sequence[Mapping[str, Any]]
) -> Any:
    """A one-off Core statement (values of its own included; a list of rows for an
    executemany) in a `transaction`: compiled here, each time; for the rarer statements of
    a checkpoint (approvals, the run's end, workspace snapshots)."""
    rows = [params] if isinstance(params, Mapping) else list(params)
    if not rows:
        return None
    many = len(rows) > 1
    compiled = statement.compile(  # type: ignore[attr-defined]
        dialect=conn.dialect, column_keys=list(rows[0]), for_executemany=many
    )
    rendered = _render(statement, conn.dialect, tuple(rows[0]), compiled)
    values = [rendered.params(compiled.construct_params(r)) for r in rows]
    return _execute(conn, rendered.sql, values if many else values[0], many=many)


@contextmanager
def transaction(conn: Connection) -> Iterator[None]:
    """One write transaction on the DBAPI connection under `conn`: BEGIN (IMMEDIATE on
    SQLite: the write lock first, so the fence cannot be raced) ... COMMIT. Any exception
    rolls back (best effort: the connection may be dead) and propagates.

    On PostgreSQL every message is a round trip, so the statements are sent together: each
    one waits, bound into its text (engine._client_binding), until a statement's answer is
    read (the fence's: `fetch_one`) or the transaction commits, and then goes with those in
    one message; the BEGIN goes with the first, the COMMIT with the last. A checkpoint is
    then two round trips (BEGIN and the fence; the rows and COMMIT), as raw psycopg making
    one insert a commit needs. Statements waiting past SEND_AT characters (a snapshot's
    blobs) go at once, so neither the client's memory nor a message outgrows them by more
    than a row. Still one simple query a message, never pipeline mode: until a message has
    fully arrived the server sees the transaction idle, so one whose owner froze inside it,
    even halfway through sending, is ended once idle for as long as the lease
    (engine._end_idle_transactions), and the run's row lock goes with it. In pipeline mode,
    or with values sent apart from the statement, the server waits for the rest of a query
    that never comes, and no timeout ends that."""
    dbapi_conn = conn.connection.dbapi_connection
    assert dbapi_conn is not None
    together = conn.dialect.driver == "psycopg"  # psycopg 3 (another driver's mogrify differs)
    begin = together and dbapi_conn.info.transaction_status == _IDLE  # else it goes on as it is
    try:
        if together:
            if begin:  # our BEGIN travels with the first statements instead of alone (psycopg's)
                dbapi_conn.autocommit = True
            _WAITING[id(dbapi_conn)] = _Waiting(["BEGIN"] if begin else [])
        elif (
            conn.dialect.name == "sqlite"
        ):  # (other PostgreSQL drivers begin on the first statement)
            same_file = conn.connection.info.get(SAME_FILE)
            if same_file is not None:  # as engine.py's BEGIN: still the file it opened
                same_file.check(dbapi_conn)
            _driver_call(conn, "BEGIN IMMEDIATE", lambda: dbapi_conn.execute("BEGIN IMMEDIATE"))
        yield
        waiting = _WAITING.get(id(dbapi_conn))
        if waiting is None or not waiting.texts:
            _driver_call(conn, "COMMIT", dbapi_conn.commit)
        elif waiting.texts != ["BEGIN"]:  # (only a BEGIN waiting: nothing was begun)
            _driver_call(
                conn, "COMMIT", lambda: _send(conn, dbapi_conn, dbapi_conn.cursor(), "COMMIT")
            )
    except BaseException:
        with contextlib.suppress(Exception):
            dbapi_conn.rollback()
        raise
    finally:
        if together:
            _WAITING.pop(id(dbapi_conn), None)
            if begin:  # (should this be cut short, the pool's check-in sets it back: engine.py)
                with contextlib.suppress(
                    Exception
                ):  # a dead connection refuses: it is dropped anyway
                    dbapi_conn.autocommit = False


def _execute(conn: Connection, sql: str, params: Any, *, many: bool) -> Any:
    dbapi_conn = conn.connection.dbapi_connection
    assert dbapi_conn is not None
    cursor = (
        dbapi_conn.cursor()
    )  # on PostgreSQL a ClientCursor: values bound into the text (engine.py)
    waiting = _WAITING.get(id(dbapi_conn)) if _WAITING else None
    if waiting is not None:  # inside `transaction`: sent with the next answer read, or the COMMIT

        def bind() -> None:
            for row in params if many else (params,):
                waiting.add(cursor.mogrify(sql, row))
                if waiting.size > SEND_AT:  # large rows go now: the client's memory stays bounded
                    _send(conn, dbapi_conn, cursor)

        _driver_call(conn, sql, bind, params, cursor)
        return cursor

    def call() -> None:
        for hook in CURSOR_HOOKS:  # the fault hooks see each statement sent
            hook("before", conn)
        if many and conn.dialect.name == "postgresql":
            for row in params:  # psycopg's own executemany pipelines (see engine.py)
                cursor.execute(sql, row)
        elif many:
            cursor.executemany(sql, params)
        else:
            cursor.execute(sql, params)
        for hook in CURSOR_HOOKS:
            hook("after", conn)

    _driver_call(conn, sql, call, params, cursor)
    return cursor


def _send(conn: Connection, dbapi_conn: Any, cursor: Any, last: str | None = None) -> None:
    """PostgreSQL inside `transaction`: the statements waiting (and `last`) in one message,
    `cursor` left on the answer of the last."""
    text = _WAITING[id(dbapi_conn)].take(last)
    for hook in CURSOR_HOOKS:  # the fault hooks see each message sent
        hook("before", conn)
    cursor.execute(text)
    while cursor.nextset():
        pass
    for hook in CURSOR_HOOKS:
        hook("after", conn)


def _driver_call(
    conn: Connection, sql: str, call: Callable[[], Any], params: Any = None, cursor: Any = None
) -> Any:
    dialect = conn.dialect
    try:
        return call()
    except dialect.loaded_dbapi.Error as exc:
        # As Connection._handle_dbapi_exception does: a dead connection is invalidated (the
        # pool will not hand it out again) and the wrapper says so.
        disconnect = bool(
            dialect.is_disconnect(exc, conn.connection.dbapi_connection, cursor)
        ) or retrying.connection_lost(exc)
        if disconnect and not conn.invalidated:
            conn.invalidate(exc)
        raise DBAPIError.instance(
            sql,
            params,
            exc,
            dialect.loaded_dbapi.Error,
            connection_invalidated=disconnect,
            dialect=dialect,
        ) from exc


def _render(
    statement: Executable, dialect: Dialect, column_keys: tuple[str, ...], compiled: Any = None
) -> Rendered:
    # for_executemany: no implicit RETURNING of generated ids (PostgreSQL), which nothing reads.
    compiled = compiled or statement.compile(  # type: ignore[attr-defined]
        dialect=dialect, column_keys=list(column_keys), for_executemany=True
    )
    assert isinstance(compiled, SQLCompiler)
    positional = bool(compiled.positional)
    # The names as rendered in the SQL (anonymous binds, e.g. a literal in .values(), get
    # theirs here, as construct_params() spells them).
    by_name = {name: bind for bind, name in compiled.bind_names.items()}
    names = tuple(compiled.positiontup or ()) if positional else tuple(by_name)
    return Rendered(
        sql=compiled.string,
        names=names,
        positional=positional,
        processors=tuple(_processor(by_name[n].type, dialect) for n in names),
    )


def _processor(kind: TypeEngine[Any], dialect: Dialect) -> Processor:
    """What turns a value into the driver's parameter, the store-boundary rule included
    (store/storable.py): text is cleaned, JSON is written as checked JSON text, and the rest
    goes through the processor Core would apply (SQLite's DateTime strings)."""
    if isinstance(kind, TypeDecorator):  # schema.JsonColumn: JSON, jsonb on PostgreSQL
        kind = kind.impl_instance
    if isinstance(kind, JSON):
        return json_text
    if isinstance(kind, String):
        return _text
    core = kind.dialect_impl(dialect).bind_processor(dialect)
    if core is not None and dialect.name == "sqlite" and isinstance(kind, DateTime):
        return _sqlite_datetime(core)
    return core


def _sqlite_datetime(core: Callable[[Any], Any]) -> Processor:
    """SQLite's DateTime text, as Core's processor writes it ("2026-11-30 12:34:56.789012"):
    for a naive datetime that is isoformat's, made in C (ten of them per step)."""

    def process(value: Any) -> Any:
        if type(value) is datetime and value.tzinfo is None:
            return value.isoformat(" ", "microseconds")
        return core(value)

    return process


def _text(value: Any) -> Any:
    return storable_text(value) if type(value) is str else storable(value)


def json_text(value: Any) -> str | None:
    """`value` as JSON text both dialects accept (None is SQL NULL).

    One C-level dump and one scan instead of a walk in Python: only a value that fails it
    (NaN, bytes, a NUL or lone surrogate somewhere inside) takes the slow path, `storable`.
    """
    if value is None:
        return None
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        text = None
    # JSON writes NUL as the escape \u0000, which jsonb refuses like the character itself
    # (a literal backslash-u0000 in a string matches too: the slow path just leaves it be).
    if text is None or has_bad_text(text) or "\\u0000" in text:
        text = json.dumps(storable(value), ensure_ascii=False, allow_nan=False, default=str)
    return text
