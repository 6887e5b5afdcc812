"""Exactly-once commands through crashes (SPEC §5, exec row of the reconciliation table).

Each command appends its own DURABLE_AGENT_CALL_ID to a ledger file in the workspace, so
the ledger is the ground truth of how often each call really ran. The rule checked: a
call runs at most once, unless a person approved running it again after a crash, and
the approvals table then holds that decision.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from side_effects_support import (
    assert_history_valid,
    ledger_lines,
    pid_alive,
    poll_query,
    query,
    run_cli,
    spawn,
    wait_for,
)

from durable_agent.tools.process import process_group_alive

APPEND = "echo $DURABLE_AGENT_CALL_ID >> ledger"
# Two commands in one model turn, then the answer. Checkpoint boundaries of `start`
# (each write transaction is two: before and after its commit):
#   model 0: intent 1-2, outcome 3-4
#   call_0_0: intent 5-6, pgid 7-8, (runs), outcome 9-10
#   call_0_1: intent 11-12, pgid 13-14, (runs), outcome 15-16
#   model 1: intent 17-18, outcome 19-20;  run finished 21-22
LEDGER_SCRIPT = [
    {
        "tool_calls": [
            {"name": "run_command", "arguments": {"command": APPEND}},
            {"name": "run_command", "arguments": {"command": APPEND + " && echo second"}},
        ]
    },
    {"content": "done"},
]
BOUNDARIES = 22
CALLS = ("call_0_0", "call_0_1")


def _scenario_env(env: dict[str, str], root: Path) -> tuple[dict[str, str], Path, Path]:
    """Its own database and workspace, so scenarios can run side by side."""
    root.mkdir()
    (root / "ws").mkdir()
    script = root / "script.json"
    script.write_text(json.dumps(LEDGER_SCRIPT))
    return {**env, "DURABLE_AGENT_DB": f"sqlite:///{root / 'store.db'}"}, root / "ws", script


def _drive_to_the_end(
    env: dict[str, str],
    ws: Path,
    db: Path,
    *,
    deny: bool,
    crash_env: dict[str, str],
    max_sessions: int = 30,
) -> list[str]:
    """Resume until completed, deciding every approval the run blocks on. Returns the exit
    codes seen, for the failure message."""
    codes: list[str] = []
    if query(db, "SELECT status FROM runs") == [("completed",)]:
        return codes  # the crash hit after the run's last commit
    for _ in range(max_sessions):
        r = run_cli({**env, **crash_env}, ws, "resume", "r", "--quiet")
        codes.append(str(r.code))
        if r.code == 0:
            return codes
        if r.code == 5:
            decided = run_cli(
                env, ws, "approve", "r", "--by", "tester", *(["--deny"] if deny else [])
            )
            assert decided.code == 0, decided.stderr
        elif r.code != -signal.SIGKILL:
            pytest.fail(f"resume exited {r.code}: {r.stderr}")
    pytest.fail(f"the run did not complete in {max_sessions} sessions: exit codes {codes}")


def _check_ledger(db: Path, ws: Path) -> Counter[str]:
    """What holds after any sequence of crashes and decisions; returns the ledger counts."""
    assert query(db, "SELECT status, stop_reason FROM runs") == [("completed", "finished")]
    assert_history_valid(db, "r")
    runs = Counter(ledger_lines(ws))
    assert set(runs) <= set(CALLS)
    decided = query(
        db,
        "SELECT call_id, decision FROM approvals WHERE kind='uncertain_side_effect' "
        "AND decided_by='tester' AND used_at IS NOT NULL",
    )
    approved = Counter(c for c, d in decided if d == "approved")
    for call in CALLS:
        # A re-run only ever happens with a person's recorded approval, one per re-run.
        assert runs[call] <= 1 + approved[call], (call, runs, decided)
        if runs[call] == 0:  # never ran: only a person can have decided that, and the model knows
            assert (call, "denied") in decided
            told = query(db, "SELECT content FROM messages WHERE tool_call_id=?", call)[0][0]
            assert "chose not to run it again" in told
    # Every call has exactly one step row, and it is settled.
    states = query(db, "SELECT call_id, state FROM steps WHERE kind='tool' ORDER BY call_id")
    assert [c for c, _ in states] == list(CALLS) and all(
        s in ("completed", "failed") for _, s in states
    )
    return runs


def test_the_sweep_covers_every_boundary(env: dict[str, str], tmp_path: Path) -> None:
    # If the checkpoints of this script change, BOUNDARIES must follow, or the sweep below
    # silently stops covering the last windows.
    env1, ws1, script1 = _scenario_env(env, tmp_path / "last")
    last = run_cli(
        {**env1, "DURABLE_AGENT_CRASH_AFTER": str(BOUNDARIES)},
        ws1,
        "start",
        "t",
        "--quiet",
        "--model",
        f"scripted:{script1}",
        "--shell",
        "allow",
        "--run-id",
        "r",
    )
    assert last.code == -signal.SIGKILL
    env2, ws2, script2 = _scenario_env(env, tmp_path / "past")
    past = run_cli(
        {**env2, "DURABLE_AGENT_CRASH_AFTER": str(BOUNDARIES + 1)},
        ws2,
        "start",
        "t",
        "--quiet",
        "--model",
        f"scripted:{script2}",
        "--shell",
        "allow",
        "--run-id",
        "r",
    )
    assert past.code == 0, past.stderr
    assert ledger_lines(ws2) == list(CALLS)


# Crash points whose uncertain command is denied; at all others it is approved.
DENIED = {8, 15}
# Where the outcome of a command is unknown: its pgid is committed, its outcome is not. (Cut
# off between its intent and its pgid, at 6-7 and 12-13, it provably never began: resume
# runs it without asking.)
UNCERTAIN = {**dict.fromkeys(range(8, 10), "call_0_0"), **dict.fromkeys(range(14, 16), "call_0_1")}
ONCE_EACH = Counter(CALLS)
EXPECTED = {
    8: Counter({"call_0_1": 1}),  # pgid recorded, the guard never got the go: denied, never ran
    9: ONCE_EACH + Counter({"call_0_0": 1}),  # it had run; a person approved running it again
    15: ONCE_EACH,  # it had run; the re-run was denied
}


@pytest.mark.slow
def test_crash_at_every_boundary_then_resume_runs_each_command_once_unless_approved(
    env: dict[str, str], tmp_path: Path
) -> None:
    def scenario(n: int) -> tuple[int, Counter[str], list[Any]]:
        root = tmp_path / f"crash{n}"
        senv, ws, script = _scenario_env(env, root)
        r = run_cli(
            {**senv, "DURABLE_AGENT_CRASH_AFTER": str(n)},
            ws,
            "start",
            "t",
            "--quiet",
            "--model",
            f"scripted:{script}",
            "--shell",
            "allow",
            "--run-id",
            "r",
        )
        assert r.code == -signal.SIGKILL, (n, r.code, r.stderr)
        _drive_to_the_end(senv, ws, root / "store.db", deny=n in DENIED, crash_env={})
        runs = _check_ledger(root / "store.db", ws)
        return n, runs, query(root / "store.db", "SELECT call_id, decision FROM approvals")

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = {
            n: (runs, approvals)
            for n, runs, approvals in pool.map(scenario, range(1, BOUNDARIES + 1))
        }
    for n, (runs, approvals) in results.items():
        assert runs == EXPECTED.get(n, ONCE_EACH), (n, runs)
        expected = (
            [(UNCERTAIN[n], "denied" if n in DENIED else "approved")] if n in UNCERTAIN else []
        )
        assert approvals == expected, (n, approvals)


@pytest.mark.slow
@pytest.mark.parametrize("every", [7, 11])
def test_repeated_crashes_every_kth_boundary_still_settle_each_command(
    every: int, env: dict[str, str], tmp_path: Path
) -> None:
    senv, ws, script = _scenario_env(env, tmp_path / "chain")
    crash = {"DURABLE_AGENT_CRASH_AFTER": str(every)}
    r = run_cli(
        {**senv, **crash},
        ws,
        "start",
        "t",
        "--quiet",
        "--model",
        f"scripted:{script}",
        "--shell",
        "allow",
        "--run-id",
        "r",
    )
    assert r.code == -signal.SIGKILL
    _drive_to_the_end(senv, ws, tmp_path / "chain" / "store.db", deny=False, crash_env=crash)
    runs = _check_ledger(tmp_path / "chain" / "store.db", ws)
    assert set(runs) == set(CALLS)  # every re-run was approved: each call ran at least once


SLOW_APPEND = "echo $DURABLE_AGENT_CALL_ID > started; sleep 2; " + APPEND


def _kill_mid_command(
    env: dict[str, str], workspace: Path, db: Path, tmp_path: Path, script: str
) -> int:
    """Start a run, SIGKILL the CLI while its command sleeps; returns the command's pgid."""
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
        "k",
    )
    try:
        pgid = wait_for(
            lambda: poll_query(
                db,
                "SELECT pgid FROM steps WHERE tool_name='run_command' "
                "AND state='started' AND pgid IS NOT NULL",
            ),
            what="the started run_command step with its pgid",
        )[0][0]
        wait_for(lambda: (workspace / "started").exists(), what="the command to start")
        assert process_group_alive(pgid, call_id="call_0_0")
        os.kill(cli.proc.pid, signal.SIGKILL)  # from outside, like the OOM killer
        assert cli.wait() == -signal.SIGKILL
    finally:
        cli.kill()
    # The guard sees its pipe to the dead harness close and kills the whole group.
    wait_for(
        lambda: not process_group_alive(pgid), timeout_s=10, what=f"process group {pgid} to die"
    )
    return pgid


