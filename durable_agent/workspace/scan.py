"""Walking a workspace into a manifest, hashing only what changed (like git's index).

A file whose lstat (mtime, ctime, size, inode, mode) equals the one cached from the last
scan keeps its cached hash without being read. Except a *racy* one: modified within
RACY_NS of the scan that cached it, it may have changed again inside the same timestamp
tick, so it is hashed again (git's "racily clean" rule).

What is left out: paths matched by the `exclude` setting (gitignore syntax, applied at the
root) and by every `.gitignore` in the tree (a deeper file wins, as in git), sockets and
other special files. A file over the size cap is an entry of kind `big` (size only). The
walk only reads: it never runs git and never writes, so the user's repository (index,
HEAD, refs, config, hooks) cannot change and no git identity is needed.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_agent.workspace.manifest import BIG, DIR, FILE, LINK, Entry, Manifest

RACY_NS = 100_000_000  # 100 ms: coarse file system clocks tick slower than time_ns()
DEFAULT_EXCLUDE = (".git/", "node_modules/", ".venv/", "__pycache__/")

StatKey = tuple[int, int, int, int, int]


@dataclass
class Scan:
    manifest: Manifest
    contents: dict[str, bytes] = field(default_factory=dict)  # hash -> bytes read in this scan
    skipped: list[bytes] = field(default_factory=list)  # over the size cap
    changed: bool = True  # False: the same manifest as this scanner's previous scan


def _spec(lines: Sequence[str]) -> Any:
    import pathspec  # lazy: only a run that snapshots pays for it

    return pathspec.GitIgnoreSpec.from_lines(lines)


class Scanner:
    """One workspace's walker and stat cache. Thread-safe (a worker runs several runs)."""

    def __init__(self, root: Path, exclude: Sequence[str], size_cap: int) -> None:
        self.root = os.fsencode(str(root))
        self.size_cap = size_cap
        self.exclude = _spec(list(exclude))
        self.lock = threading.Lock()
        self._cache: dict[bytes, tuple[StatKey, Entry, bool]] = {}  # path -> key, entry, racy
        self._ignores: dict[bytes, tuple[StatKey, Any]] = {}  # dir -> .gitignore key, spec
        self._decisions: dict[tuple[bytes, bool], bool] = {}  # (path, is_dir) -> ignored
        self._previous: Manifest | None = None
        self._ignore_epoch = 0  # +1 whenever a .gitignore changed (every decision is made again)
        self._cache_epoch = -1  # the ignore epoch the stat cache was built under
        self._changed = False  # set by the walk when an entry is new or differs

    def scan(self) -> Scan:
        with self.lock:
            started = time.time_ns()
            out = Scan({})
            cache: dict[bytes, tuple[StatKey, Entry, bool]] = {}
            self._changed = False
            if os.path.isdir(self.root):
                self._walk(b"", [], out, cache, started)
            previous = self._previous
            # No entry new or different and as many as before: the same paths, the same manifest.
            out.changed = self._changed or previous is None or len(previous) != len(out.manifest)
            self._cache = cache
            self._cache_epoch = self._ignore_epoch
            self._previous = out.manifest
            return out

    def forget(self) -> None:
        """Drop the stat cache (the next scan hashes every file again)."""
        with self.lock:
            self._cache.clear()
            self._previous = None

    # -- ignoring ------------------------------------------------------------------------------
    def _gitignore(self, rel_dir: bytes) -> Any:
        path = os.path.join(self.root, rel_dir, b".gitignore")
        try:
            st = os.lstat(path)
        except OSError:
            if rel_dir in self._ignores:
                del self._ignores[rel_dir]
                self._decisions.clear()
                self._ignore_epoch += 1
            return None
        key = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode)
        known = self._ignores.get(rel_dir)
        if known is not None and known[0] == key:
            return known[1]
        try:
            with open(path, "rb") as f:
                lines = f.read().decode("utf-8", "surrogateescape").splitlines()
        except OSError:
            lines = []
        spec = _spec(lines)
        self._ignores[rel_dir] = (key, spec)
        self._decisions.clear()  # a .gitignore changed: every decision is made again
        self._ignore_epoch += 1
        return spec

    def _ignored(self, rel: bytes, is_dir: bool, specs: list[tuple[bytes, Any]]) -> bool:
        known = self._decisions.get((rel, is_dir))
        if known is not None:
            return known
        text = os.fsdecode(rel) + ("/" if is_dir else "")
        decided: bool | None = None
        for base, spec in reversed(specs):  # the deepest .gitignore that has a say wins
            sub = text[len(os.fsdecode(base)) + 1:] if base else text
            result = spec.check_file(sub).include
            if result is not None:
                decided = bool(result)
                break
        if decided is None:
            decided = bool(self.exclude.check_file(text).include)
        elif self.exclude.check_file(text).include:
            decided = True  # the exclude setting is never overridden by a `!` in a .gitignore
        self._decisions[(rel, is_dir)] = decided
        return decided

    # -- walking -------------------------------------------------------------------------------
    def _walk(self, rel_dir: bytes, specs: list[tuple[bytes, Any]], out: Scan,
              cache: dict[bytes, tuple[StatKey, Entry, bool]], started: int) -> int:
        # The hot loop of an unchanged workspace: one lstat and a few dict lookups per file.
        spec = self._gitignore(rel_dir)
        if spec is not None:
            specs = [*specs, (rel_dir, spec)]
        found = 0
        try:
            entries = list(os.scandir(os.path.join(self.root, rel_dir) if rel_dir else self.root))
        except OSError:
            return 0
        decisions, old_cache, manifest = self._decisions, self._cache, out.manifest
        previous = self._previous or {}
        racy_after = started - RACY_NS
        epoch = self._ignore_epoch
        for item in entries:
            rel = rel_dir + b"/" + item.name if rel_dir else item.name
            try:
                is_dir = item.is_dir(follow_symlinks=False)
                if is_dir:
                    ignored = decisions.get((rel, True))
                    if ignored is None:
                        ignored = self._ignored(rel, True, specs)
                    if ignored:
                        continue
                    if self._walk(rel, specs, out, cache, started) == 0:
                        entry = Entry(DIR, stat.S_IMODE(item.stat(follow_symlinks=False).st_mode) & 0o777)
                        manifest[rel] = entry
                        if previous.get(rel) != entry:
                            self._changed = True
                    found += 1
                    continue
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since the listing
            mode = st.st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                continue
            old = old_cache.get(rel)
            # In the last scan's cache: not ignored then, and no .gitignore changed since.
            if old is None or self._ignore_epoch != epoch or self._ignore_epoch != self._cache_epoch:
                ignored = decisions.get((rel, False))
                if ignored is None:
                    ignored = self._ignored(rel, False, specs)
                if ignored:
                    continue
            found += 1
            key: StatKey = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, mode)
            if old is not None and old[0] == key and not old[2]:
                entry = old[1]
            else:
                made = self._entry(item.path, st, out, rel)
                if made is None:
                    continue
                entry = made
                if old is None or old[1] != entry:
                    self._changed = True
            cache[rel] = (key, entry, st.st_mtime_ns >= racy_after)
            manifest[rel] = entry
        return found

    def _entry(self, path: bytes, st: os.stat_result, out: Scan, rel: bytes) -> Entry | None:
        try:
            if stat.S_ISLNK(st.st_mode):
                return Entry(LINK, target=os.readlink(path))
            if st.st_size > self.size_cap:
                out.skipped.append(rel)
                return Entry(BIG, stat.S_IMODE(st.st_mode) & 0o777, size=st.st_size)
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None  # vanished or unreadable between the listing and now
        digest = hashlib.sha256(data).hexdigest()
        out.contents[digest] = data
        return Entry(FILE, stat.S_IMODE(st.st_mode) & 0o777, digest, size=len(data))


_scanners: dict[tuple[str, tuple[str, ...], int], Scanner] = {}
_scanners_lock = threading.Lock()


def scanner_for(root: Path, exclude: Sequence[str], size_cap: int) -> Scanner:
    """The process's scanner of this workspace (its stat cache lives as long as the process)."""
    key = (str(root), tuple(exclude), size_cap)
    with _scanners_lock:
        found = _scanners.get(key)
        if found is None:
            found = _scanners[key] = Scanner(root, exclude, size_cap)
        return found
