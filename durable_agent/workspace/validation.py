"""Every entry of a stored manifest checked before a restore touches the disk.

A store can be shared, copied or edited by hand: what a manifest says is not trusted. A
restore (`restore`, `fork`, `approve --deny` on drift, a rebuilt workspace on resume) first
checks all of it, and refuses with one line, having deleted and written nothing, when an
entry is one no scan records:

    path    empty, `.`, `..`, absolute, an empty part (`a//b`), NUL, a part longer than a
            file name can be, beneath an entry that is no folder (a link, a file), or a
            path the `exclude` setting leaves out (a `.git/hooks` file would run at the
            user's next git command)
    kind    not one of manifest.KINDS
    mode    not permission bits alone (0 to 0o777: no set-uid, set-gid or sticky bit)
    ref     a file's or a withheld file's not a sha256 hex digest
    target  a link's empty or holding NUL
    size    not a count of bytes
    blob    a file's content missing from the store
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

from durable_agent.errors import StoreError
from durable_agent.workspace.ignore_rules import matchable
from durable_agent.workspace.manifest import (
    BIG,
    DIR,
    FILE,
    KINDS,
    LINK,
    SECRET,
    Change,
    Entry,
    Manifest,
)
from durable_agent.workspace.scan import Scanner

_DIGEST = re.compile(r"[0-9a-f]{64}|git:(?:[0-9a-f]{40}|[0-9a-f]{64})")  # sha256, git blob id
NAME_MAX = 255  # bytes of one file name (Linux, every common file system)
SIZE_MAX = 1 << 62

Present = Callable[[Iterable[str]], set[str]]  # BlobStore.present_blobs


def _shown(path: bytes) -> str:
    return "'" + Change(path, "added", 0).shown[:200] + "'"


def _bad(path: bytes, why: str) -> StoreError:
    return StoreError(
        f"workspace snapshot path {_shown(path)} {why}; the snapshot was edited or damaged "
        "in the store, so nothing was restored (nothing changed)"
    )


def check_manifest(
    target: Manifest, scanner: Scanner, present: Present | None, blob: Callable[[str], bytes]
) -> None:
    """Raise StoreError (one line) for the first entry of `target` no scan records, or a
    file whose blob the store lacks (asked of `present`, else read through `blob`)."""
    excluded: dict[str, bool] = {}

    def left_out(text: str) -> bool:
        found = excluded.get(text)
        if found is None:
            found = excluded[text] = bool(scanner.exclude.check_file(matchable(text)).include)
        return found

    refs: set[str] = set()
    for rel, entry in target.items():
        _check_path(rel)
        _check_entry(rel, entry)
        parts = os.fsdecode(rel).split("/")
        _check_parents(target, rel)
        for i in range(1, len(parts)):
            if left_out("/".join(parts[:i]) + "/"):
                raise _bad(rel, "is below a folder the exclude setting leaves out of snapshots")
        if left_out("/".join(parts) + ("/" if entry.kind == DIR else "")):
            raise _bad(rel, "is left out of snapshots by the exclude setting")
        if entry.kind == FILE:
            refs.add(entry.ref)
    missing = _missing(refs, present, blob)
    if missing:
        path = min(p for p, e in target.items() if e.kind == FILE and e.ref == missing)
        raise _bad(path, f"names content {missing[:12]}… that is not in the store")


def _check_path(rel: bytes) -> None:
    if not isinstance(rel, bytes) or not rel:
        raise _bad(b"", "is empty")
    if b"\0" in rel:
        raise _bad(rel, "holds a NUL byte")
    if rel.startswith(b"/"):
        raise _bad(rel, "is not inside the workspace (absolute)")
    for part in rel.split(b"/"):
        if part in (b"", b".", b".."):
            raise _bad(rel, "is not inside the workspace (an empty, `.` or `..` part)")
        if len(part) > NAME_MAX:
            raise _bad(rel, f"has a name longer than {NAME_MAX} bytes")


def _check_parents(target: Manifest, rel: bytes) -> None:
    """A scan records a path only beneath folders: an entry beneath a link (to outside,
    maybe) or a file is one no scan made, and a restore would write through it."""
    at = rel.rfind(b"/")
    while at > 0:
        parent = target.get(rel[:at])
        if parent is not None and parent.kind != DIR:
            raise _bad(rel, f"lies beneath {_shown(rel[:at])}, which is a {parent.kind}")
        at = rel.rfind(b"/", 0, at)


def _check_entry(rel: bytes, e: Entry) -> None:
    if e.kind not in KINDS:
        raise _bad(rel, f"is of an unknown kind {e.kind[:40]!r}")
    if not 0 <= e.mode <= 0o777:
        raise _bad(rel, f"has mode {e.mode:o}, not permission bits alone (0 to 777)")
    if not 0 <= e.size <= SIZE_MAX:
        raise _bad(rel, f"has size {e.size}")
    if e.kind in (FILE, SECRET) and not _DIGEST.fullmatch(e.ref):
        raise _bad(rel, "names its content by no sha256 digest")
    if e.kind == LINK and (not e.target or b"\0" in e.target):
        raise _bad(rel, "is a link with an empty target or one holding NUL")
    if e.kind in (DIR, BIG) and e.target:
        raise _bad(rel, f"is a {e.kind} with a link target")


def _missing(refs: set[str], present: Present | None, blob: Callable[[str], bytes]) -> str | None:
    """The first of `refs` the store lacks."""
    if not refs:
        return None
    if present is not None:
        found = present(refs)
        lacking = sorted(refs - found)
        return lacking[0] if lacking else None
    for ref in sorted(refs):  # no presence query at hand: read each (and drop it)
        try:
            blob(ref)
        except KeyError:
            return ref
    return None
