#!/usr/bin/env python3
"""Benchmark: what compaction saves on a long run (issue 13), measured at the server.

A run of N turns (default 300), each reading a different file of S bytes (default 4 KB),
through the real CLI and the real openai client against tests/fake_openai.py, which counts
every request its documented way (JSON length // 4) and, given a window, refuses anything
over it. Side by side, in one process run:

    no compaction   a window large enough for the whole history (context_window = 10M)
    window W        context_window = W (and the server enforcing W): compaction keeps under it

For each: total prompt tokens sent, the largest request, model calls, compact steps
(elide / summarize) and summary calls, wall time.

Usage: scripts/bench_context.py [--turns 300] [--bytes 4096] [--windows 32768,16000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fake_openai import FakeOpenAI  # noqa: E402  (the test server, shipped with the sources)

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
MODEL = "bench-model"
UNBOUNDED = 10_000_000


def make_files(workspace: Path, turns: int, size: int) -> None:
    rng = random.Random(13)
    for i in range(turns):
        text = ""
        while len(text) < size:
            text += " ".join(rng.choice(WORDS) for _ in range(10)) + "\n"
        (workspace / f"f{i:03}.txt").write_text(text[:size])


def one_run(turns: int, size: int, window: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-context-") as tmp:
        base = Path(tmp)
        workspace = base / "ws"
        workspace.mkdir()
        make_files(workspace, turns, size)
        config = base / "config.toml"
        config.write_text(f'[models."{MODEL}"]\ncontext_window = {window or UNBOUNDED}\n')
        script = [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": f"f{i:03}.txt"}}]}
            for i in range(turns)
        ] + [{"content": "done"}]
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DURABLE_AGENT_"))
        }
        env.update(
            OPENAI_API_KEY="sk-bench",
            DURABLE_AGENT_CONFIG=str(config),
            DURABLE_AGENT_SANDBOX="off",
            DURABLE_AGENT_DB=f"sqlite:///{base / 'store.db'}",
        )
        with FakeOpenAI(script=script, window=window) as server:
            started = time.perf_counter()
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "durable_agent",
                    "start",
                    "read every file",
                    "--base-url",
                    server.url,
                    "--model",
                    MODEL,
                    "--max-steps",
                    str(turns + 10),
                    "--json",
                ],
                cwd=workspace,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            seconds = time.perf_counter() - started
            requests = list(server.requests)
        if proc.returncode != 0:
            raise SystemExit(
                f"run failed ({proc.returncode}): {proc.stdout[-300:]} {proc.stderr[-300:]}"
            )
        with sqlite3.connect(base / "store.db") as db:
            stages = dict(
                db.execute(
                    "SELECT json_extract(output, '$.stage'), count(*) FROM steps "
                    "WHERE kind = 'compact' GROUP BY 1"
                ).fetchall()
            )
        turns_sent = [r for r in requests if r["kind"] == "turn"]
        return {
            "window": window,
            "model_calls": len(turns_sent),
            "prompt_tokens_total": sum(r["prompt_tokens"] for r in requests),
            "largest_request": max(r["prompt_tokens"] for r in requests),
            "compactions": sum(stages.values()),
            "elide_steps": stages.get("elide", 0),
            "summarize_steps": stages.get("summarize", 0),
            "summary_calls": sum(r["kind"] == "summary" for r in requests),
            "refused_over_window": sum(
                1 for r in requests if window and r["prompt_tokens"] > window
            ),
            "seconds": round(seconds, 1),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--windows", default="32768,16000")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rows = [one_run(args.turns, args.bytes, None)]
    rows += [one_run(args.turns, args.bytes, int(w)) for w in args.windows.split(",") if w]
    base = rows[0]["prompt_tokens_total"]
    print(
        f"{args.turns} turns, {args.bytes:,}-byte tool outputs (tokens as the server counts them)"
    )
    print(
        f"{'window':>12} {'prompt tokens':>14} {'vs none':>8} {'largest':>9} {'compact':>8} "
        f"{'elide':>6} {'summ.':>6} {'calls':>6} {'time':>7}"
    )
    for r in rows:
        label = "none" if r["window"] is None else f"{r['window']:,}"
        print(
            f"{label:>12} {r['prompt_tokens_total']:>14,} {r['prompt_tokens_total'] / base:>7.1%} "
            f"{r['largest_request']:>9,} {r['compactions']:>8} {r['elide_steps']:>6} {r['summarize_steps']:>6} "
            f"{r['model_calls'] + r['summary_calls']:>6} {r['seconds']:>6}s"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
