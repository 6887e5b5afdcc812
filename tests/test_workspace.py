"""The workspace is part of the checkpoint: snapshots, diff, restore, fork, resume anywhere.

Real processes (the CLI), real bash commands, real git. The round-trip test stops the run
after every tool step (`--max-steps k`, then resume), copies the workspace itself, and
checks that `restore --at SEQ` gives exactly that copy for every step of the run.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from workspace_support import da, picture

from durable_agent.workspace.manifest import (
    FILE,
    LINK,
    Entry,
    Manifest,
    apply_stored,
    changes,
    encode_delta,
    encode_full,
)

NAME = "n\\xffm"  # a file name with the byte 0xff, as the tools take it back

MIXED = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hello\n"}}]},
    {
        "tool_calls": [
            {
                "name": "run_command",
                "arguments": {
                    "command": "mkdir -p d/e && echo hi > d/e/f && printf '\\000\\001\\377bin' > bin.dat"
                },
            }
        ]
    },
    {
        "tool_calls": [
            {
                "name": "edit_file",
                "arguments": {"path": "a.txt", "old_string": "hello", "new_string": "bye"},
            }
        ]
    },
    {
        "tool_calls": [
            {
                "name": "run_command",
                "arguments": {
                    "command": "chmod +x a.txt && ln -s a.txt link && printf 'x' > \"$(printf 'n\\377m')\""
                },
            }
        ]
    },
    {
        "tool_calls": [
            {
                "name": "run_command",
                "arguments": {"command": "rm d/e/f && mv a.txt b.txt && mkdir -p empty/x"},
            }
        ]
    },
    {
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "d/new.txt", "content": "new\n"}}
        ]
    },
    {"tool_calls": [{"name": "write_file", "arguments": {"path": NAME, "content": "utf8 now\n"}}]},
    {
        "tool_calls": [
            {"name": "run_command", "arguments": {"command": "rm -r d link && chmod 600 bin.dat"}}
        ]
    },
    {"content": "done"},
]


def _start(
    env: dict[str, str], ws: Path, model: str, run_id: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    return da(
        [
            "start",
            "t",
            "--workspace",
            str(ws),
            "--model",
            model,
            "--shell",
            "allow",
            "--run-id",
            run_id,
            "--quiet",
            *extra,
        ],
        env,
        ws,
    )


@pytest.mark.slow
def test_restore_at_every_step_equals_the_workspace_right_after_it(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    model = write_script(MIXED)
    copies = [picture(workspace)]  # copies[k]: after k tool steps (= after model call k+1)
    proc = _start(env, workspace, model, "rt", "--max-steps", "1")
    assert proc.returncode == 3, proc.stderr
    copies.append(picture(workspace))
    for k in range(2, len(MIXED) + 1):
        proc = da(["resume", "rt", "--max-steps", str(k), "--quiet"], env, workspace)
        assert proc.returncode in (0, 3), proc.stderr
        copies.append(picture(workspace))
    assert proc.returncode == 0
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    last = db.execute("SELECT MAX(seq) FROM steps WHERE run_id='rt'").fetchone()[0]
    assert last == 2 * (len(MIXED) - 1)
    for seq in range(last + 1):  # as `show` and `steps.seq` number the steps
        target = tmp_path / f"at{seq}"
        proc = da(["restore", "rt", "--at", str(seq), "--to", str(target)], env, workspace)
        assert proc.returncode == 0, proc.stderr
        expected = copies[(seq + 1) // 2]  # model step 2k and tool step 2k-1: after k tool steps
        assert picture(target) == expected, f"step {seq}"
    # Every change kind was recorded, command-made ones included, and the view shows them.
    kinds = {r[0] for r in db.execute("SELECT change FROM step_changes WHERE run_id='rt'")}
    assert kinds == {"added", "modified", "deleted", "mode"}
    assert ("d/e/f", "added") in db.execute(
        "SELECT path, change FROM step_changes WHERE run_id='rt' AND seq=3"
    ).fetchall()
    # Reads and model calls take no snapshot.
    assert db.execute(
        "SELECT COUNT(*) FROM steps WHERE run_id='rt' AND kind='model' AND "
        "(tree_id IS NOT NULL OR tree_before IS NOT NULL)"
    ).fetchone() == (0,)


def test_diff_shows_command_made_changes_and_one_step(env, workspace, write_script) -> None:  # type: ignore[no-untyped-def]
    assert _start(env, workspace, write_script(MIXED), "df").returncode == 0
    whole = da(["diff", "df"], env, workspace)
    assert whole.returncode == 0
    assert "+++ b/b.txt" in whole.stdout and "+bye" in whole.stdout
    assert "diff --git a/bin.dat b/bin.dat\nnew file mode 100644\n" in whole.stdout
    assert "GIT binary patch\nliteral " in whole.stdout  # git's own format: `git apply` takes it
    assert "d/e/f" not in whole.stdout  # created and deleted within the run
    stat3 = json.loads(da(["diff", "df", "--step", "3", "--json"], env, workspace).stdout)
    assert {(c["path"], c["change"]) for c in stat3["changes"]} == {
        ("d/e/f", "added"),
        ("bin.dat", "added"),
    }
    one = da(["diff", "df", "--step", "7", "--stat"], env, workspace)
    assert "a.txt" in one.stdout and "mode" in one.stdout and "link" in one.stdout
    assert da(["diff", "df", "--step", "99"], env, workspace).returncode == 2


def test_gitignore_exclude_and_size_cap(tmp_path, env, workspace, write_script) -> None:  # type: ignore[no-untyped-def]
    (workspace / ".gitignore").write_text("build/\n*.log\n!keep.log\n")
    (workspace / "node_modules").mkdir()
    (workspace / "node_modules" / "m.js").write_text("x")
    config = tmp_path / "c.toml"
    config.write_text("snapshot_max_file_bytes = 1000\n")
    model = write_script(
        [
            {
                "tool_calls": [
                    {
                        "name": "run_command",
                        "arguments": {
                            "command": "mkdir build && echo o > build/o && echo l > x.log && echo k > keep.log && head -c 5000 /dev/zero > big.bin"
                        },
                    }
                ]
            },
            {"content": "done"},
        ]
    )
    proc = da(
        [
            "start",
            "t",
            "--workspace",
            str(workspace),
            "--model",
            model,
            "--shell",
            "allow",
            "--run-id",
            "ig2",
            "--quiet",
        ],
        env,
        workspace,
        extra={"DURABLE_AGENT_CONFIG": str(config)},
    )
    assert proc.returncode == 0, proc.stderr
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    paths = {r[0] for r in db.execute("SELECT path FROM step_changes WHERE run_id='ig2'")}
    assert paths == {"keep.log", "big.bin"}
    note = db.execute(
        "SELECT json_extract(output, '$.workspace_note') FROM steps WHERE run_id='ig2' AND seq=1"
    ).fetchone()[0]
    assert "big.bin" in note and "size cap" in note
    # restore --force leaves ignored, excluded and oversized files alone.
    (workspace / "keep.log").unlink()
    proc = da(["restore", "ig2", "--at", "1", "--to", str(workspace), "--force"], env, workspace)
    assert proc.returncode == 0, proc.stderr
    assert "undo with: durable-agent restore ig2 --tree" in proc.stdout
    assert (
        "left as they are, too large to have been snapshotted: big.bin" in proc.stdout
    )  # not silently
    assert (workspace / "keep.log").read_text() == "k\n"
    for kept in ("build/o", "x.log", "node_modules/m.js", "big.bin"):
        assert (workspace / kept).exists(), kept


def test_restore_refuses_a_non_empty_dir_without_force(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    assert (
        _start(env, workspace, write_script(MIXED[:1] + [{"content": "ok"}]), "nf").returncode == 0
    )
    other = tmp_path / "other"
    other.mkdir()
    (other / "mine.txt").write_text("precious")
    proc = da(["restore", "nf", "--at", "1", "--to", str(other)], env, workspace)
    assert proc.returncode == 2 and "--force" in proc.stderr and "Traceback" not in proc.stderr
    assert (other / "mine.txt").read_text() == "precious"
    proc = da(["restore", "nf", "--at", "1", "--to", str(other), "--force"], env, workspace)
    assert proc.returncode == 0 and not (other / "mine.txt").exists()
    undo = proc.stdout.split("undo with: ", 1)[1].splitlines()[0]
    assert da(undo.split()[1:], env, workspace).returncode == 0
    assert (other / "mine.txt").read_text() == "precious" and not (other / "a.txt").exists()


@pytest.mark.slow
def test_fork_copies_history_and_files_and_leaves_the_original(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    model = write_script(MIXED)
    assert _start(env, workspace, model, "orig").returncode == 0
    original = picture(workspace)
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    before = db.execute("SELECT * FROM steps WHERE run_id='orig' ORDER BY seq").fetchall()
    fork_ws = tmp_path / "forked"
    proc = da(
        ["fork", "orig", "--at", "2", "--workspace", str(fork_ws), "--run-id", "f1", "--json"],
        env,
        workspace,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["run_id"] == "f1"
    assert json.loads(proc.stdout)["fork_seq"] == 2  # the number --at took
    at2 = tmp_path / "at2"
    assert da(["restore", "orig", "--at", "2", "--to", str(at2)], env, workspace).returncode == 0
    assert picture(fork_ws) == picture(at2)
    # Step 2 is the model call whose run_command had not run: closed, not left open.
    tool_msgs = db.execute(
        "SELECT content FROM messages WHERE run_id='f1' AND role='tool'"
    ).fetchall()
    assert tool_msgs[-1][0] == "error: not run in this fork"
    assert db.execute(
        "SELECT forked_from, fork_seq, status FROM runs WHERE id='f1'"
    ).fetchone() == ("orig", 2, "pending")
    shown = da(["show", "f1"], env, workspace).stdout
    assert "forked     from orig after step 2" in shown
    proc = da(["resume", "f1", "--quiet"], env, fork_ws)
    assert proc.returncode == 0, proc.stderr
    assert db.execute("SELECT * FROM steps WHERE run_id='orig' ORDER BY seq").fetchall() == before
    assert picture(workspace) == original
    assert (
        da(["fork", "orig", "--at", "2", "--workspace", str(fork_ws)], env, workspace).returncode
        == 2
    )


@pytest.mark.slow
def test_resume_rebuilds_a_missing_workspace_and_blocks_on_drift(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    model = write_script(MIXED)
    assert _start(env, workspace, model, "mv", "--max-steps", "4").returncode == 3
    expected = picture(workspace)
    elsewhere = tmp_path / "elsewhere"
    proc = da(["resume", "mv", "--workspace", str(elsewhere), "--max-steps", "4"], env, tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert picture(elsewhere) == expected
    (elsewhere / "b.txt").write_text("edited by a person\n")
    (elsewhere / "zzz").write_text("new")
    proc = da(
        ["resume", "mv", "--workspace", str(elsewhere), "--max-steps", "5", "--json"], env, tmp_path
    )
    assert proc.returncode == 5 and json.loads(proc.stdout)["stop_reason"] == "workspace_drift"
    shown = da(["show", "mv"], env, tmp_path).stdout
    assert "zzz (added)" in shown and "b.txt (added)" in shown
    assert da(["approve", "mv", "--deny"], env, tmp_path).returncode == 0
    proc = da(["resume", "mv", "--workspace", str(elsewhere), "--max-steps", "4"], env, tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert picture(elsewhere) == expected  # --deny put the snapshot back
    undo = (
        proc.stderr.split("the files it replaces: ", 1)[1].splitlines()[0].split()
    )  # after keeping them
    undone = tmp_path / "undone"
    assert da([*undo[1 : undo.index("--to") + 1], str(undone)], env, tmp_path).returncode == 0
    assert (undone / "b.txt").read_text() == "edited by a person\n" and (
        undone / "zzz"
    ).read_text() == "new"
    (elsewhere / "zzz").write_text("again")
    assert da(["resume", "mv", "--workspace", str(elsewhere)], env, tmp_path).returncode == 5
    assert da(["approve", "mv"], env, tmp_path).returncode == 0
    proc = da(
        ["resume", "mv", "--workspace", str(elsewhere), "--max-steps", "50", "--quiet"],
        env,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (elsewhere / "zzz").read_text() == "again"  # approved: the files as they were


def _git(ws: Path, env: dict[str, str], *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=ws,
        env=env,
        check=True,
        capture_output=True,
    )


def test_git_repository_is_byte_identical_after_run_fork_and_restore(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    home.mkdir()
    genv = {**env, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1"}
    genv = {k: v for k, v in genv.items() if not k.startswith("GIT_") or k == "GIT_CONFIG_NOSYSTEM"}
    subprocess.run(["git", "init", "-q"], cwd=workspace, env=genv, check=True)
    (workspace / "a.txt").write_text("hello\n")
    (workspace / "tracked.txt").write_text("one\n")
    _git(workspace, genv, "add", ".")
    _git(workspace, genv, "commit", "-qm", "first")
    (workspace / "tracked.txt").write_text("two\n")
    _git(workspace, genv, "stash")
    (workspace / "untracked.txt").write_text("u\n")
    git_before = picture(workspace / ".git")
    model = write_script(MIXED)
    assert _start(genv, workspace, model, "g").returncode == 0
    assert (
        da(
            ["fork", "g", "--at", "4", "--workspace", str(tmp_path / "fk")], genv, workspace
        ).returncode
        == 0
    )
    proc = da(["restore", "g", "--at", "0", "--to", str(workspace), "--force"], genv, workspace)
    assert proc.returncode == 0, proc.stderr
    assert picture(workspace / ".git") == git_before
    assert not (home / ".gitconfig").exists() and list(home.iterdir()) == []
    # The restored workspace is the one the run started from: untracked files included.
    assert (workspace / "untracked.txt").read_text() == "u\n" and (
        workspace / "a.txt"
    ).read_text() == "hello\n"
    assert not (tmp_path / "fk" / ".git").exists()


# -- the manifest format, with hostile names ---------------------------------------------------
names = st.binary(min_size=1, max_size=12).filter(
    lambda b: b"\0" not in b and b"/" not in b and b not in (b".", b"..")
)
entries = st.one_of(
    st.builds(
        lambda r, m, s: Entry(FILE, m, r, size=s),
        st.text("0123456789abcdef", min_size=64, max_size=64),
        st.integers(0, 0o777),
        st.integers(0, 2**40),
    ),
    st.builds(lambda t: Entry(LINK, target=t), names),
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(names, entries, max_size=8), st.dictionaries(names, entries, max_size=8))
def test_manifests_round_trip_any_names(old: dict[bytes, Entry], new: dict[bytes, Entry]) -> None:
    assert apply_stored(None, encode_full(old)) == old
    delta, _ = encode_delta(old, new)
    assert apply_stored(old, delta) == new
    assert {c.path for c in changes(old, new)} == {
        p for p in set(old) | set(new) if old.get(p) != new.get(p)
    }


def test_a_long_chain_of_small_changes_goes_on_from_the_last_whole_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every MAX_DEPTH deltas the chain went on from a whole manifest written again (1.5 MB
    # at 50,000 files); now from the last whole one, with the changes since. Each tree
    # still loads back as the manifest its snapshot took.
    from durable_agent.store.blobs import MAX_DEPTH, BlobStore, save_statements
    from durable_agent.store.engine import open_store_engine
    from durable_agent.workspace import scan, snapshot
    from durable_agent.workspace.scan import Scanner

    monkeypatch.setattr(scan, "RACY_NS", 0)
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(200):
        (ws / f"f{i:03d}.txt").write_text(f"file {i}\n")
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    blobs = BlobStore(engine)
    scanner = Scanner(ws, [], 10_000)
    taken: dict[str, Manifest] = {}

    def take(paths: list[bytes] | None, saved: bool = True) -> str:
        snap = snapshot.take(scanner, blobs, paths)
        if saved:
            save_statements(engine, snap.statements)
            taken[snap.tree_id] = dict(snap.manifest)
        return snap.tree_id

    first = take(None)
    for step in range(2 * MAX_DEPTH + 10):
        name = f"f{step % 7:03d}.txt"  # a few files, edited over and over
        (ws / name).write_text(f"edit {step}\n")
        take([name.encode()])
    with sqlite3.connect(tmp_path / "store.db") as conn:
        rows = conn.execute("SELECT id, base, depth FROM workspace_trees").fetchall()
    assert [tid for tid, base, _ in rows if base is None] == [first]  # one whole manifest
    assert max(depth for _, _, depth in rows) == MAX_DEPTH
    assert sum(1 for _, base, depth in rows if base == first and depth == 1) == 3
    snapshot._trees.clear()  # read back from the store, not the cache
    for tid, manifest in taken.items():
        assert snapshot.load(blobs, tid) == manifest, tid

    # A whole manifest whose transaction failed is not gone on from; a change of more than
    # a quarter of the files is written whole.
    for i in range(60):
        (ws / f"f{i:03d}.txt").write_text(f"rewritten {i}\n")
    lost = take(None, saved=False)
    (ws / "f100.txt").write_text("one more\n")
    for _ in range(MAX_DEPTH + 1):  # to the chain's end, so the next goes on from a whole
        (ws / "f101.txt").write_text(f"{_}\n")
        take([b"f101.txt"])
    with sqlite3.connect(tmp_path / "store.db") as conn:
        bases = {base for (base,) in conn.execute("SELECT base FROM workspace_trees")}
    assert lost not in bases
    snapshot._trees.clear()
    for tid, manifest in taken.items():
        assert snapshot.load(blobs, tid) == manifest, tid
    engine.dispose()


def test_unchanged_workspace_is_not_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_agent.workspace import scan
    from durable_agent.workspace.scan import Scanner

    (tmp_path / "f").write_text("x")
    monkeypatch.setattr(scan, "RACY_NS", 0)  # a change before the scan began is not racy
    scanner = Scanner(tmp_path, [], 10_000)
    first: Any = scanner.scan()
    assert list(first.contents) and scanner.scan().contents == {}
    (tmp_path / "f").write_text("y")
    assert list(scanner.scan().contents) != list(first.contents)


def test_interrupted_command_lists_its_changes_and_approve_restore_runs_it_from_the_start(
    env, workspace, write_script, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import signal
    import sys
    import time

    (workspace / "keep.txt").write_text("before\n")
    model = write_script(
        [
            {
                "tool_calls": [
                    {
                        "name": "run_command",
                        "arguments": {
                            "command": "echo partial > p.txt && rm keep.txt && sleep ${DA_TEST_DELAY:-0} && echo done > d.txt"
                        },
                    }
                ]
            },
            {"content": "done"},
        ]
    )
    config = tmp_path / "delay.toml"
    config.write_text('command_env = ["DA_TEST_DELAY"]\n')
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "durable_agent",
            "start",
            "t",
            "--model",
            model,
            "--shell",
            "allow",
            "--run-id",
            "cut",
            "--quiet",
        ],
        cwd=workspace,
        # Commands get only the variables `command_env` names: the first run's command waits.
        env={**env, "DA_TEST_DELAY": "60", "DURABLE_AGENT_CONFIG": str(config)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not (workspace / "p.txt").exists() or (workspace / "keep.txt").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    blocked = da(["resume", "cut"], env, workspace)
    assert blocked.returncode == 5
    assert "p.txt (added)" in blocked.stderr and "keep.txt (deleted)" in blocked.stderr
    assert "p.txt (added)" in da(["show", "cut"], env, workspace).stdout
    assert da(["approve", "cut", "--restore", "--deny"], env, workspace).returncode == 2
    assert da(["approve", "cut", "--restore"], env, workspace).returncode == 0
    done = da(["resume", "cut", "--quiet"], env, workspace)
    assert done.returncode == 0, done.stderr
    assert (workspace / "d.txt").read_text() == "done\n"
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    # Re-run from the pre-command snapshot: keep.txt came back and was deleted again.
    changed = set(
        db.execute("SELECT path, change FROM step_changes WHERE run_id='cut' AND seq=1").fetchall()
    )
    assert changed == {("p.txt", "added"), ("keep.txt", "deleted"), ("d.txt", "added")}


def test_a_changed_gitignore_applies_to_files_already_cached(tmp_path: Path) -> None:
    from durable_agent.workspace.scan import Scanner

    (tmp_path / "sub").mkdir()
    for name in ("a.log", "sub/b.log", "sub/c.txt"):
        (tmp_path / name).write_text(name)
    scanner = Scanner(tmp_path, [".git/"], 10_000)
    assert set(scanner.scan().manifest) == {b"a.log", b"sub/b.log", b"sub/c.txt"}
    (tmp_path / "sub" / ".gitignore").write_text("*.log\n")
    assert set(scanner.scan().manifest) == {b"a.log", b"sub/.gitignore", b"sub/c.txt"}
    (tmp_path / ".gitignore").write_text("*.txt\n")
    assert set(scanner.scan().manifest) == {b"a.log", b".gitignore", b"sub/.gitignore"}
    (tmp_path / ".gitignore").unlink()
    assert set(scanner.scan().manifest) == {b"a.log", b"sub/.gitignore", b"sub/c.txt"}


def test_a_detached_run_starts_on_another_root_with_the_users_files(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    (workspace / "seed.txt").write_text("from the user's disk\n")
    model = write_script(
        [
            {
                "tool_calls": [
                    {"name": "run_command", "arguments": {"command": "cat seed.txt > copy.txt"}}
                ]
            },
            {"content": "done"},
        ]
    )
    proc = da(
        ["start", "t", "--model", model, "--shell", "allow", "--run-id", "det", "--detach"],
        env,
        workspace,
    )
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "other-host"
    proc = da(["worker", "--once", "--workspace-root", str(root), "--poll", "0.1"], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rebuilt the workspace" in proc.stderr
    assert (root / "det" / "copy.txt").read_text() == "from the user's disk\n"
    assert not (workspace / "copy.txt").exists()
    stat = da(["diff", "det", "--stat"], env, workspace).stdout
    assert "copy.txt" in stat and "seed.txt" not in stat


def test_a_worker_leaves_a_run_whose_id_names_no_folder_of_its_own(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    # A store made before ids were checked may hold a run `..`: with --workspace-root ROOT it
    # ran in ROOT/.., the parent folder, and rebuilt its snapshot there.
    (workspace / "seed.txt").write_text("from the user's disk\n")
    model = write_script([{"content": "done"}])
    proc = da(["start", "t", "--model", model, "--run-id", "det", "--detach"], env, workspace)
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(tmp_path / "store.db") as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            column = "id" if table == "runs" else "run_id" if "run_id" in columns else None
            if column:
                db.execute(f"UPDATE {table} SET {column} = '..' WHERE {column} = 'det'")
    root = tmp_path / "hosts" / "h1"
    proc = da(["worker", "--once", "--workspace-root", str(root), "--poll", "0.1"], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "run id '..' cannot name a folder under --workspace-root" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "hosts" / "seed.txt").exists() and list(root.iterdir()) == []
    shown = da(["show", "..", "--json"], env, tmp_path)
    assert json.loads(shown.stdout)["status"] == "pending", shown.stdout  # left for another worker


def test_a_workspace_root_that_cannot_hold_run_folders_is_refused_before_a_claim(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    # A file, or a folder of /proc: every run claimed failed with a traceback, exit 0.
    proc = da(
        ["start", "t", "--model", write_script([{"content": "done"}]), "--run-id", "q", "--detach"],
        env,
        workspace,
    )
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "a-file").write_text("")
    for root in (tmp_path / "a-file", "/proc/nonexistent"):
        proc = da(
            ["worker", "--once", "--workspace-root", str(root), "--poll", "0.1"], env, tmp_path
        )
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(
            f"durable-agent: error: --workspace-root {root}: cannot make it a folder"
        )
    # Folders that exist and that root may "write" by the permission bits, yet where no
    # folder can be made: tried, not asked.
    for root in ("/proc", "/sys/kernel"):
        proc = da(["worker", "--once", "--workspace-root", root, "--poll", "0.1"], env, tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(
            f"durable-agent: error: --workspace-root {root}: this worker cannot make run "
            f"folders in it"
        )
    shown = da(["show", "q", "--json"], env, tmp_path)
    assert (
        json.loads(shown.stdout)["status"] == "pending"
        and json.loads(shown.stdout)["error"] is None
    )
    made = tmp_path / "new" / "root"  # a missing one is made
    proc = da(["worker", "--once", "--workspace-root", str(made), "--poll", "0.1"], env, tmp_path)
    assert proc.returncode == 0 and (made / "q").is_dir(), proc.stderr
    assert sorted(p.name for p in made.iterdir()) == ["q"]  # the probe left nothing


@pytest.mark.parametrize("rel", [b"../escaped", b"/etc/escaped", b"d/../../escaped", b"d//x"])
def test_a_hand_edited_snapshot_never_writes_outside_the_workspace(
    tmp_path: Path, rel: bytes
) -> None:
    from durable_agent.workspace.materialize import materialize
    from durable_agent.workspace.scan import Scanner

    root = tmp_path / "a" / "ws"
    root.mkdir(parents=True)
    from durable_agent.errors import StoreError

    with pytest.raises(StoreError, match="not inside the workspace"):
        materialize(
            {rel: Entry(FILE, 0o644, "x" * 64, b"", 1)},
            root,
            Scanner(root, [], 10_000),
            lambda _: b"!",
        )
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "ws"]


# The incremental scan (stat cache, a manifest kept when nothing changed) against a scan
# from scratch, after any sequence of edits: files, links, modes, empty directories, a
# file turned directory and back, .gitignore rules, old and racy mtimes.
_op_names = st.sampled_from(["a", "b", "d/c", "d/e", "d/f/g", "x.log", "d/x.log"])
_ops = st.one_of(
    st.tuples(st.just("write"), _op_names, st.binary(max_size=6), st.booleans()),
    st.tuples(st.just("delete"), st.one_of(_op_names, st.sampled_from(["d", "d/f"]))),
    st.tuples(st.just("chmod"), _op_names, st.sampled_from([0o644, 0o755, 0o600])),
    st.tuples(st.just("link"), _op_names, st.sampled_from([b"a", b"../nowhere", b"d"])),
    st.tuples(st.just("mkdir"), st.sampled_from(["e1", "d/e2", "a"])),
    st.tuples(
        st.just("ignore"),
        st.sampled_from(["", "d/"]),
        st.sampled_from(["", "*.log\n", "c\n!x.log\n", "f/\n"]),
    ),
)


def _apply(root: Path, op: tuple[Any, ...]) -> None:
    import shutil

    path = root / op[1]
    if op[0] in ("write", "link") and path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    if op[0] in ("write", "link", "mkdir"):
        path.parent.mkdir(parents=True, exist_ok=True)
    if op[0] == "write":
        if path.is_symlink():
            path.unlink()
        path.write_bytes(op[2])
        if op[3]:
            os.utime(path, ns=(10**18, 10**18))  # an old-looking mtime kept by an edit (touch -d)
    elif op[0] == "delete":
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
    elif op[0] == "chmod" and path.is_file() and not path.is_symlink():
        path.chmod(op[2])
    elif op[0] == "link":
        if path.is_symlink() or path.exists():
            path.unlink()
        path.symlink_to(os.fsdecode(op[2]))
    elif op[0] == "mkdir":
        if path.is_symlink() or path.is_file():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
    elif op[0] == "ignore":
        path.mkdir(parents=True, exist_ok=True)
        (path / ".gitignore").write_text(op[2])


@pytest.mark.slow  # over 2 s on 2 cores
@settings(max_examples=60, deadline=None)
@given(st.lists(_ops, min_size=1, max_size=12))
def test_an_incremental_scan_equals_a_scan_from_scratch(ops: list[tuple[Any, ...]]) -> None:
    import contextlib
    import tempfile

    from durable_agent.workspace.manifest import TreeIds, tree_id
    from durable_agent.workspace.scan import Scanner

    saved, TreeIds.REBUILD_AT = TreeIds.REBUILD_AT, 2  # both ways of keeping the id, in one test
    with contextlib.ExitStack() as stack:
        stack.callback(setattr, TreeIds, "REBUILD_AT", saved)
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        root = Path(tmp)
        incremental = Scanner(root, [".git/"], 4)  # files over 4 bytes are `big`
        prev: dict[bytes, Entry] = {}
        for op in ops:
            _apply(root, op)
            got = incremental.scan()
            # The scan's own delta gives the same changes as comparing every entry.
            assert changes(prev, got.manifest, got.delta_from(prev)) == changes(prev, got.manifest)
            prev = got.manifest
            want = Scanner(root, [".git/"], 4).scan().manifest
            assert got.manifest == want, op
            assert got.tree_id == tree_id(want)  # kept up to date, not recomputed
            again = incremental.scan()
            assert again.manifest == want and again.tree_id == got.tree_id


@pytest.mark.parametrize("name", ["store.db", "state dir/runs[1].db"])
def test_a_store_inside_the_workspace_is_not_part_of_its_snapshots(
    env, workspace, write_script, name
) -> None:  # type: ignore[no-untyped-def]
    # Allowed where sandboxed commands cannot write it (--sandbox off / read-only): its own
    # writes (the file, -wal, -shm) are not the run's changes and must not read as drift, and
    # no file tool may overwrite it.
    clobber = {
        "tool_calls": [{"name": "write_file", "arguments": {"path": name, "content": "gone"}}]
    }
    model = write_script(MIXED[:1] + MIXED[5:6] + [clobber, {"content": "done"}])
    db = ["--db", str(workspace / name)]
    proc = _start(env, workspace, model, "in", "--max-steps", "1", "--sandbox", "off", *db)
    assert proc.returncode == 3, proc.stderr
    proc = da(["resume", "in", "--max-steps", "5", "--quiet", *db], env, workspace)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # not blocked (workspace_drift)
    changed = sqlite3.connect(workspace / name).execute("select path from step_changes").fetchall()
    assert sorted(p for (p,) in changed) == ["a.txt", "d/new.txt"]
    assert "store" not in da(["diff", "in", "--stat", *db], env, workspace).stdout.replace(
        "durable", ""
    )
    shown = da(
        ["show", "in", *db], env, workspace
    ).stdout  # the store was not overwritten by the run
    assert "completed" in shown and "this run's own store" in shown


def test_a_fifo_or_endless_file_planted_as_gitignore_does_not_hang_the_snapshot(
    env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    # A command plants a FIFO (whose open waits for a writer for good) and a link to
    # /dev/zero (endless) where the scan reads ignore rules. Each session that scanned
    # there hung: the run, its cancel, every resume. git does not read a .gitignore that
    # is a link, and nothing but a regular file is read.
    turns = [
        {
            "tool_calls": [
                {
                    "name": "run_command",
                    "arguments": {
                        "command": "mkfifo .gitignore && mkdir sub && ln -s /dev/zero sub/.gitignore && echo '*.log' > keep.txt "
                        "&& mkfifo pipe && echo x > a.log"
                    },
                }
            ]
        },
        {
            "tool_calls": [
                {"name": "run_command", "arguments": {"command": "echo more >> keep.txt"}}
            ]
        },
        {"content": "done"},
    ]
    done = _start(env, workspace, write_script(turns), "ff")
    assert done.returncode == 0, done.stderr
    stat = json.loads(da(["diff", "ff", "--json"], env, workspace, timeout=30).stdout)
    assert {c["path"] for c in stat["changes"]} == {
        "keep.txt",
        "a.log",
        "sub/.gitignore",
    }  # the link, as a link
    restored = da(
        ["restore", "ff", "--at", "2", "--to", str(workspace.parent / "r")],
        env,
        workspace,
        timeout=30,
    )
    assert restored.returncode == 0, restored.stderr
    assert (workspace.parent / "r" / "keep.txt").read_text().startswith("*.log\n")
    assert not (workspace.parent / "r" / "pipe").exists()  # not a file: not in the snapshot


_UNREADABLE_SCAN = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from durable_agent.workspace.scan import DEFAULT_EXCLUDE, Scanner
ws = Path(sys.argv[1])
(ws / "d" / "e").mkdir(parents=True)
(ws / "d" / "empty").mkdir()
(ws / "d" / "a.txt").write_text("A")
(ws / "d" / "e" / "b.txt").write_text("B")
(ws / "f.txt").write_text("F")
(ws / "g").mkdir()
(ws / "g" / ".gitignore").write_text("*.log\\n")
(ws / "g" / "x.log").write_text("L")
scanner = Scanner(ws, DEFAULT_EXCLUDE, 1 << 20)
def names(manifest):
    return sorted(p.decode() for p in manifest)
def seen(s=None):
    scan = (s or scanner).scan()
    return {"manifest": names(scan.manifest), "unreadable": sorted(p.decode() for p in scan.unreadable)}
def fresh():
    return names(Scanner(ws, DEFAULT_EXCLUDE, 1 << 20).scan().manifest)
found = {"first": seen()}
last = scanner.scan().manifest
os.chmod(ws / "d", 0o311); os.chmod(ws / "f.txt", 0o000); os.chmod(ws / "g" / ".gitignore", 0o000)
found["closed"] = seen()
found["closed again"] = seen()
found["fresh, closed"] = {"manifest": fresh()}                    # nothing seen before: nothing to keep
seeded = Scanner(ws, DEFAULT_EXCLUDE, 1 << 20); seeded.seed(last)  # a new process, told what the store has
found["seeded, closed"] = seen(seeded)
os.chmod(ws / "d", 0o755); os.chmod(ws / "f.txt", 0o644); os.chmod(ws / "g" / ".gitignore", 0o644)
found["open"] = seen()
# Gone while hidden: seen gone once listed again, by the seeded scanner too.
os.chmod(ws / "d", 0o311)
seen(); seen(seeded)
os.chmod(ws / "d", 0o755); os.remove(ws / "d" / "a.txt"); os.chmod(ws / "d", 0o311)
os.chmod(ws / "d", 0o755)
found["gone while hidden"] = [seen()["manifest"], seen(seeded)["manifest"], fresh()]
# Listable but not searchable.
os.chmod(ws / "d", 0o644)
found["not searchable"] = seen()
os.chmod(ws / "d", 0o755)
# Ignore rules changed while hidden: once listed, as a full rescan has it.
os.chmod(ws / "d", 0o311)
seen()
(ws / ".gitignore").write_text("*.txt\\n")
seen()
os.chmod(ws / "d", 0o755)
found["rules changed while hidden"] = [seen()["manifest"], fresh()]
os.chmod(ws, 0o311)
found["root closed"] = seen()
os.chmod(ws, 0o755)
print(json.dumps(found))
"""


