"""run_command: one shell command in the workspace, in its own process group (exec effect)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, Field

from durable_agent.status import EffectClass
from durable_agent.tools.base import ToolContext, ToolResult
from durable_agent.tools.process import command_env, run_process

HEADER_ROOM = 200  # "exit code: …", "stdout:", "stderr:" and the line breaks


class RunCommandArgs(BaseModel):
    command: str = Field(description="Shell command line, run with bash -c in the workspace.")
    timeout_s: float | None = Field(
        None, gt=0, le=3600, description="Seconds before the command is killed."
    )


class RunCommand:
    name: ClassVar[str] = "run_command"
    description: ClassVar[str] = (
        "Run a shell command in the workspace (non-interactive; stdin is empty). "
        "Returns the exit code, stdout and stderr."
    )
    args_model: ClassVar[type[BaseModel]] = RunCommandArgs
    effect: ClassVar[EffectClass] = EffectClass.EXEC
    # The command starts only once its process group is committed (`on_start`, process.py):
    # an attempt cut off with no pgid recorded never began (tool_step._never_began). A subclass
    # that runs commands otherwise does not inherit it: only this class's own attribute counts.
    pgid_before_start: ClassVar[bool] = True

    def run(self, args: RunCommandArgs, ctx: ToolContext) -> ToolResult:
        outcome = run_process(
            args.command,
            cwd=ctx.workspace,
            env=command_env(
                ctx.env, run_id=ctx.run_id, call_id=ctx.call_id, passthrough=ctx.command_env
            ),
            timeout_s=args.timeout_s or ctx.command_timeout_s,
            # Both streams and the header fit the result cap, so only one truncation marker shows.
            output_cap=max(100, (ctx.output_cap - HEADER_ROOM) // 2),
            on_start=ctx.on_process_start,
            cancel=ctx.cancel,
            sandbox=ctx.sandbox,
            workspace=ctx.workspace,
        )
        # No exit code after a timeout or cancel: say so rather than print "None".
        code = "none (killed)" if outcome.exit_code is None else str(outcome.exit_code)
        parts = [f"exit code: {code}"]
        if outcome.stdout:
            parts.append(f"stdout:\n{outcome.stdout}")
        if outcome.stderr:
            parts.append(f"stderr:\n{outcome.stderr}")
        parts.extend(f"note: {note}" for note in outcome.notes)
        data = {
            "exit_code": outcome.exit_code,
            "timed_out": outcome.timed_out,
            "cancelled": outcome.cancelled,
            "duration_ms": outcome.duration_ms,
            "stdout_bytes": outcome.stdout_bytes,
            "stderr_bytes": outcome.stderr_bytes,
            "pgid": outcome.pgid,
        }
        text = "\n".join(parts)
        if outcome.cancelled:
            return ToolResult(
                output=text,
                error="the command was cancelled and its process group killed",
                data=data,
            )
        if outcome.timed_out:
            return ToolResult(
                output=text,
                error=f"timed out after {args.timeout_s or ctx.command_timeout_s:g} s; "
                "the process group was killed",
                data=data,
            )
        return ToolResult(output=text, data=data)
