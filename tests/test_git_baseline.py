"""`snapshot_baseline = "git"`: a clean checkout's files are left to its HEAD commit.

Real git, real processes (the CLI). A checkout of several MB of incompressible files is
committed; a run in it stores only what differs from HEAD (the store stays under 1 MB);
`restore` and `fork` into a fresh folder (another host: the repository reachable by its
path, or only by its remote) give every file back byte for byte with its mode; with the
commit nowhere to be found they say so in one line (exit 2, no traceback); a run SIGKILLed
mid-way resumes in a fresh folder; a dirty checkout stores its modified and untracked files.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from workspace_support import da, picture

from durable_agent.errors import StoreError
from durable_agent.redact import Redactor
from durable_agent.store.blobs import BlobStore, save_statements
from durable_agent.store.engine import open_store_engine
from durable_agent.workspace import diffing, git_baseline, git_index, snapshot
from durable_agent.workspace import manifest as manifest_module
from durable_agent.workspace import scan as scan_module
from durable_agent.workspace.manifest import changes
from durable_agent.workspace.materialize import materialize
from durable_agent.workspace.scan import DEFAULT_EXCLUDE, RACY_NS, Scanner
from durable_agent.workspace.secrets import SecretCheck

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
FILES, SIZE = 240, 25_000  # 6 MB of random bytes: nothing compresses it below 1 MB

TURNS: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "notes/new.txt", "content": "new\n"}}
        ]
    },
    {
        "tool_calls": [
            {
                "name": "run_command",
                "arguments": {
                    "command": "printf 'edited\\n' >> src/f0.bin && chmod +x src/f1.bin "
                    "&& rm src/f2.bin && mkdir -p out && echo built > out/x.txt"
                },
            }
        ]
    },
    {"content": "done"},
]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        [*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def make_checkout(root: Path, files: int = FILES, size: int = SIZE, seed: int = 1) -> Path:
    """A committed checkout of `files` random files, with `origin` a bare clone of it."""
    rnd = random.Random(seed)
    ws = root / "ws"
    (ws / "src").mkdir(parents=True)
    for i in range(files):
        (ws / "src" / f"f{i}.bin").write_bytes(rnd.randbytes(size))
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "run.sh").chmod(0o755)
    os.symlink("run.sh", ws / "link")
    (ws / ".gitignore").write_text("*.log\n")
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "base")
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(ws), str(root / "remote.git")],
        check=True,
        capture_output=True,
    )
    git(ws, "remote", "add", "origin", str(root / "remote.git"))
    return ws


@pytest.fixture
def genv(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {
        **env,
        "DURABLE_AGENT_SNAPSHOT_BASELINE": "git",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(tmp_path / "home"),
    }


def _start(env: dict[str, str], ws: Path, model: str, run_id: str, *extra: str) -> Any:
    return da(
        ["start", "t", "--workspace", str(ws), "--model", model, "--shell", "allow"]
        + ["--run-id", run_id, "--quiet", *extra],
        env,
        ws,
    )


def stored_bytes(env: dict[str, str]) -> int:
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    blobs = db.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM workspace_blobs").fetchone()[0]
    trees = db.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM workspace_trees").fetchone()[0]
    db.close()
    return int(blobs) + int(trees)


def stored_hashes(env: dict[str, str]) -> set[str]:
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    found = {r[0] for r in db.execute("SELECT hash FROM workspace_blobs")}
    db.close()
    return found


def sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def last_seq(env: dict[str, str], run_id: str) -> int:
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    seq = db.execute(
        "SELECT MAX(seq) FROM steps WHERE run_id=? AND tree_id IS NOT NULL", (run_id,)
    ).fetchone()[0]
    db.close()
    return int(seq)


WITHOUT_GIT = (b".git",)


@pytest.mark.slow
def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The names of the files the scanner reads from now on, in order."""
    read: list[bytes] = []
    real = scan_module._regular_bytes

    def counting(name: bytes, cap: int, dir_fd: int) -> bytes | None:
        read.append(name)
        return real(name, cap, dir_fd)

    monkeypatch.setattr(scan_module, "_regular_bytes", counting)
    return read