def test_what_the_harness_may_not_read_is_kept_as_last_seen_not_recorded_deleted() -> None:
    # `chmod 311 d` (or a test suite's unreadable fixture): the scan could not list d, and
    # recorded all it held as deleted. A restore or fork to that step then deleted them.
    from side_effects_support import AS_NOBODY, need_nobody, nobodys_folder

    need_nobody()
    with nobodys_folder() as ws:
        proc = subprocess.run(
            [*AS_NOBODY, "-c", _UNREADABLE_SCAN, str(ws), str(Path(__file__).parents[1])],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if "ModuleNotFoundError" in proc.stderr or "Permission denied: '/work" in proc.stderr:
            pytest.skip("nobody cannot read this checkout or its Python")
        assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    everything = ["d/a.txt", "d/e/b.txt", "d/empty", "f.txt", "g/.gitignore"]
    assert found["first"] == {"manifest": everything, "unreadable": []}
    assert found["closed"] == {"manifest": everything, "unreadable": ["d", "f.txt", "g/.gitignore"]}
    assert found["closed again"] == found["closed"]  # said at every scan while it lasts
    # Nothing seen before: d and g/.gitignore are left out, not called empty (the rules of that
    # .gitignore with it, as git has it).
    assert found["fresh, closed"] == {"manifest": ["g/x.log"]}
    # Seeded with what the store has, a new process keeps the same; only the rules of a
    # .gitignore it cannot read are unknown to it (the store has its bytes, not the scanner).
    assert found["seeded, closed"] == {
        "manifest": [*everything, "g/x.log"],
        "unreadable": found["closed"]["unreadable"],
    }
    assert found["open"] == {"manifest": everything, "unreadable": []}
    without_a = [p for p in everything if p != "d/a.txt"]
    assert found["gone while hidden"] == [without_a, without_a, without_a]
    assert found["not searchable"] == {"manifest": without_a, "unreadable": ["d"]}
    after_rules = [
        ".gitignore",
        "d/e",
        "d/empty",
        "g/.gitignore",
    ]  # *.txt ignored: d/e is empty now
    assert found["rules changed while hidden"] == [after_rules, after_rules]
    assert found["root closed"] == {"manifest": after_rules, "unreadable": [""]}


@pytest.mark.parametrize("planted", [".durable-agent-restore.tmp", "new-name"])
def test_a_link_the_agent_planted_never_takes_a_restore_outside(
    tmp_path, env, workspace, write_script, planted
) -> None:  # type: ignore[no-untyped-def]
    # restore wrote each file through a fixed temporary name: an agent's command that put a
    # link there (to ~/.bashrc, say) had restore, fork and a rebuilding resume write its
    # bytes, with its mode, outside the target. The link itself must come back as it was.
    victim, missing = tmp_path / "victim", tmp_path / "planted.sh"
    victim.write_text("ORIGINAL\n")
    victim.chmod(0o600)
    command = (
        f"ln -s {victim} {planted}; ln -s {missing} .durable-agent-restore.tmp2; "
        "printf 'PWNED\\n' > payload.txt; chmod 755 payload.txt; mkdir d; ln -s ../../.. d/up; echo x > d/f"
    )
    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "true"}}]},
            {"content": "ok"},
        ]
    )
    assert (
        _start(env, workspace, script, "pl", "--sandbox", "off", "--max-steps", "2").returncode == 3
    )
    expected = picture(workspace)
    runs = [
        (["restore", "pl", "--at", "1", "--to", str(tmp_path / "fresh")], 0),
        (
            ["fork", "pl", "--at", "1", "--workspace", str(tmp_path / "forked"), "--run-id", "pl2"],
            0,
        ),
        (["resume", "pl", "--workspace", str(tmp_path / "rebuilt"), "--max-steps", "2"], 3),
    ]  # rebuilt, stops
    for args, code in runs:
        proc = da(args, env, tmp_path)
        assert proc.returncode == code, proc.stderr
    for where in ("fresh", "forked", "rebuilt"):
        assert picture(tmp_path / where) == expected, where
    assert victim.read_text() == "ORIGINAL\n" and victim.stat().st_mode & 0o777 == 0o600
    assert not missing.exists()


