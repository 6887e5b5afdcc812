"""git's index file, read without running git: which files git tracks, and what it last saw
of each (index_files).

The `exclude` setting's default leaves out the folders tools generate (`venv/`,
`node_modules/`, `__pycache__/`…), but a file git tracks in one is the user's and stays in
the snapshots. git is not run to ask (scan.py never runs it: a planted `core.fsmonitor`
would run a command of the workspace's choosing, and the user's index must not change):
the index is parsed here, versions 2 to 4, SHA-1 and SHA-256 repositories, only far enough
to list paths. An index that cannot be read lists nothing: those folders are left out, as
an untracked one is.

With `snapshot_baseline = "git"`, a fresh scanner takes the blob id of a tracked file whose
lstat is the one git's index recorded for it, as `git status` does, without reading it
(index_files: the stat cache seeded from git's index).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import struct
import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from msgspec import Struct, field

MAX_INDEX_BYTES = 256 << 20  # far above the index of any repository a run works in
# A file git's index recorded within this much before the index was written is racy: a
# coarse file system clock may not have ticked since (index_files). So is one recorded in
# the second the index was written in, as git (built without USE_NSEC, its default) has
# it: a work tree on a file system that keeps whole seconds (ext3, 128-byte-inode ext4,
# some network ones) with its git folder on one that keeps nanoseconds (a worktree, a
# `--separate-git-dir`) records a file changed in that second as it was.
VOUCH_MARGIN_NS = 100_000_000
_SECOND = 1_000_000_000
_SHA256 = re.compile(rb"objectformat\s*=\s*sha256", re.IGNORECASE)


class Tracked:
    """Tracked files and the folders above them, relative to a workspace (bytes, `/`)."""

    def __init__(self, files: frozenset[bytes] = frozenset()) -> None:
        self.files = files
        self.dirs = frozenset(
            path[:i] for path in files for i in range(len(path)) if path[i : i + 1] == b"/"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tracked) and other.files == self.files

    def __hash__(self) -> int:
        return hash(self.files)


def find_index(root: bytes) -> tuple[bytes, bytes] | None:
    """(the index, the workspace's path in the repository: b"" at its top) of the repository
    `root` lies in (root itself or a folder above it), with `.git` a folder or a `gitdir:`
    file (worktrees, submodules); None outside any."""
    here = os.path.realpath(root)
    start = here
    while True:
        dot_git = os.path.join(here, b".git")
        try:
            st = os.stat(dot_git)
        except OSError:
            st = None
        index = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            index = os.path.join(dot_git, b"index")
        elif st is not None and stat.S_ISREG(st.st_mode):
            try:
                with open(dot_git, "rb") as f:
                    line = f.read(4096).split(b"\n", 1)[0]
            except OSError:
                return None
            if not line.startswith(b"gitdir:"):
                return None
            index = os.path.join(here, line.removeprefix(b"gitdir:").strip(), b"index")
        if index is not None:
            prefix = os.path.relpath(start, here)
            return index, b"" if prefix == b"." else prefix
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def sha256_repository(gitdir: bytes) -> bool:
    """Whether the repository names objects by SHA-256 (a worktree's config is the common one)."""
    dirs = [gitdir]
    try:
        with open(os.path.join(gitdir, b"commondir"), "rb") as f:
            dirs.append(os.path.join(gitdir, f.read(4096).strip()))
    except OSError:
        pass
    for d in dirs:
        try:
            with open(os.path.join(d, b"config"), "rb") as f:
                if _SHA256.search(f.read(1 << 20)):
                    return True
        except OSError:
            continue
    return False


def tracked_files(index: bytes, prefix: bytes, wanted: frozenset[bytes]) -> Tracked:
    """The tracked paths below `prefix` (the workspace's path in the repository, b"" at its
    root), relative to it, that pass through a folder named in `wanted`."""
    try:
        with open(index, "rb") as f:
            data = f.read(MAX_INDEX_BYTES + 1)
    except OSError:
        return Tracked()
    if len(data) > MAX_INDEX_BYTES:
        return Tracked()
    if data[4:8] in (b"\0\0\0\2", b"\0\0\0\3") and not any(name + b"/" in data for name in wanted):
        # Versions 2 and 3 hold each path whole: no `NAME/` of a wanted folder anywhere in the
        # file, no tracked path goes through one. Parsing 50,000 entries in Python to learn
        # that took as long as a third of `git status`.
        return Tracked()
    try:
        paths = _paths(data, 32 if sha256_repository(os.path.dirname(index)) else 20)
    except (struct.error, ValueError, IndexError):
        return Tracked()
    lead = prefix + b"/" if prefix else b""
    found = set()
    for path in paths:
        if not path.startswith(lead):
            continue
        rel = path[len(lead) :].rstrip(b"/")  # a sparse index lists a folder as `dir/`
        if not wanted.isdisjoint(rel.split(b"/")[:-1]):
            found.add(rel)
    return Tracked(frozenset(found))


def _paths(data: bytes, hash_size: int) -> list[bytes]:
    return [entry[0] for entry in _entries(data, hash_size)[0]]


# An entry: its path, where it starts, its flags and extended flags.
_Entry = tuple[bytes, int, int, int]
_FLAGS = struct.Struct(">H")
_STAGE = 0x3000
_ASSUME_VALID, _EXTENDED = 0x8000, 0x4000
_SKIP_WORKTREE, _INTENT_TO_ADD = 0x4000, 0x2000  # (of the extended flags)


def _entries(data: bytes, hash_size: int) -> tuple[list[_Entry], int]:
    """The index's entries, and where its extensions start."""
    signature, version, count = struct.unpack_from(">4sII", data, 0)
    if signature != b"DIRC" or version not in (2, 3, 4):
        raise ValueError("not a git index of version 2, 3 or 4")
    fixed = 40 + hash_size  # ctime, mtime, dev, ino, mode, uid, gid, size; the object id
    pos, previous, entries = 12, b"", []
    for _ in range(count):
        (flags,) = _FLAGS.unpack_from(data, pos + fixed)
        extended = 0
        name_at = pos + fixed + 2
        if flags & _EXTENDED:
            if version < 3:
                raise ValueError("extended flags in a version 2 index")
            (extended,) = _FLAGS.unpack_from(data, name_at)
            name_at += 2
        start = pos
        if version == 4:  # the name is the previous one, less N bytes, plus a suffix
            strip, name_at = _varint(data, name_at)
            end = data.index(b"\0", name_at)
            if strip > len(previous):
                raise ValueError("a prefix longer than the previous name")
            path = previous[: len(previous) - strip] + data[name_at:end]
            pos = end + 1
        else:
            end = data.index(b"\0", name_at)
            path = data[name_at:end]
            pos += (name_at - pos + len(path) + 8) & ~7  # 1 to 8 NULs pad to 8 bytes
        entries.append((path, start, flags, extended))
        previous = path
    return entries, pos


class Vouched(Protocol):
    """The files git's index vouches for by their lstat: their stat data is what the index
    recorded (index_files). In C (_speedups.Vouching) the lstat calls go on in threads while
    the caller does other work, and a question about a file waits for its own; the Python
    twin (_Vouched) has them all made."""

    def __len__(self) -> int:
        """How many files it may vouch for (0: none)."""

    def __contains__(self, path: object, /) -> bool:
        """It may vouch for `path` (its lstat decides)."""

    def exclude(self, paths: Iterable[bytes], /) -> None:
        """Not to be taken unread after all (staged, converted on checkout...)."""

    def recorded_sizes(self, paths: Iterable[bytes], /) -> dict[bytes, int]:
        """The sizes git's index recorded for `paths` (cut to 32 bits)."""

    def taken(self) -> dict[bytes, tuple[bytes, str]]:
        """path -> (its stat key, its `git:` id) of every file vouched for."""

    def fed(self) -> bool:
        """Every path was written to the feed index_files was given (waits for it)."""

    def listing(
        self, path: bytes, ctime_ns: int, mtime_ns: int, ino: int, dev: int, racy_after: int, /
    ) -> list[bytes] | None:
        """The names in the folder `path` of the index, sorted, as listed beside the lstat
        calls, where that folder had these times, inode and device then, older than
        `racy_after`; None otherwise (the caller lists it)."""


class _Vouched(dict[bytes, tuple[bytes, str]]):
    """Vouched, in Python: path -> (stat key, `git:` id)."""

    feeding: threading.Thread | None = None
    feed_done = False

    def fed(self) -> bool:
        if self.feeding is not None:
            self.feeding.join()
        return self.feed_done

    def exclude(self, paths: Iterable[bytes]) -> None:
        for path in paths:
            self.pop(path, None)

    def recorded_sizes(self, paths: Iterable[bytes]) -> dict[bytes, int]:
        # (a file's lstat is what the index recorded, its size too)
        return {p: RECORD_TAIL.unpack(self[p][0])[1] & _U32 for p in paths if p in self}

    def taken(self) -> dict[bytes, tuple[bytes, str]]:
        return dict(self)

    def listing(
        self, path: bytes, ctime_ns: int, mtime_ns: int, ino: int, dev: int, racy_after: int
    ) -> list[bytes] | None:
        return None  # (no folder is listed ahead here: the walk lists each)


class IndexFiles(Struct):
    """What git's index says of the files below a workspace (paths relative to it): `files`,
    the blob id of each regular file (stage 0); `vouched`, those git may call clean by their
    lstat alone whose lstat is the stat data it recorded; `tree`, the id of the tree the
    whole index is, where its cache-tree extension records it (HEAD's tree: nothing is
    staged)."""

    files: dict[bytes, str]
    vouched: Vouched
    tree: str | None = None  # the whole tree's id, as the index's cache-tree records it


_STAT = struct.Struct(">10I")
_U32 = 0xFFFFFFFF
_REGULAR = (0o100644, 0o100755)
_SPARSE_DIR = 0o040000


def stat_data(st: os.stat_result) -> bytes:
    """A regular file's lstat as git's index records it (cache.h's stat_data, each field cut
    to 32 bits; the mode as git makes it of a file: 100644 or, executable, 100755)."""
    c, cn = divmod(st.st_ctime_ns, 1_000_000_000)
    m, mn = divmod(st.st_mtime_ns, 1_000_000_000)
    mode = _REGULAR[1] if st.st_mode & stat.S_IXUSR else _REGULAR[0]
    return _STAT.pack(
        c & _U32,
        cn,
        m & _U32,
        mn,
        st.st_dev & _U32,
        st.st_ino & _U32,
        mode,
        st.st_uid & _U32,
        st.st_gid & _U32,
        st.st_size & _U32,
    )


def index_files(
    index: bytes,
    prefix: bytes,
    hash_size: int,
    margin_ns: int | None = None,
    root: bytes | None = None,
    feed: int = -1,
) -> IndexFiles | None:
    """The regular files git's index (the file `index`) tracks below `prefix`, and those of
    them an lstat vouches for (the workspace `root`; none without it): its stat data is the
    one the index recorded, and the entry is neither marked assume-unchanged nor
    skip-worktree, nor *racy* (changed or created within `margin_ns` before git wrote the
    index, or in the second it wrote it in when `margin_ns` is not 0, when a change in the
    same clock tick would leave its stat data as recorded: git's "racily clean" rule, by
    both times). None: an index this does not read (not there, damaged, its checksum wrong;
    a merge's stages, an intent-to-add, a split or sparse index, paths out of order): then
    git is asked (git_baseline.py), and no file is taken unread. `margin_ns`:
    VOUCH_MARGIN_NS unless given.

    The lstat calls are spread over the cores, as git's preload-index spreads them (on a
    virtual disk an lstat is a few microseconds of the kernel's: 50,000 of them take more
    than the rest of `git status`). In C they start as soon as the entries are known and go
    on after this returns, while git's commands are read and the walk begins (Vouched). A
    folder on a path that is a link is followed (the walk that uses them never enters one:
    it finds no name there to look up).

    `feed` (a pipe's fd; -1: none) is written the paths, each NUL-ended, on a thread, and
    closed whatever the answer: the input of `git check-attr -z --stdin`, which then starts
    as soon as they are known rather than after a `git ls-files` of its own."""
    if margin_ns is None:
        margin_ns = VOUCH_MARGIN_NS
    try:
        with open(index, "rb") as f:
            written = os.fstat(f.fileno()).st_mtime_ns
            data = f.read(MAX_INDEX_BYTES + 1)
    except OSError:
        data = b""
    if len(data) > MAX_INDEX_BYTES or len(data) < 12 + hash_size:
        if feed >= 0:
            os.close(feed)  # (check-attr told of no path)
        return None
    body, checksum = data[:-hash_size], data[-hash_size:]
    digest: list[bytes] = []  # (hashed on a thread while the parse runs: hashlib lets go
    # of the GIL, and 4.4 MB at 50,000 files is a tenth of the parse's time)
    hashing = threading.Thread(
        target=lambda: digest.append(
            hashlib.new("sha256" if hash_size == 32 else "sha1", body).digest()
        )
    )
    if any(checksum):  # (all zero: written with index.skipHash)
        hashing.start()
    lead = prefix + b"/" if prefix else b""
    racy_from = written - margin_ns
    if margin_ns > 0:
        racy_from = min(racy_from, written - written % _SECOND)
    root_fd = -1
    try:
        if root is not None:
            try:
                root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                if feed >= 0:
                    os.close(feed)
                raise
        # (one core left to the caller, which walks meanwhile: on 2 cores, 2 lstat threads
        # beside the walk made the whole first snapshot 8% slower than one)
        threads = max(1, (os.cpu_count() or 1) - 1)
        found = _index_files(body, hash_size, lead, racy_from, root_fd, threads, feed)
    except (OSError, struct.error, ValueError, IndexError, OverflowError):
        found = None
    finally:
        if root_fd >= 0:
            os.close(root_fd)
        if any(checksum):
            hashing.join()
    if found is None or (any(checksum) and digest != [checksum]):
        return None
    return IndexFiles(*found)


def _index_files_py(
    body: bytes,
    hash_size: int,
    lead: bytes,
    racy_from: int,
    root_fd: int,
    threads: int,
    feed_fd: int = -1,
) -> tuple[dict[bytes, str], Vouched, str | None] | None:
    """index_files's parse and lstat calls, of the index without its checksum, in one
    thread, all made before it returns; what _speedups.index_files answers in C, its lstat
    calls in `threads` threads (the same answers: tests/test_speedups.py). `feed_fd` (-1:
    none) is written the paths, each NUL-ended, on a thread, and closed, whatever the
    answer."""
    try:
        found = _parsed(body, hash_size, lead, racy_from, root_fd)
    except BaseException:
        if feed_fd >= 0:
            os.close(feed_fd)
        raise
    if feed_fd < 0:
        return found
    if found is None:
        os.close(feed_fd)
    else:
        vouched = found[1]
        assert isinstance(vouched, _Vouched)
        paths = b"".join(p + b"\0" for p in found[0])
        vouched.feeding = threading.Thread(
            target=_feed, args=(feed_fd, paths, vouched), daemon=True
        )
        vouched.feeding.start()
    return found


def _feed(fd: int, data: bytes, vouched: _Vouched) -> None:
    try:
        with contextlib.suppress(OSError):  # (git gone: it failed, and says so)
            while data:
                data = data[os.write(fd, data) :]
            vouched.feed_done = True
    finally:
        os.close(fd)


def _parsed(
    body: bytes, hash_size: int, lead: bytes, racy_from: int, root_fd: int
) -> tuple[dict[bytes, str], Vouched, str | None] | None:
    entries, pos = _entries(body, hash_size)
    files: dict[bytes, str] = {}
    asked: list[tuple[bytes, int]] = []
    skip = len(lead)
    last = None
    for path, start, flags, extended in entries:
        if last is not None and path <= last:
            return None  # out of order or twice: not as git writes it (_speedups.c)
        last = path
        mode = int.from_bytes(body[start + 24 : start + 28], "big")
        if flags & _STAGE or extended & _INTENT_TO_ADD or mode == _SPARSE_DIR:
            return None
        if mode not in _REGULAR or not path.startswith(lead):
            continue
        rel = path[skip:]
        files[rel] = body[start + 40 : start + 40 + hash_size].hex()
        if flags & _ASSUME_VALID or extended & _SKIP_WORKTREE:
            continue
        c, cn, m, mn = struct.unpack_from(">4I", body, start)
        if c * 1_000_000_000 + cn < racy_from and m * 1_000_000_000 + mn < racy_from:
            asked.append((rel, start))
    tree = None
    while pos < len(body):  # the extensions
        signature, size = struct.unpack_from(">4sI", body, pos)
        if signature in (b"link", b"sdir"):  # split index; sparse directories
            return None
        if signature == b"TREE" and tree is None and pos + 8 + size <= len(body):
            tree = _tree_root(body[pos + 8 : pos + 8 + size], hash_size)
        pos += 8 + size
    if pos != len(body):
        raise ValueError("an extension past the end of the index")
    vouched = _Vouched()
    for rel, start in asked if root_fd >= 0 else ():
        tail = _lstat_tail(root_fd, rel, body[start : start + 40])
        if tail is not None:
            vouched[rel] = (tail, "git:" + files[rel])
    return files, vouched, tree


_TREE_ROOT = re.compile(rb"\0(-?[0-9]+) [0-9]+\n")


def _tree_root(extension: bytes, hash_size: int) -> str | None:
    """The id of the whole tree git's cache-tree extension records (its first entry, whose
    path is empty), None where it records none (git writes -1 entries for one not valid)."""
    found = _TREE_ROOT.match(extension)
    if found is None or found.group(1).startswith(b"-"):
        return None
    oid = extension[found.end() : found.end() + hash_size]
    return oid.hex() if len(oid) == hash_size else None


RECORD_TAIL = struct.Struct("=qqQI")  # an lstat's ctime_ns, size, inode, permission bits


def _lstat_tail(root_fd: int, rel: bytes, recorded: bytes) -> bytes | None:
    """`rel`'s lstat (below the folder `root_fd` holds) as RECORD_TAIL, if it is a regular
    file whose stat data is `recorded`."""
    try:
        st = os.stat(rel, dir_fd=root_fd, follow_symlinks=False)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or abs(st.st_ctime_ns) >= 9_000_000_000 * 10**9:
        return None
    if stat_data(st) != recorded:
        return None
    return RECORD_TAIL.pack(st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode & 0o777)


class Seeds(Struct, frozen=True):
    """What a fresh scan takes on git's word (git_baseline.head_and_seeds): `vouched`, the
    files whose lstat, taken from `taken` (time_ns before the first) on, is the stat data
    git's index recorded for them, their bytes the commit's blob."""

    vouched: Vouched = field(default_factory=_Vouched)
    taken: int = 0


NO_SEEDS = Seeds()


_index_files: Callable[
    [bytes, int, bytes, int, int, int, int],
    tuple[dict[bytes, str], Vouched, str | None] | None,
]
try:
    from durable_agent.workspace._speedups import index_files as _index_files
except ImportError:  # built without a C compiler: the same answers, slower
    _index_files = _index_files_py


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """git's offset encoding (varint.c): 7 bits a byte, each continuation adding one."""
    byte = data[pos]
    value = byte & 0x7F
    while byte & 0x80:
        pos += 1
        byte = data[pos]
        value = ((value + 1) << 7) | (byte & 0x7F)
    return value, pos + 1
