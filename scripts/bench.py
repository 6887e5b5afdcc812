#!/usr/bin/env python3
"""Benchmark: the harness against the physical floor (SPEC §8).

Everything is measured side by side in one process run, because these machines are noisy:
ratios against baselines from the same run mean more than absolute times.

    floor A   the same loop (scripted model, read tool, messages) with no persistence
    floor B   raw sqlite3, WAL + the same synchronous setting, the same number of commits
              per step as durable-agent made, one small row each
    floor C   raw sqlite3 replaying the very transactions durable-agent's loop committed (its
              SQL and parameters as sent to the driver) into a copy of the same store: the
              I/O and SQLite work of the agent's own rows, with no Python of the harness
    agent     durable-agent's real loop through its real store

The harness's own cost per step is (agent - floor A - floor C) / N: what Python adds.

Usage: scripts/bench.py [--steps 50,200,1000] [--repeat 3] [--json FILE] [--durability full|fast] [--pg URL]
                       [--instructions]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from durable_agent.config.settings import Settings
from durable_agent.loop.runner import Runner
from durable_agent.messages import Message
from durable_agent.models.scripted import ScriptedModel
from durable_agent.redact import Redactor
from durable_agent.store import prepared
from durable_agent.store.engine import open_store_engine
from durable_agent.store.journal import BOUNDARY_HOOKS
from durable_agent.store.runs import Store
from durable_agent.tools import build_tools
from durable_agent.tools.base import ToolContext

PAYLOAD = "".join(
    f"line {i:04d} of the benchmark payload, padded to about sixty bytes..\n" for i in range(16)
)[:1024]


def script(n: int) -> list[dict[str, Any]]:
    """n model steps: n-1 turns that read the 1 KB file, then the final answer.

    The read alternates between two offsets so the repeated-action guard stays quiet.
    """
    turns: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "payload.txt", "offset": i % 2}}
            ]
        }
        for i in range(n - 1)
    ]
    turns.append({"content": "done"})
    return turns


def make_workspace(root: Path) -> Path:
    ws = root / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "payload.txt").write_text(PAYLOAD)
    return ws


# -- floor A: the loop without persistence ----------------------------------------------------
def floor_a(n: int, ws: Path) -> float:
    model = ScriptedModel(script(n), "bench")
    tools = build_tools("deny")
    read = tools["read_file"]
    messages = [Message("system", "s"), Message("user", "t")]
    start = time.perf_counter()
    for turn in range(n):
        out = model.complete(messages, [], turn)
        messages.append(Message("assistant", out.content, tool_calls=out.tool_calls))
        for call in out.tool_calls:
            args = read.args_model.model_validate(call.parsed_arguments())
            result = read.run(args, ToolContext(workspace=ws, run_id="a", call_id=call.id))
            messages.append(Message("tool", result.for_model(), tool_call_id=call.id))
    return time.perf_counter() - start


# -- floor B: raw sqlite3 commits -------------------------------------------------------------
def floor_b(commits: int, root: Path, synchronous: str) -> float:
    path = root / "floor_b.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, run TEXT, seq INTEGER, body TEXT)")
    start = time.perf_counter()
    for i in range(commits):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t (run, seq, body) VALUES (?, ?, ?)", ("r", i, "x" * 64))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - start
    db.close()
    return elapsed


# -- floor C: the agent's own transactions, replayed by raw sqlite3 ----------------------------
class Capture:
    """Records the SQL and parameters the loop's checkpoints send to the driver (main thread
    only: the heartbeat's renewals are not the loop's), one list per committed transaction."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # off while memory is traced: the capture's lists are not the run's
        self.transactions: list[list[tuple[str, Any, bool]]] = []
        self._current: list[tuple[str, Any, bool]] = []
        self._real = prepared._execute

    def __enter__(self) -> Capture:
        if not self.enabled:
            return self

        def execute(conn: Any, sql: str, params: Any, *, many: bool) -> Any:
            if threading.current_thread() is threading.main_thread():
                self._current.append((sql, params, many))
            return self._real(conn, sql, params, many=many)

        prepared._execute = execute  # type: ignore[assignment]
        BOUNDARY_HOOKS.append(self._boundary)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        prepared._execute = self._real  # type: ignore[assignment]
        BOUNDARY_HOOKS.remove(self._boundary)

    def _boundary(self, where: str) -> None:
        if where == "after_commit" and threading.current_thread() is threading.main_thread():
            self.transactions.append(self._current)
            self._current = []


