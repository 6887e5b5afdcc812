"""`durable-agent worker` on SQLite (the same code path as on PostgreSQL): draining the
queue, runs it cannot reach, SIGTERM between two steps, and a lease lost mid-command."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Result
from scale_helpers import Workers, wait_for


@pytest.fixture
def workers(env: dict[str, str], tmp_path: Path) -> Iterator[Workers]:
    w = Workers(env, env["DURABLE_AGENT_DB"], tmp_path / "logs")
    yield w
    w.kill_all()


def enqueue(
    cli_inproc: Callable[..., Result], model: str, workspace: Path, task: str = "task"
) -> str:
    res = cli_inproc(
        "start",
        task,
        "--model",
        model,
        "--shell",
        "allow",
        "--workspace",
        str(workspace),
        "--detach",
    )
    assert res.code == 0, res.stderr
    return res.stdout.strip()


def query(db: Path, sql: str, *params: Any) -> list[Any]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, params).fetchall()


def ledger(workspace: Path) -> list[str]:
    path = workspace / "ledger.txt"
    return path.read_text().split() if path.exists() else []


def command_turn(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]}


LOG = 'echo "$DURABLE_AGENT_CALL_ID" >> ledger.txt'


def test_worker_once_drains_the_queue_and_exits(
    cli_inproc: Callable[..., Result],
    cli: Callable[..., Result],
    write_script: Callable[..., str],
    tmp_path: Path,
    db_path: Path,
) -> None:
    model = write_script(
        [command_turn(f"{LOG} # 1"), command_turn(f"{LOG} # 2"), {"content": "done"}]
    )
    spaces = [tmp_path / f"ws{i}" for i in range(4)]
    ids = []
    for ws in spaces:
        ws.mkdir()
        ids.append(enqueue(cli_inproc, model, ws))
    assert {r[0] for r in query(db_path, "SELECT status FROM runs")} == {"pending"}

    res = cli("worker", "--once", "--concurrency", "2", "--quiet", "--poll", "0.1")
    assert res.code == 0, res.stderr
    for rid in ids:
        assert f"claimed run {rid} (epoch 1)" in res.stderr
        assert f"finished run {rid} · completed (finished)" in res.stderr
    assert "stopped (nothing left to claim) · 4 claimed · 4 completed" in res.stderr
    rows = query(db_path, "SELECT status, answer, lease_owner, lease_epoch FROM runs")
    assert rows == [("completed", "done", None, 1)] * 4
    assert all(ledger(ws) == ["call_0_0", "call_1_0"] for ws in spaces)

    again = cli("worker", "--once", "--quiet")
    assert again.code == 0 and "0 claimed" in again.stderr


def test_a_run_whose_workspace_is_missing_here_is_left_queued(
    cli_inproc: Callable[..., Result], cli: Callable[..., Result], tmp_path: Path, db_path: Path
) -> None:
    gone = tmp_path / "mounted-elsewhere"
    gone.mkdir()
    rid = enqueue(cli_inproc, "demo", gone)
    gone.rmdir()  # e.g. a shared filesystem that this worker's machine does not mount
    res = cli("worker", "--once", "--quiet")
    assert res.code == 0, res.stderr
    assert (
        f"skipped run {rid}: its workspace {gone} is not a directory on this machine" in res.stderr
    )
    assert f"left for other workers: 1 run(s) this worker cannot execute: {rid}" in res.stderr
    assert query(db_path, "SELECT status, lease_owner, lease_epoch, step_count FROM runs") == [
        ("pending", None, 0, 0)
    ]


@pytest.mark.parametrize(("flag", "want"), [((), 90), (("--lease-seconds", "45"), 45)])
def test_the_config_sets_the_lease_unless_the_flag_is_given(
    cli_inproc: Callable[..., Result],
    cli: Callable[..., Result],
    write_script: Callable[..., str],
    tmp_path: Path,
    db_path: Path,
    flag: tuple[str, ...],
    want: int,
) -> None:
    """`--lease-seconds` has no default of its own: a config file's lease_seconds is what the
    worker's runs hold (a flag default of 30 used to override it silently)."""
    config = tmp_path / "config.toml"
    config.write_text("lease_seconds = 90\n")
    # The run measures its own lease from inside a step: expiry minus last renewal.
    probe = (
        f"python3 -c \"import sqlite3; print(round(sqlite3.connect('{db_path}').execute("
        "'SELECT (julianday(lease_expires_at) - julianday(updated_at)) * 86400 FROM runs')"
        '.fetchone()[0]))" > lease.txt'
    )
    ws = tmp_path / "leased"
    ws.mkdir()
    queued = cli_inproc(
        "start",
        "task",
        "--model",
        write_script([command_turn(probe), {"content": "done"}]),
        "--shell",
        "allow",
        "--sandbox",
        "off",
        "--workspace",
        str(ws),
        "--detach",
    )
    assert queued.code == 0, queued.stderr  # (unsandboxed: the probe reads the store under /tmp)
    res = cli(
        "worker",
        "--once",
        "--quiet",
        "--poll",
        "0.1",
        *flag,
        extra_env={"DURABLE_AGENT_CONFIG": str(config)},
    )
    assert res.code == 0, res.stderr
    assert f"lease {want}s" in res.stderr
    assert int((ws / "lease.txt").read_text()) == want


