#!/usr/bin/env python3
"""Throughput of `durable-agent worker` on PostgreSQL: runs/second and steps/second for 1, 2
and 4 worker processes draining the same queue, with the scripted model and a trivial tool.

    .venv/bin/python scripts/bench_workers.py                       # 40 runs of 10 model steps
    .venv/bin/python scripts/bench_workers.py --workers 1,2,4,8 --runs 80 --concurrency 2
    .venv/bin/python scripts/bench_workers.py --db sqlite:///tmp/bench.db   # same, on SQLite
    .venv/bin/python scripts/bench_workers.py --model-delay 0.05   # model calls of 50 ms

Each measurement gets a fresh schema (PostgreSQL; dropped afterwards) or a fresh file
(SQLite), enqueues the runs, then starts N `worker --once` processes and waits for them to
exit. Each run is SCRIPT_STEPS model calls, each but the last calling `list_files` (a read
tool: one transaction), so a run writes 2 rows per model step and 1 per tool step.

Two windows are reported: `wall` includes the workers' start-up (interpreter, imports);
`busy` runs from the first step written to the last run finished (from the database's own
timestamps), which is what a long-lived worker pool sustains.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select, text

from durable_agent.config.settings import load_settings
from durable_agent.store import schema
from durable_agent.store.engine import open_store_engine
from durable_agent.store.runs import Store
from durable_agent.wiring import build_runner

DEFAULT_PG = os.environ.get(
    "DURABLE_AGENT_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


@dataclass(frozen=True)
class Result:
    workers: int
    runs: int
    model_steps: int
    step_rows: int
    wall_s: float
    busy_s: float


@contextmanager
def fresh_store(base: str, tmp: Path) -> Iterator[str]:
    """A store URL nobody else uses: a new PostgreSQL schema, or a new SQLite file."""
    if not base.startswith(("postgresql", "postgres")):
        yield f"sqlite:///{tmp / f'bench-{uuid.uuid4().hex[:8]}.db'}"
        return
    import psycopg

    schema = f"da_bench_{uuid.uuid4().hex[:10]}"
    admin_url = "postgresql://" + base.split("://", 1)[1]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}"
        finally:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def write_script(path: Path, steps: int, delay_s: float = 0.0) -> str:
    turns: list[dict[str, object]] = [
        {"tool_calls": [{"name": "list_files", "arguments": {"path": ".", "max_depth": 1 + i % 2}}]}
        for i in range(steps - 1)
    ]
    turns.append({"content": "done"})
    if delay_s:
        for turn in turns:
            turn["delay_s"] = delay_s
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


def measure(
    url: str,
    tmp: Path,
    model: str,
    *,
    workers: int,
    runs: int,
    concurrency: int,
    env: dict[str, str],
) -> Result:
    engine = open_store_engine(url)
    try:
        store = Store(engine)
        for i in range(runs):
            ws = tmp / f"ws-{uuid.uuid4().hex[:8]}"
            ws.mkdir()
            (ws / "file.txt").write_text("x\n")
            settings = load_settings(
                {
                    "workspace": ws,
                    "model": model,
                    "db": url,
                    "max_steps": 1000,
                    "max_repeats": 1000,
                },
                env,
            )
            build_runner(settings, env=env, store=store).create(f"bench {i}")
        cmd = [
            sys.executable,
            "-m",
            "durable_agent",
            "worker",
            "--db",
            url,
            "--once",
            "--quiet",
            "--poll",
            "0.05",
            "--concurrency",
            str(concurrency),
        ]
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(workers)
        ]
        errors = [p.communicate()[1] for p in procs]
        wall = time.perf_counter() - t0
        for p, err in zip(procs, errors, strict=True):
            if p.returncode != 0:
                raise SystemExit(f"a worker failed ({p.returncode}):\n{err}")
        with engine.connect() as conn:
            status = dict(
                conn.execute(text("SELECT status, count(*) FROM runs GROUP BY status")).all()
            )
            if status != {"completed": runs}:
                raise SystemExit(f"not every run completed: {status}")
            model_steps = conn.execute(text("SELECT sum(step_count) FROM runs")).scalar_one()
            step_rows = conn.execute(text("SELECT count(*) FROM steps")).scalar_one()
            # Through the table types, so SQLite's timestamp text comes back as datetimes too.
            first = conn.execute(select(func.min(schema.steps.c.started_at))).scalar_one()
            last = conn.execute(select(func.max(schema.runs.c.finished_at))).scalar_one()
        busy = (last - first).total_seconds()
        return Result(workers, runs, int(model_steps), int(step_rows), wall, busy)
    finally:
        engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--db",
        default=DEFAULT_PG,
        help="PostgreSQL URL of a database to create schemas in "
        "(or sqlite:///… for a file per measurement)",
    )
    parser.add_argument(
        "--workers", default="1,2,4", help="worker process counts to measure (default 1,2,4)"
    )
    parser.add_argument("--runs", type=int, default=40, help="runs per measurement (default 40)")
    parser.add_argument("--steps", type=int, default=10, help="model steps per run (default 10)")
    parser.add_argument(
        "--concurrency", type=int, default=1, help="--concurrency of each worker (default 1)"
    )
    parser.add_argument(
        "--model-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds each scripted model call takes (default 0: measure the harness)",
    )
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DURABLE_AGENT_"))}
    results = []
    with tempfile.TemporaryDirectory(prefix="da-bench-") as tmpdir:
        tmp = Path(tmpdir)
        model = write_script(tmp / "script.json", args.steps, args.model_delay)
        for n in counts:
            with fresh_store(args.db, tmp) as url:
                results.append(
                    measure(
                        url,
                        tmp,
                        model,
                        workers=n,
                        runs=args.runs,
                        concurrency=args.concurrency,
                        env=env,
                    )
                )
    backend = "PostgreSQL" if args.db.startswith("postgres") else "SQLite"
    print(
        f"{backend} · {args.runs} runs × {args.steps} model steps (+{args.steps - 1} list_files) · "
        f"worker --concurrency {args.concurrency} · model call {args.model_delay * 1000:g} ms · "
        f"{os.cpu_count()} CPUs"
    )
    header = f"{'workers':>7}  {'wall s':>7}  {'busy s':>7}  {'runs/s':>7}  {'model steps/s':>13}  {'step rows/s':>11}  {'speed-up':>8}"
    print(header)
    print("-" * len(header))
    base = results[0].runs / results[0].busy_s
    for r in results:
        rps = r.runs / r.busy_s
        print(
            f"{r.workers:>7}  {r.wall_s:>7.2f}  {r.busy_s:>7.2f}  {rps:>7.1f}  {r.model_steps / r.busy_s:>13.0f}  "
            f"{r.step_rows / r.busy_s:>11.0f}  {rps / base:>7.2f}×"
        )
    print(
        "rates use the busy window (first step written → last run finished); wall adds worker start-up"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
