"""Delegation (docs/delegation.md): a `delegate` call makes a child run, once, whatever crashes.

Real CLI processes with scripted models: one script for the parent and its children, keyed
by each run's task. DURABLE_AGENT_CRASH_AFTER=k SIGKILLs the process at its k-th checkpoint
boundary, the children's commits counted too (they run in the parent's process): every k
from 1 until a run that is not killed covers every window, before the delegate intent, after
it, inside each child, and after a child ended before the parent recorded its answer.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import forked_cli
import pytest
from scale_helpers import pg_rows

CHILDREN = {
    f"write {name}": [
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": f"{name}.txt", "content": name}}
            ]
        },
        {"tool_calls": [{"name": "read_file", "arguments": {"path": f"{name}.txt"}}]},
        {"content": f"{name} written"},
    ]
    for name in ("alpha", "beta", "gamma")
}


def three_children_script(path: Path) -> str:
    calls = [
        {"name": "delegate", "arguments": {"task": task, "workspace": "shared-write"}}
        for task in CHILDREN
    ]
    script = {"*": [{"tool_calls": calls}, {"content": "all three written"}], **CHILDREN}
    path.write_text(json.dumps(script))
    return f"scripted:{path}"


def run(env: dict[str, str], cwd: Path, *args: str, crash_after: int | None = None) -> Any:
    e = dict(env)
    if crash_after is not None:
        e["DURABLE_AGENT_CRASH_AFTER"] = str(crash_after)
    return forked_cli.run([*args, "--quiet"], env=e, cwd=cwd, timeout=120)


def query(db: Path, statement: str, *params: Any) -> list[Any]:
    with sqlite3.connect(db) as con:
        return con.execute(statement, params).fetchall()


def ledger(db: Path, parent: str) -> dict[str, Any]:
    """What must be the same after any crashes as without: the runs, their answers, the
    parent's observations, each child's completed steps."""
    kids = query(
        db,
        "SELECT id, status, answer, parent_step FROM runs WHERE parent_id = ? ORDER BY parent_step",
        parent,
    )
    return {
        "parent": query(db, "SELECT status, answer FROM runs WHERE id = ?", parent),
        "observations": query(
            db,
            "SELECT tool_call_id, content FROM messages WHERE run_id = ? AND role = 'tool' "
            "ORDER BY seq",
            parent,
        ),
        "children": [(k[1], k[2]) for k in kids],
        "child_steps": [
            query(
                db,
                "SELECT kind, tool_name, state FROM steps WHERE run_id = ? ORDER BY seq",
                k[0],
            )
            for k in kids
        ],
        "tree": query(
            db, "SELECT depth, COUNT(*) FROM run_tree WHERE root_id = ? GROUP BY depth", parent
        ),
    }


def check_once(db: Path, parent: str) -> None:
    """Each child made once, by its delegate step; no step twice; one observation per call."""
    steps = query(
        db, "SELECT seq FROM steps WHERE run_id = ? AND kind = 'delegate' ORDER BY seq", parent
    )
    kids = query(
        db, "SELECT parent_step FROM runs WHERE parent_id = ? ORDER BY parent_step", parent
    )
    assert kids == steps and len(kids) == 3
    assert query(db, "SELECT COUNT(*) FROM runs") == [(4,)]
    assert (
        query(
            db,
            "SELECT run_id, idempotency_key FROM steps GROUP BY 1, 2 HAVING COUNT(*) > 1",
        )
        == []
    )
    assert query(db, "SELECT COUNT(*) FROM steps WHERE state != 'completed'") == [(0,)]
    assert (
        query(
            db,
            "SELECT run_id, tool_call_id FROM messages WHERE role = 'tool' "
            "GROUP BY 1, 2 HAVING COUNT(*) > 1",
        )
        == []
    )


def reference(tmp_path: Path, env: dict[str, str], model: str) -> dict[str, Any]:
    ws, db = tmp_path / "reference", tmp_path / "reference.db"
    ws.mkdir()
    e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}"}
    r = run(e, ws, "start", "delegate the writes", "--delegate", "--model", model, "--run-id", "p")
    assert r.returncode == 0, r.stderr
    check_once(db, "p")
    return {"ledger": ledger(db, "p"), "files": sorted(p.name for p in ws.iterdir())}


def test_three_children_make_a_tree_and_their_tokens_roll_up(
    tmp_path: Path, env: dict[str, str]
) -> None:
    model = three_children_script(tmp_path / "script.json")
    ref = reference(tmp_path, env, model)
    assert ref["files"] == ["alpha.txt", "beta.txt", "gamma.txt"]
    got = ref["ledger"]
    assert got["parent"] == [("completed", "all three written")]
    assert [o[1] for o in got["observations"]] == [
        "alpha written",
        "beta written",
        "gamma written",
    ]
    assert got["tree"] == [(0, 1), (1, 3)]
    db = tmp_path / "reference.db"
    # The parent's tokens are its own model calls' and its children's.
    own = query(
        db,
        "SELECT SUM(prompt_tokens + completion_tokens) FROM steps WHERE run_id = 'p' "
        "AND kind = 'model'",
    )[0][0]
    kids = query(
        db, "SELECT SUM(prompt_tokens + completion_tokens) FROM runs WHERE parent_id = 'p'"
    )[0][0]
    total = query(db, "SELECT prompt_tokens + completion_tokens FROM runs WHERE id = 'p'")[0][0]
    assert kids > 0 and total == own + kids


def _sweep(tmp_path: Path, env: dict[str, str], stride: int) -> int:
    model = three_children_script(tmp_path / "script.json")
    ref = reference(tmp_path, env, model)
    k = 1
    while True:
        ws, db = tmp_path / f"ws{k}", tmp_path / f"s{k}.db"
        ws.mkdir()
        e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}"}
        args = ("start", "delegate the writes", "--delegate", "--model", model, "--run-id", "p")
        r = run(e, ws, *args, crash_after=k)
        if r.returncode == 0:
            return k  # past the last boundary: the whole run was swept
        assert r.returncode == -signal.SIGKILL, r.stderr
        if not query(db, "SELECT 1 FROM runs WHERE id = 'p'"):
            r = run(e, ws, *args)  # killed before the run existed: start it again
            assert r.returncode == 0, (k, r.stdout, r.stderr)
        elif query(db, "SELECT status FROM runs WHERE id = 'p'") != [("completed",)]:
            r = run(e, ws, "resume", "p")  # (killed after its last commit: nothing to do)
            assert r.returncode == 0, (k, r.stdout, r.stderr)
        check_once(db, "p")
        assert ledger(db, "p") == ref["ledger"], k
        assert sorted(p.name for p in ws.iterdir()) == ref["files"]
        for name in ("alpha", "beta", "gamma"):
            assert (ws / f"{name}.txt").read_text() == name
        k += stride


@pytest.mark.slow
def test_sigkill_at_every_checkpoint_of_a_parent_with_three_children(
    tmp_path: Path, env: dict[str, str]
) -> None:
    boundaries = _sweep(tmp_path, env, 1)
    assert boundaries > 40  # the parent's and all three children's checkpoints


def _start(env: dict[str, str], ws: Path, tmp_path: Path, script: dict[str, Any], *extra: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(script))
    return forked_cli.run(
        ["start", "top", "--delegate", "--model", f"scripted:{path}", "--run-id", "p", *extra],
        env=env,
        cwd=ws,
        timeout=120,
    )


def _delegate(task: str, **more: Any) -> dict[str, Any]:
    return {"name": "delegate", "arguments": {"task": task, **more}}


def test_limits_and_a_failed_child_are_error_observations(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    (tmp_path / "xdg-config" / "durable-agent").mkdir(parents=True)
    (tmp_path / "xdg-config" / "durable-agent" / "config.toml").write_text(
        "max_children = 2\nmax_depth = 1\n"
    )
    script = {
        "*": [
            {
                "tool_calls": [
                    _delegate("fail"),
                    _delegate("nest", workspace="shared-write"),  # read-only: no delegate tool
                    _delegate("third"),
                ]
            },
            {"tool_calls": [_delegate("fail", tools=["nope"])]},
            {"content": "parent went on"},
        ],
        # max_steps=1 is given by nobody: the child's script asks for a tool it lacks and
        # then runs out of answers; `fail` ends budget_exceeded with --max-steps 2.
        "fail": [{"tool_calls": [{"name": "list_files", "arguments": {}}]}] * 5,
        "nest": [
            {"tool_calls": [_delegate("deeper")]},
            {"content": "nest done"},
        ],
    }
    r = _start(env, workspace, tmp_path, script, "--max-steps", "2")
    assert r.returncode == 3, r.stderr  # the parent: budget_exceeded after its own 2 calls
    tool = query(
        db_path, "SELECT content FROM messages WHERE run_id = 'p' AND role = 'tool' ORDER BY seq"
    )
    texts = [t[0] for t in tool]
    assert texts[0].startswith("Error: child run p-") and "ended budget_exceeded" in texts[0]
    assert texts[1] == "nest done"
    assert "max_children=2" in texts[2] and texts[2].startswith("Error: not delegated")
    assert "unknown tools for the child: nope" in texts[3]
    nest = query(db_path, "SELECT id FROM runs WHERE task = 'nest'")[0][0]
    deeper = query(
        db_path, "SELECT content FROM messages WHERE run_id = ? AND role = 'tool'", nest
    )[0][0]
    assert "max_depth" in deeper and "depth 1" in deeper
    assert query(db_path, "SELECT COUNT(*) FROM runs") == [(3,)]
    # A read-only child's tools are recorded with it: whoever resumes it offers only those.
    recorded = query(db_path, "SELECT settings FROM runs WHERE task = 'fail'")[0][0]
    assert json.loads(recorded)["child_tools"] == [
        "list_files",
        "read_file",
        "read_output",
        "search_text",
    ]


def test_a_blocked_child_blocks_the_parent_and_approve_answers_it(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    command = "touch made.txt"
    script = {
        "*": [
            {"tool_calls": [_delegate("make it", workspace="shared-write")]},
            {"content": "parent done"},
        ],
        "make it": [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
            {"content": "made"},
        ],
    }
    r = _start(env, workspace, tmp_path, script)
    assert r.returncode == 5, r.stderr  # blocked, as its child
    assert f"is blocked: approval_required for {command}" in r.stderr
    child = query(db_path, "SELECT id FROM runs WHERE parent_id = 'p'")[0][0]
    assert query(db_path, "SELECT status FROM runs ORDER BY id") == [
        ("blocked",),
        ("blocked",),
    ]
    a = forked_cli.run(["approve", "p"], env=env, cwd=workspace)
    assert a.returncode == 0 and command in a.stdout and "resume p" in a.stdout, a.stderr
    r = forked_cli.run(["resume", "p", "--quiet"], env=env, cwd=workspace)
    assert r.returncode == 0 and r.stdout.strip() == "parent done", r.stderr
    assert (workspace / "made.txt").exists()
    assert query(db_path, "SELECT COUNT(*) FROM runs WHERE parent_id = 'p'") == [(1,)]
    assert query(db_path, "SELECT content FROM messages WHERE run_id = 'p' AND role = 'tool'") == [
        ("made",)
    ]
    shown = forked_cli.run(["show", "p"], env=env, cwd=workspace).stdout
    assert f"    {child}  completed" in shown and "  p  completed" in shown
    exported = forked_cli.run(["export", "p"], env=env, cwd=workspace).stdout.splitlines()
    events = [json.loads(e) for e in exported]
    assert {e["run_id"] for e in events} == {"p", child}
    assert [e["type"] for e in events if e["run_id"] == child][0] == "run_started"
    assert sum(e["type"] == "approval_requested" and e["run_id"] == child for e in events) == 1
    if importlib.util.find_spec("starlette") is not None:  # the web view: children on the page
        from ui_support import client

        page = client(env["DURABLE_AGENT_DB"]).get("/runs/p").text
        assert "Child runs" in page and f'href="/runs/{child}"' in page
        assert 'href="/runs/p"' in client(env["DURABLE_AGENT_DB"]).get(f"/runs/{child}").text
    tree = forked_cli.run(["list", "--tree"], env=env, cwd=workspace).stdout.splitlines()
    assert tree[0].startswith("p  completed") and tree[1].startswith(f"  {child}  completed")


def test_cancel_of_the_parent_cancels_its_running_child(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    import subprocess
    import sys
    import time

    script = {
        "*": [{"tool_calls": [_delegate("slow", workspace="shared-write")]}, {"content": "never"}],
        "slow": [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "sleep 60"}}]},
            {"content": "too late"},
        ],
    }
    path = tmp_path / "s.json"
    path.write_text(json.dumps(script))
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent", "start", "top", "--delegate"]
        + ["--model", f"scripted:{path}", "--run-id", "p", "--quiet", "--shell", "allow"],
        env={**env, "DURABLE_AGENT_LEASE_SECONDS": "3"},
        cwd=workspace,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the child is running (its command sleeps)
            if db_path.exists():
                try:
                    if query(
                        db_path,
                        "SELECT 1 FROM steps WHERE run_id != 'p' AND tool_name = 'run_command'",
                    ):
                        break
                except sqlite3.OperationalError:
                    pass
            time.sleep(0.05)
        c = forked_cli.run(["cancel", "p"], env=env, cwd=workspace)
        assert c.returncode == 0 and "cancelled with it: p-" in c.stdout, c.stderr
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 4, err
    assert query(db_path, "SELECT status FROM runs ORDER BY id") == [
        ("cancelled",),
        ("cancelled",),
    ]


def test_the_parents_max_cost_stops_its_children(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    path = tmp_path / "s.json"
    children = {
        f"child {i}": [
            {"tool_calls": [{"name": "list_files", "arguments": {"max_depth": d}}]}
            for d in range(1, 7)
        ]
        + [{"content": f"child {i} done"}]
        for i in range(3)
    }
    script = {
        "*": [
            # shared-write: one after another (read-only children of one answer run side by
            # side, each with its share of what the parent has left)
            {"tool_calls": [_delegate(t, workspace="shared-write") for t in children]},
            {"content": "parent done"},
        ],
        **children,
    }
    path.write_text(json.dumps(script))
    (tmp_path / "xdg-config" / "durable-agent").mkdir(parents=True)
    (tmp_path / "xdg-config" / "durable-agent" / "config.toml").write_text(
        f'[prices."scripted:{path}"]\ninput_per_mtok = 1000000\noutput_per_mtok = 1000000\n'
    )
    cap = 400  # one token costs 1: the parent's first call and about one child and a half
    r = forked_cli.run(
        ["start", "top", "--delegate", "--model", f"scripted:{path}", "--run-id", "p"]
        + ["--max-cost", str(cap), "--quiet"],
        env=env,
        cwd=workspace,
    )
    assert r.returncode == 3 and "cost budget" in r.stderr, r.stderr
    assert query(db_path, "SELECT status FROM runs WHERE id = 'p'") == [("budget_exceeded",)]
    biggest = query(
        db_path, "SELECT MAX(prompt_tokens + completion_tokens) FROM steps WHERE kind = 'model'"
    )[0][0]
    spent = query(db_path, "SELECT prompt_tokens + completion_tokens FROM runs WHERE id = 'p'")
    kids = query(
        db_path,
        "SELECT status, prompt_tokens + completion_tokens FROM runs WHERE parent_id = 'p' "
        "ORDER BY parent_step",
    )
    assert kids[0][0] == "completed" and kids[-1][0] == "budget_exceeded", kids
    assert cap <= spent[0][0] <= cap + biggest  # past the cap by one call at most
    assert len(kids) == 2  # the third is never started: the budget was spent
    own = query(
        db_path,
        "SELECT prompt_tokens + completion_tokens FROM steps WHERE run_id = 'p' AND seq = 0",
    )[0][0]
    second_cap = cap - own - kids[0][1]  # what the parent had left when it started it
    assert second_cap < kids[1][1] <= second_cap + biggest


@pytest.mark.postgres
@pytest.mark.slow
def test_postgres_workers_a_worker_killed_while_it_runs_a_child(
    tmp_path: Path, env: dict[str, str], workspace: Path
) -> None:
    from scale_helpers import Workers, pg_schema, wait_for
    from sqlalchemy import text

    from durable_agent.store.engine import open_store_engine

    children = {
        f"write {name}": [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": f"{name}.txt", "content": name}}
                ]
            },
            # The worker is killed while this call sleeps: the child is mid-run.
            {"content": f"{name} written", "delay_s": 1.5 if name == "beta" else 0},
        ]
        for name in ("alpha", "beta", "gamma")
    }
    script = {
        "*": [
            {"tool_calls": [_delegate(t, workspace="shared-write") for t in children]},
            {"content": "all three written"},
        ],
        **children,
    }
    path = tmp_path / "s.json"
    path.write_text(json.dumps(script))
    with pg_schema() as url:
        e = {**env, "DURABLE_AGENT_DB": url, "DURABLE_AGENT_LEASE_SECONDS": "2"}
        r = forked_cli.run(
            ["start", "top", "--delegate", "--model", f"scripted:{path}"]
            + ["--run-id", "p", "--detach"],
            env=e,
            cwd=workspace,
        )
        assert r.returncode == 0, r.stderr
        engine = open_store_engine(url)

        def rows(sql: str) -> list[Any]:
            with engine.connect() as conn:
                return list(conn.execute(text(sql)).all())

        workers = Workers(e, url, tmp_path / "logs")
        try:
            first = workers.start()
            # beta's write is done and its slow answer is being made: kill that worker.
            wait_for(
                lambda: rows(
                    "SELECT 1 FROM steps s JOIN runs r ON r.id = s.run_id "
                    "WHERE r.task = 'write beta' AND s.kind = 'tool' AND s.state = 'completed'"
                ),
                60,
                "the second child's write",
            )
            first.send_signal(signal.SIGKILL)
            first.wait()
            # The parent waits for beta without a lease (docs/delegation.md).
            assert rows("SELECT status, lease_owner FROM runs WHERE id = 'p'") == [
                ("waiting", None)
            ]
            workers.start()
            wait_for(
                lambda: rows("SELECT 1 FROM runs WHERE id = 'p' AND status = 'completed'"),
                90,
                "the parent to complete",
            )
        finally:
            workers.kill_all()
        assert rows("SELECT answer FROM runs WHERE id = 'p'") == [("all three written",)]
        kids = rows(
            "SELECT r.status, r.answer FROM runs r WHERE r.parent_id = 'p' ORDER BY r.parent_step"
        )
        assert kids == [("completed", f"{n} written") for n in ("alpha", "beta", "gamma")]
        assert rows("SELECT r.parent_step FROM runs r WHERE r.parent_id = 'p' ORDER BY 1") == rows(
            "SELECT seq FROM steps WHERE run_id = 'p' AND kind = 'delegate' ORDER BY 1"
        )
        assert rows("SELECT COUNT(*) FROM runs") == [(4,)]
        assert (
            rows("SELECT run_id, idempotency_key FROM steps GROUP BY 1, 2 HAVING COUNT(*) > 1")
            == []
        )
        assert rows(
            "SELECT content FROM messages WHERE run_id = 'p' AND role = 'tool' ORDER BY seq"
        ) == [(f"{n} written",) for n in ("alpha", "beta", "gamma")]
        assert rows("SELECT COUNT(*) FROM run_tree WHERE root_id = 'p'") == [(4,)]
        # The killed worker's runs were taken over: the parent's and beta's sessions resumed.
        taken = rows("SELECT resume_count > 0 FROM runs WHERE id = 'p' OR task = 'write beta'")
        assert taken == [(True,), (True,)]
        engine.dispose()
    for name in ("alpha", "beta", "gamma"):
        assert (workspace / f"{name}.txt").read_text() == name


def _readers_script(path: Path, delay: float) -> str:
    children = {
        f"read {n}": [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": f"{n}.txt"}}]},
            {"content": f"{n} read", "delay_s": delay},
        ]
        for n in ("alpha", "beta", "gamma")
    }
    script = {
        "*": [{"tool_calls": [_delegate(t) for t in children]}, {"content": "all read"}],
        **children,
    }
    path.write_text(json.dumps(script))
    return f"scripted:{path}"


def test_read_only_children_of_one_answer_run_side_by_side(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    for n in ("alpha", "beta", "gamma"):
        (workspace / f"{n}.txt").write_text(n)
    model = _readers_script(tmp_path / "s.json", 0.5)
    r = run(env, workspace, "start", "top", "--delegate", "--model", model, "--run-id", "p")
    assert r.returncode == 0 and r.stdout.strip() == "all read", r.stderr
    assert [
        t[0]
        for t in query(
            db_path,
            "SELECT content FROM messages WHERE run_id = 'p' AND role = 'tool' ORDER BY seq",
        )
    ] == ["alpha read", "beta read", "gamma read"]
    # The children's slow answers overlapped: each began before any of them ended (one after
    # another, never).
    slow = query(
        db_path,
        "SELECT started_at, finished_at FROM steps WHERE run_id != 'p' AND kind = 'model' "
        "AND turn = 1",
    )
    assert len(slow) == 3 and max(s[0] for s in slow) < min(s[1] for s in slow)
    # Intents first, in the calls' order, then the outcomes: each child made once.
    assert query(
        db_path, "SELECT parent_step FROM runs WHERE parent_id = 'p' ORDER BY id"
    ) != [] and query(db_path, "SELECT COUNT(*) FROM runs") == [(4,)]


@pytest.mark.slow
def test_sigkill_while_children_run_side_by_side(tmp_path: Path, env: dict[str, str]) -> None:
    model = _readers_script(tmp_path / "s.json", 0)
    expected = None
    k = 1
    while True:
        ws, db = tmp_path / f"ws{k}", tmp_path / f"s{k}.db"
        ws.mkdir()
        for n in ("alpha", "beta", "gamma"):
            (ws / f"{n}.txt").write_text(n)
        e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}"}
        args = ("start", "top", "--delegate", "--model", model, "--run-id", "p")
        r = run(e, ws, *args, crash_after=k)
        if r.returncode == 0:
            break
        assert r.returncode == -signal.SIGKILL, r.stderr
        if not query(db, "SELECT 1 FROM runs WHERE id = 'p'"):
            assert run(e, ws, *args).returncode == 0
        elif query(db, "SELECT status FROM runs WHERE id = 'p'") != [("completed",)]:
            r = run(e, ws, "resume", "p")
            assert r.returncode == 0, (k, r.stdout, r.stderr)
        check_once(db, "p")
        got = ledger(db, "p")
        got["child_steps"] = sorted(map(tuple, got["child_steps"]))  # (made in any order)
        expected = expected or got
        assert got == expected and got["parent"] == [("completed", "all read")], k
        k += 3
    assert k > 20


@pytest.mark.slow
def test_a_copy_child_returns_its_changes_as_a_diff_whatever_crashes(
    tmp_path: Path, env: dict[str, str]
) -> None:
    children = {
        f"edit {n}": [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": f"{n}.txt", "content": "new\n"}}
                ]
            },
            {"content": f"{n} edited"},
        ]
        for n in ("alpha", "beta")
    }
    script = {
        "*": [
            {"tool_calls": [_delegate(t, workspace="copy") for t in children]},
            {"content": "both edited"},
        ],
        **children,
    }
    path = tmp_path / "s.json"
    path.write_text(json.dumps(script))
    model = f"scripted:{path}"
    expected = None
    k = 0  # 0: no crash (the reference), then crashes at every fifth boundary
    while True:
        ws, db = tmp_path / f"ws{k}", tmp_path / f"s{k}.db"
        ws.mkdir()
        for n in ("alpha", "beta"):
            (ws / f"{n}.txt").write_text("old\n")
        # (the copies are kept beside the default store: one data folder per store here)
        e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}", "XDG_DATA_HOME": str(tmp_path / f"d{k}")}
        args = ("start", "top", "--delegate", "--model", model, "--run-id", "p")
        r = run(e, ws, *args, crash_after=k or None)
        if r.returncode == 0 and k:
            break
        if r.returncode != 0:
            assert r.returncode == -signal.SIGKILL, r.stderr
            if not query(db, "SELECT 1 FROM runs WHERE id = 'p'"):
                assert run(e, ws, *args).returncode == 0
            elif query(db, "SELECT status FROM runs WHERE id = 'p'") != [("completed",)]:
                r = run(e, ws, "resume", "p")
                assert r.returncode == 0, (k, r.stdout, r.stderr)
        # The parent's files are untouched; each child's change comes back as a diff.
        assert [(ws / f"{n}.txt").read_text() for n in ("alpha", "beta")] == ["old\n", "old\n"]
        seen = [
            t[0]
            for t in query(
                db, "SELECT content FROM messages WHERE run_id = 'p' AND role = 'tool' ORDER BY seq"
            )
        ]
        assert len(seen) == 2 and all("-old\n+new" in t for t in seen), seen
        assert seen[0].startswith("alpha edited") and "a/alpha.txt" in seen[0]
        expected = expected or seen
        assert seen == expected, k
        check_copies = query(db, "SELECT COUNT(*) FROM runs WHERE parent_id = 'p'")
        assert check_copies == [(2,)]
        k += 5
    assert k > 20


# One child that writes a file and runs a command which appends to a ledger: a command run
# twice shows as a second line.
CUT_SCRIPT = {
    "*": [
        {"tool_calls": [_delegate("write and log", workspace="shared-write")]},
        {"content": "the child wrote and logged"},
    ],
    "write and log": [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "a"}}]},
        {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo x >> log.txt"}}]},
        {"content": "written and logged"},
    ],
}


def _cut_ledger(url: str, parent: str) -> list[Any]:
    """The parent's and its child's status, answer, completed steps and messages."""
    return pg_rows(
        url,
        "SELECT t.depth, r.status, r.answer, (SELECT COUNT(*) FROM steps s WHERE s.run_id = "
        "r.id AND s.state = 'completed'), (SELECT COUNT(*) FROM messages m WHERE m.run_id = "
        f"r.id) FROM run_tree t JOIN runs r ON r.id = t.run_id WHERE t.root_id = '{parent}' "
        "ORDER BY t.depth",
    )


def _delegate_under_a_cut(env: dict[str, str], root: Path, url: str, at: int | None) -> list[int]:
    """The delegating run (its own run id, in a store whose schema is made), its PostgreSQL
    connection terminated right after statement `at` (counting the child's: it runs in the
    parent's thread) once, or, every third, a hundred times in a row (exit 7, then
    `resume`); `at=None` counts the statements instead."""
    parent = root.name
    ws = root / "ws"
    ws.mkdir(parents=True)
    path = root / "s.json"
    path.write_text(json.dumps(CUT_SCRIPT))
    log = root / "faults.log"
    fault = {"DURABLE_AGENT_FAULT": "terminate", "DURABLE_AGENT_FAULT_LOG": str(log)}
    fault["DURABLE_AGENT_FAULT_AT"] = "999999" if at is None else str(at)
    fault["DURABLE_AGENT_FAULT_REPEAT"] = "100" if at is not None and at % 3 == 1 else "1"
    start = ["start", "top", "--delegate", "--model", f"scripted:{path}", "--run-id", parent]
    start += ["--shell", "allow"]
    e = {**env, "DURABLE_AGENT_DB": url}
    codes = [run({**e, **fault}, ws, *start).returncode]
    while codes[-1] == 7 and len(codes) < 5:
        # (cut before the run row was committed: start it again)
        made = pg_rows(url, f"SELECT COUNT(*) FROM runs WHERE id = '{parent}'") == [(1,)]
        codes.append(run(e, ws, *(["resume", parent] if made else start)).returncode)
    if codes[-1] == 5:  # the server went away while the command ran: its outcome is unknown
        child = pg_rows(url, f"SELECT id FROM runs WHERE parent_id = '{parent}'")[0][0]
        deny = ["approve", child, "--deny", "--by", "tester"]
        assert forked_cli.run(deny, env=e, cwd=ws).returncode == 0
        codes.append(run(e, ws, "resume", parent).returncode)
    assert codes[-1] == 0, (at, codes)
    made = pg_rows(url, f"SELECT parent_step FROM runs WHERE parent_id = '{parent}'")
    delegates = f"SELECT seq FROM steps WHERE run_id = '{parent}' AND kind = 'delegate'"
    assert made == pg_rows(url, delegates) and len(made) == 1, (at, made)
    assert (ws / "a.txt").read_text() == "a"
    lines = (ws / "log.txt").read_text().splitlines() if (ws / "log.txt").exists() else []
    assert lines in ([], ["x"]) if 5 in codes else lines == ["x"], (at, lines)
    (root / "ledger.json").write_text(json.dumps(_cut_ledger(url, parent)))
    if at is None:
        (count,) = [int(x.split()[1]) for x in log.read_text().splitlines() if "statements" in x]
        return [count]
    return codes


@pytest.mark.postgres
@pytest.mark.slow  # a run (or more) on PostgreSQL per statement of the delegating run
def test_a_postgres_connection_cut_at_every_statement_of_a_delegating_run(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The server's backend is terminated after each statement of a run that delegates to a
    child (the child's statements too), once or for longer than the retries last: the child
    is made once, its command runs once, and both runs end as an uncut run's do. One store
    for all (its schema made by the first run): the cuts fall in the runs, not in migrations,
    which tests/test_store_faults.py cuts."""
    from concurrent.futures import ThreadPoolExecutor

    from scale_helpers import pg_schema

    with pg_schema() as url:
        _delegate_under_a_cut(env, tmp_path / "first", url, None)
        (count,) = _delegate_under_a_cut(env, tmp_path / "ref", url, None)
        reference = json.loads((tmp_path / "ref" / "ledger.json").read_text())
        assert count > 30 and reference[0][1:3] == ["completed", "the child wrote and logged"]
        with ThreadPoolExecutor(max_workers=3) as pool:
            codes = pool.map(
                lambda at: _delegate_under_a_cut(env, tmp_path / f"p{at:03}", url, at),
                range(1, count + 1),
            )
            results = dict(zip(range(1, count + 1), codes, strict=True))
        once = "SELECT run_id, idempotency_key FROM steps GROUP BY 1, 2 HAVING COUNT(*) > 1"
        assert pg_rows(url, once) == []
    for at, codes in results.items():
        if 5 not in codes:
            got = json.loads((tmp_path / f"p{at:03}" / "ledger.json").read_text())
            assert got == reference, at
    stopped = sum(1 for codes in results.values() if codes[0] == 7)
    asked = sum(1 for codes in results.values() if 5 in codes)
    print(f"delegate on PostgreSQL: {count} statements cut, {stopped} exit 7, {asked} asked")
    assert stopped > 0 and asked <= 2


