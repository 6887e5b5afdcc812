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
