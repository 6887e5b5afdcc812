"""`durable-agent schedule add|list|pause|resume|remove` (docs/fleets.md); the workers start
the runs (durable_agent/schedules.py)."""

from __future__ import annotations

import json
from argparse import Namespace
from typing import Any

from durable_agent.errors import UsageError
from durable_agent.visible import visible

NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"


def cmd_schedule(outer: Namespace, env: dict[str, str]) -> int:
    import re

    from durable_agent.cli.fleet_parser import schedule_arguments
    from durable_agent.config.store import open_store
    from durable_agent.store import fleet

    try:
        args = schedule_arguments(outer.action).parse_intermixed_args(outer.rest)
    except SystemExit as exc:  # --help (0) or a usage error, already printed (2)
        return int(exc.code or 0)
    args.action = outer.action

    if args.action != "list" and (args.name is None or not re.fullmatch(NAME, args.name)):
        raise UsageError(
            f"schedule {args.action}: NAME is 1 to 100 letters, digits, '.', '_' or '-'"
        )
    store = open_store(args.db, env)
    if args.action == "add":
        return _add(args, env, store)
    if args.action == "list":
        rows = fleet.list_schedules(store.engine)
        if args.json:
            print(json.dumps([_as_json(s) for s in rows], ensure_ascii=False))
            return 0
        if not rows:
            print("no schedules (durable-agent schedule add NAME --cron EXPR TASK)")
            return 0
        print(f"{'NAME':<20} {'CRON':<16} {'TZ':<16} {'STATE':<7} {'NEXT (UTC)':<17} LAST RUN")
        for s in rows:
            print(
                f"{visible(s.name)[:20]:<20} {s.cron:<16} {s.tz:<16} "
                f"{'paused' if s.paused else 'active':<7} {s.next_tick:%Y-%m-%d %H:%M}  "
                f"{s.last_run_id or '-'}"
            )
        return 0
    if args.action == "remove":
        if not fleet.remove_schedule(store.engine, args.name):
            raise UsageError(f"no schedule {args.name!r}")
        print(f"schedule {args.name} removed (its runs stay)")
        return 0
    # pause / resume
    found = {s.name: s for s in fleet.list_schedules(store.engine)}.get(args.name)
    if found is None:
        raise UsageError(f"no schedule {args.name!r}")
    if args.action == "pause":
        fleet.update_schedule(store.engine, args.name, paused=True)
        print(f"schedule {args.name} paused")
        return 0
    from durable_agent import schedules

    if not found.paused:  # its next tick stays: moved past now, a tick due would be skipped
        print(
            f"schedule {args.name} is not paused · next tick {found.next_tick:%Y-%m-%d %H:%M} UTC"
        )
        return 0
    # Resumed: the ticks that came while paused are not caught up; the next one runs.
    nxt = schedules.next_tick(found.cron, found.tz, schedules.clock(env))
    fleet.update_schedule(store.engine, args.name, paused=False, next_tick=nxt)
    print(f"schedule {args.name} resumed · next tick {nxt:%Y-%m-%d %H:%M} UTC")
    return 0


def _add(args: Namespace, env: dict[str, str], store: Any) -> int:
    from pathlib import Path

    from durable_agent import schedules
    from durable_agent.config.settings import load_settings
    from durable_agent.store import fleet
    from durable_agent.store.rows import utcnow

    if args.cron is None or not args.task or not args.task.strip():
        raise UsageError('usage: durable-agent schedule add NAME --cron "0 3 * * *" TASK')
    schedules.zone(args.tz)
    schedules.check_cron(args.cron)
    flags = {
        "workspace": Path(args.workspace).resolve() if args.workspace else None,
        "model": args.model,
        "base_url": args.base_url,
        "verify": args.verify,
        "shell": args.shell,
        "sandbox": args.sandbox,
        "max_steps": args.max_steps,
        "max_tokens": args.max_tokens,
        "max_cost": args.max_cost,
        "db": args.db,
    }
    settings = load_settings({k: v for k, v in flags.items() if v is not None}, env)
    if not settings.workspace.is_dir():
        raise UsageError(f"--workspace {settings.workspace} is not a directory")
    now = utcnow()
    record = fleet.ScheduleRecord(
        name=args.name,
        cron=args.cron,
        tz=args.tz,
        task=args.task,
        settings={
            "run": settings.redacted_dict(),
            "priority": args.priority,
            "queue_key": args.queue_key,
        },
        catch_up=args.catch_up,
        paused=False,
        next_tick=schedules.next_tick(args.cron, args.tz, schedules.clock(env)),
        last_tick=None,
        last_run_id=None,
        created_at=now,
    )
    if not fleet.add_schedule(store.engine, record):
        raise UsageError(f"a schedule {args.name!r} exists: `schedule remove {args.name}` first")
    print(
        f"schedule {args.name} · {args.cron} ({args.tz}) · next tick "
        f"{record.next_tick:%Y-%m-%d %H:%M} UTC · started by `durable-agent worker`"
    )
    return 0


def _as_json(s: Any) -> dict[str, Any]:
    return {
        "name": s.name,
        "cron": s.cron,
        "tz": s.tz,
        "task": s.task,
        "catch_up": s.catch_up,
        "paused": s.paused,
        "next_tick": s.next_tick.isoformat(),
        "last_tick": s.last_tick.isoformat() if s.last_tick else None,
        "last_run_id": s.last_run_id,
    }
