"""What a tool declares beyond `Tool` is one of the Protocols of tools/base.py (WriteTool,
IdempotentWriteTool, ExecTool, SchemaTool): a write without a plan must say it is
idempotent, and no tool is trusted by the module it claims to come from."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

PLUGIN = """
from typing import Any, ClassVar

from pydantic import BaseModel

from durable_agent import EffectClass, ToolContext, ToolResult


class Args(BaseModel):
    path: str


class Sloppy:
    \"\"\"A write with neither a plan nor a word about being idempotent.\"\"\"

    name: ClassVar[str] = "sloppy"
    description: ClassVar[str] = "Write a file."
    args_model: ClassVar[type[BaseModel]] = Args
    effect: ClassVar[EffectClass] = EffectClass.WRITE

    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        (ctx.workspace / args.path).write_text("x")
        return ToolResult(output="ok")


class Impostor:
    \"\"\"A read tool that says it is one of the package's own, and returns no ToolResult.\"\"\"

    __module__ = "durable_agent.tools.files"
    name: ClassVar[str] = "impostor"
    description: ClassVar[str] = "Pretends to be built in."
    args_model: ClassVar[type[BaseModel]] = Args
    effect: ClassVar[EffectClass] = EffectClass.READ

    def run(self, args: Any, ctx: ToolContext) -> Any:
        return 42
"""


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "da_protocols.py").write_text(PLUGIN)
    return {"PYTHONPATH": str(site)}


def test_a_write_without_a_plan_must_say_it_is_idempotent(
    cli: Callable[..., Any], plugin_env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('tools = ["da_protocols:Sloppy"]\n')
    r = cli("tools", extra_env={**plugin_env, "DURABLE_AGENT_CONFIG": str(config)})
    assert r.code == 2, r.stdout
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "'sloppy' is a write tool without `plan`" in r.stderr
    assert "idempotent = True" in r.stderr


def test_a_tool_is_not_trusted_by_the_module_it_names(
    cli: Callable[..., Any],
    plugin_env: dict[str, str],
    tmp_path: Path,
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
) -> None:
    # Its result is checked like any plugged-in tool's: an error observation, not a run that
    # fails at recording time (and runs the tool again on every resume).
    config = tmp_path / "config.toml"
    config.write_text('tools = ["da_protocols:Impostor"]\n')
    model = write_script(
        [
            {"tool_calls": [{"name": "impostor", "arguments": {"path": "a"}}]},
            {"content": "done"},
        ]
    )
    extra_env = {**plugin_env, "DURABLE_AGENT_CONFIG": str(config)}
    r = cli("start", "t", "--model", model, "--json", extra_env=extra_env)
    assert r.code == 0, r.stderr
    assert sql("SELECT state, error FROM steps WHERE kind = 'tool'") == [
        ("failed", "the tool returned int, not a ToolResult")
    ]
    listed = {
        t["name"]: t["source"]
        for t in json.loads(cli("tools", "--json", extra_env=extra_env).stdout)
    }
    assert listed["impostor"] == "config da_protocols:Impostor"


PROGRAM = """
from typing import Any, ClassVar

from pydantic import BaseModel

from durable_agent import (
    EffectClass,
    ExecTool,
    IdempotentWriteTool,
    SchemaTool,
    Tool,
    ToolContext,
    ToolResult,
    WritePlan,
    WriteTool,
)


class Args(BaseModel):
    path: str


class Planned:
    name: ClassVar[str] = "planned"
    description: ClassVar[str] = "A write with a plan."
    args_model: ClassVar[type[BaseModel]] = Args
    effect: ClassVar[EffectClass] = EffectClass.WRITE

    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        return ToolResult(output="ok")

    def plan(self, args: Any, ctx: ToolContext) -> WritePlan:
        return WritePlan(args.path, None, "0" * 64)

    def current_sha(self, plan: WritePlan, ctx: ToolContext) -> str | None:
        return None


class Again(Planned):
    idempotent: ClassVar[bool] = True


class Command(Planned):
    effect: ClassVar[EffectClass] = EffectClass.EXEC
    asks: ClassVar[bool] = False
    pgid_before_start: ClassVar[bool] = True


class Remote(Planned):
    parameters: ClassVar[dict[str, Any]] = {"type": "object"}


tools: list[Tool] = [Planned(), Again(), Command(), Remote()]
write: WriteTool = Planned()
idempotent: IdempotentWriteTool = Again()
command: ExecTool = Command()
schema: SchemaTool = Remote()
"""


@pytest.mark.slow  # mypy over the package: the full lane only
def test_the_tool_protocols_type_check_under_mypy_strict(tmp_path: Path) -> None:
    program = tmp_path / "my_tools.py"
    program.write_text(PROGRAM)
    # The cache of scripts/test's own mypy run of the package (the same strict options): the
    # program is checked against the package's types as they are (mypy looks again at any
    # module changed since), in a second instead of analysing the package and its
    # dependencies from nothing. A copy: tests running side by side must not share one.
    if (ROOT / ".mypy_cache").is_dir():
        shutil.copytree(ROOT / ".mypy_cache", tmp_path / "cache")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(program),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
