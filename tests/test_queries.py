"""Every SQL block of docs/queries.md runs against a real store holding a few real runs
(completed after a crash, blocked, crashed and left, retried, over budget), and the queries
find what they promise. The SQL views of migration 0002 are checked on the way; on
PostgreSQL too when a server is available."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import forked_cli
import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "queries.md"
PG_MARK = "-- PostgreSQL"


@dataclass(frozen=True)
class Block:
    section: str
    sql: str

    @property
    def postgres_only(self) -> bool:
        return self.sql.startswith(PG_MARK)


def sql_blocks() -> list[Block]:
    blocks, section, current = [], "", None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if current is not None:
            if line.startswith("```"):
                blocks.append(Block(section, "\n".join(current).strip()))
                current = None
            else:
                current.append(line)
        elif line.startswith("## "):
            section = line[3:].strip()
        elif line.strip() == "```sql":
            current = []
    return blocks


SQLITE_BLOCKS = [b for b in sql_blocks() if not b.postgres_only]

# What each portable block must return on the store below, in the order of the document:
# "rows" (at least one), "none", or the run (by its role below) that must be among the rows.
EXPECT: dict[str, list[str]] = {
    "A first look": ["rows", "rows"],
    "1. Token use per run": ["demo"],
    "2. Token use per model and day": ["rows"],
    "3. The slowest tool calls": ["demo"],
    "4. Time per tool: calls, average, worst, failures": ["rows"],
    "5. Runs stuck in `running`": ["crashed"],
    "6. Approvals waiting for a person": ["blocked"],
    "7. Retries: steps that took more than one attempt": ["retried"],
    "8. Why runs did not complete": ["rows"],
    "9. Steps a crash cut off": ["crashed"],
    "10. Nothing ran twice": ["none", "rows"],
}


def run_cli(args: list[str], env: dict[str, str], cwd: Path, crash_after: int | None = None) -> str:
    extra = {"DURABLE_AGENT_CRASH_AFTER": str(crash_after)} if crash_after else {}
    proc = forked_cli.run(args, env={**env, **extra}, cwd=cwd)
    return f"{proc.returncode}\n{proc.stdout}{proc.stderr}"


def populate(db: str, root: Path) -> dict[str, str]:
    """A few real runs of each kind; returns their ids by role."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DURABLE_AGENT_"))}
    env.update(
        XDG_CONFIG_HOME=str(root / "config"), XDG_DATA_HOME=str(root / "data"), DURABLE_AGENT_DB=db
    )
    ws = root / "ws"
    ws.mkdir()

    def script(name: str, turns: list[dict[str, Any]]) -> str:
        path = root / f"{name}.json"
        path.write_text(json.dumps(turns))
        return f"scripted:{path}"

    write = script(
        "write",
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a", "content": "1"}}]},
            {"content": "ok"},
        ],
    )
    ask = script(
        "ask",
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "touch b"}}]},
            {"content": "ok"},
        ],
    )
    out = run_cli(["demo", "--db", db], env, ws)  # the demo ignores DURABLE_AGENT_DB on purpose
    assert out.startswith("0\n"), out
    demo = re.search(r"run (demo-\w+)", out).group(1)  # type: ignore[union-attr]
    assert (
        run_cli(["start", "t", "--model", ask, "--shell", "ask", "--run-id", "blocked"], env, ws)[0]
        == "5"
    )
    assert (
        run_cli(["start", "t", "--model", write, "--run-id", "crashed"], env, ws, crash_after=6)[:3]
        == "-9\n"
    )
    assert (
        run_cli(["start", "t", "--model", write, "--run-id", "retried"], env, ws, crash_after=2)[:3]
        == "-9\n"
    )
    assert run_cli(["resume", "retried"], env, ws)[0] == "0"
    assert (
        run_cli(["start", "t", "--model", write, "--run-id", "over", "--max-steps", "1"], env, ws)[
            0
        ]
        == "3"
    )
    return {
        "demo": demo,
        "blocked": "blocked",
        "crashed": "crashed",
        "retried": "retried",
        "over": "over",
    }


