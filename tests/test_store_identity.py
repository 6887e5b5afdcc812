"""A store deleted or replaced under a live run: the run stops at its next checkpoint with
exit 7 and one line, instead of writing on into a file no one can open (and reporting
`completed`), or into the file put in its place. Through the real CLI: the run's own
command (unsandboxed, so it can reach the store) deletes or replaces the file mid-run."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def _commands(*commands: str) -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": c}}]} for c in commands
    ] + [{"content": "done"}]


def _start(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    run_id: str,
    store: Path,
    *cmds: str,
    extra: dict[str, str] | None = None,
) -> Any:
    return cli(
        "start",
        "t",
        "--model",
        write_script(_commands(*cmds)),
        "--shell",
        "allow",
        "--sandbox",
        "off",
        "--run-id",
        run_id,
        extra_env={"DURABLE_AGENT_DB": f"sqlite:///{store}", **(extra or {})},
    )


def _one_line(stderr: str) -> str:
    """The error: one line, the last (the lines before are the run's progress)."""
    lines = stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("durable-agent: error:")]
    assert errors == lines[-1:] and "Traceback" not in stderr, stderr
    return errors[0]


@pytest.mark.slow
def test_a_store_deleted_mid_run_stops_it_with_exit_7(
    cli: Callable[..., Any], write_script: Callable[..., str], tmp_path: Path
) -> None:
    store = tmp_path / "store.db"
    r = _start(
        cli, write_script, "gone", store, f"rm -f {store} {store}-wal {store}-shm", "echo after"
    )
    assert r.code == 7, (r.code, r.stdout, r.stderr)
    line = _one_line(r.stderr)
    assert f"the store file {store} was deleted" in line, line
    # Nothing was made in its place (a connection opening the path would create it empty).
    assert not store.exists()


@pytest.mark.slow
def test_a_store_deleted_under_a_long_command_stops_the_command(
    cli: Callable[..., Any], write_script: Callable[..., str], tmp_path: Path
) -> None:
    # The heartbeat sees it (every third of the lease) and stops the command: the run does
    # not wait out a command whose result it could never record.
    store = tmp_path / "store.db"
    started = time.monotonic()
    r = _start(
        cli,
        write_script,
        "long",
        store,
        f"rm -f {store} {store}-wal {store}-shm; sleep 100",
        extra={"DURABLE_AGENT_LEASE_SECONDS": "3"},
    )
    assert r.code == 7, (r.code, r.stdout, r.stderr)
    assert f"the store file {store} was deleted" in _one_line(r.stderr)
    assert time.monotonic() - started < 60  # not the 100 s of the command


@pytest.mark.slow
@pytest.mark.parametrize("how", ["moved over it", "copied over it"])
def test_a_store_replaced_mid_run_stops_it_and_the_replacement_keeps_its_run(
    cli: Callable[..., Any], write_script: Callable[..., str], tmp_path: Path, how: str
) -> None:
    other = tmp_path / "other.db"
    assert _start(cli, write_script, "theirs", other, "echo theirs").code == 0
    conn = sqlite3.connect(other)
    before = conn.execute(
        "SELECT seq, kind, state FROM steps WHERE run_id='theirs' ORDER BY seq"
    ).fetchall()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # all of it in the file that is copied
    conn.close()
    assert before

    store = tmp_path / "store.db"
    # A new file at the path, as `mv` or a restore from a backup makes one (`cp` onto a file
    # rewrites it in place: the same file, which is not what this is about).
    swap = f"cp {other} {tmp_path}/copy.db && mv {tmp_path}/copy.db {store}"
    if how == "copied over it":
        swap = f"rm -f {store} && cp {other} {store}"
    r = _start(cli, write_script, "ours", store, swap, "echo after")
    assert r.code == 7, (r.code, r.stdout, r.stderr)
    line = _one_line(r.stderr)
    assert f"the store file {store} was replaced by another file" in line, line

    # The replacement holds the other run, whole, and nothing of this one.
    conn = sqlite3.connect(store)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    after = conn.execute(
        "SELECT seq, kind, state FROM steps WHERE run_id='theirs' ORDER BY seq"
    ).fetchall()
    ours = conn.execute("SELECT count(*) FROM runs WHERE id='ours'").fetchone()
    status = conn.execute("SELECT status FROM runs WHERE id='theirs'").fetchone()
    conn.close()
    assert after == before and ours == (0,) and status == ("completed",)
    shown = cli("show", "theirs", extra_env={"DURABLE_AGENT_DB": f"sqlite:///{store}"})
    assert shown.code == 0, shown.stderr
