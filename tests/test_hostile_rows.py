"""`show`, `export` and `list` never fail on a stored row, whatever it holds: rows written
straight into the tables (by hand, by an older or buggy version, by another tool) with
values of any shape, on SQLite (where a text column can hold bytes that are not UTF-8 and
a JSON column text that is not JSON) and on PostgreSQL."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, insert

from durable_agent.cli.parser import main
from durable_agent.store.engine import open_store_engine
from durable_agent.store.rows import utcnow
from durable_agent.store.schema import approvals, messages, runs, steps
from durable_agent.store.storable import storable

# Keys the renderers look for, so generated shapes reach their code paths.
KEYS = st.sampled_from(
    [
        "tool_calls",
        "function",
        "name",
        "arguments",
        "id",
        "content",
        "usage",
        "result",
        "data",
        "output_tail",
        "command",
        "plan",
        "prices",
        "input_per_mtok",
        "output_per_mtok",
        "prompt_tokens",
        "completion_tokens",
        "model",
        "path",
        "m",
    ]
)
TEXT = st.text(st.characters(exclude_categories=()), max_size=30)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS | TEXT, inner, max_size=4),
    max_leaves=15,
)
NAMES = st.sampled_from(["model", "tool", "verify", "weird", ""]) | TEXT
STATES = st.sampled_from(["started", "completed", "failed", "odd"]) | TEXT


@pytest.fixture
def read_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[[str, str], None]:
    """Run show, show --json, export, list and list --json for a run; each must exit 0."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("DURABLE_AGENT_DB", raising=False)

    def check(url: str, run_id: str) -> None:
        for command in (
            ["show", run_id],
            ["show", run_id, "--json"],
            ["export", run_id],
            ["list"],
            ["list", "--json"],
        ):
            capsys.readouterr()
            code = main(
                [*command, "--db", url]
            )  # an exception here is the traceback a user would see
            err = capsys.readouterr().err
            assert code == 0, (command, err)

    return check


