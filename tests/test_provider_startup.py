"""An offline (scripted) run never imports `openai`: ~0.4 s saved on every such start.

openai's exceptions are mapped where they arise, in `models/openai_chat.py`; the retry
layer (`models/retry.py`, `models/failures.py`) never imports openai.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.MULTILINE)


def test_a_scripted_run_does_not_import_openai(
    cli: Callable[..., Any], write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    model = write_script(
        [{"tool_calls": [{"name": "list_files", "arguments": {}}]}, {"content": "done"}]
    )
    result = cli(
        "start",
        "look around",
        "--model",
        model,
        "--json",
        extra_env={"PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert result.code == 0, result.stderr
    modules = set(IMPORTED.findall(result.stderr))
    assert "durable_agent.loop.runner" in modules  # guard the check: the profile was captured
    assert (
        "durable_agent.models.retry" in modules
    )  # the retry layer did run (its tenacity part only on a failure)
    assert not {m for m in modules if m == "openai" or m.startswith("openai.")}


def test_the_retry_layer_never_imports_openai_and_the_boundary_maps_its_errors() -> None:
    code = (
        "import sys\n"
        "from durable_agent.models.retry import call_with_retries, classify\n"
        "print(classify(TimeoutError('slow')).reason, 'openai' in sys.modules)\n"
        "import httpx, openai\n"
        "from durable_agent.models.openai_chat import map_exception\n"
        # openai >= 3.60 reads the request's headers in the constructor: give it one
        "request = httpx.Request('POST', 'http://127.0.0.1/v1/chat/completions')\n"
        "print(map_exception(openai.APITimeoutError(request=request)).reason)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["timeout False", "timeout"]


def test_store_only_commands_import_neither_the_settings_model_nor_other_dialects(
    cli: Callable[..., Any], write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    """`list`, `show` and the like answer in about the time it takes to import SQLAlchemy:
    no pydantic (config_layers.store_options), no PostgreSQL dialect for an SQLite store,
    no runner, no tenacity unless the store fails (scripts/bench.py measures the ratio)."""
    model = write_script([{"content": "done"}])
    assert cli("start", "t", "--model", model, "--run-id", "r1").code == 0
    for args in (("list",), ("show", "r1"), ("export", "r1")):
        result = cli(*args, extra_env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert result.code == 0, result.stderr
        modules = set(IMPORTED.findall(result.stderr))
        assert "durable_agent.cli.render" in modules  # guard the check: the profile was captured
        # list and show read an SQLite store with the standard library (store/sqlite_reads.py)
        assert ("sqlalchemy" in modules) == (args[0] == "export"), args
        heavy = {
            m
            for m in modules
            if m.split(".")[0] in ("pydantic", "tenacity", "alembic")
            or m.startswith("sqlalchemy.dialects.postgresql")
            or m == "durable_agent.loop.runner"
        }
        assert not heavy, (args, sorted(heavy))


def test_a_start_on_an_sqlite_store_imports_no_other_dialect_and_no_alembic(
    cli: Callable[..., Any], write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    """A `start` (snapshots included) on an SQLite store that is up to date: no PostgreSQL
    dialect (~40 ms), no Alembic (only when an upgrade is due), no tenacity (only after a
    failed call)."""
    model = write_script([{"content": "done"}])
    assert cli("start", "t", "--model", model, "--run-id", "r1").code == 0  # creates the store
    result = cli(
        "start",
        "t",
        "--model",
        write_script(
            [
                {
                    "tool_calls": [
                        {"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}}
                    ]
                },
                {"content": "done"},
            ]
        ),
        "--run-id",
        "r2",
        extra_env={"PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert result.code == 0, result.stderr
    modules = set(IMPORTED.findall(result.stderr))
    assert "durable_agent.workspace.snapshot" in modules  # guard: a snapshot was taken
    heavy = {
        m
        for m in modules
        if m.split(".")[0] in ("alembic", "tenacity")
        or m.startswith("sqlalchemy.dialects.postgresql")
    }
    assert not heavy, sorted(heavy)


def test_the_store_options_agree_with_the_settings_model() -> None:
    """store_settings.StoreOptions mirrors five fields of Settings: same defaults, same refusals."""
    import pytest

    from durable_agent.config.settings import Settings, load_settings
    from durable_agent.config.store import StoreOptions, store_options
    from durable_agent.errors import ConfigError

    fields = Settings.model_fields
    for name in ("durability", "store_retry_attempts", "store_retry_seconds", "lease_seconds"):
        assert getattr(StoreOptions("x"), name) == fields[name].default, name
    env = {}
    for flags in (
        {"durability": "fast"},
        {"store_retry_attempts": 1},
        {"store_retry_seconds": 0.5},
        {"durability": "fsync"},
        {"store_retry_attempts": 0},
        {"store_retry_attempts": 2.5},
        {"store_retry_seconds": 0},
        {"store_retry_seconds": float("nan")},
        {"store_retry_attempts": True},
        {"store_retry_attempts": "3"},
        {"durability": 1},
        {"lease_seconds": 2},
        {"lease_seconds": 0},
        {"lease_seconds": 2e9},
        {"lease_seconds": float("inf")},
        {"lease_seconds": "5"},
    ):
        try:
            full = load_settings({"db": "sqlite:///x.db", **flags}, env)
        except ConfigError:
            with pytest.raises(ConfigError):
                store_options({"db": "sqlite:///x.db", **flags}, env)
            continue
        light = store_options({"db": "sqlite:///x.db", **flags}, env)
        assert (
            light.db,
            light.durability,
            light.store_retry_attempts,
            light.store_retry_seconds,
            light.lease_seconds,
        ) == (
            full.db,
            full.durability,
            full.store_retry_attempts,
            full.store_retry_seconds,
            full.lease_seconds,
        ), flags
