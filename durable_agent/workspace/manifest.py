"""A workspace snapshot's manifest: relative path (bytes) -> Entry, and its stored form.

Paths are the file system's bytes, so a name that is not UTF-8 round-trips exactly. In the
stored JSON a path (and a link's target) is a string when it is UTF-8 and `{"b": base64}`
otherwise: unambiguous, and readable for the common case. The tree id is a hash of a
canonical byte serialisation of the full manifest (in buckets: TreeIds), so equal
workspaces have equal ids whatever delta chain stored them.

Entry kinds: `file` (ref = sha256 of its bytes), `link` (target = the link's bytes, never
followed), `dir` (an empty directory; others are implied by their files), `big` (over the
size cap: recorded by size only, never stored, and left alone by restore), `secret` (held
a secret: ref = sha256 of its bytes, size, mode; never stored, and left alone by restore:
workspace/secrets.py). A manifest stored before `secret` existed reads as it was.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import json
import os
import re
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec
from msgspec import Struct

from durable_agent.encoding import show_name

FILE, LINK, DIR, BIG, SECRET = "file", "link", "dir", "big", "secret"
KINDS = frozenset({FILE, LINK, DIR, BIG, SECRET})
GIT_REF = "git:"  # a file's content id that is a git blob id (the commit holds the bytes)


class Entry(Struct, frozen=True, gc=False):
    kind: str
    mode: int = 0  # permission bits (st_mode & 0o777) of files and directories
    ref: str = ""  # file: sha256 hex of the content
    target: bytes = b""  # link: what it points to
    size: int = 0  # file / big: bytes


Manifest = dict[bytes, Entry]


class Change(Struct, frozen=True):
    path: bytes
    change: str  # added | modified | deleted | mode
    bytes: int
    secret: bool = False  # either side held a secret: its content was never stored

    @property
    def shown(self) -> str:
        """For people (diff, show, the step_changes view): undecodable bytes and control
        characters as `\\xHH`, so a name holding a newline cannot forge a line of a diff."""
        return _CONTROL.sub(_escaped, show_name(self.path.decode("utf-8", "surrogateescape")))


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _escaped(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def _enc(raw: bytes) -> Any:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"b": base64.b64encode(raw).decode("ascii")}


def _dec(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    return base64.b64decode(value["b"])


def _entry_json(path: bytes, e: Entry) -> list[Any]:
    return [_enc(path), e.kind, e.mode, e.ref, _enc(e.target), e.size]


def _entry_from(row: Any) -> tuple[bytes, Entry]:
    """A stored row; ValueError for one no version wrote (a store edited by hand)."""
    try:
        path, kind, mode, ref, target, size = row
        if not (
            isinstance(kind, str)
            and isinstance(ref, str)
            and all(type(n) is int for n in (mode, size))  # (not a bool, not a float)
        ):
            raise TypeError
        return _dec(path), Entry(kind, mode, ref, _dec(target), size)
    except (TypeError, ValueError, KeyError, AttributeError, binascii.Error):
        raise ValueError(f"a manifest row no version writes: {_shown_row(row)}") from None


def _shown_row(row: Any) -> str:
    text = json.dumps(row, ensure_ascii=True)
    return text if len(text) <= 120 else text[:100] + "..."


def _line(path: bytes, e: Entry) -> bytes:
    return b"%s\0%s\0%o\0%s\0%s\0%d\n" % (
        path,
        e.kind.encode(),
        e.mode,
        e.ref.encode(),
        e.target,
        e.size,
    )


def updated(
    previous: Mapping[bytes, Entry], entries: Mapping[bytes, Entry], deleted: Iterable[bytes]
) -> Manifest:
    """`previous` with `entries` set and `deleted` gone, as a new manifest (`previous` is
    left as it is: a stored snapshot may hold it)."""
    manifest = dict(previous)
    for path in deleted:
        manifest.pop(path, None)
    manifest.update(entries)
    return manifest


def tree_id(manifest: Mapping[bytes, Entry]) -> str:
    return TreeIds().rebuild(manifest)


BUCKETS = 1024  # of a tree id: a path's is crc32(path) % BUCKETS


class TreeIds:
    """`tree_id` of a manifest that changes a few paths at a time. The id is the sha256 of
    the sha256s of BUCKETS buckets, each the canonical lines of its paths in order: a
    one-file edit hashes its bucket's lines again, not those of all 50,000 files (5 MB).
    Equal manifests have equal ids, whatever delta chain stored them. A bucket's lines are
    made when it is hashed, not kept (5 MB at 50,000 files)."""

    REBUILD_AT = 256  # more changes than this: sort and serialise everything again

    def __init__(self) -> None:
        self.paths: list[list[bytes]] = [[] for _ in range(BUCKETS)]
        self.digests = [_EMPTY] * BUCKETS
        self.id = self._digest()

    def rebuild(self, manifest: Mapping[bytes, Entry]) -> str:
        paths = sorted(manifest)
        self.paths = _bucketed(paths)
        self.digests = [
            hashlib.sha256(lines).digest() if lines else _EMPTY
            for lines in bucket_lines(paths, manifest)
        ]
        return self._digest()

    def update(
        self,
        manifest: Mapping[bytes, Entry],
        entries: Mapping[bytes, Entry],
        deleted: Sequence[bytes],
    ) -> str:
        """The id of `manifest`, which is the last one's with `entries` set and `deleted` gone."""
        if len(entries) + len(deleted) > self.REBUILD_AT:
            return self.rebuild(manifest)
        touched: set[int] = set()
        for path in deleted:
            b = zlib.crc32(path) % BUCKETS
            paths = self.paths[b]
            i = bisect.bisect_left(paths, path)
            if i < len(paths) and paths[i] == path:
                del paths[i]
                touched.add(b)
        for path in entries:
            b = zlib.crc32(path) % BUCKETS
            paths = self.paths[b]
            i = bisect.bisect_left(paths, path)
            if i == len(paths) or paths[i] != path:
                paths.insert(i, path)
            touched.add(b)
        for b in touched:
            paths = self.paths[b]
            self.digests[b] = hashlib.sha256(joined(paths, manifest)).digest() if paths else _EMPTY
        return self._digest()

    def _digest(self) -> str:
        self.id = hashlib.sha256(b"".join(self.digests)).hexdigest()
        return self.id


