"""MCP servers as tool sources: the tests' own fault server (every annotation combination,
a slow tool, a crashing server) and the real `mcp-server-time` and `mcp-server-git`."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp_support import BIN, FAULT_SERVER, TESTS, counter_lines, fault_config, wait_until
from sandbox_support import need_bwrap

pytest.importorskip("mcp")


@pytest.fixture
def run_f(
    cli: Callable[..., Any], tmp_path: Path, workspace: Path, write_script: Callable[..., str]
):  # type: ignore[no-untyped-def]
    """Run a scripted task against the fault server `f`; returns (result, run_id)."""

    def run(
        turns: list[dict[str, Any]],
        *flags: str,
        extra: str = "",
        server_env: str = "",
        timeout: float = 120,
    ) -> Any:
        config = fault_config(tmp_path, workspace, extra=extra, server_env=server_env)
        return cli(
            "start",
            "use the tools",
            "--model",
            write_script(turns),
            "--json",
            *flags,
            extra_env={"DURABLE_AGENT_CONFIG": str(config)},
            timeout=timeout,
        )

    return run


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def tool_steps(sql: Callable[..., list[Any]]) -> list[tuple[Any, ...]]:
    return sql(
        "SELECT tool_name, effect, state, error, json_extract(output, '$.result'), "
        "json_extract(output, '$.data') FROM steps WHERE kind = 'tool' ORDER BY seq"
    )


@pytest.mark.slow
def test_tools_lists_every_source_with_effect_classes(
    cli: Callable[..., Any], tmp_path: Path, workspace: Path
) -> None:
    config = fault_config(tmp_path, workspace, extra="")
    config.write_text(config.read_text() + '[mcp_servers.f.tools.plain]\neffect = "read"\n')
    r = cli("tools", "--json", extra_env={"DURABLE_AGENT_CONFIG": str(config)})
    assert r.code == 0, r.stderr
    tools = {t["name"]: t for t in r.json()}
    assert tools["read_file"]["source"] == "built-in" and tools["read_file"]["effect"] == "read"
    assert tools["run_command"]["effect"] == "exec"
    effects = {name: t["effect"] for name, t in tools.items() if t["source"] == "mcp f"}
    assert effects["f__lookup"] == "read"  # readOnlyHint
    assert effects["f__put"] == "write"  # idempotentHint and not destructive
    assert effects["f__launch"] == "exec"  # destructiveHint
    assert effects["f__append"] == "exec"  # not destructive, but not idempotent either
    assert effects["f__plain"] == "read"  # no annotations (exec), overridden by the config
    assert tools["f__lookup"]["description"] == "Read-only: look a key up."
    # `twin.a` and `twin_a` are both `f__twin_a` once cleaned: each is offered, by a name of its own.
    twins = {name: effect for name, effect in effects.items() if name.startswith("f__twin_a")}
    assert len(twins) == 2 and sorted(twins.values()) == ["exec", "read"], twins


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_a_run_calls_the_server_and_records_results(
    run_f: Callable[..., Any], sql: Callable[..., list[Any]], workspace: Path
) -> None:
    r = run_f(
        [
            {
                "tool_calls": [
                    call("f__lookup", key="a"),
                    call("f__put", key="a", value="1"),
                    call("f__stats"),
                    call("f__fails"),
                ]
            },
            {"content": "done"},
        ],
        "--shell",
        "allow",
    )
    assert r.code == 0, r.stderr
    rows = tool_steps(sql)
    assert [(name, effect, state) for name, effect, state, *_ in rows] == [
        ("f__lookup", "read", "completed"),
        ("f__put", "write", "completed"),
        ("f__stats", "read", "completed"),
        ("f__fails", "read", "failed"),
    ]
    assert rows[0][4] == 'lookup ok {"key": "a"}'
    assert json.loads(rows[2][5])["structured_content"] == {"calls": 1, "answer": 42}
    assert json.loads(rows[3][5])["is_error"] is True and "always fails" in rows[3][3]
    assert counter_lines(workspace) == [
        "lookup started",
        'lookup {"key": "a"}',
        "put started",
        'put {"key": "a", "value": "1"}',
    ]
    sources = json.loads(sql("SELECT tool_sources FROM runs")[0][0])
    recorded = {t["name"]: t["effect"] for t in sources["mcp_servers"]["f"]["tools"]}
    assert recorded["f__put"] == "write" and recorded["f__launch"] == "exec"


@pytest.mark.slow
def test_a_server_script_under_tmp_is_visible_in_the_sandbox(
    cli: Callable[..., Any],
    tmp_path: Path,
    workspace: Path,
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
) -> None:
    # The sandbox's /tmp is private; a server's own script there (a checkout under /tmp) is
    # carried in read-only, and nothing else of the host's /tmp is.
    need_bwrap()  # Landlock's /tmp is the host's (a private TMPDIR instead)
    assert str(tmp_path).startswith("/tmp/")
    (tmp_path / "server").mkdir()
    script = tmp_path / "server" / "fault_server.py"
    script.write_bytes(FAULT_SERVER.read_bytes())
    (tmp_path / "server" / "secret.txt").write_text("not the server's")
    config = fault_config(tmp_path, workspace, extra="")
    config.write_text(
        config.read_text().replace(json.dumps(str(FAULT_SERVER)), json.dumps(str(script)))
    )
    turns = [
        {
            "tool_calls": [
                call("f__lookup", key="a"),
                call("run_command", command=f"cat {tmp_path}/server/secret.txt"),
            ]
        },
        {"content": "done"},
    ]
    r = cli(
        "start",
        "use the tools",
        "--model",
        write_script(turns),
        "--json",
        "--shell",
        "allow",
        extra_env={"DURABLE_AGENT_CONFIG": str(config)},
    )
    assert r.code == 0, r.stderr
    rows = tool_steps(sql)
    assert rows[0][2] == "completed" and rows[0][4] == 'lookup ok {"key": "a"}'
    cat = sql("SELECT state, output FROM steps WHERE tool_name = 'run_command'")[0]
    assert "No such file" in str(cat[1]) and "not the server's" not in str(cat[1])


@pytest.mark.slow
def test_huge_structured_content_is_not_kept(
    run_f: Callable[..., Any], sql: Callable[..., list[Any]]
) -> None:
    r = run_f(
        [
            {"tool_calls": [call("f__bulky", size=1000), call("f__bulky", size=2_000_000)]},
            {"content": "done"},
        ],
        "--shell",
        "allow",
    )
    assert r.code == 0, r.stderr
    small, big = tool_steps(sql)
    assert json.loads(small[5])["structured_content"] == {"blob": "x" * 1000}
    data = json.loads(big[5])
    assert big[2] == "completed" and "structured_content" not in data
    assert data["structured_content_elided"].startswith("2000012 characters of JSON")
    assert len(big[4]) < 25_000  # the text the model sees is capped (output_cap)


@pytest.mark.slow
def test_an_answer_the_sdk_cannot_read_fails_the_call_at_once(
    run_f: Callable[..., Any], sql: Callable[..., list[Any]], db_path: Path
) -> None:
    # Nested past the SDK's parser's limits, the answer was logged and dropped there, and
    # the call waited out the whole mcp_timeout_s (120 s by default) for it.
    started = time.monotonic()
    r = run_f(
        [
            {"tool_calls": [call("f__deep", depth=250)]},
            {"tool_calls": [call("f__lookup", key="b")]},
            {"content": "done"},
        ],
        "--shell",
        "allow",
        extra="mcp_timeout_s = 60",
    )
    assert r.code == 0, r.stderr
    assert time.monotonic() - started < 30
    assert "Traceback" not in r.stderr and "Failed to parse" not in r.stderr, (
        r.stderr
    )  # the SDK's log: not on the terminal
    deep, lookup = tool_steps(sql)
    assert deep[2] == "failed" and "could not be read" in deep[3], deep
    assert lookup[2] == "completed"
    # Kept, with its traceback, in the server's own log beside the store (wiring.log_dir).
    from durable_agent.config.layers import store_files

    log = Path(store_files(f"sqlite:///{db_path}")[4]) / "mcp-f.log"
    assert "Failed to parse JSONRPC message" in log.read_text()


@pytest.mark.slow
def test_twin_names_call_their_own_tools(
    run_f: Callable[..., Any], sql: Callable[..., list[Any]]
) -> None:
    r = run_f([{"tool_calls": [call("f__twin_a")]}, {"content": "done"}], "--shell", "allow")
    assert r.code == 0, r.stderr
    sources = json.loads(sql("SELECT tool_sources FROM runs")[0][0])
    other = next(t["name"] for t in sources["mcp_servers"]["f"]["tools"] if t["remote"] == "twin_a")
    assert re.fullmatch(r"f__twin_a_[0-9a-f]{8}", other)
    r = run_f([{"tool_calls": [call(other)]}, {"content": "done"}], "--shell", "allow")
    assert r.code == 0, r.stderr
    assert [(row[0], row[1], row[4]) for row in tool_steps(sql)] == [
        ("f__twin_a", "read", "twin.a ran"),
        (other, "exec", "twin_a ran"),
    ]


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_the_server_is_contained_like_a_command(
    run_f: Callable[..., Any],
    sql: Callable[..., list[Any]],
    tmp_path: Path,
    workspace: Path,
    env: dict[str, str],
) -> None:
    if env.get("DURABLE_AGENT_SANDBOX") == "off":
        pytest.skip("no OS sandbox on this host (conftest.NO_SANDBOX)")
    # Outside the workspace: the host's /tmp (the sandbox's own /tmp is private) and the
    # source tree next to this file (read-only inside; in a checkout under /tmp it is not
    # there at all, and the write lands in the sandbox's private /tmp). Either way, nothing
    # outside the workspace changes on the host.
    in_tmp, in_tree = tmp_path / "outside.txt", TESTS / f".mcp-escape-{tmp_path.name}"
    try:
        r = run_f(
            [
                {
                    "tool_calls": [
                        call("f__touch", path=str(workspace / "inside.txt")),
                        call("f__touch", path=str(in_tmp)),
                        call("f__touch", path=str(in_tree)),
                    ]
                },
                {"content": "done"},
            ],
            "--shell",
            "allow",
        )
        assert r.code == 0, r.stderr
        inside, _, tree = tool_steps(sql)
        assert (
            inside[4] == f"wrote {workspace / 'inside.txt'}" and (workspace / "inside.txt").exists()
        )
        if not TESTS.is_relative_to("/tmp"):
            assert tree[4].startswith("refused:"), tree
        assert not in_tmp.exists() and not in_tree.exists()
    finally:
        in_tree.unlink(missing_ok=True)


@pytest.mark.slow
def test_a_server_that_died_between_calls_is_started_again(
    run_f: Callable[..., Any], sql: Callable[..., list[Any]], workspace: Path
) -> None:
    # `vanish` answers, then its server exits; the next call finds it gone before it is sent.
    wait = f"until grep -qx vanished {workspace / '.counter'}; do sleep 0.05; done"
    r = run_f(
        [
            {"tool_calls": [call("f__vanish")]},
            {"tool_calls": [call("run_command", command=wait)]},
            {"tool_calls": [call("f__put", key="k", value="v")]},
            {"content": "done"},
        ],
        "--shell",
        "allow",
    )
    assert r.code == 0, r.stderr
    vanish, waited, put = tool_steps(sql)
    assert vanish[2] == waited[2] == "completed"
    assert put[2] == "completed" and put[4] == 'put ok {"key": "k", "value": "v"}', put
    assert counter_lines(workspace) == [
        "vanish started",
        "vanished",
        "put started",
        'put {"key": "k", "value": "v"}',
    ]


@pytest.mark.slow
def test_a_server_that_dies_mid_call_is_restarted(
    run_f: Callable[..., Any], sql: Callable[..., list[Any]], workspace: Path
) -> None:
    r = run_f(
        [
            {"tool_calls": [call("f__crash")]},
            {"tool_calls": [call("f__lookup", key="after")]},
            {"content": "done"},
        ],
        "--shell",
        "allow",
    )
    assert r.code == 0, r.stderr
    crash, after = tool_steps(sql)
    assert crash[2] == "failed" and "died" in crash[3] and "restarted" in crash[3]
    assert after[2] == "completed" and after[4] == 'lookup ok {"key": "after"}'
    assert counter_lines(workspace)[0] == "crash started"


@pytest.mark.slow
def test_a_slow_call_times_out_and_the_run_goes_on(
    run_f: Callable[..., Any], sql: Callable[..., list[Any]]
) -> None:
    r = run_f(
        [
            {"tool_calls": [call("f__slow", seconds=30)]},
            {"tool_calls": [call("f__lookup", key="b")]},
            {"content": "done"},
        ],
        "--shell",
        "allow",
        extra="mcp_timeout_s = 1.5",
    )
    assert r.code == 0, r.stderr
    slow, lookup = tool_steps(sql)
    assert slow[2] == "failed" and "no answer within 1.5s" in slow[3]
    assert lookup[2] == "completed"


@pytest.mark.slow
def test_a_server_s_own_timeout_wins(
    cli: Callable[..., Any],
    tmp_path: Path,
    workspace: Path,
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
) -> None:
    config = fault_config(tmp_path, workspace, extra="mcp_timeout_s = 600")
    config.write_text(config.read_text() + "timeout_s = 1.5\n")  # in [mcp_servers.f]
    model = write_script([{"tool_calls": [call("f__slow", seconds=30)]}, {"content": "done"}])
    r = cli(
        "start",
        "t",
        "--model",
        model,
        "--json",
        "--shell",
        "allow",
        extra_env={"DURABLE_AGENT_CONFIG": str(config)},
    )
    assert r.code == 0, r.stderr
    ((_, _, state, error, _, _),) = tool_steps(sql)
    assert state == "failed" and "no answer within 1.5s" in error


@pytest.mark.slow
def test_exec_tools_ask_under_shell_ask_unless_not_destructive(
    run_f: Callable[..., Any], sql: Callable[..., list[Any]], workspace: Path
) -> None:
    r = run_f(
        [
            {"tool_calls": [call("f__append", text="x"), call("f__plain", text="y")]},
            {"content": "done"},
        ],
        "--shell",
        "ask",
    )
    assert r.code == 5, r.stderr  # blocked
    assert r.json()["stop_reason"] == "approval_required"
    assert counter_lines(workspace) == [
        "append started",
        'append {"text": "x"}',
    ]  # plain did not run
    assert sql("SELECT tool_name, kind FROM approvals") == [("f__plain", "approval_required")]


@pytest.mark.slow
def test_a_server_that_cannot_start_is_one_line_with_its_stderr(
    run_f: Callable[..., Any], tmp_path: Path
) -> None:
    r = run_f([{"content": "done"}], server_env=', MCP_TEST_FAIL_START = "1" }\nrequired = true\n#')
    assert r.code == 2
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "MCP server 'f' failed to start" in line and "MCP_TEST_FAIL_START is set" in line
    # Its stderr is kept next to the store (the tests' store is tmp_path/store.db).
    log = tmp_path / "mcp-logs" / "mcp-f.log"
    assert "cannot start: MCP_TEST_FAIL_START is set" in log.read_text()


@pytest.mark.slow
def test_an_unknown_command_is_a_config_error(
    cli: Callable[..., Any], write_script: Callable[..., str]
) -> None:
    r = cli(
        "start",
        "t",
        "--model",
        write_script([{"content": "x"}]),
        "--mcp",
        "nope=no-such-mcp-server-here",
    )
    # Optional: a warning naming the program, and the run goes on without its tools.
    assert r.code == 0, r.stderr
    (line,) = [line for line in r.stderr.splitlines() if "warning" in line]
    assert "its program 'no-such-mcp-server-here' is not on PATH" in line


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_the_server_gets_no_harness_secrets(
    run_f: Callable[..., Any],
    sql: Callable[..., list[Any]],
    cli: Callable[..., Any],
    env: dict[str, str],
) -> None:
    env["SERVICE_TOKEN"] = "tok-abcdef123456"
    env["OPENAI_API_KEY"] = "sk-test-abcdef123456"
    r = run_f(
        [{"tool_calls": [call("f__envnames")]}, {"content": "done"}],
        "--shell",
        "allow",
        server_env=', MY_SETTING = "on"',
    )
    assert r.code == 0, r.stderr
    names = tool_steps(sql)[0][4].split()
    assert "SERVICE_TOKEN" not in names and "OPENAI_API_KEY" not in names
    assert "MY_SETTING" in names and "PATH" in names and "PAGER" in names  # as a command's env


@pytest.mark.slow
def test_the_server_gets_an_allowlisted_environment(
    run_f: Callable[..., Any], sql: Callable[..., list[Any]], env: dict[str, str]
) -> None:
    # Credentials by names no denylist foresaw (MYSQL_PWD) reach no server: it gets what a
    # command gets, the allowlist and what `command_env` names.
    env.update(
        MYSQL_PWD="mysql-pw-6d2f1a9b",
        MY_API_TOKEN="api-token-83c1e07d",
        DB_PASSWORD="db-password-5e9a42c1",
        AWS_SECRET_ACCESS_KEY="wJalrXUtnFEMIxK7MDENGbPxRfiCYEXAMPLEKEY",
        SOME_UNLISTED_SETTING="x",
        PASSED_ON="yes",
    )
    r = run_f(
        [{"tool_calls": [call("f__envnames")]}, {"content": "done"}],
        "--shell",
        "allow",
        extra='command_env = ["PASSED_ON"]',
    )
    assert r.code == 0, r.stderr
    names = tool_steps(sql)[0][4].split()
    for name in ("MYSQL_PWD", "MY_API_TOKEN", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY"):
        assert name not in names, names
    assert "SOME_UNLISTED_SETTING" not in names
    assert "PASSED_ON" in names and "PATH" in names and "MCP_TEST_COUNTER" in names


@pytest.mark.slow
def test_a_server_cannot_fill_the_disk_through_its_stderr_log(
    run_f: Callable[..., Any], sql: Callable[..., list[Any]], tmp_path: Path
) -> None:
    # 50 MB written to stderr: the log beside the store is rotated at its cap (default
    # 5 MB), one older part kept, and says what was dropped.
    r = run_f(
        [{"tool_calls": [call("f__noise", megabytes=50)]}, {"content": "done"}],
        "--shell",
        "allow",
        timeout=300,
    )
    assert r.code == 0, r.stderr
    assert tool_steps(sql)[0][4] == "wrote 50 MB to stderr"
    log = tmp_path / "mcp-logs" / "mcp-f.log"
    older = log.with_name("mcp-f.log.1")
    cap = 5_000_000
    assert log.stat().st_size <= cap and older.stat().st_size <= cap
    head = log.read_text(errors="replace")[:500]
    assert "this log was truncated at 5000000 bytes" in head and "were dropped" in head, head
    assert "noise noise" in log.read_text(errors="replace")[-2000:]  # what came last is kept


@pytest.mark.slow
def test_resume_offers_the_recorded_tools_and_a_vanished_one_is_an_observation(
    run_f: Callable[..., Any],
    cli: Callable[..., Any],
    sql: Callable[..., list[Any]],
    tmp_path: Path,
    workspace: Path,
) -> None:
    r = run_f([{"tool_calls": [call("f__plain", text="y")]}, {"content": "done"}], "--shell", "ask")
    assert r.code == 5, r.stderr
    run_id = r.json()["run_id"]
    # The server no longer offers `plain`, and the config now calls it a read: neither
    # changes what the run recorded.
    (workspace / ".counter.hide").write_text("plain\n")
    config = fault_config(tmp_path, workspace)
    config.write_text(config.read_text() + '[mcp_servers.f.tools.plain]\neffect = "read"\n')
    extra_env = {"DURABLE_AGENT_CONFIG": str(config)}
    assert cli("approve", run_id, extra_env=extra_env).code == 0
    r = cli("resume", run_id, "--json", extra_env=extra_env)
    assert r.code == 0, r.stderr
    (plain,) = tool_steps(sql)
    assert (
        plain[1] == "exec"
        and plain[2] == "failed"
        and "no longer offers the tool 'plain'" in plain[3]
    )
    assert "plain started" not in counter_lines(workspace)


def test_missing_extra_is_one_line(env: dict[str, str], workspace: Path) -> None:
    code = (
        "import sys; sys.modules['mcp'] = None; from durable_agent.cli.parser import main; "
        "raise SystemExit(main(['tools', '--mcp', 'x=python']))"
    )
    proc = subprocess.run(
        [str(BIN / "python"), "-c", code],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "durable-agent: error: MCP servers need the `mcp` extra: pip install 'durable-agent[mcp]'"
    )


@pytest.mark.slow
def test_real_servers_time_and_git(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
    workspace: Path,
) -> None:
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    (workspace / "hello.txt").write_text("hi\n")
    subprocess.run(["git", "-C", str(workspace), "add", "hello.txt"], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(workspace),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-qm",
            "first commit",
        ],
        check=True,
    )
    turns = [
        {
            "tool_calls": [
                call("time__get_current_time", timezone="UTC"),
                call(
                    "time__convert_time",
                    source_timezone="UTC",
                    time="12:00",
                    target_timezone="Asia/Tokyo",
                ),
                call("git__git_status", repo_path=str(workspace)),
                call("git__git_log", repo_path=str(workspace), max_count=5),
            ]
        },
        {"content": "done"},
    ]
    r = cli(
        "start",
        "what time is it, and what is in the repository?",
        "--model",
        write_script(turns),
        "--mcp",
        f"time={BIN / 'mcp-server-time'}",
        "--mcp",
        f"git={BIN / 'mcp-server-git'}",
        "--json",
        "--shell",
        "deny",
    )
    assert r.code == 0, r.stderr
    rows = tool_steps(sql)
    assert [row[2] for row in rows] == ["completed"] * 4, rows
    assert '"timezone": "UTC"' in rows[0][4] and "Asia/Tokyo" in rows[1][4]
    assert "On branch" in rows[2][4] or "branch" in rows[2][4].lower()
    assert "first commit" in rows[3][4]
    assert {row[1] for row in rows} == {"read"}  # both servers mark these readOnlyHint


def _start_and_kill_during(
    env: dict[str, str], workspace: Path, config: Path, model: str, marker: str
) -> str:
    """Start a run in a child process, SIGKILL it while the server is in the call (its
    counter says `marker`), and return the run id."""
    proc = subprocess.Popen(
        [
            str(BIN / "python"),
            "-m",
            "durable_agent",
            "start",
            "t",
            "--model",
            model,
            "--shell",
            "allow",
            "--run-id",
            "killed",
        ],
        cwd=workspace,
        env={**env, "DURABLE_AGENT_CONFIG": str(config)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: marker in counter_lines(workspace) or proc.poll() is not None, 60, marker
        )
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stderr:
            proc.stderr.close()
    return "killed"


@pytest.mark.slow
def test_kill_during_a_read_only_call_reruns_it_on_resume(
    env: dict[str, str],
    cli: Callable[..., Any],
    tmp_path: Path,
    workspace: Path,
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
) -> None:
    config = fault_config(tmp_path, workspace)
    model = write_script(
        [{"tool_calls": [call("f__lookup", key="k", sleep_s=2)]}, {"content": "done"}]
    )
    run_id = _start_and_kill_during(env, workspace, config, model, "lookup started")
    r = cli("resume", run_id, "--json", extra_env={"DURABLE_AGENT_CONFIG": str(config)})
    assert r.code == 0, r.stderr
    assert counter_lines(workspace).count("lookup started") == 2  # re-run, as read_file would be
    ((name, effect, state, _, result, _),) = tool_steps(sql)
    assert (name, effect, state, result) == (
        "f__lookup",
        "read",
        "completed",
        'lookup ok {"key": "k"}',
    )


@pytest.mark.slow
def test_kill_during_a_destructive_call_blocks_and_approve_runs_it_once(
    env: dict[str, str],
    cli: Callable[..., Any],
    tmp_path: Path,
    workspace: Path,
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
) -> None:
    config = fault_config(tmp_path, workspace)
    extra_env = {"DURABLE_AGENT_CONFIG": str(config)}
    model = write_script(
        [{"tool_calls": [call("f__launch", target="rocket", sleep_s=2)]}, {"content": "done"}]
    )
    run_id = _start_and_kill_during(env, workspace, config, model, "launch started")
    r = cli("resume", run_id, "--json", extra_env=extra_env)
    assert r.code == 5, r.stderr  # blocked: its outcome is unknown, it is not run again alone
    assert r.json()["stop_reason"] == "uncertain_side_effect"
    assert counter_lines(workspace).count("launch started") == 1
    assert cli("approve", run_id, extra_env=extra_env).code == 0
    r = cli("resume", run_id, "--json", extra_env=extra_env)
    assert r.code == 0, r.stderr
    assert counter_lines(workspace).count("launch started") == 2  # the approved run, once
    assert counter_lines(workspace).count('launch {"target": "rocket"}') == 1
    ((name, effect, state, _, result, _),) = tool_steps(sql)
    assert (name, effect, state, result) == (
        "f__launch",
        "exec",
        "completed",
        'launch ok {"target": "rocket"}',
    )
    assert sql("SELECT attempts FROM steps WHERE tool_name = 'f__launch'") == [(2,)]


@pytest.mark.slow
def test_kill_during_an_idempotent_call_reruns_it(
    env: dict[str, str],
    cli: Callable[..., Any],
    tmp_path: Path,
    workspace: Path,
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
) -> None:
    config = fault_config(tmp_path, workspace)
    model = write_script(
        [{"tool_calls": [call("f__put", key="k", value="v", sleep_s=2)]}, {"content": "done"}]
    )
    run_id = _start_and_kill_during(env, workspace, config, model, "put started")
    r = cli("resume", run_id, "--json", extra_env={"DURABLE_AGENT_CONFIG": str(config)})
    assert r.code == 0, r.stderr
    assert counter_lines(workspace).count("put started") == 2
    assert sql("SELECT effect, state, attempts FROM steps WHERE tool_name = 'f__put'") == [
        ("write", "completed", 2)
    ]


@pytest.mark.slow
def test_a_streamable_http_server(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    env: dict[str, str],
    sql: Callable[..., list[Any]],
    tmp_path: Path,
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    counter = tmp_path / "http-counter"
    server = subprocess.Popen(
        [str(BIN / "python"), str(FAULT_SERVER)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**env, "MCP_TEST_HTTP_PORT": str(port), "MCP_TEST_COUNTER": str(counter)},
    )
    try:

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_until(listening, 30, "the HTTP server")
        model = write_script(
            [{"tool_calls": [call("h__lookup", key="web"), call("h__stats")]}, {"content": "done"}]
        )
        r = cli("start", "t", "--model", model, "--json", "--mcp", f"h=http://127.0.0.1:{port}/mcp")
        assert r.code == 0, r.stderr
        lookup, stats = tool_steps(sql)
        assert (
            lookup[4] == 'lookup ok {"key": "web"}'
            and json.loads(stats[5])["structured_content"]["answer"] == 42
        )
        assert counter.read_text().splitlines() == ["lookup started", 'lookup {"key": "web"}']
    finally:
        server.kill()
        server.wait()
    # Gone: an optional server is a warning, its tools absent (the model is told no tool).
    r = cli("start", "t", "--model", model, "--mcp", f"h=http://127.0.0.1:{port}/mcp")
    assert r.code == 0 and "warning: MCP server 'h' failed to start" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_a_server_that_cannot_start_on_resume_is_an_observation(
    run_f: Callable[..., Any],
    cli: Callable[..., Any],
    sql: Callable[..., list[Any]],
    tmp_path: Path,
    workspace: Path,
) -> None:
    r = run_f([{"tool_calls": [call("f__plain", text="y")]}, {"content": "done"}], "--shell", "ask")
    assert r.code == 5, r.stderr
    run_id = r.json()["run_id"]
    (workspace / ".counter.fail").write_text("")
    extra_env = {"DURABLE_AGENT_CONFIG": str(tmp_path / "config.toml")}
    assert cli("approve", run_id, extra_env=extra_env).code == 0
    r = cli("resume", run_id, "--json", extra_env=extra_env)
    assert r.code == 0, r.stderr  # the model was told, and answered
    (plain,) = tool_steps(sql)
    assert plain[2] == "failed" and "MCP server 'f' failed to start" in plain[3]
    assert "MCP_TEST_FAIL_START is set" in plain[3]  # the end of its stderr


@pytest.mark.slow
def test_a_worker_gives_back_a_run_whose_server_will_not_start(
    cli: Callable[..., Any],
    tmp_path: Path,
    workspace: Path,
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
) -> None:
    config = fault_config(tmp_path, workspace)
    config.write_text(config.read_text() + "required = true\n")  # no run without it
    extra_env = {"DURABLE_AGENT_CONFIG": str(config)}
    model = write_script([{"tool_calls": [call("f__lookup", key="w")]}, {"content": "done"}])
    r = cli("start", "t", "--model", model, "--detach", "--json", extra_env=extra_env)
    assert r.code == 0, r.stderr
    run_id = r.json()["run_id"]
    (workspace / ".counter.fail").write_text("")  # the worker's host cannot start it
    r = cli("worker", "--once", extra_env=extra_env)
    assert r.code == 0 and "failed to start" in r.stderr and "Traceback" not in r.stderr
    assert sql("SELECT status, tool_sources FROM runs") == [("pending", None)]
    (workspace / ".counter.fail").unlink()
    r = cli("resume", run_id, "--json", extra_env=extra_env)  # at once: the lease was given back
    assert r.code == 0, r.stderr
    assert counter_lines(workspace) == ["lookup started", 'lookup {"key": "w"}']
