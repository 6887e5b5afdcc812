"""Batches (docs/fleets.md): submit TASKS.jsonl over local git repositories, each task's
workspace made as its run's first durable step, dedup by batch name + task id, `--run` in
the foreground, `show` totals, `export --preds` patches that `git apply --check` takes on a
fresh worktree, cancel and resume; and on PostgreSQL three workers SIGKILLed at random
while they drain a batch: every task completes once, no workspace shared."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Result
from scale_helpers import Workers, pg_schema, wait_for

SCRIPT = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "fix.txt", "content": "ok\n"}}]},
    {
        "tool_calls": [
            {
                "name": "edit_file",
                "arguments": {"path": "app.py", "old_string": "x = 1", "new_string": "x = 2"},
            }
        ]
    },
    {"content": "done"},
]


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def make_repos(root: Path, n: int) -> list[Path]:
    repos = []
    for i in range(n):
        repo = root / f"repo{i}"
        repo.mkdir(parents=True)
        _git("init", "-q", cwd=repo)
        (repo / "app.py").write_text(f"# repo {i}\nx = 1\n")
        _git("add", ".", cwd=repo)
        _git("commit", "-qm", "init", cwd=repo)
        repos.append(repo)
    return repos


def write_tasks(path: Path, repos: list[Path], n: int, model: str) -> None:
    with path.open("w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {
                        "id": f"proj__issue-{i}",
                        "task": "fix it",
                        "repo": str(repos[i % len(repos)]),
                        "ref": "HEAD",
                        "verify": "test -f fix.txt",
                        "model": model,
                        "metadata": {"n": i},
                    }
                )
                + "\n"
            )


def check_preds(preds: Path, repos: list[Path], n: int, scratch: Path) -> None:
    lines = [json.loads(line) for line in preds.read_text().splitlines()]
    assert sorted(p["instance_id"] for p in lines) == sorted(f"proj__issue-{i}" for i in range(n))
    for p in lines:
        i = int(p["instance_id"].rsplit("-", 1)[1])
        fresh = scratch / f"check-{i}"
        _git("worktree", "add", "-q", "--detach", str(fresh), "HEAD", cwd=repos[i % len(repos)])
        patch = scratch / f"p{i}.diff"
        patch.write_text(p["model_patch"])
        assert "+x = 2" in p["model_patch"] and "b/fix.txt" in p["model_patch"]
        subprocess.run(["git", "apply", "--check", str(patch)], cwd=fresh, check=True)


@pytest.mark.slow  # over 2 s on 2 cores (git worktrees, four runs)
def test_submit_run_show_export_dedup(
    cli: Callable[..., Result], tmp_path: Path, write_script: Callable[..., str]
) -> None:
    repos = make_repos(tmp_path / "src", 2)
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, repos, 4, write_script(SCRIPT))
    wd = tmp_path / "wd"
    res = cli(
        "batch", "submit", str(tasks), "--workdir", str(wd), "--shell", "allow", "--name", "b"
    )
    assert res.code == 0, res.stderr
    batch_id = res.stdout.strip()
    # a crash of an earlier attempt left a half-made workspace: it is made again, not used
    run0 = json.loads(cli("batch", "show", "b", "--json").stdout)["task_rows"][0]["run_id"]
    ws0 = next(p for p in wd.iterdir() if p.name.startswith("proj__issue-0-"))
    (wd / f".{ws0.name}.partial-{run0}").mkdir()
    (wd / f".{ws0.name}.partial-{run0}" / "junk").write_text("half")
    again = cli("batch", "submit", str(tasks), "--workdir", str(wd), "--name", "b")
    assert again.code == 0 and "0 task(s) queued · 4 already in the batch" in again.stderr
    ran = cli("batch", "resume", batch_id, "--run", "--concurrency", "2")
    assert ran.code == 0, ran.stderr
    assert "4/4 · 4 done · 0 failed" in ran.stderr
    shown = cli("batch", "show", batch_id, "--json").json()
    assert shown["tasks"] == 4 and shown["by_status"] == {"completed": 4}
    assert shown["passed"] == 4 and shown["pass_rate"] == 1.0
    assert all(t["model_calls"] == 3 for t in shown["task_rows"])
    table = cli("batch", "show", "b")
    assert "4 tasks · 4 completed · verify: 4/4 passed (100%)" in table.stdout
    assert not (ws0.parent / f".{ws0.name}.partial-{run0}").exists()
    assert not (ws0 / "junk").exists() and (ws0 / "fix.txt").is_file()
    # four distinct workspaces, each its own worktree at the repo's commit
    spaces = sorted(p for p in wd.iterdir() if not p.name.startswith("."))
    assert len(spaces) == 4 and all((p / ".git").is_file() for p in spaces)
    preds = tmp_path / "preds.jsonl"
    assert cli("batch", "export", batch_id, "--preds", str(preds)).code == 0
    check_preds(preds, repos, 4, tmp_path)


@pytest.mark.slow  # over 2 s on 2 cores
def test_bad_lines_cancel_and_resume(
    cli: Callable[..., Result], tmp_path: Path, write_script: Callable[..., str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "task": "t", "repo": "."}\n{"id": "a", "task": "t"}\n')
    res = cli("batch", "submit", str(bad), "--workdir", str(tmp_path / "wd"))
    assert res.code == 2 and "bad.jsonl:2: 'repo' must be a non-empty string" in res.stderr
    assert "Traceback" not in res.stderr
    repos = make_repos(tmp_path / "src", 1)
    tasks = tmp_path / "t.jsonl"
    write_tasks(tasks, repos, 3, write_script(SCRIPT))
    assert cli("batch", "submit", str(tasks), "--workdir", str(tmp_path / "wd")).code == 0
    cancelled = cli("batch", "cancel", "t")
    assert cancelled.code == 0 and "3 queued task(s) cancelled" in cancelled.stderr
    assert cli("batch", "show", "t", "--json").json()["by_status"] == {"cancelled": 3}
    resumed = cli("batch", "resume", "t", "--run")
    rows = cli("batch", "show", "t", "--json").json()["task_rows"]
    assert resumed.code == 0, [cli("show", r["run_id"]).stdout for r in rows]
    assert cli("batch", "show", "t", "--json").json()["by_status"] == {"completed": 3}
    assert cli("batch", "show", "nope").code == 2


SLOW_SCRIPT = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "fix.txt", "content": "ok\n"}}]},
    {"tool_calls": [{"name": "run_command", "arguments": {"command": "sleep 0.3"}}]},
    {
        "tool_calls": [
            {
                "name": "edit_file",
                "arguments": {"path": "app.py", "old_string": "x = 1", "new_string": "x = 2"},
            }
        ]
    },
    {"content": "done"},
]


@pytest.mark.slow
@pytest.mark.postgres
def test_three_workers_killed_at_random_finish_a_batch_once(
    cli: Callable[..., Result],
    env: dict[str, str],
    tmp_path: Path,
    write_script: Callable[..., str],
) -> None:
    """BATCH_KILL_TASKS=200 runs the issue's full size (minutes); 30 by default."""
    n = int(os.environ.get("BATCH_KILL_TASKS", "30"))
    rng = random.Random(36)
    with pg_schema() as db:
        repos = make_repos(tmp_path / "src", 5)
        tasks = tmp_path / "tasks.jsonl"
        write_tasks(tasks, repos, n, write_script(SLOW_SCRIPT))
        res = cli(
            "batch", "submit", str(tasks), "--workdir", str(tmp_path / "wd"),
            "--shell", "allow", "--db", db,
        )  # fmt: skip
        assert res.code == 0, res.stderr
        batch_id = res.stdout.strip()
        workers = Workers(env, db, tmp_path / "logs")
        procs = [
            workers.start("--concurrency", "2", "--lease-seconds", "4", "--poll", "0.2")
            for _ in range(3)
        ]
        kills = 0

        def shown() -> dict[str, Any]:
            return cli("batch", "show", batch_id, "--db", db, "--json").json()

        try:
            deadline = time.monotonic() + 60 + 3 * n
            while time.monotonic() < deadline:
                state = shown()
                if (
                    state["by_status"].get("completed", 0) + state["by_status"].get("blocked", 0)
                    == n
                ):
                    break
                time.sleep(rng.uniform(0.5, 1.5))
                victim = rng.randrange(3)  # every half second to 1.5 s until it is done
                os.kill(procs[victim].pid, signal.SIGKILL)
                procs[victim].wait()
                kills += 1
                procs[victim] = workers.start(
                    "--concurrency", "2", "--lease-seconds", "4", "--poll", "0.2"
                )
            # a command cut by a kill stops its run `blocked` for a person: approve, resume
            for row in shown()["task_rows"]:
                if row["status"] == "blocked":
                    assert cli("approve", row["run_id"], "--db", db).code == 0
            cli("batch", "resume", batch_id, "--db", db)
            wait_for(
                lambda: shown()["by_status"] == {"completed": n}, 60 + n, "every task completed"
            )
        finally:
            workers.kill_all()
        assert kills >= 3
        state = shown()
        assert state["passed"] == n
        # every task's edits landed once: its workspace holds its own change, exactly once
        spaces = [p for p in (tmp_path / "wd").iterdir() if not p.name.startswith(".")]
        assert len(spaces) == n
        for ws in spaces:
            assert (ws / "app.py").read_text().count("x = 2") == 1
        from sqlalchemy import create_engine, text

        engine = create_engine(db.replace("postgresql://", "postgresql+psycopg://", 1))
        with engine.connect() as conn:
            per_run = conn.execute(
                text(
                    "SELECT r.id, count(*) FILTER (WHERE s.kind = 'workspace'), "
                    "count(*) FILTER (WHERE s.kind = 'workspace' AND s.state = 'completed'), "
                    "count(*) FILTER (WHERE s.tool_name = 'edit_file' AND s.state = 'completed') "
                    "FROM runs r JOIN steps s ON s.run_id = r.id "
                    "WHERE r.batch_id = :b GROUP BY r.id"
                ),
                {"b": batch_id},
            ).all()
            taken_over = conn.execute(
                text("SELECT count(*) FROM runs WHERE batch_id = :b AND resume_count > 0"),
                {"b": batch_id},
            ).scalar_one()
        engine.dispose()
        assert taken_over >= 1  # the kills landed mid-run: those runs went on from their step
        assert len(per_run) == n  # one run per task, no duplicate
        assert all(row[1] == 1 and row[2] == 1 and row[3] == 1 for row in per_run), per_run
        preds = tmp_path / "preds.jsonl"
        assert cli("batch", "export", batch_id, "--db", db, "--preds", str(preds)).code == 0
        check_preds(preds, repos, n, tmp_path)


