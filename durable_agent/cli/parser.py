"""Command line. argparse and lazy imports keep `durable-agent --help` fast: sqlalchemy,
pydantic and openai load only when a command needs them.

Exit codes (SPEC §2): 0 completed · 1 failed · 2 usage/config · 3 budget_exceeded ·
4 cancelled · 5 blocked · 6 busy (another live process holds the run) · 7 store unavailable.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from durable_agent import __version__
from durable_agent.cli import (
    collector,
    fleet_parser,
    streams,  # tiny modules: keep --help fast
)
from durable_agent.cli.streams import Parser, Subcommands
from durable_agent.status import EXIT_BUSY, EXIT_STORE, EXIT_USAGE

DESCRIPTION = """\
A coding agent that cannot lose its work. Every step is checkpointed to a SQL database
(SQLite by default); a run killed at any instant continues with `durable-agent resume ID`.
"""

EPILOG = """\
exit codes: 0 completed, 1 failed, 2 usage or configuration error, 3 budget exceeded,
            4 cancelled, 5 blocked (needs `approve`), 6 run busy in another process,
            7 the store is unavailable (connection lost, disk full): resumable once it is back
environment: OPENAI_API_KEY, OPENAI_BASE_URL, OPENAI_API_VERSION (Azure), DURABLE_AGENT_<SETTING>
             for every setting (DURABLE_AGENT_MODEL, DURABLE_AGENT_DB, DURABLE_AGENT_SANDBOX,
             DURABLE_AGENT_MAX_STEPS, ...),
             DURABLE_AGENT_CONFIG (a TOML file with the same settings as the flags; default
             ~/.config/durable-agent/config.toml); a project's own: .durable-agent/config.toml
             in the workspace. `durable-agent config` shows what applies and where it came from
try it offline: durable-agent demo     check the command sandbox: durable-agent doctor
"""


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--db",
        metavar="URL",
        help="SQLAlchemy URL of the store (default: SQLite in the user data dir)",
    )


def _add_budgets(p: argparse.ArgumentParser, *, resume: bool = False, turn: bool = False) -> None:
    if turn:  # `continue`: the budgets count from the new turn's start
        g = p.add_argument_group(
            "budgets of the new turn (counted from the message, the run's totals keep counting; "
            "the run's recorded budgets apply unless a flag replaces one)"
        )
        g.add_argument("--max-steps", type=int, metavar="N", help="model calls allowed in the turn")
    elif resume:  # the run's recorded budgets apply; a flag replaces one (to raise it)
        g = p.add_argument_group(
            "budgets (the run's recorded budgets apply; a flag replaces one before "
            "continuing, which raises it, e.g. --max-steps 80 after max_steps stopped it)"
        )
        g.add_argument(
            "--max-steps",
            type=int,
            metavar="N",
            help="model calls allowed, in total over all sessions",
        )
    else:
        g = p.add_argument_group("budgets (checked before the action that would exceed them)")
        g.add_argument(
            "--max-steps", type=int, metavar="N", help="model calls allowed (default 50)"
        )
    g.add_argument("--max-tool-calls", type=int, metavar="N", help="tool calls allowed")
    g.add_argument("--max-tokens", type=int, metavar="N", help="prompt + completion tokens allowed")
    g.add_argument(
        "--max-seconds",
        type=float,
        metavar="S",
        help="active seconds allowed in the turn, over its resumes"
        if turn
        else "active seconds allowed, over all resumes",
    )
    g.add_argument(
        "--max-repeats",
        type=int,
        metavar="N",
        help="the same tool call allowed N times in a row" + ("" if resume else " (default 3)"),
    )
    g.add_argument(
        "--max-cost",
        type=float,
        metavar="AMOUNT",
        help="spend allowed, at the model's price from the config file's `prices`",
    )
    g.add_argument(
        "--max-context-tokens",
        type=int,
        metavar="N",
        help="tokens sent per request, below the model's window: compaction keeps under it",
    )


def _add_output(p: argparse.ArgumentParser) -> None:
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "--json", action="store_true", help="print only one JSON object with the result on stdout"
    )
    out.add_argument(
        "--jsonl",
        action="store_true",
        help="print the run's events live on stdout, one JSON object per line, as `export` "
        "prints them (the last one, run_finished, holds the answer)",
    )
    p.add_argument("--quiet", action="store_true", help="no step timeline on stderr")


def _default(text: str, resume: bool) -> str:
    """A default as `start` applies it; on `resume` the run's recorded value applies instead."""
    return "" if resume else text


