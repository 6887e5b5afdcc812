"""Helpers for the containment tests: is a real bubblewrap here, the canary outside the
workspace, and driving a run through the real CLI to its end (approving what it asks).

Tests that need bubblewrap skip with the reason when it is missing, except in CI
(`CI=true`), where `.ci/run` installs it and a missing bwrap is a failure.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from side_effects_support import Done, run_cli


def bwrap_problem() -> str | None:
    """None when bubblewrap can build our namespaces here, else why not."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    proc = subprocess.run(
        [
            bwrap,
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--unshare-pid",
            "--unshare-net",
            "--cap-drop",
            "ALL",
            "true",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return f"bwrap does not work here: {proc.stderr.strip()}"
    return None


def need_bwrap() -> None:
    problem = bwrap_problem()
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the sandbox tests: {problem} (.ci/run installs it)")
    pytest.skip(f"sandbox test skipped: {problem}")


def tree_digest(root: Path) -> dict[str, str]:
    """Every file, link and directory under `root` with its bytes, target or mode."""
    found: dict[str, str] = {}
    if not root.exists():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                found[rel] = f"dir:{path.stat().st_mode:o}"
            else:
                data = path.read_bytes()
                found[rel] = f"file:{path.stat().st_mode:o}:" + hashlib.sha256(data).hexdigest()
    return found


@dataclass
class Listener:
    """A TCP listener on 127.0.0.1, outside any sandbox. `connections()` reads its backlog
    without waiting: a command that connected has done so before it exited."""

    sock: socket.socket = field(
        default_factory=lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    )

    def __post_init__(self) -> None:
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def connections(self) -> int:
        n = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return n
            conn.close()
            n += 1


def open_listener() -> Iterator[Listener]:
    """Body of a `listener` fixture (declared in each module, with `name="listener"`)."""
    server = Listener()
    try:
        yield server
    finally:
        server.sock.close()


def drive_to_end(
    env: dict[str, str], cwd: Path, run_id: str, start_args: list[str], *, max_rounds: int = 60
) -> tuple[Done, int]:
    """`start`, then approve and resume for as long as the run stops `blocked` (exit 5).
    Returns the last result and how many approvals it took."""
    done = run_cli(env, cwd, "start", *start_args, "--run-id", run_id)
    approvals = 0
    while done.code == 5 and approvals < max_rounds:
        approved = run_cli(env, cwd, "approve", run_id)
        assert approved.code == 0, approved.stderr
        approvals += 1
        done = run_cli(env, cwd, "resume", run_id)
    return done, approvals


def store_bytes(db: Path) -> bytes:
    """The database as it is on disk: main file, WAL and shared memory."""
    return b"".join(
        p.read_bytes()
        for p in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"))
        if p.exists()
    )