def test_a_clean_checkout_stores_under_1_mb_and_restore_and_fork_rebuild_it(
    tmp_path, genv, write_script
) -> None:  # type: ignore[no-untyped-def]
    ws = make_checkout(tmp_path)
    assert sum(f.stat().st_size for f in (ws / "src").iterdir()) >= 6_000_000
    proc = _start(genv, ws, write_script(TURNS), "g1")
    assert proc.returncode == 0, proc.stderr
    assert (ws / "notes/new.txt").read_text() == "new\n" and (ws / "out/x.txt").exists()
    assert stored_bytes(genv) <= 1_000_000, stored_bytes(genv)
    # What the run wrote and changed is stored as today; what HEAD holds is not.
    hashes = stored_hashes(genv)
    assert {sha256(ws / "notes/new.txt"), sha256(ws / "src/f0.bin")} <= hashes
    assert sha256(ws / "src/f3.bin") not in hashes
    db = sqlite3.connect(genv["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    changed = set(db.execute("SELECT path, change FROM workspace_changes WHERE run_id='g1'"))
    assert changed == {
        ("notes/new.txt", "added"),
        ("src/f0.bin", "modified"),
        ("src/f1.bin", "mode"),
        ("src/f2.bin", "deleted"),
        ("out/x.txt", "added"),
    }
    commit = git(ws, "rev-parse", "HEAD")
    recorded = {r[0] for r in db.execute("SELECT git FROM workspace_trees")}
    assert all(commit in (r or "") for r in recorded), recorded
    expected = picture(ws, skip=WITHOUT_GIT)
    seq = last_seq(genv, "g1")
    other = tmp_path / "host2"
    other.mkdir()
    out = other / "restored"
    proc = da(["restore", "g1", "--at", str(seq), "--to", str(out)], genv, other)
    assert proc.returncode == 0, proc.stderr
    assert picture(out) == expected  # every file's bytes and mode, links, folders
    fork = other / "forked"
    proc = da(
        ["fork", "g1", "--at", str(seq), "--workspace", str(fork), "--run-id", "g2"], genv, other
    )
    assert proc.returncode == 0, proc.stderr
    assert picture(fork) == expected
    # The step before the command: f0 as committed, f2 still there.
    proc = da(["restore", "g1", "--at", "1", "--to", str(other / "at1")], genv, other)
    assert proc.returncode == 0, proc.stderr
    assert (other / "at1/src/f0.bin").read_bytes() == subprocess.run(
        ["git", "show", "HEAD:src/f0.bin"], cwd=ws, capture_output=True, check=True
    ).stdout
    assert (other / "at1/src/f2.bin").exists() and not (other / "at1/out").exists()

    # The repository gone from its path: its remote (a bare repository) is cloned instead.
    shutil.move(ws, tmp_path / "moved")
    proc = da(["restore", "g1", "--at", str(seq), "--to", str(other / "via-remote")], genv, other)
    assert proc.returncode == 0, proc.stderr
    assert picture(other / "via-remote") == expected

    # Neither the repository nor its remote: one line, exit 2, nothing written.
    shutil.rmtree(tmp_path / "remote.git")
    shutil.rmtree(tmp_path / "cache")
    target = other / "nowhere"
    proc = da(["restore", "g1", "--at", str(seq), "--to", str(target)], genv, other)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert commit[:12] in proc.stderr and "not reachable" in proc.stderr
    assert not target.exists() or not any(target.iterdir())
    proc = da(["fork", "g1", "--at", str(seq), "--workspace", str(other / "f3")], genv, other)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "not reachable" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_commit_gone_from_the_repository_is_said_in_one_line(
    tmp_path, genv, write_script
) -> None:  # type: ignore[no-untyped-def]
    ws = make_checkout(tmp_path, files=20, size=1000)
    shutil.rmtree(tmp_path / "remote.git")
    git(ws, "remote", "remove", "origin")
    proc = _start(genv, ws, write_script(TURNS), "gone")
    assert proc.returncode == 0, proc.stderr
    old = git(ws, "rev-parse", "HEAD")
    # History rewritten and the old commit pruned: the path holds a repository, not the commit.
    git(ws, "checkout", "-q", "--orphan", "other")
    git(ws, "commit", "-q", "-m", "rewritten")
    git(ws, "branch", "-D", "main")
    git(ws, "reflog", "expire", "--expire=now", "--all")
    git(ws, "gc", "-q", "--prune=now")
    assert subprocess.run(["git", "cat-file", "-e", old], cwd=ws).returncode != 0
    proc = da(["restore", "gone", "--at", "1", "--to", str(tmp_path / "out")], genv, tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert old[:12] in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_dirty_checkout_stores_its_changes_and_references_the_rest(
    tmp_path, genv, write_script
) -> None:  # type: ignore[no-untyped-def]
    ws = make_checkout(tmp_path, files=40, size=20_000)
    (ws / "src/f5.bin").write_bytes(b"modified before the run\n")
    (ws / "src/f6.bin").chmod(0o700)  # a mode changed only: its bytes are still HEAD's
    (ws / "untracked.txt").write_text("not in git\n")
    (ws / "build.log").write_text("ignored by .gitignore: not in snapshots\n")
    os.remove(ws / "src/f7.bin")
    proc = _start(genv, ws, write_script([{"content": "nothing to do"}]), "dirty")
    assert proc.returncode == 0, proc.stderr
    hashes = stored_hashes(genv)
    assert sha256(ws / "src/f5.bin") in hashes and sha256(ws / "untracked.txt") in hashes
    tracked = [p for p in (ws / "src").iterdir() if p.name != "f5.bin"]
    assert not {sha256(p) for p in tracked} & hashes  # f6.bin too: same bytes as HEAD's
    out = tmp_path / "out"
    proc = da(
        ["restore", "dirty", "--tree", _start_tree(genv, "dirty"), "--to", str(out)], genv, tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert picture(out) == picture(ws, skip=(b".git", b"build.log"))


def _start_tree(env: dict[str, str], run_id: str) -> str:
    db = sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    tree = db.execute("SELECT tree_start FROM runs WHERE id=?", (run_id,)).fetchone()[0]
    db.close()
    return str(tree)


@pytest.mark.slow
def test_a_run_sigkilled_mid_way_resumes_in_a_fresh_folder_from_store_and_git(
    tmp_path, genv, write_script
) -> None:  # type: ignore[no-untyped-def]
    ws = make_checkout(tmp_path, files=60, size=10_000)
    model = write_script(TURNS)
    ref = tmp_path / "ref"
    shutil.copytree(ws, ref, symlinks=True)
    ref_env = {**genv, "DURABLE_AGENT_DB": f"sqlite:///{tmp_path / 'ref.db'}"}
    assert _start(ref_env, ref, model, "ref").returncode == 0
    proc = da(
        ["start", "t", "--workspace", str(ws), "--model", model, "--shell", "allow"]
        + ["--run-id", "k", "--quiet"],
        genv,
        ws,
        extra={"DURABLE_AGENT_CRASH_AFTER": "4"},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # Another host: an empty folder, the repository reachable at its recorded path.
    elsewhere = tmp_path / "elsewhere"
    for _ in range(20):
        proc = da(["resume", "k", "--workspace", str(elsewhere), "--quiet"], genv, tmp_path)
        if proc.returncode == 5:  # the command cut off by the kill: a person says run it again
            assert da(["approve", "k"], genv, tmp_path).returncode == 0
            continue
        break
    assert proc.returncode == 0, proc.stderr
    assert picture(elsewhere) == picture(ref, skip=WITHOUT_GIT)
    assert stored_bytes(genv) <= 1_000_000


def _scan_take_rebuild(
    ws: Path, db_url: str, out: Path, then: Callable[[], None] | None = None
) -> tuple[int, int]:
    """The first snapshot (git baseline) of `ws`, rebuilt into `out`. `then`: edits after
    it, snapshotted by the same scanner, and that second one is rebuilt; a fresh scanner
    seeded with it (a resume's drift check) sees the same tree."""
    engine = open_store_engine(db_url)
    try:
        blobs = BlobStore(engine)
        scanner = Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000)
        snap = snapshot.take(scanner, blobs, git=True)
        save_statements(engine, snap.statements)
        stored = sum(len(rows) for stmt, rows in snap.statements if "workspace_blobs" in str(stmt))
        if then is not None:
            then()
            snap = snapshot.take(scanner, blobs, git=True)
            save_statements(engine, snap.statements)
        reader = BlobStore(engine)
        manifest = snapshot.load(reader, snap.tree_id)
        materialize(
            manifest,
            out,
            Scanner(out, list(DEFAULT_EXCLUDE), 10_000_000),
            reader.blob,
            present=reader.present_blobs,
        )
        if then is not None:
            fresh = Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000)
            fresh.seed(manifest)
            snapshot.use_git(fresh)
            assert not changes(manifest, fresh.scan().manifest)
        return stored, len(manifest)
    finally:
        engine.dispose()


_names = st.sampled_from(["a", "b", "c.txt", "d/e", "d/f.bin", "g/h/i", "x y", "n\udcff"])
_bytes = st.binary(max_size=300)


@pytest.mark.slow
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    tree=st.dictionaries(_names, _bytes, min_size=1, max_size=6),
    edits=st.dictionaries(_names, st.one_of(st.none(), _bytes), max_size=4),
    later=st.dictionaries(_names, st.one_of(st.none(), st.just(b"same"), _bytes), max_size=4),
    vouched=st.booleans(),
)
def test_any_committed_tree_with_any_edits_is_rebuilt_as_it_was(
    tree, edits, later, vouched, tmp_path_factory
) -> None:  # type: ignore[no-untyped-def]
    # `vouched`: no margin before git looks, so the files written just before (all of them,
    # here) are taken on git's word unread; else they are read, as files written within
    # 100 ms of a snapshot are.
    with mock.patch.object(git_index, "VOUCH_MARGIN_NS", 0 if vouched else RACY_NS):
        _committed_tree_with_edits(tree, edits, later, tmp_path_factory)


def _committed_tree_with_edits(
    tree: dict[str, bytes],
    edits: dict[str, bytes | None],
    later: dict[str, bytes | None],
    tmp_path_factory: Any,
) -> None:
    root = tmp_path_factory.mktemp("prop")
    ws = root / "ws"
    ws.mkdir()

    def put(name: str, data: bytes) -> None:
        p = os.path.join(str(ws), name)  # (a name not UTF-8: surrogateescape, as fsencode)
        if os.path.isdir(p):
            shutil.rmtree(p)
        parent = os.path.dirname(p)
        if os.path.isfile(parent):
            os.remove(parent)
        os.makedirs(parent, exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)

    for name, data in tree.items():
        try:
            put(name, data)
        except OSError:
            continue
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "--allow-empty", "-m", "base")

    def edit(changes: dict[str, bytes | None]) -> None:
        # Within the same second as the commit and the snapshots (git's racy entries).
        for name, data in changes.items():
            p = os.path.join(str(ws), name)
            try:
                if data is None:
                    if os.path.isfile(p):
                        os.remove(p)
                elif data == b"same":  # the same bytes written again: a new ctime only
                    if os.path.isfile(p):
                        put(name, Path(p).read_bytes())
                else:
                    put(name, data)
            except OSError:
                continue

    edit(edits)
    out = root / "out"
    stored, _ = _scan_take_rebuild(ws, f"sqlite:///{root / 'store.db'}", out)
    if not edits:  # a clean checkout: every file is HEAD's, none is stored
        assert stored == 0
    assert picture(out) == picture(ws, skip=WITHOUT_GIT)
    out2 = root / "out2"
    _scan_take_rebuild(ws, f"sqlite:///{root / 'store2.db'}", out2, lambda: edit(later))
    assert picture(out2) == picture(ws, skip=WITHOUT_GIT)


@pytest.mark.slow
def test_a_resume_on_a_host_without_the_commit_stops_in_one_line(
    tmp_path, genv, write_script
) -> None:  # type: ignore[no-untyped-def]
    ws = make_checkout(tmp_path, files=20, size=1000)
    model = write_script(TURNS)
    assert _start(genv, ws, model, "far", "--max-steps", "1").returncode == 3
    shutil.move(ws, tmp_path / "elsewhere-repo")
    shutil.rmtree(tmp_path / "remote.git")
    fresh = tmp_path / "fresh"
    proc = da(["resume", "far", "--workspace", str(fresh), "--quiet"], genv, tmp_path)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr  # (and the resume's notes)
    assert "not reachable" in errors[0] and "Traceback" not in proc.stderr
    assert not fresh.exists() or not any(fresh.iterdir())
    # The repository back where it was recorded: the same resume rebuilds and finishes.
    shutil.move(tmp_path / "elsewhere-repo", ws)
    proc = da(
        ["resume", "far", "--workspace", str(fresh), "--max-steps", "10", "--quiet"],
        genv,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (fresh / "out/x.txt").read_text() == "built\n"


def test_take_and_rebuild_on_each_backend(store_url: str, tmp_path: Path) -> None:
    ws = make_checkout(tmp_path, files=30, size=2000)
    (ws / "src/f1.bin").write_bytes(b"changed\n")
    (ws / "new.txt").write_text("untracked\n")
    stored, entries = _scan_take_rebuild(ws, store_url, tmp_path / "out")
    assert entries == 34 and stored == 2  # the changed file and the untracked one
    assert picture(tmp_path / "out") == picture(ws, skip=WITHOUT_GIT)


def _first_git_snapshot(ws: Path, tmp_path: Path) -> snapshot.Snapshot:
    """A fresh scanner's first snapshot of `ws` with the git baseline, into a new store."""
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        return snapshot.take(
            Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000), BlobStore(engine), git=True
        )
    finally:
        engine.dispose()


def _aged(ws: Path) -> None:
    """git's index written well after every file's last change, as a checkout's is when git
    refreshed it later: a file its index recorded within VOUCH_MARGIN_NS of writing it is
    racy, and read whatever the index says, so a test of what is not read waits it out."""
    newest = max(p.lstat().st_ctime_ns for p in ws.rglob("*") if ".git" not in p.parts)
    while (
        time.time_ns() - newest <= 2 * git_index.VOUCH_MARGIN_NS
        or time.time_ns() // 10**9 == newest // 10**9  # (the index's second is racy too)
    ):
        time.sleep(0.05)
    git(ws, "read-tree", "HEAD")  # (its entries without stat data, so that git writes them)
    git(ws, "update-index", "-q", "--refresh")


def test_files_git_vouches_for_are_not_read_and_rebuild_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = make_checkout(tmp_path, files=30, size=2000)
    _aged(ws)
    (ws / "src/f1.bin").write_bytes(b"changed\n")  # dirty: read, stored
    (ws / "src/f2.bin").write_bytes(b"staged, not committed\n")
    git(ws, "add", "src/f2.bin")  # its index blob is in no commit: read, stored
    (ws / "new.txt").write_text("untracked\n")
    os.utime(ws / "src/f3.bin")  # touched: read, its git id
    read = _count_reads(monkeypatch)
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        blobs = BlobStore(engine)
        scanner = Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000)
        snap = snapshot.take(scanner, blobs, git=True)
        save_statements(engine, snap.statements)
        # .gitignore is read for its rules, as always; no other clean file is opened (f3
        # when git's index does not vouch for it without reading it, which git leaves open).
        must = {b".gitignore", b"f1.bin", b"f2.bin", b"new.txt"}
        assert must <= set(read) <= must | {b"f3.bin"} and len(read) == len(set(read)), read
        m = snap.manifest
        for name in (b"src/f0.bin", b"src/f3.bin", b"run.sh"):
            assert m[name].ref == "git:" + git(ws, "rev-parse", f"HEAD:{name.decode()}")
        for name in (b"src/f1.bin", b"src/f2.bin", b"new.txt"):
            assert m[name].ref == sha256(ws / name.decode())
        assert stored_blob_refs(engine) == {
            m[b"src/f1.bin"].ref,
            m[b"src/f2.bin"].ref,
            m[b"new.txt"].ref,
        }

        # Another folder (another host), from the store and the repository by its path.
        reader = BlobStore(engine)
        manifest = snapshot.load(reader, snap.tree_id)
        out = tmp_path / "out"
        materialize(
            manifest,
            out,
            Scanner(out, list(DEFAULT_EXCLUDE), 10_000_000),
            reader.blob,
            present=reader.present_blobs,
        )
        assert picture(out) == picture(ws, skip=WITHOUT_GIT)

        # Touched after the snapshot (same bytes, a new ctime): the same ids, no drift,
        # whether the same scanner looks again or a fresh one seeded as resume does.
        os.utime(ws / "src/f0.bin", ns=(1, 1))
        (ws / "src/f4.bin").write_bytes((ws / "src/f4.bin").read_bytes())
        again = snapshot.take(scanner, blobs, git=True)
        assert again.tree_id == snap.tree_id
        fresh = Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000)
        fresh.seed(manifest)
        snapshot.use_git(fresh)
        assert fresh.scan().tree_id == snap.tree_id
        assert not changes(manifest, fresh.scan().manifest)

        # Changed after the snapshot: its sha256, stored.
        (ws / "src/f5.bin").write_bytes(b"edited by the run\n")
        later = snapshot.take(scanner, blobs, git=True)
        save_statements(engine, later.statements)
        assert later.manifest[b"src/f5.bin"].ref == sha256(ws / "src/f5.bin")
        assert later.manifest[b"src/f5.bin"].ref in stored_blob_refs(engine)
        assert [c.path for c in changes(manifest, later.manifest)] == [b"src/f5.bin"]
    finally:
        engine.dispose()


