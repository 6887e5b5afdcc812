"""Every tool a run is offered, with where it came from: built-in, plugin, config, Python,
MCP server. `ToolSet.open(store, run_id)` gives the run its tools: MCP tools from the
catalog recorded with the run (listed from the servers and recorded by its first session),
so a resume offers the same tools with the same effect classes. `close()` stops the servers.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msgspec import Struct
from msgspec.structs import asdict

from durable_agent.config.settings import Settings
from durable_agent.errors import ConfigError
from durable_agent.tools import build_tools, registered
from durable_agent.tools.base import Tool

if TYPE_CHECKING:
    from durable_agent.config.mcp_servers import McpServerConfig
    from durable_agent.mcp.client import Launch
    from durable_agent.mcp.tools import McpHub
    from durable_agent.store.runs import Store


class ToolInfo(Struct, frozen=True):
    name: str
    source: str
    effect: str
    description: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ToolSet:
    def __init__(
        self,
        settings: Settings,
        env: Mapping[str, str],
        *,
        extra: Sequence[Tool] = (),
        log_dir: Path | None = None,
    ) -> None:
        from durable_agent.tools.plugins import load_named, load_plugins

        self.settings, self.env = settings, env
        self.log_dir = log_dir or Path(settings.workspace) / ".durable-agent-logs"
        self.local: dict[str, Tool] = {}
        self.sources: dict[str, str] = {}
        custom = registered()
        for tool in build_tools(settings.shell).values():
            self._add(tool, "python" if custom.get(tool.name) is tool else "built-in")
        if settings.delegate and settings.max_depth > 0:  # docs/delegation.md
            from durable_agent.tools.delegate import Delegate

            self._add(Delegate(), "built-in")
        for loaded in (*load_plugins(), *load_named(settings.tools)):
            self._add(loaded.tool, loaded.source)
        for tool in extra:
            self._add(tool, "python")
        self.hub: McpHub | None = None
        self.catalog: dict[str, Any] | None = None
        self.warnings: list[str] = []

    def _add(self, tool: Tool, source: str) -> None:
        if source != "built-in":
            from durable_agent.tools.plugins import check_tool

            check_tool(tool, source)
        if tool.name in self.local and self.local[tool.name] is not tool:  # one source twice too
            raise ConfigError(
                f"two tools are named {tool.name!r} ({self.sources[tool.name]}, {source})"
            )
        self.local[tool.name], self.sources[tool.name] = tool, source

    def _mcp_hub(self) -> McpHub:
        if self.hub is None:
            from durable_agent.mcp.tools import McpHub

            self.hub = McpHub(
                self.servers(),
                launch_for=self._launch,
                startup_timeout_s=self.settings.mcp_startup_timeout_s,
                call_timeout_s=self.settings.mcp_timeout_s,
            )
        return self.hub

    def servers(self) -> dict[str, McpServerConfig]:
        """The configured servers that are enabled."""
        return {n: c for n, c in self.settings.mcp_servers.items() if c.enabled}

    def prepare(self) -> None:
        """Start the MCP servers and list their tools (a new run). A required server that
        fails is a ConfigError with the server's stderr tail, before anything is recorded; an
        optional one is a warning, and the catalog records it as failed, without tools."""
        if not self.settings.mcp_servers or self.catalog is not None:
            return
        from durable_agent.mcp.client import ServerFailed
        from durable_agent.mcp.tools import list_catalog

        try:
            self.catalog = list_catalog(self._mcp_hub(), reserved=self.local, warn=self.warn)
        except ServerFailed as exc:
            self.close()
            raise ConfigError(str(exc)) from None

    def open(self, store: Store, run_id: str) -> dict[str, Tool]:
        """The run's tools. MCP tools come from the run's recorded catalog; a run without
        one (its first session) lists the servers and records what they offer."""
        tools = self._allowed(dict(self.local))
        if (
            not self.settings.mcp_servers
        ):  # a run with MCP servers has them in its recorded settings
            return tools
        recorded = store.tool_sources(run_id)
        if recorded is None:
            self.prepare()
            assert self.catalog is not None
            # Its launch lines as the settings record them: no credential's value.
            catalog = self.settings.known_secrets().redact_known_json(self.catalog)
            recorded = store.record_tool_sources(run_id, {"mcp_servers": catalog})
        servers = (recorded or {}).get("mcp_servers") or {}
        if servers:
            from durable_agent.mcp.tools import make_tools

            hub = self._mcp_hub()
            for name in servers:  # a recorded server no longer configured: its calls fail clearly
                if name not in hub.servers:
                    hub.servers[name] = _from_record(name, servers[name])
            tools.update(make_tools(hub, servers))
        return self._allowed(tools)

    def _allowed(self, tools: dict[str, Tool]) -> dict[str, Tool]:
        """Only a delegated child's own tools (`child_tools`, docs/delegation.md)."""
        only = self.settings.child_tools
        return tools if only is None else {n: t for n, t in tools.items() if n in only}

    def listing(self) -> list[ToolInfo]:
        """For `durable-agent tools`: every tool a run started now would be offered."""
        infos = [
            ToolInfo(t.name, self.sources[t.name], str(t.effect.value), _first_line(t.description))
            for t in self.local.values()
        ]
        self.prepare()
        for server, source in (self.catalog or {}).items():
            for entry in source["tools"]:
                infos.append(
                    ToolInfo(
                        entry["name"],
                        f"mcp {server}",
                        entry["effect"],
                        _first_line(entry.get("description") or ""),
                    )
                )
        return infos

    def warn(self, message: str) -> None:
        """One line on stderr (stdout keeps --json's result), kept for the caller too."""
        self.warnings.append(message)
        print(f"durable-agent: warning: {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.hub is not None:
            self.hub.close()

    def _launch(self, name: str, config: McpServerConfig) -> Launch:
        """How to start one server: of the harness's environment what a command gets (the
        allowlist and `command_env`), the server's own env on top, contained like a command
        by the run's OS sandbox."""
        from durable_agent.mcp.client import Launch
        from durable_agent.mcp.tools import log_path
        from durable_agent.tools.os_sandbox import Mechanism, SandboxUnavailable, for_run, prepare
        from durable_agent.tools.process import command_env

        if config.url is not None:
            return Launch(name, url=config.url)
        s = self.settings
        assert config.command is not None
        env = command_env(self.env, run_id="", call_id="", passthrough=s.command_env)
        # A server lives across calls (and is started before the run has an id): no ids.
        env.pop("DURABLE_AGENT_RUN_ID"), env.pop("DURABLE_AGENT_CALL_ID")
        workspace = Path(s.workspace)
        cwd = Path(config.cwd).expanduser() if config.cwd else workspace
        if not cwd.is_absolute():
            cwd = workspace / cwd
        program = _program(name, config.command, self.env.get("PATH"), cwd)
        network = s.network or config.network
        sandbox = for_run(s.sandbox, network, self.env, s.db)
        cache: Path | None = None
        if sandbox.mechanism is not Mechanism.OFF:
            # Under the sandbox the home folder is read-only: what a launcher caches (npm's
            # ~/.npm, uv's ~/.cache/uv) goes to a folder of the server's own, kept between
            # starts. The server's own env may still name another place.
            cache = _cache_dir(name, config, self.env)
            for var in CACHE_VARS:
                env[var] = str(cache)
            env["UV_PYTHON_INSTALL_DIR"] = str(cache / "python")  # uvx may fetch a Python too
            if not network:  # nothing to retry for: fail at once, not after npm's backoff
                env["npm_config_fetch_retries"] = "0"
        env.update({k: self.env[k] for k in config.env_vars if k in self.env})
        env.update(config.env)
        try:
            # The server's program, its whole package (node_modules' parent, a virtualenv),
            # its cwd and the files its arguments name (a script) are the server's own:
            # carried into the sandbox even from under /tmp.
            named = [cwd / a for a in config.args if a and not a.startswith("-")]
            launch = prepare(
                sandbox,
                [program, *config.args],
                cwd=cwd,
                workspace=workspace,
                env=env,
                carry=[Path(program), *package_roots(Path(program)), cwd, *named],
                writable_extra=[cache] if cache is not None else [],
            )
        except SandboxUnavailable as exc:
            raise ConfigError(f"MCP server {name!r}: {exc}") from None
        run_env = dict(launch.env)
        if sandbox.mechanism is Mechanism.LANDLOCK and cache is not None:
            # Landlock cannot open the cache_dir for writing (it grants whole trees): what is
            # downloaded goes to the launch's private TMPDIR instead, removed when it stops.
            cache = Path(run_env["TMPDIR"]) / "cache"
            for var in (*CACHE_VARS, "UV_PYTHON_INSTALL_DIR"):
                if var not in config.env:
                    run_env[var] = str(cache)
        return Launch(
            name,
            argv=launch.argv,
            env=run_env,
            cwd=str(cwd),
            log_path=log_path(self.log_dir, name),
            log_max_bytes=s.mcp_log_max_bytes,
            cleanup=launch.cleanup,
            network=None if sandbox.mechanism is Mechanism.OFF else network,
            cache_dir=str(cache) if cache is not None else None,
        )


CACHE_VARS = ("npm_config_cache", "UV_CACHE_DIR", "XDG_CACHE_HOME", "PIP_CACHE_DIR")
"""Where npm, uv, pip and most others keep their downloads: the server's cache_dir."""


def _program(name: str, command: str, path: str | None, cwd: Path) -> str:
    """The program's path, or a ServerFailed naming it (before any sandbox hides why)."""
    from durable_agent.mcp.client import ServerFailed

    table = f"[mcp_servers.{name}]"
    if "/" not in command:
        found = shutil.which(command, path=path)
        if found is None:
            raise ServerFailed(
                f"MCP server {name!r}: its program {command!r} is not on PATH; install it, "
                f"or give its full path as `command` in {table}"
            )
        return found
    where = Path(command).expanduser()
    where = where if where.is_absolute() else cwd / where
    if not where.exists():
        raise ServerFailed(
            f"MCP server {name!r}: its program {str(where)!r} does not exist; "
            f"fix `command` in {table}"
        )
    return str(where)


def package_roots(program: Path) -> list[Path]:
    """The folders a program needs whole: for `.../node_modules/.bin/X` (and the package
    file it links to) the folder holding node_modules (its dependencies are beside it), for
    a virtualenv's `bin/X` the virtualenv. Both as given and as resolved."""
    roots: list[Path] = []
    for path in (program, Path(os.path.realpath(program))):
        for folder in path.parents:
            if folder.name == "node_modules":
                roots.append(folder.parent)
                break
            if (folder / "pyvenv.cfg").exists():
                roots.append(folder)
                break
    return [r for r in dict.fromkeys(roots) if str(r) not in ("/", "/usr", "/usr/local")]


def _cache_dir(name: str, config: McpServerConfig, env: Mapping[str, str]) -> Path:
    if config.cache_dir:
        where = Path(config.cache_dir).expanduser()
    else:
        # Beside the servers' logs; the sandbox hides the rest of that folder (the store).
        home = Path(env.get("HOME") or Path.home())
        base = Path(env.get("XDG_DATA_HOME") or home / ".local" / "share")
        where = base / "durable-agent" / "mcp-cache" / name
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"MCP server {name!r}: cannot make its cache_dir {where}: {exc}"
        ) from None
    return where.resolve()


def _from_record(name: str, recorded: dict[str, Any]) -> McpServerConfig:
    from durable_agent.config.mcp_servers import McpServerConfig

    # A server the run recorded that its settings no longer name: started from the record
    # (command and args; its env stays in the config), or failing as an observation.
    if recorded.get("url"):
        return McpServerConfig.model_validate({"url": recorded["url"]})
    return McpServerConfig.model_validate(
        {"command": recorded.get("command") or "false", "args": list(recorded.get("args") or [])}
    )


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:120]
