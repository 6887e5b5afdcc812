"""durable-agent: a coding agent that cannot lose its work.

Every state transition of a run is checkpointed to a SQL database before the next one
begins, so a run killed at any instant resumes from its last verified step.
Start reading at `loop/runner.py` (the loop) and `loop/step.py` (the step primitive: every
step's checkpoints).

For programs: `from durable_agent import Agent` (docs/api.md). The names below load on
first use, so `import durable_agent` (and `durable-agent --help`) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "Agent": "durable_agent.api",
    "RunView": "durable_agent.api",
    "Outcome": "durable_agent.loop.outcome",
    "EffectClass": "durable_agent.status",
    "Tool": "durable_agent.tools.base",
    "ToolContext": "durable_agent.tools.base",
    "ToolResult": "durable_agent.tools.base",
    "ToolFailure": "durable_agent.tools.base",
    "WriteTool": "durable_agent.tools.base",
    "IdempotentWriteTool": "durable_agent.tools.base",
    "ExecTool": "durable_agent.tools.base",
    "SchemaTool": "durable_agent.tools.base",
    "WritePlan": "durable_agent.tools.base",
}
__all__ = [
    "Agent",
    "EffectClass",
    "ExecTool",
    "IdempotentWriteTool",
    "Outcome",
    "RunView",
    "SchemaTool",
    "Tool",
    "ToolContext",
    "ToolFailure",
    "ToolResult",
    "WritePlan",
    "WriteTool",
    "__version__",
]

if TYPE_CHECKING:
    from durable_agent.api import Agent, RunView
    from durable_agent.loop.outcome import Outcome
    from durable_agent.status import EffectClass
    from durable_agent.tools.base import (
        ExecTool,
        IdempotentWriteTool,
        SchemaTool,
        Tool,
        ToolContext,
        ToolFailure,
        ToolResult,
        WritePlan,
        WriteTool,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'durable_agent' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