def stored_blob_refs(engine: Any) -> set[str]:
    with engine.connect() as conn:
        return {r[0] for r in conn.exec_driver_sql("SELECT hash FROM workspace_blobs")}


@pytest.mark.slow
def test_a_touched_file_is_not_drift_on_resume(tmp_path, genv, write_script) -> None:  # type: ignore[no-untyped-def]
    ws = make_checkout(tmp_path, files=20, size=1000)
    model = write_script(TURNS)
    assert _start(genv, ws, model, "touch", "--max-steps", "1").returncode == 3
    os.utime(ws / "src/f5.bin", ns=(1, 1))  # its stat changed, not its bytes
    (ws / "run.sh").write_bytes((ws / "run.sh").read_bytes())
    proc = da(["resume", "touch", "--max-steps", "10", "--quiet"], genv, tmp_path)
    assert proc.returncode == 0, proc.stderr  # (drift would stop it: exit 5, a question)
    assert (ws / "out/x.txt").read_text() == "built\n"


@pytest.mark.slow
def test_an_untouched_file_is_not_drift_after_head_moved(tmp_path, genv, write_script) -> None:  # type: ignore[no-untyped-def]
    ws = make_checkout(tmp_path, files=20, size=1000)
    model = write_script(TURNS)
    assert _start(genv, ws, model, "moved", "--max-steps", "1").returncode == 3
    # HEAD moves between the sessions to a commit whose src/f5.bin is other bytes; the file
    # in the folder is not touched (a partial commit does this: `git add -p`).
    blob = (
        subprocess.run(
            ["git", "hash-object", "-w", "--stdin"],
            cwd=ws,
            input=b"committed elsewhere\n",
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .strip()
    )
    before = (ws / "src/f5.bin").lstat()
    git(ws, "update-index", "--cacheinfo", f"100644,{blob},src/f5.bin")
    git(ws, "commit", "-q", "-m", "moved")
    assert (ws / "src/f5.bin").lstat().st_ctime_ns == before.st_ctime_ns
    proc = da(["resume", "moved", "--max-steps", "10", "--quiet"], genv, tmp_path)
    assert proc.returncode == 0, proc.stderr  # (drift would stop it: exit 5, a question)
    assert (ws / "out/x.txt").read_text() == "built\n"
    # Nor is it a change of the steps after: its sha256 names the bytes its `git:` id did.
    db = sqlite3.connect(genv["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    with db:
        changed = db.execute("SELECT path, change FROM step_changes WHERE run_id = 'moved'")
        paths = dict(changed.fetchall())
    db.close()
    assert "src/f0.bin" in paths and "src/f5.bin" not in paths, paths
    whole = da(["diff", "moved"], genv, tmp_path)
    assert whole.returncode == 0 and "src/f0.bin" in whole.stdout, whole.stderr
    assert "src/f5.bin" not in whole.stdout, whole.stdout


def test_a_default_run_after_a_git_one_in_the_same_process_stores_every_file(
    tmp_path: Path,
) -> None:
    """One scanner per workspace and process (a worker's runs share it): a run with the
    default baseline must not carry the other run's `git:` ids into trees naming no commit."""
    ws = make_checkout(tmp_path, files=10, size=500)
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        blobs = BlobStore(engine)
        scanner = Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000)
        first = snapshot.take(scanner, blobs, git=True)
        save_statements(engine, first.statements)
        assert any(e.ref.startswith("git:") for e in first.manifest.values())
        plain = snapshot.take(scanner, blobs)
        save_statements(engine, plain.statements)
        refs = {e.ref for e in plain.manifest.values() if e.kind == "file"}
        assert refs and not any(r.startswith("git:") for r in refs)
        assert refs <= stored_blob_refs(engine)
        assert BlobStore(engine).tree_git(plain.tree_id) is None
    finally:
        engine.dispose()


def test_default_runs_between_git_ones_in_the_same_process_store_every_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """git, default, git, default on one scanner: the second git run's scanner is not
    fresh, yet the ids it took from HEAD are dropped for the default run after it, whose
    tree (naming no commit) must rebuild from the store alone."""
    monkeypatch.setattr(scan_module, "RACY_NS", 0)
    ws = make_checkout(tmp_path, files=4, size=200)
    committed = (ws / "run.sh").read_bytes()
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        blobs = BlobStore(engine)
        scanner = Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000)
        for git_baseline_on, edit in ((True, None), (False, b"#!/bin/sh\n"), (True, committed)):
            if edit is not None:
                (ws / "run.sh").write_bytes(edit)  # back to HEAD's bytes: a `git:` id again
            snap = snapshot.take(scanner, blobs, git=git_baseline_on)
            save_statements(engine, snap.statements)
        assert snap.manifest[b"run.sh"].ref.startswith("git:")
        (ws / "new.txt").write_text("made by the default run\n")
        plain = snapshot.take(scanner, blobs)
        save_statements(engine, plain.statements)
        refs = {e.ref for e in plain.manifest.values() if e.kind == "file"}
        assert not any(r.startswith("git:") for r in refs), refs
        assert refs <= stored_blob_refs(engine)
        assert BlobStore(engine).tree_git(plain.tree_id) is None
    finally:
        engine.dispose()


@pytest.mark.parametrize("loop", ["c", "python"])
def test_the_first_snapshot_on_gits_word_equals_a_full_rescan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: str
) -> None:
    """A fresh scanner's first snapshot takes the files git vouches for unread; it must give
    the manifest a scan that reads every file gives, whatever the checkout holds."""
    if loop == "python":
        monkeypatch.setattr(scan_module, "_changed", scan_module._changed_py)
        monkeypatch.setattr(scan_module, "_preload", scan_module._preload_py)
        monkeypatch.setattr(scan_module, "_seeded", scan_module._seeded_py)
        monkeypatch.setattr(git_index, "_index_files", git_index._index_files_py)
    ws = tmp_path / "ws"
    for name in ("a/clean.txt", "a/b/deep.txt", "mod.txt", "gone.txt", "exec.sh", "perm.txt"):
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(f"{name}\n")
    (ws / "racy.txt").write_text("aaaa\n")
    (ws / "kept.log").write_text("tracked, but ignored by .gitignore\n")
    (ws / "node_modules/pkg").mkdir(parents=True)
    (ws / "node_modules/pkg/tracked.js").write_text("tracked in a generated folder\n")
    (ws / ".gitignore").write_text("*.log\n")
    (ws / ".env").write_text("TOKEN=committed\n")  # withheld by its name, read or not
    os.symlink("a/clean.txt", ws / "link")
    os.symlink("mod.txt", ws / "relinked")
    os.symlink("exec.sh", ws / "was-link")
    # A mode git does not record: clean to git, not to the manifest. Set before `git add`:
    # a chmod after it changes the change time, which git compares by the second, so git
    # calls the file dirty (and it is read) whenever the two straddle a second.
    (ws / "perm.txt").chmod(0o600)
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "add", "-f", "kept.log")
    git(ws, "commit", "-q", "-m", "base")
    (ws / "racy.txt").write_text("bbbb\n")  # same size, same second as the index: racy
    (ws / "mod.txt").write_text("modified\n")
    (ws / "gone.txt").unlink()
    (ws / "exec.sh").chmod(0o755)  # a mode git records
    (ws / "relinked").unlink()
    os.symlink("a/b/deep.txt", ws / "relinked")
    (ws / "was-link").unlink()
    (ws / "was-link").write_text("a file now\n")
    (ws / "untracked.txt").write_text("new\n")
    (ws / "u/v").mkdir(parents=True)
    (ws / "u/v/new.bin").write_bytes(b"\x00\x01")
    os.symlink("untracked.txt", ws / "u/link")
    (ws / "empty/dir").mkdir(parents=True)
    (ws / "node_modules/pkg/untracked.js").write_text("left out\n")
    (ws / "other.log").write_text("ignored\n")
    read = _count_reads(monkeypatch)
    # No margin before git looks: the files written just now are taken on git's word (the
    # racy one included), as a checkout's older files are.
    monkeypatch.setattr(git_index, "VOUCH_MARGIN_NS", 0)
    check = SecretCheck(Redactor({"API_KEY": "sk-not-in-any-file"}))
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        fast = snapshot.take(
            Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000, check), BlobStore(engine), git=True
        )
    finally:
        engine.dispose()
    assert b"clean.txt" not in read and b"perm.txt" not in read  # git's word, unread
    head = git_baseline.head_of(os.fsencode(str(ws)))
    assert head is not None
    full = Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000, check)
    full.use_git(head.files, fmt=head.baseline.format)  # no file vouched for: all read
    rescan = full.scan().manifest
    assert fast.manifest == rescan
    m = rescan
    assert m[b"perm.txt"].mode == 0o600 and m[b"exec.sh"].mode & 0o111
    assert m[b"racy.txt"].ref == sha256(ws / "racy.txt")
    assert m[b"relinked"].target == b"a/b/deep.txt" and m[b"was-link"].kind == "file"
    assert m[b"empty/dir"].kind == "dir" and m[b".env"].kind == "secret"
    assert b"gone.txt" not in m and b"kept.log" not in m and b"other.log" not in m
    assert b"node_modules/pkg/tracked.js" in m and b"node_modules/pkg/untracked.js" not in m
    assert m[b"a/clean.txt"].ref.startswith("git:")


