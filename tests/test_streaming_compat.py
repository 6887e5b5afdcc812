"""Live tokens against a streaming server we did not write: fakellm (PyPI, a mock
OpenAI-compatible server on FastAPI), run as its own process on 127.0.0.1.

Its streams are not ours: ids of its own, the tool call's arguments in pieces, no usage
in the stream (it ignores stream_options), so the usage of a streamed step is the
harness's estimate. The answer, the tool call and what the history holds must be the same
as the same server's unstreamed answers.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from provider_support import FAST_RETRIES, KEY, toml_value
from scale_helpers import wait_for

pytest.importorskip("fakellm", reason="fakellm (a dev extra) is not installed")
pytestmark = pytest.mark.slow  # two servers and two CLI runs: seconds

RULES = """\
rules:
  - name: answer
    when:
      tool_result_contains: "remember the milk"
    respond:
      content: "The notes say: remember the milk. Done."
  - name: read
    respond:
      tool_calls:
        - name: read_file
          arguments: {path: notes.txt}
"""


@pytest.fixture
def fakellm(tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A fresh fakellm per call (it keeps a conversation's state per process)."""
    (tmp_path / "fakellm.yaml").write_text(RULES)
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> str:
        url, proc = _serve(tmp_path)
        procs.append(proc)
        return url

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def _serve(tmp_path: Path) -> tuple[str, subprocess.Popen[bytes]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fakellm.cli",
            "serve",
            "--port",
            str(port),
            "--config",
            "fakellm.yaml",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def up() -> bool:
        assert proc.poll() is None, "fakellm exited"
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(up, 30, "fakellm listening")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return f"http://127.0.0.1:{port}/v1", proc


def run(cli: Callable[..., Any], tmp_path: Path, url: str, run_id: str, **settings: Any) -> Any:
    config = tmp_path / f"{run_id}.toml"
    config.write_text(
        "".join(f"{k} = {toml_value(v)}\n" for k, v in {**FAST_RETRIES, **settings}.items())
    )
    env = {"OPENAI_API_KEY": KEY, "DURABLE_AGENT_CONFIG": str(config)}
    return cli(
        "start",
        "read the notes",
        "--base-url",
        url,
        "--model",
        "gpt-4o",
        "--run-id",
        run_id,
        extra_env=env,
    )


def test_fakellm_streams_and_the_run_records_what_an_unstreamed_one_does(
    fakellm: str,
    cli: Callable[..., Any],
    workspace: Path,
    tmp_path: Path,
    sql: Callable[..., list[Any]],
) -> None:
    (workspace / "notes.txt").write_text("remember the milk\n")
    streamed = run(cli, tmp_path, fakellm(), "streamed")
    assert streamed.code == 0, streamed.stderr
    assert "\n  → read_file\n" in streamed.stderr  # the name, as it streamed in
    assert "│ The notes say: remember the milk. Done." in streamed.stderr
    assert streamed.stdout.strip() == "The notes say: remember the milk. Done."
    plain = run(cli, tmp_path, fakellm(), "plain", stream=False)
    assert plain.code == 0, plain.stderr
    assert "│ " not in plain.stderr

    def history(run_id: str) -> list[Any]:
        rows = sql(
            "SELECT role, content, tool_calls FROM messages WHERE run_id = ? ORDER BY seq", run_id
        )
        return [
            (
                role,
                content,
                [
                    (c["function"]["name"], c["function"]["arguments"])
                    for c in json.loads(calls or "[]")
                ],
            )
            for role, content, calls in rows
        ]

    assert history("streamed") == history("plain")
    outputs = [
        json.loads(o)
        for (o,) in sql(
            "SELECT output FROM steps WHERE run_id = 'streamed' AND kind = 'model' ORDER BY seq"
        )
    ]
    assert [o.get("finish_reason") for o in outputs] == ["tool_calls", "stop"]
    assert all(o["usage"].get("estimated") for o in outputs)  # no usage in its stream
