#!/usr/bin/env python3
"""Write config/default.toml from the Settings model, so the documented defaults cannot drift.

Usage: scripts/gen_default_config.py [--check]   (--check: exit 1 if the file is out of date)
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
from pathlib import Path

from durable_agent.config import settings as settings_module
from durable_agent.config.settings import Settings

TARGET = Path(__file__).resolve().parent.parent / "config" / "default.toml"
SKIP = {"workspace", "api_key"}  # per run (a flag) and a secret (the environment)
EXAMPLES = {
    "model": '"gpt-4.1-mini"',
    "base_url": '"http://localhost:11434/v1"',
    "db": '"sqlite:////path/to/durable-agent.db"',
    "max_tool_calls": "200",
    "max_tokens": "2000000",
    "max_seconds": "3600",
    "verify": '"python -m pytest -q"',
    "temperature": "0.2",
    "max_cost": "5.0",
    "max_running_runs": "8",
}
TABLE_EXAMPLES = {
    "otel": ["# [otel]", "# enabled = false", "# capture_content = false"],
    "prices": ['# [prices."gpt-4.1-mini"]', "# input_per_mtok = 0.40", "# output_per_mtok = 1.60"],
    "models": ['# [models."gpt-4.1-mini"]', "# context_window = 1047576"],
    "mcp_servers": [
        "# [mcp_servers.time]",
        '# command = "mcp-server-time"',
        "# args = []",
        '# env = { TZ = "UTC" }',
        '# # url = "http://127.0.0.1:8000/mcp"  (instead of command)',
        "# [mcp_servers.time.tools.get_current_time]",
        '# effect = "read"',
    ],
}


def field_docs() -> dict[str, str]:
    """The docstring under each field of `Settings`, as the source spells it."""
    tree = ast.parse(inspect.getsource(settings_module))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings"]
    docs: dict[str, str] = {}
    for field, after in zip(cls.body, cls.body[1:], strict=False):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[field.target.id] = inspect.cleandoc(after.value.value)
    return docs


def render() -> str:
    out = [
        "# durable-agent settings: every setting, its default and what it does.",
        "# Generated from durable_agent/config/settings.py by scripts/gen_default_config.py.",
        "# Copy to ~/.config/durable-agent/config.toml, or point DURABLE_AGENT_CONFIG at a file.",
        "# Precedence: defaults < config file < environment < command-line flags.",
        "# Settings that are unset by default are shown commented out.",
        "",
    ]
    tables: list[str] = []
    docs = field_docs()
    for name, field in Settings.model_fields.items():
        if name in SKIP:
            continue
        doc = [f"# {line}".rstrip() for line in docs.get(name, "").splitlines()]
        default = field.get_default(call_default_factory=True)
        if hasattr(default, "model_dump"):  # a settings table ([otel])
            default = default.model_dump()
        if isinstance(default, dict):  # TOML tables must follow the plain keys
            tables += [*doc, *TABLE_EXAMPLES[name], ""]
            continue
        out += doc
        out.append(
            f"# {name} = {EXAMPLES.get(name, '...')}"
            if default is None
            else f"{name} = {json.dumps(default)}"
        )
        out.append("")
    return "\n".join(out + tables).rstrip() + "\n"


def write_or_check(target: Path, text: str, script: str) -> int:
    """Write `text` to `target`; with --check, exit 1 instead when they differ."""
    if "--check" in sys.argv:
        if not target.exists() or target.read_text() != text:
            print(f"{target} is out of date: run scripts/{script}", file=sys.stderr)
            return 1
        return 0
    target.write_text(text)
    return 0


def main() -> int:
    return write_or_check(TARGET, render(), "gen_default_config.py")


if __name__ == "__main__":
    raise SystemExit(main())