def _converted_on_checkout(ws: Path, attributes: str, config: tuple[str, ...] = ()) -> None:
    """a.txt committed, then checked out again: its bytes on disk are what `attributes` (and
    `config`) make of its blob, and git calls it clean."""
    for item in config:
        git(ws, "config", *item.split("=", 1))
    (ws / ".gitattributes").write_text(attributes)
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "attributes")
    (ws / "a.txt").unlink()
    git(ws, "checkout", "--", "a.txt")


def _converted_outside(ws: Path, path: Path) -> None:
    """As _converted_on_checkout with `ident`, named in $GIT_DIR/info/attributes or in the
    file core.attributesFile names (by `path`), not in a .gitattributes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("*.txt ident\n")
    if path.parent != ws / ".git" / "info":
        git(ws, "config", "core.attributesFile", str(path))
    (ws / "a.txt").unlink()
    git(ws, "checkout", "--", "a.txt")


def _normalized_when_added(ws: Path, attributes: str, config: tuple[str, ...] = ()) -> None:
    """a.txt written with CRLF line ends and committed: git stores it with LF (`attributes`,
    `config`), leaves the file as it is, and calls it clean."""
    for item in config:
        git(ws, "config", *item.split("=", 1))
    if attributes:
        (ws / ".gitattributes").write_text(attributes)
    (ws / "a.txt").write_bytes(b"line one\r\nline two\r\n")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "CRLF, stored as LF")


_GIT_CALLS_CLEAN: dict[str, Callable[[Path], None]] = {
    "eol=crlf": lambda ws: _converted_on_checkout(ws, "*.txt text eol=crlf\n"),
    "text=auto, core.eol=crlf": lambda ws: _converted_on_checkout(
        ws, "* text=auto\n", ("core.eol=crlf",)
    ),
    "text=auto, added with CRLF": lambda ws: _normalized_when_added(ws, "* text=auto\n"),
    "eol=lf, added with CRLF": lambda ws: _normalized_when_added(ws, "*.txt eol=lf\n"),
    "autocrlf=input, added with CRLF": lambda ws: _normalized_when_added(
        ws, "", ("core.autocrlf=input",)
    ),
    "ident": lambda ws: _converted_on_checkout(ws, "*.txt ident\n"),
    "filter": lambda ws: _converted_on_checkout(
        ws,
        "*.txt filter=up\n",
        # (a round trip: the blob back from the checked-out bytes, `$Id$` included, or git
        # calls the file modified whenever it compares the bytes of a racily clean entry)
        ("filter.up.smudge=sed s/one/ONE/", "filter.up.clean=sed s/ONE/one/"),
    ),
    "autocrlf=true": lambda ws: _converted_on_checkout(ws, "", ("core.autocrlf=true",)),
    "a macro of eol=crlf": lambda ws: _converted_on_checkout(
        ws, "[attr]windows text eol=crlf\n*.txt windows\n"
    ),
    "legacy crlf, core.eol=crlf": lambda ws: _converted_on_checkout(
        ws, "*.txt crlf\n", ("core.eol=crlf",)
    ),
    "working-tree-encoding": lambda ws: (
        (ws / ".gitattributes").write_text("*.txt working-tree-encoding=UTF-16LE\n"),
        git(ws, "add", ".gitattributes"),  # (a.txt is UTF-8 on disk until checked out again)
        git(ws, "commit", "-q", "-m", "attributes"),
        (ws / "a.txt").unlink(),
        git(ws, "checkout", "--", "a.txt"),
    ),
    "info/attributes": lambda ws: _converted_outside(ws, ws / ".git" / "info" / "attributes"),
    "core.attributesFile": lambda ws: _converted_outside(ws, ws.parent / "attrs"),
    "assume-unchanged": lambda ws: (
        git(ws, "update-index", "--assume-unchanged", "a.txt"),
        (ws / "a.txt").write_text("edited, and git told not to look\n"),
    ),
    "skip-worktree": lambda ws: (
        git(ws, "update-index", "--skip-worktree", "a.txt"),
        (ws / "a.txt").write_text("a local edit git is told to skip\n"),
    ),
}


@pytest.mark.parametrize("case", sorted(_GIT_CALLS_CLEAN))
def test_a_file_git_calls_clean_with_other_bytes_than_its_blob_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """git calls a file clean when its bytes are what checking its blob out gives (CRLF line
    ends, a smudge filter, `$Id$` expanded), or when told not to look (assume-unchanged,
    skip-worktree): its bytes are not the blob's, so it is read and stored, and a rebuild
    gives it back as it was on disk."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("$Id$\nline one\nline two\n")
    (ws / "b.txt").write_text("untouched\n")
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "base")
    _GIT_CALLS_CLEAN[case](ws)
    assert (ws / "a.txt").read_bytes() != subprocess.run(
        ["git", "cat-file", "blob", "HEAD:a.txt"], cwd=ws, capture_output=True, check=True
    ).stdout
    assert "a.txt" not in git(ws, "status", "--porcelain")
    monkeypatch.setattr(git_index, "VOUCH_MARGIN_NS", 0)  # all taken on git's word if it can
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        blobs = BlobStore(engine)
        snap = snapshot.take(Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000), blobs, git=True)
        save_statements(engine, snap.statements)
        head = git_baseline.head_of(os.fsencode(str(ws)))
        assert head is not None
        full = Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000)
        full.use_git(head.files, fmt=head.baseline.format)  # every file read
        assert snap.manifest == full.scan().manifest
        assert snap.manifest[b"a.txt"].ref == sha256(ws / "a.txt")
        reader = BlobStore(engine)
        manifest = snapshot.load(reader, snap.tree_id)
        out = tmp_path / "out"
        materialize(
            manifest,
            out,
            Scanner(out, list(DEFAULT_EXCLUDE), 10_000_000),
            reader.blob,
            present=reader.present_blobs,
        )
        assert picture(out) == picture(ws, skip=WITHOUT_GIT)
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "attributes, config",
    [("* text=auto\n", ()), ("*.txt text eol=lf\n", ()), ("", ("core.autocrlf=input",))],
)
def test_files_git_only_normalizes_when_added_are_taken_on_its_word_at_their_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attributes: str, config: tuple[str, ...]
) -> None:
    """`text=auto` (a common .gitattributes), `eol=lf`, `core.autocrlf = input`: checking
    a blob out writes its bytes as they are, so a clean file of the blob's size is the
    blob and is not read; one git made LF when it was added (CRLF on disk, a larger size)
    is read."""
    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "-q")
    for item in config:
        git(ws, "config", *item.split("=", 1))
    if attributes:
        (ws / ".gitattributes").write_text(attributes)
    for i in range(5):
        (ws / f"plain{i}.txt").write_text(f"line {i}\nanother\n")
    (ws / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "base")
    assert git(ws, "status", "--porcelain").strip() == ""
    monkeypatch.setattr(git_index, "VOUCH_MARGIN_NS", 0)
    read = _count_reads(monkeypatch)
    snap = _first_git_snapshot(ws, tmp_path)
    assert b"crlf.txt" in read and not any(name.startswith(b"plain") for name in read), read
    assert snap.manifest[b"crlf.txt"].ref == sha256(ws / "crlf.txt")
    assert snap.manifest[b"plain3.txt"].ref == "git:" + git(ws, "rev-parse", "HEAD:plain3.txt")


