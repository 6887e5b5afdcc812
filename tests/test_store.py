"""The schema comes from Alembic, automatically; SQLite is set up for several processes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from durable_agent.store.engine import make_engine, migrations_dir, open_store_engine, upgrade
from durable_agent.store.schema import HEAD_REVISION

FIXED_COLUMNS = {
    "runs": {"id", "task", "workspace", "model", "status", "stop_reason", "answer", "error", "created_at",
             "updated_at", "finished_at", "step_count", "tool_call_count", "prompt_tokens",
             "completion_tokens", "lease_owner", "lease_expires_at", "lease_epoch", "cancel_requested"},
    "steps": {"run_id", "seq", "kind", "state", "idempotency_key", "call_id", "tool_name", "input", "output",
              "error", "attempts", "prompt_tokens", "completion_tokens", "started_at", "finished_at",
              "duration_ms"},
    "messages": {"run_id", "seq", "role", "content", "tool_calls", "tool_call_id"},
}


def test_upgrade_empty_database_to_head_and_select_everything(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD_REVISION
        for table in ("runs", "steps", "messages", "approvals", "run_timeline"):
            assert conn.execute(text(f"SELECT * FROM {table}")).all() == []
    db = sqlite3.connect(tmp_path / "a.db")
    for table, columns in FIXED_COLUMNS.items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        assert columns <= have, f"{table} lacks {columns - have}"


def test_head_revision_constant_matches_the_migrations() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    assert ScriptDirectory.from_config(cfg).get_current_head() == HEAD_REVISION


def test_first_use_creates_the_schema_and_sets_sqlite_pragmas(tmp_path: Path) -> None:
    engine = open_store_engine(f"sqlite:///{tmp_path / 'sub' / 'b.db'}")
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 2  # FULL
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() >= 1000
    fast = open_store_engine(f"sqlite:///{tmp_path / 'sub' / 'b.db'}", durability="fast")
    with fast.connect() as conn:
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL


def test_writers_take_the_lock_up_front(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    engine = open_store_engine(f"sqlite:///{path}")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    with engine.begin() as conn:
        conn.execute(text("SELECT 1"))  # has written nothing yet, and already holds the write lock
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
    with engine.connect().execution_options(readonly=True) as reader, reader.begin():
        reader.execute(text("SELECT 1"))  # readers never block a writer
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    other.close()


def test_db_commands(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'd.db'}"
    assert cli("db", "path", "--db", url).stdout.strip() == url
    assert cli("db", "current", "--db", url).stdout.strip().startswith("empty")
    up = cli("db", "upgrade", "--db", url)
    assert up.code == 0 and up.stdout.strip() == HEAD_REVISION
    assert cli("db", "current", "--db", url).stdout.strip() == HEAD_REVISION


def test_default_database_lives_in_the_user_data_dir(cli, env) -> None:  # type: ignore[no-untyped-def]
    del env["DURABLE_AGENT_DB"]  # the cli fixture runs with this same environment
    r = cli("db", "path")
    assert r.code == 0
    assert r.stdout.strip() == f"sqlite:///{env['XDG_DATA_HOME']}/durable-agent/durable-agent.db"
