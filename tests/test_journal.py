"""The journal's writing connection: one per session, given back on every way out."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, update

from durable_agent.config.settings import Settings
from durable_agent.errors import LeaseLost
from durable_agent.loop.runner import Runner
from durable_agent.messages import Message, ModelTurn, ToolCall
from durable_agent.redact import Redactor
from durable_agent.store.engine import open_store_engine
from durable_agent.store.runs import Store
from durable_agent.store.schema import runs
from durable_agent.tools import build_tools


class ReadingModel:
    """Reads a file every turn; `on_turn` runs before answering turn 2 (to break things)."""

    name = "reading"

    def __init__(self, on_turn_2: Any) -> None:
        self.on_turn_2 = on_turn_2

    def complete(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], turn: int
    ) -> ModelTurn:
        if turn == 2:
            self.on_turn_2()
        if turn == 3:
            return ModelTurn(content="done")
        return ModelTurn(
            content=None,
            tool_calls=(
                ToolCall(f"c{turn}", "read_file", f'{{"path": "a.txt", "offset": {turn}}}'),
            ),
        )


def make_runner(tmp_path: Path, on_turn_2: Any = lambda: None) -> tuple[Runner, Engine]:
    ws = tmp_path / "ws"
    ws.mkdir(parents=True)
    (ws / "a.txt").write_text("hello\n")
    engine = open_store_engine(f"sqlite:///{tmp_path / 'j.db'}")
    settings = Settings(workspace=ws, model="reading", db=str(tmp_path / "j.db"), shell="deny")
    runner = Runner(
        store=Store(engine),
        settings=settings,
        model=ReadingModel(on_turn_2),
        tools=build_tools("deny"),
        env={},
        redactor=Redactor.from_env({}),
    )
    return runner, engine


def checked_out(engine: Engine) -> int:
    return int(engine.pool.checkedout())  # type: ignore[attr-defined]


def test_a_finished_run_gives_its_connection_back(tmp_path: Path) -> None:
    runner, engine = make_runner(tmp_path)
    outcome = runner.execute(runner.create("t"))
    assert outcome.status == "completed"
    assert checked_out(engine) == 0
    messages = runner.store.messages(outcome.run_id)
    assert [m.role for m in messages] == ["system", "user"] + ["assistant", "tool"] * 3 + [
        "assistant"
    ]
    assert all(s.state == "completed" for s in runner.store.steps(outcome.run_id))


def test_a_lost_lease_and_ctrl_c_give_the_connection_back(tmp_path: Path) -> None:
    def take_over() -> None:  # another process took the lease while the model was thinking
        with engine.begin() as conn:
            conn.execute(
                update(runs).values(lease_owner="someone-else", lease_epoch=runs.c.lease_epoch + 1)
            )

    runner, engine = make_runner(tmp_path, take_over)
    run_id = runner.create("t")
    with pytest.raises(LeaseLost):
        runner.execute(run_id)
    assert checked_out(engine) == 0
    # The read of turn 1 rode along with the intent of model call 2; nothing after it was written.
    assert [s.seq for s in runner.store.steps(run_id)] == [0, 1, 2, 3, 4]

    def interrupt() -> None:
        raise KeyboardInterrupt

    runner, engine = make_runner(tmp_path / "b", interrupt)
    outcome = runner.execute(runner.create("t"))
    assert outcome.status == "cancelled"
    assert checked_out(engine) == 0


def test_the_heartbeats_look_for_a_cancel_is_one_try_and_the_loops_is_retried() -> None:
    """A server that refuses connections (here: nothing listens on the port): the look for
    the heartbeat fails at once, without a wait, so its next lease renewal is not held back;
    the ordinary read waits and tries again under the store policy."""
    import socket

    from durable_agent.errors import StoreUnavailable
    from durable_agent.store.engine import make_engine
    from durable_agent.store.journal import Journal
    from durable_agent.store.retrying import StorePolicy

    with socket.socket() as s:  # a free port, closed again: connections to it are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = make_engine(f"postgresql://127.0.0.1:{port}/none")
    waits: list[float] = []
    journal = Journal(
        engine,
        "r",
        "me",
        1,
        30,
        policy=StorePolicy(max_attempts=3, max_seconds=30),
        sleep=waits.append,
    )
    try:
        with pytest.raises(StoreUnavailable):
            journal.cancel_requested(once=True)
        assert waits == []
        with pytest.raises(StoreUnavailable):
            journal.cancel_requested()
        assert len(waits) == 2  # three tries
    finally:
        engine.dispose()