def test_a_folder_past_path_max_is_noted_not_recorded_empty(tmp_path: Path) -> None:
    # 25 folders of 200 characters: past PATH_MAX (4096) the listing fails (ENAMETOOLONG),
    # and the walk recorded the folder there as empty, the files below it gone, without a word.
    from durable_agent.workspace.scan import DEFAULT_EXCLUDE, Scanner

    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        for _ in range(25):
            os.mkdir("d" * 200, dir_fd=fd)
            deeper = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        leaf = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"deep")
        os.close(leaf)
    finally:
        os.close(fd)
    try:
        scan = Scanner(tmp_path, DEFAULT_EXCLUDE, 1 << 20).scan()
        assert scan.unreadable and all(len(p) + len(str(tmp_path)) > 4000 for p in scan.unreadable)
        assert not any(
            p in scan.manifest for p in scan.unreadable
        )  # left out (never seen), not "empty"
        assert all(len(p) + len(str(tmp_path)) < 4096 for p in scan.manifest)
    finally:
        subprocess.run(["rm", "-rf", str(tmp_path / ("d" * 200))], check=False)


def test_a_restore_that_fills_the_disk_halfway_says_where_and_how_to_undo(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    # A real full disk: the target on a 1 MiB tmpfs. The undo line came only after a restore
    # that succeeded; one stopped halfway said "cannot write the output", naming nothing.
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    script = write_script(
        [
            {
                "tool_calls": [
                    {
                        "name": "run_command",
                        "arguments": {
                            "command": "head -c 3000000 /dev/urandom > big.bin; echo small > a.txt"
                        },
                    }
                ]
            },
            {"content": "ok"},
        ]
    )
    assert _start(env, workspace, script, "full").returncode == 0
    target = tmp_path / "small-disk"
    target.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target)], check=False
    ).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (target / "mine.txt").write_text("precious")
        proc = da(["restore", "full", "--at", "1", "--to", str(target), "--force"], env, workspace)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert (
            "the restore stopped at" in proc.stderr
            and "No space left" in proc.stderr
            and "undo with:" in proc.stderr
        )
        undo = proc.stdout.split("undo with: ", 1)[1].splitlines()[0]  # printed before it began
        assert da(undo.split()[1:], env, workspace).returncode == 0
        assert sorted(p.name for p in target.iterdir()) == ["mine.txt"]
        assert (target / "mine.txt").read_text() == "precious"
    finally:
        subprocess.run(["umount", str(target)], check=False)


