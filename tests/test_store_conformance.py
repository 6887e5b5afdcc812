"""One suite over every way into the store, on SQLite and on PostgreSQL alike (as LangGraph
runs one suite over every checkpointer): the same rows in, the same records out.

Every test takes `backend`, parametrized by conftest's `store_url` (an SQLite file, an
empty PostgreSQL schema), and holds the store to expectations written once. The reads
with two ways (`list` and `show`: the standard library's on SQLite, store/sqlite_reads.py,
and SQLAlchemy's) are run both ways on the same data and must agree (`assert_reads_agree`);
the checkpoint's statements below Core (store/prepared.py) must write what Core writes.
The last tests break each fast path on purpose and show the suite fails.
"""

from __future__ import annotations

import ast
import json
import math
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, insert, select, update

from durable_agent.errors import LeaseLost, RunBusy, RunNotFound, UsageError
from durable_agent.messages import Message, ToolCall
from durable_agent.status import StepKind
from durable_agent.store import prepared, sqlite_reads
from durable_agent.store.blobs import (
    BlobStore,
    TreeAt,
    TreeLink,
    TreeRow,
    WorkspaceWrite,
    changes_statement,
    first_tree,
    save_statements,
    step_trees,
    tree_at,
)
from durable_agent.store.engine import open_store_engine
from durable_agent.store.forks import fork_run
from durable_agent.store.journal import Journal
from durable_agent.store.payloads import Unknown, decode_output
from durable_agent.store.prepared import Prepared
from durable_agent.store.queue import Queue
from durable_agent.store.reads import Reads, RunReads
from durable_agent.store.records import FileChange, StepState
from durable_agent.store.retrying import StorePolicy
from durable_agent.store.rows import utcnow
from durable_agent.store.runs import Store
from durable_agent.store.schema import runs, steps
from durable_agent.store.step import STEP_COLUMNS, Counters
from durable_agent.store.storable import storable

POLICY = StorePolicy(max_attempts=2, max_seconds=5.0)
LEASE = 30.0
ZERO = Counters(0, 0, 0, 0, 0, 0)
WHEN = datetime(2026, 11, 30, 12, 34, 56, 789012)
LATER = datetime(2099, 1, 1, 0, 0, 0, 123456)  # after every run the tests create


class Backend:
    """One store on one dialect, and the ways to read it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: Engine = open_store_engine(url)
        self.store = Store(self.engine, POLICY)
        self.sqlite = self.engine.dialect.name == "sqlite"

    def create(
        self,
        *,
        task: str = "a task",
        settings: dict[str, Any] | None = None,
        first: tuple[Message, ...] = (Message("system", "be brief"), Message("user", "go")),
        lease: str | None = None,
        run_id: str | None = None,
    ) -> str:
        run_id = run_id or uuid.uuid4().hex
        self.store.create_run(
            run_id,
            task=task,
            workspace="/w",
            model="m",
            settings=settings if settings is not None else {"max_steps": 3},
            first_messages=first,
            lease=(lease, LEASE) if lease else None,
        )
        return run_id

    def journal(self, run_id: str, owner: str, epoch: int) -> Journal:
        return Journal(self.engine, run_id, owner, epoch, LEASE, policy=POLICY)

    def ways(self) -> list[RunReads]:
        """Every implementation of `RunReads` on this store: the Store itself, and `Reads`
        with and without the standard library's way (the only way that differs on SQLite)."""
        return [
            self.store,
            Reads(self.url, lambda: self.store, plain=False),
            Reads(self.url, lambda: self.store, plain=True),
        ]