@pytest.mark.slow
def test_kill_9_mid_command_kills_its_group_blocks_and_approval_runs_it_once(
    cli, write_script, env, workspace, db_path, sql, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": SLOW_APPEND}}]},
            {"content": "done"},
        ]
    )
    pgid = _kill_mid_command(env, workspace, db_path, tmp_path, script)
    assert ledger_lines(workspace) == []  # killed in its sleep: the append never happened

    r = cli("resume", "k")
    assert r.code == 5, r.stderr
    assert sql("SELECT status, stop_reason FROM runs") == [("blocked", "uncertain_side_effect")]
    assert "durable-agent approve k" in r.stderr and SLOW_APPEND in r.stderr
    assert ledger_lines(workspace) == []  # resume never re-ran it on its own
    assert cli("resume", "k").code == 5  # undecided: still blocked

    a = cli("approve", "k", "--by", "alice")
    assert a.code == 0 and "approved" in a.stdout and "call_0_0" in a.stdout
    r = cli("resume", "k")
    assert r.code == 0, r.stderr
    assert ledger_lines(workspace) == ["call_0_0"]
    seq, attempts, state, new_pgid = sql(
        "SELECT seq, attempts, state, pgid FROM steps WHERE call_id='call_0_0'"
    )[0]
    assert (attempts, state) == (2, "completed") and new_pgid != pgid
    assert sql(
        "SELECT call_id, kind, decision, decided_by, step_seq, used_at IS NOT NULL, command FROM approvals"
    ) == [("call_0_0", "uncertain_side_effect", "approved", "alice", seq, 1, SLOW_APPEND)]
    assert_history_valid(db_path, "k")


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_kill_9_mid_command_then_deny_tells_the_model_and_runs_nothing(
    cli, write_script, env, workspace, db_path, sql, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": SLOW_APPEND}}]},
            {"content": "done"},
        ]
    )
    _kill_mid_command(env, workspace, db_path, tmp_path, script)
    assert cli("resume", "k").code == 5
    assert cli("approve", "k", "--deny").code == 0
    r = cli("resume", "k")
    assert r.code == 0 and r.stdout.strip() == "done", r.stderr
    assert ledger_lines(workspace) == []
    told = sql("SELECT content FROM messages WHERE role='tool' AND tool_call_id='call_0_0'")[0][0]
    assert "interrupted" in told and "chose not to run it again" in told
    assert sql("SELECT state FROM steps WHERE call_id='call_0_0'") == [("failed",)]
    assert sql("SELECT decision, used_at IS NOT NULL FROM approvals") == [("denied", 1)]
    assert_history_valid(db_path, "k")


