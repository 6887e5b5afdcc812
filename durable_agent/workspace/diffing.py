"""Unified diffs between two manifests (what `durable-agent diff` prints).

Text files as `diff -u` does, with git's headers for what `diff` cannot say: new and
deleted files, permission changes, symlinks (their targets as the content), and binary
files ("Binary files a/x and b/x differ"). A file that held a secret was never stored: its
diff says so, and shows nothing of it (workspace/secrets.py). File names that are not UTF-8 are shown with
`\\xHH` for each such byte.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Any

from durable_agent.encoding import looks_binary
from durable_agent.workspace.manifest import BIG, DIR, FILE, LINK, SECRET, Change, Entry, Manifest
from durable_agent.workspace.secrets import HELD

Blob = Callable[[str], bytes]


def _content(entry: Entry | None, blob: Blob) -> bytes | None:
    if entry is None or entry.kind == DIR:
        return b""
    if entry.kind == LINK:
        return entry.target + b"\n"
    if entry.kind == FILE:
        return blob(entry.ref)
    return None  # over the size cap: never stored


def _what(e: Entry) -> str:
    if e.kind == SECRET:
        return f"file ({HELD})"
    return (
        "symlink"
        if e.kind == LINK
        else f"{'directory' if e.kind == DIR else 'file'} mode {e.mode:o}"
    )


def unified(old: Manifest, new: Manifest, changes: list[Change], blob: Blob) -> Iterator[str]:
    for c in changes:
        a, b = old.get(c.path), new.get(c.path)
        name = c.shown
        yield f"diff --durable-agent a/{name} b/{name}\n"
        if a is None and b is not None:
            yield f"new {_what(b)}\n"
        elif b is None and a is not None:
            yield f"deleted {_what(a)}\n"
        elif a is not None and b is not None and a.mode != b.mode:
            yield f"old mode {a.mode:o}\nnew mode {b.mode:o}\n"
        if c.change == "mode":
            continue
        if c.secret:  # (before _content: nothing of it is read, not even an older stored copy)
            yield f"File a/{name} or b/{name} {HELD}: not shown\n"
            continue
        before, after = _content(a, blob), _content(b, blob)
        if (
            before is None
            or after is None
            or (a is not None and a.kind == BIG)
            or (b is not None and b.kind == BIG)
        ):
            yield f"File a/{name} or b/{name} is over the snapshot size cap: not compared\n"
            continue
        if looks_binary(before) or looks_binary(after):
            yield f"Binary files a/{name} and b/{name} differ\n"
            continue
        left = before.decode("utf-8", "replace").splitlines(keepends=True)
        right = after.decode("utf-8", "replace").splitlines(keepends=True)
        for line in difflib.unified_diff(
            left,
            right,
            "/dev/null" if a is None else f"a/{name}",
            "/dev/null" if b is None else f"b/{name}",
        ):
            yield line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"


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
    return old, new, changes(old, new), blobs


def step_diff(engine: Any, run_id: str, seq: int) -> Iterator[str] | None:
    """The unified diff of what step `seq` changed (None: no such step; empty: a step that
    changes no files, or a store without snapshots). `diff --step` and the web view."""
    trees = step_range(engine, run_id, seq)
    if trees is None:
        return None
    old, new, found, blobs = between(engine, *trees)
    return unified(old, new, found, blobs.blob)
