"""The checkpoint's hot path below Core (store/prepared.py), on both dialects: what it writes
reads back through Core exactly as Core would have written it, driver errors come out as
SQLAlchemy's (so the retry policy classifies them the same), and a failed transaction
leaves nothing behind."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scale_helpers import wait_for
from sqlalchemy import Engine, bindparam, insert, select, update
from sqlalchemy.exc import DBAPIError

from durable_agent.messages import Message
from durable_agent.store import prepared, retrying
from durable_agent.store.engine import open_store_engine
from durable_agent.store.prepared import Prepared
from durable_agent.store.runs import Store
from durable_agent.store.schema import messages, runs, steps
from durable_agent.store.step import STEP_COLUMNS

WHEN = datetime(2026, 11, 30, 12, 34, 56, 789012)


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    e = open_store_engine(store_url)
    Store(e).create_run(
        "r",
        task="t",
        workspace="/w",
        model="m",
        settings={},
        first_messages=[Message("system", "s")],
    )
    yield e
    e.dispose()


def step_row(seq: int, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(STEP_COLUMNS)
    row.update(
        run_id="r",
        seq=seq,
        kind="model",
        state="started",
        idempotency_key=f"k{seq}",
        attempts=1,
        started_at=WHEN,
        **values,
    )
    return row


def test_prepared_rows_read_back_as_core_wrote_them(engine: Engine) -> None:
    nasty = {
        "text": "a\x00b\ud800c",
        "nan": float("nan"),
        "bytes": b"\xff\x00",
        "deep": [{"k": "\udcff"}],
    }
    with engine.connect() as conn, prepared.transaction(conn):
        Prepared(insert(steps), keys=STEP_COLUMNS).run_many(
            conn,
            [
                step_row(0, input={"a": [1, "é", None]}, output=None, error="plain"),
                step_row(1, input=nasty, error="nul\x00here"),
            ],
        )
        Prepared(
            update(steps).where(
                steps.c.run_id == bindparam("b_run"), steps.c.seq == bindparam("b_seq")
            )
        ).run(conn, {"b_run": "r", "b_seq": 0, "state": "completed", "finished_at": WHEN})
        # A one-off statement with a literal of its own (an anonymous bind).
        prepared.run_core(
            conn, update(runs).where(runs.c.id == "r").values(answer="done\x00"), {}
        ).close()
    with engine.connect() as conn:
        rows = {r.seq: r for r in conn.execute(select(steps).where(steps.c.run_id == "r"))}
        answer = conn.execute(select(runs.c.answer)).scalar()
    assert (
        rows[0].state == "completed" and rows[0].finished_at == WHEN and rows[0].started_at == WHEN
    )
    assert (
        rows[0].input == {"a": [1, "é", None]}
        and rows[0].output is None
        and rows[0].error == "plain"
    )
    assert rows[1].input == {
        "text": "a\\x00b\ufffdc",
        "nan": "NaN",
        "bytes": "\\xff\\x00",
        "deep": [{"k": "\\xff"}],
    }
    assert rows[1].error == "nul\\x00here" and answer == "done\\x00"


def test_a_failed_statement_is_sqlalchemys_error_and_rolls_the_transaction_back(
    engine: Engine,
) -> None:
    with engine.connect() as conn, pytest.raises(DBAPIError) as caught, prepared.transaction(conn):
        Prepared(insert(steps), keys=STEP_COLUMNS).run_many(conn, [step_row(0)])
        Prepared(insert(steps), keys=STEP_COLUMNS).run_many(conn, [step_row(0)])  # same (run, seq)
    assert not retrying.is_transient(caught.value)  # an integrity error: permanent, not retried
    with engine.connect() as conn:
        assert conn.execute(select(steps.c.seq)).all() == []


@pytest.mark.postgres
def test_a_terminated_connection_is_invalidated_and_transient() -> None:
    import psycopg
    from scale_helpers import PG_URL, _libpq_url, pg_schema

    with pg_schema() as url:
        engine = open_store_engine(url)
        Store(engine).create_run(
            "r",
            task="t",
            workspace="/w",
            model="m",
            settings={},
            first_messages=[Message("system", "s")],
        )
        with engine.connect() as conn:
            pid = conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
            with psycopg.connect(_libpq_url(PG_URL), autocommit=True) as side:
                side.execute("SELECT pg_terminate_backend(%s)", (pid,))
            with pytest.raises(DBAPIError) as caught, prepared.transaction(conn):
                Prepared(insert(messages)).run(
                    conn,
                    {
                        "run_id": "r",
                        "seq": 9,
                        "role": "user",
                        "content": "x",
                        "tool_calls": None,
                        "tool_call_id": None,
                        "step_seq": None,
                        "created_at": WHEN,
                    },
                )
            assert caught.value.connection_invalidated and retrying.is_transient(caught.value)
            assert conn.invalidated
        engine.dispose()


@pytest.mark.postgres
def test_rows_go_one_statement_each_on_postgresql_never_through_executemany(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """psycopg's executemany runs in a pipeline of its own: a process frozen inside it would
    leave the server mid-query, where no timeout frees the run's row lock."""
    import psycopg
    from scale_helpers import pg_schema

    def refused(*_: Any, **__: Any) -> None:
        raise AssertionError("executemany on PostgreSQL")

    monkeypatch.setattr(psycopg.Cursor, "executemany", refused)
    with pg_schema() as url:
        engine = open_store_engine(url)
        Store(engine).create_run(
            "r",
            task="t",
            workspace="/w",
            model="m",
            settings={},
            first_messages=[Message("system", "s")],
        )
        with engine.connect() as conn, prepared.transaction(conn):
            Prepared(insert(messages)).run_many(
                conn,
                [
                    {
                        "run_id": "r",
                        "seq": 10 + i,
                        "role": "user",
                        "content": f"m{i}",
                        "tool_calls": None,
                        "tool_call_id": None,
                        "step_seq": None,
                        "created_at": WHEN,
                    }
                    for i in range(3)
                ],
            )
        with engine.connect() as conn:
            assert conn.execute(
                select(messages.c.content).where(messages.c.seq >= 10).order_by(messages.c.seq)
            ).scalars().all() == ["m0", "m1", "m2"]
        engine.dispose()