@pytest.mark.slow
def test_sigterm_finishes_the_current_step_then_gives_the_run_back(
    cli_inproc: Callable[..., Result],
    cli: Callable[..., Result],
    write_script: Callable[..., str],
    workspace: Path,
    db_path: Path,
    workers: Workers,
) -> None:
    model = write_script(
        [command_turn(f"{LOG}; sleep 1.5"), command_turn(f"{LOG} # 2"), {"content": "done"}]
    )
    rid = enqueue(cli_inproc, model, workspace)
    proc = workers.start("--poll", "0.1")
    wait_for(lambda: ledger(workspace) == ["call_0_0"], 30, "the first command to run")
    assert workers.stop(proc, timeout_s=30) == 0
    log = workers.log(proc)
    assert f"released run {rid} between two steps" in log
    assert "stopped (signal) · 1 claimed · 1 released" in log
    # The command that was running when SIGTERM came was finished and recorded, not cut off.
    steps = query(db_path, "SELECT seq, kind, state, call_id FROM steps ORDER BY seq")
    assert steps == [(0, "model", "completed", None), (1, "tool", "completed", "call_0_0")]
    assert query(
        db_path, "SELECT status, lease_owner, lease_expires_at, lease_epoch FROM runs"
    ) == [("pending", None, None, 1)]

    res = cli("worker", "--once", "--quiet")
    assert res.code == 0, res.stderr
    assert f"claimed run {rid} (epoch 2)" in res.stderr
    assert query(db_path, "SELECT status, answer, lease_epoch FROM runs") == [
        ("completed", "done", 2)
    ]
    assert ledger(workspace) == ["call_0_0", "call_1_0"]  # nothing ran twice


def test_a_worker_that_loses_its_lease_mid_command_writes_nothing_more(
    cli_inproc: Callable[..., Result],
    write_script: Callable[..., str],
    workspace: Path,
    db_path: Path,
    workers: Workers,
) -> None:
    slow = 'echo "start-$DURABLE_AGENT_CALL_ID" >> ledger.txt; sleep 5; echo "end-$DURABLE_AGENT_CALL_ID" >> ledger.txt'
    model = write_script([command_turn(slow), {"content": "done"}])
    rid = enqueue(cli_inproc, model, workspace)
    proc = workers.start("--once", "--quiet", "--lease-seconds", "1", "--poll", "0.1")
    wait_for(lambda: ledger(workspace) == ["start-call_0_0"], 30, "the command to start")
    # Another worker takes the run over (as if this one had stalled past its lease).
    with sqlite3.connect(db_path) as conn:
        conn.execute(
            "UPDATE runs SET lease_owner = 'elsewhere:1:thief', lease_epoch = lease_epoch + 1, "
            "lease_expires_at = datetime('now', '+60 seconds')"
        )
    assert (
        proc.wait(timeout=30) == 0
    )  # --once: the run is not claimable (a live lease), so it exits
    log = workers.log(proc)
    assert f"lost run {rid}: its lease was taken over by another worker" in log
    # The heartbeat noticed, the command was killed (its group is gone once the worker has
    # returned from it), and no outcome was recorded under the lost lease.
    assert ledger(workspace) == ["start-call_0_0"]
    assert query(db_path, "SELECT seq, state, lease_epoch FROM steps ORDER BY seq") == [
        (0, "completed", 1),
        (1, "started", 1),
    ]
    assert query(db_path, "SELECT status, lease_owner, lease_epoch FROM runs") == [
        ("running", "elsewhere:1:thief", 2)
    ]


