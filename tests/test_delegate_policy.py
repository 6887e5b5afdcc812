"""The policy on the `delegate` call itself, and a `copy` child's folder (docs/delegation.md).

`[[rules]]` and `pre_tool`/`post_tool` hooks apply to a `delegate` call as to any tool call:
a deny (by name, by arguments) is the call's error observation; an `ask` stops the parent
`blocked` before the child is made, and `approve`/`--deny` decide it; a hook that blocks
stops it. A `copy` child's folder is removed once the parent recorded the child's outcome.
Real CLI processes with scripted models; DURABLE_AGENT_CRASH_AFTER=k SIGKILLs the process at
its k-th checkpoint boundary.
"""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import forked_cli
import pytest

from durable_agent.loop.delegate_step import copies_root, copy_folder, drop_copy

COUNT = [{"tool_calls": [{"name": "list_files", "arguments": {}}]}, {"content": "three files"}]


def _delegate(task: str, **more: Any) -> dict[str, Any]:
    return {"name": "delegate", "arguments": {"task": task, **more}}


def query(db: Path, statement: str, *params: Any) -> list[Any]:
    with sqlite3.connect(db) as con:
        return con.execute(statement, params).fetchall()


def cli(env: dict[str, str], cwd: Path, *args: str, crash_after: int | None = None) -> Any:
    e = dict(env)
    if crash_after is not None:
        e["DURABLE_AGENT_CRASH_AFTER"] = str(crash_after)
    return forked_cli.run([*args], env=e, cwd=cwd, timeout=120)


def start(
    env: dict[str, str], ws: Path, tmp_path: Path, script: dict[str, Any], rules: str = ""
) -> Any:
    model = tmp_path / "s.json"
    model.write_text(json.dumps(script))
    extra: list[str] = []
    if rules:
        (tmp_path / "rules.toml").write_text(rules)
        extra = ["--rules", str(tmp_path / "rules.toml")]
    return cli(
        env,
        ws,
        *("start", "top", "--delegate", "--model", f"scripted:{model}", "--run-id", "p"),
        *extra,
        "--quiet",
    )


def observations(db: Path, run: str = "p") -> list[str]:
    rows = query(
        db, "SELECT content FROM messages WHERE run_id = ? AND role = 'tool' ORDER BY seq", run
    )
    return [r[0] for r in rows]