def test_no_filter_the_repository_config_names_is_run(tmp_path: Path) -> None:
    """A run can write the repository's config: a clean filter planted there (git runs it
    on a racily clean entry's bytes) must not run when the harness asks git which files
    are clean, as a planted fsmonitor does not."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("committed\n")
    (ws / "b.bin").write_bytes(b"\x00lfs\n")
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "base")
    ran = tmp_path / "ran"
    for name in ("evil", "lfs"):  # (one named like a driver a user has for real)
        git(ws, "config", f"filter.{name}.clean", f"echo {name} >> '{ran}'; cat")
        git(ws, "config", f"filter.{name}.process", f"sh -c 'echo {name} >> {ran}'")
    (ws / ".git/info/attributes").write_text("a.txt filter=evil\n*.bin filter=lfs\n")
    # Every entry racily clean (the index older than the files): git reads each through
    # its filter to compare it.
    os.utime(ws / ".git/index", (1, 1))
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        blobs = BlobStore(engine)
        snap = snapshot.take(Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000), blobs, git=True)
    finally:
        engine.dispose()
    assert not ran.exists(), ran.read_text()
    assert snap.manifest[b"a.txt"].ref.startswith("git:")  # read: its bytes are the blob's


@pytest.mark.slow
def test_a_commit_edited_in_the_store_is_never_an_option_to_git(
    tmp_path, genv, write_script
) -> None:  # type: ignore[no-untyped-def]
    """The recorded commit is handed to `git fetch` when the cached clone of the remote
    lacks it: one edited to read `--upload-pack=...` would run a command. It is refused as
    damage, in one line."""
    ws = make_checkout(tmp_path, files=5, size=100)
    assert _start(genv, ws, write_script(TURNS), "edit").returncode == 0
    seq = last_seq(genv, "edit")
    shutil.move(ws, tmp_path / "moved")  # restored from the remote: its clone is cached
    proc = da(["restore", "edit", "--at", str(seq), "--to", str(tmp_path / "a")], genv, tmp_path)
    assert proc.returncode == 0, proc.stderr
    ran = tmp_path / "ran"
    db = sqlite3.connect(genv["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    with db:
        for tid, text in db.execute("SELECT id, git FROM workspace_trees").fetchall():
            doc = json.loads(text)
            doc["commit"] = f"--upload-pack=touch {ran}; git-upload-pack"
            db.execute("UPDATE workspace_trees SET git = ? WHERE id = ?", (json.dumps(doc), tid))
    db.close()
    proc = da(["restore", "edit", "--at", str(seq), "--to", str(tmp_path / "b")], genv, tmp_path)
    assert not ran.exists()
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr


_STAGED: dict[str, Callable[[Path], None]] = {
    "clean": lambda ws: None,
    "added": lambda ws: ((ws / "new.txt").write_text("new\n"), git(ws, "add", "new.txt")),
    "removed": lambda ws: git(ws, "rm", "-q", "--cached", "src/f0.bin"),
    "modified": lambda ws: (
        (ws / "src/f1.bin").write_bytes(b"staged\n"),
        git(ws, "add", "src/f1.bin"),
    ),
    "a link now": lambda ws: (
        (ws / "src/f2.bin").unlink(),
        os.symlink("run.sh", ws / "src/f2.bin"),
        git(ws, "add", "src/f2.bin"),
    ),
    "a file now": lambda ws: (
        (ws / "link").unlink(),
        (ws / "link").write_text("a file\n"),
        git(ws, "add", "link"),
    ),
    "modified, its tree written": lambda ws: (
        (ws / "src/f1.bin").write_bytes(b"staged\n"),
        git(ws, "add", "src/f1.bin"),
        git(ws, "write-tree"),  # (the index's cache-tree whole again: not HEAD's tree)
    ),
    "clean, its tree written": lambda ws: git(ws, "write-tree"),
    "executable": lambda ws: git(ws, "update-index", "--chmod=+x", "src/f3.bin"),
    "skip-worktree": lambda ws: git(ws, "update-index", "--skip-worktree", "src/f4.bin"),
    "index version 4": lambda ws: git(ws, "update-index", "--index-version=4"),
    "conflict": lambda ws: subprocess.run(
        ["git", "update-index", "--index-info"],
        cwd=ws,
        input=f"100644 {git(ws, 'rev-parse', 'HEAD:run.sh')} 1\tsrc/c.txt\n",
        text=True,
        check=True,
    ),
}


@pytest.mark.parametrize("state", sorted(_STAGED))
@pytest.mark.parametrize("where", ["top", "src"])
def test_the_commits_files_read_from_the_index_are_what_ls_tree_lists(
    tmp_path: Path, state: str, where: str
) -> None:
    """The commit's files are git's index's, corrected by what `git diff-index --cached`
    says differs (git_baseline._at_commit), or `git ls-tree`'s where the index is not one
    index_files reads (a conflict): either way the tree `ls-tree` lists, below the
    workspace's folder when it is one of the repository's."""
    ws = make_checkout(tmp_path, files=6, size=100)
    _STAGED[state](ws)
    root = ws if where == "top" else ws / "src"
    got = git_baseline.head_and_seeds(os.fsencode(str(root)))[0]
    assert got is not None
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "-z", "HEAD"], cwd=root, capture_output=True, check=True
    ).stdout
    assert got.files == git_baseline._tree_of(listed)
    assert got.baseline.prefix == ("" if where == "top" else "src")


def test_diff_index_runs_only_when_the_index_is_not_heads_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = make_checkout(tmp_path, files=6, size=100)
    _aged(ws)  # (read-tree leaves the cache-tree whole, as a commit or a checkout does)
    ran: list[str] = []
    real = git_baseline._git
    monkeypatch.setattr(
        git_baseline,
        "_git",
        lambda root, *args, **kw: ran.append(args[0]) or real(root, *args, **kw),
    )
    head, seeds = git_baseline.head_and_seeds(os.fsencode(str(ws)))
    assert head is not None and "diff-index" not in ran and len(seeds.vouched) > 0
    (ws / "src/f1.bin").write_bytes(b"staged\n")
    git(ws, "add", "src/f1.bin")
    git_baseline._heads.clear()
    head, seeds = git_baseline.head_and_seeds(os.fsencode(str(ws)))
    assert head is not None and "diff-index" in ran
    assert b"src/f1.bin" not in seeds.vouched.taken()  # staged: its blob is not HEAD's


def test_an_index_git_is_told_of_elsewhere_vouches_for_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index is read while `git rev-parse` runs, found as git finds it; where git's
    environment names another (GIT_INDEX_FILE), git's word stands: the commit's files as
    `ls-tree` lists them, and every file read."""
    ws = make_checkout(tmp_path, files=6, size=100)
    _aged(ws)
    head, seeds = git_baseline.head_and_seeds(os.fsencode(str(ws)))
    assert head is not None and len(seeds.vouched) > 0
    other = tmp_path / "other-index"
    shutil.copy(ws / ".git" / "index", other)
    monkeypatch.setenv("GIT_INDEX_FILE", str(other))
    git_baseline._heads.clear()
    head, seeds = git_baseline.head_and_seeds(os.fsencode(str(ws)))
    assert head is not None and seeds is git_index.NO_SEEDS
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "-z", "HEAD"], cwd=ws, capture_output=True, check=True
    ).stdout
    assert head.files == git_baseline._tree_of(listed)


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_a_linked_worktree_s_index_is_the_one_read(tmp_path: Path, object_format: str) -> None:
    """`.git` a file naming the worktree's git folder, its config the common one's: the
    index found there is git's, and vouches for the worktree's files."""
    main = tmp_path / "main"
    main.mkdir()
    git(main, "init", "-q", f"--object-format={object_format}")
    for i in range(5):
        (main / f"f{i}.txt").write_text(f"file {i}\n")
    git(main, "add", "-A")
    git(main, "commit", "-q", "-m", "base")
    linked = tmp_path / "linked"
    git(main, "worktree", "add", "-q", str(linked))
    assert (linked / ".git").is_file()
    _aged(linked)
    head, seeds = git_baseline.head_and_seeds(os.fsencode(str(linked)))
    assert head is not None and head.baseline.format == object_format
    assert set(seeds.vouched.taken()) == {f"f{i}.txt".encode() for i in range(5)}
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "-z", "HEAD"], cwd=linked, capture_output=True, check=True
    ).stdout
    assert head.files == git_baseline._tree_of(listed)


