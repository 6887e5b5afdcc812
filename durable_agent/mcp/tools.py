"""MCP tools as harness tools: names, effect classes, the catalog recorded with a run.

Effect class from the tool's annotations (hints the server gives; the config can override):

    readOnlyHint true                          read   re-run on resume, like read_file
    idempotentHint true, destructiveHint false write   intent row; re-run on resume (idempotent)
    anything else                              exec   intent row; an interrupted call stops
                                                      the run `blocked` until a person decides

Under `--shell ask` an exec tool asks first unless its destructiveHint is false.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, ClassVar, cast

from pydantic import BaseModel, ConfigDict

from durable_agent.config.mcp_servers import McpServerConfig
from durable_agent.config.settings import mask_url_password
from durable_agent.mcp.client import (
    CallTimedOut,
    Launch,
    RemoteTool,
    ServerConnection,
    ServerFailed,
    require_sdk,
)
from durable_agent.mcp.diagnose import explain
from durable_agent.status import EffectClass
from durable_agent.tools.base import Tool, ToolContext, ToolResult

_INVALID = re.compile(r"[^A-Za-z0-9_-]")
STRUCTURED_CAP = 256_000  # characters of a call's structured content kept in steps.output
PING_TIMEOUT_S = 5.0  # a started server that does not answer a ping in this long is restarted


class McpArguments(BaseModel):
    """Whatever the model sends: the server validates against its own schema."""

    model_config = ConfigDict(extra="allow")


def tool_name(server: str, remote: str, taken: Collection[str] = ()) -> str:
    """`NAME__TOOL`, made a valid OpenAI function name (letters, digits, _ and -, ≤ 64).
    One that the cleaning or the cut makes equal to a name in `taken` (`a.b` and `a_b`)
    gets a suffix from a hash of the server's and the tool's names, so each is offered."""
    name = _INVALID.sub("_", f"{server}__{remote}")[:64]
    if name not in taken:
        return name
    digest = hashlib.sha256(f"{server}\0{remote}".encode()).hexdigest()[:8]
    return f"{name[:55]}_{digest}"


def effect_of(annotations: dict[str, Any], override: str | None) -> tuple[EffectClass, bool]:
    """(effect class, asks under --shell ask) for one tool."""
    destructive = annotations.get("destructiveHint")
    asks = destructive is not False  # the protocol's default is destructive
    if override is not None:
        effect = EffectClass(override)
        return effect, asks and effect is EffectClass.EXEC
    if annotations.get("readOnlyHint") is True:
        return EffectClass.READ, False
    if annotations.get("idempotentHint") is True and destructive is False:
        return EffectClass.WRITE, False
    return EffectClass.EXEC, asks


def catalog_entry(
    server: str, config: McpServerConfig, remote: RemoteTool, taken: Collection[str] = ()
) -> dict[str, Any]:
    """One tool as recorded with the run (runs.tool_sources)."""
    override = config.tools.get(remote.name)
    effect, asks = effect_of(remote.annotations, override.effect if override else None)
    return {
        "name": tool_name(server, remote.name, taken),
        "remote": remote.name,
        "description": remote.description,
        "input_schema": remote.input_schema,
        "annotations": remote.annotations,
        "effect": effect.value,
        "asks": asks,
    }


class McpHub:
    """The run's MCP servers, each started on first use and again after it dies."""

    def __init__(
        self,
        servers: dict[str, McpServerConfig],
        *,
        launch_for: Any,
        startup_timeout_s: float,
        call_timeout_s: float,
    ) -> None:
        self.servers = servers
        self._launch_for = launch_for  # (name, config) -> Launch: the env and sandbox are wiring's
        self.startup_timeout_s, self.call_timeout_s = startup_timeout_s, call_timeout_s
        self._live: dict[str, ServerConnection] = {}
        self._offered: dict[str, set[str]] = {}
        self.starts: dict[str, int] = {}

    def connection(self, name: str) -> ServerConnection:
        live = self._live.get(name)
        if live is not None and live.responsive(min(self.startup_timeout_s, PING_TIMEOUT_S)):
            return live
        if live is not None:
            live.close()  # died (during a call, or since the last one): start it again
        require_sdk()
        config = self.servers[name]
        launch: Launch = self._launch_for(name, config)
        startup = config.startup_timeout_s or self.startup_timeout_s
        try:
            conn = ServerConnection(launch, startup)
        except ServerFailed as exc:
            raise ServerFailed(explain(name, config, launch, str(exc))) from None
        self.starts[name] = self.starts.get(name, 0) + 1
        self._live[name] = conn
        try:
            self._offered[name] = {t.name for t in conn.tools(startup)}
        except (ServerFailed, CallTimedOut) as exc:
            conn.close()
            self._live.pop(name, None)
            raise ServerFailed(explain(name, config, launch, str(exc))) from None
        return conn

    def list_tools(self, name: str) -> list[RemoteTool]:
        startup = self.servers[name].startup_timeout_s or self.startup_timeout_s
        return self.connection(name).tools(startup)

    def call(
        self, server: str, remote: str, arguments: dict[str, Any], ctx: ToolContext
    ) -> ToolResult:
        try:
            conn = self.connection(server)
        except ServerFailed as exc:
            return ToolResult(error=str(exc))
        if remote not in self._offered.get(server, set()):
            return ToolResult(
                error=f"MCP server {server!r} no longer offers the tool {remote!r} "
                "(it was offered when the run started); nothing was run"
            )
        timeout = self.servers[server].timeout_s or self.call_timeout_s
        try:
            outcome = conn.call(remote, arguments, timeout, ctx.cancel)
        except CallTimedOut as exc:
            # The server may still be working on it: restart it so no half-done call lingers.
            conn.close()
            return ToolResult(
                error=f"{server}__{remote}: {exc}; the server was stopped and will be "
                "restarted on the next call (the call may have partly run)"
            )
        except ServerFailed as exc:
            conn.close()
            return ToolResult(
                error=f"{exc}. It will be restarted on the next call; this call's "
                "effect is unknown (it may have partly run)"
            )
        data: dict[str, Any] = {"is_error": outcome.is_error}
        if outcome.structured is not None:
            size = len(json.dumps(outcome.structured, default=str))
            if size <= STRUCTURED_CAP:
                data["structured_content"] = outcome.structured
            else:  # the model sees the capped text; the step row is not made the server's dump
                data["structured_content_elided"] = (
                    f"{size} characters of JSON, more than {STRUCTURED_CAP} kept"
                )
        if outcome.is_error:
            return ToolResult(
                output="", error=outcome.text or "the tool reported an error", data=data
            )
        return ToolResult(output=outcome.text, data=data)

    def close(self) -> None:
        for conn in self._live.values():
            conn.close()
        self._live.clear()


