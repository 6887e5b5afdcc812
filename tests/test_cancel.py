"""Cancellation (SPEC §3): Ctrl-C in the foreground and `durable-agent cancel` from another
shell stop the run `cancelled` (exit 4), kill a running command with its whole process
group (grandchildren included), leave a valid history, and the run can be resumed."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from side_effects_support import (
    Spawned,
    assert_history_valid,
    pid_alive,
    poll_query,
    query,
    spawn,
    wait_for,
)

from durable_agent.tools.process import process_group_alive


@pytest.fixture
def env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """These tests read `$$` and `$!` from the outside: inside the sandbox's PID namespace
    those are not the host's pids. So they run unsandboxed; test_sandbox.py shows that a
    sandboxed command's processes die with their group, `setsid` escapees included."""
    config = tmp_path / "sandbox-off.toml"
    config.write_text('sandbox = "off"\n')
    return {**env, "DURABLE_AGENT_CONFIG": str(config)}


# The shell writes its pid, starts a grandchild in the background and writes that pid,
# then waits: both must be gone after the cancel, long before 30 s.
SLEEPER = "echo $$ > shell.pid; sleep 30 & echo $! > child.pid; sleep 30"
SCRIPT = [
    {"tool_calls": [{"name": "run_command", "arguments": {"command": SLEEPER}}]},
    {"content": "done after resume"},
]


def _start_sleeper(
    env: dict[str, str],
    workspace: Path,
    db: Path,
    tmp_path: Path,
    script: str,
    command_started: bool = True,
) -> tuple[Spawned, int, list[int]]:
    cli = spawn(
        env,
        workspace,
        tmp_path / "logs",
        "start",
        "t",
        "--model",
        script,
        "--shell",
        "allow",
        "--run-id",
        "c",
    )
    pgid = wait_for(
        lambda: poll_query(
            db,
            "SELECT pgid FROM steps WHERE tool_name='run_command' "
            "AND state='started' AND pgid IS NOT NULL",
        ),
        what="the running command's pgid",
    )[0][0]
    pids = wait_for(lambda: _pids(workspace), what="the command's pid files")
    assert all(pid_alive(p) for p in pids) and process_group_alive(pgid)
    return cli, pgid, pids


def _pids(workspace: Path) -> list[int] | None:
    files = [workspace / "shell.pid", workspace / "child.pid"]
    try:
        texts = [f.read_text().strip() for f in files]
    except FileNotFoundError:
        return None
    return [int(t) for t in texts] if all(texts) else None


def _assert_cancelled_and_clean(
    cli: Spawned, pgid: int, pids: list[int], db: Path, started: float
) -> None:
    assert cli.wait(timeout=25) == 4, cli.stderr()
    assert time.monotonic() - started < 20, "the command was waited for instead of killed"
    # Nothing of the command survives: not the shell, not its background grandchild.
    wait_for(lambda: not process_group_alive(pgid), timeout_s=5, what=f"group {pgid} to be gone")
    for pid in pids:
        assert not pid_alive(pid), f"pid {pid} of the cancelled command still runs"
    assert query(db, "SELECT status, stop_reason FROM runs") == [("cancelled", "cancelled")]
    # The interrupted call got an honest error result; the history stays valid.
    assert query(db, "SELECT state FROM steps WHERE tool_name='run_command'") == [("failed",)]
    told = query(db, "SELECT content FROM messages WHERE role='tool' AND tool_call_id='call_0_0'")
    assert len(told) == 1 and told[0][0].startswith("Error:") and "killed" in told[0][0]
    assert_history_valid(db, "c")


