"""`durable-agent demo`: offline, a real SIGKILL of a child process, a resume, and a report
that is checked against the database and the workspace it leaves behind."""

from __future__ import annotations

import re
import shlex
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from durable_agent.demo.checks import check_story


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_demo_crashes_resumes_and_shows_nothing_ran_twice(
    cli, env, tmp_path: Path, db_path: Path
) -> None:
    # The user's own configuration must not change the story, nor their store receive the run.
    config = tmp_path / "user.toml"
    config.write_text('max_steps = 2\nverify = "false"\nshell = "deny"\n')
    began = time.monotonic()
    r = cli(
        "demo",
        extra_env={
            "DURABLE_AGENT_CONFIG": str(config),
            "OPENAI_API_KEY": "sk-unused",
            "TMPDIR": str(tmp_path),
        },
    )  # what it keeps goes with the test (XDG_DATA_HOME)
    elapsed = time.monotonic() - began
    assert r.code == 0, r.stdout + r.stderr
    assert elapsed < 30, f"the demo took {elapsed:.1f} s"
    out = r.stdout
    assert "power goes out right after edit_file writes calc.py" in out
    assert re.search(r"process \d+ killed by SIGKILL", out)
    assert "intent recorded, outcome never committed" in out
    assert "calc.py on disk: already edited (the write happened)" in out
    assert "↻ resumed run demo-" in out
    assert "exited with code 0" in out
    assert "kept as recorded, not run again" in out
    assert "(no rows)" in out
    assert (
        "test_calc.py logged 2 runs in the workspace, by call: call_2_0 ×1 (before the crash), call_6_0 ×1 (after)"
        in out
    )
    assert "edit_file (step 11): cut off by the crash; the resume checked the workspace" in out
    # One step number everywhere (docs/schema.md): the demo's SQL and its side-by-side table
    # print steps.seq as stored, the number its sentences use.
    assert re.search(r"^\s+11\s+edit_file\s+call_5_0\s+1\s+completed\s*$", out, re.M), out
    assert "seq + 1" not in out
    assert out.rstrip().splitlines()[-2].startswith("kept: ")
    assert "✓ crashed with SIGKILL, resumed, finished; nothing ran twice" in out

    # What it reported is what the store and the workspace hold.
    root = Path(out.rstrip().splitlines()[-2].removeprefix("kept: "))
    assert root.parent == Path(env["XDG_DATA_HOME"]) / "durable-agent" / "demo"
    with sqlite3.connect(root.parent / "demo.db") as conn:
        [(run_id, status, resumes, steps)] = conn.execute(
            "SELECT id, status, resume_count, step_count FROM runs"
        ).fetchall()
        assert (status, resumes, steps) == ("completed", 1, 9)
        assert conn.execute("SELECT COUNT(*) FROM steps WHERE attempts != 1").fetchone() == (0,)
        edit = conn.execute(
            "SELECT state, json_extract(output, '$.result') FROM steps "
            "WHERE tool_name = 'edit_file'"
        ).fetchone()
        assert edit[0] == "completed" and "already has the intended content" in edit[1]
    assert f"run {run_id}" in out
    assert (root / "project" / ".test-runs.log").read_text().split() == ["call_2_0", "call_6_0"]
    assert "return a + b" in (root / "project" / "calc.py").read_text()
    if db_path.exists():  # DURABLE_AGENT_DB of the test environment: untouched
        with sqlite3.connect(db_path) as conn:
            assert conn.execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_demo_records_into_a_given_db_and_keeps_its_workspace(cli, env, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'mine.db'}"
    r = cli("demo", "--db", url)
    assert r.code == 0, r.stdout + r.stderr
    workspace = Path(re.search(r"workspace  (\S+)", r.stdout).group(1))  # type: ignore[union-attr]
    assert (workspace / "calc.py").exists()  # kept, for `diff` and `show`
    with sqlite3.connect(tmp_path / "mine.db") as conn:
        assert conn.execute("SELECT status, resume_count FROM runs").fetchall() == [
            ("completed", 1)
        ]
    assert f"--db {url}" in r.stdout  # how to look at it again
    assert not (workspace.parent.parent / "demo.db").exists()  # the given store, not its own


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_the_commands_the_demo_prints_find_its_run_until_clean_removes_it(
    env: dict[str, str], tmp_path: Path, db_path: Path
) -> None:
    """After the README's install (`.venv/bin/durable-agent demo`, nothing on PATH), every
    command it printed is pasted as printed, from the same directory, and works."""
    program = Path(sys.executable).parent / "durable-agent"
    assert program.exists(), "the console script of this install"
    env = {**env, "PATH": "/usr/bin:/bin"}  # (not this install's bin: as after the README)

    def run(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            shlex.split(command),
            cwd=program.parent.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    demo = run("bin/durable-agent demo")
    assert demo.returncode == 0, demo.stdout + demo.stderr
    run_id = re.search(r"run (demo-[0-9a-f]{8})", demo.stdout).group(1)  # type: ignore[union-attr]
    printed = [
        line.split(": ", 1)[-1].strip()
        for line in demo.stdout.splitlines()
        if "bin/durable-agent " in line and "--db" in line
    ]
    show = next(c for c in printed if c.startswith("bin/durable-agent show "))
    resume = next(c for c in printed if c.startswith("bin/durable-agent resume "))
    listing = next(c for c in printed if c.startswith("bin/durable-agent list "))
    assert run_id in show and run_id in resume
    shown = run(show)
    assert shown.returncode == 0 and f"run        {run_id}" in shown.stdout, shown.stderr
    again = run(resume)  # completed: said so, not "no run with id"
    assert "no run with id" not in again.stderr and run_id in again.stdout + again.stderr
    assert run_id in run(listing).stdout
    # The user's own store holds none of it, and its `list` says where the demo's runs are.
    mine = run("bin/durable-agent list")
    assert "no runs yet" in mine.stdout
    assert "the demo's runs are kept in a store of their own: bin/durable-agent list --db" in (
        mine.stdout
    )
    assert not db_path.exists() or "demo-" not in run("bin/durable-agent list").stdout

    clean = run("bin/durable-agent demo --clean")
    assert clean.returncode == 0, clean.stderr
    assert "removed " in clean.stdout and "1 demo run(s)" in clean.stdout
    home = Path(env["XDG_DATA_HOME"]) / "durable-agent" / "demo"
    assert not home.exists()
    assert "their own" not in run("bin/durable-agent list").stdout
    gone = run(show)
    assert gone.returncode != 0 and f"no run with id '{run_id}'" in gone.stderr


T0, T1 = datetime(2026, 1, 1, 12, 0, 0), datetime(2026, 1, 1, 12, 0, 1)


def step(
    seq: int,
    kind: str,
    state: str = "completed",
    finished_at: datetime | None = T0,
    attempts: int = 1,
    tool_name: str | None = None,
    call_id: str | None = None,
) -> SimpleNamespace:
    return SimpleNamespace(
        seq=seq,
        kind=kind,
        state=state,
        finished_at=finished_at,
        attempts=attempts,
        tool_name=tool_name,
        call_id=call_id,
        idempotency_key=f"{kind}:{seq}",
        prompt_tokens=10 if kind == "model" else None,
        completion_tokens=5 if kind == "model" else None,
        output={"result": "ok"},
    )


def test_the_checks_catch_what_would_make_the_demo_a_lie() -> None:
    run = SimpleNamespace(
        status="completed",
        stop_reason="finished",
        step_count=2,
        prompt_tokens=20,
        completion_tokens=10,
    )
    before = [step(0, "model"), step(1, "tool", tool_name="run_command", call_id="c1")]
    honest = [*before, step(2, "model")]
    fixed = "def add(a, b):\n    return a + b\n"
    good = check_story(
        run=run,
        before=before,
        after=honest,
        resumed_code=0,
        witness_before=Counter(c1=1),
        witness=Counter(c1=1),
        calc_py=fixed,
    )
    assert good.ok, good.problems

    rerun = [
        before[0],
        step(1, "tool", finished_at=T1, tool_name="run_command", call_id="c1"),
        step(2, "model"),
    ]
    bad = check_story(
        run=run,
        before=before,
        after=rerun,
        resumed_code=0,
        witness_before=Counter(c1=1),
        witness=Counter(c1=2),
        calc_py=fixed,
    )
    assert not bad.ok
    assert "step 1 (tool) was executed again after the resume" in bad.problems
    assert any("the workspace saw test runs {'c1': 2}" in p for p in bad.problems)

    unfixed = check_story(
        run=SimpleNamespace(**{**vars(run), "status": "failed"}),
        before=before,
        after=honest,
        resumed_code=1,
        witness_before=Counter(c1=1),
        witness=Counter(c1=1),
        calc_py="return a - b",
    )
    assert not unfixed.ok
    assert len(unfixed.problems) == 2


@pytest.mark.slow
def test_demo_without_any_sandbox_says_so_in_one_line_and_runs(
    env, tmp_path: Path, workspace: Path
) -> None:
    from side_effects_support import run_cli

    empty = tmp_path / "empty-path"  # no bwrap on PATH; Landlock ruled out by the test hook
    empty.mkdir()
    r = run_cli(
        {**env, "PATH": str(empty), "DURABLE_AGENT_NO_LANDLOCK": "1", "TMPDIR": str(tmp_path)},
        workspace,
        "demo",
    )
    assert r.code == 0, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines() if "unsandboxed" in line]
    assert len(lines) == 1 and "no bubblewrap, no Landlock" in lines[0]
    assert "✓ crashed with SIGKILL, resumed, finished; nothing ran twice" in r.stdout
    # Kept, and the commands it offers name the demo's store.
    assert "see it yourself" in r.stdout and "demo/demo.db" in r.stdout
    assert "demo --clean` removes what the demos kept" in r.stdout.rstrip().splitlines()[-1]
