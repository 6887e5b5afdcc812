"""Batches across crashes on PostgreSQL (docs/fleets.md): a process SIGKILLed at a chosen
point, held there by a lock the test owns (no sleep-and-hope): a submit killed while
recording a task (its run and its task row are one transaction), and a worker killed between
a batch's last run ending and the batch's finish. `batch cancel` still reaches every run of
the batch, one an earlier version left without its task row too, and the batch is still
finished (its status, its `batch_done`) by the next worker."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import Result
from scale_helpers import Workers, pg_rows, pg_schema, wait_for
from test_batch import SCRIPT, make_repos, write_tasks

pytestmark = pytest.mark.postgres

LOCK = 73_4211


@contextmanager
def admin(db: str) -> Iterator[Any]:
    import psycopg

    conn = psycopg.connect(db, autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


@contextmanager
def task_rows_held(db: str) -> Iterator[None]:
    """Every insert into batch_tasks waits, inside its transaction, until the block ends: a
    trigger takes an advisory lock that the test holds meanwhile."""
    with admin(db) as conn:
        conn.execute(
            "CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"PERFORM pg_advisory_xact_lock({LOCK}); RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER hold BEFORE INSERT ON batch_tasks FOR EACH ROW EXECUTE FUNCTION hold()"
        )
        conn.execute(f"SELECT pg_advisory_lock({LOCK})")
        try:
            yield
        finally:
            # The lock first: a process waiting in the trigger holds batch_tasks, for which
            # DROP TRIGGER waits (the other order is a deadlock, which PostgreSQL breaks by
            # failing either side). A killed submit's server process then goes on, finds
            # its client gone and rolls back.
            conn.execute(f"SELECT pg_advisory_unlock({LOCK})")
            conn.execute("DROP TRIGGER hold ON batch_tasks")


def waiting_on(db: str, what: str) -> bool:
    """Is some session of the store blocked on a lock while running `what`?"""
    found = pg_rows(
        db,
        "SELECT query FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()",
    )
    return any(what in q for (q,) in found)


def test_a_submit_killed_at_a_task_row_leaves_no_run_its_batch_does_not_list(
    cli: Callable[..., Result],
    env: dict[str, str],
    tmp_path: Path,
    write_script: Callable[..., str],
) -> None:
    with pg_schema() as db:
        assert cli("db", "upgrade", "--db", db).code == 0
        repos = make_repos(tmp_path / "src", 1)
        tasks = tmp_path / "tasks.jsonl"
        write_tasks(tasks, repos, 3, write_script(SCRIPT))
        with task_rows_held(db):  # the first task's row waits, its run's row made before it
            submit = subprocess.Popen(
                [sys.executable, "-m", "durable_agent", "batch", "submit", str(tasks),
                 "--workdir", str(tmp_path / "wd"), "--name", "k", "--db", db],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, cwd=tmp_path,
            )  # fmt: skip
            try:
                wait_for(lambda: waiting_on(db, "batch_tasks"), 60, "the submit at its task row")
            finally:
                os.kill(submit.pid, signal.SIGKILL)
                submit.wait()
        (batch_id,) = pg_rows(db, "SELECT id FROM batches WHERE name = 'k'")[0]
        # The run and its task row are one transaction: neither is there.
        assert pg_rows(db, f"SELECT id FROM runs WHERE batch_id = '{batch_id}'") == []
        assert pg_rows(db, "SELECT count(*) FROM batch_tasks") == [(0,)]
        again = cli("batch", "submit", str(tasks), "--workdir", str(tmp_path / "wd"),
                    "--name", "k", "--db", db)  # fmt: skip
        assert again.code == 0, again.stderr
        assert "3 task(s) queued" in again.stderr
        shown = cli("batch", "show", "k", "--json", "--db", db)
        assert shown.code == 0, shown.stderr
        listed = {t["run_id"] for t in json.loads(shown.stdout)["task_rows"]}
        made = {r for (r,) in pg_rows(db, f"SELECT id FROM runs WHERE batch_id = '{batch_id}'")}
        assert listed == made and len(made) == 3


def test_cancel_reaches_a_run_an_earlier_version_left_without_its_task_row(
    cli: Callable[..., Result],
    env: dict[str, str],
    tmp_path: Path,
    write_script: Callable[..., str],
) -> None:
    # Before runs and task rows were one transaction, a submit killed between them left a
    # queued run with no task row: a store may still hold one (made so here by hand).
    with pg_schema() as db:
        assert cli("db", "upgrade", "--db", db).code == 0
        repos = make_repos(tmp_path / "src", 1)
        tasks = tmp_path / "tasks.jsonl"
        write_tasks(tasks, repos, 2, write_script(SCRIPT))
        submitted = cli("batch", "submit", str(tasks), "--workdir", str(tmp_path / "wd"),
                        "--name", "k", "--db", db)  # fmt: skip
        assert submitted.code == 0, submitted.stderr
        (batch_id,) = pg_rows(db, "SELECT id FROM batches WHERE name = 'k'")[0]
        with admin(db) as conn:
            conn.execute("DELETE FROM batch_tasks WHERE seq = 0")
        cancelled = cli("batch", "cancel", "k", "--db", db)
        assert cancelled.code == 0, cancelled.stderr
        left = pg_rows(db, f"SELECT id FROM runs WHERE batch_id = '{batch_id}' AND "
                       "status <> 'cancelled'")  # fmt: skip
        assert left == [], "batch cancel left a run of the batch queued"


def test_a_batch_whose_last_run_ended_on_a_killed_worker_is_finished(
    cli: Callable[..., Result],
    env: dict[str, str],
    tmp_path: Path,
    write_script: Callable[..., str],
) -> None:
    with pg_schema() as db:
        repos = make_repos(tmp_path / "src", 1)
        tasks = tmp_path / "tasks.jsonl"
        write_tasks(tasks, repos, 1, write_script(SCRIPT))
        args = ("--workdir", str(tmp_path / "wd"), "--shell", "allow", "--name", "f", "--db", db)
        assert cli("batch", "submit", str(tasks), *args).code == 0
        workers = Workers(env, db, tmp_path / "logs")
        try:
            with admin(db) as conn, conn.transaction():
                # The batch's row is the test's: the worker's finish waits on it, its run's
                # end committed already; it is killed there.
                conn.execute("SELECT * FROM batches FOR UPDATE")
                first = workers.start("--poll", "0.2")
                wait_for(lambda: waiting_on(db, "UPDATE batches"), 60, "the worker's finish")
                first.kill()
                first.wait()
            state = cli("batch", "show", "f", "--db", db, "--json").json()
            assert state["by_status"] == {"completed": 1} and state["status"] == "active"
            after = workers.start("--once", "--poll", "0.2")
            assert after.wait(timeout=60) == 0, workers.log(after)
        finally:
            workers.kill_all()
        state = cli("batch", "show", "f", "--db", db, "--json").json()
        assert state["status"] == "finished", json.dumps(state)
        assert "batch " in workers.log(after) and " finished" in workers.log(after)


def test_two_submits_of_one_file_at_once_queue_each_task_once(
    cli: Callable[..., Result],
    env: dict[str, str],
    tmp_path: Path,
    write_script: Callable[..., str],
) -> None:
    # The first submit holds its first task's run and row, uncommitted; the second, started
    # meanwhile, finds no run yet and makes the same one. It must not die of the key that
    # the first commits: the task is the batch's, queued once.
    with pg_schema() as db:
        assert cli("db", "upgrade", "--db", db).code == 0
        repos = make_repos(tmp_path / "src", 1)
        tasks = tmp_path / "tasks.jsonl"
        write_tasks(tasks, repos, 2, write_script(SCRIPT))
        argv = [sys.executable, "-m", "durable_agent", "batch", "submit", str(tasks),
                "--workdir", str(tmp_path / "wd"), "--name", "k", "--db", db]  # fmt: skip

        def submit() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, cwd=tmp_path,
            )  # fmt: skip

        with task_rows_held(db):
            first = submit()
            wait_for(lambda: waiting_on(db, "batch_tasks"), 60, "the first at its task row")
            second = submit()
            wait_for(
                lambda: waiting_on(db, "INSERT INTO runs") or second.poll() is not None,
                60,
                "the second at the first's run",
            )
        out2, err2 = second.communicate(timeout=120)
        out1, err1 = first.communicate(timeout=120)
        assert first.returncode == 0, err1.decode()
        assert "Traceback" not in err2.decode(), err2.decode()
        assert second.returncode == 0, err2.decode()
        assert out1 == out2  # the one batch's id
        queued = [re.search(r"(\d+) task\(s\) queued", e.decode()) for e in (err1, err2)]
        assert sum(int(m.group(1)) for m in queued if m) == 2, (err1, err2)
        (batch_id,) = pg_rows(db, "SELECT id FROM batches WHERE name = 'k'")[0]
        shown = cli("batch", "show", "k", "--json", "--db", db)
        assert shown.code == 0, shown.stderr
        listed = {t["run_id"] for t in json.loads(shown.stdout)["task_rows"]}
        made = {r for (r,) in pg_rows(db, f"SELECT id FROM runs WHERE batch_id = '{batch_id}'")}
        assert listed == made and len(made) == 2