def _bucketed_py(paths: list[bytes]) -> list[list[bytes]]:
    """`paths` in BUCKETS lists, each those (in order) of zlib.crc32(path) % BUCKETS; what
    _speedups.bucketed answers in C, this where it could not be built."""
    out: list[list[bytes]] = [[] for _ in range(BUCKETS)]
    for path in paths:
        out[zlib.crc32(path) % BUCKETS].append(path)
    return out


def _joined_py(paths: list[bytes], manifest: Mapping[bytes, Entry]) -> bytes:
    """The canonical lines of `paths` in `manifest`, joined; _speedups.joined in C."""
    return b"".join([_line(p, manifest[p]) for p in paths])


def joined(paths: list[bytes], manifest: Mapping[bytes, Entry]) -> bytes:
    return _in_c(_joined, _joined_py, paths, manifest)


def _bucket_lines_py(paths: list[bytes], manifest: Mapping[bytes, Entry]) -> list[bytes]:
    """The lines of each bucket's paths (`paths` in order), joined; _speedups.bucket_lines in
    C, in one pass."""
    return [_joined_py(each, manifest) for each in _bucketed_py(paths)]


def bucket_lines(paths: list[bytes], manifest: Mapping[bytes, Entry]) -> list[bytes]:
    return _in_c(_bucket_lines, _bucket_lines_py, paths, manifest)


Out = TypeVar("Out")


def _in_c(
    c: Callable[[list[bytes], dict[bytes, Entry]], Out],
    python: Callable[[list[bytes], Mapping[bytes, Entry]], Out],
    paths: list[bytes],
    manifest: Mapping[bytes, Entry],
) -> Out:
    """`c`'s answer of a plain dict, `python`'s of anything else or where C says a mode or
    size is past 64 bits (a store edited by hand)."""
    if type(manifest) is dict:
        try:
            return c(paths, manifest)
        except OverflowError:
            pass
    return python(paths, manifest)


def _no_json_rows(paths: list[bytes], manifest: Mapping[bytes, Entry]) -> bytes | None:
    return None  # (without C: _rows_json writes every row)


