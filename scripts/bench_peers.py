#!/usr/bin/env python3
"""Per-step durable overhead side by side: durable-agent, DBOS Transact and LangGraph, on
SQLite, in one process run, against a raw sqlite3 floor measured in the same run.

    python3 scripts/bench_peers.py [--steps 50,1000] [--repeat 3] [--json FILE]

Run with any Python of the project: the first run makes `.venv-peers` (gitignored) from the
same base interpreter, installs the pinned peers below and the project (editable) into it,
and re-runs itself there, so all four are measured by one interpreter on one disk. Not a
test: nothing under tests/ imports it.

Each system does the same trivial work per step, reading a 1 KB file, and makes it durable
its own way (each on a fresh SQLite file in one temporary folder):

    floor        raw sqlite3, WAL, synchronous=FULL: two commits of one small row per step
                 (scripts/bench.py's floor B with two commits a step)
    agent        durable-agent's real loop and store (scripts/bench.py `agent_runner`,
                 durability=full: WAL, synchronous=FULL): a scripted model turn asking for
                 `read_file` of the file, then the tool; baseline: bench.py's floor A
    dbos         a `@DBOS.workflow` calling one `@DBOS.step` per iteration that reads the file;
                 baseline: the same loop of plain calls. DBOS as shipped opens SQLite in its
                 default rollback journal (synchronous=FULL, the library default)
    dbos-wal     the same, its file put in WAL mode before launch (a persistent setting DBOS
                 keeps): the same journal and sync settings as the agent and the floor
    langgraph    a one-node graph looping on itself N times, the node reading the file into
                 the state; `SqliteSaver` (WAL, synchronous=FULL set on its connection),
                 `durability="sync"` (each step's checkpoint written before the next step);
                 baseline: the same graph compiled without a checkpointer
    langgraph-msgs  the same graph with an agent's state as LangGraph keeps it: a message list
                 (`operator.add`) each step appends the call and the 1 KB result to, which
                 every checkpoint holds whole (durable-agent stores each message once)

Per-step durable overhead = (wall - the system's own no-persistence baseline) / N, printed as
a ratio to the floor and to durable-agent's, min and median over the rounds; the same in CPU
time of the process (all threads, user + system), which other load on a shared machine
inflates far less than wall time. Commits per step are counted apart (an untimed run with
every sqlite3 connection traced: COMMITs at 2N minus at N, divided by N).
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NamedTuple, TypedDict

ROOT = Path(__file__).resolve().parent.parent
PEERS_VENV = ROOT / ".venv-peers"
# Pinned so a figure in docs/performance.md can be reproduced against the same peers.
PEERS = ["dbos==3.4.0", "langgraph==1.2.24", "langgraph-checkpoint-sqlite==3.1.2"]
SYSTEMS = ["agent", "dbos", "dbos-wal", "langgraph", "langgraph-msgs"]


# -- the venv --------------------------------------------------------------------------------
def ensure_venv() -> None:
    """Re-run this script inside .venv-peers, making or updating it first."""
    if Path(sys.prefix).resolve() == PEERS_VENV.resolve():
        return
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {PEERS_VENV}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    stamp = PEERS_VENV / ".peers"
    want = " ".join(PEERS)
    if not stamp.exists() or stamp.read_text() != want:
        print(f"installing {want} and the project into {PEERS_VENV}", file=sys.stderr)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *PEERS, "-e", str(ROOT)], check=True
        )
        stamp.write_text(want)
    os.execv(str(python), [str(python), __file__, *sys.argv[1:]])


# -- the peers ---------------------------------------------------------------------------------
class Timing(NamedTuple):
    wall: float
    cpu: float  # the process's CPU time, all threads: what other load on the machine inflates least


class Measured(NamedTuple):
    durable: Timing  # the run with its persistence
    bare: Timing  # the same work with none: the system's own loop without a store
    settings: dict[str, str]  # the SQLite journal mode and synchronous level it ran with


def timed(run: Callable[[], object]) -> Timing:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


def read_payload(ws: Path) -> str:
    """The trivial work of a step: what the agent's `read_file` step reads."""
    return (ws / "payload.txt").read_text()


