"""Workspace snapshots in the store: content-addressed blobs and trees (see workspace/).

Blobs (`workspace_blobs`) are zlib-compressed file contents keyed by the sha256 of the
uncompressed bytes, written once whatever number of runs and steps hold them. Trees
(`workspace_trees`) are manifests keyed by their tree id; most are stored as a delta on an
earlier tree (`base`, at most MAX_DEPTH deltas deep), so a one-line edit costs one blob and
a few paths of manifest, not a copy of the workspace's file list.

With `snapshot_baseline = "git"` a tree also records a git commit (`workspace_trees.git`)
whose files its snapshot did not store: their content ids are `git:` and a git blob id,
read from that commit's repository (workspace/git_baseline.py) for the trees loaded through
this BlobStore (`add_git_source`, called by snapshot.load).

Both are immutable and written with "insert unless present", so a transaction that is
retried, or two runs that store the same content at once, never conflict. This module
speaks bytes only; the manifest format is workspace/manifest.py's.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from msgspec import Struct, field
from sqlalchemy import Connection, Engine, bindparam, insert, select

from durable_agent.store import retrying
from durable_agent.store.prepared import Prepared, fetch_all
from durable_agent.store.schema import runs, workspace_blobs, workspace_changes, workspace_trees

T = TypeVar("T")

MAX_DEPTH = 50  # deltas walked to rebuild a tree, at most
Statement = tuple[Any, Any]
_CHANGES = insert(workspace_changes)
GIT_REF = "git:"  # a content id read from a git baseline (workspace/manifest.GIT_REF)


class GitSource(Protocol):
    """A git baseline's repository on this host (workspace/git_baseline.Source)."""

    def open(self) -> None: ...  # WorkspaceUnreachable when no repository has the commit

    def has(self, blob_id: str) -> bool: ...

    def read(self, blob_id: str) -> bytes | None: ...  # None: the commit has no such file


class TreeRow(Struct, frozen=True):
    id: str
    base: str | None
    depth: int
    entries: int
    data: bytes
    git: str | None = None  # the git baseline's JSON (workspace/git_baseline.py)


class TreeLink(Struct, frozen=True):
    """One stored tree of a chain (BlobStore.tree_chain)."""

    id: str
    data: bytes
    git: str | None


class WorkspaceWrite(Struct):
    """What a snapshot adds to a step's transaction: raw statements (binary, not run through
    `storable`) and the step row's columns (`tree_before` or `tree_id`)."""

    statements: list[Statement] = field(default_factory=list)
    columns: dict[str, Any] = field(default_factory=dict)
    note: str | None = None  # e.g. files over the size cap, for the step's output
    # Called once the step's transaction committed them (snapshot.committed: the next
    # snapshot of an unchanged workspace then asks the store nothing).
    committed: Callable[[], None] | None = None


def _insert_ignore(engine: Engine, table: Any) -> Any:
    # The dialect's own insert, imported for the store at hand only: a SQLite start does not
    # pay for the PostgreSQL dialect's import (~40 ms).
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table).on_conflict_do_nothing()
    from sqlalchemy.dialects import sqlite

    return sqlite.insert(table).on_conflict_do_nothing()


