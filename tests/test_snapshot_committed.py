"""A snapshot that returns early (its tree and contents taken for stored) names only what
the store it is taken for holds: never a tree or a blob that another store, or an earlier
store at the same path, was told about (snapshot.committed, snapshot._stored)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from durable_agent.store import blobs as blobs_module
from durable_agent.store.blobs import BlobStore, save_statements
from durable_agent.store.engine import open_store_engine
from durable_agent.workspace import scan, snapshot
from durable_agent.workspace.manifest import blob_refs
from durable_agent.workspace.scan import Scanner


@pytest.fixture(autouse=True)
def _not_racy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan, "RACY_NS", 0)  # the stat cache trusts a file written just now


def _take(scanner: Scanner, engine: Engine, paths: list[bytes] | None = None) -> str:
    """A snapshot saved and marked committed, as a step's commit does (recorder.before)."""
    blobs = BlobStore(engine)
    snap = snapshot.take(scanner, blobs, paths)
    save_statements(engine, snap.statements)
    snapshot.committed(scanner, blobs, snap)
    return snap.tree_id


def _holds(engine: Engine, tid: str) -> bool:
    """`engine`'s store holds the tree `tid` and every blob it names (but those a git
    commit holds: `git:`, read back through the commit's listing, its id checked)."""
    blobs = BlobStore(engine)
    if tid not in blobs.stored([], [tid])[1]:
        return False
    with snapshot._trees_lock:
        snapshot._trees.clear()  # read back from this store
    refs = {r for r in blob_refs(snapshot.load(blobs, tid).values()) if not r.startswith("git:")}
    return blobs.stored_blobs(refs) == refs


@contextlib.contextmanager
def _engine(url: str) -> Iterator[Engine]:
    engine = open_store_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.mark.parametrize("paths", [None, [b"f"]])
def test_a_scanner_shared_by_two_stores_writes_each_the_blobs_its_trees_name(
    tmp_path: Path, store_url: str, paths: list[bytes] | None
) -> None:
    """Two runs of one process on one workspace, each with its own store: the contents the
    first store was written are written to the second one too."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_bytes(b"one")
    scanner = Scanner(ws, [], 1 << 20)
    with _engine(store_url) as first, _engine(f"sqlite:///{tmp_path / 'other.db'}") as second:
        tid = _take(scanner, first)
        assert _holds(first, tid)
        assert _take(scanner, second) == tid
        assert _holds(second, tid)
        (ws / "f").write_bytes(b"two")  # a file tool's write, then back to the first store
        tid = _take(scanner, second, paths)
        assert _holds(second, tid)
        assert _take(scanner, first, paths) == tid
        assert _holds(first, tid)


def test_a_store_replaced_by_a_fresh_file_at_its_path_is_written_the_tree(
    tmp_path: Path,
) -> None:
    """Runs of one process, one after the other: the store's file deleted between them and
    a new store made at the same path. The first snapshot of the new store writes it."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_bytes(b"one")
    scanner = Scanner(ws, [], 1 << 20)
    db = tmp_path / "store.db"
    url = f"sqlite:///{db}"
    with _engine(url) as engine:
        tid = _take(scanner, engine)
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{db}{suffix}")
    with _engine(url) as engine:
        assert _take(scanner, engine) == tid
        assert _holds(engine, tid)


@pytest.mark.postgres
def test_a_postgresql_schema_made_anew_under_the_same_url_is_written_the_tree(
    tmp_path: Path,
) -> None:
    """The PostgreSQL twin: the schema dropped and made again between two runs (the same
    URL text); the first snapshot of the new one writes its tree."""
    import psycopg
    from scale_helpers import PG_URL, _libpq_url, pg_schema

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_bytes(b"one")
    scanner = Scanner(ws, [], 1 << 20)
    with pg_schema() as url:
        schema = url.rsplit("%3D", 1)[1]
        with _engine(url) as engine:
            tid = _take(scanner, engine)
        admin: Any = psycopg.connect(_libpq_url(PG_URL), autocommit=True)
        with admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
            admin.execute(f'CREATE SCHEMA "{schema}"')
        with _engine(url) as engine:
            assert _take(scanner, engine) == tid
            assert _holds(engine, tid)


def test_a_new_engine_on_the_same_store_reads_no_file_again(tmp_path: Path) -> None:
    """Another engine on the store the scanner's snapshots went to (a second Agent of one
    process): one question of the store, not a read of every file."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(100):
        (ws / f"f{i}").write_bytes(b"%d" % i)
    scanner = Scanner(ws, [], 1 << 20)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with _engine(url) as engine:
        tid = _take(scanner, engine)
    with _engine(url) as engine:
        snap = snapshot.take(scanner, BlobStore(engine))
        assert snap.tree_id == tid and snap.scan.contents == {} and snap.statements == []


def test_a_store_that_failed_the_question_is_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The question whether another store holds the scanner's contents failed (the store
    away): the next snapshot for it asks again, and writes them."""
    from durable_agent.errors import StoreUnavailable

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_bytes(b"one")
    scanner = Scanner(ws, [], 1 << 20)
    real = BlobStore.stored_blobs
    calls: list[int] = []

    def once_away(self: BlobStore, hashes: Any) -> set[str]:
        calls.append(1)
        if len(calls) == 1:
            raise StoreUnavailable("away")
        return real(self, hashes)

    with (
        _engine(f"sqlite:///{tmp_path / 'a.db'}") as first,
        _engine(f"sqlite:///{tmp_path / 'b.db'}") as second,
    ):
        tid = _take(scanner, first)
        monkeypatch.setattr(BlobStore, "stored_blobs", once_away)
        with pytest.raises(StoreUnavailable):
            _take(scanner, second)
        assert _take(scanner, second) == tid
        assert _holds(second, tid)