@pytest.fixture(scope="module")
def store(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[sqlite3.Connection, dict[str, str]]]:
    root = tmp_path_factory.mktemp("queries")
    db = root / "store.db"
    runs = populate(f"sqlite:///{db}", root)
    conn = sqlite3.connect(db)
    # As if the crashed run's lease had run out long ago (it is 30 s after the crash).
    conn.execute("UPDATE runs SET lease_expires_at = '2000-01-01 00:00:00' WHERE id = 'crashed'")
    conn.commit()
    yield conn, runs
    conn.close()


def test_the_document_has_ten_numbered_queries_each_with_an_expectation() -> None:
    numbered = {b.section for b in sql_blocks() if re.match(r"\d+\. ", b.section)}
    assert len(numbered) == 10
    assert {b.section for b in SQLITE_BLOCKS} == set(EXPECT)
    for section, expected in EXPECT.items():
        assert len([b for b in SQLITE_BLOCKS if b.section == section]) == len(expected), section


@pytest.mark.parametrize(
    "index",
    range(len(SQLITE_BLOCKS)),
    ids=[f"{b.section[:30]}#{i}" for i, b in enumerate(SQLITE_BLOCKS)],
)
@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_each_documented_query_runs_on_sqlite_and_finds_what_it_promises(store, index: int) -> None:
    conn, runs = store
    block = SQLITE_BLOCKS[index]
    position = [b for b in SQLITE_BLOCKS if b.section == block.section].index(block)
    expected = EXPECT[block.section][position]
    rows = conn.execute(block.sql.replace("RUN_ID", runs["demo"])).fetchall()
    if expected == "none":
        assert rows == []
    elif expected == "rows":
        assert rows
    else:
        assert any(runs[expected] in row for row in rows), f"{runs[expected]} not in {rows}"


def test_the_views_on_sqlite(store) -> None:
    conn, runs = store
    demo = runs["demo"]
    tool_rows = conn.execute(
        "SELECT tool_name, json_extract(arguments, '$.path'), duration_ms FROM tool_calls "
        "WHERE run_id = ? ORDER BY seq",
        (demo,),
    ).fetchall()
    assert [t for t, _, _ in tool_rows] == [
        "list_files",
        "read_file",
        "run_command",
        "search_text",
        "read_file",
        "edit_file",
        "run_command",
        "write_file",
    ]
    assert tool_rows[1][1] == "README.md" and all(d is not None for _, _, d in tool_rows)

    totals = conn.execute(
        "SELECT model_calls, tool_calls, total_tokens, prompt_tokens + completion_tokens, "
        "resume_count, step_rows, unfinished_steps, extra_attempts, pending_approvals "
        "FROM run_totals WHERE run_id = ?",
        (demo,),
    ).fetchone()
    assert totals[:2] == (9, 8) and totals[2] == totals[3] and totals[4:] == (1, 17, 0, 0, 0)
    assert conn.execute(
        "SELECT unfinished_steps FROM run_totals WHERE run_id = 'crashed'"
    ).fetchone() == (1,)
    assert conn.execute(
        "SELECT extra_attempts FROM run_totals WHERE run_id = 'retried'"
    ).fetchone() == (1,)
    assert conn.execute(
        "SELECT run_id, kind, command, run_status FROM pending_approvals"
    ).fetchall() == [("blocked", "approval_required", "touch b", "blocked")]


@pytest.mark.slow
@pytest.mark.postgres
def test_each_documented_query_runs_on_postgresql(tmp_path: Path) -> None:
    from scale_helpers import _libpq_url, pg_schema

    with pg_schema() as url:
        runs = populate(url, tmp_path)
        import psycopg

        with psycopg.connect(_libpq_url(url), autocommit=True) as conn:
            for block in sql_blocks():
                if block.section == "5. Runs stuck in `running`" and not block.postgres_only:
                    continue  # the SQLite spelling; its PostgreSQL twin follows
                if block.section == "10. Nothing ran twice" and "json_extract" in block.sql:
                    continue
                rows = conn.execute(block.sql.replace("RUN_ID", runs["demo"])).fetchall()  # type: ignore[arg-type]
                if block.section.startswith("6."):
                    assert [r[1] for r in rows] == ["blocked"]
                if block.section.startswith("10.") and "command" in block.sql:
                    assert len(rows) == 2
