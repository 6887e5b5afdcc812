"""Kill -9 at many instants, resume until done: the result equals an uninterrupted run.

DURABLE_AGENT_CRASH_AFTER=k makes the CLI SIGKILL itself at its k-th checkpoint boundary
(just before or just after a commit), so with k small every window of the run is hit,
from the first intent row to the final status. A second test kills from outside at
arbitrary moments.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import forked_cli
import pytest


def script_turns() -> list[dict[str, Any]]:
    """41 model turns over read, write and edit tools; edits chain on one file."""
    turns: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "log.txt", "content": "END\n"}}
            ]
        }
    ]
    for i in range(19):
        turns.append(
            {
                "tool_calls": [
                    {
                        "name": "write_file",
                        "arguments": {"path": f"src/f{i}.txt", "content": f"value {i}\n"},
                    },
                    {"name": "read_file", "arguments": {"path": f"src/f{i}.txt"}},
                ]
            }
        )
        turns.append(
            {
                "tool_calls": [
                    {
                        "name": "edit_file",
                        "arguments": {
                            "path": "log.txt",
                            "old_string": "END",
                            "new_string": f"line {i}\nEND",
                        },
                    },
                    {"name": "search_text", "arguments": {"pattern": "value", "path": "src"}},
                ]
            }
        )
    turns.append(
        {"tool_calls": [{"name": "list_files", "arguments": {"path": ".", "max_depth": 3}}]}
    )
    turns.append({"content": "finished the chores"})
    return turns


def tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def run_cli(args: list[str], env: dict[str, str], cwd: Path, crash_after: int | None = None) -> int:
    e = dict(env)
    if crash_after is not None:
        e["DURABLE_AGENT_CRASH_AFTER"] = str(crash_after)
    proc = forked_cli.run([*args, "--quiet"], env=e, cwd=cwd)
    if proc.returncode not in (0, -signal.SIGKILL):
        print(proc.stdout, proc.stderr)  # shown by pytest when the test fails
    return proc.returncode


def check_ledger(sql, run_id: str, turns: int) -> None:  # type: ignore[no-untyped-def]
    assert sql("SELECT status, stop_reason, answer FROM runs WHERE id=?", run_id)[0] == (
        "completed",
        "finished",
        "finished the chores",
    )
    assert (
        sql(
            "SELECT idempotency_key, COUNT(*) FROM steps WHERE run_id=? GROUP BY 1 HAVING COUNT(*) > 1",
            run_id,
        )
        == []
    )
    per_turn = sql(
        "SELECT turn, COUNT(*) FROM steps WHERE run_id=? AND kind='model' AND state='completed' "
        "GROUP BY turn ORDER BY turn",
        run_id,
    )
    assert per_turn == [(t, 1) for t in range(turns)], "each model turn completed exactly once"
    assert sql("SELECT COUNT(*) FROM steps WHERE run_id=? AND state != 'completed'", run_id) == [
        (0,)
    ]
    # The run's totals agree with its history.
    assert sql(
        "SELECT step_count, tool_call_count, message_count FROM runs WHERE id=?", run_id
    ) == [
        (
            turns,
            sql("SELECT COUNT(*) FROM messages WHERE run_id=? AND role='tool'", run_id)[0][0],
            sql("SELECT COUNT(*) FROM messages WHERE run_id=?", run_id)[0][0],
        )
    ]
    # One tool message per call, no call answered twice.
    assert (
        sql(
            "SELECT tool_call_id, COUNT(*) FROM messages WHERE run_id=? AND role='tool' "
            "GROUP BY 1 HAVING COUNT(*) > 1",
            run_id,
        )
        == []
    )


@pytest.fixture
def scripted(tmp_path: Path) -> tuple[str, int]:
    turns = script_turns()
    path = tmp_path / "chores.json"
    path.write_text(json.dumps(turns))
    return f"scripted:{path}", len(turns)


@pytest.fixture
def reference(tmp_path: Path, env: dict[str, str], scripted: tuple[str, int]) -> dict[str, str]:
    ws = tmp_path / "reference"
    ws.mkdir()
    e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{tmp_path / 'reference.db'}"}
    assert run_cli(["start", "chores", "--model", scripted[0]], e, ws) == 0
    return tree(ws)


@pytest.mark.slow
@pytest.mark.parametrize("every", [6, 7])  # odd: just before a commit; even: just after
def test_crash_at_every_kth_checkpoint_then_resume(
    every, tmp_path, env, workspace, scripted, reference, sql
) -> None:  # type: ignore[no-untyped-def]
    model, turns = scripted
    code = run_cli(
        ["start", "chores", "--model", model, "--run-id", "crashy"],
        env,
        workspace,
        crash_after=every,
    )
    assert code == -signal.SIGKILL
    crashes = 1
    # A crash right after the final commit leaves a completed run: nothing left to resume.
    while sql("SELECT status FROM runs")[0][0] != "completed" and crashes < 400:
        code = run_cli(["resume", "crashy"], env, workspace, crash_after=every)
        if code != -signal.SIGKILL:
            assert code == 0
            break
        crashes += 1
    print(f"every={every}: {crashes} SIGKILLs before the run completed")
    assert crashes > 30, "the crashes should be spread over the whole run"
    assert tree(workspace) == reference
    check_ledger(sql, "crashy", turns)
    assert sql("SELECT resume_count FROM runs")[0][0] in (crashes - 1, crashes)


@pytest.mark.slow
def test_kill_from_outside_at_arbitrary_moments(
    tmp_path, env, workspace, scripted, reference, sql
) -> None:  # type: ignore[no-untyped-def]
    model, turns = scripted
    # Slow each model turn a little so kills land in calls, tool steps and commits alike.
    slow = [dict(t, delay_s=0.01) for t in json.loads(Path(model[9:]).read_text())]
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(slow))
    args = ["start", "chores", "--model", f"scripted:{path}", "--run-id", "outside", "--quiet"]
    kills = 0
    for attempt in range(60):
        proc = subprocess.Popen(
            [sys.executable, "-m", "durable_agent", *args],
            env=env,
            cwd=workspace,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # Wait for progress past where this session started, then kill at a varying delay.
        before = progress(sql)
        deadline = time.monotonic() + 30
        while proc.poll() is None and progress(sql) <= before and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep((attempt % 7) * 0.013)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        code = proc.wait()
        status = sql("SELECT status FROM runs")
        if code == 0 or status == [("completed",)]:
            break
        assert code == -signal.SIGKILL
        if status:  # killed before the run was created: start again
            args = ["resume", "outside", "--quiet"]
    else:
        # 60 kills (a loaded machine makes little progress between them): the rest of the run
        # in one session, which must finish it from wherever the kills left it.
        assert forked_cli.run(args, env=env, cwd=workspace).returncode == 0
    print(f"{kills} SIGKILLs from outside before the run completed")
    assert kills >= 5
    assert tree(workspace) == reference
    check_ledger(sql, "outside", turns)


def progress(sql) -> int:  # type: ignore[no-untyped-def]
    try:
        return sql("SELECT COUNT(*) FROM steps WHERE state='completed'")[0][0]
    except Exception:  # the store does not exist before the first start
        return -1


def test_crash_points_are_off_by_default() -> None:
    assert "DURABLE_AGENT_CRASH_AFTER" not in os.environ
