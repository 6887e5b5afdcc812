"""Snapshots of a file tool's step look at the path it wrote, not at the whole tree.

The tree between steps is known (every command's step is snapshotted by a full scan after it
runs), so after a file tool's write the scanner looks at that path alone. Whatever the
sequence of file-tool writes and command writes (same-second mtimes, renames, deletions,
mode changes, links, .gitignore rules, new folders, a write's leftover temp file), the
manifest it keeps is the one a full scan from scratch finds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from durable_agent.workspace import scan
from durable_agent.workspace.git_index import RECORD_TAIL
from durable_agent.workspace.manifest import TreeIds, changes, tree_id
from durable_agent.workspace.scan import Scanner

EXCLUDE = [".git/", "node_modules/", "*.out"]
SAME_SECOND = 1_700_000_000 * 10**9  # one mtime for every write that keeps it (touch -d)

_files = st.sampled_from(
    ["a", "b", "d/c", "d/e", "d/f/g", "x.log", "d/x.log", "n/m/k", "node_modules/p", "c.out"]
)
_any = st.one_of(_files, st.sampled_from(["d", "d/f", "n", ".gitignore", "d/.gitignore"]))
_command = st.one_of(
    st.tuples(st.just("write"), _files, st.binary(max_size=6), st.booleans()),
    st.tuples(st.just("delete"), _any),
    st.tuples(st.just("chmod"), _files, st.sampled_from([0o644, 0o755, 0o600])),
    st.tuples(st.just("link"), _files, st.sampled_from([b"a", b"../nowhere", b"d"])),
    st.tuples(st.just("mkdir"), st.sampled_from(["e1", "d/e2", "a", "n/m"])),
    st.tuples(st.just("rename"), _any, _any),
    st.tuples(st.just("leftover"), st.sampled_from(["a", "d/c"])),
    st.tuples(
        st.just("ignore"),
        st.sampled_from(["", "d/"]),
        st.sampled_from(["", "*.log\n", "c\n!x.log\n", "f/\n"]),
    ),
)
_tool = st.tuples(
    st.just("tool"),
    st.one_of(
        _files,
        st.sampled_from(["a", "d/c", "n/m/k", "e1/k", "q/z.out", ".gitignore", "d/.gitignore"]),
    ),
    st.binary(max_size=6),
    st.booleans(),  # keeps the same mtime
    st.booleans(),  # in place (same inode) rather than a temp file renamed over it
)


def _clear(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _command_writes(root: Path, op: tuple[Any, ...]) -> None:
    path = root / op[1]
    if op[0] in ("write", "link", "mkdir", "leftover"):
        for parent in reversed(path.relative_to(root).parents[:-1]):
            if (root / parent).is_symlink() or (root / parent).is_file():
                (root / parent).unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
    if op[0] == "write":
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        if path.is_symlink():
            path.unlink()
        path.write_bytes(op[2])
        if op[3]:
            os.utime(path, ns=(SAME_SECOND, SAME_SECOND))
    elif op[0] == "delete":
        _clear(path)
    elif op[0] == "chmod" and path.is_file() and not path.is_symlink():
        path.chmod(op[2])
    elif op[0] == "link":
        _clear(path)
        path.symlink_to(os.fsdecode(op[2]))
    elif op[0] == "mkdir":
        if path.is_symlink() or path.is_file():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
    elif op[0] == "rename":
        target = root / op[2]
        if (path.exists() or path.is_symlink()) and not (
            target.is_relative_to(path) or path.is_relative_to(target)
        ):
            _clear(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.parent.is_symlink():
                os.rename(path, target)
    elif op[0] == "leftover":  # a write killed before its rename (files.atomic_write)
        (path.parent / f".{path.name}.da-x1.tmp").write_bytes(b"half")
    elif op[0] == "ignore":
        if path.is_symlink() or path.is_file():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
        _clear(path / ".gitignore")
        (path / ".gitignore").write_text(op[2])


def _tool_writes(root: Path, op: tuple[Any, ...]) -> bool:
    """What write_file does (folders made, a temp file renamed over the file, the folder's
    leftover temp files removed); False where it would refuse (a link or a file in the way)."""
    path = root / op[1]
    rel = path.relative_to(root)
    if any((root / p).is_symlink() or (root / p).is_file() for p in rel.parents[:-1]) or (
        path.is_dir() or path.is_symlink()
    ):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    for leftover in path.parent.glob(f".{path.name}.da-*.tmp"):
        leftover.unlink()
    if op[4] and path.exists():
        path.write_bytes(op[2])
    else:
        tmp = path.parent / f".{path.name}.da-t.tmp"
        tmp.write_bytes(op[2])
        os.rename(tmp, path)
    if op[3]:
        os.utime(path, ns=(SAME_SECOND, SAME_SECOND))
    return True


@pytest.mark.slow  # over 2 s on 2 cores
@pytest.mark.parametrize("loop", ["c", "ahead", "python"])
@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(_command, _tool, _tool), min_size=1, max_size=14))
@example([("mkdir", "e1"), ("tool", "e1/k", b"k", False, False)])  # an empty folder filled
@example([("leftover", "a"), ("tool", "a", b"k", True, False)])  # its temp file cleared
@example([("tool", "q/z.out", b"k", False, False)])  # a new folder of excluded files
@example([("write", "a", b"1", True), ("tool", "a", b"2", True, True)])  # same size and mtime
def test_file_tool_writes_looked_at_alone_give_the_manifest_of_a_full_scan(
    loop: str, ops: list[tuple[Any, ...]]
) -> None:
    saved, TreeIds.REBUILD_AT = TreeIds.REBUILD_AT, 2  # both ways of keeping the id
    with contextlib.ExitStack() as stack:
        stack.callback(setattr, TreeIds, "REBUILD_AT", saved)
        if loop == "python":  # the stat cache's loop where the C one could not be built
            patch = stack.enter_context(pytest.MonkeyPatch.context())
            patch.setattr(scan, "_changed", scan._changed_py)
            patch.setattr(scan, "_preload", scan._preload_py)
        elif loop == "ahead":  # the lstat calls made ahead in threads, however few the files
            stack.enter_context(pytest.MonkeyPatch.context()).setattr(scan, "PRELOAD_FROM", 0)
        root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        (root / "d").mkdir()
        (root / "d" / "c").write_bytes(b"c")
        scanner = Scanner(root, EXCLUDE, 4)  # files over 4 bytes are `big`
        prev = scanner.scan().manifest
        for op in ops:
            if op[0] == "tool":
                if not _tool_writes(root, op):
                    continue
                got = scanner.scan([op[1].encode()])
            else:
                _command_writes(root, op)
                got = scanner.scan()
            assert changes(prev, got.manifest, got.delta_from(prev)) == changes(prev, got.manifest)
            prev = got.manifest
            want = Scanner(root, EXCLUDE, 4).scan().manifest
            assert got.manifest == want, op
            assert got.tree_id == tree_id(want)
            again = scanner.scan()  # a full scan after it finds nothing new
            assert again.manifest == want and not again.changed, op


def _tree(root: Path, dirs: int, per_dir: int) -> None:
    for i in range(dirs):
        d = root / f"p{i}"
        d.mkdir()
        for j in range(per_dir):
            (d / f"f{j}.py").write_text(f"{i} {j}\n")


@pytest.mark.parametrize("path", [b"p3/f1.py", b"p3/new.py", b"new/deeper/x.py"])
def test_a_written_path_is_looked_at_without_walking_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: bytes
) -> None:
    _tree(tmp_path, 20, 20)
    scanner = Scanner(tmp_path, EXCLUDE, 1000)
    scanner.scan()
    (tmp_path / "p5" / "f5.py").write_text("changed from outside between steps\n")
    walked: list[bytes] = []
    real = Scanner._walk_in
    monkeypatch.setattr(
        Scanner, "_walk_in", lambda self, fd, rel, *a: walked.append(rel) or real(self, fd, rel, *a)
    )
    target = tmp_path / os.fsdecode(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("written by a file tool\n")
    got = scanner.scan([path])
    assert walked == []
    assert [
        c.path for c in changes(got.base or {}, got.manifest, got.delta_from(got.base or {}))
    ] == [path]
    # The change from outside is not the write's: the next full scan (a command's) finds it.
    full = scanner.scan()
    assert walked and [c.path for c in changes(got.manifest, full.manifest)] == [b"p5/f5.py"]


def test_a_run_walks_the_tree_for_commands_only_and_resume_still_finds_drift(
    tmp_path: Path,
    workspace: Path,
    env: dict[str, str],
    write_script: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from durable_agent import Agent

    _tree(workspace, 3, 3)
    walks: list[int] = []
    real = Scanner._walk_all
    monkeypatch.setattr(Scanner, "_walk_all", lambda self: walks.append(1) or real(self))

    def call(name: str, **arguments: Any) -> dict[str, Any]:
        return {"tool_calls": [{"name": name, "arguments": arguments}]}

    model = write_script(
        [
            call("run_command", command="echo made > p0/made.txt"),
            call("write_file", path="p1/new.py", content="new\n"),
            call("edit_file", path="p1/f0.py", old_string="1 0", new_string="one"),
            call("write_file", path="fresh/dir/x.py", content="x\n"),
            {"content": "done"},
        ]
    )
    db = f"sqlite:///{tmp_path / 'api.db'}"
    agent = Agent(model=model, workspace=workspace, db=db, shell="allow", max_steps=4, env=env)
    first = agent.start("write files")
    assert first.stop_reason == "max_steps"
    # The run's first snapshot, the check before its first step and the command's two
    # snapshots: the three file-tool steps walked nothing.
    assert len(walks) == 4
    import sqlite3

    rows = sqlite3.connect(tmp_path / "api.db").execute(
        "SELECT s.tool_name, c.path, c.change FROM step_changes c JOIN steps s "
        "ON s.run_id = c.run_id AND s.seq = c.seq ORDER BY s.seq"
    )
    assert rows.fetchall() == [
        ("run_command", "p0/made.txt", "added"),
        ("write_file", "p1/new.py", "added"),
        ("edit_file", "p1/f0.py", "modified"),
        ("write_file", "fresh/dir/x.py", "added"),
    ]
    # A change from outside between sessions: resume (in this same process, whose scanner
    # kept its state) walks the whole tree and stops on it.
    (workspace / "p2" / "f2.py").write_text("changed by hand\n")
    blocked = agent.resume(first.run_id, max_steps=20)
    assert (blocked.status, blocked.stop_reason) == ("blocked", "workspace_drift")
    assert "p2/f2.py" in (blocked.answer or "") + str(agent.show(first.run_id))


def _wait_until_old(root: Path) -> None:
    """Until every folder's change time is older than RACY_NS (a condition, not a guess)."""
    import time

    from durable_agent.workspace.scan import RACY_NS

    newest = max(os.lstat(d).st_ctime_ns for d, _, _ in os.walk(root))
    while time.time_ns() - RACY_NS <= newest:
        time.sleep(0.01)