@pytest.mark.postgres
def test_a_transaction_left_idle_longer_than_the_lease_is_ended_by_the_server() -> None:
    """An owner frozen inside a checkpoint holds its run's row lock from the fence on. Each
    statement waits for its answer (no pipeline mode), so the server sees the transaction
    idle, and ends it after the lease: the lock goes, and the frozen owner's COMMIT fails as
    a lost connection (transient; on retry its fence finds the lease taken)."""
    import psycopg
    from scale_helpers import PG_URL, _libpq_url, pg_schema

    fence = Prepared(
        update(runs).where(runs.c.id == bindparam("b_id")).returning(runs.c.cancel_requested)
    )
    with pg_schema() as url:
        engine = open_store_engine(url, lease_seconds=1.5)
        Store(engine).create_run(
            "r",
            task="t",
            workspace="/w",
            model="m",
            settings={},
            first_messages=[Message("system", "s")],
        )
        with engine.connect() as conn, psycopg.connect(_libpq_url(PG_URL), autocommit=True) as side:
            dbapi_conn: Any = conn.connection.dbapi_connection
            assert (
                conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
                == "1500ms"
            )
            conn.rollback()
            pid = dbapi_conn.info.backend_pid

            def state() -> str | None:
                row = side.execute(
                    "SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
                return None if row is None else str(row[0])

            with pytest.raises(DBAPIError) as caught, prepared.transaction(conn):
                assert (
                    prepared.fetch_one(conn, fence.run(conn, {"b_id": "r", "answer": "lost"}))
                    is not None
                )
                assert dbapi_conn._pipeline is None and state() == "idle in transaction"
                wait_for(lambda: state() is None, 30, "the server to end the idle transaction")
            assert retrying.is_transient(caught.value) and conn.invalidated
        with engine.connect() as conn:
            assert conn.execute(select(runs.c.answer)).scalar() is None  # rolled back
        engine.dispose()


class _FreezingProxy:
    """A TCP relay to PostgreSQL that stops passing the client's bytes halfway through the
    first statement holding `marker`, as if the client froze mid-send (SIGSTOP, a paused VM:
    its kernel keeps the connection open, its process sends no more). With `rate`, the
    client's bytes go at most that many a second (a slow link)."""

    def __init__(self, upstream: tuple[str, int], marker: bytes, rate: float | None = None) -> None:
        self.upstream, self.marker, self.frozen, self.rate = (
            upstream,
            marker,
            threading.Event(),
            rate,
        )
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self.sockets: list[socket.socket] = []
        self._start(self._accept)

    def _start(self, target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.sockets += (client, server)
            self._start(self._pump, client, server, True)
            self._start(self._pump, server, client, False)

    def _pump(self, src: Any, dst: Any, from_client: bool) -> None:
        seen = b""
        try:
            while chunk := src.recv(65536):
                if from_client and self.frozen.is_set():
                    continue  # frozen: nothing more reaches the server
                if from_client:
                    window = seen[-len(self.marker) :] + chunk
                    at = window.find(self.marker)
                    if at >= 0:  # pass the marker's first half, then freeze
                        cut = at - (len(window) - len(chunk)) + len(self.marker) // 2
                        dst.sendall(chunk[: max(cut, 0)])
                        self.frozen.set()
                        continue
                    seen = window
                dst.sendall(chunk)
                if from_client and self.rate:
                    time.sleep(len(chunk) / self.rate)  # a rate limit, not a wait for anything
        except OSError:
            pass
        finally:
            # The server ended the session: the client learns it (a frozen client would on thawing).
            if not from_client:
                self._cut(src, dst)

    @staticmethod
    def _cut(*socks: socket.socket) -> None:
        for sock in socks:  # shutdown, not only close: it wakes a recv blocked in another thread
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        """Cut every connection (the test's own way out if the server never ends the session)."""
        self.listener.close()
        self._cut(*self.sockets)


@pytest.mark.slow
@pytest.mark.postgres
def test_a_statement_half_sent_by_an_owner_that_froze_does_not_hold_the_run() -> None:
    """An owner frozen while sending a row larger than its socket's buffer leaves part of the
    statement with the server. Sent with server-side binding, the row's values follow the
    statement's text (Bind after Parse) and the server, reading a query already begun, waits
    with the run's row locked and no timeout ends it. Bound into the text, the statement is
    one message: the server is still idle in the transaction, ends it after the lease, and
    the lock goes (engine._client_binding: every statement of the store, Core's too)."""
    import psycopg
    from scale_helpers import PG_URL, _libpq_url, pg_schema
    from sqlalchemy.engine import make_url

    marker = b"FROZEN-HALFWAY-" + b"%d" % id(object())
    fence = Prepared(
        update(runs).where(runs.c.id == bindparam("b_id")).returning(runs.c.cancel_requested)
    )
    with pg_schema() as url:
        parsed = make_url(url)
        proxy = _FreezingProxy((parsed.host or "127.0.0.1", parsed.port or 5432), marker)
        engine = open_store_engine(
            parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False),
            lease_seconds=1.5,
        )
        try:
            Store(engine).create_run(
                "r",
                task="t",
                workspace="/w",
                model="m",
                settings={},
                first_messages=[Message("system", "s")],
            )
            big = Message("tool", marker.decode() + "x" * 400_000, tool_call_id="c1")
            with (
                engine.connect() as conn,
                psycopg.connect(_libpq_url(PG_URL), autocommit=True) as side,
            ):
                pid = conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
                factory = conn.connection.dbapi_connection.cursor_factory  # type: ignore[union-attr]
                assert issubclass(factory, psycopg.ClientCursor)
                conn.rollback()

                def gone() -> bool:
                    return (
                        side.execute(
                            "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)
                        ).fetchone()
                        is None
                    )

                cut = threading.Timer(20, proxy.close)  # a way out, not the way it should end
                cut.start()
                started = time.monotonic()
                with pytest.raises(DBAPIError) as caught, prepared.transaction(conn):
                    assert (
                        prepared.fetch_one(conn, fence.run(conn, {"b_id": "r", "answer": "lost"}))
                        is not None
                    )
                    prepared.run_core(
                        conn,
                        insert(messages),
                        {
                            "run_id": "r",
                            "seq": 1,
                            "role": "tool",
                            "content": big.content,
                            "tool_call_id": "c1",
                            "created_at": WHEN,
                        },
                    )
                cut.cancel()
                assert proxy.frozen.is_set()
                assert time.monotonic() - started < 15, "the server kept the frozen owner's session"
                assert retrying.is_transient(caught.value)
                wait_for(gone, 10, "the server to end the session of the frozen owner")
                side.execute(f"SET search_path = {parsed.query['options'].split('=')[-1]}")
                side.execute("SET lock_timeout = '5s'")
                side.execute(
                    "UPDATE runs SET answer = 'taken' WHERE id = 'r'"
                )  # the lock went with it
                assert side.execute("SELECT count(*) FROM messages WHERE seq = 1").fetchone() == (
                    0,
                )
        finally:
            engine.dispose()
            proxy.close()


def test_a_connection_lost_inside_psycopgs_pipeline_is_transient_and_lost() -> None:
    # As CI saw it: executemany's pipeline read the server's 57P01 (a terminated backend),
    # then leaving pipeline mode failed, and that second error is what reached the store,
    # with the 57P01 only in its context. The dialect's is_disconnect did not see it.
    psycopg = pytest.importorskip("psycopg")
    try:
        try:
            raise psycopg.errors.AdminShutdown(
                "terminating connection due to administrator command"
            )
        except psycopg.Error:
            raise psycopg.OperationalError("cannot exit pipeline mode while busy") from None
    except psycopg.Error as exc:
        exc.__suppress_context__ = False
        wrapped = DBAPIError.instance("INSERT ...", [], exc, psycopg.Error)
    assert isinstance(wrapped.orig.__context__, psycopg.errors.AdminShutdown)
    assert retrying.is_transient(wrapped) and retrying.connection_lost(wrapped.orig)
    refused = DBAPIError.instance(
        "INSERT ...", [], psycopg.errors.UniqueViolation("duplicate key"), psycopg.Error
    )
    assert not retrying.is_transient(refused) and not retrying.connection_lost(refused.orig)


def test_a_socket_that_failed_under_psycopg_is_transient_and_lost() -> None:
    # Seen in the terminated-connection sweep: psycopg's wait loop turns the socket's
    # OSError into "connection socket closed" (the server's message never read).
    psycopg = pytest.importorskip("psycopg")
    for cause in (
        ConnectionResetError(104, "Connection reset by peer"),
        OSError(9, "Bad file descriptor"),
    ):
        try:
            try:
                raise cause
            except OSError as ex:
                raise psycopg.OperationalError("connection socket closed") from ex
        except psycopg.Error as exc:
            wrapped = DBAPIError.instance("INSERT ...", [], exc, psycopg.Error)
        assert retrying.is_transient(wrapped) and retrying.connection_lost(wrapped.orig)
    busy = psycopg.OperationalError("sending query failed: another command is already in progress")
    assert retrying.is_transient(DBAPIError.instance("ROLLBACK", [], busy, psycopg.Error))


def test_json_parameters_match_cores_json_text(engine: Engine) -> None:
    """What the hot path writes into a JSON column parses to what Core's serializer wrote."""
    value = {"z": [1, 2.5, True, None], "é": "ünïcode", "nested": {"k": ["v"]}}
    text = prepared.json_text(value)
    assert text is not None and json.loads(text) == json.loads(json.dumps(value))


@settings(max_examples=300, deadline=None)
@given(st.datetimes() | st.datetimes(timezones=st.timezones()) | st.dates() | st.none())
def test_sqlites_datetime_text_is_cores(value: Any) -> None:
    # The fast path (isoformat, in C) against the processor Core would have applied.
    from sqlalchemy import DateTime
    from sqlalchemy.dialects import sqlite

    dialect = sqlite.dialect()
    core = DateTime().dialect_impl(dialect).bind_processor(dialect)
    assert prepared._processor(DateTime(), dialect)(value) == core(value)


@pytest.mark.slow
@pytest.mark.postgres
def test_rows_core_sends_many_at_once_go_one_at_a_time_so_a_frozen_sender_holds_nothing() -> None:
    """Core's executemany (a snapshot's blobs, a run's first messages): psycopg sends the rows
    in a pipeline, and mid-pipeline the server waits for the rest of a query, the first rows'
    index entries locked, with no timeout. A `start` frozen in its first snapshot then held
    every other run that wrote a file of the same content. One statement at a time, the
    server ends the frozen transaction after the lease (engine._client_binding)."""
    import hashlib
    import zlib

    import psycopg
    from scale_helpers import PG_URL, _libpq_url, pg_schema
    from sqlalchemy.engine import make_url

    from durable_agent.store.blobs import _insert_ignore, save_statements
    from durable_agent.store.schema import workspace_blobs

    def blob(data: bytes) -> dict[str, Any]:
        return {
            "hash": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "data": zlib.compress(data),
        }

    common, second = blob(b"a LICENSE, say\n" * 100), blob(b"the second file")
    with pg_schema() as url:
        parsed = make_url(url)
        proxy = _FreezingProxy(
            (parsed.host or "127.0.0.1", parsed.port or 5432), second["hash"].encode()
        )
        engine = open_store_engine(
            parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False),
            lease_seconds=1.5,
        )
        ended: list[BaseException] = []

        def snapshot() -> None:
            try:
                save_statements(
                    engine,
                    [(_insert_ignore(engine, workspace_blobs), [common, second])],
                    retrying.StorePolicy(max_attempts=1),
                )
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                ended.append(exc)

        writer = threading.Thread(target=snapshot, daemon=True)
        writer.start()
        try:
            wait_for(proxy.frozen.is_set, 30, "the relay to freeze on the second blob")
            with psycopg.connect(_libpq_url(PG_URL), autocommit=True) as side:
                side.execute(f"SET search_path = {parsed.query['options'].split('=')[-1]}")
                side.execute("SET lock_timeout = '15s'")
                started = time.monotonic()
                side.execute(
                    "INSERT INTO workspace_blobs (hash, size, data) VALUES (%s, %s, %s) "
                    "ON CONFLICT DO NOTHING",
                    (common["hash"], common["size"], common["data"]),
                )
                assert (
                    time.monotonic() - started < 10
                )  # the lease (1.5 s) and a margin, not for good
            writer.join(30)
            assert ended and "idle-in-transaction timeout" in str(ended[0]), (
                ended
            )  # ended by the server
        finally:
            engine.dispose()
            proxy.close()


