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
    {
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "a.txt", "content": "<b>hi</b>\n"}}
        ]
    },
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
    {"tool_calls": [{"name": "run_command", "arguments": {"command": "cat a.txt"}}]},
    {"content": "done <script>alert(1)</script>"},
]
BLOCKED_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "run_command", "arguments": {"command": UNLISTED}}]},
    {"content": "made it"},
]


def open_store(url: str) -> Any:
    from durable_agent.config.settings import load_settings
    from durable_agent.wiring import open_store as open_

    return open_(load_settings({"db": url}, {}))


def client(
    url: str, *, token: str | None = None, user: str = "tester", poll_s: float = 0.05
) -> Any:
    from starlette.testclient import TestClient

    from durable_agent.ui.app import UiConfig, build_app
    from durable_agent.ui.security import Access

    store = open_store(url)
    access = Access(token=token)
    app = build_app(UiConfig(store=store, access=access, user=user, poll_s=poll_s))
    client = TestClient(app, base_url="http://127.0.0.1:8765")
    if token is None:  # as a person who opened the printed link: may act
        client.get(f"/?token={access.key}")
    return client


def csrf_of(html: str) -> str:
    found = re.search(r'data-csrf="([^"]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)


def make_runs(
    cli: Callable[..., Any], write_script: Callable[[list[dict[str, Any]]], str], url: str
) -> None:
    """`done`: completed with model, write, read and exec steps; `wait`: blocked on a question."""
    env = {"DURABLE_AGENT_DB": url}
    r = cli(
        "start",
        "finish <it>",
        "--model",
        write_script(FINISHED_SCRIPT),
        "--run-id",
        "done",
        "--shell",
        "allow",
        "--quiet",
        extra_env=env,
    )
    assert r.code == 0, r.stderr
    r = cli(
        "start",
        "needs a person",
        "--model",
        write_script(BLOCKED_SCRIPT),
        "--run-id",
        "wait",
        "--quiet",
        extra_env=env,
    )
    assert r.code == 5, r.stderr


def start_ui(
    env: dict[str, str], url: str, *flags: str, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """A real `durable-agent ui --port 0` process and the address it printed first."""
    err = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent", "ui", "--port", "0", "--db", url, *flags],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    from scale_helpers import wait_for

    def address() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"ui exited {proc.returncode}: {log.read_text()}")
        found = re.search(r"durable-agent ui: (http://\S+/)", log.read_text())
        return found.group(1) if found else None

    return proc, str(wait_for(address, 30, "the ui's address"))


def printed_link(log: Path) -> str:
    """The whole link the ui printed first (with the key that acting takes)."""
    found = re.search(r"durable-agent ui: (http://\S+)", log.read_text())
    assert found, log.read_text()
    return found.group(1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def synthetic_run(url: str, run_id: str, n_steps: int) -> None:
    """A run of `n_steps` recorded steps written straight into the store: model calls and
    tool calls of every effect class, retries, failures, a compaction, and a resume after
    a pause halfway (a new lease epoch), so the chart has every kind of mark."""
    from datetime import timedelta

    from sqlalchemy import insert, update

    from durable_agent.messages import Message
    from durable_agent.store.rows import utcnow
    from durable_agent.store.schema import runs, steps

    store = open_store(url)
    store.create_run(
        run_id,
        task=f"a long run of {n_steps} steps",
        workspace="/tmp/ws",
        model="scripted:long",
        settings={
            "max_steps": n_steps,
            "max_tool_calls": n_steps,
            "sandbox": "workspace-write",
            "sandbox_mechanism": "bubblewrap",
            "network": False,
        },
        first_messages=[Message("system", "you are an agent"), Message("user", "do it")],
    )
    start = utcnow() - timedelta(seconds=n_steps * 0.2 + 60)
    rows = []
    effects = ("read", "write", "exec")
    for seq in range(n_steps):
        at = start + timedelta(seconds=seq * 0.2 + (40 if seq >= n_steps // 2 else 0))
        kind = "model" if seq % 2 == 0 else "tool"
        if seq == n_steps // 3:
            kind = "compact"
        effect = effects[(seq // 2) % 3] if kind == "tool" else None
        failed = seq % 37 == 5
        rows.append(
            {
                "run_id": run_id,
                "seq": seq,
                "kind": kind,
                "state": "failed" if failed else "completed",
                "idempotency_key": f"k{seq}",
                "call_id": f"call_{seq}" if kind == "tool" else None,
                "tool_name": {"read": "read_file", "write": "edit_file", "exec": "run_command"}.get(
                    effect or ""
                ),
                "input": {"arguments": {"path": f"src/file_{seq}.py"}}
                if kind == "tool"
                else {"turn": seq // 2},
                "output": {"content": f"output of step {seq} <b>not bold</b>"},
                "error": "boom" if failed else None,
                "attempts": 2 if seq % 11 == 3 else 1,
                "prompt_tokens": 100 if kind == "model" else None,
                "completion_tokens": 20 if kind == "model" else None,
                "started_at": at,
                "finished_at": at + timedelta(milliseconds=150),
                "duration_ms": 150,
                "turn": seq // 2,
                "effect": effect,
                "lease_epoch": 1 if seq < n_steps // 2 else 2,
            }
        )
    with store.engine.begin() as conn:
        conn.execute(insert(steps), rows)
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(
                status="completed",
                stop_reason="finished",
                answer="all done",
                finished_at=rows[-1]["finished_at"],
                step_count=n_steps // 2,
                tool_call_count=n_steps // 2,
                prompt_tokens=100 * n_steps // 2,
                completion_tokens=20 * n_steps // 2,
                active_ms=150 * n_steps,
                resume_count=1,
                lease_epoch=2,
            )
        )


def blocked_run(url: str, run_id: str, command: str = UNLISTED) -> int:
    """A `blocked` run with one pending question about `command`, written straight into the
    store (no process holds it); the question's id."""
    from sqlalchemy import insert, update

    from durable_agent.messages import Message
    from durable_agent.store.rows import utcnow
    from durable_agent.store.schema import approvals, runs

    store = open_store(url)
    store.create_run(
        run_id,
        task="needs a person",
        workspace="/nonexistent",
        model="m",
        settings={},
        first_messages=[Message("user", "t")],
    )
    with store.engine.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(status="blocked", stop_reason="approval_required")
        )
        done = conn.execute(
            insert(approvals).values(
                run_id=run_id,
                call_id="call_0_0",
                kind="approval_required",
                tool_name="run_command",
                command=command,
                reason="not in the allowlist",
                requested_at=utcnow(),
            )
        )
    return int(done.inserted_primary_key[0])


def answered_meanwhile(monkeypatch: Any, url: str, *, approved: bool, by: str = "ui:link") -> None:
    """Every `Store.pending_approval` from now on finds the question still open, and right
    after it someone else (a notification's link, in another process) answers it: a
    decision racing another, without timing."""
    from durable_agent.store.runs import Store

    original = Store.pending_approval
    other = open_store(url)

    def racing(self: Any, run_id: str) -> Any:
        found = original(self, run_id)
        if found is not None:
            assert other.decide_once(run_id, found.id, approved=approved, by=by)
        return found

    monkeypatch.setattr(Store, "pending_approval", racing)
