"""Mixed fleets on one PostgreSQL queue (docs/versions.md): workers of two releases, runs
of both queued; each worker claims only the runs of its own version key, all finish, and no
run needed anyone's consent. The other release is this code with its release number set
higher before the CLI starts (what a newer build's worker is, to the queue)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from scale_helpers import pg_schema, wait_for

pytestmark = pytest.mark.postgres

NEWER = "9.9.0"
# The CLI of a build whose release is NEWER (the same code otherwise).
AS_NEWER = (
    "import sys, durable_agent.loop.versions as v; v.RELEASE = sys.argv.pop(1); "
    "from durable_agent.cli.parser import main; raise SystemExit(main(sys.argv[1:]))"
)


def _cli(env: dict[str, str], release: str | None, *args: str) -> list[str]:
    if release is None:
        return [sys.executable, "-m", "durable_agent", *args]
    return [sys.executable, "-c", AS_NEWER, release, *args]


@pytest.mark.slow  # eight CLI processes: over 2 s on 2 cores
def test_two_releases_share_a_queue_and_each_claims_only_its_own(
    tmp_path: Path, env: dict[str, str]
) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
                {"content": "done"},
            ]
        )
    )
    with pg_schema() as url:
        ids: dict[str | None, list[str]] = {None: [], NEWER: []}
        for release in (None, NEWER):
            for i in range(3):
                rid = f"{'new' if release else 'old'}{i}"
                ws = tmp_path / rid
                ws.mkdir()
                (ws / "a.txt").write_text("hi\n")
                r = subprocess.run(
                    _cli(env, release, "start", "t", "--model", f"scripted:{script}",
                         "--workspace", str(ws), "--shell", "deny", "--db", url,
                         "--run-id", rid, "--detach"),
                    env=env, capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                assert r.returncode == 0, r.stderr
                ids[release].append(rid)
        logs = {}
        procs = {}
        for release in (None, NEWER):
            logs[release] = tmp_path / f"worker-{release}.log"
            with logs[release].open("wb") as err:
                procs[release] = subprocess.Popen(
                    _cli(env, release, "worker", "--db", url, "--once", "--poll", "0.1"),
                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                )  # fmt: skip
        for release, proc in procs.items():
            assert proc.wait(timeout=120) == 0, logs[release].read_text()
        from sqlalchemy import create_engine, text

        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        with engine.connect() as conn:
            status = dict(conn.execute(text("SELECT id, status FROM runs")).all())
            rows = conn.execute(
                text(
                    "SELECT run_id, reason, fingerprint->>'durable_agent' FROM run_versions "
                    "ORDER BY id"
                )
            ).all()
        engine.dispose()
        assert set(status.values()) == {"completed"}, status
        for release in procs:
            log = logs[release].read_text()
            claimed = {rid for rid in status if f"claimed run {rid} " in log}
            assert claimed == set(ids[release]), log  # its own, all of them, nothing else
        # One row each, recorded by the release that made the run: nothing was accepted.
        assert sorted(r[0] for r in rows) == sorted(status)
        assert {r[1] for r in rows} == {"start"}
        assert {r[0]: r[2] for r in rows if r[0].startswith("new")} == dict.fromkeys(
            ids[NEWER], NEWER
        )


@pytest.mark.slow  # a worker process, waited on
def test_a_worker_stops_claiming_when_the_schema_is_newer_than_it(
    tmp_path: Path, env: dict[str, str]
) -> None:
    with pg_schema() as url:
        up = subprocess.run(
            [sys.executable, "-m", "durable_agent", "db", "upgrade", "--db", url],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert up.returncode == 0, up.stderr
        log = tmp_path / "worker.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "durable_agent", "worker", "--db", url, "--poll", "0.1"],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        try:
            wait_for(lambda: "worker " in log.read_text(), 60, "the worker to start")
            import psycopg

            libpq = "postgresql://" + url.split("://", 1)[1]
            with psycopg.connect(libpq, autocommit=True) as conn:  # a newer release's upgrade
                conn.execute("UPDATE alembic_version SET version_num = '0099'")
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        lines = [line for line in log.read_text().splitlines() if "0099" in line]
        assert len(lines) == 1 and "claiming no more runs" in lines[0], log.read_text()


@pytest.mark.slow  # five CLI processes
def test_a_worker_that_accepts_all_takes_another_releases_run_and_records_it(
    tmp_path: Path, env: dict[str, str]
) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
                {"content": "done"},
            ]
        )
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hi\n")
    with pg_schema() as url:
        made = subprocess.run(
            _cli(env, NEWER, "start", "t", "--model", f"scripted:{script}", "--workspace",
                 str(ws), "--shell", "deny", "--db", url, "--run-id", "n", "--max-steps", "1"),
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert made.returncode == 3, made.stderr  # a budget: the newer release ran a step
        queued = subprocess.run(
            _cli(env, NEWER, "resume", "n", "--db", url, "--max-steps", "5", "--detach"),
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert queued.returncode == 0, queued.stderr
        own = _cli(env, None, "worker", "--db", url, "--once", "--poll", "0.1")
        left = subprocess.run(own, env=env, capture_output=True, text=True, timeout=60)
        assert left.returncode == 0 and "claimed run n" not in left.stderr, left.stderr
        wide = subprocess.run(
            [*own, "--accept-changes", "all"], env=env, capture_output=True, text=True, timeout=60
        )
        assert wide.returncode == 0 and "claimed run n" in wide.stderr, wide.stderr
        from sqlalchemy import create_engine, text

        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        with engine.connect() as conn:
            status = conn.execute(text("SELECT status FROM runs WHERE id = 'n'")).scalar()
            rows = conn.execute(text("SELECT reason FROM run_versions ORDER BY id")).all()
            by = conn.execute(
                text("SELECT input->>'accepted_by' FROM steps WHERE kind = 'version'")
            ).scalar()
        engine.dispose()
        assert status == "completed"
        assert [r for (r,) in rows] == ["start", "accepted"]
        assert by is not None and "--accept-changes all" in by