def test_unattended_setting_tells_the_model_instead_of_blocking(
    cli, write_script, env, workspace, sql, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "worker.toml"
    config.write_text('on_uncertain_exec = "tell_model"\n')
    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": APPEND}}]},
            {"content": "done"},
        ]
    )
    # Boundary 9: the command has run, its outcome is not committed.
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--shell",
        "allow",
        "--run-id",
        "u",
        extra_env={"DURABLE_AGENT_CRASH_AFTER": "9", "DURABLE_AGENT_CONFIG": str(config)},
    )
    assert r.code == -signal.SIGKILL
    assert ledger_lines(workspace) == ["call_0_0"]
    r = cli("resume", "u", extra_env={"DURABLE_AGENT_CONFIG": str(config)})
    assert r.code == 0, r.stderr
    assert ledger_lines(workspace) == ["call_0_0"]  # not run again
    assert sql("SELECT count(*) FROM approvals") == [(0,)]
    told = sql("SELECT content FROM messages WHERE role='tool'")[0][0]
    assert "interrupted by a crash" in told and "not run again" in told


def test_run_command_results_are_observations(cli, write_script, workspace, sql) -> None:  # type: ignore[no-untyped-def]
    # Non-zero exit, stderr, a timeout that kills the group, a huge output: all go back to the
    # model as tool results and the loop goes on to the answer.
    script = write_script(
        [
            {
                "tool_calls": [
                    {"name": "run_command", "arguments": {"command": "pwd; echo oops >&2; exit 3"}}
                ]
            },
            {
                "tool_calls": [
                    {
                        "name": "run_command",
                        "arguments": {
                            "command": "sleep 30 & echo $! > bg.pid; sleep 30",
                            "timeout_s": 1,
                        },
                    }
                ]
            },
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "seq 1 200000"}}]},
            {"content": "done"},
        ]
    )
    # Unsandboxed: bg.pid must be a host pid (the sandbox's PID namespace has its own).
    r = cli(
        "start", "t", "--model", script, "--shell", "allow", "--run-id", "o", "--sandbox", "off"
    )
    assert r.code == 0 and r.stdout.strip() == "done", r.stderr
    first, timed, big = (
        c for (c,) in sql("SELECT content FROM messages WHERE role='tool' ORDER BY seq")
    )
    assert first.startswith("exit code: 3") and str(workspace) in first and "stderr:\noops" in first
    assert timed.startswith("Error: timed out after 1 s") and "exit code: none (killed)" in timed
    assert not pid_alive(int((workspace / "bg.pid").read_text()))  # the background child went too
    assert "truncated" in big and "200000" in big and len(big) <= 20_000
    assert sql("SELECT state FROM steps WHERE kind='tool' ORDER BY seq") == [
        ("completed",),
        ("failed",),
        ("completed",),
    ]


