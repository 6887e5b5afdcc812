"""Writing a manifest into a directory: `restore`, `fork`, and a rebuilt workspace on resume.

The directory ends up with exactly the manifest's files, links and empty directories
(bytes, permission bits, link targets), and without the paths the manifest lacks, except
what snapshots leave out: excluded and .gitignored paths (a `.git` directory among them),
files over the size cap and files that held a secret (workspace/secrets.py: what is on disk
at such a path, in the target or now, stays as it is) are never written nor deleted. A path
under a symlink is never written through it: the link is replaced by a real directory
first, so nothing outside the directory can be reached. Every entry of the target is
checked first (validation.py): a manifest edited in the store is refused before anything
is touched. Every operation is relative to a folder fd opened beneath the directory's fd
with no link followed (tools/beneath.py): a folder swapped for a link to outside while the
restore runs stops it, it is never written, read or removed through.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from durable_agent.errors import DurableAgentError, UsageError
from durable_agent.tools import beneath
from durable_agent.tools.tree import walk
from durable_agent.workspace import git_baseline, progress
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
Fetch = Callable[[Sequence[str]], dict[str, bytes]]  # content ids -> the bytes of those found


class RestoreStopped(DurableAgentError):
    """Making the target stopped partway: "stopped at PATH: why" (a full disk, a folder the
    harness may not write) or "stopped: why" (a blob the store lacks)."""


@contextlib.contextmanager
def _at(broot: bytes, rel: bytes) -> Iterator[None]:
    """An OSError of an fd-relative call names the whole path (RestoreStopped says where)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None or not os.fsencode(exc.filename).startswith(b"/"):
            raise OSError(exc.errno, exc.strerror, os.path.join(broot, rel)) from None
        raise


def _remove(root_fd: int, rel: bytes) -> None:
    try:
        with beneath.parent_of(root_fd, rel) as (fd, name):
            beneath.remove_at(fd, name)
    except FileNotFoundError:
        return


