"""The conversation: messages, tool calls and model turns, and their canonical JSON.

Plain frozen dataclasses rather than pydantic models: they are built and hashed on every
step (the hot path) and the CLI imports them before it knows it needs pydantic.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, UTF-8 kept: equal values give equal text (fingerprints, hashes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@lru_cache(maxsize=16)
def _canonical_arguments(arguments: str) -> str:
    value = _parse_object(arguments)
    return arguments if value is None else canonical_json(value)


@dataclass(frozen=True)
class ToolCall:
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
        json.loads(self.arguments)  # raises the parser's own error when it is not JSON at all
        raise ValueError("tool arguments must be a JSON object")

    def canonical_arguments(self) -> str:
        """The arguments as canonical JSON, or as written when they are not a JSON object."""
        return _canonical_arguments(self.arguments)

    def fingerprint(self) -> str:
        """Name plus canonical arguments, ignoring the call id (repeat detection, idempotency)."""
        return f"{self.name}:{self.canonical_arguments()}"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        fn = d.get("function", d)
        return cls(id=d["id"], name=fn["name"], arguments=fn.get("arguments", ""))


@dataclass(frozen=True)
class Message:
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


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class ModelTurn:
    """What one model call answered: text, tool calls, or both."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)

    def to_dict(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "usage": {"prompt_tokens": self.usage.prompt_tokens,
                      "completion_tokens": self.usage.completion_tokens},
        }


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
        update = self._sha.update
        update(len(fields).to_bytes(4, "big"))
        for text in fields:
            if text is None:
                update(b"\xff\xff\xff\xff")  # None differs from ""
                continue
            data = text.encode("utf-8")
            update(len(data).to_bytes(4, "big"))
            update(data)

    @property
    def digest(self) -> str:
        return self._sha.copy().hexdigest()
