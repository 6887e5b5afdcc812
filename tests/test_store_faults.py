"""No run is lost to its store: real faults at every statement, real dropped connections,
a real full disk (SPEC §5, §2 exit 7; issue: database faults).

Each scenario runs the real CLI on a 20-step script with writes, edits, reads and commands
(each command appends its call id to a ledger file: the ground truth of how often it ran),
with a fault injected by `durable_agent/store/faults.py`:

- SQLite: the N-th statement of the run fails with a driver error (disk I/O error,
  database is full, database is locked), once (retried in place) or for good (exit 7);
- PostgreSQL: the run's own server backend is terminated right after its N-th statement
  (`pg_terminate_backend`), and, separately, at random moments from outside;
- a real full disk: the SQLite file on a 1 MiB tmpfs (root only), grown afterwards.

After each, the run is resumed until it completes and must equal an uninterrupted run:
same workspace bytes, each command's ledger line exactly once, one step row per tool call,
run totals equal to the rows, a valid history.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from scale_helpers import pg_schema
from side_effects_support import run_cli
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

TURNS = 20


def script() -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for i in range(TURNS):
        kind = i % 5
        if kind == 0:
            call = {
                "name": "write_file",
                "arguments": {"path": f"f{i}.txt", "content": f"line {i}\n"},
            }
        elif kind == 1:
            call = {
                "name": "run_command",
                "arguments": {"command": "echo $DURABLE_AGENT_CALL_ID >> ledger"},
            }
        elif kind == 2:
            call = {
                "name": "edit_file",
                "arguments": {
                    "path": f"f{i - 2}.txt",
                    "old_string": f"line {i - 2}",
                    "new_string": f"edited {i - 2}",
                },
            }
        elif kind == 3:
            call = {"name": "read_file", "arguments": {"path": f"f{i - 3}.txt"}}
        else:
            call = {
                "name": "run_command",
                "arguments": {
                    "command": "printf 'a\\tb' > out_$DURABLE_AGENT_CALL_ID.txt; "
                    "echo $DURABLE_AGENT_CALL_ID >> ledger"
                },
            }
        turns.append(
            {"tool_calls": [call, {"name": "list_files", "arguments": {}}] if kind == 3 else [call]}
        )
    turns.append({"content": "done"})
    return turns


COMMANDS = [f"call_{i}_0" for i in range(TURNS) if i % 5 in (1, 4)]


class Scenario:
    """One run in its own workspace (and, on SQLite, its own database file)."""

    def __init__(
        self,
        root: Path,
        env: dict[str, str],
        url: str,
        run_id: str,
        inspect_url: str | None = None,
        snapshots: bool = True,
    ) -> None:
        self.root, self.url, self.run_id = root, url, run_id
        # The test's own reads go through a URL the fault injection does not aim at.
        self.inspect_url = inspect_url or url
        self.ws = root / "ws"
        self.ws.mkdir(parents=True)
        (root / "script.json").write_text(json.dumps(script()))
        # Commands run unsandboxed here: containment adds no store statement, has its own
        # suites, and would cost the sweeps' hundreds of runs a bubblewrap start per command.
        (root / "config.toml").write_text(
            'store_retry_attempts = 4\nstore_retry_seconds = 3\nsandbox = "off"\n'
            f"snapshots = {'true' if snapshots else 'false'}\n"
        )
        self.env = {
            **env,
            "DURABLE_AGENT_DB": url,
            "DURABLE_AGENT_CONFIG": str(root / "config.toml"),
        }
        self.codes: list[int] = []
        self.stderr: list[str] = []
        self.decisions: list[str] = []

    def start(self, fault: dict[str, str]) -> int:
        r = run_cli(
            {**self.env, **fault, "DURABLE_AGENT_FAULT_LOG": str(self.root / "faults.log")},
            self.ws,
            "start",
            "t",
            "--model",
            f"scripted:{self.root / 'script.json'}",
            "--shell",
            "allow",
            "--max-steps",
            "30",
            "--run-id",
            self.run_id,
            "--quiet",
        )
        self.codes.append(r.code)
        self.stderr.append(r.stderr)
        return r.code

    def resume_to_the_end(self, sessions: int = 6) -> None:
        for _ in range(sessions):
            if self.status() == "completed":
                return
            r = run_cli(self.env, self.ws, "resume", self.run_id, "--quiet")
            self.codes.append(r.code)
            self.stderr.append(r.stderr)
            assert r.code in (0, 5, 7), (self.codes, r.stderr)
            if r.code == 5:
                self.decide()
        assert self.status() == "completed", (self.codes, self.stderr[-1])

    def decide(self) -> None:
        """Answer an `uncertain_side_effect` question as the person it asks would: look at
        the workspace. The store failed around a command (its process group or its outcome
        could not be recorded), so the harness cannot know whether it ran; the ledger can."""
        ((call_id, kind),) = self.rows(
            "SELECT call_id, kind FROM approvals WHERE run_id = :rid AND decision IS NULL"
        )
        assert kind == "uncertain_side_effect"
        ran = (
            call_id in (self.ws / "ledger").read_text().split()
            if (self.ws / "ledger").exists()
            else False
        )
        r = run_cli(
            self.env,
            self.ws,
            "approve",
            self.run_id,
            *(["--deny"] if ran else []),
            "--by",
            "tester",
        )
        assert r.code == 0, r.stderr
        self.decisions.append("denied" if ran else "approved")

    def faults(self) -> list[str]:
        log = self.root / "faults.log"
        return log.read_text().splitlines() if log.exists() else []

    def rows(self, statement: str, **params: Any) -> list[Any]:
        with _engine(self.inspect_url).connect() as conn:
            return list(conn.execute(text(statement), {"rid": self.run_id, **params}).all())

    def status(self) -> str | None:
        found = self.rows("SELECT status FROM runs WHERE id = :rid")
        return found[0][0] if found else None


_ENGINES: dict[str, Engine] = {}
_ENGINES_LOCK = threading.Lock()


def _engine(url: str) -> Engine:
    """One engine per store for the checks (the sweeps run hundreds of them)."""
    with _ENGINES_LOCK:
        if url not in _ENGINES:
            _ENGINES[url] = create_engine(
                url.replace("postgresql://", "postgresql+psycopg://"), poolclass=NullPool
            )
        return _ENGINES[url]


def files(ws: Path) -> dict[str, bytes]:
    return {str(p.relative_to(ws)): p.read_bytes() for p in sorted(ws.rglob("*")) if p.is_file()}


def check(s: Scenario, reference: dict[str, bytes]) -> None:
    """What must hold after any fault and any number of resumes."""
    assert s.rows("SELECT status, stop_reason FROM runs WHERE id = :rid") == [
        ("completed", "finished")
    ]
    assert files(s.ws) == reference
    assert Counter((s.ws / "ledger").read_text().split()) == Counter(COMMANDS)  # each exactly once
    tool_rows = s.rows("SELECT call_id, state FROM steps WHERE run_id = :rid AND kind = 'tool'")
    assert sorted(c for c, _ in tool_rows) == sorted(set(c for c, _ in tool_rows)), (
        "a call has two step rows"
    )
    assert all(state in ("completed", "failed") for _, state in tool_rows)
    # A store failure is never recorded as a tool's result (the old bug: SQL text as the output).
    for output, error in s.rows(
        "SELECT output, error FROM steps WHERE run_id = :rid AND kind = 'tool'"
    ):
        text_seen = f"{output} {error}".lower()
        assert not any(
            w in text_seen for w in ("operationalerror", "disk i/o", "sqlalchemy", "terminating")
        )
    keys = s.rows(
        "SELECT idempotency_key, COUNT(*) FROM steps WHERE run_id = :rid GROUP BY idempotency_key "
        "HAVING COUNT(*) > 1"
    )
    assert keys == []
    model_done = s.rows(
        "SELECT COUNT(*) FROM steps WHERE run_id = :rid AND kind = 'model' AND state = 'completed'"
    )[0][0]
    assert model_done == TURNS + 1  # each model turn paid for exactly once
    (run,) = s.rows(
        "SELECT step_count, tool_call_count, prompt_tokens, completion_tokens, message_count "
        "FROM runs WHERE id = :rid"
    )
    roles = dict(s.rows("SELECT role, COUNT(*) FROM messages WHERE run_id = :rid GROUP BY role"))
    tokens = s.rows(
        "SELECT SUM(prompt_tokens), SUM(completion_tokens) FROM steps "
        "WHERE run_id = :rid AND kind = 'model'"
    )[0]
    assert tuple(run) == (
        roles["assistant"],
        roles["tool"],
        tokens[0],
        tokens[1],
        sum(roles.values()),
    )
    open_calls: list[str] = []
    for role, calls, call_id in s.rows(
        "SELECT role, tool_calls, tool_call_id FROM messages WHERE run_id = :rid ORDER BY seq"
    ):
        if role == "assistant":
            assert not open_calls, f"calls {open_calls} have no result"
            calls = json.loads(calls) if isinstance(calls, str) else calls
            open_calls = [c["id"] for c in calls or []]
        elif role == "tool":
            open_calls.remove(call_id)


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An upgraded, empty store to copy: the faults then hit the run, not the migrations."""
    db = tmp_path_factory.mktemp("template") / "store.db"
    r = run_cli({**os.environ, "DURABLE_AGENT_DB": f"sqlite:///{db}"}, db.parent, "db", "upgrade")
    assert r.code == 0, r.stderr
    return db


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> tuple[dict[str, bytes], int]:
    """An uninterrupted run's workspace, and how many statements its thread executes."""
    root = tmp_path_factory.mktemp("reference")
    s = _sqlite(root, dict(os.environ), sqlite_template)
    assert s.start({"DURABLE_AGENT_FAULT_AT": "999999", "DURABLE_AGENT_FAULT": "io_error"}) == 0
    (count,) = [int(line.split()[1]) for line in s.faults() if line.startswith("statements")]
    return files(s.ws), count


