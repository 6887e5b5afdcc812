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
    r = cli("start", "t", "--model", write_script([WRITE, {"content": "ok"}]), "--run-id", "w",
            extra_env={"DURABLE_AGENT_CRASH_AFTER": str(crash_after)})
    assert r.code == -signal.SIGKILL
    return r


def test_write_not_yet_applied_is_applied_on_resume(cli, write_script, workspace, sql) -> None:
    (workspace / "a.txt").write_text("old\n")
    start(cli, write_script, 6)
    assert (workspace / "a.txt").read_text() == "old\n"
    assert sql("SELECT state FROM steps WHERE tool_name='write_file'") == [("started",)]
    assert cli("resume", "w").code == 0
    assert (workspace / "a.txt").read_text() == "new\n"
    assert sql("SELECT state, attempts FROM steps WHERE tool_name='write_file'") == [("completed", 2)]


def test_write_that_landed_is_marked_done_without_writing(cli, write_script, workspace, sql) -> None:
    (workspace / "a.txt").write_text("old\n")
    start(cli, write_script, 7)
    assert (workspace / "a.txt").read_text() == "new\n"
    mtime = (workspace / "a.txt").stat().st_mtime_ns
    assert cli("resume", "w").code == 0
    assert (workspace / "a.txt").stat().st_mtime_ns == mtime
    state, attempts, = sql("SELECT state, attempts FROM steps WHERE tool_name='write_file'")[0]
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
    assert "chose not to apply it again" in sql("SELECT content FROM messages WHERE role='tool'")[0][0]


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
