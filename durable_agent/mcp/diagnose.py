"""Why an MCP server did not start, in one line that says how to fix it.

The usual launch lines (`npx -y PACKAGE`, `uvx PACKAGE`) download the server first, into a
cache under the home folder: under the sandbox the network is off unless asked for, and
the home folder is read-only. Their stderr says which (EAI_AGAIN, EROFS ...); a launch that
only times out with the network off is most likely still retrying its download.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from durable_agent.config.mcp_servers import McpServerConfig
    from durable_agent.mcp.client import Launch

_NETWORK = re.compile(
    r"ENOTFOUND|EAI_AGAIN|ENETUNREACH|ECONNREFUSED|getaddrinfo|name resolution|"
    r"Network is unreachable|dns error|failed to lookup address|Could not resolve host|"
    r"network request to .* failed|Failed to fetch|ConnectError",
    re.IGNORECASE,
)
_READ_ONLY = re.compile(
    r"EROFS|EACCES|Read-only file system|Permission denied|os error 30|Errno 30|Errno 13",
    re.IGNORECASE,
)
_QUOTED_PATH = re.compile(r"""['"`](/[^'"`\s]*)['"`]|\bpath (/\S+)""")
_MISSING = re.compile(r"execvp .*: No such file|Exec format error")
"""bubblewrap could not run the program (it is not visible inside, or not a program)."""
_INTERPRETER = re.compile(r"env: '?([^':|]+)'?: No such file")
"""The program's `#!/usr/bin/env NAME` line names what is not on PATH."""
DOWNLOADERS = {"npx", "uvx", "pipx", "bunx", "pnpx", "pnpm", "yarn", "uv", "bun", "deno"}
"""Launchers that fetch the server's package before it starts."""
TAIL_CHARS = 240


def explain(name: str, config: McpServerConfig, launch: Launch, message: str) -> str:
    """`message` (the start failure, with its stderr tail) led by the likely cause and fix."""
    table = f"[mcp_servers.{name}]"
    head, _, tail = message.partition("; its stderr ends with: ")
    program = os.path.basename(config.command or "")
    contained = launch.network is not None
    hint = ""
    if (
        contained
        and not launch.network
        and (_NETWORK.search(tail) or ("did not start within" in head and program in DOWNLOADERS))
    ):
        what = "it tried to reach the network" if tail else f"`{program}` downloads its package"
        hint = (
            f"the network is off in the sandbox and {what}: set `network = true` in {table} "
            "(or pass --network on)"
        )
    elif contained and (denied := _READ_ONLY.search(tail)):
        path = _denied_path(tail, denied.start())
        where = f"to write {path}, which" if path else "to write a path that"
        hint = (
            f"it tried {where} is read-only in the sandbox: point it at its writable cache_dir "
            f"({launch.cache_dir}) with `env` in {table}, or set `cache_dir`"
        )
    elif missing := _INTERPRETER.search(tail):
        hint = (
            f"its interpreter {missing.group(1)!r} (the #! line of {config.command!r}) is not "
            f"on PATH; install it, or give its full path in `command` and `args` in {table}"
        )
    elif _MISSING.search(tail):
        hint = (
            f"its program {config.command!r} cannot be run (no such file, or its interpreter "
            f"is missing); install it or give its full path as `command` in {table}"
        )
    if not hint:
        return message
    short = tail if len(tail) <= TAIL_CHARS else "..." + tail[-TAIL_CHARS:]
    log = f" (log: {launch.log_path})" if launch.log_path else ""
    reason = head.partition("failed to start: ")[2] or head
    said = f"; its stderr ends with: {short}" if short else ""
    return f"MCP server {name!r} failed to start: {hint} [{reason}]{said}{log}"


def _denied_path(tail: str, at: int) -> str | None:
    """The path on the failing line: after the error (npm's "EROFS: ..., mkdir '/x'",
    Python's "Read-only file system: '/x'"), else just before it (uv's "`/x`: Read-only")."""
    start = tail.rfind(" | ", 0, at) + 1
    end = tail.find(" | ", at)
    line = tail[start : end if end >= 0 else len(tail)]
    after = [next(g for g in m.groups() if g) for m in _QUOTED_PATH.finditer(line, at - start)]
    before = [next(g for g in m.groups() if g) for m in _QUOTED_PATH.finditer(line[: at - start])]
    return (after or before[-1:] or [None])[0]
