"""A parent run by a worker waits for its children without a lease or a process
(docs/delegation.md, "Waiting in the workers' queue").

Real worker processes with scripted models (one script for the parent and its children,
keyed by each run's task). The parent stops `waiting` at its `delegate` calls; the workers
claim the children like any run; the last child's end makes the parent `pending` again in
its own commit, and each claim wakes a waiting parent whose children all ended. SIGKILLs
(DURABLE_AGENT_CRASH_AFTER=k: the k-th checkpoint boundary of the worker's process) while a
child runs and right after a child's final commit change nothing in the ledger: each child
made once, its steps once, the parent's observation of each child once, the same answer as
the foreground run's.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import forked_cli
import pytest
from scale_helpers import Workers, owner_pid, pg_schema, wait_for
from test_delegate import check_once, ledger, query

NAMES = ("alpha", "beta", "gamma")


def readers_script(path: Path, slow: str | None = None, delay: float = 1.5) -> str:
    """Three read-only children (side by side); `slow`'s last answer takes `delay` s."""
    children = {
        f"read {n}": [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": f"{n}.txt"}}]},
            {"content": f"{n} read", "delay_s": delay if n == slow else 0},
        ]
        for n in NAMES
    }
    calls = [{"name": "delegate", "arguments": {"task": t}} for t in children]
    script = {"*": [{"tool_calls": calls}, {"content": "all read"}], **children}
    path.write_text(json.dumps(script))
    return f"scripted:{path}"


def folder(tmp_path: Path, name: str) -> Path:
    ws = tmp_path / name
    ws.mkdir()
    for n in NAMES:
        (ws / f"{n}.txt").write_text(n)
    return ws


