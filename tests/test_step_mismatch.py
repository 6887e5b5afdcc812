"""A recorded step that differs from the one resume would run is a structured mismatch with
its own stop reason, never a guess (issue: one step primitive)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from durable_agent.errors import StepMismatch
from durable_agent.messages import Message
from durable_agent.store.engine import open_store_engine
from durable_agent.store.journal import Journal
from durable_agent.store.runs import Store


def test_resume_after_the_history_was_edited_stops_as_step_mismatch(
    cli, write_script, db_path: Path
) -> None:  # type: ignore[no-untyped-def]
    script = write_script(
        [{"tool_calls": [{"name": "list_files", "arguments": {}}]}, {"content": "done"}]
    )
    # Boundary 2: the first model call's intent is committed, its answer is not.
    crashed = cli(
        "start",
        "task",
        "--model",
        script,
        "--run-id",
        "mm",
        extra_env={"DURABLE_AGENT_CRASH_AFTER": "2"},
    )
    assert crashed.code == -9
    with sqlite3.connect(db_path) as conn:
        (key,) = conn.execute(
            "SELECT idempotency_key FROM steps WHERE run_id='mm' AND kind='model'"
        ).fetchone()
        conn.execute(
            "UPDATE messages SET content = 'another task' WHERE run_id='mm' AND role='user'"
        )
    resumed = cli("resume", "mm", "--json")
    assert resumed.code == 1, resumed.stderr
    out = json.loads(resumed.stdout)
    assert (out["status"], out["stop_reason"]) == ("failed", "step_mismatch")
    with sqlite3.connect(db_path) as conn:
        (error,) = conn.execute("SELECT error FROM runs WHERE id='mm'").fetchone()
        states = conn.execute("SELECT state FROM steps WHERE run_id='mm'").fetchall()
    assert key in error and "recorded" in error
    assert states == [("started",)]  # nothing more was run, the recorded step is left as it was


def test_step_mismatch_carries_its_fields(tmp_path: Path) -> None:
    engine = open_store_engine(f"sqlite:///{tmp_path / 's.db'}")
    store = Store(engine)
    store.create_run(
        "r",
        task="t",
        workspace=str(tmp_path),
        model="m",
        settings={},
        first_messages=[Message("user", "t")],
        lease=("host:1:x", 60),
    )
    journal = Journal(engine, "r", "host:1:x", 1, 60)
    journal.load()
    journal.step("model:0:aaaa", "model", {"turn": 0}, turn=0)
    journal.load()
    with pytest.raises(StepMismatch) as caught:
        journal.find("model:0:bbbb", "model", turn=0)
    exc = caught.value
    assert (exc.run_id, exc.seq, exc.expected_key, exc.recorded_key) == (
        "r",
        0,
        "model:0:bbbb",
        "model:0:aaaa",
    )
    engine.dispose()
