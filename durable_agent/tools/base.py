"""What a tool is: a pydantic argument model, an effect class and a `run`.

By effect class (the Protocols below; `declared` reads what a tool declares):

    read    Tool                  run again after a crash
    write   WriteTool             `plan`s its effect before it happens (the file's hash before
                                  and after), so resume can tell whether it landed
            IdempotentWriteTool   no plan: says it is `idempotent`, run again after a crash
    exec    ExecTool              `asks` under --shell ask; `pgid_before_start`: starts only
                                  after its process group is recorded
    (any)   SchemaTool            its own JSON schema (`parameters`)
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
    """A write's postcondition, recorded in the intent row before the write happens. `path`
    is the one file the write changes: the step's snapshots look at it alone."""

    path: str
    before_sha: str | None  # None: the file did not exist
    after_sha: str


class Tool(Protocol):
    """Every tool; a read tool (`EffectClass.READ`) is only this: run again after a crash."""

    name: ClassVar[str]
    description: ClassVar[str]
    args_model: ClassVar[type[BaseModel]]
    effect: ClassVar[EffectClass]

    def run(self, args: Any, ctx: ToolContext) -> ToolResult: ...


class WriteTool(Tool, Protocol):
    """A write with a postcondition: `plan` says the file's hash before and after, recorded
    in the intent; after a crash `current_sha` tells whether the write landed."""

    def plan(self, args: Any, ctx: ToolContext) -> WritePlan: ...

    def current_sha(self, plan: WritePlan, ctx: ToolContext) -> str | None: ...


class IdempotentWriteTool(Tool, Protocol):
    """A write without a plan: after a crash it is simply run again, so it must be
    idempotent, and says so (`idempotent = True`; a plan-less write without it is refused
    when the tool is loaded)."""

    idempotent: ClassVar[bool]


class ExecTool(Tool, Protocol):
    """A command-like effect, never run again after a crash without a person.

    `asks`: under `--shell ask` it asks first (default True). `pgid_before_start`: its one
    command starts only after its process group is committed (`ctx.on_process_start`), so an
    attempt cut off with no process group recorded never began and is run again without a
    question; declared by the class itself (a subclass that runs commands otherwise does not
    inherit it)."""

    asks: ClassVar[bool]
    pgid_before_start: ClassVar[bool]


class SchemaTool(Tool, Protocol):
    """A tool whose arguments' JSON schema comes from elsewhere (an MCP server's)."""

    parameters: ClassVar[dict[str, Any]]


class Declared(Struct, frozen=True):
    """A tool's protocol as it declares it (the Protocols above), read in one place."""

    effect: EffectClass
    planned: bool  # a WriteTool: plan and current_sha
    idempotent: bool  # an IdempotentWriteTool
    asks: bool  # an ExecTool that asks under --shell ask
    pgid_before_start: bool  # an ExecTool whose command waits for its recorded process group
    parameters: dict[str, Any] | None  # a SchemaTool's own schema


def declared(tool: Tool) -> Declared:
    """What `tool` declares beyond `Tool`: the one reader of the optional features."""
    features = type(tool).__dict__
    planned = callable(getattr(tool, "plan", None)) and callable(getattr(tool, "current_sha", None))
    parameters = getattr(tool, "parameters", None)
    return Declared(
        effect=tool.effect,
        planned=tool.effect is EffectClass.WRITE and planned,
        idempotent=getattr(tool, "idempotent", False) is True,
        asks=getattr(tool, "asks", True) is not False,
        pgid_before_start=features.get("pgid_before_start") is True,
        parameters=parameters if isinstance(parameters, dict) else None,
    )


def protocol_problem(tool: Tool) -> str | None:
    """Why the loop could not run `tool` durably by its effect class; None when it can."""
    d = declared(tool)
    if d.effect is EffectClass.WRITE and not d.planned and not d.idempotent:
        return (
            "is a write tool without `plan` and `current_sha`: resume runs it again after a "
            "crash, so it must be idempotent and say so (`idempotent = True`), or plan its write"
        )
    return None


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI function-calling schema, generated from the argument model (or given as
    `parameters` by a tool whose schema comes from elsewhere, as an MCP server's does)."""
    given = declared(tool).parameters
    if given is not None:
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
