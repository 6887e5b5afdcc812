"""`durable-agent queue`: what the workers' queue holds and why a run waits;
`queue limit KEY N`: a concurrency key's limit (docs/fleets.md)."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from datetime import datetime

from durable_agent.errors import UsageError
from durable_agent.visible import visible


def cmd_queue(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.config.store import open_store
    from durable_agent.store import fleet

    if args.action == "limit":
        if args.key is None or args.limit is None:
            raise UsageError("usage: durable-agent queue limit KEY N")
        if args.limit < 1:
            raise UsageError("queue limit: N must be at least 1")
        store = open_store(args.db, env)
        fleet.set_key_limit(store.engine, args.key, args.limit)
        print(f"queue_key {args.key!r}: at most {args.limit} run(s) at once")
        return 0
    if args.key is not None:
        raise UsageError(f"queue: unexpected argument {args.key!r} (did you mean `queue limit`?)")
    store = open_store(args.db, env)
    max_running = _global_limit(env)
    rows = fleet.queue_overview(store.engine, max_running=max_running)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "run_id": r.id,
                        "status": r.status,
                        "priority": r.priority,
                        "queue_key": r.queue_key,
                        "batch": r.batch,
                        "created_at": r.created_at.isoformat(),
                        "owner": r.owner,
                        "why": r.why,
                    }
                    for r in rows
                ],
                ensure_ascii=False,
            )
        )
        return 0
    running = [r for r in rows if r.why == "running"]
    waiting = [r for r in rows if r.why != "running"]
    out = sys.stdout
    print(f"running: {len(running)} · waiting: {len(waiting)}", file=out)
    if running:
        print(f"{'RUN':<18} {'PRIO':>4}  {'KEY':<16} {'BATCH':<16} OWNER", file=out)
        for r in running:
            print(
                f"{r.id[:18]:<18} {r.priority:>4}  {_cut(r.queue_key):<16} {_cut(r.batch):<16} "
                f"{visible(r.owner or '')}",
                file=out,
            )
    if waiting:
        print(f"{'WAITING (claim order)':<18} {'PRIO':>4}  {'KEY':<16} {'BATCH':<16} WHY", file=out)
        for r in waiting:
            print(
                f"{r.id[:18]:<18} {r.priority:>4}  {_cut(r.queue_key):<16} {_cut(r.batch):<16} "
                f"{visible(r.why)} · queued {_age(r.created_at)}",
                file=out,
            )
    return 0


def _global_limit(env: dict[str, str]) -> int | None:
    from durable_agent.config.settings import load_settings

    try:
        return load_settings({}, env).max_running_runs
    except Exception:  # noqa: BLE001 - a view of the queue does not need the config to be valid
        return None


def _cut(text: str | None, width: int = 16) -> str:
    text = visible(text or "-")
    return text if len(text) <= width else text[: width - 1] + "…"


def _age(when: datetime) -> str:
    from durable_agent.store.rows import utcnow

    secs = max(0, int((utcnow() - when).total_seconds()))
    if secs < 120:
        return f"{secs}s ago"
    if secs < 7200:
        return f"{secs // 60}m ago"
    return f"{secs // 3600}h ago"