class BlobStore:
    """Reads of the content-addressed workspace store. Each read is retried on transient
    faults like every other store access (store/retrying.py): a dropped connection during
    a snapshot waits for the store, then stops the run with exit 7, never a traceback."""

    def __init__(
        self, engine: Engine, policy: retrying.StorePolicy | None = None, run_id: str | None = None
    ) -> None:
        self.engine, self.run_id = (
            engine,
            run_id,
        )  # run_id: named by a StoreUnavailable (resume hint)
        self.policy = policy or retrying.StorePolicy()
        # tree id -> its git baseline's repository, of the trees loaded that record one
        self._git_trees: dict[str, GitSource] = {}

    def add_git_source(self, tree: str, source: GitSource) -> None:
        """Where the `git:` content ids of a loaded tree are read."""
        self._git_trees[tree] = source

    def has_git_source(self, tree: str) -> bool:
        return tree in self._git_trees

    def _read(self, query: Callable[[Connection], T]) -> T:
        return _read(self.engine, query, self.policy, self.run_id)

    def present_blobs(self, hashes: Iterable[str]) -> set[str]:
        """The blobs a restore can read: stored (a sha256), or (a `git:` id) held by the git
        baseline of a loaded tree (its repository found first: GitBaselineUnreachable, one
        line, if none has it)."""
        wanted = list(hashes)
        found = self.stored_blobs([h for h in wanted if not h.startswith(GIT_REF)])
        rest = [h for h in wanted if h.startswith(GIT_REF)]
        for src in self._git_trees.values() if rest else ():
            src.open()
            found.update(h for h in rest if src.has(h[len(GIT_REF) :]))
        return found

    def stored_blobs(self, hashes: Iterable[str]) -> set[str]:
        """The blobs `workspace_blobs` holds (what a snapshot need not write again)."""
        wanted = list(hashes)
        return self._read(lambda conn: _blobs_among(conn, wanted))

    def stored(
        self, hashes: Iterable[str], trees: Iterable[str]
    ) -> tuple[set[str], dict[str, int]]:
        """Of `hashes`, the blobs stored; of `trees`, the stored ones and their depths. One
        read: a snapshot asks both at every step that changed a file, and each read is a
        connection's transaction of its own."""
        wanted, ids = list(hashes), [i for i in trees if i]
        return self._read(lambda conn: (_blobs_among(conn, wanted), _depths_among(conn, ids)))

    def blob_statement(self, contents: dict[str, bytes]) -> Statement:
        rows = [
            {"hash": h, "size": len(data), "data": zlib.compress(data, 6)}
            for h, data in contents.items()
        ]
        return (_insert_ignore(self.engine, workspace_blobs), rows)

    def tree_statement(self, row: TreeRow) -> Statement:
        return (
            _insert_ignore(self.engine, workspace_trees),
            [
                {
                    "id": row.id,
                    "base": row.base,
                    "depth": row.depth,
                    "entries": row.entries,
                    "data": row.data,
                    "git": row.git,
                }
            ],
        )

    def tree_chain(self, tree: str) -> list[TreeLink]:
        """The stored data of `tree` and its bases, the whole manifest first."""

        def query(conn: Connection) -> list[TreeLink]:
            chain: list[TreeLink] = []
            current: str | None = tree
            while current is not None:
                row = conn.execute(
                    select(
                        workspace_trees.c.base, workspace_trees.c.data, workspace_trees.c.git
                    ).where(workspace_trees.c.id == current)
                ).first()
                if row is None:
                    raise KeyError(f"workspace tree {current} is not in the store")
                chain.append(TreeLink(current, bytes(row.data), row.git))
                current = row.base
            chain.reverse()
            return chain

        return self._read(query)

    def blob(self, digest: str) -> bytes:
        """The bytes of a content id: a sha256 from `workspace_blobs`, a `git:` id from the
        repository of a loaded tree's git baseline."""
        if digest.startswith(GIT_REF):
            got = self._from_git(digest)
            if got is None:
                raise KeyError(f"workspace blob {digest} is in no git baseline loaded")
            return got
        data = self._read(
            lambda conn: conn.execute(
                select(workspace_blobs.c.data).where(workspace_blobs.c.hash == digest)
            ).scalar()
        )
        if data is None:
            raise KeyError(f"workspace blob {digest} is not in the store")
        return zlib.decompress(bytes(data))

    def blobs(self, digests: Sequence[str]) -> dict[str, bytes]:
        """The bytes of those of `digests` the store holds (sha256s), read 500 to a
        statement: a restore writes thousands of files, and a statement each was half of
        its time. A `git:` id, or one not stored, is not in the answer (`blob` says why)."""
        wanted = [d for d in digests if not d.startswith(GIT_REF)]

        def query(conn: Connection) -> list[tuple[str, bytes]]:
            rows: list[tuple[str, bytes]] = []
            for i in range(0, len(wanted), 500):
                found = conn.execute(
                    select(workspace_blobs.c.hash, workspace_blobs.c.data).where(
                        workspace_blobs.c.hash.in_(wanted[i : i + 500])
                    )
                )
                rows += [(digest, data) for digest, data in found]
            return rows

        return {digest: zlib.decompress(bytes(data)) for digest, data in self._read(query)}

    def _from_git(self, ref: str) -> bytes | None:
        for src in self._git_trees.values():
            data = src.read(ref[len(GIT_REF) :])  # None unless git's hash of it matches
            if data is not None:
                return data
        return None

    def tree_git(self, tree: str) -> str | None:
        """The git baseline recorded with a stored tree (None: its blobs are all stored)."""
        return self._read(
            lambda conn: conn.execute(
                select(workspace_trees.c.git).where(workspace_trees.c.id == tree)
            ).scalar()
        )


class TreeAt(Struct, frozen=True):
    tree: str
    seq: int  # the step whose snapshot it is
    after: bool  # the snapshot after that step (False: from before it, e.g. the run's start)


def tree_at(
    engine: Engine, run_id: str, seq: int | None = None, policy: retrying.StorePolicy | None = None
) -> TreeAt | None:
    """The workspace as it was after step `seq` (None: after the run's last snapshot).

    The last `tree_id` at or before `seq`; before any, the first recorded `tree_before`
    (the workspace as the run found it). An interrupted step (intent only) counts with
    its `tree_before` when it is the latest: the files were last seen there."""
    from durable_agent.store.schema import steps

    where = [steps.c.run_id == run_id]
    if seq is not None:
        where.append(steps.c.seq <= seq)
    return _read(engine, lambda conn: _tree_at(conn, run_id, where), policy, run_id)