def sqlite_settings(execute: Callable[[str], Any]) -> dict[str, str]:
    return {p: str(execute(f"PRAGMA {p}")) for p in ("journal_mode", "synchronous")}


def agent_bench(n: int, base: Path, ws: Path) -> Measured:
    """durable-agent's real loop and store (scripts/bench.py's runner, durability=full);
    bare: bench.py's floor A, the same loop with no persistence."""
    from bench import agent_runner, floor_a

    bare = timed(lambda: floor_a(n, ws))
    runner, _ = agent_runner(f"sqlite:///{base / 'agent.db'}", ws, n, n, "full")
    run_id = runner.create("bench")
    with runner.store.engine.connect() as c:
        settings = sqlite_settings(lambda sql: c.exec_driver_sql(sql).scalar_one())
    outcome: list[Any] = []
    durable = timed(lambda: outcome.append(runner.execute(run_id)))
    assert outcome[0].status == "completed", outcome
    runner.store.engine.dispose()
    return Measured(durable, bare, settings)


def dbos_bench(n: int, base: Path, ws: Path, wal: bool) -> Measured:
    """A workflow of n steps; bare: the same loop of undecorated calls."""
    from dbos import DBOS
    from dbos._dbos import _get_dbos_instance

    def work(i: int) -> str:
        return read_payload(ws)

    def loop(count: int, call: Callable[[int], str]) -> int:
        for i in range(count):
            call(i)
        return count

    # Registered under names of their own: DBOS keeps its registry across destroy().
    step = DBOS.step(name=f"read-{base.name}")(work)
    flow = DBOS.workflow(name=f"flow-{base.name}")(lambda count: loop(count, step))

    db = base / "dbos.db"
    if wal:
        with sqlite3.connect(db) as c:  # persistent in the file: DBOS's connections open in WAL
            c.execute("PRAGMA journal_mode=WAL")
    config = {
        "name": "bench-peers",
        "system_database_url": f"sqlite:///{db}",
        "log_level": "WARNING",
    }
    DBOS(config=config)  # type: ignore[arg-type]
    DBOS.launch()
    try:
        with _get_dbos_instance()._sys_db.engine.connect() as c:
            settings = sqlite_settings(lambda sql: c.exec_driver_sql(sql).scalar_one())
        durable = timed(lambda: flow(n))
    finally:
        DBOS.destroy()
    return Measured(durable, timed(lambda: loop(n, work)), settings)


class GraphState(TypedDict):
    """LangGraph's state: a step counter and the last read (replaced, not appended)."""

    i: int
    last: str


class MessagesGraphState(TypedDict):
    """An agent's state as LangGraph keeps it (its MessagesState): a list every step appends
    to, the assistant's call and the tool's result; the checkpoint holds the whole list."""

    i: int
    messages: Annotated[list[dict[str, str]], operator.add]