def test_a_folder_listed_before_is_not_listed_again_until_a_name_in_it_changes(
    tmp_path: Path,
) -> None:
    _tree(tmp_path, 3, 3)
    (tmp_path / "p2" / "new.py").write_text("in a folder changed just now\n")
    scanner = Scanner(tmp_path, EXCLUDE, 1000)
    scanner.scan()
    # Changed within RACY_NS of the scan: a name added in the same clock tick would leave
    # its change time as it is, so its listing is not kept.
    assert b"p2" not in scanner._listing
    _wait_until_old(tmp_path)
    scanner.scan()
    assert set(scanner._listing) == {b"", b"p0", b"p1", b"p2"}
    listed: list[int] = []
    real = scan._listing
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scan, "_listing", lambda fd: listed.append(fd) or real(fd))
        # A file's content changes, its folder's names do not: found by its lstat alone.
        (tmp_path / "p1" / "f1.py").write_text("edited in place\n")
        got = scanner.scan()
        assert listed == [] and [c.path for c in changes(got.base or {}, got.manifest)] == [
            b"p1/f1.py"
        ]
        # A name added, one renamed, one removed: their folders are listed again.
        (tmp_path / "p0" / "added.py").write_text("added\n")
        os.rename(tmp_path / "p1" / "f0.py", tmp_path / "p1" / "moved.py")
        (tmp_path / "p2" / "f2.py").unlink()
        got = scanner.scan()
        assert len(listed) == 3
    assert got.manifest == Scanner(tmp_path, EXCLUDE, 1000).scan().manifest
    assert {(c.path, c.change) for c in changes(got.base or {}, got.manifest)} == {
        (b"p0/added.py", "added"),
        (b"p1/f0.py", "deleted"),
        (b"p1/moved.py", "added"),
        (b"p2/f2.py", "deleted"),
    }


