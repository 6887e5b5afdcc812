"""What a tool is: a pydantic argument model, an effect class and a `run`.

Write tools also `plan` their effect before it happens (the file's hash before and the
hash it will have after), so resume can tell whether an interrupted write landed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from msgspec import Struct, field
from pydantic import BaseModel

from durable_agent.status import EffectClass

if TYPE_CHECKING:
    from durable_agent.tools.os_sandbox import Sandbox


class ToolContext(Struct, frozen=True):
    workspace: Path
    run_id: str
    call_id: str
    output_cap: int = 20_000
    env: Mapping[str, str] = field(default_factory=dict)
    """The harness's environment; a command gets only what `process.command_env` keeps of it."""
    command_env: tuple[str, ...] = ()
    """The `command_env` setting: host variables a command gets beyond the allowlist."""
    command_timeout_s: float = 300.0
    cancel: threading.Event | None = None
    on_process_start: Callable[[int], float | None] | None = None
    """Records a command's process group before it starts; returns the CLOCK_BOOTTIME by
    which it must start (the run's lease), or None (no limit). See process.run_process."""
    sandbox: Sandbox | None = None
    """How the run contains commands: an exec tool passes it to `run_process(sandbox=...)`
    (None only under --sandbox off). In-process Python code is not contained by it."""
    stored_output: Callable[[str], str | None] | None = None
    """The recorded result of an earlier tool call of this run, by call id (read_output)."""
    store: str | None = None
    """The run's store URL: the file tools never write an SQLite store's own files (a store
    may lie in the workspace under --sandbox off or read-only)."""
    before_rename: Callable[[], None] | None = None
    """Called by a file tool right before its write lands (the rename): raises LeaseLost when
    the run may be another's by now (see files.atomic_write); None: no check."""


class ToolResult(Struct, frozen=True):
    """An observation. `error` set means the call failed; the model is told either way."""

    output: str = ""
    error: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def for_model(self) -> str:
        if self.error is None:
            return self.output
        return f"Error: {self.error}" + (f"\n{self.output}" if self.output else "")


class ToolFailure(Exception):
    """Raised inside a tool for an expected failure; becomes an error observation."""


class WritePlan(Struct, frozen=True):
    """A write's postcondition, recorded in the intent row before the write happens."""

    path: str
    before_sha: str | None  # None: the file did not exist
    after_sha: str


class Tool(Protocol):
    name: ClassVar[str]
    description: ClassVar[str]
    args_model: ClassVar[type[BaseModel]]
    effect: ClassVar[EffectClass]

    def run(self, args: Any, ctx: ToolContext) -> ToolResult: ...


class WriteTool(Tool, Protocol):
    def plan(self, args: Any, ctx: ToolContext) -> WritePlan: ...

    def current_sha(self, plan: WritePlan, ctx: ToolContext) -> str | None: ...


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI function-calling schema, generated from the argument model (or given as
    `parameters` by a tool whose schema comes from elsewhere, as an MCP server's does)."""
    given = getattr(tool, "parameters", None)
    if isinstance(given, dict):
        return {
            "type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": given},
        }
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": json.loads(_parameters(tool.args_model)),
        },
    }


@lru_cache(maxsize=256)
def _parameters(args_model: type[BaseModel]) -> str:
    """The argument model's JSON schema, as text: generating it cost a run (a worker's every
    run) a few milliseconds, and each caller gets its own copy to keep or change. The built-in
    tools' are generated ahead (tools/schemas.py): pydantic's generator cost every start 0.6%."""
    from durable_agent.tools.schemas import SCHEMAS

    found = SCHEMAS.get(f"{args_model.__module__}.{args_model.__qualname__}")
    return found if found is not None else generated_parameters(args_model)


def generated_parameters(args_model: type[BaseModel]) -> str:
    """The argument model's JSON schema as pydantic generates it, without titles."""
    params = args_model.model_json_schema()
    params.pop("title", None)
    for prop in params.get("properties", {}).values():
        prop.pop("title", None)
    return json.dumps(params)
