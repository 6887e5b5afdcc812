"""A big answer is stored once, in its messages row: not again in the model step's output
nor in its tool step's input (a 50 MB answer took about three times that). The step rows
keep a readable head, and `export` still gives the whole answer and arguments."""

from __future__ import annotations

import json
import sqlite3

BIG = 3_000_000


def test_a_big_answer_and_big_arguments_are_stored_once(
    cli, write_script, db_path, workspace
) -> None:  # type: ignore[no-untyped-def]
    content = "y" * BIG
    answer = "done " + "x" * BIG
    script = write_script(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "big.txt", "content": content}}
                ]
            },
            {"content": answer},
        ]
    )
    r = cli("start", "t", "--model", script, "--run-id", "big")
    assert r.code == 0, r.stderr
    assert (workspace / "big.txt").read_text() == content
    with sqlite3.connect(db_path) as conn:
        in_steps = conn.execute(
            "SELECT SUM(LENGTH(input) + COALESCE(LENGTH(output), 0)) FROM steps WHERE run_id='big'"
        ).fetchone()[0]
        in_messages = conn.execute(
            "SELECT SUM(COALESCE(LENGTH(content), 0) + COALESCE(LENGTH(tool_calls), 0)) "
            "FROM messages WHERE run_id='big'"
        ).fetchone()[0]
        (shown,) = conn.execute("SELECT arguments FROM tool_calls WHERE run_id='big'").fetchone()
        (model_head,) = conn.execute(
            "SELECT json_extract(output, '$.content') FROM steps WHERE run_id='big' AND seq=2"
        ).fetchone()
    assert in_messages > 2 * BIG  # the history holds both whole
    assert in_steps < 50_000, in_steps  # and the step rows no copy of either
    # Readable in SQL: the view's arguments and the step's answer start as the real ones.
    assert json.loads(shown)["path"] == "big.txt" and json.loads(shown)["content"].startswith("yyy")
    assert model_head.startswith("done xxx")
    events = [json.loads(line) for line in cli("export", "big").stdout.splitlines()]
    started = next(e for e in events if e["type"] == "tool_started")
    assert started["arguments"] == {"path": "big.txt", "content": content}
    answers = [e["content"] for e in events if e["type"] == "model_completed"]
    assert answers[-1] == answer
    called = next(e for e in events if e["type"] == "model_completed")["tool_calls"][0]
    assert called["arguments"] == {"path": "big.txt", "content": content}