def langgraph_bench(n: int, base: Path, ws: Path, messages: bool) -> Measured:
    """A one-node graph looping n times; bare: the same graph without a checkpointer."""
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    def node(state: GraphState) -> dict[str, Any]:
        return {"i": state["i"] + 1, "last": read_payload(ws)}

    def node_messages(state: MessagesGraphState) -> dict[str, Any]:
        call = {"role": "assistant", "tool_call": f"read_file payload.txt {state['i'] % 2}"}
        result = {"role": "tool", "content": read_payload(ws)}
        return {"i": state["i"] + 1, "messages": [call, result]}

    def more(state: GraphState | MessagesGraphState) -> str:
        return "work" if state["i"] < n else END

    graph: Any = StateGraph(MessagesGraphState) if messages else StateGraph(GraphState)
    graph.add_node("work", node_messages if messages else node)
    graph.add_edge(START, "work")
    graph.add_conditional_edges("work", more)
    first = {"i": 0, "messages": []} if messages else {"i": 0, "last": ""}
    config = {"configurable": {"thread_id": "bench"}, "recursion_limit": n + 10}

    def run(compiled: Any, **durability: str) -> None:
        assert compiled.invoke(first, config, **durability)["i"] == n

    conn = sqlite3.connect(base / "langgraph.db", check_same_thread=False)
    conn.execute("PRAGMA synchronous=FULL")  # the library default here, said outright
    saver = SqliteSaver(conn)
    saver.setup()  # sets WAL
    settings = sqlite_settings(lambda sql: conn.execute(sql).fetchone()[0])
    try:
        durable = timed(lambda: run(graph.compile(checkpointer=saver), durability="sync"))
    finally:
        conn.close()
    # Without a checkpointer, durability is not passed (LangGraph fails on "sync" there).
    return Measured(durable, timed(lambda: run(graph.compile())), settings)


def measure(system: str, n: int, base: Path) -> Measured:
    from bench import make_workspace

    base.mkdir(parents=True)
    ws = make_workspace(base)
    if system == "agent":
        return agent_bench(n, base, ws)
    if system.startswith("langgraph"):
        return langgraph_bench(n, base, ws, messages=system == "langgraph-msgs")
    return dbos_bench(n, base, ws, wal=system == "dbos-wal")


# -- commits per step ------------------------------------------------------------------------
@contextmanager
def counted_commits() -> Iterator[list[int]]:
    """Every sqlite3 connection opened inside counts the COMMITs it sends (the sqlite3 module
    sends one only when a transaction is open: a commit with nothing written is not seen)."""
    count = [0]
    real = sqlite3.connect

    def trace(sql: str) -> None:
        if sql.lstrip().upper().startswith(("COMMIT", "END")):
            count[0] += 1

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real(*args, **kwargs)
        conn.set_trace_callback(trace)
        return conn

    sqlite3.connect = sqlite3.dbapi2.connect = connect  # type: ignore[assignment]
    try:
        yield count
    finally:
        sqlite3.connect = sqlite3.dbapi2.connect = real  # type: ignore[assignment]


def commits_per_step(system: str, root: Path, k: int = 50) -> float:
    def commits(n: int) -> int:
        with counted_commits() as count:
            if system == "floor":
                floor(n, root / f"count-floor-{n}")
            else:
                measure(system, n, root / f"count-{system}-{n}")
        return count[0]

    return (commits(2 * k) - commits(k)) / k


# -- the run ---------------------------------------------------------------------------------
def stats(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3)}


def floor(n: int, where: Path) -> tuple[float, float]:
    """(seconds of the floor's 2n commits as bench.py times them, CPU seconds of the call)."""
    from bench import floor_b

    where.mkdir()
    seconds: list[float] = []
    cpu = timed(lambda: seconds.append(floor_b(2 * n, where, "FULL"))).cpu
    return seconds[0], cpu


