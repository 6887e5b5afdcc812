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
