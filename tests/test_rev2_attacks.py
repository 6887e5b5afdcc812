"""Review attacks on continue, memory, streaming and versioned resume (rev2)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from side_effects_support import query, run_cli

SAME = "go on"


def _scenario(
    env: dict[str, str], root: Path, script: list[dict[str, Any]]
) -> tuple[dict[str, str], Path, Path]:
    root.mkdir()
    (root / "ws").mkdir()
    path = root / "script.json"
    path.write_text(json.dumps(script))
    return {**env, "DURABLE_AGENT_DB": f"sqlite:///{root / 'store.db'}"}, root / "ws", path


def test_the_same_message_again_killed_before_it_is_recorded_is_not_lost(
    env: dict[str, str], tmp_path: Path
) -> None:
    """A person says the same words twice in a row (two turns); the second `continue` is
    killed after it took the run, before its message step committed. The same `continue`
    again must add the message as the new turn, not take the earlier turn's step for it."""
    senv, ws, script = _scenario(
        env, tmp_path / "s", [{"content": "a1"}, {"content": "a2"}, {"content": "a3"}]
    )
    db = tmp_path / "s" / "store.db"
    base = ("--quiet",)
    r = run_cli(senv, ws, "start", "t", "--model", f"scripted:{script}", "--run-id", "r", *base)
    assert r.code == 0, r.stderr
    r = run_cli(senv, ws, "continue", "r", SAME, *base)
    assert r.code == 0 and r.stdout.strip() == "a2", r.stderr
    r = run_cli({**senv, "DURABLE_AGENT_CRASH_AFTER": "1"}, ws, "continue", "r", SAME, *base)
    assert r.code == -signal.SIGKILL, (r.code, r.stderr)
    r = run_cli(senv, ws, "continue", "r", SAME, *base)
    assert r.code == 0, r.stderr
    assert r.stdout.strip() == "a3", r.stdout
    said = query(db, "SELECT COUNT(*) FROM messages WHERE role='user' AND content=?", SAME)
    assert said == [(2,)]
    assert query(db, "SELECT step_count, answer FROM runs") == [(3, "a3")]
