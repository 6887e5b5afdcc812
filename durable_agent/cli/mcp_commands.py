"""`durable-agent mcp add|list|remove`: the MCP servers of the user's config file.

The file is edited as text, never rewritten from a parse (there is no TOML writer in the
standard library, and a rewrite would lose the user's comments and order): `add` appends a
`[mcp_servers.NAME]` table, `remove` cuts that table and its sub-tables out. Every edit is
parsed again before it replaces the file; one that would not leave exactly the intended
servers is refused and the file left as it was.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import tomllib
from argparse import Namespace
from pathlib import Path
from typing import Any

from durable_agent.cli import streams
from durable_agent.errors import ConfigError


def config_file(env: dict[str, str]) -> Path:
    """The user's config file, existing or not (where `add` creates it)."""
    if env.get("DURABLE_AGENT_CONFIG"):
        return Path(env["DURABLE_AGENT_CONFIG"]).expanduser()
    base = Path(env.get("XDG_CONFIG_HOME") or Path(env.get("HOME") or Path.home()) / ".config")
    return base / "durable-agent" / "config.toml"


def cmd_mcp(args: Namespace, env: dict[str, str]) -> int:
    path = config_file(env)
    if args.action == "list":
        return _list(path, args.json)
    if args.action == "add":
        return _add(path, args)
    return _remove(path, args.name)


def _read(path: Path) -> tuple[str, dict[str, Any]]:
    if not path.exists():
        return "", {}
    from durable_agent.config.layers import read_config_file

    return path.read_text(encoding="utf-8"), read_config_file(path)


def _servers(data: dict[str, Any]) -> dict[str, Any]:
    servers = data.get("mcp_servers") or {}
    return servers if isinstance(servers, dict) else {}


def _list(path: Path, as_json: bool) -> int:
    from durable_agent.config.settings import json_servers

    _, data = _read(path)
    rows: list[dict[str, Any]] = []
    toml_names = set(_servers(data))
    for name, server in _servers(data).items():
        rows.append(_row(name, server, str(path)))
    if data.get("mcp_config"):
        given = str(data["mcp_config"])
        where = Path(given).expanduser()
        where = where if where.is_absolute() else path.parent / where
        for name, server in json_servers(given, path).items():
            if name not in toml_names:  # the TOML's server of the same name wins
                rows.append(_row(name, server, str(where)))
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no MCP servers in {path} (add one: durable-agent mcp add NAME -- COMMAND ARGS...)")
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        state = ("enabled" if r["enabled"] else "disabled") + (
            ", required" if r["required"] else ", optional"
        )
        print(
            streams.visible(
                f"{r['name']:<{width}}  {state:<19}  {r['launch']}  ({r['defined_in']})"
            )
        )
    return 0


def _row(name: str, server: Any, where: str) -> dict[str, Any]:
    server = server if isinstance(server, dict) else {}
    if server.get("url"):
        from durable_agent.config.settings import mask_url_password

        launch = mask_url_password(str(server["url"]))
    else:
        import shlex

        launch = shlex.join([str(server.get("command", "")), *map(str, server.get("args") or [])])
    enabled = server.get("enabled", not server.get("disabled", False))
    return {
        "name": name,
        "launch": launch,
        "enabled": bool(enabled),
        "required": bool(server.get("required", False)),
        "network": bool(server.get("network", False)),
        "defined_in": where,
    }


def _add(path: Path, args: Namespace) -> int:
    from durable_agent.config.mcp_servers import McpServerConfig, check_server_names

    name = args.name
    argv = [a for a in args.launch if a != "--"] if args.launch[:1] == ["--"] else args.launch
    if not argv:
        raise ConfigError("mcp add takes NAME -- COMMAND ARGS... (or NAME -- URL)")
    table: dict[str, Any] = (
        {"url": argv[0]}
        if argv[0].startswith(("http://", "https://")) and len(argv) == 1
        else {"command": argv[0], "args": argv[1:]}
    )
    env_pairs = {}
    for pair in args.env or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env takes NAME=VALUE, not {pair!r}")
        env_pairs[key] = value
    if env_pairs:
        table["env"] = env_pairs
    if args.network:
        table["network"] = True
    if args.required:
        table["required"] = True
    try:
        McpServerConfig.model_validate(table)
    except ValueError as exc:
        raise ConfigError(f"mcp add {name}: {exc}") from None
    check_server_names({name: McpServerConfig.model_validate(table)})
    text, data = _read(path)
    if name in _servers(data):
        raise ConfigError(
            f"{path} already has an MCP server {name!r}: `durable-agent mcp remove {name}` first"
        )
    lines = [f"[mcp_servers.{name}]"]
    for key, value in table.items():
        lines.append(f"{key} = {_toml(value)}")
    new = text + ("\n" if text and not text.endswith("\n") else "") + "\n" + "\n".join(lines) + "\n"
    _replace(
        path,
        new,
        lambda servers: servers.get(name) == table and set(servers) == {*_servers(data), name},
    )
    print(f"added MCP server {name!r} to {path}")
    return 0


def _toml(value: Any) -> str:
    """A TOML value: strings as JSON writes them are TOML basic strings (json.dumps with
    ensure_ascii escapes only what both read alike)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value).__name__)


_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]*?)\s*\]\]?\s*(#.*)?$")


def _header_path(line: str) -> list[str] | None:
    """The dotted key of a table header line, unquoted (None: not a header)."""
    found = _HEADER.match(line)
    if found is None:
        return None
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"|\'([^\']*)\'|([A-Za-z0-9_-]+)', found.group(1))
    return [a or b or c for a, b, c in parts]


def _remove(path: Path, name: str) -> int:
    text, data = _read(path)
    if name not in _servers(data):
        return _remove_from_json(path, data, name)
    kept: list[str] = []
    cutting = False
    for line in text.splitlines(keepends=True):
        header = _header_path(line)
        if header is not None:
            cutting = header[:2] == ["mcp_servers", name]
        if not cutting:
            kept.append(line)
    others = set(_servers(data)) - {name}
    _replace(path, "".join(kept), lambda servers: set(servers) == others)
    print(f"removed MCP server {name!r} from {path}")
    return 0


def _remove_from_json(path: Path, data: dict[str, Any], name: str) -> int:
    from durable_agent.config.settings import json_servers

    if data.get("mcp_config"):
        given = str(data["mcp_config"])
        where = Path(given).expanduser()
        where = where if where.is_absolute() else path.parent / where
        if name in json_servers(given, path):
            raw = json.loads(where.read_text(encoding="utf-8"))
            key = "mcpServers" if "mcpServers" in raw else "servers"
            del raw[key][name]
            _write(where, json.dumps(raw, indent=2) + "\n")
            print(f"removed MCP server {name!r} from {where}")
            return 0
    raise ConfigError(f"no MCP server {name!r} in {path} (see `durable-agent mcp list`)")


def _replace(path: Path, new: str, intended: Any) -> None:
    """Write `new` over `path` if it parses and `intended(its servers)` holds."""
    try:
        servers = _servers(tomllib.loads(new))
        ok = bool(intended(servers))
    except tomllib.TOMLDecodeError:
        ok = False
    if not ok:
        raise ConfigError(
            f"could not edit {path} safely (its mcp_servers are written in a way this command "
            "does not change); edit the file by hand"
        )
    _write(path, new)


def _write(path: Path, text: str) -> None:
    path = path.resolve()  # a config linked in from a dotfiles folder stays a link
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600  # it may hold the API key
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
