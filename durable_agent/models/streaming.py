"""A streamed chat completion (`stream: true`, server-sent events) assembled into the object a
non-streamed call answers, so both are read by `answers.completion_turn` and recorded alike.

Each `data:` event is a `chat.completion.chunk`; the pieces are put together as OpenAI's own
SDK does (`ChatCompletionStreamState`), with the habits of compatible servers allowed for:

    delta.content / delta.refusal           text, concatenated
    delta.reasoning_content / reasoning     thinking, concatenated (kept apart from the text)
    delta.tool_calls[i]                     by `index`: the first `id` wins, the name is set
                                            once (a server repeating it whole is not doubled),
                                            `arguments` concatenated; an index taken by a
                                            call of another id, given with a name (Ollama sends
                                            every call at 0), starts a new call; no `index`: a
                                            new `id` starts a new call, none continues the last
    choices[0].finish_reason                the last one given
    usage (a last chunk with `choices: []`) stream_options.include_usage
    {"error": {...}}                        a failure, classified as an error body is
    data: [DONE]                            the end

A stream that ends (the connection closed) before `[DONE]` and before any finish_reason is
cut: a retryable `truncated_response`, like a JSON body cut short. Each piece of text and
each tool call's name is handed to `on_delta` as it arrives (the live timeline); nothing of
it is stored until the whole answer is (the step's outcome).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from durable_agent.models.answers import _error_body, _without_lone_surrogates
from durable_agent.models.failures import Failure, FailureKind, ProviderError
from durable_agent.observer import DeltaKind

__all__ = ["Assembler", "Delta", "OnDelta", "listener", "listening"]

Scrub = Callable[[str], str]


class Delta:
    """One live piece of the answer (a tool call's name comes once)."""

    __slots__ = ("kind", "text")

    def __init__(self, kind: DeltaKind, text: str) -> None:
        self.kind, self.text = kind, text

    def __repr__(self) -> str:
        return f"Delta({self.kind!r}, {self.text!r})"


OnDelta = Callable[[Delta], None]

_LISTENER: ContextVar[OnDelta | None] = ContextVar("durable_agent_on_delta", default=None)


@contextmanager
def listening(on_delta: OnDelta) -> Iterator[None]:
    """Model calls made in this block hand their live pieces to `on_delta` (the model step
    sets it: the client's signature, `complete(messages, tools, turn)`, stays as it is). A
    DeltaKind.START opens each try: a retry's text replaces the failed one's."""
    token = _LISTENER.set(on_delta)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def listener() -> OnDelta | None:
    return _LISTENER.get()


class Assembler:
    """Fed the decoded body as it arrives (`feed`), then `finish()` gives the completion."""

    def __init__(self, scrub: Scrub, on_delta: OnDelta | None = None) -> None:
        self.scrub, self.on_delta = scrub, on_delta
        self._pending = b""
        self._data: list[str] = []
        self.done = False
        self.events = 0
        self._id: Any = None
        self._model: Any = None
        self._content: list[str] | None = None
        self._refusal: list[str] | None = None
        self._reasoning: list[str] = []
        self._reasoning_field = "reasoning_content"
        self._calls: list[dict[str, Any]] = []
        self._by_index: dict[Any, dict[str, Any]] = {}
        self._finish: Any = None
        self._usage: Any = None
        self._role: Any = "assistant"

    # -- the event stream -----------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """More of the body: every complete line is read now (a partial one waits)."""
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            self._line(line.rstrip(b"\r").decode("utf-8", errors="replace"))

    def _line(self, line: str) -> None:
        if self.done:
            return
        if not line:  # the blank line that ends an event
            if self._data:
                data, self._data = "\n".join(self._data), []
                self._event(data)
            return
        if line.startswith(":"):
            return  # a comment: servers send them to keep the connection open
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)

    def _event(self, data: str) -> None:
        self.events += 1
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):
            raise ProviderError(
                Failure(
                    FailureKind.PERMANENT,
                    "invalid_response",
                    self.scrub(f"a streamed event is not JSON: {data[:300]}"),
                )
            ) from None
        if not isinstance(chunk, dict):
            return
        if chunk.get("error") not in (None, "", {}) and not chunk.get("choices"):
            raise ProviderError(_error_body(chunk["error"], chunk, self.scrub))
        self._id = self._id or chunk.get("id")
        self._model = self._model or chunk.get("model")
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):  # a server sending whole messages as events
            delta = choice.get("message")
        self._delta(delta if isinstance(delta, dict) else {})

    def _delta(self, delta: dict[str, Any]) -> None:
        if isinstance(delta.get("role"), str):
            self._role = delta["role"]
        content = delta.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
        if isinstance(content, str):
            self._content = [*(self._content or []), content]
            if content:
                self._emit(DeltaKind.TEXT, content)
        if isinstance(delta.get("refusal"), str):
            self._refusal = [*(self._refusal or []), delta["refusal"]]
            self._emit(DeltaKind.TEXT, delta["refusal"])
        for name in ("reasoning_content", "reasoning"):
            piece = delta.get(name)
            if isinstance(piece, str) and piece:
                self._reasoning_field = name
                self._reasoning.append(piece)
                self._emit(DeltaKind.REASONING, piece)
                break
        calls = delta.get("tool_calls")
        if calls is None and isinstance(delta.get("function_call"), dict):
            calls = [{"index": 0, "function": delta["function_call"]}]
        if isinstance(calls, list):
            for piece in calls:
                if isinstance(piece, dict):
                    self._call(piece)

    def _call(self, piece: dict[str, Any]) -> None:
        index = piece.get("index")
        new_id = piece.get("id") if isinstance(piece.get("id"), str) and piece["id"] else None
        call = self._by_index.get(index) if index is not None else None
        fn = piece.get("function")
        named = isinstance(fn, dict) and isinstance(fn.get("name"), str) and bool(fn["name"])
        if call is not None and named and new_id is not None and call["id"] not in (None, new_id):
            # Another id and a name at an index already taken: the next call of a parallel
            # batch that a server streams all at index 0 (Ollama), not more of the first one.
            # (An id alone, a server's fresh id on every piece, continues the call.)
            call = None
        if index is None:  # no index: a new id starts a call, none continues the last one
            last = self._calls[-1] if self._calls else None
            if last is not None and (new_id is None or new_id == last.get("id")):
                call = last
        if call is None:
            call = {"id": None, "type": "function", "function": {"name": None, "arguments": ""}}
            self._calls.append(call)
            if index is not None:
                self._by_index[index] = call
        if new_id is not None and not call["id"]:
            call["id"] = new_id
        if isinstance(piece.get("type"), str):
            call["type"] = piece["type"]
        fn = piece.get("function")
        if not isinstance(fn, dict):
            return
        name = fn.get("name")
        if isinstance(name, str) and name:
            had = call["function"]["name"]
            if had is None:
                call["function"]["name"] = name
                self._emit(DeltaKind.TOOL, name)
            elif name != had:  # the name in pieces (a server repeating it whole is not doubled)
                call["function"]["name"] = had + name
        args = fn.get("arguments")
        if isinstance(args, str):
            call["function"]["arguments"] += args
        elif isinstance(args, dict):  # given whole, as an object
            call["function"]["arguments"] = args

    def _emit(self, kind: DeltaKind, text: str) -> None:
        if self.on_delta is not None:
            self.on_delta(Delta(kind, text))

    # -- the end --------------------------------------------------------------------------
    def finish(self) -> dict[str, Any]:
        """The completion object, as a non-streamed call would have answered it."""
        if self._pending.strip():
            self._line(self._pending.rstrip(b"\r").decode("utf-8", errors="replace"))
        if self._data and not self.done:
            data, self._data = "\n".join(self._data), []
            self._event(data)
        if not self.done and self._finish is None:
            raise ProviderError(
                Failure(
                    FailureKind.RETRYABLE,
                    "truncated_response",
                    f"the stream ended before its end ([DONE] or a finish_reason) after "
                    f"{self.events} events",
                )
            )
        content = None if self._content is None else "".join(self._content)
        if self._calls and not content:
            content = None  # `"content": ""` beside tool calls: a non-streamed answer has null
        message: dict[str, Any] = {"role": self._role, "content": content}
        if self._refusal is not None:
            message["refusal"] = "".join(self._refusal)
        if self._reasoning:
            message[self._reasoning_field] = "".join(self._reasoning)
        if self._calls:
            message["tool_calls"] = self._calls
        completion: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion",
            "model": self._model,
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish}],
        }
        if self._usage is not None:
            completion["usage"] = self._usage
        # A surrogate pair split over two events is whole again now; a lone one is not.
        fixed: dict[str, Any] = _without_lone_surrogates(completion)
        return fixed
