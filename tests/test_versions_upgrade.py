"""An upgrade with runs in flight, with real packages (docs/versions.md).

The commit before run_versions was added is checked out of this repository with git, built
into a wheel and installed into a virtualenv of its own (its dependencies are this one's).
Runs started with that build are killed with SIGKILL at random checkpoints: on SQLite in
the foreground, on PostgreSQL in a worker of that build, which `db upgrade` by this build
finds holding a lease and which goes on writing steps after it. Then this build resumes
every run (SQLite) or drains them with a worker (PostgreSQL): every run completes, no
model call is paid twice (a fake OpenAI endpoint logs each request) and no command runs
twice (each appends its call id to a ledger in its workspace).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import spawn_fake_openai
from scale_helpers import pg_schema, wait_for

from durable_agent.store.revision import HEAD_REVISION

pytestmark = pytest.mark.slow  # a wheel build and a dozen processes: about a minute

REPO = Path(__file__).resolve().parent.parent
SCRIPT = [
    {"tool_calls": [{"name": "run_command", "arguments": {"command": 'echo "$DURABLE_AGENT_CALL_ID" >> ledger.txt; sleep 0.2'}}]},
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": "b\n"}}]},
    {"tool_calls": [{"name": "run_command", "arguments": {"command": 'echo "$DURABLE_AGENT_CALL_ID" >> ledger.txt # 2'}}]},
    {"content": "done"},
]  # fmt: skip
RUNS = 3


def _earlier_commit() -> str:
    """The commit before the one that added run_versions (any commit on a branch without it)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the earlier build cannot be made")
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "alembic/versions/*run_versions.py"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    if not added:
        return "HEAD"  # not committed yet: HEAD predates it
    return added[-1] + "^"