def test_ctrl_c_kills_the_command_group_and_resume_continues(
    cli, write_script, env, workspace, db_path, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    proc, pgid, pids = _start_sleeper(env, workspace, db_path, tmp_path, write_script(SCRIPT))
    started = time.monotonic()
    try:
        proc.proc.send_signal(signal.SIGINT)  # what the terminal sends on Ctrl-C
        _assert_cancelled_and_clean(proc, pgid, pids, db_path, started)
    finally:
        proc.kill()
    assert "cancelling at the next step boundary" in proc.stderr()

    r = cli("resume", "c")
    assert r.code == 0, r.stderr
    assert r.stdout.strip() == "done after resume"
    assert query(db_path, "SELECT status, step_count FROM runs") == [("completed", 2)]
    assert_history_valid(db_path, "c")


def test_cancel_from_another_shell_kills_the_command_promptly(
    cli, write_script, env, workspace, db_path, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    proc, pgid, pids = _start_sleeper(env, workspace, db_path, tmp_path, write_script(SCRIPT))
    started = time.monotonic()
    try:
        r = cli("cancel", "c")
        assert r.code == 0 and r.stdout.startswith("cancellation requested"), r.stdout + r.stderr
        # Not only at the next lease heartbeat (every 10 s by default): within a second or so.
        wait_for(
            lambda: not process_group_alive(pgid), timeout_s=8, what="the command to be killed"
        )
        _assert_cancelled_and_clean(proc, pgid, pids, db_path, started)
    finally:
        proc.kill()
    assert cli("resume", "c").code == 0
    assert query(db_path, "SELECT status FROM runs") == [("completed",)]


def test_second_ctrl_c_stops_now_and_still_records_the_call(
    cli, write_script, env, workspace, db_path, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # The shell ignores SIGTERM, so after the first Ctrl-C the command lingers in its grace
    # period (SIGKILL comes 2 s later): the second Ctrl-C lands while it still runs.
    stubborn = "trap '' TERM; " + SLEEPER.replace("sleep 30 &", "(trap '' TERM; sleep 30) &")
    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": stubborn}}]},
            {"content": "done after resume"},
        ]
    )
    proc, pgid, pids = _start_sleeper(env, workspace, db_path, tmp_path, script)
    started = time.monotonic()
    try:
        proc.proc.send_signal(signal.SIGINT)
        wait_for(
            lambda: "cancelling at the next step boundary" in proc.stderr(), what="the first Ctrl-C"
        )
        proc.proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=25) == 4, proc.stderr()
    finally:
        proc.kill()
    assert time.monotonic() - started < 20
    wait_for(lambda: not process_group_alive(pgid), timeout_s=5, what=f"group {pgid} to be gone")
    assert not any(pid_alive(p) for p in pids)
    assert query(db_path, "SELECT status, stop_reason FROM runs") == [("cancelled", "cancelled")]
    # The second Ctrl-C ended the command (the first would have needed the 2 s grace
    # period): the call still has its result, saying what happened.
    told = query(db_path, "SELECT content FROM messages WHERE role='tool'")
    assert len(told) == 1 and "interrupted by the user (Ctrl-C)" in told[0][0], told
    assert query(db_path, "SELECT state FROM steps WHERE tool_name='run_command'") == [("failed",)]
    assert_history_valid(db_path, "c")
    assert cli("resume", "c").code == 0


def test_ctrl_c_during_verification_is_not_a_failed_check(
    cli, write_script, env, workspace, db_path, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    (workspace / "slow").write_text("")
    verify = "echo $$ > shell.pid; echo $$ > child.pid; if [ -f slow ]; then sleep 30; fi"
    proc = spawn(
        env,
        workspace,
        tmp_path / "logs",
        "start",
        "t",
        "--model",
        write_script([{"content": "done"}]),
        "--verify",
        verify,
        "--run-id",
        "c",
    )
    try:
        wait_for(
            lambda: poll_query(
                db_path, "SELECT 1 FROM steps WHERE kind='verify' AND state='started'"
            ),
            what="the verify step",
        )
        pid = wait_for(lambda: _pids(workspace), what="the verify command")[0]
        proc.proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=25) == 4, proc.stderr()
    finally:
        proc.kill()
    assert not pid_alive(pid)
    # A cancelled check says nothing about the answer: the model is not told it failed,
    # and resume runs the check again on the same step.
    assert query(db_path, "SELECT state, error FROM steps WHERE kind='verify'") == [
        ("failed", "cancelled")
    ]
    assert query(
        db_path, "SELECT count(*) FROM messages WHERE content LIKE 'Verification failed%'"
    ) == [(0,)]
    (workspace / "slow").unlink()
    # A person changed the workspace since the last snapshot: resume asks before going on.
    r = cli("resume", "c")
    assert r.code == 5 and "slow (deleted)" in r.stderr, r.stderr
    assert cli("approve", "c").code == 0
    r = cli("resume", "c")
    assert r.code == 0 and r.stdout.strip() == "done", r.stderr
    assert query(db_path, "SELECT state, attempts FROM steps WHERE kind='verify'") == [
        ("completed", 2)
    ]
    assert query(db_path, "SELECT step_count FROM runs") == [(1,)]