@pytest.mark.slow  # a 60-step child on a 1 MiB disk, then its resume
def test_a_full_disk_inside_a_child_stops_the_run_and_it_resumes_once_there_is_room(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The store's disk fills while the child runs (its reads' outputs): the whole process
    stops with exit 7, resumable; with room again, `resume` of the parent finishes the same
    child, and its command runs once."""
    import subprocess

    from mounts import mount_tmpfs

    disk = tmp_path / "disk"
    mount_tmpfs(disk, "1m")
    try:
        ws = tmp_path / "ws"
        ws.mkdir()
        for i in range(60):  # outputs that fill 1 MiB long before the child's script ends
            (ws / f"big{i}.txt").write_text(f"{i} " + "x" * 15_000)
        reads = [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": f"big{i}.txt"}}]}
            for i in range(60)
        ]
        log = {"name": "run_command", "arguments": {"command": "echo x >> log.txt"}}
        script = {
            "*": [
                {"tool_calls": [_delegate("read them all", workspace="shared-write")]},
                {"content": "the child read them"},
            ],
            "read them all": [*reads, {"tool_calls": [log]}, {"content": "read and logged"}],
        }
        path = tmp_path / "s.json"
        path.write_text(json.dumps(script))
        db = disk / "store.db"
        e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}"}
        start = ["start", "top", "--delegate", "--model", f"scripted:{path}", "--run-id", "p"]
        r = run(e, ws, *start, "--shell", "allow", "--max-steps", "80")
        assert r.returncode == 7, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert "Traceback" not in r.stderr and "full" in last, last
        assert query(db, "SELECT COUNT(*) FROM runs WHERE parent_id = 'p'") == [(1,)]
        assert not (ws / "log.txt").exists()  # stopped among the reads
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        r = run(e, ws, "resume", "p")
        assert r.returncode == 0, r.stderr
        assert query(db, "SELECT status, answer FROM runs ORDER BY parent_id IS NOT NULL") == [
            ("completed", "the child read them"),
            ("completed", "read and logged"),
        ]
        child_models = query(
            db,
            "SELECT COUNT(*) FROM steps s JOIN runs r ON r.id = s.run_id WHERE r.parent_id = 'p' "
            "AND s.kind = 'model' AND s.state = 'completed'",
        )
        assert child_models == [(62,)]  # each of the child's model turns paid for once
        assert (ws / "log.txt").read_text() == "x\n"
        assert (
            query(db, "SELECT run_id, idempotency_key FROM steps GROUP BY 1, 2 HAVING COUNT(*) > 1")
            == []
        )
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
