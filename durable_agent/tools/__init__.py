"""The tool registry: built-in tools by name, plus custom ones registered in Python.

A custom tool is any object with `name`, `description`, `args_model` (a pydantic model),
`effect` (EffectClass) and `run(args, ctx) -> ToolResult`; write tools also implement
`plan` and `current_sha` (see base.py). Register it with `register_tool` before the run.
"""

from __future__ import annotations

from durable_agent.tools.base import Tool

_custom: dict[str, Tool] = {}


def register_tool(tool: Tool) -> None:
    _custom[tool.name] = tool


def build_tools(shell: str) -> dict[str, Tool]:
    from durable_agent.tools.files import EditFile, ListFiles, ReadFile, SearchText, WriteFile
    from durable_agent.tools.outputs import ReadOutput

    tools: list[Tool] = [
        ListFiles(),
        ReadFile(),
        SearchText(),
        WriteFile(),
        EditFile(),
        ReadOutput(),
    ]
    if shell != "deny":
        from durable_agent.tools.shell import RunCommand

        tools.append(RunCommand())
    registry = {t.name: t for t in tools}
    registry.update(_custom)
    return registry
