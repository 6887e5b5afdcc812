"""Two live processes, one run, on PostgreSQL.

A `start` is frozen (SIGSTOP: a GC pause, a laptop lid, a partition) past its lease; a
`resume` elsewhere takes the run over and finishes it; then the first process thaws. Its
first checkpoint after the thaw finds the fence taken and writes nothing, it exits 6, and
every command of the run ran exactly once (each appends its call id to a ledger: the
ground truth). Frozen at a different moment each round.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from scale_helpers import pg_schema, wait_for
from side_effects_support import process_state, run_cli, thawed_at_the_end
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

pytestmark = (
    pytest.mark.slow
)  # each waits out real leases (5-6 s): the full suite runs them, not the fast lane
TURNS = 8


def script() -> list[dict[str, Any]]:
    command = {
        "name": "run_command",
        "arguments": {"command": "echo $DURABLE_AGENT_CALL_ID >> ledger"},
    }
    return [*({"delay_s": 0.3, "tool_calls": [command]} for _ in range(TURNS)), {"content": "done"}]


class Race:
    """One run on a fresh schema, a first owner in the background, the ground truth after."""

    def __init__(self, url: str, tmp_path: Path, env: dict[str, str]) -> None:
        self.tmp, self.ws = tmp_path, tmp_path / "ws"
        self.ws.mkdir()
        (tmp_path / "script.json").write_text(json.dumps(script()))
        (tmp_path / "config.toml").write_text('lease_seconds = 1\nsandbox = "off"\n')
        self.env = {
            **env,
            "DURABLE_AGENT_DB": url,
            "DURABLE_AGENT_CONFIG": str(tmp_path / "config.toml"),
        }
        assert run_cli(self.env, self.ws, "db", "upgrade").code == 0
        self.engine = create_engine(
            url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool
        )

    def one(self, sql: str) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(text(sql)).first()

    def start_first(self, extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.tmp / "first.err").open("w") as err:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "durable_agent",
                    "start",
                    "t",
                    "--model",
                    f"scripted:{self.tmp / 'script.json'}",
                    "--shell",
                    "allow",
                    "--run-id",
                    "race",
                    "--max-repeats",
                    "99",
                    "--quiet",
                ],
                cwd=self.ws,
                env={**self.env, **extra_env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def take_over_and_thaw(self, first: subprocess.Popen[bytes]) -> list[str]:
        """Once the frozen owner's lease has expired: `resume` to the end here, then thaw it."""
        with thawed_at_the_end(first):
            wait_for(
                lambda: self.one(
                    "SELECT lease_expires_at < now() AT TIME ZONE 'UTC' FROM runs WHERE id = 'race'"
                )[0],
                30,
                "the frozen owner's lease to expire",
            )
            decisions = _resume_to_the_end(self.env, self.ws, self.one)
            os.kill(first.pid, signal.SIGCONT)
            assert first.wait(timeout=60) == 6  # SPEC: the run is executed by another process
        return decisions

    def check(self, decisions: list[str]) -> None:
        err = (self.tmp / "first.err").read_text()
        last = err.strip().splitlines()[-1]
        assert "Traceback" not in err and "lease" in last, err
        ledger = (self.ws / "ledger").read_text().split()
        assert Counter(ledger) == Counter(f"call_{i}_0" for i in range(TURNS)), (ledger, decisions)
        status, epoch, steps = self.one(
            "SELECT status, lease_epoch, step_count FROM runs WHERE id = 'race'"
        )
        assert (status, steps) == ("completed", TURNS + 1) and epoch >= 2
        # Nothing of the first owner's epoch after the takeover's first row.
        first_new = self.one(
            f"SELECT min(seq) FROM steps WHERE run_id = 'race' AND lease_epoch = {epoch}"
        )[0]
        assert (
            self.one(
                f"SELECT count(*) FROM steps WHERE run_id = 'race' AND seq > {first_new} "
                f"AND lease_epoch < {epoch}"
            )[0]
            == 0
        )
        self.engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("freeze_after", [1, 3, 6])
def test_a_thawed_owner_is_fenced_and_nothing_runs_twice(
    freeze_after: int, tmp_path: Path, env: dict[str, str]
) -> None:
    with pg_schema() as url:
        race = Race(url, tmp_path, env)
        first = race.start_first({})
        wait_for(
            lambda: (
                (race.one("SELECT step_count FROM runs WHERE id = 'race'") or (0,))[0]
                >= freeze_after
            ),
            60,
            "the first process's steps",
        )
        os.kill(first.pid, signal.SIGSTOP)  # its heartbeat stops with it
        race.check(race.take_over_and_thaw(first))