def test_a_long_command_output_is_cut_once_with_one_marker(
    cli, write_script, workspace, sql
) -> None:  # type: ignore[no-untyped-def]
    script = write_script(
        [
            {
                "tool_calls": [
                    {
                        "name": "run_command",
                        "arguments": {"command": "seq 1 200000; seq 1 50000 >&2"},
                    }
                ]
            },
            {"content": "done"},
        ]
    )
    assert cli("start", "t", "--model", script, "--shell", "allow").code == 0
    content = sql("SELECT content FROM messages WHERE role='tool'")[0][0]
    assert content.count("truncated") == 2  # one marker per stream, none from a second cap
    assert "stdout:\n1\n" in content and "200000" in content and "50000" in content


# -- A command cut off before its process group was committed never began ---------------------
ONE_APPEND = [
    {"tool_calls": [{"name": "run_command", "arguments": {"command": APPEND}}]},
    {"content": "done"},
]


def test_a_command_cut_off_before_its_pgid_runs_on_resume_without_a_question_even_under_ask(
    cli, write_script, workspace, sql
) -> None:  # type: ignore[no-untyped-def]
    # --shell ask: the person approves the command; the attempt is killed between its intent
    # (boundary 6, committed) and its pgid. That approval was for a command that never ran:
    # it still stands, and no other question is asked.
    script = write_script(ONE_APPEND)
    assert cli("start", "t", "--model", script, "--shell", "ask", "--run-id", "a").code == 5
    assert cli("approve", "a", "--by", "alice").code == 0
    r = cli("resume", "a", extra_env={"DURABLE_AGENT_CRASH_AFTER": "2"})  # intent 1-2, pgid 3-4
    assert r.code == -signal.SIGKILL
    assert sql("SELECT state, pgid FROM steps WHERE kind = 'tool'") == [("started", None)]
    r = cli("resume", "a")
    assert r.code == 0, r.stderr
    assert ledger_lines(workspace) == ["call_0_0"]
    assert sql("SELECT kind, decision FROM approvals") == [("approval_required", "approved")]


def test_a_retry_approved_after_a_crash_and_cut_off_before_its_pgid_runs_without_a_second_question(
    cli, write_script, workspace, sql
) -> None:  # type: ignore[no-untyped-def]
    # Boundary 8: the pgid is committed, the guard never got the go: a person decides. The
    # approved retry is cut off before its own pgid (the old attempt's is not kept): it runs.
    script = write_script(ONE_APPEND)
    assert (
        cli(
            "start",
            "t",
            "--model",
            script,
            "--shell",
            "allow",
            "--run-id",
            "b",
            extra_env={"DURABLE_AGENT_CRASH_AFTER": "8"},
        ).code
        == -signal.SIGKILL
    )
    assert cli("resume", "b").code == 5
    assert cli("approve", "b", "--by", "alice").code == 0
    assert cli("resume", "b", extra_env={"DURABLE_AGENT_CRASH_AFTER": "2"}).code == -signal.SIGKILL
    assert sql("SELECT state, pgid, attempts FROM steps WHERE kind = 'tool'") == [
        ("started", None, 2)
    ]
    r = cli("resume", "b")
    assert r.code == 0, r.stderr
    assert ledger_lines(workspace) == ["call_0_0"]
    assert sql("SELECT kind, decision FROM approvals") == [("uncertain_side_effect", "approved")]


