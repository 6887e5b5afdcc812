"""`--shell ask` and approvals (SPEC §4): what is not allowlisted stops the run `blocked`
before anything runs; a person's decision is a row that outlives the process; `resume`
then runs the command exactly once, or tells the model it was denied."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_openai import FakeOpenAI
from side_effects_support import assert_history_valid, ledger_lines

UNLISTED = "touch made.txt; echo $DURABLE_AGENT_CALL_ID >> ledger"


def _calls(*commands: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_command", "arguments": {"command": c}} for c in commands]}


def test_unlisted_command_blocks_before_it_runs_then_approve_runs_it_once(
    cli, write_script, workspace, db_path, sql
) -> None:  # type: ignore[no-untyped-def]
    script = write_script([_calls(UNLISTED), {"content": "done"}])
    r = cli("start", "t", "--model", script, "--run-id", "a")  # --shell ask is the default
    assert r.code == 5
    assert not (workspace / "made.txt").exists() and ledger_lines(workspace) == []
    assert UNLISTED in r.stderr and "durable-agent approve a" in r.stderr
    assert sql("SELECT status, stop_reason FROM runs") == [("blocked", "approval_required")]
    # Nothing ran, so there is no intent row of it either: only the question.
    assert sql("SELECT count(*) FROM steps WHERE kind='tool'") == [(0,)]
    assert sql("SELECT call_id, kind, command, decision FROM approvals") == [
        ("call_0_0", "approval_required", UNLISTED, None)
    ]

    assert cli("resume", "a").code == 5  # undecided: still blocked, still nothing ran
    assert not (workspace / "made.txt").exists()

    a = cli("approve", "a", "--by", "bob")
    assert (
        a.code == 0
        and f"approved run_command `{UNLISTED}`" in a.stdout
        and "durable-agent resume a" in a.stdout
    )
    again = cli("approve", "a")  # nothing left to decide: it says what was decided and what next
    assert (
        again.code == 2
        and "already approved" in again.stderr
        and "durable-agent resume a" in again.stderr
    )
    r = cli("resume", "a")
    assert r.code == 0 and r.stdout.strip() == "done", r.stderr
    assert (workspace / "made.txt").exists() and ledger_lines(workspace) == ["call_0_0"]
    decision, by, decided, used = sql(
        "SELECT decision, decided_by, decided_at IS NOT NULL, used_at IS NOT NULL FROM approvals"
    )[0]
    assert (decision, by, decided, used) == ("approved", "bob", 1, 1)
    assert cli("resume", "a").code == 2  # completed: the approval cannot be used twice
    assert ledger_lines(workspace) == ["call_0_0"]


def test_denied_command_never_runs_and_the_model_is_told(
    cli, write_script, workspace, db_path, sql
) -> None:  # type: ignore[no-untyped-def]
    script = write_script([_calls(UNLISTED), {"content": "done"}])
    assert cli("start", "t", "--model", script, "--run-id", "d").code == 5
    d = cli("approve", "d", "--deny")
    assert d.code == 0 and "denied" in d.stdout
    assert cli("resume", "d").code == 0
    assert not (workspace / "made.txt").exists() and ledger_lines(workspace) == []
    told = sql("SELECT content FROM messages WHERE role='tool'")[0][0]
    assert "denied" in told
    assert sql("SELECT state, tool_name FROM steps WHERE kind='tool'") == [
        ("failed", "run_command")
    ]
    assert sql("SELECT decision, used_at IS NOT NULL FROM approvals") == [("denied", 1)]
    assert_history_valid(db_path, "d")


@pytest.mark.slow
def test_destructive_commands_ask_even_under_a_broad_allowlist(
    cli, write_script, workspace, tmp_path, sql
) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "broad.toml"
    config.write_text(
        'shell_allowlist = ["rm", "git", "ls", "make"]\n'
        'shell_always_ask = ["\\\\bmake\\\\s+deploy\\\\b"]\n'
    )
    (workspace / "x").mkdir()
    (workspace / "x" / "keep.txt").write_text("precious\n")
    script = write_script(
        [
            _calls("rm -rf x"),
            _calls("git reset --hard"),
            _calls("make deploy"),
            _calls("ls x"),
            {"content": "done"},
        ]
    )
    extra = {"DURABLE_AGENT_CONFIG": str(config)}
    reasons: list[str] = []
    for _ in range(3):
        r = (
            cli("resume", "b", extra_env=extra)
            if reasons
            else cli("start", "t", "--model", script, "--run-id", "b", extra_env=extra)
        )
        assert r.code == 5, r.stderr
        assert (workspace / "x" / "keep.txt").exists()
        reasons.append(sql("SELECT reason FROM approvals WHERE decision IS NULL")[0][0])
        assert cli("approve", "b", "--deny").code == 0
    assert reasons[0].startswith("destructive") and "rm -rf" in reasons[0]
    assert reasons[1].startswith("destructive") and "reset --hard" in reasons[1]
    assert reasons[2].startswith("destructive") and "make deploy" in reasons[2]
    r = cli("resume", "b", extra_env=extra)  # `ls x` is allowlisted: it runs without asking
    assert r.code == 0, r.stderr
    assert sql("SELECT count(*) FROM approvals") == [(3,)]
    assert (
        "keep.txt"
        in sql("SELECT content FROM messages WHERE role='tool' ORDER BY seq DESC LIMIT 1")[0][0]
    )


def test_allowlisted_commands_run_without_asking(cli, write_script, workspace, sql) -> None:  # type: ignore[no-untyped-def]
    (workspace / "hello.txt").write_text("hi\n")
    script = write_script(
        [_calls("ls", "git status", "python -m pytest --version"), {"content": "done"}]
    )
    r = cli("start", "t", "--model", script, "--run-id", "ok")
    assert r.code == 0, r.stderr
    assert sql("SELECT count(*) FROM approvals") == [(0,)]
    rows = sql(
        "SELECT json_extract(input, '$.arguments.command'), state FROM steps WHERE kind='tool' ORDER BY seq"
    )
    assert rows == [
        ("ls", "completed"),
        ("git status", "completed"),
        ("python -m pytest --version", "completed"),
    ]
    assert "hello.txt" in sql("SELECT content FROM messages WHERE tool_call_id='call_0_0'")[0][0]


def test_bad_always_ask_pattern_is_a_configuration_error(cli, write_script, tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "bad.toml"
    config.write_text('shell_always_ask = ["(unclosed"]\n')
    r = cli(
        "start",
        "t",
        "--model",
        write_script([{"content": "x"}]),
        extra_env={"DURABLE_AGENT_CONFIG": str(config)},
    )
    assert r.code == 2 and "shell_always_ask" in r.stderr


def _tool_names(body: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or []}


def test_shell_deny_does_not_offer_the_tool(cli, env) -> None:  # type: ignore[no-untyped-def]
    key = {"OPENAI_API_KEY": "sk-test-0000000000000000000000"}
    with FakeOpenAI(script=[{"content": "ok"}, {"content": "ok"}]) as server:
        denied = cli(
            "start", "t", "--model", "m", "--base-url", server.url, "--shell", "deny", extra_env=key
        )
        asked = cli("start", "t", "--model", "m", "--base-url", server.url, extra_env=key)
        assert denied.code == 0 and asked.code == 0, denied.stderr + asked.stderr
        bodies = [r["body"] for r in server.requests]
    assert len(bodies) == 2
    assert "run_command" not in _tool_names(bodies[0]) and "read_file" in _tool_names(bodies[0])
    assert "run_command" in _tool_names(bodies[1])  # the control: offered under the default `ask`
    assert json.dumps(bodies[0]).count("run_command") == 0  # not even mentioned


def test_resuming_with_shell_allow_settles_the_pending_question(
    cli, write_script, workspace, sql
) -> None:  # type: ignore[no-untyped-def]
    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "touch made.txt"}}]},
            {"content": "done"},
        ]
    )
    assert cli("start", "t", "--model", script, "--run-id", "pol").code == 5
    assert sql("SELECT decision FROM approvals") == [(None,)]
    assert cli("resume", "pol", "--shell", "allow").code == 0
    assert (workspace / "made.txt").exists()
    decision, by, used = sql("SELECT decision, decided_by, used_at IS NOT NULL FROM approvals")[0]
    assert (decision, by, used) == ("approved", "policy (--shell allow)", 1)


# A carriage return and ESC[2K erased the real command from the line a person reads before
# approving; ESC[8m hid the rest; the approve output echoed the fake text.
DISGUISED = "touch PWNED; echo harmless #\r\x1b[2K`ls -la` needs approval: a listing.\x1b[8m\u202e"


def test_a_command_that_hides_itself_with_control_characters_is_shown_escaped_wherever_a_person_reads_it(
    cli, write_script, workspace, sql
) -> None:  # type: ignore[no-untyped-def]
    script = write_script([_calls(DISGUISED), {"content": "done\x1b[31m red"}])
    shown = [cli("start", "\x1b]52;c;aGk=\x07task", "--model", script, "--run-id", "esc")]
    assert shown[0].code == 5
    assert sql("SELECT command FROM approvals") == [
        (DISGUISED,)
    ]  # stored as asked: it is what would run
    shown += [cli("show", "esc"), cli("list"), cli("approve", "esc")]
    for r in shown:
        text = r.stdout + r.stderr
        assert not set(text) & {"\r", "\x1b", "\x07", "\u202e"}, (r.stdout, r.stderr)
    assert (
        "touch PWNED; echo harmless #\\x0d\\x1b[2K" in shown[0].stderr
    )  # the whole command, visible
    assert "touch PWNED" in shown[1].stdout and "\\x1b]52;c;aGk=\\x07task" in shown[2].stdout
    assert shown[3].stdout.startswith(
        "approved run_command `touch PWNED; echo harmless #\\x0d\\x1b[2K"
    )
    done = cli("resume", "esc", "--quiet")
    assert done.code == 0 and (workspace / "PWNED").exists()  # it ran byte for byte
    assert done.stdout == "done\x1b[31m red\n"  # the answer to a pipe is data: as the model gave it


@pytest.mark.slow
def test_an_mcp_tool_s_approval_names_the_tool_and_server_and_its_arguments(
    cli, write_script, workspace, tmp_path, sql
) -> None:  # type: ignore[no-untyped-def]
    """The question once read ``{"target": …}` needs approval`: no tool, no server."""
    from mcp_support import fault_config

    extra_env = {"DURABLE_AGENT_CONFIG": str(fault_config(tmp_path, workspace))}
    args = {"target": "big\x1b[2K rocket", "sleep_s": 0}
    script = write_script(
        [{"tool_calls": [{"name": "f__launch", "arguments": args}]}, {"content": "done"}]
    )
    asked = 'launch (MCP server f) target="big\\u001b[2K rocket" sleep_s=0'
    r = cli("start", "t", "--model", script, "--run-id", "m", "--shell", "ask", extra_env=extra_env)
    assert r.code == 5 and f"{asked} needs approval" in r.stderr, r.stderr
    show = cli("show", "m", extra_env=extra_env)
    assert asked in show.stdout and "\x1b" not in show.stdout, show.stdout
    d = cli("approve", "m", "--deny", extra_env=extra_env)
    assert d.code == 0 and d.stdout.startswith(f"denied {asked} (call "), d.stdout
    again = cli("approve", "m", extra_env=extra_env)
    assert again.code == 2 and f"{asked} (call call_0_0) is already denied" in again.stderr


def test_a_long_argument_is_cut_with_a_marker_and_a_command_is_named_by_its_tool() -> None:
    from durable_agent.presentation import approval_subject

    long = approval_subject("s__put", json.dumps({"path": "a b.txt", "text": "x" * 500}), 60)
    assert long.startswith('put (MCP server s) path="a b.txt" text=xxx') and long.endswith("…")
    assert len(long) <= 80
    assert approval_subject("run_command", "ls -la") == "run_command `ls -la`"
    assert approval_subject("write_file", None) == "write_file"


def test_approve_racing_a_link_is_refused_not_written_over(cli_inproc, env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A notification's link answers between `approve`'s look and its write: the command
    says so (exit 2) and the link's decision stays: a question is answered once."""
    from ui_support import answered_meanwhile, blocked_run, open_store

    url = env["DURABLE_AGENT_DB"]
    blocked_run(url, "race")
    answered_meanwhile(monkeypatch, url, approved=False)
    r = cli_inproc("approve", "race", "--by", "bob")
    assert r.code == 2 and "already denied" in r.stderr and "Traceback" not in r.stderr, r
    (decision,) = open_store(url).approvals("race")
    assert (decision.decision, decision.decided_by) == ("denied", "ui:link")
