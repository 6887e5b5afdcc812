"""Shared fixtures: a real SQLite file per test, a real temp workspace, the real CLI.

`cli(...)` runs the CLI in a subprocess (what users run; crash tests kill it);
`cli_inproc(...)` calls `main()` in this process (faster, for output and exit codes).
Both get an isolated environment: a fresh XDG data dir, no OPENAI_* variables.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))  # helper modules (fake_openai, scripts) import by name

import forked_cli  # noqa: E402

from durable_agent.tools.os_sandbox import Mechanism, resolve_sandbox  # noqa: E402

# A machine with neither bubblewrap nor Landlock: the CLI would refuse every run that can run
# commands, so the tests' runs go unconfined (said in the header) and the sandbox tests skip.
NO_SANDBOX = resolve_sandbox("workspace-write", False, os.environ).mechanism is Mechanism.NONE


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The long tests first, the short ones after to fill the cores up evenly: in file order
    # the four-minute fault sweep (test_store_faults.py) started late and ran alone at the
    # end while the other core idled. A stable sort, the same on every worker (xdist needs that).
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_report_header(config: pytest.Config) -> str | None:
    if NO_SANDBOX:
        return (
            "sandbox: neither bubblewrap nor Landlock works here; runs in tests use "
            "DURABLE_AGENT_SANDBOX=off and the sandbox tests are skipped"
        )
    return None


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DURABLE_AGENT_"))}
    if NO_SANDBOX:
        e["DURABLE_AGENT_SANDBOX"] = "off"
    e["XDG_DATA_HOME"] = str(tmp_path / "xdg-data")
    e["XDG_CONFIG_HOME"] = str(tmp_path / "xdg-config")
    e["DURABLE_AGENT_DB"] = f"sqlite:///{tmp_path / 'store.db'}"
    return e


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store on each backend: an SQLite file, and an empty PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    from scale_helpers import pg_schema

    with pg_schema() as url:
        yield url


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def write_script(tmp_path: Path) -> Callable[[list[dict[str, Any]]], str]:
    """Write a scripted-model JSON file; returns the `--model` value for it."""
    counter = iter(range(1_000_000))

    def make(turns: list[dict[str, Any]]) -> str:
        path = tmp_path / f"script{next(counter)}.json"
        path.write_text(json.dumps(turns))
        return f"scripted:{path}"

    return make


@pytest.fixture
def cli(env: dict[str, str], workspace: Path) -> Callable[..., Result]:
    def run(
        *args: str,
        extra_env: dict[str, str] | None = None,
        timeout: float = 120,
        cwd: Path | None = None,
    ) -> Result:
        proc = forked_cli.run(
            args, env={**env, **(extra_env or {})}, cwd=cwd or workspace, timeout=timeout
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def cli_inproc(
    env: dict[str, str],
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Callable[..., Result]:
    from durable_agent.cli.parser import main

    def run(*args: str) -> Result:
        for k in list(os.environ):
            if k.startswith(("OPENAI_", "DURABLE_AGENT_")):
                monkeypatch.delenv(k)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.chdir(workspace)
        capsys.readouterr()
        try:
            code = main(list(args))
        finally:
            # As the command's own process does at its end (collector.process_ends): its
            # stores' connections closed, not left to the collector (a worker of many
            # PostgreSQL tests held up to 90 of the server's 100 slots).
            from durable_agent.store.engine import dispose_all

            dispose_all()
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


@pytest.fixture
def sql(db_path: Path) -> Iterator[Callable[..., list[Any]]]:
    """Plain sqlite3 queries against the test's store, as a user would inspect it."""
    import sqlite3

    conns: list[sqlite3.Connection] = []

    def query(statement: str, *params: Any) -> list[Any]:
        if not conns:
            conns.append(sqlite3.connect(db_path))
        return conns[0].execute(statement, params).fetchall()

    yield query
    for c in conns:
        c.close()
