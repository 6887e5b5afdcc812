"""A store failure inside a command's start hook is a store failure, not the command's
result (issue 10, item 1): the process group is committed before the command starts
(`Step.set_pgid`), and that write can meet a full disk or a dropped connection.

The fault is real and aimed at exactly that write, on both stores: SQLite statements fail
with the driver's own "disk I/O error", PostgreSQL backends are terminated with
`pg_terminate_backend` after each statement. Once: retried in place, the command runs
once. For good: the run stops with exit 7, the command never ran, its step stays
`started` with no result and no pgid, and resume runs it (once) without asking a person.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import Result
from pydantic import BaseModel
from sqlalchemy import Connection, text

from durable_agent import tools as registry
from durable_agent.status import EffectClass
from durable_agent.store import faults as fault_injection
from durable_agent.store.engine import open_store_engine
from durable_agent.store.prepared import CURSOR_HOOKS
from durable_agent.store.step import Step
from durable_agent.tools.base import ToolContext, ToolResult
from durable_agent.tools.process import command_env, run_process

SCRIPT = [
    {
        "tool_calls": [
            {
                "name": "run_command",
                "arguments": {"command": "echo $DURABLE_AGENT_CALL_ID >> ledger"},
            }
        ]
    },
    {"content": "done"},
]
STORE_WORDS = (
    "operationalerror",
    "disk i/o",
    "sqlalchemy",
    "terminating",
    "psycopg",
    "update steps",
)


@contextmanager
def failing(times: int) -> Iterator[list[int]]:
    """The next `times` statements of this thread fail for real: SQLite's driver error
    before each, or PostgreSQL's backend killed after each (the next one finds it dead)."""
    hits = [0]
    me = threading.current_thread()

    def hook(when: str, conn: Connection) -> None:
        if threading.current_thread() is not me or hits[0] >= times:
            return
        if when == "before" and conn.dialect.name == "sqlite":
            hits[0] += 1
            error = sqlite3.OperationalError("disk I/O error")
            error.sqlite_errorname = "SQLITE_IOERR"
            raise error
        if when == "after" and conn.dialect.name == "postgresql":
            hits[0] += 1
            fault_injection._terminate(conn)

    CURSOR_HOOKS.append(hook)
    try:
        yield hits
    finally:
        CURSOR_HOOKS.remove(hook)


@pytest.fixture
def hook_fails(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], list[int]]:
    """Arm `failing(times)` around every `Step.set_pgid` of the runs that follow."""

    def arm(times: int) -> list[int]:
        original = Step.set_pgid
        hits = [0]

        def set_pgid(self: Step, pgid: int) -> float:
            with failing(times) as now:
                try:
                    return original(self, pgid)  # with its deadline: the retries count against it
                finally:
                    hits[0] += now[0]

        monkeypatch.setattr(Step, "set_pgid", set_pgid)
        return hits

    return arm


@pytest.fixture
def run(
    store_url: str,
    cli_inproc: Callable[..., Result],
    write_script: Callable[..., str],
    tmp_path: Path,
    env: dict[str, str],
) -> Callable[..., Result]:
    config = tmp_path / "config.toml"
    config.write_text("store_retry_attempts = 3\nstore_retry_seconds = 2\n")
    env["DURABLE_AGENT_CONFIG"] = str(config)
    model = write_script(SCRIPT)

    def cli(command: str, *args: str) -> Result:
        extra = (
            ("t", "--model", model, "--shell", "allow", "--run-id", "r")
            if command == "start"
            else ()
        )
        return cli_inproc(command, *extra, *args, "--db", store_url)

    return cli


def rows(store_url: str, statement: str) -> list[Any]:
    engine = open_store_engine(store_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(statement))]
    finally:
        engine.dispose()


def tool_rows(store_url: str) -> list[Any]:
    return rows(
        store_url,
        "SELECT state, pgid IS NOT NULL, output, error FROM steps "
        "WHERE run_id = 'r' AND kind = 'tool'",
    )


def no_store_words(store_url: str) -> None:
    for *_, output, error in tool_rows(store_url):
        seen = f"{output} {error}".lower()
        assert not any(w in seen for w in STORE_WORDS), seen


def test_one_failed_write_in_the_start_hook_is_retried_and_the_command_runs_once(
    run: Callable[..., Result],
    hook_fails: Callable[[int], list[int]],
    store_url: str,
    workspace: Path,
) -> None:
    hits = hook_fails(1)
    started = run("start", "--json")
    assert started.code == 0, started.stderr
    assert hits == [1]  # the fault did hit the hook's write
    assert (workspace / "ledger").read_text().split() == ["call_0_0"]
    ((state, has_pgid, output, _),) = tool_rows(store_url)
    assert (state, has_pgid) == ("completed", True)
    result = (json.loads(output) if isinstance(output, str) else output)["result"]
    assert result.startswith("exit code: 0"), result
    no_store_words(store_url)