def test_a_name_holding_a_newline_cannot_forge_a_line_of_a_diff(
    env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    forged = "x\ndiff --durable-agent a/README b/README\nnew file mode 755"
    script = write_script(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": forged, "content": "hi\n"}}
                ]
            },
            {"content": "ok"},
        ]
    )
    assert _start(env, workspace, script, "nl").returncode == 0
    assert (workspace / forged).read_text() == "hi\n"  # the name itself is kept as written
    stat = da(["diff", "nl", "--stat"], env, workspace)
    assert stat.returncode == 0 and len(stat.stdout.splitlines()) == 2, (
        stat.stdout
    )  # one change, one total
    shown = "x\\x0adiff --durable-agent a/README b/README\\x0anew file mode 755"
    assert shown in stat.stdout
    full = da(["diff", "nl"], env, workspace).stdout
    headers = [line for line in full.splitlines() if line.startswith("diff --")]
    quoted = "x\\ndiff --durable-agent a/README b/README\\nnew file mode 755"
    assert headers == [f'diff --git "a/{quoted}" "b/{quoted}"']  # quoted as git quotes it


def test_restore_never_destroys_what_snapshots_leave_out(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    # In place (--force), restore replaced an ignored file, removed a git repository that had
    # taken the place of a `.git` file, and emptied a folder of ignored logs: none of them in
    # the undo snapshot, so the undo could not bring them back. Now it refuses, changing
    # nothing, and names what is in the way; what is ignored in a folder it removes stays.
    command = "mkdir sub && echo 'gitdir: ../elsewhere' > sub/.git && echo old > a.txt"
    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
            {"content": "ok"},
        ]
    )
    assert _start(env, workspace, script, "keep", "--sandbox", "off").returncode == 0
    (workspace / "sub" / ".git").unlink()
    _git(workspace / "sub", env, "init", "-q")
    (workspace / ".gitignore").write_text("a.txt\n*.log\n")
    (workspace / "a.txt").write_text("PRECIOUS\n")
    (workspace / "logs").mkdir()
    (workspace / "logs" / "x.log").write_text("L\n")

    def restore() -> subprocess.CompletedProcess[str]:
        return da(
            ["restore", "keep", "--at", "1", "--to", str(workspace), "--force"], env, workspace
        )

    for blocking in ("a.txt", "sub/.git/"):
        before = picture(workspace)
        proc = restore()
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"would destroy {blocking}" in proc.stderr and "Traceback" not in proc.stderr
        assert picture(workspace) == before  # nothing changed
        (workspace / "a.txt").unlink(missing_ok=True)  # the person moves it away; then the next
    subprocess.run(["rm", "-rf", str(workspace / "sub" / ".git")], check=True)
    proc = restore()
    assert proc.returncode == 0, proc.stderr
    assert (workspace / "a.txt").read_text() == "old\n" and (workspace / "sub" / ".git").is_file()
    assert (workspace / "logs" / "x.log").read_text() == "L\n"  # ignored: left where it was


