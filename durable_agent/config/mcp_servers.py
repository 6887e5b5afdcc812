"""How an MCP server is configured: `[mcp_servers.NAME]` in TOML, or `--mcp NAME=COMMAND`.

Pure pydantic, no `mcp` import: settings validate without the extra installed.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from durable_agent.errors import ConfigError

SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
MASK = "***"


class McpToolOverride(BaseModel):
    """`[mcp_servers.NAME.tools.TOOL]`: what the harness believes about one tool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    effect: Literal["read", "write", "exec"]
    """Effect class instead of the one from the tool's annotations (write = idempotent)."""


class McpServerConfig(BaseModel):
    """One MCP server: a command speaking stdio, or the URL of a streamable-HTTP server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | None = None
    """Program to start (stdio transport)."""
    args: list[str] = Field(default_factory=list)
    """Its arguments."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables added to its environment (the harness's credentials are never passed on)."""
    cwd: str | None = None
    """Directory it starts in (default: the workspace)."""
    url: str | None = None
    """Streamable-HTTP endpoint instead of a command."""
    timeout_s: float | None = Field(None, gt=0)
    """Seconds one tool call may take (default: mcp_timeout_s)."""
    tools: dict[str, McpToolOverride] = Field(default_factory=dict)
    """Per-tool overrides, by the server's tool name."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either `command` (stdio) or `url` (streamable HTTP)")
        return self


def check_server_names(servers: dict[str, McpServerConfig]) -> None:
    for name in servers:
        if not SERVER_NAME_RE.match(name) or "__" in name:
            raise ConfigError(
                f"MCP server name {name!r}: use 1 to 32 letters, digits, '_' or '-' "
                "(no '__': it separates server and tool in NAME__TOOL)"
            )


def parse_cli_server(spec: str) -> tuple[str, dict[str, Any]]:
    """`--mcp NAME=COMMAND ARGS...` -> (NAME, {"command": ..., "args": [...]})."""
    name, sep, command = spec.partition("=")
    name = name.strip()
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"--mcp {spec!r}: {exc}") from None
    if not sep or not name or not argv:
        raise ConfigError(
            f"--mcp takes NAME=COMMAND (e.g. --mcp time=mcp-server-time), not {spec!r}"
        )
    if name.startswith(("http:", "https:")) or argv[0].startswith(("http://", "https://")):
        return name, {"url": command.strip()}
    return name, {"command": argv[0], "args": argv[1:]}


def recorded_env(env: dict[str, str]) -> dict[str, str]:
    """A server's env as recorded with the run: credential-like values masked."""
    from durable_agent.redact import is_secret_name

    return {k: (MASK if is_secret_name(k) or "@" in v else v) for k, v in env.items()}


def merge_recorded(recorded: dict[str, Any], configured: dict[str, Any]) -> dict[str, Any]:
    """Servers recorded with a run, masked env values filled in again from the configured
    server of the same name (a value that is not configured any more is left out)."""
    merged: dict[str, Any] = {}
    for name, server in recorded.items():
        if not isinstance(server, dict):
            merged[name] = server
            continue
        now = configured.get(name)
        now_env = (
            now.env
            if isinstance(now, McpServerConfig)
            else dict((now or {}).get("env") or {})
            if isinstance(now, dict)
            else {}
        )
        env = {
            k: (now_env[k] if v == MASK else v)
            for k, v in dict(server.get("env") or {}).items()
            if v != MASK or k in now_env
        }
        merged[name] = {**server, "env": env}
    return merged
