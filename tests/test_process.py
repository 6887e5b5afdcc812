"""run_process with real subprocesses: capture, caps, timeouts, cancel, and a harness
killed with SIGKILL that must not leave its command running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scale_helpers import wait_for
from side_effects_support import pid_alive

from durable_agent.tools.process import (
    GUARD_SCRIPT,
    ProcessOutcome,
    command_env,
    kill_process_group,
    process_group_alive,
    run_process,
)

REPO = Path(__file__).resolve().parents[1]


def stays_false(condition: Callable[[], bool], for_s: float) -> bool:
    """For negative checks: `condition` never became true during `for_s` seconds."""
    deadline = time.monotonic() + for_s
    while time.monotonic() < deadline:
        if condition():
            return False
        time.sleep(0.02)
    return not condition()


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


_started_groups: list[int] = []


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    """Even when a test fails (or the code under test is broken), kill what it started."""
    yield
    while _started_groups:  # not with the code under test: it may be what is broken
        with contextlib.suppress(ProcessLookupError):
            os.killpg(_started_groups.pop(), signal.SIGKILL)


def run(command: str, cwd: Path, **kwargs: Any) -> ProcessOutcome:
    on_start = kwargs.pop("on_start", None)

    def record(pgid: int) -> None:
        _started_groups.append(pgid)
        if on_start is not None:
            on_start(pgid)

    kwargs.setdefault("timeout_s", 20.0)
    kwargs.setdefault("env", dict(os.environ))
    kwargs.setdefault("sandbox", None)  # the guard itself; test_sandbox.py tests containment
    return run_process(command, cwd=cwd, on_start=record, **kwargs)


def test_exit_code_stdout_and_stderr_are_captured_separately(tmp_path: Path) -> None:
    out = run("echo out; echo err >&2; exit 7", tmp_path)
    assert (out.exit_code, out.stdout, out.stderr) == (7, "out\n", "err\n")
    assert not out.timed_out and not out.cancelled
    assert (out.stdout_bytes, out.stderr_bytes) == (4, 4)
    assert out.pgid > 1 and out.duration_ms >= 0


def test_runs_in_the_workspace_with_stdin_closed(tmp_path: Path) -> None:
    (tmp_path / "marker.txt").write_text("here")
    out = run("pwd; cat marker.txt; cat; echo done", tmp_path)  # `cat` must not block
    assert out.stdout == f"{tmp_path}\nheredone\n"
    assert out.exit_code == 0


def test_runs_in_its_own_process_group_and_session(tmp_path: Path) -> None:
    out = run("cut -d' ' -f5,6 /proc/$$/stat", tmp_path)  # pgrp and session of the shell
    pgid, sid = (int(x) for x in out.stdout.split())
    assert pgid == sid == out.pgid
    assert pgid != os.getpgrp()


def test_killed_by_a_signal_is_a_negative_exit_code(tmp_path: Path) -> None:
    assert run("kill -9 $$", tmp_path).exit_code == -signal.SIGKILL


def test_missing_workspace_raises(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        run("true", tmp_path / "nope")


def test_undecodable_output_is_replaced_not_fatal(tmp_path: Path) -> None:
    # No UTF-8 in it at all: Latin-1 (durable_agent/encoding.py). Mostly UTF-8: the bad byte as \xff.
    out = run(r"printf 'a\377b'", tmp_path)
    assert out.stdout == "a\u00ffb"
    assert out.stdout_bytes == 3
    assert run(r"printf 'caf\303\251 \377 \303\251'", tmp_path).stdout == "café \\xff é"
    assert run(r"printf 'a\000b'", tmp_path).stdout == "a\\x00b"  # PostgreSQL text cannot hold NUL


def test_output_is_capped_with_a_marker_and_the_original_size(tmp_path: Path) -> None:
    out = run(
        "python3 -c \"print('H' * 5000 + 'x' * 90000 + 'T' * 5000)\"", tmp_path, output_cap=1000
    )
    assert out.stdout_bytes == 100_001
    assert len(out.stdout) <= 1000
    assert out.stdout.startswith("H" * 400)
    assert out.stdout.endswith("T" * 400 + "\n")
    assert "[... truncated " in out.stdout and " of 100001 bytes ...]" in out.stdout
    omitted = int(out.stdout.split("[... truncated ")[1].split(" ")[0])
    assert omitted == 100_001 - len(out.stdout.split("\n[...")[0]) - len(
        out.stdout.split("...]\n")[1]
    )


def test_output_just_under_the_cap_is_untouched(tmp_path: Path) -> None:
    out = run("printf '%0999d' 0", tmp_path, output_cap=999)
    assert out.stdout == "0" * 999


def test_multibyte_output_is_capped_in_characters(tmp_path: Path) -> None:
    out = run("python3 -c \"print('é' * 50000)\"", tmp_path, output_cap=500)
    assert out.stdout_bytes == 100_001
    assert len(out.stdout) <= 500
    assert "\ufffd" not in out.stdout


def test_huge_output_on_both_streams_does_not_deadlock(tmp_path: Path) -> None:
    # 20 MB on each pipe, interleaved: a reader that drains one pipe at a time would hang.
    script = (
        "import sys\nfor _ in range(200):\n"
        "    sys.stdout.write('o' * 100000); sys.stderr.write('e' * 100000)\n"
    )
    (tmp_path / "spam.py").write_text(script)
    out = run(f"{sys.executable} spam.py", tmp_path, timeout_s=60, output_cap=100)
    assert out.exit_code == 0, out.stderr
    assert (out.stdout_bytes, out.stderr_bytes) == (20_000_000, 20_000_000)
    assert len(out.stdout) <= 100 and "truncated" in out.stdout


def test_timeout_kills_the_whole_group_including_grandchildren(tmp_path: Path) -> None:
    out = run("sleep 100 & echo $! > bg.pid; sleep 100", tmp_path, timeout_s=1.0)
    assert out.timed_out and not out.cancelled
    assert out.exit_code is None
    assert out.duration_ms < 10_000
    bg = read_pid(tmp_path / "bg.pid")
    assert bg is not None
    wait_for(lambda: not pid_alive(bg), 5, "the background sleep to die")
    assert not process_group_alive(out.pgid)


def test_timeout_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path: Path) -> None:
    out = run(
        "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        tmp_path,
        timeout_s=0.5,
        kill_grace_s=0.3,
    )
    assert out.timed_out and out.stdout == "ready\n"
    assert not process_group_alive(out.pgid)


def test_cancel_event_kills_the_group(tmp_path: Path) -> None:
    cancel = threading.Event()
    outcome: list[ProcessOutcome] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            run("sleep 100 & echo $! > bg.pid; wait", tmp_path, timeout_s=60, cancel=cancel)
        )
    )
    worker.start()
    wait_for(lambda: read_pid(tmp_path / "bg.pid") is not None, what="the command to start")
    bg = read_pid(tmp_path / "bg.pid")
    assert bg is not None and pid_alive(bg)
    cancel.set()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert outcome[0].cancelled and not outcome[0].timed_out and outcome[0].exit_code is None
    wait_for(lambda: not pid_alive(bg), 5, "the background sleep to die")


def test_cancelled_before_the_start_never_runs(tmp_path: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    out = run("touch ran", tmp_path, cancel=cancel)
    assert out.cancelled and out.exit_code is None
    assert not (tmp_path / "ran").exists()
    assert out.duration_ms < 2_000  # no SIGTERM grace period for a command never started


def test_background_leftovers_are_killed_when_the_command_ends(tmp_path: Path) -> None:
    out = run("sleep 100 & echo $! > bg.pid; echo started", tmp_path, timeout_s=30)
    assert out.exit_code == 0 and out.stdout == "started\n"
    assert out.duration_ms < 10_000  # did not wait for the sleep
    bg = read_pid(tmp_path / "bg.pid")
    assert bg is not None
    wait_for(lambda: not pid_alive(bg), 5, "the leftover sleep to die")


def test_on_start_gets_the_pgid_before_the_command_runs(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    seen: list[tuple[int, bool]] = []

    def record(pgid: int) -> None:
        # Slow enough for an ungated guard to have started the command by now.
        seen.append((pgid, stays_false(ran.exists, 0.5)))

    out = run("touch ran", tmp_path, on_start=record)
    assert seen == [(out.pgid, True)]
    assert ran.exists()


def test_failing_on_start_means_the_command_never_runs(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    pgids: list[int] = []

    def record(pgid: int) -> None:
        pgids.append(pgid)
        assert stays_false(ran.exists, 0.5)
        raise RuntimeError("database is down")

    with pytest.raises(RuntimeError, match="database is down"):
        run("touch ran", tmp_path, on_start=record)
    assert not ran.exists()
    assert not process_group_alive(pgids[0])


def test_command_env_drops_credentials_and_adds_ids(tmp_path: Path) -> None:
    parent = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "MY_API_KEY": "k-123456",
        "GITHUB_TOKEN": "t",
        "aws_secret_access_key": "s",
        "DB_PASSWORD": "p",
        "MYSQL_PWD": "m",
        "OLDPWD": "/srv",
        "DATABASE_URL": "postgresql://u:hunter2@db/app",
        "GIT_AUTHOR_NAME": "Ada",
        "LC_ALL": "C.UTF-8",
        "PAGER": "less",
        "FORCE_COLOR": "1",
        "DURABLE_AGENT_CRASH_AFTER": "3",
        "DURABLE_AGENT_DB": "sqlite:////tmp/x.db",
        "DURABLE_AGENT_CALL_ID": "outer",
    }
    env = command_env(parent, run_id="run-1", call_id="call-9")
    for name in (
        "MY_API_KEY",
        "GITHUB_TOKEN",
        "aws_secret_access_key",
        "DB_PASSWORD",
        "MYSQL_PWD",
        "OLDPWD",
        "DATABASE_URL",
        "GIT_AUTHOR_NAME",  # not on the allowlist: only what `command_env` names
        "FORCE_COLOR",
        "DURABLE_AGENT_CRASH_AFTER",
        "DURABLE_AGENT_DB",
    ):
        assert name not in env
    assert env["HOME"] == str(tmp_path) and env["LC_ALL"] == "C.UTF-8"
    assert env["PAGER"] == env["GIT_PAGER"] == "cat"
    assert env["GIT_TERMINAL_PROMPT"] == "0" and env["NO_COLOR"] == "1"

    out = run(
        'echo "${MY_API_KEY:-unset} $DURABLE_AGENT_RUN_ID $DURABLE_AGENT_CALL_ID $PAGER"',
        tmp_path,
        env=env,
    )
    assert out.stdout == "unset run-1 call-9 cat\n"


def test_command_env_passes_what_the_setting_names() -> None:
    parent = {
        "PATH": "/usr/bin",
        "GIT_AUTHOR_NAME": "Ada",
        "GIT_ASKPASS": "/bin/askpass",  # credential-named (PASS): a pattern does not pass it
        "GIT_TOKEN": "t-123456",
        "MYSQL_PWD": "m-123456",
        "DURABLE_AGENT_DB": "sqlite:////tmp/x.db",
        "REPO_URL": "https://u:hunter2@host/repo",
        "OTHER": "o",
    }
    env = command_env(
        parent,
        run_id="r",
        call_id="c",
        passthrough=["GIT_*", "MYSQL_PWD", "DURABLE_AGENT_*", "REPO_*"],
    )
    assert env["GIT_AUTHOR_NAME"] == "Ada" and env["MYSQL_PWD"] == "m-123456"  # named exactly
    for name in ("GIT_ASKPASS", "GIT_TOKEN", "DURABLE_AGENT_DB", "REPO_URL", "OTHER"):
        assert name not in env


def test_the_guard_ignores_the_commands_python_settings(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("raise SystemExit('guard hijacked')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PYTHONSTARTUP=str(tmp_path / "x.py"))
    out = run("echo ok", tmp_path, env=env)
    assert (out.exit_code, out.stdout) == (0, "ok\n"), out.stderr


def test_kill_process_group_for_resume(tmp_path: Path) -> None:
    # A group that outlived its recorder, as resume may find one.
    proc = subprocess.Popen(
        ["sleep", "100"],
        start_new_session=True,
        env=dict(os.environ, DURABLE_AGENT_CALL_ID="call-1", DURABLE_AGENT_RUN_ID="run-a"),
    )
    _started_groups.append(proc.pid)
    try:
        assert process_group_alive(proc.pid)
        assert process_group_alive(proc.pid, call_id="call-1")
        assert process_group_alive(proc.pid, call_id="call-1", run_id="run-a")
        assert not process_group_alive(
            proc.pid, call_id="call-1", run_id="run-b"
        )  # same call id, other run
        assert not kill_process_group(proc.pid, call_id="call-1", run_id="run-b")
        assert not process_group_alive(proc.pid, call_id="someone-else")
        assert not kill_process_group(proc.pid, call_id="someone-else")  # not ours: untouched
        assert proc.poll() is None
        assert kill_process_group(proc.pid, call_id="call-1", grace_s=2)
        assert proc.wait(timeout=5) == -signal.SIGTERM
        assert not process_group_alive(proc.pid)
        assert not kill_process_group(proc.pid)  # nothing left to kill
    finally:
        proc.kill()
        proc.wait()


def test_refuses_to_kill_its_own_group_or_init() -> None:
    for pgid in (0, 1, os.getpgrp()):
        with pytest.raises(ValueError):
            kill_process_group(pgid)


HARNESS = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from durable_agent.tools.process import command_env, run_process

    workspace = Path(sys.argv[1])
    run_process(
        "sleep 60 & echo $! > child.pid; wait",
        cwd=workspace,
        env=command_env(os.environ, run_id="r", call_id="c"),
        timeout_s=120,
        on_start=lambda pgid: (workspace / "pgid").write_text(str(pgid)),  # an int: not a deadline
        sandbox=None,
    )
    (workspace / "harness-finished").write_text("should have been killed")
""")