def _add_model(p: argparse.ArgumentParser, *, resume: bool = False) -> None:
    p.add_argument(
        "-m",
        "--model",
        metavar="NAME",
        help="endpoint model name, `scripted:PATH` (JSON script of turns) or `demo`",
    )
    p.add_argument(
        "--base-url",
        metavar="URL",
        help="OpenAI-compatible endpoint, e.g. http://localhost:11434/v1",
    )
    p.add_argument(
        "--api-type",
        choices=["auto", "openai", "azure"],
        help="azure: Azure OpenAI (api-key header, deployment in the path, api_version); "
        f"auto{_default(' (default)', resume)}: azure for a "
        ".../openai/deployments/NAME?api-version=... URL",
    )
    p.add_argument(
        "--tool-protocol",
        choices=["native", "text"],
        help=f"native function calling{_default(' (default)', resume)}, or TOOL_CALL lines "
        "for models without it",
    )


def _add_containment(p: argparse.ArgumentParser, *, resume: bool = False) -> None:
    title = "containment (the sandbox is the boundary; the shell policy only decides who is asked)"
    if resume:
        title = title[:-1] + "; the run's recorded values apply unless a flag is given)"
    g = p.add_argument_group(title)
    _add_yes(g)
    g.add_argument(
        "--shell",
        choices=["allow", "ask", "deny"],
        help=f"who is asked: run all commands, ask a person for unlisted ones{_default(' (default)', resume)}, "
        "or no shell tool. Not a security boundary: approved commands still run "
        "in the sandbox",
    )
    g.add_argument(
        "--sandbox",
        choices=["workspace-write", "read-only", "off"],
        help="OS sandbox of every command (bubblewrap, else Landlock): workspace-write "
        f"{_default('(default) ', resume)}= only the workspace and a private /tmp writable, git config and "
        "hooks read-only, no other process visible; read-only = the workspace too; "
        "off = UNCONFINED, commands can change anything you can",
    )
    g.add_argument(
        "--network",
        choices=["on", "off"],
        help="network access of commands" + _default(" (default off)", resume),
    )


def _add_shared(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-shared-workspace",
        action="store_true",
        help="UNSAFE: run even while another live run uses the workspace (docs/sandbox.md)",
    )


def _add_mcp(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mcp",
        action="append",
        metavar="NAME=COMMAND",
        help="offer the tools of an MCP server as NAME__TOOL (stdio: a command with its "
        "arguments, or an http(s) URL); repeatable; needs durable-agent[mcp]",
    )


# -- project memory and the habits of agent CLIs (docs/memory.md, docs/configuration.md) --
def _add_yes(p: Any) -> None:
    p.add_argument(
        "-y",
        dest="shell",
        action="store_const",
        const="allow",
        help="the same as --shell allow: run every command without asking (still sandboxed)",
    )


def _add_memory(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-memory",
        dest="memory",
        action="store_false",
        default=None,
        help="read no AGENTS.md (memory_files) into the system context; recorded with the run",
    )


def _add_delegate(p: argparse.ArgumentParser) -> None:
    # Delegation (docs/delegation.md): its settings, max_depth and max_children, are in config.
    p.add_argument(
        "--delegate",
        action="store_true",
        default=None,
        help="offer the model the `delegate` tool: child runs for parts of the task",
    )


