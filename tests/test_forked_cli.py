"""The suite's forked CLI (tests/forked_cli.py) answers as a fresh `python -m durable_agent`
would: same exit statuses (a signal included), same output, the given environment and
directory, stdin, timeouts. Every CLI test leans on it, so it is held to a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import forked_cli
import pytest


def fresh(
    args: list[str], env: dict[str, str], cwd: Path, **kw: Any
) -> subprocess.CompletedProcess[str]:
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(
        [sys.executable, "-m", "durable_agent", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        **kw,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["nosuch"],
        ["list"],
        ["show", "nothing"],
        ["list", "--json"],
        ["start", "--help"],
        ["db", "current"],
    ],
)
@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_answers_as_a_fresh_process(args: list[str], env: dict[str, str], workspace: Path) -> None:
    forked = forked_cli.run(args, env=env, cwd=workspace)
    plain = fresh(args, env, workspace)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )


@pytest.mark.slow  # about 3 s on 2 cores
def test_a_run_its_store_its_directory_and_a_sigkill(
    env: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps(
            [
                {
                    "tool_calls": [
                        {"name": "write_file", "arguments": {"path": "a", "content": "x"}}
                    ]
                },
                {"content": "done"},
            ]
        )
    )
    db = tmp_path / "other.db"
    started = forked_cli.run(
        ["start", "t", "--model", f"scripted:{script}", "--run-id", "r1", "--json"],
        env={**env, "DURABLE_AGENT_DB": f"sqlite:///{db}"},
        cwd=workspace,
    )
    assert started.returncode == 0, started.stderr
    assert (
        json.loads(started.stdout)["status"] == "completed" and (workspace / "a").read_text() == "x"
    )
    assert (
        db.exists() and not (tmp_path / "store.db").exists()
    )  # the command's environment, not this one's
    killed = forked_cli.run(
        ["start", "t", "--model", f"scripted:{script}", "--run-id", "r2"],
        env={**env, "DURABLE_AGENT_CRASH_AFTER": "1"},
        cwd=workspace,
    )
    assert killed.returncode == -signal.SIGKILL
    resumed = forked_cli.run(["resume", "r2", "--json"], env=env, cwd=workspace)
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["status"] == "completed", (
        resumed.stderr
    )


@pytest.mark.slow
def test_a_timeout_kills_the_command(env: dict[str, str], workspace: Path, tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "run_command", "arguments": {"command": "sleep 60"}}]},
                {"content": "done"},
            ]
        )
    )
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        forked_cli.run(
            ["start", "t", "--model", f"scripted:{script}", "--shell", "allow", "--run-id", "slow"],
            env=env,
            cwd=workspace,
            timeout=3,
        )
    assert time.monotonic() - began < 50  # killed, not waited for
    shown = forked_cli.run(["show", "slow", "--json"], env=env, cwd=workspace)
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] != "completed", shown.stdout


def test_an_environment_it_cannot_take_runs_as_a_plain_process(
    env: dict[str, str], workspace: Path
) -> None:
    assert forked_cli.usable(env)
    odd = {**env, "PYTHONIOENCODING": "latin-1"}
    assert not forked_cli.usable(odd)  # read by the interpreter as it starts
    forked, plain = (
        forked_cli.run(["list"], env=odd, cwd=workspace),
        fresh(["list"], odd, workspace),
    )
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )


def test_a_store_is_whole_in_its_file_when_the_command_ends(
    env: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    """A process's exit closes its SQLite connections, and closing the last folds the WAL into
    the file (tests copy such files as templates): so does the forked command's."""
    import shutil
    import sqlite3

    for name, run in (("forked", forked_cli.run), ("fresh", None)):
        db = tmp_path / f"{name}.db"
        e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}"}
        r = (
            run(["db", "upgrade"], env=e, cwd=workspace)
            if run
            else fresh(["db", "upgrade"], e, workspace)
        )
        assert r.returncode == 0, r.stderr
        shutil.copy(db, tmp_path / f"{name}-copy.db")  # the file alone
        tables = (
            sqlite3.connect(tmp_path / f"{name}-copy.db")
            .execute("SELECT name FROM sqlite_master WHERE name = 'runs'")
            .fetchall()
        )
        assert tables == [("runs",)], name


def test_the_umask_and_limits_of_the_test_at_the_call_and_a_missing_directory(
    env: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    forked_cli.run(["list"], env=env, cwd=workspace)  # the zygote up, under the usual umask
    old = os.umask(0o077)
    try:
        for name in ("forked", "fresh"):
            db = tmp_path / f"{name}.db"
            e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}"}
            r = (
                forked_cli.run(["db", "upgrade"], env=e, cwd=workspace)
                if name == "forked"
                else fresh(["db", "upgrade"], e, workspace)
            )
            assert r.returncode == 0 and stat.S_IMODE(db.stat().st_mode) == 0o600, (
                name,
                oct(db.stat().st_mode),
            )
    finally:
        os.umask(old)
    with pytest.raises(FileNotFoundError):
        forked_cli.run(["list"], env=env, cwd=tmp_path / "nowhere")