class McpTool:
    """Base of the generated per-tool classes (a Tool's name and effect are class attributes)."""

    name: ClassVar[str]
    description: ClassVar[str]
    args_model: ClassVar[type[BaseModel]] = McpArguments
    effect: ClassVar[EffectClass]
    parameters: ClassVar[dict[str, Any]]  # the server's schema (a SchemaTool)
    asks: ClassVar[bool]  # an exec tool asks under --shell ask unless not destructive
    idempotent: ClassVar[bool]  # a write: annotated idempotent (or made a write by the config)
    server: ClassVar[str]
    remote: ClassVar[str]

    def __init__(self, hub: McpHub) -> None:
        self.hub = hub

    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        arguments = args.model_dump() if isinstance(args, BaseModel) else dict(args)
        return self.hub.call(self.server, self.remote, arguments, ctx)


def make_tools(hub: McpHub, catalog: dict[str, Any]) -> dict[str, Tool]:
    """Tools from a recorded catalog: {server: {"tools": [entry, ...]}}."""
    tools: dict[str, Tool] = {}
    for server, source in catalog.items():
        for entry in source.get("tools", []):
            schema = dict(entry.get("input_schema") or {"type": "object", "properties": {}})
            schema.setdefault("type", "object")
            schema.setdefault("properties", {})
            cls = type(
                f"Mcp_{entry['name']}",
                (McpTool,),
                {
                    "name": entry["name"],
                    "description": (entry.get("description") or entry["remote"])[:1024],
                    "effect": EffectClass(entry["effect"]),
                    "parameters": schema,
                    "asks": bool(entry.get("asks", True)),
                    "idempotent": entry["effect"] == EffectClass.WRITE.value,
                    "server": server,
                    "remote": entry["remote"],
                },
            )
            tools[entry["name"]] = cast(Tool, cls(hub))
    return tools


def list_catalog(
    hub: McpHub,
    reserved: Collection[str] = (),
    warn: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Start every server and describe its tools: what a new run records. Every tool gets a
    name of its own, unlike the `reserved` ones (the built-in and plugin tools)."""
    catalog: dict[str, Any] = {}
    taken = set(reserved)
    for name, config in hub.servers.items():
        where = (
            {"url": mask_url_password(config.url)}
            if config.url
            else {"command": config.command, "args": config.args}
        )
        try:
            listed = hub.list_tools(name)
        except ServerFailed as exc:
            if config.required:
                raise
            # An optional server that cannot start: the run goes on without its tools, and
            # the catalog says why they are absent (a resume offers the same: none).
            if warn is not None:
                warn(
                    f"{exc} (optional: its tools are left out; `required = true` makes this fatal)"
                )
            catalog[name] = {**where, "tools": [], "failed": str(exc)}
            continue
        entries = []
        for remote in listed:
            entry = catalog_entry(name, config, remote, taken)
            taken.add(entry["name"])
            entries.append(entry)
        live = hub._live.get(name)
        info = live.server_info if live is not None else {}
        catalog[name] = {**where, "tools": entries, **({"server_info": info} if info else {})}
    return catalog


def log_path(log_dir: Path, server: str) -> Path:
    return log_dir / f"mcp-{server}.log"
