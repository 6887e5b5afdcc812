"""`python -m durable_agent.demo.power_cut ARGS…`: the real CLI with one fault injected, for
`durable-agent demo`: edit_file writes its file, then the process is killed with SIGKILL
before the edit's outcome can be recorded — the worst moment for a crash.

The fault goes in through the public `register_tool` (a custom tool replaces the built-in of
the same name), not by counting checkpoint commits with DURABLE_AGENT_CRASH_AFTER: the
crash lands at the same instant however the journal batches its writes.
"""

from __future__ import annotations

import os
import signal

from durable_agent.tools.base import ToolContext, ToolResult
from durable_agent.tools.files import EditFile, EditFileArgs


class EditThenPowerCut(EditFile):
    """The real edit_file, then the power goes out."""

    def run(self, args: EditFileArgs, ctx: ToolContext) -> ToolResult:
        result = super().run(args, ctx)
        os.kill(os.getpid(), signal.SIGKILL)
        return result  # not reached


def main() -> int:
    from durable_agent.cli.parser import main as cli_main
    from durable_agent.tools import register_tool

    register_tool(EditThenPowerCut())
    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
