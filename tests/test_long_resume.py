"""A long run keeps and reads back what its requests send, not its whole history
(loop/replay.py, store/journal.py `Journal.load`): the messages a summary replaced are
neither held in memory nor read by a resume, and the state rebuilt without them is the one
rebuilt from every message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from durable_agent.config.settings import Settings
from durable_agent.context.view import HEAD
from durable_agent.loop import turns
from durable_agent.loop.replay import RunState, rebuild
from durable_agent.loop.runner import Runner
from durable_agent.models.scripted import ScriptedModel
from durable_agent.redact import Redactor
from durable_agent.store.engine import open_store_engine
from durable_agent.store.journal import Journal, Loaded
from durable_agent.store.rows import GONE, message_from_row
from durable_agent.store.runs import Store
from durable_agent.store.schema import messages
from durable_agent.tools import build_tools

REPEATS = 12  # the same call at the end, in a row: a streak a summary's cut falls inside


def script() -> list[dict[str, Any]]:
    reads = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt", "offset": i % 3}}]}
        for i in range(40)
    ]
    again = [{"tool_calls": [{"name": "read_output", "arguments": {"call_id": "call_0_0"}}]}]
    same = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]}
        for _ in range(REPEATS)
    ]
    return [*reads, *again, *same, {"content": "done"}]


def state_of(loaded: Loaded, history: list[Any], *, partial: bool) -> RunState:
    return rebuild(
        loaded.run.id,
        history,
        active_ms=0,
        model_tokens=loaded.model_tokens,
        compactions=loaded.compactions,
        window=turns.window_of(loaded.user_turns),
        older=loaded.older if partial else None,
    )


@pytest.mark.slow
def test_a_resume_reads_the_view_and_rebuilds_the_same_state(
    store_url: str, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text(
        "".join(f"line {i} of a file read again and again\n" for i in range(60))
    )
    settings = Settings(
        workspace=ws,
        model="scripted:long",
        db=store_url,
        max_steps=100,
        max_repeats=REPEATS + 5,
        shell="deny",
        sandbox="off",
        max_context_tokens=3000,
    )
    engine = open_store_engine(store_url)
    runner = Runner(
        store=Store(engine),
        settings=settings,
        model=ScriptedModel(script(), "scripted:long"),
        tools=build_tools("deny"),
        env={},
        redactor=Redactor.from_env({}),
    )
    run_id = runner.create("read it")
    assert runner.execute(run_id).status == "completed"
    with engine.connect() as conn:
        every = [
            message_from_row(r)
            for r in conn.execute(
                select(messages).where(messages.c.run_id == run_id).order_by(messages.c.seq)
            )
        ]
    # The result read again long after a summary replaced it is the stored one.
    [again] = [m for m in every if m.role == "tool" and m.tool_call_id == "call_40_0"]
    [first] = [m for m in every if m.role == "tool" and m.tool_call_id == "call_0_0"]
    assert first.content and first.content in (again.content or "")

    loaded = Journal(engine, run_id, "nobody", 0, 30).load()
    older = loaded.older
    assert older.start > HEAD + 40  # summaries moved the view well past the first reads
    read = [m for m in loaded.messages if m is not GONE]
    assert len(loaded.messages) == len(every)  # every seq keeps its place
    assert len(read) < len(every) / 2
    assert all(m is GONE or m == every[i] for i, m in enumerate(loaded.messages))
    assert older.streak_seqs  # the repeated call runs across the start

    part, whole = (
        state_of(loaded, loaded.messages, partial=True),
        state_of(loaded, every, partial=False),
    )
    for name in ("step_count", "tool_call_count", "last_fingerprint", "repeat_streak"):
        assert getattr(part, name) == getattr(whole, name), name
    # The ids of the calls answered below the start stay in the store, looked up there.
    journal = Journal(engine, run_id, "nobody", 0, 30)
    assert part.ids_below == older.start and whole.ids_below == HEAD
    below = whole.used_call_ids - part.used_call_ids
    assert below and all(journal.answered_before(i, older.start) for i in below)
    assert not any(journal.answered_before(i, older.start) for i in part.used_call_ids - below)
    assert part.used_call_ids <= whole.used_call_ids
    assert whole.repeat_streak == REPEATS
    assert part.history.digest == whole.history.digest
    assert part.request() == whole.request()
    # What stays in memory after a rebuild from every message is what a resume reads.
    assert [m is GONE for m in whole.messages] == [m is GONE for m in part.messages]
    engine.dispose()


def status_of(db: Path) -> str:
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        return str(conn.execute("SELECT status FROM runs").fetchone()[0])
    finally:
        conn.close()


def history_of(db: Path, run_id: str) -> list[tuple[Any, ...]]:
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            "SELECT seq, role, content, tool_calls, tool_call_id FROM messages WHERE run_id = ? "
            "ORDER BY seq",
            (run_id,),
        ).fetchall()
        compactions = conn.execute(
            "SELECT turn, output FROM steps WHERE run_id = ? AND kind = 'compact' "
            "AND state = 'completed' ORDER BY seq",
            (run_id,),
        ).fetchall()
    finally:
        conn.close()
    return [*rows, *compactions]


@pytest.mark.slow
@pytest.mark.parametrize("every", [5, 6])  # odd: just before a commit; even: just after
def test_killed_at_every_kth_checkpoint_of_a_compacting_run_it_ends_as_one_never_killed(
    every: int, tmp_path: Path, env: dict[str, str], workspace: Path
) -> None:
    """SIGKILL at many checkpoints of a run whose summaries move its view on (its resumes
    read only the messages after the last summary's start, store/journal.py): the messages
    and the compactions it ends with are an uninterrupted run's, byte for byte."""
    import signal

    import forked_cli

    for ws in (workspace, tmp_path / "reference"):
        ws.mkdir(exist_ok=True)
        (ws / "a.txt").write_text("".join(f"line {i} of a file read again\n" for i in range(60)))
    path = tmp_path / "script.json"
    path.write_text(__import__("json").dumps(script()))
    args = ["start", "read it", "--model", f"scripted:{path}", "--run-id", "long", "--quiet"]
    args += ["--max-context-tokens", "3000", "--max-repeats", str(REPEATS + 5)]
    args += ["--sandbox", "off", "--max-steps", "100"]
    reference_db = tmp_path / "reference.db"
    done = forked_cli.run(
        args,
        env={**env, "DURABLE_AGENT_DB": f"sqlite:///{reference_db}"},
        cwd=tmp_path / "reference",
    )
    assert done.returncode == 0, done.stderr
    crashy = {**env, "DURABLE_AGENT_CRASH_AFTER": str(every)}
    proc = forked_cli.run(args, env=crashy, cwd=workspace)
    kills = 0
    db = Path(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    while proc.returncode == -signal.SIGKILL and kills < 400:
        kills += 1
        if status_of(db) == "completed":  # killed just after its last commit
            break
        proc = forked_cli.run(["resume", "long", "--quiet"], env=crashy, cwd=workspace)
    else:
        assert proc.returncode == 0, proc.stderr
    assert kills > 20, "the kills should be spread over the whole run"
    assert status_of(db) == "completed"
    assert history_of(db, "long") == history_of(reference_db, "long")
    assert any(len(r) == 2 and '"summarize"' in r[1] for r in history_of(db, "long"))


def compacted_run(store_url: str, ws: Path) -> tuple[Any, str]:
    """A finished run of script() whose summaries moved its view past most of it."""
    ws.mkdir()
    (ws / "a.txt").write_text(
        "".join(f"line {i} of a file read again and again\n" for i in range(60))
    )
    settings = Settings(
        workspace=ws,
        model="scripted:long",
        db=store_url,
        max_steps=100,
        max_repeats=REPEATS + 5,
        shell="deny",
        sandbox="off",
        max_context_tokens=3000,
    )
    engine = open_store_engine(store_url)
    runner = Runner(
        store=Store(engine),
        settings=settings,
        model=ScriptedModel(script(), "scripted:long"),
        tools=build_tools("deny"),
        env={},
        redactor=Redactor.from_env({}),
    )
    run_id = runner.create("read it")
    assert runner.execute(run_id).status == "completed"
    return engine, run_id


def assert_resume_state_is_the_whole_one(engine: Any, run_id: str) -> Loaded:
    """The state rebuilt from what a resume reads is the one rebuilt from every message."""
    with engine.connect() as conn:
        every = [
            message_from_row(r)
            for r in conn.execute(
                select(messages).where(messages.c.run_id == run_id).order_by(messages.c.seq)
            )
        ]
    loaded = Journal(engine, run_id, "nobody", 0, 30).load()
    part = state_of(loaded, loaded.messages, partial=True)
    whole = state_of(loaded, every, partial=False)
    for name in ("step_count", "tool_call_count", "last_fingerprint", "repeat_streak"):
        assert getattr(part, name) == getattr(whole, name), name
    assert part.used_call_ids <= whole.used_call_ids
    assert part.history.digest == whole.history.digest
    assert part.request() == whole.request()
    assert part.pending_calls() == whole.pending_calls()
    return loaded


@pytest.mark.slow
def test_messages_deleted_by_hand_from_the_end_leave_the_same_state(
    store_url: str, tmp_path: Path
) -> None:
    """A person rolls a compacted run back by deleting its last messages (no gap in the
    seqs is left): up to the view's start and past it, a resume rebuilds the state every
    message gives, the repeat streak below the start included (it was lost when nothing
    from the start on was left)."""
    from sqlalchemy import delete

    engine, run_id = compacted_run(store_url, tmp_path / "ws")
    start = Journal(engine, run_id, "nobody", 0, 30).load().older.start
    assert start > HEAD + 40
    for first in range(start + 3, start - 4, -1):  # each deletes one more
        with engine.begin() as conn:
            conn.execute(
                delete(messages).where(messages.c.run_id == run_id, messages.c.seq >= first)
            )
        loaded = assert_resume_state_is_the_whole_one(engine, run_id)
        assert len(loaded.messages) == first
    engine.dispose()


@pytest.fixture(scope="module")
def finished_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    """An SQLite store holding one compacted run: (its file, the run, the view's start)."""
    where = tmp_path_factory.mktemp("finished")
    engine, run_id = compacted_run(f"sqlite:///{where / 'store.db'}", where / "ws")
    start = Journal(engine, run_id, "nobody", 0, 30).load().older.start
    engine.dispose()
    return where / "store.db", run_id, start


IDS = st.sampled_from([None, "", "call_0_0", "call_45_0", "call_50_0", "x"])
EDITS = st.lists(
    st.tuples(
        st.sampled_from(["delete from", "delete one", "move", "id", "calls", "role"]),
        st.integers(-8, 8),  # the message's seq, from the view's start
        st.integers(0, 5),
    ),
    min_size=1,
    max_size=4,
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=EDITS, ids=st.lists(IDS, min_size=4, max_size=4))
@example(edits=[("calls", 0, 2)], ids=[None] * 4)  # a call at the start answered below it
def test_messages_edited_by_hand_leave_the_same_state(
    finished_store: tuple[Path, str, int],
    edits: list[tuple[str, int, int]],
    ids: list[str | None],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Rows deleted (the tail, or one: a gap) or moved, and call ids, calls and roles changed
    with SQL around the view's start: a resume rebuilds the state every message gives."""
    import shutil

    from sqlalchemy import delete, func, update

    db, run_id, start = finished_store
    copy = tmp_path_factory.mktemp("edited") / "store.db"
    shutil.copy(db, copy)
    engine = open_store_engine(f"sqlite:///{copy}")
    calls = [None, [], [{"id": "call_44_0", "type": "function", "function": {"name": "x"}}]]
    roles = ["user", "tool", "assistant", "system"]
    of_run = messages.c.run_id == run_id
    with engine.begin() as conn:
        for kind, offset, value in edits:
            seq = messages.c.seq == start + offset
            if kind == "delete from":
                conn.execute(delete(messages).where(of_run, messages.c.seq >= start + offset))
            elif kind == "delete one":
                conn.execute(delete(messages).where(of_run, seq))
            elif kind == "move":  # below 0: a gap, yet as many rows as seqs up to the last
                low = conn.execute(select(func.min(messages.c.seq)).where(of_run)).scalar()
                conn.execute(update(messages).where(of_run, seq).values(seq=min(low, 0) - 1))
            elif kind == "id":
                conn.execute(
                    update(messages).where(of_run, seq).values(tool_call_id=ids[value % 4])
                )
            elif kind == "calls":
                conn.execute(
                    update(messages).where(of_run, seq).values(tool_calls=calls[value % 3])
                )
            else:
                conn.execute(update(messages).where(of_run, seq).values(role=roles[value % 4]))
    try:
        assert_resume_state_is_the_whole_one(engine, run_id)
    finally:
        engine.dispose()


@pytest.mark.slow
def test_read_output_of_an_id_with_a_nul_or_a_surrogate_after_a_summary(
    store_url: str, tmp_path: Path
) -> None:
    """A result a summary replaced is read back from the store (tool_step._stored_output):
    a call id the model wrote with a NUL or a lone surrogate in it is looked up as the
    store would hold it. PostgreSQL refused the NUL (the run failed, and every resume on
    the same call), SQLite's driver the surrogate (an encoding error as the result)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text(
        "".join(f"line {i} of a file read again and again\n" for i in range(60))
    )
    odd = ["call_0_0\x00", "call_0_0\ud800"]
    turns = [
        *script()[:40],
        *({"tool_calls": [{"name": "read_output", "arguments": {"call_id": i}}]} for i in odd),
        {"content": "done"},
    ]
    settings = Settings(
        workspace=ws,
        model="scripted:odd",
        db=store_url,
        max_steps=100,
        shell="deny",
        sandbox="off",
        max_context_tokens=3000,
    )
    engine = open_store_engine(store_url)
    runner = Runner(
        store=Store(engine),
        settings=settings,
        model=ScriptedModel(turns, "scripted:odd"),
        tools=build_tools("deny"),
        env={},
        redactor=Redactor.from_env({}),
    )
    run_id = runner.create("read it")
    assert runner.execute(run_id).status == "completed"
    loaded = assert_resume_state_is_the_whole_one(engine, run_id)
    assert loaded.older.start > HEAD + 20  # the results were no longer in memory
    results = [m.content or "" for m in loaded.messages if m is not GONE and m.role == "tool"]
    assert len(results) >= 2
    assert all("no recorded tool result" in r for r in results[-2:]), results[-2:]
    engine.dispose()
