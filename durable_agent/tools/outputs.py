"""read_output: an earlier tool result again, from the store (read effect).

Compaction elides old tool results from the request, never from the store; the stub it
leaves names this tool, so the model can look at an elided output again when it needs it.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, Field

from durable_agent.status import EffectClass
from durable_agent.tools.base import ToolContext, ToolFailure, ToolResult
from durable_agent.tools.limits import cap_text


class ReadOutputArgs(BaseModel):
    call_id: str = Field(description="The id of an earlier tool call of this run, e.g. call_12.")


class ReadOutput:
    name: ClassVar[str] = "read_output"
    description: ClassVar[str] = (
        "Read the stored result of an earlier tool call again, by its call id "
        "(for outputs elided from the conversation to save context)."
    )
    args_model: ClassVar[type[BaseModel]] = ReadOutputArgs
    effect: ClassVar[EffectClass] = EffectClass.READ

    def run(self, args: ReadOutputArgs, ctx: ToolContext) -> ToolResult:
        found = ctx.stored_output(args.call_id) if ctx.stored_output is not None else None
        if found is None:
            raise ToolFailure(f"no recorded tool result with call id {args.call_id!r} in this run")
        return ToolResult(output=cap_text(found, ctx.output_cap), data={"bytes": len(found)})
