"""The compiled loops (_speedups.c) against their Python twins: the same answers for what a
workspace and git's index can hold, hostile bytes included (the C parser reads an index a
command may have written), and the twins against what they stand for (git, zlib, the
secret names)."""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import tempfile
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from durable_agent.redact import Redactor
from durable_agent.workspace import git_index, manifest, scan
from durable_agent.workspace.manifest import FILE, Entry
from durable_agent.workspace.secrets import NAME_SHAPES, SECRET_NAMES, TOKEN_FILES, SecretCheck

_speedups = pytest.importorskip("durable_agent.workspace._speedups")

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        [*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_every_loop_is_built_in_c() -> None:
    from scale_helpers import in_ci

    try:
        from durable_agent.workspace import _speedups as built
    except ImportError as exc:  # pragma: no cover - a machine with no C compiler
        if in_ci():
            raise
        pytest.skip(f"not built here ({exc}): the Python twins run")
    assert scan._seeded is built.seeded
    assert git_index._index_files is built.index_files
    assert manifest._bucketed is built.bucketed and manifest._joined is built.joined
    assert manifest._bucket_lines is built.bucket_lines and manifest._json_rows is built.json_rows
    assert manifest._git_delta is built.git_delta
    assert scan._listing is built.listing and scan._changed is built.changed
    assert scan._preload is built.preload


# -- git's index ---------------------------------------------------------------------------


def _repo(root: Path, version: int, object_format: str) -> Path:
    repo = root / f"r{version}{object_format}"
    repo.mkdir()
    git(repo, "init", "-q", f"--object-format={object_format}")
    names = ["a.txt", "run.sh", "sub/b.txt", "sub/deep/é c.txt", "sub/skip.txt", "same.txt"]
    names += [f"sub/{'n' * i}" for i in range(1, 10)]  # every padding, shared prefixes
    for name in names:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(name)
    (repo / "run.sh").chmod(0o755)
    os.symlink("a.txt", repo / "link")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "update-index", "--assume-unchanged", "same.txt")
    git(repo, "update-index", "--skip-worktree", "sub/skip.txt")
    git(repo, "update-index", f"--index-version={version}")
    return repo


@pytest.mark.parametrize("version", [2, 3, 4])
@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_the_index_is_read_as_git_lists_it(
    tmp_path: Path, version: int, object_format: str
) -> None:
    repo = _repo(tmp_path, version, object_format)
    index = os.fsencode(repo / ".git" / "index")
    size = 32 if object_format == "sha256" else 20
    for prefix in (b"", b"sub"):
        root = os.fsencode(repo / os.fsdecode(prefix))
        got = git_index.index_files(index, prefix, size, margin_ns=0, root=root)
        assert got is not None
        listed = subprocess.run(
            ["git", "ls-files", "-s", "-z", "--", prefix.decode() or "."],
            cwd=repo,
            capture_output=True,
            check=True,
        ).stdout
        expected = {}
        for record in listed.split(b"\0"):
            if record:
                meta, _, path = record.partition(b"\t")
                mode, blob, _stage = meta.split()
                if mode in (b"100644", b"100755"):
                    rel = path[len(prefix) + 1 :] if prefix else path
                    expected[rel] = blob.decode()
        assert got.files == expected
        # git's word for those it may call clean by their lstat: not the assume-unchanged
        # and skip-worktree ones, and their lstat now is the stat data it recorded
        unread = set(expected) - {b"same.txt", b"skip.txt", b"sub/skip.txt"}
        taken = got.vouched.taken()
        assert set(taken) == unread and len(got.vouched) == len(unread)
        for rel, (key, ref) in taken.items():
            st = os.lstat(repo / os.fsdecode(prefix) / os.fsdecode(rel))
            assert key == git_index.RECORD_TAIL.pack(
                st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode & 0o777
            )
            assert ref == "git:" + expected[rel]
        alone = git_index.index_files(index, prefix, size, margin_ns=0)
        assert alone is not None and alone.files == got.files
        assert not alone.vouched and alone.vouched.taken() == {}  # (no workspace: none)
        body = Path(os.fsdecode(index)).read_bytes()[:-size]
        lead = prefix + b"/" if prefix else b""
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for threads in (0, 1, 3):
                assert _answer(_speedups.index_files(body, size, lead, 2**62, fd, threads, -1)) == (
                    _answer(git_index._index_files_py(body, size, lead, 2**62, fd, threads, -1))
                )
        finally:
            os.close(fd)


def _answer(found: Any) -> Any:
    """index_files's answer, its Vouched as the dict it takes (C's and Python's compared)."""
    if not isinstance(found, tuple):
        return found
    return (found[0], found[1].taken(), found[2])


