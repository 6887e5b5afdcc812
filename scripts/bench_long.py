#!/usr/bin/env python3
"""Benchmark: long runs (docs/performance.md, "Long runs").

For each length N, a real `durable-agent start` (a scripted model, one `list_files` or
`read_file` step per model call, `--sandbox off`) runs N steps and is killed (SIGKILL)
inside its model call N+1, deterministically: that turn of the script waits an hour, and
the kill comes once its intent is in the store. Then, for that N:

    bytes/step  the store (WAL folded in, VACUUMed) beyond the same kill at N=0, over N
    peak RSS    the killed process's maximum resident set (wait4's ru_maxrss)
    ms/step     the last tenth of the steps, from the steps' own timestamps (flat when
                nothing a step does grows with the run)
    resume      a `durable-agent resume` of the killed run, timed in its own process from
                after its imports (every module a resume loads, imported first) to the end
                of the command: taking the lease over from the dead process, loading the
                run, the checks a session makes, and the one step left (the model call the
                kill cut off, now answered at once with the final answer), committed, and
                the run finished. Also: from the same start to that step's own commit, and
                what of it is the scripted model's own reading and checking of its script
                (every turn, so it grows with N: timed again in the same process after).

The bench process itself uses only the standard library: what is measured is whole
processes, as a person runs them.

Usage: scripts/bench_long.py [--steps 1000,10000] [--tool list_files|read_file]
                             [--repeat 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PAYLOAD = "".join(
    f"line {i:04d} of the benchmark payload, padded to about sixty bytes..\n" for i in range(16)
)[:1024]
WAIT = 3600  # seconds the killed call would have waited: it never returns


def script(n: int, tool: str, *, waiting: bool) -> list[dict[str, Any]]:
    """n tool turns, then the final answer (waiting: it takes an hour, the kill's point).
    The arguments alternate so that the repeated-action guard stays quiet."""
    if tool == "read_file":
        args = [{"path": "payload.txt", "offset": i % 2} for i in range(2)]
    else:
        args = [{"path": "."}, {"path": ""}]
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": tool, "arguments": args[i % 2]}]} for i in range(n)
    ]
    last: dict[str, Any] = {"content": "done"}
    if waiting:
        last["delay_s"] = WAIT
    return [*turns, last]


def make_workspace(root: Path) -> Path:
    ws = root / "ws"
    ws.mkdir(parents=True)
    (ws / "payload.txt").write_text(PAYLOAD)
    for i in range(3):
        (ws / f"file{i}.txt").write_text(f"file {i}\n")
    return ws


def bench_env(db: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DURABLE_AGENT_"))}
    env["DURABLE_AGENT_DB"] = f"sqlite:///{db}"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def last_step(db: Path) -> tuple[str, int, str] | None:
    """(kind, turn, state) of the store's last step row, read without disturbing the writer."""
    if not db.exists():
        return None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(
            "SELECT kind, turn, state FROM steps ORDER BY id DESC LIMIT 1"
        ).fetchone()
    except sqlite3.OperationalError:
        return None  # not made yet
    finally:
        conn.close()


def wait4(proc: subprocess.Popen[bytes]) -> tuple[int, int]:
    """Reap `proc`: (its exit status, its peak RSS in bytes)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024


def killed_run(n: int, tool: str, root: Path) -> dict[str, Any]:
    """Start a run of n steps, kill it in its model call n+1; what it left and used."""
    root.mkdir(parents=True)
    ws = make_workspace(root)
    db = root / "store.db"
    path = root / "script.json"
    path.write_text(json.dumps(script(n, tool, waiting=True)))
    argv = [sys.executable, "-m", "durable_agent", "start", "long run", "--model"]
    argv += [f"scripted:{path}", "--sandbox", "off", "--quiet"]
    argv += ["--max-steps", str(n + 1), "--max-repeats", str(n + 2)]
    began = time.perf_counter()
    with (root / "start.log").open("wb") as log:
        proc = subprocess.Popen(argv, cwd=ws, env=bench_env(db), stdout=log, stderr=log)
    while last_step(db) != ("model", n, "started"):
        if proc.poll() is not None:
            raise SystemExit(f"the run of {n} steps ended before its kill: {proc.returncode}")
        time.sleep(0.2)
    wall = time.perf_counter() - began
    proc.send_signal(signal.SIGKILL)
    code, rss = wait4(proc)
    assert code == -signal.SIGKILL, code
    # The model call that never answers is answered at once by the resume.
    path.write_text(json.dumps(script(n, tool, waiting=False)))
    folded = root / "folded.db"
    src = sqlite3.connect(db)
    src.execute(f"VACUUM INTO '{folded}'")  # the WAL's pages included, free pages dropped
    src.close()
    return {
        "db": db,
        "ws": ws,
        "bytes": os.path.getsize(folded),
        "peak_rss": rss,
        "wall_s": wall,
        "ms_per_step_last_tenth": ms_per_step_late(db, n),
    }


def ms_per_step_late(db: Path, n: int) -> float | None:
    """Milliseconds a step over the last tenth of the run (model steps' start times)."""
    if n < 10:
        return None
    conn = sqlite3.connect(db)
    rows = dict(
        conn.execute(
            "SELECT turn, started_at FROM steps WHERE kind = 'model' AND turn IN (?, ?)",
            (n - n // 10, n),
        ).fetchall()
    )
    conn.close()
    a, b = (datetime.fromisoformat(str(rows[t])) for t in (n - n // 10, n))
    return (b - a).total_seconds() * 1000 / (n // 10)


# A resume in its own process: the modules in argv[1] imported first, then timed from there.
_RESUME = """import importlib, json, sys, time
modules, run_id, out, script_path = sys.argv[1:5]
for name in json.load(open(modules)):
    try:
        importlib.import_module(name)
    except Exception:
        pass
from durable_agent.cli.parser import main
sys.argv = ["durable-agent", "resume", run_id, "--quiet"]
wall, start = time.time(), time.perf_counter()
code = main()
seconds = time.perf_counter() - start
# What of it was the scripted model's own work: reading and checking its script, every turn.
from pathlib import Path
from durable_agent.models.scripted import load_script
again = time.perf_counter()
load_script(Path(script_path))
script = time.perf_counter() - again
open(out, "w").write(json.dumps({"code": code, "seconds": seconds, "wall_start": wall, "script": script}))
"""

# A resume that notes, at exit, every module it loaded (what _RESUME imports beforehand).
_NOTE = """import atexit, json, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = "durable-agent"
runpy.run_module("durable_agent", run_name="__main__")
"""


def run_id_of(db: Path) -> str:
    conn = sqlite3.connect(db)
    (run_id,) = conn.execute("SELECT id FROM runs").fetchone()
    conn.close()
    return str(run_id)


def note_modules(killed: dict[str, Any], root: Path) -> Path:
    """Resume a killed run under the noting wrapper: the modules a resume loads."""
    out = root / "modules.json"
    argv = [sys.executable, "-c", _NOTE, str(out), "resume", run_id_of(killed["db"]), "--quiet"]
    subprocess.run(
        argv,
        cwd=killed["ws"],
        env=bench_env(killed["db"]),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    skip = {"__main__", "durable_agent.__main__", "runpy"}
    out.write_text(json.dumps([m for m in json.loads(out.read_text()) if m not in skip]))
    return out


def resume(killed: dict[str, Any], modules: Path, root: Path) -> dict[str, Any]:
    out = root / "resume.json"
    run_id = run_id_of(killed["db"])
    script = killed["db"].parent / "script.json"
    argv = [sys.executable, "-c", _RESUME, str(modules), run_id, str(out), str(script)]
    with (root / "resume.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, cwd=killed["ws"], env=bench_env(killed["db"]), stdout=log, stderr=log
        )
    code, rss = wait4(proc)
    assert code == 0, code
    timed = json.loads(out.read_text())
    assert timed["code"] == 0, timed  # completed
    conn = sqlite3.connect(killed["db"])
    status, finished = conn.execute("SELECT status, finished_at FROM runs").fetchone()
    (step_done,) = conn.execute(
        "SELECT finished_at FROM steps WHERE kind = 'model' ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    conn.close()
    assert status == "completed", status
    done = datetime.fromisoformat(str(step_done)).replace(tzinfo=UTC).timestamp()
    return {
        "resume_ms": timed["seconds"] * 1000,
        "resume_to_step_ms": (done - timed["wall_start"]) * 1000,
        "resume_script_ms": timed["script"] * 1000,
        "resume_peak_rss": rss,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", default="1000,10000", help="comma-separated run lengths")
    parser.add_argument("--tool", choices=["list_files", "read_file"], default="list_files")
    parser.add_argument("--repeat", type=int, default=1, help="runs per length (median)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    opts = parser.parse_args()
    sizes = [int(s) for s in opts.steps.split(",")]
    root = Path(tempfile.mkdtemp(prefix="da-bench-long-"))
    results: dict[str, Any] = {"tool": opts.tool, "python": sys.version.split()[0], "sizes": []}
    try:
        # As installed by pip, which compiles the bytecode (see bench.py).
        import compileall

        compileall.compile_dir(str(Path(__file__).parent.parent / "durable_agent"), quiet=1)
        base = killed_run(0, opts.tool, root / "base")
        modules = note_modules(base, root)
        results["base_bytes"] = base["bytes"]
        results["base_peak_rss_mb"] = round(base["peak_rss"] / 1e6, 1)
        again = killed_run(0, opts.tool, root / "base-again")  # the fixed part of a resume
        results["base_resume_ms"] = round(
            resume(again, modules, again["db"].parent)["resume_ms"], 1
        )
        for n in sizes:
            rows = []
            for rep in range(opts.repeat):
                where = root / f"n{n}-{rep}"
                killed = killed_run(n, opts.tool, where)
                rows.append({**killed, **resume(killed, modules, where)})
                shutil.rmtree(where, ignore_errors=True)
                print(f"measured N={n} ({rep + 1}/{opts.repeat})", file=sys.stderr)

            def med(key: str, rows: list[dict[str, Any]] = rows) -> float:
                return float(statistics.median(r[key] for r in rows))

            results["sizes"].append(
                {
                    "steps": n,
                    "bytes_per_step": round((med("bytes") - base["bytes"]) / n),
                    "peak_rss_mb": round(med("peak_rss") / 1e6, 1),
                    "wall_s": round(med("wall_s"), 1),
                    "ms_per_step_last_tenth": round(med("ms_per_step_last_tenth"), 2),
                    "resume_ms": round(med("resume_ms"), 1),
                    "resume_to_step_ms": round(med("resume_to_step_ms"), 1),
                    "resume_script_ms": round(med("resume_script_ms"), 1),
                    "resume_peak_rss_mb": round(med("resume_peak_rss") / 1e6, 1),
                }
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(results)
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def print_table(r: dict[str, Any]) -> None:
    print(
        f"tool={r['tool']}  python {r['python']}  killed at N=0: {r['base_bytes']:,} bytes, "
        f"peak RSS {r['base_peak_rss_mb']} MB, resumed in {r['base_resume_ms']} ms"
    )
    cols = [
        ("steps", "N"),
        ("bytes_per_step", "bytes/step"),
        ("peak_rss_mb", "peak RSS MB"),
        ("ms_per_step_last_tenth", "ms/step (last 10%)"),
        ("wall_s", "wall s"),
        ("resume_ms", "resume ms"),
        ("resume_to_step_ms", "… to its step"),
        ("resume_script_ms", "… of it the script"),
        ("resume_peak_rss_mb", "resume RSS MB"),
    ]
    print(" ".join(f"{h:>{max(len(h), 8)}}" for _, h in cols))
    for s in r["sizes"]:
        print(" ".join(f"{s[k]!s:>{max(len(h), 8)}}" for k, h in cols))
    first = r["sizes"][0]
    for s in r["sizes"][1:]:
        print(
            f"N={s['steps']} against N={first['steps']}: bytes/step "
            f"×{s['bytes_per_step'] / first['bytes_per_step']:.3f}, peak RSS "
            f"×{s['peak_rss_mb'] / first['peak_rss_mb']:.2f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