def run_size(n: int, repeat: int, root: Path) -> dict[str, Any]:
    per: dict[str, list[dict[str, float]]] = {s: [] for s in ["floor", *SYSTEMS]}
    settings: dict[str, dict[str, str]] = {}
    ms = 1000 / n
    for rep in range(repeat):
        # Interleaved: a slow minute of the shared machine falls on every system alike.
        wall, cpu = floor(n, root / f"floor-{n}-{rep}")
        per["floor"].append({"wall": wall * ms, "overhead": wall * ms, "cpu": cpu * ms})
        for system in SYSTEMS:
            got = measure(system, n, root / f"{system}-{n}-{rep}")
            settings[system] = got.settings
            per[system].append(
                {
                    "wall": got.durable.wall * ms,
                    "overhead": (got.durable.wall - got.bare.wall) * ms,
                    "cpu": (got.durable.cpu - got.bare.cpu) * ms,
                }
            )
        print(f"measured N={n} round {rep + 1}/{repeat}", file=sys.stderr)
    out: dict[str, Any] = {"steps": n, "settings": settings, "systems": {}}
    floor_s = stats([r["overhead"] for r in per["floor"]])
    agent = stats([r["overhead"] for r in per["agent"]])
    agent_cpu = stats([r["cpu"] for r in per["agent"]])
    for system, rows in per.items():
        overhead = stats([r["overhead"] for r in rows])
        cpu = stats([r["cpu"] for r in rows])
        out["systems"][system] = {
            "wall_ms_per_step": stats([r["wall"] for r in rows]),
            "overhead_ms_per_step": overhead,
            # Ratios of the minima (the least disturbed by other load on the machine) and of
            # the medians.
            "vs_floor": {k: round(overhead[k] / floor_s[k], 2) for k in ("min", "median")},
            "vs_agent": {k: round(overhead[k] / agent[k], 2) for k in ("min", "median")},
            "cpu_overhead_ms_per_step": cpu,
            "cpu_vs_agent": {k: round(cpu[k] / agent_cpu[k], 2) for k in ("min", "median")},
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", default="50,1000", help="comma-separated run lengths")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per run length")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    opts = parser.parse_args()
    ensure_venv()
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/bench.py's helpers
    from importlib.metadata import version

    root = Path(tempfile.mkdtemp(prefix="da-peers-"))  # where scripts/bench.py puts its files
    results: dict[str, Any] = {
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "versions": {
            p: version(p)
            for p in ("durable-agent", "dbos", "langgraph", "langgraph-checkpoint-sqlite")
        },
        "dir": str(root.parent),
        "sizes": [],
    }
    try:
        results["commits_per_step"] = {
            s: round(commits_per_step(s, root), 2) for s in ["floor", *SYSTEMS]
        }
        for n in [int(s) for s in opts.steps.split(",")]:
            results["sizes"].append(run_size(n, opts.repeat, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(results)
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def ratio(r: dict[str, float]) -> str:
    return f"{r['min']}–{r['median']}"


def print_table(r: dict[str, Any]) -> None:
    v = r["versions"]
    print(
        f"python {r['python']} · sqlite {r['sqlite']} · durable-agent {v['durable-agent']} · "
        f"dbos {v['dbos']} · langgraph {v['langgraph']} (checkpoint-sqlite "
        f"{v['langgraph-checkpoint-sqlite']}) · files under {r['dir']}"
    )
    settings = r["sizes"][0]["settings"] if r["sizes"] else {}
    print(
        "settings: floor wal/sync=2 · "
        + " · ".join(
            f"{s} {d['journal_mode']}/sync={d['synchronous']}" for s, d in settings.items()
        )
        + "  (sync=2 is FULL: an fsync at every commit)"
    )
    print("commits/step: " + " · ".join(f"{s} {c}" for s, c in r["commits_per_step"].items()))
    head = (
        f"{'N':>5} {'system':>14} {'wall ms/step':>16} {'overhead ms/step':>18} "
        f"{'÷ floor':>12} {'÷ agent':>12} {'CPU ovh ms/step':>17} {'CPU ÷ agent':>12}"
    )
    print(head + "   (min–median; ratios: of the minima–of the medians)")
    for size in r["sizes"]:
        for system, s in size["systems"].items():
            w, o, c = (
                s["wall_ms_per_step"],
                s["overhead_ms_per_step"],
                s["cpu_overhead_ms_per_step"],
            )
            print(
                f"{size['steps']:>5} {system:>14} {w['min']:>7}–{w['median']:<8} "
                f"{o['min']:>8}–{o['median']:<9} "
                f"{ratio(s['vs_floor']):>12} {ratio(s['vs_agent']):>12} "
                f"{c['min']:>8}–{c['median']:<8} {ratio(s['cpu_vs_agent']):>12}"
            )


if __name__ == "__main__":
    raise SystemExit(main())