@pytest.mark.xfail(strict=True, reason="attributes are read as they are now, not as of checkout")
@pytest.mark.parametrize("change", ["gitattributes", "autocrlf"])
def test_a_file_checked_out_converted_is_not_its_blob_after_the_rules_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """a.txt checked out converted (`ident`; CRLF by core.autocrlf), its stat data recorded,
    then the rule that converted it is gone (a .gitattributes edited in the work tree; the
    config changed): its bytes are not its blob's, yet its lstat is what git's index has."""
    ws = _converted_then_rules_gone(tmp_path, change)
    snap = _first_git_snapshot(ws, tmp_path)
    data = (ws / "a.txt").read_bytes()
    assert snap.manifest[b"a.txt"].ref in (
        "git:" + git_baseline.git_blob_id(data),
        sha256(ws / "a.txt"),
    )


def _converted_then_rules_gone(tmp_path: Path, change: str) -> Path:
    """A checkout whose a.txt git checked out converted (`ident`; CRLF by core.autocrlf),
    its stat data recorded, then the rule that converted it gone; and a b.txt as it is."""
    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "-q")
    (ws / "a.txt").write_text("id: $Id$\nline two\n")
    (ws / "b.txt").write_text("b\n")
    if change == "gitattributes":
        (ws / ".gitattributes").write_text("*.txt ident\n")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "base")
    if change == "autocrlf":
        git(ws, "config", "core.autocrlf", "true")
    (ws / "a.txt").unlink()
    git(ws, "checkout", "--", "a.txt")
    assert (ws / "a.txt").read_bytes() != git(ws, "show", "HEAD:a.txt").encode() + b"\n"
    _aged(ws)
    if change == "gitattributes":
        (ws / ".gitattributes").write_text("")
    else:
        git(ws, "config", "core.autocrlf", "false")
    return ws


