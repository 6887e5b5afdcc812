"""A small OpenAI-compatible chat-completions server for tests (stdlib only).

In-process, as a context manager:

    with FakeOpenAI(script=[{"content": "done"}], faults=[{"status": 503}]) as server:
        client = openai.OpenAI(base_url=server.url, api_key="sk-test", max_retries=0)
        client.chat.completions.create(model="m", messages=[...])  # -> openai.InternalServerError
        client.chat.completions.create(model="m", messages=[...])  # -> "done"
        assert [r["attempt"] for r in server.requests] == [1, 2]

As a separate process, so a crash test can kill the client while the server lives on
(`spawn_fake_openai` below does this and waits for the port):

    python tests/fake_openai.py --port-file PORT --script S.json [--faults F.json] [--log L.jsonl]

It writes its port to PORT once it listens and serves until SIGTERM/SIGINT.

Endpoints: `POST /v1/chat/completions` and `POST /chat/completions`; `server.url` is the
base URL ending in `/v1`. Azure OpenAI's deployment path
`POST /openai/deployments/NAME/chat/completions?api-version=V` is served too (the log
keeps the query). Anything else is a 404 with an OpenAI-style error body.

Turns. The script is the project's format: a JSON list whose items are
`{"content": "final answer"}` or `{"tool_calls": [{"name": "read_file", "arguments":
{"path": "a.txt"}}]}` (a string `arguments` is sent raw, so malformed JSON can be scripted).
The turn is decided FROM THE REQUEST: turn = the number of assistant messages already in
`messages` (0-based, so turn i is script[i]). A resumed client therefore gets the same
turn. Tool-call ids are `call_<turn>_<i>`. Past the end: content "script exhausted".
Usage: prompt_tokens = len(json.dumps(messages)) // 4, completion_tokens = 5
(`chars_per_token=N`, `--chars-per-token N`: // N instead, a tokenizer unlike the client's).
Turns survive compaction: tool-call ids carry their turn, so turn = max(the number of
assistant messages, 1 + the highest T of an assistant's `call_T_i`).

Window. `window=N` (`--window N`) enforces a context window: a request whose prompt_tokens
(counted as above) pass N gets HTTP 400 with code `context_length_exceeded`, as OpenAI sends.

Summaries. A request whose first message starts with "Summarize the conversation" (the
harness's compaction prompt) is answered with a summary text, not a script turn; its log
entry has `"kind": "summary"` (else "turn") and the fault selector `"kind"` picks it.

Faults. A list of dicts, each used at most `times` times (default 1). A request takes the
first fault, in list order, whose selectors all match; a fault without selectors matches
any request, so plain faults are consumed in order by the next requests. Selectors:
`"request": n` (1-based request number on this server), `"turn": t` (0-based),
`"attempt": a` (1-based count of requests for that turn, across client restarts).
Actions, combinable in this order:

    {"delay": 5.0}                              sleep, then go on (answer normally if nothing else)
    {"before": fn}                              in-process only: call fn() first, then go on (a
                                                test acting while a model call is under way)
    {"drop": true}                              close the socket without a response
    {"status": 429, "headers": {"Retry-After": "2"}, "body": {"error": {...}}}
                                                an error response; body defaults to an
                                                OpenAI-style error, a string body is sent raw
    e.g. {"turn": 2, "attempt": 1, "status": 503}   first attempt of turn 2 gets a 503
    {"message": {...}}                          the normal answer, with this raw assistant
                                                message in choices[0] (odd provider shapes)
    {"content_type": "text/html"}               with "status": the Content-Type sent
    {"encode": "gzip"}                          with "status": the body compressed so ("gzip",
                                                "deflate", "raw-deflate": deflate without the
                                                zlib header, which some servers send)
    {"truncate": n}                             send only the first n bytes of the body,
                                                without Content-Length, then close
    {"short_body": n}                           declare the full Content-Length, send only
                                                the first n bytes, then close (cut mid-body)
    {"trickle": s}                              the normal answer (or with "status", the error
                                                body), a byte every s seconds
    {"stall": "headers", "every": s}            a status line, then a header line every s
                                                seconds, never the end of the headers
    {"stall": "hints", "every": s}              a `103 Early Hints` every s seconds, forever
    {"stall": "deflate", "every": s}            200, Content-Encoding: deflate, chunked, then an
                                                empty deflate block every s seconds (decodes
                                                to nothing), forever
    {"gzip_bomb": n}                            200 (or "status"), Content-Encoding: gzip, n MiB
                                                of spaces (a few KiB on the wire)
    {"headers": {...}}                          without "status": sent with the normal answer
                                                (e.g. a Content-Encoding the body does not have)
    {"finish_reason": "length"}                 the normal answer with this finish_reason
    {"no_usage": true}                          the normal answer without a `usage` field
    {"same_index": true}                        streamed: every tool-call piece at `index` 0
                                                (Ollama streams parallel calls so), ids kept
    {"usage": {...}}                            the normal answer with this `usage` (odd counts)

Log. Every request is appended to `server.requests` (and, with `log_path`, to a JSONL
file, flushed per line) as `{"request", "turn", "attempt", "kind", "path", "query", "headers"
(lower-case names, Authorization included), "body", "fault", "prompt_tokens", "hashes"}`;
`hashes` has one sha256 (of the message's canonical JSON) per message, for prefix checks.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Json = dict[str, Any]
_SELECTORS = ("request", "turn", "attempt", "kind")
SUMMARY_MARK = "Summarize the conversation"
_CALL_TURN = re.compile(r"^call_(\d+)_\d+$")


def prompt_tokens(messages: list[Json], chars_per_token: int = 4) -> int:
    """The server's count of a request: the documented rule, JSON length // 4."""
    return len(json.dumps(messages)) // chars_per_token


