"""The schema comes from Alembic, automatically; SQLite is set up for several processes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from durable_agent.store.engine import make_engine, migrations_dir, open_store_engine, upgrade
from durable_agent.store.schema import HEAD_REVISION

FIXED_COLUMNS = {
    "runs": {
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
    },
    "steps": {
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
    },
    "messages": {"run_id", "seq", "role", "content", "tool_calls", "tool_call_id"},
}


def test_upgrade_empty_database_to_head_and_select_everything(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    upgrade(engine)
    with engine.connect() as conn:
        assert (
            conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD_REVISION
        )
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


# -- a new SQLite store is made from the generated head schema (store/head_sqlite.py) -----------
def _schema_facts(path: Path) -> dict[str, object]:
    """Everything SQLite knows of a store's schema: its objects' SQL, each table's columns
    (hidden ones too) and foreign keys, the revision."""
    db = sqlite3.connect(path)
    try:
        objects = sorted(
            db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"), key=repr
        )
        tables = [name for kind, name, _, _ in objects if kind == "table"]
        return {
            "objects": objects,
            "columns": {t: db.execute(f"PRAGMA table_xinfo({t})").fetchall() for t in tables},
            "foreign_keys": {
                t: db.execute(f"PRAGMA foreign_key_list({t})").fetchall() for t in tables
            },
            "revision": db.execute("SELECT version_num FROM alembic_version").fetchall(),
            "integrity": db.execute("PRAGMA integrity_check").fetchall(),
        }
    finally:
        db.close()


def test_a_new_sqlite_store_is_made_at_head_exactly_as_the_migrations_make_it(
    tmp_path: Path,
) -> None:
    migrated = make_engine(f"sqlite:///{tmp_path / 'migrated.db'}")
    upgrade(migrated)
    migrated.dispose()
    open_store_engine(f"sqlite:///{tmp_path / 'new.db'}").dispose()
    made, expected = _schema_facts(tmp_path / "new.db"), _schema_facts(tmp_path / "migrated.db")
    assert made == expected
    assert made["revision"] == [(HEAD_REVISION,)]


def test_the_generated_head_schema_is_up_to_date() -> None:
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "scripts" / "gen_head_schema.py"
    check = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    from durable_agent.store import head_sqlite

    assert head_sqlite.REVISION == HEAD_REVISION


def test_making_a_new_sqlite_store_does_not_import_alembic(tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'n.db'}"
    code = (
        "import sys\nfrom durable_agent.store.engine import open_store_engine\n"
        f"open_store_engine({url!r}).dispose()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert _schema_facts(tmp_path / "n.db")["revision"] == [(HEAD_REVISION,)]


def test_processes_making_the_same_new_store_at_once_make_it_once(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "shared.db"
    go = tmp_path / "go"
    url = f"sqlite:///{path}"
    code = (
        "import os, sys, time\nfrom durable_agent.store.engine import open_store_engine\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.001)\n"
        f"open_store_engine({url!r}).dispose()\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    go.touch()
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    migrated = make_engine(f"sqlite:///{tmp_path / 'migrated.db'}")
    upgrade(migrated)
    migrated.dispose()
    assert _schema_facts(path) == _schema_facts(tmp_path / "migrated.db")


def test_a_sqlite_file_that_holds_other_tables_is_left_to_the_migrations(tmp_path: Path) -> None:
    path = tmp_path / "theirs.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes (body TEXT)")
    db.execute("INSERT INTO notes VALUES ('kept')")
    db.commit()
    db.close()
    open_store_engine(f"sqlite:///{path}").dispose()  # the migrations add the store beside them
    db = sqlite3.connect(path)
    assert db.execute("SELECT body FROM notes").fetchall() == [("kept",)]
    assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD_REVISION,)]
    db.close()


@pytest.mark.slow
def test_a_new_store_on_a_full_disk_is_made_whole_or_not_at_all(
    tmp_path: Path, cli, write_script
) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    from mounts import mount_tmpfs

    disk = tmp_path / "disk"
    mount_tmpfs(disk, "1m")
    try:
        (disk / "filler").write_bytes(b"\0" * ((1 << 20) - (32 << 10)))  # 32 KiB left
        db = disk / "new.db"
        script = write_script([{"content": "done"}])
        r = cli(
            "start", "t", "--model", script, "--db", f"sqlite:///{db}", "--run-id", "f", "--quiet"
        )
        assert r.code == 7, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        if db.exists():  # whatever is there is no half-made store: empty, or nothing at all
            check = sqlite3.connect(db)
            assert check.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
            check.close()
        r = cli(
            "start", "t", "--model", script, "--db", f"sqlite:///{db}", "--run-id", "f", "--quiet"
        )
        assert r.code == 0, r.stderr
        migrated = make_engine(f"sqlite:///{tmp_path / 'migrated.db'}")
        upgrade(migrated)
        migrated.dispose()
        facts, expected = _schema_facts(db), _schema_facts(tmp_path / "migrated.db")
        assert facts["objects"] == expected["objects"] and facts["revision"] == expected["revision"]
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
