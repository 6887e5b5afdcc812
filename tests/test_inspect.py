"""`list` and `show`: what they print, their JSON, and their exit codes (unknown ids, empty
stores, crashed and blocked runs)."""

from __future__ import annotations

import json
import re

import pytest

FIX = [
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "missing.txt"}}]},
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hello\n"}}]},
    {"content": "wrote a.txt"},
]


def start(cli_inproc, model: str, *extra: str) -> str:  # type: ignore[no-untyped-def]
    r = cli_inproc("start", "a task", "--model", model, "--json", *extra)
    return str(r.json()["run_id"])


def test_list_on_an_empty_store_says_how_to_begin(cli_inproc) -> None:
    r = cli_inproc("list")
    assert r.code == 0
    assert "no runs yet" in r.stdout and "durable-agent demo" in r.stdout
    r = cli_inproc("list", "--json")
    assert (r.code, json.loads(r.stdout)) == (0, [])
    r = cli_inproc("list", "--status", "failed")
    assert (r.code, r.stdout.strip()) == (0, "no runs with status failed")


@pytest.mark.parametrize(
    "command", [["show", "nope"], ["show", "nope", "--json"], ["export", "nope"]]
)
def test_unknown_run_id_exits_2_with_a_hint(cli_inproc, write_script, command) -> None:
    for populated in (False, True):  # an empty store, then one with a run in it
        if populated:
            start(cli_inproc, write_script([{"content": "hi"}]))
        r = cli_inproc(*command)
        assert r.code == 2
        assert r.stdout == ""
        assert "no run with id 'nope'" in r.stderr and "durable-agent list" in r.stderr


def test_list_is_newest_first_filters_by_status_and_rejects_unknown_statuses(
    cli_inproc, write_script
) -> None:
    done = start(cli_inproc, write_script([{"content": "done"}]))
    cut = start(cli_inproc, write_script(FIX), "--max-steps", "1")
    r = cli_inproc("list")
    assert r.code == 0
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "MODEL", "CALLS", "TOKENS", "COST", "AGE", "TASK"]
    assert [line.split()[:3] for line in lines[1:]] == [
        [cut, "budget_exceeded", "1"],
        [done, "completed", "1"],
    ]

    r = cli_inproc("list", "--status", "completed", "--json")
    rows = json.loads(r.stdout)
    assert [(row["id"], row["status"]) for row in rows] == [(done, "completed")]
    assert "settings" not in rows[0] and rows[0]["prompt_tokens"] > 0

    r = cli_inproc("list", "--status", "bogus")
    assert r.code == 2 and "unknown status 'bogus'" in r.stderr


def test_show_prints_header_timeline_tokens_attempts_and_errors(
    cli_inproc, write_script, sql
) -> None:
    run_id = start(cli_inproc, write_script(FIX))
    r = cli_inproc("show", run_id[:6])  # a unique prefix is enough
    assert r.code == 0
    out = r.stdout
    assert f"run        {run_id}" in out
    assert "status     completed (finished)" in out
    assert "answer     wrote a.txt" in out
    ((prompt, completion),) = sql(
        "SELECT prompt_tokens, completion_tokens FROM runs WHERE id=?", run_id
    )
    # Model calls (what --max-steps counts) and steps (the table's rows) are named apart.
    assert (
        f"3 model calls · 5 steps · 2 tool calls · 7 messages · {prompt}+{completion} tokens" in out
    )

    table = out[out.index("#  KIND") :].splitlines()
    assert table[0].split() == ["#", "KIND", "STATE", "TIME", "TOKENS", "COST", "TRIES", "WHAT"]
    rows = sql(
        "SELECT seq, kind, state, prompt_tokens, completion_tokens, error FROM steps "
        "WHERE run_id=? ORDER BY seq",
        run_id,
    )
    printed = [line for line in table[1:] if re.match(r"\s+\d+  ", line)]
    assert len(printed) == len(rows) == 5
    for line, (seq, kind, state, p, c, _error) in zip(printed, rows, strict=True):
        fields = line.split()
        assert fields[:3] == [str(seq), kind, state]  # the stored seq
        if kind == "model":
            assert f"{p}+{c}" in fields
    assert "read_file" in printed[1] and "failed" in printed[1]
    error_line = table[table.index(printed[1]) + 1]
    assert error_line.strip().startswith("error:") and "missing.txt" in error_line
    assert "model call 3 → answer: wrote a.txt" in printed[-1]
    assert "model call 1 → " in printed[0]


def test_show_json_has_the_run_its_steps_and_approvals(cli_inproc, write_script, sql) -> None:
    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "touch made.txt"}}]},
            {"content": "ok"},
        ]
    )
    r = cli_inproc("start", "t", "--model", script, "--shell", "ask", "--json")
    assert r.code == 5, r.stderr  # blocked: the command is not on the allowlist
    run_id = r.json()["run_id"]

    doc = cli_inproc("show", run_id, "--json").json()
    assert (doc["id"], doc["status"], doc["stop_reason"]) == (
        run_id,
        "blocked",
        "approval_required",
    )
    assert [s["seq"] for s in doc["steps"]] == [0]
    assert doc["steps"][0]["output"]["tool_calls"][0]["function"]["name"] == "run_command"
    assert doc["created_at"].endswith("Z")
    [approval] = doc["approvals"]
    assert (approval["kind"], approval["command"], approval["decision"]) == (
        "approval_required",
        "touch made.txt",
        None,
    )

    text = cli_inproc("show", run_id).stdout
    approvals = text[text.index("\napprovals\n") :]
    assert "approval_required · PENDING · call call_0_0 · run_command `touch made.txt`" in approvals
    assert f"durable-agent approve {run_id}" in text

    assert cli_inproc("approve", run_id, "--by", "ada").code == 0
    text = cli_inproc("show", run_id).stdout
    assert "approval_required · approved by ada" in text
    assert "answer with:" not in text


def test_show_marks_a_crashed_step_cut_off_and_where_the_resume_began(cli, write_script) -> None:
    script = write_script(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}}
                ]
            },
            {"content": "done"},
        ]
    )
    # Boundaries: model intent (1, 2), model outcome (3, 4), write intent (5, 6): 6 is just
    # after the write's intent committed, before the file is written.
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--run-id",
        "crashy",
        extra_env={"DURABLE_AGENT_CRASH_AFTER": "6"},
    )
    assert r.code == -9
    out = cli("show", "crashy").stdout
    assert "status     running" in out
    assert "is gone: `durable-agent resume crashy` continues the run" in out
    [write_row] = [line for line in out.splitlines() if re.match(r"\s+\d+  tool ", line)]
    assert write_row.split()[:3] == ["1", "tool", "cut"]  # "cut off"

    assert cli("resume", "crashy").code == 0
    out = cli("show", "crashy").stdout
    assert "resumed 1×" in out
    lines = out.splitlines()
    marker = next(i for i, line in enumerate(lines) if "── resumed (lease epoch 2) ──" in line)
    assert lines[marker + 1].split()[:3] == [
        "1",
        "tool",
        "completed",
    ]  # the write, settled by the resume
    assert "cut off" not in out and "is gone" not in out


def test_show_of_a_run_without_steps(cli_inproc, write_script) -> None:
    r = cli_inproc("start", "t", "--model", write_script([{"content": "x"}]), "--detach")
    run_id = r.stdout.strip()
    out = cli_inproc("show", run_id).stdout
    assert "status     pending" in out and "no steps recorded yet" in out
