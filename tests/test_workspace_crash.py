"""Workspace snapshots under kill -9, and on two hosts without a shared file system.

- SIGKILL at every k-th commit boundary of a snapshot-heavy run (writes, edits, commands),
  resumed (and approved, for a command cut off) until it completes: the workspace equals
  an uninterrupted run's, and every snapshot recorded on a completed step is whole (its
  tree and every blob it names can be read back and restored).
- PostgreSQL, two `--workspace-root` folders standing for two hosts: a worker is SIGKILLed
  mid-run and its folder deleted; a worker on the other root takes the run over, rebuilds
  the files from the store and completes it with the uninterrupted run's end state.
"""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from scale_helpers import Workers, pg_schema, wait_for
from sqlalchemy import text
from workspace_support import da, picture

from durable_agent.store.blobs import BlobStore
from durable_agent.store.engine import open_store_engine
from durable_agent.workspace import snapshot
from durable_agent.workspace.manifest import blob_refs


def heavy_turns(delay_s: float = 0.0) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for i in range(3):
        turns += [
            {
                "tool_calls": [
                    {
                        "name": "write_file",
                        "arguments": {"path": f"src/m{i}.py", "content": f"x = {i}\n"},
                    },
                    {
                        "name": "run_command",
                        "arguments": {
                            "command": f"mkdir -p out/{i} && printf 'built {i}\\n' > out/{i}/a.txt && cp src/m{i}.py out/{i}/"
                        },
                    },
                ]
            },
            {
                "tool_calls": [
                    {
                        "name": "edit_file",
                        "arguments": {
                            "path": f"src/m{i}.py",
                            "old_string": f"x = {i}",
                            "new_string": f"x = {i * 10}",
                        },
                    },
                    {
                        "name": "run_command",
                        "arguments": {"command": f"rm -rf out/{i - 1} && chmod +x src/m{i}.py"},
                    },
                ]
            },
        ]
    turns.append({"content": "built"})
    return [dict(t, delay_s=delay_s) for t in turns] if delay_s else turns


def _resume_until_done(run_id: str, env: dict[str, str], ws: Path, every: int) -> int:
    crashes = 0
    for _ in range(500):
        proc = da(
            ["resume", run_id, "--quiet"], env, ws, extra={"DURABLE_AGENT_CRASH_AFTER": str(every)}
        )
        if proc.returncode == -signal.SIGKILL:
            crashes += 1
            continue
        if proc.returncode == 5:  # a command cut off: a person says run it again
            assert da(["approve", run_id], env, ws).returncode == 0
            continue
        # A crash right after the final commit leaves a completed run: nothing left to resume.
        assert proc.returncode == 0 or (proc.returncode == 2 and "is completed" in proc.stderr), (
            proc.stderr
        )
        return crashes
    pytest.fail("the run did not complete")


def _check_snapshots_whole(db_url: str, run_id: str) -> int:
    engine = open_store_engine(db_url)
    blobs = BlobStore(engine)
    with engine.connect() as conn:
        trees = [
            r[0]
            for r in conn.execute(
                text(
                    "SELECT tree_id FROM steps WHERE run_id=:r AND state='completed' AND tree_id IS NOT NULL"
                ),
                {"r": run_id},
            )
        ]
    for tree in trees:
        manifest = snapshot.load(blobs, tree)
        refs = blob_refs(manifest.values())
        assert blobs.present_blobs(refs) == refs, f"tree {tree} names blobs the store lacks"
    engine.dispose()
    return len(trees)