def test_sigterm_cancels_like_ctrl_c(env, write_script, workspace, sql) -> None:  # type: ignore[no-untyped-def]
    """A service manager's stop (SIGTERM) ends the run `cancelled` and resumable, not blocked."""
    import signal as _signal
    import subprocess as _subprocess
    import sys as _sys
    import time as _time

    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "sleep 30"}}]},
            {"content": "done"},
        ]
    )
    proc = _subprocess.Popen(
        [
            _sys.executable,
            "-m",
            "durable_agent",
            "start",
            "t",
            "--model",
            script,
            "--shell",
            "allow",
            "--run-id",
            "term",
            "--quiet",
        ],
        env=env,
        cwd=workspace,
        stdout=_subprocess.DEVNULL,
        stderr=_subprocess.DEVNULL,
    )
    deadline = _time.monotonic() + 30
    while _time.monotonic() < deadline:
        try:
            if sql("SELECT pgid FROM steps WHERE tool_name='run_command' AND pgid IS NOT NULL"):
                break
        except Exception:  # the store is not created yet
            pass
        _time.sleep(0.05)
    proc.send_signal(_signal.SIGTERM)
    assert proc.wait(timeout=30) == 4
    assert sql("SELECT status, stop_reason FROM runs") == [("cancelled", "cancelled")]
    content = sql("SELECT content FROM messages WHERE role='tool'")[0][0]
    assert "cancelled" in content


@pytest.mark.parametrize("waiting_on", ["the answer", "a backoff"])
@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_cancel_stops_a_run_waiting_on_the_model_at_once(
    waiting_on: str,
    cli: Callable[..., Any],
    env: dict[str, str],
    workspace: Path,
    tmp_path: Path,
    db_path: Path,
) -> None:
    # The cancel was seen only at the next step boundary: after the model answered (up to
    # request_timeout_s, 10 minutes by default), or after a backoff between two tries.
    from provider_support import serve

    with serve(cli, env, workspace, tmp_path, [{"content": "never reached"}]) as ep:
        ep.configure(request_timeout_s=120.0, retry_max_seconds=600.0)
        if waiting_on == "the answer":
            ep.server.add_faults([{"delay": 60}])
        else:  # a 503, then a backoff of a minute before the next try
            ep.server.add_faults([{"status": 503, "times": 10}])
            ep.configure(retry_initial_wait_s=60.0, retry_max_wait_s=60.0, retry_after_cap_s=60.0)
        proc = ep.popen("--run-id", "m", "--quiet")
        try:
            wait_for(lambda: ep.server.requests, what="the model request")
            assert cli("cancel", "m", extra_env=ep.cli_env()).code == 0
            asked = time.monotonic()
            proc.wait(timeout=45)
            stopped = time.monotonic() - asked
        finally:
            proc.kill()
            _, err = proc.communicate()
        assert proc.returncode == 4, err
        assert stopped < 15, stopped  # the poll (0.5 s) and a read slice (0.25 s), not the minute
        assert len(ep.server.requests) == 1
    assert query(db_path, "SELECT status, stop_reason FROM runs") == [("cancelled", "cancelled")]
    assert query(db_path, "SELECT kind, state, error FROM steps") == [
        ("model", "failed", "cancelled while waiting for the model's answer")
    ]


