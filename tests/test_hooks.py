"""Hooks through the real CLI with a scripted model: a pre_tool hook blocks `rm -rf` and the
model sees why; a post_tool hook keeps a ledger; SIGKILL at every checkpoint, resumed:
every finished hook's line once, an interrupted one asked about, never run again unasked."""

from __future__ import annotations

import json
import signal
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


def _q(env: dict[str, str], query: str, **params: Any) -> list[tuple[Any, ...]]:
    """Rows from the run's store (SQLite or PostgreSQL), as tuples."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(env["DURABLE_AGENT_DB"])
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sqlalchemy.text(query), params)]
    finally:
        engine.dispose()


def _steps(env: dict[str, str], run_id: str) -> list[tuple[str, str, Any]]:
    rows = _q(
        env,
        "SELECT idempotency_key, state, output FROM steps WHERE run_id=:r AND kind='hook'",
        r=run_id,
    )
    return [(k, st, json.loads(o) if isinstance(o, str) else o) for k, st, o in rows]


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
    return str(_q(env, "SELECT status FROM runs WHERE id=:r", r=run_id)[0][0])


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
            pending = _q(
                env,
                "SELECT call_id FROM approvals WHERE run_id=:r AND decision IS NULL",
                r=run_id,
            )
            assert pending  # an interrupted hook or command
            asked |= {c for (c,) in pending}
            assert forked_cli.run(["approve", run_id, "--deny"], env=env, cwd=ws).returncode == 0
        assert code == 0
        ledger = (ws / ".ledger").read_text().split() if (ws / ".ledger").exists() else []
        assert len(ledger) == len(set(ledger)), (crash, ledger)  # never a line twice
        for key, state, output in _steps(env, run_id):
            assert state == "completed"
            ran = output.get("exit_code") == 0
            if ran:
                assert ledger.count(key) == 1, (crash, key)
            else:  # not run again after a crash: asked first
                assert key in asked, (crash, key)
        asked_total |= asked
        crash += 1
    assert crash > 8  # the kills hit hooks while they ran, too: those were asked about
    assert any(k.startswith("hook:") for k in asked_total), asked_total


WAITING = (
    "cat > /dev/null; echo started >> .hook-runs; "
    "while [ ! -e .go ]; do sleep 0.05; done; echo finished >> .hook-runs"
)


def _killed_during_the_hook(env: dict[str, str], ws: Path, model: str, run_id: str) -> None:
    """Start the run and SIGKILL it while its pre_tool hook runs (it waits for .go)."""
    import os
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent", "start", "t", "--model", model]
        + ["--shell", "allow", "--run-id", run_id, "--quiet"],
        env=env,
        cwd=ws,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not (ws / ".hook-runs").exists():  # the hook has begun
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (ws / ".go").touch()  # the hook can end now (when run again)


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_hook_cut_off_runs_again_only_when_idempotent_else_asks(
    env: dict[str, str], tmp_path: Path, write_script: Any, idempotent: bool, store_url: str
) -> None:
    env = {**env, "DURABLE_AGENT_DB": store_url}
    _config(env, [{"event": "pre_tool", "command": WAITING, "idempotent": idempotent}])
    model = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo hi"}}]},
            {"content": "done"},
        ]
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    _killed_during_the_hook(env, ws, model, "k1")
    assert (ws / ".hook-runs").read_text() == "started\n"
    code = _run(env, ws, ["resume", "k1"], None)
    if idempotent:
        assert code == 0
        assert (ws / ".hook-runs").read_text() == "started\nstarted\nfinished\n"
        return
    assert code == 5  # blocked: asked, not run
    assert (ws / ".hook-runs").read_text() == "started\n"
    asked = _q(
        env, "SELECT call_id, kind, command FROM approvals WHERE run_id='k1' AND decision IS NULL"
    )
    assert asked == [("hook:pre_tool:call_0_0:0", "uncertain_side_effect", WAITING)]
    assert _run(env, ws, ["resume", "k1"], None) == 5  # asked again, still not run
    assert (ws / ".hook-runs").read_text() == "started\n"
    assert forked_cli.run(["approve", "k1"], env=env, cwd=ws).returncode == 0
    assert _run(env, ws, ["resume", "k1"], None) == 0
    assert (ws / ".hook-runs").read_text() == "started\nstarted\nfinished\n"


def test_a_stop_hook_sends_the_model_back_to_work(
    env: dict[str, str], workspace: Path, write_script: Any
) -> None:
    check = "cat > /dev/null; [ -e done.txt ] || { echo 'write done.txt first' >&2; exit 2; }"
    _config(env, [{"event": "stop", "command": check}])
    model = write_script(
        [
            {"content": "finished"},
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "done.txt", "content": "y"}}
                ]
            },
            {"content": "finished, really"},
        ]
    )
    proc = forked_cli.run(
        ["start", "t", "--model", model, "--run-id", "s1", "--json"], env=env, cwd=workspace
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["answer"] == "finished, really"
    said = [r[0] for r in _q(env, "SELECT content FROM messages WHERE role='user'")]
    assert any("write done.txt first" in (m or "") for m in said)


def test_rules_ask_and_deny_file_tools_in_a_run(
    env: dict[str, str], workspace: Path, write_script: Any, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[rules]]\ndecision = "deny"\ntool = "write_file"\npath = "secrets/**"\n'
        'reason = "secrets are written by people"\n'
        '[[rules]]\ndecision = "ask"\ntool = "edit_file"\n'
    )
    (workspace / "a.txt").write_text("old\n")
    model = write_script(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "secrets/k", "content": "x"}}
                ]
            },
            {
                "tool_calls": [
                    {
                        "name": "edit_file",
                        "arguments": {"path": "a.txt", "old_string": "old", "new_string": "new"},
                    }
                ]
            },
            {"content": "done"},
        ]
    )
    args = ["start", "t", "--model", model, "--run-id", "f1", "--rules", str(rules)]
    assert _run(env, workspace, args, None) == 5  # the edit asks
    assert not (workspace / "secrets").exists()
    assert (workspace / "a.txt").read_text() == "old\n"
    assert forked_cli.run(["approve", "f1"], env=env, cwd=workspace).returncode == 0
    assert _run(env, workspace, ["resume", "f1"], None) == 0
    assert (workspace / "a.txt").read_text() == "new\n"
    said = [r[0] for r in _q(env, "SELECT content FROM messages WHERE role='tool' ORDER BY seq")]
    recorded = json.loads(_q(env, "SELECT settings FROM runs WHERE id='f1'")[0][0])
    assert "secrets are written by people" in said[0]
    assert [r["source"] for r in recorded["rules"]] == [str(rules)] * 2


def test_session_start_resume_and_pre_compact_hooks(
    env: dict[str, str], workspace: Path, write_script: Any, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[rules]]\ndecision = "ask"\ntool = "write_file"\n'
        + "".join(
            f'[[hooks]]\nevent = "{e}"\ncommand = {json.dumps(LEDGER)}\n'
            for e in ("session_start", "resume", "pre_compact")
        )
    )
    model = write_script(
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "nope"}}]},
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a", "content": "1"}}]},
            {"content": "done"},
        ]
    )
    args = ["start", "t", "--model", model, "--run-id", "e1", "--rules", str(rules)]
    assert _run(env, workspace, args, None) == 5
    assert forked_cli.run(["compact", "e1"], env=env, cwd=workspace).returncode == 0
    assert forked_cli.run(["approve", "e1"], env=env, cwd=workspace).returncode == 0
    assert _run(env, workspace, ["resume", "e1"], None) == 0
    assert (workspace / ".ledger").read_text().split() == [
        "hook:session_start:s0:0",
        "hook:pre_compact:t2:2",  # `compact` took the lease: the resume is the third session
        "hook:session_start:s2:0",
        "hook:resume:s2:1",
    ]


def test_a_hook_gets_its_whole_document_however_large_the_call(
    env: dict[str, str], workspace: Path, write_script: Any
) -> None:
    # One exec string holds at most 128 KiB, and JSON spells each non-ASCII character in
    # six bytes: a file written whole, or a result of accented text, is a larger document.
    content = "é'\"$(x)`\\\n" * 20_000
    seen = (
        "python3 -c 'import json,sys; d=json.load(sys.stdin); "
        'open(".seen","a").write(d["event"]+" "+str(len(d["arguments"].get("content","")))'
        '+" "+str(len(d.get("result","")))+"\\n")\''
    )
    _config(env, [{"event": "pre_tool", "command": seen}, {"event": "post_tool", "command": seen}])
    model = write_script(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "a", "content": content}}
                ]
            },
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "cat a"}}]},
            {"content": "done"},
        ]
    )
    args = ["start", "t", "--model", model, "--shell", "allow", "--run-id", "h1", "--json"]
    proc = forked_cli.run(args, env=env, cwd=workspace)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (workspace / "a").read_text() == content
    lines = (workspace / ".seen").read_text().splitlines()
    assert lines[0] == f"pre_tool {len(content)} 0"
    assert lines[2].startswith("pre_tool 0 0") and lines[3].startswith("post_tool 0 ")
    assert int(lines[3].split()[2]) > 5_000  # the command's output, as the model saw it


PROBE = """import json, os, sys
doc = json.load(sys.stdin)
lines, pid = [], os.getppid()
while pid > 1:  # the shell and its subshell above this hook, up to the sandbox's init
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        lines.append(f.read())
    with open(f"/proc/{pid}/stat") as f:
        pid = int(f.read().rsplit(")", 1)[1].split()[1])
