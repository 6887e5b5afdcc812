"""Store faults classified and retried (store/retrying.py), with real PostgreSQL faults:
a serialization failure (40001) and a deadlock (40P01) are transient, the transaction is
tried again and goes through; a refused statement (a duplicate key) is permanent, tried
once and reported as a StoreError, never as "the store is unavailable" (exit 7)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from scale_helpers import pg_schema
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from durable_agent.errors import StoreError, StoreUnavailable
from durable_agent.store import retrying

pytestmark = pytest.mark.postgres

POLICY = retrying.StorePolicy(max_attempts=4, max_seconds=30, initial_wait=0.01, max_wait=0.05)


@pytest.fixture
def engine() -> Iterator[Engine]:
    with pg_schema() as url:
        e = create_engine(url.replace("postgresql://", "postgresql+psycopg://"), poolclass=NullPool)
        with e.begin() as conn:
            conn.execute(text("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)"))
            conn.execute(text("INSERT INTO t VALUES (1, 0), (2, 0)"))
        yield e
        e.dispose()


def sqlstate(exc: BaseException) -> Any:
    assert isinstance(exc, DBAPIError)
    return getattr(exc.orig, "sqlstate", None)


def value(engine: Engine, row: int) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT v FROM t WHERE id = :id"), {"id": row}).scalar_one())


def test_a_serialization_failure_is_retried_and_the_transaction_goes_through(
    engine: Engine,
) -> None:
    seen: list[BaseException] = []
    tries = [0]

    def attempt() -> None:
        tries[0] += 1
        with (
            engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn,
            conn.begin(),
        ):
            conn.execute(text("SELECT v FROM t WHERE id = 1")).scalar()
            if tries[0] == 1:  # another writer commits under our snapshot, once
                with engine.begin() as other:
                    other.execute(text("UPDATE t SET v = v + 1 WHERE id = 1"))
            conn.execute(text("UPDATE t SET v = v + 10 WHERE id = 1"))

    retrying.run(attempt, POLICY, on_retry=seen.append)
    assert [sqlstate(e) for e in seen] == ["40001"]
    assert retrying.is_transient(seen[0])
    assert tries[0] == 2 and value(engine, 1) == 11  # both writes, each once


def test_a_deadlock_is_retried_and_both_transactions_go_through(engine: Engine) -> None:
    seen: list[BaseException] = []
    both_hold_one = threading.Barrier(2, timeout=20)
    errors: list[BaseException] = []

    def worker(first: int, second: int) -> None:
        tries = [0]

        def attempt() -> None:
            tries[0] += 1
            with engine.begin() as conn:
                conn.execute(text("SET LOCAL deadlock_timeout = '200ms'"))
                conn.execute(text("UPDATE t SET v = v + 1 WHERE id = :id"), {"id": first})
                if tries[0] == 1:
                    both_hold_one.wait()  # each holds one row and wants the other's
                conn.execute(text("UPDATE t SET v = v + 1 WHERE id = :id"), {"id": second})

        try:
            retrying.run(attempt, POLICY, on_retry=seen.append)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=(1, 2)),
        threading.Thread(target=worker, args=(2, 1)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert [sqlstate(e) for e in seen] == ["40P01"]  # one of the two was chosen as the victim
    assert (value(engine, 1), value(engine, 2)) == (2, 2)  # both transactions, each once


def test_a_refused_statement_is_permanent_tried_once(engine: Engine) -> None:
    tries = [0]

    def attempt() -> None:
        tries[0] += 1
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO t VALUES (1, 5)"))

    with pytest.raises(StoreError) as caught:
        retrying.run(attempt, POLICY)
    assert not isinstance(caught.value, StoreUnavailable)
    assert tries[0] == 1
    assert str(caught.value).startswith("the database refused a statement: UniqueViolation: ")