def test_a_start_hook_whose_write_keeps_failing_stops_the_run_before_the_command(
    run: Callable[..., Result],
    hook_fails: Callable[[int], list[int]],
    store_url: str,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hits = hook_fails(10_000)
    started = run("start")
    assert started.code == 7, started.stderr
    assert hits[0] >= 3  # every try of the write met the fault
    last = started.stderr.strip().splitlines()[-1]
    assert last.startswith("durable-agent: error: the store is unavailable: "), last
    assert last.endswith("the run is resumable: `durable-agent resume r`"), last
    assert not (workspace / "ledger").exists()  # the command never ran
    # Not recorded as the command's result: the step stays started, with nothing in it,
    # and the model was told nothing.
    assert tool_rows(store_url) == [("started", False, None, None)]
    assert rows(
        store_url, "SELECT COUNT(*) FROM messages WHERE run_id = 'r' AND role = 'tool'"
    ) == [(0,)]
    shown = run("show", "r")
    assert shown.code == 0 and "its process is gone" in shown.stdout, shown.stdout

    monkeypatch.undo()  # the store is back
    # No pgid was committed, so the guard never started the command: resume runs it
    # without asking a person (an unattended run is not left blocked on a question).
    finished = run("resume", "r", "--json")
    assert finished.code == 0 and finished.json()["status"] == "completed", finished.stderr
    assert rows(store_url, "SELECT COUNT(*) FROM approvals WHERE run_id = 'r'") == [(0,)]
    assert (workspace / "ledger").read_text().split() == ["call_0_0"]  # exactly once
    assert [r[:2] for r in tool_rows(store_url)] == [("completed", True)]
    no_store_words(store_url)


@pytest.fixture
def late(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], list[int]]:
    """The next `times` pgid records return a start deadline already past, as after a stall
    (a slow store, a frozen process) that the lease survived. Returns the calls seen."""

    def arm(times: int) -> list[int]:
        original = Step.set_pgid
        calls = [0]

        def set_pgid(self: Step, pgid: int) -> float:
            deadline = original(self, pgid)
            calls[0] += 1
            return deadline - 3600 if calls[0] <= times else deadline

        monkeypatch.setattr(Step, "set_pgid", set_pgid)
        return calls

    return arm


def test_a_command_late_to_start_while_the_run_is_still_ours_gets_one_more_try(
    run: Callable[..., Result], late: Callable[[int], list[int]], store_url: str, workspace: Path
) -> None:
    calls = late(1)
    started = run("start", "--json")
    assert started.code == 0, started.stderr
    assert calls == [2]  # refused once, started on the second try
    assert (workspace / "ledger").read_text().split() == ["call_0_0"]
    assert [r[:2] for r in tool_rows(store_url)] == [("completed", True)]


def test_a_command_late_twice_stops_the_run_and_resume_runs_it_without_a_question(
    run: Callable[..., Result],
    late: Callable[[int], list[int]],
    store_url: str,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    late(2)
    started = run("start")
    assert started.code == 7, started.stderr
    assert "not started" in started.stderr and "raise lease_seconds" in started.stderr
    assert not (workspace / "ledger").exists()
    assert tool_rows(store_url) == [
        ("started", False, None, None)
    ]  # its pgid cleared: it never began
    monkeypatch.undo()
    finished = run("resume", "r", "--json")
    assert finished.code == 0 and finished.json()["status"] == "completed", finished.stderr
    assert (workspace / "ledger").read_text().split() == ["call_0_0"]
    assert rows(store_url, "SELECT COUNT(*) FROM approvals WHERE run_id = 'r'") == [(0,)]


def test_a_guard_that_finds_the_go_late_gets_one_more_try_too(
    run: Callable[..., Result],
    late: Callable[[int], list[int]],
    store_url: str,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The stall after the harness's own check (faked: its clock stands still), before the
    # go: the guard itself answers `late`.
    from durable_agent.tools import process

    calls = late(1)
    monkeypatch.setattr(process, "_boottime", lambda: -1e12)
    started = run("start", "--json")
    assert started.code == 0, started.stderr
    assert calls == [2]
    assert (workspace / "ledger").read_text().split() == ["call_0_0"]
    assert [r[:2] for r in tool_rows(store_url)] == [("completed", True)]


class NoArgs(BaseModel):
    pass


class TwoCommands:
    """An exec tool of its own that runs two commands, each through ctx.on_process_start."""

    name: ClassVar[str] = "two_commands"
    description: ClassVar[str] = "two commands"
    args_model: ClassVar[type[BaseModel]] = NoArgs
    effect: ClassVar[EffectClass] = EffectClass.EXEC

    def run(self, args: NoArgs, ctx: ToolContext) -> ToolResult:
        for word in ("first", "second"):
            run_process(
                f"echo {word} >> ledger",
                cwd=ctx.workspace,
                timeout_s=30,
                env=command_env(ctx.env, run_id=ctx.run_id, call_id=ctx.call_id),
                on_start=ctx.on_process_start,
                sandbox=ctx.sandbox,
                workspace=ctx.workspace,
            )
        return ToolResult(output="ran both")


def test_another_exec_tool_late_to_start_its_second_command_is_never_run_again(
    store_url: str,
    cli_inproc: Callable[..., Result],
    write_script: Callable[..., str],
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only run_command is known to start nothing before its one command: another tool's `run`
    # started its first command already, so it is not tried again (the session ends, exit 6).
    monkeypatch.setitem(registry._custom, TwoCommands.name, TwoCommands())
    model = write_script(
        [{"tool_calls": [{"name": "two_commands", "arguments": {}}]}, {"content": "done"}]
    )
    original = Step.set_pgid
    calls = [0]

    def set_pgid(self: Step, pgid: int) -> float:
        deadline = original(self, pgid)
        calls[0] += 1
        return deadline - 3600 if calls[0] == 2 else deadline  # the second command is late

    monkeypatch.setattr(Step, "set_pgid", set_pgid)
    started = cli_inproc(
        "start", "t", "--model", model, "--shell", "allow", "--run-id", "p", "--db", store_url
    )
    assert started.code == 6, started.stderr
    assert "not started" in started.stderr
    assert (workspace / "ledger").read_text().split() == ["first"]
