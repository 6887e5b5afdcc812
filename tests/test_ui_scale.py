"""The runs list stays fast at 100,000 runs: keyset pages on the indexed (created_at, id)
order cost the same on page 1 and page 1,999, with or without a status filter, on SQLite
and PostgreSQL. The figures are printed (-s) and recorded in docs/ui.md."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest
from ui_support import client, open_store

pytestmark = pytest.mark.slow
pytest.importorskip("starlette", reason="the `ui` extra is not installed")
RUNS = 100_000
STATUSES = (
    "completed",
    "completed",
    "completed",
    "failed",
    "blocked",
    "budget_exceeded",
    "cancelled",
    "pending",
)


def _fill(url: str) -> None:
    from sqlalchemy import insert

    from durable_agent.store.rows import utcnow
    from durable_agent.store.schema import runs

    store = open_store(url)
    start = utcnow() - timedelta(days=30)
    rows: list[dict[str, Any]] = []
    for i in range(RUNS):
        when = start + timedelta(seconds=i * 20)
        rows.append(
            {
                "id": f"run-{i:06d}",
                "task": f"task number {i} fix the {('parser', 'tests', 'docs')[i % 3]}",
                "workspace": "/w",
                "model": "gpt",
                "status": STATUSES[i % len(STATUSES)],
                "created_at": when,
                "updated_at": when,
                "step_count": i % 40,
                "tool_call_count": i % 30,
                "prompt_tokens": i,
                "completion_tokens": i // 3,
                "lease_epoch": 1,
                "cancel_requested": False,
                "message_count": 3,
                "active_ms": i % 9000,
                "resume_count": 0,
                "settings": {},
            }
        )
    with store.engine.begin() as conn:
        if store.engine.dialect.name != "postgresql":
            conn.execute(insert(runs), rows)
            return
        # COPY: an executemany is a statement a row on PostgreSQL here (store/engine.py's
        # OneAtATime), 100,000 round trips.
        from sqlalchemy import text

        raw = conn.connection.dbapi_connection
        assert raw is not None
        names = ", ".join(rows[0])
        with raw.cursor() as cur, cur.copy(f"COPY runs ({names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([json.dumps(v) if isinstance(v, dict) else v for v in row.values()])
        conn.execute(text("ANALYZE runs"))


def _timed(c: Any, params: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    best = float("inf")
    doc: dict[str, Any] = {}
    for _ in range(3):
        t = time.perf_counter()
        r = c.get("/api/runs", params=params)
        best = min(best, time.perf_counter() - t)
        assert r.status_code == 200
        doc = r.json()
    return best, doc


def test_runs_list_pages_are_as_fast_deep_as_on_top(store_url) -> None:  # type: ignore[no-untyped-def]
    _fill(store_url)
    c = client(store_url)
    figures: dict[str, float] = {}
    figures["page 1"], first = _timed(c, {})
    assert first["runs"][0]["id"] == "run-099999" and len(first["runs"]) == 50
    deep_cursor = None
    doc = first
    for _ in range(3):  # walk a few pages by cursor, then jump near the end with one of ours
        doc = c.get("/api/runs", params={"after": doc["next"]}).json()
    from durable_agent.ui.queries import encode_cursor

    near_end = open_store(store_url).get_run("run-000100")
    deep_cursor = encode_cursor(near_end)
    figures["page 1,998"], deep = _timed(c, {"after": deep_cursor})
    assert [r["id"] for r in deep["runs"]][:2] == ["run-000099", "run-000098"]
    figures["status=blocked, deep"], blocked = _timed(
        c, {"status": "blocked", "after": deep_cursor}
    )
    assert blocked["runs"] and all(r["status"] == "blocked" for r in blocked["runs"])
    figures["text filter, page 1"], found = _timed(c, {"q": "number 99999"})
    assert [r["id"] for r in found["runs"]] == ["run-099999"]
    t = time.perf_counter()
    assert c.get("/").status_code == 200
    figures["HTML page 1"] = time.perf_counter() - t
    print({k: f"{v * 1000:.0f} ms" for k, v in figures.items()})
    # Keyset pages cost the same at any depth (OFFSET would read 99,900 rows first).
    assert (
        figures["page 1,998"] < 0.5
        and figures["status=blocked, deep"] < 0.5
        and figures["page 1"] < 0.5
    )