def _tree_at(conn: Connection, run_id: str, where: list[Any]) -> TreeAt | None:
    from durable_agent.store.schema import steps

    row = conn.execute(
        select(steps.c.seq, steps.c.tree_id, steps.c.tree_before)
        .where(*where, (steps.c.tree_id.is_not(None)) | (steps.c.tree_before.is_not(None)))
        .order_by(steps.c.seq.desc())
        .limit(1)
    ).first()
    if row is not None:
        if row.tree_id is not None:
            return TreeAt(row.tree_id, row.seq, True)
        return TreeAt(row.tree_before, row.seq, False)
    first = conn.execute(
        select(steps.c.seq, steps.c.tree_before)
        .where(steps.c.run_id == run_id, steps.c.tree_before.is_not(None))
        .order_by(steps.c.seq)
        .limit(1)
    ).first()
    if first is not None:
        return TreeAt(first.tree_before, first.seq, False)
    start = conn.execute(select(runs.c.tree_start).where(runs.c.id == run_id)).scalar()
    return None if start is None else TreeAt(start, -1, False)  # as the run was created


def step_trees(engine: Engine, run_id: str, seq: int) -> tuple[str | None, str | None] | None:
    """(tree_before, tree_id) of one step, or None when there is no such step."""
    from durable_agent.store.schema import steps

    row = _read(
        engine,
        lambda conn: conn.execute(
            select(steps.c.tree_before, steps.c.tree_id).where(
                steps.c.run_id == run_id, steps.c.seq == seq
            )
        ).first(),
    )
    return None if row is None else (row.tree_before, row.tree_id)


def first_tree(engine: Engine, run_id: str) -> str | None:
    """The workspace as the run found it: its snapshot at creation, else its first `tree_before`."""
    start = _read(
        engine,
        lambda conn: conn.execute(select(runs.c.tree_start).where(runs.c.id == run_id)).scalar(),
    )
    if start is not None:
        return str(start)
    found = tree_at(engine, run_id, -1)
    return found.tree if found is not None else None


def changes_statement(rows: list[dict[str, Any]]) -> Statement:
    """The rows of `workspace_changes` (the `step_changes` view) a step's outcome commits:
    each with run_id, seq, path, change and bytes."""
    return (_CHANGES, rows)


def save_statements(
    engine: Engine, statements: list[Statement], policy: retrying.StorePolicy | None = None
) -> None:
    """A snapshot outside any run (a new run's first one; restore --force keeps what it
    overwrites): content addressed and immutable, so no lease is needed to write it, and
    a retry after a fault writes nothing twice."""

    def write() -> None:
        with engine.begin() as conn:
            for statement, params in statements:
                conn.execute(statement, params)

    retrying.run(write, policy or retrying.StorePolicy())


# Values a lookup of stored blobs or trees sends in one statement, the last repeated where
# there are fewer: statements of these widths are rendered once each (Prepared). A file
# tool's step asks of one blob and three trees, and Core's IN, compiled at each call, cost
# 0.3 ms of it warm and up to 1.5 ms cold (60 µs warm at 16; 64 values took 106 µs, and a
# start 5 M instructions more to render). A first snapshot asks of every blob it read
# (50,000: Core's IN of 500 took 130 ms on SQLite, about 1 s on PostgreSQL): 250 takes
# 92-103 ms and 0.7-0.8 s; 64 took 89 ms and 1.8-2.5 s (round trips), 500 148 ms and 0.5-0.7 s.
_NARROW, _WIDE = 16, 250


@functools.cache
def _lookup(table: str, width: int) -> Prepared:
    """The blobs' or the trees' lookup statement of `width` values, made at its first use
    (not at import: a start pays for what it runs)."""
    values: list[Any] = [bindparam(f"v{i}") for i in range(width)]
    if table == "blobs":
        return Prepared(select(workspace_blobs.c.hash).where(workspace_blobs.c.hash.in_(values)))
    return Prepared(
        select(workspace_trees.c.id, workspace_trees.c.depth).where(
            workspace_trees.c.id.in_(values)
        )
    )


def _among(conn: Connection, table: str, wanted: list[str]) -> list[Any]:
    rows: list[Any] = []
    width = _NARROW if len(wanted) <= _NARROW else _WIDE
    for i in range(0, len(wanted), width):
        chunk = wanted[i : i + width]
        values = {f"v{k}": chunk[min(k, len(chunk) - 1)] for k in range(width)}
        rows += fetch_all(conn, _lookup(table, width).run(conn, values))
    return rows


def _blobs_among(conn: Connection, wanted: list[str]) -> set[str]:
    return {row[0] for row in _among(conn, "blobs", wanted)}


def _depths_among(conn: Connection, wanted: list[str]) -> dict[str, int]:
    return {row[0]: int(row[1]) for row in _among(conn, "trees", wanted)}


def _read(
    engine: Engine,
    query: Callable[[Connection], T],
    policy: retrying.StorePolicy | None = None,
    run_id: str | None = None,
) -> T:
    return retrying.read(engine, query, policy or retrying.StorePolicy(), run_id=run_id)
