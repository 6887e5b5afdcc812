"""Two live processes, one run, on PostgreSQL with pipelined checkpoints (store/prepared.py).

A `start` is frozen (SIGSTOP: a GC pause, a laptop lid, a partition) past its lease; a
`resume` elsewhere takes the run over and finishes it; then the first process thaws. Its
first checkpoint after the thaw finds the fence taken and writes nothing, it exits 6, and
every command of the run ran exactly once (each appends its call id to a ledger: the
ground truth). Frozen at a different moment each round.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from scale_helpers import pg_schema, wait_for
from side_effects_support import run_cli
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

TURNS = 8


def script() -> list[dict[str, Any]]:
    command = {"name": "run_command", "arguments": {"command": "echo $DURABLE_AGENT_CALL_ID >> ledger"}}
    return [*({"delay_s": 0.3, "tool_calls": [command]} for _ in range(TURNS)), {"content": "done"}]


@pytest.mark.postgres
@pytest.mark.parametrize("freeze_after", [1, 3, 6])
def test_a_thawed_owner_is_fenced_and_nothing_runs_twice(freeze_after: int, tmp_path: Path,
                                                         env: dict[str, str]) -> None:
    with pg_schema() as url:
        ws = tmp_path / "ws"
        ws.mkdir()
        (tmp_path / "script.json").write_text(json.dumps(script()))
        (tmp_path / "config.toml").write_text('lease_seconds = 1\nsandbox = "off"\n')
        e = {**env, "DURABLE_AGENT_DB": url, "DURABLE_AGENT_CONFIG": str(tmp_path / "config.toml")}
        assert run_cli(e, ws, "db", "upgrade").code == 0
        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool)

        def one(sql: str) -> Any:
            with engine.connect() as conn:
                return conn.execute(text(sql)).first()

        err = (tmp_path / "first.err").open("w")
        first = subprocess.Popen([sys.executable, "-m", "durable_agent", "start", "t", "--model",
                                  f"scripted:{tmp_path / 'script.json'}", "--shell", "allow", "--run-id", "race", "--max-repeats", "99",
                                  "--quiet"], cwd=ws, env=e, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=err)
        try:
            wait_for(lambda: (one("SELECT step_count FROM runs WHERE id = 'race'") or (0,))[0] >= freeze_after,
                     60, "the first process's steps")
            os.kill(first.pid, signal.SIGSTOP)  # its heartbeat stops with it
            wait_for(lambda: one("SELECT lease_expires_at < now() AT TIME ZONE 'UTC' FROM runs "
                                 "WHERE id = 'race'")[0], 30, "the frozen owner's lease to expire")
            decisions = _resume_to_the_end(e, ws, one)
            os.kill(first.pid, signal.SIGCONT)
            assert first.wait(timeout=60) == 6  # SPEC: the run is executed by another process
        finally:
            if first.poll() is None:
                os.kill(first.pid, signal.SIGCONT)
                first.kill()
                first.wait()
            err.close()
        last = (tmp_path / "first.err").read_text().strip().splitlines()[-1]
        assert "Traceback" not in (tmp_path / "first.err").read_text() and "lease" in last, last
        ledger = (ws / "ledger").read_text().split()
        assert Counter(ledger) == Counter(f"call_{i}_0" for i in range(TURNS)), (ledger, decisions)
        status, epoch, steps = one("SELECT status, lease_epoch, step_count FROM runs WHERE id = 'race'")
        assert (status, steps) == ("completed", TURNS + 1) and epoch >= 2
        # Nothing of the first owner's epoch after the takeover's first row.
        first_new = one(f"SELECT min(seq) FROM steps WHERE run_id = 'race' AND lease_epoch = {epoch}")[0]
        assert one(f"SELECT count(*) FROM steps WHERE run_id = 'race' AND seq > {first_new} "
                   f"AND lease_epoch < {epoch}")[0] == 0
        engine.dispose()


def _resume_to_the_end(env: dict[str, str], ws: Path, one: Any) -> list[str]:
    """`resume` until completed; a command the frozen owner had started but not recorded is
    a question for a person (exit 5), answered as that person would: by the ledger."""
    decisions: list[str] = []
    for _ in range(4):
        r = run_cli(env, ws, "resume", "race", "--quiet")
        if r.code == 0:
            return decisions
        assert r.code == 5, (r.code, r.stderr)
        call_id = one("SELECT call_id FROM approvals WHERE run_id = 'race' AND decision IS NULL")[0]
        ran = (ws / "ledger").exists() and call_id in (ws / "ledger").read_text().split()
        assert run_cli(env, ws, "approve", "race", *(["--deny"] if ran else []), "--by", "tester").code == 0
        decisions.append(f"{call_id}: {'ran' if ran else 'not run'}")
    pytest.fail(f"the run did not complete: {decisions}")