@pytest.mark.slow
@pytest.mark.parametrize("every", [6, 7])  # odd: just before a commit; even: just after (a command
# takes 3 commits to finish: fewer boundaries per session would cut it off forever)
def test_sigkill_at_commit_boundaries_resumes_to_the_same_workspace(
    every, tmp_path, env, workspace
) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "heavy.json"
    script.write_text(json.dumps(heavy_turns()))
    ref_ws = tmp_path / "reference"
    ref_ws.mkdir()
    ref_env = {**env, "DURABLE_AGENT_DB": f"sqlite:///{tmp_path / 'reference.db'}"}
    args = ["--model", f"scripted:{script}", "--shell", "allow", "--quiet"]
    assert da(["start", "heavy", "--run-id", "ref", *args], ref_env, ref_ws).returncode == 0
    proc = da(
        ["start", "heavy", "--run-id", "crashy", *args],
        env,
        workspace,
        extra={"DURABLE_AGENT_CRASH_AFTER": str(every)},
    )
    assert proc.returncode == -signal.SIGKILL
    crashes = 1 + _resume_until_done("crashy", env, workspace, every)
    assert crashes > 8, "the crashes should be spread over the whole run"
    assert picture(workspace) == picture(ref_ws)
    assert _check_snapshots_whole(env["DURABLE_AGENT_DB"], "crashy") >= 12
    # The last snapshot is the workspace: restoring it elsewhere gives the same files.
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    last = db.execute("SELECT MAX(seq) FROM steps WHERE run_id='crashy'").fetchone()[0]
    assert (
        da(
            ["restore", "crashy", "--at", str(last), "--to", str(tmp_path / "r")],
            env,
            workspace,
        ).returncode
        == 0
    )
    assert picture(tmp_path / "r") == picture(workspace)


@pytest.mark.slow
@pytest.mark.postgres
def test_worker_on_another_root_rebuilds_the_workspace_after_a_sigkill(tmp_path, env) -> None:  # type: ignore[no-untyped-def]
    turns = heavy_turns(delay_s=0.3)
    script = tmp_path / "heavy.json"
    script.write_text(json.dumps(turns))
    ref_ws = tmp_path / "reference"
    ref_ws.mkdir()
    fast = tmp_path / "fast.json"
    fast.write_text(json.dumps(heavy_turns()))
    ref_env = {**env, "DURABLE_AGENT_DB": f"sqlite:///{tmp_path / 'reference.db'}"}
    assert (
        da(
            ["start", "heavy", "--model", f"scripted:{fast}", "--shell", "allow", "--quiet"],
            ref_env,
            ref_ws,
        ).returncode
        == 0
    )
    root1, root2 = tmp_path / "host1", tmp_path / "host2"
    with pg_schema() as url:
        wenv = {**env, "DURABLE_AGENT_DB": url}
        queued = tmp_path / "queued"
        queued.mkdir()
        proc = da(
            [
                "start",
                "heavy",
                "--model",
                f"scripted:{script}",
                "--shell",
                "allow",
                "--run-id",
                "two",
                "--detach",
                "--workspace",
                str(queued),
            ],
            wenv,
            tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        engine = open_store_engine(url)
        workers = Workers(wenv, url, tmp_path / "logs")
        try:
            first = workers.start(
                "--workspace-root", str(root1), "--lease-seconds", "2", "--poll", "0.1"
            )

            def in_model_call_after_some_tools() -> bool:
                with engine.connect() as conn:
                    done = conn.execute(
                        text(
                            "SELECT COUNT(*) FROM steps WHERE run_id='two' AND kind='tool' "
                            "AND state='completed'"
                        )
                    ).scalar()
                    last = conn.execute(
                        text(
                            "SELECT kind, state FROM steps WHERE run_id='two' "
                            "ORDER BY seq DESC LIMIT 1"
                        )
                    ).first()
                return bool(
                    done and done >= 6 and last is not None and tuple(last) == ("model", "started")
                )

            wait_for(
                in_model_call_after_some_tools,
                60,
                "the first worker to be mid-run, in a model call",
            )
            first.send_signal(signal.SIGKILL)
            first.wait()
            assert (root1 / "two").is_dir()
            shutil.rmtree(root1)  # that host is gone
            second = workers.start(
                "--workspace-root", str(root2), "--lease-seconds", "2", "--poll", "0.1", "--once"
            )
            assert second.wait(timeout=120) == 0, workers.log(second)
            with engine.connect() as conn:
                status = conn.execute(
                    text("SELECT status, resume_count FROM runs WHERE id='two'")
                ).first()
            assert status is not None and status[0] == "completed", workers.log(second)
            assert status[1] >= 1
            assert "rebuilt the workspace" in workers.log(second)
            assert picture(root2 / "two") == picture(ref_ws)
            assert _check_snapshots_whole(url, "two") >= 12
        finally:
            workers.kill_all()
            engine.dispose()


def _files_after(writes: int) -> dict[str, str]:
    """deep_turns' files after its first `writes` write_file steps."""
    files: dict[str, str] = {}
    for i in range(writes):
        files[f"f{i % 5}.txt"] = f"step {i}\n"
    return files


def deep_turns(writes: int) -> list[dict[str, Any]]:
    """One write_file a turn over five files: more changed snapshots than MAX_DEPTH."""
    turns: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {
                    "name": "write_file",
                    "arguments": {"path": f"f{i % 5}.txt", "content": f"step {i}\n"},
                }
            ]
        }
        for i in range(writes)
    ]
    return [*turns, {"content": "written"}]