def message_hash(message: Json) -> str:
    return hashlib.sha256(json.dumps(message, sort_keys=True).encode()).hexdigest()[:16]


def request_turn(messages: list[Json]) -> int:
    assistants = [m for m in messages if m.get("role") == "assistant"]
    turns = [
        int(found.group(1)) + 1
        for m in assistants
        for c in m.get("tool_calls") or []
        if (found := _CALL_TURN.match(str(c.get("id"))))
    ]
    return max([len(assistants), *turns])


def is_summary(messages: list[Json]) -> bool:
    return bool(messages) and str(messages[0].get("content") or "").startswith(SUMMARY_MARK)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a handler stuck in a delay must not block shutdown
    fake: FakeOpenAI

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out or get dropped close their end; that is the point of the
        # faults, not an error worth a traceback on stderr.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class FakeOpenAI:
    """The server. `start()`/`stop()` or use it as a context manager."""

    def __init__(
        self,
        script: list[Json] | None = None,
        faults: list[Json] | None = None,
        *,
        log_path: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        window: int | None = None,
        chars_per_token: int = 4,
        streaming: str = "ignore",
    ) -> None:
        self.script: list[Json] = list(script or [])
        self.streaming = streaming
        self.window = window
        self.chars_per_token = chars_per_token
        self.requests: list[Json] = []
        self._faults: list[Json] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._log_path = Path(log_path) if log_path is not None else None
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.fake = self
        self._thread: threading.Thread | None = None
        self.add_faults(faults or [])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def add_faults(self, faults: list[Json]) -> None:
        with self._lock:
            for fault in faults:
                self._faults.append({"times": 1, **fault})

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def start(self) -> FakeOpenAI:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        # A short poll makes stop() quick: shutdown() waits for the loop's next poll.
        self._httpd.serve_forever(poll_interval=0.05)

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers sleeping in a delay fault
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- used by the handler ---------------------------------------------------------------

    def _record(self, path: str, headers: dict[str, str], body: Json, query: str = "") -> Json:
        messages = body.get("messages") or []
        kind = "summary" if is_summary(messages) else "turn"
        turn = request_turn(messages) if kind == "turn" else -1
        with self._lock:
            number = len(self.requests) + 1
            attempt = 1 + sum(1 for r in self.requests if r["turn"] == turn)
            fault = self._take_fault(
                {"request": number, "turn": turn, "attempt": attempt, "kind": kind}
            )
            entry = {
                "at": time.monotonic(),  # arrival, for rate checks (tests/test_rate_limits.py)
                "request": number,
                "turn": turn,
                "attempt": attempt,
                "kind": kind,
                "prompt_tokens": prompt_tokens(messages, self.chars_per_token),
                "hashes": [message_hash(m) for m in messages],
                "path": path,
                "query": query,
                "headers": headers,
                "body": body,
                "fault": fault,
            }
            self.requests.append(entry)
            if self._log_path is not None:
                with self._log_path.open("a", encoding="utf-8") as log:
                    log.write(json.dumps(entry) + "\n")
        return entry

    def _take_fault(self, where: dict[str, int]) -> Json | None:
        for fault in self._faults:
            if fault["times"] > 0 and all(
                fault[key] == where[key] for key in _SELECTORS if key in fault
            ):
                fault["times"] -= 1
                return {k: v for k, v in fault.items() if k != "times"}
        return None

    def _completion(self, turn: int, body: Json) -> Json:
        if turn < 0:  # a summary request
            text = str((body.get("messages") or [{}])[-1].get("content") or "")
            calls = sorted(set(re.findall(r"\[(call_\d+_\d+)\]", text)))
            step: Json = {
                "content": f"Task: as given. Files read so far: {len(calls)} "
                f"(calls {', '.join(calls[:3])}...). Next steps: go on reading."
            }
        else:
            step = self.script[turn] if turn < len(self.script) else {"content": "script exhausted"}
        tool_calls = [
            {
                "id": f"call_{turn}_{i}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": call["arguments"]
                    if isinstance(call.get("arguments"), str)
                    else json.dumps(call.get("arguments") or {}),
                },
            }
            for i, call in enumerate(step.get("tool_calls") or [])
        ]
        message: Json = {"role": "assistant", "content": step.get("content"), "refusal": None}
        if step.get("reasoning"):
            message["reasoning_content"] = step["reasoning"]
        if tool_calls:
            message["tool_calls"] = tool_calls
        prompt = prompt_tokens(body.get("messages") or [], self.chars_per_token)
        return {
            "id": f"chatcmpl-fake-{turn}-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or "fake-model",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if tool_calls else "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": 5,
                "total_tokens": prompt + 5,
            },
        }


