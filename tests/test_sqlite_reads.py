"""`list` and `show` on SQLite read through the standard library (store/sqlite_reads.py):
the same records as the store's own reads, for every kind of run and for rows edited by
hand; the whole way (store/runs.py) whenever the plain path does not apply; and no
SQLAlchemy imported by either command on a store at this version's revision."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Boolean, DateTime
from sqlalchemy.types import JSON, TypeDecorator

from durable_agent.store import sqlite_reads
from durable_agent.store.engine import open_store_engine
from durable_agent.store.runs import Store
from durable_agent.store.schema import approvals, runs, steps

SCRIPT = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "héllo\n"}}]},
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
    {
        "tool_calls": [{"name": "run_command", "arguments": {"command": "rm -rf build"}}]
    },  # asks (shell=ask)
    {"content": "done"},
]


def copy_store(url: str, to: Path) -> sqlite3.Connection:
    """A copy of the store (its WAL included), left open for edits."""
    source, target = sqlite3.connect(url.removeprefix("sqlite:///")), sqlite3.connect(to)
    source.backup(target)
    source.close()
    return target


def full_way(url: str, run_id: str) -> tuple[Any, Any, Any]:
    engine = open_store_engine(url)
    try:
        store = Store(engine)
        return store.get_run(run_id), store.steps(run_id), store.approvals(run_id)
    finally:
        engine.dispose()


def listed_the_full_way(url: str, **kw: Any) -> list[Any]:
    engine = open_store_engine(url)
    try:
        return Store(engine).list_runs(**kw)
    finally:
        engine.dispose()


@pytest.fixture
def store_with_runs(
    cli_inproc: Callable[..., Any], write_script: Callable[..., str], db_path: Path
) -> tuple[str, list[str]]:
    """A store holding a blocked run (pending approval), a completed one, one cut by its
    budget and a cancelled one."""
    ids = []
    for script, extra in (
        (SCRIPT, ()),
        ([{"content": "only"}], ()),
        (SCRIPT, ("--max-steps", "1")),
    ):
        r = cli_inproc(
            "start", "a tåsk", "--model", write_script(script), "--json", "--shell", "ask", *extra
        )
        ids.append(json.loads(r.stdout)["run_id"])
    r = cli_inproc(
        "start", "queued", "--model", write_script([{"content": "x"}]), "--detach", "--json"
    )
    ids.append(json.loads(r.stdout)["run_id"])
    assert cli_inproc("cancel", ids[-1]).code == 0
    return f"sqlite:///{db_path}", ids


def test_column_kinds_are_the_schemas() -> None:
    """One schema definition: the columns converted on the way out are the schema's DateTime,
    JSON and Boolean columns of those tables, no more and no fewer."""
    for table in (runs, steps, approvals):
        kinds: dict[str, list[str]] = {"datetime": [], "json": [], "bool": []}
        for column in table.c:
            kind = (
                column.type.impl_instance if isinstance(column.type, TypeDecorator) else column.type
            )
            for name, cls in (("datetime", DateTime), ("json", JSON), ("bool", Boolean)):
                if isinstance(kind, cls):
                    kinds[name].append(column.name)
        assert list(sqlite_reads.DATETIME_COLUMNS[table.name]) == kinds["datetime"]
        assert list(sqlite_reads.JSON_COLUMNS[table.name]) == kinds["json"]
        assert list(sqlite_reads.BOOLEAN_COLUMNS[table.name]) == kinds["bool"]
        assert sqlite_reads.COLUMNS[table.name] == tuple(c.name for c in table.c)


def test_the_same_records_as_the_stores_own_reads(store_with_runs: tuple[str, list[str]]) -> None:
    url, ids = store_with_runs
    for run_id in ids:
        found = sqlite_reads.show(url, run_id)
        assert found is not None and found == full_way(url, run_id)
        assert sqlite_reads.show(url, run_id[:6]) == found  # a unique prefix
    blocked = sqlite_reads.show(url, ids[0])
    assert (
        blocked is not None and blocked[2] and blocked[1]
    )  # approvals and steps were compared, not empties
    for status in (None, "completed", "blocked", "budget_exceeded", "cancelled", "failed"):
        for limit in (1, 2, 50):
            assert sqlite_reads.list_runs(url, status=status, limit=limit) == listed_the_full_way(
                url, status=status, limit=limit
            )


def test_what_the_plain_way_leaves_to_the_whole_way(
    store_with_runs: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, ids = store_with_runs
    assert sqlite_reads.show(url, "nope") is None  # not found: the store says so, in its words
    assert sqlite_reads.show(url, "") is None
    assert sqlite_reads.show(url, "\udcff") is None  # an id no row can hold
    assert sqlite_reads.show(url, "x" * 2000) is None
    db = url.removeprefix("sqlite:///")
    assert sqlite_reads.list_runs(f"{url}?mode=ro", status=None, limit=5) is None  # URL options
    assert sqlite_reads.list_runs("postgresql://127.0.0.1/x", status=None, limit=5) is None
    assert sqlite_reads.list_runs(f"sqlite:///{tmp_path / 'none.db'}", status=None, limit=5) is None
    assert not (tmp_path / "none.db").exists()  # never created here
    (tmp_path / "folder.db").mkdir()
    assert (
        sqlite_reads.list_runs(f"sqlite:///{tmp_path / 'folder.db'}", status=None, limit=5) is None
    )
    older = tmp_path / "older.db"
    with copy_store(url, older) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0005'")
    conn.close()
    assert (
        sqlite_reads.list_runs(f"sqlite:///{older}", status=None, limit=5) is None
    )  # upgraded the whole way
    # A writer holding the lock does not stop a reader (WAL), and nothing is left open.
    with sqlite3.connect(db, isolation_level=None) as writer:
        writer.execute("BEGIN IMMEDIATE")
        assert sqlite_reads.list_runs(url, status=None, limit=5) is not None
        writer.execute("ROLLBACK")


# Values a person or another tool could have written into a column (SQLite keeps any type):
# the shapes each converted kind can be given, often, and anything at all, sometimes.
SPECIAL = st.sampled_from(
    [
        "2026-11-30 12:34:56",
        "2026-11-30T12:34:56",
        "2026-11-30",
        "2026-11-30 12:34:56.5",
        "2026-11-30 12:34:56.123456+01:00",
        "2026-11-30 12:34:56.1234567",
        "20261130",
        "",
        "{}",
        "[1, 2]",
        '{"a": "\\u0000"}',
        "NaN",
        '"\\ud800"',
        '{"k": "\\udcff"}',
        "null",
        "true",
        "not json",
        0,
        1,
        2,
        -1,
        1.5,
        b"\x00\xff",
        b'{"a": 1}',
        "\udcff",
        None,
    ]
)
ODD = (
    SPECIAL
    | st.integers(-2, 2**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=40)
    | st.binary(max_size=12)
)
CONVERTED = [
    (t, c)
    for t, kinds in (("runs", runs), ("steps", steps), ("approvals", approvals))
    for c in (
        *sqlite_reads.DATETIME_COLUMNS[t],
        *sqlite_reads.JSON_COLUMNS[t],
        *sqlite_reads.BOOLEAN_COLUMNS[t],
    )
]
OTHER = (
    [("runs", c.name) for c in runs.c if c.name != "id"]
    + [("steps", c.name) for c in steps.c if c.name not in ("id", "run_id", "seq")]
    + [("approvals", c.name) for c in approvals.c if c.name not in ("id", "run_id")]
)
COLUMNS = st.sampled_from(CONVERTED) | st.sampled_from(OTHER)


@pytest.mark.slow
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(edits=st.lists(st.tuples(COLUMNS, ODD), min_size=1, max_size=2))
@example(edits=[(("runs", "cancel_requested"), 2)])
@example(edits=[(("approvals", "restore_workspace"), 1)])
@example(edits=[(("steps", "input"), '"\\ud800"')])
@example(edits=[(("runs", "settings"), "not json")])
@example(edits=[(("runs", "updated_at"), "2026-11-30 12:34:56")])
@example(edits=[(("steps", "finished_at"), "2026-11-30T12:34:56")])
def test_rows_edited_by_hand_read_the_same_or_go_the_whole_way(
    store_with_runs: tuple[str, list[str]],
    tmp_path_factory: pytest.TempPathFactory,
    edits: list[tuple[tuple[str, str], Any]],
) -> None:
    """Whatever a column holds, the plain way gives what SQLAlchemy gives, or leaves it."""
    url, ids = store_with_runs
    copy = tmp_path_factory.mktemp("edited") / "store.db"
    target = copy_store(url, copy)
    with target:
        target.execute("PRAGMA foreign_keys=OFF")
        for (table, column), value in edits:
            cast = "?"
            if isinstance(value, str) and any("\ud800" <= ch <= "\udfff" for ch in value):
                # Text that is not UTF-8, as only another tool could write it.
                cast, value = "CAST(? AS TEXT)", value.encode("utf-8", "surrogatepass")
            target.execute(
                f'UPDATE OR IGNORE {table} SET "{column}" = {cast}', (value,)
            )  # (NOT NULL kept)
    target.close()
    copy_url = f"sqlite:///{copy}"
    for run_id in ids[:2]:
        plain = sqlite_reads.show(copy_url, run_id)
        try:
            whole: Any = full_way(copy_url, run_id)
        except Exception:  # noqa: BLE001  (the whole way refuses: the plain way must have left it)
            whole = "refused"
        assert plain is None or plain == whole, (edits, run_id)
    plain_list = sqlite_reads.list_runs(copy_url, status=None, limit=10)
    try:
        whole_list: Any = listed_the_full_way(copy_url, status=None, limit=10)
    except Exception:  # noqa: BLE001
        whole_list = "refused"
    assert plain_list is None or plain_list == whole_list, edits


def test_list_and_show_import_no_sqlalchemy(
    store_with_runs: tuple[str, list[str]], env: dict[str, str], workspace: Path
) -> None:
    """What makes them answer at once (scripts/bench.py measures it): not even imported."""
    url, ids = store_with_runs
    probe = (
        "import sys; from durable_agent.cli.parser import main; code = main(sys.argv[1:]); "
        "print('LOADED' if {'sqlalchemy', 'pydantic', 'alembic'} & set(sys.modules) else 'PLAIN', code)"
    )
    for command in (
        ["list"],
        ["list", "--json", "--status", "blocked"],
        ["show", ids[0]],
        ["show", ids[0], "--json"],
    ):
        proc = subprocess.run(
            [sys.executable, "-c", probe, *command, "--db", url],
            capture_output=True,
            text=True,
            env=env,
            cwd=workspace,
            timeout=60,
        )
        assert proc.stdout.rstrip().splitlines()[-1] == "PLAIN 0", (
            command,
            proc.stdout,
            proc.stderr,
        )
    # The whole way when the plain one cannot answer (an unknown id): the store's own words.
    proc = subprocess.run(
        [sys.executable, "-c", probe, "show", "nope", "--db", url],
        capture_output=True,
        text=True,
        env=env,
        cwd=workspace,
        timeout=60,
    )
    assert "no run with id 'nope'" in proc.stderr and proc.stdout.rstrip().endswith("LOADED 2")


def both_ways(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(exit code, stdout, stderr) of the command the plain way (when it answers), then the whole way."""
    from datetime import datetime

    from durable_agent import presentation
    from durable_agent.cli import render
    from durable_agent.cli.parser import main

    for module in (render, presentation):  # the AGE column, the same both times
        monkeypatch.setattr(module, "utcnow", lambda: datetime(2030, 1, 1))
    answers = []
    for plain in (True, False):
        if not plain:
            monkeypatch.setattr(sqlite_reads, "list_runs", lambda *a, **k: None)
            monkeypatch.setattr(sqlite_reads, "show", lambda *a, **k: None)
        capsys.readouterr()
        try:
            code: Any = main(args)
        except Exception as exc:  # noqa: BLE001  (a traceback a user would see)
            code = repr(exc)
        out = capsys.readouterr()
        answers.append((code, out.out, out.err))
    monkeypatch.undo()
    return answers[0], answers[1]


