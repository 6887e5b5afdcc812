"""The store on PostgreSQL (each test in its own schema of the `test` database) and the
queue's guarantees on both backends: migrations, the CLI, SKIP LOCKED claims, the global
limit, lease expiry and fencing."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import forked_cli
import pytest
from scale_helpers import pg_schema
from sqlalchemy import Engine, text, update

from durable_agent.errors import LeaseLost
from durable_agent.messages import Message
from durable_agent.store.engine import current_revision, open_store_engine, upgrade
from durable_agent.store.journal import Journal
from durable_agent.store.queue import Queue
from durable_agent.store.rows import utcnow
from durable_agent.store.runs import Store
from durable_agent.store.schema import HEAD_REVISION, runs
from durable_agent.store.step import Counters

# Owners on another "host": the same-host dead-pid takeover of acquire_lease must not
# kick in, only lease expiry.
OWNER_A = "host-a:101:aaaa"
OWNER_B = "host-b:202:bbbb"
OWNER_C = "host-c:303:cccc"


@pytest.fixture
def pg_url() -> Iterator[str]:
    with pg_schema() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = open_store_engine(store_url, pool_size=12)
    yield eng
    eng.dispose()


def add_runs(store: Store, n: int, workspace: Path, prefix: str = "run") -> list[str]:
    ids = [f"{prefix}{i:03d}" for i in range(n)]
    for rid in ids:
        store.create_run(
            rid,
            task=f"task {rid}",
            workspace=str(workspace),
            model="scripted:x",
            settings={"max_steps": 5},
            first_messages=[Message("system", "s"), Message("user", f"task {rid}")],
        )
    return ids


def expire_lease(engine: Engine, run_id: str) -> None:
    """What time does to a worker that stopped renewing (crashed, paused, partitioned)."""
    with engine.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )


ZERO = Counters(0, 0, 0, 0, 2, 0)


# -- PostgreSQL: migrations and the CLI ---------------------------------------------------------
@pytest.mark.postgres
def test_migrations_build_the_schema_with_views_and_indexes_in_a_private_schema(
    pg_url: str,
) -> None:
    engine = open_store_engine(pg_url)
    try:
        assert current_revision(engine) == HEAD_REVISION
        with engine.connect() as conn:
            schema = conn.execute(text("SELECT current_schema()")).scalar_one()
            assert schema.startswith("da_test_")  # everything landed in the test's schema
            tables = set(
                conn.execute(
                    text(
                        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
                    )
                ).scalars()
            )
            assert {
                "runs",
                "steps",
                "messages",
                "approvals",
                "alembic_version",
                "run_timeline",
            } <= tables
            indexes = set(
                conn.execute(
                    text(
                        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'runs'"
                    )
                ).scalars()
            )
            assert {
                "ix_runs_claimable",
                "ix_runs_created_id",
                "ix_runs_status_created_id",
            } <= indexes
            assert (
                conn.execute(
                    text(
                        "SELECT data_type FROM information_schema.columns WHERE table_schema = current_schema() "
                        "AND table_name = 'steps' AND column_name = 'input'"
                    )
                ).scalar_one()
                == "jsonb"
            )
        # Down past the queue indexes and up again: both directions work on PostgreSQL.
        upgrade_to(engine, "0002", down=True)
        assert current_revision(engine) == "0002"
        upgrade(engine)
        assert current_revision(engine) == HEAD_REVISION
    finally:
        engine.dispose()


def upgrade_to(engine: Engine, revision: str, *, down: bool) -> None:
    from alembic.config import Config

    from alembic import command
    from durable_agent.store.engine import migrations_dir

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)


@pytest.mark.postgres
def test_claim_query_reads_the_partial_index(pg_url: str, tmp_path: Path) -> None:
    engine = open_store_engine(pg_url)
    try:
        store = Store(engine)
        add_runs(store, 50, tmp_path)
        with engine.begin() as conn:
            conn.execute(text("UPDATE runs SET status = 'completed' WHERE id < 'run040'"))
            conn.execute(text("ANALYZE runs"))
            conn.execute(
                text("SET LOCAL enable_seqscan = off")
            )  # tiny table: ask what it *can* use
            plan = "\n".join(
                conn.execute(
                    text(
                        "EXPLAIN SELECT id FROM runs WHERE status IN ('pending', 'running') "
                        "AND (lease_expires_at IS NULL OR lease_expires_at <= now()) "
                        "ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED"
                    )
                ).scalars()
            )
        assert "ix_runs_claimable" in plan, plan
        assert "Sort" not in plan, plan  # rows come in claim order straight from the index
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_cli_start_list_show_export_work_unchanged_on_postgres(
    pg_url: str, env: dict[str, str], workspace: Path, write_script: Callable[..., str]
) -> None:
    env = {**env, "DURABLE_AGENT_DB": pg_url}
    model = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo pg-ok"}}]},
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "a.txt", "content": "x\n"}}
                ]
            },
            {"content": "done"},
        ]
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return forked_cli.run(args, env=env, cwd=workspace)

    started = cli("start", "do it", "--model", model, "--shell", "allow", "--json")
    assert started.returncode == 0, started.stderr
    result = json.loads(started.stdout)
    assert (result["status"], result["answer"], result["steps"], result["tool_calls"]) == (
        "completed",
        "done",
        3,
        2,
    )
    rid = result["run_id"]
    listed = cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(r["id"], r["status"]) for r in json.loads(listed.stdout)] == [(rid, "completed")]
    shown = cli("show", rid, "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert [(s["kind"], s["state"]) for s in doc["steps"]] == [
        ("model", "completed"),
        ("tool", "completed"),
    ] * 2 + [("model", "completed")]
    exported = cli("export", rid)
    assert exported.returncode == 0, exported.stderr
    types = [json.loads(line)["type"] for line in exported.stdout.splitlines()]
    assert types[0] == "run_started" and types[-1] == "run_finished"
    # JSON columns are jsonb that psql users read with -> and ->>.
    engine = open_store_engine(pg_url)
    try:
        with engine.connect() as conn:
            args = conn.execute(
                text(
                    "SELECT tool_name, input -> 'arguments' ->> 'command', input -> 'arguments' ->> 'path' "
                    "FROM steps WHERE run_id = :r AND kind = 'tool' ORDER BY seq"
                ),
                {"r": rid},
            ).all()
        assert [tuple(a) for a in args] == [
            ("run_command", "echo pg-ok", None),
            ("write_file", None, "a.txt"),
        ]
    finally:
        engine.dispose()
    assert (workspace / "a.txt").read_text() == "x\n"


# -- the queue on both backends ---------------------------------------------------------------
def test_concurrent_claims_never_hand_out_a_run_twice(engine: Engine, tmp_path: Path) -> None:
    store, queue = Store(engine), Queue(engine)
    ids = add_runs(store, 24, tmp_path)
    claimed: list[tuple[str, str, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def claimer(n: int) -> None:
        try:
            barrier.wait()
            while True:
                got = queue.claim(f"host-t:{n}:{n:04d}", 60).claim
                if got is None:
                    return
                with lock:
                    claimed.append((got.run_id, got.owner, got.epoch))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sorted(r for r, _, _ in claimed) == ids  # every run exactly once
    assert {e for _, _, e in claimed} == {1}
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, status, lease_owner, lease_epoch FROM runs")).all()
    owners = {r: o for r, o, _ in claimed}
    assert all(
        r.status == "running" and r.lease_epoch == 1 and r.lease_owner == owners[r.id] for r in rows
    )


def test_global_limit_holds_under_concurrent_claims(engine: Engine, tmp_path: Path) -> None:
    store, queue = Store(engine), Queue(engine)
    add_runs(store, 10, tmp_path)
    got: list[str] = []
    limited: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def claimer(n: int) -> None:
        barrier.wait()
        result = queue.claim(f"host-t:{n}:x", 60, max_running=3)
        with lock:
            if result.claim is not None:
                got.append(result.claim.run_id)
            elif result.at_limit:
                limited.append(n)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 3 and len(set(got)) == 3
    assert len(limited) == 5
    with engine.connect() as conn:
        assert (
            conn.execute(
                text(
                    "SELECT COUNT(*) FROM runs WHERE status = 'running' AND lease_owner IS NOT NULL"
                )
            ).scalar()
            == 3
        )
    # A finished run frees its slot.
    rid = got[0]
    with engine.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == rid)
            .values(status="completed", lease_owner=None, lease_expires_at=None)
        )
    assert queue.claim(OWNER_C, 60, max_running=3).claim is not None
    assert queue.claim(OWNER_C, 60, max_running=3).at_limit


def test_a_live_lease_is_not_claimable_an_expired_one_is_taken_over(
    engine: Engine, tmp_path: Path
) -> None:
    store, queue = Store(engine), Queue(engine)
    (rid,) = add_runs(store, 1, tmp_path)
    first = queue.claim(OWNER_A, 60).claim
    assert first is not None and first.epoch == 1 and not first.takeover
    assert queue.claim(OWNER_B, 60).claim is None  # live: nobody else gets it
    assert (
        store.cancel(rid) == "requested"
    )  # a cancel that reached the run just before its worker died
    expire_lease(engine, rid)
    second = queue.claim(OWNER_B, 60).claim
    assert second is not None
    assert (second.run_id, second.epoch, second.takeover, second.previous_owner) == (
        rid,
        2,
        True,
        OWNER_A,
    )
    run = store.get_run(rid)
    assert (run.lease_owner, run.lease_epoch, run.status) == (OWNER_B, 2, "running")
    assert run.cancel_requested  # kept: the new owner must still honour the cancel
    assert run.resume_count == 1


def test_unreachable_workspaces_are_passed_over_and_left_queued(
    engine: Engine, tmp_path: Path
) -> None:
    store, queue = Store(engine), Queue(engine)
    ids = add_runs(store, 3, tmp_path)
    result = queue.claim(OWNER_A, 60, accept=lambda ws: False)
    assert result.claim is None and [r.run_id for r in result.rejected] == ids
    assert all(
        store.get_run(r).status == "pending" and store.get_run(r).lease_owner is None for r in ids
    )
    result = queue.claim(OWNER_A, 60, exclude={ids[0]})
    assert result.claim is not None and result.claim.run_id == ids[1]


def test_a_stolen_lease_fences_every_write_of_the_old_owner(engine: Engine, tmp_path: Path) -> None:
    """A worker that stalled past its lease (GC pause, partition) and comes back finds its
    lease taken: it cannot write a checkpoint, renew, finish or release the run."""
    store, queue = Store(engine), Queue(engine)
    (rid,) = add_runs(store, 1, tmp_path)
    epoch_a = store.acquire_lease(rid, OWNER_A, 30)
    old = Journal(engine, rid, OWNER_A, epoch_a, 30)
    old.load()
    first = old.step("model:0:abc", "model", {"turn": 0}, turn=0)  # the intent row, committed
    expire_lease(engine, rid)
    epoch_b = store.acquire_lease(rid, OWNER_B, 30)  # `resume` elsewhere takes it over
    assert epoch_b == epoch_a + 1

    def writes(j: Journal) -> dict[str, Callable[[], object]]:
        return {
            "complete": lambda: first.complete(
                {"x": 1}, messages=[Message("assistant", "hi")], counters=ZERO
            ),
            "start": lambda: j.find("tool:c1:x", "tool", turn=0, call_id="c1").start({}),
            "heartbeat": j.heartbeat,
            "finish_run": lambda: j.finish_run(
                status="completed", stop_reason="finished", answer="x", error=None, counters=ZERO
            ),
        }

    for name, write in writes(old).items():
        try:
            write()
        except LeaseLost:
            continue
        pytest.fail(f"{name} wrote under a stolen lease")
    assert not queue.release(rid, OWNER_A, epoch_a)  # cannot give back what is not ours
    steps = store.steps(rid)
    assert [(s.seq, s.state, s.lease_epoch) for s in steps] == [(0, "started", epoch_a)]
    assert len(store.messages(rid)) == 2
    run = store.get_run(rid)
    assert (run.status, run.lease_owner, run.lease_epoch) == ("running", OWNER_B, epoch_b)

    # A worker's claim steals it the same way from B, and B is fenced in turn.
    new = Journal(engine, rid, OWNER_B, epoch_b, 30)
    new.load()
    new.find("model:0:abc", "model", turn=0).complete({"x": 1}, counters=ZERO)
    expire_lease(engine, rid)
    claim = queue.claim(OWNER_C, 30).claim
    assert claim is not None and claim.epoch == epoch_b + 1
    with pytest.raises(LeaseLost):
        new.find("tool:c1:x", "tool", turn=0, call_id="c1").start({})
    with pytest.raises(LeaseLost):
        new.heartbeat()
    current = Journal(engine, rid, OWNER_C, claim.epoch, 30)
    current.load()
    current.find("tool:c1:x", "tool", turn=0, call_id="c1").start({})
    assert [(s.seq, s.state, s.lease_epoch) for s in store.steps(rid)] == [
        (0, "completed", epoch_a),
        (1, "started", claim.epoch),
    ]


def test_a_foreground_start_is_created_leased_so_no_worker_can_claim_it(
    engine: Engine, tmp_path: Path
) -> None:
    store, queue = Store(engine), Queue(engine)
    store.create_run(
        "fg",
        task="t",
        workspace=str(tmp_path),
        model="demo",
        settings={},
        first_messages=[Message("user", "t")],
        lease=(OWNER_A, 60),
    )
    assert queue.claim(OWNER_B, 60).claim is None
    run = store.get_run("fg")
    assert (run.status, run.lease_owner, run.lease_epoch) == ("running", OWNER_A, 1)
    journal = Journal(engine, "fg", OWNER_A, 1, 60)  # the starter writes under that lease
    journal.finish_run(
        status="completed",
        stop_reason="finished",
        answer="ok",
        error=None,
        counters=Counters(0, 0, 0, 0, 1, 0),
    )
    assert store.get_run("fg").status == "completed"


def test_a_live_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(
    engine: Engine, tmp_path: Path
) -> None:
    import os
    import socket

    store, queue = Store(engine), Queue(engine)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid is provably dead
    from durable_agent.store.leases import _pid_space

    dead_owner = f"{socket.gethostname()}:{gone.pid}:dead-{_pid_space()}"
    alive_owner = f"{socket.gethostname()}:{os.getpid()}:alive-{_pid_space()}"
    for rid, holder in (("orphan", dead_owner), ("held", alive_owner)):
        store.create_run(
            rid,
            task="t",
            workspace=str(tmp_path),
            model="demo",
            settings={},
            first_messages=[Message("user", "t")],
            lease=(holder, 600),
        )
    claim = queue.claim(OWNER_B, 60).claim
    assert claim is not None and (claim.run_id, claim.epoch, claim.takeover) == ("orphan", 2, True)
    assert claim.previous_owner == dead_owner
    assert queue.claim(OWNER_C, 60).claim is None  # the live owner keeps its run


_RESET_ON_A_CLOSED_CONNECTION = """
import sys
from sqlalchemy import text
from durable_agent.store.engine import open_store_engine

engine = open_store_engine(sys.argv[1])
conn = engine.raw_connection()  # (as the pool hands it: its reset is what runs)
cursor = conn.cursor()
cursor.execute("SELECT pg_backend_pid()")
pid = cursor.fetchone()[0]
with engine.connect() as other:
    other.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    other.commit()
conn.close()  # the pool's reset (a rollback) meets the closed connection
print("given back")
engine.dispose()
"""


def test_a_connection_the_server_closed_is_let_go_of_without_a_traceback(
    pg_url: str, tmp_path: Path
) -> None:
    """A connection the server ended (a take-over, a restart) is given back to the pool,
    whose rollback of it fails: SQLAlchemy logs that with its traceback, which logging's
    last resort printed on a user's terminal under the one line the store's own error
    says. It is the store's to say, once."""
    done = subprocess.run(
        [sys.executable, "-c", _RESET_ON_A_CLOSED_CONNECTION, pg_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "given back" in done.stdout
    assert "Traceback" not in done.stderr and "Exception during reset" not in done.stderr, (
        done.stderr
    )
