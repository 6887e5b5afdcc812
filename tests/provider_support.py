"""Helpers for the provider tests: the real CLI pointed at tests/fake_openai.py.

`Endpoint` bundles a running `FakeOpenAI`, a TOML config file (tiny retry waits, so no
test sleeps through a backoff) and the `cli` fixture, and adds the flags and environment
a user would pass: `--base-url`, `--model`, `OPENAI_API_KEY`, `DURABLE_AGENT_CONFIG`.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from fake_openai import FakeOpenAI

KEY = "sk-test-provider-0123456789abcdef"
MODEL = "fake-model"

# Waits small enough that a test never notices them, large enough to be real sleeps.
FAST_RETRIES: dict[str, Any] = {
    "retry_initial_wait_s": 0.01,
    "retry_max_wait_s": 0.05,
    "retry_after_cap_s": 0.05,
    "retry_max_attempts": 6,
    "request_timeout_s": 10.0,
    "connect_timeout_s": 5.0,
}


def toml_value(value: Any) -> str:
    """Enough TOML for a config file: numbers, strings, booleans and (nested) inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
        )
    raise TypeError(f"no TOML for {value!r}")


@dataclass
class Endpoint:
    cli: Callable[..., Any]
    server: FakeOpenAI
    env: dict[str, str]
    workspace: Path
    config_path: Path
    settings: dict[str, Any] = field(default_factory=lambda: dict(FAST_RETRIES))

    def configure(self, **settings: Any) -> None:
        """Set config-file settings for the next CLI runs (on top of FAST_RETRIES)."""
        self.settings.update(settings)

    def cli_env(self) -> dict[str, str]:
        lines = [f"{key} = {toml_value(value)}" for key, value in self.settings.items()]
        self.config_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return {"OPENAI_API_KEY": KEY, "DURABLE_AGENT_CONFIG": str(self.config_path)}

    def start(self, *args: str, task: str = "fix the bug") -> Any:
        return self.cli("start", task, *self.model_flags(), *args, extra_env=self.cli_env())

    def resume(self, run_id: str, *args: str) -> Any:
        return self.cli("resume", run_id, *args, extra_env=self.cli_env())

    def model_flags(self) -> list[str]:
        return ["--base-url", self.server.url, "--model", MODEL]

    def popen(self, *args: str, task: str = "fix the bug") -> subprocess.Popen[str]:
        """`start` in a child process this test can kill."""
        return subprocess.Popen(
            [sys.executable, "-m", "durable_agent", "start", task, *self.model_flags(), *args],
            cwd=self.workspace,
            env={**self.env, **self.cli_env()},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    # --- what the server saw -------------------------------------------------------------

    def turns(self) -> list[tuple[int, int, int | None]]:
        """(turn, attempt, injected status or None) of every request, in order."""
        return [
            (r["turn"], r["attempt"], (r["fault"] or {}).get("status"))
            for r in self.server.requests
        ]

    def answered(self) -> dict[int, int]:
        """How many times each turn got a normal answer (no fault at all)."""
        counts: dict[int, int] = {}
        for r in self.server.requests:
            if not r["fault"]:
                counts[r["turn"]] = counts.get(r["turn"], 0) + 1
        return counts


def http_library() -> ModuleType:
    """The HTTP library the installed openai client uses: httpx2 (openai 3.x) or httpx.

    The tests name its classes through this, so they run on every supported openai.
    """
    import openai

    client = openai.OpenAI(api_key="sk-unused", base_url="http://127.0.0.1:9/v1")
    # openai wraps the library's Client in a subclass of its own: take the library's base.
    roots = (cls.__module__.partition(".")[0] for cls in type(client._client).__mro__)
    return importlib.import_module(next(r for r in roots if r.startswith("httpx")))


def database_bytes(db_path: Path) -> bytes:
    """The SQLite file and its WAL and shared-memory files: everything the store wrote."""
    return b"".join(p.read_bytes() for p in sorted(db_path.parent.glob(db_path.name + "*")))


@contextmanager
def serve(
    cli: Callable[..., Any],
    env: dict[str, str],
    workspace: Path,
    tmp_path: Path,
    script: list[dict[str, Any]],
) -> Iterator[Endpoint]:
    """A fake endpoint serving `script`, with the workspace's notes file the scripts read."""
    (workspace / "notes.txt").write_text("remember the milk\n")
    with FakeOpenAI(script=script) as server:
        yield Endpoint(cli, server, env, workspace, tmp_path / "config.toml")
