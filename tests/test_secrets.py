"""Secrets (SPEC §4): values of credential-named environment variables and well-known key
shapes are redacted before anything is stored or sent, and commands never see the
credential-named variables at all.

Checked where it matters: the raw bytes of the database files (main file, WAL, shared
memory) and every request body the model server received."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from fake_openai import FakeOpenAI
from side_effects_support import assert_history_valid


def _db_bytes(db: Path) -> bytes:
    return b"".join(
        p.read_bytes()
        for p in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"))
        if p.exists()
    )


def test_secrets_reach_neither_the_database_nor_the_model(cli, workspace, db_path) -> None:  # type: ignore[no-untyped-def]
    token = "tok-" + secrets.token_hex(16)  # named like a credential, no known shape
    api_key = "sk-" + secrets.token_hex(20)
    github = "ghp_" + secrets.token_hex(18)  # a key shape, in no variable at all
    (workspace / "notes.txt").write_text(
        f"service token: {token}\nopenai: {api_key}\ngithub: {github}\n"
    )
    script: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {
                    "name": "run_command",
                    "arguments": {
                        "command": "echo token=${MY_SERVICE_TOKEN:-unset} key=${OPENAI_API_KEY:-unset}; env"
                    },
                }
            ]
        },
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
        {"tool_calls": [{"name": "run_command", "arguments": {"command": "cat notes.txt"}}]},
        {"content": "done"},
    ]
    with FakeOpenAI(script=script) as server:
        r = cli(
            "start",
            f"use the token {token} carefully",
            "--model",
            "m",
            "--base-url",
            server.url,
            "--shell",
            "allow",
            "--run-id",
            "s",
            "--verify",
            "cat notes.txt",
            extra_env={"MY_SERVICE_TOKEN": token, "OPENAI_API_KEY": api_key},
        )
        requests = list(server.requests)
    assert r.code == 0, r.stderr
    assert len(requests) == 4

    # The key did reach the server, where it belongs: in the Authorization header only.
    assert all(req["headers"]["authorization"] == f"Bearer {api_key}" for req in requests)
    bodies = json.dumps([req["body"] for req in requests])
    for secret in (token, api_key, github):
        assert secret not in bodies
        assert not any(
            secret in v
            for req in requests
            for k, v in req["headers"].items()
            if k != "authorization"
        )
    stored = _db_bytes(db_path)
    assert stored, "no database file to check"
    for secret in (token, api_key, github):
        assert secret.encode() not in stored

    # Positive controls: the redaction happened (the model saw markers, not nothing), and
    # the command ran with its own variables but without the credential-named ones.
    last = requests[-1]["body"]["messages"]
    tool_texts = [m["content"] for m in last if m["role"] == "tool"]
    env_dump = tool_texts[0]
    assert "token=unset key=unset" in env_dump
    assert "DURABLE_AGENT_CALL_ID=call_0_0" in env_dump and "PAGER=cat" in env_dump
    assert "MY_SERVICE_TOKEN" not in env_dump and "OPENAI_API_KEY" not in env_dump
    assert (
        "[REDACTED:MY_SERVICE_TOKEN]" in tool_texts[1]
        and "[REDACTED:OPENAI_API_KEY]" in tool_texts[1]
    )
    assert "github: [REDACTED]" in tool_texts[1]
    assert "[REDACTED:MY_SERVICE_TOKEN]" in tool_texts[2]
    assert "[REDACTED:MY_SERVICE_TOKEN]" in last[1]["content"]  # the task as the model got it
    assert_history_valid(db_path, "s")


def test_a_command_cannot_print_a_credential_variable_it_was_given(
    cli, write_script, workspace, sql
) -> None:  # type: ignore[no-untyped-def]
    # Even a variable the command sets itself from a file is caught by its value, as long as
    # the value is a credential the harness knows about.
    token = "tok-" + secrets.token_hex(16)
    (workspace / "t.txt").write_text(token)
    script = write_script(
        [
            {
                "tool_calls": [
                    {
                        "name": "run_command",
                        "arguments": {"command": 'X=$(cat t.txt); echo "got $X" >&2'},
                    }
                ]
            },
            {"content": "done"},
        ]
    )
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--shell",
        "allow",
        "--run-id",
        "e",
        extra_env={"DEPLOY_PASSWORD": token},
    )
    assert r.code == 0, r.stderr
    out = sql("SELECT content FROM messages WHERE role='tool'")[0][0]
    assert "got [REDACTED:DEPLOY_PASSWORD]" in out
    assert token not in json.dumps(sql("SELECT output, error FROM steps"))


def test_what_the_model_writes_is_written_byte_for_byte_except_the_harness_secrets(  # type: ignore[no-untyped-def]
    cli, write_script, workspace, db_path
) -> None:
    # Redaction never alters an effect: a key-shaped test fixture lands on disk as written,
    # and is stored as written. Only the exact value of the harness's own credential is
    # replaced, in the file, the command and the store alike.
    fixture = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    aws = "AKIAIOSFODNN7EXAMPLE"
    own = "tok-" + secrets.token_hex(16)
    content = f"token={fixture}\naws={aws}\nmine={own}\n"
    script = write_script(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "conf.txt", "content": content}}
                ]
            },
            {
                "tool_calls": [
                    {"name": "run_command", "arguments": {"command": f"printf %s {aws} > ran.txt"}}
                ]
            },
            {"content": "done"},
        ]
    )
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--run-id",
        "argsecret",
        "--shell",
        "allow",
        extra_env={"DEPLOY_TOKEN": own},
    )
    assert r.code == 0, r.stderr
    assert (workspace / "conf.txt").read_text() == (
        f"token={fixture}\naws={aws}\nmine=[REDACTED:DEPLOY_TOKEN]\n"
    )
    assert (workspace / "ran.txt").read_text() == aws
    stored = _db_bytes(db_path)
    assert fixture.encode() in stored and aws.encode() in stored  # the arguments, as run
    assert own.encode() not in stored


def test_observation_redaction_can_be_turned_off_for_trusted_repos_but_not_for_own_secrets(  # type: ignore[no-untyped-def]
    cli, write_script, workspace, tmp_path
) -> None:
    aws = "AKIAIOSFODNN7EXAMPLE"
    own = "tok-" + secrets.token_hex(16)
    (workspace / "fixture.txt").write_text(f"aws={aws}\nmine={own}\n")
    script = write_script(
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "fixture.txt"}}]},
            {"content": "done"},
        ]
    )
    config = tmp_path / "trusted.toml"
    config.write_text("redact_observations = false\n")
    results = {}
    for run_id, extra in (("default", {}), ("trusted", {"DURABLE_AGENT_CONFIG": str(config)})):
        r = cli(
            "start",
            "t",
            "--model",
            script,
            "--run-id",
            run_id,
            extra_env={"DEPLOY_TOKEN": own, **extra},
        )
        assert r.code == 0, r.stderr
        results[run_id] = _tool_message(tmp_path / "store.db", run_id)
    assert results["default"] == "aws=[REDACTED]\nmine=[REDACTED:DEPLOY_TOKEN]\n"
    assert results["trusted"] == f"aws={aws}\nmine=[REDACTED:DEPLOY_TOKEN]\n"


def _tool_message(db: Path, run_id: str) -> str:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return str(
            conn.execute(
                "SELECT content FROM messages WHERE run_id=? AND role='tool'", (run_id,)
            ).fetchone()[0]
        )


def test_the_harness_secret_spelt_with_json_escapes_or_as_a_tool_name_is_replaced_too(  # type: ignore[no-untyped-def]
    cli, write_script, workspace, db_path
) -> None:
    # A model that has the key (the promise is for exactly that case) can spell it with JSON
    # escapes, which the tool receives decoded, or send it as a tool's name, which is stored
    # and sent back: neither may reach a file, a command or the store.
    own = "tok-" + secrets.token_hex(16)
    escaped = "\\u00" + own[:1].encode().hex() + own[1:]  # "\u0074ok-...": JSON for the same text
    script = write_script(
        [
            {
                "tool_calls": [
                    {
                        "name": "run_command",
                        "arguments": '{"command": "printf %s ' + escaped + ' > ran.txt"}',
                    }
                ]
            },
            {
                "tool_calls": [
                    {
                        "name": "write_file",
                        "arguments": '{"path": "w.txt", "content": "' + escaped + '"}',
                    }
                ]
            },
            {"tool_calls": [{"name": own, "arguments": {"path": "a"}}]},
            {
                "tool_calls": [
                    {
                        "name": "write_file",
                        "arguments": '{"path": "bad.txt", "content": "' + escaped + '"',
                    }
                ]
            },
            {
                "tool_calls": [
                    {
                        "name": "write_file",
                        "arguments": '{"path": "plain.txt", "content": "caf\\u00e9 \\u0041"}',
                    }
                ]
            },
            {"content": "done"},
        ]
    )
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--run-id",
        "escsecret",
        "--shell",
        "allow",
        extra_env={"DEPLOY_TOKEN": own},
    )
    assert r.code == 0, r.stderr
    assert (workspace / "ran.txt").read_text() == "[REDACTED:DEPLOY_TOKEN]"
    assert (workspace / "w.txt").read_text() == "[REDACTED:DEPLOY_TOKEN]"
    assert (workspace / "plain.txt").read_text() == "café A"  # no secret: decoded as written
    stored = _db_bytes(db_path)
    assert own.encode() not in stored and own[1:].encode() not in stored
    assert (
        b"caf\\\\u00e9 \\\\u0041" in stored or b"caf\\u00e9 \\u0041" in stored
    )  # its arguments as sent
    for args in (["show", "escsecret"], ["export", "escsecret"], ["show", "escsecret", "--json"]):
        shown = cli(*args)
        assert shown.code == 0 and own not in shown.stdout


def test_the_text_protocols_content_keeps_no_escaped_spelling_of_the_secret(  # type: ignore[no-untyped-def]
    cli, write_script, workspace, db_path
) -> None:
    # With --tool-protocol text the TOOL_CALL lines are the content, stored and sent back as
    # written: the call was redacted, but the content kept "\u0074ok-...", which the text
    # protocol itself decodes.
    own = "tok-" + secrets.token_hex(16)
    escaped = "\\u00" + own[:1].encode().hex() + own[1:]
    script = write_script(
        [
            {
                "content": 'I will write it.\nTOOL_CALL {"name": "write_file", "input": {"path": "w.txt", "content": "'
                + escaped
                + '"}}'
            },
            # `input` as a string holding JSON, which the protocol decodes twice: escaped twice.
            {
                "content": 'TOOL_CALL {"name": "write_file", "input": "{\\"path\\": \\"x.txt\\", \\"content\\": \\"'
                + escaped.replace("\\", "\\\\")
                + '\\"}"}'
            },
            # Broken JSON: the final answer, kept as written but for the secret.
            {
                "content": 'Broken on purpose: TOOL_CALL {"name": "write_file", "input": {"content": "'
                + escaped
            },
        ]
    )
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--run-id",
        "txtsecret",
        "--tool-protocol",
        "text",
        extra_env={"DEPLOY_TOKEN": own},
    )
    assert r.code == 0, r.stderr
    assert (workspace / "w.txt").read_text() == "[REDACTED:DEPLOY_TOKEN]"
    assert (workspace / "x.txt").read_text() == "[REDACTED:DEPLOY_TOKEN]"
    stored = _db_bytes(db_path)
    assert own.encode() not in stored and own[1:].encode() not in stored
    for args in (["show", "txtsecret"], ["export", "txtsecret"]):
        shown = cli(*args)
        assert shown.code == 0 and own[1:] not in shown.stdout


def test_the_runs_settings_hold_no_value_of_a_credential_variable(  # type: ignore[no-untyped-def]
    cli, workspace, db_path, write_script
) -> None:
    """A credential's value given in a setting (the key in the endpoint's query, a token on
    an MCP server's command line or in the verify command, as a shell expands `$TOKEN`) is
    recorded as `[REDACTED:NAME]`: in runs.settings, the tool catalog, the version
    fingerprint and the verify step alike."""
    token = "tok-" + secrets.token_hex(16)
    api_key = "sk-" + secrets.token_hex(20)
    r = cli(
        "start",
        "t",
        "--model",
        write_script([{"content": "done"}]),
        "--base-url",
        f"http://127.0.0.1:9/v1?api-key={api_key}",
        "--verify",
        f"test -n {token}",
        "--mcp",
        f"gh=/bin/false --token {token}",
        "--run-id",
        "s",
        extra_env={"MY_SERVICE_TOKEN": token, "OPENAI_API_KEY": api_key},
    )
    assert r.code == 0, r.stderr  # the verify command ran with what it was given
    stored = _db_bytes(db_path)
    assert stored, "no database file to check"
    for secret in (token, api_key):
        assert secret.encode() not in stored
    assert b"[REDACTED:MY_SERVICE_TOKEN]" in stored and b"[REDACTED:OPENAI_API_KEY]" in stored