def test_files_a_person_changed_and_approved_are_in_the_next_snapshot(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    # The drift check's own scan read the person's files, and the next step's snapshot then
    # found nothing new to store: its tree named blobs that were never written, and a
    # restore to that step failed with a traceback (KeyError).
    turns = [
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "a.txt", "content": "agent\n"}}
            ]
        },
        {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo more > c.txt"}}]},
        {"content": "ok"},
    ]
    assert _start(env, workspace, write_script(turns), "ap", "--max-steps", "1").returncode == 3
    (workspace / "b.txt").write_text("the person's own\n")
    assert da(["resume", "ap", "--quiet"], env, workspace).returncode == 5  # workspace_drift
    assert da(["approve", "ap"], env, workspace).returncode == 0
    proc = da(["resume", "ap", "--quiet", "--max-steps", "10"], env, workspace)
    assert proc.returncode == 0, proc.stderr
    expected = picture(workspace)
    last = (
        sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
        .execute("SELECT MAX(seq) FROM steps WHERE run_id = 'ap' AND tree_id IS NOT NULL")
        .fetchone()[0]
    )
    proc = da(["restore", "ap", "--at", str(last), "--to", str(tmp_path / "back")], env, workspace)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "back" / "b.txt").read_text() == "the person's own\n"
    assert picture(tmp_path / "back") == expected


