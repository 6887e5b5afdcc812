#!/usr/bin/env python3
"""Queue throughput on PostgreSQL: claims/s and steps/s with 1, 2, 4 and 8 worker processes,
side by side with DBOS queues on the same server doing the same number of durable steps.

    .venv/bin/python scripts/bench_fleet.py                    # everything, the defaults
    .venv/bin/python scripts/bench_fleet.py --workers 1,2 --runs 12 --claims 200
    .venv/bin/python scripts/bench_fleet.py --skip-dbos        # without DBOS installed

Three measurements per worker count, each on a fresh schema (dropped afterwards):

- claims/s: CLAIMS queued runs; N processes each claim (store/queue.py: the claim path with
  priorities and queue controls) and mark completed, until none is left. The queue alone.
- durable-agent steps/s: RUNS runs of STEPS model steps (scripted model, `list_files` as
  the tool, as scripts/bench_workers.py) drained by N `worker --once` processes; a model
  step is two committed transactions (intent, outcome), a tool read one. `busy` runs from
  the first step written to the last run finished.
- DBOS steps/s: RUNS workflows of as many `@DBOS.step`s as the runs wrote step rows,
  enqueued on a DBOS Queue (worker_concurrency 1, polling every 50 ms, as the workers
  poll) served by N processes; timed from the first enqueue to the last result.
  DBOS is not a dependency of the project: `pip install dbos` into the venv to compare.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_workers import DEFAULT_PG, fresh_store, measure, write_script  # noqa: E402

DBOS_QUEUE = "bench"


# -- claims/s -------------------------------------------------------------------------------
def _claimer(url: str, ready: mp.Queue, go: object, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from sqlalchemy import update

    from durable_agent.store.engine import open_store_engine
    from durable_agent.store.queue import Queue
    from durable_agent.store.schema import runs

    engine = open_store_engine(url, pool_size=2)
    queue = Queue(engine)
    with engine.connect():  # connected before the clock runs
        pass
    ready.put(os.getpid())
    go.wait()  # type: ignore[attr-defined]
    n = 0
    while True:
        got = queue.claim(f"bench:{os.getpid()}:{n}", 30).claim
        if got is None:
            break
        with engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.id == got.run_id).values(status="completed"))
        n += 1
    out.put((n, time.time()))
    engine.dispose()


def claims_per_second(url: str, workers: int, claims: int, tmp: Path) -> float:
    from durable_agent.messages import Message
    from durable_agent.store.engine import open_store_engine
    from durable_agent.store.runs import Store

    store = Store(open_store_engine(url))
    for i in range(claims):
        store.create_run(
            f"c{i:05d}",
            task="t",
            workspace=str(tmp),
            model="m",
            settings={},
            first_messages=[Message("user", "t")],
            queue={"priority": i % 3},
        )
    store.engine.dispose()
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    ready: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    go = ctx.Event()  # every process started, imported and connected before the clock runs
    procs = [ctx.Process(target=_claimer, args=(url, ready, go, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=600)
    started = time.time()
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    taken = sum(n for n, _ in results)
    if taken != claims:
        raise SystemExit(f"claimed {taken} of {claims}")
    return claims / (max(t for _, t in results) - started)


# -- DBOS -----------------------------------------------------------------------------------
def dbos_worker(url: str, schema: str, steps: int) -> None:
    """One DBOS process serving the bench queue until stdin closes."""
    from dbos import DBOS

    @DBOS.step()
    def one_step(i: int) -> int:
        return i

    @DBOS.workflow(name="bench_flow")
    def bench_flow(n: int) -> int:
        for i in range(n):
            one_step(i)
        return n

    DBOS(
        config={
            "name": "bench",
            "system_database_url": url,
            "dbos_system_schema": schema,
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    DBOS.register_queue(DBOS_QUEUE, worker_concurrency=1, polling_interval_sec=0.05)
    print("ready", flush=True)
    sys.stdin.read()
    DBOS.destroy()


def dbos_steps(pg: str, workers: int, runs: int, steps: int) -> tuple[float, int]:
    """(seconds from the first enqueue to the last result, steps written)."""
    import psycopg
    from dbos import DBOSClient, EnqueueOptions

    schema = f"dbos_bench_{uuid.uuid4().hex[:8]}"
    url = "postgresql://" + pg.split("://", 1)[1]
    procs = []
    try:
        first = _spawn_dbos(url, schema, steps)  # makes the schema alone (its migrations)
        procs = [first] + [_spawn_dbos(url, schema, steps) for _ in range(workers - 1)]
        client = DBOSClient(system_database_url=url, dbos_system_schema=schema)
        t0 = time.perf_counter()
        handles = [
            client.enqueue(EnqueueOptions(queue_name=DBOS_QUEUE, workflow_name="bench_flow"), steps)
            for _ in range(runs)
        ]
        for h in handles:
            h.get_result()
        elapsed = time.perf_counter() - t0
        with psycopg.connect(url) as conn:
            written = conn.execute(f'SELECT count(*) FROM "{schema}".operation_outputs').fetchone()[
                0
            ]  # type: ignore[index]
        client.destroy()
        return elapsed, int(written)
    finally:
        for p in procs:
            if p.stdin:
                p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _spawn_dbos(url: str, schema: str, steps: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--dbos-worker", url, schema, str(steps)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        raise SystemExit(f"a DBOS worker did not start ({proc.poll()})")
    return proc


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--dbos-worker":
        dbos_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default=DEFAULT_PG, help="PostgreSQL URL to make schemas in")
    parser.add_argument("--workers", default="1,2,4,8", help="process counts (default 1,2,4,8)")
    parser.add_argument("--claims", type=int, default=400, help="runs to claim (default 400)")
    parser.add_argument("--runs", type=int, default=24, help="runs / workflows (default 24)")
    parser.add_argument("--steps", type=int, default=10, help="model steps a run (default 10)")
    parser.add_argument("--skip-dbos", action="store_true", help="durable-agent only")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DURABLE_AGENT_"))}
    env["DURABLE_AGENT_SANDBOX"] = "off"  # list_files only: no command runs
    rows = []
    with tempfile.TemporaryDirectory(prefix="da-fleet-bench-") as tmpdir:
        tmp = Path(tmpdir)
        model = write_script(tmp / "script.json", args.steps)
        for n in [int(x) for x in args.workers.split(",")]:
            with fresh_store(args.db, tmp) as url:
                cps = claims_per_second(url, n, args.claims, tmp)
            with fresh_store(args.db, tmp) as url:
                r = measure(url, tmp, model, workers=n, runs=args.runs, concurrency=1, env=env)
            per_run = r.step_rows // r.runs
            dbos = None if args.skip_dbos else dbos_steps(args.db, n, args.runs, per_run)
            rows.append((n, cps, r, dbos))
            d = (
                f"{dbos[1] / dbos[0]:8.1f} steps/s ({dbos[1]} steps, {dbos[0]:.1f}s)"
                if dbos
                else "-"
            )
            print(
                f"{n} workers · claims {cps:7.1f}/s · durable-agent {r.step_rows / r.busy_s:7.1f} "
                f"steps/s busy ({r.step_rows} steps, {r.busy_s:.1f}s; wall {r.wall_s:.1f}s) · "
                f"DBOS {d}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
