"""Helpers for the worker and PostgreSQL tests: a fresh PostgreSQL schema per test, worker
subprocesses, polling with a deadline.

PostgreSQL: DURABLE_AGENT_TEST_PG_URL (default postgresql://postgres@127.0.0.1:5432/test).
When it cannot be reached the test is skipped with the reason, except under CI=true,
where a missing server fails the test: CI must not go green without the scale-out tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest

PG_URL = os.environ.get("DURABLE_AGENT_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
PG_START_HINT = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def _libpq_url(url: str) -> str:
    # psycopg.connect wants a libpq URL, not SQLAlchemy's postgresql+psycopg:// spelling.
    return "postgresql://" + url.split("://", 1)[1]


def with_search_path(url: str, schema: str) -> str:
    """The URL whose connections use `schema` (created tables, Alembic's version table, views)."""
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"


@contextmanager
def pg_schema() -> Iterator[str]:
    """A store URL in a new, empty schema of the test database; dropped afterwards."""
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - dev installs have it
        _unavailable(f"psycopg is not installed ({exc})")
    try:
        admin = psycopg.connect(_libpq_url(PG_URL), connect_timeout=3, autocommit=True)
    except psycopg.Error as exc:
        _unavailable(f"PostgreSQL is not reachable at {PG_URL}: {str(exc).strip()}")
    schema = f"da_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield with_search_path(PG_URL, schema)
        finally:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def pg_rows(url: str, statement: str) -> list[Any]:
    """The rows of one statement on the store at `url` (a test's own look, on a connection
    of its own that no fault injection aims at)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(statement))]
    finally:
        engine.dispose()


def _unavailable(reason: str) -> NoReturn:
    if in_ci():
        pytest.fail(
            f"{reason} — CI=true, so the PostgreSQL tests must run (start it: {PG_START_HINT})"
        )
    pytest.skip(f"{reason} (set DURABLE_AGENT_TEST_PG_URL or start it: {PG_START_HINT})")


def wait_for(
    condition: Callable[[], Any], timeout_s: float = 30.0, what: str = "", interval_s: float = 0.02
) -> Any:
    """Poll until `condition()` is truthy and return it; fail the test at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what or condition}")
        time.sleep(interval_s)


class Workers:
    """Worker subprocesses (the real CLI), each with its stderr in a file; whatever a test
    leaves running is killed at teardown."""

    def __init__(self, env: dict[str, str], db: str, logs: Path) -> None:
        self.env, self.db, self.logs = env, db, logs
        self.procs: list[subprocess.Popen[bytes]] = []
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, *flags: str) -> subprocess.Popen[bytes]:
        n = len(self.procs)
        with (self.logs / f"worker{n}.log").open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "durable_agent", "worker", "--db", self.db, *flags],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.logs / f"worker{self.procs.index(proc)}.log").read_text()

    def stop(self, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> int:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=timeout_s)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def owner_pid(owner: str | None) -> int | None:
    """The pid in a lease owner `host:pid:nonce`."""
    if not owner:
        return None
    parts = owner.split(":")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None
