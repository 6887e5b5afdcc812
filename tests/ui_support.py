"""Shared by the web view's tests: a store with runs made by the real CLI, a TestClient
on the app, and a real `durable-agent ui` process."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

UNLISTED = "touch made.txt; echo $DURABLE_AGENT_CALL_ID >> ledger"
FINISHED_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "<b>hi</b>\n"}}]},
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
    {"tool_calls": [{"name": "run_command", "arguments": {"command": "cat a.txt"}}]},
    {"content": "done <script>alert(1)</script>"},
]
BLOCKED_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "run_command", "arguments": {"command": UNLISTED}}]},
    {"content": "made it"},
]


def open_store(url: str) -> Any:
    from durable_agent.settings import load_settings
    from durable_agent.wiring import open_store as open_

    return open_(load_settings({"db": url}, {}))


def client(url: str, *, token: str | None = None, user: str = "tester", poll_s: float = 0.05) -> Any:
    from starlette.testclient import TestClient

    from durable_agent.ui.app import UiConfig, build_app
    from durable_agent.ui.security import Access

    store = open_store(url)
    app = build_app(UiConfig(store=store, access=Access(token=token), user=user, poll_s=poll_s))
    return TestClient(app, base_url="http://127.0.0.1:8765")


def csrf_of(html: str) -> str:
    found = re.search(r'data-csrf="([^"]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)


def make_runs(cli: Callable[..., Any], write_script: Callable[[list[dict[str, Any]]], str], url: str) -> None:
    """`done`: completed with model, write, read and exec steps; `wait`: blocked on a question."""
    env = {"DURABLE_AGENT_DB": url}
    r = cli("start", "finish <it>", "--model", write_script(FINISHED_SCRIPT), "--run-id", "done",
            "--shell", "allow", "--quiet", extra_env=env)
    assert r.code == 0, r.stderr
    r = cli("start", "needs a person", "--model", write_script(BLOCKED_SCRIPT), "--run-id", "wait",
            "--quiet", extra_env=env)
    assert r.code == 5, r.stderr


def start_ui(env: dict[str, str], url: str, *flags: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A real `durable-agent ui --port 0` process and the address it printed first."""
    err = log.open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "durable_agent", "ui", "--port", "0", "--db", url, *flags],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    from scale_helpers import wait_for

    def address() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"ui exited {proc.returncode}: {log.read_text()}")
        found = re.search(r"durable-agent ui: (http://\S+/)", log.read_text())
        return found.group(1) if found else None

    return proc, str(wait_for(address, 30, "the ui's address"))


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