def _git_delta_py(
    manifest: Mapping[bytes, Entry], files: Mapping[bytes, str]
) -> tuple[int, list[bytes], list[bytes], list[bytes]]:
    """(mode, differing, gone, ours): what encode_head stores of `manifest` beside the
    commit's regular files `files` (path -> blob id). An entry is the commit's when it is a
    file named `git:` and the blob at its path, of permission bits `mode`: the commonest
    bits among such files (0o644 where it is among the commonest, else the lowest of them).
    `ours`: the paths of those, `differing`: the manifest's other paths, each in the
    manifest's order; `gone`: the paths of `files` it lacks, in their order. What
    _speedups.git_delta answers in C."""
    modes: list[int] = []
    counts = [0] * 0o1000
    for path, e in manifest.items():
        blob = files.get(path)
        m = e.mode
        commits = (
            blob is not None
            and e.kind == FILE
            and type(m) is int
            and 0 <= m < 0o1000
            and e.ref == GIT_REF + blob
            and e.target == b""
        )
        modes.append(m if commits else -1)
        if commits:
            counts[m] += 1
    mode = 0o644
    for m in range(0o1000):
        if counts[m] > counts[mode]:
            mode = m
    differing: list[bytes] = []
    ours: list[bytes] = []
    for p, m in zip(manifest, modes, strict=True):
        (ours if m == mode else differing).append(p)
    gone = [p for p in files if p not in manifest]
    return mode, differing, gone, ours


try:
    from durable_agent.workspace._speedups import bucket_lines as _bucket_lines
    from durable_agent.workspace._speedups import bucketed as _bucketed
    from durable_agent.workspace._speedups import git_delta as _git_delta
    from durable_agent.workspace._speedups import joined as _joined
    from durable_agent.workspace._speedups import json_rows as _json_rows
except ImportError:  # built without a C compiler: the same answers, slower
    _bucketed, _joined, _json_rows = _bucketed_py, _joined_py, _no_json_rows
    _bucket_lines, _git_delta = _bucket_lines_py, _git_delta_py


_EMPTY = hashlib.sha256(b"").digest()


def encode_full(manifest: Mapping[bytes, Entry]) -> bytes:
    # A whole manifest (a first snapshot: 50,000 rows): its rows written in C where every
    # text is plain ASCII (_speedups.json_rows), else by msgspec; level 1 of zlib, 2.5 times
    # faster than 6 on a manifest, 5% larger.
    return compressed(b'{"full":' + _rows(sorted(manifest), manifest) + b"}")


def _rows(paths: list[bytes], manifest: Mapping[bytes, Entry]) -> bytes:
    rows = _json_rows(paths, manifest) if type(manifest) is dict else None
    return _rows_json(paths, manifest) if rows is None else rows


def encode_head(manifest: Mapping[bytes, Entry], files: Mapping[bytes, str]) -> bytes:
    """A whole manifest stored as what differs from a git commit's files (`files`: path ->
    blob id of its regular files, relative to the workspace): `{"head": {"mode": bits,
    "sizes": [...], "set": rows, "del": paths}}`. Read back (apply_stored) on the listing
    of the commit's files (`git ls-tree -r`): those neither set nor deleted, in the order of
    their paths' bytes, are each a file named `git:` and its blob id, of the permission
    bits `mode` and of its size in `sizes` (the size the snapshot saw: a file git's index
    vouches for at another size than its blob's reads back as it was taken); then `set`
    and `del` as a delta's. A clean checkout of 50,000 files is a few KB where its whole
    manifest was 1.5 MB and 30 ms to write."""
    if type(manifest) is dict and type(files) is dict:
        mode, differing, gone, ours = _git_delta(manifest, files)
    else:
        mode, differing, gone, ours = _git_delta_py(manifest, files)
    ours.sort()
    sizes = msgspec.json.encode([manifest[p].size for p in ours])
    rows = _rows(sorted(differing), manifest)
    drop = msgspec.json.encode([_enc(p) for p in sorted(gone)])
    return compressed(
        b'{"head":{"mode":%d,"sizes":%s,"set":%s,"del":%s}}' % (mode, sizes, rows, drop)
    )


# Bytes of JSON from which compressed() spreads the work: a thread costs about 0.1 ms; a
# 10,000-file manifest's 970 KB took 6.6 ms in one part, 3.8 ms in two.
PARALLEL_FROM = 256 << 10


