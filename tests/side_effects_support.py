"""Helpers for the side-effect tests (commands, approvals, cancel, verify, secrets).

They drive the real CLI as a subprocess (`spawn`, `run_cli`) so a test can signal or
kill it from outside, and inspect what it left behind: processes (`pid_alive`), the
history (`assert_history_valid`), a ledger file written by the commands themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import forked_cli
import pytest
from scale_helpers import wait_for  # noqa: F401 - one poller for all test helpers


@dataclass
class Done:
    code: int
    stdout: str
    stderr: str


def run_cli(env: dict[str, str], cwd: Path, *args: str, timeout: float = 120) -> Done:
    """One CLI command to its end (the `cli` fixture, for a given env and directory)."""
    proc = forked_cli.run(args, env=env, cwd=cwd, timeout=timeout)
    return Done(proc.returncode, proc.stdout, proc.stderr)


@dataclass
class Spawned:
    """A CLI process running in the background; output goes to files (a full pipe would block it)."""

    proc: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def spawn(env: dict[str, str], cwd: Path, logs: Path, *args: str) -> Spawned:
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / "cli.out", logs / "cli.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "durable_agent", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=o,
            stderr=e,
        )
    return Spawned(proc, out, err)


def pid_alive(pid: int) -> bool:
    """Running, not a zombie: kill(pid, 0) also succeeds on an unreaped zombie, which runs
    nothing (and in a container whose init does not reap, zombies stay around)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return process_state(pid) not in (None, "Z", "X")


@contextlib.contextmanager
def thawed_at_the_end(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """A process that froze itself (DURABLE_AGENT_STOP_AFTER) or was frozen: whatever the
    block did, it is thawed and killed if still there, so it never outlives the test."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of a process (R, S, T for stopped, Z...), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (
        FileNotFoundError,
        ProcessLookupError,
    ):  # gone before the open, or between open and read
        return None
    return stat[stat.rfind(")") + 2 :].split()[0]


def query(db: Path, statement: str, *params: Any) -> list[Any]:
    with sqlite3.connect(db) as conn:
        return conn.execute(statement, params).fetchall()


def poll_query(db: Path, statement: str, *params: Any) -> list[Any]:
    """`query` for polling a database another process is still creating: [] until it can answer."""
    if not db.exists():
        return []  # connecting would create an empty file under the CLI's feet
    try:
        return query(db, statement, *params)
    except sqlite3.OperationalError:  # no such table yet (migrations running), or locked
        return []


def assert_history_valid(db: Path, run_id: str) -> None:
    """SPEC §3: every assistant tool call has exactly one tool result, before the next
    assistant message (a call cut short still gets an honest error result)."""
    rows = query(
        db,
        "SELECT role, tool_calls, tool_call_id FROM messages WHERE run_id=? ORDER BY seq",
        run_id,
    )
    open_ids: list[str] = []
    for role, tool_calls, tool_call_id in rows:
        if role == "assistant":
            assert not open_ids, f"tool calls {open_ids} have no result before the next model turn"
            open_ids = [c["id"] for c in json.loads(tool_calls or "[]")]
        elif role == "tool":
            assert tool_call_id in open_ids, f"tool result {tool_call_id} answers no open call"
            open_ids.remove(tool_call_id)


def ledger_lines(workspace: Path, name: str = "ledger") -> list[str]:
    path = workspace / name
    return path.read_text().splitlines() if path.exists() else []


# Permission bits only stop a user who is not root: tests of what the harness may not read
# run Python as `nobody`.
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable]


def need_nobody(*programs: str) -> None:
    if os.geteuid() != 0 or any(shutil.which(p) is None for p in ("setpriv", *programs)):
        pytest.skip(f"needs root (to become nobody) and {', '.join(('setpriv', *programs))}")


@contextlib.contextmanager
def nobodys_folder() -> Iterator[Path]:
    """A folder of `nobody`'s own under /tmp (pytest's own folder is root's alone)."""
    base = Path(tempfile.mkdtemp(dir="/tmp"))
    base.chmod(0o755)
    ws = base / "ws"
    ws.mkdir()
    shutil.chown(ws, "nobody")
    try:
        yield ws
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)  # (deep trees: not rmtree)