def test_deny_rules_by_arguments_refuse_a_delegate_call(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    rules = """
[[rules]]
decision = "deny"
tool = "delegate"
arguments = { task = "*deploy*" }
reason = "deploys are for people"
examples_match = [{ task = "deploy the site" }]

[[rules]]
decision = "deny"
tool = "deleg*"
arguments = { workspace = "shared-write" }
reason = "no child writes the shared folder here"

[[rules]]
decision = "deny"
tool = "write_file"
reason = "no writes"
"""
    script = {
        "*": [
            {
                "tool_calls": [
                    _delegate("deploy the site"),
                    _delegate("fix it", workspace="shared-write"),
                    {"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}},
                ]
            },
            {"tool_calls": [_delegate("count the files")]},
            {"content": "parent done"},
        ],
        "count the files": COUNT,
    }
    r = start(env, workspace, tmp_path, script, rules)
    assert r.returncode == 0 and r.stdout.strip() == "parent done", r.stderr
    seen = observations(db_path)
    # The same kind of error observation as an ordinary tool's refusal by a rule.
    assert seen[0].startswith("Error: not allowed by the policy: deploys are for people")
    assert seen[1].startswith("Error: not allowed by the policy: no child writes the shared")
    assert seen[2].startswith("Error: not allowed by the policy: no writes")
    assert seen[3] == "three files"
    # Only the allowed call made a child; the refused ones are failed delegate steps.
    assert query(db_path, "SELECT task FROM runs WHERE parent_id = 'p'") == [("count the files",)]
    assert query(
        db_path, "SELECT state FROM steps WHERE run_id = 'p' AND kind = 'delegate' ORDER BY seq"
    ) == [("failed",), ("failed",), ("completed",)]
    assert not (workspace / "a.txt").exists()


def _ask_script() -> dict[str, Any]:
    return {
        "*": [{"tool_calls": [_delegate("count the files")]}, {"content": "parent done"}],
        "count the files": COUNT,
    }


ASK = """
[[rules]]
decision = "ask"
tool = "delegate"
reason = "a person decides who gets work"
"""


def test_an_ask_rule_blocks_before_the_child_and_approve_makes_it_once(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    r = start(env, workspace, tmp_path, _ask_script(), ASK)
    assert r.returncode == 5, r.stderr  # blocked
    assert "delegate" in r.stderr and "needs approval" in r.stderr, r.stderr
    assert query(db_path, "SELECT id, status FROM runs") == [("p", "blocked")]  # no child yet
    assert query(db_path, "SELECT kind, decision FROM approvals") == [("approval_required", None)]
    a = cli(env, workspace, "approve", "p")
    assert a.returncode == 0 and "count the files" in a.stdout, (a.stdout, a.stderr)
    r = cli(env, workspace, "resume", "p", "--quiet")
    assert r.returncode == 0 and r.stdout.strip() == "parent done", r.stderr
    assert query(db_path, "SELECT status FROM runs WHERE parent_id = 'p'") == [("completed",)]
    assert observations(db_path) == ["three files"]
    # The approval was used by the delegate step's intent (the commit that made the child).
    used = query(db_path, "SELECT decision, used_at IS NOT NULL FROM approvals")
    assert used == [("approved", 1)]
    # Resumed again: nothing more is made.
    cli(env, workspace, "resume", "p", "--quiet")
    assert query(db_path, "SELECT COUNT(*) FROM runs") == [(2,)]


def test_deny_of_an_asked_delegate_call_makes_no_child(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    r = start(env, workspace, tmp_path, _ask_script(), ASK)
    assert r.returncode == 5, r.stderr
    a = cli(env, workspace, "approve", "p", "--deny")
    assert a.returncode == 0, a.stderr
    r = cli(env, workspace, "resume", "p", "--quiet")
    assert r.returncode == 0 and r.stdout.strip() == "parent done", r.stderr
    assert observations(db_path) == [
        "Error: the user denied this delegate call; do not make it again"
    ]
    assert query(db_path, "SELECT id FROM runs") == [("p",)]  # no child, ever
    assert query(db_path, "SELECT decision, used_at IS NOT NULL FROM approvals") == [("denied", 1)]


def test_an_ask_among_children_run_side_by_side(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    """Read-only delegations of one answer run side by side: an `ask` on the second stops the
    parent before that child is made; approved, each child is made once and observed once."""
    rules = """
[[rules]]
decision = "ask"
tool = "delegate"
arguments = { task = "count*" }
"""
    script = {
        "*": [
            {"tool_calls": [_delegate("look"), _delegate("count the files"), _delegate("see")]},
            {"content": "parent done"},
        ],
        "look": [{"content": "looked"}],
        "see": [{"content": "seen"}],
        "count the files": COUNT,
    }
    r = start(env, workspace, tmp_path, script, rules)
    assert r.returncode == 5, r.stderr
    assert query(db_path, "SELECT task FROM runs WHERE parent_id = 'p'") == [("look",)]
    assert cli(env, workspace, "approve", "p").returncode == 0
    r = cli(env, workspace, "resume", "p", "--quiet")
    assert r.returncode == 0 and r.stdout.strip() == "parent done", r.stderr
    kids = query(
        db_path, "SELECT task, status FROM runs WHERE parent_id = 'p' ORDER BY parent_step"
    )
    assert kids == [("look", "completed"), ("count the files", "completed"), ("see", "completed")]
    assert observations(db_path) == ["looked", "three files", "seen"]
    assert query(db_path, "SELECT decision, used_at IS NOT NULL FROM approvals") == [
        ("approved", 1)
    ]
    assert query(db_path, "SELECT COUNT(*) FROM steps WHERE state != 'completed'") == [(0,)]


def test_an_asked_delegate_call_of_a_child_blocks_its_parent(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    """The child inherits the rules: its own `delegate` call asks, the parent stops blocked
    with the child's question, and `approve PARENT` answers it."""
    rules = """
[[rules]]
decision = "ask"
tool = "delegate"
arguments = { task = "deeper*" }
"""
    script = {
        "*": [
            {"tool_calls": [_delegate("nest", workspace="shared-write")]},
            {"content": "parent done"},
        ],
        "nest": [{"tool_calls": [_delegate("deeper look")]}, {"content": "nest done"}],
        "deeper look": [{"content": "looked deep"}],
    }
    r = start(env, workspace, tmp_path, script, rules)
    assert r.returncode == 5 and '{"task": "deeper look"}' in r.stderr, r.stderr
    assert query(db_path, "SELECT task, status FROM runs ORDER BY id") == [
        ("top", "blocked"),
        ("nest", "blocked"),
    ]
    assert cli(env, workspace, "approve", "p").returncode == 0
    r = cli(env, workspace, "resume", "p", "--quiet")
    assert r.returncode == 0 and r.stdout.strip() == "parent done", r.stderr
    assert query(db_path, "SELECT task, status FROM runs ORDER BY id") == [
        ("top", "completed"),
        ("nest", "completed"),
        ("deeper look", "completed"),
    ]
    nest = query(db_path, "SELECT id FROM runs WHERE task = 'nest'")[0][0]
    assert observations(db_path, nest) == ["looked deep"]


@pytest.mark.slow
def test_sigkill_between_the_approval_and_the_delegate_intent(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    """From the approved state, a resume killed at every checkpoint boundary: one child, the
    decision used once, the same answer; some kill fell between the approval and the intent
    (the decision not yet used, no child) and some after it."""
    r = start(env, workspace, tmp_path, _ask_script(), ASK)
    assert r.returncode == 5, r.stderr
    assert cli(env, workspace, "approve", "p").returncode == 0
    approved = tmp_path / "approved.db"
    shutil.copy(db_path, approved)
    windows = set()
    k = 1
    while True:
        db = tmp_path / f"s{k}.db"
        shutil.copy(approved, db)
        e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}"}
        r = cli(e, workspace, "resume", "p", "--quiet", crash_after=k)
        if r.returncode == 0:
            break
        assert r.returncode == -signal.SIGKILL, r.stderr
        kids = query(db, "SELECT COUNT(*) FROM runs WHERE parent_id = 'p'")[0][0]
        used = query(db, "SELECT used_at IS NOT NULL FROM approvals")[0][0]
        assert bool(kids) == bool(used), k  # the child and the decision's use: one commit
        windows.add(kids)
        if query(db, "SELECT status FROM runs WHERE id = 'p'") != [("completed",)]:
            r = cli(e, workspace, "resume", "p", "--quiet")
            assert r.returncode == 0 and r.stdout.strip() == "parent done", (k, r.stderr)
        assert query(db, "SELECT COUNT(*) FROM runs WHERE parent_id = 'p'") == [(1,)], k
        assert observations(db) == ["three files"], k
        assert query(db, "SELECT decision, used_at IS NOT NULL FROM approvals") == [("approved", 1)]
        assert (
            query(db, "SELECT run_id, idempotency_key FROM steps GROUP BY 1, 2 HAVING COUNT(*) > 1")
            == []
        )
        assert query(db, "SELECT COUNT(*) FROM steps WHERE state != 'completed'") == [(0,)]
        k += 1
    assert windows == {0, 1} and k > 5, (windows, k)


def test_pre_tool_hooks_block_or_note_and_post_tool_sees_the_childs_answer(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    rules = """
[[hooks]]
event = "pre_tool"
tool = "delegate"
command = "if grep -q forbidden; then echo 'not that work' >&2; exit 2; fi; echo checked"

[[hooks]]
event = "post_tool"
tool = "delegate"
command = "cat >> post_tool.jsonl; echo >> post_tool.jsonl"
"""
    script = {
        "*": [
            {"tool_calls": [_delegate("do the forbidden thing")]},
            {"tool_calls": [_delegate("count the files")]},
            {"content": "parent done"},
        ],
        "count the files": COUNT,
    }
    r = start(env, workspace, tmp_path, script, rules)
    assert r.returncode == 0 and r.stdout.strip() == "parent done", r.stderr
    seen = observations(db_path)
    assert seen[0] == "Error: blocked by a pre_tool hook: not that work"
    assert seen[1] == "[pre_tool hook] checked\n\nthree files"  # the note, then the answer
    assert query(db_path, "SELECT task FROM runs WHERE parent_id = 'p'") == [("count the files",)]
    # Each hook run is a step of kind `hook` of the parent, as for any tool call.
    hooks = query(
        db_path,
        "SELECT idempotency_key, state FROM steps WHERE run_id = 'p' AND kind = 'hook' ORDER BY seq",
    )
    assert [(key.split(":")[1], state) for key, state in hooks] == [
        ("pre_tool", "completed"),
        ("post_tool", "completed"),
        ("pre_tool", "completed"),
        ("post_tool", "completed"),
    ]
    posted = [
        json.loads(line)
        for line in (workspace / "post_tool.jsonl").read_text().splitlines()
        if line
    ]
    assert [p["tool"] for p in posted] == ["delegate", "delegate"]
    assert posted[0]["result"] == seen[0]
    assert posted[1]["result"].endswith("three files")  # the child's answer is its output
    assert posted[1]["arguments"] == {"task": "count the files"}


# -- a `copy` child's folder ----------------------------------------------------------------
def _copy_script(tmp_path: Path) -> str:
    script = {
        "*": [{"tool_calls": [_delegate("edit it", workspace="copy")]}, {"content": "parent done"}],
        "edit it": [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "a.txt", "content": "new\n"}}
                ]
            },
            {"content": "edited"},
        ],
    }
    path = tmp_path / "copy.json"
    path.write_text(json.dumps(script))
    return f"scripted:{path}"


def test_a_copy_childs_folder_is_removed_and_restore_rebuilds_it(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    (workspace / "a.txt").write_text("old\n")
    model = _copy_script(tmp_path)
    args = ("start", "top", "--delegate", "--model", model, "--run-id", "p", "--quiet")
    r = cli(env, workspace, *args)
    assert r.returncode == 0 and r.stdout.strip() == "parent done", r.stderr
    kid, folder = query(db_path, "SELECT id, workspace FROM runs WHERE parent_id = 'p'")[0]
    copies = Path(env["XDG_DATA_HOME"]) / "durable-agent" / "copies"
    assert folder == str(copies / kid) and copies.is_dir()
    assert list(copies.iterdir()) == []  # removed once the parent recorded its outcome
    assert "-old\n+new" in observations(db_path)[0]  # its changes, in the parent's record
    assert (workspace / "a.txt").read_text() == "old\n"
    # The child's snapshots are in the store: its files can be had again.
    last = query(db_path, "SELECT MAX(seq) FROM steps WHERE run_id = ?", kid)[0][0]
    out = tmp_path / "again"
    r = cli(env, workspace, "restore", kid, "--at", str(last), "--to", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "a.txt").read_text() == "new\n"
    forked = tmp_path / "forked"
    r = cli(env, workspace, "fork", kid, "--at", str(last), "-w", str(forked))
    assert r.returncode == 0, r.stderr
    assert (forked / "a.txt").read_text() == "new\n"


@pytest.mark.slow
def test_sigkill_after_the_outcome_commit_before_the_copy_is_removed(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Killed at every checkpoint boundary: after each, a resume leaves no copy behind; some
    kill fell after the outcome's commit with the folder still there (the resume removed it)."""
    model = _copy_script(tmp_path)
    left_after_outcome = 0
    k = 1
    while True:
        ws, db = tmp_path / f"ws{k}", tmp_path / f"s{k}.db"
        ws.mkdir()
        (ws / "a.txt").write_text("old\n")
        data = tmp_path / f"d{k}"
        e = {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}", "XDG_DATA_HOME": str(data)}
        args = ("start", "top", "--delegate", "--model", model, "--run-id", "p", "--quiet")
        r = cli(e, ws, *args, crash_after=k)
        if r.returncode == 0:
            break
        assert r.returncode == -signal.SIGKILL, r.stderr
        copies = data / "durable-agent" / "copies"
        if not query(db, "SELECT 1 FROM runs WHERE id = 'p'"):
            assert cli(e, ws, *args).returncode == 0
        else:
            done = query(db, "SELECT state FROM steps WHERE run_id = 'p' AND kind = 'delegate'")
            kept = copies.is_dir() and any(copies.iterdir())
            if done == [("completed",)] and kept:
                left_after_outcome += 1
            if query(db, "SELECT status FROM runs WHERE id = 'p'") != [("completed",)]:
                r = cli(e, ws, "resume", "p", "--quiet")
                assert r.returncode == 0 and r.stdout.strip() == "parent done", (k, r.stderr)
        assert list(copies.iterdir()) == [], k
        seen = observations(db)
        assert len(seen) == 1 and seen[0].startswith("edited") and "+new" in seen[0], k
        assert query(db, "SELECT COUNT(*) FROM runs WHERE parent_id = 'p'") == [(1,)], k
        assert (ws / "a.txt").read_text() == "old\n"
        k += 1
    assert left_after_outcome >= 1 and k > 10, (left_after_outcome, k)


def test_only_a_childs_own_folder_under_the_copies_folder_is_removed(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    notes: list[str] = []
    ctx: Any = SimpleNamespace(env=env, observer=SimpleNamespace(note=notes.append))
    root = copies_root(env)
    root.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    # A link where the copy would be: neither it nor what it points to is removed.
    (root / "p-link").symlink_to(elsewhere)
    drop_copy(ctx, "p-link", str(root / "p-link"))
    assert (root / "p-link").is_symlink() and (elsewhere / "keep.txt").exists()
    # A child whose recorded workspace is not its copy folder (a shared child): untouched.
    drop_copy(ctx, "elsewhere", str(elsewhere))
    mine = copy_folder(env, "p-abc")
    mine.mkdir()
    drop_copy(ctx, "p-abc", str(elsewhere))
    assert mine.is_dir() and (elsewhere / "keep.txt").exists()
    # An id that would climb out of the copies folder: nothing is removed.
    drop_copy(ctx, "..", str(root / ".."))
    drop_copy(ctx, "../../../elsewhere", str(root / "../../../elsewhere"))
    assert root.is_dir() and (elsewhere / "keep.txt").exists()
    # Its own: removed.
    (mine / "sub").mkdir()
    (mine / "sub" / "f").write_text("x")
    drop_copy(ctx, "p-abc", str(mine))
    assert not mine.exists() and root.is_dir() and notes == []


# -- the tree in `export` and in the web view ---------------------------------------------
def test_export_and_the_web_view_show_children_and_grandchildren(
    tmp_path: Path, env: dict[str, str], workspace: Path, db_path: Path
) -> None:
    script = {
        "*": [
            {"tool_calls": [_delegate("plan it", workspace="shared-write"), _delegate("look")]},
            {"content": "parent done"},
        ],
        "plan it": [{"tool_calls": [_delegate("count the files")]}, {"content": "planned"}],
        "look": [{"content": "looked"}],
        "count the files": COUNT,
    }
    r = start(env, workspace, tmp_path, script)
    assert r.returncode == 0 and r.stdout.strip() == "parent done", r.stderr
    ids = dict(query(db_path, "SELECT task, id FROM runs"))
    plan, look, count = ids["plan it"], ids["look"], ids["count the files"]
    assert query(db_path, "SELECT parent_id FROM runs WHERE id = ?", count) == [(plan,)]
    exported = cli(env, workspace, "export", "p").stdout.splitlines()
    events = [json.loads(line) for line in exported]
    # Each run's events under its own run id, one run after another: the parent's first,
    # then its children's (the grandchild's too), each run's events once.
    order = [e["run_id"] for e in events]
    runs = [rid for i, rid in enumerate(order) if i == 0 or order[i - 1] != rid]
    assert runs[0] == "p" and sorted(runs) == sorted(["p", plan, look, count]), runs
    for rid, answer in ((plan, "planned"), (look, "looked"), (count, "three files")):
        mine = [e for e in events if e["run_id"] == rid]
        assert [e["type"] for e in mine].count("run_started") == 1, rid
        assert any(answer in json.dumps(e) for e in mine), rid
    alone = [json.loads(line) for line in cli(env, workspace, "export", plan).stdout.splitlines()]
    assert {e["run_id"] for e in alone} == {plan, count}  # a child's export: its own subtree
    pytest.importorskip("starlette")
    from ui_support import client

    web = client(env["DURABLE_AGENT_DB"])
    page = web.get("/runs/p").text
    assert "Child runs" in page
    assert f'href="/runs/{plan}"' in page and f'href="/runs/{look}"' in page
    assert "plan it" in page and "look" in page
    assert f'href="/runs/{count}"' not in page  # a grandchild is on its own parent's page
    assert f'href="/runs/{count}"' in web.get(f"/runs/{plan}").text
    assert "Child runs" not in web.get(f"/runs/{look}").text
