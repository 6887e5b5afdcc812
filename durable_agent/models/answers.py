"""A chat-completions response body -> `ModelTurn`, whatever a compatible server sent.

The body is read here rather than by the openai SDK's models: servers vary, and a shape
the SDK does not expect must end as a usable answer or a classified failure, never as an
AttributeError halfway through a paid call ("unexpected ... (this may be a bug)").

A response that holds no answer raises `ProviderError`:

    body                                       kind        reason
    cut off inside its JSON, or empty          retryable   truncated_response
    {"error": {...}} (with HTTP 200)           by its status / type: server_error or
                                               rate_limit retryable, else permanent api_error
    an SSE stream, HTML, other non-JSON text   permanent   invalid_response
    no `choices`, `choices: []`, no message    permanent   invalid_response

An answer that is there but partly unusable is NOT a failure: it was paid for, and a retry
would buy another. A tool call without a name, with `function: null`, or with arguments
that are not an object becomes a call the tool layer rejects with an error observation
(see `ToolCall.from_wire`), and the raw message is kept in `ModelTurn.raw` for the step's
output. Arguments given as a JSON object are taken as the object.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, NoReturn

from durable_agent.messages import ModelTurn, ToolCall, Usage, canonical_json
from durable_agent.models.failures import Failure, FailureKind, ProviderError, failure_for_status
from durable_agent.models.usage import cached_prompt_tokens

__all__ = ["completion_turn", "parse_completion", "reasoning_of"]

RETRYABLE, PERMANENT = FailureKind.RETRYABLE, FailureKind.PERMANENT
SNIPPET = 300
"""Characters of an unusable body quoted in the failure: enough to recognise it."""
RAW_CAP = 20_000
"""Characters of a partly unusable message kept in the step's output."""

# Error types that say the provider, not the request, failed (OpenAI, Anthropic-style, vLLM).
_TRANSIENT_TYPES = frozenset(
    {
        "server_error",
        "internal_error",
        "internal_server_error",
        "overloaded",
        "overloaded_error",
        "service_unavailable",
        "timeout",
        "api_error",
    }
)
_RATE_TYPES = frozenset(
    {"rate_limit_exceeded", "rate_limit_error", "rate_limit", "requests", "tokens"}
)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # only then can json.loads make one
_SURROGATE = re.compile("[\ud800-\udfff]")

Scrub = Callable[[str], str]
# A finish_reason is a word ("stop", "length", "tool_calls", "content_filter"); anything else
# (a provider echoing text, even the key it was sent) is dropped, not stored.
_WORD = re.compile(r"[A-Za-z_]{1,40}")
# The most tokens one request can be said to use: steps count them in 32-bit columns (and no
# window comes near it). A count past it is no count: the step estimates it.
MAX_TOKENS = 2**31 - 1


def parse_completion(body: bytes, content_type: str, scrub: Scrub) -> ModelTurn:
    """The answer in a 2xx response body; raises `ProviderError` when there is none."""
    text = body.decode("utf-8", errors="replace")
    return completion_turn(_json(text, content_type.lower(), scrub), text, scrub)


def completion_turn(data: Any, text: str, scrub: Scrub) -> ModelTurn:
    """The answer in a decoded chat.completion object (`text`: its JSON, for messages). A
    streamed answer is assembled into this shape first (streaming.py), so both are read
    by this one function and recorded alike."""
    if not isinstance(data, dict):
        _fail(
            PERMANENT,
            "invalid_response",
            f"the response is JSON but not an object: {_snippet(text, scrub)}",
        )
    if data.get("error") not in (None, "", {}) and not data.get("choices"):
        raise ProviderError(_error_body(data["error"], data, scrub))
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        what = "an empty `choices` list" if choices == [] else "no `choices`"
        _fail(PERMANENT, "invalid_response", f"the response has {what}: {_snippet(text, scrub)}")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        if isinstance(choice, dict) and "text" in choice:
            detail = "it answered like the legacy completions API (`choices[0].text`); use the chat endpoint"
        else:
            detail = f"`choices[0]` has no message: {_snippet(text, scrub)}"
        _fail(PERMANENT, "invalid_response", detail)
    content, calls, problems = _message(message)
    raw = None
    if problems:
        raw = json.dumps({"problems": problems, "message": message}, ensure_ascii=False)[:RAW_CAP]
    finish = choice.get("finish_reason")
    return ModelTurn(
        content=content,
        tool_calls=calls,
        usage=_usage(data.get("usage")),
        raw=raw,
        model=scrub(data["model"][:200]) if isinstance(data.get("model"), str) else None,
        finish_reason=scrub(finish)
        if isinstance(finish, str) and _WORD.fullmatch(finish)
        else None,
        reasoning=reasoning_of(message),
    )


REASONING_CAP = 256 * 1024
"""Characters of a provider's reasoning text kept in the step's output."""
REASONING_FIELDS = ("reasoning_content", "reasoning")
"""Where servers put it: DeepSeek, vLLM, llama.cpp (`reasoning_content`); OpenRouter,
Ollama, LM Studio (`reasoning`)."""


def reasoning_of(message: dict[str, Any]) -> str | None:
    """The message's reasoning text, cut at REASONING_CAP; None when it has none."""
    for name in REASONING_FIELDS:
        value = message.get(name)
        if isinstance(value, str) and value:
            return value if len(value) <= REASONING_CAP else value[:REASONING_CAP] + "…"
    return None


