"""Schedules (docs/fleets.md): a task started on a cron schedule, stored in the database and
started by whichever worker sees a tick due.

Each tick starts exactly one run over any number of workers: its run id is a function of
(schedule, tick), so a second worker handling the same tick finds the run there instead of
making another, and the schedule moves past the tick with a compare-and-set on its next
tick (store/fleet.tick_done). A worker killed between making the run and moving the
schedule leaves the tick due; the next worker finds the run and only moves the schedule.

Missed ticks (no worker ran when they came: older than GRACE_S when seen) start one run,
for the latest of them, with `--catch-up one` (the default), and none with `--catch-up
none`. Cron expressions are read in the schedule's time zone (zoneinfo), by croniter (the
`schedule` extra), imported only here.

The clock is injectable: `now` everywhere, and DURABLE_AGENT_SCHEDULE_CLOCK (a file holding
an ISO time, UTC) for worker processes under test.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from durable_agent.config.settings import load_settings, recorded_settings
from durable_agent.errors import ConfigError, DurableAgentError, UsageError
from durable_agent.store import fleet
from durable_agent.store.rows import utcnow
from durable_agent.store.runs import Store

GRACE_S = 60.0  # a due tick older than this when a worker sees it was missed
CLOCK_ENV = "DURABLE_AGENT_SCHEDULE_CLOCK"
CRASH_ENV = "DURABLE_AGENT_SCHEDULE_CRASH"  # tests: SIGKILL after making a tick's run
MAX_WALK = 100_000  # ticks walked over to find the latest due one (a minutely cron, 2 months)


def _croniter() -> Any:
    try:
        from croniter import croniter
    except ImportError:
        raise ConfigError(
            "schedules need croniter: pip install 'durable-agent[schedule]'"
        ) from None
    return croniter


def zone(tz: str) -> Any:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise UsageError(
            f"unknown time zone {tz!r} (an IANA name: UTC, Europe/Paris, ...)"
        ) from None


def check_cron(expr: str) -> None:
    if len(expr.split()) != 5:
        raise UsageError(
            f"--cron {expr!r}: five fields (minute hour day-of-month month day-of-week), "
            'e.g. "0 3 * * *"'
        )
    if not _croniter().is_valid(expr):
        raise UsageError(f"--cron {expr!r} is not a valid cron expression")
    try:  # valid, yet a date that never comes (the 30th of February): no tick at all
        next_tick(expr, "UTC", utcnow())
    except ValueError as exc:  # (croniter's CroniterBadDateError)
        raise UsageError(f"--cron {expr!r} never fires: {exc}") from None


def next_tick(expr: str, tz: str, after: datetime) -> datetime:
    """The first tick of `expr` in zone `tz` strictly after `after` (naive UTC, as stored).

    When the clocks go back, a wall time comes twice: a schedule of fixed hours ("30 2 * *
    *") fires at its first coming only, as cron does; one of every hour ("30 * * * *")
    fires at both, an hour apart."""
    where = zone(tz)
    fixed_hours = expr.split()[1] != "*"
    while True:
        local = after.replace(tzinfo=UTC).astimezone(where)
        found: datetime = _croniter()(expr, local).get_next(datetime)
        tick = found.astimezone(UTC).replace(tzinfo=None)
        if not (fixed_hours and _second_coming(found, where)):
            return tick
        after = tick


def _second_coming(moment: datetime, where: Any) -> bool:
    """`moment`'s wall time in zone `where` came once already, an offset earlier (the hour
    the clocks went back repeats)."""
    wall = moment.astimezone(where).replace(tzinfo=None)
    first, second = wall.replace(tzinfo=where, fold=0), wall.replace(tzinfo=where, fold=1)
    return first.utcoffset() != second.utcoffset() and moment.astimezone(UTC) == second.astimezone(
        UTC
    )


def run_id_for(name: str, tick: datetime) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]", "-", name)[:24].strip("-.") or "s"
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"sched-{slug}-{digest}-{tick:%Y%m%dT%H%M%S}"


def clock(env: Mapping[str, str]) -> datetime:
    """Now (naive UTC), or the time in the file DURABLE_AGENT_SCHEDULE_CLOCK names."""
    path = env.get(CLOCK_ENV)
    if not path:
        return utcnow()
    with open(path) as f:
        return datetime.fromisoformat(f.read().strip()).replace(tzinfo=None)


def fire_due(
    store: Store,
    env: Mapping[str, str],
    db: str,
    now: datetime,
    note: Callable[[str], None] = lambda _line: None,
) -> list[str]:
    """Start the run of every schedule whose tick has come; returns the runs this call made
    and recorded (another worker may have made some of the others)."""
    started = []
    for s in fleet.list_schedules(store.engine, due_by=now):
        latest, walked = s.next_tick, 0
        while walked < MAX_WALK:
            following = next_tick(s.cron, s.tz, latest)
            if following > now:
                break
            latest, walked = following, walked + 1
        after = next_tick(s.cron, s.tz, now)
        missed = (now - latest).total_seconds() > GRACE_S
        if missed and s.catch_up == "none":
            if fleet.tick_done(store.engine, s.name, s.next_tick, None, None, after):
                note(f"schedule {s.name}: missed tick(s) up to {latest:%Y-%m-%d %H:%M} UTC skipped")
            continue
        run_id = run_id_for(s.name, latest)
        try:
            _make_run(store, env, db, s, run_id)
        except DurableAgentError as exc:  # cannot be built here: the tick stays due
            note(f"schedule {s.name}: cannot start its run: {exc}")
            continue
        if env.get(CRASH_ENV) == "after_run":
            os.kill(os.getpid(), signal.SIGKILL)
        if fleet.tick_done(store.engine, s.name, s.next_tick, latest, run_id, after):
            started.append(run_id)
            note(
                f"schedule {s.name}: tick {latest:%Y-%m-%d %H:%M} UTC started run {run_id}"
                + (" (catching up missed ticks)" if missed or walked else "")
            )
    return started


def _make_run(store: Store, env: Mapping[str, str], db: str, s: Any, run_id: str) -> None:
    from durable_agent.wiring import build_runner

    if store.run_exists(run_id):
        return  # made by a worker that died before it moved the schedule on
    stored: dict[str, Any] = s.settings
    settings = load_settings({"db": db}, env, base=recorded_settings(stored.get("run")))
    runner = build_runner(settings, env=env, store=store)
    queue = {
        "priority": stored.get("priority"),
        "queue_key": stored.get("queue_key") or f"schedule:{s.name}",
    }
    try:
        runner.create(s.task, run_id, queue=queue)
    except Exception:  # "already exists", or a key conflict: another worker made it just now
        if not store.run_exists(run_id):
            raise
