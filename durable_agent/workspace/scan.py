"""Walking a workspace into a manifest, hashing only what changed (like git's index).

A file whose lstat (change time, size, inode) equals the one cached from the last scan
keeps its cached hash without being read. Except a *racy* one: changed within RACY_NS of
the scan that cached it, it may have changed again inside the same timestamp tick, so it
is hashed again (git's "racily clean" rule). An unchanged workspace costs one lstat, one
lookup and one comparison per file, and builds nothing: the previous manifest stands. A
folder is not listed again while its change time says no name in it was added, removed or
renamed (git's untracked cache; the same racy rule for the listing). The lstat of a
folder's cached files and the comparison of their keys is one call in C (_speedups.c,
built with the package; _changed_py where it could not be); in a walk of a big tree those
calls are made ahead, in threads, from the moment it starts (git's preload-index:
_speedups.preload), and the walk waits only for a folder not done yet.

A file tool's step knows what it wrote: `scan(paths)` looks at those paths alone and updates
the previous manifest (manifest.updated, as the walk does), since the tree between steps is
known (every command's step walks it after the command). What changed elsewhere meanwhile,
from outside the run, is found by the next full walk: a command's step, resume's check.

What is left out: paths matched by the `exclude` setting (gitignore syntax, applied at the
root) and by every `.gitignore` in the tree (a deeper file wins, as in git), sockets and
other special files. A file over the size cap is an entry of kind `big` (size only); one
that holds a secret, of kind `secret` (its hash: its bytes are never kept, secrets.py). The
walk only reads: it never runs git and never writes, so the user's repository (index,
HEAD, refs, config, hooks) cannot change and no git identity is needed. With
`snapshot_baseline = "git"`, snapshot.use_git hands it git's word (git_baseline.py): the
HEAD commit's blob ids, and the stat data git's index recorded for the tracked files that
are the commit's, which a fresh scanner records as `git:` ids without reading them when
their lstat is that (Scanner.use_git: git's index seeds the stat cache).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import hashlib
import itertools
import os
import stat
import struct
import sys
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from msgspec import Struct, field

from durable_agent.tools.limits import read_capped
from durable_agent.workspace import progress
from durable_agent.workspace.git_baseline import git_blob_id
from durable_agent.workspace.git_index import (
    NO_SEEDS,
    RECORD_TAIL,
    Seeds,
    Tracked,
    Vouched,
    find_index,
    tracked_files,
)
from durable_agent.workspace.ignore_rules import (
    DirectoryNames,
    compile_checked,
    compile_rules,
    matchable,
)
from durable_agent.workspace.manifest import (
    BIG,
    DIR,
    FILE,
    GIT_REF,
    LINK,
    SECRET,
    Entry,
    Manifest,
    TreeIds,
    updated,
)
from durable_agent.workspace.secrets import NAME_SHAPES, SecretCheck

PATH_MAX = 4096  # bytes of a path the kernel takes, its NUL included
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
RACY_NS = 100_000_000  # 100 ms: coarse file system clocks tick slower than time_ns()
# Folders that tools generate (virtualenvs, packages, caches): named by a plain `NAME/` rule
# of the `exclude` setting (as its default does), they are left out unless git tracks
# files in them, which stay in (git_index.py). A model's `python -m venv venv` added 9.6 MB
# to every snapshot.
GENERATED = frozenset(
    {
        ".venv",
        "venv",
        "node_modules",
        "__pycache__",
        ".tox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
    }
)
DEFAULT_EXCLUDE = (".git/", *(f"{name}/" for name in sorted(GENERATED)))

# A file's stat key: its lstat's change time (ns), size, inode and permission bits, packed
# (git_index.RECORD_TAIL: one bytes object a file, compared in C by memcmp; a tuple of
# three ints cost four objects a file, a tenth of a first scan on git's word).
StatKey = bytes


def _stat_key(st: os.stat_result) -> StatKey:
    try:
        return RECORD_TAIL.pack(st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode & 0o777)
    except struct.error:  # a change time past 2262: a key no other equals (read every scan)
        return RECORD_TAIL.pack(0, -1, next(_NO_KEY), 0)


_NO_KEY = itertools.count()
_FS_ENCODED = functools.partial(
    str.encode, encoding=sys.getfilesystemencoding(), errors=sys.getfilesystemencodeerrors()
)  # os.fsencode of many names at once (a name holds no NUL)


MAX_DEPTH = 200  # folder levels walked: the walk recurses a level a call, below Python's limit
_UNREADABLE = Entry(FILE, 0, "unreadable")


def _changed_py(
    dir_fd: int, names: list[bytes], cached: dict[bytes, tuple[StatKey | None, Entry]]
) -> list[bytes]:
    """The `names` (in order) that `cached` does not vouch for: not cached as a file whose
    stat key is its lstat's now (not cached, racy, not lstat'able, or changed). What
    _speedups.changed answers in C; this is where it could not be built."""
    out = []
    lstat = os.stat
    for name in names:
        old = cached.get(name)
        if old is not None and old[0] is not None:
            try:
                st = lstat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                out.append(name)
                continue
            if old[0] == _stat_key(st):
                continue
        out.append(name)
    return out


def _seeded_py(
    names: list[bytes],
    lead: bytes,
    vouched: Vouched,
    cached: dict[bytes, tuple[StatKey | None, Entry]],
    entries: Manifest,
    entry: type[Entry],
    kind: str,
    size_cap: int,
    racy_after: int,
    shapes: tuple[tuple[bytes, ...], tuple[bytes, ...], tuple[bytes, ...]] | None,
) -> list[bytes]:
    """A fresh scanner's folder on git's word: each of `names` (in the folder whose path and
    a `/` is `lead`) that git's index vouches for (`vouched`: its lstat is the stat data the
    index recorded; Scanner.use_git) and is under the cap is recorded by its `git:` id,
    unread: its row in `cached`, its entry in `entries`. The others are returned, in order,
    for the walk to look at, and so is a name that may be a secret's (`shapes`:
    secrets.NAME_SHAPES; None: none is withheld by its name).
    What _speedups.seeded answers in C (of a _speedups.Vouching, which index_files makes
    there); this is where it could not be built (of a git_index._Vouched)."""
    todo = []
    assert isinstance(vouched, dict)
    for name in names:
        rel = lead + name
        found = vouched.get(rel)
        if found is not None and not _may_be_secret(name, shapes):
            tail, ref = found
            ctime, size, _, mode = RECORD_TAIL.unpack(tail)
            if size <= size_cap:
                made = entry(kind, mode, ref, b"", size)
                cached[name] = (None if ctime >= racy_after else tail, made)
                entries[rel] = made
                continue
        todo.append(name)
    return todo


def _listing_py(dir_fd: int) -> list[bytes]:
    """The names in the folder `dir_fd` holds, as bytes, sorted; _speedups.listing in C."""
    listed = os.listdir(dir_fd)  # (by its fd: names as str, encoded back in one call)
    return sorted(_FS_ENCODED("\0".join(listed)).split(b"\0")) if listed else []


def _may_be_secret(
    name: bytes, shapes: tuple[tuple[bytes, ...], tuple[bytes, ...], tuple[bytes, ...]] | None
) -> bool:
    if shapes is None:
        return False
    low = name.lower()
    return (
        len(name) >= 256 or low.startswith(shapes[0]) or low.endswith(shapes[1]) or low in shapes[2]
    )


def _preload_py(root_fd: int, cache: dict[bytes, Any], threads: int) -> Any:
    return None  # (without C: the walk makes every lstat call itself, in _changed)


try:
    from durable_agent.workspace._speedups import changed as _changed
    from durable_agent.workspace._speedups import listing as _listing
    from durable_agent.workspace._speedups import preload as _preload
    from durable_agent.workspace._speedups import seeded as _seeded
except ImportError:  # built without a C compiler: the same answers, slower
    _changed, _seeded, _listing = _changed_py, _seeded_py, _listing_py
    _preload = _preload_py

# Threads that make a walk's lstat calls ahead of it (_speedups.preload), beside the walk's
# own: one fewer than the cores, as for git's index (git_index.index_files).
PRELOAD_THREADS = (os.cpu_count() or 1) - 1
# Files from which a walk has them made ahead: below, its lstat calls take about as long as
# starting a thread (a tenth of a millisecond).
PRELOAD_FROM = 1024


_pauses = 0  # walks under way that paused the garbage collector (collector_paused)
_pauses_lock = threading.Lock()
_resume = False  # it was enabled when the first of them paused it


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The garbage collector waits while a walk runs: a first walk of 50,000 files makes
    100,000 objects, none in a cycle, and the collections they set off went through every
    object of the process (8 ms of a git-baseline first snapshot's 180). Walks in several
    threads pause it once; the last to end lets it go on, if it was on."""
    global _pauses, _resume
    with _pauses_lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pauses_lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()


