"""Text from a model, a command or a file, made safe to print on a terminal.

A model (or a command's output, or a file's name) controls what the timeline, `show`,
`approve` and the errors print. A carriage return plus `ESC[2K` erased the real command
from a `needs approval` line and printed a harmless one in its place; `ESC[8m` hid the
rest; OSC 52 writes the clipboard; a right-to-left override reorders what is read. So
every control character but tab and newline is printed as its escape (`\\x1b`, as NUL
already is in the store), and so are the bidirectional overrides and isolates.
"""

from __future__ import annotations

import json
import re
from typing import Any

_HIDDEN = [
    *range(0x00, 0x09),
    *range(0x0B, 0x20),
    *range(0x7F, 0xA0),
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_ESCAPES = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _HIDDEN}


def visible(text: str) -> str:
    """`text` with every character that could move the cursor, erase, recolour, hide or
    reorder what a terminal shows written as its escape; the rest as it is."""
    return text.translate(_ESCAPES)


# -- what an approval asks (the blocked message, `approve`, `show`, the web view: all of
# them through presentation.py, but for the loop's message, which is below that layer) ---
_BARE = re.compile(r"[^\s\"'=\\`]+")


def tool_label(tool_name: str | None) -> str:
    """`run_command`; an MCP tool (`NAME__TOOL`, mcp/tools.py) as `TOOL (MCP server NAME)`."""
    name = tool_name or "?"
    server, sep, tool = name.partition("__")
    return f"{tool} (MCP server {server})" if sep and server and tool else name


def _value(value: Any) -> str:
    if isinstance(value, str) and _BARE.fullmatch(value):
        return value
    return json.dumps(value, ensure_ascii=False)  # quoted: spaces, newlines, `=` stay readable


def call_arguments(command: str | None, width: int = 200) -> str:
    """An approval's arguments readably: a command as the command (in backticks); an object
    of arguments (a tool without a `command`, e.g. an MCP tool) as `key=value` pairs. Every
    control character is escaped (visible.py) and a long text is cut with `…`."""
    if not command:
        return ""
    try:
        parsed = json.loads(command)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and not (
        set(parsed) == {"command"} and isinstance(parsed["command"], str)
    ):
        text = " ".join(f"{k}={_value(v)}" for k, v in parsed.items()) or "(no arguments)"
    else:
        text = f"`{parsed['command'] if isinstance(parsed, dict) else command}`"
    text = visible(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def approval_subject(tool_name: str | None, command: str | None, width: int = 200) -> str:
    """What an approval asks, naming the tool: `run_command `make test``,
    `exec (MCP server box) duration=8 steps=4`, `write_file`."""
    args = call_arguments(command, width)
    return visible(tool_label(tool_name)) + (f" {args}" if args else "")
