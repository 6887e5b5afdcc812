"""Turns cut off by a crash before their first commit: a `continue` or a `compact` killed
after taking the run leaves it as it ended (the same message again is a new turn, never taken
for the last one), and a run whose first model call was cut off is not given project memory
written after it (its call's request must stay what it was)."""

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


def test_memory_written_after_a_crash_in_the_first_model_call_does_not_stop_the_run(
    env: dict[str, str], tmp_path: Path
) -> None:
    """No AGENTS.md when the run began (no memory step), killed inside its first model call;
    then the person adds AGENTS.md. The resume goes on (the files are read for the run, or
    not), it does not end in a "history diverged" failure."""
    senv, ws, script = _scenario(env, tmp_path / "s", [{"content": "a1"}])
    db = tmp_path / "s" / "store.db"
    r = run_cli(
        {**senv, "DURABLE_AGENT_CRASH_AFTER": "2"},
        ws,
        "start",
        "t",
        "--model",
        f"scripted:{script}",
        "--run-id",
        "r",
        "--quiet",
    )
    assert r.code == -signal.SIGKILL, (r.code, r.stderr)
    assert query(db, "SELECT kind, state FROM steps") == [("model", "started")]
    (ws / "AGENTS.md").write_text("always say please\n")
    r = run_cli(senv, ws, "resume", "r", "--quiet")
    assert r.code == 5, r.stderr  # (the new file is drift: the person says go on with it)
    assert run_cli(senv, ws, "approve", "r").code == 0
    r = run_cli(senv, ws, "resume", "r", "--quiet")
    assert r.code == 0, r.stderr
    assert query(db, "SELECT status, answer FROM runs") == [("completed", "a1")]


def test_a_compact_killed_then_the_same_message_again_is_a_new_turn(
    env: dict[str, str], tmp_path: Path
) -> None:
    """`compact` takes the run (it reads `running` while it works) and puts it back; killed
    before it put it back, the run must not pass for a `continue` cut off in its turn."""
    call = {"tool_calls": [{"name": "list_files", "arguments": {}}]}
    senv, ws, script = _scenario(env, tmp_path / "s", [call, call, {"content": "a3"}])
    db = tmp_path / "s" / "store.db"
    start = ("--model", f"scripted:{script}", "--run-id", "r", "--max-steps", "1", "--quiet")
    assert run_cli(senv, ws, "start", "t", *start).code == 3
    assert run_cli(senv, ws, "continue", "r", SAME, "--quiet").code == 3
    r = run_cli({**senv, "DURABLE_AGENT_CRASH_AFTER": "1"}, ws, "compact", "r")
    assert r.code == -signal.SIGKILL, (r.code, r.stderr)
    r = run_cli(senv, ws, "continue", "r", SAME, "--quiet")
    assert r.code == 0, r.stderr
    assert r.stdout.strip() == "a3"
    said = query(db, "SELECT COUNT(*) FROM messages WHERE role='user' AND content=?", SAME)
    assert said == [(2,)]