class Scan(Struct):
    manifest: Manifest
    contents: dict[str, bytes] = field(default_factory=dict)  # hash -> bytes read in this scan
    skipped: list[bytes] = field(default_factory=list)  # over the size cap
    too_deep: list[bytes] = field(
        default_factory=list
    )  # folders at MAX_DEPTH, left out with all below
    unreadable: list[bytes] = field(
        default_factory=list
    )  # not listed or not read: kept as last seen
    excluded: list[bytes] = field(default_factory=list)  # left out by `exclude` (folders: `d/`)
    changed: bool = True  # False: the same manifest as this scanner's previous scan
    tree_id: str = ""  # manifest.tree_id(manifest), kept up to date by the scanner
    base: Manifest | None = None  # the scanner's previous manifest, which this one ...
    entries: Manifest = field(default_factory=dict)  # ... changes by these (set) paths
    deleted: list[bytes] = field(default_factory=list)  # ... and these gone

    def delta_from(self, old: Manifest) -> tuple[Manifest, list[bytes]] | None:
        """(set, deleted) paths from `old` to this manifest when `old` is this scan's base
        (manifest.changes and encode_delta then compare nothing); None otherwise."""
        return (self.entries, self.deleted) if old is self.base else None


class _Walk:
    """One scan's findings. An unchanged workspace writes nothing here but the directories
    it listed: the previous manifest and the stat cache stay as they are (building new ones
    for 5,000 files cost more than the lstat calls)."""

    __slots__ = (
        "out",
        "racy_after",
        "visited",
        "empty",
        "entries",
        "deleted",
        "empty_after",
        "preload",
    )

    def __init__(self, out: Scan, started: int) -> None:
        self.out = out
        self.racy_after = started - RACY_NS
        self.visited: list[bytes] = []  # directories listed
        self.empty: list[bytes] = []  # empty directories (entries of their own)
        self.entries: Manifest = {}  # new or different entries
        self.deleted: list[bytes] = []  # files of the previous manifest that are gone
        self.empty_after: set[bytes] = set()  # the new manifest's empty directories
        self.preload: Any = None  # the cache's lstat calls, made ahead in threads (_walk_all)


class _Found(Struct):
    """What one looked-at path is now (Scanner._look_at): its entry (None: none), the stat
    key to cache it under, cached names gone beside it, new folders on its way."""

    rel: bytes
    parent: bytes
    name: bytes
    entry: Entry | None
    key: StatKey | None
    gone: list[bytes]
    new_dirs: list[bytes]