# -- the stat cache's loop: in C (_speedups.c), and in Python where it cannot be built ---------

_KEY_AS = st.sampled_from(
    ["same", "racy", "ctime", "size", "inode", "mode", "absent", "huge", "short", "tuple"]
)


def test_the_stat_cache_loop_is_built_in_c() -> None:
    # Without it every command's step pays an os.stat_result per file (1.5× `git status` at
    # 50,000 files): a build that fell back to Python must not go unnoticed in CI. Elsewhere
    # (a machine with no C compiler) the Python loop is the one there is: said, not failed.
    from scale_helpers import in_ci

    try:
        from durable_agent.workspace import _speedups
    except ImportError as exc:
        if in_ci():
            raise
        pytest.skip(f"the C loop is not built here ({exc}): the scanner takes its Python loop")
    assert scan._changed is _speedups.changed and scan._preload is _speedups.preload


def _make(path: Path, kind: str, i: int) -> None:
    """A `kind` at `path` (`gone`: nothing), a file of `i` bytes."""
    if kind == "file":
        path.write_bytes(b"x" * i)
    elif kind == "link":
        path.symlink_to("nowhere")
    elif kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["file", "link", "dir", "fifo", "gone"]), _KEY_AS),
        min_size=0,
        max_size=12,
    )
)
def test_the_c_and_python_loops_give_the_same_names(kinds: list[tuple[str, str]]) -> None:
    _speedups = pytest.importorskip("durable_agent.workspace._speedups")

    with tempfile.TemporaryDirectory() as tmp:
        names: list[bytes] = []
        cached: dict[bytes, Any] = {}
        for i, (kind, key_as) in enumerate(kinds):
            name = f"n{i}".encode()
            path = Path(tmp) / os.fsdecode(name)
            _make(path, kind, i)
            names.append(name)
            if key_as == "absent":
                continue
            if kind == "gone":
                ctime, size, ino, mode = 1, 2, 3, 0o644
            else:
                s = os.lstat(path)
                ctime, size, ino, mode = s.st_ctime_ns, s.st_size, s.st_ino, s.st_mode & 0o777
            pack = RECORD_TAIL.pack
            key: Any = {
                "racy": None,
                "ctime": pack(ctime + 1, size, ino, mode),
                "size": pack(ctime, size + 1, ino, mode),
                "inode": pack(ctime, size, ino ^ 1, mode),
                "mode": pack(ctime, size, ino, mode ^ 1),
                "huge": pack(-(2**63), 2**63 - 1, 2**64 - 1, 2**32 - 1),
                "short": pack(ctime, size, ino, mode)[:-1],
                "tuple": (ctime, size, ino),  # the key of an older version: not trusted
            }.get(key_as, pack(ctime, size, ino, mode))
            cached[name] = (key, object())
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
        try:
            got = _speedups.changed(fd, names, cached)
            assert got == scan._changed_py(fd, names, cached)
        finally:
            os.close(fd)
        # Vouched for: cached with the key of what is there now.
        vouched = [key_as == "same" and kind != "gone" for kind, key_as in kinds]
        assert got == [n for n, ok in zip(names, vouched, strict=True) if not ok]


