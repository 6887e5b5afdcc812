"""Helpers for the MCP tests: a config naming the tests' fault server, the counter it keeps."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FAULT_SERVER = TESTS / "mcp_fault_server.py"
# Where the third-party servers (mcp-server-time, mcp-server-git) are installed: beside this
# Python, unless DURABLE_AGENT_TEST_MCP_BIN names another venv's bin/ (scripts/test-floors
# tests the client at the `mcp` floor against today's servers, which need a newer `mcp`).
BIN = Path(os.environ.get("DURABLE_AGENT_TEST_MCP_BIN") or Path(sys.executable).parent)


def fault_config(tmp_path: Path, workspace: Path, *, extra: str = "", server_env: str = "") -> Path:
    """A config file with the fault server as `f`. Its counter lives in the workspace: the
    server runs in the OS sandbox, where nothing outside the workspace is writable. The
    counter and the test's control files (.counter.*) are the test's, not the run's: left
    out of workspace snapshots, so a resume does not see them as a person's edits
    (`workspace_drift`)."""
    counter = workspace / ".counter"
    path = tmp_path / "config.toml"
    path.write_text(
        f'{extra}\nexclude = [".git/", ".counter*"]\n[mcp_servers.f]\ncommand = {json.dumps(sys.executable)}\n'
        f"args = [{json.dumps(str(FAULT_SERVER))}]\n"
        f"env = {{ MCP_TEST_COUNTER = {json.dumps(str(counter))}{server_env} }}\n"
    )
    return path


def counter_lines(workspace: Path) -> list[str]:
    path = workspace / ".counter"
    return path.read_text().splitlines() if path.exists() else []


def wait_until(check: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
