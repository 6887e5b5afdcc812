"""Database faults: classified once, here, and retried with tenacity like model faults.

    driver error (via SQLAlchemy's DBAPIError)         kind
    connection invalidated / closed / reset             transient  (reconnect, retry)
    PostgreSQL class 08 (connection), 57P01–57P03       transient  (server killed us, restarting)
    PostgreSQL 40001, 40P01 (serialization, deadlock)   transient  (retry the transaction)
    SQLite BUSY / LOCKED (beyond busy_timeout)          transient
    SQLite IOERR, FULL, PROTOCOL                        transient  (a full disk may be freed)
    anything else (integrity, data, programming)        permanent  (a bug or bad data: no retry)

`run` retries transient faults under a `StorePolicy` (full-jitter backoff, bounded attempts
and total time) and raises `StoreUnavailable` when they persist, `StoreError` at once for
permanent ones. The caller makes each try a whole transaction, so a retry replays all of
it on a fresh connection; a commit whose outcome is unknown is settled by the caller
(Journal reads back its checkpoint token) before it is tried again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from msgspec import Struct
from sqlalchemy.exc import DBAPIError

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

from durable_agent.errors import StoreError, StoreUnavailable

T = TypeVar("T")

_PG_TRANSIENT = {"40001", "40P01", "57P01", "57P02", "57P03", "55P03", "53300"}
# Not CANTOPEN (a path under a file, no permission): a wrong --db, not a passing fault.
_SQLITE_TRANSIENT = (
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_IOERR",
    "SQLITE_FULL",
    "SQLITE_PROTOCOL",
)
# Messages of drivers that carry no code: a connection gone or left unusable (psycopg over a
# socket that died) ...
_LOST_TEXT = (
    "server closed the connection",
    "connection is closed",
    "terminating connection",
    "connection reset",
    "broken pipe",
    "consuming input failed",
    "ssl syscall error",
    "no connection to the server",
    "the connection is lost",
    # psycopg's executemany runs in pipeline mode; a backend terminated inside the
    # pipeline surfaces as this, the server's 57P01 only in its context.
    "cannot exit pipeline mode",
    # psycopg's wait loop: an OSError on the socket (its cause), or a connection
    # left mid-command by one.
    "connection socket closed",
    "another command is already in progress",
)
# ... or a store that is there but busy, full or not reachable yet (sqlite3's text too).
_BUSY_TEXT = (
    "connection refused",
    "could not connect",
    "connection timed out",
    "the database system is",
    "database is locked",
    "disk i/o error",
    "database or disk is full",
    # PostgreSQL's connection slots all taken (53300, which psycopg's failed connect
    # carries as text only): for the server, a role or a database
    "too many clients",
    "too many connections",
    "remaining connection slots are reserved",
    # libpq's connect_timeout (engine.SILENCE_BOUNDS): a server that answered nothing
    "timeout expired",
)
_PG_LOST = ("57P01", "57P02", "57P03")


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """The driver's error and what it was raised from or during (a few links deep): psycopg
    reports a connection lost inside a pipeline as a second error about the pipeline."""
    seen = 0
    while exc is not None and seen < 6:
        yield exc
        exc = exc.__cause__ or exc.__context__
        seen += 1


def connection_lost(orig: BaseException | None) -> bool:
    """The driver's connection is gone or unusable (not merely a refused statement): the
    pool must not hand it out again. Read from the whole chain, for what `is_disconnect`
    of the dialect misses (the socket not yet seen closed when the error was raised)."""
    for e in _chain(orig):
        if isinstance(e, OSError):  # the socket itself failed
            return True
        sqlstate = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if isinstance(sqlstate, str) and (sqlstate.startswith("08") or sqlstate in _PG_LOST):
            return True
        # The words only of an error the server did not classify: a server error's message
        # may quote the agent's own text ("duplicate key value (...)=(timeout expired)").
        if not sqlstate and any(t in str(e).lower() for t in _LOST_TEXT):
            return True
    return False


class StorePolicy(Struct, frozen=True):
    """How long a run waits for its store before it stops (exit 7, resumable)."""

    max_attempts: int = 12
    max_seconds: float = 60.0
    max_wait: float = 5.0
    initial_wait: float = 0.05


def is_transient(exc: BaseException) -> bool:
    """A fault that a new connection or a little patience may cure."""
    if not isinstance(exc, DBAPIError):
        return isinstance(exc, (ConnectionError, TimeoutError))
    if exc.connection_invalidated:
        return True
    if connection_lost(exc.orig):
        return True
    for orig in _chain(exc.orig):
        sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
        if isinstance(sqlstate, str) and sqlstate in _PG_TRANSIENT:
            return True
        name = getattr(orig, "sqlite_errorname", None)
        if isinstance(name, str) and name.startswith(_SQLITE_TRANSIENT):
            return True
        if not sqlstate and any(
            t in str(orig).lower() for t in _BUSY_TEXT
        ):  # (as in connection_lost)
            return True
    return False


def read(
    engine: Engine,
    query: Callable[[Connection], T],
    policy: StorePolicy,
    *,
    run_id: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`query` on a read-only connection of its own, retried whole on transient faults."""

    def attempt() -> T:
        with engine.connect().execution_options(readonly=True) as conn:
            return query(conn)

    return run(attempt, policy, run_id=run_id, sleep=sleep)


def describe(exc: BaseException) -> str:
    """One line, the driver's words without SQL text or parameters."""
    orig = getattr(exc, "orig", None) or exc
    first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return f"{type(orig).__name__}: {first}"


def translate(exc: BaseException, run_id: str | None = None) -> StoreError:
    """The package's error for a driver error (the httpx habit, applied to SQL)."""
    if is_transient(exc):
        return StoreUnavailable(describe(exc), run_id)
    return StoreError(f"the database refused a statement: {describe(exc)}")


def run(
    attempt: Callable[[], T],
    policy: StorePolicy,
    *,
    run_id: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """Call `attempt` until it succeeds, retrying transient database faults.

    Only `DBAPIError` (and bare connection errors) are looked at; anything else, the
    package's own errors included (LeaseLost), passes through untouched.
    """

    # The first try outside tenacity: building a Retrying costs more CPU than a checkpoint's
    # statements, and nearly every try succeeds.
    try:
        return attempt()
    except (DBAPIError, ConnectionError, TimeoutError) as exc:
        if not is_transient(exc) or policy.max_attempts <= 1:
            raise translate(exc, run_id) from exc
        if on_retry is not None:
            on_retry(exc)
        first_failure = time.monotonic()

    def before_sleep(state: object) -> None:
        outcome = getattr(state, "outcome", None)
        if on_retry is not None and outcome is not None and outcome.exception() is not None:
            on_retry(outcome.exception())

    remaining = max(policy.max_seconds - (time.monotonic() - first_failure), 0.0)
    # Imported only now, on a first failure: read-only commands never need it.
    from tenacity import (
        Retrying,
        retry_if_exception,
        stop_after_attempt,
        stop_after_delay,
        wait_random_exponential,
    )

    retrying = Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(policy.max_attempts - 1) | stop_after_delay(remaining),
        wait=wait_random_exponential(multiplier=policy.initial_wait, max=policy.max_wait),
        sleep=sleep,
        reraise=True,
        before_sleep=before_sleep,
    )
    sleep(min(policy.initial_wait, remaining))  # the backoff before the second try
    try:
        return retrying(attempt)
    except (DBAPIError, ConnectionError, TimeoutError) as exc:
        raise translate(exc, run_id) from exc
