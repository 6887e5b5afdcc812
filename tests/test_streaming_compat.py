"""Live tokens against streaming servers we did not write, each run as its own process on
127.0.0.1: fakellm and llm-mock-api (PyPI, mock OpenAI-compatible servers on FastAPI).

Their streams are not ours: ids of their own, fakellm's tool-call arguments in pieces and no
usage in its stream (it ignores stream_options, so a streamed step's usage is the harness's
estimate), llm-mock-api's usage in a last chunk that still has a choice. The answer, the
tool call and what the history holds must be the same as the same server's unstreamed
answers.
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

pytestmark = pytest.mark.slow  # two servers and two CLI runs a test: seconds

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


MOCK_RULES = """\
{
  rules: [
    {
      when: "notes",
      replies: [
        { reply: { tools: [{ name: "read_file", args: { path: "notes.txt" } }] } },
        { reply: { text: "The notes say: remember the milk. Done." } },
      ],
    },
  ],
}
"""


def servers(tmp_path: Path, command: Callable[[int], list[str]]) -> Iterator[Callable[[], str]]:
    """A fresh server per call (they keep a conversation's state per process)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> str:
        url, proc = _serve(tmp_path, command)
        procs.append(proc)
        return url

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def fakellm(tmp_path: Path) -> Iterator[Callable[[], str]]:
    pytest.importorskip("fakellm", reason="fakellm (a dev extra) is not installed")
    (tmp_path / "fakellm.yaml").write_text(RULES)
    serve = [sys.executable, "-m", "fakellm.cli", "serve", "--config", "fakellm.yaml"]
    yield from servers(tmp_path, lambda port: [*serve, "--port", str(port)])


@pytest.fixture
def llm_mock_api(tmp_path: Path) -> Iterator[Callable[[], str]]:
    pytest.importorskip("llm_mock_api", reason="llm-mock-api (a dev extra) is not installed")
    (tmp_path / "rules.json5").write_text(MOCK_RULES)
    launcher = "import sys; from llm_mock_api.cli import main; sys.exit(main())"
    serve = [sys.executable, "-c", launcher, "start", "-H", "127.0.0.1", "-r", "rules.json5"]
    quiet = ["-l", "0", "-c", "5", "--log-level", "error"]  # no delay, 5 characters a chunk
    yield from servers(tmp_path, lambda port: [*serve, *quiet, "-p", str(port)])


def _serve(
    tmp_path: Path, command: Callable[[int], list[str]]
) -> tuple[str, subprocess.Popen[bytes]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        command(port), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )

    def up() -> bool:
        assert proc.poll() is None, "the server exited"
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(up, 30, "the server listening")
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


def test_llm_mock_api_streams_and_the_run_records_what_an_unstreamed_one_does(
    llm_mock_api: Callable[[], str],
    cli: Callable[..., Any],
    workspace: Path,
    tmp_path: Path,
    sql: Callable[..., list[Any]],
) -> None:
    (workspace / "notes.txt").write_text("remember the milk\n")
    streamed = run(cli, tmp_path, llm_mock_api(), "streamed")
    assert streamed.code == 0, streamed.stderr
    assert "\n  → read_file\n" in streamed.stderr
    assert "│ The notes say: remember the milk. Done." in streamed.stderr
    plain = run(cli, tmp_path, llm_mock_api(), "plain", stream=False)
    assert plain.code == 0, plain.stderr

    def recorded(run_id: str) -> list[Any]:
        rows = sql(
            "SELECT output, prompt_tokens, completion_tokens FROM steps"
            " WHERE run_id = ? AND kind = 'model' ORDER BY seq",
            run_id,
        )
        out = []
        for output, prompt, completion in rows:
            doc = json.loads(output)
            for call in doc["tool_calls"]:
                call.pop("id")  # its own random ids
            out.append((doc, prompt, completion))
        return out

    assert recorded("streamed") == recorded("plain")  # usage from its last chunk included
    assert [r[1:] for r in recorded("streamed")] == [(10, 5), (10, 5)]
