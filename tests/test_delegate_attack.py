"""Attacks on delegation: budgets at their edges, hostile task text, cancels at depth."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import forked_cli
from test_delegate import query


def _delegate(task: str, **more: Any) -> dict[str, Any]:
    return {"name": "delegate", "arguments": {"task": task, **more}}


def _script(tmp_path: Path, script: dict[str, Any]) -> str:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(script))
    return f"scripted:{path}"


def test_a_parent_with_few_tokens_left_makes_children_a_worker_can_run(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    """Fewer tokens left than children side by side: each still gets one (a child recorded
    with max_tokens=0 had settings no worker, no `resume CHILD` accepts: its parent waited
    forever); none left: no child is made, the parent stops as for a spent cost."""
    kids = {f"read {i}": [{"content": f"{i} read"}] for i in range(3)}
    model = _script(
        tmp_path,
        {"*": [{"tool_calls": [_delegate(t) for t in kids]}, {"content": "done"}], **kids},
    )
    r = forked_cli.run(
        ["start", "t", "--delegate", "--model", model, "--run-id", "ref", "--quiet"],
        env=env,
        cwd=workspace,
    )
    assert r.returncode == 0, r.stderr
    first = query(
        db_path,
        "SELECT prompt_tokens + completion_tokens FROM steps WHERE run_id = 'ref' AND seq = 0",
    )[0][0]
    for rid, cap in (("p", first + 2), ("q", first)):
        r = forked_cli.run(
            ["start", "t", "--delegate", "--model", model, "--run-id", rid, "--detach"]
            + ["--max-tokens", str(cap)],
            env=env,
            cwd=workspace,
        )
        assert r.returncode == 0, r.stderr
    w = forked_cli.run(["worker", "--once", "--poll", "0.05"], env=env, cwd=workspace, timeout=120)
    assert w.returncode == 0, w.stderr
    assert "skipped" not in w.stdout, w.stdout
    # Two tokens among three: one each; each child made one call, past it (as any run may).
    rows = query(db_path, "SELECT status, settings FROM runs WHERE parent_id = 'p'")
    assert [json.loads(s)["max_tokens"] for _st, s in rows] == [1, 1, 1]
    assert {st for st, _s in rows} == {"completed"}
    assert query(db_path, "SELECT status, stop_reason FROM runs WHERE id = 'p'") == [
        ("budget_exceeded", "max_tokens")
    ]
    # None left: no child is made.
    assert query(db_path, "SELECT COUNT(*) FROM runs WHERE parent_id = 'q'") == [(0,)]
    assert query(db_path, "SELECT status, stop_reason, error FROM runs WHERE id = 'q'") == [
        (
            "budget_exceeded",
            "max_tokens",
            f"token budget: max_tokens={first} is spent, no child is started",
        )
    ]
