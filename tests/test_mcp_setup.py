"""Setting MCP servers up as other tools write them, and starting them under the sandbox:
npm and uvx-style launches, a server that cannot start saying why, Codex's keys, a
`mcpServers` JSON file, `durable-agent mcp add|list|remove`, optional and required servers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp_support import BIN, FAULT_SERVER
from sandbox_support import need_bwrap

pytest.importorskip("mcp")

TIME = str(BIN / "mcp-server-time")
GIT = str(BIN / "mcp-server-git")


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def mcp_tools(r: Any) -> dict[str, str]:
    """`tools --json`'s MCP tools: name -> source."""
    return {t["name"]: t["source"] for t in r.json() if t["source"].startswith("mcp ")}


@pytest.fixture
def npm_server(tmp_path: Path) -> Path:
    """`@modelcontextprotocol/server-memory` installed under the test's /tmp folder."""
    if os.environ.get("CI"):
        pytest.skip("npm install needs the npm registry: not in CI")
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    prefix = tmp_path / "npm"
    try:
        done = subprocess.run(
            ["npm", "install", "--prefix", str(prefix), "@modelcontextprotocol/server-memory"],
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("npm install took more than 240 s")
    program = prefix / "node_modules" / ".bin" / "mcp-server-memory"
    if done.returncode != 0 or not program.exists():
        pytest.skip(f"npm install failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return program


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_an_npm_server_installed_under_tmp_runs_in_the_default_sandbox(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
    npm_server: Path,
    tmp_path: Path,
) -> None:
    need_bwrap()
    assert str(npm_server).startswith(os.path.realpath("/tmp"))
    memory = tmp_path / "ws" / "memory.jsonl"  # its graph, kept in the workspace
    config = tmp_path / "config.toml"
    config.write_text(
        f"[mcp_servers.mem]\ncommand = {json.dumps(str(npm_server))}\n"
        f"env = {{ MEMORY_FILE_PATH = {json.dumps(str(memory))} }}\n"
    )
    r = cli(
        "start",
        "what do you remember?",
        "--model",
        write_script([{"tool_calls": [call("mem__read_graph")]}, {"content": "done"}]),
        "--json",
        extra_env={"DURABLE_AGENT_CONFIG": str(config)},
    )
    assert r.code == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr
    ((state, result),) = sql(
        "SELECT state, json_extract(output, '$.result') FROM steps WHERE kind = 'tool'"
    )
    assert state == "completed" and "entities" in result, result


@pytest.mark.slow  # over 2 s on 2 cores
def test_a_missing_program_is_one_line_naming_it(cli: Callable[..., Any], tmp_path: Path) -> None:
    gone = tmp_path / "node_modules" / ".bin" / "mcp-gone"
    r = cli("tools", "--json", "--mcp", f"gone={gone}", "--mcp", f"time={TIME}")
    assert r.code == 0, r.stderr
    (line,) = warnings(r.stderr)
    assert f"its program '{gone}' does not exist" in line and "[mcp_servers.gone]" in line
    assert "time__get_current_time" in mcp_tools(r)  # the other server is unaffected


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_a_download_with_the_network_off_says_so_and_names_the_setting(
    cli: Callable[..., Any],
) -> None:
    need_bwrap()
    if shutil.which("npx") is None:
        pytest.skip("npx is not installed")
    r = cli(
        "tools",
        "--json",
        "--mcp",
        "mem=npx -y @modelcontextprotocol/server-memory",
        timeout=90,
    )
    assert r.code == 0, r.stderr
    (line,) = warnings(r.stderr)
    assert "MCP server 'mem' failed to start" in line
    assert "the network is off" in line and "network = true" in line, line
    assert "[mcp_servers.mem]" in line and "--network on" in line
    assert mcp_tools(r) == {}


def test_a_write_to_a_read_only_path_names_it_and_the_cache_dir(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    need_bwrap()
    script = tmp_path / "writes_home.py"  # as a launcher caching under ~ would
    script.write_text("import pathlib\npathlib.Path.home().joinpath('.mcp-setup-test').mkdir()\n")
    r = cli("tools", "--json", "--mcp", f"home={sys.executable} {script}")
    assert r.code == 0, r.stderr
    (line,) = warnings(r.stderr)
    home = os.path.realpath(Path.home())
    assert f"it tried to write {home}/.mcp-setup-test, which is read-only" in line, line
    assert "cache_dir" in line and "[mcp_servers.home]" in line


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_codex_keys_and_an_mcp_servers_json_are_accepted(
    cli: Callable[..., Any],
    tmp_path: Path,
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
) -> None:
    (tmp_path / "claude.json").write_text(
        json.dumps(
            {
                "mcpServers": {
                    "git": {"type": "stdio", "command": GIT, "args": [], "env": {}},
                    "gone": {"command": "no-such-program", "disabled": True},
                }
            }
        )
    )
    config = tmp_path / "config.toml"
    config.write_text(
        'mcp_config = "claude.json"\n'
        "[mcp_servers.f]\n"
        f"command = {json.dumps(sys.executable)}\n"
        f"args = [{json.dumps(str(FAULT_SERVER))}]\n"
        "startup_timeout_sec = 20\n"
        "tool_timeout_sec = 30\n"
        "enabled = true\n"
        'env_vars = ["MCP_SETUP_PASSED_ON"]\n'
        "[mcp_servers.off]\n"
        'command = "no-such-program"\n'
        "enabled = false\n"
    )
    extra_env = {"DURABLE_AGENT_CONFIG": str(config), "MCP_SETUP_PASSED_ON": "yes"}
    r = cli("tools", "--json", extra_env=extra_env)
    assert r.code == 0, r.stderr
    assert r.stderr.strip() == ""  # the disabled ones are not started
    sources = set(mcp_tools(r).values())
    assert sources == {"mcp f", "mcp git"}, sources
    r = cli(
        "start",
        "t",
        "--model",
        write_script([{"tool_calls": [call("f__envnames")]}, {"content": "done"}]),
        "--json",
        extra_env=extra_env,
    )
    assert r.code == 0, r.stderr
    ((names,),) = sql("SELECT json_extract(output, '$.result') FROM steps WHERE kind = 'tool'")
    assert "MCP_SETUP_PASSED_ON" in names.split()  # env_vars: passed on by name


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_mcp_add_list_remove_round_trip(cli: Callable[..., Any], tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('# mine\nshell = "deny"\n\n[mcp_servers.keep]\ncommand = "keep-me"\n')
    extra_env = {"DURABLE_AGENT_CONFIG": str(config)}
    r = cli(
        "mcp",
        "add",
        "--env",
        'Q="quoted"',
        "time",
        "--",
        TIME,
        "--local-timezone",
        "UTC",
        extra_env=extra_env,
    )
    assert r.code == 0, r.stderr
    data = tomllib.loads(config.read_text())
    assert data["mcp_servers"]["time"] == {
        "command": TIME,
        "args": ["--local-timezone", "UTC"],
        "env": {"Q": '"quoted"'},
    }
    assert cli("mcp", "add", "time", "--", TIME, extra_env=extra_env).code == 2  # taken
    r = cli("mcp", "list", "--json", extra_env=extra_env)
    assert r.code == 0, r.stderr
    rows = {row["name"]: row for row in r.json()}
    assert rows["time"]["defined_in"] == str(config) and rows["time"]["enabled"] is True
    assert rows["time"]["required"] is False and set(rows) == {"keep", "time"}
    r = cli("mcp", "list", extra_env=extra_env)
    assert "time" in r.stdout and "enabled, optional" in r.stdout and str(config) in r.stdout
    r = cli("tools", "--json", extra_env=extra_env)  # `keep` cannot start: a warning
    assert r.code == 0 and "time__get_current_time" in mcp_tools(r), r.stderr
    r = cli("mcp", "remove", "keep", extra_env=extra_env)
    assert r.code == 0, r.stderr
    text = config.read_text()
    assert text.startswith('# mine\nshell = "deny"\n')
    assert set(tomllib.loads(text)["mcp_servers"]) == {"time"}
    r = cli("mcp", "remove", "keep", extra_env=extra_env)
    assert r.code == 2 and len(warnings(r.stderr)) == 1 and "no MCP server 'keep'" in r.stderr


def _broken_and_time(tmp_path: Path, required: bool) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(
        f"[mcp_servers.time]\ncommand = {json.dumps(TIME)}\n"
        f"[mcp_servers.broken]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = [{json.dumps(str(FAULT_SERVER))}]\n"
        'env = { MCP_TEST_FAIL_START = "1" }\n' + ("required = true\n" if required else "")
    )
    return config


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_an_optional_server_that_fails_is_a_warning_and_recorded(
    cli: Callable[..., Any],
    tmp_path: Path,
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
) -> None:
    extra_env = {"DURABLE_AGENT_CONFIG": str(_broken_and_time(tmp_path, required=False))}
    r = cli("tools", "--json", extra_env=extra_env)
    assert r.code == 0, r.stderr
    (line,) = warnings(r.stderr)
    assert "MCP server 'broken' failed to start" in line and "required = true" in line
    assert set(mcp_tools(r).values()) == {"mcp time"}
    turns = [{"tool_calls": [call("time__get_current_time", timezone="UTC")]}, {"content": "ok"}]
    r = cli("start", "t", "--model", write_script(turns), "--json", extra_env=extra_env)
    assert r.code == 0, r.stderr
    (line,) = warnings(r.stderr)
    assert "MCP server 'broken' failed to start" in line
    ((sources,),) = sql("SELECT tool_sources FROM runs")
    recorded = json.loads(sources)["mcp_servers"]
    assert recorded["broken"]["tools"] == []
    assert "MCP_TEST_FAIL_START is set" in recorded["broken"]["failed"]
    assert recorded["time"]["tools"]


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_a_required_server_that_fails_stops_the_start(
    cli: Callable[..., Any], tmp_path: Path, write_script: Callable[..., str]
) -> None:
    extra_env = {"DURABLE_AGENT_CONFIG": str(_broken_and_time(tmp_path, required=True))}
    r = cli("tools", "--json", extra_env=extra_env)
    assert r.code == 2
    (line,) = warnings(r.stderr)
    assert "MCP server 'broken' failed to start" in line and "Traceback" not in line
    r = cli(
        "start", "t", "--model", write_script([{"content": "x"}]), "--json", extra_env=extra_env
    )
    assert r.code == 2 and len(warnings(r.stderr)) == 1, r.stderr
