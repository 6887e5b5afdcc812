"""Delegation (docs/delegation.md): a `delegate` call makes a child run, once, whatever crashes.

Real CLI processes with scripted models: one script for the parent and its children, keyed
by each run's task. DURABLE_AGENT_CRASH_AFTER=k SIGKILLs the process at its k-th checkpoint
boundary, the children's commits counted too (they run in the parent's process): every k
from 1 until a run that is not killed covers every window, before the delegate intent, after
it, inside each child, and after a child ended before the parent recorded its answer.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import forked_cli
import pytest

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
        elif query(db, "SELECT status FROM runs WHERE id = 'p'") != [("completed",)]:
            r = run(e, ws, "resume", "p")
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


def test_sigkill_at_every_seventh_checkpoint(tmp_path: Path, env: dict[str, str]) -> None:
    assert _sweep(tmp_path, env, 7) > 40