def test_a_later_snapshot_of_a_process_runs_no_git_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HEAD is found once a process (the run's later snapshots keep its commit): a step's
    snapshot after the first runs no git command and reads no index."""
    ws = make_checkout(tmp_path, files=5, size=100)
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        blobs = BlobStore(engine)
        scanner = Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000)
        save_statements(engine, snapshot.take(scanner, blobs, git=True).statements)
        ran: list[Any] = []
        real_popen, real_run = subprocess.Popen, subprocess.run
        monkeypatch.setattr(
            git_baseline.subprocess, "Popen", lambda *a, **k: ran.append(a) or real_popen(*a, **k)
        )
        monkeypatch.setattr(
            git_baseline.subprocess, "run", lambda *a, **k: ran.append(a) or real_run(*a, **k)
        )
        monkeypatch.setattr(git_baseline, "index_files", lambda *a, **k: ran.append(a) or None)
        (ws / "src/f1.bin").write_bytes(b"a step's edit\n")
        later = snapshot.take(scanner, blobs, git=True)
        assert later.manifest[b"src/f1.bin"].ref == sha256(ws / "src/f1.bin")
        assert later.manifest[b"src/f0.bin"].ref.startswith("git:")
        assert ran == []
    finally:
        engine.dispose()


# -- a whole manifest kept as the differences from the commit ---------------------------------


def _forget_process() -> None:
    """What a new process knows: no tree, baseline or repository found yet."""
    snapshot._trees.clear()
    snapshot._git_of.clear()
    git_baseline._heads.clear()
    git_baseline._sources.clear()


def _stored_tree(engine: Any, tid: str) -> tuple[dict[str, Any], str | None]:
    with engine.connect() as conn:
        data, recorded = conn.execute(
            sa.text("SELECT data, git FROM workspace_trees WHERE id = :i"), {"i": tid}
        ).one()
    return json.loads(zlib.decompress(bytes(data))), recorded


def _commit_listing(repo: Path, spec: str) -> dict[bytes, tuple[str, int]]:
    out = subprocess.run(
        ["git", "ls-tree", "-r", "-l", "-z", spec], cwd=repo, capture_output=True, check=True
    ).stdout
    listed = {}
    for record in filter(None, out.split(b"\0")):
        meta, _, path = record.partition(b"\t")
        mode, kind, blob, size = meta.split()
        if kind == b"blob" and mode in (b"100644", b"100755"):
            listed[path] = (blob.decode(), int(size))
    return listed


def _take_and_read_back(root: Path, tmp_path: Path) -> tuple[snapshot.Snapshot, dict[str, Any]]:
    """A fresh process's first snapshot (git baseline) of `root`, stored; its tree read back
    by a new process. (the snapshot, the stored tree's JSON)"""
    _forget_process()
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        blobs = BlobStore(engine)
        snap = snapshot.take(Scanner(root, list(DEFAULT_EXCLUDE), 10_000_000), blobs, git=True)
        save_statements(engine, snap.statements)
        doc, _ = _stored_tree(engine, snap.tree_id)
        _forget_process()
        assert snapshot.load(BlobStore(engine), snap.tree_id) == snap.manifest
    finally:
        engine.dispose()
    return snap, doc


def _paths_of(items: list[Any]) -> set[bytes]:
    return {manifest_module._dec(item) for item in items}


@pytest.mark.parametrize("state", sorted(_STAGED))
@pytest.mark.parametrize("where", ["top", "src"])
def test_a_whole_manifest_is_stored_as_what_differs_from_the_commit(
    tmp_path: Path, state: str, where: str
) -> None:
    """Whatever the index holds (read, corrected by `diff-index`, or `ls-tree`'s where it is
    not read) and whatever the work tree holds beside it, the tree names exactly the
    entries that are not the commit's files as `git ls-tree -r -l` lists them (blob, size,
    the commonest permission bits), and the paths of those gone; read back in a new
    process from that listing, it is the manifest the snapshot took."""
    ws = make_checkout(tmp_path, files=6, size=100)
    _STAGED[state](ws)
    (ws / "src/f5.bin").unlink()  # gone from the work tree only
    (ws / "src/new.txt").write_text("untracked\n")
    (ws / "src/f4.bin").chmod(0o600)
    (ws / "src/empty").mkdir()
    os.symlink("f4.bin", ws / "src/to-f4")
    root = ws if where == "top" else ws / "src"
    snap, doc = _take_and_read_back(root, tmp_path)
    assert set(doc) == {"head"}
    listed = _commit_listing(ws, "HEAD" if where == "top" else "HEAD:src")
    mode = doc["head"]["mode"]
    assert mode == 0o644
    differing = {
        p
        for p, e in snap.manifest.items()
        if p not in listed
        or e != manifest_module.Entry("file", mode, "git:" + listed[p][0], size=listed[p][1])
    }
    assert _paths_of([row[0] for row in doc["head"]["set"]]) == differing
    assert _paths_of(doc["head"]["del"]) == set(listed) - set(snap.manifest)
    lead = b"src/" if where == "top" else b""  # (the edits above, as the manifest names them)
    assert {lead + name for name in (b"new.txt", b"f4.bin", b"to-f4", b"empty")} <= differing
    assert lead + b"f5.bin" in _paths_of(doc["head"]["del"])


def test_a_clean_checkout_s_manifest_is_a_few_bytes_in_the_commit_s_permission_bits(
    tmp_path: Path,
) -> None:
    ws = make_checkout(tmp_path, files=200, size=100)
    for path in ws.rglob("*"):  # as checked out under a 002 umask
        if ".git" not in path.parts and path.is_file() and not path.is_symlink():
            path.chmod(0o775 if os.access(path, os.X_OK) else 0o664)
    snap, doc = _take_and_read_back(ws, tmp_path)
    assert doc["head"]["mode"] == 0o664 and doc["head"]["del"] == []
    assert _paths_of([row[0] for row in doc["head"]["set"]]) == {b"run.sh", b"link"}
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT SUM(LENGTH(data)) FROM workspace_trees")).scalar()
    engine.dispose()
    whole = len(manifest_module.encode_full(snap.manifest))
    assert len(snap.manifest) == 203 and stored < 200 and whole > 20 * stored, (stored, whole)


def test_a_folder_the_commit_lacks_keeps_its_whole_manifest(tmp_path: Path) -> None:
    """A workspace in a folder of the checkout that no commit holds: nothing to take from
    the commit (its listing of that folder would fail where the repository is there)."""
    ws = make_checkout(tmp_path, files=3, size=100)
    (ws / "fresh").mkdir()
    (ws / "fresh/a.txt").write_text("a\n")
    snap, doc = _take_and_read_back(ws / "fresh", tmp_path)
    assert set(doc) == {"full"} and set(snap.manifest) == {b"a.txt"}


def test_a_commit_that_lists_other_files_is_never_taken_for_the_snapshot(
    tmp_path: Path,
) -> None:
    """The tree read back from a commit's listing must have the tree's id: a row pointed at
    another commit of the same repository is refused as damage, in one line, never read
    as a workspace it was not."""
    ws = make_checkout(tmp_path, files=6, size=100)
    snap, _ = _take_and_read_back(ws, tmp_path)
    (ws / "extra.txt").write_text("in the next commit only\n")
    git(ws, "add", "extra.txt")
    git(ws, "commit", "-q", "-m", "next")
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        _, recorded = _stored_tree(engine, snap.tree_id)
        assert recorded is not None
        doc = json.loads(recorded)
        doc["commit"] = git(ws, "rev-parse", "HEAD")
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE workspace_trees SET git = :g WHERE id = :i"),
                {"g": json.dumps(doc), "i": snap.tree_id},
            )
        _forget_process()
        with pytest.raises(StoreError, match="damaged in the store") as raised:
            snapshot.load(BlobStore(engine), snap.tree_id)
        assert "\n" not in str(raised.value)
    finally:
        engine.dispose()


def test_the_commit_s_listing_is_read_whatever_its_names_hold(tmp_path: Path) -> None:
    """Names holding a tab, a newline, or the text of another record (after a link's tab):
    the listing names the regular files the commit holds, each with its blob as
    `rev-parse` names it, and nothing else."""
    ws = tmp_path / "ws"
    ws.mkdir()
    fake = "100644 blob " + "a" * 40 + "\tforged"
    names = ["plain", "tab\there", "new\nline", fake, "d/" + fake, "é"]
    for i, name in enumerate(names):
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_bytes(b"x" * i)
    os.symlink("plain", ws / ("link " + fake))
    (ws / "run.sh").write_text("#!/bin/sh\n")
    (ws / "run.sh").chmod(0o755)
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "odd names")
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "-z", "HEAD"], cwd=ws, capture_output=True, check=True
    ).stdout
    got = git_baseline._tree_of(listed)
    assert set(got) == {os.fsencode(n) for n in [*names, "run.sh"]}
    for path, blob in got.items():
        assert blob == git(ws, "rev-parse", f"HEAD:{os.fsdecode(path)}"), path