def _add_config_command(sub: Subcommands) -> None:
    p = sub.add_parser(
        "config",
        help="the effective settings and where each value came from",
        description="Every setting as a run started here would get it, and its source: "
        "default, the user config file, the project's .durable-agent/config.toml, an "
        "environment variable (DURABLE_AGENT_<SETTING>) or a flag.",
    )
    p.add_argument("-w", "--workspace", metavar="DIR", help="as for start")
    p.add_argument("-m", "--model", metavar="NAME", help="as for start")
    _add_yes(p)
    p.add_argument("--shell", choices=["allow", "ask", "deny"], help="as for start")
    _add_db(p)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(func=_command("cmd_config", "config_command"))


# -- `continue` and `--last` (cli/continue_command.py) ----------------------------------------
def _add_run_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", metavar="RUN_ID", nargs="?", help="a run id or a unique prefix")
    p.add_argument(
        "--last",
        action="store_true",
        help="instead of RUN_ID: the newest run started in this folder",
    )


def _add_continue(sub: Subcommands) -> None:
    p = sub.add_parser(
        "continue",
        help="send a follow-up to a run that has ended: a new turn of its history",
        description="Add MESSAGE to a completed, failed, budget_exceeded or cancelled run as a "
        "new turn of the same history, with a fresh budget window (budget flags apply to the "
        "turn; the run's totals keep counting), and execute it like `resume`. A crash, or the "
        "same `continue` again while its turn is unfinished, never adds the message twice. "
        "A running or blocked run is refused. MESSAGE `-` reads it from stdin.",
    )
    p.add_argument("run_id", metavar="RUN_ID", nargs="?", help="a run id or a unique prefix")
    p.add_argument("message", metavar="MESSAGE", nargs="?", help="what to do next; - for stdin")
    p.add_argument(
        "--last",
        action="store_true",
        help="instead of RUN_ID: the newest run started in this folder",
    )
    p.add_argument(
        "--fork",
        action="store_true",
        help="leave the run as it is: continue a copy of it (history and files as at its last "
        "step) in a folder of its own (--workspace, default: beside the run's, named after the copy)",
    )
    p.add_argument(
        "--detach", action="store_true", help="record the message, then queue the run for workers"
    )
    p.add_argument(
        "-w",
        "--workspace",
        metavar="DIR",
        help="with --fork: the copy's folder (empty or new); without: continue in DIR, as `resume`",
    )
    p.add_argument("--run-id", dest="new_run_id", metavar="ID", help="with --fork: the copy's id")
    _add_db(p)
    _add_budgets(p, resume=True, turn=True)
    _add_model(p, resume=True)
    _add_containment(p, resume=True)
    _add_shared(p)
    _add_output(p)
    p.set_defaults(func=_command("cmd_continue", "continue_command"))


# -- policy: `--rules FILE` and `policy check` (cli/policy_command.py, docs/policy.md) -------
def _add_rules(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rules",
        action="append",
        metavar="FILE",
        help="a TOML file of [[rules]] and [[hooks]], added to the config's (repeatable; "
        "docs/policy.md)",
    )