def test_a_snapshot_naming_a_blob_the_store_lacks_fails_restore_in_one_line(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    assert (
        _start(env, workspace, write_script(MIXED[:1] + [{"content": "ok"}]), "lack").returncode
        == 0
    )
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    with db:
        db.execute("DELETE FROM workspace_blobs")  # as a store edited by hand would lack them
    proc = da(["restore", "lack", "--at", "1", "--to", str(tmp_path / "out")], env, workspace)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "is not in the store" in proc.stderr and "Traceback" not in proc.stderr


def test_restore_goes_ahead_where_nothing_would_be_lost(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    # Refused before: a file ignored since but holding the very bytes the snapshot has, and a
    # folder that a command turned into a link (the check followed it to files elsewhere).
    turns = [
        {
            "tool_calls": [
                {
                    "name": "run_command",
                    "arguments": {
                        "command": "mkdir lib build && echo x > lib/x.py && echo js > build/out.js"
                    },
                }
            ]
        },
        {
            "tool_calls": [
                {
                    "name": "run_command",
                    "arguments": {
                        "command": "printf 'build/\\n' > .gitignore && mv lib src && ln -s src lib"
                    },
                }
            ]
        },
        {"content": "ok"},
    ]
    assert _start(env, workspace, write_script(turns), "ok1", "--sandbox", "off").returncode == 0
    proc = da(["restore", "ok1", "--at", "1", "--to", str(workspace), "--force"], env, workspace)
    assert proc.returncode == 0, proc.stderr
    assert (workspace / "lib").is_dir() and not (workspace / "lib").is_symlink()
    assert (workspace / "lib" / "x.py").read_text() == "x\n" and (
        workspace / "build" / "out.js"
    ).read_text() == "js\n"


def test_a_deny_that_cannot_put_the_snapshot_back_stays_blocked_and_says_how_to_undo(
    env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    turns = [
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "out.log", "content": "agent\n"}}
            ]
        },
        {"content": "ok"},
    ]
    assert _start(env, workspace, write_script(turns), "dn", "--max-steps", "1").returncode == 3
    (workspace / ".gitignore").write_text("*.log\n")
    (workspace / "out.log").write_text(
        "the person's\n"
    )  # ignored now, and not what the snapshot has
    assert da(["resume", "dn", "--quiet"], env, workspace).returncode == 5
    assert da(["approve", "dn", "--deny"], env, workspace).returncode == 0
    proc = da(["resume", "dn", "--max-steps", "5"], env, workspace)
    assert proc.returncode == 5, proc.stderr  # blocked again, not failed
    assert (
        "could not put the snapshot back" in proc.stderr and "would destroy out.log" in proc.stderr
    )
    assert (workspace / "out.log").read_text() == "the person's\n"
    undo = proc.stderr.split("the files it replaces: ", 1)[1].split()
    assert undo[:2] == ["durable-agent", "restore"] and "--tree" in undo  # said before it began
    (workspace / "out.log").unlink()  # the person moves it away: the deny goes through
    proc = da(["resume", "dn", "--max-steps", "5", "--quiet"], env, workspace)
    assert proc.returncode == 0, proc.stderr
    assert (workspace / "out.log").read_text() == "agent\n" and not (
        workspace / ".gitignore"
    ).exists()


@pytest.mark.parametrize("re2", [True, False], ids=["re2", "without-re2"])
def test_a_planted_gitignore_cannot_make_the_scan_backtrack(tmp_path: Path, re2: bool) -> None:
    # A command wrote this rule and a 255-byte name: Python's regex took 12 minutes (one more
    # `*a`, for ever) in the harness itself, after the step, where no timeout or Ctrl-C reached.
    # (In a child process: a regex match holds the GIL, no thread of the test could stop it.)
    import sys

    (tmp_path / ".gitignore").write_text("*a" * 14 + "b\n*.log\n")
    (tmp_path / ("a" * 255)).write_text("x")
    (tmp_path / "x.log").write_text("x")
    code = (
        "import sys\n"
        + ("" if re2 else "sys.modules['re2'] = None  # as if google-re2 were missing\n")
        + "from durable_agent.workspace.scan import Scanner\n"
        + f"print(sorted(p.decode() for p in Scanner(__import__('pathlib').Path({str(tmp_path)!r}), "
        + "['.git/'], 10_000).scan().manifest))"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the scan of a 3-file workspace did not end in 60 s")
    assert json.loads(out.stdout.replace("'", '"')) == [
        ".gitignore",
        "a" * 255,
    ]  # the other rules still apply


def test_rules_and_names_with_bytes_that_are_not_utf8_still_match(tmp_path: Path) -> None:
    # RE2 takes UTF-8 only: a name with an undecodable byte failed the whole scan.
    from durable_agent.workspace.scan import Scanner

    root = os.fsencode(tmp_path)
    with open(os.path.join(root, b".gitignore"), "wb") as f:
        f.write(b"caf\xe9*\n*.log\n")
    for name in (b"caf\xe9.txt", b"x\xff.log", b"x\xff.txt", b"caf\xc3\xa9.txt"):
        with open(os.path.join(root, name), "wb") as f:
            f.write(b"x")
    manifest = Scanner(tmp_path, [".git/"], 10_000).scan().manifest
    assert set(manifest) == {b".gitignore", b"x\xff.txt", b"caf\xc3\xa9.txt"}


@pytest.mark.parametrize("then", ["write", "verify"])
def test_a_workspace_unmounted_under_the_run_is_neither_written_below_nor_recorded_as_deleted(
    tmp_path, env, write_script, then
) -> None:  # type: ignore[no-untyped-def]
    # The workspace is a mount point (a shared file system a worker mounts per run) and is
    # unmounted while a command runs: the folder below it was written to, and the next
    # snapshot recorded every file as deleted by the command.
    import sys

    from mounts import mount_tmpfs
    from scale_helpers import wait_for

    ws = tmp_path / "ws"
    mount_tmpfs(ws, "4m")
    try:
        (ws / "keep.txt").write_text("kept\n")
        (ws / "node_modules").mkdir()  # (left out of snapshots: the test's signals go there)
        script = write_script(
            [
                {
                    "tool_calls": [
                        {
                            "name": "run_command",
                            "arguments": {
                                "command": "touch node_modules/started; until [ -e node_modules/go ]; do sleep 0.05; done"
                            },
                        }
                    ]
                },
                *(
                    [
                        {
                            "tool_calls": [
                                {
                                    "name": "write_file",
                                    "arguments": {"path": "sub/b.txt", "content": "b"},
                                }
                            ]
                        }
                    ]
                    if then == "write"
                    else []
                ),
                {"content": "done"},
            ]
        )
        verify = ["--verify", "touch verified.txt"] if then == "verify" else []
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "durable_agent",
                "start",
                "t",
                "--model",
                script,
                "--run-id",
                "mnt",
                "--shell",
                "allow",
                "--workspace",
                str(ws),
                *verify,
            ],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: (ws / "node_modules" / "started").exists(), 60, "the command to start")
        held = os.open(
            ws, os.O_RDONLY | os.O_DIRECTORY
        )  # the mounted folder, reachable after the unmount
        try:
            subprocess.run(["umount", "-l", str(ws)], check=True)
            os.close(
                os.open("node_modules/go", os.O_CREAT | os.O_WRONLY, dir_fd=held)
            )  # the command may end
        finally:
            os.close(held)
        out, err = proc.communicate(timeout=120)
    finally:
        subprocess.run(["umount", "-l", str(ws)], capture_output=True)
    assert proc.returncode == 1, err
    assert "is not the folder this session started in" in err
    assert list(ws.iterdir()) == []  # nothing written below the mount point, nothing verified there
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    assert db.execute(
        "SELECT count(*) FROM workspace_changes WHERE run_id = 'mnt' AND change = 'deleted'"
    ).fetchone() == (0,)


