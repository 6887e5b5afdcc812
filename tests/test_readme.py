"""The README's SQL examples run against a real store and return what they promise."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_opens_with_the_demo_and_the_test_command() -> None:
    text = README.read_text()
    first_block = text.split("```sh", 1)[1].split("```", 1)[0]
    assert "durable-agent demo" in first_block and "scripts/test" in first_block


def test_readme_queries_run_on_a_real_store(cli, write_script, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo hi"}}]},
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}}
                ]
            },
            {"content": "done"},
        ]
    )
    assert cli("start", "t", "--model", script, "--shell", "allow", "--run-id", "readme").code == 0
    blocks = re.findall(r"```sql\n(.*?)```", README.read_text(), re.S)
    statements = [s.strip() for block in blocks for s in block.split(";") if s.strip()]
    assert len(statements) >= 3
    db = sqlite3.connect(db_path)
    results = [db.execute(s.replace("RUN_ID", "readme")).fetchall() for s in statements]
    assert results[0][0][:3] == ("readme", "completed", "finished")
    assert [r[1] for r in results[1]] == ["model", "tool", "model", "tool", "model"]
    assert results[2] == [("readme", "echo hi", 0, results[2][0][3])]
