"""OpenTelemetry traces and metrics: one trace per run, whole across crashes and resumes.

With the SDK's in-memory exporter (in process), and with a real OTLP/HTTP receiver on
127.0.0.1 decoding the protobuf (the run killed with SIGKILL twice, then finished by a
worker). Off, or without the extra, nothing of opentelemetry is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "a\n"}}]},
    {"tool_calls": [{"name": "list_files", "arguments": {}}]},
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
    {"content": "done"},
]


def _imported_otel(argv: list[str], cwd: Path, env: dict[str, str], before: str = "") -> list[str]:
    out = cwd / "modules.json"
    program = (
        "import atexit, json, sys\n"
        f"{before}\n"
        "def report():\n"
        "    names = sorted(m for m, mod in list(sys.modules.items())\n"
        "                   if m.startswith('opentelemetry') and mod is not None)\n"
        f"    open({str(out)!r}, 'w').write(json.dumps(names))\n"
        "atexit.register(report)\n"
        "from durable_agent.cli.parser import main\n"
        f"sys.argv = ['durable-agent', *{argv!r}]\n"
        "sys.exit(main())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names: list[str] = json.loads(out.read_text())
    return names


@pytest.mark.slow
def test_off_or_without_the_extra_nothing_of_opentelemetry_is_imported(
    env: dict[str, str], workspace: Path, write_script: Callable[..., str]
) -> None:
    script = write_script([{"content": "done"}])
    argv = ["start", "t", "--model", script, "--quiet"]
    assert _imported_otel(argv, workspace, env) == []  # off
    # On, but the extra is absent (its import fails): the run goes on, untraced.
    absent = "import sys\nsys.modules['opentelemetry'] = None\n"
    on = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert _imported_otel(argv, workspace, on, before=absent) == []
    # And the checker sees an import when there is one.
    assert _imported_otel(argv, workspace, env, before="import opentelemetry.trace") != []


@pytest.fixture
def memory() -> Iterator[tuple[Any, Any]]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from durable_agent.loop import telemetry

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    provider = TracerProvider(id_generator=telemetry._ids())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = (telemetry._Process.tracer, telemetry._Process.meter, telemetry._Process.instruments)
    telemetry.install(provider, MeterProvider(metric_readers=[reader]))
    yield exporter, reader
    telemetry._Process.tracer, telemetry._Process.meter, telemetry._Process.instruments = saved


def _config(tmp_path: Path, **otel: Any) -> str:
    path = tmp_path / "otel.toml"
    path.write_text("[otel]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in otel.items()))
    return str(path)


def test_in_memory_spans_attributes_and_metrics(
    memory: tuple[Any, Any],
    env: dict[str, str],
    cli_inproc: Callable[..., Any],
    write_script: Callable[..., str],
    tmp_path: Path,
    sql: Callable[..., list[Any]],
) -> None:
    exporter, reader = memory
    env["DURABLE_AGENT_CONFIG"] = _config(tmp_path, enabled=True)
    r = cli_inproc("start", "t", "--model", write_script(SCRIPT), "--json", "--run-id", "mem")
    assert r.code == 0, r.stderr
    spans = exporter.get_finished_spans()
    ((trace_id,),) = sql("SELECT trace_id FROM runs")
    assert {format(s.context.trace_id, "032x") for s in spans} == {trace_id}
    names = [s.name for s in spans]
    assert names.count("invoke_agent") == 1
    assert names.count("chat " + write_script.__name__) == 0  # (the model is the script's path)
    chats = [s for s in spans if s.name.startswith("chat ")]
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert len(chats) == 4 and {t.name for t in tools} == {
        "execute_tool write_file",
        "execute_tool list_files",
        "execute_tool read_file",
    }
    (session,) = [s for s in spans if s.name == "invoke_agent"]
    assert session.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert session.attributes["gen_ai.conversation.id"] == "mem"
    for s in chats + tools:
        assert s.parent.span_id == session.context.span_id
    chat = chats[0].attributes
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.provider.name"] == "openai"
    assert chat["gen_ai.usage.input_tokens"] > 0 and chat["gen_ai.usage.output_tokens"] > 0
    assert chat["durable_agent.step.attempt"] == 1 and chat["durable_agent.step.resumed"] is False
    keys = {k for (k,) in sql("SELECT idempotency_key FROM steps")}
    assert {s.attributes["durable_agent.step.idempotency_key"] for s in chats + tools} == keys
    tool = [t for t in tools if t.name.endswith("write_file")][0].attributes
    assert tool["gen_ai.tool.name"] == "write_file" and tool["gen_ai.tool.call.id"]
    assert "gen_ai.input.messages" not in chat and "gen_ai.tool.call.arguments" not in tool
    metrics = {
        m.name
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert {
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "durable_agent.steps",
    } <= metrics


def test_content_is_exported_only_when_asked_and_redacted_as_stored(
    memory: tuple[Any, Any],
    env: dict[str, str],
    cli_inproc: Callable[..., Any],
    write_script: Callable[..., str],
    tmp_path: Path,
) -> None:
    exporter, _ = memory
    env["DURABLE_AGENT_CONFIG"] = _config(tmp_path, enabled=True, capture_content=True)
    env["OPENAI_API_KEY"] = key = "sk-test-telemetry-0123456789abcdefghij"
    r = cli_inproc("start", f"use the key {key}", "--model", write_script(SCRIPT), "--quiet")
    assert r.code == 0, r.stderr
    spans = exporter.get_finished_spans()
    chat = [s for s in spans if s.name.startswith("chat ")][0].attributes
    assert (
        "use the key" in chat["gen_ai.input.messages"] and key not in chat["gen_ai.input.messages"]
    )
    sent = json.loads(chat["gen_ai.input.messages"])  # messages, not their Python spelling
    assert [m["role"] for m in sent] == ["system", "user"]
    assert sent[1]["content"] == "use the key [REDACTED:OPENAI_API_KEY]"
    (answer,) = json.loads(chat["gen_ai.output.messages"])
    assert (
        answer["role"] == "assistant"
        and answer["tool_calls"][0]["function"]["name"] == "write_file"
    )
    tool = [s for s in spans if s.name == "execute_tool write_file"][0].attributes
    assert "a.txt" in tool["gen_ai.tool.call.arguments"]
    assert all(key not in json.dumps(dict(s.attributes)) for s in spans)


@pytest.mark.slow
def test_killed_twice_then_finished_by_a_worker_is_one_trace_over_otlp(
    cli: Callable[..., Any],
    env: dict[str, str],
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
) -> None:
    from otlp_receiver import OtlpReceiver, attrs

    receiver = OtlpReceiver()
    try:
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_METRIC_EXPORT_INTERVAL": "500"}
        script = write_script(SCRIPT)
        # Killed just after the intent of the first model call, then, resumed, just after
        # the intent of the second (the list_files read rides in that commit): each time a
        # step is cut off between its intent and its outcome.
        first = cli(
            "start",
            "t",
            "--model",
            script,
            "--run-id",
            "k",
            extra_env={**otel, "DURABLE_AGENT_CRASH_AFTER": "4"},
        )
        assert first.code == -9, first.stderr
        second = cli("resume", "k", extra_env={**otel, "DURABLE_AGENT_CRASH_AFTER": "10"})
        assert second.code == -9, second.stderr
        done = cli("worker", "--once", "--poll", "0.05", extra_env=otel)
        assert done.code == 0, done.stderr
        assert sql("SELECT status FROM runs") == [("completed",)]
    finally:
        receiver.close()
    spans = receiver.spans
    ((trace_id,),) = sql("SELECT trace_id FROM runs")
    assert {s.trace_id.hex() for s in spans} == {trace_id}  # one trace, whole
    sessions = sorted(
        (s for s in spans if s.name == "invoke_agent"),
        key=lambda s: attrs(s)["durable_agent.session.epoch"],
    )
    assert [attrs(s)["durable_agent.session.epoch"] for s in sessions] == [1, 2, 3]
    assert [bool(attrs(s).get("durable_agent.session.died")) for s in sessions] == [
        True,
        True,
        False,
    ]
    assert len({s.span_id for s in sessions}) == 3
    assert [len(s.links) for s in sessions] == [0, 1, 1]
    for before, after in zip(sessions, sessions[1:], strict=False):  # each links the one it follows
        assert after.links[0].span_id == before.span_id
        assert before.start_time_unix_nano <= after.start_time_unix_nano
    session_ids = {s.span_id for s in sessions}
    steps = [s for s in spans if s.name.startswith(("chat ", "execute_tool "))]
    assert all(s.parent_span_id in session_ids for s in steps)
    # Every attempt of every durable step is one span: the cut-off ones and the paid-again.
    for key, attempts, effect in sql("SELECT idempotency_key, attempts, effect FROM steps"):
        mine = sorted(
            attrs(s)["durable_agent.step.attempt"]
            for s in steps
            if attrs(s)["durable_agent.step.idempotency_key"] == key
        )
        if effect == "read":  # a read lost to a crash is simply run again (no intent row)
            assert mine and set(mine) == {1}, (key, mine)
        else:
            assert mine == list(range(1, attempts + 1)), (key, mine, attempts)
    again = [s for s in steps if attrs(s)["durable_agent.step.attempt"] == 2]
    assert len(again) == 2 and all(attrs(s)["durable_agent.step.resumed"] for s in again)
    interrupted = [s for s in steps if attrs(s).get("durable_agent.step.interrupted")]
    assert len(interrupted) == 2
    chat = [
        s
        for s in steps
        if s.name.startswith("chat ") and not attrs(s).get("durable_agent.step.interrupted")
    ][0]
    a = attrs(chat)
    assert a["gen_ai.conversation.id"] == "k" and a["gen_ai.usage.input_tokens"] > 0
    assert "gen_ai.client.token.usage" in receiver.metric_names


def test_an_approval_wait_is_a_span_in_the_session_that_acts_on_it(
    memory: tuple[Any, Any],
    env: dict[str, str],
    cli_inproc: Callable[..., Any],
    write_script: Callable[..., str],
    tmp_path: Path,
) -> None:
    from ui_support import BLOCKED_SCRIPT

    exporter, _ = memory
    env["DURABLE_AGENT_CONFIG"] = _config(tmp_path, enabled=True)
    blocked = cli_inproc("start", "t", "--model", write_script(BLOCKED_SCRIPT), "--run-id", "w")
    assert blocked.code == 5, blocked.stderr
    assert cli_inproc("approve", "w", "--by", "dora").code == 0
    assert cli_inproc("resume", "w", "--quiet").code == 0
    spans = exporter.get_finished_spans()
    (wait,) = [s for s in spans if s.name.startswith("approval_wait")]
    assert wait.name == "approval_wait run_command"
    assert wait.attributes["durable_agent.approval.decision"] == "approved"
    assert wait.attributes["durable_agent.approval.decided_by"] == "dora"
    sessions = [s for s in spans if s.name == "invoke_agent"]
    assert len(sessions) == 2 and wait.parent.span_id == sessions[1].context.span_id
    assert sessions[1].links[0].context.span_id == sessions[0].context.span_id
    assert wait.start_time < wait.end_time <= sessions[1].start_time


@pytest.mark.slow  # about 5 s: waits out the exporter's timeout
def test_a_collector_that_trickles_its_answer_does_not_hold_the_run(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    sql: Callable[..., list[Any]],
) -> None:
    # Spans are exported as each ends, in the run's thread; the exporter's timeout is per
    # read, and this collector sends a byte of its answer every 0.2 s, without end.
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    posts: list[str] = []

    class Trickle(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            posts.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"\0")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass  # the exporter hung up

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        }
        result = cli("start", "t", "--model", write_script(SCRIPT), extra_env=otel, timeout=90)
        assert result.code == 0, result.stderr
        assert sql("SELECT status FROM runs") == [("completed",)]
        assert posts  # it was asked
    finally:
        server.shutdown()
        server.server_close()