def test_a_workspace_deleted_and_made_again_during_a_model_call_is_not_taken_for_it(
    tmp_path, env
) -> None:  # type: ignore[no-untyped-def]
    # ext4 hands the freed inode number to the new folder when nothing holds the old one:
    # (device, inode) alone saw the same folder, and the run went on in the empty one.
    import shutil

    from fake_openai import FakeOpenAI
    from provider_support import KEY

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_text("kept\n")

    def replace_it() -> None:
        shutil.rmtree(ws)
        ws.mkdir()

    turns = [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "a"}}]},
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": "b"}}]},
        {"content": "done"},
    ]
    with FakeOpenAI(script=turns, faults=[{"turn": 1, "before": replace_it}]) as server:
        proc = da(
            [
                "start",
                "t",
                "--base-url",
                server.url,
                "--model",
                "m",
                "--workspace",
                str(ws),
                "--run-id",
                "again",
            ],
            env,
            tmp_path,
            extra={"OPENAI_API_KEY": KEY},
        )
    assert proc.returncode == 1, proc.stderr
    assert "is not the folder this session started in" in proc.stderr
    assert list(ws.iterdir()) == []


def test_gitignore_rules_the_matcher_cannot_take_are_left_out_and_the_rest_still_apply(
    tmp_path: Path,
) -> None:
    # A valid git line RE2 refuses (`[[:digit:]]`), a reversed range, a trailing backslash:
    # each failed the whole scan, at creation and after every step, so a run whose model
    # wrote one could never be resumed.
    from durable_agent.workspace.scan import Scanner

    (tmp_path / ".gitignore").write_text("*.[[:digit:]]\n[z-a]\nx\\\n*.log\nbuild/\n")
    for name in ("a.1", "b.log", "c.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "out").write_text("x")
    scanner = Scanner(tmp_path, [".git/"], 10_000)
    assert set(scanner.scan().manifest) == {
        b".gitignore",
        b"a.1",
        b"c.txt",
    }  # left out: a.1 is kept
    assert scanner.exclude_refused == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.sampled_from("ab*?![]-\\/:^{}.#  \t\udc80é"), max_size=12), max_size=6
    )
)
def test_no_gitignore_line_makes_compiling_the_rules_fail(lines: list[str]) -> None:
    from durable_agent.workspace.ignore_rules import compile_checked

    spec, refused = compile_checked(lines)
    spec.check_file("a/b.c")  # and the compiled rules match
    assert {rule for rule, _ in refused} <= set(lines) | {
        line.translate({0xDC80: 0xF780}) for line in lines
    }


def test_a_gitignore_the_model_writes_with_a_rule_git_takes_and_the_matcher_does_not_ends_nothing(
    env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    turns = [
        {
            "tool_calls": [
                {
                    "name": "write_file",
                    "arguments": {"path": ".gitignore", "content": "[z-a]\n*.[[:digit:]]\n"},
                }
            ]
        },
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.1", "content": "one\n"}}]},
        {"content": "ok"},
    ]
    proc = _start(env, workspace, write_script(turns), "gi")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (workspace / "a.1").read_text() == "one\n"
    assert "a.1" in da(["diff", "gi"], env, workspace).stdout  # snapshotted like any file


def test_an_exclude_rule_the_matcher_cannot_take_is_refused_before_a_run_is_made(
    env, workspace, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "config.toml"
    config.write_text('exclude = [".git/", "[z-a]"]\n')
    script = tmp_path / "ok.json"
    script.write_text('[{"content": "ok"}]')
    proc = da(
        [
            "start",
            "t",
            "--workspace",
            str(workspace),
            "--model",
            f"scripted:{script}",
            "--run-id",
            "ex",
        ],
        {**env, "DURABLE_AGENT_CONFIG": str(config)},
        workspace,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip().splitlines() == [proc.stderr.strip()]
        and "'[z-a]' cannot be used" in proc.stderr
    )
    assert da(["show", "ex"], env, workspace).returncode == 2  # no run was made


@pytest.mark.parametrize("re2", [True, False], ids=["re2", "without-re2"])
def test_a_gitignore_too_big_for_one_rule_set_still_ignores_what_it_lists(
    tmp_path: Path, re2: bool
) -> None:
    # RE2 compiles a file's rules as one set, whose size is limited: 2,000 plain names failed
    # it, every rule was then "left out", and the secret the first line ignores was stored.
    import sys

    names = ["secret.env", *(f"gen_{i}.txt" for i in range(3000)), "!gen_7.txt", "bad[z-a]"]
    (tmp_path / ".gitignore").write_text("\n".join(names) + "\n")
    for name in ("secret.env", "gen_5.txt", "gen_7.txt", "kept.txt"):
        (tmp_path / name).write_text("x")
    code = (
        "import sys, json\n"
        + ("" if re2 else "sys.modules['re2'] = None\n")
        + "from pathlib import Path\nfrom durable_agent.workspace.scan import Scanner\n"
        + f"s = Scanner(Path({str(tmp_path)!r}), ['.git/', *[f'x{{i}}/' for i in range(3000)]], 10_000)\n"
        + "print(json.dumps([sorted(p.decode() for p in s.scan().manifest), s.exclude_refused]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    manifest, refused = json.loads(out.stdout)
    assert manifest == [".gitignore", "gen_7.txt", "kept.txt"]  # in order: the later `!` still wins
    assert refused == []  # 3,001 valid exclude rules are not refused for their number


@pytest.mark.slow  # real git, a few thousand rules per trial
@pytest.mark.parametrize("trial", range(6))
def test_a_big_gitignore_matched_in_parts_ignores_what_git_ignores(
    tmp_path: Path, trial: int
) -> None:
    # Rules past RE2's limit on one set are compiled in consecutive parts (ignore_rules.InOrder):
    # with negations and directory rules spread across the parts, the files left are git's.
    import random
    import shutil

    from durable_agent.workspace.ignore_rules import InOrder, _have_re2, compile_checked
    from durable_agent.workspace.scan import Scanner

    if shutil.which("git") is None or not _have_re2():
        pytest.skip("needs git, and google-re2 (a set size limit is RE2's)")
    rnd = random.Random(trial)
    names = [f"f{i}.txt" for i in range(30)] + [
        f"d{i}/g{j}.log" for i in range(5) for j in range(4)
    ]
    for name in [*names, "sec.env", "d1/sec.env"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    vocab = [
        *(f"f{i}.txt" for i in range(30)),
        *(f"d{i}/" for i in range(5)),
        "*.log",
        "!g1.log",
        "!d2/g0.log",
        "sec.env",
        "!f3.txt",
        "f*.txt",
        "!f1*.txt",
        "d1/*",
        "!d1/sec.env",
        "/f5.txt",
        "**/g2.log",
    ]
    lines = [rnd.choice(vocab) for _ in range(3000)] + [f"pad{i}.x" for i in range(2500)]
    rnd.shuffle(lines)
    (tmp_path / ".gitignore").write_text("\n".join(lines) + "\n")
    assert isinstance(compile_checked(lines)[0], InOrder)  # the case under test: more than one part
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    git = subprocess.run(
        ["git", "-C", str(tmp_path), "ls-files", "-o", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    ours = [
        p.decode()
        for p in Scanner(tmp_path, [".git/"], 10_000).scan().manifest
        if (tmp_path / p.decode()).is_file()
    ]
    assert sorted(ours) == sorted(git)


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_generated_folders_stay_out_of_snapshots_unless_git_tracks_files_in_them(
    cli: Any, workspace: Path, write_script: Any, sql: Any
) -> None:
    """A virtualenv the model makes (`venv/` not in .gitignore) added 9.6 MB to the store;
    the default `exclude` leaves such folders out, but a file git tracks in one stays in,
    and `show` says what was left out."""

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=workspace, check=True, capture_output=True)

    git("init", "-q")
    (workspace / "venv").mkdir()
    (workspace / "venv" / "pinned.txt").write_text("tracked\n")
    git("add", "venv/pinned.txt")
    command = (
        "mkdir -p venv/lib .tox/py node_modules/m && echo x > venv/lib/site.py && "
        "echo y > .tox/py/log && echo z > node_modules/m/i.js && echo more >> venv/pinned.txt && "
        "echo a > app.py"
    )
    model = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
            {"content": "done"},
        ]
    )
    run = cli("start", "t", "--model", model, "--shell", "allow", "--run-id", "gen", "--quiet")
    assert run.code == 0, run.stderr
    changed = {p for (p,) in sql("SELECT path FROM step_changes WHERE run_id = 'gen'")}
    assert changed == {"app.py", "venv/pinned.txt"}
    [(note,)] = sql("SELECT json_extract(output, '$.workspace_note') FROM steps WHERE seq = 1")
    assert (
        "left out of the snapshot by the exclude setting: .tox/, node_modules/, venv/lib/" in note
    )
    shown = cli("show", "gen")
    assert shown.code == 0, shown.stderr
    assert "snapshot: left out of the snapshot by the exclude setting: .tox/" in shown.stdout
    # A later step does not say it again; a file git starts tracking there comes in.
    git("add", "-f", "venv/lib/site.py")
    model = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo b > b.py"}}]},
            {"content": "done"},
        ]
    )
    again = cli("start", "t", "--model", model, "--shell", "allow", "--run-id", "gen2", "--quiet")
    assert again.code == 0, again.stderr
    tree = sql("SELECT tree_id FROM steps WHERE run_id = 'gen2' AND seq = 1")[0][0]
    assert tree
    restored = workspace.parent / "restored"
    back = cli("restore", "gen2", "--at", "1", "--to", str(restored))
    assert back.code == 0, back.stderr
    assert (restored / "venv" / "lib" / "site.py").read_text() == "x\n"
    assert not (restored / ".tox").exists() and not (restored / "node_modules").exists()
    [(note,)] = sql(
        "SELECT json_extract(output, '$.workspace_note') FROM steps WHERE run_id = 'gen2' AND seq = 1"
    )
    assert note is None  # those folders were there before this run: nothing new to say


@pytest.mark.parametrize("version", [2, 3, 4])
@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_the_files_git_tracks_are_read_from_its_index_as_git_lists_them(
    tmp_path: Path, version: int, object_format: str
) -> None:
    from durable_agent.workspace.git_index import find_index, tracked_files

    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> bytes:
        return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True).stdout

    git("init", "-q", f"--object-format={object_format}")
    names = ["venv/a", "sub/venv/b", "sub/venv/deep/é c", "sub/plain", "sub/node_modules/x/y.js"]
    names += [f"sub/venv/{'n' * i}" for i in range(1, 12)]  # every padding, shared prefixes
    for name in names:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(name)
    git("add", *names[:-1])
    git("add", "-N", names[-1])  # intent to add: an extended flag in versions 3 and 4
    git("update-index", f"--index-version={version}")
    listed = git("ls-files", "-z", "--", "sub").split(b"\0")
    wanted = frozenset({b"venv", b"node_modules"})
    expected = {p.removeprefix(b"sub/") for p in listed if p}
    expected = {p for p in expected if not wanted.isdisjoint(p.split(b"/")[:-1])}
    found = find_index(os.fsencode(repo / "sub"))
    assert found is not None and found[1] == b"sub"
    assert tracked_files(*found, wanted).files == expected
    assert len(expected) == len(names) - 2  # all but plain and the top-level venv/a


