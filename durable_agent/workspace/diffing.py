"""What `durable-agent diff` prints: a patch in git's format, which `git apply` applies.

`diff --git` headers with git's modes (`new file mode 100644`, `deleted file mode`, `old
mode`/`new mode` for the executable bit, symlinks as mode 120000 with their target as the
content, no newline after it) and `index` lines with git's blob ids, unified hunks for
text, and `GIT binary patch` (zlib, then git's base85) for binary files. A path whose kind
changes (a file becomes a symlink) is a deletion and a creation, as git writes it. Names
git would quote (spaces, quotes, control and non-ASCII bytes) are quoted as git quotes
them, so a name holding a newline cannot forge a line of the patch.

What the patch cannot carry is a `# ` comment line, which `git apply` skips: a file that
held a secret was never stored (workspace/secrets.py), one over the snapshot size cap was
never stored either; directories are not in it (git keeps none).
"""

from __future__ import annotations

import difflib
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from durable_agent.encoding import looks_binary
from durable_agent.workspace.git_baseline import git_blob_id, ref_format
from durable_agent.workspace.manifest import (
    BIG,
    DIR,
    FILE,
    GIT_REF,
    LINK,
    Change,
    Entry,
    Manifest,
)
from durable_agent.workspace.secrets import HELD

Blob = Callable[[str], bytes]

NO_BLOB = "0" * 40
# git's base85 alphabet (base85.c). It is the same as RFC 1924's (base64.b85encode's): what
# is git's own is the framing, one length character then at most 52 bytes a line.
GIT85 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
# Bytes a name may hold unquoted. A space is kept as it is inside quotes, but a name with
# one is quoted all the same: `diff --git a/x y b/x y` is ambiguous to read back.
_PLAIN = frozenset(range(0x21, 0x7F)) - {0x22, 0x5C}
_C_ESCAPES = {7: b"a", 8: b"b", 9: b"t", 10: b"n", 11: b"v", 12: b"f", 13: b"r", 0x22: b'"'}
_C_ESCAPES[0x5C] = b"\\"


def git_name(prefix: bytes, path: bytes) -> bytes:
    """`a/x` as git writes it; quoted C-style (octal for other bytes) when it must be."""
    full = prefix + path
    if all(c in _PLAIN for c in full):
        return full
    out = bytearray(b'"')
    for c in full:
        if c in _PLAIN or c == 0x20:
            out.append(c)
        elif c in _C_ESCAPES:
            out += b"\\" + _C_ESCAPES[c]
        else:
            out += b"\\%03o" % c
    return bytes(out) + b'"'


def base85_line(chunk: bytes) -> bytes:
    """One line of a binary hunk: its length (A-Z: 1-26, a-z: 27-52), then each 4 bytes
    (zero-padded) as 5 characters, most significant first."""
    n = len(chunk)
    out = bytearray([ord("A") + n - 1 if n <= 26 else ord("a") + n - 27])
    padded = chunk + b"\0" * (-n % 4)
    for i in range(0, len(padded), 4):
        acc = int.from_bytes(padded[i : i + 4], "big")
        group = bytearray(5)
        for j in range(4, -1, -1):
            acc, digit = divmod(acc, 85)
            group[j] = GIT85[digit]
        out += group
    return bytes(out) + b"\n"


def binary_hunk(data: bytes) -> bytes:
    packed = zlib.compress(data, 9)
    lines = b"".join(base85_line(packed[i : i + 52]) for i in range(0, len(packed), 52))
    return b"literal %d\n" % len(data) + lines + b"\n"


def _git_mode(e: Entry) -> bytes:
    if e.kind == LINK:
        return b"120000"
    return b"100755" if e.mode & 0o100 else b"100644"  # git keeps only the owner's x bit


def _content(e: Entry | None, blob: Blob) -> bytes:
    if e is None:
        return b""
    return e.target if e.kind == LINK else blob(e.ref)


def _lines(data: bytes) -> list[str]:
    """Lines as git counts them (only `\\n` ends one), each byte one character (latin-1),
    so every byte comes back as it was."""
    parts = data.decode("latin-1").split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _note(text: str) -> bytes:
    return ("# " + text + "\n").encode("utf-8", "surrogateescape")


def _section(
    path: bytes, a: Entry | None, b: Entry | None, blob: Blob, *, binary: bool
) -> Iterator[bytes]:
    ga, gb = git_name(b"a/", path), git_name(b"b/", path)
    before, after = _content(a, blob), _content(b, blob)
    head = [b"diff --git " + ga + b" " + gb + b"\n"]
    same_mode = a is not None and b is not None and _git_mode(a) == _git_mode(b)
    if b is None:
        assert a is not None
        head.append(b"deleted file mode " + _git_mode(a) + b"\n")
    elif a is None:
        head.append(b"new file mode " + _git_mode(b) + b"\n")
    elif not same_mode:
        head.append(b"old mode " + _git_mode(a) + b"\nnew mode " + _git_mode(b) + b"\n")
    if a is not None and b is not None and before == after:
        if not same_mode:  # (a change git cannot see, e.g. 644 to 600, is left out)
            yield from head
        return
    ids = (NO_BLOB if a is None else git_blob_id(before)) + ".."
    ids += NO_BLOB if b is None else git_blob_id(after)
    mode = b" " + _git_mode(a) if same_mode and a is not None else b""
    head.append(b"index " + ids.encode() + mode + b"\n")
    yield from head
    if not before and not after:
        return  # a new or deleted empty file: the header says it all
    if looks_binary(before) or looks_binary(after):
        if binary:
            yield b"GIT binary patch\n" + binary_hunk(after) + binary_hunk(before)
        else:
            yield b"Binary files " + ga + b" and " + gb + b" differ\n"
        return
    yield b"--- " + (b"/dev/null" if a is None else ga) + b"\n"
    yield b"+++ " + (b"/dev/null" if b is None else gb) + b"\n"
    hunks = difflib.unified_diff(_lines(before), _lines(after), lineterm="\n")
    for n, line in enumerate(hunks):
        if n >= 2:  # (difflib's own ---/+++ lines: ours are above)
            raw = line.encode("latin-1")
            yield raw if raw.endswith(b"\n") else raw + b"\n\\ No newline at end of file\n"