def test_the_cancel_watch_is_the_sessions_heartbeat_not_a_thread_per_call(
    cli_inproc, write_script, workspace, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A thread started and joined around every command and model call cost a step about a
    quarter of a millisecond; the session's heartbeat polls the flag instead."""
    import threading

    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    commands = [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": f"echo {i}"}}]}
        for i in range(8)
    ]
    result = cli_inproc(
        "start",
        "t",
        "--shell",
        "allow",
        "--sandbox",
        "off",
        "--run-id",
        "cmds",
        "--model",
        write_script([*commands, {"content": "done"}]),
        "--verify",
        "true",
    )
    assert result.code == 0, result.err
    assert started.count("lease-heartbeat") == 1, started  # guard the check: starts are counted
    assert started.count("cancel-watch") == 0, started


class _CountingJournal:
    """What the heartbeat asks of a journal, counted."""

    def __init__(self) -> None:
        self.renewals = 0
        self.looks = 0
        self.renewed = threading.Event()
        self.looked = threading.Event()

    def heartbeat(self) -> bool:
        self.renewals += 1
        self.renewed.set()
        return False

    def cancel_requested(self, *, once: bool = False) -> bool:
        self.looks += 1
        self.looked.set()
        return self.looks >= 2  # the second look finds the flag set


def test_the_heartbeat_looks_for_a_cancel_only_while_a_call_is_armed() -> None:
    from durable_agent.loop.heartbeat import Heartbeat, watch_cancel

    assert _beat(1.0, 5.0, armed=False).looked_at == []  # renewals only (they bring the flag too)
    assert _beat(1.0, 5.0, armed=True).looked_at == pytest.approx(
        [0.5, 1.5, 2.5, 3.5, 4.5], abs=1e-5
    )
    # The real thread: an armed call sees the flag within a look; the end disarms it.
    journal = _CountingJournal()
    cancel = threading.Event()
    with Heartbeat(journal, 1.0, cancel) as beat:  # type: ignore[arg-type]
        with watch_cancel(cancel, journal, beat):  # type: ignore[arg-type]
            assert cancel.wait(10), "an armed call never saw the cancel"
        assert not beat.armed
    assert not beat.running


def test_without_a_heartbeat_the_cancel_watch_has_a_thread_of_its_own() -> None:
    from durable_agent.loop.heartbeat import watch_cancel

    journal = _CountingJournal()
    cancel = threading.Event()
    with watch_cancel(cancel, journal):  # type: ignore[arg-type]
        assert cancel.wait(10)
    assert journal.looks == 2


class _FakeTime:
    """The heartbeat's clock and its stop event in one: each wait moves the clock on by
    its timeout at once, and the loop stops at `until`."""

    def __init__(self, until: float) -> None:
        self.now, self.until = 0.0, until

    def __call__(self) -> float:
        return self.now

    def wait(self, timeout: float) -> bool:
        self.now += timeout
        return self.now >= self.until

    def set(self) -> None:
        pass


class _TimedJournal:
    def __init__(self, clock: _FakeTime, *, looks_fail: bool) -> None:
        self.clock, self.looks_fail = clock, looks_fail
        self.renewed_at: list[float] = []
        self.looked_at: list[float] = []
        self.retried_looks = 0

    def heartbeat(self) -> bool:
        self.renewed_at.append(round(self.clock.now, 6))
        return False

    def cancel_requested(self, *, once: bool = False) -> bool:
        if not once:  # retried for up to a minute: not for the heartbeat
            self.retried_looks += 1
            return False
        self.looked_at.append(round(self.clock.now, 6))
        if self.looks_fail:
            raise OSError("the store is down")
        return False


def _beat(interval: float, until: float, *, armed: bool, looks_fail: bool = False) -> _TimedJournal:
    from durable_agent.loop.heartbeat import Heartbeat

    clock = _FakeTime(until)
    journal = _TimedJournal(clock, looks_fail=looks_fail)
    beat = Heartbeat(journal, interval, threading.Event(), clock=clock)  # type: ignore[arg-type]
    beat._stop = clock  # type: ignore[assignment]
    beat.armed = armed
    beat._loop()  # in this thread, on the fake clock
    return journal


def test_the_lease_is_renewed_every_interval_not_at_the_next_tick_after_it() -> None:
    """A renewal rounded up to the half-second look came up to 0.5 s late: with a lease
    of 1.6 s only 0.59 s of it was left, and a writer holding the lock that long lost the run."""
    journal = _beat(1.6 / 3, 3.0, armed=False)
    assert journal.renewed_at == pytest.approx(
        [0.533333, 1.066667, 1.6, 2.133333, 2.666667], abs=1e-5
    )
    journal = _beat(1.6, 7.0, armed=True)
    assert journal.renewed_at == pytest.approx([1.6, 3.2, 4.8, 6.4], abs=1e-5)
    assert len(journal.looked_at) >= 8  # armed: a look every half second between them


def test_a_failing_look_for_a_cancel_neither_retries_nor_delays_the_renewal() -> None:
    """The look is one try: retried through a store outage (up to a minute), it held the
    renewal back past the lease, and a worker took the run over."""
    journal = _beat(2.0, 9.0, armed=True, looks_fail=True)
    assert journal.renewed_at == pytest.approx([2.0, 4.0, 6.0, 8.0], abs=1e-5)
    assert len(journal.looked_at) >= 8 and journal.retried_looks == 0
