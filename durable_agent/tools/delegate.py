"""The built-in `delegate` tool: hand a part of the task to a child run (docs/delegation.md).

Only its arguments and schema live here; the call is not run by `run`: the loop executes it
as a step of kind `delegate` (loop/delegate_step.py), which creates the child run in its
intent and runs it durably."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from durable_agent.status import EffectClass
from durable_agent.tools.base import ToolContext, ToolResult

NAME = "delegate"


class DelegateArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, description="What the child run is to do, self-contained.")
    tools: list[str] | None = Field(
        None, description="The tools the child may use (names; all of this run's when omitted)."
    )
    model: str | None = Field(None, description="The child's model (this run's when omitted).")
    max_steps: int | None = Field(None, ge=1, description="The child's model calls, at most.")
    max_cost: float | None = Field(None, gt=0, description="The child's spend, at most.")
    workspace: Literal["shared", "shared-write", "copy"] = Field(
        "shared",
        description="`shared`: this run's files, read-only for the child (only read tools); "
        "`shared-write`: the child may change them too; `copy`: the child works on a copy of "
        "them and its changes come back as a diff for you to apply.",
    )


class Delegate:
    name: ClassVar[str] = NAME
    description: ClassVar[str] = (
        "Hand a self-contained part of the task to a child agent with its own context; its "
        "final answer comes back as this call's result. Delegations asked together in one "
        "answer run at the same time, unless they write the shared files."
    )
    args_model: ClassVar[type[BaseModel]] = DelegateArgs
    # Not a read: the child may run commands and write (what it may do is its own tools').
    effect: ClassVar[EffectClass] = EffectClass.EXEC

    def run(self, args: DelegateArgs, ctx: ToolContext) -> ToolResult:
        return ToolResult(error="delegate runs as a step of the loop, not as a tool")
