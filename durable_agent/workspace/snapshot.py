"""Taking a snapshot: scan, then the statements that store what the store lacks.

A blob is written when the store does not have it yet. The scanner remembers the contents
it read until a later snapshot finds them in the store (`pending`): a transaction that
failed after the scan must not leave a tree that names a blob nobody wrote (nor a
snapshot for another store than the last one's: it asks that store for them all). A tree is
written unless its id is already stored (an unchanged workspace writes nothing), as a
delta on the scanner's previous tree when that one is stored and the delta is small.

With `git` (the `snapshot_baseline = "git"` setting) in a git checkout, a file the
checkout's HEAD commit holds at its path is named by its git blob id (`git:`) and not
written: the tree records the commit (workspace/git_baseline.py) and a rebuild reads those
files from the repository. A whole manifest is then stored as what differs from the
commit's files (manifest.encode_head), and read back on the commit's listing. A fresh
scanner does not read the files whose lstat is what git's index recorded for them, as
`git status` does not.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Collection
from functools import partial
from typing import TYPE_CHECKING

from msgspec import Struct

from durable_agent.errors import StoreError
from durable_agent.store.blobs import (
    GIT_REF,
    MAX_DEPTH,
    BlobStore,
    Statement,
    TreeLink,
    TreeRow,
)
from durable_agent.workspace import git_baseline
from durable_agent.workspace.git_index import NO_SEEDS
from durable_agent.workspace.manifest import (
    Manifest,
    apply_stored,
    blob_refs,
    encode_delta,
    encode_full,
    encode_head,
    tree_id,
)
from durable_agent.workspace.scan import Scan, Scanner

if TYPE_CHECKING:
    from sqlalchemy import Engine  # (the store speaks SQL: this layer only holds its engine)


class Snapshot(Struct):
    tree_id: str
    manifest: Manifest
    statements: list[Statement]
    skipped: list[bytes]
    scan: Scan  # what changed since the scanner's previous scan (Scan.delta_from)
    written: list[str] = []  # the contents (sha256) its statements write


_pending: dict[int, dict[str, bytes]] = {}  # id(scanner) -> contents not yet seen stored
_last: dict[int, tuple[str, Manifest]] = {}  # id(scanner) -> its previous snapshot
# id(scanner) -> its last tree stored whole (depth 0): where a chain MAX_DEPTH deltas deep
# goes on from, with the changes since (a whole manifest every MAX_DEPTH changed steps was
# 1.5 MB and 110 ms at 50,000 files: 2 ms a step, and 30 KB, on average)
_whole: dict[int, tuple[str, Manifest]] = {}


# store -> tree ids seen stored (trees are immutable). By the store's engine, not its URL:
# the same URL text may name another store later in the process (a file deleted and made
# anew at its path, a schema made again, a relative path after a chdir), whose trees a
# snapshot that returns early would name unwritten. A new engine asks the store once.
_stored: weakref.WeakKeyDictionary[Engine, set[str]] = weakref.WeakKeyDictionary()
# id(scanner) -> the engine of the store its last snapshot was taken for: `_pending` lets go
# of the contents one store holds, which another store may lack (_held_by).
_store_of: dict[int, weakref.ref[Engine]] = {}


def take(
    scanner: Scanner,
    blobs: BlobStore,
    paths: Collection[bytes] | None = None,
    *,
    git: bool = False,
) -> Snapshot:
    """`paths`: only these changed since the scanner's previous scan (Scanner.scan). `git`:
    leave to the checkout's HEAD commit the files it holds (git_baseline.py)."""
    if not git:
        scanner.drop_git()  # its tree names no commit: every file in the store
    head = use_git(scanner) if git else None
    scan = scanner.scan(paths)
    if not _held_by(scanner, blobs, scan):
        scanner.forget()  # read every file again: its contents go to this store too
        scan = scanner.scan()
    manifest = scan.manifest
    with scanner.lock:
        # What this scan read, and any plain scan since the last snapshot (a resume's drift
        # check): a file read there is not read again here, yet its bytes must be stored.
        pending = _pending.setdefault(id(scanner), {})
        pending.update(scanner.unsaved)
        scanner.unsaved.clear()
        last = _last.get(id(scanner))
        whole = _whole.get(id(scanner))
        stored = _stored.setdefault(blobs.engine, set())
        if last is not None and last[0] == scan.tree_id and last[0] in stored and not pending:
            # Unchanged since a snapshot the store has: nothing to hash, query or write.
            return Snapshot(last[0], manifest, [], scan.skipped, scan)
    tid = scan.tree_id
    with scanner.lock:
        check = set(pending)
    trees = [tid, last[0] if last else "", whole[0] if whole else ""]
    present, depths = blobs.stored(check, trees)
    statements: list[Statement] = []
    with scanner.lock:
        for digest in present:
            pending.pop(digest, None)
        if any(h not in scan.contents for h in pending):  # left from a failed transaction
            refs = blob_refs(manifest.values())
            for digest in [h for h in pending if h not in refs]:
                del pending[digest]  # no longer in the workspace: nothing will name it
        missing = dict(pending)
    if missing:
        statements.append(blobs.blob_statement(missing))
    with scanner.lock:
        stored.update(depths)
    if depths.get(tid) == 0:
        whole = (tid, manifest)  # (stored whole before: a new process's first snapshot)
    elif tid not in depths:
        row = None
        if last is not None and depths.get(last[0], MAX_DEPTH) < MAX_DEPTH:
            data, size = encode_delta(last[1], manifest, scan.delta_from(last[1]))
            if size * 4 <= len(manifest) + 4:  # small change: a delta; else a new full manifest
                row = TreeRow(tid, last[0], depths[last[0]] + 1, len(manifest), data)
        elif whole is not None and depths.get(whole[0]) == 0:
            # The chain is MAX_DEPTH deep (or its last tree was never stored): the changes
            # since the last whole manifest, on it. Every entry is compared (most are the
            # same objects: `is` settles them), a few ms at 50,000 files.
            data, size = encode_delta(whole[1], manifest)
            if size * 4 <= len(manifest) + 4:
                row = TreeRow(tid, whole[0], 1, len(manifest), data)
        if row is None:
            # In a checkout with a commit: what differs from the commit's files (a clean
            # checkout's is a few bytes). Not of a folder the commit lacks: its listing
            # would fail where the repository is there.
            if head is not None and head.files:
                data = encode_head(manifest, head.files)
            else:
                data = encode_full(manifest)
            row = TreeRow(tid, None, 0, len(manifest), data)
            whole = (tid, manifest)
        if head is not None:
            row = TreeRow(
                row.id, row.base, row.depth, row.entries, row.data, head.baseline.encoded()
            )
        statements.append(blobs.tree_statement(row))
        # What the row says: a later load need not ask (one query a step).
        _note_git((str(blobs.engine.url), tid), head.baseline if head is not None else None)
    with scanner.lock:
        _last[id(scanner)] = (tid, manifest)
        if whole is not None:
            _whole[id(scanner)] = whole
    return Snapshot(tid, manifest, statements, scan.skipped, scan, list(missing))


