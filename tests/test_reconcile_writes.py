"""An interrupted write is settled by the recorded hashes, never by a guess (SPEC §5).

Commit boundaries of `start` here: model intent (ticks 1-2), model outcome (3-4), write
intent (5-6), write outcome (7-8). CRASH_AFTER=6 dies after the intent, before the write;
CRASH_AFTER=7 dies after the write, before its outcome is committed.
"""

from __future__ import annotations

import signal

import pytest

WRITE = {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "new\n"}}]}


def start(cli, write_script, crash_after: int):  # type: ignore[no-untyped-def]
    r = cli(
        "start",
        "t",
        "--model",
        write_script([WRITE, {"content": "ok"}]),
        "--run-id",
        "w",
        extra_env={"DURABLE_AGENT_CRASH_AFTER": str(crash_after)},
    )
    assert r.code == -signal.SIGKILL
    return r


def test_write_not_yet_applied_is_applied_on_resume(cli, write_script, workspace, sql) -> None:
    (workspace / "a.txt").write_text("old\n")
    start(cli, write_script, 6)
    assert (workspace / "a.txt").read_text() == "old\n"
    assert sql("SELECT state FROM steps WHERE tool_name='write_file'") == [("started",)]
    assert cli("resume", "w").code == 0
    assert (workspace / "a.txt").read_text() == "new\n"
    assert sql("SELECT state, attempts FROM steps WHERE tool_name='write_file'") == [
        ("completed", 2)
    ]


def test_write_that_landed_is_marked_done_without_writing(
    cli, write_script, workspace, sql
) -> None:
    (workspace / "a.txt").write_text("old\n")
    start(cli, write_script, 7)
    assert (workspace / "a.txt").read_text() == "new\n"
    mtime = (workspace / "a.txt").stat().st_mtime_ns
    assert cli("resume", "w").code == 0
    assert (workspace / "a.txt").stat().st_mtime_ns == mtime
    (
        state,
        attempts,
    ) = sql("SELECT state, attempts FROM steps WHERE tool_name='write_file'")[0]
    assert (state, attempts) == ("completed", 1)
    content = sql("SELECT content FROM messages WHERE role='tool'")[0][0]
    assert "already has the intended content" in content


def test_drift_blocks_until_a_person_decides(cli, write_script, workspace, sql) -> None:
    (workspace / "a.txt").write_text("old\n")
    start(cli, write_script, 6)
    (workspace / "a.txt").write_text("someone else's edit\n")
    r = cli("resume", "w")
    assert r.code == 5
    assert sql("SELECT status, stop_reason FROM runs") == [("blocked", "uncertain_side_effect")]
    assert "drift" in sql("SELECT reason FROM approvals")[0][0]
    assert (workspace / "a.txt").read_text() == "someone else's edit\n"
    assert cli("resume", "w").code == 5  # still undecided: still blocked, nothing written
    assert cli("approve", "w", "--deny").code == 0
    assert cli("resume", "w").code == 0
    assert (workspace / "a.txt").read_text() == "someone else's edit\n"
    assert (
        "chose not to apply it again" in sql("SELECT content FROM messages WHERE role='tool'")[0][0]
    )


@pytest.mark.slow
def test_drift_approved_applies_the_write(cli, write_script, workspace, sql) -> None:
    start(cli, write_script, 6)
    (workspace / "a.txt").write_text("drifted\n")
    assert cli("resume", "w").code == 5
    approve = cli("approve", "w")
    assert approve.code == 0 and "approved" in approve.stdout
    assert cli("resume", "w").code == 0
    assert (workspace / "a.txt").read_text() == "new\n"
    decision, used = sql("SELECT decision, used_at IS NOT NULL FROM approvals")[0]
    assert (decision, used) == ("approved", 1)


@pytest.mark.slow  # waits out a real lease
def test_an_owner_frozen_after_a_writes_intent_never_writes_once_the_run_is_another_s(
    env, write_script, workspace, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # Frozen (SIGSTOP: a paused VM, a stopped job) right after committing the write's intent;
    # another process took the run over and finished it; thawed, the first wrote its old
    # content over the newer file, and the completed run's workspace contradicted its record.
    import os
    import subprocess
    import sys

    from scale_helpers import wait_for
    from side_effects_support import process_state, run_cli, thawed_at_the_end

    (tmp_path / "config.toml").write_text("lease_seconds = 1\n")
    env = {**env, "DURABLE_AGENT_CONFIG": str(tmp_path / "config.toml")}
    first_write = {
        "tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "old\n"}}]
    }
    second_write = {
        "tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "new\n"}}]
    }
    model = write_script([first_write, second_write, {"content": "done"}])
    with (tmp_path / "first.err").open("w") as err:
        first = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "durable_agent",
                "start",
                "t",
                "--model",
                model,
                "--run-id",
                "z",
                "--quiet",
            ],
            cwd=workspace,
            env={**env, "DURABLE_AGENT_STOP_AFTER": "6"},  # after the write's intent
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    with thawed_at_the_end(first):
        wait_for(lambda: process_state(first.pid) == "T", 60, "the first process to freeze itself")
        assert not (workspace / "out.txt").exists()

        def taken_over() -> bool:
            r = run_cli(env, workspace, "resume", "z", "--quiet")
            assert r.code in (0, 6), r.stderr  # 6 until the frozen owner's lease has run out
            return r.code == 0

        wait_for(taken_over, 30, "the takeover")
        assert (workspace / "out.txt").read_text() == "new\n"
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=60) == 6
    assert (workspace / "out.txt").read_text() == "new\n"  # the thawed owner wrote nothing
    assert [p.name for p in workspace.iterdir() if p.name.endswith(".tmp")] == []
    err = (tmp_path / "first.err").read_text()
    assert "Traceback" not in err and "lost the lease on run z" in err, err


def test_a_write_slower_than_its_lease_margin_renews_the_lease_and_lands(
    cli_inproc, write_script, workspace, sql, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    # Past the point where the intent's lease surely holds (a very slow disk, say), the write
    # is not refused while the run is still ours: a fenced checkpoint proves it, then it lands.
    import threading

    from durable_agent.store.journal import BOUNDARY_HOOKS, Journal

    def checkpoints(run_id: str) -> int:
        done: list[str] = []

        def hook(where: str) -> None:
            if where == "after_commit" and threading.current_thread() is threading.main_thread():
                done.append(where)

        BOUNDARY_HOOKS.append(hook)
        try:
            r = cli_inproc(
                "start",
                "t",
                "--model",
                write_script([WRITE, {"content": "ok"}]),
                "--run-id",
                run_id,
            )
        finally:
            BOUNDARY_HOOKS.remove(hook)
        assert r.code == 0, r.stderr
        assert (workspace / "a.txt").read_text() == "new\n"
        (workspace / "a.txt").unlink()
        return len(done)

    on_time = checkpoints("on-time")
    monkeypatch.setattr(
        Journal, "start_deadline", lambda self: float("-inf")
    )  # every write is "late"
    assert checkpoints("slow") == on_time + 1  # the one that proved the run still ours
    assert sql("SELECT state FROM steps WHERE run_id = 'slow' AND tool_name = 'write_file'") == [
        ("completed",)
    ]
