"""The Python API (docs/api.md): its example runs as written; resume, approve and show
act on the same runs as the CLI, with the same durability."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from durable_agent import Agent, EffectClass, ToolContext, ToolResult
from durable_agent.errors import ConfigError, UsageError

ROOT = Path(__file__).resolve().parent.parent


def test_the_documented_example_runs(tmp_path: Path, env: dict[str, str]) -> None:
    doc = (ROOT / "docs" / "api.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    expected = doc[doc.index("It prints:") :].split("```")[1].strip()
    (tmp_path / "example.py").write_text(code)
    proc = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected


class CountArgs(BaseModel):
    label: str


class Counted:
    """An exec tool that counts its runs in a file of the workspace."""

    name: ClassVar[str] = "count"
    description: ClassVar[str] = "Count a call."
    args_model: ClassVar[type[BaseModel]] = CountArgs
    effect: ClassVar[EffectClass] = EffectClass.EXEC

    def run(self, args: CountArgs, ctx: ToolContext) -> ToolResult:
        with (ctx.workspace / "count.txt").open("a") as f:
            f.write(args.label + "\n")
        return ToolResult(output="counted " + args.label)


def test_budget_stop_then_resume_runs_each_tool_once(
    tmp_path: Path, workspace: Path, env: dict[str, str], write_script: Callable[..., str]
) -> None:
    model = write_script(
        [
            {"tool_calls": [{"name": "count", "arguments": {"label": "a"}}]},
            {"tool_calls": [{"name": "count", "arguments": {"label": "b"}}]},
            {"content": "done"},
        ]
    )
    agent = Agent(
        model=model,
        workspace=workspace,
        db=f"sqlite:///{tmp_path / 'api.db'}",
        tools=[Counted()],
        shell="allow",
        max_steps=1,
        env=env,
    )
    first = agent.start("count twice")
    assert (first.status, first.stop_reason) == ("budget_exceeded", "max_steps")
    done = agent.resume(first.run_id, max_steps=5)
    assert (done.status, done.answer) == ("completed", "done")
    assert (workspace / "count.txt").read_text() == "a\nb\n"
    assert [r.id for r in agent.runs()] == [first.run_id]
    view = agent.show(first.run_id[:6])
    assert [s.tool_name for s in view.steps if s.kind == "tool"] == ["count", "count"]
    with pytest.raises(UsageError, match="nothing to resume"):
        agent.resume(first.run_id)


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_approve_then_resume_under_shell_ask(
    tmp_path: Path,
    workspace: Path,
    env: dict[str, str],
    write_script: Callable[..., str],
    cli: Callable[..., Any],
) -> None:
    model = write_script(
        [{"tool_calls": [{"name": "count", "arguments": {"label": "x"}}]}, {"content": "ok"}]
    )
    db = f"sqlite:///{tmp_path / 'store.db'}"  # the CLI fixture's store: both see the same run
    agent = Agent(model=model, workspace=workspace, db=db, tools=[Counted()], shell="ask", env=env)
    blocked = agent.start("count once")
    assert (blocked.status, blocked.stop_reason) == ("blocked", "approval_required")
    assert not (workspace / "count.txt").exists()
    assert cli("show", blocked.run_id, "--json").json()["status"] == "blocked"
    approval = agent.approve(blocked.run_id)
    assert approval.tool_name == "count"
    assert agent.resume(blocked.run_id).status == "completed"
    assert (workspace / "count.txt").read_text() == "x\n"
    assert {t.name: t.source for t in agent.tools()}["count"] == "python"


def test_bad_settings_fail_when_the_agent_is_made(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="max_steps"):
        Agent(model="demo", max_steps=0, env=env)
    with pytest.raises(ConfigError, match="no_such_setting"):
        Agent(model="demo", no_such_setting=1, env=env)


def test_import_stays_cheap() -> None:
    code = "import sys, durable_agent; print(sorted(m for m in ('pydantic', 'sqlalchemy', 'openai') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]"


KILLED_PROGRAM = """
import json, sys
from pathlib import Path
from typing import ClassVar
from pydantic import BaseModel
from durable_agent import Agent, EffectClass, ToolContext, ToolResult

class CountArgs(BaseModel):
    label: str

class Counted:
    name: ClassVar[str] = "count"
    description: ClassVar[str] = "Count a call."
    args_model: ClassVar[type[BaseModel]] = CountArgs
    effect: ClassVar[EffectClass] = EffectClass.EXEC

    def run(self, args: CountArgs, ctx: ToolContext) -> ToolResult:
        with (ctx.workspace / "count.txt").open("a") as f:
            f.write(args.label + "\\n")
        if args.label == "hang":  # mid-call: the test kills this process now
            Path(sys.argv[4]).write_text("in the tool")
            Path(sys.argv[4] + ".fifo").read_text()  # blocks: nobody ever writes it
        return ToolResult(output="counted " + args.label)