@pytest.fixture
def backend(store_url: str) -> Iterator[Backend]:
    b = Backend(store_url)
    yield b
    b.engine.dispose()


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 == True == 1.0 in Python)."""
    return bool(a == b and repr(a) == repr(b))


def assert_reads_agree(b: Backend, run_ids: list[str]) -> None:
    """Every way of `list` and `show` gives the same records; on SQLite the standard
    library's way answers them itself (it does not leave them to SQLAlchemy's)."""
    ways = b.ways()
    if b.sqlite:
        assert sqlite_reads.list_runs(b.url, status=None, limit=5) is not None
        for run_id in run_ids:
            assert sqlite_reads.show(b.url, run_id) is not None, run_id
    statuses = {r.status for r in b.store.list_runs(limit=1000)}
    for status in (None, *sorted(statuses), "completed"):
        for limit in (1, 1000):
            listed = [w.list_runs(status=status, limit=limit) for w in ways]
            assert all(same(x, listed[0]) for x in listed), (status, limit)
    for run_id in run_ids:
        for spelled in (run_id, run_id[:12]):
            shown = [w.show(spelled) for w in ways]
            assert all(same(x, shown[0]) for x in shown), run_id
            assert shown[0][0].id == run_id


# -- runs ---------------------------------------------------------------------------------------


def test_a_new_run_reads_back_as_it_was_created(backend: Backend) -> None:
    b = backend
    first = (Message("system", "be brief"), Message("user", "gö"))
    run_id = b.create(task="tåsk", settings={"max_steps": 3, "nested": [1, None]}, first=first)
    run = b.store.get_run(run_id)
    assert (run.id, run.task, run.workspace, run.model) == (run_id, "tåsk", "/w", "m")
    assert (run.status, run.lease_owner, run.lease_epoch, run.cancel_requested) == (
        "pending",
        None,
        0,
        False,
    )
    assert run.settings == {"max_steps": 3, "nested": [1, None]}
    assert (run.step_count, run.message_count, run.prompt_tokens, run.active_ms) == (0, 2, 0, 0)
    assert run.created_at == run.updated_at and run.finished_at is None
    assert [(m.role, m.content, m.seq) for m in b.store.messages(run_id)] == [
        ("system", "be brief", 0),
        ("user", "gö", 1),
    ]
    assert b.store.run_exists(run_id) and not b.store.run_exists("nope")
    assert b.store.steps(run_id) == [] and b.store.approvals(run_id) == []
    assert b.store.pending_approval(run_id) is None
    leased = b.create(lease="owner-1")
    run = b.store.get_run(leased)
    assert (run.status, run.lease_owner, run.lease_epoch) == ("running", "owner-1", 1)
    assert run.lease_expires_at is not None and run.lease_expires_at > run.created_at
    assert_reads_agree(b, [run_id, leased])


def test_ids_and_prefixes_are_found_or_refused_alike(backend: Backend) -> None:
    b = backend
    a = b.create(run_id="abc_1%" + "x" * 20)
    b.create(run_id="abd" + "y" * 20)
    b.create(run_id="abd" + "z" * 20)
    for ways in b.ways():
        assert ways.show(a[:4])[0].id == a
    assert b.store.find_run_id(a) == a and b.store.find_run_id("abc_") == a
    assert b.store.find_run_id("abc_1%") == a  # the pattern's own characters are literal
    with pytest.raises(RunNotFound):
        b.store.find_run_id("abc%")
    with pytest.raises(UsageError, match="ambiguous"):
        b.store.find_run_id("abd")
    for prefix in ("", "\udcff", "q" * 2000, "nope"):
        with pytest.raises(RunNotFound):
            b.store.find_run_id(prefix)
    for w in b.ways():
        with pytest.raises(UsageError, match="ambiguous"):
            w.show("abd")
        with pytest.raises(RunNotFound):
            w.show("nope")
        with pytest.raises(RunNotFound):
            b.store.get_run("nope")


def test_runs_are_listed_newest_first_by_status_and_limit(backend: Backend) -> None:
    b = backend
    ids = [b.create(task=f"t{i}") for i in range(4)]
    # Two runs created in the same microsecond are ordered by id, both ways.
    with b.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id.in_(ids[2:])).values(created_at=LATER))
        conn.execute(update(runs).where(runs.c.id == ids[0]).values(status="failed"))
    order = sorted(ids[2:], reverse=True) + [ids[1], ids[0]]
    assert [r.id for r in b.store.list_runs()] == order
    assert [r.id for r in b.store.list_runs(limit=2)] == order[:2]
    assert [r.id for r in b.store.list_runs(status="failed")] == [ids[0]]
    assert b.store.list_runs(status="completed") == []
    assert_reads_agree(b, ids)


def test_settings_and_tool_sources(backend: Backend) -> None:
    b = backend
    run_id = b.create()
    b.store.update_settings(run_id, {"max_steps": 9, "odd": "a\x00b"})
    assert b.store.get_run(run_id).settings == {"max_steps": 9, "odd": "a\\x00b"}
    assert b.store.tool_sources(run_id) is None
    assert b.store.record_tool_sources(run_id, {"mcp": ["x"]}) == {"mcp": ["x"]}
    assert b.store.record_tool_sources(run_id, {"mcp": ["other"]}) == {"mcp": ["x"]}  # first wins
    assert b.store.tool_sources(run_id) == {"mcp": ["x"]}


def test_a_user_query_gives_columns_and_rows(backend: Backend) -> None:
    b = backend
    run_id = b.create()
    columns, rows = b.store.query(
        "SELECT run_id, status, step_rows FROM run_totals WHERE run_id = :r", {"r": run_id}
    )
    assert (columns, rows) == (["run_id", "status", "step_rows"], [(run_id, "pending", 0)])


# -- the journal: a run under a lease ---------------------------------------------------------


def test_a_run_from_its_lease_to_its_end(backend: Backend) -> None:
    b = backend
    run_id = b.create()
    owner = "owner-a"
    epoch = b.store.acquire_lease(run_id, owner, LEASE)
    assert epoch == 1 and b.store.get_run(run_id).status == "running"
    j = b.journal(run_id, owner, epoch)
    loaded = j.load()
    assert (loaded.next_seq, loaded.open_steps, loaded.compactions) == (0, [], [])
    assert [m.content for m in loaded.messages] == ["be brief", "go"]
    assert loaded.model_tokens == (0, 0) and loaded.last_model_output == Unknown(None)  # none yet

    # A model step: intent, then outcome with its message and the run's totals.
    call = ToolCall("c1", "read_file", '{"path": "a.txt"}')
    usage = {"usage": {"prompt_tokens": 10}, "context": {"n": 1}}
    with j.step("model:0", "model", {"turn": 0}, turn=0) as model:
        assert b.store.steps(run_id)[0].state == StepState.STARTED
        model.complete(
            usage,
            counters=Counters(1, 0, 10, 5, 3, 40),
            messages=[Message("assistant", None, (call,))],
            tokens=(10, 5),
        )
    # A read: nothing is written until the next commit carries it.
    read = j.find("read:c1", "tool", turn=1, call_id="c1", tool_name="read_file", effect="read")
    read.defer().complete(
        {"content": "x"},
        counters=Counters(1, 1, 10, 5, 4, 41),
        messages=[Message("tool", "x", tool_call_id="c1")],
    )
    assert len(b.store.steps(run_id)) == 1
    # A command: intent, its process group, a retry inside it, a failure.
    command = j.find("exec:c2", "tool", turn=1, call_id="c2", tool_name="run_command")
    command.start({"command": "ls"})
    assert command.set_pgid(4242) == j.start_deadline()
    assert b.store.steps(run_id)[2].pgid == 4242
    command.clear_pgid()
    command.set_attempts(2, "transient")
    assert (b.store.steps(run_id)[2].attempts, b.store.steps(run_id)[2].error) == (2, "transient")
    command.fail("boom", counters=Counters(1, 2, 10, 5, 4, 42))

    found = b.store.steps(run_id)
    assert [(s.seq, s.kind, s.state, s.idempotency_key) for s in found] == [
        (0, "model", "completed", "model:0"),
        (1, "tool", "completed", "read:c1"),
        (2, "tool", "failed", "exec:c2"),
    ]
    assert found[0].output == usage and found[0].input == {"turn": 0}
    assert (found[0].prompt_tokens, found[0].completion_tokens) == (10, 5)
    assert (found[1].call_id, found[1].tool_name, found[1].effect) == ("c1", "read_file", "read")
    assert (found[2].error, found[2].pgid, found[2].input) == ("boom", None, {"command": "ls"})
    assert all(s.lease_epoch == 1 and s.finished_at is not None for s in found)
    assert [(m.seq, m.role, m.step_seq) for m in b.store.messages(run_id)] == [
        (0, "system", None),
        (1, "user", None),
        (2, "assistant", 0),
        (3, "tool", 1),
    ]
    assert b.store.messages(run_id)[2].tool_calls == [call.to_dict()]
    run = b.store.get_run(run_id)
    assert (run.step_count, run.tool_call_count, run.prompt_tokens, run.completion_tokens) == (
        1,
        2,
        10,
        5,
    )
    assert (run.message_count, run.active_ms) == (4, 42)
    assert j.recorded("exec:c2") == found[2] and j.completed("exec:c2") is None
    assert j.completed("model:0") == found[0] and j.recorded("nope") is None
    assert j.step_failed("exec:c2")
    assert_reads_agree(b, [run_id])

    # The heartbeat extends the lease and carries a cancel request back.
    before = b.store.get_run(run_id).lease_expires_at
    assert j.heartbeat() is False
    assert b.store.get_run(run_id).lease_expires_at >= before  # type: ignore[operator]
    assert b.store.cancel(run_id) == "requested"  # the lease is live: the run stops itself
    assert j.cancel_requested() and j.cancel_requested(once=True) and j.heartbeat() is True

    j.finish_run(
        status="cancelled",
        stop_reason="cancelled",
        answer="ä",
        error=None,
        counters=Counters(1, 2, 10, 5, 4, 50),
    )
    run = b.store.get_run(run_id)
    assert (run.status, run.stop_reason, run.answer, run.lease_owner, run.active_ms) == (
        "cancelled",
        "cancelled",
        "ä",
        None,
        50,
    )
    assert run.finished_at is not None
    assert_reads_agree(b, [run_id])


def test_a_resumed_run_loads_what_its_last_session_left(backend: Backend) -> None:
    b = backend
    run_id = b.create()
    j = b.journal(run_id, "first", b.store.acquire_lease(run_id, "first", LEASE))
    j.load()
    outputs = []
    for turn in range(3):
        out = {"usage": {"estimated": turn == 2}, "context": {"turn": turn}}
        outputs.append(out)
        j.step(f"model:{turn}", "model", {}, turn=turn).complete(
            out, counters=ZERO, tokens=(turn, 1)
        )
    j.step("compact:3", "compact", {}, turn=3).complete(
        {"summary": "s"}, counters=ZERO, tokens=(5, 5)
    )
    j.step("exec:4", "tool", {"command": "x"}, turn=4)  # cut off: no outcome
    j.release_lease()
    expires = b.store.get_run(run_id).lease_expires_at
    assert expires is not None and expires <= utcnow()  # the next owner need not wait

    epoch, stood = b.store.take_over(run_id, "second", LEASE)
    assert epoch == 2 and stood == ("running", None, None, None)
    with pytest.raises(LeaseLost):  # the first session is fenced out
        j.step("model:5", "model", {}, turn=5)
    again = b.journal(run_id, "second", epoch)
    loaded = again.load()
    assert loaded.next_seq == 5 and [s.idempotency_key for s in loaded.open_steps] == ["exec:4"]
    assert loaded.model_tokens == (0 + 1 + 2 + 5, 3 + 5)
    assert loaded.compactions == [{"summary": "s"}]
    # The last one whose counts were reported, decoded once by the store (store/payloads.py).
    assert loaded.last_model_output == decode_output(StepKind.MODEL, outputs[1])
    step = again.find("exec:4", "tool", turn=4)
    assert step.prior is not None and step.seq == 4
    step.start({"command": "x"}).complete({"exit": 0}, counters=ZERO)
    assert b.store.steps(run_id)[4].attempts == 2 and b.store.steps(run_id)[4].lease_epoch == 2
    with pytest.raises(RunBusy):
        b.store.take_over(run_id, "third", LEASE)
    assert b.store.take_over(run_id, "second", LEASE)[0] == 2  # its own lease: a lost answer
    assert_reads_agree(b, [run_id])


def test_approvals_are_asked_decided_and_used_once(backend: Backend) -> None:
    b = backend
    run_id = b.create()
    j = b.journal(run_id, "o", b.store.acquire_lease(run_id, "o", LEASE))
    j.load()
    step = j.step("exec:c1", "tool", {"command": "rm x"}, turn=0)
    j.request_approval(
        call_id="c1",
        kind="approval_required",
        tool_name="run_command",
        command="rm x",
        reason="why\x00",
        step_seq=step.seq,
    )
    j.request_approval(  # asked again while pending: still one question
        call_id="c1",
        kind="approval_required",
        tool_name="run_command",
        command="rm x",
        reason="r",
        step_seq=0,
    )
    pending = b.store.pending_approval(run_id)
    assert pending is not None and b.store.approvals(run_id) == [pending]
    assert (pending.call_id, pending.kind, pending.command, pending.reason) == (
        "c1",
        "approval_required",
        "rm x",
        "why\\x00",
    )
    assert pending.decision is None and pending.step_seq == 0
    assert j.approval_for("c1", "approval_required") == pending
    b.store.decide_approval(pending.id, approved=True, by="ann", restore=True)
    decided = j.approval_for("c1", "approval_required")
    assert decided is not None and (decided.decision, decided.decided_by) == ("approved", "ann")
    assert decided.restore_workspace is True and b.store.pending_approval(run_id) is None
    step.complete({"exit": 0}, counters=ZERO, use_approval=pending.id)
    assert j.approval_for("c1", "approval_required") is None  # used
    used = j.approval_for("c1", "approval_required", used_too=True)
    assert used is not None and used.used_at is not None

    j.request_approval(
        call_id="c2",
        kind="uncertain_side_effect",
        tool_name="t",
        command=None,
        reason="r",
        step_seq=None,
    )
    second = b.store.pending_approval(run_id)
    assert second is not None and second.command is None and second.step_seq is None
    j.settle_approval(second.id, by="policy")
    b.store.decide_approval(second.id, approved=False, by="bob")  # a later decision wins
    assert [(a.call_id, a.decision, a.decided_by) for a in b.store.approvals(run_id)] == [
        ("c1", "approved", "ann"),
        ("c2", "denied", "bob"),
    ]
    assert_reads_agree(b, [run_id])


def test_cancel_and_requeue_a_run_not_executing(backend: Backend) -> None:
    b = backend
    run_id = b.create()
    assert b.store.cancel(run_id) == "cancelled"
    run = b.store.get_run(run_id)
    assert (run.status, run.stop_reason, run.cancel_requested) == ("cancelled", "cancelled", False)
    b.store.requeue(run_id, settings={"max_steps": 1})
    run = b.store.get_run(run_id)
    assert (run.status, run.stop_reason, run.finished_at, run.settings) == (
        "pending",
        None,
        None,
        {"max_steps": 1},
    )
    live = b.create(lease="someone")
    with pytest.raises(RunBusy):
        b.store.requeue(live)
    with pytest.raises(RunNotFound):
        b.store.cancel("nope")
    with b.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == run_id).values(status="completed"))
    with pytest.raises(UsageError, match="already completed"):
        b.store.cancel(run_id)
    assert_reads_agree(b, [run_id, live])


def test_a_requeue_checks_the_status_it_was_asked_for(backend: Backend) -> None:
    # `resume --detach` and the view check a run, then queue it: a run cancelled (or
    # completed) by another process between the two is not queued, its cancel undone.
    b = backend
    run_id = b.create()
    with b.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == run_id).values(status="failed"))
    assert b.store.cancel(run_id) == "cancelled"  # meanwhile, after the check saw `failed`
    with pytest.raises(UsageError, match="is cancelled now .failed when it was checked"):
        b.store.requeue(run_id, if_status="failed")
    run = b.store.get_run(run_id)
    assert (run.status, run.stop_reason) == ("cancelled", "cancelled")
    b.store.requeue(run_id, if_status="cancelled")  # what was checked: queued
    assert b.store.get_run(run_id).status == "pending"


def test_the_queue_claims_releases_and_takes_over(backend: Backend) -> None:
    b = backend
    queue = Queue(b.engine, POLICY)
    assert queue.claim("w1", LEASE).claim is None
    first = b.create(settings={"max_steps": 2})
    claimed = queue.claim("w1", LEASE, exclude=()).claim
    assert claimed is not None and (claimed.run_id, claimed.epoch, claimed.takeover) == (
        first,
        1,
        False,
    )
    assert claimed.settings == {"max_steps": 2} and claimed.workspace == "/w"
    assert queue.claim("w2", LEASE).claim is None  # held
    assert queue.claim("w2", LEASE, max_running=1).at_limit
    assert queue.release(first, "w1", 1, note="later")
    assert not queue.release(first, "w1", 1)  # no longer ours
    run = b.store.get_run(first)
    assert (run.status, run.error, run.lease_owner) == ("pending", "later", None)
    rejected = queue.claim("w2", LEASE, accept=lambda _w: False)
    assert rejected.claim is None and [r.run_id for r in rejected.rejected] == [first]
    again = queue.claim("w2", LEASE).claim
    assert again is not None and again.epoch == 2
    with b.engine.begin() as conn:  # its worker died: the lease runs out
        conn.execute(
            update(runs).where(runs.c.id == first).values(lease_expires_at=WHEN - timedelta(days=1))
        )
    taken = queue.claim("w3", LEASE).claim
    assert taken is not None and taken.takeover and taken.previous_owner == "w2"
    assert taken.epoch == 3
    assert_reads_agree(b, [first])


# -- workspace snapshots ------------------------------------------------------------------------


def test_snapshots_blobs_trees_and_step_changes(backend: Backend) -> None:
    b = backend
    run_id = b.create()
    blobs = BlobStore(b.engine, POLICY, run_id)
    data = bytes(range(256)) * 3
    base = TreeRow("t0", None, 0, 1, b"\x00manifest", '{"commit": "c"}')
    save_statements(
        b.engine,
        [blobs.blob_statement({"h1": data, "h2": b""}), blobs.tree_statement(base)],
        POLICY,
    )
    save_statements(b.engine, [blobs.blob_statement({"h1": data})], POLICY)  # present: no conflict
    assert blobs.present_blobs(["h1", "h2", "h3"]) == {"h1", "h2"}
    assert blobs.blob("h1") == data and blobs.blob("h2") == b""
    with pytest.raises(KeyError):
        blobs.blob("h3")
    assert first_tree(b.engine, run_id) is None and tree_at(b.engine, run_id) is None

    j = b.journal(run_id, "o", b.store.acquire_lease(run_id, "o", LEASE))
    j.load()
    step = j.find("write:c1", "tool", turn=0, call_id="c1", tool_name="write_file", effect="write")
    step.start({"path": "a"}, workspace=WorkspaceWrite([], {"tree_before": "t0"}))
    delta = TreeRow("t1", "t0", 1, 2, b"delta")
    rows = [
        {"run_id": run_id, "seq": step.seq, "path": "b/é.txt", "change": "added", "bytes": 5},
        {"run_id": run_id, "seq": step.seq, "path": "a.txt", "change": "modified", "bytes": None},
    ]
    step.complete(
        {"ok": True},
        counters=ZERO,
        workspace=WorkspaceWrite(
            [blobs.tree_statement(delta), changes_statement(rows)], {"tree_id": "t1"}
        ),
    )
    assert blobs.stored([], ["t0", "t1", "t9", ""])[1] == {"t0": 0, "t1": 1}
    assert blobs.tree_chain("t1") == [
        TreeLink("t0", b"\x00manifest", '{"commit": "c"}'),
        TreeLink("t1", b"delta", None),
    ]
    with pytest.raises(KeyError):
        blobs.tree_chain("t9")
    assert step_trees(b.engine, run_id, 0) == ("t0", "t1")
    assert step_trees(b.engine, run_id, 7) is None
    assert tree_at(b.engine, run_id) == TreeAt("t1", 0, True)
    assert tree_at(b.engine, run_id, -1) == TreeAt("t0", 0, False)  # before any: as found
    assert first_tree(b.engine, run_id) == "t0"
    assert b.store.has_step_changes()
    assert b.store.step_changes(run_id) == {
        0: [FileChange("a.txt", "modified", None), FileChange("b/é.txt", "added", 5)]
    }
    assert b.store.step_changes("nope") == {}
    assert_reads_agree(b, [run_id])


def test_a_fork_copies_the_history_up_to_its_step(backend: Backend) -> None:
    b = backend
    source = b.create()
    j = b.journal(source, "o", b.store.acquire_lease(source, "o", LEASE))
    j.load()
    for turn in range(3):
        j.step(f"model:{turn}", "model", {}, turn=turn).complete(
            {"n": turn}, counters=ZERO, messages=[Message("assistant", f"a{turn}")]
        )
    fork_run(b.engine, source, 1, "forked", workspace="/elsewhere", settings=None, task=None)
    run = b.store.get_run("forked")
    assert (run.forked_from, run.fork_seq, run.status, run.workspace) == (
        source,
        1,
        "pending",
        "/elsewhere",
    )
    assert [s.output for s in b.store.steps("forked")] == [{"n": 0}, {"n": 1}]
    assert [m.content for m in b.store.messages("forked")] == ["be brief", "go", "a0", "a1"]
    assert_reads_agree(b, [source, "forked"])


# -- the web view's reads -----------------------------------------------------------------------


def test_pages_of_runs_by_keyset_and_steps_from_a_seq(backend: Backend) -> None:
    b = backend
    ids = [b.create(task=task) for task in ("Fix the BUG", "100% done", "snake_case", "other")]
    with b.engine.begin() as conn:
        for i, run_id in enumerate(ids):
            conn.execute(
                update(runs)
                .where(runs.c.id == run_id)
                .values(created_at=WHEN + timedelta(seconds=i // 2))  # two share a time
            )
    newest = sorted(ids[2:], reverse=True) + sorted(ids[:2], reverse=True)
    page = b.store.run_page(limit=3)
    assert [r.id for r in page] == newest[:3]
    after = (page[-1].created_at, page[-1].id)
    assert [r.id for r in b.store.run_page(after=after, limit=3)] == newest[3:]
    assert [r.id for r in b.store.run_page(needle="bug", limit=9)] == [ids[0]]
    assert [r.id for r in b.store.run_page(needle="0%", limit=9)] == [ids[1]]  # % is literal
    assert [r.id for r in b.store.run_page(needle="e_c", limit=9)] == [ids[2]]  # _ is literal
    assert [r.id for r in b.store.run_page(needle=ids[3][:10].upper(), limit=9)] == [ids[3]]
    assert b.store.run_page(status="failed", limit=9) == []

    j = b.journal(ids[0], "o", b.store.acquire_lease(ids[0], "o", LEASE))
    j.load()
    for turn in range(4):
        j.step(f"model:{turn}", "model", {}, turn=turn).complete({}, counters=ZERO)
    assert [s.seq for s in b.store.steps_from(ids[0], 2)] == [2, 3]
    assert [s.seq for s in b.store.steps_from(ids[0], 1, 2)] == [1, 2]
    assert b.store.steps_from(ids[0], 9) == []
    assert b.store.steps_from(ids[0], 0) == b.store.steps(ids[0])


# -- hostile values, every way ------------------------------------------------------------------

# Text as people, models, commands and file names give it: odd unicode, lone surrogates,
# NUL, bytes that are not UTF-8 carried with surrogateescape, control characters.
ODD_TEXT = st.text(
    st.characters(blacklist_categories=())
    | st.sampled_from(["\x00", "\ud800", "\udcff", "\u2028"]),
    max_size=30,
)
BINARYISH = st.binary(max_size=30).map(
    lambda b: b.replace(b"\x00", b"").decode("utf-8", "surrogateescape")
)
TEXT = ODD_TEXT | BINARYISH
HUGE = st.integers(-(2**200), 2**200)
# Not a float of 1e16 or more: Python writes it with an exponent, and PostgreSQL's jsonb
# keeps it as a numeric that it prints without one, so it reads back as an int, and not
# the float's exact value (1e23 becomes 10**23). NaN and the infinities are the store's
# rule's (storable: strings).
FLOAT = st.floats(allow_nan=True).filter(lambda f: math.isnan(f) or math.isinf(f) or abs(f) < 1e16)
JSON = st.recursive(
    st.none() | st.booleans() | HUGE | FLOAT | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=12,
)
# The top of a JSON column: an object or a list (as the package writes it), or a bare
# integer that fits 64 bits. Not a bare float, nor a larger integer: the JSON column's
# NUMERIC affinity makes SQLite keep such a value as a REAL, converted by its own parser,
# which is not exact (5.3290581928055855e-306 reads back as 5.329058192805586e-306).
# Inside a list or an object the number is JSON text, and exact.
TOP = (
    st.none()
    | st.integers(-(2**63), 2**63 - 1)
    | st.lists(JSON, max_size=3)
    | st.dictionaries(TEXT, JSON, max_size=3)
)
BIGINT = st.integers(0, 2**63 - 1)
INT = st.integers(0, 2**31 - 1)


def as_stored(value: Any) -> Any:
    """What the store gives back for `value` written into a JSON column: the store-boundary
    rule (store/storable.py), through JSON."""
    return storable(json.loads(json.dumps(storable(value), allow_nan=False)))


@pytest.mark.slow  # (hypothesis: seconds on 2 cores)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    task=TEXT,
    settings_=st.dictionaries(TEXT, JSON, max_size=4),
    step_input=TOP,
    step_output=TOP,
    error=st.none() | TEXT,
    content=st.none() | TEXT,
    counters=st.tuples(INT, INT, BIGINT, BIGINT, INT, BIGINT),
    tokens=st.none() | st.tuples(INT, INT),
)
@example(
    task="\x00\ud800\udcff",
    settings_={"\x00": float("nan"), "big": 2**200},
    step_input=[float("inf"), b"x".decode()],
    step_output={"k": "\\u0000"},
    error="",
    content="\x00",
    counters=(2**31 - 1, 0, 2**63 - 1, 0, 1, 2**63 - 1),
    tokens=(2**31 - 1, 0),
)
def test_hostile_values_read_back_the_same_every_way(
    backend: Backend,
    task: str,
    settings_: dict[str, Any],
    step_input: Any,
    step_output: Any,
    error: str | None,
    content: str | None,
    counters: tuple[int, ...],
    tokens: tuple[int, int] | None,
) -> None:
    b = backend
    run_id = b.create(task=task, settings=settings_, first=(Message("user", content),))
    j = b.journal(run_id, "o", b.store.acquire_lease(run_id, "o", LEASE))
    j.load()
    total = Counters(*counters)
    kept = j.step("k", "model", step_input, turn=0)
    kept.complete(
        step_output, counters=total, messages=[Message("assistant", content)], tokens=tokens
    )
    failed = j.step("f", "tool", {"x": step_input}, turn=1, tool_name=task[:100] or None)
    failed.fail(error or "e", counters=total, output=step_output)
    j.request_approval(
        call_id="c",
        kind="approval_required",
        tool_name="t",
        command=content,
        reason=task,
        step_seq=1,
    )

    run = b.store.get_run(run_id)
    assert run.task == storable(task)
    assert run.settings == as_stored(settings_)
    assert (run.step_count, run.tool_call_count, run.prompt_tokens) == counters[:3]
    assert (run.completion_tokens, run.message_count, run.active_ms) == counters[3:]
    found = b.store.steps(run_id)
    assert [s.input for s in found] == [as_stored(step_input), as_stored({"x": step_input})]
    assert [s.output for s in found] == [as_stored(step_output)] * 2
    assert found[1].error == storable(error or "e")
    assert found[1].tool_name == storable(task[:100] or None)
    assert (found[0].prompt_tokens, found[0].completion_tokens) == (tokens or (None, None))
    assert [m.content for m in b.store.messages(run_id)] == [storable(content)] * 2
    (approval,) = b.store.approvals(run_id)
    assert (approval.command, approval.reason) == (storable(content), storable(task))
    assert j.load().messages[1].content == storable(content)
    assert_reads_agree(b, [run_id])


def test_json_written_by_another_tool_reads_the_same_every_way(backend: Backend) -> None:
    """JSON text the package would not write (another tool's, by hand): the escapes of what
    a str must not carry, NaN, a bare number, text that is not JSON. Read as the store's
    rule says, every way."""
    b = backend
    spelled = {
        '{"k": "\\ud800", "n": "\\u0000"}': {"k": "\ufffd", "n": "\\x00"},
        "[NaN, 1]": ["NaN", 1],
        "7": 7,
        "not json": "not json",
    }
    for text_, expected in spelled.items():
        run_id = b.create()
        with b.engine.begin() as conn:
            if b.sqlite:
                conn.exec_driver_sql("UPDATE runs SET settings = ? WHERE id = ?", (text_, run_id))
            elif text_ == "7":  # (jsonb refuses the others: only another SQLite tool writes them)
                conn.execute(update(runs).where(runs.c.id == run_id).values(settings=7))
            else:
                continue
        assert b.store.get_run(run_id).settings == expected, text_
        assert_reads_agree(b, [run_id])


# -- the checkpoint's statements below Core ----------------------------------------------------


def write_both_ways(b: Backend, rows: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """The same step rows written by the prepared statement (under two run ids' worth of
    seqs) and by Core; both read back through Core, without the id."""
    run_id = b.create()
    fast = [{**r, "run_id": run_id, "seq": i} for i, r in enumerate(rows)]
    plain = [
        {**r, "run_id": run_id, "seq": 1000 + i, "idempotency_key": f"p{i}"}
        for i, r in enumerate(rows)
    ]
    with b.engine.connect() as conn:
        with prepared.transaction(conn):
            Prepared(insert(steps), keys=STEP_COLUMNS).run_many(conn, fast)
        with conn.begin():
            conn.execute(insert(steps), storable(plain))
        read = (
            conn.execute(select(steps).where(steps.c.run_id == run_id).order_by(steps.c.seq))
            .mappings()
            .all()
        )
    shown = [
        {k: v for k, v in r.items() if k not in ("id", "seq", "idempotency_key")} for r in read
    ]
    return shown[: len(rows)], shown[len(rows) :]


def step_row(i: int, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(STEP_COLUMNS)
    row.update(kind="tool", state="started", idempotency_key=f"f{i}", attempts=1, started_at=WHEN)
    row.update(values)
    return row


STEP_VALUES = st.fixed_dictionaries(
    {},
    optional={
        "input": JSON,
        "output": JSON,
        "error": TEXT,
        "tool_name": TEXT.map(lambda t: t[:100]),
        "call_id": TEXT.map(lambda t: t[:200]),
        "prompt_tokens": INT,
        "duration_ms": INT,
        "finished_at": st.datetimes(datetime(1970, 1, 1), datetime(9999, 1, 1)),
        "started_at": st.datetimes(datetime(1970, 1, 1), datetime(9999, 1, 1)),
    },
)


@pytest.mark.slow  # (hypothesis: seconds on 2 cores)
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(values=st.lists(STEP_VALUES, min_size=1, max_size=3))
def test_the_prepared_checkpoint_writes_what_core_writes(
    backend: Backend, values: list[dict[str, Any]]
) -> None:
    fast, plain = write_both_ways(backend, [step_row(i, **v) for i, v in enumerate(values)])
    assert fast == plain


# -- only the store speaks SQL -------------------------------------------------------------


def sql_imports(folder: str) -> dict[str, set[str]]:
    """The SQL libraries each module of durable_agent/<folder> imports (not for type checks)."""
    found: dict[str, set[str]] = {}
    for path in (Path(__file__).resolve().parents[1] / "durable_agent" / folder).rglob("*.py"):
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                if name.split(".")[0] in ("sqlalchemy", "sqlite3", "psycopg"):
                    found.setdefault(path.name, set()).add(name)
    return found


def test_the_web_view_and_the_workspace_leave_sql_to_the_store() -> None:
    assert sql_imports("ui") == {} and sql_imports("workspace") == {}
    assert sql_imports("store")  # (the check sees what it looks for)


# -- the suite can fail -----------------------------------------------------------------------


def suite_fails(test: Callable[[], None]) -> str | None:
    """What `test` failed with, or None when it passed."""
    try:
        test()
    except Exception as exc:  # noqa: BLE001  (an assertion, or a write refused that Core makes)
        return f"{getattr(test, '__name__', test)}: {type(exc).__name__}: {exc}"[:2000]
    return None


def _slip(name: str) -> Callable[[pytest.MonkeyPatch], None]:
    """One slip in the standard library's read, as `monkeypatch` puts it in."""
    original_list = sqlite_reads.list_runs

    def seconds(mp: pytest.MonkeyPatch) -> None:  # timestamps cut to the second
        mp.setattr(
            sqlite_reads,
            "_datetime",
            lambda v: None if v is None else datetime.fromisoformat(v).replace(microsecond=0),
        )

    def order(mp: pytest.MonkeyPatch) -> None:  # runs of one time in the other order
        mp.setattr(
            sqlite_reads,
            "list_runs",
            lambda db, *, status, limit: sorted(
                original_list(db, status=status, limit=limit) or [], key=lambda r: r.id
            ),
        )

    def json_(mp: pytest.MonkeyPatch) -> None:  # JSON not cleaned as the store reads it
        mp.setattr(sqlite_reads, "_json", lambda v: None if v is None else json.loads(v))

    def flag(mp: pytest.MonkeyPatch) -> None:  # a flag read as its number
        mp.setattr(sqlite_reads, "_boolean", lambda v: v)

    return {"seconds": seconds, "order": order, "json": json_, "flag": flag}[name]


# The suite's tests that a broken read must fail, the quick ones first.
READ_SUITE: list[Callable[[Backend], None]] = [
    test_a_new_run_reads_back_as_it_was_created,
    test_runs_are_listed_newest_first_by_status_and_limit,
    test_json_written_by_another_tool_reads_the_same_every_way,
    test_a_run_from_its_lease_to_its_end,
    test_hostile_values_read_back_the_same_every_way,
]


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("slip", ["seconds", "order", "json", "flag"])
def test_a_broken_fast_read_is_caught(
    backend: Backend,
    slip: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The standard library's read with a slip in it: the suite's own tests fail."""

    def suite_catches() -> str | None:
        for test in READ_SUITE:
            b = Backend(f"sqlite:///{tmp_path_factory.mktemp('broken') / 'store.db'}")
            try:
                failed = suite_fails(lambda: test(b))  # noqa: B023  (called at once)
            finally:
                b.engine.dispose()
            if failed:
                return f"{test.__name__}: {failed}"
        return None

    found = suite_catches()
    assert found is None, found  # as it is, the suite passes
    _slip(slip)(monkeypatch)
    assert suite_catches(), f"the suite missed a fast read with the slip {slip!r}"


@pytest.mark.slow
def test_a_broken_fast_write_is_caught(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prepared statements with a slip: timestamps cut to the second, or text not
    cleaned by the store-boundary rule. The suite's own test fails on each."""
    core_processor = prepared._processor

    def seconds(kind: Any, dialect: Any) -> Any:
        if isinstance(kind, type(steps.c.started_at.type)):
            return lambda v: (
                v.replace(microsecond=0).isoformat(" ")
                if backend.sqlite
                else v.replace(microsecond=0)
            )
        return core_processor(kind, dialect)

    def uncleaned(kind: Any, dialect: Any) -> Any:
        found = core_processor(kind, dialect)
        return None if found is prepared._text else found

    passed = suite_fails(lambda: test_the_prepared_checkpoint_writes_what_core_writes(backend))
    assert passed is None, passed
    for slip in (seconds, uncleaned):
        monkeypatch.setattr(prepared, "_processor", slip)
        assert suite_fails(lambda: test_the_prepared_checkpoint_writes_what_core_writes(backend)), (
            slip
        )
        monkeypatch.undo()


def test_a_requeue_whose_commit_answer_was_lost_is_not_refused_on_its_retry(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The COMMIT that queued the run lands, then the connection fails before its answer is
    # read: the retry finds the run `pending`, queued by that very commit, and is done (not
    # "is pending now (failed when it was checked): it was not queued", exit 2).
    import sqlite3

    b = backend
    run_id = b.create()
    with b.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == run_id).values(status="failed"))
    dialect = b.engine.dialect
    real_commit = dialect.do_commit
    lost = [0]

    def commit_then_lose(dbapi_conn: Any) -> None:
        real_commit(dbapi_conn)
        if lost[0]:
            return
        lost[0] += 1
        if dialect.name == "postgresql":
            import psycopg

            raise psycopg.OperationalError("server closed the connection unexpectedly")
        error = sqlite3.OperationalError("disk I/O error")
        error.sqlite_errorname = "SQLITE_IOERR"
        raise error

    monkeypatch.setattr(dialect, "do_commit", commit_then_lose)
    b.store.requeue(run_id, if_status="failed")
    monkeypatch.undo()
    assert lost == [1]
    assert b.store.get_run(run_id).status == "pending"
