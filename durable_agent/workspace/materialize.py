"""Writing a manifest into a directory: `restore`, `fork`, and a rebuilt workspace on resume.

The directory ends up with exactly the manifest's files, links and empty directories
(bytes, permission bits, link targets), and without the paths the manifest lacks, except
what snapshots leave out: excluded and .gitignored paths (a `.git` directory among them),
files over the size cap and files that held a secret (workspace/secrets.py: what is on disk
at such a path, in the target or now, stays as it is) are never written nor deleted. A path
under a symlink is never written through it: the link is replaced by a real directory
first, so nothing outside the directory can be reached. Every entry of the target is
checked first (validation.py): a manifest edited in the store is refused before anything
is touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from durable_agent.errors import DurableAgentError, UsageError
from durable_agent.workspace.manifest import (
    BIG,
    DIR,
    FILE,
    LINK,
    SECRET,
    Change,
    Entry,
    Manifest,
    changes,
    same_content,
)
from durable_agent.workspace.scan import Scanner
from durable_agent.workspace.validation import Present, check_manifest

KEPT = (BIG, SECRET)  # never stored: what is on disk at their paths is left as it is


class RestoreStopped(DurableAgentError):
    """Making the target stopped partway: "stopped at PATH: why" (a full disk, a folder the
    harness may not write) or "stopped: why" (a blob the store lacks)."""


def _remove(path: bytes) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _parent_dirs(root: bytes, rel: bytes) -> None:
    """Make every directory above `rel` a real directory (not a file, not a link)."""
    current = root
    for part in rel.split(b"/")[:-1]:
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            os.mkdir(current)
            continue
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(current)
            os.mkdir(current)


def _write(
    root: bytes, rel: bytes, entry: Entry, have: Entry | None, blob: Callable[[str], bytes]
) -> None:
    path = os.path.join(root, rel)
    _parent_dirs(root, rel)
    same = have is not None and (have.kind, have.ref, have.target, have.size) == (
        entry.kind,
        entry.ref,
        entry.target,
        entry.size,
    )
    if same and entry.kind != LINK and not os.path.islink(path):
        os.chmod(path, entry.mode)  # the permission bits alone differ
        return
    if entry.kind == DIR:
        if not os.path.isdir(path) or os.path.islink(path):
            _remove(path)
            os.mkdir(path)
        os.chmod(path, entry.mode)
        return
    _remove(path)
    if entry.kind == LINK:
        os.symlink(entry.target, path)
        return
    # A fresh name made with O_EXCL | O_NOFOLLOW (mkstemp), never a fixed one: a link the
    # workspace holds under a fixed name would have taken the bytes and the mode outside.
    fd, tmp = tempfile.mkstemp(prefix=b".durable-agent-restore.", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob(entry.ref))
            os.fchmod(f.fileno(), entry.mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _in_the_way(
    broot: bytes, target: Manifest, current: Manifest, held: set[bytes]
) -> bytes | None:
    """The first path that making `target` would destroy though snapshots leave it out
    (ignored, excluded like a `.git` folder, over the size cap): no undo could bring it back.
    A folder that a target file replaces must hold nothing but what `current` has."""

    def covered(rel: bytes) -> bool:
        have = current.get(rel)
        return have is not None and have.kind not in KEPT

    def same(path: bytes, st: os.stat_result, entry: Entry) -> bool:
        """Already what the target holds (a .gitignore changed since): nothing to lose."""
        if entry.kind == LINK:
            return stat.S_ISLNK(st.st_mode) and os.readlink(path) == entry.target
        if entry.kind != FILE or not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
            return False
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest() == entry.ref

    folders: set[bytes] = set()  # parents already seen to be folders
    for rel, entry in target.items():
        if entry.kind == SECRET or rel in held:  # not written: nothing of it is in the way
            continue
        parts = rel.split(b"/")
        below_a_file = False  # then nothing is at `rel` itself (a link there is not followed)
        for i in range(1, len(parts)):  # a file or link where the target needs a folder
            parent = b"/".join(parts[:i])
            if parent in folders:
                continue
            try:
                st = os.lstat(os.path.join(broot, parent))
            except (FileNotFoundError, NotADirectoryError):
                below_a_file = True
                break
            if not stat.S_ISDIR(st.st_mode):
                if not covered(parent) and (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    return parent
                below_a_file = True
                break
            folders.add(parent)
        if below_a_file or entry.kind == BIG or current.get(rel) == entry:
            continue
        path = os.path.join(broot, rel)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISDIR(st.st_mode):
            if entry.kind == DIR:
                continue
            for dirpath, dirs, files in os.walk(path):  # what would be left for rmtree
                links = [
                    d for d in dirs if os.path.islink(os.path.join(dirpath, d))
                ]  # (not followed)
                for name in files + links:
                    inner = os.path.relpath(os.path.join(dirpath, name), broot)
                    if not covered(inner):
                        return inner
        elif (
            (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode))
            and not covered(rel)
            and not same(path, st, entry)
        ):  # (a FIFO or a socket holds nothing to lose)
            return rel
    return None


def materialize(
    target: Manifest,
    root: Path,
    scanner: Scanner,
    blob: Callable[[str], bytes],
    *,
    present: Present | None = None,
    held: list[bytes] | None = None,
) -> list[Change]:
    """Make `root` hold `target`; returns what was changed. `scanner` must be `root`'s;
    `present` (BlobStore.present_blobs) tells which blobs the store has. Raises StoreError
    for a target entry no scan records, and UsageError when making it would destroy what
    snapshots leave out (`_in_the_way`), both having changed nothing; RestoreStopped when
    it stops partway. `held` receives the paths left as they are because they held a
    secret (in the target or on disk) where the target and the disk differ."""
    # Before the disk is touched: a row edited by hand must not write outside `root`, nor
    # set a set-uid bit, nor delete what it cannot write back.
    check_manifest(target, scanner, present, blob)
    broot = os.fsencode(str(root))
    try:
        os.makedirs(broot, exist_ok=True)
        return _materialize(target, root, broot, scanner, blob, held)
    except OSError as exc:
        where = os.fsdecode(exc.filename) if exc.filename else str(root)
        raise RestoreStopped(f"stopped at {where}: {exc.strerror or exc}") from None
    except KeyError as exc:  # a store written by hand, or by a version that lost a blob
        raise RestoreStopped(f"stopped: {exc.args[0] if exc.args else exc}") from None


def _differ(a: Entry | None, b: Entry | None) -> bool:
    return a is None or b is None or not same_content(a, b) or a.mode != b.mode


def _materialize(
    target: Manifest,
    root: Path,
    broot: bytes,
    scanner: Scanner,
    blob: Callable[[str], bytes],
    left: list[bytes] | None,
) -> list[Change]:
    current = scanner.scan().manifest
    # A path that held a secret, in the target or on disk now: its bytes are in no snapshot,
    # so neither what the target recorded nor what is there now could be brought back.
    held = {p for p, e in target.items() if e.kind == SECRET}
    held |= {p for p, e in current.items() if e.kind == SECRET}
    blocking = _in_the_way(broot, target, current, held)
    if blocking is not None:
        shown = Change(blocking, "deleted", 0).shown
        raise UsageError(
            f"restoring {root} would destroy {shown}, which snapshots leave out (ignored, "
            "excluded or over the size cap), so no undo could bring it back: move it out "
            "of the way first (nothing was changed)"
        )
    wanted_dirs = {
        b"/".join(p.split(b"/")[:i]) for p in target for i in range(1, p.count(b"/") + 1)
    }
    wanted_dirs |= {p for p, e in target.items() if e.kind == DIR}
    for rel in sorted(current, reverse=True):  # deepest first
        old = current[rel]
        if old.kind in KEPT or rel in target:
            continue
        if old.kind == DIR and rel in wanted_dirs:
            continue
        if old.kind == DIR:  # empty as far as snapshots see: what is in it is ignored, and stays
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(broot, rel))
            continue
        _remove(os.path.join(broot, rel))
        parent = os.path.dirname(rel)
        while parent and parent not in wanted_dirs:  # directories left empty by the deletions
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(broot, parent))
            parent = os.path.dirname(parent)
    for rel in sorted(target):
        entry = target[rel]
        have = current.get(rel)
        if entry.kind in KEPT or have == entry or rel in held:
            continue
        if entry.kind in (FILE, LINK, DIR):
            _write(broot, rel, entry, have, blob)
    # Our writes happened within the racy window: hash them again next time. What is below a
    # folder the harness may not list is kept as this manifest has it.
    scanner.forget(seen=target)
    if left is not None:
        left += sorted(p for p in held if _differ(current.get(p), target.get(p)))
    return [c for c in changes(current, target) if c.path not in held]
