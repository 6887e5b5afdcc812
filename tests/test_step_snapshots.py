"""Every step that can change files is measured from a snapshot taken when it started.

A step's changes (`step_changes`, `durable-agent diff RUN --step N`) are its "after"
snapshot compared with its "before" one. Each effect class goes through the one step
primitive (durable_agent/loop/step.py), which takes both: a write tool without a `plan`
(a Python plugin, an MCP tool annotated idempotent) once started without the "before"
snapshot, and its changes were then every file of the workspace, or none at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# A plan-less write tool: idempotent (writing the same text twice leaves the same file).
PLUGIN = """
from typing import Any, ClassVar

from pydantic import BaseModel

from durable_agent import EffectClass, ToolContext, ToolResult


class Args(BaseModel):
    path: str
    text: str


class SaveNote:
    name: ClassVar[str] = "save_note"
    description: ClassVar[str] = "Write a note into the workspace."
    args_model: ClassVar[type[BaseModel]] = Args
    effect: ClassVar[EffectClass] = EffectClass.WRITE
    idempotent: ClassVar[bool] = True

    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        (ctx.workspace / args.path).write_text(args.text)
        return ToolResult(output="saved " + args.path)
"""


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


@pytest.fixture
def existing(workspace: Path) -> Path:
    """A workspace with files of its own before the run: none of them is any step's change."""
    (workspace / "a.txt").write_text("alpha\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "b.txt").write_text("beta\n")
    return workspace


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "da_save_note.py").write_text(PLUGIN)
    return {"PYTHONPATH": str(site)}


def shown_number(show_text: str, tool: str) -> int:
    """The number `show` prints for the step of `tool` (what `diff --step` takes)."""
    for line in show_text.splitlines():
        found = re.match(r"\s*(\d+)\b.*\b" + re.escape(tool) + r"\b", line)
        if found and "model" not in line.split(tool)[0]:
            return int(found.group(1))
    raise AssertionError(f"no step of {tool} in:\n{show_text}")


def step_changes(sql: Callable[..., list[Any]], tool: str) -> list[tuple[str, str]]:
    return sql(
        "SELECT c.path, c.change FROM step_changes c JOIN steps s "
        "ON s.run_id = c.run_id AND s.seq = c.seq WHERE s.tool_name = ? ORDER BY c.path",
        tool,
    )


def check_step(
    cli: Callable[..., Any],
    sql: Callable[..., list[Any]],
    run_id: str,
    tool: str,
    created: str | None,
    extra_env: dict[str, str],
) -> None:
    """`tool`'s step changed exactly `created` (added), in the view and in `diff --step`."""
    expected = [(created, "added")] if created else []
    assert step_changes(sql, tool) == expected, tool
    shown = cli("show", run_id, extra_env=extra_env)
    assert shown.code == 0, shown.stderr
    n = shown_number(shown.stdout, tool)
    diff = cli("diff", run_id, "--step", str(n), extra_env=extra_env)
    assert diff.code == 0, diff.stderr
    stat = cli("diff", run_id, "--step", str(n), "--json", extra_env=extra_env)
    changes = {(c["path"], c["change"]) for c in json.loads(stat.stdout)["changes"]}
    assert changes == set(expected), (tool, changes)
    if created:
        assert f"+++ b/{created}" in diff.stdout, (tool, diff.stdout)
        assert "a.txt" not in diff.stdout and "sub/b.txt" not in diff.stdout
    else:
        assert "diff --durable-agent" not in diff.stdout, (tool, diff.stdout)


@pytest.mark.slow  # over 2 s on 2 cores
def test_each_effect_class_records_only_what_its_step_changed(
    cli: Callable[..., Any],
    existing: Path,
    write_script: Callable[..., str],
    plugin_env: dict[str, str],
    tmp_path: Path,
    sql: Callable[..., list[Any]],
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('tools = ["da_save_note:SaveNote"]\n')
    extra_env = {**plugin_env, "DURABLE_AGENT_CONFIG": str(config)}
    model = write_script(
        [
            call("read_file", path="a.txt"),
            call("write_file", path="w.txt", content="planned\n"),
            call("save_note", path="p.txt", text="no plan\n"),
            call("run_command", command="echo ran > e.txt"),
            {"content": "done"},
        ]
    )
    r = cli(
        "start",
        "make files",
        "--model",
        model,
        "--shell",
        "allow",
        "--run-id",
        "fx",
        extra_env=extra_env,
    )
    assert r.code == 0, r.stderr
    # Every step that can change files has both snapshots; a read has none.
    trees = dict(
        sql(
            "SELECT tool_name, tree_before IS NOT NULL AND tree_id IS NOT NULL FROM steps "
            "WHERE kind = 'tool'"
        )
    )
    assert trees == {"read_file": 0, "write_file": 1, "save_note": 1, "run_command": 1}
    check_step(cli, sql, "fx", "read_file", None, extra_env)
    check_step(cli, sql, "fx", "write_file", "w.txt", extra_env)
    check_step(cli, sql, "fx", "save_note", "p.txt", extra_env)
    check_step(cli, sql, "fx", "run_command", "e.txt", extra_env)


@pytest.mark.slow  # an MCP server's start: over 2 s on 2 cores
def test_an_idempotent_mcp_write_records_only_what_it_changed(
    cli: Callable[..., Any],
    existing: Path,
    write_script: Callable[..., str],
    tmp_path: Path,
    sql: Callable[..., list[Any]],
) -> None:
    pytest.importorskip("mcp")
    from mcp_support import fault_config

    config = fault_config(tmp_path, existing)
    extra_env = {"DURABLE_AGENT_CONFIG": str(config)}
    model = write_script([call("f__save", path="m.txt", text="from mcp\n"), {"content": "done"}])
    r = cli("start", "save", "--model", model, "--run-id", "mx", extra_env=extra_env)
    assert r.code == 0, r.stderr
    assert sql("SELECT effect FROM steps WHERE tool_name = 'f__save'") == [("write",)]
    assert (existing / "m.txt").read_text() == "from mcp\n"
    check_step(cli, sql, "mx", "f__save", "m.txt", extra_env)
