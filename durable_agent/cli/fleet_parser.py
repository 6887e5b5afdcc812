"""The fleet commands' arguments (docs/fleets.md): `queue`, `batch`, `schedule`, and the
queue flags of `start`. Kept out of parser.py so that file gains two lines only."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_queue_flags(p: argparse.ArgumentParser) -> None:
    """`start`'s queue controls."""
    p.add_argument(
        "--priority",
        type=int,
        metavar="N",
        help="workers claim higher priorities first (default 0; FIFO within one)",
    )
    p.add_argument(
        "--queue-key",
        metavar="KEY",
        help="concurrency key: at most `queue limit KEY N` runs of KEY at once (default 1)",
    )


def add_fleet_commands(sub: Any, command: Callable[[str, str], Any], add_db: Any) -> None:
    p = sub.add_parser(
        "queue",
        help="what waits for a worker, what runs, and why a run waits",
        description="The queue as workers see it: running runs, then waiting ones in the "
        "order a claim takes them (orphans first, then priority, then age), each with why "
        "it waits. `queue limit KEY N` sets how many runs of a queue_key run at once.",
    )
    p.add_argument("action", nargs="?", choices=["show", "limit"], default="show")
    p.add_argument("key", nargs="?", metavar="KEY", help="with `limit`: the queue_key")
    p.add_argument("limit", nargs="?", type=int, metavar="N", help="with `limit`: runs at once")
    add_db(p)
    p.add_argument("--json", action="store_true", help="JSON array on stdout")
    p.set_defaults(func=command("cmd_queue", "queue_command"))

    p = sub.add_parser(
        "batch",
        help="run many tasks over many repositories: submit, show, export, resume, cancel",
        description="submit TASKS.jsonl: one task a line ({id, task, repo, ref, verify, model, "
        "budgets, priority, metadata, queue_key}); each task's run makes its own workspace "
        "under --workdir (a git worktree of a local repo, or a clone of a URL, at ref) as "
        "its first durable step, and is queued for workers (or run here with --run). "
        "Submitting again adds only new task ids. show ID: a results table with totals. "
        "export ID --preds FILE: SWE-bench predictions. resume ID / cancel ID.",
    )
    p.add_argument("action", choices=["submit", "show", "export", "resume", "cancel"])
    p.add_argument("target", nargs="?", metavar="TASKS.jsonl|ID")
    add_db(p)
    p.add_argument("--name", help="submit: the batch's name (default: the file's stem); dedup key")
    p.add_argument("--workdir", metavar="DIR", help="submit: where each task's workspace is made")
    p.add_argument(
        "--max-parallel", type=int, metavar="N", help="submit: runs of the batch at once"
    )
    p.add_argument("--model", help="submit: model of tasks that name none")
    p.add_argument("--base-url", metavar="URL", help="submit: OpenAI-compatible endpoint")
    p.add_argument("--shell", choices=["allow", "ask", "deny"], help="submit: shell policy")
    p.add_argument(
        "--sandbox", choices=["workspace-write", "read-only", "off"], help="submit: containment"
    )
    p.add_argument("--run", action="store_true", help="submit/resume: run the batch here now")
    p.add_argument(
        "--concurrency", type=int, default=4, metavar="N", help="with --run: runs at once (4)"
    )
    p.add_argument("--verbose", action="store_true", help="with --run: one line per run event")
    p.add_argument("--preds", metavar="FILE", help="export: the predictions file (JSONL)")
    p.add_argument("--all", action="store_true", help="export: tasks not completed too")
    p.add_argument("--json", action="store_true", help="show: one JSON object")
    p.set_defaults(func=command("cmd_batch", "batch_commands"))

    p = sub.add_parser(
        "schedule",
        help="start a task on a cron schedule: add, list, pause, resume, remove",
        description='add NAME --cron "0 3 * * *" TASK [start flags]: store a schedule; the '
        "workers start one run a tick (exactly one over all workers), in --tz's time. "
        "Ticks missed while no worker ran start one run (--catch-up one) or none "
        "(--catch-up none). Needs `pip install 'durable-agent[schedule]'` (croniter). "
        "`schedule add --help` lists add's flags.",
    )
    p.add_argument("action", choices=["add", "list", "pause", "resume", "remove"])
    # NAME, TASK and the flags in any order (argparse cannot take a positional after
    # options): schedule_commands parses them with parse_intermixed_args.
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="NAME [TASK] [flags]")
    _schedule_flags(p)  # for --help only: REMAINDER takes them, schedule_arguments parses them
    p.set_defaults(func=command("cmd_schedule", "schedule_commands"))


def schedule_arguments(action: str) -> argparse.ArgumentParser:
    """The arguments after `schedule ACTION`."""
    p = argparse.ArgumentParser(prog=f"durable-agent schedule {action}")
    p.add_argument("name", nargs="?", metavar="NAME")
    p.add_argument("task", nargs="?", metavar="TASK", help="add: what each run is asked to do")
    _schedule_flags(p)
    return p


def _schedule_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL", help="SQLAlchemy URL of the store")
    p.add_argument("--cron", metavar="EXPR", help='add: five cron fields, e.g. "0 3 * * *"')
    p.add_argument("--tz", default="UTC", help="add: the cron's time zone (IANA; default UTC)")
    p.add_argument(
        "--catch-up",
        choices=["none", "one"],
        default="one",
        dest="catch_up",
        help="add: ticks missed while no worker ran start one run (one) or none (none)",
    )
    p.add_argument("--workspace", metavar="DIR", help="add: where its runs work")
    p.add_argument("--model", help="add: model of its runs")
    p.add_argument("--base-url", metavar="URL")
    p.add_argument("--verify", metavar="CMD")
    p.add_argument("--shell", choices=["allow", "ask", "deny"])
    p.add_argument("--sandbox", choices=["workspace-write", "read-only", "off"])
    p.add_argument("--max-steps", type=int, metavar="N")
    p.add_argument("--max-tokens", type=int, metavar="N")
    p.add_argument("--max-cost", type=float, metavar="AMOUNT")
    add_queue_flags(p)
    p.add_argument("--json", action="store_true", help="list: a JSON array")