def odd_folder(url: str, tmp_path: Path) -> Path:
    """Copies of the store under names a URL would read otherwise."""
    folder = tmp_path / "odd"
    folder.mkdir()
    for name in ("st%41.db", "st?x.db", "50% off.db", "store.db"):
        copy_store(url, folder / name).close()
    return folder


@pytest.mark.parametrize(
    "spelling",
    [
        "{dir}/st%41.db",  # a plain path: the whole way makes it a URL, where %41 is 'A'
        "{dir}/st?x.db",  # ... and where '?' starts the URL's options
        "sqlite+foo:///{dir}/store.db",  # a driver that does not exist
        "sqlite+aiosqlite:///{dir}/store.db",  # a driver that is not installed
        "sqlite://store.db",  # a host, not a file (a slash too few)
    ],
)
def test_a_store_spelling_reads_the_file_the_whole_way_reads(
    store_with_runs: tuple[str, list[str]],
    spelling: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, ids = store_with_runs
    folder = odd_folder(url, tmp_path)
    db = spelling.format(dir=folder)
    for args in (["list"], ["list", "--json"], ["show", ids[0]], ["show", ids[1][:5], "--json"]):
        monkeypatch.chdir(folder)
        plain, whole = both_ways([*args, "--db", db], monkeypatch, capsys)
        assert plain == whole, (args, db)


@pytest.mark.parametrize(
    "spelling",
    [
        "{dir}/st%41.db",
        "{dir}/st?x.db",
        "{dir}/50% off.db",
        "sqlite:///{dir}/st%2541.db",
        "sqlite:///{dir}/st%3Fx.db",
        "sqlite:///{dir}/50%25%20off.db",
    ],
)
def test_a_store_whose_name_holds_url_characters_is_that_very_file(
    store_with_runs: tuple[str, list[str]],
    spelling: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--db 'st?x.db'` once opened (and created) `st`, and `st%41.db` opened `stA.db`: a
    plain path is escaped when it becomes a URL, and a URL's escapes are decoded the way
    SQLAlchemy decodes them, so both ways, and the store files kept from commands, are the
    named file."""
    from durable_agent.config.layers import sqlite_file

    url, ids = store_with_runs
    folder = odd_folder(url, tmp_path)
    db = spelling.format(dir=folder)
    before = sorted(p.name for p in folder.iterdir())
    for args in (["list"], ["show", ids[0]]):
        plain, whole = both_ways([*args, "--db", db], monkeypatch, capsys)
        assert plain == whole and whole[0] == 0 and ids[0] in whole[1], (args, db, whole)
    assert (
        sorted(p.name for p in folder.iterdir() if not p.name.endswith(("-wal", "-shm"))) == before
    )
    file = sqlite_file(db)
    assert file is not None and file.parent == folder.resolve() and file.name in before, file


@pytest.mark.parametrize("db", ["sqlite://store.db", "sqlite://localhost/store.db"])
def test_an_sqlite_url_with_a_host_is_refused_in_one_line(
    cli_inproc: Callable[..., Any], db: str
) -> None:
    for args in (["list"], ["show", "x"], ["cancel", "x"]):
        r = cli_inproc(*args, "--db", db)
        assert r.code == 2 and "Invalid SQLite URL" in r.stderr and "Traceback" not in r.stderr, (
            args,
            r,
        )


@pytest.mark.parametrize(
    ("table", "column"),
    [
        ("runs", "tree_start"),
        ("runs", "last_checkpoint"),
        ("steps", "tree_id"),
        ("approvals", "restore_workspace"),
    ],
)
def test_a_store_missing_a_column_is_refused_both_ways(
    store_with_runs: tuple[str, list[str]],
    table: str,
    column: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A column dropped by hand at this revision: the whole way refuses ("no such column"),
    so the plain way must not answer with the column read as empty."""
    url, ids = store_with_runs
    with copy_store(url, tmp_path / "dropped.db") as conn:
        conn.execute("DROP VIEW IF EXISTS run_timeline")  # (a view that names the columns)
        conn.execute("DROP INDEX IF EXISTS ix_steps_trees")  # (an index that names tree_id)
        conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    conn.close()
    for args in (["list"], ["show", ids[0]], ["show", ids[0], "--json"]):
        plain, whole = both_ways([*args, "--db", str(tmp_path / "dropped.db")], monkeypatch, capsys)
        assert plain == whole and (whole[0] != 0 or (args == ["list"] and table != "runs")), (
            args,
            plain,
        )