def _sqlite(root: Path, env: dict[str, str], template: Path, run_id: str = "r") -> Scenario:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(template, root / "store.db")
    return Scenario(root, env, f"sqlite:///{root / 'store.db'}", run_id)


def _sqlite_fault(
    tmp: Path,
    env: dict[str, str],
    template: Path,
    reference: dict[str, bytes],
    at: int,
    kind: str,
    repeat: int = 1,
) -> Scenario:
    s = _sqlite(tmp / f"{kind}-{at}-{repeat}", env, template)
    code = s.start(
        {
            "DURABLE_AGENT_FAULT_AT": str(at),
            "DURABLE_AGENT_FAULT": kind,
            "DURABLE_AGENT_FAULT_REPEAT": str(repeat),
        }
    )
    assert code in (0, 7), (at, kind, code, s.stderr[-1])
    if code == 7:
        lines = s.stderr[-1].strip().splitlines()
        assert "Traceback" not in s.stderr[-1]
        assert lines[-1].startswith("durable-agent: error: the store is unavailable: ")
        assert (
            lines[-1].endswith(f"the run is resumable: `durable-agent resume {s.run_id}`")
            or s.status() is None
        )
    s.resume_to_the_end() if s.status() is not None else _restart(s)
    check(s, reference)
    return s