def test_command_dies_with_a_harness_killed_by_sigkill(tmp_path: Path) -> None:
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    harness = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
    try:
        wait_for(
            lambda: read_pid(tmp_path / "child.pid") is not None,
            15,
            "the harness to start its command",
        )
        child = read_pid(tmp_path / "child.pid")
        pgid = read_pid(tmp_path / "pgid")
        assert child is not None and pgid is not None
        assert pid_alive(child) and process_group_alive(pgid)
        recorded_pgid = pgid

        harness.send_signal(signal.SIGKILL)
        assert harness.wait(timeout=5) == -signal.SIGKILL

        wait_for(lambda: not pid_alive(child), 5, "the grandchild sleep to die with the harness")
        wait_for(lambda: not process_group_alive(recorded_pgid), 5, "the whole group to be gone")
        assert not (tmp_path / "harness-finished").exists()
    finally:
        harness.kill()
        harness.wait()
        pgid = read_pid(tmp_path / "pgid")
        if pgid is not None:
            _started_groups.append(pgid)


@pytest.mark.parametrize(
    ("go", "starts"),
    [
        (b"g -\n", True),
        (b"g %.6f\n", True),
        (b"g -\nmore", True),
        (b"g 1.0\n", False),
        (b"g nan\n", False),
        (b"g abc\n", False),
        (b"x\n", False),
        (b"", False),
    ],
)
def test_the_guard_starts_the_command_only_on_a_go_before_its_deadline(
    go: bytes, starts: bool, tmp_path: Path
) -> None:
    # The harness's own check comes first (run_process); this is the guard's, for a harness
    # frozen between that check and its write. b"%.6f": an hour from now; 1.0: long past.
    if b"%" in go:
        go = go % (time.clock_gettime(time.CLOCK_BOOTTIME) + 3600)
    watch_r, watch_w = os.pipe()
    status_r, status_w = os.pipe()
    guard = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-S",
            str(GUARD_SCRIPT),
            str(watch_r),
            str(status_w),
            "/bin/sh",
            "-c",
            "echo ran > ledger",
        ],
        cwd=tmp_path,
        pass_fds=(watch_r, status_w),
        start_new_session=True,
    )
    os.close(watch_r)
    os.close(status_w)
    os.write(watch_w, go)
    if not go:
        os.close(watch_w)  # the harness went away before any go
    with os.fdopen(status_r, "rb") as status:
        said = status.read()  # until the guard is gone
    guard.wait(timeout=30)
    if go:
        os.close(watch_w)
    assert (tmp_path / "ledger").exists() == starts
    assert said == (b"exit 0\n" if starts else b"late\n" if go.startswith(b"g ") else b"")