def test_an_entry_written_just_before_the_index_is_racy(tmp_path: Path) -> None:
    repo = _repo(tmp_path, 2, "sha1")
    index = os.fsencode(repo / ".git" / "index")
    changed = os.lstat(repo / "a.txt").st_ctime_ns
    written = changed + 1_500_000_000  # in a later second (that one's is racy too)
    os.utime(index, ns=(written, written))
    root = os.fsencode(repo)
    got = git_index.index_files(index, b"", 20, margin_ns=written - changed, root=root)
    assert got is not None and b"a.txt" in got.files and b"a.txt" not in got.vouched
    got = git_index.index_files(index, b"", 20, margin_ns=written - changed - 1, root=root)
    assert got is not None and b"a.txt" in got.vouched
    os.utime(index, ns=(1, 1))  # an index older than its entries: every one is racy
    got = git_index.index_files(index, b"", 20, margin_ns=0, root=root)
    assert got is not None and got.files and not got.vouched


def test_an_entry_of_the_second_the_index_was_written_in_is_racy(tmp_path: Path) -> None:
    """A work tree whose file system keeps whole seconds, its git folder on one that keeps
    nanoseconds: a file written, added and written again (same size) in one second has
    the stat data git recorded, 150 ms or more before the index was written. git (by the
    second) calls it racy and reads it; so must index_files, or its old blob is taken."""
    repo = _repo(tmp_path, 2, "sha1")
    index = os.fsencode(repo / ".git" / "index")
    st = os.lstat(repo / "a.txt")
    second = st.st_ctime_ns - st.st_ctime_ns % 1_000_000_000 + 1_000_000_000
    os.utime(repo / "a.txt", ns=(second, second))  # a whole second, as such a file system has
    git(repo, "update-index", "-q", "--really-refresh")
    body = Path(os.fsdecode(index)).read_bytes()[:-20]
    parsed = git_index._index_files_py(body, 20, b"", 0, -1, 1, -1)
    assert parsed is not None  # (its mtime as recorded: the whole second)
    assert parsed[0][b"a.txt"] and Path(os.fsdecode(index)).read_bytes().count(
        (second // 1_000_000_000).to_bytes(4, "big") + bytes(4)
    )
    written = max(second, os.lstat(repo / "a.txt").st_ctime_ns) + 300_000_000
    if written // 1_000_000_000 != second // 1_000_000_000:
        pytest.skip("the change time is in the next second")
    os.utime(index, ns=(written, written))  # the index written in that second, 300 ms later
    got = git_index.index_files(index, b"", 20, root=os.fsencode(repo))
    assert got is not None and b"a.txt" in got.files and b"a.txt" not in got.vouched
    assert b"sub/b.txt" in got.vouched


@pytest.mark.parametrize(
    "state", ["conflict", "intent-to-add", "split", "sparse", "checksum", "truncated"]
)
def test_an_index_this_does_not_read_is_none(tmp_path: Path, state: str) -> None:
    repo = _repo(tmp_path, 2, "sha1")
    index = repo / ".git" / "index"
    if state == "conflict":
        blob = git(repo, "rev-parse", "HEAD:a.txt")
        info = f"100644 {blob} 1\tc.txt\n100644 {blob} 2\tc.txt\n"
        subprocess.run(
            ["git", "update-index", "--index-info"], cwd=repo, input=info, text=True, check=True
        )
    elif state == "intent-to-add":
        (repo / "new.txt").write_text("new\n")
        git(repo, "add", "-N", "new.txt")
    elif state == "split":
        git(repo, "update-index", "--split-index")
    elif state == "sparse":
        git(repo, "sparse-checkout", "init", "--cone", "--sparse-index")
        git(repo, "sparse-checkout", "set", "sub/deep")
        assert (
            b"sdir" in index.read_bytes()
            or b"040000"
            in subprocess.run(
                ["git", "ls-files", "-s", "--sparse"], cwd=repo, capture_output=True
            ).stdout
        )
    elif state == "checksum":
        data = bytearray(index.read_bytes())
        data[-1] ^= 1
        index.write_bytes(bytes(data))
    elif state == "truncated":
        index.write_bytes(index.read_bytes()[:-30])
    assert git_index.index_files(os.fsencode(index), b"", 20, margin_ns=0) is None


def _refused_or(call: Any) -> Any:
    try:
        return call()
    except (ValueError, IndexError, OverflowError, struct.error):
        return ("refused",)


_BODIES: dict[tuple[int, int], bytes] = {}


def _body(version: int, size: int) -> bytes:
    """A real index's bytes (no checksum), made once per version and object format."""
    key = (version, size)
    if key not in _BODIES:
        with tempfile.TemporaryDirectory() as tmp:
            repo = _repo(Path(tmp), version, "sha256" if size == 32 else "sha1")
            _BODIES[key] = (repo / ".git" / "index").read_bytes()[:-size]
    return _BODIES[key]


@settings(max_examples=400, deadline=None)
@given(
    version=st.sampled_from([2, 3, 4]),
    size=st.sampled_from([20, 32]),
    edits=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=6),
    cut=st.one_of(st.none(), st.integers(0, 2000)),
    lead=st.sampled_from([b"", b"sub/", b"s", b"sub/deep/"]),
    racy_from=st.integers(-(2**63), 2**63 - 1),
)
def test_any_bytes_of_an_index_give_the_same_answer_in_c_and_python(
    version: int,
    size: int,
    edits: list[tuple[int, int]],
    cut: int | None,
    lead: bytes,
    racy_from: int,
) -> None:
    """The C parser reads a file a command may have written: any bytes are parsed as the
    Python twin parses them, or refused as it refuses them, and never read past the end."""
    data = bytearray(_body(version, size))
    for at, byte in edits:
        if at < len(data):
            data[at] = byte
    body = bytes(data[:cut] if cut is not None else data)
    c = _refused_or(lambda: _answer(_speedups.index_files(body, size, lead, racy_from, -1, 2, -1)))
    py = _refused_or(
        lambda: _answer(git_index._index_files_py(body, size, lead, racy_from, -1, 2, -1))
    )
    # (None and refused are one answer, "not read": each loop may meet the entry that makes
    # it None or the bytes that refuse it first)
    assert (c if c is not None else ("refused",)) == (py if py is not None else ("refused",))


