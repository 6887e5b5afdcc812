"""Live tokens: model calls streamed through the real openai client from tests/fake_openai.py
(server-sent events), recorded exactly as an unstreamed call records the same answer.

The server splits each answer into `chat.completion.chunk`s (text and thinking in pieces, a
tool call's arguments across chunks, usage in a last chunk of its own); faults cut a stream
in the middle, stall it, or hold it until the test releases it, so a test can look at the
CLI's stderr while the rest of the answer is still on the server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI
from provider_support import KEY, MODEL, Endpoint
from scale_helpers import wait_for

from durable_agent import live
from durable_agent.messages import Message
from durable_agent.models.failures import ProviderError
from durable_agent.models.openai_chat import OpenAIChatModel
from durable_agent.models.streaming import Assembler, Delta, listening
from durable_agent.store.location import store_key

SCRIPT: list[dict[str, Any]] = [
    {
        "reasoning": "The notes file should say what to do.",
        "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
    },
    {"content": "Hello streaming world: the notes say to remember the milk."},
]

STEP_COLUMNS = (
    "seq, kind, state, idempotency_key, call_id, tool_name, input, output, error, attempts, "
    "prompt_tokens, completion_tokens, turn, effect"
)
MESSAGE_COLUMNS = "seq, role, content, tool_calls, tool_call_id, step_seq"


@pytest.fixture
def make_api(
    cli: Callable[..., Any], env: dict[str, str], workspace: Path, tmp_path: Path
) -> Iterator[Callable[..., Endpoint]]:
    servers: list[FakeOpenAI] = []
    (workspace / "notes.txt").write_text("remember the milk\n")

    def make(streaming: str = "sse", script: list[dict[str, Any]] | None = None) -> Endpoint:
        server = FakeOpenAI(script=script or SCRIPT, streaming=streaming).start()
        servers.append(server)
        return Endpoint(cli, server, env, workspace, tmp_path / f"config{len(servers)}.toml")

    yield make
    for server in servers:
        server.stop()


def recorded(sql: Callable[..., list[Any]], run_id: str) -> tuple[list[Any], list[Any]]:
    """The run's step rows and messages rows, as stored (the JSON columns as their text)."""
    steps = sql(f"SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ? ORDER BY seq", run_id)
    messages = sql(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE run_id = ? ORDER BY seq", run_id)
    return steps, messages


def model_outputs(sql: Callable[..., list[Any]], run_id: str) -> list[dict[str, Any]]:
    rows = sql("SELECT output FROM steps WHERE run_id = ? AND kind = 'model' ORDER BY seq", run_id)
    return [json.loads(r[0]) for r in rows]


# --- the record ---------------------------------------------------------------------------


@pytest.mark.slow  # two runs of the real CLI
def test_the_same_rows_on_each_store(make_api: Callable[..., Endpoint], store_url: str) -> None:
    """SQLite and PostgreSQL alike: a streamed run's steps and messages, as the store reads
    them back, are those of an unstreamed run of the same answers."""
    from ui_support import open_store

    for run_id, stream in (("s", True), ("p", False)):
        api = make_api("sse")
        api.configure(stream=stream)
        flags = [*api.model_flags(), "--run-id", run_id, "--json"]
        env = {**api.cli_env(), "DURABLE_AGENT_DB": store_url}
        result = api.cli("start", "fix the bug", *flags, extra_env=env)
        assert result.code == 0, result.stderr
    store = open_store(store_url)
    fields = STEP_COLUMNS.replace(" ", "").split(",")

    def rows(run_id: str) -> tuple[list[Any], list[Any]]:
        steps = [tuple(getattr(s, f) for f in fields) for s in store.steps(run_id)]
        messages = [
            (m.seq, m.role, m.content, m.tool_calls, m.tool_call_id) for m in store.messages(run_id)
        ]
        return steps, messages

    assert rows("s") == rows("p") and len(rows("s")[0]) == 3


@pytest.mark.slow  # two runs of the real CLI: about 3 s on 2 cores
def test_a_streamed_run_is_recorded_byte_for_byte_as_an_unstreamed_one(
    make_api: Callable[..., Endpoint], sql: Callable[..., list[Any]]
) -> None:
    streamed = make_api("sse")
    result = streamed.start("--run-id", "streamed", "--json")
    assert result.code == 0, result.stderr
    plain = make_api("sse")
    plain.configure(stream=False)
    result = plain.start("--run-id", "plain", "--json")
    assert result.code == 0, result.stderr

    asked = [r["body"] for r in streamed.server.requests]
    assert [(b.get("stream"), b.get("stream_options")) for b in asked] == [
        (True, {"include_usage": True})
    ] * 2
    assert all("stream" not in r["body"] for r in plain.server.requests)
    assert recorded(sql, "streamed") == recorded(sql, "plain")
    first, last = model_outputs(sql, "streamed")
    # usage came in the stream's last chunk; the arguments were split over several chunks
    assert first["usage"] == {
        "prompt_tokens": streamed.server.requests[0]["prompt_tokens"],
        "completion_tokens": 5,
    }
    assert first["tool_calls"][0]["function"] == {
        "name": "read_file",
        "arguments": '{"path": "notes.txt"}',
    }
    assert first["reasoning"] == SCRIPT[0]["reasoning"]  # kept in the step's output ...
    second_request = json.dumps(asked[1]["messages"])
    assert "notes file should say" not in second_request  # ... and never sent back
    assert last["content"] == SCRIPT[1]["content"]
    assert last["finish_reason"] == "stop"


def test_a_stream_cut_in_the_middle_is_retried_and_recorded_once(
    make_api: Callable[..., Endpoint], sql: Callable[..., list[Any]]
) -> None:
    api = make_api("sse")
    api.server.add_faults([{"turn": 1, "attempt": 1, "cut_stream": 4}])
    result = api.start("--run-id", "cut", "--json")
    assert result.code == 0, result.stderr
    assert [(t, a) for t, a, _ in api.turns()] == [(0, 1), (1, 1), (1, 2)]
    rows = sql(
        "SELECT attempts, error, state FROM steps WHERE run_id = 'cut' AND turn = 1 AND kind = 'model'"
    )
    assert rows == [(2, None, "completed")]
    assert model_outputs(sql, "cut")[1]["content"] == SCRIPT[1]["content"]


def test_a_stream_that_stalls_past_the_read_timeout_is_retried(
    make_api: Callable[..., Endpoint], sql: Callable[..., list[Any]]
) -> None:
    api = make_api("sse")
    api.configure(request_timeout_s=1.0)
    api.server.add_faults([{"turn": 1, "attempt": 1, "hold": 3}])  # 3 events, then nothing
    result = api.start("--run-id", "stall")
    assert result.code == 0, result.stderr
    assert "attempt 1 failed: timeout" in result.stderr
    assert [(t, a) for t, a, _ in api.turns()] == [(0, 1), (1, 1), (1, 2)]
    rows = sql(
        "SELECT attempts, state FROM steps WHERE run_id = 'stall' AND turn = 1 AND kind = 'model'"
    )
    assert rows == [(2, "completed")]


@pytest.mark.parametrize("how", ["reject", "ignore"])
def test_an_endpoint_that_does_not_stream_is_asked_without_and_remembered(
    make_api: Callable[..., Endpoint], sql: Callable[..., list[Any]], env: dict[str, str], how: str
) -> None:
    api = make_api(how)
    result = api.start("--run-id", "first", "--json")
    assert result.code == 0, result.stderr
    streamed = [bool(r["body"].get("stream")) for r in api.server.requests]
    # reject: refused (400 naming stream_options), asked again at once without; ignore: a
    # whole JSON answer to a streamed request is the answer. Either way, asked once per process.
    assert streamed == ([True, False, False] if how == "reject" else [True, False])
    memo = Path(env["XDG_DATA_HOME"]) / "durable-agent" / "no-stream.json"
    assert f"{api.server.url} {MODEL}" in json.loads(memo.read_text())
    before = len(api.server.requests)
    result = api.start("--run-id", "second", "--json")
    assert result.code == 0, result.stderr
    assert [bool(r["body"].get("stream")) for r in api.server.requests[before:]] == [False, False]
    assert recorded(sql, "first")[1] == recorded(sql, "second")[1]
    rows = sql("SELECT attempts FROM steps WHERE run_id = 'first' AND kind = 'model'")
    assert rows == [(1,), (1,)]  # a refusal of streaming is no failed try


# --- live output --------------------------------------------------------------------------


class StderrReader:
    """Reads a child's stderr (or stdout) as it comes (a thread), so a test waits on what
    it says."""

    def __init__(self, proc: subprocess.Popen[str], stdout: bool = False) -> None:
        stream = proc.stdout if stdout else proc.stderr
        assert stream is not None
        self.fd, self.text, self.cond = stream.fileno(), "", threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            data = os.read(self.fd, 4096)
            with self.cond:
                if not data:
                    self.cond.notify_all()
                    return
                self.text += data.decode("utf-8", "replace")
                self.cond.notify_all()

    def wait_for(self, words: str, timeout: float = 20) -> str:
        with self.cond:
            assert self.cond.wait_for(lambda: words in self.text, timeout), self.text
            return self.text


def popen(api: Endpoint, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent", "start", "fix the bug", *api.model_flags(), *args],
        cwd=api.workspace,
        env={**api.env, **api.cli_env()},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc


@pytest.mark.slow  # over 2 s on 2 cores
def test_text_and_tool_names_appear_while_the_answer_is_still_coming(
    make_api: Callable[..., Endpoint], sql: Callable[..., list[Any]]
) -> None:
    api = make_api("sse")
    tool_held, text_held = threading.Event(), threading.Event()
    # turn 0: the role, 10 pieces of thinking, then the call's name; held before its arguments.
    # turn 1: the role and 4 pieces of text ("Hello streaming") ; held before the rest.
    api.server.add_faults(
        [
            {"turn": 0, "hold": 12, "release": tool_held},
            {"turn": 1, "hold": 5, "release": text_held},
        ]
    )
    proc = popen(api, "--run-id", "live")
    err = StderrReader(proc)
    try:
        seen = err.wait_for("\n  → read_file\n")
        assert "┆ The notes file should say what to do." in seen  # the thinking, marked
        assert proc.poll() is None and not sql(
            "SELECT 1 FROM steps WHERE kind = 'model' AND state = 'completed'"
        )
        tool_held.set()
        seen = err.wait_for("│ Hello streami")
        assert "remember the milk" not in seen.split("│ Hello streami")[-1]
        # the web view's side channel has the same text, written while the stream waits
        channel = live.channel_file(store_key(api.env["DURABLE_AGENT_DB"]), api.env, "live")
        wait_for(lambda: (live.read(channel) or {}).get("text") == "Hello streaming ")
        assert sql(
            "SELECT state FROM steps WHERE run_id = 'live' AND turn = 1 AND kind = 'model'"
        ) == [("started",)]
        text_held.set()
        assert proc.stdout is not None  # (not communicate(): the reader thread has stderr)
        out = proc.stdout.read()
        proc.wait(timeout=30)
        err.thread.join(timeout=10)
    finally:
        tool_held.set()
        text_held.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.text
    assert out.strip() == SCRIPT[1]["content"]
    assert "│ Hello streaming world: the notes say to remember the milk." in err.text
    assert not channel.exists()  # gone with the call: nothing of it is kept


@pytest.mark.slow  # a killed start, a resume and a baseline run
def test_a_crash_mid_stream_pays_the_call_again_exactly_once(
    make_api: Callable[..., Endpoint], sql: Callable[..., list[Any]]
) -> None:
    api = make_api("sse")
    held = threading.Event()
    api.server.add_faults([{"turn": 1, "attempt": 1, "hold": 5, "release": held}])
    proc = popen(api, "--run-id", "crash")
    err = StderrReader(proc)
    try:
        err.wait_for("│ Hello streami")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        held.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sql(
        "SELECT state FROM steps WHERE run_id = 'crash' AND kind = 'model' AND turn = 1"
    ) == [("started",)]
    result = api.resume("crash", "--jsonl")  # (resume prints the events live too)
    assert result.code == 0, result.stderr
    types = [json.loads(line)["type"] for line in result.stdout.splitlines()]
    assert "run_resumed" in types and types[-1] == "run_finished"
    assert [(t, a) for t, a, _ in api.turns()] == [(0, 1), (1, 1), (1, 2)]  # paid again once
    baseline = make_api("sse")
    baseline.configure(stream=False)
    assert baseline.start("--run-id", "whole", "--json").code == 0
    assert recorded(sql, "crash")[1] == recorded(sql, "whole")[1]
    steps, whole = recorded(sql, "crash")[0], recorded(sql, "whole")[0]
    # the interrupted call counts both tries (column 9, attempts); all else is the same rows
    assert [r[:9] + r[10:] for r in steps] == [r[:9] + r[10:] for r in whole]
    assert [r[9] for r in steps] == [1, 1, 2] and [r[9] for r in whole] == [1, 1, 1]


# --- the assembly, one rule at a time -----------------------------------------------------


def feed(*events: Any, on_delta: Callable[[Delta], None] | None = None) -> dict[str, Any]:
    assembler = Assembler(lambda text: text, on_delta)
    body = "".join(
        f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events
    ).encode()
    for i in range(0, len(body), 7):  # in pieces that cut lines and events anywhere
        assembler.feed(body[i : i + 7])
    return assembler.finish()


def delta(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def test_tool_calls_without_an_index_and_names_sent_whole_each_time() -> None:
    done = feed(
        delta(
            {"tool_calls": [{"id": "a", "function": {"name": "read_file", "arguments": '{"pa'}}]}
        ),
        delta({"tool_calls": [{"function": {"name": "read_file", "arguments": 'th": "x"}'}}]}),
        delta({"tool_calls": [{"id": "b", "function": {"name": "list_files", "arguments": "{}"}}]}),
        delta({}, "tool_calls"),
        "[DONE]",
    )
    calls = done["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("a", "read_file", '{"path": "x"}'),
        ("b", "list_files", "{}"),
    ]


def test_an_error_event_is_a_classified_failure_and_a_stream_without_end_is_cut() -> None:
    with pytest.raises(ProviderError) as raised:
        feed(delta({"content": "Hi"}), {"error": {"message": "overloaded", "type": "server_error"}})
    assert raised.value.failure.retryable and raised.value.failure.reason == "server_error"
    with pytest.raises(ProviderError) as cut:
        feed(delta({"content": "Hi"}))
    assert cut.value.failure.reason == "truncated_response" and cut.value.failure.retryable


def test_pieces_are_handed_over_as_they_are_read() -> None:
    pieces: list[Delta] = []
    done = feed(
        delta({"role": "assistant", "content": ""}),
        delta({"reasoning": "hm"}),
        delta({"content": "Hel"}),
        delta({"content": "lo"}, "stop"),
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
        "[DONE]",
        on_delta=pieces.append,
    )
    assert [(p.kind.value, p.text) for p in pieces] == [
        ("reasoning", "hm"),
        ("text", "Hel"),
        ("text", "lo"),
    ]
    message = done["choices"][0]["message"]
    assert (message["content"], message["reasoning"], done["usage"]["completion_tokens"]) == (
        "Hello",
        "hm",
        2,
    )


def test_the_client_hands_each_try_a_start(tmp_path: Path) -> None:
    with FakeOpenAI(script=[{"content": "Hi there"}], streaming="sse") as server:
        server.add_faults([{"cut_stream": 2}])
        model = OpenAIChatModel(
            "m", api_key=KEY, base_url=server.url, read_timeout=5, connect_timeout=5
        )
        pieces: list[Delta] = []
        with listening(pieces.append), pytest.raises(ProviderError):
            model.complete([Message("user", "hi")], [], 0)
        with listening(pieces.append):
            answer = model.complete([Message("user", "hi")], [], 0)
    assert answer.content == "Hi there"
    assert [p.kind.value for p in pieces].count("start") == 2
    assert model.streams  # a cut stream is no reason to stop streaming


@pytest.mark.slow  # over 2 s on 2 cores
def test_jsonl_prints_the_export_events_live(
    make_api: Callable[..., Endpoint], cli: Callable[..., Any]
) -> None:
    api = make_api("sse")
    held = threading.Event()
    api.server.add_faults([{"turn": 1, "hold": 3, "release": held}])
    proc = popen(api, "--run-id", "events", "--jsonl")
    out = StderrReader(proc, stdout=True)
    try:
        seen = out.wait_for('"type": "tool_completed"')  # while the last call is still held
        assert proc.poll() is None and '"run_finished"' not in seen
        held.set()
        proc.wait(timeout=30)
        out.thread.join(timeout=10)
    finally:
        held.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    exported = cli("export", "events")
    assert exported.code == 0, exported.stderr
    assert out.text == exported.stdout  # line for line what `export` prints afterwards
    first_call = json.loads(out.text.splitlines()[1])
    assert (first_call["type"], first_call["reasoning"]) == (
        "model_completed",
        SCRIPT[0]["reasoning"],
    )
    last = json.loads(out.text.splitlines()[-1])
    assert (last["type"], last["answer"]) == ("run_finished", SCRIPT[1]["content"])


def test_json_and_jsonl_together_are_a_usage_error(make_api: Callable[..., Endpoint]) -> None:
    result = make_api("sse").start("--json", "--jsonl")
    assert result.code == 2 and "not allowed with" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# --- the web view ---------------------------------------------------------------------------


def test_the_run_page_stream_sends_a_streaming_calls_tokens(
    cli: Callable[..., Any], env: dict[str, str], tmp_path: Path
) -> None:
    pytest.importorskip("starlette", reason="the `ui` extra is not installed")
    from starlette.testclient import TestClient
    from ui_support import open_store

    from durable_agent.observer import DeltaKind
    from durable_agent.store.location import store_key
    from durable_agent.ui.app import UiConfig, _Stream, build_app
    from durable_agent.ui.security import Access

    url = env["DURABLE_AGENT_DB"]
    queued = cli("start", "wait here", "--model", "demo", "--detach", "--run-id", "q")
    assert queued.code == 0, queued.stderr  # pending: its page's stream stays open
    where = live.channel_dir(store_key(url), env)
    # What a streaming call's process writes (model_step._live), found by the view's side
    # from its own spelling of the store's URL.
    store = open_store(url)
    assert where == live.channel_dir(
        store_key(store.engine.url.render_as_string(hide_password=False)), env
    )
    channel = live.Channel(where / "q.json", 3, 1)
    channel.add(DeltaKind.START, "")
    channel.add(DeltaKind.REASONING, "thinking <b>")
    channel.add(DeltaKind.TOOL, "read_file")
    channel.add(DeltaKind.TEXT, "Hello")
    channel.add(DeltaKind.START, "")  # (start and tool names are written at once)
    channel.add(DeltaKind.TEXT, "Hello again")
    channel.add(DeltaKind.TOOL, "edit_file")
    channel.flush()  # (its thread does this within WRITE_EVERY_S)
    access = Access(token=None)
    cfg = UiConfig(
        store=store, access=access, user="t", poll_s=0.05, stream_max_s=0.5, live_dir=where
    )
    c = TestClient(build_app(cfg), base_url="http://127.0.0.1:8765")
    c.get(f"/?token={access.key}")
    body = c.get("/api/runs/q/events").text
    tokens = [
        json.loads(block.split("data: ", 1)[1])
        for block in body.split("\n\n")
        if block.startswith("event: tokens")
    ]
    assert tokens and tokens[0] == {
        "seq": 3,
        "turn": 1,
        "try": 2,
        "version": 7,
        "text": "Hello again",
        "reasoning": "",
        "tools": ["edit_file"],
    }
    assert len(tokens) == 1  # sent when it changes, not every look
    page = c.get("/runs/q").text
    assert 'id="live"' in page
    stream = _Stream(store, None, "q", 0, cfg)  # type: ignore[arg-type]
    assert stream.tokens() is not None and stream.tokens() is None
    channel.close()  # the call ended
    assert stream.tokens() == {"seq": None} and not (where / "q.json").exists()


# --- the timeline's rendering ----------------------------------------------------------------


def test_a_pipe_gets_each_piece_at_once_and_a_terminal_whole_lines_thinking_dimmed() -> None:
    import io

    from test_inspect_live import ERASE, FakeClock, Locked, model

    from durable_agent.cli.render import Timeline
    from durable_agent.observer import DeltaKind

    piped = io.StringIO()
    t = Timeline(piped)
    t.step(model("started"))
    t.delta(0, 0, DeltaKind.START, "")
    t.delta(0, 0, DeltaKind.REASONING, "hm\x1b[2J")  # the model's bytes: escaped, never obeyed
    t.delta(0, 0, DeltaKind.TEXT, "Hel")
    assert piped.getvalue() == "  ┆ hm\\x1b[2J\n  │ Hel"  # no line end yet: written as it came
    t.delta(0, 0, DeltaKind.TEXT, "lo\nworld")
    t.delta(0, 0, DeltaKind.TOOL, "read_file")
    t.step(model("completed", detail="read_file", duration_ms=5))
    assert piped.getvalue() == (
        "  ┆ hm\\x1b[2J\n  │ Hello\n  │ world\n  → read_file\n"
        "Step 0 · model call 1 · m → read_file · 5 ms\n"
    )

    out = Locked()
    t = Timeline(out, live=True, interval=3600, clock=FakeClock())
    t.step(model("started"))
    t.delta(0, 0, DeltaKind.REASONING, "think\n")
    t.delta(0, 0, DeltaKind.TEXT, "Hello wor")
    assert out.text().endswith(ERASE + "| model m thinking 0.0 s · Hello wor")  # in the status line
    t.delta(0, 0, DeltaKind.TEXT, "ld\n")
    t.close()
    text = out.text()
    assert ERASE + "\x1b[2m  ┆ think\x1b[0m\n" in text and ERASE + "  │ Hello world\n" in text


@pytest.mark.parametrize(
    ("status", "message", "refused"),
    [
        (400, "Unrecognized request argument supplied: stream_options", True),
        (422, "stream: extra fields not permitted", True),
        (501, "Streaming is not supported by this backend", True),
        (400, "the upstream provider rejected the request", False),  # not about streaming
        (503, "streaming is not supported", False),  # a server failing: retried as it is
        (400, "maximum context length exceeded while streaming", False),  # context_length
    ],
)
def test_only_a_refusal_of_streaming_turns_it_off(status: int, message: str, refused: bool) -> None:
    from durable_agent.models.failures import failure_for_status
    from durable_agent.models.openai_chat import refuses_streaming

    assert refuses_streaming(failure_for_status(status, message)) is refused


def test_parallel_calls_streamed_all_at_index_0_stay_apart(
    cli: Any, env: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    """Ollama (and gateways in front of Gemini) stream each call of a parallel batch at
    `index` 0, each with its own id: two calls, not one named twice with its arguments glued
    together (`{"path": "a.txt", ...}{"path": "b.txt", ...}`, an observation of bad JSON)."""
    two = {
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "a.txt", "content": "A"}},
            {"name": "write_file", "arguments": {"path": "b.txt", "content": "B"}},
        ]
    }
    server = FakeOpenAI(script=[two, {"content": "done"}], streaming="sse").start()
    try:
        server.add_faults([{"turn": 0, "same_index": True}])
        api = Endpoint(cli, server, env, workspace, tmp_path / "config.toml")
        r = api.start("--run-id", "p", "--json", "-y")
        assert r.code == 0, r.stderr
    finally:
        server.stop()
    assert (workspace / "a.txt").read_text() == "A"
    assert (workspace / "b.txt").read_text() == "B"
    db = Path(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    [(calls,)] = _query(db, "SELECT tool_calls FROM messages WHERE tool_calls IS NOT NULL")
    assert [c["id"] for c in json.loads(calls)] == ["call_0_0", "call_0_1"]


def test_a_fresh_id_on_every_piece_of_one_call_is_still_one_call() -> None:
    done = feed(
        delta({"tool_calls": [{"index": 0, "id": "x1", "function": {"name": "read_file"}}]}),
        delta({"tool_calls": [{"index": 0, "id": "x2", "function": {"arguments": '{"pa'}}]}),
        delta({"tool_calls": [{"index": 0, "id": "x3", "function": {"arguments": 'th": "a"}'}}]}),
        delta({}, "tool_calls"),
        "[DONE]",
    )
    calls = done["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("x1", "read_file", '{"path": "a"}')
    ]


def _query(db: Path, sql: str) -> list[Any]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()