@pytest.mark.slow  # over 2 s on 2 cores
def test_a_git_url_is_cloned_at_its_ref(
    cli: Callable[..., Result], tmp_path: Path, write_script: Callable[..., str]
) -> None:
    (repo,) = make_repos(tmp_path / "src", 1)
    first = _git("rev-parse", "HEAD", cwd=repo).strip()
    (repo / "app.py").write_text("# moved on\ny = 0\n")
    _git("commit", "-qam", "later", cwd=repo)
    tasks = tmp_path / "url.jsonl"
    task = {"id": "u1", "task": "fix", "repo": f"file://{repo}", "ref": first}
    tasks.write_text(json.dumps({**task, "model": write_script(SCRIPT)}) + "\n")
    ran = cli("batch", "submit", str(tasks), "--workdir", str(tmp_path / "wd"), "--run")
    assert ran.code == 0, ran.stderr
    (ws,) = [p for p in (tmp_path / "wd").iterdir() if not p.name.startswith(".")]
    assert (ws / ".git").is_dir()  # a clone, not a worktree of the source
    assert _git("rev-parse", "HEAD", cwd=ws).strip() == first
    preds = tmp_path / "preds.jsonl"
    assert cli("batch", "export", "url", "--preds", str(preds)).code == 0
    (pred,) = [json.loads(line) for line in preds.read_text().splitlines()]
    fresh = tmp_path / "fresh"
    _git("worktree", "add", "-q", "--detach", str(fresh), first, cwd=repo)
    (tmp_path / "p.diff").write_text(pred["model_patch"])
    subprocess.run(["git", "apply", "--check", str(tmp_path / "p.diff")], cwd=fresh, check=True)