# -- a fresh scanner's folder on git's word ----------------------------------------------


_SEEDED_AS = st.sampled_from(["same", "racy", "changed", "excluded", "untracked"])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["file", "exec", "big", "link", "dir", "gone", "secret"]), _SEEDED_AS
        ),
        max_size=10,
    ),
    st.booleans(),
    st.booleans(),
)
def test_the_c_and_python_seeded_loops_agree(
    kinds: list[tuple[str, str]], withhold: bool, shuffled: bool
) -> None:
    """A folder's files as git's index has them (added, then some changed, replaced by a
    link or a folder, removed, excluded), taken by the C loop from a Vouching and by the
    Python one from a _Vouched: the same entries and rows, and what is left, in order."""
    cap = 64
    shapes = NAME_SHAPES if withhold else None
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        git(repo, "init", "-q")
        (repo / "d" / "sub").mkdir(parents=True)
        (repo / "d" / "sub" / "x").write_text("below: skipped by the folder's merge")
        (repo / "d.txt").write_text("beside")
        names: list[bytes] = []
        for i, (kind, _) in enumerate(kinds):
            name = f"n{i}" if kind != "secret" else f"id_RSA{i}.pub"
            path = repo / "d" / name
            path.write_bytes(b"x" * (cap + 1 if kind == "big" else i))
            if kind == "exec":
                path.chmod(0o751)
            names.append(name.encode())
        git(repo, "add", "-A")
        untracked = [
            "d/" + os.fsdecode(n)
            for n, (_, a) in zip(names, kinds, strict=True)
            if a == "untracked"
        ]
        if untracked:
            git(repo, "rm", "-q", "--cached", "--", *untracked)
        for i, (kind, seeded_as) in enumerate(kinds):
            path = repo / "d" / os.fsdecode(names[i])
            if kind in ("link", "dir", "gone"):
                path.unlink()
            if kind == "link":
                path.symlink_to("nowhere")
            elif kind == "dir":
                path.mkdir()
            if seeded_as == "changed" and kind not in ("link", "dir", "gone"):
                path.write_bytes(b"y" * (cap + 1 if kind == "big" else i + 1))
        body = (repo / ".git" / "index").read_bytes()[:-20]
        excluded = [b"d/" + n for n, (_, a) in zip(names, kinds, strict=True) if a == "excluded"]
        racy_after = 0 if any(a == "racy" for _, a in kinds) else 2**62
        listed = sorted(names) if not shuffled else list(reversed(sorted(names)))
        out = []
        fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for make, loop in (
                (_speedups.index_files, _speedups.seeded),
                (git_index._index_files_py, scan._seeded_py),
            ):
                found = make(body, 20, b"", 2**62, fd, 2, -1)
                assert found is not None
                vouched = found[1]
                vouched.exclude(excluded)
                cached: dict[bytes, Any] = {}
                entries: dict[bytes, Any] = {}
                left = loop(
                    list(listed),
                    b"d/",
                    vouched,
                    cached,
                    entries,
                    Entry,
                    FILE,
                    cap,
                    racy_after,
                    shapes,
                )
                out.append((left, cached, entries))
        finally:
            os.close(fd)
        assert out[0] == out[1]
        left, cached, entries = out[0]
        assert left == [n for n in listed if n not in cached]  # (in the order given)
        for i, (kind, seeded_as) in enumerate(kinds):
            name = names[i]
            taken = (
                kind in ("file", "exec") or (kind == "secret" and not withhold)
            ) and seeded_as in ("same", "racy")
            assert (name not in left) == taken, (kind, seeded_as)
            if taken:
                entry = entries[b"d/" + name]
                blob = git(repo, "rev-parse", f":d/{os.fsdecode(name)}")
                assert entry.ref == "git:" + blob and entry.size == i
                st_ = os.lstat(repo / "d" / os.fsdecode(name))
                assert entry.mode == st_.st_mode & 0o777
                assert cached[name][1] is entry
                key = git_index.RECORD_TAIL.pack(
                    st_.st_ctime_ns, st_.st_size, st_.st_ino, st_.st_mode & 0o777
                )
                assert cached[name][0] == (None if racy_after == 0 else key)