def test_one_step_number_from_the_tables_to_every_command(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    """A step's number is its `steps.seq` everywhere (docs/schema.md): the seq a person reads
    in `step_changes` is what `restore --at`, `diff --step` and `fork --at` take, and what the
    timeline, `show`, `export` and the web view print."""
    write = [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": p, "content": p}}]}
        for p in ("a.txt", "b.txt")
    ]
    model = write_script([*write, {"content": "done"}])
    started = da(
        ["start", "t", "--workspace", str(workspace), "--model", model, "--run-id", "one"],
        env,
        workspace,
    )
    assert started.returncode == 0, started.stderr
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    changed = db.execute(
        "SELECT seq, path FROM step_changes WHERE run_id='one' ORDER BY seq"
    ).fetchall()
    assert [path for _seq, path in changed] == ["a.txt", "b.txt"]
    first, second = (seq for seq, _path in changed)
    seqs = [s for (s,) in db.execute("SELECT seq FROM steps WHERE run_id='one' ORDER BY seq")]

    target = tmp_path / "after-first"
    proc = da(["restore", "one", "--at", str(first), "--to", str(target)], env, workspace)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]  # that step's files, no more
    assert f"after step {first} of run one" in proc.stdout
    one = json.loads(da(["diff", "one", "--step", str(second), "--json"], env, workspace).stdout)
    assert [(c["path"], c["change"]) for c in one["changes"]] == [("b.txt", "added")]
    fork = da(
        ["fork", "one", "--at", str(first), "--workspace", str(tmp_path / "fk"), "--json"],
        env,
        workspace,
    )
    assert fork.returncode == 0, fork.stderr
    assert json.loads(fork.stdout)["fork_seq"] == first
    assert sorted(p.name for p in (tmp_path / "fk").iterdir()) == ["a.txt"]
    missing = da(["restore", "one", "--at", str(seqs[-1] + 1), "--to", str(target)], env, workspace)
    assert missing.returncode == 2
    assert f"its steps are {seqs[0]} to {seqs[-1]}" in missing.stderr

    # What the timeline printed live, `show` (text and --json), `export`: the stored numbers.
    timeline = {
        int(line.split()[1]) for line in started.stderr.splitlines() if line.startswith("Step ")
    }
    assert timeline == set(seqs)
    table = da(["show", "one"], env, workspace).stdout.split("WHAT\n", 1)[1].splitlines()
    assert [int(row.split()[0]) for row in table if row.split()[0].isdigit()] == seqs
    doc = json.loads(da(["show", "one", "--json"], env, workspace).stdout)
    assert [s["seq"] for s in doc["steps"]] == seqs
    events = [json.loads(x) for x in da(["export", "one"], env, workspace).stdout.splitlines()]
    written = [e["step_seq"] for e in events if e["type"] == "tool_completed"]
    assert written == [first, second]

    pytest.importorskip("starlette", reason="the `ui` extra is not installed")
    from ui_support import client

    page = client(env["DURABLE_AGENT_DB"]).get("/runs/one").text
    assert all(f'<span class="seq">#{s}</span>' in page for s in seqs)
    assert f'<span class="seq">#{seqs[-1] + 1}</span>' not in page


@pytest.mark.slow  # about 3 s on 2 cores
def test_a_restore_reads_its_contents_500_to_a_statement_and_writes_them_exactly(
    store_url: str, tmp_path: Path
) -> None:
    """1,200 files (some sharing a content, one over a chunk's byte bound, one whose mode
    alone differs on disk) restored from a real store: byte for byte, and in a few
    statements, not one a file."""
    from sqlalchemy import event

    from durable_agent.store.blobs import BlobStore, save_statements
    from durable_agent.store.engine import open_store_engine
    from durable_agent.workspace import materialize as materialize_module
    from durable_agent.workspace import snapshot
    from durable_agent.workspace.materialize import materialize
    from durable_agent.workspace.scan import Scanner

    src = tmp_path / "src"
    for i in range(1200):
        path = src / f"d{i % 7}" / f"f{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"shared\n" if i % 10 == 0 else f"file {i}\n".encode() * (1 + i % 5))
    (src / "big.bin").write_bytes(os.urandom(materialize_module.CHUNK_BYTES + 1))
    (src / "mode.sh").write_text("echo hi\n")
    (src / "mode.sh").chmod(0o755)
    engine = open_store_engine(store_url)
    try:
        blobs = BlobStore(engine)
        snap = snapshot.take(Scanner(src, [], 64 << 20), blobs)
        save_statements(engine, snap.statements)
        out = tmp_path / "out"
        out.mkdir()
        (out / "mode.sh").write_text("echo hi\n")  # the same bytes, another mode
        sent: list[str] = []
        event.listen(engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
        materialize(
            snapshot.load(blobs, snap.tree_id),
            out,
            Scanner(out, [], 64 << 20),
            blobs.blob,
            present=blobs.present_blobs,
            fetch=blobs.blobs,
        )
    finally:
        engine.dispose()
    assert picture(out) == picture(src)
    reads = [s for s in sent if "workspace_blobs.data" in s]
    assert 3 <= len(reads) <= 6, len(reads)  # 1,201 contents: 500 to a statement, big.bin alone
