#!/usr/bin/env python3
"""Benchmark: workspace snapshots (issues 12 and 40), in one process run.

A generated workspace of N files (default 5,000 of 10 KB text; over 5,000 files 1 KB each
unless --size says otherwise), 50 files a folder in folders of 20, old mtimes like a
checked-out repository, committed to a git repository in it; a real SQLite store:

    first      the first snapshot of a process: every file hashed and stored
    unchanged  a snapshot of the unchanged workspace (stat only) — target ≤ 20 ms (5,000)
    one file   one file changed by one line — target ≤ 25 ms (5,000)
    growth     store bytes added by that one-line edit's snapshot, against the file's
               zlib size — target ≤ 2×
    floor      the same walk with nothing but listing and lstat (no cache, no manifest): on a
               loaded machine the ratio to it says more than the milliseconds
    git status `git status --porcelain` (untracked cache and fsmonitor off) on the same
               tree, timed next to each step below
    file tool  a write_file step's two snapshots (before and after), which look at the
               written path alone — target ≤ 5 ms at 50,000 files
    command    a command step's snapshot after it changed one file (a full scan) — target
               ≤ 1.0× git status; also its CPU time (user + system) against git status's:
               on a machine other work shares, git's threads (preload-index) get a larger
               share of the cores than one thread does, which the CPU times leave out
    git first  with `snapshot_baseline = "git"`: the first snapshot of a clean checkout (a
               fresh process's: files git vouches for neither read nor stored), taken and
               committed, next to `git status --porcelain` in the same repeat, and the
               bytes it stored —
               targets ≤ 1 MB stored for 100 MB, ≤ 2× git status. `--git-only` measures this
               alone (e.g. `--git-only --files 10000 --size 10000`: a 100 MB checkout)

"scan" is the walk alone; "take" adds the store's existence queries and building the
statements; "commit" adds writing them (one transaction, synchronous=FULL). Each figure is
the median of --repeat runs, with its range (min–max).

Usage: scripts/bench_workspace.py [--files 5000|50000|500000] [--size BYTES] [--repeat 21]
       [--git-only] [--json FILE]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import resource
import statistics
import string
import subprocess
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from durable_agent.store.blobs import BlobStore
from durable_agent.store.engine import open_store_engine
from durable_agent.store.schema import workspace_blobs, workspace_trees
from durable_agent.workspace import git_baseline, snapshot
from durable_agent.workspace.scan import DEFAULT_EXCLUDE, Scanner

OLD = 1_600_000_000 * 10**9  # an mtime long past: not "racy"


def make_workspace(root: Path, files: int, size: int) -> list[Path]:
    rng = random.Random(12)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(2000)]
    paths = []
    for i in range(files):
        d = root / f"pkg{i // 1000:03d}" / f"sub{i // 50 % 20:02d}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"mod{i:06d}.py"
        lines, total = [], 0
        while total < size:
            line = " ".join(rng.choices(words, k=10)) + "\n"
            lines.append(line)
            total += len(line)
        p.write_text("".join(lines)[:size])
        os.utime(p, ns=(OLD, OLD))
        paths.append(p)
    return paths


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def walk_floor(root: Path) -> int:
    """The physical floor in Python: list every directory and lstat every entry, nothing else
    (.git left out, as the snapshots leave it)."""
    n = 0
    stack = [os.fsencode(str(root))]
    while stack:
        for item in os.scandir(stack.pop()):
            item.stat(follow_symlinks=False)
            n += 1
            if item.is_dir(follow_symlinks=False) and item.name != b".git":
                stack.append(item.path)
    return n


GIT = [
    "git",
    *("-c", "core.untrackedCache=false", "-c", "core.fsmonitor=false"),
    *("-c", "gc.auto=0", "-c", "maintenance.auto=false"),  # nothing left running in .git
]


def git_commit_all(root: Path) -> bool:
    """The workspace as a clean checkout: every file committed (False: no git here)."""
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@b",
        "GIT_COMMITTER_NAME": "b",
    }
    env["GIT_COMMITTER_EMAIL"] = "b@b"
    try:
        for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tree"]):
            subprocess.run([*GIT, *cmd], cwd=root, env=env, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return False
    git_status_ms(root)  # the index refreshed once, as a user's checkout has it
    return True


def git_status_ms(root: Path, cpu: list[float] | None = None) -> float:
    """Its wall-clock time; its CPU time (user + system, ms) appended to `cpu`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([*GIT, "status", "--porcelain"], cwd=root, check=True, capture_output=True)
    took = (time.perf_counter() - t) * 1000
    if cpu is not None:
        cpu.append(cpu_ms(before, resource.getrusage(resource.RUSAGE_CHILDREN)))
    return took


