"""Queue controls through the database (docs/fleets.md): priorities (higher first, FIFO
within one, orphans before every pending run), concurrency limits per queue_key and per
batch (max_parallel), on SQLite and PostgreSQL; racing claimers never overshoot a limit;
`durable-agent queue` says why a run waits."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from conftest import Result
from sqlalchemy import insert, update

from durable_agent.messages import Message
from durable_agent.store import fleet
from durable_agent.store.engine import open_store_engine
from durable_agent.store.queue import Queue
from durable_agent.store.rows import utcnow
from durable_agent.store.runs import Store
from durable_agent.store.schema import batches, runs


def _store(url: str) -> Store:
    return Store(open_store_engine(url, pool_size=12))


def _add(store: Store, run_id: str, ws: Path, *, age: int, **queue: Any) -> None:
    store.create_run(
        run_id,
        task="t",
        workspace=str(ws),
        model="m",
        settings={},
        first_messages=[Message("user", "t")],
        queue=queue,
    )
    # created_at fixed, so FIFO does not hang on the clock's resolution
    with store.engine.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(created_at=utcnow() - timedelta(seconds=1000 - age))
        )


def _drain_order(queue: Queue, n: int) -> list[str]:
    got = []
    for i in range(n):
        res = queue.claim(f"h:{i}:w", 60)
        assert res.claim is not None, got
        got.append(res.claim.run_id)
    return got


def test_priorities_fifo_within_and_orphans_first(store_url: str, workspace: Path) -> None:
    store = _store(store_url)
    _add(store, "low-old", workspace, age=1, priority=0)
    _add(store, "high-new", workspace, age=5, priority=10)
    _add(store, "high-old", workspace, age=2, priority=10)
    _add(store, "mid", workspace, age=3, priority=5)
    _add(store, "neg", workspace, age=0, priority=-1)
    _add(store, "orphan", workspace, age=9, priority=-5)  # newest and lowest: still first
    with store.engine.begin() as conn:  # running under a lease that expired
        conn.execute(
            update(runs)
            .where(runs.c.id == "orphan")
            .values(
                status="running",
                lease_owner="elsewhere:1:x",
                lease_epoch=1,
                lease_expires_at=utcnow() - timedelta(seconds=5),
            )
        )
    queue = Queue(store.engine)
    order = _drain_order(queue, 6)
    assert order == ["orphan", "high-old", "high-new", "mid", "low-old", "neg"]
    assert queue.claim("h:9:w", 60).claim is None


def test_queue_key_limit_and_batch_max_parallel(store_url: str, workspace: Path) -> None:
    store = _store(store_url)
    now = utcnow()
    with store.engine.begin() as conn:
        conn.execute(
            insert(batches).values(
                id="b1",
                name="nightly",
                status="active",
                max_parallel=2,
                workdir="/tmp",
                created_at=now,
                updated_at=now,
            )
        )
    for i in range(3):
        _add(store, f"repoA-{i}", workspace, age=i, queue_key="repo-a", priority=1)
    for i in range(4):
        _add(store, f"batch-{i}", workspace, age=10 + i, batch_id="b1")
    _add(store, "free", workspace, age=20)
    queue = Queue(store.engine)
    got = []
    while (res := queue.claim(f"h:{len(got)}:w", 60)).claim is not None:
        got.append(res.claim.run_id)
    # one of repo-a (a key without a row allows one), two of the batch, and the free run
    assert got == ["repoA-0", "batch-0", "batch-1", "free"]
    rows = {r.id: r.why for r in fleet.queue_overview(store.engine)}
    assert rows["repoA-1"] == "queue_key 'repo-a' at its limit (1/1 running)"
    assert rows["batch-2"] == "batch 'nightly' at max_parallel (2/2 running)"
    # a run that ends frees its slot: the next of its key is claimable
    with store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == "repoA-0").values(status="completed"))
    assert queue.claim("h:x:w", 60).claim.run_id == "repoA-1"  # type: ignore[union-attr]
    fleet.set_key_limit(store.engine, "repo-a", 2)
    assert queue.claim("h:y:w", 60).claim.run_id == "repoA-2"  # type: ignore[union-attr]
    assert queue.claim("h:z:w", 60).claim is None


def test_racing_claimers_never_overshoot_a_key(store_url: str, workspace: Path) -> None:
    store = _store(store_url)
    fleet.set_key_limit(store.engine, "k", 3)
    for i in range(12):
        _add(store, f"r{i}", workspace, age=i, queue_key="k")
    queue = Queue(store.engine)
    won: list[str] = []
    lock = threading.Lock()
    go = threading.Barrier(8)

    def claimer(n: int) -> None:
        go.wait()
        for _ in range(4):
            res = queue.claim(f"h:{n}:w", 60)
            if res.claim is not None:
                with lock:
                    won.append(res.claim.run_id)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 3 and len(set(won)) == 3, won


def test_queue_command_shows_why(
    cli_inproc: Callable[..., Result], env: dict[str, str], workspace: Path
) -> None:
    store = _store(env["DURABLE_AGENT_DB"])
    _add(store, "a1", workspace, age=1, queue_key="repo")
    _add(store, "a2", workspace, age=2, queue_key="repo", priority=3)
    Queue(store.engine).claim("h:1:w", 60)
    res = cli_inproc("queue")
    assert res.code == 0, res.stderr
    assert "running: 1 · waiting: 1" in res.stdout
    assert "a1" in res.stdout and "queue_key 'repo' at its limit (1/1 running)" in res.stdout
    assert cli_inproc("queue", "limit", "repo", "2").code == 0
    shown = cli_inproc("queue", "--json").json()
    assert [r["run_id"] for r in shown] == ["a2", "a1"]  # running first
    assert shown[1]["why"] == "next for a free worker"
    bad = cli_inproc("queue", "limit", "repo", "0")
    assert bad.code == 2 and "at least 1" in bad.stderr