def committed(scanner: Scanner, blobs: BlobStore, snap: Snapshot) -> None:
    """`snap`'s statements were committed: its tree and the contents it wrote are in the
    store. The next snapshot of a workspace unchanged since then (a file tool's before, after
    the last step's after) asks the store nothing (trees and blobs are never deleted)."""
    if not snap.statements:
        return
    with scanner.lock:
        pending = _pending.get(id(scanner), {})
        for digest in snap.written:
            pending.pop(digest, None)
        _stored.setdefault(blobs.engine, set()).add(snap.tree_id)


def _held_by(scanner: Scanner, blobs: BlobStore, scan: Scan) -> bool:
    """False where `scan`'s files name contents the store of `blobs` lacks and no one holds
    their bytes to write: the scanner's previous snapshots were taken for another store,
    which was written them (and `_pending` let go of them once it held them). Asked once
    each time a scanner's snapshots go to another store than its last one's."""
    with scanner.lock:
        known = _store_of.get(id(scanner))
        if known is None:  # its first: no snapshot let go of a content yet (nothing to ask)
            _store_of[id(scanner)] = weakref.ref(blobs.engine)
            return True
        if known() is blobs.engine:
            return True
        held = set(_pending.get(id(scanner), {})).union(scanner.unsaved)
    refs = [
        h for h in blob_refs(scan.manifest.values()) if h not in held and not h.startswith(GIT_REF)
    ]
    found = not refs or len(blobs.stored_blobs(refs)) == len(refs)  # (a fault: asked again)
    with scanner.lock:
        _store_of[id(scanner)] = weakref.ref(blobs.engine)
    return found