@pytest.mark.parametrize("why", ["an older row", "fast durability", "files changed"])
def test_a_command_cut_off_before_its_pgid_still_asks_without_the_evidence(
    why: str, cli, write_script, workspace, db_path, sql
) -> None:  # type: ignore[no-untyped-def]
    script = write_script(ONE_APPEND)
    flags = ("--durability", "fast") if why == "fast durability" else ()
    assert (
        cli(
            "start",
            "t",
            "--model",
            script,
            "--shell",
            "allow",
            "--run-id",
            "c",
            *flags,
            extra_env={"DURABLE_AGENT_CRASH_AFTER": "6"},
        ).code
        == -signal.SIGKILL
    )
    assert sql("SELECT state, pgid FROM steps WHERE kind = 'tool'") == [("started", None)]
    if why == "an older row":  # written by a release that did not record the protocol
        import sqlite3

        with sqlite3.connect(db_path) as conn:
            conn.execute(
                "UPDATE steps SET input = json_remove(input, '$.pgid_before_start') WHERE kind = 'tool'"
            )
    if why == "files changed":  # something ran after all: only a person can tell what
        (workspace / "ledger").write_text("call_0_0\n")
    r = cli("resume", "c")
    assert r.code == 5, r.stderr
    assert sql("SELECT kind FROM approvals") == [("uncertain_side_effect",)]


SHADOW = '''
import os, signal, sys
from typing import ClassVar
from pydantic import BaseModel
from durable_agent import tools
from durable_agent.cli.parser import main
from durable_agent.status import EffectClass


class Args(BaseModel):
    command: str


class ItsOwnRunCommand:
    """A program's own exec tool under the built-in's name: it acts, then its process dies."""
    name: ClassVar[str] = "run_command"
    description: ClassVar[str] = "runs the command its own way"
    args_model: ClassVar[type[BaseModel]] = Args
    effect: ClassVar[EffectClass] = EffectClass.EXEC

    def run(self, args, ctx):
        with open(os.environ["OUTSIDE_LEDGER"], "a") as f:  # an effect outside the workspace
            f.write(ctx.call_id + "\\n")
        os.kill(os.getpid(), signal.SIGKILL)


tools.register_tool(ItsOwnRunCommand())
sys.exit(main(sys.argv[1:]))
'''


def test_a_tool_of_its_own_under_the_run_command_name_that_ran_is_asked_about_not_run_again(
    env, write_script, workspace, sql, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # No pgid is ever recorded by such a tool: its intent must not claim the guard protocol,
    # or the built-in run_command that answers on resume would run the command again.
    script = write_script(ONE_APPEND)
    program = tmp_path / "program.py"
    program.write_text(SHADOW)
    outside = tmp_path / "outside-ledger"
    first = subprocess.run(
        [
            sys.executable,
            str(program),
            "start",
            "t",
            "--model",
            script,
            "--shell",
            "allow",
            "--run-id",
            "s",
        ],
        cwd=workspace,
        env={**env, "OUTSIDE_LEDGER": str(outside)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert outside.read_text().split() == ["call_0_0"]  # it acted (the workspace is unchanged)
    assert sql("SELECT state, pgid FROM steps WHERE kind = 'tool'") == [("started", None)]
    r = run_cli(env, workspace, "resume", "s")
    assert r.code == 5, r.stderr
    # The run_command of this resume is another tool (another schema) than the one the
    # history called: a person consents first (docs/versions.md), then is asked about it.
    assert sql("SELECT kind FROM approvals") == [("changed_since_checkpoint",)]
    r = run_cli(env, workspace, "resume", "s", "--accept-changes")
    assert r.code == 5, r.stderr
    assert ledger_lines(workspace) == []  # not run again by the built-in run_command
    assert sql("SELECT kind FROM approvals") == [
        ("changed_since_checkpoint",),
        ("uncertain_side_effect",),
    ]