def floor_c(transactions: list[list[tuple[str, Any, bool]]], copy: Path, synchronous: str) -> float:
    db = sqlite3.connect(copy, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("PRAGMA foreign_keys=ON")
    start = time.perf_counter()
    for statements in transactions:
        db.execute("BEGIN IMMEDIATE")
        for sql, params, many in statements:
            if many:
                db.executemany(sql, params)
            else:
                db.execute(sql, params).fetchall()
        db.execute("COMMIT")
    elapsed = time.perf_counter() - start
    db.close()
    return elapsed


# -- PostgreSQL: the same loop against a raw psycopg floor ------------------------------------
def pg_schema_url(base: str, name: str) -> str:
    """A fresh schema on the server at `base`, as a URL whose connections use it."""
    import psycopg

    with psycopg.connect(
        base.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        c.execute(f'CREATE SCHEMA "{name}"')
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{name}"


def floor_b_pg(commits: int, url: str) -> float:
    """Raw psycopg: one small-row INSERT per transaction, as many commits as the agent made."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as db:
        db.execute("CREATE TABLE floor_b (id serial PRIMARY KEY, run text, seq int, body text)")
        db.commit()
        start = time.perf_counter()
        for i in range(commits):
            db.execute(
                "INSERT INTO floor_b (run, seq, body) VALUES (%s, %s, %s)", ("r", i, "x" * 64)
            )
            db.commit()
        return time.perf_counter() - start


def pg_copy_store(base: str, source: str, name: str) -> str:
    """A new schema holding a copy of the store in schema `source` (made by the migrations,
    then filled row for row): floor C's starting point."""
    import psycopg

    url = pg_schema_url(base, name)
    open_store_engine(url).dispose()
    with psycopg.connect(
        base.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as c:
        tables = [
            r[0]
            for r in c.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "AND table_type = 'BASE TABLE' AND table_name <> 'alembic_version'",
                (source,),
            )
        ]
        for table in sorted(
            tables, key=lambda t: t != "runs"
        ):  # the runs first: the rest refer to them
            c.execute(f'INSERT INTO "{name}"."{table}" SELECT * FROM "{source}"."{table}"')
    return url


def floor_c_pg(transactions: list[list[tuple[str, Any, bool]]], url: str) -> float:
    """Raw psycopg replaying the loop's transactions as the store sends them
    (store/prepared.py `transaction`): each statement bound into its text, BEGIN with the
    fence (the first statement, whose answer is read) in one message, the rest with COMMIT
    in a second."""
    import psycopg

    with psycopg.connect(
        url.replace("postgresql+psycopg://", "postgresql://"),
        autocommit=True,
        cursor_factory=psycopg.ClientCursor,
    ) as db:
        cur = db.cursor()
        start = time.perf_counter()
        for statements in transactions:
            texts = [
                cur.mogrify(sql, row)
                for sql, params, many in statements
                for row in (params if many else [params])
            ]
            cur.execute(f"BEGIN;\n{texts[0]}")
            while cur.nextset():
                pass
            cur.fetchall()
            cur.execute(";\n".join([*texts[1:], "COMMIT"]))
        return time.perf_counter() - start


def pg_table(base: str, sizes: list[int], repeat: int, root: Path) -> list[dict[str, Any]]:
    try:
        return _pg_table(base, sizes, repeat, root)
    finally:
        _drop_schemas(base, f"da\\_%\\_{os.getpid()}\\_%")


def _drop_schemas(base: str, like: str) -> None:
    """The schemas this run made (they hold a store each: left, they would fill the server)."""
    import psycopg

    with psycopg.connect(
        base.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as c:
        for (name,) in c.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (like,)
        ).fetchall():
            c.execute(f'DROP SCHEMA "{name}" CASCADE')


def _pg_table(base: str, sizes: list[int], repeat: int, root: Path) -> list[dict[str, Any]]:
    out = []
    for n in sizes:
        rows = []
        for rep in range(repeat):
            ws = make_workspace(root / f"pg-{n}-{rep}")
            schema = f"da_bench_{os.getpid()}_{n}_{rep}"
            url = pg_schema_url(base, schema)
            runner, counts = agent_runner(url, ws, n, n, "full")
            run_id = runner.create("bench")
            copy = pg_copy_store(base, schema, f"da_floorc_{os.getpid()}_{n}_{rep}")
            counts["commits"] = 0
            with Capture() as capture:
                start = time.perf_counter()
                assert runner.execute(run_id).status == "completed"
                seconds = time.perf_counter() - start
            runner.store.engine.dispose()
            a = floor_a(n, ws)
            b = floor_b_pg(
                counts["commits"], pg_schema_url(base, f"da_floor_{os.getpid()}_{n}_{rep}")
            )
            c = floor_c_pg(capture.transactions, copy)
            rows.append({"seconds": seconds, "a": a, "b": b, "c": c})
        med = {k: statistics.median(r[k] for r in rows) for k in ("seconds", "a", "b", "c")}
        overhead, floor, floor_c = (
            (med["seconds"] - med["a"]) / n * 1000,
            med["b"] / n * 1000,
            med["c"] / n * 1000,
        )
        out.append(
            {
                "steps": n,
                "overhead_ms_per_step": round(overhead, 3),
                "floor_b_ms_per_step": round(floor, 3),
                "overhead_vs_floor_b": round(overhead / floor, 2),
                "floor_c_ms_per_step": round(floor_c, 3),
                "overhead_vs_floor_c": round(overhead / floor_c, 2),
                "floor_c_vs_floor_b": round(floor_c / floor, 2),
                "python_ms_per_step": round(overhead - floor_c, 3),
            }
        )
        print(f"measured PostgreSQL N={n}", file=sys.stderr)
    return out


# -- durable-agent ------------------------------------------------------------------------------
def agent_runner(
    db_url: str, ws: Path, n: int, max_steps: int, durability: str
) -> tuple[Runner, dict[str, int]]:
    settings = Settings(
        workspace=ws,
        model="bench",
        db=db_url,
        max_steps=max_steps,
        max_repeats=n + 1,
        shell="deny",
        durability=durability,
    )
    engine = open_store_engine(db_url, durability=durability)
    counts = {"commits": 0}
    # Checkpoints commit on the DBAPI connection (store/prepared.py), which SQLAlchemy's
    # commit event does not see: count the journal's checkpoints (the heartbeat's own
    # transactions, on other threads, are not the loop's).
    BOUNDARY_HOOKS[:] = [h for h in BOUNDARY_HOOKS if getattr(h, "__name__", "") != "_count"]

    def _count(where: str) -> None:
        if where == "after_commit" and threading.current_thread() is threading.main_thread():
            counts["commits"] += 1

    BOUNDARY_HOOKS.append(_count)

    runner = Runner(
        store=Store(engine),
        settings=settings,
        model=ScriptedModel(script(n), "bench"),
        tools=build_tools("deny"),
        env={},
        redactor=Redactor.from_env({}),
    )
    return runner, counts


def agent_run(n: int, root: Path, durability: str, *, trace_memory: bool = False) -> dict[str, Any]:
    """One run of n steps through the real store. Timed without tracemalloc (it slows every
    allocation about 2.5x); with `trace_memory` the same run is made again only for its peak.
    The loop's transactions are captured, and replayed by floor C into a copy of the store as
    it was before the loop (`floor_c_copy`)."""
    db_path = root / f"agent-{n}{'-mem' if trace_memory else ''}.db"
    url = f"sqlite:///{db_path}"
    ws = make_workspace(root)
    runner, counts = agent_runner(url, ws, n, n, durability)
    run_id = runner.create("bench")
    runner.store.engine.dispose()  # the file whole (WAL folded in) before the loop, for floor C
    copy = db_path.with_suffix(".floor-c.db")
    folded = sqlite3.connect(db_path)
    folded.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    folded.close()
    shutil.copyfile(db_path, copy)
    counts["commits"] = 0
    if trace_memory:
        tracemalloc.start()
    with Capture(enabled=not trace_memory) as capture:
        start = time.perf_counter()
        outcome = runner.execute(run_id)
        elapsed = time.perf_counter() - start
    peak = 0
    if trace_memory:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert outcome.status == "completed", outcome
    commits = counts["commits"]
    runner.store.engine.dispose()
    return {
        "seconds": elapsed,
        "commits": commits,
        "peak_mb": peak / 1e6,
        "db": db_path,
        "url": url,
        "transactions": capture.transactions,
        "floor_c_copy": copy,
    }


def db_bytes(db_path: Path) -> int:
    """The file's size once the WAL is folded in and free pages are dropped."""
    db = sqlite3.connect(db_path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.execute("VACUUM")
    db.close()
    return os.path.getsize(db_path)


def empty_store_bytes(root: Path, durability: str) -> int:
    """A store holding one created run and no steps: the fixed part (schema, first messages)."""
    url = f"sqlite:///{root / 'empty.db'}"
    runner, _ = agent_runner(url, make_workspace(root), 1, 1, durability)
    runner.create("bench")
    runner.store.engine.dispose()
    return db_bytes(root / "empty.db")


def resume_time(n: int, root: Path, durability: str) -> float:
    """A run of n steps stopped at its last step; time to open, rebuild and run one new step."""
    url = f"sqlite:///{root / f'resume-{n}.db'}"
    ws = make_workspace(root)
    runner, _ = agent_runner(url, ws, n + 2, n, durability)
    run_id = runner.create("bench")
    assert runner.execute(run_id).status == "budget_exceeded"
    runner.store.engine.dispose()
    start = time.perf_counter()
    again, _ = agent_runner(url, ws, n + 2, n + 1, durability)
    outcome = again.execute(run_id)
    elapsed = time.perf_counter() - start
    assert outcome.status == "budget_exceeded" and again.store.get_run(run_id).step_count == n + 1
    again.store.engine.dispose()
    return elapsed


def cold_start(args: list[str], cwd: Path, env: dict[str, str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "durable_agent", *args],
            cwd=cwd,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def python_time(code: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# Whole-process baselines of the start-up ratios. `import pydantic` alone is lazy in pydantic
# 2 (its machinery loads with the first model class), so the cost of using it at all is
# measured too: one model defined and validated.
BASELINES = {
    "bare_python_ms": "pass",
    "import_sqlalchemy_ms": "import sqlalchemy",
    "import_sqlalchemy_pydantic_ms": "import sqlalchemy, pydantic",
    "sqlalchemy_one_pydantic_model_ms": "import sqlalchemy, pydantic\n"
    "class M(pydantic.BaseModel):\n    x: int = 0\nM(x=1)",
}


def startup_ratios(r: dict[str, Any], unit: str) -> dict[str, float]:
    """The issue's ratios (and the stretch's: list and show against bare python)."""

    def ratio(a: str, b: str) -> float:
        return round(r[f"{a}{unit}"] / r[f"{b}{unit}"], 2)

    return {
        "help_vs_bare": ratio("cold_help", "bare_python"),
        "list_vs_import_sqlalchemy": ratio("cold_list_1000", "import_sqlalchemy"),
        "show_vs_import_sqlalchemy": ratio("cold_show", "import_sqlalchemy"),
        "list_vs_bare": ratio("cold_list_1000", "bare_python"),
        "show_vs_bare": ratio("cold_show", "bare_python"),
        "start_vs_import_sqlalchemy_pydantic": ratio(
            "cold_start_1_step", "import_sqlalchemy_pydantic"
        ),
        "start_vs_sqlalchemy_one_pydantic_model": ratio(
            "cold_start_1_step", "sqlalchemy_one_pydantic_model"
        ),
    }


def instructions(argv: list[str], cwd: Path, env: dict[str, str]) -> int:
    """Instructions one whole process executes, counted by callgrind: the same count for the
    same binary and inputs whatever else the machine does (wall times here vary by 30%)."""
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=True,
    )
    return int(proc.stderr.split("Collected :")[1].split()[0])


# A 1-step start run under a wrapper that notes, at exit, the modules it loaded and how many
# records (msgspec Structs) the project's modules define.
_NOTE_START = """import atexit, json, runpy, sys
out = sys.argv.pop(1)
def note():
    import msgspec
    records = {c for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("durable_agent")
               for c in vars(m).values() if isinstance(c, type) and issubclass(c, msgspec.Struct)
               and c.__module__ == m.__name__}
    open(out, "w").write(json.dumps({"modules": sorted(sys.modules), "records": len(records)}))
atexit.register(note)
sys.argv[0] = "durable-agent"
runpy.run_module("durable_agent", run_name="__main__")
"""

# N classes of five fields, as the project's records have about: as msgspec Structs (what the
# project defines) and as frozen dataclasses (what it defined before: each one compiles and
# execs its generated methods).
_RECORDS = """import sys
from dataclasses import dataclass
from msgspec import Struct
n, kind = int(sys.argv[1]), sys.argv[2]
for _ in range(n):
    if kind == "struct":
        class Record(Struct, frozen=True):
            a: int
            b: str = ""
            c: tuple = ()
            d: int = 0
            e: str | None = None
    else:
        @dataclass(frozen=True)
        class Record:
            a: int
            b: str = ""
            c: tuple = ()
            d: int = 0
            e: str | None = None
"""


def start_breakdown(argv: list[str], cwd: Path, env: dict[str, str], root: Path) -> dict[str, int]:
    """Where a 1-step start's instructions go beyond `import sqlalchemy, pydantic` and one
    model: importing the project's modules it loads (nothing run), then running the command;
    and what defining as many records as it does costs on its own, as Structs and as dataclasses."""
    found = root / "start-modules.json"
    subprocess.run(
        [sys.executable, "-c", _NOTE_START, str(found), *argv[3:]],
        cwd=cwd,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    noted = json.loads(found.read_text())
    own = [
        m
        for m in noted["modules"]
        if m.startswith("durable_agent") and m != "durable_agent.__main__"
    ]
    # As the CLI imports them and ends: the collector paused, everything frozen at the end
    # (durable_agent/cli/collector.py), so "running the command" is the rest.
    imports = (
        f"import gc, importlib\ngc.disable()\nfor m in {own!r}:\n    importlib.import_module(m)\n"
        "gc.freeze()\n"
    )
    n = noted["records"]

    def records(kind: str) -> int:
        return instructions(
            [sys.executable, "-c", _RECORDS, str(n), kind], cwd, env
        ) - instructions([sys.executable, "-c", _RECORDS, "0", kind], cwd, env)

    return {
        "start_imports_only_instr": instructions([sys.executable, "-c", imports], cwd, env),
        "start_records": n,
        "start_records_alone_instr": records("struct"),
        "start_records_as_dataclasses_instr": records("dataclass"),
    }


def make_runs_store(url: str, n: int) -> None:
    """A store holding `n` finished one-step runs (run-0000 ...), for `list` and `show`."""
    store = Store(open_store_engine(url))
    for i in range(n):
        store.create_run(
            f"run-{i:04d}",
            task=f"task {i}",
            workspace="/w",
            model="bench",
            settings={},
            first_messages=[Message("system", "s"), Message("user", f"task {i}")],
        )
    store.engine.dispose()


def sandbox_overhead(root: Path, repeat: int) -> dict[str, Any]:
    """One `true` through run_process (guard, process group) unsandboxed and under each
    mechanism available here: the per-command cost of containment, as a ratio."""
    from durable_agent.tools.os_sandbox import Mechanism, resolve_sandbox
    from durable_agent.tools.process import command_env, run_process

    ws = root / "sandbox-ws"
    ws.mkdir()
    env = command_env(os.environ, run_id="bench", call_id="bench")
    variants = {
        "off": resolve_sandbox("off", False, os.environ),
        "bubblewrap": resolve_sandbox("workspace-write", False, os.environ),
        "landlock": resolve_sandbox("workspace-write", False, {"PATH": str(root / "no-bwrap")}),
    }
    out: dict[str, Any] = {}
    for name, sandbox in variants.items():
        if name != "off" and sandbox.mechanism is not Mechanism(name):
            continue  # not available on this machine
        times = []
        for _ in range(max(20, repeat)):
            t = time.perf_counter()
            run_process("true", cwd=ws, env=env, timeout_s=30, sandbox=sandbox)
            times.append(time.perf_counter() - t)
        out[f"{name}_ms"] = round(statistics.median(times) * 1000, 2)
    for name in ("bubblewrap", "landlock"):
        if f"{name}_ms" in out:
            out[f"{name}_ratio"] = round(out[f"{name}_ms"] / out["off_ms"], 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", default="50,200,1000", help="comma-separated run lengths")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--durability", choices=["full", "fast"], default="full")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count the start-up commands' instructions under valgrind (deterministic)",
    )
    parser.add_argument(
        "--pg",
        metavar="URL",
        help="also measure on this PostgreSQL server (a schema per run), "
        "e.g. postgresql://127.0.0.1/test",
    )
    opts = parser.parse_args()
    sizes = [int(s) for s in opts.steps.split(",")]
    synchronous = "FULL" if opts.durability == "full" else "NORMAL"
    results: dict[str, Any] = {
        "durability": opts.durability,
        "python": sys.version.split()[0],
        "sizes": [],
    }
    root = Path(tempfile.mkdtemp(prefix="da-bench-"))
    try:
        (root / "empty").mkdir()
        empty = empty_store_bytes(root / "empty", opts.durability)
        results["empty_store_bytes"] = empty
        for n in sizes:
            rows = []
            for rep in range(opts.repeat):
                base = root / f"n{n}-{rep}"
                base.mkdir()
                ws = make_workspace(base)
                a = floor_a(n, ws)
                agent = agent_run(n, base, opts.durability)
                b = floor_b(agent["commits"], base, synchronous)
                c = floor_c(agent.pop("transactions"), agent["floor_c_copy"], synchronous)
                rows.append({"a": a, "b": b, "c": c, **agent})
            med = {
                k: statistics.median(r[k] for r in rows)
                for k in ("a", "b", "c", "seconds", "commits")
            }
            med["peak_mb"] = agent_run(n, root / f"n{n}-0", opts.durability, trace_memory=True)[
                "peak_mb"
            ]
            overhead = (med["seconds"] - med["a"]) / n * 1000
            floor_b_ms = med["b"] / n * 1000
            floor_c_ms = med["c"] / n * 1000
            res = {
                "steps": n,
                "wall_s": round(med["seconds"], 4),
                "floor_a_s": round(med["a"], 4),
                "floor_b_s": round(med["b"], 4),
                "overhead_ms_per_step": round(overhead, 3),
                "floor_b_ms_per_step": round(floor_b_ms, 3),
                "overhead_vs_floor_b": round(overhead / floor_b_ms, 2) if floor_b_ms else None,
                "floor_c_ms_per_step": round(floor_c_ms, 3),
                "overhead_vs_floor_c": round(overhead / floor_c_ms, 2) if floor_c_ms else None,
                # The least overhead/floorB can be: the agent's own rows with no Python of the
                # harness at all (its transactions write more pages per commit than floor B's row).
                "floor_c_vs_floor_b": round(floor_c_ms / floor_b_ms, 2) if floor_b_ms else None,
                # What the harness's Python adds per step, beyond the loop and its own SQL.
                "python_ms_per_step": round(overhead - floor_c_ms, 3),
                "commits_per_step": round(med["commits"] / n, 2),
                # Per step beyond the fixed size of a store with one empty run: flat when
                # nothing is copied per step. The raw size / N is kept for reference.
                "bytes_per_step": round((db_bytes(rows[-1]["db"]) - empty) / n),
                "raw_bytes_per_step": round(db_bytes(rows[-1]["db"]) / n),
                "resume_ms": round(
                    statistics.median(
                        resume_time(n, root / f"r{n}-{i}", opts.durability)
                        for i in range(opts.repeat)
                    )
                    * 1000,
                    1,
                ),
                "peak_mb": round(med["peak_mb"], 2),
            }
            results["sizes"].append(res)
            print(f"measured N={n}", file=sys.stderr)
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DURABLE_AGENT_"))
        }
        env["DURABLE_AGENT_DB"] = f"sqlite:///{root / 'cold.db'}"
        # As installed by pip, which compiles the bytecode: an editable checkout run with
        # PYTHONDONTWRITEBYTECODE (CI images set it) would compile ~70 modules on every start,
        # while the baselines' packages are compiled.
        import compileall

        import durable_agent

        compileall.compile_dir(str(Path(durable_agent.__file__).parent), quiet=1)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        ws = make_workspace(root / "cold")
        one = root / "one.json"
        one.write_text(json.dumps([{"content": "done"}]))
        subprocess.run(
            [sys.executable, "-m", "durable_agent", "db", "upgrade"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        results["cold_help_ms"] = round(
            cold_start(["--help"], ws, env, max(5, opts.repeat)) * 1000, 1
        )
        results["cold_start_1_step_ms"] = round(
            cold_start(
                ["start", "t", "--model", f"scripted:{one}", "--quiet"],
                ws,
                env,
                max(5, opts.repeat),
            )
            * 1000,
            1,
        )
        many = root / "many.db"
        make_runs_store(f"sqlite:///{many}", 1000)
        many_env = {**env, "DURABLE_AGENT_DB": f"sqlite:///{many}"}
        results["cold_list_1000_ms"] = round(
            cold_start(["list"], ws, many_env, max(5, opts.repeat)) * 1000, 1
        )
        results["cold_show_ms"] = round(
            cold_start(["show", "run-0500"], ws, many_env, max(5, opts.repeat)) * 1000, 1
        )
        for key, code in BASELINES.items():
            results[key] = round(python_time(code, max(5, opts.repeat)) * 1000, 1)
        results["startup_ratios"] = startup_ratios(results, "_ms")
        if opts.instructions:
            commands = {
                "cold_help": (["--help"], env),
                "cold_start_1_step": (["start", "t", "--model", f"scripted:{one}", "--quiet"], env),
                "cold_list_1000": (["list"], many_env),
                "cold_show": (["show", "run-0500"], many_env),
            }
            counted = {
                f"{k}_instr": instructions([sys.executable, "-m", "durable_agent", *a], ws, e)
                for k, (a, e) in commands.items()
            }
            counted.update(
                {
                    f"{k.removesuffix('_ms')}_instr": instructions(
                        [sys.executable, "-c", code], ws, env
                    )
                    for k, code in BASELINES.items()
                }
            )
            counted.update(
                start_breakdown(
                    [sys.executable, "-m", "durable_agent", *commands["cold_start_1_step"][0]],
                    ws,
                    env,
                    root,
                )
            )
            results["instructions"] = counted
            results["instruction_ratios"] = startup_ratios(counted, "_instr")
        if opts.pg:
            results["postgresql"] = pg_table(
                opts.pg, [s for s in sizes if s <= 1000], opts.repeat, root
            )
        results["sandbox"] = sandbox_overhead(root, opts.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(results)
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def print_table(r: dict[str, Any]) -> None:
    head = (
        f"{'N':>5} {'wall s':>8} {'floorA s':>9} {'floorB s':>9} {'ovh ms/step':>12} {'floorB ms/step':>15} "
        f"{'ovh/floorB':>10} {'floorC ms/step':>15} {'ovh/floorC':>10} {'py ms/step':>10} "
        f"{'commits/step':>13} {'bytes/step':>11} {'resume ms':>10} {'peak MB':>8}"
    )
    print(f"durability={r['durability']}  python {r['python']}")
    print(head)
    for s in r["sizes"]:
        print(
            f"{s['steps']:>5} {s['wall_s']:>8} {s['floor_a_s']:>9} {s['floor_b_s']:>9} "
            f"{s['overhead_ms_per_step']:>12} {s['floor_b_ms_per_step']:>15} {s['overhead_vs_floor_b']:>10} "
            f"{s['floor_c_ms_per_step']:>15} {s['overhead_vs_floor_c']:>10} {s['python_ms_per_step']:>10} "
            f"{s['commits_per_step']:>13} {s['bytes_per_step']:>11} {s['resume_ms']:>10} {s['peak_mb']:>8}"
        )
    print(
        "least ovh/floorB possible (floor C / floor B: the loop's own transactions with no Python of the "
        "harness): " + " · ".join(f"N={s['steps']} {s['floor_c_vs_floor_b']}" for s in r["sizes"])
    )
    print(
        f"bytes/step: beyond an empty store of {r['empty_store_bytes']} bytes "
        f"(raw size / N: {', '.join(str(s['raw_bytes_per_step']) for s in r['sizes'])})"
    )
    print(
        f"cold start: --help {r['cold_help_ms']} ms · 1-step start {r['cold_start_1_step_ms']} ms "
        f"· list (1,000 runs) {r['cold_list_1000_ms']} ms · show {r['cold_show_ms']} ms"
    )
    print(
        f"  baselines: bare python {r['bare_python_ms']} ms · import sqlalchemy {r['import_sqlalchemy_ms']} ms"
        f" · import sqlalchemy, pydantic {r['import_sqlalchemy_pydantic_ms']} ms"
        f" · and one pydantic model {r['sqlalchemy_one_pydantic_model_ms']} ms"
    )
    print("  ratios: " + " · ".join(f"{k} {v}" for k, v in r["startup_ratios"].items()))
    if "instruction_ratios" in r:
        print(
            "  instructions (callgrind): "
            + " · ".join(f"{k} {v:,}" for k, v in r["instructions"].items())
        )
        print(
            "  ratios in instructions: "
            + " · ".join(f"{k} {v}" for k, v in r["instruction_ratios"].items())
        )
        i = r["instructions"]
        if "start_imports_only_instr" in i:
            base, model = (
                i["import_sqlalchemy_pydantic_instr"],
                i["sqlalchemy_one_pydantic_model_instr"],
            )
            imports, start = i["start_imports_only_instr"], i["cold_start_1_step_instr"]
            print(
                f"  1-step start, in instructions: import sqlalchemy, pydantic {base / 1e6:,.0f}M + the first "
                f"pydantic model {(model - base) / 1e6:,.0f}M + importing the project's modules {(imports - model) / 1e6:,.0f}M"
                f" + running the command {(start - imports) / 1e6:,.0f}M; the {i['start_records']} records "
                f"those modules define cost {i['start_records_alone_instr'] / 1e6:,.0f}M made on their own "
                f"({i['start_records_as_dataclasses_instr'] / 1e6:,.0f}M as dataclasses); "
                f"the target (1.5x) leaves {(1.5 * base - model) / 1e6:,.0f}M for the modules and the run"
            )
    for row in r.get("postgresql", []):
        print(
            f"PostgreSQL N={row['steps']}: overhead {row['overhead_ms_per_step']} ms/step · raw psycopg floor "
            f"{row['floor_b_ms_per_step']} ms/step · ×{row['overhead_vs_floor_b']} · the loop's own "
            f"transactions replayed {row['floor_c_ms_per_step']} ms/step (×{row['overhead_vs_floor_c']}; "
            f"Python {row['python_ms_per_step']} ms/step; least ×{row['floor_c_vs_floor_b']})"
        )
    sb = r.get("sandbox", {})
    parts = [f"unsandboxed {sb.get('off_ms')} ms"] + [
        f"{name} {sb[name + '_ms']} ms (×{sb[name + '_ratio']})"
        for name in ("bubblewrap", "landlock")
        if name + "_ms" in sb
    ]
    print("one `true` command: " + " · ".join(parts))


if __name__ == "__main__":
    raise SystemExit(main())
