"""A command cannot start processes without bound, even when the harness runs as root (where
the kernel's RLIMIT_NPROC does not apply): a bounded fork bomb through the real CLI is
stopped by the sandbox's process limit, and nothing of it is left on the host."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest
from sandbox_support import need_bwrap
from scale_helpers import wait_for

from durable_agent.tools.pids import PIDS_MAX

BOMB = textwrap.dedent(
    """\
    import os, sys
    started = 0
    for _ in range(5000):
        try:
            pid = os.fork()
        except OSError as exc:
            print("stopped after", started, exc.strerror)
            break
        if pid == 0:
            os.execv("/bin/sleep", ["sleep", "987"])
        started += 1
    else:
        print("started all", started)
    """
)


def _sleepers() -> int:
    found = subprocess.run(["pgrep", "-c", "-f", "^sleep 987$"], capture_output=True, text=True)
    return int(found.stdout.strip() or 0)


@pytest.mark.slow  # a thousand real processes
def test_a_fork_bomb_is_stopped_by_the_process_limit(cli, write_script, db_path, workspace) -> None:  # type: ignore[no-untyped-def]
    need_bwrap()
    (workspace / "bomb.py").write_text(BOMB)
    script = write_script(
        [
            {
                "tool_calls": [
                    {
                        "name": "run_command",
                        "arguments": {"command": f"{sys.executable} -I bomb.py; echo after"},
                    }
                ]
            },
            {"content": "done"},
        ]
    )
    r = cli("start", "t", "--model", script, "--shell", "allow", "--run-id", "bomb")
    assert r.code == 0, r.stderr
    with sqlite3.connect(db_path) as conn:
        (told,) = conn.execute(
            "SELECT content FROM messages WHERE run_id='bomb' AND role='tool'"
        ).fetchone()
    assert "stopped after" in told and "Resource temporarily unavailable" in told, told
    started = int(told.split("stopped after", 1)[1].split()[0])
    assert 0 < started < PIDS_MAX, told
    assert "after" in told.split("stopped after", 1)[1]  # the shell itself went on
    wait_for(lambda: _sleepers() == 0 or None, 10, "the command's processes gone")
    # The host is fine: it still starts processes.
    assert subprocess.run(["true"], check=False).returncode == 0