@pytest.mark.slow
@pytest.mark.parametrize("every", [37, 483, 1000])  # 483: killed past MAX_DEPTH; 1000: never
def test_a_chain_past_max_depth_restores_every_step_after_sigkills(
    every, tmp_path, env, workspace
) -> None:  # type: ignore[no-untyped-def]
    # Past MAX_DEPTH changed snapshots a chain goes on from the last whole manifest (its
    # changes since, at depth 1). Killed at commit boundaries and resumed, the run ends with
    # the files an uninterrupted run has, every completed step's tree loads whole, and a
    # restore at a step gives the files as they were right after it.
    writes = 70
    for i in range(40):  # files no step changes: a few changed paths are a small delta
        (workspace / f"kept{i}.txt").write_text(f"kept {i}\n")
    script = tmp_path / "deep.json"
    script.write_text(json.dumps(deep_turns(writes)))
    args = ["--model", f"scripted:{script}", "--quiet", "--max-steps", "200"]
    proc = da(
        ["start", "deep", "--run-id", "deep", *args],
        env,
        workspace,
        extra={"DURABLE_AGENT_CRASH_AFTER": str(every)},
    )
    if every < 1000:
        assert proc.returncode == -signal.SIGKILL
        assert _resume_until_done("deep", env, workspace, every) >= 0
    else:
        assert proc.returncode == 0, proc.stderr
    files = {p.name: p.read_text() for p in workspace.glob("f*.txt")}
    assert files == _files_after(writes)
    assert len(list(workspace.glob("kept*.txt"))) == 40
    assert _check_snapshots_whole(env["DURABLE_AGENT_DB"], "deep") >= writes
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    # Some whole manifest is the base of more than one tree at depth 1: the chain went on
    # from it once it was MAX_DEPTH deep, rather than writing the manifest again. (Killed
    # every 37 commits, about 5 steps, no process takes 50 snapshots in a row: each new
    # process goes on from the last tree, and writes a whole manifest at MAX_DEPTH.)
    (most,) = db.execute(
        "SELECT MAX(n) FROM (SELECT COUNT(*) AS n FROM workspace_trees WHERE depth = 1 "
        "GROUP BY base)"
    ).fetchone()
    assert most >= (2 if every > 400 else 1)
    tools = [
        seq
        for (seq,) in db.execute(
            "SELECT seq FROM steps WHERE run_id='deep' AND kind='tool' ORDER BY seq"
        )
    ]
    assert len(tools) == writes
    for k in [*range(0, writes, 9), writes - 2, writes - 1]:
        target = tmp_path / f"at{k}"
        proc = da(["restore", "deep", "--at", str(tools[k]), "--to", str(target)], env, workspace)
        assert proc.returncode == 0, proc.stderr
        got = {p.name: p.read_text() for p in target.glob("f*.txt")}
        assert got == _files_after(k + 1), f"after write {k}"
        assert len(list(target.glob("kept*.txt"))) == 40
