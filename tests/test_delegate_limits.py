"""Delegation at its edges: a token budget nearly spent, a chain of children deeper than the
connection pool, a cancel just before a delegate intent commits, hostile task text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import forked_cli
import pytest
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


HOSTILE = {
    "nul": "read\x00 this\x00",
    "surrogate": "lone \ud800 and \udfff surrogates",
    "huge": "x" * 1_500_000,
    "controls": "\x1b[31mred\x1b[0m \x7f\x08\r\n",
}


def test_hostile_task_text_makes_each_child_once(
    tmp_path: Path, env: dict[str, str], store_url: str
) -> None:
    """NUL, lone surrogates, a task of 1.5 MB, control bytes: each child made once, its
    answer the parent's observation once, on both backends. (A NUL is stored as `\\x00`,
    as in any message: the child's task, and its script's key, say so. Lone surrogates are
    refused by the arguments' validation: an error observation, no child.)"""
    from scale_helpers import pg_rows

    calls = [[_delegate(t)] for t in HOSTILE.values()]
    keys = {**HOSTILE, "nul": HOSTILE["nul"].replace("\x00", "\\x00")}
    script = {
        "*": [*({"tool_calls": c} for c in calls), {"content": "parent done"}],
        **{t: [{"content": f"{name} answered"}] for name, t in keys.items()},
    }
    model = _script(tmp_path, script)
    ws = tmp_path / "ws"
    ws.mkdir()
    e = {**env, "DURABLE_AGENT_DB": store_url}
    r = forked_cli.run(
        ["start", "top", "--delegate", "--model", model, "--run-id", "p", "--quiet"],
        env=e,
        cwd=ws,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "parent done"

    def q(sql: str) -> list[Any]:
        if store_url.startswith("postgresql"):
            return [tuple(x) for x in pg_rows(store_url, sql)]
        return query(tmp_path / "store.db", sql)

    made = [n for n in HOSTILE if n != "surrogate"]
    kids = q("SELECT status, answer FROM runs WHERE parent_id = 'p' ORDER BY parent_step")
    assert kids == [("completed", f"{n} answered") for n in made], kids
    seen = [
        s[0]
        for s in q("SELECT content FROM messages WHERE run_id = 'p' AND role = 'tool' ORDER BY seq")
    ]
    assert seen[0] == "nul answered" and seen[2:] == ["huge answered", "controls answered"]
    assert seen[1].startswith("Error: invalid arguments for delegate: task:"), seen[1]
    assert q("SELECT COUNT(*) FROM runs") == [(4,)]


def test_a_chain_of_children_deeper_than_the_pool_completes(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    """A child that delegates its own task again (a cycle), max_depth 20: each level waits
    in the same process for the one below. A waiting parent held its writing connection, so
    past 15 levels (the pool) the deepest one waited 30 s for one and failed, leaving a run
    `running`; now every level completes."""
    again = {"name": "delegate", "arguments": {"task": "again", "workspace": "shared-write"}}
    model = _script(
        tmp_path,
        {
            "*": [{"tool_calls": [again]}, {"content": "top done"}],
            "again": [{"tool_calls": [again]}, {"content": "level done"}],
        },
    )
    (tmp_path / "xdg-config" / "durable-agent").mkdir(parents=True)
    (tmp_path / "xdg-config" / "durable-agent" / "config.toml").write_text("max_depth = 20\n")
    r = forked_cli.run(
        ["start", "top", "--delegate", "--model", model, "--run-id", "p", "--quiet"],
        env=env,
        cwd=workspace,
        timeout=300,
    )
    assert r.returncode == 0 and r.stdout.strip() == "top done", r.stderr[-2000:]
    assert query(db_path, "SELECT status, COUNT(*) FROM runs GROUP BY status") == [
        ("completed", 21)
    ]
    assert query(db_path, "SELECT MAX(depth) FROM run_tree WHERE root_id = 'p'") == [(20,)]


@pytest.mark.parametrize("where", ["worker", "foreground"])
def test_a_cancel_just_before_a_delegate_intent_reaches_the_child(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path, where: str
) -> None:
    """`cancel PARENT` lands while a worker's parent is between its check and its delegate
    intent (a pre_tool hook runs the cancel there: the walk of the children finds none yet).
    The child the intent then makes must not run: the parent does not go `waiting` for it."""
    import sys

    env = {**env, "DURABLE_AGENT_SANDBOX": "off"}  # the hook writes the store
    (tmp_path / "xdg-config" / "durable-agent").mkdir(parents=True)
    (tmp_path / "xdg-config" / "durable-agent" / "config.toml").write_text(
        "[[hooks]]\n"
        'event = "pre_tool"\n'
        'tool = "delegate"\n'
        f'command = "{sys.executable} -m durable_agent cancel $DURABLE_AGENT_RUN_ID '
        f'--db {env["DURABLE_AGENT_DB"]}"\n'
    )
    model = _script(
        tmp_path,
        {
            "*": [{"tool_calls": [_delegate("work")]}, {"content": "parent done"}],
            "work": [
                {"tool_calls": [{"name": "list_files", "arguments": {}}]},
                {"content": "worked"},
            ],
        },
    )
    if where == "worker":
        r = forked_cli.run(
            ["start", "t", "--delegate", "--model", model, "--run-id", "p", "--detach"],
            env=env,
            cwd=workspace,
        )
        assert r.returncode == 0, r.stderr
        w = forked_cli.run(
            ["worker", "--once", "--poll", "0.05"], env=env, cwd=workspace, timeout=120
        )
        assert w.returncode == 0, w.stderr
    else:
        w = forked_cli.run(
            ["start", "t", "--delegate", "--model", model, "--run-id", "p", "--quiet"],
            env=env,
            cwd=workspace,
            timeout=120,
        )
        assert w.returncode == 4, w.stderr
    hook = query(db_path, "SELECT state FROM steps WHERE run_id = 'p' AND kind = 'hook'")
    assert hook == [("completed",)], w.stdout
    assert query(db_path, "SELECT status FROM runs WHERE id = 'p'") == [("cancelled",)]
    kids = query(db_path, "SELECT id, status FROM runs WHERE parent_id = 'p'")
    assert len(kids) == 1, kids
    for kid, status in kids:
        assert status == "cancelled", (kids, w.stdout)
        assert query(db_path, "SELECT COUNT(*) FROM steps WHERE run_id = ?", kid) == [(0,)]