@pytest.mark.slow
def test_generated_rows_of_any_shape_never_break_show_export_list(
    store_url: str, read_commands: Callable[[str, str], None]
) -> None:
    engine = open_store_engine(store_url)
    counter = iter(range(1_000_000))

    @settings(
        max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(
        run_text=st.lists(TEXT, min_size=6, max_size=6),
        run_settings=JSON,
        status=STATES,
        rows=st.lists(
            st.tuples(NAMES, STATES, TEXT, JSON, JSON, st.integers(-3, 3) | st.none()), max_size=5
        ),
        calls=JSON,
        approval=st.tuples(TEXT, TEXT, st.sampled_from([None, "approved", "denied", "?"])),
    )
    def one(
        run_text: list[str],
        run_settings: Any,
        status: str,
        rows: list[Any],
        calls: Any,
        approval: tuple[str, str, str | None],
    ) -> None:
        run_id = f"h{next(counter)}"
        insert_run(engine, run_id, run_text, run_settings, status, rows, calls, approval)
        read_commands(store_url, run_id)

    try:
        one()
    finally:
        engine.dispose()


def insert_run(
    engine: Engine,
    run_id: str,
    text: list[str],
    run_settings: Any,
    status: str,
    rows: list[Any],
    calls: Any,
    approval: tuple[str, str, str | None],
) -> None:
    """One run with the generated values, made storable only as far as the column type
    itself demands on this dialect (PostgreSQL text cannot hold NUL, nor jsonb `\\u0000`)."""
    now = utcnow()
    task, answer, error, model, workspace, owner = storable(text)
    with engine.begin() as conn:
        conn.execute(
            insert(runs).values(
                id=run_id,
                task=task,
                workspace=workspace,
                model=model,
                status=storable(status)[:20],
                stop_reason=storable(status)[:32],
                answer=answer,
                error=error,
                created_at=now,
                updated_at=now,
                finished_at=now if len(rows) % 2 else None,
                step_count=len(rows),
                tool_call_count=2,
                prompt_tokens=7,
                completion_tokens=3,
                lease_owner=owner[:200] or None,
                lease_expires_at=now + timedelta(seconds=60),
                lease_epoch=len(rows),
                settings=storable(run_settings),
            )
        )
        for seq, (kind, state, err, input_, output, epoch) in enumerate(rows):
            conn.execute(
                insert(steps).values(
                    run_id=run_id,
                    seq=seq,
                    kind=storable(kind)[:16],
                    state=storable(state)[:16],
                    idempotency_key=f"k{seq}",
                    call_id=storable(err)[:200],
                    tool_name=storable(kind)[:100],
                    input=storable(input_),
                    output=storable(output),
                    error=storable(err) or None,
                    attempts=1,
                    started_at=now,
                    finished_at=now if seq % 2 else None,
                    lease_epoch=epoch,
                    turn=epoch,
                )
            )
        conn.execute(
            insert(messages).values(
                run_id=run_id,
                seq=0,
                role="assistant",
                content=answer,
                tool_calls=storable(calls),
                created_at=now,
            )
        )
        conn.execute(
            insert(approvals).values(
                run_id=run_id,
                call_id=storable(approval[0])[:200] or "c",
                kind=storable(approval[1])[:32],
                command=storable(approval[0]),
                reason=storable(approval[1]),
                requested_at=now,
                decision=approval[2],
            )
        )


def test_sqlite_text_that_is_not_utf8_and_json_that_is_not_json(
    tmp_path: Path, read_commands: Callable[[str, str], None]
) -> None:
    """What only SQLite can hold: bytes in a text column, any text in a JSON column."""
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    open_store_engine(url).dispose()
    bad = "CAST(X'61ff00fe62eda080' AS TEXT)"  # a, \xff, NUL, \xfe, b, the UTF-8-ish spelling of U+D800
    con = sqlite3.connect(path)
    with con:
        con.execute(f"""INSERT INTO runs (id, task, workspace, model, status, stop_reason, answer, error,
            created_at, updated_at, finished_at, step_count, tool_call_count, prompt_tokens,
            completion_tokens, lease_epoch, cancel_requested, settings, message_count, active_ms,
            resume_count)
            VALUES ('bad', {bad}, {bad}, {bad}, 'completed', {bad}, {bad}, {bad}, '2026-01-01 00:00:00',
            '2026-01-01 00:00:00', '2026-01-01 00:00:01', 2, 1, 1, 1, 1, 0, 'Infinity', 1, 5, 0)""")
        for seq, (kind, input_, output) in enumerate(
            [
                (
                    "model",
                    '"\\ud800"',
                    '{"tool_calls": [{"function": {"name": "x", "arguments": "{\\"a\\": \\"\\ud800\\u0000\\"}"}}], "content": "\\u0000"}',
                ),
                ("tool", "not json", '{"result": "\\udcff", "data": NaN}'),
                ("tool", '{"arguments": "\\u0000\\ud800"}', "{broken"),
                ("verify", "[1, 2]", '{"output_tail": 5}'),
            ]
        ):
            con.execute(
                f"""INSERT INTO steps (run_id, seq, kind, state, idempotency_key, call_id, tool_name,
                input, output, error, attempts, started_at, finished_at, turn, lease_epoch)
                VALUES ('bad', ?, ?, 'completed', ?, {bad}, {bad}, ?, ?, {bad}, 1, '2026-01-01 00:00:00',
                '2026-01-01 00:00:01', 0, 1)""",
                (seq, kind, f"k{seq}", input_, output),
            )
        con.execute(f"""INSERT INTO messages (run_id, seq, role, content, tool_calls, created_at)
            VALUES ('bad', 0, 'assistant', {bad}, 'nope', '2026-01-01 00:00:00')""")
        con.execute(f"""INSERT INTO approvals (run_id, call_id, kind, tool_name, command, reason, requested_at)
            VALUES ('bad', {bad}, 'approval_required', {bad}, {bad}, {bad}, '2026-01-01 00:00:00')""")
    con.close()
    read_commands(url, "bad")