def test_the_lookup_of_stored_blobs_and_trees_answers_any_number_of_values(
    store_url: str,
) -> None:
    """The lookups run a statement of blobs._NARROW or blobs._WIDE values, the last repeated
    (blobs._among): none, one, a statement's worth and one more of each, 5,000 and repeated
    values answer as the rows are, on both stores."""
    from durable_agent.store.blobs import TreeRow

    with _engine(store_url) as engine:
        blobs = BlobStore(engine)
        have = [f"{i:064x}" for i in range(0, 5_000, 3)]
        trees = [f"t{i:063x}" for i in range(0, 200, 2)]
        save_statements(
            engine,
            [
                blobs.blob_statement({h: b"" for h in have}),
                *[
                    blobs.tree_statement(TreeRow(t, None, i % 5, 0, b"{}"))
                    for i, t in enumerate(trees)
                ],
            ],
        )
        depth = {t: i % 5 for i, t in enumerate(trees)}
        narrow, wide = blobs_module._NARROW, blobs_module._WIDE
        for n in (0, 1, narrow, narrow + 1, wide - 1, wide, wide + 1, 2 * wide + 1, 5_000):
            asked = [f"{i:064x}" for i in range(n)]
            assert blobs.stored_blobs(asked) == set(have).intersection(asked), n
            named = [f"t{i:063x}" for i in range(min(n, 200))]
            found, depths = blobs.stored(asked, named)
            assert found == set(have).intersection(asked), n
            assert depths == {t: depth[t] for t in named if t in depth}, n
        repeated = [have[0]] * 70 + ["'; x", "", have[1], have[1]]
        assert blobs.stored_blobs(repeated) == {have[0], have[1]}
        assert blobs.stored([], ["", trees[0], trees[0], "nope"])[1] == {trees[0]: 0}


def _every_tree_held(url: str) -> None:
    """Every tree a run's rows name is stored, with every blob it names."""
    from sqlalchemy import select

    from durable_agent.store.schema import runs, steps

    with _engine(url) as engine:
        with engine.connect() as conn:
            named = {r for (r,) in conn.execute(select(runs.c.tree_start)) if r}
            for before, after in conn.execute(select(steps.c.tree_before, steps.c.tree_id)):
                named.update(t for t in (before, after) if t)
        assert named
        for tid in named:
            assert _holds(engine, tid), tid


@pytest.mark.parametrize("baseline", ["store", "git"])
@pytest.mark.parametrize("failing", range(1, 13))
def test_a_checkpoint_that_failed_leaves_no_tree_named_unwritten(
    cli_inproc: Any,
    write_script: Any,
    workspace: Path,
    env: dict[str, str],
    store_url: str,
    failing: int,
    baseline: str,
) -> None:
    """A run of file tools whose `failing`-th checkpoint fails (the store away: nothing of
    it committed), resumed in the same process (the same scanner): every tree its rows name
    is in the store with its blobs, however its snapshots returned early. With the git
    baseline, in a checkout: its first tree is stored as the differences from HEAD."""
    import threading

    from durable_agent.errors import StoreUnavailable
    from durable_agent.store.journal import BOUNDARY_HOOKS

    env["DURABLE_AGENT_DB"] = store_url
    if baseline == "git":
        _committed(workspace)
        env["DURABLE_AGENT_SNAPSHOT_BASELINE"] = "git"

    def write(content: str) -> dict[str, Any]:
        call = {"name": "write_file", "arguments": {"path": "a.txt", "content": content}}
        return {"tool_calls": [call]}

    script = write_script([write("one\n"), write("two\n"), write("one\n"), {"content": "ok"}])
    seen: list[str] = []

    def hook(where: str) -> None:
        if where == "before_commit" and threading.current_thread() is threading.main_thread():
            seen.append(where)
            if len(seen) == failing:
                raise StoreUnavailable("away")

    BOUNDARY_HOOKS.append(hook)
    try:
        first = cli_inproc("start", "t", "--model", script, "--run-id", "r")
    finally:
        BOUNDARY_HOOKS.remove(hook)
    if first.code == 0:
        _every_tree_held(store_url)
        return
    assert first.code == 7, first.stderr
    again = cli_inproc("resume", "r")
    assert again.code == 0, again.stderr
    assert (workspace / "a.txt").read_text() == "one\n"
    _every_tree_held(store_url)
    if baseline == "git":
        with _engine(store_url) as engine, engine.connect() as conn:
            whole = [bytes(d) for (d,) in conn.execute(text("SELECT data FROM workspace_trees"))]
        assert any(b'"head"' in zlib.decompress(d) for d in whole)


def _committed(root: Path) -> None:
    """`root` a git checkout of a few committed files, a.txt among them."""
    (root / "a.txt").write_text("zero\n")
    (root / "src").mkdir()
    for i in range(5):
        (root / "src" / f"f{i}.txt").write_text(f"file {i}\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run([*git, *args], cwd=root, check=True, capture_output=True)
