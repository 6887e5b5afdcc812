"""The finish gate (SPEC §3): with `--verify CMD` a final answer counts only once CMD exits 0
after the last edit. A failure goes back to the model, the rejected answer stays in the
history, the evidence is a `verify` step; a budget that runs out while it still fails
ends the run `failed` / `verification_failed`."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI
from side_effects_support import assert_history_valid

CHECK = """\
import pathlib, sys
text = pathlib.Path("answer.txt").read_text() if pathlib.Path("answer.txt").exists() else "<missing>"
if text.strip() != "42":
    print("noise line\\n" * 3 + f"FAIL: answer.txt says {text.strip()!r}, expected '42'")
    sys.exit(3)
print("PASS")
"""


def _write(content: str) -> dict[str, Any]:
    return {
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "answer.txt", "content": content}}
        ]
    }


def test_gate_rejects_until_the_check_passes_and_the_model_sees_why(
    cli, workspace, db_path, sql
) -> None:  # type: ignore[no-untyped-def]
    (workspace / "check.py").write_text(CHECK)
    script: list[dict[str, Any]] = [
        {"content": "done (without checking)"},
        _write("41\n"),
        {"content": "fixed"},
        _write("42\n"),
        {"content": "fixed, really"},
    ]
    with FakeOpenAI(script=script) as server:
        r = cli(
            "start",
            "t",
            "--model",
            "m",
            "--base-url",
            server.url,
            "--verify",
            "python3 check.py",
            "--run-id",
            "v",
            extra_env={"OPENAI_API_KEY": "sk-test-000000000000000000000000"},
        )
        requests = list(server.requests)
    assert r.code == 0, r.stderr
    assert r.stdout.strip() == "fixed, really"
    assert sql("SELECT status, stop_reason, answer FROM runs") == [
        ("completed", "finished", "fixed, really")
    ]

    # The evidence: one verify step per final answer, with command, exit code and output tail.
    rows = sql(
        "SELECT state, tool_name, json_extract(input, '$.command'), json_extract(output, '$.exit_code'), "
        "json_extract(output, '$.output_tail'), json_extract(output, '$.passed') "
        "FROM steps WHERE kind='verify' ORDER BY seq"
    )
    assert [(s, t, c, e, p) for s, t, c, e, _, p in rows] == [
        ("failed", "verify", "python3 check.py", 3, 0),
        ("failed", "verify", "python3 check.py", 3, 0),
        ("completed", "verify", "python3 check.py", 0, 1),
    ]
    assert (
        "FAIL: answer.txt says '<missing>'" in rows[0][4]
        and "'41'" in rows[1][4]
        and rows[2][4] == "PASS"
    )

    # What the model got: the rejected answer stays an assistant message, then the failure
    # comes as a user message with the output.
    sent = requests[1]["body"]["messages"]
    assert sent[-2] == {"role": "assistant", "content": "done (without checking)"}
    assert sent[-1]["role"] == "user"
    assert (
        "Verification failed" in sent[-1]["content"]
        and "FAIL: answer.txt says '<missing>'" in sent[-1]["content"]
    )
    later = requests[3]["body"]["messages"]
    assert [
        m.get("content") for m in later if m["role"] == "assistant" and not m.get("tool_calls")
    ] == ["done (without checking)", "fixed"]
    assert len(requests) == 5  # no model call after the accepted answer
    assert_history_valid(db_path, "v")


def test_budget_out_while_verification_fails_is_verification_failed(
    cli, write_script, workspace, sql
) -> None:  # type: ignore[no-untyped-def]
    (workspace / "check.py").write_text(CHECK)
    script = write_script(
        [{"content": "done"}, {"content": "still done"}, _write("42\n"), {"content": "ok now"}]
    )
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--verify",
        "python3 check.py",
        "--max-steps",
        "2",
        "--run-id",
        "b",
    )
    assert r.code == 1, r.stderr
    assert sql("SELECT status, stop_reason, step_count FROM runs") == [
        ("failed", "verification_failed", 2)
    ]
    assert sql("SELECT state FROM steps WHERE kind='verify'") == [("failed",), ("failed",)]
    assert "verification" in r.stderr
    # Resumable with a raised budget: the next turns fix it and the gate lets the answer through.
    r = cli("resume", "b", "--max-steps", "5")
    assert r.code == 0 and r.stdout.strip() == "ok now", r.stderr
    assert (workspace / "answer.txt").read_text() == "42\n"


def test_verify_interrupted_by_a_crash_is_run_again(cli, write_script, workspace, sql) -> None:  # type: ignore[no-untyped-def]
    (workspace / "check.py").write_text(CHECK)
    (workspace / "answer.txt").write_text("42\n")
    script = write_script([{"content": "done"}])
    # Boundaries: model intent 1-2, outcome 3-4, verify intent 5-6. Crash after the intent.
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--verify",
        "python3 check.py",
        "--run-id",
        "c",
        extra_env={"DURABLE_AGENT_CRASH_AFTER": "6"},
    )
    assert r.code == -signal.SIGKILL
    assert sql("SELECT state FROM steps WHERE kind='verify'") == [("started",)]
    r = cli("resume", "c")
    assert r.code == 0, r.stderr
    # A check is not a side effect: it simply runs again, on the same step row, no approval.
    assert sql("SELECT state, attempts FROM steps WHERE kind='verify'") == [("completed", 2)]
    assert sql("SELECT count(*) FROM approvals") == [(0,)]
    assert sql("SELECT step_count FROM runs") == [(1,)]  # the answer was not asked for again


@pytest.mark.slow
def test_verify_that_hangs_times_out_and_the_model_is_told(
    cli, write_script, workspace, tmp_path, sql
) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "fast.toml"
    config.write_text("command_timeout_s = 1\n")
    script = write_script([{"content": "done"}, {"content": "done again"}])
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--verify",
        "sleep 30",
        "--max-steps",
        "2",
        "--run-id",
        "h",
        extra_env={"DURABLE_AGENT_CONFIG": str(config)},
    )
    assert r.code == 1
    note = sql("SELECT content FROM messages WHERE role='user' ORDER BY seq DESC LIMIT 1")[0][0]
    assert "timed out after 1 s" in note
    assert (
        json.loads(sql("SELECT output FROM steps WHERE kind='verify' LIMIT 1")[0][0])["timed_out"]
        is True
    )


def test_no_gate_without_verify(cli, write_script, workspace: Path, sql) -> None:  # type: ignore[no-untyped-def]
    r = cli("start", "t", "--model", write_script([{"content": "done"}]))
    assert r.code == 0
    assert sql("SELECT count(*) FROM steps WHERE kind='verify'") == [(0,)]