@pytest.mark.postgres
def test_a_checkpoint_on_postgresql_is_two_messages_begin_with_the_fence_and_the_rest_with_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every message is a round trip: the fence's answer is read before anything else goes
    (a fenced-out owner sends no row), then the rows go with the COMMIT."""
    import psycopg
    from scale_helpers import pg_schema

    from durable_agent.store.journal import Journal
    from durable_agent.store.step import Counters

    sent: list[str] = []
    real = psycopg.ClientCursor.execute

    def execute(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        sent.append(str(query))
        return real(self, query, params, **kw)

    with pg_schema() as url:
        engine = open_store_engine(url)
        store = Store(engine)
        store.create_run(
            "r",
            task="t",
            workspace="/w",
            model="m",
            settings={},
            first_messages=[Message("system", "s")],
        )
        epoch = store.acquire_lease("r", "host:1:a", 60)
        journal = Journal(engine, "r", "host:1:a", epoch, 60)
        journal.load()
        step = journal.step(
            "model:0:a", "model", {"turn": 0}, turn=0
        )  # the connection is checked out
        monkeypatch.setattr(psycopg.ClientCursor, "execute", execute)
        zero = Counters(0, 0, 0, 0, 0, 0)
        step.complete(
            {"content": "50% done; it's $$ -- /*"},
            counters=zero,
            messages=[Message("assistant", "%s %(x)s ;'\\"), Message("user", "two")],
        )
        monkeypatch.undo()
        assert len(sent) == 2, sent
        assert sent[0].startswith("BEGIN;\nUPDATE runs SET") and "RETURNING" in sent[0]
        assert sent[1].count("INSERT INTO messages") == 2 and sent[1].endswith(";\nCOMMIT")
        assert [m.content for m in store.messages("r")][-2:] == ["%s %(x)s ;'\\", "two"]
        assert store.steps("r")[0].output == {"content": "50% done; it's $$ -- /*"}
        journal.close()
        with (
            engine.connect() as conn
        ):  # the pooled connection is back to psycopg's own transactions
            assert conn.connection.dbapi_connection.autocommit is False  # type: ignore[union-attr]
        engine.dispose()


_HOSTILE = st.lists(
    st.sampled_from([*"%s()'\";\\$-/*\n\x00\ud800é", "%(x)s", "$$", "COMMIT", "E'"]), max_size=20
).map("".join) | st.text(max_size=40)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(texts=st.lists(_HOSTILE, min_size=1, max_size=4))
def test_hostile_text_sent_together_reads_back_as_written(engine: Engine, texts: list[str]) -> None:
    """Statements bound into their text and sent in one message (PostgreSQL) keep every
    value byte for byte (as the store cleans NUL and lone surrogates, on both dialects)."""
    from durable_agent.store.storable import storable_text

    fence = Prepared(
        update(runs).where(runs.c.id == bindparam("b_id")).returning(runs.c.cancel_requested)
    )
    with engine.connect() as conn:
        base = (
            conn.execute(select(messages.c.seq).order_by(messages.c.seq.desc())).scalar() or 0
        ) + 1
        conn.rollback()
        with prepared.transaction(conn):
            assert (
                prepared.fetch_one(conn, fence.run(conn, {"b_id": "r", "answer": texts[0]}))
                is not None
            )
            Prepared(insert(messages)).run_many(
                conn,
                [
                    {
                        "run_id": "r",
                        "seq": base + i,
                        "role": "user",
                        "content": t,
                        "tool_calls": None,
                        "tool_call_id": t,
                        "step_seq": None,
                        "created_at": WHEN,
                    }
                    for i, t in enumerate(texts)
                ],
            )
    with engine.connect() as conn:
        got = conn.execute(
            select(messages.c.content, messages.c.tool_call_id)
            .where(messages.c.seq >= base)
            .order_by(messages.c.seq)
        ).all()
        answer = conn.execute(select(runs.c.answer)).scalar()
    assert [tuple(r) for r in got] == [(storable_text(t), storable_text(t)) for t in texts]
    assert answer == storable_text(texts[0])


@pytest.mark.postgres
def test_statements_waiting_past_the_limit_go_at_once_and_all_land(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A snapshot's blobs in one checkpoint: the statements waiting are sent as they pass
    SEND_AT, so no message (and none of the client's copies of it) holds them all."""
    import psycopg
    from scale_helpers import pg_schema

    sent: list[str] = []
    real = psycopg.ClientCursor.execute

    def execute(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        sent.append(str(query))
        return real(self, query, params, **kw)

    fence = Prepared(
        update(runs).where(runs.c.id == bindparam("b_id")).returning(runs.c.cancel_requested)
    )
    rows = [
        {
            "run_id": "r",
            "seq": 10 + i,
            "role": "tool",
            "content": f"{i}:" + "x" * 3000,
            "tool_calls": None,
            "tool_call_id": None,
            "step_seq": None,
            "created_at": WHEN,
        }
        for i in range(20)
    ]
    with pg_schema() as url:
        engine = open_store_engine(url)
        Store(engine).create_run(
            "r",
            task="t",
            workspace="/w",
            model="m",
            settings={},
            first_messages=[Message("system", "s")],
        )
        monkeypatch.setattr(prepared, "SEND_AT", 10_000)
        monkeypatch.setattr(psycopg.ClientCursor, "execute", execute)
        with engine.connect() as conn, prepared.transaction(conn):
            assert (
                prepared.fetch_one(conn, fence.run(conn, {"b_id": "r", "answer": "a"})) is not None
            )
            Prepared(insert(messages)).run_many(conn, rows)
        monkeypatch.undo()
        ours = [
            len(m) for m in sent[next(i for i, m in enumerate(sent) if m.startswith("BEGIN")) :]
        ]
        assert len(ours) == 1 + 5 and max(ours) < 10_000 + 3_500, (
            ours
        )  # the fence, then 4 rows a message
        with engine.connect() as conn:
            got = conn.execute(
                select(messages.c.content).where(messages.c.seq >= 10).order_by(messages.c.seq)
            )
            assert got.scalars().all() == [r["content"] for r in rows]
        engine.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_snapshot_slower_to_send_than_the_lease_still_lands() -> None:
    """The server's idle-in-transaction timer runs while it reads a message: a checkpoint
    sent whole as one message (a step's new files as blobs) over a link slower than its size
    needs within the lease was ended by the server on every try. Sent as it passes SEND_AT,
    each message arrives well within the lease."""
    import os

    from scale_helpers import pg_schema
    from sqlalchemy.engine import make_url

    from durable_agent.store.blobs import BlobStore
    from durable_agent.store.journal import Journal

    with pg_schema() as url:
        parsed = make_url(url)
        relay = _FreezingProxy(
            (parsed.host or "127.0.0.1", parsed.port or 5432), b"never-in-a-message", rate=2_000_000
        )
        engine = open_store_engine(
            parsed.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False),
            lease_seconds=2.0,
        )
        try:
            store = Store(engine)
            store.create_run(
                "r",
                task="t",
                workspace="/w",
                model="m",
                settings={},
                first_messages=[Message("system", "s")],
            )
            epoch = store.acquire_lease("r", "host:1:a", 60)
            journal = Journal(
                engine,
                "r",
                "host:1:a",
                epoch,
                60,
                policy=retrying.StorePolicy(max_attempts=2, max_seconds=60),
            )
            journal.load()
            blobs = {
                f"{i:064x}": os.urandom(500_000) for i in range(8)
            }  # 8 MB as hex: 4 s at 2 MB/s
            journal.commit(raw=[BlobStore(engine).blob_statement(blobs)])
            journal.close()
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT count(*) FROM workspace_blobs").scalar() == 8
        finally:
            engine.dispose()
            relay.close()


@pytest.mark.postgres
def test_a_connection_left_in_autocommit_goes_back_to_the_pool_without_it() -> None:
    # A checkpoint cut short in its clean-up (a second Ctrl-C) could leave the autocommit it
    # sets for its own BEGIN; the next user of that pooled connection (Core's transactions)
    # would then commit statement by statement.
    from scale_helpers import pg_schema

    with pg_schema() as url:
        engine = open_store_engine(url, pool_size=1)
        with engine.connect() as conn:
            dbapi_conn: Any = conn.connection.dbapi_connection
            dbapi_conn.autocommit = True
        with engine.connect() as conn:
            assert conn.connection.dbapi_connection is dbapi_conn  # the same one, from the pool
            assert dbapi_conn.autocommit is False
        engine.dispose()