def _key_of(path: Path) -> bytes:
    s = os.lstat(path)
    return RECORD_TAIL.pack(s.st_ctime_ns, s.st_size, s.st_ino, s.st_mode & 0o777)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["", "d", "d/e", "f"]),
            st.sampled_from(["file", "link", "dir", "gone"]),
            _KEY_AS,
            st.sampled_from(["kept", "written", "replaced", "removed", "new row"]),
        ),
        min_size=0,
        max_size=16,
    ),
    st.sampled_from([0, 1, 4, 16]),
)
def test_the_lstat_calls_made_ahead_give_the_loops_answer(
    files: list[tuple[str, str, str, str]], threads: int
) -> None:
    """A walk's lstat calls made ahead in threads (_speedups.preload), whatever changed
    between the cache and them or between them and the walk's question (a row made anew, a
    file written or gone since), answer what the loop answers when asked then."""
    _speedups = pytest.importorskip("durable_agent.workspace._speedups")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for folder in ("d", "d/e", "f"):
            (root / folder).mkdir(parents=True)
        cache: dict[bytes, dict[bytes, Any]] = {}
        after: list[tuple[Path, str, bytes, bytes]] = []
        for i, (folder, kind, key_as, then) in enumerate(files):
            name = f"n{i}".encode()
            path = root / folder / os.fsdecode(name)
            _make(path, kind, i)
            rows = cache.setdefault(os.fsencode(folder), {})
            if key_as == "absent":
                continue
            key: Any = _key_of(path) if kind != "gone" else RECORD_TAIL.pack(1, 2, 3, 0o644)
            ctime, size, ino, mode = RECORD_TAIL.unpack(key)
            key = {
                "racy": None,
                "ctime": RECORD_TAIL.pack(ctime + 1, size, ino, mode),
                "size": RECORD_TAIL.pack(ctime, size + 1, ino, mode),
                "short": key[:-1],
                "tuple": (ctime, size, ino),
            }.get(key_as, key)
            rows[name] = (key, object())
            after.append((path, then, os.fsencode(folder), name))
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            pre = _speedups.preload(fd, cache, threads)
        finally:
            os.close(fd)  # (it keeps its own)
        for path, then, folder, name in after:  # changes since its lstat calls
            if then == "written" and path.is_file() and not path.is_symlink():
                with path.open("ab") as f:
                    f.write(b"more")
            elif then == "replaced" and not path.is_dir():
                path.unlink(missing_ok=True)
                path.write_bytes(b"new")
            elif then == "removed" and not path.is_dir():
                path.unlink(missing_ok=True)
            elif then == "new row" and lexists(path):
                cache[folder][name] = (_key_of(path), object())  # made by the walk since
        for folder, rows in cache.items():
            fd = os.open(root / os.fsdecode(folder), os.O_RDONLY | os.O_DIRECTORY)
            try:
                names = sorted(rows) + [b"unknown"]
                want = scan._changed_py(fd, names, rows)
                got = pre.changed(fd, folder, names, rows)
                # A verdict made before the change stands for its row (a change during a
                # walk is the next walk's); any other is the loop's answer now.
                stale = {
                    n
                    for p, then, f, n in after
                    if f == folder and then in ("written", "replaced", "removed")
                }
                assert [n for n in got if n not in stale] == [n for n in want if n not in stale]
                assert set(got) - stale <= set(want)
            finally:
                os.close(fd)