def _json(text: str, content_type: str, scrub: Scrub) -> Any:
    stripped = text.strip()
    try:
        data = json.loads(text)  # first: a JSON body under a wrong Content-Type is still read
    except (ValueError, RecursionError) as exc:
        if "text/event-stream" in content_type or stripped.startswith(("data:", "event:")):
            _fail(
                PERMANENT,
                "invalid_response",
                "the endpoint answered with a server-sent event "
                f"stream although none was requested: {_snippet(text, scrub)}",
            )
        if "html" in content_type or stripped.startswith("<"):
            title = _TITLE.search(text)
            shown = f"({scrub(title.group(1).strip())!r})" if title else _snippet(text, scrub)
            _fail(
                PERMANENT,
                "invalid_response",
                f"the endpoint answered with an HTML page, not JSON: {shown}",
            )
        if not stripped:
            _fail(RETRYABLE, "truncated_response", "the response body is empty")
        if stripped[0] in "{[" and _unfinished(stripped):
            _fail(
                RETRYABLE,
                "truncated_response",
                f"the response ends inside its JSON after "
                f"{len(text.encode())} bytes: ...{scrub(stripped[-80:])}",
            )
        _fail(
            PERMANENT,
            "invalid_response",
            f"the response is not JSON ({exc}): {_snippet(text, scrub)}",
        )
    return _without_lone_surrogates(data) if _SURROGATE_ESCAPE.search(text) else data


def _without_lone_surrogates(value: Any) -> Any:
    """Lone surrogates (a `\\ud800` escape without its pair) become U+FFFD: no UTF-8 store,
    request or file can carry them, and a paid answer must not make the run unresumable."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v) for k, v in value.items()}
    return value


def _unfinished(text: str) -> bool:
    """True when `text` ends inside a string or an open object/list: a cut-off document."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    return in_string or depth > 0


def _error_body(error: Any, data: dict[str, Any], scrub: Scrub) -> Failure:
    """An error reported inside a 200 response: classified like the HTTP error it stands for."""
    fields = error if isinstance(error, dict) else {}
    message = fields.get("message") if fields else error
    if not isinstance(message, str) or not message.strip():
        message = canonical_json(error)[:SNIPPET]
    message = scrub(message)
    code, kind = str(fields.get("code") or ""), str(fields.get("type") or "")
    for status in (fields.get("status"), fields.get("code"), data.get("status")):
        if isinstance(status, int) and not isinstance(status, bool) and 400 <= status < 600:
            return failure_for_status(status, message, code, kind)
    words = {code.lower(), kind.lower()}
    if words & _RATE_TYPES:
        return Failure(RETRYABLE, "rate_limit", message)
    if words & _TRANSIENT_TYPES:
        return Failure(RETRYABLE, "server_error", message)
    if "insufficient_quota" in words or "context" in f"{code} {kind}".lower():
        # The status rule knows these words; 400 stands for "the request, not the server".
        failure = failure_for_status(
            429 if "insufficient_quota" in words else 400, message, code, kind
        )
        return Failure(failure.kind, failure.reason, message)
    return Failure(PERMANENT, "api_error", message)


def _message(message: dict[str, Any]) -> tuple[str | None, tuple[ToolCall, ...], list[str]]:
    problems: list[str] = []
    content = message.get("content")
    if isinstance(content, list):  # content parts, as some servers answer
        texts = [p.get("text") if isinstance(p, dict) else p for p in content]
        content = "".join(t for t in texts if isinstance(t, str))
    elif content is not None and not isinstance(content, str):
        problems.append("`content` is not text")
        content = canonical_json(content)
    if content is None and isinstance(message.get("refusal"), str):
        content = message["refusal"]  # a refusal is the model's answer: show it, do not drop it
    wire = message.get("tool_calls")
    if wire is None and isinstance(message.get("function_call"), dict):
        wire = [{"function": message["function_call"]}]  # the pre-tools function-calling shape
    if wire is None:
        wire = []
    elif not isinstance(wire, list):
        problems.append("`tool_calls` is not a list")
        wire = [wire]
    calls = []
    for i, item in enumerate(wire):
        call, problem = ToolCall.from_wire(item)
        if problem is not None:
            problems.append(f"tool call {i}: {problem}")
        calls.append(call)
    return content, tuple(calls), problems


def _usage(usage: Any) -> Usage:
    def count(name: str) -> int | None:
        value = usage.get(name, 0)
        good = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS
        return value if good else None

    if not isinstance(usage, dict) or not ({"prompt_tokens", "completion_tokens"} & usage.keys()):
        return Usage(reported=False)  # the step estimates it: budgets must keep working
    prompt, completion = count("prompt_tokens"), count("completion_tokens")
    # Nothing, or a count that is no count (negative, a float, past MAX_TOKENS, which the
    # step's row cannot hold): estimated, so the answer is still recorded once.
    if prompt is None or completion is None or prompt == completion == 0:
        return Usage(reported=False)
    cached = cached_prompt_tokens(usage, prompt)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)


def _snippet(text: str, scrub: Scrub) -> str:
    flat = " ".join(text.split())
    return scrub(flat[:SNIPPET] + ("…" if len(flat) > SNIPPET else "")) or "(empty)"


def _fail(kind: FailureKind, reason: str, message: str) -> NoReturn:
    raise ProviderError(Failure(kind, reason, message))