def start(env: dict[str, str], ws: Path, model: str, *extra: str) -> None:
    r = forked_cli.run(
        ["start", "read them", "--delegate", "--model", model, "--run-id", "p", "--quiet", *extra],
        env=env,
        cwd=ws,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


def reference(tmp_path: Path, env: dict[str, str], model: str) -> dict[str, Any]:
    """The foreground run's ledger and totals (children in the parent's process)."""
    db = tmp_path / "reference.db"
    start({**env, "DURABLE_AGENT_DB": f"sqlite:///{db}"}, folder(tmp_path, "ref"), model)
    check_once(db, "p")
    return {"ledger": ledger(db, "p"), "tokens": tokens(db)}


def tokens(db: Path) -> list[Any]:
    return query(db, "SELECT prompt_tokens, completion_tokens FROM runs WHERE id = 'p'")


def worker(env: dict[str, str], cwd: Path, *flags: str, crash_after: int | None = None) -> Any:
    e = dict(env)
    if crash_after is not None:
        e["DURABLE_AGENT_CRASH_AFTER"] = str(crash_after)
    return forked_cli.run(
        ["worker", "--once", "--poll", "0.05", *flags], env=e, cwd=cwd, timeout=120
    )


@pytest.mark.slow
def queued(tmp_path: Path, env: dict[str, str], *run_ids: str) -> None:
    """Runs queued (`start --detach`) under these ids, each its id as its task; the tests
    then shape their rows into a tree by hand."""
    ws = folder(tmp_path, "ws")
    model = readers_script(tmp_path / "s.json")
    for rid in run_ids:
        r = forked_cli.run(
            ["start", rid, "--model", model, "--run-id", rid, "--detach"], env=env, cwd=ws
        )
        assert r.returncode == 0, r.stderr


def test_a_claim_wakes_a_waiting_parent_whose_childs_wake_was_lost(
    tmp_path: Path, env: dict[str, str], store_url: str
) -> None:
    """The sweep: a waiting parent whose children all ended is claimed (its wake was lost,
    as if the child's end had been written without it); not before."""
    from sqlalchemy import text

    from durable_agent.store.engine import open_store_engine
    from durable_agent.store.leases import new_owner
    from durable_agent.store.queue import Queue

    queued(tmp_path, {**env, "DURABLE_AGENT_DB": store_url}, *("p", "c"))
    engine = open_store_engine(store_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE runs SET status = 'waiting' WHERE id = 'p'"))
            conn.execute(text("UPDATE runs SET parent_id = 'p', parent_step = 1 WHERE id = 'c'"))
        queue = Queue(engine)
        first = queue.claim(new_owner(), 30).claim
        assert first is not None and first.run_id == "c"  # p waits on it
        assert queue.claim(new_owner(), 30).claim is None
        with engine.begin() as conn:  # c ends without waking p (a lost wake)
            conn.execute(text("UPDATE runs SET status = 'completed', lease_owner = NULL"))
            conn.execute(text("UPDATE runs SET status = 'waiting' WHERE id = 'p'"))
            conn.execute(text("UPDATE runs SET version_key = 'v1'"))
        # Woken by any claim, claimed by the rules of versions (docs/versions.md): a worker
        # of another version key leaves it, one of its own takes it.
        queue.version_key = "v2"
        assert queue.claim(new_owner(), 30).claim is None
        with engine.connect() as conn:
            assert conn.execute(text("SELECT status FROM runs WHERE id = 'p'")).all() == [
                ("pending",)
            ]
        queue.version_key = "v1"
        second = queue.claim(new_owner(), 30).claim
        assert second is not None and second.run_id == "p" and not second.takeover
    finally:
        engine.dispose()


@pytest.mark.slow
def test_one_sqlite_worker_parent_waits_without_a_lease(
    tmp_path: Path, env: dict[str, str]
) -> None:
    model = readers_script(tmp_path / "s.json", slow="beta")
    ref = reference(tmp_path, env, model)
    db = tmp_path / "w.db"
    url = f"sqlite:///{db}"
    e = {**env, "DURABLE_AGENT_DB": url}
    start(e, folder(tmp_path, "ws"), model, "--detach")
    workers = Workers(e, url, tmp_path / "logs")
    try:
        proc = workers.start("--poll", "0.05")
        # beta's slow answer is being made by the only worker: the parent holds nothing.
        wait_for(
            lambda: query(
                db,
                "SELECT 1 FROM runs p JOIN runs c ON c.parent_id = p.id WHERE p.id = 'p' "
                "AND p.status = 'waiting' AND p.lease_owner IS NULL "
                "AND p.lease_expires_at IS NULL AND c.status = 'running' "
                "AND c.lease_owner IS NOT NULL",
            ),
            60,
            "the parent waiting while a child runs",
        )
        wait_for(
            lambda: query(db, "SELECT 1 FROM runs WHERE id = 'p' AND status = 'completed'"),
            60,
            "the parent to complete",
        )
        assert workers.stop(proc) == 0
        log = workers.log(proc)
    finally:
        workers.kill_all()
    check_once(db, "p")
    assert ledger(db, "p") == ref["ledger"]
    assert tokens(db) == ref["tokens"]  # the children's tokens counted once, at the outcomes
    assert "run p is waiting for its child runs" in log
    # The children were made by the parent's release: the same workers claim them.
    assert query(db, "SELECT COUNT(DISTINCT version_key), COUNT(version_key) FROM runs") == [(1, 4)]


def _state(db: Path) -> str:
    parent = query(db, "SELECT status, lease_owner FROM runs WHERE id = 'p'")
    kids = query(
        db,
        "SELECT r.status, (SELECT COUNT(*) FROM steps s WHERE s.run_id = r.id) "
        "FROM runs r WHERE r.parent_id = 'p'",
    )
    if any(k[0] == "running" for k in kids):
        return "inside a child" if any(k[1] > 0 for k in kids if k[0] == "running") else "other"
    if kids and all(k[0] == "completed" for k in kids) and parent == [("pending", None)]:
        return "after the last child's end"  # woken in that commit, not claimed again yet
    if any(k[0] == "completed" for k in kids) and parent == [("waiting", None)]:
        return "after a child's end"  # the next one not claimed yet
    return "other"


@pytest.mark.slow
def test_sqlite_worker_killed_inside_a_child_and_after_a_childs_end(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """One worker SIGKILLed at each checkpoint boundary k; another finishes the runs. Each k
    that falls inside a child or right after a child's final commit is checked in full."""
    model = readers_script(tmp_path / "s.json")
    ref = reference(tmp_path, env, model)
    seen: dict[str, int] = {}
    k = 1
    while True:
        db = tmp_path / f"k{k}.db"
        e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}"}
        start(e, folder(tmp_path, f"ws{k}"), model, "--detach")
        r = worker(e, tmp_path, crash_after=k)
        if r.returncode == 0:
            break  # past the last boundary
        assert r.returncode == -signal.SIGKILL, r.stderr
        where = _state(db)
        seen[where] = seen.get(where, 0) + 1
        # Finished and checked: every k after a child's end, every third inside a child,
        # every seventh elsewhere (the cores are shared).
        every = {"inside a child": 3, "other": 7}.get(where, 1)
        if seen[where] % every == 1 % every:
            r = worker(e, tmp_path)  # another worker: the dead one's lease is taken at once
            assert r.returncode == 0, (k, r.stderr)
            assert query(db, "SELECT status FROM runs WHERE id = 'p'") == [("completed",)], k
            check_once(db, "p")
            assert ledger(db, "p") == ref["ledger"], k
            assert tokens(db) == ref["tokens"], k
        k += 1
    assert seen.get("inside a child", 0) >= 3, seen
    assert seen.get("after a child's end", 0) >= 1, seen
    assert seen.get("after the last child's end", 0) >= 1, seen


def pg_ledger(rows: Any) -> dict[str, Any]:
    """`ledger` (tests/test_delegate.py) of a PostgreSQL store, read by `rows(sql)`."""

    def q(sql: str) -> list[Any]:
        return [tuple(r) for r in rows(sql)]

    kids = [k for (k,) in q("SELECT id FROM runs WHERE parent_id = 'p' ORDER BY parent_step")]
    return {
        "parent": q("SELECT status, answer FROM runs WHERE id = 'p'"),
        "observations": q(
            "SELECT tool_call_id, content FROM messages WHERE run_id = 'p' AND role = 'tool' "
            "ORDER BY seq"
        ),
        "children": q("SELECT status, answer FROM runs WHERE parent_id = 'p' ORDER BY parent_step"),
        "child_steps": [
            q(f"SELECT kind, tool_name, state FROM steps WHERE run_id = '{kid}' ORDER BY seq")
            for kid in kids
        ],
        "tree": q(
            "SELECT depth, COUNT(*) FROM run_tree WHERE root_id = 'p' GROUP BY depth ORDER BY 1"
        ),
    }


def pg_tokens(rows: Any) -> list[Any]:
    return [
        tuple(r) for r in rows("SELECT prompt_tokens, completion_tokens FROM runs WHERE id = 'p'")
    ]


def pg_once(rows: Any) -> None:
    """`check_once` of a PostgreSQL store."""
    assert [tuple(r) for r in rows("SELECT COUNT(*) FROM runs")] == [(4,)]
    assert rows("SELECT r.parent_step FROM runs r WHERE r.parent_id = 'p' ORDER BY 1") == rows(
        "SELECT seq FROM steps WHERE run_id = 'p' AND kind = 'delegate' ORDER BY 1"
    )
    assert rows("SELECT run_id, idempotency_key FROM steps GROUP BY 1, 2 HAVING COUNT(*) > 1") == []
    assert rows("SELECT COUNT(*) FROM steps WHERE state != 'completed'")[0][0] == 0
    assert (
        rows(
            "SELECT run_id, tool_call_id FROM messages WHERE role = 'tool' "
            "GROUP BY 1, 2 HAVING COUNT(*) > 1"
        )
        == []
    )


@contextmanager
def pg_store() -> Iterator[tuple[str, Any]]:
    """A fresh PostgreSQL store and a `rows(sql)` reader of it."""
    from sqlalchemy import text

    from durable_agent.store.engine import open_store_engine

    with pg_schema() as url:
        engine = open_store_engine(url)

        def rows(sql: str) -> list[Any]:
            with engine.connect() as conn:
                return list(conn.execute(text(sql)).all())

        try:
            yield url, rows
        finally:
            engine.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_worker_killed_right_after_the_last_childs_end(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The worker dies right after the last child's final commit: that commit woke the
    parent (`pending`, no lease) although nothing ran after it; two workers finish it.
    The boundary is found by bisection on DURABLE_AGENT_CRASH_AFTER (one worker, one run at
    a time: the same boundaries every time)."""
    model = readers_script(tmp_path / "s.json")
    ref = reference(tmp_path, env, model)
    n = [0]

    def ended(k: int) -> bool:
        """Killed at boundary k (or not at all): had every child ended?"""
        n[0] += 1
        with pg_store() as (url, rows):
            e = {**env, "DURABLE_AGENT_DB": url}
            start(e, folder(tmp_path, f"probe{n[0]}"), model, "--detach")
            r = worker(e, tmp_path, crash_after=k)
            return (
                r.returncode == 0
                or rows("SELECT COUNT(*) FROM runs WHERE parent_id = 'p' AND status = 'completed'")[
                    0
                ][0]
                == 3
            )

    low, high = 1, 256  # not ended at `low`, ended at `high`
    assert ended(high) and not ended(low)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if ended(mid) else (mid, high)
    with pg_store() as (url, rows):
        e = {**env, "DURABLE_AGENT_DB": url, "DURABLE_AGENT_LEASE_SECONDS": "3"}
        start(e, folder(tmp_path, "ws"), model, "--detach")
        r = worker(e, tmp_path, crash_after=high)
        assert r.returncode == -signal.SIGKILL, r.stderr
        # Woken by the child's own commit: no claim ran since.
        assert rows("SELECT status, lease_owner FROM runs WHERE id = 'p'") == [("pending", None)]
        workers = Workers(e, url, tmp_path / "logs")
        try:
            for _ in range(2):
                workers.start("--poll", "0.05")
            wait_for(
                lambda: rows("SELECT 1 FROM runs WHERE id = 'p' AND status = 'completed'"),
                90,
                "the parent to complete",
            )
        finally:
            workers.kill_all()
        pg_once(rows)
        assert pg_ledger(rows) == ref["ledger"]
        assert pg_tokens(rows) == ref["tokens"]


@pytest.mark.slow
@pytest.mark.postgres
def test_two_postgres_workers_one_killed_in_a_child(tmp_path: Path, env: dict[str, str]) -> None:
    model = readers_script(tmp_path / "s.json", slow="beta", delay=2.0)
    ref = reference(tmp_path, env, model)
    with pg_store() as (url, rows):
        e = {**env, "DURABLE_AGENT_DB": url, "DURABLE_AGENT_LEASE_SECONDS": "3"}
        start(e, folder(tmp_path, "ws"), model, "--detach")
        workers = Workers(e, url, tmp_path / "logs")
        try:
            procs = [workers.start("--poll", "0.05") for _ in range(2)]
            # beta's slow answer is being made: the parent waits, holding nothing.
            running = wait_for(
                lambda: rows(
                    "SELECT c.lease_owner FROM runs p JOIN runs c ON c.parent_id = p.id "
                    "WHERE p.id = 'p' AND p.status = 'waiting' AND p.lease_owner IS NULL "
                    "AND c.task = 'read beta' AND c.status = 'running' AND EXISTS "
                    "(SELECT 1 FROM steps s WHERE s.run_id = c.id AND s.kind = 'tool' "
                    "AND s.state = 'completed')"
                ),
                60,
                "the parent waiting while beta runs",
            )
            pid = owner_pid(running[0][0])
            victim = next(p for p in procs if p.pid == pid)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            # The other worker takes beta over (its owner is a dead process of this host),
            # and the parent after it.
            wait_for(
                lambda: rows("SELECT 1 FROM runs WHERE id = 'p' AND status = 'completed'"),
                90,
                "the parent to complete",
            )
            assert rows("SELECT resume_count > 0 FROM runs WHERE task = 'read beta'") == [(True,)]
        finally:
            workers.kill_all()
        pg_once(rows)
        assert pg_ledger(rows) == ref["ledger"]
        assert pg_tokens(rows) == ref["tokens"]


@pytest.mark.slow
def test_cancel_of_a_waiting_parent_cancels_its_children(
    tmp_path: Path, env: dict[str, str]
) -> None:
    model = readers_script(tmp_path / "s.json", slow="alpha", delay=6.0)
    db = tmp_path / "w.db"
    url = f"sqlite:///{db}"
    e = {**env, "DURABLE_AGENT_DB": url}
    ws = folder(tmp_path, "ws")
    start(e, ws, model, "--detach")
    workers = Workers(e, url, tmp_path / "logs")
    try:
        proc = workers.start("--poll", "0.05", "--once")
        wait_for(
            lambda: query(
                db,
                "SELECT 1 FROM runs p JOIN runs c ON c.parent_id = p.id WHERE p.id = 'p' "
                "AND p.status = 'waiting' AND c.status = 'running'",
            ),
            60,
            "the parent waiting while alpha runs",
        )
        # `waiting` where runs are listed (alpha's answer takes 6 s: still waiting).
        listed = forked_cli.run(["list", "--status", "waiting"], env=e, cwd=ws).stdout
        assert "p " in listed and "waiting" in listed, listed
        shown = forked_cli.run(["show", "p"], env=e, cwd=ws).stdout
        assert "waits for its child runs" in shown and "  p  waiting" in shown, shown
        queued = forked_cli.run(["queue"], env=e, cwd=ws).stdout
        assert "waiting for its child runs" in queued, queued
        r = forked_cli.run(["cancel", "p"], env=e, cwd=ws)
        assert r.returncode == 0, r.stderr
        assert "run p cancelled" in r.stdout and "cancelled with it" in r.stdout
        # At once: the parent (nobody executes it) and the children not begun; alpha stops
        # at its next step boundary.
        assert query(db, "SELECT status FROM runs WHERE id = 'p'") == [("cancelled",)]
        assert proc.wait(timeout=60) == 0  # nothing left: the parent is not waiting forever
    finally:
        workers.kill_all()
    assert query(db, "SELECT status FROM runs WHERE parent_id = 'p'") == [("cancelled",)] * 3
    assert query(db, "SELECT status FROM runs WHERE id = 'p'") == [("cancelled",)]


@pytest.mark.slow
def test_workspace_root_children_run_in_their_parents_folder_or_copy(
    tmp_path: Path, env: dict[str, str]
) -> None:
    children = {
        "read alpha": [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "alpha.txt"}}]},
            {"content": "alpha read"},
        ],
        "edit a copy": [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "beta.txt", "content": "B"}}
                ]
            },
            {"content": "copy edited"},
        ],
    }
    script = {
        "*": [
            {
                "tool_calls": [
                    {"name": "delegate", "arguments": {"task": "read alpha"}},
                    {"name": "delegate", "arguments": {"task": "edit a copy", "workspace": "copy"}},
                ]
            },
            {"content": "done"},
        ],
        **children,
    }
    path = tmp_path / "s.json"
    path.write_text(json.dumps(script))
    db, root = tmp_path / "w.db", tmp_path / "root"
    e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}", "XDG_DATA_HOME": str(tmp_path / "data")}
    start(e, folder(tmp_path, "ws"), f"scripted:{path}", "--detach")
    r = worker(e, tmp_path, "--workspace-root", str(root))
    assert r.returncode == 0, r.stderr
    assert query(db, "SELECT status, answer FROM runs WHERE id = 'p'") == [("completed", "done")]
    kids = dict(query(db, "SELECT task, id FROM runs WHERE parent_id = 'p'"))
    # The shared child read the parent's file where the parent ran: ROOT/p.
    out = query(
        db,
        "SELECT output FROM steps WHERE run_id = ? AND kind = 'tool'",
        kids["read alpha"],
    )
    assert json.loads(out[0][0])["result"].startswith("alpha"), out
    assert sorted(p.name for p in root.iterdir()) == ["p"]  # no ROOT/CHILD_ID
    copy = tmp_path / "data" / "durable-agent" / "copies" / kids["edit a copy"]
    # The copy child wrote in its copy: its change came back as a diff in the parent's
    # observation, and the copy was removed once that was recorded.
    (observed,) = query(
        db, "SELECT output FROM steps WHERE run_id = 'p' AND kind = 'delegate' AND input LIKE ?",
        "%edit a copy%",
    )  # fmt: skip
    assert "+B" in json.loads(observed[0])["result"] and "beta.txt" in observed[0], observed
    assert not copy.exists()
    assert (root / "p" / "beta.txt").read_text() == "beta"  # the parent's files untouched
    assert query(db, "SELECT workspace FROM runs WHERE id = ?", kids["edit a copy"]) == [
        (str(copy),)
    ]


@pytest.mark.slow
def test_a_worker_parent_of_a_blocked_child_is_blocked_and_goes_on_after_approve(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The child blocks (a command to approve): its end wakes the waiting parent, which
    stops blocked with the child's question. `approve p`, `resume p --detach`: the worker's
    parent queues the answered child, waits again, and completes."""
    command = "touch made.txt"
    script = {
        "*": [
            {
                "tool_calls": [
                    {
                        "name": "delegate",
                        "arguments": {"task": "make it", "workspace": "shared-write"},
                    }
                ]
            },
            {"content": "parent done"},
        ],
        "make it": [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
            {"content": "made"},
        ],
    }
    path = tmp_path / "s.json"
    path.write_text(json.dumps(script))
    db = tmp_path / "w.db"
    e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}"}
    ws = folder(tmp_path, "ws")
    start(e, ws, f"scripted:{path}", "--detach")
    r = worker(e, tmp_path)
    assert r.returncode == 0, r.stderr
    assert query(db, "SELECT status, stop_reason FROM runs ORDER BY id") == [
        ("blocked", "approval_required"),
        ("blocked", "approval_required"),
    ]
    assert (
        f"approval_required for {command}"
        in query(db, "SELECT error FROM runs WHERE id = 'p'")[0][0]
    )
    a = forked_cli.run(["approve", "p"], env=e, cwd=ws)
    assert a.returncode == 0, a.stderr
    r = forked_cli.run(["resume", "p", "--detach"], env=e, cwd=ws)
    assert r.returncode == 0, r.stderr
    r = worker(e, tmp_path)
    assert r.returncode == 0, r.stderr
    assert query(db, "SELECT status, answer FROM runs WHERE id = 'p'") == [
        ("completed", "parent done")
    ]
    assert (ws / "made.txt").exists()
    assert query(db, "SELECT COUNT(*) FROM runs") == [(2,)]
    assert query(db, "SELECT content FROM messages WHERE run_id = 'p' AND role = 'tool'") == [
        ("made",)
    ]
    shown = forked_cli.run(["list", "--status", "waiting"], env=e, cwd=ws)
    assert shown.returncode == 0, shown.stderr


@pytest.mark.slow
def test_a_persons_resume_of_a_waiting_parent_runs_its_children_here(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The worker is killed while the parent waits (a child mid-run); `durable-agent resume
    p` in the foreground runs the children not ended in its process, as before."""
    model = readers_script(tmp_path / "s.json", slow="alpha", delay=2.0)
    ref = reference(tmp_path, env, model)
    db = tmp_path / "w.db"
    url = f"sqlite:///{db}"
    e = {**env, "DURABLE_AGENT_DB": url}
    ws = folder(tmp_path, "ws")
    start(e, ws, model, "--detach")
    workers = Workers(e, url, tmp_path / "logs")
    try:
        proc = workers.start("--poll", "0.05")
        wait_for(
            lambda: query(
                db,
                "SELECT 1 FROM runs p JOIN runs c ON c.parent_id = p.id WHERE p.id = 'p' "
                "AND p.status = 'waiting' AND c.status = 'running'",
            ),
            60,
            "the parent waiting while alpha runs",
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        workers.kill_all()
    r = forked_cli.run(["resume", "p", "--quiet"], env=e, cwd=ws, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "all read", r.stderr
    check_once(db, "p")
    assert ledger(db, "p") == ref["ledger"]
    assert tokens(db) == ref["tokens"]


def test_batch_cancel_reaches_the_tasks_grandchildren(
    tmp_path: Path, env: dict[str, str], store_url: str
) -> None:
    """`batch cancel` ends a task's whole tree: its children's children too, not only the
    runs it delegated to directly; a run outside the batch is left as it was."""
    from sqlalchemy import text

    from durable_agent.store import fleet
    from durable_agent.store.engine import open_store_engine

    queued(tmp_path, {**env, "DURABLE_AGENT_DB": store_url}, *("t", "c", "g", "g2", "u"))
    engine = open_store_engine(store_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE runs SET status = 'waiting' WHERE id IN ('t', 'c')"))
            conn.execute(text("UPDATE runs SET parent_id = 't', parent_step = 1 WHERE id = 'c'"))
            conn.execute(
                text("UPDATE runs SET parent_id = 'c', parent_step = 1 WHERE id IN ('g', 'g2')")
            )
            conn.execute(text("UPDATE runs SET status = 'running' WHERE id = 'g2'"))
        batch, made = fleet.open_batch(engine, "b1", "b", str(tmp_path), None)
        assert made
        fleet.add_task(engine, batch.id, "task", "t", 0, {})
        assert fleet.cancel_batch(engine, batch.id) == (3, 1)
        with engine.connect() as conn:
            got = dict(conn.execute(text("SELECT id, status FROM runs")).all())
            asked = conn.execute(text("SELECT id FROM runs WHERE cancel_requested")).all()
        assert got == {
            "t": "cancelled",
            "c": "cancelled",
            "g": "cancelled",
            "g2": "running",
            "u": "pending",
        }
        assert asked == [("g2",)]
    finally:
        engine.dispose()