agent = Agent(model="gpt-4.1-mini", base_url=sys.argv[1], workspace=sys.argv[2], db=sys.argv[3],
              tools=[Counted()], shell="allow", retry_max_attempts=1)
agent.start("count", run_id="killed")
"""


@pytest.mark.parametrize("where", ["model", "tool"])
def test_a_run_killed_mid_call_through_the_api_resumes_with_nothing_paid_twice(
    tmp_path: Path, workspace: Path, env: dict[str, str], where: str
) -> None:
    """SIGKILL of a program in the middle of `Agent.start` (inside a model call, or inside
    an exec tool): `Agent.resume` pays no finished model call again and runs no finished
    tool again; the tool cut off is not run again unasked (an exec's effect is uncertain)."""
    import os
    import signal

    from fake_openai import spawn_fake_openai
    from scale_helpers import wait_for

    calls = [{"name": "count", "arguments": {"label": "a"}}]
    script = [
        {"tool_calls": calls},
        {"tool_calls": [{"name": "count", "arguments": {"label": "hang"}}]},
        {"content": "done"},
    ]
    if where == "model":
        script[1] = {"tool_calls": [{"name": "count", "arguments": {"label": "b"}}]}
    faults = [{"turn": 2, "attempt": 1, "stall": "headers", "every": 0.2}]
    marker = tmp_path / "in-tool"
    os.mkfifo(str(marker) + ".fifo")
    db = f"sqlite:///{tmp_path / 'killed.db'}"
    (tmp_path / "program.py").write_text(KILLED_PROGRAM)
    with spawn_fake_openai(tmp_path / "fake", script, faults if where == "model" else []) as server:
        child_env = {**env, "OPENAI_API_KEY": "sk-test"}
        proc = subprocess.Popen(
            [
                sys.executable,
                str(tmp_path / "program.py"),
                server.url,
                str(workspace),
                db,
                str(marker),
            ],
            env=child_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            if where == "model":  # the third model call is under way (and stalls)
                wait_for(
                    lambda: (
                        proc.poll() is not None or any(r["turn"] == 2 for r in server.requests())
                    ),
                    60,
                    "turn 2",
                )
            else:
                wait_for(lambda: marker.exists() or proc.poll() is not None, 60, "the tool")
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait()
        agent = Agent(
            model="gpt-4.1-mini",
            base_url=server.url,
            workspace=workspace,
            db=db,
            tools=[Counted()],
            shell="allow",
            retry_max_attempts=1,
            env=child_env,
        )
        resumed = agent.resume("killed")
        turns = [r["turn"] for r in server.requests() if r.get("kind") == "turn"]
    if where == "model":
        assert (resumed.status, resumed.answer) == ("completed", "done")
        assert (workspace / "count.txt").read_text() == "a\nb\n"  # each tool ran once
        assert turns == [0, 1, 2, 2]  # only the call cut off is made again
    else:
        # The exec cut off is not run again unasked: the run asks, as the CLI's does.
        assert (resumed.status, resumed.stop_reason) == ("blocked", "uncertain_side_effect")
        assert (workspace / "count.txt").read_text() == "a\nhang\n"
        assert turns == [0, 1]
    steps = agent.show("killed").steps
    keys = [s.idempotency_key for s in steps]
    assert len(keys) == len(set(keys))
    paid = [s for s in steps if s.kind == "model" and s.state == "completed"]
    assert sorted(s.turn for s in paid) == sorted(set(s.turn for s in paid))


def test_approve_returns_the_answer_and_refuses_one_answered_meanwhile(
    tmp_path: Path, workspace: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ui_support import answered_meanwhile, blocked_run

    db = f"sqlite:///{tmp_path / 'approve.db'}"
    blocked_run(db, "asked")
    blocked_run(db, "race")
    agent = Agent(model="demo", workspace=workspace, db=db, env=env)
    answer = agent.approve("asked", deny=True, by="carol")
    assert (answer.decision, answer.decided_by) == ("denied", "carol")
    assert answer.decided_at is not None and answer == agent.show("asked").approvals[0]
    answered_meanwhile(monkeypatch, db, approved=True)
    with pytest.raises(UsageError, match="already approved"):
        agent.approve("race", deny=True)
    assert [(a.decision, a.decided_by) for a in agent.show("race").approvals] == [
        ("approved", "ui:link")
    ]


def test_a_run_id_with_nul_is_run_not_found_on_either_store(
    store_url: str, workspace: Path, env: dict[str, str]
) -> None:
    from durable_agent.errors import RunNotFound

    agent = Agent(model="demo", workspace=workspace, db=store_url, env=env)
    for call in (
        lambda: agent.show("a\x00b"),
        lambda: agent.approve("a\x00b"),
        lambda: agent.resume("a\x00b"),
        lambda: agent.continue_run("a\x00b", "more"),
    ):
        with pytest.raises(RunNotFound):
            call()
