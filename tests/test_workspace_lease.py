"""One live run per workspace (issue 41, item 1): a second `start` or `resume` in a workspace
another live process runs in exits 6 with one line; `--allow-shared-workspace` lets it run;
the lease of a process killed with SIGKILL is taken over at once."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

DONE = {"content": "done"}


@contextmanager
def held_by_a_run(
    workspace: Path, env: dict[str, str], model: str, run_id: str
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A real `start` whose command waits on a FIFO in the workspace; yields once that
    command has opened it (the run is live, inside its step), with the FIFO's write end."""
    gate = workspace / "gate"
    os.mkfifo(gate)
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent", "start", "hold", "--model", model]
        + ["--shell", "allow", "--run-id", run_id, "--quiet"],
        cwd=workspace,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    fd = -1
    try:
        while fd < 0:  # a FIFO opens for writing without blocking only once it has a reader
            try:
                fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                if proc.poll() is not None or time.monotonic() > deadline:
                    out, err = proc.communicate()
                    pytest.fail(f"the holding run never reached its command: {err}")
        yield proc, fd
    finally:
        if fd >= 0:
            os.close(fd)
        if proc.poll() is None:
            proc.communicate(timeout=60)
        gate.unlink()


def test_a_second_run_in_a_live_runs_workspace_is_refused(
    workspace: Path,
    env: dict[str, str],
    cli: Callable[..., Any],
    write_script: Callable[[list[dict[str, Any]]], str],
) -> None:
    hold = write_script(
        [{"tool_calls": [{"name": "run_command", "arguments": {"command": "cat gate"}}]}, DONE]
    )
    quick = write_script([DONE])
    with held_by_a_run(workspace, env, hold, "A") as (proc, gate):
        refused = cli("start", "other", "--model", quick, "--run-id", "B")
        assert refused.code == 6, refused.stderr
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
        assert "in use by run A" in refused.stderr and "--allow-shared-workspace" in refused.stderr
        assert "B" not in cli("list").stdout.split()  # refused before the run was made
        again = cli("resume", "A")  # the holding run itself: the run's own refusal
        assert again.code == 6 and "run A is being executed by another live process" in again.stderr
        shared = cli(
            "start", "other", "--model", quick, "--run-id", "C", "--allow-shared-workspace"
        )
        assert shared.code == 0, shared.stderr
        os.write(gate, b"go\n")
    assert proc.returncode == 0, proc.stderr
    after = cli("start", "other", "--model", quick, "--run-id", "B")  # released at its end
    assert after.code == 0, after.stderr


def test_the_lease_of_a_killed_run_is_taken_over(
    workspace: Path,
    env: dict[str, str],
    cli: Callable[..., Any],
    write_script: Callable[[list[dict[str, Any]]], str],
) -> None:
    hold = write_script(
        [{"tool_calls": [{"name": "run_command", "arguments": {"command": "cat gate"}}]}, DONE]
    )
    with held_by_a_run(workspace, env, hold, "K") as (proc, _gate):
        assert cli("start", "x", "--model", write_script([DONE])).code == 6
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        started = cli("start", "other", "--model", write_script([DONE]), "--run-id", "N")
        assert started.code == 0, started.stderr
        resumed = cli("resume", "K")  # the killed run itself: its command's fate is uncertain
        assert resumed.code == 5 and "uncertain" in resumed.stdout + resumed.stderr, resumed.stderr


def test_a_worker_leaves_a_run_queued_while_its_workspace_is_in_use(
    workspace: Path,
    env: dict[str, str],
    cli: Callable[..., Any],
    write_script: Callable[[list[dict[str, Any]]], str],
) -> None:
    """A worker claims a queued run whose workspace a live foreground run holds: it gives the
    run back, queued (nothing of it runs), and a later worker runs it once the lease is free."""
    hold = write_script(
        [{"tool_calls": [{"name": "run_command", "arguments": {"command": "cat gate"}}]}, DONE]
    )
    queued = write_script(
        [{"tool_calls": [{"name": "write_file", "arguments": {"path": "q.txt", "content": "q"}}]}]
        + [DONE]
    )
    detached = cli("start", "queued", "--model", queued, "--run-id", "Q", "--detach")
    assert detached.code == 0, detached.stderr
    with held_by_a_run(workspace, env, hold, "A") as (proc, gate):
        worker = cli("worker", "--once")
        assert worker.code == 0, worker.stderr
        assert "skipped run Q" in worker.stderr and "in use by run A" in worker.stderr
        assert not (workspace / "q.txt").exists()  # nothing of it ran
        shown = cli("show", "Q", "--json")
        assert shown.code == 0 and '"status": "pending"' in shown.stdout, shown.stdout
        os.write(gate, b"go\n")
    assert proc.returncode == 0, proc.stderr
    again = cli("worker", "--once")
    assert again.code == 0, again.stderr
    assert (workspace / "q.txt").read_text() == "q"
    assert '"status": "completed"' in cli("show", "Q", "--json").stdout