@pytest.fixture(scope="module")
def old_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a virtualenv where the earlier build is installed from its wheel."""
    root = tmp_path_factory.mktemp("earlier")
    src = root / "src"
    src.mkdir()
    archive = subprocess.run(
        ["git", "archive", _earlier_commit()], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(root / "wheel"), str(src)], check=True)
    (wheel,) = (root / "wheel").glob("durable_agent-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    # Its dependencies are this environment's (a path entry: this one's .pth files, the
    # editable install of the current code among them, are not run there).
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    where = subprocess.run(
        [str(python), "-c", "import durable_agent, os; print(os.path.dirname(durable_agent.__file__))"],
        capture_output=True, text=True, check=True, cwd=root,
    ).stdout.strip()  # fmt: skip
    assert where.startswith(str(site)), where  # the earlier build, not this checkout
    return python


@pytest.fixture
def setting(tmp_path: Path, env: dict[str, str]) -> Iterator[dict[str, str]]:
    config = tmp_path / "config.toml"
    # A command cut off by a kill is reported to the model as interrupted instead of asking a
    # person (SPEC §5), so every run can complete on its own.
    config.write_text('on_uncertain_exec = "tell_model"\n')
    yield {**env, "DURABLE_AGENT_CONFIG": str(config), "OPENAI_API_KEY": "sk-test"}


def _da(
    python: Path | str, *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    # Never from this checkout's folder: `-m` puts the working directory first on sys.path,
    # where the earlier build would import the current code instead of its own.
    return subprocess.run(
        [str(python), "-m", "durable_agent", *args],
        env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        cwd=cwd or Path(env["XDG_DATA_HOME"]).parent,
    )  # fmt: skip


def _start_args(url: str, ws: Path, rid: str, db: str) -> list[str]:
    return [
        "start", f"task {rid}", "--model", "m", "--base-url", url, "--workspace", str(ws),
        "--shell", "allow", "--run-id", rid, "--db", db, "--quiet",
    ]  # fmt: skip


def _workspaces(tmp_path: Path, prefix: str) -> dict[str, Path]:
    found = {}
    for i in range(RUNS):
        ws = tmp_path / f"{prefix}{i}"
        ws.mkdir()
        (ws / "a.txt").write_text("a\n")
        found[f"{prefix}{i}"] = ws
    return found


def _check(
    requests: list[dict[str, Any]], rows: list[Any], steps: list[Any], spaces: dict[str, Path]
) -> None:
    """Every run completed; no command twice; no model call paid twice."""
    status = dict(rows)
    assert status == dict.fromkeys(spaces, "completed"), status
    for rid, ws in spaces.items():
        ledger = Counter((ws / "ledger.txt").read_text().split())
        assert all(n == 1 for n in ledger.values()), (rid, ledger)  # no command twice
        completed = {
            call
            for r, kind, call, tool, state, _t, _a in steps
            if r == rid and kind == "tool" and tool == "run_command" and state == "completed"
        }
        assert completed <= set(ledger), (rid, completed, ledger)  # recorded ones ran
    # Each request for a turn is a paid call: never more than its model step's attempts (an
    # attempt cut off by a kill is counted on the step; a recorded answer is never asked
    # for again).
    asked = Counter(
        (r["body"]["messages"][1]["content"].split()[-1], r["turn"])
        for r in requests
        if r["kind"] == "turn"
    )
    attempts = {(r, turn): a for r, kind, _c, _tool, _s, turn, a in steps if kind == "model"}
    for key, n in asked.items():
        assert n <= attempts.get(key, 0), (key, n, attempts)
    for rid in spaces:  # and every turn of the script was answered
        assert {t for (r, t) in asked if r == rid} == set(range(len(SCRIPT))), asked


def _steps_sql() -> str:
    return (
        "SELECT run_id, kind, call_id, tool_name, state, turn, attempts FROM steps "
        "ORDER BY run_id, seq"
    )


def test_sqlite_runs_of_the_earlier_build_resume_after_db_upgrade(
    old_python: Path, setting: dict[str, str], tmp_path: Path
) -> None:
    rng = random.Random(os.environ.get("DURABLE_AGENT_TEST_SEED") or None)
    db = tmp_path / "store.db"
    spaces = _workspaces(tmp_path, "s")
    with spawn_fake_openai(tmp_path / "fake", SCRIPT) as server:
        for rid, ws in spaces.items():
            k = rng.randint(1, 14)  # the k-th checkpoint boundary of its run
            r = _da(old_python, *_start_args(server.url, ws, rid, str(db)),
                    env={**setting, "DURABLE_AGENT_CRASH_AFTER": str(k)})  # fmt: skip
            assert r.returncode in (0, -9), (k, r.stderr)
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == ("0006",)
            unfinished = conn.execute("SELECT count(*) FROM runs WHERE status != 'completed'")
            resumed = unfinished.fetchone()[0]
        up = _da(sys.executable, "db", "upgrade", "--db", str(db), env=setting)
        assert up.returncode == 0, up.stderr
        for rid, ws in spaces.items():
            r = _da(sys.executable, "resume", rid, "--db", str(db), "--quiet", env=setting, cwd=ws)
            assert r.returncode == 0 or "is completed" in r.stderr, r.stderr
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT id, status FROM runs").fetchall()
            steps = conn.execute(_steps_sql()).fetchall()
            reasons = conn.execute("SELECT reason FROM run_versions").fetchall()
        _check(server.requests(), rows, steps, spaces)
        # A run the earlier build made has no row: this build records what it goes on with
        # (`start` for one killed before its first step).
        assert len(reasons) == resumed and set(reasons) <= {("adopted",), ("start",)}


@pytest.mark.postgres
def test_postgresql_upgrade_while_an_earlier_worker_holds_a_lease(
    old_python: Path, setting: dict[str, str], tmp_path: Path
) -> None:
    import psycopg

    spaces = _workspaces(tmp_path, "p")
    with pg_schema() as db, spawn_fake_openai(tmp_path / "fake", SCRIPT) as server:
        libpq = "postgresql://" + db.split("://", 1)[1]

        def one(sql: str) -> Any:
            with psycopg.connect(libpq, autocommit=True) as conn:
                return conn.execute(sql).fetchall()

        for rid, ws in spaces.items():
            r = _da(old_python, *_start_args(server.url, ws, rid, db), "--detach", env=setting)
            assert r.returncode == 0, r.stderr
        log = tmp_path / "old-worker.log"
        with log.open("wb") as err:
            old = subprocess.Popen(
                [str(old_python), "-m", "durable_agent", "worker", "--db", db, "--poll", "0.1"],
                env=setting, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        try:
            wait_for(
                lambda: one("SELECT count(*) FROM runs WHERE lease_owner IS NOT NULL AND status = 'running'")[0][0],
                60, "the earlier worker to hold a lease",
            )  # fmt: skip
            before = one("SELECT count(*) FROM steps")[0][0]
            up = _da(sys.executable, "db", "upgrade", "--db", db, env=setting)
            assert up.returncode == 0, up.stderr
            assert one("SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]
            # The earlier worker goes on checkpointing on the upgraded schema...
            wait_for(lambda: one("SELECT count(*) FROM steps")[0][0] > before + 1, 60,
                     "the earlier worker to write steps after the upgrade")  # fmt: skip
            # ...until it is killed at a random moment, a lease in its hands.
            wait_for(
                lambda: one("SELECT count(*) FROM runs WHERE lease_owner IS NOT NULL AND status = 'running'")[0][0]
                or old.poll() is not None,
                60, "a lease held",
            )  # fmt: skip
            old.send_signal(signal.SIGKILL)
            old.wait()
        finally:
            if old.poll() is None:
                old.kill()
                old.wait()
        new = _da(sys.executable, "worker", "--db", db, "--once", "--poll", "0.1", env=setting)
        assert new.returncode == 0, new.stderr
        rows = one("SELECT id, status FROM runs")
        steps = one(_steps_sql())
        _check(server.requests(), rows, steps, spaces)
        rows_v = one("SELECT run_id, reason FROM run_versions")
        assert {reason for _r, reason in rows_v} <= {"adopted", "start"}