_NOTHING = _Found(b"", b"", b"", None, None, [], [])  # a path that is no entry, nor was one


def _parents(rel: bytes) -> list[bytes]:
    """`a/b/c` -> [`a`, `a/b`]."""
    parts = rel.split(b"/")[:-1]
    return [b"/".join(parts[: i + 1]) for i in range(len(parts))]


class Scanner:
    """One workspace's walker and stat cache. Thread-safe (a worker runs several runs)."""

    def __init__(
        self,
        root: Path,
        exclude: Sequence[str],
        size_cap: int,
        secrets: SecretCheck | None = None,
    ) -> None:
        self.root = os.fsencode(str(root))
        self.size_cap = size_cap
        self.secrets = secrets  # what is withheld from snapshots (None: nothing)
        self._secret_shapes = NAME_SHAPES if secrets is not None and secrets.by_name else None
        # The `exclude` setting's rules the matcher cannot take: a new run refuses them
        # (recorder.at_creation); in a .gitignore they are left out (compile_checked).
        # Its `NAME/` rules of GENERATED folders are matched apart: they yield to git's index.
        generated = [r for r in exclude if r.endswith("/") and r[:-1] in GENERATED]
        self.generated = frozenset(r[:-1] for r in generated)
        self._generated_names = frozenset(os.fsencode(n) for n in self.generated)
        self.exclude, self.exclude_refused = compile_checked(
            [r for r in exclude if r not in generated]
        )
        # Files git tracks in those folders (git_index.py); None: not read since the index
        # last changed, as no decision needed it yet (_tracked_now).
        self._tracked: Tracked | None = None
        self._index_key: tuple[object, ...] | None = None
        self._index: tuple[bytes, bytes] | None = None  # the index and the workspace's prefix
        # Paths the `exclude` setting left out, as last told (report_excluded).
        self._excluded_told: set[bytes] | None = None
        self.lock = threading.Lock()
        # directory -> name -> (stat key, entry) of every file (or link) of the previous
        # manifest; the key is None while the file is racy (it is read again).
        self._cache: dict[bytes, dict[bytes, tuple[StatKey | None, Entry]]] = {}
        self._ignores: dict[bytes, tuple[tuple[int, ...], Any]] = {}  # dir -> .gitignore key, spec
        self._decisions: dict[tuple[bytes, bool], bool] = {}  # (path, is_dir) -> ignored
        self._by_setting: set[tuple[bytes, bool]] = set()  # of those, left out by `exclude`
        self._previous: Manifest = {}
        self._empty: set[bytes] = set()  # the previous manifest's empty directories
        self._ids = TreeIds()  # the id of _previous
        self._ignore_epoch = 0  # +1 whenever a .gitignore changed (every decision is made again)
        self._cache_epoch = -1  # the ignore epoch the stat cache was built under
        # What a fresh scanner (a new process, or after forget) keeps below a folder it may
        # not list: the last manifest stored or written (seed, forget).
        self._last_seen: Manifest = {}
        self._stale: set[bytes] = set()  # kept unlisted: their rows are checked again once listed
        # directory -> (its change time, modification time, inode; the names in it) when last
        # listed (_names)
        self._listing: dict[bytes, tuple[tuple[int, int, int], list[bytes]]] = {}
        # Contents read by scans since a snapshot last took them (snapshot.take stores them):
        # a plain scan reads a changed file once, and the next scan finds it unchanged.
        self.unsaved: dict[str, bytes] = {}
        # sha256 -> the `git:` id of the same bytes, for files read that a snapshot recorded
        # by a commit HEAD no longer is: content ids of one content, so resume's drift check
        # does not call an untouched file changed after HEAD moved (a fact about bytes:
        # never stale).
        self.same_bytes: dict[str, str] = {}
        # `snapshot_baseline = "git"` (snapshot.use_git): the HEAD commit's blob ids by path,
        # the stat data git's index recorded for the files a fresh scan takes unread when
        # their lstat is that (git_baseline.head_and_seeds), the commit's object format.
        self._head: dict[bytes, str] = {}
        self._head_ids: frozenset[str] | None = frozenset()  # (None: not yet made of _head)
        self._seeds: Seeds = NO_SEEDS
        self._git_format = "sha1"
        self._git_used = False  # some entry may hold a `git:` id (drop_git)

    def scan(self, paths: Collection[bytes] | None = None) -> Scan:
        """The workspace's manifest. `paths` (relative): only these may have changed since
        this scanner's previous scan (the file a file tool wrote); they alone are looked at,
        unless that cannot tell (no previous scan here, a .gitignore among them, a folder
        left or emptied...): then, as without `paths`, the whole tree is walked. Changes made
        elsewhere meanwhile are seen by the next full scan (a command's, resume's)."""
        with self.lock:
            self._check_index()
            first = self._cache_epoch < 0
            w = None
            if (
                paths is not None
                and not first
                and not self._stale
                and self._ignore_epoch == self._cache_epoch
            ):
                w = self._look_at(paths)
            if first and self._seeds.vouched and self._last_seen:
                _keep_stored_ids(self._seeds, self._last_seen)
            try:
                if w is not None:
                    return self._finish(w, first)
                with collector_paused():
                    return self._finish(self._walk_all(), first)
            finally:
                if first:  # (they seed a fresh scanner's first walk alone)
                    self._seeds = NO_SEEDS

    def _walk_all(self) -> _Walk:
        w = _Walk(Scan({}), time.time_ns())
        if self._seeds.vouched:  # lstat'ed before the walk: racy from then on
            w.racy_after = min(w.racy_after, self._seeds.taken - RACY_NS)
        if os.path.isdir(self.root):
            if len(self._previous) >= PRELOAD_FROM and self._cache_epoch >= 0:
                w.preload = _preloaded(self.root, self._cache)
            try:
                self._walk(b"", [], w, None)
            finally:
                w.preload = None  # (its threads joined)
        visited = set(w.visited)
        for rel_dir in [d for d in self._cache if d not in visited]:  # gone, ignored, a link now
            prefix = rel_dir + b"/" if rel_dir else b""
            w.deleted += [prefix + name for name in self._cache.pop(rel_dir)]
            self._listing.pop(rel_dir, None)
        w.empty_after = set(w.empty)
        w.deleted += [d for d in self._empty if d not in w.empty_after]
        return w

    def _finish(self, w: _Walk, first: bool) -> Scan:
        """The new manifest: the previous one with what the walk (or the look) found."""
        previous, out = self._previous, w.out
        # A path gone as one kind and back as another (a file now a directory) is set.
        deleted = [p for p in w.deleted if p not in w.entries and p in previous]
        out.base, out.entries, out.deleted = previous, w.entries, deleted
        if w.entries or deleted or first:
            # (a fresh scanner's first: the walk's entries are the manifest, not copied)
            fresh = not previous and not deleted
            out.manifest = w.entries if fresh else updated(previous, w.entries, deleted)
            out.changed = True
            out.tree_id = (
                self._ids.rebuild(out.manifest)
                if first
                else self._ids.update(out.manifest, w.entries, deleted)
            )
        else:
            out.manifest, out.changed, out.tree_id = previous, False, self._ids.id
        self._cache_epoch = self._ignore_epoch
        self._previous, self._empty = out.manifest, w.empty_after
        self.unsaved.update(out.contents)
        if self._excluded_told is None:  # what was there before: not news (report_excluded)
            self._excluded_told = set(out.excluded)
        return out

    def _look_at(self, paths: Collection[bytes]) -> _Walk | None:
        """What the files at `paths` are now, against the previous scan; None when the paths
        alone cannot tell. Nothing is changed (cache, manifest) until every path is looked
        at, so a None leaves the scanner as it was for the full walk."""
        w = _Walk(Scan({}), time.time_ns())
        found: list[_Found] = []
        for rel in sorted(set(paths)):
            one = self._look_at_one(rel, w)
            if one is None:
                return None
            found.append(one)
        filled: set[bytes] = set()  # empty directories that now hold a file
        for one in found:
            if one.entry is None and not one.gone:
                continue
            for rel_dir in one.new_dirs:
                self._cache[rel_dir] = {}
            cached = self._cache[one.parent]
            for name in one.gone:
                del cached[name]
                w.deleted.append((one.parent + b"/" if one.parent else b"") + name)
            if one.entry is None:
                continue
            cached[one.name] = (one.key, one.entry)
            self._note(one.rel, one.entry, w)
            filled.update(d for d in _parents(one.rel) if d in self._empty)
        w.deleted += filled
        w.empty_after = self._empty - filled
        told = self._excluded_told or set()  # not news again (report_excluded)
        w.out.excluded = sorted(told.union(w.out.excluded))
        return w

    def _look_at_one(self, rel: bytes, w: _Walk) -> _Found | None:
        parts = rel.split(b"/")
        if (
            any(p in (b"", b".", b"..", b".gitignore") for p in parts)
            or len(parts) > MAX_DEPTH
            or len(self.root) + len(rel) >= PATH_MAX - 1
            or rel in self._cache  # a folder listed at the previous scan
            or rel in self._empty
        ):
            return None
        specs: list[tuple[bytes, Any]] = []
        new_dirs: list[bytes] = []
        rel_dir = b""
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError:
            return None
        try:
            for depth, part in enumerate(parts):
                if rel_dir in self._cache:
                    spec = self._ignores.get(rel_dir)
                    if spec is not None:
                        specs.append((rel_dir, spec[1]))
                elif os.listdir(fd) != [os.fsdecode(part)]:
                    return None  # a new folder that holds more than the written path
                if depth == len(parts) - 1:
                    return self._look_at_file(fd, rel_dir, part, specs, new_dirs, w)
                sub = rel_dir + b"/" + part if rel_dir else part
                if sub in self._previous and sub not in self._cache:  # was a file or a link
                    return None
                if sub not in self._cache and not new_dirs and self._ignored(sub, True, specs):
                    return _NOTHING  # in a folder left out (as at the previous scan)
                try:
                    child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if sub in self._cache or new_dirs:
                        return None  # a folder gone since: the walk decides
                    return _NOTHING  # not there (a write not made yet): nothing below it is
                except OSError:
                    return None
                os.close(fd)
                fd, rel_dir = child, sub
                if sub not in self._cache:
                    new_dirs.append(sub)
        except OSError:
            return None
        finally:
            os.close(fd)
        return None

    def _look_at_file(
        self,
        fd: int,
        rel_dir: bytes,
        name: bytes,
        specs: list[tuple[bytes, Any]],
        new_dirs: list[bytes],
        w: _Walk,
    ) -> _Found | None:
        rel = rel_dir + b"/" + name if rel_dir else name
        cached = self._cache.get(rel_dir, {})
        # The folder is listed (names only): what a file tool's rename left gone beside the
        # file (a temp file of an interrupted write it cleared) is seen gone too.
        listed = {os.fsencode(n) for n in os.listdir(fd)}
        gone = [n for n in cached if n not in listed and n != name]
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        mode = st.st_mode if st is not None else 0
        if stat.S_ISDIR(mode):
            return None
        entry: Entry | None = None
        key: StatKey | None = None
        if st is not None and (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            if self._ignored(rel, False, specs):
                if (rel, False) in self._by_setting:
                    w.out.excluded.append(rel)
            else:
                key = _stat_key(st)
                old = cached.get(name)
                entry = (
                    old[1]
                    if old is not None and old[0] == key
                    else self._entry(fd, name, st, w.out, rel, old[1] if old is not None else None)
                )
                if entry is None or entry is _UNREADABLE:
                    return None  # changed under the look, or unreadable: the walk decides
                if st.st_ctime_ns >= w.racy_after:
                    key = None  # read again by the next scan
        if entry is None and name in cached:
            gone.append(name)
        if entry is None and (new_dirs or (gone and len(gone) >= len(cached))):
            return None  # a folder that may be empty now (an entry of its own): the walk decides
        return _Found(rel, rel_dir, name, entry, key, gone, new_dirs)

    @property
    def fresh(self) -> bool:
        """No scan yet (or forgotten): the next one reads every file it is not told about."""
        with self.lock:
            return self._cache_epoch < 0

    def use_git(self, head: dict[bytes, str], seeds: Seeds = NO_SEEDS, fmt: str = "sha1") -> None:
        """Content ids from a git commit (snapshot_baseline = "git"): `head` (path -> blob id
        at the commit) names a file read whose bytes are that blob by `git:` and its id,
        not by a sha256. `seeds` (git_index.Seeds, from git_baseline.head_and_seeds: the
        files whose lstat, taken while git's commands ran, was the stat data git's index
        recorded for them, their bytes the blob `head` names) are the files the next full
        scan of a fresh scanner records so without reading them, as `git status` does,
        unless their name may be a secret's or the store keeps them by their sha256. One
        changed since that lstat is racy (its stat cache row is read again next time)."""
        with self.lock:
            if head is not self._head:
                self._head, self._head_ids = head, None
            self._seeds, self._git_format = seeds, fmt
            self._git_used = True  # entries may hold `git:` ids now (drop_git)

    def drop_git(self) -> None:
        """No `git:` ids from now on (a run with the default baseline in a process where one
        with "git" scanned the same workspace): the cache that holds them is dropped, so the
        next scan reads every file and its snapshot's store holds them all."""
        with self.lock:
            if not self._git_used:
                return
            self._git_used = False
            self._head, self._head_ids, self._seeds = {}, frozenset(), NO_SEEDS
        self.forget()

    def seed(self, manifest: Manifest) -> None:
        """What the store last recorded of this workspace, for a fresh scanner to keep below
        a folder it may not list (not recorded as deleted, nor as drift on resume)."""
        with self.lock:
            self._last_seen = manifest

    def forget(self, seen: Manifest | None = None) -> None:
        """Drop the stat cache (the next scan hashes every file again); `seen` (default: the
        previous manifest) is what it keeps below a folder it may not list."""
        with self.lock:
            self._last_seen = self._previous if seen is None else seen
            self._stale.clear()
            self._cache.clear()
            self._listing.clear()
            self._previous, self._empty = {}, set()
            self._cache_epoch = -1

    def report_excluded(self, scan: Scan) -> list[bytes]:
        """What the `exclude` setting left out of `scan` that it had not left out when last
        told (for the step's note). What this scanner's first scan found is not news: it was
        there before this process (noted then, if a step of the run made it)."""
        with self.lock:
            found = set(scan.excluded)
            told, self._excluded_told = self._excluded_told or set(), found
            return sorted(found - told)

    # -- ignoring ------------------------------------------------------------------------------
    def _check_index(self) -> None:
        """Read git's index again when it changed: which files in GENERATED folders it tracks
        decides what is left out; when that changed, every decision is made again."""
        if not self.generated:
            return
        found = find_index(self.root)
        key: tuple[object, ...] | None = None
        if found is not None:
            try:
                st = os.stat(found[0])
                key = (found, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
            except OSError:
                key = None
        if key == self._index_key:
            return
        self._index_key, self._index = key, (found if key is not None else None)
        if self._tracked is None:
            return  # no decision was made on it: read when one needs it
        tracked = self._read_tracked()
        if tracked != self._tracked:
            self._tracked = tracked
            self._decisions.clear()
            self._by_setting.clear()
            self._ignore_epoch += 1

    def _read_tracked(self) -> Tracked:
        if self._index is None:
            return Tracked()
        return tracked_files(*self._index, self._generated_names)

    def _tracked_now(self) -> Tracked:
        """The tracked files in GENERATED folders, read from the index when first needed (a
        walk that meets no such folder never parses it: 50,000 entries cost a third of
        `git status`)."""
        if self._tracked is None:
            self._tracked = self._read_tracked()
        return self._tracked

    def _gitignore(self, rel_dir: bytes, dir_fd: int, names: list[bytes]) -> Any:
        """The rules of the .gitignore in the folder `dir_fd` holds, whose `names` are
        listed: one not listed is not looked for (an lstat per folder, 5% of a walk)."""
        path = b".gitignore"
        st = None
        if path in names:
            try:
                st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                st = None
        if st is None:
            if rel_dir in self._ignores:
                del self._ignores[rel_dir]
                self._decisions.clear()
                self._by_setting.clear()
                self._ignore_epoch += 1
            return None
        key = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode)
        known = self._ignores.get(rel_dir)
        if known is not None and known[0] == key:
            return known[1]
        # Only a regular file, as git reads it (it does not follow an in-tree .gitignore that
        # is a link): a FIFO planted there would block the open for good, /dev/zero never end.
        try:
            data = (
                _regular_bytes(path, MAX_IGNORE_BYTES, dir_fd) if stat.S_ISREG(st.st_mode) else None
            )
        except FileNotFoundError:
            data = None
        except OSError:  # kept as last seen, its rules too (else what they left out comes in)
            return known[1] if known is not None else None
        lines = (data or b"").decode("utf-8", "surrogateescape").splitlines()
        spec = compile_rules(lines)
        self._ignores[rel_dir] = (key, spec)
        self._decisions.clear()  # a .gitignore changed: every decision is made again
        self._by_setting.clear()
        self._ignore_epoch += 1
        return spec

    def _ignored(self, rel: bytes, is_dir: bool, specs: list[tuple[bytes, Any]]) -> bool:
        known = self._decisions.get((rel, is_dir))
        if known is not None:
            return known
        text = matchable(os.fsdecode(rel) + ("/" if is_dir else ""))
        decided: bool | None = None
        for base, spec in reversed(specs):  # the deepest .gitignore that has a say wins
            sub = text[len(os.fsdecode(base)) + 1 :] if base else text
            result = spec.check_file(sub).include
            if result is not None:
                decided = bool(result)
                break
        excluded = self._excluded(text, rel, is_dir)
        if excluded:
            self._by_setting.add((rel, is_dir))
        # The exclude setting is never overridden by a `!` in a .gitignore.
        decided = excluded or bool(decided)
        self._decisions[(rel, is_dir)] = decided
        return decided

    def _excluded(self, text: str, rel: bytes, is_dir: bool) -> bool:
        """Left out by the `exclude` setting: one of its rules, or a GENERATED folder on the
        way that holds no file git tracks (a tracked file itself stays in)."""
        if self.exclude.check_file(text).include:
            return True
        if self.generated.isdisjoint(text.split("/")[:-1]):
            return False
        tracked = self._tracked_now()
        return rel not in (tracked.dirs if is_dir else tracked.files)

    # -- walking -------------------------------------------------------------------------------
    def _walk(
        self, rel_dir: bytes, specs: list[tuple[bytes, Any]], w: _Walk, parent_fd: int | None
    ) -> int:
        """Walk one directory; returns how many entries of it are in the manifest, -1 for one it
        could not list and knows nothing of.

        The directory is opened under its parent's fd, the link not followed (`parent_fd`
        None: the root, by its path), and everything in it is read relative to that fd: a
        folder swapped for a link to outside since its parent was listed is not walked."""
        if len(self.root) + len(rel_dir) >= PATH_MAX - 1:
            # Past PATH_MAX no tool, command or restore can name it by its path (ENAMETOOLONG,
            # as a walk by path found it): noted, never recorded empty.
            return self._unlisted(rel_dir, w)
        try:
            if parent_fd is None:
                fd = os.open(self.root, _DIR_FLAGS)
            else:
                fd = os.open(
                    os.path.basename(rel_dir), _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd
                )
        except (FileNotFoundError, NotADirectoryError):
            return 0  # gone since its parent was listed (a link now: O_NOFOLLOW says ENOTDIR)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return 0
            return self._unlisted(rel_dir, w)  # not ours to list: never "emptied"
        try:
            return self._walk_in(fd, rel_dir, specs, w)
        finally:
            os.close(fd)

    def _walk_in(self, fd: int, rel_dir: bytes, specs: list[tuple[bytes, Any]], w: _Walk) -> int:
        try:
            names = self._names(fd, rel_dir, w.racy_after)
        except (FileNotFoundError, NotADirectoryError):
            return 0  # gone since its parent was listed
        except OSError:  # not ours to list: never "emptied"
            return self._unlisted(rel_dir, w)
        progress.listed(len(names))  # (for a live display of a long first walk)
        spec = self._gitignore(rel_dir, fd, names)
        if spec is not None:
            specs = [*specs, (rel_dir, spec)]
        w.visited.append(rel_dir)
        cached = self._cache.get(rel_dir)
        if cached is None:
            cached = self._cache[rel_dir] = {}
        before = len(cached)
        # The cache's rows were made under this directory's current ignore rules (a change
        # in a .gitignore deeper down does not concern this directory's files).
        trusted = self._ignore_epoch == self._cache_epoch and rel_dir not in self._stale
        self._stale.discard(rel_dir)
        fast = cached if trusted else {}
        prefix = rel_dir + b"/" if rel_dir else b""
        # Rules that are all plain `NAME/` (the `exclude` setting's default, such a
        # .gitignore) decide a file by its folders alone, as they decided this folder, which
        # the walk entered: none leaves out a file here, unless a GENERATED folder is on the
        # way (a file in it is left out unless git tracks it: _excluded). Matching every file
        # of a first scan against them took a third of its walk.
        by_folder = (
            isinstance(self.exclude, DirectoryNames)
            and all(isinstance(rules, DirectoryNames) for _, rules in specs)
            and self._generated_names.isdisjoint(rel_dir.split(b"/"))
        )
        # The hot path of an unchanged workspace: the names whose cached key the lstat
        # confirms are counted, nothing is built for them. The change time moves with every
        # change to a file (content, mode, times, a rename) and no program can set it; size
        # and inode catch the rest. The others are looked at one by one.
        if not fast:
            todo = names
        elif w.preload is not None:
            todo = w.preload.changed(fd, rel_dir, names, fast)
        else:
            todo = _changed(fd, names, fast)
        hits, found = len(names) - len(todo), 0
        if (
            self._seeds.vouched
            and not before
            and not self._previous
            and len(self.root) + len(prefix) < PATH_MAX - 256
        ):
            # A fresh scanner on git's word (use_git): the files git's index vouches for
            # are made entries in one call, unread; the rest as below. Under rules that
            # decide a file by more than its folders (`*.log`), those the rules leave out
            # stay for the loop below, which leaves them out.
            vouched = self._seeds.vouched
            offered = todo
            if not by_folder:
                offered = [
                    n
                    for n in todo
                    if prefix + n in vouched and not self._ignored(prefix + n, False, specs)
                ]
            left = _seeded(
                offered,
                prefix,
                vouched,
                cached,
                w.entries,
                Entry,
                FILE,
                self.size_cap,
                w.racy_after,
                self._secret_shapes,
            )
            if len(left) < len(offered):
                found = len(offered) - len(left)
                if offered is not todo:
                    taken = set(offered).difference(left)
                    left = [n for n in todo if n not in taken]
                todo = left
        dropped: list[bytes] = []  # cached names still listed but no longer entries
        vanished: list[bytes] = []  # listed, gone since
        lstat = os.stat
        for name in todo:
            try:
                st = lstat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                vanished.append(name)
                continue
            except OSError:  # listable, not searchable (chmod 644 d): none of it can be read
                return self._unlisted(rel_dir, w)
            old = fast.get(name)
            if old is not None and old[0] == _stat_key(st):
                hits += 1  # an lstat that failed in _changed (EINTR, ENOMEM) and works now
                continue
            rel, mode = prefix + name, st.st_mode
            old = cached.get(name)
            if old is not None:
                dropped.append(name)  # until it turns out to be an entry still
            if stat.S_ISDIR(mode):
                ignored = self._decisions.get((rel, True))
                if ignored is None:
                    ignored = self._ignored(rel, True, specs)
                if ignored and (rel, True) in self._by_setting and name != b".git":
                    w.out.excluded.append(rel + b"/")
                if not ignored and rel.count(b"/") >= MAX_DEPTH:
                    w.out.too_deep.append(rel)
                    found += 1
                elif not ignored:
                    below = self._walk(rel, specs, w, fd)
                    if below == 0:  # an empty directory is an entry
                        w.empty.append(rel)
                        self._note(rel, Entry(DIR, stat.S_IMODE(mode) & 0o777), w)
                    if below >= 0:  # (-1: not listed and never seen: left out, not called empty)
                        found += 1
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                continue
            if (old is None or not trusted) and not by_folder:
                ignored = self._decisions.get((rel, False))
                if ignored is None:
                    ignored = self._ignored(rel, False, specs)
                if ignored:
                    if (rel, False) in self._by_setting:
                        w.out.excluded.append(rel)
                    continue
            key = _stat_key(st)
            entry = (
                old[1]
                if old is not None and old[0] == key
                else self._entry(fd, name, st, w.out, rel, old[1] if old is not None else None)
            )
            unread = entry is _UNREADABLE
            if unread:  # kept as last seen (not deleted), and tried again at the next scan
                w.out.unreadable.append(rel)
                entry = (
                    old[1]
                    if old is not None
                    else self._last_seen.get(rel)
                    if self._cache_epoch < 0
                    else None
                )
            if entry is None:
                continue
            if old is not None:
                dropped.pop()
                hits += 1
            cached[name] = (None if unread or st.st_ctime_ns >= w.racy_after else key, entry)
            self._note(rel, entry, w)
            found += 1
        if dropped or hits < before:  # some of the cached files are gone: which ones
            listed = set(names).difference(vanished)
            gone = dropped + [name for name in cached if name not in listed]
            for name in gone:
                del cached[name]
            w.deleted += [prefix + name for name in gone]
        return hits + found

    def _names(self, fd: int, rel_dir: bytes, racy_after: int) -> list[bytes]:
        """The names in the folder `fd` holds: as listed at a previous scan while the
        folder's change time says no name was added, removed or renamed in it since (git's
        untracked cache: its files are still each lstat'ed, for their content); listed again
        otherwise. A listing made within RACY_NS of a change to the folder is not kept: a
        name added in the same clock tick would leave its change time as it was."""
        st = os.fstat(fd)
        key = (st.st_ctime_ns, st.st_mtime_ns, st.st_ino)
        known = self._listing.get(rel_dir)
        if known is not None and known[0] == key:
            return known[1]
        names = None
        if self._seeds.vouched:  # a fresh scan's folders, listed beside the lstat calls
            names = self._seeds.vouched.listing(
                rel_dir, st.st_ctime_ns, st.st_mtime_ns, st.st_ino, st.st_dev, racy_after
            )
        if names is None:
            names = _listing(fd)
        if st.st_ctime_ns < racy_after and st.st_mtime_ns < racy_after:
            self._listing[rel_dir] = (key, names)
        else:
            self._listing.pop(rel_dir, None)
        return names

    def _unlisted(self, rel_dir: bytes, w: _Walk) -> int:
        """A folder the harness may not list (`chmod 311 d`) or search (`chmod 644 d`): what
        was last seen below it stands. Recorded as gone, a restore to this step would delete
        it. Its cached rows were made under the ignore rules of then: checked once it is
        listed again."""
        w.out.unreadable.append(rel_dir)
        prefix = rel_dir + b"/" if rel_dir else b""
        below = [d for d in self._cache if d == rel_dir or d.startswith(prefix)]
        w.visited += below
        self._stale.update(below)
        if self._cache_epoch >= 0:  # the previous manifest holds them: nothing to note
            w.empty += [d for d in self._empty if d.startswith(prefix)]
            if any(path.startswith(prefix) for path in self._previous):
                return 1
            return 0 if rel_dir in self._previous else -1
        kept = 0
        for path, entry in self._last_seen.items():  # a fresh scanner: the last one stored
            if path.startswith(prefix):
                self._note(path, entry, w)
                if entry.kind == DIR:
                    w.empty.append(path)
                else:  # a row (read again when listed), so that one gone meanwhile is seen gone
                    parent, _, name = path.rpartition(b"/")
                    self._cache.setdefault(parent, {})[name] = (None, entry)
                    self._stale.add(parent)
                    w.visited.append(parent)
                kept += 1
        return kept if kept or rel_dir in self._last_seen else -1

    def _note(self, rel: bytes, entry: Entry, w: _Walk) -> None:
        old = self._previous.get(rel)
        if old is not entry and old != entry:
            w.entries[rel] = entry

    def _entry(
        self,
        dir_fd: int,
        name: bytes,
        st: os.stat_result,
        out: Scan,
        rel: bytes,
        prior: Entry | None = None,
    ) -> Entry | None:
        """The entry for a listed name in the folder `dir_fd` holds; None if it is gone or no
        longer what was listed, _UNREADABLE if the harness may not read it. `prior`: the
        cached entry at `rel`, if any (else the previous or last stored manifest's)."""
        if len(self.root) + len(rel) >= PATH_MAX - 1:
            return _UNREADABLE  # no one can open it by its path (see _walk)
        if prior is None:
            prior = self._previous.get(rel) or self._last_seen.get(rel)
        try:
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(name, dir_fd=dir_fd)
                if self.secrets is not None and self.secrets.link_holds(target):
                    return _withheld(target, 0)
                return Entry(LINK, target=target)
            if st.st_size > self.size_cap:
                out.skipped.append(rel)
                return Entry(BIG, stat.S_IMODE(st.st_mode) & 0o777, size=st.st_size)
            data = _regular_bytes(name, self.size_cap, dir_fd)
        except (FileNotFoundError, NotADirectoryError):
            return None  # vanished between the listing and now
        except OSError:
            return _UNREADABLE
        if data is None:
            return None  # no longer the regular file listed
        if self.secrets is not None and self.secrets.holds(rel, data):
            # Its bytes never reach `contents`, so no snapshot can store them.
            return _withheld(data, stat.S_IMODE(st.st_mode) & 0o777)
        mode = stat.S_IMODE(st.st_mode) & 0o777
        ref, recorded = self._git_ref(rel, data, prior)
        if ref is not None:  # the commit holds these bytes: nothing to store
            return Entry(FILE, mode, ref, size=len(data))
        digest = hashlib.sha256(data).hexdigest()
        if recorded is not None:
            self.same_bytes[digest] = recorded
        out.contents[digest] = data
        return Entry(FILE, mode, digest, size=len(data))

    def _git_ref(
        self, rel: bytes, data: bytes, prior: Entry | None
    ) -> tuple[str | None, str | None]:
        """The `git:` content id of bytes read at `rel`, when the commit holds them there: the
        same id as `prior`'s (a touched file is no change), or HEAD's blob at the path.
        None: a sha256 (a content the store holds, or will); then, second, `prior`'s `git:`
        id when these are its bytes still, of a commit HEAD no longer is (same_bytes)."""
        was = prior.ref if prior is not None and prior.kind == FILE else ""
        at = self._head.get(rel)
        if not was.startswith(GIT_REF) and at is None:
            return None, None
        same_size = prior is not None and prior.size == len(data)
        if was and not was.startswith(GIT_REF) and same_size and _sha256(data) == was:
            return None, None  # unchanged, and stored: it keeps its sha256
        recorded = None
        if was.startswith(GIT_REF) and same_size:
            fmt = "sha256" if len(was) == len(GIT_REF) + 64 else "sha1"
            blob = git_blob_id(data, fmt)
            if was == GIT_REF + blob:  # the same bytes as recorded; still a commit's?
                if self._head_ids is None:
                    self._head_ids = frozenset(self._head.values())
                if blob in self._head_ids:
                    return was, None
                recorded = was
        if at is not None and git_blob_id(data, self._git_format) == at:
            return GIT_REF + at, None
        return None, recorded


def _preloaded(root: bytes, cache: dict[bytes, Any]) -> Any:
    """The lstat calls of the cached files, under way in threads (_speedups.preload); None
    where there is none to have (no C, one core, no descriptor for the root)."""
    if PRELOAD_THREADS < 1:
        return None
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError:
        return None
    try:
        return _preload(fd, cache, PRELOAD_THREADS)
    except OSError:  # (no descriptor to spare for it: the walk makes its own calls)
        return None
    finally:
        os.close(fd)


def _keep_stored_ids(seeds: Seeds, last_seen: Manifest) -> None:
    """Take out of `seeds` the files the store last recorded by a sha256: a stored file keeps
    its id (read again, it is the same bytes: Scanner._git_ref)."""
    seeds.vouched.exclude([p for p, e in last_seen.items() if not e.ref.startswith(GIT_REF)])


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _withheld(data: bytes, mode: int) -> Entry:
    """The entry of a file (or link) that held a secret: its hash and size, not its bytes."""
    return Entry(SECRET, mode, hashlib.sha256(data).hexdigest(), size=len(data))


MAX_IGNORE_BYTES = (
    4 << 20
)  # of one .gitignore (not the snapshot's cap: its rules apply whatever that is)


def _regular_bytes(name: bytes, cap: int, dir_fd: int) -> bytes | None:
    """The bytes of `name` (in the folder `dir_fd` holds) if it is (still) a regular file of
    at most `cap` bytes, else None. Opened without following a link and without blocking (a
    FIFO opens at once), then checked on the open file, so nothing put there since the
    listing can hang the scan."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a link or a socket now: not what was listed
            return None
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > cap:
            return None
        data = read_capped(f, st.st_size, cap)
    return data if len(data) <= cap else None


_scanners: dict[tuple[str, tuple[str, ...], int, str], Scanner] = {}
_scanners_lock = threading.Lock()


def scanner_for(root: Path, exclude: Sequence[str], size_cap: int, secrets: SecretCheck) -> Scanner:
    """The process's scanner of this workspace (its stat cache lives as long as the process);
    one per set of secrets withheld, as its cache holds what it withheld."""
    key = (str(root), tuple(exclude), size_cap, secrets.key)
    with _scanners_lock:
        found = _scanners.get(key)
        if found is None:
            found = _scanners[key] = Scanner(root, exclude, size_cap, secrets)
        return found