def test_the_repositories_found_are_let_go_of_past_a_few(tmp_path: Path) -> None:
    """A worker goes through many repositories: each source found holds its commit's listing
    and a `cat-file` process. Past SOURCES_KEPT the oldest is let go of, its process ended;
    a store that still holds it reads on, with a new process."""
    ws = make_checkout(tmp_path, files=2, size=100)
    commit = git(ws, "rev-parse", "HEAD")
    git_baseline._sources.clear()
    first = git_baseline.source(git_baseline.Baseline(commit, str(ws), "", ""))
    blob = git(ws, "rev-parse", "HEAD:src/f0.bin")
    assert first.read(blob) == (ws / "src/f0.bin").read_bytes()
    proc = first._proc
    assert proc is not None and proc.poll() is None
    others = [
        git_baseline.source(git_baseline.Baseline(commit, str(ws), "", "", f"other{i}"))
        for i in range(git_baseline.SOURCES_KEPT)
    ]
    assert list(git_baseline._sources.values()) == others  # the first one let go of
    assert proc.poll() is not None and proc not in git_baseline._open_procs
    assert first.read(blob) == (ws / "src/f0.bin").read_bytes()  # (a new process)
    assert first._proc is not None and first._proc is not proc
    first.close()


def test_a_tree_taken_with_git_dir_in_the_environment_is_read_back_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIT_DIR set (as a git hook has it) makes git take the current folder for the work
    tree's top: the commit is listed whole, from the workspace's folder. Read back where
    GIT_DIR is not set (a restore, a resume in another shell), git finds the repository
    above that folder, and its listing must not then be cut to that folder."""
    ws = make_checkout(tmp_path, files=6, size=100)
    (ws / "src/f5.bin").unlink()  # gone from the work tree: the tree lists it as deleted
    _forget_process()
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        with monkeypatch.context() as env:
            env.setenv("GIT_DIR", str(ws / ".git"))
            scanner = Scanner(ws / "src", list(DEFAULT_EXCLUDE), 10_000_000)
            snap = snapshot.take(scanner, BlobStore(engine), git=True)
        save_statements(engine, snap.statements)
        assert set(_stored_tree(engine, snap.tree_id)[0]) == {"head"}
        _forget_process()
        assert snapshot.load(BlobStore(engine), snap.tree_id) == snap.manifest
    finally:
        engine.dispose()


@pytest.mark.parametrize("change", ["gitattributes", "autocrlf"])
def test_a_file_git_vouches_for_at_another_size_than_its_blob_s_leaves_the_tree_readable(
    tmp_path: Path, change: str
) -> None:
    """a.txt checked out converted, then the rule that converted it gone (as in
    test_a_file_checked_out_converted_is_not_its_blob_after_the_rules_change): git's index
    vouches for it at its size on disk, which is not its blob's. The commit's listing gives
    the blob's size: the tree stored as the differences from it must still be read back as
    the snapshot took it, never refused as damaged (the run's workspace lost)."""
    ws = _converted_then_rules_gone(tmp_path, change)
    snap, doc = _take_and_read_back(ws, tmp_path)
    assert set(doc) == {"head"}
    assert snap.manifest[b"a.txt"].size == (ws / "a.txt").stat().st_size


def test_a_file_named_by_its_blob_in_one_tree_and_by_its_sha256_in_the_other_is_no_change(
    tmp_path: Path,
) -> None:
    """A run resumed outside the checkout names by sha256 the files its first trees named
    by the commit's blob (`git:`): `diff` between them (and the web view's) tells the same
    bytes by git's hash of the stored ones, either way, and shows only what changed."""
    ws = make_checkout(tmp_path, files=5, size=100)
    out = tmp_path / "elsewhere"
    shutil.copytree(ws, out, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    (out / "src/f1.bin").write_bytes(b"changed\n")
    engine = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        blobs = BlobStore(engine)
        at_home = snapshot.take(Scanner(ws, list(DEFAULT_EXCLUDE), 10_000_000), blobs, git=True)
        save_statements(engine, at_home.statements)
        away = snapshot.take(Scanner(out, list(DEFAULT_EXCLUDE), 10_000_000), blobs)
        save_statements(engine, away.statements)
        assert at_home.manifest[b"src/f0.bin"].ref.startswith("git:")
        assert not away.manifest[b"src/f0.bin"].ref.startswith("git:")
        _forget_process()
        for before, after in ((at_home, away), (away, at_home)):
            found = diffing.between(engine, before.tree_id, after.tree_id)[2]
            assert [(c.path, c.change) for c in found] == [(b"src/f1.bin", "modified")]
    finally:
        engine.dispose()
