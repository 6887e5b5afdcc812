"""What the command line prints (issue 17): `--json` is one JSON object on every command
that has it, detached or not, and `resume --help` says how budgets work on a resume."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

DONE = {"content": "done"}


def one_object(stdout: str) -> dict[str, Any]:
    value = json.loads(stdout)  # the whole stdout, nothing else
    assert isinstance(value, dict), stdout
    return value


def test_detached_start_and_resume_print_one_json_object(
    cli_inproc: Callable[..., Any], write_script: Callable[..., str], sql: Callable[..., list[Any]]
) -> None:
    model = write_script([DONE])
    started = cli_inproc("start", "t", "--model", model, "--detach", "--json")
    assert started.code == 0, started.stderr
    out = one_object(started.stdout)
    assert out == {"run_id": out["run_id"], "status": "pending"}
    assert sql("SELECT status FROM runs WHERE id = ?", out["run_id"]) == [("pending",)]
    # Without --json: the bare id, as before (scripts read it with $(...)).
    plain = cli_inproc("start", "t", "--model", model, "--detach")
    assert plain.stdout.strip() and "{" not in plain.stdout

    assert cli_inproc("cancel", out["run_id"]).code == 0
    resumed = cli_inproc("resume", out["run_id"], "--detach", "--json")
    assert resumed.code == 0, resumed.stderr
    assert one_object(resumed.stdout) == {"run_id": out["run_id"], "status": "pending"}


def test_every_json_flag_prints_json_only(
    cli_inproc: Callable[..., Any], write_script: Callable[..., str]
) -> None:
    done = cli_inproc("start", "t", "--model", write_script([DONE]), "--json")
    run_id = one_object(done.stdout)["run_id"]
    assert one_object(cli_inproc("show", run_id, "--json").stdout)["id"] == run_id
    listed = json.loads(cli_inproc("list", "--json").stdout)
    assert isinstance(listed, list) and listed[0]["id"] == run_id


def test_resume_help_says_the_recorded_budget_applies(cli: Callable[..., Any]) -> None:
    text = " ".join(cli("resume", "--help").stdout.split())
    assert "(default 50)" not in text and "(default 3)" not in text
    assert "recorded budgets apply" in text and "raises" in text
    # Nor any other start default: the run's recorded shell, sandbox, network, protocol apply.
    assert [d for d in text.split("(default")[1:] if not d.startswith(": SQLite")] == [], text
    assert "recorded values apply unless a flag is given" in text
    start = " ".join(cli("start", "--help").stdout.split())
    assert "(default 50)" in start  # start keeps its defaults


def test_model_calls_and_steps_are_named_apart(
    cli: Callable[..., Any], write_script: Callable[..., str], workspace: Any
) -> None:
    (workspace / "a.txt").write_text("hi\n")
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]}
    model = write_script([read, read, DONE])
    first = cli("start", "t", "--model", model, "--max-steps", "2", "--run-id", "w1")
    assert first.code == 3, first.stderr
    lines = first.stderr.splitlines()
    assert any(line.startswith("Step 2 · model call 2 · ") for line in lines), first.stderr
    assert any(line.startswith("Step 3 · tool · read_file") for line in lines), first.stderr
    assert "2 model calls · 4 steps · 2 tool calls · " in first.stderr
    again = cli("resume", "w1", "--max-steps", "5")
    assert again.code == 0, again.stderr
    assert "resuming from model call 2 (budget_exceeded)" in again.stderr
    assert "↻ resumed run w1 after 2 model calls" in again.stderr
    assert "3 model calls · 5 steps · 2 tool calls · " in again.stderr
    shown = cli("show", "w1").stdout
    assert "totals     3 model calls · 5 steps · 2 tool calls" in shown
    listed = cli("list").stdout.splitlines()
    assert listed[0].split()[:4] == ["ID", "STATUS", "MODEL", "CALLS"]
    assert listed[1].split()[:3] == ["w1", "completed", "3"]  # model calls, not the 5 steps


def test_the_json_result_names_model_calls(
    cli_inproc: Callable[..., Any], write_script: Callable[..., str], workspace: Any
) -> None:
    (workspace / "a.txt").write_text("hi\n")
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]}
    out = one_object(
        cli_inproc("start", "t", "--model", write_script([read, DONE]), "--json").stdout
    )
    # `steps` is the contract's name for model calls (as --max-steps counts them), kept;
    # `model_calls` says it in the timeline's words.
    assert (out["model_calls"], out["steps"], out["tool_calls"]) == (2, 2, 1)


@pytest.mark.slow  # over 2 s on 2 cores
def test_a_run_the_store_is_lost_under_still_prints_one_json_object(
    cli: Callable[..., Any], write_script: Callable[..., str], tmp_path: Any
) -> None:
    # Exit 7 (the store unavailable) left stdout empty: a script's `json.loads` failed, and
    # only stderr named the run to resume.
    model = write_script(
        [{"tool_calls": [{"name": "read_file", "arguments": {"path": "nope"}}]}] * 3 + [DONE]
    )
    log = tmp_path / "faults.log"
    assert (
        cli("start", "t", "--model", write_script([DONE]), "--quiet").code == 0
    )  # the store made: counts alike
    counted = cli(
        "start",
        "t",
        "--model",
        model,
        "--json",
        "--run-id",
        "count",
        extra_env={
            "DURABLE_AGENT_FAULT": "full",
            "DURABLE_AGENT_FAULT_AT": "1000000",
            "DURABLE_AGENT_FAULT_LOG": str(log),
        },
    )
    assert counted.code == 0, counted.stderr
    statements = int(log.read_text().split("statements ")[-1].split()[0])
    stopped = cli(
        "start",
        "t",
        "--model",
        model,
        "--json",
        "--run-id",
        "cut",
        extra_env={
            "DURABLE_AGENT_FAULT": "full",
            "DURABLE_AGENT_FAULT_AT": str(statements // 2),
            "DURABLE_AGENT_FAULT_REPEAT": "100000",
        },
    )
    assert stopped.code == 7, stopped.stderr
    out = one_object(stopped.stdout)
    assert (
        out["run_id"] == "cut" and out["status"] is None and "store is unavailable" in out["error"]
    )
    assert set(out) == set(one_object(counted.stdout))  # the same keys as any result
    resumed = cli("resume", "cut", "--json")
    assert resumed.code == 0 and one_object(resumed.stdout)["status"] == "completed", resumed.stderr