@pytest.mark.postgres
@pytest.mark.parametrize("boundary", [3, 7])
def test_an_owner_frozen_inside_its_checkpoint_does_not_hold_the_run_forever(
    boundary: int, tmp_path: Path, env: dict[str, str]
) -> None:
    """Frozen between its fence (the run row locked) and its COMMIT: the server ends a
    transaction idle for longer than the lease, so the lock goes and the takeover goes on."""
    with pg_schema() as url:
        race = Race(url, tmp_path, env)
        first = race.start_first(
            {"DURABLE_AGENT_STOP_AFTER": str(boundary)}
        )  # odd: before its COMMIT
        wait_for(lambda: process_state(first.pid) == "T", 60, "the first process to freeze itself")
        race.check(race.take_over_and_thaw(first))


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
        assert (
            run_cli(env, ws, "approve", "race", *(["--deny"] if ran else []), "--by", "tester").code
            == 0
        )
        decisions.append(f"{call_id}: {'ran' if ran else 'not run'}")
    pytest.fail(f"the run did not complete: {decisions}")


@pytest.mark.postgres
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"),
    reason="needs root and unshare(1) for a process that cannot see the first one (another host)",
)
def test_an_owner_frozen_between_a_commands_pgid_and_its_start_never_starts_it_after_its_lease(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Frozen right after committing its command's pgid (boundary 8: model 1-4, intent 5-6,
    pgid 7-8), before telling the guard to go. The takeover runs from another PID namespace,
    as from another host: it cannot kill the frozen owner's guard. It asks about the command
    (its pgid is recorded), the person sees it did not run and approves, it runs once. The
    owner thaws long past its lease: the guard refuses to start the command (`late`)."""
    with pg_schema() as url:
        race = Race(url, tmp_path, env)
        first = race.start_first({"DURABLE_AGENT_STOP_AFTER": "8"})
        with thawed_at_the_end(first):
            wait_for(
                lambda: process_state(first.pid) == "T", 60, "the first process to freeze itself"
            )
            assert race.one(
                "SELECT pgid IS NOT NULL FROM steps WHERE run_id = 'race' AND kind = 'tool'"
            )[0]
            wait_for(
                lambda: race.one(
                    "SELECT lease_expires_at < now() AT TIME ZONE 'UTC' FROM runs WHERE id = 'race'"
                )[0],
                30,
                "the frozen owner's lease to expire",
            )
            elsewhere = [
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                sys.executable,
                "-m",
                "durable_agent",
            ]

            def resume() -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [*elsewhere, "resume", "race", "--quiet"],
                    cwd=race.ws,
                    env=race.env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )

            asked = resume()
            assert asked.returncode == 5, asked.stderr
            assert not (race.ws / "ledger").exists()  # the frozen owner never started it
            assert run_cli(race.env, race.ws, "approve", "race", "--by", "tester").code == 0
            done = resume()
            assert done.returncode == 0, done.stderr
            os.kill(first.pid, signal.SIGCONT)
            assert first.wait(timeout=60) == 6
        ledger = (race.ws / "ledger").read_text().split()
        assert Counter(ledger) == Counter(f"call_{i}_0" for i in range(TURNS)), ledger
        err = (tmp_path / "first.err").read_text()
        assert "was not started" in err and "Traceback" not in err, err
        race.engine.dispose()


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"),
    reason="needs root and unshare(1) "
    "for a process with the same hostname in another PID namespace",
)
def test_a_live_owner_is_not_taken_over_from_another_pid_namespace_of_the_same_host(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Containers sharing the host's network share its name, not its pids: the owner's pid
    was missing in the other namespace, so its live lease was taken at once (by `resume` and
    by a worker's orphan claim) while its command still ran. Here the store is SQLite."""
    ws = tmp_path / "ws"
    ws.mkdir()
    command = "echo started > started; while [ ! -e go ]; do sleep 0.05; done; echo ran >> ledger"
    script = [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
        {"content": "done"},
    ]
    (tmp_path / "script.json").write_text(json.dumps(script))
    (tmp_path / "config.toml").write_text('lease_seconds = 60\nsandbox = "off"\n')
    env = {**env, "DURABLE_AGENT_CONFIG": str(tmp_path / "config.toml")}
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "durable_agent",
            "start",
            "t",
            "--model",
            f"scripted:{tmp_path / 'script.json'}",
            "--shell",
            "allow",
            "--run-id",
            "live",
            "--quiet",
        ],
        cwd=ws,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: (ws / "started").exists(), 60, "the first owner's command")
        elsewhere = [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            "-m",
            "durable_agent",
        ]
        resumed = subprocess.run(
            [*elsewhere, "resume", "live", "--quiet"],
            cwd=ws,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert resumed.returncode == 6 and "another live process" in resumed.stderr, resumed.stderr
        worker = subprocess.run(
            [*elsewhere, "worker", "--once", "--poll", "0.1"],
            cwd=ws,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert worker.returncode == 0 and "took over" not in worker.stderr, worker.stderr
        assert "0 claimed" in worker.stderr or "claimed run" not in worker.stderr, worker.stderr
        (ws / "go").touch()
        _, err = first.communicate(timeout=60)
        assert first.returncode == 0, err.decode()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert (ws / "ledger").read_text() == "ran\n"