_trees: OrderedDict[str, Manifest] = OrderedDict()
_trees_lock = threading.Lock()


def use_git(scanner: Scanner) -> git_baseline.Head | None:
    """Let `scanner` take content ids from the checkout's HEAD commit, and give its Head
    (None: not in a checkout with a commit). A fresh scanner's first scan takes the files
    git's index vouches for unread (git_baseline.head_and_seeds)."""
    if scanner.fresh:
        head, seeds = git_baseline.head_and_seeds(scanner.root)
    else:
        head, seeds = git_baseline.head_of(scanner.root), NO_SEEDS
    if head is not None:
        scanner.use_git(head.files, seeds, head.baseline.format)
    return head


def remember(tid: str, manifest: Manifest) -> None:
    with _trees_lock:
        _trees[tid] = manifest
        _trees.move_to_end(tid)
        while len(_trees) > 16:
            _trees.popitem(last=False)


def load(blobs: BlobStore, tid: str) -> Manifest:
    """The manifest of a stored tree (trees are immutable: a small cache keeps recent ones).
    A tree that records a git baseline tells `blobs` where its unstored files are."""
    with _trees_lock:
        cached = _trees.get(tid)
    if cached is not None:
        _add_git(blobs, tid, cached)
        return cached
    manifest = _load(blobs, tid)
    _add_git(blobs, tid, manifest)
    return manifest


def _add_git(blobs: BlobStore, tid: str, manifest: Manifest) -> None:
    key = (str(blobs.engine.url), tid)
    with _trees_lock:
        known = _git_of.get(key, False)
    if known is False:
        known = git_baseline.decoded(blobs.tree_git(tid))
        _note_git(key, known)
    if not isinstance(known, git_baseline.Baseline) or blobs.has_git_source(tid):
        return
    blobs.add_git_source(tid, git_baseline.source(known))


# (store URL, tree id) -> the tree's git baseline, None without one (trees are immutable)
_git_of: dict[tuple[str, str], git_baseline.Baseline | None | bool] = {}


def _note_git(key: tuple[str, str], baseline: git_baseline.Baseline | None) -> None:
    with _trees_lock:
        _git_of[key] = baseline
        while len(_git_of) > 4096:  # the oldest first (a worker runs for weeks)
            del _git_of[next(iter(_git_of))]


def _load(blobs: BlobStore, tid: str) -> Manifest:
    manifest: Manifest | None = None
    chain = blobs.tree_chain(tid)
    try:
        for link in chain:
            asked: list[str] = []
            manifest = apply_stored(manifest, link.data, partial(_commit_files, link, asked))
            if asked and tree_id(manifest) != link.id:
                # Stored as the differences from a commit, which lists other files than the
                # snapshot saw: never a wrong workspace in its place.
                raise ValueError(f"the files of git commit {asked[0][:12]} are not its own")
    except ValueError as exc:  # edited by hand: one line, not a traceback
        raise StoreError(f"workspace snapshot {tid} is damaged in the store: {exc}") from None
    assert manifest is not None
    remember(tid, manifest)
    return manifest


def _commit_files(link: TreeLink, asked: list[str]) -> dict[bytes, str]:
    """The regular files of the commit a tree stored as differences from it records."""
    baseline = git_baseline.decoded(link.git)
    if baseline is None:
        raise ValueError("a tree stored as the differences from a git commit names none")
    asked.append(baseline.commit)
    return git_baseline.source(baseline).files()