def test_a_vouching_dropped_while_its_threads_run_waits_for_them() -> None:
    """Its threads read its memory: freeing it joins them first (no use after free), and a
    question asked of it waits for the file's own lstat, whoever makes it."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        git(repo, "init", "-q")
        for i in range(3000):
            (repo / f"f{i:04d}").write_bytes(b"x")
        git(repo, "add", "-A")
        body = (repo / ".git" / "index").read_bytes()[:-20]
        fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for threads in (0, 1, 4, 16):
                found = _speedups.index_files(body, 20, b"", 2**62, fd, threads, -1)
                assert found is not None
                del found  # (at once: its threads are under way)
            files, vouching, _ = _speedups.index_files(body, 20, b"", 2**62, fd, 4, -1)
        finally:
            os.close(fd)  # (it keeps its own copy of the folder's descriptor)
        last = [f"f{i:04d}".encode() for i in range(2990, 3000)]
        cached: dict[bytes, Any] = {}
        entries: dict[bytes, Any] = {}
        left = _speedups.seeded(last, b"", vouching, cached, entries, Entry, FILE, 64, 2**62, None)
        assert left == [] and set(entries) == set(last)
        assert len(vouching.taken()) == len(files) == 3000


_NAME_PART = st.one_of(
    st.sampled_from(
        [p.replace(b"*", b"") for p in SECRET_NAMES + TOKEN_FILES] + [b"ENV", b".Env", b"ID_"]
    ),
    st.binary(min_size=0, max_size=4).filter(lambda b: b"/" not in b and b"\0" not in b),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_NAME_PART, min_size=1, max_size=3).map(b"".join))
@example(b".ENV.local")
@example(b"Server.PEM")
def test_a_name_withheld_by_its_name_is_always_left_to_the_check(name: bytes) -> None:
    assume(name and b"/" not in name and b"\0" not in name)
    check = SecretCheck(Redactor({}))
    if check.named(b"some/dir/" + name):
        assert scan._may_be_secret(name, NAME_SHAPES)


# -- a tree id's buckets and lines ----------------------------------------------------------

_paths = st.binary(min_size=0, max_size=20)
_entries = st.builds(
    Entry,
    st.sampled_from(["file", "link", "dir", "big", "secret", "é", ""]),
    st.one_of(st.integers(0, 0o777), st.integers(-(2**70), 2**70)),
    st.text(max_size=10),
    st.binary(max_size=8),
    st.one_of(st.integers(0, 2**40), st.integers(-(2**70), 2**70)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_paths, max_size=40))
def test_buckets_are_zlibs_crc32(paths: list[bytes]) -> None:
    got = _speedups.bucketed(paths)
    assert got == manifest._bucketed_py(paths)
    for b, each in enumerate(got):
        assert all(zlib.crc32(p) % manifest.BUCKETS == b for p in each)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_paths, _entries, max_size=12))
@example({b"a": Entry("file", -5, "x", b"", -(2**63) + 1)})
@example({b"a": Entry("file", 0, "\udc80", b"", 0)})
def test_lines_are_joined_as_python_writes_them(m: dict[bytes, Entry]) -> None:
    paths = sorted(m)
    py = _refused_or(lambda: manifest._joined_py(paths, m))
    assert _refused_or(lambda: manifest.joined(paths, m)) == py
    # each bucket's, in one pass (TreeIds.rebuild): what joined() gives of each bucket
    in_buckets = _refused_or(lambda: manifest._bucket_lines_py(paths, m))
    assert _refused_or(lambda: manifest.bucket_lines(paths, m)) == in_buckets
    if not isinstance(in_buckets, tuple):
        assert in_buckets == [manifest._joined_py(b, m) for b in manifest._bucketed_py(paths)]
        assert len(in_buckets) == manifest.BUCKETS
    try:
        assert _speedups.bucket_lines(paths, m) == in_buckets
    except (OverflowError, UnicodeEncodeError):
        assert isinstance(py, tuple) or any(
            abs(e.mode) >= 2**63 or abs(e.size) >= 2**63 for e in m.values()
        )
    try:
        c = _speedups.joined(paths, m)
    except OverflowError:
        assert any(abs(e.mode) >= 2**63 or abs(e.size) >= 2**63 for e in m.values())
        return
    except UnicodeEncodeError:
        assert isinstance(py, tuple)
        return
    assert c == py


_blob_ids = st.sampled_from(["a" * 40, "b" * 40, "c" * 64, "é", ""])
_near = st.sampled_from([b"a", b"b", b"d/c", b"d/e", b"\xff", b""])  # (shared by both sides)
_git_entries = st.builds(
    Entry,
    st.sampled_from(["file", "file", "link", "big", "secret", "fil"]),
    st.one_of(st.sampled_from([0o644, 0o664, 0o755]), st.integers(-(2**70), 2**70)),
    st.one_of(_blob_ids.map("git:".__add__), _blob_ids, st.text(max_size=6)),
    st.one_of(st.just(b""), st.binary(max_size=4)),
    st.integers(0, 2**40),
)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(st.one_of(_near, _paths), _git_entries, max_size=10),
    st.dictionaries(st.one_of(_near, _paths), _blob_ids, max_size=10),
)
@example(  # a blob id not ASCII (none git writes): the commit's file in Python, and in C
    {b"d/e": Entry("file", 0o644, "git:\u00e9")}, {b"d/e": "\u00e9"}
)
def test_the_differences_from_a_commit_are_the_same_in_c_and_python(
    m: dict[bytes, Entry], files: dict[bytes, str]
) -> None:
    assert _speedups.git_delta(m, files) == manifest._git_delta_py(m, files)


_plain_entries = st.builds(
    Entry,
    st.sampled_from(["file", "file", "file", "link", "dir", "big", "secret"]),
    st.sampled_from([0o644, 0o644, 0o664, 0o755, 0o600]),
    st.one_of(_blob_ids.map("git:".__add__), st.sampled_from(["f" * 64, ""])),
    st.one_of(st.just(b""), st.just(b"t\xff")),
    st.integers(0, 2**40),
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.one_of(_near, _paths), _plain_entries, max_size=12),
    st.dictionaries(st.one_of(_near, _paths), st.sampled_from(["a" * 40, "c" * 64]), max_size=12),
    st.booleans(),
)
def test_a_manifest_stored_as_its_differences_from_a_commit_reads_back_whole(
    m: dict[bytes, Entry], files: dict[bytes, str], in_c: bool
) -> None:
    """encode_head, then apply_stored on the commit's listing (path -> blob id): the same
    manifest, whatever the sizes (the snapshot's are kept)."""
    if not in_c:
        m = _NotADict(m)  # type: ignore[assignment]
    asked = []
    data = manifest.encode_head(m, files)
    back = manifest.apply_stored(None, data, lambda: asked.append(1) or files)
    assert back == dict(m) and asked == [1]
    mode, differing, gone, ours = manifest._git_delta_py(m, files)
    assert sorted(gone) == sorted(set(files) - set(m))
    assert sorted(differing + ours) == sorted(m)
    for path, e in m.items():  # each entry the commit's, or written out
        commits = e == Entry(FILE, mode, "git:" + files.get(path, "?"), size=e.size)
        assert commits == (path in ours) != (path in differing)
    if ours:  # another commit's listing (a file more or fewer) is never taken for it
        with pytest.raises(ValueError):
            manifest.apply_stored(None, data, lambda: {**files, b"\0more": "a" * 40})
        with pytest.raises(ValueError):
            manifest.apply_stored(
                None, data, lambda: {p: b for p, b in files.items() if p != ours[0]}
            )


class _NotADict(dict):  # type: ignore[type-arg]
    """A manifest that is not a plain dict: the Python twins answer for it."""


def test_a_tree_id_is_the_same_with_the_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(3)
    m = {
        os.urandom(rnd.randint(1, 30)): Entry("file", 0o644, f"{i:064x}", b"", i)
        for i in range(3000)
    }
    fast = manifest.tree_id(m)
    monkeypatch.setattr(manifest, "_joined", manifest._joined_py)
    monkeypatch.setattr(manifest, "_bucketed", manifest._bucketed_py)
    monkeypatch.setattr(manifest, "_bucket_lines", manifest._bucket_lines_py)
    assert manifest.tree_id(m) == fast
    ids = manifest.TreeIds()  # and a few changes at a time, each bucket joined again
    ids.rebuild({})
    part: dict[bytes, Entry] = {}
    for i, (path, entry) in enumerate(m.items()):
        part[path] = entry
        got = ids.update(part, {path: entry}, [])
        if i % 500 == 0:
            assert got == manifest.tree_id(part)
    assert ids.id == fast


@settings(max_examples=10, deadline=None)
@given(
    st.integers(1, 800),  # (the threads take 256 entries at a time)
    st.integers(1, 8),
    st.lists(
        st.sampled_from(["edit", "touch", "exec", "link", "dir", "gone", "same"]), max_size=40
    ),
)
def test_the_index_files_lstat_calls_in_threads_give_what_one_loop_gives(
    count: int, threads: int, changes: list[str]
) -> None:
    """Entries taken a chunk at a time by several threads: each entry's lstat compared with
    what the index recorded, as one loop in Python compares it; vouched for only where
    nothing changed since git recorded it."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        git(repo, "init", "-q")
        for i in range(count):
            (repo / f"d{i % 7}").mkdir(exist_ok=True)
            (repo / f"d{i % 7}" / f"f{i}").write_bytes(b"x" * (i % 50))
        git(repo, "add", "-A")
        body = (repo / ".git" / "index").read_bytes()[:-20]
        changed = set()
        for i, change in enumerate(changes[:count]):
            at = repo / f"d{i % 7}" / f"f{i}"
            if change == "edit":
                at.write_bytes(b"y" * (i % 50 + 1))
            elif change == "touch":
                os.utime(at, ns=(1, 1))
            elif change == "exec":
                at.chmod(0o755)
            elif change == "link":
                at.unlink()
                at.symlink_to("f0")
            elif change == "dir":
                at.unlink()
                at.mkdir()
            elif change == "gone":
                at.unlink()
            if change != "same":
                changed.add(os.fsencode(at.relative_to(repo)))
        fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY)
        try:
            got = _answer(_speedups.index_files(body, 20, b"", 2**62, fd, threads, -1))
            assert got == _answer(git_index._index_files_py(body, 20, b"", 2**62, fd, threads, -1))
        finally:
            os.close(fd)
        assert got is not None
        files, vouched, _ = got
        assert len(files) == count
        assert set(vouched) == set(files) - changed


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000), st.integers(1, 6), st.booleans())
def test_a_manifest_compressed_in_parts_is_one_zlib_stream(
    data: bytes, parts: int, repeat: bool
) -> None:
    if repeat:  # (text that compresses, and back-references a part cannot make)
        data = data * 40
    out = manifest.compressed(data, parts)
    assert zlib.decompress(out) == data
    assert zlib.decompressobj().decompress(out) == data  # (a stream, read as one)


# -- a folder's names ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.sets(
        st.binary(min_size=1, max_size=12).filter(
            lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")
        ),
        max_size=30,
    )
)
def test_a_folder_is_listed_in_c_as_in_python(names: set[bytes]) -> None:
    """Any bytes a name can hold (not UTF-8 included), sorted as bytes; the fd's offset left
    where os.listdir leaves it, so a listing after it sees every name too."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = os.path.join(os.fsencode(tmp), name)
            if len(name) % 3 == 0:
                os.mkdir(path)
            else:
                with open(path, "wb"):
                    pass
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
        try:
            got = _speedups.listing(fd)
            assert got == scan._listing_py(fd) == sorted(names)
            assert _speedups.listing(fd) == got and sorted(os.listdir(fd)) == sorted(
                os.fsdecode(n) for n in names
            )
        finally:
            os.close(fd)


def test_a_folder_removed_under_its_fd_lists_as_os_listdir_lists_it() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "d"
        folder.mkdir()
        (folder / "a").write_text("a")
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert _speedups.listing(fd) == scan._listing_py(fd) == [b"a"]
            (folder / "a").unlink()
            folder.rmdir()
            assert _speedups.listing(fd) == scan._listing_py(fd) == []
        finally:
            os.close(fd)
        (Path(tmp) / "f").write_text("f")
        fd = os.open(Path(tmp) / "f", os.O_RDONLY)
        try:
            with pytest.raises(NotADirectoryError):  # (as os.listdir says of a file's fd)
                _speedups.listing(fd)
            with pytest.raises(NotADirectoryError):
                scan._listing_py(fd)
        finally:
            os.close(fd)


# -- what index_files gives beside the files: the whole tree's id, the paths fed to git, the
# folders listed ahead -------------------------------------------------------------------------


@pytest.mark.parametrize("version", [2, 4])
@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_the_index_s_cache_tree_gives_head_s_tree_until_something_is_staged(
    tmp_path: Path, version: int, object_format: str
) -> None:
    repo = _repo(tmp_path, version, object_format)
    size = 32 if object_format == "sha256" else 20
    index = os.fsencode(repo / ".git" / "index")
    git(repo, "write-tree")  # (its cache-tree whole, as a commit or a checkout leaves it)
    got = git_index.index_files(index, b"", size, margin_ns=0)
    assert got is not None and got.tree == git(repo, "rev-parse", "HEAD^{tree}")
    (repo / "a.txt").write_text("staged\n")
    git(repo, "add", "a.txt")  # (its folders' cache-tree entries, the root's too, go)
    got = git_index.index_files(index, b"", size, margin_ns=0)
    assert got is not None and got.tree is None
    git(repo, "write-tree")  # the cache-tree made whole again: the staged tree, not HEAD's
    got = git_index.index_files(index, b"", size, margin_ns=0)
    assert got is not None and got.tree not in (None, git(repo, "rev-parse", "HEAD^{tree}"))
    body = Path(os.fsdecode(index)).read_bytes()[:-size]
    assert _answer(_speedups.index_files(body, size, b"", 0, -1, 1, -1)) == _answer(
        git_index._index_files_py(body, size, b"", 0, -1, 1, -1)
    )


@pytest.mark.parametrize("loop", ["c", "python"])
@pytest.mark.parametrize("state", ["read", "conflict", "damaged"])
def test_the_paths_are_fed_to_git_and_the_feed_closed_whatever_the_answer(
    tmp_path: Path, loop: str, state: str
) -> None:
    """What check-attr is told: every path, NUL-ended, then the end (it would wait for
    more), and nothing where the index is not one this reads."""
    repo = _repo(tmp_path, 2, "sha1")
    if state == "conflict":
        blob = git(repo, "rev-parse", "HEAD:a.txt")
        info = f"100644 {blob} 1\tc.txt\n100644 {blob} 2\tc.txt\n"
        subprocess.run(
            ["git", "update-index", "--index-info"], cwd=repo, input=info, text=True, check=True
        )
    body = (repo / ".git" / "index").read_bytes()[:-20]
    if state == "damaged":
        body = body[:100]
    make = _speedups.index_files if loop == "c" else git_index._index_files_py
    read, write = os.pipe()
    try:
        found = _refused_or(lambda: make(body, 20, b"sub/", 2**62, -1, 2, write))
        told = b""
        while chunk := os.read(read, 65536):  # (ends: the feed was closed)
            told += chunk
    finally:
        os.close(read)
    if state == "read":
        assert isinstance(found, tuple) and found[1].fed()
        assert told == b"".join(p + b"\0" for p in found[0]) and told.count(b"\0") == 12
    else:
        assert found in (None, ("refused",)) and told == b""
    with pytest.raises(OSError):  # (closed by index_files, not left to the caller)
        os.close(write)


def _index_of(paths: list[bytes], version: int = 2) -> bytes:
    """An index (no checksum) of `paths`, in that order: no stat data, no object ids;
    version 4's names whole (nothing of the previous one kept)."""
    body = b"DIRC" + struct.pack(">II", version, len(paths))
    previous = b""
    for path in paths:
        fixed = struct.pack(">10I", 0, 0, 0, 0, 0, 0, 0o100644, 0, 0, 0) + bytes(20)
        body += fixed + struct.pack(">H", len(path))
        if version == 4:
            assert len(previous) < 128  # (a one-byte varint)
            body += bytes([len(previous)]) + path + b"\0"
            previous = path
        else:
            body += path + b"\0" * (8 - (len(fixed) + 2 + len(path)) % 8)
    return body


def test_a_vouching_freed_before_git_reads_its_feed_does_not_wait_for_git() -> None:
    """An index whose checksum is wrong is dropped before git's answer is read: git, whose
    answer fills its pipe, no longer reads its input, and the feed's end must not wait."""
    body = _index_of([b"%05d-" % i + b"p" * 100 for i in range(2000)])  # (past a pipe's 64 KiB)
    assert git_index._index_files_py(body, 20, b"", 0, -1, 1, -1) is not None
    read, write = os.pipe()
    try:
        found = _speedups.index_files(body, 20, b"", 0, -1, 1, write)
        assert found is not None and len(found[0]) == 2000
        box = [found]
        del found
        dropped = threading.Thread(target=box.clear, daemon=True)  # (joined with a timeout)
        dropped.start()
        dropped.join(10)
        assert not dropped.is_alive()
    finally:
        os.close(read)  # (the feed's end then fails: the feeder ends)


def test_a_vouching_with_no_folder_to_lstat_in_vouches_for_none() -> None:
    body = _body(2, 20)
    found = _speedups.index_files(body, 20, b"", 2**62, -1, 1, -1)
    python = git_index._index_files_py(body, 20, b"", 2**62, -1, 1, -1)
    assert found is not None and python is not None
    files, vouching = found[0], found[1]
    vouching.exclude([b"a.txt", b"sub/b.txt"])
    assert len(vouching) == len(python[1]) == 0
    assert [p for p in files if p in vouching] == [p for p in files if p in python[1]] == []


@pytest.mark.parametrize("version", [2, 4])
@pytest.mark.parametrize("order", ["apart", "twice"])
def test_an_index_out_of_order_is_not_read(version: int, order: str) -> None:
    """git writes its paths in order, each once: where a folder's paths are apart, each
    return to it would list it again (a folder of 20,000 files, 4,000 times, took 10 s)."""
    if order == "apart":
        paths = [p for i in range(3) for p in (b"big/f%d" % i, b"a%d" % i)]
    else:
        paths = [b"a", b"b", b"b", b"c"]
    body = _index_of(paths, version)
    assert _speedups.index_files(_index_of(sorted(set(paths)), version), 20, b"", 0, -1, 1, -1)
    assert _speedups.index_files(body, 20, b"", 0, -1, 1, -1) is None
    assert git_index._index_files_py(body, 20, b"", 0, -1, 1, -1) is None


def test_a_folder_is_listed_once_whatever_path_of_the_index_reaches_it(tmp_path: Path) -> None:
    """An index may name a folder by many paths (through links, `./`): each would list it
    again (a link to a folder of 20,000 files for each entry of an index). The first lists
    it; the walk, which never goes through a link, lists itself what no one listed."""
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "x").write_text("x")
    (tmp_path / "l").symlink_to(".")
    paths = [b"./big/x", b"big/x", b"l/big/x", b"l/l/big/x"]
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        found = _speedups.index_files(_index_of(paths), 20, b"", 0, fd, 1, -1)
    finally:
        os.close(fd)
    assert found is not None
    st = os.stat(tmp_path / "big")
    key = (st.st_ctime_ns, st.st_mtime_ns, st.st_ino, st.st_dev, 2**62)
    listed = [found[1].listing(p.rsplit(b"/", 1)[0], *key) for p in paths]
    assert listed == [[b"x"], None, None, None]