def patch(
    old: Manifest, new: Manifest, changes: list[Change], blob: Blob, *, binary: bool = True
) -> Iterator[bytes]:
    """The changes as a patch `git apply` applies (bytes: file contents are not text).
    `binary` False: a binary file is one `Binary files … differ` line (the web view)."""
    for c in changes:
        a, b = old.get(c.path), new.get(c.path)
        a, b = (None if e is None or e.kind == DIR else e for e in (a, b))
        if a is None and b is None:
            continue  # a directory: git keeps none
        name = c.shown
        if c.secret:  # (before any content: nothing of it is read, not even an older copy)
            yield _note(f"File a/{name} or b/{name} {HELD}: not shown, left out of this patch")
            continue
        if BIG in (a.kind if a else "", b.kind if b else ""):
            yield _note(
                f"File a/{name} or b/{name} is over the snapshot size cap: not compared, "
                "left out of this patch"
            )
            continue
        if a is not None and b is not None and (a.kind == LINK) != (b.kind == LINK):
            yield from _section(c.path, a, None, blob, binary=binary)
            yield from _section(c.path, None, b, blob, binary=binary)
        else:
            yield from _section(c.path, a, b, blob, binary=binary)


def unified(old: Manifest, new: Manifest, changes: list[Change], blob: Blob) -> Iterator[str]:
    """The patch as text for a page (the web view): binary files as one line."""
    for chunk in patch(old, new, changes, blob, binary=False):
        yield chunk.decode("utf-8", "replace")


def stat_lines(changes: list[Change]) -> Iterator[str]:
    width = max((len(c.shown) for c in changes), default=0)
    for c in changes:
        held = f" ({HELD})" if c.secret else ""
        yield f" {c.shown:<{width}} | {c.change:<8} {c.bytes} bytes{held}\n"
    counts = {
        kind: sum(1 for c in changes if c.change == kind)
        for kind in ("added", "modified", "deleted", "mode")
    }
    yield (
        " "
        + ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)
        + (" (no changes)" if not changes else "")
        + "\n"
    )


def step_range(engine: Any, run_id: str, seq: int) -> tuple[str | None, str | None] | None:
    """The snapshots (before, after) between which step `seq` changed files; (None, None)
    for a step that changes none (a model call, a read); None: no such step."""
    from durable_agent.store.blobs import step_trees

    trees = step_trees(engine, run_id, seq)
    if trees is None:
        return None
    return trees if trees[1] is not None else (None, None)


def between(
    engine: Any, before: str | None, after: str | None
) -> tuple[Manifest, Manifest, list[Change], Any]:
    """The manifests of two snapshots (none: empty / unchanged), their changes, and the blob
    store to read contents from (`unified`)."""
    from durable_agent.store.blobs import BlobStore
    from durable_agent.workspace import snapshot
    from durable_agent.workspace.manifest import changes

    blobs = BlobStore(engine)
    old: Manifest = snapshot.load(blobs, before) if before else {}
    new: Manifest = snapshot.load(blobs, after) if after else old
    return old, new, changes(old, new, same=same_bytes(old, new, blobs)), blobs


def same_bytes(old: Manifest, new: Manifest, blobs: Any) -> dict[str, str]:
    """New content ids that name the bytes of the old one at their path: a file named by
    a git commit's blob (`git:`) in one tree and by its sha256 in the other, as a run's
    trees name it once resumed outside the checkout (the scanner that saw both knew, in its
    process: Scanner.same_bytes). Told by git's hash of the stored bytes."""
    pairs = [
        (a.ref, b.ref)
        for path, b in new.items()
        if (a := old.get(path)) is not None
        and a.kind == b.kind == FILE
        and a.size == b.size
        and a.ref.startswith(GIT_REF) != b.ref.startswith(GIT_REF)
    ]
    stored = blobs.blobs([r for pair in pairs for r in pair if not r.startswith(GIT_REF)])
    same: dict[str, str] = {}
    for was, now in pairs:
        git_ref, sha = (was, now) if was.startswith(GIT_REF) else (now, was)
        data = stored.get(sha)
        if data is not None and GIT_REF + git_blob_id(data, ref_format(git_ref)) == git_ref:
            same[now] = was
    return same


def step_diff(engine: Any, run_id: str, seq: int) -> Iterator[str] | None:
    """The unified diff of what step `seq` changed (None: no such step; empty: a step that
    changes no files, or a store without snapshots). `diff --step` and the web view."""
    trees = step_range(engine, run_id, seq)
    if trees is None:
        return None
    old, new, found, blobs = between(engine, *trees)
    return unified(old, new, found, blobs.blob)
