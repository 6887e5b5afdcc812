"""`durable-agent config`: the effective settings and where each value came from.

Layers, lowest first: the defaults, the user config file, the project's
`.durable-agent/config.toml`, the environment (`DURABLE_AGENT_<SETTING>`), the flags.
"""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from typing import Any

from durable_agent.cli import streams


def effective(flags: dict[str, Any], env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each setting: its value as a run would record it (no secret) and its source."""
    from durable_agent.cli.commands import _task_folder
    from durable_agent.config.layers import DEFAULT
    from durable_agent.config.settings import Settings, load_settings, mask_url_password

    sources: dict[str, str] = {}
    settings = load_settings(flags, env, sources=sources)
    if settings.memory_dir is None:  # as `start` sets it (docs/memory.md)
        _task_folder(settings)
        if settings.memory_dir is not None:
            sources["memory_dir"] = "the current directory"
    # As a run records them (redacted_dict): an MCP server's token and a password in its URL
    # are masked too, not only the key (this output is pasted into bug reports).
    values = settings.redacted_dict()
    out: dict[str, dict[str, Any]] = {}
    for name in Settings.model_fields:
        value = values.get(name)
        if name == "api_key":
            value = None if settings.api_key is None else "***"  # never shown
        elif name == "db":
            value = None if settings.db is None else mask_url_password(settings.db)
        out[name] = {"value": value, "source": sources.get(name, DEFAULT)}
    return out


def cmd_config(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.config.layers import default_config_path, project_config_path

    flags = {
        "workspace": args.workspace,
        "model": args.model,
        "db": args.db,
        "shell": args.shell,
    }
    rows = effective(flags, env)
    user = default_config_path(env)
    project = project_config_path(rows["workspace"]["value"])
    out = streams.forgiving(sys.stdout)
    if args.json:
        doc = {
            "settings": rows,
            "user_config": None if user is None else str(user),
            "project_config": None if project is None else str(project),
        }
        print(json.dumps(doc, indent=2), file=out)
        return 0
    print(f"user config:    {user or '(none)'}", file=out)
    print(f"project config: {project or '(none)'}", file=out)
    width = max(len(n) for n in rows)
    for name, row in rows.items():
        value = json.dumps(row["value"], ensure_ascii=False)
        if len(value) > 60:
            value = value[:57] + "..."
        print(streams.visible(f"{name:<{width}}  {value:<40}  {row['source']}"), file=out)
    return 0