def cpu_ms(before: resource.struct_rusage, after: resource.struct_rusage) -> float:
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.2f} ({min(values):,.2f}–{max(values):,.2f})"


def stored_bytes(blobs: BlobStore) -> int:
    with blobs.engine.connect() as conn:
        b = conn.execute(
            select(func.coalesce(func.sum(func.length(workspace_blobs.c.data)), 0))
        ).scalar()
        t = conn.execute(
            select(func.coalesce(func.sum(func.length(workspace_trees.c.data)), 0))
        ).scalar()
    return int(b or 0) + int(t or 0)


def commit(blobs: BlobStore, snap: snapshot.Snapshot, scanner: Scanner | None = None) -> None:
    """`snap`'s statements, in one transaction; then, as a step does, the scanner told that
    they are in the store (snapshot.committed; the code before it asked the store again)."""
    with blobs.engine.begin() as conn:
        for statement, params in snap.statements:
            conn.execute(statement, params)
    told = getattr(snapshot, "committed", None)
    if scanner is not None and told is not None:
        told(scanner, blobs, snap)


def steps(
    root: Path, paths: list[Path], scanner: Scanner, blobs: BlobStore, repeat: int
) -> dict[str, Any]:
    """Per step, next to `git status` on the same tree in the same repeat: a file tool's
    step (its before and after snapshots look at the written path) and a command's (its
    after snapshot walks the tree, one file changed)."""
    if not git_commit_all(root):
        return {"git": "not found: no git status baseline"}
    # The code before issue 40 takes no paths: its file-tool steps walked the tree.
    looks = "paths" in inspect.signature(snapshot.take).parameters

    def take(paths: list[bytes] | None) -> snapshot.Snapshot:
        return snapshot.take(scanner, blobs, paths) if looks else snapshot.take(scanner, blobs)

    snapshot.take(scanner, blobs)  # the tree as git left it (its index read once)
    commit(blobs, snapshot.take(scanner, blobs), scanner)
    git, tool, tool_commit, command, ratio = [], [], [], [], []
    git_cpu: list[float] = []
    command_cpu: list[float] = []
    for i in range(repeat):
        git.append(git_status_ms(root, git_cpu))
        target = paths[(i * 7919) % len(paths)]
        rel = [os.fsencode(os.path.relpath(target, root))]
        t = time.perf_counter()
        before = take(rel)
        took = time.perf_counter() - t
        tmp = target.with_name(f".{target.name}.tmp")  # as write_file does: a rename
        tmp.write_text(target.read_text() + f"one more line {i}\n")
        os.rename(tmp, target)
        t = time.perf_counter()
        after = take(rel)
        tool.append((took + time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        commit(blobs, before, scanner)
        commit(blobs, after, scanner)
        tool_commit.append((time.perf_counter() - t) * 1000)
        commit(blobs, snapshot.take(scanner, blobs), scanner)  # a command's before snapshot
        with paths[(i * 104729 + 1) % len(paths)].open("a") as f:
            f.write(f"a command's line {i}\n")
        used = resource.getrusage(resource.RUSAGE_SELF)
        t = time.perf_counter()
        after = snapshot.take(scanner, blobs)
        command.append((time.perf_counter() - t) * 1000)
        command_cpu.append(cpu_ms(used, resource.getrusage(resource.RUSAGE_SELF)))
        commit(blobs, after, scanner)
        ratio.append(command[-1] / git[-1])
    return {
        "git_status_ms": git,
        "file_tool_step_snapshots_ms": tool,
        "file_tool_step_commit_ms": tool_commit,
        "command_step_after_snapshot_ms": command,
        "command_ratio_to_git_status": ratio,
        "git_status_cpu_ms": git_cpu,
        "command_step_after_snapshot_cpu_ms": command_cpu,
        "command_cpu_ratio_to_git_status_cpu": [
            c / g for c, g in zip(command_cpu, git_cpu, strict=True)
        ],
    }


def git_first(
    tmp: str, files: int, size: int, repeat: int, with_store: bool = True
) -> dict[str, Any]:
    """The git baseline's first snapshot of a clean checkout, as a fresh process takes it
    (a new scanner, HEAD looked up again, a new store), next to `git status` each repeat."""
    root = Path(tmp) / "checkout"
    root.mkdir()
    make_workspace(root, files, size)
    if not git_commit_all(root):
        return {"git": "not found: no git baseline"}
    status, first, stored, plain, plain_stored = [], [], [], [], []
    asked: list[float] = []
    for i in range(repeat):
        status.append(git_status_ms(root))
        if not with_store:
            plain.append(0.0)
            plain_stored.append(0)
        # The default ("store") first snapshot of the same checkout, for comparison.
        if with_store:
            engine = open_store_engine(f"sqlite:///{tmp}/store{i}.db", durability="full")
            blobs = BlobStore(engine)
            scanner = Scanner(root, list(DEFAULT_EXCLUDE), 10_000_000)
            t = time.perf_counter()
            commit(blobs, snapshot.take(scanner, blobs))
            plain.append((time.perf_counter() - t) * 1000)
            plain_stored.append(stored_bytes(blobs))
            engine.dispose()
            os.remove(f"{tmp}/store{i}.db")
        # What the scan waits for before its walk (git's commands and the index read:
        # head_and_seeds; the tracked files' lstat calls go on in threads after it), then
        # the snapshot.
        git_baseline._heads.clear()
        t = time.perf_counter()
        git_baseline.head_and_seeds(os.fsencode(str(root)))
        asked.append((time.perf_counter() - t) * 1000)
        engine = open_store_engine(f"sqlite:///{tmp}/git{i}.db", durability="full")
        blobs = BlobStore(engine)
        scanner = Scanner(root, list(DEFAULT_EXCLUDE), 10_000_000)
        git_baseline._heads.clear()  # what a new process knows of HEAD: nothing
        t = time.perf_counter()
        commit(blobs, snapshot.take(scanner, blobs, git=True))
        first.append((time.perf_counter() - t) * 1000)
        stored.append(stored_bytes(blobs))
        engine.dispose()
        os.remove(f"{tmp}/git{i}.db")
    return {
        "git_first_checkout_bytes": files * size,
        "git_first_git_status_ms": status,
        "git_first_snapshot_ms": first,
        "git_first_git_commands_ms": asked,
        "git_first_ratio_to_git_status": [f / s for f, s in zip(first, status, strict=True)],
        "git_first_stored_bytes": statistics.median(stored),
        "store_first_snapshot_ms": plain,
        "store_first_stored_bytes": statistics.median(plain_stored),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument(
        "--size", type=int, help="bytes per file (default 10,000; 1,000 over 5,000 files)"
    )
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument(
        "--git-only", action="store_true", help="the git baseline's first snapshot alone"
    )
    parser.add_argument(
        "--no-store-first",
        action="store_true",
        help="with --git-only: leave out the default first snapshot (its figures are known)",
    )
    args = parser.parse_args()
    if args.size is None:
        args.size = 10_000 if args.files <= 5000 else 1000
    if args.git_only:
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
            return report(
                git_first(tmp, args.files, args.size, args.repeat, not args.no_store_first),
                args.json,
            )
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        root = Path(tmp) / "ws"
        root.mkdir()
        paths = make_workspace(root, args.files, args.size)
        engine = open_store_engine(f"sqlite:///{tmp}/store.db", durability="full")
        blobs = BlobStore(engine)
        scanner = Scanner(root, list(DEFAULT_EXCLUDE), 10_000_000)
        t = time.perf_counter()
        first = snapshot.take(scanner, blobs)
        first_ms = (time.perf_counter() - t) * 1000
        commit(blobs, first)
        snapshot.take(scanner, blobs)  # confirms the first snapshot's blobs are stored
        r: dict[str, Any] = {
            "files": args.files,
            "bytes": args.files * args.size,
            "first_snapshot_ms": first_ms,
        }
        r["unchanged_scan_ms"] = median_ms(scanner.scan, args.repeat)
        # The floor is measured next to each timing (alternating), so both see the same
        # machine: on a noisy one the ratios hold where the milliseconds do not.
        floors, unchanged = [], []
        for _ in range(args.repeat):
            floors.append(median_ms(lambda: walk_floor(root), 1))
            unchanged.append(median_ms(lambda: snapshot.take(scanner, blobs), 1))
        r["unchanged_take_ms"] = statistics.median(unchanged)
        target = paths[len(paths) // 2]
        counter = [0]
        growth: list[int] = []

        take_times, commit_times = [], []
        for _ in range(args.repeat):
            counter[0] += 1
            with target.open("a") as f:
                f.write(f"one more line {counter[0]}\n")
            floors.append(median_ms(lambda: walk_floor(root), 1))
            t = time.perf_counter()
            snap = snapshot.take(scanner, blobs)
            take_times.append((time.perf_counter() - t) * 1000)
            before = stored_bytes(blobs)
            t = time.perf_counter()
            commit(blobs, snap)
            commit_times.append((time.perf_counter() - t) * 1000)
            growth.append(stored_bytes(blobs) - before)
        r["one_file_changed_take_ms"] = statistics.median(take_times)
        r["one_file_changed_commit_ms"] = statistics.median(commit_times)
        r["floor_walk_lstat_ms"] = statistics.median(floors)
        r["unchanged_ratio_to_floor"] = r["unchanged_take_ms"] / r["floor_walk_lstat_ms"]
        r["one_file_ratio_to_floor"] = r["one_file_changed_take_ms"] / r["floor_walk_lstat_ms"]
        compressed = len(zlib.compress(target.read_bytes(), 6))
        r["growth_bytes_one_line_edit"] = statistics.median(growth)
        r["changed_file_zlib_bytes"] = compressed
        r["growth_ratio"] = r["growth_bytes_one_line_edit"] / compressed
        r.update(steps(root, paths, scanner, blobs, args.repeat))
        r["store_bytes_total"] = stored_bytes(blobs)
        r["workspace_zlib_bytes"] = sum(len(zlib.compress(p.read_bytes(), 6)) for p in paths)
        r.update(git_first(tmp, args.files, args.size, min(args.repeat, 5)))
    return report(r, args.json)


def report(r: dict[str, Any], json_file: str | None) -> int:
    width = max(len(k) for k in r)
    for k, v in r.items():
        if isinstance(v, list):
            print(f"{k:<{width}}  {spread(v)}")
        else:
            print(f"{k:<{width}}  {v:,.2f}" if isinstance(v, float) else f"{k:<{width}}  {v:,}")
    print(
        "targets: unchanged ≤ 20 ms, one file changed ≤ 25 ms, growth ratio ≤ 2 (5,000 files); "
        "file-tool step ≤ 5 ms, command step ≤ 1.0× git status (50,000 files); git baseline's "
        "first snapshot ≤ 2× git status, ≤ 1 MB stored for 100 MB"
    )
    if json_file:
        Path(json_file).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