def lexists(path: Path) -> bool:
    return os.path.lexists(path)


def test_lstat_calls_made_in_another_folder_are_not_taken(tmp_path: Path) -> None:
    """A folder swapped for another since the lstat calls (the same names, the same files by
    hard links: the same stat keys) is lstat'ed again by the walk, as is one asked of under
    a path the cache did not have."""
    _speedups = pytest.importorskip("durable_agent.workspace._speedups")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"a")
    cache = {b"d": {b"a": (_key_of(tmp_path / "d" / "a"), object())}}
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        pre = _speedups.preload(fd, cache, 1)
    finally:
        os.close(fd)
    fd = os.open(tmp_path / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:  # (its lstat calls made: the answer waits for them)
        assert pre.changed(fd, b"d", [b"a"], cache[b"d"]) == []
    finally:
        os.close(fd)
    os.rename(tmp_path / "d", tmp_path / "old")
    (tmp_path / "d").mkdir()
    os.link(tmp_path / "old" / "a", tmp_path / "d" / "a")
    os.unlink(tmp_path / "old" / "a")
    fd = os.open(tmp_path / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:
        (tmp_path / "d" / "a").chmod(0o600)  # the walk's own lstat sees this
        assert pre.changed(fd, b"d", [b"a"], cache[b"d"]) == [b"a"]
        assert pre.changed(fd, b"elsewhere", [b"a"], cache[b"d"]) == [b"a"]
    finally:
        os.close(fd)


def test_a_preload_dropped_while_its_threads_run_waits_for_them(tmp_path: Path) -> None:
    """Its threads read its memory: freeing it joins them first (no use after free)."""
    _speedups = pytest.importorskip("durable_agent.workspace._speedups")
    cache: dict[bytes, dict[bytes, Any]] = {}
    for d in range(40):
        folder = tmp_path / f"d{d}"
        folder.mkdir()
        rows = cache[os.fsencode(folder.name)] = {}
        for i in range(100):
            (folder / f"f{i}").write_bytes(b"x")
            rows[f"f{i}".encode()] = (_key_of(folder / f"f{i}"), object())
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for threads in (0, 1, 4, 16):
            pre = _speedups.preload(fd, cache, threads)
            del pre  # (at once: its threads are under way)
        pre = _speedups.preload(fd, cache, 4)
    finally:
        os.close(fd)
    last = tmp_path / "d39"
    fd = os.open(last, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert pre.changed(fd, b"d39", sorted(cache[b"d39"]), cache[b"d39"]) == []
    finally:
        os.close(fd)


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["c", "ahead", "python"])
@settings(max_examples=12, deadline=None)
@given(st.lists(_command, min_size=1, max_size=8))
def test_commands_over_files_cached_long_ago_give_the_manifest_of_a_full_scan(
    loop: str, ops: list[tuple[Any, ...]]
) -> None:
    # Files scanned within RACY_NS of their last change are read again by every scan, so in
    # the test above the cached keys are mostly racy: here every file is old when cached,
    # so each command's changes are found by comparing stat keys alone.
    with contextlib.ExitStack() as stack:
        if loop == "python":
            patch = stack.enter_context(pytest.MonkeyPatch.context())
            patch.setattr(scan, "_changed", scan._changed_py)
            patch.setattr(scan, "_preload", scan._preload_py)
        elif loop == "ahead":  # the lstat calls made ahead in threads, however few the files
            stack.enter_context(pytest.MonkeyPatch.context()).setattr(scan, "PRELOAD_FROM", 0)
        root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for rel in ["a", "b", "d/c", "d/e", "d/f/g", "n/m/k", "x.log"]:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(b"old")
        (root / "d" / "f" / "g").chmod(0o755)
        (root / "b").unlink()
        (root / "b").symlink_to("a")
        _wait_until_old(root)
        scanner = Scanner(root, EXCLUDE, 4)
        scanner.scan()
        for op in ops:
            _command_writes(root, op)
            got = scanner.scan()
            assert got.manifest == Scanner(root, EXCLUDE, 4).scan().manifest, op


def test_walks_pause_the_collector_and_leave_it_as_they_found_it() -> None:
    import gc
    import threading

    assert gc.isenabled()
    inside = threading.Event()
    release = threading.Event()

    def walk() -> None:
        with scan.collector_paused():
            inside.set()
            release.wait(10)

    other = threading.Thread(target=walk)
    other.start()
    inside.wait(10)
    with scan.collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # (the other walk is still under way)
    release.set()
    other.join()
    assert gc.isenabled()
    gc.disable()  # one who turned it off keeps it off
    try:
        with scan.collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


_KILLED_SCANNER = r"""
import os, sys
from pathlib import Path
from durable_agent.store.blobs import BlobStore
from durable_agent.store.engine import open_store_engine
from durable_agent.workspace import scan, snapshot
from durable_agent.workspace.scan import Scanner

root, url = Path(sys.argv[1]), sys.argv[2]
engine = open_store_engine(url)
blobs = BlobStore(engine)
scanner = Scanner(root, [], 10_000_000)
real = scan._preload


def preload(fd, cache, threads):  # the parent is told once the threads are under way
    made = real(fd, cache, threads)
    os.write(1, b"walking\n")
    return made


scan._preload = preload
for i in range(10_000):  # commands' steps: a file changed, a full walk, committed
    (root / "d0" / f"f{i % 50}").write_bytes(b"changed %d" % i)
    snap = snapshot.take(scanner, blobs)
    with engine.begin() as conn:
        for statement, params in snap.statements:
            conn.execute(statement, params)
"""


@pytest.mark.slow
def test_a_process_killed_while_its_lstat_threads_run_leaves_every_named_tree_whole(
    tmp_path: Path,
) -> None:
    """SIGKILL once a walk's lstat calls are under way in threads (preload, over 1,024 files),
    among snapshots committed to a real store: the threads only read, so every tree the store
    holds is whole, and a new process's snapshot of the files as they are is taken and
    stored."""
    import signal
    import subprocess
    import sys

    from durable_agent.store.blobs import BlobStore
    from durable_agent.store.engine import open_store_engine
    from durable_agent.store.schema import workspace_trees
    from durable_agent.workspace import snapshot
    from durable_agent.workspace.manifest import blob_refs

    root = tmp_path / "ws"
    for d in range(30):
        (root / f"d{d}").mkdir(parents=True)
        for i in range(50):
            (root / f"d{d}" / f"f{i}").write_bytes(b"%d/%d" % (d, i))
    url = f"sqlite:///{tmp_path / 'store.db'}"
    for kill_at in (1, 3, 7):  # the kill comes once the k-th walk's threads are under way
        proc = subprocess.Popen(
            [sys.executable, "-c", _KILLED_SCANNER, str(root), url], stdout=subprocess.PIPE
        )
        assert proc.stdout is not None
        for _ in range(kill_at):
            assert proc.stdout.readline() == b"walking\n"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        engine = open_store_engine(url)
        try:
            blobs = BlobStore(engine)
            with engine.connect() as conn:
                trees = [
                    r[0]
                    for r in conn.execute(
                        workspace_trees.select().with_only_columns(workspace_trees.c.id)
                    )
                ]
            assert trees
            for tid in trees:
                with snapshot._trees_lock:
                    snapshot._trees.clear()
                refs = blob_refs(snapshot.load(blobs, tid).values())
                assert blobs.stored_blobs(refs) == refs, tid
            fresh = Scanner(root, [], 10_000_000)
            snap = snapshot.take(fresh, blobs)
            with engine.begin() as conn:
                for statement, params in snap.statements:
                    conn.execute(statement, params)
            assert snap.manifest == Scanner(root, [], 10_000_000).scan().manifest
            assert snap.tree_id in blobs.stored([], [snap.tree_id])[1]
        finally:
            engine.dispose()
