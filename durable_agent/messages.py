"""The conversation: messages, tool calls and model turns, and their canonical JSON.

Frozen msgspec Structs rather than pydantic models: they are built and hashed on every
step (the hot path) and the CLI imports them before it knows it needs pydantic.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from typing import Any

from msgspec import Struct, field


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, UTF-8 kept: equal values give equal text (fingerprints, hashes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# A reasoning block (`<think>…</think>`, `<reasoning>…`) is thinking: neither an action nor
# an answer. An unclosed block (the answer was cut inside it) runs to the end of the text.
REASONING_BLOCK = re.compile(r"<(think|thinking|reasoning)>.*?(?:</\1>|\Z)", re.S | re.I)


# What the model is told after an answer that is not final (model_step.py); an answer
# followed by CUT_NUDGE is continued by the next one (replay.py joins them).
CUT_NUDGE = (
    "Your answer was cut off: the response reached its length limit. Continue exactly "
    "where it stopped, without repeating what you already wrote."
)
EMPTY_NUDGE = (
    "Your answer was empty: no text and no tool call. Answer the task, or call a tool "
    "to make progress."
)


def without_reasoning(text: str) -> str:
    """The text with its reasoning blocks taken out: what is left is the answer."""
    return REASONING_BLOCK.sub("", text) if "<" in text else text


def sha256_text(text: str) -> str:
    # surrogatepass: a lone surrogate in a model's arguments (JSON "\ud800") must still give
    # a key, the same one on every resume; for any other text it changes nothing.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# The loop looks at a call's arguments about seven times while it runs the call. A small
# cache, not a field: a cached value on every ToolCall in the history would cost memory
# for the whole run.
@lru_cache(maxsize=16)
def _parse_object(arguments: str) -> dict[str, Any] | None:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError):  # nested deeper than Python recurses: not usable either
        return None
    return (
        value if isinstance(value, dict) and not _deeper_than(value, MAX_ARGUMENT_DEPTH) else None
    )


MAX_ARGUMENT_DEPTH = 100
"""Nesting a tool call's arguments may have. Deeper ones are refused where they come in:
stored as parsed values, every later reader (show, export, resume) would recurse on them."""


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests lists and objects more than `limit` deep (without recursing)."""
    level: list[Any] = [value]
    for _ in range(limit):
        level = [
            v
            for item in level
            if isinstance(item, (dict, list))
            for v in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return False
    return any(isinstance(item, (dict, list)) for item in level)


@lru_cache(maxsize=16)
def _canonical_arguments(arguments: str) -> str:
    value = _parse_object(arguments)
    return arguments if value is None else canonical_json(value)


UNNAMED_TOOL = "unnamed_tool_call"
"""The name given to a tool call that came without a usable one. No tool has it, so the
tool layer answers with an "unknown tool" error observation, and it is a valid function
name, so the history that carries it back to the provider is still accepted."""


def _kind(value: Any) -> str:
    """How a JSON value is described in a problem: `null`, `a number`, `"text"`..."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return "empty" if not value.strip() else "text"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return (
        "a list"
        if isinstance(value, list)
        else "an object"
        if isinstance(value, dict)
        else "not JSON"
    )


def _json_kind(value: Any) -> str:
    """What a parsed JSON value is, for "must be a JSON object, not ..." messages."""
    if isinstance(value, str):
        return "a string"
    return _kind(value)


class ToolCall(Struct, frozen=True):
    """One call the model asked for. `arguments` is the raw JSON text the model wrote."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as an object; raises ValueError when they are not a JSON object.

        Shared with other callers (see `_parse_object`): do not mutate the result.
        """
        value = _parse_object(self.arguments)
        if value is not None:
            return value
        too_deep = ValueError(f"arguments nest more than {MAX_ARGUMENT_DEPTH} levels deep")
        try:
            value = json.loads(
                self.arguments
            )  # raises the parser's own error when it is not JSON at all
        except RecursionError:
            raise too_deep from None
        if _deeper_than(value, MAX_ARGUMENT_DEPTH):
            raise too_deep
        # Valid JSON, but not an object ("[1,2]", "3", "\"x\""): say so, not "not valid JSON".
        raise ValueError(f"arguments must be a JSON object, not {_json_kind(value)}")

    def arguments_or_text(self) -> Any:
        """The arguments as an object, or the text as written when it is not one (for records)."""
        try:
            return self.parsed_arguments()
        except ValueError:
            return self.arguments

    def canonical_arguments(self) -> str:
        """The arguments as canonical JSON, or as written when they are not a JSON object."""
        return _canonical_arguments(self.arguments)

    def fingerprint(self) -> str:
        """Name plus canonical arguments, ignoring the call id (repeat detection, idempotency)."""
        return f"{self.name}:{self.canonical_arguments()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @classmethod
    def from_dict(cls, d: Any) -> ToolCall:
        """A call from its stored (or wire) form. Never raises: see `from_wire`."""
        return cls.from_wire(d)[0]

    @classmethod
    def from_wire(cls, d: Any) -> tuple[ToolCall, str | None]:
        """A call from any JSON value, and what was wrong with it (None: nothing).

        Providers and old rows hold every shape: `function` null or missing, a name that is
        null, arguments given as an object. A paid answer must not be lost nor a stored row
        make a run unresumable, so nothing here raises: a missing name becomes
        UNNAMED_TOOL (the tool layer answers "unknown tool", an error observation), an
        object is taken as the object (canonical JSON text), anything else that is not text
        is kept as its JSON text, which the tool layer rejects as "not a JSON object".
        A missing id is "": the runner derives one from the turn and position.
        """
        if not isinstance(d, dict):
            return cls("", UNNAMED_TOOL, ""), f"a tool call is {_kind(d)}, not an object"
        fn = d.get("function")
        if not isinstance(fn, dict):
            # The flat form {"name", "arguments"} of scripts and of the legacy function_call.
            fn = d if "function" not in d and "name" in d else None
        call_id = d["id"] if isinstance(d.get("id"), str) else ""
        if fn is None:
            return cls(
                call_id, UNNAMED_TOOL, ""
            ), f"a tool call has `function` {_kind(d.get('function'))}"
        name, args = fn.get("name"), fn.get("arguments")
        problem = None
        if not isinstance(name, str) or not name.strip():
            problem = f"a tool call has no function name (`name` is {_kind(name)})"
            name = UNNAMED_TOOL
        if isinstance(args, str):
            arguments = args
        elif args is None:
            arguments = ""
        else:
            arguments = canonical_json(args)
            if not isinstance(args, dict):
                problem = problem or f"the arguments of {name} are {_kind(args)}, not an object"
        return cls(call_id, name, arguments), problem


# The history's first messages, the system prompt and the task: never elided, never
# summarized (context/view.py), never dropped from a long run's memory (store/journal.py).
HEAD = 2


class Message(Struct, frozen=True):
    role: str  # system | user | assistant | tool
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def to_api(self) -> dict[str, Any]:
        """The chat-completions wire form."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d


class Usage(Struct, frozen=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Of prompt_tokens, those the provider served from its prompt cache (cheaper)."""
    estimated: bool = False
    """True when the provider reported no usage and the counts are the harness's estimate
    (`models/estimate.py`); False for counts the provider reported."""
    reported: bool = True
    """False when the response carried no usable `usage`: the step estimates the counts."""


class ModelTurn(Struct, frozen=True):
    """What one model call answered: text, tool calls, or both."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    raw: str | None = None
    """The provider's message as it came (JSON text), kept only when part of it could not
    be used (a tool call without a name...): the step's output keeps the evidence."""
    finish_reason: str | None = None
    """The provider's `finish_reason` ("stop", "length", "tool_calls"...), when it gave one."""
    reasoning: str | None = None
    """Thinking the provider sent beside the answer (`reasoning_content` / `reasoning`):
    kept in the step's output, shown dimmed, never sent back to the model as content."""
    model: str | None = None
    """The model that answered, as the provider named it (`model` of the response)."""

    def to_dict(self) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
        }
        if self.usage.cached_tokens:
            usage["cached_tokens"] = self.usage.cached_tokens
        if self.usage.estimated:
            usage["estimated"] = True
        d: dict[str, Any] = {
            "content": self.content,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "usage": usage,
        }
        if self.raw is not None:
            d["raw"] = self.raw
        if self.finish_reason is not None:
            d["finish_reason"] = self.finish_reason
        if self.reasoning is not None:
            d["reasoning"] = self.reasoning
        return d


class HistoryHash:
    """A running digest of the messages: the request hash of turn t without rehashing history.

    Hashing the whole history on every turn would make a 1000-step run quadratic; one
    streaming SHA-256 over every message's fields, each length-prefixed so that no two
    different histories feed it the same bytes, keeps it linear (resume rebuilds it for
    thousands of messages, so no JSON is built here) and still changes if any earlier
    message changes.
    """

    def __init__(self) -> None:
        self._sha = hashlib.sha256()

    def add(self, message: Message) -> None:
        fields = [message.role, message.content, message.tool_call_id]
        for call in message.tool_calls:
            fields += [call.id, call.name, call.arguments]
        # One update per message (the digest is of the bytes in order, however they are fed).
        parts = [len(fields).to_bytes(4, "big")]
        for text in fields:
            if text is None:
                parts.append(b"\xff\xff\xff\xff")  # None differs from ""
                continue
            data = text.encode("utf-8")
            parts += (len(data).to_bytes(4, "big"), data)
        self._sha.update(b"".join(parts))

    @property
    def digest(self) -> str:
        return self._sha.copy().hexdigest()
