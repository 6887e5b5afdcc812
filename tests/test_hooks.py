"""Hooks through the real CLI with a scripted model: a pre_tool hook blocks `rm -rf` and the
model sees why; a post_tool hook keeps a ledger; SIGKILL at every checkpoint, resumed:
every finished hook's line once, an interrupted one asked about, never run again unasked."""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import forked_cli
import pytest

GUARD = (
    "python3 -c 'import json,sys; d=json.load(sys.stdin); "
    'c=d["arguments"].get("command",""); '
    'sys.exit((print("no recursive deletes here", file=sys.stderr), 2)[1] if "rm -rf" in c else 0)\''
)
LEDGER = (
    "python3 -c 'import json,sys; d=json.load(sys.stdin); "
    'open(".ledger","a").write(d["hook_key"]+"\\n")\''
)


def _config(env: dict[str, str], hooks: list[dict[str, Any]]) -> None:
    path = Path(env["XDG_CONFIG_HOME"]) / "durable-agent" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for h in hooks:
        lines.append("[[hooks]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in h.items()]
    path.write_text("\n".join(lines) + "\n")


def _steps(env: dict[str, str], run_id: str) -> list[tuple[str, str, str | None]]:
    db = env["DURABLE_AGENT_DB"].removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT idempotency_key, state, output FROM steps WHERE run_id=? AND kind='hook'",
            (run_id,),
        ).fetchall()


def test_a_pre_tool_hook_blocks_and_the_model_sees_why(
    env: dict[str, str], workspace: Path, write_script: Any
) -> None:
    _config(
        env,
        [
            {"event": "pre_tool", "tool": "run_command", "command": GUARD},
            {"event": "post_tool", "command": LEDGER},
        ],
    )
    model = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "rm -rf build"}}]},
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo fine"}}]},
            {"content": "done"},
        ]
    )
    proc = forked_cli.run(
        ["start", "clean up", "--model", model, "--shell", "allow", "--run-id", "r1", "--json"],
        env=env,
        cwd=workspace,
    )
    assert proc.returncode == 0, proc.stderr
    shown = forked_cli.run(["export", "r1"], env=env, cwd=workspace)
    assert "blocked by a pre_tool hook: no recursive deletes here" in shown.stdout
    ledger = (workspace / ".ledger").read_text().split()
    assert len(ledger) == 2 and len(set(ledger)) == 2  # one line per call, both calls
    assert all(state == "completed" for _, state, _ in _steps(env, "r1"))


def _status(env: dict[str, str], run_id: str) -> str:
    db = env["DURABLE_AGENT_DB"].removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        return str(conn.execute("SELECT status FROM runs WHERE id=?", (run_id,)).fetchone()[0])


def _run(env: dict[str, str], cwd: Path, args: list[str], crash: int | None) -> int:
    e = dict(env)
    if crash is not None:
        e["DURABLE_AGENT_CRASH_AFTER"] = str(crash)
    proc = forked_cli.run([*args, "--quiet"], env=e, cwd=cwd)
    assert proc.returncode in (0, 5, -signal.SIGKILL), proc.stderr
    return proc.returncode


@pytest.mark.slow
def test_sigkill_at_every_checkpoint_runs_each_finished_hook_once(
    env: dict[str, str], tmp_path: Path, write_script: Any
) -> None:
    _config(
        env,
        [
            {"event": "pre_tool", "command": LEDGER},
            {"event": "post_tool", "command": LEDGER},
            {"event": "stop", "command": LEDGER},
        ],
    )
    model = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo hi"}}]},
            {"content": "done"},
        ]
    )
    asked_total: set[str] = set()
    crash = 1
    while True:
        ws = tmp_path / f"ws{crash}"
        ws.mkdir()
        run_id = f"c{crash}"
        args = ["start", "t", "--model", model, "--shell", "allow", "--run-id", run_id]
        code = _run(env, ws, args, crash)
        if code == 0 and crash > 1:
            break  # past the last checkpoint: the run finished uninterrupted
        asked: set[str] = set()
        for _ in range(10):
            if _status(env, run_id) == "completed":  # killed after its last commit
                code = 0
                break
            code = _run(env, ws, ["resume", run_id], None)
            if code == 0:
                break
            # Blocked: an interrupted hook (not idempotent) is asked about; say no.
            db = env["DURABLE_AGENT_DB"].removeprefix("sqlite:///")
            with sqlite3.connect(db) as conn:
                pending = conn.execute(
                    "SELECT call_id FROM approvals WHERE run_id=? AND decision IS NULL", (run_id,)
                ).fetchall()
            assert pending  # an interrupted hook or command
            asked |= {c for (c,) in pending}
            assert forked_cli.run(["approve", run_id, "--deny"], env=env, cwd=ws).returncode == 0
        assert code == 0
        ledger = (ws / ".ledger").read_text().split() if (ws / ".ledger").exists() else []
        assert len(ledger) == len(set(ledger)), (crash, ledger)  # never a line twice
        for key, state, output in _steps(env, run_id):
            assert state == "completed"
            ran = json.loads(output).get("exit_code") == 0
            if ran:
                assert ledger.count(key) == 1, (crash, key)
            else:  # not run again after a crash: asked first
                assert key in asked, (crash, key)
        asked_total |= asked
        crash += 1
    assert crash > 8  # the kills hit hooks while they ran, too: those were asked about
    assert any(k.startswith("hook:") for k in asked_total), asked_total
