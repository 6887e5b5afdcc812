#!/usr/bin/env python3
"""Benchmark: workspace snapshots (issue 12's targets), in one process run.

A workspace of N files (default 5,000 of 10 KB text: 50 MB, in 50 directories, old mtimes
like a checked-out repository) and a real SQLite store:

    first      the first snapshot of a process: every file hashed and stored
    unchanged  a snapshot of the unchanged workspace (stat only) — target ≤ 20 ms
    one file   one file changed by one line — target ≤ 25 ms
    growth     store bytes added by that one-line edit's snapshot, against the file's
               zlib size — target ≤ 2×
    floor      the same walk with nothing but listing and lstat (no cache, no manifest): on a
               loaded machine the ratio to it says more than the milliseconds

"scan" is the walk alone; "take" adds the store's existence queries and building the
statements; "commit" adds writing them (one transaction, synchronous=FULL).

Usage: scripts/bench_workspace.py [--files 5000] [--size 10000] [--repeat 21] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
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
from durable_agent.workspace import snapshot
from durable_agent.workspace.scan import DEFAULT_EXCLUDE, Scanner

OLD = 1_600_000_000 * 10**9  # an mtime long past: not "racy"


def make_workspace(root: Path, files: int, size: int) -> list[Path]:
    rng = random.Random(12)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(2000)]
    paths = []
    for i in range(files):
        d = root / f"pkg{i % 50:02d}"
        d.mkdir(exist_ok=True)
        p = d / f"mod{i:05d}.py"
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
    """The physical floor in Python: list every directory and lstat every entry, nothing else."""
    n = 0
    stack = [os.fsencode(str(root))]
    while stack:
        for item in os.scandir(stack.pop()):
            item.stat(follow_symlinks=False)
            n += 1
            if item.is_dir(follow_symlinks=False):
                stack.append(item.path)
    return n


def stored_bytes(blobs: BlobStore) -> int:
    with blobs.engine.connect() as conn:
        b = conn.execute(
            select(func.coalesce(func.sum(func.length(workspace_blobs.c.data)), 0))
        ).scalar()
        t = conn.execute(
            select(func.coalesce(func.sum(func.length(workspace_trees.c.data)), 0))
        ).scalar()
    return int(b or 0) + int(t or 0)


def commit(blobs: BlobStore, snap: snapshot.Snapshot) -> None:
    with blobs.engine.begin() as conn:
        for statement, params in snap.statements:
            conn.execute(statement, params)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--size", type=int, default=10_000, help="bytes per file")
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
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
        r["store_bytes_total"] = stored_bytes(blobs)
        r["workspace_zlib_bytes"] = sum(len(zlib.compress(p.read_bytes(), 6)) for p in paths)
    width = max(len(k) for k in r)
    for k, v in r.items():
        print(f"{k:<{width}}  {v:,.2f}" if isinstance(v, float) else f"{k:<{width}}  {v:,}")
    print("targets: unchanged ≤ 20 ms, one file changed ≤ 25 ms, growth ratio ≤ 2")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