def test_a_second_sigterm_exits_at_once_and_leaves_the_lease_to_expire(
    cli_inproc: Callable[..., Result],
    write_script: Callable[..., str],
    workspace: Path,
    db_path: Path,
    workers: Workers,
) -> None:
    slow = 'echo "start-$DURABLE_AGENT_CALL_ID" >> ledger.txt; sleep 60; echo "end" >> ledger.txt'
    rid = enqueue(cli_inproc, write_script([command_turn(slow), {"content": "done"}]), workspace)
    proc = workers.start("--poll", "0.1", "--lease-seconds", "5")
    wait_for(lambda: ledger(workspace) == ["start-call_0_0"], 30, "the command to start")
    proc.send_signal(signal.SIGTERM)
    wait_for(  # (a deadline for a loaded CI machine, not a wait: it ends when the line comes)
        lambda: "stopping: 1 run(s) finish their current step" in workers.log(proc),
        25,
        "the worker to start draining",
    )
    assert proc.poll() is None  # still finishing the step (the command sleeps 60 s)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=25) == -signal.SIGTERM
    assert "second signal: exiting now" in workers.log(proc)
    # Not released: the run keeps its lease until it expires, then any worker takes it over.
    ((status, owner, epoch),) = query(
        db_path, "SELECT status, lease_owner, lease_epoch FROM runs WHERE id = ?", rid
    )
    assert (status, epoch) == ("running", 1) and owner is not None
    assert query(db_path, "SELECT state FROM steps WHERE call_id = 'call_0_0'") == [("started",)]


@pytest.mark.slow
def test_a_blocked_run_goes_back_to_the_workers_after_approve(
    cli_inproc: Callable[..., Result],
    cli: Callable[..., Result],
    write_script: Callable[..., str],
    tmp_path: Path,
    db_path: Path,
) -> None:
    ws = tmp_path / "wsq"
    ws.mkdir()
    model = write_script([command_turn("touch made.txt"), {"content": "done"}])
    res = cli_inproc(
        "start", "t", "--model", model, "--workspace", str(ws), "--detach"
    )  # --shell ask
    rid = res.stdout.strip()
    assert cli("worker", "--once", "--quiet", "--poll", "0.1").code == 0
    assert query(db_path, "SELECT status, stop_reason FROM runs") == [
        ("blocked", "approval_required")
    ]
    assert not (ws / "made.txt").exists()
    assert cli("approve", rid).code == 0
    queued = cli("resume", rid, "--detach")
    assert queued.code == 0 and queued.stdout.strip() == rid
    assert query(db_path, "SELECT status, lease_owner FROM runs") == [("pending", None)]
    done = cli("worker", "--once", "--quiet", "--poll", "0.1")
    assert done.code == 0 and f"finished run {rid} · completed (finished)" in done.stderr
    assert (ws / "made.txt").exists()


