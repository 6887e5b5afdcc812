"""How an MCP server is configured: `[mcp_servers.NAME]` in TOML, or `--mcp NAME=COMMAND`.

Pure pydantic, no `mcp` import: settings validate without the extra installed.
"""

import re
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from durable_agent.errors import ConfigError

SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
MASK = "***"
CODEX_ALIASES = {"startup_timeout_sec": "startup_timeout_s", "tool_timeout_sec": "timeout_s"}
"""Codex's key -> ours (Codex's `enabled` and `env_vars` are ours too)."""


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
    args: list[str] = []
    """Its arguments."""
    env: dict[str, str] = {}
    """Variables added to its environment (the harness's credentials are never passed on)."""
    cwd: str | None = None
    """Directory it starts in (default: the workspace)."""
    url: str | None = None
    """Streamable-HTTP endpoint instead of a command."""
    timeout_s: float | None = Field(None, gt=0)
    """Seconds one tool call may take (default: mcp_timeout_s)."""
    tools: dict[str, McpToolOverride] = {}
    """Per-tool overrides, by the server's tool name."""
    startup_timeout_s: float | None = Field(None, gt=0)
    """Seconds it may take to start and list its tools (default: mcp_startup_timeout_s)."""
    network: bool = False
    """Let it reach the network under the sandbox even when the run's --network is off (a
    launch that downloads its package, `npx -y ...` or `uvx ...`, needs it)."""
    cache_dir: str | None = None
    """A folder it may write, given to it as npm_config_cache, UV_CACHE_DIR, XDG_CACHE_HOME
    and PIP_CACHE_DIR (default: mcp-cache/NAME in the harness's data folder), writable
    under bubblewrap."""
    env_vars: list[str] = []
    """Names of the harness's environment variables passed on to it as they are."""
    enabled: bool = True
    """false: configured but not started, its tools not offered."""
    required: bool = False
    """true: a run does not start without it. Otherwise a server that fails to start is a
    warning and its tools are absent (recorded so with the run)."""

    @model_validator(mode="before")
    @classmethod
    def _codex_names(cls, data: Any) -> Any:
        """Codex's names for the same settings, so its `[mcp_servers.NAME]` can be pasted."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for codex, ours in CODEX_ALIASES.items():
            if codex in data:
                if ours in data:
                    raise ValueError(f"give `{ours}` or `{codex}` (the same setting), not both")
                data[ours] = data.pop(codex)
        return data

    @model_validator(mode="after")
    def _one_transport(self) -> "McpServerConfig":
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
    server of the same name (a value that is not configured any more is left out). A server
    recorded with a credential's value taken out of its command line or URL
    (`[REDACTED:NAME]`, Settings.redacted_dict) is the configured one of its name, or left
    out: a `--mcp` flag of the resume gives it again."""
    merged: dict[str, Any] = {}
    for name, server in recorded.items():
        if not isinstance(server, dict):
            merged[name] = server
            continue
        now = configured.get(name)
        if holds_redacted({k: v for k, v in server.items() if k != "env"}):
            if now is not None:
                merged[name] = now
            continue
        now_env = (
            now.env
            if isinstance(now, McpServerConfig)
            else dict((now or {}).get("env") or {})
            if isinstance(now, dict)
            else {}
        )
        env = {
            k: (now_env[k] if _masked(v) else v)
            for k, v in dict(server.get("env") or {}).items()
            if not _masked(v) or k in now_env
        }
        merged[name] = {**server, "env": env}
    return merged


def _masked(value: Any) -> bool:
    return value == MASK or holds_redacted(value)


def holds_redacted(value: Any) -> bool:
    """A recorded value that held a credential's value (`[REDACTED:NAME]` in a string)."""
    if isinstance(value, str):
        return "[REDACTED:" in value
    if isinstance(value, dict):
        return any(holds_redacted(k) or holds_redacted(v) for k, v in value.items())
    if isinstance(value, list):
        return any(holds_redacted(v) for v in value)
    return False


def read_mcp_json(path: Path) -> dict[str, Any]:
    """The servers of a Claude Code / Cursor / VS Code style JSON file: `{"mcpServers": {NAME:
    {command, args, env, url, ...}}}` (VS Code's `servers` too), as `[mcp_servers.NAME]` tables.
    Their `type` ("stdio", "http", "streamable-http") is implied by command or url here."""
    import json

    try:
        data = json.loads(path.expanduser().read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"mcp_config: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"mcp_config: cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"mcp_config: {path} is not JSON: {exc}") from None
    servers = data.get("mcpServers", data.get("servers")) if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError(f'mcp_config: {path} has no "mcpServers" object of servers')
    found: dict[str, Any] = {}
    for name, server in servers.items():
        if not isinstance(server, dict):
            raise ConfigError(f"mcp_config: {path}: server {name!r} is not an object")
        server = dict(server)
        kind = server.pop("type", None)
        if kind not in (None, "stdio", "http", "streamable-http", "streamableHttp"):
            raise ConfigError(
                f"mcp_config: {path}: server {name!r} has type {kind!r}; "
                "only stdio (command) and streamable HTTP (url) servers are supported"
            )
        if "disabled" in server:  # Cline's and Roo's spelling
            server["enabled"] = not server.pop("disabled")
        found[str(name)] = server
    return found