def _add_policy(sub: Any) -> None:
    p = sub.add_parser(
        "policy",
        help="the rules: explain the decision for a call",
        description="`policy check [--tool NAME] -- ARGS...`: which rules match the call, "
        "in which file, and why it is allowed, asked or denied. For run_command ARGS is the "
        "command; for other tools a JSON object, KEY=VALUE pairs, or a path.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    a = actions.add_parser(
        "check",
        help="explain the decision for a call: policy check [--tool NAME] -- ARGS...",
        description="Explain the decision for a call under the config's rules (and --rules).",
    )
    a.add_argument("--tool", default="run_command", help="the tool (default run_command)")
    a.add_argument(
        "--effect",
        choices=["read", "write", "exec"],
        help="the tool's effect class when no rule matches (default: the built-in tool's; "
        "exec for others)",
    )
    a.add_argument("--shell", choices=["allow", "ask", "deny"], help="as for start")
    _add_rules(a)
    a.add_argument("call", nargs=argparse.REMAINDER, metavar="-- ARGS...")
    a.set_defaults(func=_command("cmd_policy", "policy_command"))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, a command's name, that command's arguments alone (Subcommands)."""
    parser = Parser(
        prog="durable-agent",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"durable-agent {__version__}")
    sub = Subcommands(parser.add_subparsers(dest="command", metavar="COMMAND"), only)

    p = sub.add_parser(
        "start",
        help="create a run and execute it in the foreground",
        description="Create a run and execute it; the run id is printed first so it can be resumed.",
    )
    p.add_argument(
        "task", help="what the agent should do, in plain words (`-`: read it from stdin)"
    )
    _add_memory(p)
    _add_delegate(p)
    p.add_argument(
        "-w",
        "--workspace",
        metavar="DIR",
        help="directory the agent works in (default: current directory)",
    )
    _add_model(p)
    _add_db(p)
    _add_budgets(p)
    _add_containment(p)
    p.add_argument(
        "--verify", metavar="CMD", help="finish gate: accept a final answer only once CMD exits 0"
    )
    p.add_argument("--run-id", metavar="ID", help="choose the run id (letters, digits, . _ -)")
    p.add_argument(
        "--durability",
        choices=["full", "fast"],
        help="full (default) survives power loss; fast may lose the last step on an OS crash",
    )
    p.add_argument(
        "--detach",
        action="store_true",
        help="only enqueue the run (pending) for `durable-agent worker`",
    )
    _add_shared(p)
    _add_mcp(p)
    _add_output(p)
    fleet_parser.add_queue_flags(p)  # fleets: --priority, --queue-key (docs/fleets.md)

    _add_rules(p)
    p.set_defaults(func=_command("cmd_start"))
    p = sub.add_parser(
        "resume",
        help="continue a run from its last verified step",
        description="Continue a run that is not completed, under the settings and budgets "
        "recorded with it. A flag replaces a recorded value: a budget flag raises that budget.",
    )
    _add_run_id(p)
    _add_db(p)
    _add_budgets(p, resume=True)
    _add_model(p, resume=True)
    _add_containment(p, resume=True)
    p.add_argument(
        "--detach",
        action="store_true",
        help="do not run it here: queue it (pending) for `durable-agent worker`, e.g. after `approve`",
    )
    p.add_argument(
        "-w",
        "--workspace",
        metavar="DIR",
        help="continue in DIR (e.g. on another host): rebuilt from the last snapshot when missing or empty",
    )
    _add_shared(p)
    _add_output(p)

    p.set_defaults(func=_command("cmd_resume"))
    _add_continue(sub)
    p = sub.add_parser(
        "list",
        help="runs, newest first",
        description="Runs, newest first: id, status, model calls, tokens, age, task.",
    )
    _add_db(p)
    p.add_argument(
        "--status",
        help="only runs with this status (pending, running, completed, failed, "
        "budget_exceeded, cancelled, blocked, waiting)",
    )
    p.add_argument("--limit", type=int, default=50, help="at most this many runs (default 50)")
    p.add_argument("--json", action="store_true", help="JSON array on stdout")
    p.add_argument(
        "--tree",
        action="store_true",
        help="each run with the child runs it delegated to, indented, with status and cost",
    )

    p.set_defaults(func=_command("cmd_list", "read_commands"))
    p = sub.add_parser(
        "show",
        help="one run: header and step timeline",
        description="One run: its header, then every step with its state, duration, tokens, "
        "attempts and error, then its approvals. RUN_ID may be a unique prefix.",
    )
    _add_run_id(p)
    _add_db(p)
    p.add_argument("--json", action="store_true", help="the run and its steps as JSON")

    p.set_defaults(func=_command("cmd_show", "read_commands"))
    p = sub.add_parser(
        "cancel",
        help="request cancellation; a running loop stops at its next step",
        description="Request cancellation: the process executing the run stops it at its "
        "next step (status cancelled; a running command is killed). A run "
        "that is not executing is marked cancelled at once. `resume` "
        "continues it later.",
    )
    p.add_argument("run_id", metavar="RUN_ID")
    _add_db(p)

    p.set_defaults(func=_command("cmd_cancel"))
    p = sub.add_parser(
        "approve",
        help="answer the pending approval of a blocked run (then resume)",
        description="Answer the question a blocked run waits on (`show` prints it): a "
        "command outside the allowlist, a step a crash left uncertain, or a "
        "workspace that changed since the last snapshot. Then `resume` acts "
        "on the answer.",
    )
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument(
        "--deny",
        action="store_true",
        help="deny instead: the model is told the call was not run (workspace_drift: "
        "the files are put back to the last snapshot)",
    )
    p.add_argument(
        "--restore",
        action="store_true",
        help="a command cut off by a crash: put the workspace back as it was before the "
        "command started, then run it again",
    )
    p.add_argument("--by", metavar="NAME", help="who decides (default: the current user)")
    _add_db(p)

    p.set_defaults(func=_command("cmd_approve"))
    p = sub.add_parser(
        "compact",
        help="compact a stopped run's context by hand (then resume)",
        description="Elide older tool outputs and summarize older turns of a stopped run, as "
        "durable `compact` steps, so its next request is small; then `resume` it.",
    )
    p.add_argument("run_id", metavar="RUN_ID")
    _add_db(p)
    _add_model(p)
    p.add_argument(
        "--max-context-tokens", type=int, metavar="N", help="tokens per request to compact for"
    )
    p.set_defaults(func=_command("cmd_compact"))

    p = sub.add_parser(
        "diff",
        help="what a run (or one step) changed in the workspace, as a unified diff",
        description="The workspace changes recorded by the run's snapshots, command-made "
        "ones included: from the workspace as the run found it to its last "
        "snapshot, or those of one step (--step SEQ, a number as `show` prints).",
    )
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--step", type=int, metavar="SEQ", help="only this step's changes")
    p.add_argument(
        "--stat", action="store_true", help="one line per changed path instead of the diff"
    )
    p.add_argument("--json", action="store_true", help="the changed paths as one JSON object")
    _add_db(p)
    p.set_defaults(func=_command("cmd_diff"))

    p = sub.add_parser(
        "restore",
        help="put the workspace files as they were after a step into a directory",
        description="Only the files: DIR gets exactly the snapshot after step SEQ (ignored "
        "and excluded paths such as .git are left alone). Into a non-empty DIR "
        "only with --force, which snapshots DIR first and prints how to undo.",
    )
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--at", type=int, metavar="SEQ", help="the step number (as `show` prints it)")
    p.add_argument(
        "--tree", metavar="ID", help="a snapshot id instead of --at (e.g. from an undo line)"
    )
    p.add_argument("--to", metavar="DIR", required=True, help="the directory to write")
    p.add_argument(
        "--force", action="store_true", help="DIR may be non-empty (it is snapshotted first)"
    )
    _add_db(p)
    p.set_defaults(func=_command("cmd_restore"))

    p = sub.add_parser(
        "fork",
        help="a new run from step SEQ of another, its files restored into DIR",
        description="A new run whose history is RUN_ID's up to and including step SEQ "
        "(tool calls without results are closed as 'not run in this fork'), "
        "with DIR (empty or absent) restored to the snapshot after SEQ. "
        "Prints the new id; `resume NEW_ID` continues it.",
    )
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument(
        "--at", type=int, metavar="SEQ", required=True, help="the step number (as `show` prints it)"
    )
    p.add_argument(
        "-w",
        "--workspace",
        metavar="DIR",
        required=True,
        help="the fork's workspace (empty or absent)",
    )
    p.add_argument("--task", metavar="TEXT", help="a new instruction, added as a user message")
    p.add_argument("--run-id", metavar="ID", dest="new_run_id", help="choose the new run's id")
    p.add_argument("--json", action="store_true", help="print the new run as one JSON object")
    _add_db(p)
    p.set_defaults(func=_command("cmd_fork"))

    p = sub.add_parser(
        "export",
        help="the run as a JSONL transcript on stdout",
        description="The run as JSON lines, one event each, in order: run_started, "
        "model_completed, tool_started, tool_completed, approval_requested, "
        "run_resumed, run_finished (docs/schema.md describes them).",
    )
    p.add_argument("run_id", metavar="RUN_ID")
    _add_db(p)

    p.set_defaults(func=_command("cmd_export"))
    p = sub.add_parser(
        "demo",
        help="offline: run a bundled task, crash it on purpose, resume it",
        description="Offline, no API key: copies a tiny buggy project to a folder of its own, "
        "runs the bundled scripted task in a child process that is killed with "
        "SIGKILL mid-run, resumes it in another, and shows from the database that "
        "nothing ran twice. The workspace and the demo's own SQLite store are kept "
        "(XDG_DATA_HOME/durable-agent/demo) for the commands it prints; --clean removes them.",
    )
    p.add_argument(
        "--db",
        metavar="URL",
        help="record the demo run in this store (default: the demo's own SQLite file)",
    )
    p.add_argument(
        "--clean",
        action="store_true",
        help="remove the workspaces and the store the demos kept, and run nothing",
    )
    # What --keep asked for is what the demo always does now: accepted, not advertised.
    p.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)

    p.set_defaults(func=_command("cmd_demo"))
    p = sub.add_parser(
        "doctor",
        help="which sandbox contains commands here, with a 1-second self-check",
        description="Print the mechanism that contains commands (bubblewrap, Landlock or "
        "none) and check it: a write inside the workspace works, a write "
        "outside fails, the network is off, other processes are hidden. "
        "Exit 0 when the sandbox works.",
    )
    p.add_argument(
        "--sandbox",
        choices=["workspace-write", "read-only", "off"],
        help="the mode to check (default: the configured one)",
    )
    p.add_argument("--network", choices=["on", "off"], help="check with the network on or off")
    p.set_defaults(func=_command("cmd_doctor"))

    p = sub.add_parser(
        "tools",
        help="every tool a run would be offered: name, source, effect class",
        description="Every tool a run started now would be offered: built-in tools, "
        "plugins (entry points `durable_agent.tools`), the config's `tools`, "
        "and the tools of its MCP servers (which are started to list them).",
    )
    p.add_argument(
        "-w",
        "--workspace",
        metavar="DIR",
        help="directory the agent works in (default: current directory)",
    )
    _add_yes(p)
    p.add_argument(
        "--shell", choices=["allow", "ask", "deny"], help="as for start (deny: no run_command)"
    )
    _add_db(p)
    _add_mcp(p)
    p.add_argument("--json", action="store_true", help="JSON array on stdout")
    p.set_defaults(func=_command("cmd_tools"))

    p = sub.add_parser(
        "mcp",
        help="the MCP servers of the config file: add, list, remove",
        description="Edit the [mcp_servers] of the user's config file "
        "(DURABLE_AGENT_CONFIG, else ~/.config/durable-agent/config.toml). "
        "`add NAME -- COMMAND ARGS...` (or `-- URL`), `list`, `remove NAME`.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    a = actions.add_parser(
        "add",
        help="add a server: mcp add NAME -- COMMAND ARGS...",
        description="Append [mcp_servers.NAME] to the config file: the command and its "
        "arguments after `--`, or an http(s) URL.",
    )
    a.add_argument("name", metavar="NAME")
    a.add_argument(
        "--env", action="append", metavar="NAME=VALUE", help="a variable for it; repeatable"
    )
    a.add_argument("--network", action="store_true", help="it may use the network (network = true)")
    a.add_argument("--required", action="store_true", help="a run does not start without it")
    a.add_argument("launch", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS...")
    a.set_defaults(func=_command("cmd_mcp", "mcp_commands"))
    a = actions.add_parser(
        "list",
        help="every server, where it is defined, its state",
        description="Every MCP server of the config file and its mcp_config JSON: how it "
        "starts, whether it is enabled and required, and which file defines it.",
    )
    a.add_argument("--json", action="store_true", help="JSON array on stdout")
    a.set_defaults(func=_command("cmd_mcp", "mcp_commands"))
    a = actions.add_parser(
        "remove",
        help="remove a server: mcp remove NAME",
        description="Remove [mcp_servers.NAME] (and its tool overrides) from the config "
        "file, or the server from the mcp_config JSON.",
    )
    a.add_argument("name", metavar="NAME")
    a.set_defaults(func=_command("cmd_mcp", "mcp_commands"))

    p = sub.add_parser(
        "db",
        help="the database: upgrade, current revision, path",
        description="upgrade: apply the migrations up to the newest (also done on first "
        "use); current: print the database's revision; path: print the "
        "store's URL (for SQLite, the file follows sqlite:///).",
    )
    p.add_argument("action", choices=["upgrade", "current", "path"])
    _add_db(p)

    p.set_defaults(func=_command("cmd_db"))
    p = sub.add_parser(
        "worker",
        help="claim queued and orphaned runs from the database and execute them",
        description="Claim queued runs (`start --detach`, `resume --detach`) and runs whose "
        "owner died, and execute them until SIGTERM (or with --once until "
        "nothing is left). Any number of workers may share one PostgreSQL "
        "database; a run is never executed by two at once.",
    )
    _add_db(p)
    p.add_argument(
        "--concurrency", type=int, default=1, metavar="N", help="runs executed at once (default 1)"
    )
    p.add_argument(
        "--lease-seconds",
        type=float,
        metavar="S",
        help="lease length (default: the config's lease_seconds, 30)",
    )
    p.add_argument(
        "--poll",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between claims when idle (default 1)",
    )
    p.add_argument(
        "--max-running",
        type=int,
        metavar="N",
        dest="max_running_runs",
        help="global limit: claim nothing while N runs hold live leases (all workers)",
    )
    p.add_argument("--once", action="store_true", help="exit when nothing is left to claim")
    p.add_argument(
        "--workspace-root",
        metavar="DIR",
        help="run each run in DIR/RUN_ID, rebuilt from the run's last snapshot when missing "
        "(hosts without a shared file system)",
    )
    p.add_argument("--quiet", action="store_true", help="no step timeline on stderr")
    p.set_defaults(func=_command("cmd_worker"))

    _add_config_command(sub)

    p = sub.add_parser(
        "ui",
        help="a web view of the store: runs, timelines, approvals (extra `ui`)",
        description="Serve a web view of the store: the runs, a page per run with its "
        "timeline and steps, updated live, and approve / deny / cancel / "
        "resume buttons. Needs `pip install 'durable-agent[ui]'`.",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; any other needs --token)",
    )
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    _add_db(p)
    p.add_argument(
        "--token",
        metavar="TOKEN",
        help="every request must carry it (Authorization: Bearer, "
        "or open /?token=TOKEN once); default: $DURABLE_AGENT_UI_TOKEN",
    )
    p.add_argument(
        "--open", action="store_true", dest="open_browser", help="open the view in a browser"
    )
    p.add_argument(
        "--public-url",
        metavar="URL",
        help="the view's address as notifications' receivers reach it: `blocked` "
        "notifications then carry signed one-time approve/deny links to it",
    )
    p.set_defaults(func=_command("cmd_ui"))
    _add_policy(sub)

    # Versions (docs/versions.md): flags of resume, worker and list, added in one place.
    from durable_agent.cli.versions_command import add_version_flags

    add_version_flags(sub.sub.choices)

    # -- notifications (docs/observability.md) ----------------------------------------------
    p = sub.add_parser(
        "notify",
        help="notifications of [[notify]]: send a sample, deliver what is pending",
        description="test: queue a sample event to every [[notify]] entry of the config and "
        "deliver it (as a run's end would be: Idempotency-Key, signature); deliver: send "
        "every notification still pending in the store (a worker and every run do this too).",
    )
    p.add_argument("action", choices=["test", "deliver"])
    _add_db(p)
    p.set_defaults(func=_command("cmd_notify", "notify_commands"))
    fleet_parser.add_fleet_commands(sub, _command, _add_db)  # queue, batch, schedule
    return parser if sub.found else build_parser()  # `only` named no command: all, for the error


def _command(
    name: str, module: str = "commands"
) -> Callable[[argparse.Namespace, dict[str, str]], int]:
    """The handler of a subcommand, imported when it runs (commands.py pulls in the store;
    read_commands.py, for `list` and `show`, only what they use)."""

    def run(args: argparse.Namespace, env: dict[str, str]) -> int:
        import importlib

        return int(getattr(importlib.import_module(f"durable_agent.cli.{module}"), name)(args, env))

    return run


def main(argv: Sequence[str] | None = None) -> int:
    collector.pause()  # until a run's loop begins (collector.py)
    try:
        return _main(argv)
    finally:
        collector.restore()
        # The process's own command (a caller from Python passes argv) that handled Ctrl-C
        # or ran commands (both load signal; --help and list load it not, nor start threads):
        # its exit code decided, a second press while it ends printed a traceback from
        # threading._shutdown or an atexit handler.
        if argv is None and (signal := sys.modules.get("signal")) is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if argv is None:
            collector.process_ends()


def _main(argv: Sequence[str] | None) -> int:
    streams.open_missing()
    own = argv is None  # the process's own command (a caller from Python passes argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
    args = parser.parse_args(argv)
    streams.lenient()
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if any(
        os.environ.get(f"DURABLE_AGENT_{name}")
        for name in ("CRASH_AFTER", "STOP_AFTER", "FAULT_AT", "NOTIFY_CRASH")
    ):
        from durable_agent.store import (
            faults as fault_injection,
        )  # the crash and fault suites' real faults

        fault_injection.install(os.environ)
    from durable_agent.errors import DurableAgentError, LeaseLost, RunBusy, StoreUnavailable

    env = dict(os.environ)  # the command's, and what it starts gets: taken before the next line
    if own:  # no pydantic plugins: a package's broken entry_points.txt failed every command (tests/test_plugins.py)
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    try:
        return int(args.func(args, env))
    except StoreUnavailable as exc:
        _error(str(exc))
        return EXIT_STORE
    except RunBusy as exc:
        _error(str(exc))
        return EXIT_BUSY
    except LeaseLost as exc:
        _error(str(exc))
        return EXIT_BUSY
    except DurableAgentError as exc:
        _error(str(exc))
        return EXIT_USAGE if _is_usage(exc) else 1
    except KeyboardInterrupt:
        _error("interrupted")
        return 4
    except BrokenPipeError:
        return 0
    except OSError as exc:  # one line, never a traceback
        if exc.filename is None and streams.output_broken():  # > /dev/full, a terminal gone
            _error(f"cannot write the output: {exc.strerror or exc}")
            streams.silence_stdout()
        else:  # a file of the user's, a program to start: say which, and what went wrong
            names = " -> ".join(
                repr(n if isinstance(n, int) else os.fsdecode(n))
                for n in (exc.filename, exc.filename2)
                if n is not None
            )
            _error(f"{exc.strerror or exc}" + (f": {names}" if names else ""))
        return 1


def _is_usage(exc: Any) -> bool:
    from durable_agent.errors import UsageError

    return isinstance(exc, UsageError)


def _error(message: str) -> None:
    # (a stderr nobody reads must not turn exit 6 or 7 into 1; a message can quote a model)
    print(f"durable-agent: error: {streams.visible(message)}", file=streams.forgiving(sys.stderr))


if __name__ == "__main__":
    raise SystemExit(main())