def test_a_finished_batch_is_notified_once(
    cli: Callable[..., Result], tmp_path: Path, write_script: Callable[..., str]
) -> None:
    """`batch_done` goes through the outbox with the batch's finish (keyed by the batch):
    one event however often the batch is looked at again, its counts and signature right."""
    from test_notify import SECRET, config
    from webhook_receiver import Receiver

    receiver = Receiver(secret=SECRET)
    try:
        extra = config(
            tmp_path, [{"url": receiver.url, "secret": SECRET, "events": ["batch_done"]}]
        )
        repos = make_repos(tmp_path / "src", 1)
        tasks = tmp_path / "tasks.jsonl"
        write_tasks(tasks, repos, 2, write_script(SCRIPT))
        wd = tmp_path / "wd"
        args = ("batch", "submit", str(tasks), "--workdir", str(wd), "--shell", "allow")
        ran = cli(*args, "--name", "nb", "--run", "--concurrency", "2", extra_env=extra)
        assert ran.code == 0, ran.stderr
        # Again: nothing left to run, the batch finished already: no second event.
        again = cli("batch", "resume", "nb", "--run", extra_env=extra)
        assert again.code == 0, again.stderr
        (event,) = receiver.events().values()
        assert len(receiver.accepted()) == 1
        assert all(receiver.verify(r) for r in receiver.accepted())
        batch_id = cli("batch", "show", "nb", "--json").json()["batch_id"]
        assert (event["event"], event["batch_id"], event["name"]) == ("batch_done", batch_id, "nb")
        assert event["tasks"] == 2 and event["by_status"] == {"completed": 2}
        assert event["idempotency_key"].startswith(f"batch_done:{batch_id}:")
    finally:
        receiver.close()