def _kind(dir_fd: int, name: str) -> int | None:
    """The lstat mode of `name` in the folder `dir_fd` holds; None if there is nothing."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _parent_dirs(root_fd: int, rel: bytes) -> Iterator[tuple[int, str]]:
    """Make every directory above `rel` a real directory (not a file, not a link); yields
    the fd of the last one (opened with no link followed) and the name of `rel` in it."""
    parts = os.fsdecode(rel).split("/")
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            mode = _kind(fd, part)
            if mode is not None and not stat.S_ISDIR(mode):
                os.unlink(part, dir_fd=fd)
                mode = None
            if mode is None:
                os.mkdir(part, dir_fd=fd)
            below = beneath.open_at(fd, part, os.O_RDONLY | os.O_DIRECTORY)
            os.close(fd)
            fd = below
        yield fd, parts[-1]
    finally:
        os.close(fd)


def _write(
    root_fd: int, rel: bytes, entry: Entry, have: Entry | None, blob: Callable[[str], bytes]
) -> None:
    with _parent_dirs(root_fd, rel) as (dir_fd, name):
        _write_in(dir_fd, name, entry, have, blob)


def _write_in(
    dir_fd: int, name: str, entry: Entry, have: Entry | None, blob: Callable[[str], bytes]
) -> None:
    same = _same_but_mode(entry, have)
    mode = _kind(dir_fd, name)
    if same and entry.kind != LINK and mode is not None and not stat.S_ISLNK(mode):
        beneath.chmod_at(dir_fd, name, entry.mode)  # the permission bits alone differ
        return
    if entry.kind == DIR:
        if mode is None or not stat.S_ISDIR(mode):
            beneath.remove_at(dir_fd, name)
            os.mkdir(name, dir_fd=dir_fd)
        beneath.chmod_at(dir_fd, name, entry.mode)
        return
    beneath.remove_at(dir_fd, name)
    if entry.kind == LINK:
        os.symlink(os.fsdecode(entry.target), name, dir_fd=dir_fd)
        return
    # A fresh name made with O_EXCL | O_NOFOLLOW, never a fixed one: a link the workspace
    # holds under a fixed name would have taken the bytes and the mode outside.
    tmp = beneath.temp_name("durable-agent-restore", ".")
    fd = beneath.create_exclusive(dir_fd, tmp, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob(entry.ref))
            os.fchmod(f.fileno(), entry.mode)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def _rmdir(root_fd: int, rel: bytes) -> None:
    with beneath.parent_of(root_fd, rel) as (fd, name):
        os.rmdir(name, dir_fd=fd)


def _in_the_way(
    root_fd: int, broot: bytes, target: Manifest, current: Manifest, held: set[bytes]
) -> bytes | None:
    """The first path that making `target` would destroy though snapshots leave it out
    (ignored, excluded like a `.git` folder, over the size cap): no undo could bring it back.
    A folder that a target file replaces must hold nothing but what `current` has."""

    def covered(rel: bytes) -> bool:
        have = current.get(rel)
        return have is not None and have.kind not in KEPT

    def lstat(rel: bytes) -> os.stat_result:
        with beneath.parent_of(root_fd, rel) as (fd, name):
            return os.stat(name, dir_fd=fd, follow_symlinks=False)

    def same(rel: bytes, st: os.stat_result, entry: Entry) -> bool:
        """Already what the target holds (a .gitignore changed since): nothing to lose."""
        if entry.kind == LINK:
            if not stat.S_ISLNK(st.st_mode):
                return False
            with beneath.parent_of(root_fd, rel) as (fd, name):
                return os.readlink(name, dir_fd=fd) == os.fsdecode(entry.target)
        if entry.kind != FILE or not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
            return False
        flags = os.O_RDONLY | os.O_NONBLOCK
        blob = git_baseline.blob_id_of(entry.ref)
        with os.fdopen(beneath.open_at(root_fd, rel, flags), "rb") as f:
            if blob is not None:  # a `git:` content id: git's hash of the bytes
                data = f.read(entry.size + 1)
                return git_baseline.git_blob_id(data, git_baseline.ref_format(entry.ref)) == blob
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
                st = lstat(parent)
            except (FileNotFoundError, NotADirectoryError, beneath.Escaped):
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
            st = lstat(rel)
        except (FileNotFoundError, NotADirectoryError, beneath.Escaped):
            continue
        if stat.S_ISDIR(st.st_mode):
            if entry.kind == DIR:
                continue
            # What would be left for rmtree, each folder opened beneath the root's fd.
            for dirpath, _dirs, files, links in walk(os.fsdecode(path), beneath=os.fsdecode(broot)):
                for name in files + sorted(links):  # (links: listed with dirs, not followed)
                    inner = os.fsencode(beneath.relative_to(broot, os.path.join(dirpath, name)))
                    if not covered(inner):
                        return inner
        elif (
            (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode))
            and not covered(rel)
            and not same(rel, st, entry)
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
    fetch: Fetch | None = None,
) -> list[Change]:
    """Make `root` hold `target`; returns what was changed. `scanner` must be `root`'s;
    `present` (BlobStore.present_blobs) tells which blobs the store has, `fetch`
    (BlobStore.blobs) gives many at once (`blob` gives one, and those `fetch` does not).
    Raises StoreError for a target entry no scan records, and UsageError when making it
    would destroy what snapshots leave out (`_in_the_way`), both having changed nothing;
    RestoreStopped when it stops partway. `held` receives the paths left as they are because
    they held a secret (in the target or on disk) where the target and the disk differ."""
    # Before the disk is touched: a row edited by hand must not write outside `root`, nor
    # set a set-uid bit, nor delete what it cannot write back.
    check_manifest(target, scanner, present, blob)
    broot = os.fsencode(str(root))
    try:
        os.makedirs(broot, exist_ok=True)
        with beneath.root(broot) as root_fd:
            return _materialize(target, root, broot, root_fd, scanner, blob, held, fetch)
    except OSError as exc:
        where = os.fsdecode(exc.filename) if exc.filename else str(root)
        raise RestoreStopped(f"stopped at {where}: {exc.strerror or exc}") from None
    except KeyError as exc:  # a store written by hand, or by a version that lost a blob
        raise RestoreStopped(f"stopped: {exc.args[0] if exc.args else exc}") from None


CHUNK_FILES, CHUNK_BYTES = 500, 16 << 20  # a restore's contents read at a time, at most


def _chunks(paths: list[bytes], target: Manifest) -> Iterator[list[bytes]]:
    """`paths` in order, in runs of at most CHUNK_FILES whose files' sizes add up to at
    most CHUNK_BYTES (or one file, if bigger): what is read ahead of the writes at once."""
    chunk: list[bytes] = []
    size = 0
    for rel in paths:
        size += target[rel].size
        if chunk and (len(chunk) == CHUNK_FILES or size > CHUNK_BYTES):
            yield chunk
            chunk, size = [], target[rel].size
        chunk.append(rel)
    if chunk:
        yield chunk


def _same_but_mode(entry: Entry, have: Entry | None) -> bool:
    """`have` is `entry` but perhaps for its mode: writing it is a chmod (_write_in)."""
    return have is not None and (have.kind, have.ref, have.target, have.size) == (
        entry.kind,
        entry.ref,
        entry.target,
        entry.size,
    )


def _needs_bytes(entry: Entry, have: Entry | None) -> bool:
    """Writing `entry` over `have` reads its content."""
    return entry.kind == FILE and not _same_but_mode(entry, have)


def _differ(a: Entry | None, b: Entry | None) -> bool:
    return a is None or b is None or not same_content(a, b) or a.mode != b.mode


def _materialize(
    target: Manifest,
    root: Path,
    broot: bytes,
    root_fd: int,
    scanner: Scanner,
    blob: Callable[[str], bytes],
    left: list[bytes] | None,
    fetch: Fetch | None,
) -> list[Change]:
    current = scanner.scan().manifest
    # A path that held a secret, in the target or on disk now: its bytes are in no snapshot,
    # so neither what the target recorded nor what is there now could be brought back.
    held = {p for p, e in target.items() if e.kind == SECRET}
    held |= {p for p, e in current.items() if e.kind == SECRET}
    with _at(broot, b""):
        blocking = _in_the_way(root_fd, broot, target, current, held)
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
                _rmdir(root_fd, rel)
            continue
        with _at(broot, rel):
            _remove(root_fd, rel)
        parent = os.path.dirname(rel)
        while parent and parent not in wanted_dirs:  # directories left empty by the deletions
            with contextlib.suppress(OSError):
                _rmdir(root_fd, parent)
            parent = os.path.dirname(parent)
    todo = [
        rel
        for rel in sorted(target)
        if target[rel].kind in (FILE, LINK, DIR)
        and current.get(rel) != target[rel]
        and rel not in held
    ]
    with progress.working("restoring the workspace", progress.WRITTEN, len(todo)):
        for chunk in _chunks(todo, target):
            # The chunk's stored contents in one read (500 to a statement), not one each.
            wanted = [target[r].ref for r in chunk if _needs_bytes(target[r], current.get(r))]
            read = fetch(wanted) if fetch is not None and wanted else {}

            def content(ref: str, read: dict[str, bytes] = read) -> bytes:
                found = read.get(ref)
                return found if found is not None else blob(ref)

            for rel in chunk:
                with _at(broot, rel):
                    _write(root_fd, rel, target[rel], current.get(rel), content)
            progress.advanced(len(chunk), progress.WRITTEN)
    # Our writes happened within the racy window: hash them again next time. What is below a
    # folder the harness may not list is kept as this manifest has it.
    scanner.forget(seen=target)
    if left is not None:
        left += sorted(p for p in held if _differ(current.get(p), target.get(p)))
    return [c for c in changes(current, target) if c.path not in held]