@pytest.mark.parametrize("failing", ["once", "always"])
def test_worker_once_takes_back_a_run_a_store_fault_interrupted(
    failing: str,
    cli_inproc: Callable[..., Result],
    write_script: Callable[..., str],
    tmp_path: Path,
    db_path: Path,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The store failed past its retries (PostgreSQL's connection slots all taken, say): the
    # lease stayed ours and could not be released, and `--once` left at once, "nothing left
    # to claim", with the run `running` until another worker came by.
    from durable_agent import worker
    from durable_agent.config.settings import load_settings
    from durable_agent.errors import StoreUnavailable

    ws = tmp_path / "interrupted"
    ws.mkdir()
    rid = enqueue(cli_inproc, write_script([command_turn(LOG), {"content": "done"}]), ws)
    built = []
    real = worker.build_runner

    def flaky(*args: Any, **kwargs: Any) -> Any:
        runner = real(*args, **kwargs)
        built.append(runner)
        if len(built) == 1 or failing == "always":

            def unavailable(*_: Any, **__: Any) -> Any:
                raise StoreUnavailable("the database is not reachable (too many clients already)")

            runner.execute = unavailable
        return runner

    monkeypatch.setattr(worker, "build_runner", flaky)
    settings = load_settings({"db": env["DURABLE_AGENT_DB"], "lease_seconds": 1}, env)
    options = worker.WorkerOptions(
        db=env["DURABLE_AGENT_DB"], lease_seconds=1, poll_s=0.05, once=True, quiet=True
    )
    if (
        failing == "always"
    ):  # taken back once; failing again, it is not a blip: exit 7, not for ever
        with pytest.raises(StoreUnavailable, match="too many clients"):
            worker.run_worker(settings, options, env)
        assert len(built) == 2 and query(db_path, "SELECT status FROM runs") == [("running",)]
        return
    assert worker.run_worker(settings, options, env) == 0
    err = capsys.readouterr().err
    assert f"run {rid} interrupted" in err and f"took over run {rid}" in err, err
    assert len(built) == 2 and query(db_path, "SELECT status FROM runs") == [("completed",)]
    assert ledger(ws) == ["call_0_0"]


@pytest.mark.slow
def test_worker_once_stops_with_exit_7_on_a_store_that_keeps_failing(
    tmp_path: Path, env: dict[str, str]
) -> None:
    # The run fills the store's disk (a real 1 MiB tmpfs): the worker's run stops on it, and
    # `--once` waited for the lease, took the run back, failed again, and so on for ever (or
    # polled "cannot claim" for ever): a CI job that never ended. Now: exit 7, one line.
    from mounts import mount_tmpfs
    from side_effects_support import run_cli

    disk = tmp_path / "disk"
    mount_tmpfs(disk, "1m")
    try:
        (tmp_path / "c.toml").write_text("store_retry_attempts = 2\nstore_retry_seconds = 1\n")
        e = {
            **env,
            "DURABLE_AGENT_DB": f"sqlite:///{disk / 'store.db'}",
            "DURABLE_AGENT_CONFIG": str(tmp_path / "c.toml"),
        }
        ws = tmp_path / "ws"
        ws.mkdir()
        for i in range(60):  # outputs that fill 1 MiB long before the script ends
            (ws / f"big{i}.txt").write_text(f"{i} " + "x" * 15_000)
        turns = [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": f"big{i}.txt"}}]}
            for i in range(60)
        ]
        (tmp_path / "script.json").write_text(json.dumps([*turns, {"content": "done"}]))
        queued = run_cli(
            e,
            ws,
            "start",
            "t",
            "--model",
            f"scripted:{tmp_path / 'script.json'}",
            "--max-steps",
            "70",
            "--run-id",
            "full",
            "--detach",
        )
        assert queued.code == 0, queued.stderr
        worker = run_cli(
            e,
            ws,
            "worker",
            "--once",
            "--quiet",
            "--poll",
            "0.1",
            "--lease-seconds",
            "1",
            timeout=90,
        )
        assert worker.code == 7, worker.stderr
        last = worker.stderr.strip().splitlines()[-1]
        assert (
            last.startswith("durable-agent: error: the store is unavailable: ") and "full" in last
        ), worker.stderr
        assert "Traceback" not in worker.stderr
        # Room again: the next `worker --once` finishes the run from its last checkpoint.
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        again = run_cli(
            e,
            ws,
            "worker",
            "--once",
            "--quiet",
            "--poll",
            "0.1",
            "--lease-seconds",
            "1",
            timeout=90,
        )
        assert again.code == 0 and "finished run full · completed" in again.stderr, again.stderr
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_the_workers_log_prints_a_providers_control_characters_escaped(
    cli: Callable[..., Result], workspace: Path
) -> None:
    # The worker's own lines (`finished run ... failed: <error>`) quoted the provider's error
    # raw: an ESC sequence recoloured or erased the operator's terminal or CI log.
    from fake_openai import FakeOpenAI

    error = {
        "error": {
            "message": "bad \x1b[31mRED\x1b[0m \r\x1b[2Kinjected \u202eevil",
            "type": "invalid_request_error",
        }
    }
    with FakeOpenAI(script=[{"content": "done"}], faults=[{"status": 400, "body": error}]) as fake:
        queued = cli("start", "t", "--model", "m", "--base-url", fake.url, "--detach")
        assert queued.code == 0, queued.stderr
        res = cli("worker", "--once")
    assert res.code == 0, res.stderr
    assert "failed (model_error)" in res.stderr and "\\x1b[31mRED" in res.stderr, res.stderr
    assert not set(res.stderr) & {"\x1b", "\r", "\u202e"}