with open(".probe", "wb") as f:
    f.write(doc["arguments"]["content"].encode() + b"\\n" + b"\\n".join(lines))
"""


def test_a_hooks_document_is_in_no_command_line(
    env: dict[str, str], workspace: Path, write_script: Any
) -> None:
    """The document (a tool's arguments) reaches the hook on stdin, and is on no command
    line of the processes that run it: `ps` shows those to every user of the host."""
    (workspace / "probe.py").write_text(PROBE)
    _config(env, [{"event": "pre_tool", "tool": "write_file", "command": "python3 probe.py"}])
    model = write_script(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "a", "content": "MARK-7f1c"}}
                ]
            },
            {"content": "done"},
        ]
    )
    args = ["start", "t", "--model", model, "--shell", "allow", "--run-id", "h2", "--json"]
    proc = forked_cli.run(args, env=env, cwd=workspace)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got, *cmdlines = (workspace / ".probe").read_bytes().split(b"\n")
    assert got == b"MARK-7f1c" and cmdlines  # the document came, and its shells were seen
    assert not any(b"MARK-7f1c" in line for line in cmdlines), cmdlines


def test_a_hook_that_cannot_start_is_the_hooks_failure_not_the_runs(
    env: dict[str, str], workspace: Path, write_script: Any
) -> None:
    """A hook whose process cannot start (here an environment variable passed to commands
    longer than one exec string may be) is recorded as failed, exit 127 and why, and the
    run goes on: a failing hook never ends the run it watches."""
    env = {**env, "HUGE_SETTING": "x" * 200_000}
    _config(env, [{"event": "pre_tool", "tool": "write_file", "command": "true"}])
    path = Path(env["XDG_CONFIG_HOME"]) / "durable-agent" / "config.toml"
    path.write_text('command_env = ["HUGE_SETTING"]\n' + path.read_text())
    model = write_script(
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a", "content": "x"}}]},
            {"content": "done"},
        ]
    )
    args = ["start", "t", "--model", model, "--run-id", "h3", "--json", "--sandbox", "off"]
    proc = forked_cli.run(args, env=env, cwd=workspace)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (workspace / "a").read_text() == "x"
    ((_key, state, output),) = _steps(env, "h3")
    got = json.loads(output) if isinstance(output, str) else output
    assert state == "completed" and got["exit_code"] == 127, got
    assert "could not start" in got["stderr"] and "HUGE_SETTING" in got["stderr"]