def _restart(s: Scenario) -> None:
    """The fault hit before the run was created: nothing to resume, start it again."""
    assert s.start({}) == 0, s.stderr[-1]


# -- SQLite -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["io_error", "full", "locked"])
@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_one_failed_statement_is_retried_in_place(
    kind: str, tmp_path: Path, env: dict[str, str], sqlite_template: Path, reference: Any
) -> None:
    files_ref, count = reference
    for at in (1, count // 2):
        s = _sqlite_fault(tmp_path, env, sqlite_template, files_ref, at, kind)
        assert s.codes[0] == 0, (at, s.stderr[0])  # retried: the run never stopped
        assert s.faults()[0] == f"fault {at}"


@pytest.mark.slow
def test_a_store_that_stays_away_stops_the_run_with_exit_7_and_it_resumes(
    tmp_path: Path, env: dict[str, str], sqlite_template: Path, reference: Any
) -> None:
    files_ref, count = reference
    for at in (count // 4, count - 3):
        s = _sqlite_fault(tmp_path, env, sqlite_template, files_ref, at, "io_error", repeat=10_000)
        assert s.codes[0] == 7, (at, s.codes)
        assert len(s.codes) >= 2 and s.codes[-1] == 0


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_run_totals_are_derived_from_the_rows_not_trusted(
    tmp_path: Path, env: dict[str, str], sqlite_template: Path, reference: Any
) -> None:
    """A counter that disagrees with the rows (a total written from memory after a failed
    commit, or a hand edit) is corrected, never a reason to refuse the run."""
    files_ref, count = reference
    s = _sqlite(tmp_path / "totals", env, sqlite_template)
    code = s.start(
        {
            "DURABLE_AGENT_FAULT_AT": str(count // 2),
            "DURABLE_AGENT_FAULT": "io_error",
            "DURABLE_AGENT_FAULT_REPEAT": "10000",
        }
    )
    assert code == 7
    engine = create_engine(s.url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE runs SET step_count = step_count + 5, tool_call_count = 999, "
                "prompt_tokens = 7, message_count = 1 WHERE id = 'r'"
            )
        )
    engine.dispose()
    s.resume_to_the_end()
    check(s, files_ref)  # check() compares every total with the rows


@pytest.mark.slow
def test_a_fault_at_every_statement_of_a_20_step_run(
    tmp_path: Path, env: dict[str, str], sqlite_template: Path, reference: Any
) -> None:
    files_ref, count = reference

    def one(at: int) -> tuple[int, list[int]]:
        # Every 4th: the store stays away (exit 7, then resume); the others: one blip, retried
        # in place. Every statement gets a fault; a stop-and-resume costs a second process.
        repeat = 10_000 if at % 4 == 1 else 1
        s = _sqlite_fault(tmp_path, env, sqlite_template, files_ref, at, "io_error", repeat)
        return at, s.codes

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(pool.map(one, range(1, count + 1)))
    stopped = sum(1 for codes in results.values() if codes[0] == 7)
    print(
        f"SQLite: {count} statement boundaries, {count} faults injected, {stopped} runs stopped "
        f"with exit 7 and resumed, {count - stopped} recovered in place, 0 duplicates"
    )
    assert len(results) == count


def test_a_full_disk_stops_the_run_with_exit_7_and_it_resumes_once_there_is_room(
    tmp_path: Path, env: dict[str, str], sqlite_template: Path
) -> None:
    from mounts import mount_tmpfs

    disk = tmp_path / "disk"
    mount_tmpfs(disk, "1m")
    try:
        shutil.copy(sqlite_template, disk / "store.db")
        root = tmp_path / "run"
        s = Scenario(root, env, f"sqlite:///{disk / 'store.db'}", "full")
        for i in range(60):  # outputs that fill 1 MiB long before the script ends
            (s.ws / f"big{i}.txt").write_text(f"{i} " + "x" * 15_000)
        turns = [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": f"big{i}.txt"}}]}
            for i in range(60)
        ]
        (root / "script.json").write_text(json.dumps([*turns, {"content": "done"}]))
        r = run_cli(
            s.env,
            s.ws,
            "start",
            "t",
            "--model",
            f"scripted:{root / 'script.json'}",
            "--max-steps",
            "70",
            "--run-id",
            "full",
            "--quiet",
        )
        assert r.code == 7, r.stderr
        assert "Traceback" not in r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert (
            last.startswith("durable-agent: error: the store is unavailable: ") and "full" in last
        ), last
        shown = run_cli(s.env, s.ws, "show", "full")
        assert shown.code == 0 and "its process is gone" in shown.stdout
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        s.resume_to_the_end()
        assert (
            s.rows(
                "SELECT COUNT(*) FROM steps WHERE run_id = :rid AND kind = 'model' "
                "AND state = 'completed'"
            )[0][0]
            == 61
        )
        assert s.rows("SELECT step_count, tool_call_count FROM runs WHERE id = :rid") == [(61, 60)]
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# -- PostgreSQL -------------------------------------------------------------------------------
@pytest.fixture
def pg_url() -> Any:
    with pg_schema() as url:
        r = run_cli({**os.environ, "DURABLE_AGENT_DB": url}, Path.cwd(), "db", "upgrade")
        assert r.code == 0, r.stderr
        yield url


@pytest.fixture(scope="module")
def pg_count() -> int:
    """How many statements a PostgreSQL run of the script makes, workspace snapshots off.

    The PostgreSQL sweeps run without snapshots, in one store: snapshots are shared by
    content across the runs of a store, so with them a later run would make fewer
    statements than the reference and the numbering would drift. Every snapshot statement
    is swept on SQLite (each run in a fresh copy of the store), and the random
    terminations below hit PostgreSQL runs with snapshots on."""
    with pg_schema() as url:
        r = run_cli({**os.environ, "DURABLE_AGENT_DB": url}, Path.cwd(), "db", "upgrade")
        assert r.code == 0, r.stderr
        with tempfile.TemporaryDirectory() as tmp:
            s = Scenario(Path(tmp) / "ref", dict(os.environ), url, "ref", snapshots=False)
            assert (
                s.start({"DURABLE_AGENT_FAULT_AT": "999999", "DURABLE_AGENT_FAULT": "terminate"})
                == 0
            )
            (count,) = [
                int(line.split()[1]) for line in s.faults() if line.startswith("statements")
            ]
    return count


@pytest.mark.postgres
def test_connection_slots_all_taken_is_a_store_to_wait_for_not_a_wrong_store(
    pg_url: str, tmp_path: Path
) -> None:
    # PostgreSQL's "too many clients" (53300) arrives from a failed connect as text only: it
    # was taken for a wrong --db (exit 2, and a worker's finished command lost its result).
    import psycopg
    from scale_helpers import _libpq_url

    role = f"da_slots_{uuid.uuid4().hex[:8]}"
    schema = pg_url.rsplit("%3D", 1)[1]
    with psycopg.connect(_libpq_url(pg_url), autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 1')
        admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        admin.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        try:
            url = pg_url.replace("://postgres@", f"://{role}@", 1)
            (tmp_path / "c.toml").write_text("store_retry_attempts = 2\nstore_retry_seconds = 1\n")
            env = {
                **os.environ,
                "DURABLE_AGENT_DB": url,
                "DURABLE_AGENT_CONFIG": str(tmp_path / "c.toml"),
            }
            with psycopg.connect(_libpq_url(url)):  # the role's one slot
                r = run_cli(env, tmp_path, "list")
            assert r.code == 7, (r.code, r.stderr)
            assert "too many connections" in r.stderr and r.stderr.count("\n") == 1, r.stderr
            r = run_cli(env, tmp_path, "list")  # the slot is free again
            assert r.code == 0, r.stderr
        finally:
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


@pytest.mark.postgres
def test_a_refused_statement_quoting_words_of_a_lost_connection_is_not_a_store_to_wait_for(
    pg_url: str,
) -> None:
    # A unique violation's message quotes the value: the agent's text ("timeout expired",
    # "connection refused") made a permanent refusal look like a store gone (retried for a
    # minute, then exit 7 "resumable", forever).
    from sqlalchemy.exc import IntegrityError

    from durable_agent.store import retrying
    from durable_agent.store.engine import make_engine

    engine = make_engine(pg_url)
    try:
        for words in (*retrying._BUSY_TEXT, *retrying._LOST_TEXT):
            with engine.connect() as conn:
                conn.execute(text("CREATE TEMP TABLE quoted (k text PRIMARY KEY)"))
                conn.execute(text("INSERT INTO quoted VALUES (:k)"), {"k": words})
                with pytest.raises(IntegrityError) as caught:
                    conn.execute(text("INSERT INTO quoted VALUES (:k)"), {"k": words})
                assert words in str(caught.value.orig).lower()
                assert not retrying.is_transient(caught.value), words
                assert not retrying.connection_lost(caught.value.orig), words
                conn.rollback()
    finally:
        engine.dispose()


@pytest.mark.slow
def test_a_server_that_accepts_and_says_nothing_is_a_store_to_wait_for_not_a_hang(
    tmp_path: Path,
) -> None:
    # libpq waits for a silent server without end by default: `list`, `resume`, a worker
    # hung for as long as it stayed silent (a partition, a proxy that stopped forwarding).
    pytest.importorskip("psycopg")
    with socket.socket() as silent:  # the kernel completes the handshakes; nobody answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"postgresql://u@127.0.0.1:{silent.getsockname()[1]}/x"
        (tmp_path / "c.toml").write_text("store_retry_attempts = 2\nstore_retry_seconds = 1\n")
        env = {**os.environ, "DURABLE_AGENT_CONFIG": str(tmp_path / "c.toml")}
        for given in (url, url + "?connect_timeout=2"):  # the URL's own bound is kept
            r = run_cli({**env, "DURABLE_AGENT_DB": given}, tmp_path, "list", timeout=90)
            assert r.code == 7, (r.code, r.stderr)
            assert (
                "unavailable" in r.stderr and "timeout" in r.stderr and r.stderr.count("\n") == 1
            ), r.stderr


@pytest.mark.postgres
def test_store_connections_are_probed_by_the_kernel_when_silent(pg_url: str) -> None:
    # Waiting for an answer, a connection to a server gone silent is found dead by TCP
    # keepalives and tcp_user_timeout (then retried, exit 7), as set on the socket itself.
    from durable_agent.store.engine import make_engine

    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            fd = conn.connection.dbapi_connection.fileno()  # type: ignore[union-attr]
            with socket.socket(fileno=os.dup(fd)) as sock:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_what_the_user_set_by_libpqs_own_means_wins_over_the_silence_bounds(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PGCONNECT_TIMEOUT and a service file's settings lost to the harness's own (libpq
    # takes them only as defaults, under the connection's explicit arguments).
    from sqlalchemy.engine import make_url

    from durable_agent.store.engine import make_engine

    def parameters(url: str) -> dict[str, str]:
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                return dict(conn.connection.dbapi_connection.info.get_parameters())  # type: ignore[union-attr]
        finally:
            engine.dispose()

    monkeypatch.setenv("PGCONNECT_TIMEOUT", "3")
    got = parameters(pg_url)
    assert (got["connect_timeout"], got["keepalives_idle"]) == ("3", "10")
    monkeypatch.delenv("PGCONNECT_TIMEOUT")
    where = make_url(pg_url)
    service = tmp_path / "pg_service.conf"
    server = f"host={where.host}\nport={where.port or 5432}\ndbname={where.database}\nuser={where.username}\n"
    service.write_text(
        f"[durable]\nconnect_timeout=4\nkeepalives_idle=44\n{server}[plain]\n{server}"
    )
    monkeypatch.setenv("PGSERVICEFILE", str(service))
    got = parameters("postgresql+psycopg:///?service=durable")
    assert (got["connect_timeout"], got["keepalives_idle"], got["tcp_user_timeout"]) == (
        "4",
        "44",
        "30000",
    )
    # A service that sets none of them gets them all (psycopg reads no connect_timeout from
    # a service: a silent server held the connect for 130 s).
    got = parameters("postgresql+psycopg:///?service=plain")
    assert (got["connect_timeout"], got["keepalives_idle"]) == ("10", "10")


def _pg_fault(
    tmp: Path, env: dict[str, str], url: str, reference: dict[str, bytes], at: int
) -> Scenario:
    s = Scenario(tmp / f"pg-{at}", env, url, f"pg{at}", snapshots=False)
    code = s.start({"DURABLE_AGENT_FAULT_AT": str(at), "DURABLE_AGENT_FAULT": "terminate"})
    assert code in (0, 7), (at, code, s.stderr[-1])
    s.resume_to_the_end() if s.status() is not None else _restart(s)
    check(s, reference)
    return s


@pytest.mark.slow
@pytest.mark.postgres
def test_a_terminated_connection_is_replaced_and_the_run_goes_on(
    tmp_path: Path, env: dict[str, str], pg_url: str, reference: Any, pg_count: int
) -> None:
    files_ref, _ = reference
    for at in (pg_count // 3, pg_count - 2):
        s = _pg_fault(tmp_path, env, pg_url, files_ref, at)
        assert s.codes[0] == 0, (at, s.stderr[0])
        assert f"fault {at}" in s.faults()


@pytest.mark.postgres
@pytest.mark.slow
def test_a_terminated_connection_at_every_statement_of_a_20_step_run(
    tmp_path: Path, env: dict[str, str], pg_url: str, reference: Any, pg_count: int
) -> None:
    files_ref, _ = reference
    count = pg_count
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(
            pool.map(
                lambda at: _pg_fault(tmp_path, env, pg_url, files_ref, at), range(1, count + 1)
            )
        )
    hit = sum(1 for s in results if s.faults() and s.faults()[0].startswith("fault"))
    print(
        f"PostgreSQL: {count} statement boundaries, {hit} backends terminated, "
        f"{sum(1 for s in results if s.codes[0] != 0)} runs stopped and resumed, 0 duplicates"
    )
    assert hit == count


@pytest.mark.postgres
@pytest.mark.slow
def test_connections_terminated_from_outside_at_random_moments(
    tmp_path: Path, env: dict[str, str], pg_url: str, reference: Any
) -> None:
    import psycopg

    files_ref, _ = reference
    rng = random.Random(20261130)
    admin_url = pg_url.split("?")[0]
    terminated = 0
    for n in range(6):
        app = f"da_fault_{os.getpid()}_{n}"
        s = Scenario(
            tmp_path / f"random-{n}",
            env,
            f"{pg_url}&application_name={app}",
            f"rnd{n}",
            inspect_url=pg_url,
        )
        stop = threading.Event()

        def killer(stop: threading.Event = stop, app: str = app) -> None:
            nonlocal terminated
            with psycopg.connect(admin_url, autocommit=True) as admin:
                while not stop.wait(rng.uniform(0.05, 0.4)):
                    got = admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = %s",
                        (app,),
                    ).fetchall()
                    terminated += len(got)

        thread = threading.Thread(target=killer)
        thread.start()
        try:
            code = s.start({})
            assert code in (0, 7), s.stderr[-1]
            if s.status() != "completed":
                s.resume_to_the_end(sessions=10)
        finally:
            stop.set()
            thread.join()
        s.resume_to_the_end()
        check(s, files_ref)
    print(
        f"PostgreSQL: {terminated} connections terminated from outside over 6 runs, all completed"
    )
    assert terminated > 0


@pytest.mark.postgres
@pytest.mark.slow
def test_a_server_that_stops_answering_mid_run_is_not_waited_for_for_ever(
    tmp_path: Path, env: dict[str, str], pg_url: str
) -> None:
    # A proxy that hung (or a SIGSTOPped server): its host acknowledges every byte and answers
    # keepalives, so neither they nor tcp_user_timeout fire, and libpq waited for the answer
    # to the run's next checkpoint for ever. Now the store's silence watchdog cuts the
    # connection after twice the lease (at least 10 s), the store's retries find no server,
    # exit 7; once the proxy is back the run resumes to its end, no command run twice.
    from frozen_relay import relay_to
    from scale_helpers import wait_for

    where = urlsplit(pg_url)
    with relay_to((where.hostname or "127.0.0.1", where.port or 5432)) as relay:
        via = (
            urlunsplit(where._replace(netloc=f"{where.username}@127.0.0.1:{relay.port}"))
            + "&connect_timeout=2"
        )
        s = Scenario(tmp_path / "frozen", env, via, "frozen", inspect_url=pg_url)
        with (s.root / "config.toml").open("a") as config:
            config.write("lease_seconds = 2\n")
        err = s.root / "start.err"
        with err.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "durable_agent",
                    "start",
                    "t",
                    "--model",
                    f"scripted:{s.root / 'script.json'}",
                    "--shell",
                    "allow",
                    "--max-steps",
                    "30",
                    "--run-id",
                    "frozen",
                    "--quiet",
                ],
                cwd=s.ws,
                env=s.env,
                stdout=out,
                stderr=out,
            )
        try:
            wait_for(
                lambda: (
                    (s.ws / "ledger").exists() and len((s.ws / "ledger").read_text().split()) >= 2
                ),
                what="the run's second command",
            )
            relay.freeze()
            frozen_at = time.monotonic()
            code = proc.wait(timeout=90)
        finally:
            proc.kill()
        waited = time.monotonic() - frozen_at
        assert code == 7, err.read_text()
        assert (
            err.read_text()
            .strip()
            .splitlines()[-1]
            .startswith("durable-agent: error: the store is unavailable")
        )
        assert 10 <= waited < 60, waited  # the bound, then the retries; not the 90 s of the test
        relay.thaw()
        s.resume_to_the_end()
    ledger = (s.ws / "ledger").read_text().split()
    assert sorted(ledger) == sorted(set(ledger)) and set(ledger) <= set(COMMANDS), ledger


@pytest.mark.postgres
@pytest.mark.slow
def test_the_silence_watchdog_cuts_only_a_connection_waiting_on_a_silent_server(
    pg_url: str,
) -> None:
    # What the watchdog looks at: a command in progress with no byte moving for the bound.
    # A connection left idle for longer (checked out or in the pool) is not cut; a command
    # the server itself keeps silent on past the bound is, as a frozen server's would be.
    from durable_agent.store.engine import open_store_engine
    from durable_agent.store.silence import WATCHDOG, silence_bound

    engine = open_store_engine(pg_url, lease_seconds=1)
    bound = silence_bound(1)
    try:
        cuts = WATCHDOG.cuts
        with engine.connect() as idle, engine.connect() as waiting:
            assert idle.execute(text("SELECT 1")).scalar() == 1
            idle.commit()
            start = time.monotonic()
            with pytest.raises(Exception, match="server closed the connection"):
                waiting.execute(text(f"SELECT pg_sleep({bound * 3})"))
            assert bound <= time.monotonic() - start < bound * 2
            assert idle.execute(text("SELECT 2")).scalar() == 2  # idle as long: untouched
        assert WATCHDOG.cuts == cuts + 1
    finally:
        engine.dispose()


@pytest.mark.postgres
@pytest.mark.slow
def test_a_connection_finalized_during_the_watchdogs_look_does_not_wedge_the_store(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A checked-out connection left in a reference cycle is closed by whichever thread the
    # garbage collector runs in; in the watchdog's, inside its look, the pool's close event
    # waited on the lock that thread held, and every later connect of the process with it.
    import gc

    from scale_helpers import wait_for

    from durable_agent.store import silence
    from durable_agent.store.engine import open_store_engine

    engine = open_store_engine(pg_url, lease_seconds=1)
    looked = threading.Event()
    real = silence._silent_for

    def look(conn: Any) -> int:  # a collection landing inside the look, in the watchdog's thread
        gc.collect()
        looked.set()
        return real(conn)

    monkeypatch.setattr(silence, "_silent_for", look)
    gc.disable()
    try:

        class Cycle:
            pass

        cycle = Cycle()
        cycle.me, cycle.conn = cycle, engine.connect()  # type: ignore[attr-defined]
        cycle.conn.execute(text("SELECT 1"))  # type: ignore[attr-defined]
        del cycle
        wait_for(looked.is_set, what="the watchdog's look")
        engine.pool.dispose()  # the next connect makes (and registers) a new connection
        done = threading.Event()

        def connect() -> None:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            done.set()

        threading.Thread(target=connect, daemon=True).start()
        assert done.wait(15), "a connect waited on the watchdog"
    finally:
        gc.enable()
        engine.dispose()


def test_the_silence_watchdog_looks_while_connections_come_and_go() -> None:
    # Registering takes no lock (a checkout never waits on the watchdog); its connections were
    # held in a WeakKeyDictionary, whose iteration raises when another thread adds meanwhile,
    # which would have ended the watchdog's thread for good, silently.
    from durable_agent.store.silence import Watchdog

    class Conn:  # no libpq connection: never silent, never cut
        pass

    dog = Watchdog()
    dog._thread = threading.current_thread()  # looked at by this test, not by a thread of its own
    conns = [Conn() for _ in range(4000)]
    for conn in conns[:2000]:
        dog.register(conn, 10.0)
    del conn

    def arrive() -> None:
        for conn in conns[2000:]:
            dog.register(conn, 10.0)

    newcomer = threading.Thread(target=arrive)
    newcomer.start()
    while newcomer.is_alive():
        dog.look()
    newcomer.join()
    dog.look()
    assert all(dog._watched(conn) == 10.0 for conn in conns) and dog.cuts == 0
    conns.clear()
    dog.look()  # gone without a close event: forgotten
    assert dog._conns == {}