def stream_chunks(completion: Json, include_usage: bool, piece: int = 4) -> list[Json]:
    """A completion as the `chat.completion.chunk`s OpenAI streams it: the role first, the
    text and the thinking in pieces of `piece` characters, each tool call's id and name,
    then its arguments in pieces split across chunks, the finish_reason in a chunk of its
    own, and the usage in a last chunk with no choices (when asked for)."""
    choice, head = (
        completion["choices"][0],
        {
            "id": completion["id"],
            "object": "chat.completion.chunk",
            "created": completion["created"],
            "model": completion["model"],
        },
    )
    message = choice["message"]

    def chunk(delta: Json, finish: str | None = None) -> Json:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": None if message.get("tool_calls") else ""})]
    reasoning = message.get("reasoning_content") or ""
    for i in range(0, len(reasoning), piece):
        out.append(chunk({"reasoning_content": reasoning[i : i + piece]}))
    content = message.get("content") or ""
    for i in range(0, len(content), piece):
        out.append(chunk({"content": content[i : i + piece]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        first = {"index": index, "id": call["id"], "type": "function"}
        out.append(
            chunk({"tool_calls": [{**first, "function": {"name": fn["name"], "arguments": ""}}]})
        )
        args = fn["arguments"]
        for i in range(0, len(args), piece + 1):
            out.append(
                chunk(
                    {
                        "tool_calls": [
                            {"index": index, "function": {"arguments": args[i : i + piece + 1]}}
                        ]
                    }
                )
            )
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage and "usage" in completion:
        out.append({**head, "choices": [], "usage": completion["usage"]})
    return out


def _error_body(status: int, message: str) -> Json:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the real API
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log is the record; keep test output clean

    def do_POST(self) -> None:
        fake = self.server.fake
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path, _, query = self.path.partition("?")
        azure = path.startswith("/openai/deployments/") and path.endswith("/chat/completions")
        if path not in ("/v1/chat/completions", "/chat/completions") and not azure:
            self._send(404, _error_body(404, f"unknown path {path}"))
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, _error_body(400, "request body is not JSON"))
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        entry = fake._record(path, headers, body, query)
        fault = entry["fault"] or {}

        if callable(fault.get("before")):
            fault["before"]()
        if fault.get("delay"):
            fake._stopping.wait(float(fault["delay"]))
        if fault.get("drop"):
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if "gzip_bomb" in fault:
            packer, mib = (
                zlib.compressobj(9, zlib.DEFLATED, 31),
                b" " * (1 << 20),
            )  # (31: gzip framing)
            packed = b"".join(
                [*(packer.compress(mib) for _ in range(int(fault["gzip_bomb"]))), packer.flush()]
            )
            self.send_response(int(fault.get("status", 200)))
            for name, value in (
                ("Content-Type", "application/json"),
                ("Content-Encoding", "gzip"),
                ("Content-Length", str(len(packed))),
            ):
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(packed)
            return
        if "stall" in fault:
            self._stall(str(fault["stall"]), float(fault.get("every", 0.2)))
            return
        if body.get("stream") and fake.streaming == "reject" and "status" not in fault:
            message = "Unrecognized request argument supplied: stream_options (streaming is not supported)"
            self._send(400, _error_body(400, message))
            return
        if "status" in fault:
            status = int(fault["status"])
            default = _error_body(status, f"fake error {status}")
            self._send(
                status,
                fault.get("body", default),
                fault.get("headers") or {},
                content_type=fault.get("content_type"),
                truncate=fault.get("truncate"),
                trickle=fault.get("trickle"),
                encode=fault.get("encode"),
                short=fault.get("short_body"),
            )
            return
        if fake.window is not None and entry["prompt_tokens"] > fake.window:
            self._send(
                400,
                {
                    "error": {
                        "message": f"This model's maximum context length is {fake.window} tokens. However, your "
                        f"messages resulted in {entry['prompt_tokens']} tokens.",
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": "context_length_exceeded",
                    }
                },
            )
            return
        completion = fake._completion(entry["turn"], body)
        if "message" in fault:
            completion["choices"][0]["message"] = fault["message"]
        if "finish_reason" in fault:
            completion["choices"][0]["finish_reason"] = fault["finish_reason"]
        if fault.get("no_usage"):
            del completion["usage"]
        if "usage" in fault:
            completion["usage"] = fault["usage"]
        if body.get("stream") and fake.streaming == "sse":
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            chunks = stream_chunks(completion, include)
            if fault.get("same_index"):  # Ollama's habit: every parallel call at index 0
                for c in chunks:
                    for choice in c.get("choices") or []:
                        for piece in choice["delta"].get("tool_calls") or []:
                            piece["index"] = 0
            self._send_stream(chunks, fault)
            return
        self._send(
            200,
            completion,
            fault.get("headers") or {},
            truncate=fault.get("truncate"),
            short=fault.get("short_body"),
            trickle=fault.get("trickle"),
        )

    def _stall(self, how: str, every: float) -> None:
        """Bytes keep coming, every wait is short, the answer never does (see Faults)."""
        self.close_connection = True
        if how == "headers":
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        elif how == "deflate":
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Encoding: deflate\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
        n = 0
        with contextlib.suppress(OSError):
            while not self.server.fake._stopping.wait(every):
                n += 1
                if how == "headers":
                    self.wfile.write(f"X-Still-Thinking: {n}\r\n".encode())
                elif how == "hints":
                    self.wfile.write(
                        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
                    )
                else:  # (the zlib header first) an empty stored block: valid, decodes to nothing
                    block = (b"x\x9c" if n == 1 else b"") + b"\x00\x00\x00\xff\xff"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                self.wfile.flush()

    def _send_stream(self, chunks: list[Json], fault: Json) -> None:
        """Server-sent events, one HTTP chunk each, flushed: `cut_stream` n closes the
        connection after n events (no last chunk: the client sees the body cut), `hold`
        n waits after n events for `release` (a threading.Event, in-process) or for ever
        (a stall), then goes on."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
        fake = self.server.fake
        with contextlib.suppress(OSError):
            for n, event in enumerate(events):
                if n == fault.get("cut_stream"):
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if n == fault.get("hold"):
                    release = fault.get("release")
                    while not fake._stopping.is_set() and not (release and release.is_set()):
                        fake._stopping.wait(0.02)
                    if release is None:  # a stall: nothing more comes
                        self.close_connection = True
                        return
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    def do_GET(self) -> None:
        self._send(404, _error_body(404, f"unknown path {self.path}"))

    def _send(
        self,
        status: int,
        body: Any,
        headers: dict[str, str] | None = None,
        *,
        content_type: str | None = None,
        truncate: int | None = None,
        short: int | None = None,
        trickle: float | None = None,
        encode: str | None = None,
    ) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        if (
            encode is not None
        ):  # "gzip" | "deflate" (zlib) | "raw-deflate" (no zlib header, as some send it)
            packer = zlib.compressobj(
                9, zlib.DEFLATED, {"gzip": 31, "deflate": 15, "raw-deflate": -15}[encode]
            )
            data = packer.compress(data) + packer.flush()
            headers = {
                **(headers or {}),
                "Content-Encoding": "gzip" if encode == "gzip" else "deflate",
            }
        self.send_response(status)
        self.send_header("Content-Type", content_type or "application/json")
        if short is not None:
            # The length of the whole body is promised, a part is sent: the client knows it
            # was cut (a proxy or server dying mid-answer after the headers went out).
            self.send_header("Content-Length", str(len(data)))
            data = data[:short]
            self.send_header("Connection", "close")
            self.close_connection = True
        elif truncate is None:
            self.send_header("Content-Length", str(len(data)))
        else:
            # No length and no chunking: the body ends where the connection closes, so the
            # client cannot tell the cut from the end (a proxy dying mid-answer).
            data = data[:truncate]
            self.send_header("Connection", "close")
            self.close_connection = True
        for name, value in (headers or {}).items():
            self.send_header(name, str(value))
        self.end_headers()
        if trickle is None:
            self.wfile.write(data)
            return
        for i in range(
            len(data)
        ):  # each read gets a byte in time: only a deadline on the whole helps
            if self.server.fake._stopping.wait(trickle):  # type: ignore[attr-defined]
                return
            self.wfile.write(data[i : i + 1])
            self.wfile.flush()


# --- separate-process mode ----------------------------------------------------------------


def read_log(path: str | os.PathLike[str]) -> list[Json]:
    """The requests logged to a JSONL file so far."""
    log = Path(path)
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]


@dataclass
class FakeOpenAIProcess:
    """A fake server running in its own process; `requests()` reads its JSONL log."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    workdir: Path = field(repr=False)

    def requests(self) -> list[Json]:
        return read_log(self.log_path)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def spawn_fake_openai(
    workdir: str | os.PathLike[str],
    script: list[Json],
    faults: list[Json] | None = None,
    *,
    timeout: float = 10.0,
    window: int | None = None,
) -> Iterator[FakeOpenAIProcess]:
    """Run the fake in a child process (files go to `workdir`); stops it on exit."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    script_path, faults_path = work / "fake_script.json", work / "fake_faults.json"
    port_path, log_path = work / "fake_port", work / "fake_requests.jsonl"
    script_path.write_text(json.dumps(script), encoding="utf-8")
    faults_path.write_text(json.dumps(faults or []), encoding="utf-8")
    port_path.unlink(missing_ok=True)
    args = [sys.executable, __file__, "--port-file", str(port_path), "--script", str(script_path)]
    args += ["--faults", str(faults_path), "--log", str(log_path)]
    if window is not None:
        args += ["--window", str(window)]
    proc = subprocess.Popen(args)
    server = FakeOpenAIProcess(proc, "", log_path, work)
    try:
        deadline = time.monotonic() + timeout
        while not port_path.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fake OpenAI server did not start (exit {proc.poll()})")
            time.sleep(0.02)
        server.url = f"http://127.0.0.1:{int(port_path.read_text())}/v1"
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible server for tests.")
    parser.add_argument("--port-file", required=True, help="write the listening port here")
    parser.add_argument("--script", help="JSON list of turns")
    parser.add_argument("--faults", help="JSON list of faults")
    parser.add_argument("--log", help="append every request to this JSONL file")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--window", type=int, help="answer 400 context_length_exceeded above this many tokens"
    )
    parser.add_argument(
        "--chars-per-token", type=int, default=4, help="count a request as JSON length // N"
    )
    args = parser.parse_args(argv)

    def load(path: str | None) -> list[Json]:
        return json.loads(Path(path).read_text(encoding="utf-8")) if path else []

    server = FakeOpenAI(
        load(args.script),
        load(args.faults),
        log_path=args.log,
        port=args.port,
        window=args.window,
        chars_per_token=args.chars_per_token,
    )

    def on_signal(signum: int, frame: object) -> None:
        # shutdown() waits for serve_forever, which runs in this thread: call it from another.
        threading.Thread(target=server._httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Write then rename, so a reader polling for the file never sees it half written.
    port_file = Path(args.port_file)
    tmp = port_file.with_name(port_file.name + ".tmp")
    tmp.write_text(str(server.port), encoding="utf-8")
    tmp.replace(port_file)
    try:
        server.serve_forever()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
