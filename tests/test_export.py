"""`export`: the JSONL transcript of SPEC §9 is complete (every recorded step, approval and
resume is in it) and ordered, for runs killed with SIGKILL at different instants and
resumed, for blocked runs, and with long results truncated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from durable_agent.transcript import EVENT_TYPES, RESULT_CAP

SCRIPT = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "x\n"}}]},
    {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo hi"}}]},
    {"content": "done"},
]
STEPS = [
    "model_completed",
    "tool_started",
    "tool_completed",
    "model_completed",
    "tool_started",
    "tool_completed",
    "model_completed",
    "run_finished",
]


def export(cli, run_id: str) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    r = cli("export", run_id)
    assert r.code == 0, r.stderr
    assert r.stdout.endswith("\n")
    return [json.loads(line) for line in r.stdout.splitlines()]


def check_complete_and_ordered(events: list[dict[str, Any]], sql, run_id: str) -> None:  # type: ignore[no-untyped-def]
    assert [e["seq"] for e in events] == list(range(len(events)))
    for e in events:
        assert list(e)[:4] == ["type", "run_id", "seq", "at"]
        assert e["type"] in EVENT_TYPES and e["run_id"] == run_id and e["at"].endswith("Z")
    assert [e["at"] for e in events] == sorted(e["at"] for e in events), "events go forward in time"
    assert events[0]["type"] == "run_started"

    def of(kind: str) -> list[int]:
        return [e["step_seq"] for e in events if e["type"] == kind]

    steps = sql(
        "SELECT seq, kind, finished_at IS NOT NULL FROM steps WHERE run_id=? ORDER BY seq", run_id
    )
    assert of("model_completed") == [s for s, k, done in steps if k == "model" and done]
    assert of("tool_started") == [s for s, k, _ in steps if k != "model"]
    assert of("tool_completed") == [s for s, k, done in steps if k != "model" and done]
    step_events = [e["step_seq"] for e in events if "step_seq" in e]
    assert step_events == sorted(step_events), "steps appear in their recorded order"
    ((resumes, status),) = sql("SELECT resume_count, status FROM runs WHERE id=?", run_id)
    assert len([e for e in events if e["type"] == "run_resumed"]) == resumes
    assert (events[-1]["type"] == "run_finished") == (status not in ("running", "pending"))
    ((approvals,),) = sql("SELECT COUNT(*) FROM approvals WHERE run_id=?", run_id)
    assert len([e for e in events if e["type"] == "approval_requested"]) == approvals


# Crash points, in checkpoint boundaries (two per write transaction: before and after its
# commit), with how many events the run had before the resume, and the steps tried twice.
@pytest.mark.parametrize(
    ("crash_after", "events_before", "attempts"),
    [
        (2, 0, {0: 2}),  # the first model call's intent committed, the call not made: asked again
        (4, 1, {}),  # its outcome committed: reused
        (6, 1, {1: 2}),  # the write's intent committed, the file not written: written by the resume
        (
            7,
            3,
            {},
        ),  # the file written, its outcome not: the resume sees the new hash, writes nothing
    ],
)
def test_export_of_a_crashed_and_resumed_run_is_complete_and_ordered(
    cli,
    cli_inproc,
    write_script,
    sql,
    workspace: Path,
    crash_after: int,
    events_before: int,
    attempts: dict[int, int],
) -> None:
    script = write_script(SCRIPT)
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--shell",
        "allow",
        "--run-id",
        "r1",
        extra_env={"DURABLE_AGENT_CRASH_AFTER": str(crash_after)},
    )
    assert r.code == -9, r.stderr
    crashed = export(cli_inproc, "r1")
    check_complete_and_ordered(crashed, sql, "r1")
    assert crashed[-1]["type"] != "run_finished"  # still `running`: it has no end yet

    assert cli_inproc("resume", "r1").code == 0
    events = export(cli_inproc, "r1")
    check_complete_and_ordered(events, sql, "r1")
    # A step the resumed session settled without running it again keeps its place before
    # run_resumed (crash point 7); see transcript.py.
    assert [e["type"] for e in events] == [
        "run_started",
        *STEPS[:events_before],
        "run_resumed",
        *STEPS[events_before:],
    ]
    resumed = events[1 + events_before]
    assert (resumed["lease_epoch"], resumed["resume"]) == (2, 1)
    for e in events:
        if "step_seq" in e:
            assert e["attempts"] == attempts.get(e["step_seq"], 1)

    # Payloads: arguments, results, usage and the end.
    started = {e["tool_name"]: e for e in events if e["type"] == "tool_started"}
    assert started["write_file"]["arguments"] == {"path": "a.txt", "content": "x\n"}
    assert started["write_file"]["effect"] == "write" and started["run_command"]["effect"] == "exec"
    done = {e["tool_name"]: e for e in events if e["type"] == "tool_completed"}
    assert "hi" in done["run_command"]["result"] and done["run_command"]["state"] == "completed"
    models = [e for e in events if e["type"] == "model_completed"]
    tokens = dict(
        (s, (p, c))
        for s, p, c in sql(
            "SELECT seq, prompt_tokens, completion_tokens FROM steps WHERE run_id='r1' AND kind='model'"
        )
    )
    for m in models:
        assert (m["usage"]["prompt_tokens"], m["usage"]["completion_tokens"]) == tokens[
            m["step_seq"]
        ]
    assert models[0]["tool_calls"] == [
        {"id": "call_0_0", "name": "write_file", "arguments": {"path": "a.txt", "content": "x\n"}}
    ]
    assert models[-1]["content"] == "done" and models[-1]["tool_calls"] == []
    end = events[-1]
    assert (end["status"], end["stop_reason"], end["answer"], end["resume_count"]) == (
        "completed",
        "finished",
        "done",
        1,
    )
    assert (workspace / "a.txt").read_text() == "x\n"


def test_an_approval_and_the_resume_after_it(cli_inproc, write_script, sql) -> None:
    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "touch made.txt"}}]},
            {"content": "done"},
        ]
    )
    assert cli_inproc("start", "t", "--model", script, "--shell", "ask", "--run-id", "r2").code == 5
    assert cli_inproc("approve", "r2", "--by", "ada").code == 0
    assert cli_inproc("resume", "r2").code == 0
    events = export(cli_inproc, "r2")
    check_complete_and_ordered(events, sql, "r2")
    assert [e["type"] for e in events] == [
        "run_started",
        "model_completed",
        "approval_requested",
        "run_resumed",
        "tool_started",
        "tool_completed",
        "model_completed",
        "run_finished",
    ]
    approval = events[2]
    assert (
        approval["approval_kind"],
        approval["command"],
        approval["decision"],
        approval["decided_by"],
    ) == ("approval_required", "touch made.txt", "approved", "ada")


def test_an_interrupted_command_asks_a_person_in_its_own_session(
    cli, cli_inproc, write_script, sql
) -> None:
    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo ran >> log"}}]},
            {"content": "done"},
        ]
    )
    # 8: the command's intent and its process group are committed; the harness dies.
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--shell",
        "allow",
        "--run-id",
        "r3",
        extra_env={"DURABLE_AGENT_CRASH_AFTER": "8"},
    )
    assert r.code == -9
    assert cli_inproc("resume", "r3").code == 5  # blocked: uncertain_side_effect
    assert cli_inproc("approve", "r3").code == 0
    assert cli_inproc("resume", "r3").code == 0
    events = export(cli_inproc, "r3")
    check_complete_and_ordered(events, sql, "r3")
    assert [e["type"] for e in events] == [
        "run_started",
        "model_completed",
        "run_resumed",
        "approval_requested",  # the first resume found the cut-off command
        "run_resumed",
        "tool_started",
        "tool_completed",  # the second ran it, approved
        "model_completed",
        "run_finished",
    ]
    assert [e["lease_epoch"] for e in events if e["type"] == "run_resumed"] == [2, 3]
    assert events[3]["approval_kind"] == "uncertain_side_effect"
    assert events[5]["attempts"] == 2


def test_long_results_are_truncated_with_their_size(
    cli_inproc, write_script, workspace: Path
) -> None:
    (workspace / "big.txt").write_text("x" * 100 + "\n" + "y" * 5000 + "\n")
    script = write_script(
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt"}}]},
            {"content": "read"},
        ]
    )
    assert cli_inproc("start", "t", "--model", script, "--run-id", "r4").code == 0
    [done] = [e for e in export(cli_inproc, "r4") if e["type"] == "tool_completed"]
    assert done["truncated"] is True and done["result_chars"] > 5000
    assert done["result"].endswith(f"…[truncated: {done['result_chars']} chars in all]")
    assert len(done["result"]) < RESULT_CAP + 50