def compressed(data: bytes, parts: int | None = None) -> bytes:
    """zlib.compress(data, 1), in `parts` parts on as many threads (zlib lets go of the GIL)
    where the data is large (a whole manifest of 50,000 files: 4.8 MB, 45 ms in one): each
    part is deflated on its own, all but the last ended at a byte (a sync flush), after
    the first's zlib header, then the whole data's checksum. One zlib stream, as pigz
    writes it: zlib.decompress reads it as any; a part cannot refer back to the one
    before, which costs a few hundred bytes."""
    if parts is None:
        parts = min(os.cpu_count() or 1, 4) if len(data) >= PARALLEL_FROM else 1
    if parts <= 1:
        return zlib.compress(data, 1)
    cuts = [len(data) * i // parts for i in range(parts + 1)]
    out: list[bytes] = [b""] * parts

    def deflate(i: int) -> None:
        z = zlib.compressobj(1, zlib.DEFLATED, zlib.MAX_WBITS if i == 0 else -zlib.MAX_WBITS)
        piece = z.compress(data[cuts[i] : cuts[i + 1]])
        out[i] = piece + z.flush(zlib.Z_FINISH if i == parts - 1 else zlib.Z_SYNC_FLUSH)

    threads = [threading.Thread(target=deflate, args=(i,)) for i in range(1, parts)]
    for thread in threads:
        thread.start()
    deflate(0)
    for thread in threads:
        thread.join()
    return b"".join(out) + zlib.adler32(data).to_bytes(4, "big")


def _rows_json(paths: list[bytes], manifest: Mapping[bytes, Entry]) -> bytes:
    """A whole manifest's rows as JSON (msgspec), its paths decoded in one call when all are
    UTF-8 (json.dumps and two calls a row took a fifth of the git baseline's first
    snapshot): the same JSON as _speedups.json_rows, but for non-ASCII text, written as
    UTF-8 rather than escaped (the reader takes both)."""
    try:
        names: list[Any] = b"\0".join(paths).decode("utf-8").split("\0") if paths else []
    except UnicodeDecodeError:
        names = []
    if len(names) != len(paths):  # (not UTF-8, or a NUL in a path no file system gave)
        names = [_enc(p) for p in paths]
    rows = [
        (name, e.kind, e.mode, e.ref, _enc(e.target) if e.target else "", e.size)
        for name, e in zip(names, map(manifest.__getitem__, paths), strict=True)
    ]
    return msgspec.json.encode(rows)


Known = tuple[Iterable[bytes], Iterable[bytes]]  # (set, deleted) paths from one manifest to another


def _delta_paths(
    old: Mapping[bytes, Entry], new: Mapping[bytes, Entry], known: Known | None
) -> Known:
    """The paths set and the paths deleted from `old` to `new`: `known` when the caller has
    them (a scan does: scan.Scan.delta_from), else by comparing every entry."""
    if known is not None:
        return known
    # Entries the scanner kept from its cache are the same objects: `is` settles most paths
    # without a field-by-field comparison.
    return _differing(old, new), [p for p in old if p not in new]


def encode_delta(
    base: Mapping[bytes, Entry], manifest: Mapping[bytes, Entry], known: Known | None = None
) -> tuple[bytes, int]:
    """The delta from `base` to `manifest`, compressed, and how many paths it names."""
    set_paths, deleted = _delta_paths(base, manifest, known)
    put = [_entry_json(p, manifest[p]) for p in sorted(set_paths)]
    drop = [_enc(p) for p in sorted(deleted)]
    data = json.dumps({"set": put, "del": drop}, separators=(",", ":")).encode()
    return zlib.compress(data, 6), len(put) + len(drop)


def _differing(old: Mapping[bytes, Entry], new: Mapping[bytes, Entry]) -> list[bytes]:
    """Paths of `new` whose entry is not the one in `old` (new paths included)."""
    get = old.get
    return [p for p, e in new.items() if (o := get(p)) is not e and o != e]


def apply_stored(
    base: Manifest | None,
    data: bytes,
    commit_files: Callable[[], Mapping[bytes, str]] | None = None,
) -> Manifest:
    """A stored tree's data (full, a delta on `base`, or the differences from a git
    commit: encode_head) as a manifest; ValueError for data no version writes
    (snapshot.load says which tree). `commit_files`: the regular files of the commit the
    tree records (path -> blob id), asked only of a tree stored as differences from it
    (GitBaselineUnreachable from it when no repository here holds it)."""
    try:
        doc = json.loads(zlib.decompress(data))
    except (zlib.error, ValueError, RecursionError) as exc:
        raise ValueError(f"not a stored manifest ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a stored manifest")
    if "full" in doc:
        if not isinstance(doc["full"], list):
            raise ValueError("not a stored manifest")
        return dict(_entry_from(row) for row in doc["full"])
    head = "head" in doc
    if head:
        doc = doc["head"]
        if not isinstance(doc, dict):
            raise ValueError("not a stored manifest")
    elif base is None:
        raise ValueError("a delta tree without its base")
    put, drop = doc.get("set"), doc.get("del")
    if not isinstance(put, list) or not isinstance(drop, list):
        raise ValueError("not a stored manifest")
    entries = [_entry_from(row) for row in put]
    gone = [_deleted(path) for path in drop]
    if head:
        base = _commit_base(doc, commit_files, {p for p, _ in entries}.union(gone))
    assert base is not None
    out = dict(base)
    out.update(entries)
    for path in gone:
        out.pop(path, None)
    return out


def _deleted(path: Any) -> bytes:
    try:
        return _dec(path)
    except (TypeError, ValueError, KeyError, AttributeError, binascii.Error):
        raise ValueError(f"a deleted path no version writes: {_shown_row(path)}") from None


def _commit_base(
    doc: dict[str, Any],
    commit_files: Callable[[], Mapping[bytes, str]] | None,
    named: set[bytes],
) -> Manifest:
    """The commit's files that a tree stored by encode_head keeps as they are: those its
    `set` and `del` do not name (`named`), in the order of their paths, with `sizes`."""
    mode, sizes = doc.get("mode"), doc.get("sizes")
    if (
        type(mode) is not int
        or not 0 <= mode < 0o1000
        or not isinstance(sizes, list)
        or not all(type(n) is int and n >= 0 for n in sizes)
    ):
        raise ValueError("not a stored manifest")
    if commit_files is None:
        raise ValueError("a tree stored as the differences from a git commit names none")
    listed = commit_files()
    ours = sorted(p for p in listed if p not in named)
    if len(ours) != len(sizes):  # (another commit's listing: the tree id would say so too)
        raise ValueError(f"{len(sizes)} files of the commit were kept, it lists {len(ours)}")
    return {
        path: Entry(FILE, mode, GIT_REF + listed[path], size=size)
        for path, size in zip(ours, sizes, strict=True)
    }


def changes(
    old: Mapping[bytes, Entry],
    new: Mapping[bytes, Entry],
    known: Known | None = None,
    same: Mapping[str, str] | None = None,
) -> list[Change]:
    """What differs from `old` to `new`, by path: added, modified, deleted, or mode only.
    `same`: new ids that name the bytes of an old one (`Scanner.same_bytes`: a file its
    `git:` id named, of a commit HEAD no longer is, now stored by its sha256): no change."""
    out: list[Change] = []
    set_paths, deleted = _delta_paths(old, new, known)
    for path in sorted([*set_paths, *deleted]):
        a, b = old.get(path), new.get(path)
        secret = SECRET in (a.kind if a else "", b.kind if b else "")
        if a is None:
            assert b is not None
            out.append(Change(path, "added", b.size, secret))
        elif b is None:
            out.append(Change(path, "deleted", a.size, secret))
        elif not same_content(a, b) and not (same and same.get(b.ref) == a.ref):
            out.append(Change(path, "modified", b.size, secret))
        elif a.mode != b.mode:
            out.append(Change(path, "mode", b.size, secret))
        # else: the same bytes, once stored and now withheld (or the other way): no change
    return out


def same_content(a: Entry, b: Entry) -> bool:
    """The same bytes at a path. A file withheld for a secret is the same as the stored file
    with its hash: another process (or version) may know other secrets than the one that
    took the snapshot, and that is no change to the workspace."""
    if {a.kind, b.kind} == {FILE, SECRET}:
        return (a.ref, a.size) == (b.ref, b.size)
    return (a.kind, a.ref, a.target, a.size) == (b.kind, b.ref, b.target, b.size)


def blob_refs(entries: Iterable[Entry]) -> set[str]:
    return {e.ref for e in entries if e.kind == FILE}