def test_a_folder_listed_beside_the_lstat_calls_is_taken_only_as_it_still_is(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path, 2, "sha1")
    (repo / "sub" / "untracked.txt").write_text("listed too")
    body = (repo / ".git" / "index").read_bytes()[:-20]
    fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY)
    try:
        found = _speedups.index_files(body, 20, b"", 2**62, fd, 1, -1)
        assert found is not None
        vouching = found[1]
        python = git_index._index_files_py(body, 20, b"", 2**62, fd, 1, -1)
        assert python is not None
    finally:
        os.close(fd)

    def asked(rel: str, racy_after: int = 2**62) -> list[bytes] | None:
        st = os.stat(repo / rel) if rel else os.stat(repo)
        key = (st.st_ctime_ns, st.st_mtime_ns, st.st_ino, st.st_dev)
        assert python[1].listing(os.fsencode(rel), *key, racy_after) is None  # (lists itself)
        return vouching.listing(os.fsencode(rel), *key, racy_after)

    for rel in ("", "sub", "sub/deep"):
        folder = os.open(repo / rel, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert asked(rel) == scan._listing_py(folder)
        finally:
            os.close(folder)
    (repo / "sub" / "new").mkdir()
    assert asked("sub/new") is None  # not a folder of the index: listed by the walk
    assert asked("sub", racy_after=0) is None  # changed within the racy margin: listed again
    (repo / "sub" / "added.txt").write_text("after")
    assert asked("sub") is None  # changed since: listed again
    st = os.stat(repo / "sub" / "deep")  # another inode: another folder
    key = (st.st_ctime_ns, st.st_mtime_ns, st.st_ino + 1, st.st_dev)
    assert vouching.listing(b"sub/deep", *key, 2**62) is None


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)
_tree_docs = st.fixed_dictionaries(
    {},
    optional={
        "mode": st.one_of(st.integers(-2, 0o1000), _json),
        "sizes": st.one_of(st.lists(st.integers(-1, 9), max_size=3), _json),
        "set": st.one_of(
            st.lists(
                st.tuples(
                    st.text(max_size=3),
                    st.just("file"),
                    st.just(0o644),
                    st.text(max_size=3),
                    st.just(""),
                    st.integers(0, 9),
                ).map(list),
                max_size=3,
            ),
            _json,
        ),
        "del": st.one_of(st.lists(st.one_of(st.text(max_size=3), _json), max_size=3), _json),
    },
)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        _tree_docs.map(lambda d: {"head": d}),
        _tree_docs,
        st.dictionaries(st.sampled_from(["head", "full", "set", "del"]), _json, max_size=3),
        _json,
    ),
    st.dictionaries(st.binary(max_size=3), st.sampled_from(["a" * 40, "é", ""]), max_size=4),
)
def test_a_stored_tree_edited_by_hand_is_read_or_refused_as_damage(
    doc: Any, listed: dict[bytes, str]
) -> None:
    """Any JSON where a tree's data is (its own rows, a delta, the differences from a
    commit), on any commit's listing: a manifest of entries, or ValueError (snapshot.load
    says `damaged`, one line), never another exception."""
    data = zlib.compress(json.dumps(doc).encode())
    try:
        got = manifest.apply_stored({b"base": Entry(FILE)}, data, lambda: listed)
    except ValueError:
        return
    assert all(isinstance(p, bytes) and isinstance(e, Entry) for p, e in got.items())
