"""`max_tool_calls_per_turn`: an answer asking for more tool calls than that runs only the
first ones; every other call is answered "not run" without running, so the history stays
valid (one result per call) and a resume runs nothing more."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def _answer(n: int) -> list[dict[str, object]]:
    calls = [
        {"name": "write_file", "arguments": {"path": f"f{i}.txt", "content": f"{i}\n"}}
        for i in range(n)
    ]
    return [{"tool_calls": calls}, {"content": "done"}]


def _tool_rows(db: Path, run_id: str) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT content FROM messages WHERE run_id=? AND role='tool' ORDER BY seq",
                (run_id,),
            )
        ]


def test_calls_past_the_cap_are_answered_not_run(cli, write_script, db_path, workspace) -> None:  # type: ignore[no-untyped-def]
    script = write_script(_answer(100))
    r = cli("start", "t", "--model", script, "--run-id", "cap")
    assert r.code == 0, r.stderr
    written = sorted(int(p.stem[1:]) for p in workspace.glob("f*.txt"))
    assert written == list(range(64)), written  # the default cap: 64
    results = _tool_rows(db_path, "cap")
    assert len(results) == 100  # every call has exactly one result
    skipped = [t for t in results if "not run" in t]
    assert len(skipped) == 36 and all("max_tool_calls_per_turn" in t for t in skipped), skipped[:1]
    assert "asked for 100 tool calls" in skipped[0]
    shown = cli("show", "cap", "--json")
    assert shown.code == 0 and shown.json()["status"] == "completed", shown.stdout[:300]


def test_the_cap_is_a_setting(cli, write_script, db_path, workspace, tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = write_script(_answer(12))
    config = tmp_path / "config.toml"
    config.write_text("max_tool_calls_per_turn = 5\n")
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--run-id",
        "small",
        extra_env={"DURABLE_AGENT_CONFIG": str(config)},
    )
    assert r.code == 0, r.stderr
    assert sorted(p.name for p in workspace.glob("f*.txt")) == [f"f{i}.txt" for i in range(5)]
    results = _tool_rows(db_path, "small")
    assert len(results) == 12 and sum("not run" in t for t in results) == 7
