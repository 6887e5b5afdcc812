"""Schedules (docs/fleets.md): cron in an explicit time zone, stored in the database, each
tick started exactly once over any number of workers (run id = schedule + tick), missed
ticks caught up once or skipped, with an injectable clock (`now`, and a clock file for
worker processes)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import Result
from scale_helpers import Workers, pg_schema, wait_for

from durable_agent import schedules
from durable_agent.errors import UsageError
from durable_agent.store import fleet
from durable_agent.store.engine import open_store_engine
from durable_agent.store.runs import Store

T0 = datetime(2026, 3, 28, 23, 30)  # naive UTC, the night Paris moves to summer time


def test_next_tick_in_a_time_zone_across_dst() -> None:
    # 03:00 in Paris is 02:00 UTC in winter, 01:00 UTC from the 29th of March 2026
    assert schedules.next_tick("0 3 * * *", "Europe/Paris", T0) == datetime(2026, 3, 29, 1, 0)
    assert schedules.next_tick("0 3 * * *", "UTC", T0) == datetime(2026, 3, 29, 3, 0)
    assert schedules.next_tick("*/15 * * * *", "UTC", T0) == datetime(2026, 3, 28, 23, 45)

    # The 25th of October 2026, Paris: 03:00 CEST becomes 02:00 CET, 02:00-02:59 comes twice.
    # A fixed hour fires at the first coming only; an every-hour one at both.
    def ticks(expr: str, n: int) -> list[datetime]:
        out, t = [], datetime(2026, 10, 24, 22, 0)
        for _ in range(n):
            t = schedules.next_tick(expr, "Europe/Paris", t)
            out.append(t)
        return out

    assert ticks("30 2 * * *", 2) == [datetime(2026, 10, 25, 0, 30), datetime(2026, 10, 26, 1, 30)]
    assert ticks("15 1-3 * * *", 3) == [
        datetime(2026, 10, 24, 23, 15),  # 01:15 CEST
        datetime(2026, 10, 25, 0, 15),  # 02:15 CEST (not 02:15 CET again)
        datetime(2026, 10, 25, 2, 15),  # 03:15 CET
    ]
    assert ticks("30 * * * *", 5)[2:] == [datetime(2026, 10, 25, h, 30) for h in (0, 1, 2)]
    with pytest.raises(Exception, match="five fields"):
        schedules.check_cron("0 3 * *")
    with pytest.raises(Exception, match="not a valid cron"):
        schedules.check_cron("0 25 * * *")
    with pytest.raises(UsageError, match="never fires"):  # the 30th of February
        schedules.check_cron("0 0 30 2 *")
    with pytest.raises(Exception, match="unknown time zone"):
        schedules.zone("Mars/Olympus")


def _add(
    cli: Callable[..., Result], name: str, *extra: str, env: dict[str, str] | None = None
) -> None:
    res = cli(
        "schedule", "add", name, "--cron", "* * * * *", "say done",
        "--model", "{model}", "--shell", "deny", *extra, extra_env=env,
    )  # fmt: skip
    assert res.code == 0, res.stderr


@pytest.mark.slow  # over 2 s on 2 cores
def test_commands_and_missed_ticks(
    cli: Callable[..., Result],
    env: dict[str, str],
    tmp_path: Path,
    write_script: Callable[..., str],
) -> None:
    model = write_script([{"content": "done"}])
    clock = tmp_path / "clock"
    clock.write_text(T0.isoformat())
    cenv = {schedules.CLOCK_ENV: str(clock)}
    for name, catch in (("one", "one"), ("none", "none")):
        res = cli(
            "schedule", "add", name, "--cron", "*/5 * * * *", "say done", "--model", model,
            "--shell", "deny", "--tz", "Europe/Paris", "--catch-up", catch, extra_env=cenv,
        )  # fmt: skip
        assert res.code == 0, res.stderr
        assert "next tick 2026-03-28 23:35 UTC" in res.stdout
    assert cli("schedule", "add", "one", "--cron", "* * * * *", "x").code == 2
    bad = cli("schedule", "add", "x", "--cron", "61 * * * *", "t")
    assert bad.code == 2 and "not a valid cron" in bad.stderr and "Traceback" not in bad.stderr
    listed = cli("schedule", "list", "--json").json()
    assert [(s["name"], s["tz"], s["catch_up"]) for s in listed] == [
        ("none", "Europe/Paris", "none"),
        ("one", "Europe/Paris", "one"),
    ]
    # no worker for an hour: twelve ticks missed
    store = Store(open_store_engine(env["DURABLE_AGENT_DB"]))
    later = T0 + timedelta(hours=1, seconds=90)
    started = schedules.fire_due(store, env, env["DURABLE_AGENT_DB"], later)
    assert started == [schedules.run_id_for("one", datetime(2026, 3, 29, 0, 30))]
    assert fleet.schedule_runs(store.engine, "none") == []
    assert {s.name: s.next_tick for s in fleet.list_schedules(store.engine)} == {
        "none": datetime(2026, 3, 29, 0, 35),
        "one": datetime(2026, 3, 29, 0, 35),
    }
    # the same moment again (another worker): nothing more
    assert schedules.fire_due(store, env, env["DURABLE_AGENT_DB"], later) == []
    assert cli("schedule", "pause", "one").code == 0
    # nine minutes on: "none" has a tick on time (00:40), "one" is paused
    assert schedules.fire_due(
        store, env, env["DURABLE_AGENT_DB"], later + timedelta(minutes=9)
    ) == [schedules.run_id_for("none", datetime(2026, 3, 29, 0, 40))]
    # Resumed at 00:40:30 by the schedules' clock: the next tick is 00:45, not the wall's.
    clock.write_text((later + timedelta(minutes=9)).isoformat())
    resumed = cli("schedule", "resume", "one", extra_env=cenv)
    assert resumed.code == 0 and "next tick 2026-03-29 00:45 UTC" in resumed.stdout, resumed.stdout
    # "none" is not paused and its 00:45 tick is due: a resume says so and skips nothing.
    clock.write_text((later + timedelta(minutes=14)).isoformat())
    again = cli("schedule", "resume", "none", extra_env=cenv)
    assert again.code == 0 and "is not paused" in again.stdout, again.stdout
    assert schedules.fire_due(
        store, env, env["DURABLE_AGENT_DB"], later + timedelta(minutes=14)
    ) == [schedules.run_id_for(n, datetime(2026, 3, 29, 0, 45)) for n in ("none", "one")]
    assert cli("schedule", "remove", "none").code == 0
    assert cli("schedule", "remove", "none").code == 2
    assert [s["name"] for s in cli("schedule", "list", "--json").json()] == ["one"]


@pytest.mark.slow  # worker processes and ten ticks
@pytest.mark.postgres
def test_three_workers_ten_ticks_ten_runs_a_crash_included(
    cli: Callable[..., Result],
    env: dict[str, str],
    tmp_path: Path,
    write_script: Callable[..., str],
) -> None:
    model = write_script([{"content": "done"}])
    clock = tmp_path / "clock"
    clock.write_text(T0.isoformat())
    wenv = {**env, schedules.CLOCK_ENV: str(clock)}
    with pg_schema() as db:
        res = cli(
            "schedule", "add", "nightly", "--cron", "* * * * *", "say done", "--model", model,
            "--shell", "deny", "--db", db, extra_env=wenv,
        )  # fmt: skip
        assert res.code == 0, res.stderr
        engine = open_store_engine(db)
        workers = Workers(wenv, db, tmp_path / "logs")
        flags = ("--poll", "0.1", "--quiet")
        procs = [workers.start(*flags) for _ in range(3)]

        def ticks() -> int:
            return len(fleet.schedule_runs(engine, "nightly"))

        try:
            for k in range(1, 11):
                if k == 6:  # this tick comes while the only worker dies making its run
                    for p in procs:
                        workers.stop(p)
                    crash = Workers({**wenv, schedules.CRASH_ENV: "after_run"}, db, tmp_path / "c")
                    victim = crash.start(*flags)
                    clock.write_text((T0 + timedelta(minutes=k, seconds=1)).isoformat())
                    assert victim.wait(timeout=60) == -signal.SIGKILL
                    run = schedules.run_id_for("nightly", T0 + timedelta(minutes=k))
                    assert Store(engine).run_exists(run) and ticks() == k - 1
                    procs = [workers.start(*flags) for _ in range(3)]
                else:
                    clock.write_text((T0 + timedelta(minutes=k, seconds=1)).isoformat())
                wait_for(lambda k=k: ticks() == k, 60, f"tick {k} started")
            wait_for(
                lambda: (
                    cli("list", "--db", db, "--status", "completed", "--json").json().__len__()
                    == 10
                ),
                60,
                "ten runs completed",
            )
        finally:
            workers.kill_all()
        runs = cli("list", "--db", db, "--json").json()
        assert len(runs) == 10 and all(r["status"] == "completed" for r in runs)
        assert sorted(t for t, _ in fleet.schedule_runs(engine, "nightly")) == [
            T0 + timedelta(minutes=k) for k in range(1, 11)
        ]
        engine.dispose()
    assert os.environ.get(schedules.CRASH_ENV) is None
