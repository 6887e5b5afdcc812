"""Hostile and careless batch files (docs/fleets.md, "A bad line is refused with its line
number (exit 2), before anything is queued"): each file gives one error line naming its
line and queues nothing, or a correct batch; never a traceback, never a credential in the
store; and no two tasks share a workspace folder, not even across batches."""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_batch import SCRIPT, make_repos, write_tasks

SECRET = "ghp_s3cretT0kenXYZ"


def _store_text(db: Path) -> str:
    """Every value of every table of the store, as text."""
    if not db.exists():
        return ""
    conn = sqlite3.connect(db)
    try:
        out = []
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                out.append(repr(row))
        return "\n".join(out)
    finally:
        conn.close()


def _count(db: Path, table: str) -> int:
    if not db.exists():
        return 0
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    except sqlite3.OperationalError:  # no such table: the store was never made
        return 0
    finally:
        conn.close()


@pytest.mark.slow  # two batches run (git worktrees)
def test_two_batches_in_one_workdir_never_share_a_folder(
    cli: Callable[..., Result], tmp_path: Path, write_script: Callable[..., str]
) -> None:
    """The same tasks under a second name (another model, say) in the same --workdir: each
    run gets its own tree, not the first batch's edited one."""
    repos = make_repos(tmp_path / "src", 1)
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, repos, 1, write_script(SCRIPT))
    wd = tmp_path / "wd"
    for name in ("first", "second"):
        ran = cli("batch", "submit", str(tasks), "--workdir", str(wd), "--name", name, "--run")
        assert ran.code == 0, ran.stderr
        preds = tmp_path / f"{name}.jsonl"
        assert cli("batch", "export", name, "--preds", str(preds)).code == 0
        (pred,) = [json.loads(line) for line in preds.read_text().splitlines()]
        assert "+x = 2" in pred["model_patch"], (name, pred)
    spaces = [p for p in wd.iterdir() if not p.name.startswith(".")]
    assert len(spaces) == 2


@pytest.mark.parametrize(
    "bad",
    [
        {"repo": "missing"},
        {"priority": 2**40},
        {"max_steps": -3},
        {"model": "scripted:/no/such/script.json"},
    ],
    ids=["repo", "priority", "budget", "model"],
)
def test_a_bad_line_after_good_ones_queues_nothing(
    cli_inproc: Callable[..., Result],
    tmp_path: Path,
    write_script: Callable[..., str],
    bad: dict[str, Any],
) -> None:
    (repo,) = make_repos(tmp_path / "src", 1)
    good = {"id": "a", "task": "t", "repo": str(repo), "model": write_script(SCRIPT)}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b", **bad}) + "\n")
    res = cli_inproc("batch", "submit", str(tasks), "--workdir", str(tmp_path / "wd"))
    assert res.code == 2, res
    assert (
        res.stderr.startswith(f"durable-agent: error: {tasks}:2: ") and res.stderr.count("\n") == 1
    ), res.stderr
    db = tmp_path / "store.db"
    assert _count(db, "runs") == 0 and _count(db, "batches") == 0


def _task_lines(repo: str, script: str) -> st.SearchStrategy[str]:
    """One line of a hostile TASKS.jsonl: a good task with one field made hostile (or none),
    or a line that is no task at all."""
    hostile_text = st.text(st.characters(codec=None), min_size=1, max_size=12)
    hostile = {
        "id": st.one_of(st.sampled_from(["a", "a/b", "a_b", "..", "x" * 201]), hostile_text),
        "task": hostile_text,
        "repo": st.one_of(
            st.sampled_from(
                [
                    "src/repo0",
                    "../outside",
                    "missing",
                    "--upload-pack=touch pwned;://x",
                    "-c",
                    f"https://user:{SECRET}@example.invalid/x.git",
                    f"https://{SECRET}@example.invalid/x.git",
                    f"ssh://git:{SECRET}@example.invalid/x.git",
                    "file:///nonexistent/repo",
                ]
            ),
            hostile_text,
        ),
        "ref": st.one_of(st.sampled_from(["HEAD", "--orphan=x", "-"]), hostile_text),
        "priority": st.one_of(st.integers(), st.floats(), st.booleans()),
        "queue_key": hostile_text,
        "max_steps": st.one_of(st.integers(), st.floats(allow_nan=True)),
        "metadata": st.one_of(st.dictionaries(hostile_text, hostile_text), st.integers()),
        "model": hostile_text,
        "extra": st.none(),
    }
    ids = st.text("abc/_.", min_size=1, max_size=3)
    base = ids.map(lambda i: {"id": i, "task": "fix it", "repo": repo, "model": script})
    one = st.sampled_from(sorted(hostile)).flatmap(
        lambda field: st.tuples(st.just(field), hostile[field])
    )
    task = st.tuples(base, st.one_of(st.none(), one)).map(
        lambda pair: json.dumps({**pair[0], **({pair[1][0]: pair[1][1]} if pair[1] else {})})
    )
    return st.one_of(
        task,
        task,
        task,
        task,
        st.sampled_from(["{}", "[1]", "not json", "x" * 200_000]),
    )


def _submit_in_process(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    import os

    from durable_agent.cli.parser import main

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, err.getvalue()


@pytest.mark.slow  # over 3 s on 2 cores
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    lines=st.lists(st.data(), min_size=1, max_size=3),
    raw=st.one_of(st.just(b""), st.sampled_from([b"", b"\x00", b"\xff\xfe", b"\n\n", b"\xc3("])),
)
def test_hostile_files_give_one_error_line_or_a_correct_batch(
    tmp_path_factory: pytest.TempPathFactory,
    env: dict[str, str],
    lines: list[st.DataObject],
    raw: bytes,
) -> None:
    tmp = tmp_path_factory.mktemp("hostile")
    (repo,) = make_repos(tmp / "src", 1)
    script = tmp / "script.json"
    script.write_text(json.dumps(SCRIPT))
    strategy = _task_lines(str(repo), f"scripted:{script}")
    text = [d.draw(strategy) for d in lines]
    tasks = tmp / "tasks.jsonl"
    tasks.write_bytes(raw + "\n".join(text).encode("utf-8", "surrogatepass") + b"\n")
    db = tmp / "store.db"
    code, err = _submit_in_process(
        ["batch", "submit", str(tasks), "--workdir", str(tmp / "wd"), "--db", f"sqlite:///{db}"],
        {**env, "DURABLE_AGENT_DB": f"sqlite:///{db}"},
    )
    assert "Traceback" not in err, err
    assert SECRET not in _store_text(db)
    if code != 0:
        assert code == 2, err
        assert err.count("\n") == 1 and err.startswith("durable-agent: error: "), err
        assert _count(db, "runs") == 0 and _count(db, "batch_tasks") == 0
        return
    # a correct batch: one run a task, each in a folder of its own under --workdir
    conn = sqlite3.connect(db)
    try:
        spaces = [r[0] for r in conn.execute("SELECT workspace FROM runs")]
        tasks_n = conn.execute("SELECT count(*) FROM batch_tasks").fetchone()[0]
    finally:
        conn.close()
    assert len(spaces) == tasks_n == len(set(spaces)) >= 1
    assert all(Path(w).parent == (tmp / "wd").resolve() for w in spaces)
