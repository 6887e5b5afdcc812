"""The built-in tools by name, plus ones a program registers in place of one of them.

A tool is any object with `name`, `description`, `args_model` (a pydantic model), `effect`
(EffectClass) and `run(args, ctx) -> ToolResult`; what a write or an exec tool declares
beyond that is in base.py's Protocols. `register_tool` (before the run) puts a program's
own tool next to, or in place of, a built-in one (its source is then `python`); tools of
a program's own are better given to `Agent(tools=...)`.
"""

from __future__ import annotations

from durable_agent.tools.base import Tool

_custom: dict[str, Tool] = {}


def register_tool(tool: Tool) -> None:
    _custom[tool.name] = tool


def registered() -> dict[str, Tool]:
    """The tools registered with `register_tool`, by name (a copy)."""
    return dict(_custom)


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
