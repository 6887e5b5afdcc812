"""Scale-out on PostgreSQL: three worker processes drain 30 queued runs; one is killed with
SIGKILL in the middle of a command, and the others finish its runs once its leases expire.

What proves it, from the database and the workspaces rather than from logs:
- every run completes;
- ledgers (each command appends its call id to its run's ledger.txt): no call ran twice;
  every call recorded as completed ran exactly once; the call(s) cut off by the kill ran at
  most once and were reported to the model as interrupted (`on_uncertain_exec =
  "tell_model"`, set in the config file: with the default `block` such a run would stop
  `blocked` for a person, by design, SPEC §5);
- leases: test-only triggers record every lease change and every step write with the run's
  lease at that instant. A new epoch is only ever taken from a lease that had expired or
  been released, every step write happened under the then-current epoch, each epoch had one
  owner, and no write of an epoch came after the next epoch began. So no two workers ever
  held a run at once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scale_helpers import Workers, owner_pid, pg_schema, wait_for
from sqlalchemy import Engine, text

from durable_agent.config.settings import load_settings
from durable_agent.store.engine import open_store_engine
from durable_agent.store.runs import Store
from durable_agent.wiring import build_runner

RUNS = 30
LEASE_S = 2

AUDIT_SQL = [
    """CREATE TABLE lease_audit (
           id bigserial PRIMARY KEY, run_id text, old_epoch int, new_epoch int, old_owner text,
           new_owner text, old_expires timestamp, at timestamp)""",
    """CREATE FUNCTION audit_lease() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         INSERT INTO lease_audit (run_id, old_epoch, new_epoch, old_owner, new_owner, old_expires, at)
         VALUES (NEW.id, OLD.lease_epoch, NEW.lease_epoch, OLD.lease_owner, NEW.lease_owner,
                 OLD.lease_expires_at, clock_timestamp() AT TIME ZONE 'UTC');
         RETURN NEW;
       END $$""",
    """CREATE TRIGGER runs_lease_audit AFTER UPDATE ON runs FOR EACH ROW
       WHEN (OLD.lease_epoch IS DISTINCT FROM NEW.lease_epoch) EXECUTE FUNCTION audit_lease()""",
    """CREATE TABLE step_audit (
           id bigserial PRIMARY KEY, run_id text, seq int, op text, state text, step_epoch int,
           run_epoch int, run_owner text, at timestamp)""",
    # Reads the run row inside the writing transaction, i.e. right after the Journal's fence.
    """CREATE FUNCTION audit_step() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         INSERT INTO step_audit (run_id, seq, op, state, step_epoch, run_epoch, run_owner, at)
         SELECT NEW.run_id, NEW.seq, TG_OP, NEW.state, NEW.lease_epoch, r.lease_epoch, r.lease_owner,
                clock_timestamp() AT TIME ZONE 'UTC'
         FROM runs r WHERE r.id = NEW.run_id;
         RETURN NEW;
       END $$""",
    """CREATE TRIGGER steps_audit AFTER INSERT OR UPDATE ON steps FOR EACH ROW
       EXECUTE FUNCTION audit_step()""",
]


def command(n: int) -> dict[str, Any]:
    # The sleep comes after the append: a kill then lands in the worst window, where the
    # side effect happened and its outcome is not recorded. The comment keeps fingerprints
    # distinct (max_repeats).
    return {
        "name": "run_command",
        "arguments": {"command": f'echo "$DURABLE_AGENT_CALL_ID" >> ledger.txt; sleep 0.4 # {n}'},
    }


SCRIPT = [
    {"tool_calls": [command(1)]},
    {"tool_calls": [command(2), command(3)]},
    {"tool_calls": [command(4)]},
    {"content": "done"},
]
CALLS_PER_RUN = 4


@pytest.fixture
def pg_url() -> Iterator[str]:
    with pg_schema() as url:
        yield url


@pytest.fixture
def engine(pg_url: str) -> Iterator[Engine]:
    eng = open_store_engine(pg_url)
    yield eng
    eng.dispose()


@pytest.fixture
def workers(env: dict[str, str], tmp_path: Path, pg_url: str) -> Iterator[Workers]:
    w = Workers(env, pg_url, tmp_path / "logs")
    yield w
    w.kill_all()


def rows(engine: Engine, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql), params).all())


@pytest.mark.postgres
@pytest.mark.slow
def test_three_workers_drain_30_runs_and_take_over_from_a_killed_one(
    pg_url: str, engine: Engine, env: dict[str, str], tmp_path: Path, workers: Workers
) -> None:
    with engine.begin() as conn:
        for statement in AUDIT_SQL:
            conn.execute(text(statement))
    config = tmp_path / "config.toml"
    config.write_text('on_uncertain_exec = "tell_model"\nshell = "allow"\n')
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env.update(DURABLE_AGENT_DB=pg_url, DURABLE_AGENT_CONFIG=str(config))
    workers.env = env

    # Enqueue: the same code as `start --detach` (settings, build_runner, create), sharing
    # one engine; the CLI's --detach itself is covered in test_worker.py.
    spaces: dict[str, Path] = {}
    store = Store(engine)
    for i in range(RUNS):
        ws = tmp_path / "ws" / f"{i:02d}"
        ws.mkdir(parents=True)
        settings = load_settings({"workspace": ws, "model": f"scripted:{script}"}, env)
        spaces[build_runner(settings, env=env, store=store).create(f"task {i}")] = ws
    recorded = store.get_run(next(iter(spaces))).settings
    assert recorded["on_uncertain_exec"] == "tell_model"  # the workers will rebuild it from here

    flags = ("--concurrency", "2", "--lease-seconds", str(LEASE_S), "--poll", "0.1", "--quiet")
    victim, *survivors = [workers.start(*flags) for _ in range(3)]
    host = socket.gethostname()

    def victim_mid_command() -> bool:
        found = rows(
            engine,
            "SELECT r.lease_owner FROM runs r JOIN steps s ON s.run_id = r.id "
            "WHERE s.kind = 'tool' AND s.state = 'started' AND r.lease_owner IS NOT NULL",
        )
        return any(owner_pid(o) == victim.pid and o.startswith(host + ":") for (o,) in found)

    wait_for(victim_mid_command, 60, "the victim worker to be in the middle of a command", 0.01)
    # The survivors are frozen while the victim dies and what it held is read: one of them
    # takes a dead worker's run over at once (same host, pid gone), and would otherwise race
    # the reads below.
    for p in survivors:
        p.send_signal(signal.SIGSTOP)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    # What the victim held when it died (it can write nothing more, so this is final).
    held = {
        r.id: r
        for r in rows(engine, "SELECT id, lease_owner, lease_epoch FROM runs")
        if owner_pid(r.lease_owner) == victim.pid
    }
    cut_off = {
        (r.run_id, r.call_id): r.began
        for r in rows(
            engine,
            "SELECT run_id, call_id, pgid IS NOT NULL AS began FROM steps "
            "WHERE kind = 'tool' AND state = 'started'",
        )
        if r.run_id in held
    }
    for p in survivors:
        p.send_signal(signal.SIGCONT)
    assert held and cut_off

    def all_done() -> bool:
        for p in survivors:
            assert p.poll() is None, f"a surviving worker exited early:\n{workers.log(p)}"
        return (
            rows(engine, "SELECT count(*) FROM runs WHERE status IN ('pending', 'running')")[0][0]
            == 0
        )

    wait_for(all_done, 240, "every run to end", 0.2)
    for p in survivors:
        assert workers.stop(p) == 0, workers.log(p)
        assert "stopped (signal)" in workers.log(p)
    survivor_logs = "".join(workers.log(p) for p in survivors)
    once = workers.start("--once", "--quiet")
    assert once.wait(timeout=60) == 0
    assert "stopped (nothing left to claim) · 0 claimed" in workers.log(once)

    # Every run completed, including the ones taken over from the victim.
    final = {
        r.id: r
        for r in rows(engine, "SELECT id, status, answer, lease_epoch, step_count FROM runs")
    }
    assert len(final) == RUNS
    assert {(r.status, r.answer, r.step_count) for r in final.values()} == {
        ("completed", "done", 4)
    }
    for rid, was in held.items():
        assert final[rid].lease_epoch > was.lease_epoch
        assert f"took over run {rid} from {was.lease_owner}" in survivor_logs

    # Ledgers: nothing ran twice; recorded calls ran once; interrupted ones at most once.
    tool_steps = rows(engine, "SELECT run_id, call_id, state, error FROM steps WHERE kind = 'tool'")
    assert len(tool_steps) == RUNS * CALLS_PER_RUN
    interrupted = {
        (s.run_id, s.call_id) for s in tool_steps if s.error and "interrupted by a crash" in s.error
    }
    # A command whose pgid was committed may have run: the model is told. One cut off before
    # that never began (the guard waits for the pgid): it is run, once, like any other.
    assert {k for k, began in cut_off.items() if began} <= interrupted
    assert not {k for k, began in cut_off.items() if not began} & interrupted
    # Finished, every one; the only failures are the calls cut off by a crash (the model was told).
    assert {(s.run_id, s.call_id) for s in tool_steps if s.state != "completed"} == interrupted
    assert {s.state for s in tool_steps if (s.run_id, s.call_id) in interrupted} <= {"failed"}
    for rid, ws in spaces.items():
        counts = Counter((ws / "ledger.txt").read_text().split())
        assert max(counts.values()) == 1, f"run {rid} ran a command twice: {counts}"
        for s in (s for s in tool_steps if s.run_id == rid):
            if (rid, s.call_id) in interrupted:
                assert counts[s.call_id] <= 1
            else:
                assert counts[s.call_id] == 1, (
                    f"run {rid}: call {s.call_id} recorded but not in the ledger"
                )

    # Epochs never go backwards along a run's steps.
    by_run: dict[str, list[int]] = defaultdict(list)
    for r in rows(engine, "SELECT run_id, lease_epoch FROM steps ORDER BY run_id, seq"):
        by_run[r.run_id].append(r.lease_epoch)
    assert all(epochs == sorted(epochs) for epochs in by_run.values())

    # Leases: each new epoch was taken only from an expired or released lease, or from the
    # killed worker (same host, pid gone: taken over at once, without waiting for expiry).
    transitions = rows(engine, "SELECT * FROM lease_audit ORDER BY id")
    epoch_owner: dict[tuple[str, int], str] = {}
    epoch_began: dict[tuple[str, int], Any] = {}
    for t in transitions:
        assert t.new_epoch == t.old_epoch + 1
        assert (
            t.old_owner is None or t.old_expires <= t.at or owner_pid(t.old_owner) == victim.pid
        ), f"lease of {t.run_id} taken while live: {t}"
        epoch_owner[(t.run_id, t.new_epoch)] = t.new_owner
        epoch_began[(t.run_id, t.new_epoch)] = t.at
    takeovers = [t for t in transitions if owner_pid(t.old_owner) == victim.pid]
    assert {t.run_id for t in takeovers} == set(held)
    assert all(owner_pid(t.new_owner) in {p.pid for p in survivors} for t in takeovers)

    # Every step write happened under the run's current epoch, by that epoch's one owner,
    # and before the next epoch began.
    writes = rows(engine, "SELECT * FROM step_audit ORDER BY id")
    assert len(writes) >= RUNS * (CALLS_PER_RUN + 4)
    for w in writes:
        assert w.run_owner == epoch_owner[(w.run_id, w.run_epoch)], w
        assert w.step_epoch <= w.run_epoch and (w.op == "UPDATE" or w.step_epoch == w.run_epoch), w
        following = epoch_began.get((w.run_id, w.run_epoch + 1))
        assert following is None or w.at < following, (
            f"write of epoch {w.run_epoch} after the next began: {w}"
        )
