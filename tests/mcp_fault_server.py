"""A small MCP server of the tests' own, for faults (stdio; run as a script).

Every call appends a line `TOOL ARGS` to the file named by MCP_TEST_COUNTER (so a test can
count what really ran on the server), and `TOOL started` before it sleeps. Tools cover each
annotation combination, a slow tool, and a tool that kills its own server mid-call.
"""

from __future__ import annotations

import json
import os
import threading
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("faults")
COUNTER = os.environ.get("MCP_TEST_COUNTER", "")
# Tools that disappeared: named in the env, or in COUNTER.hide (read at start, so a test can
# hide a tool from a server that a resume starts with the run's recorded settings).
HIDDEN = set(os.environ.get("MCP_TEST_HIDE", "").split(","))
if COUNTER and os.path.exists(COUNTER + ".hide"):
    with open(COUNTER + ".hide", encoding="utf-8") as hidden:
        HIDDEN |= set(hidden.read().split())


def tool(**kwargs: object):  # type: ignore[no-untyped-def]
    """server.tool, except for the tools MCP_TEST_HIDE names (a tool that disappeared)."""

    def register(fn):  # type: ignore[no-untyped-def]
        return fn if fn.__name__ in HIDDEN else server.tool(**kwargs)(fn)  # type: ignore[arg-type]

    return register


def _log(line: str) -> None:
    if COUNTER:
        with open(COUNTER, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def _run(name: str, args: dict[str, object], sleep_s: float) -> str:
    _log(f"{name} started")
    time.sleep(sleep_s)
    _log(f"{name} {json.dumps(args, sort_keys=True)}")
    return f"{name} ok {json.dumps(args, sort_keys=True)}"


@tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(key: str, sleep_s: float = 0.0) -> str:
    """Read-only: look a key up."""
    return _run("lookup", {"key": key}, sleep_s)


@tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
def put(key: str, value: str, sleep_s: float = 0.0) -> str:
    """Idempotent, not destructive: set a key."""
    return _run("put", {"key": key, "value": value}, sleep_s)


@tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
def save(path: str, text: str) -> str:
    """Idempotent, not destructive: write a file in the server's folder (the workspace)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return _run("save", {"path": path}, 0.0)


@tool(annotations=ToolAnnotations(destructive_hint=True))
def launch(target: str, sleep_s: float = 0.0) -> str:
    """Destructive: launch something (not idempotent)."""
    return _run("launch", {"target": target}, sleep_s)


@tool(annotations=ToolAnnotations(destructive_hint=False))
def append(text: str) -> str:
    """Not destructive, not idempotent: append a line."""
    return _run("append", {"text": text}, 0.0)


@tool()
def plain(text: str) -> str:
    """No annotations at all (the protocol's defaults: may be destructive)."""
    return _run("plain", {"text": text}, 0.0)


@tool(annotations=ToolAnnotations(read_only_hint=True))
def slow(seconds: float) -> str:
    """Read-only and slow."""
    return _run("slow", {"seconds": seconds}, seconds)


@tool(annotations=ToolAnnotations(read_only_hint=True))
def crash() -> str:
    """Kills its own server in the middle of the call."""
    _log("crash started")
    os._exit(3)


@tool(annotations=ToolAnnotations(read_only_hint=True))
def fails() -> str:
    """Always reports an error (isError)."""
    raise ToolError("this tool always fails")


@tool(annotations=ToolAnnotations(read_only_hint=True), structured_output=True)
def stats() -> dict[str, int]:
    """Structured content."""
    return {"calls": 1, "answer": 42}


@tool(annotations=ToolAnnotations(read_only_hint=True), structured_output=True)
def bulky(size: int) -> dict[str, str]:
    """Structured content of `size` characters."""
    return {"blob": "x" * size}


@tool(annotations=ToolAnnotations(read_only_hint=True), structured_output=True)
def deep(depth: int) -> dict[str, object]:
    """Structured content nested `depth` lists deep."""
    value: object = []
    for _ in range(depth):
        value = [value]
    return {"deep": value}


@tool(annotations=ToolAnnotations(read_only_hint=True))
def envnames() -> str:
    """The names of the server's environment variables."""
    return " ".join(sorted(os.environ))


@tool(annotations=ToolAnnotations(read_only_hint=True))
def vanish() -> str:
    """Answers, then its server exits (it dies between calls), logging `vanished` first."""

    def exit_now() -> None:
        _log("vanished")
        os._exit(4)

    _log("vanish started")
    threading.Timer(0.2, exit_now).start()
    return "vanishing"


@tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
def touch(path: str) -> str:
    """Write a file (to see where the server may write)."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write("touched\n")
    except OSError as exc:
        return f"refused: {exc}"
    return f"wrote {path}"


@tool(annotations=ToolAnnotations(read_only_hint=True))
def noise(megabytes: int) -> str:
    """Write `megabytes` MB to stderr (into the harness's log of this server), then answer."""
    import sys

    line = b"noise " * 170 + b"\n"  # 1021 bytes
    for _ in range(megabytes * 1024):
        sys.stderr.buffer.write(line)
    sys.stderr.buffer.flush()
    return f"wrote {megabytes} MB to stderr"


# Two tools whose names are equal once made valid function names (`.` is not allowed).
server.tool(name="twin.a", annotations=ToolAnnotations(read_only_hint=True))(lambda: "twin.a ran")
server.tool(name="twin_a", annotations=ToolAnnotations(destructive_hint=True))(lambda: "twin_a ran")


if __name__ == "__main__":
    if os.environ.get("MCP_TEST_FAIL_START") or (COUNTER and os.path.exists(COUNTER + ".fail")):
        import sys

        print("cannot start: MCP_TEST_FAIL_START is set", file=sys.stderr)
        raise SystemExit(1)
    port = os.environ.get("MCP_TEST_HTTP_PORT")
    if port:  # streamable HTTP at http://127.0.0.1:PORT/mcp instead of stdio
        server.run("streamable-http", host="127.0.0.1", port=int(port))
    else:
        server.run()
