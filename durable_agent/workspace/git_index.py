"""Which files git tracks, read from the repository's index file, without running git.

The `exclude` setting's default leaves out the folders tools generate (`venv/`,
`node_modules/`, `__pycache__/`…), but a file git tracks in one is the user's and stays in
the snapshots. git is not run to ask (scan.py never runs it: a planted `core.fsmonitor`
would run a command of the workspace's choosing, and the user's index must not change):
the index is parsed here, versions 2 to 4, SHA-1 and SHA-256 repositories, only far enough
to list paths. An index that cannot be read lists nothing: those folders are left out, as
an untracked one is.
"""

from __future__ import annotations

import os
import re
import stat
import struct

MAX_INDEX_BYTES = 256 << 20  # far above the index of any repository a run works in
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


def _sha256(gitdir: bytes) -> bool:
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
        paths = _paths(data, 32 if _sha256(os.path.dirname(index)) else 20)
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
    signature, version, count = struct.unpack_from(">4sII", data, 0)
    if signature != b"DIRC" or version not in (2, 3, 4):
        raise ValueError("not a git index of version 2, 3 or 4")
    fixed = 40 + hash_size  # ctime, mtime, dev, ino, mode, uid, gid, size; the object id
    pos, previous, paths = 12, b"", []
    for _ in range(count):
        (flags,) = struct.unpack_from(">H", data, pos + fixed)
        name_at = pos + fixed + 2 + (2 if version >= 3 and flags & 0x4000 else 0)
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
        paths.append(path)
        previous = path
    return paths


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """git's offset encoding (varint.c): 7 bits a byte, each continuation adding one."""
    byte = data[pos]
    value = byte & 0x7F
    while byte & 0x80:
        pos += 1
        byte = data[pos]
        value = ((value + 1) << 7) | (byte & 0x7F)
    return value, pos + 1
