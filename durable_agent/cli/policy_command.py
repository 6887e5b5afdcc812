"""`durable-agent policy check [--tool NAME] -- ARGS…`: the policy's decision for a call,
explained: its simple commands, the rules that matched (and in which file), the default
that decided what no rule matched, and why the decision is what it is."""

from __future__ import annotations

import json
import shlex
import sys
from argparse import Namespace
from typing import Any

from durable_agent.cli import streams
from durable_agent.errors import UsageError

COMMAND_TOOL = "run_command"


def call_arguments(tool: str, args: list[str]) -> Any:
    """ARGS as the call's arguments: for run_command the command line (one argument: as
    written; several: the words, quoted); else a JSON object, `KEY=VALUE` pairs, or a path."""
    if tool == COMMAND_TOOL:
        return {"command": args[0] if len(args) == 1 else shlex.join(args)}
    if len(args) == 1 and args[0].lstrip().startswith("{"):
        try:
            value = json.loads(args[0])
        except ValueError as exc:
            raise UsageError(f"the arguments are not a JSON object: {exc}") from None
        if not isinstance(value, dict):
            raise UsageError("the arguments must be a JSON object")
        return value
    if len(args) == 1 and "=" not in args[0]:
        return {"path": args[0]}
    pairs: dict[str, Any] = {}
    for arg in args:
        key, eq, text = arg.partition("=")
        if not eq or not key:
            raise UsageError(f"not KEY=VALUE: {arg!r} (or give one JSON object, or one path)")
        try:
            pairs[key] = json.loads(text)
        except ValueError:
            pairs[key] = text
    return pairs


def effect_of(tool: str, given: str | None) -> bool:
    """Is the tool an exec tool: --effect, else the built-in tool's class, else exec (an
    MCP or plugin tool whose class is not known here: decided as the stricter)."""
    if given is not None:
        return given == "exec"
    from durable_agent.status import EffectClass
    from durable_agent.tools import build_tools

    builtin = build_tools("allow")
    return tool not in builtin or builtin[tool].effect is EffectClass.EXEC


def cmd_policy(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.config.policy import decide
    from durable_agent.config.settings import load_settings
    from durable_agent.loop.approvals import policy_input

    if args.call[:1] == ["--"]:
        args.call = args.call[1:]
    if not args.call:
        raise UsageError("give the call after `--`: policy check -- git push origin main")
    settings = load_settings({"shell": args.shell, "rules_files": args.rules or None}, env)
    arguments = call_arguments(args.tool, args.call)
    policy = policy_input(settings, exec_tool=effect_of(args.tool, args.effect))
    decision = decide(policy, args.tool, arguments)
    out = streams.forgiving(sys.stdout)
    shown = arguments["command"] if args.tool == COMMAND_TOOL else json.dumps(arguments)
    print(f"call: {args.tool} {shown}", file=out)
    print(decision.explain(), file=out)
    return 0
