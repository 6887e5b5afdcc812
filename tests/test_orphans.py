"""Runs whose owner died: `resume` and the workers' queue take them at once, through the real
CLI. A killed owner is proved dead on this host (same boot and PID namespace) when its pid is
gone or is a zombie its parent has not reaped yet; the workers take such orphans, and runs
whose lease expired, before newer queued runs, oldest first (docs/scale-out.md, "Claim")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Result
from scale_helpers import Workers
from sqlalchemy import Engine, update

from durable_agent.messages import Message
from durable_agent.store.engine import open_store_engine
from durable_agent.store.leases import _pid_space, owner_is_dead
from durable_agent.store.queue import Queue
from durable_agent.store.rows import utcnow
from durable_agent.store.runs import Store
from durable_agent.store.schema import runs

LISTS = [{"tool_calls": [{"name": "list_files", "arguments": {}}]}] * 2 + [{"content": "done"}]


def killed_unreaped(proc: subprocess.Popen[Any]) -> None:
    """Wait until `proc` has exited, leaving it a zombie: not reaped (WNOWAIT)."""
    info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    assert info is not None and info.si_status == signal.SIGKILL, info


def test_a_zombie_owner_is_dead() -> None:
    import socket

    child = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"])
    try:
        killed_unreaped(child)
        with open(f"/proc/{child.pid}/stat") as f:
            assert f.read().rpartition(")")[2].split()[0] == "Z"  # still there, defunct
        assert owner_is_dead(f"{socket.gethostname()}:{child.pid}:z-{_pid_space()}")
        assert not owner_is_dead(f"{socket.gethostname()}:{os.getpid()}:me-{_pid_space()}")
    finally:
        child.wait()


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_resume_right_after_a_kill_takes_over_from_an_owner_not_yet_reaped(
    cli: Callable[..., Result],
    env: dict[str, str],
    workspace: Path,
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
) -> None:
    model = write_script(LISTS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent", "start", "t", "--model", model, "--run-id", "z"],
        cwd=workspace,
        env={**env, "DURABLE_AGENT_CRASH_AFTER": "2"},  # SIGKILL at its 2nd checkpoint boundary
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        killed_unreaped(proc)  # `kill -9`, and the parent (this test) has not waited for it yet
        assert sql("SELECT status FROM runs WHERE id = 'z'") == [("running",)]
        resumed = cli("resume", "z")
        assert resumed.code == 0, resumed.stderr  # not exit 6, "executed by another live process"
        assert sql("SELECT status, resume_count FROM runs WHERE id = 'z'") == [("completed", 1)]
    finally:
        proc.wait()


def enqueue(cli: Callable[..., Result], model: str, run_id: str, db: str) -> None:
    res = cli("start", "t", "--model", model, "--run-id", run_id, "--detach", "--db", db)
    assert res.code == 0, res.stderr


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_a_killed_workers_older_run_is_taken_over_before_newer_queued_ones(
    cli: Callable[..., Result],
    env: dict[str, str],
    write_script: Callable[..., str],
    store_url: str,
    tmp_path: Path,
) -> None:
    model = write_script(LISTS)
    enqueue(cli, model, "old", store_url)
    workers = Workers({**env, "DURABLE_AGENT_CRASH_AFTER": "2"}, store_url, tmp_path / "logs")
    try:
        crashing = workers.start("--quiet", "--poll", "0.1")
        assert crashing.wait(timeout=60) == -signal.SIGKILL, workers.log(crashing)
    finally:
        workers.kill_all()
    assert "claimed run old" in workers.log(crashing)
    enqueue(cli, model, "new1", store_url)
    enqueue(cli, model, "new2", store_url)

    # Its lease (30 s) has not expired: its owner is proved dead on this host at claim time.
    res = cli(
        "worker", "--once", "--concurrency", "1", "--quiet", "--poll", "0.1", "--db", store_url
    )
    assert res.code == 0, res.stderr
    order = [
        line.split(" run ")[1].split()[0]
        for line in res.stderr.splitlines()
        if " claimed run " in line or " took over run " in line
    ]
    assert order == ["old", "new1", "new2"], res.stderr
    assert "took over run old from " in res.stderr
    assert "3 claimed · 3 completed" in res.stderr


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = open_store_engine(store_url)
    yield eng
    eng.dispose()


def test_orphans_come_before_pending_runs_oldest_first(engine: Engine, tmp_path: Path) -> None:
    """Whatever their age: an orphan whose lease expired, created after a pending run, and
    one whose owner on this host is gone, are both taken before it, the older first."""
    import socket

    store, queue = Store(engine), Queue(engine)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = f"{socket.gethostname()}:{gone.pid}:dead-{_pid_space()}"

    def create(run_id: str, lease: tuple[str, float] | None = None) -> None:
        store.create_run(
            run_id,
            task="t",
            workspace=str(tmp_path),
            model="demo",
            settings={},
            first_messages=[Message("user", "t")],
            lease=lease,
        )

    create("a-pending")
    create("b-expired", ("host-x:1:x", 60))
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == "b-expired").values(lease_expires_at=utcnow()))
    create("c-dead-owner", (dead, 600))
    create("d-live-elsewhere", ("host-y:2:y", 600))
    taken = []
    for owner in ("w1:1:a", "w2:2:b", "w3:3:c"):
        claim = queue.claim(owner, 60).claim
        assert claim is not None
        taken.append((claim.run_id, claim.takeover))
    assert taken == [("b-expired", True), ("c-dead-owner", True), ("a-pending", False)]
    assert queue.claim("w4:4:d", 60).claim is None  # the live lease elsewhere is kept


def test_a_dead_owners_run_is_taken_over_at_the_global_limit(
    engine: Engine, tmp_path: Path
) -> None:
    """Its lease counts as running until it expires; taking it over adds no running run."""
    import socket

    store, queue = Store(engine), Queue(engine)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for run_id, lease in (
        ("dead", (f"{socket.gethostname()}:{gone.pid}:dead-{_pid_space()}", 600.0)),
        ("queued", None),
    ):
        store.create_run(
            run_id,
            task="t",
            workspace=str(tmp_path),
            model="demo",
            settings={},
            first_messages=[Message("user", "t")],
            lease=lease,
        )
    claim = queue.claim("w1:1:a", 60, max_running=1).claim
    assert claim is not None and claim.run_id == "dead"
    assert queue.claim("w2:2:b", 60, max_running=1).at_limit  # one runs: the queued one waits
