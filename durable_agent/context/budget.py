"""How many tokens a request may hold, and how many a request holds (before it is sent).

The window: `[models."NAME"] context_window` from the config, else the first entry of
BUILT_IN_WINDOWS whose prefix the model name starts with (after any `provider/` part),
else DEFAULT_WINDOW, a conservative 32768. `--max-context-tokens` caps it further.
Compaction starts when a request would pass `compact_at` of that budget.

The count: `tiktoken` where it fits (OpenAI model names, the optional `tokens` extra,
imported lazily), else the documented estimate of models/estimate.py (about four
characters per token, plus framing). Either is then calibrated with what the provider
reported: the ratio of the last call's `prompt_tokens` to the harness's count of that same
request (stored in the model step's output as `context.counted`), so a server that
tokenizes differently (or counts the JSON around the text) is followed after one call.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

from durable_agent.config.settings import Settings
from durable_agent.messages import Message
from durable_agent.models.estimate import CHARS_PER_TOKEN, FRAMING_TOKENS

DEFAULT_WINDOW = 32_768
# Longest prefix first where two overlap (gpt-4.1 before gpt-4, gpt-4o before gpt-4).
BUILT_IN_WINDOWS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-5", 400_000),
    ("gpt-3.5-turbo", 16_385),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4", 200_000),
    ("claude", 200_000),
    ("gemini", 1_048_576),
    ("qwen2.5", 32_768),
    ("qwen3", 32_768),
    ("llama3", 131_072),
    ("llama-3", 131_072),
    ("deepseek", 65_536),
    ("mistral", 32_768),
    ("codestral", 256_000),
)
TIKTOKEN_LOAD_S = 5.0
CALIBRATION_RANGE = (0.5, 4.0)  # a provider count far outside this is not a tokenizer difference


def context_window(settings: Settings, model: str | None = None) -> int:
    """The model's window in tokens (config, then the built-in table, then the default)."""
    name = model or settings.model or ""
    info = settings.models.get(name)
    if info is not None and info.context_window is not None:
        return info.context_window
    bare = name.rsplit("/", 1)[-1].lower()
    for prefix, window in BUILT_IN_WINDOWS:
        if bare.startswith(prefix):
            return window
    return DEFAULT_WINDOW


def request_budget(settings: Settings) -> int:
    """Tokens one request may hold: the window, capped by --max-context-tokens."""
    window = context_window(settings)
    cap = settings.max_context_tokens
    return window if cap is None else min(window, cap)


def compact_threshold(settings: Settings) -> int:
    return int(request_budget(settings) * settings.compact_at)


def _tiktoken_counter(model: str) -> Callable[[str], int] | None:
    """tiktoken's encoder for an OpenAI model name, or None (not installed, unknown, offline)."""
    bare = model.rsplit("/", 1)[-1].lower()
    if not bare.startswith(("gpt-", "o1", "o3", "o4", "chatgpt")):
        return None
    try:
        import tiktoken  # optional extra `tokens`
    except ImportError:
        return None
    found: list[Any] = []

    def load() -> None:
        with contextlib.suppress(Exception):  # an unknown name, or no encoding file to be had
            found.append(tiktoken.encoding_for_model(bare))

    # The first use downloads the encoding file (without a timeout): a budget check must not
    # hang on a network that is not there, so it waits a few seconds, then estimates.
    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(TIKTOKEN_LOAD_S)
    if not found:
        return None
    encoding = found[0]
    return lambda text: len(encoding.encode(text, disallowed_special=()))


_COUNTERS: dict[str, Callable[[str], int] | None] = {}


def _estimate(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def text_counter(model: str) -> Callable[[str], int]:
    if model not in _COUNTERS:
        _COUNTERS[model] = _tiktoken_counter(model)
    return _COUNTERS[model] or _estimate


def count_message(message: Message, counter: Callable[[str], int]) -> int:
    n = FRAMING_TOKENS + counter(message.content or "")
    for call in message.tool_calls:
        n += counter(call.id) + counter(call.name) + counter(call.arguments)
    return n


def count_request(
    messages: Sequence[Message], schemas: Sequence[dict[str, Any]], model: str
) -> int:
    """The harness's own count of a request (not yet calibrated)."""
    counter = text_counter(model)
    n = sum(count_message(m, counter) for m in messages)
    return n + schema_tokens(schemas, counter)


# The tool schemas of a session do not change: counted once per (schemas, counter).
_SCHEMA_TOKENS: dict[tuple[int, int], tuple[object, int]] = {}


def schema_tokens(schemas: Sequence[dict[str, Any]], counter: Callable[[str], int]) -> int:
    if not schemas:
        return 0
    key = (id(schemas), id(counter))
    found = _SCHEMA_TOKENS.get(key)
    if found is None or found[0] is not schemas:  # (the held reference keeps the id unique)
        found = _SCHEMA_TOKENS[key] = (schemas, counter(json.dumps(list(schemas))))
    return found[1]


def calibrate(counted: int, reported: int | None) -> float:
    """The factor that turns the harness's count into the provider's (1.0 without a report)."""
    if not reported or counted <= 0:
        return 1.0
    low, high = CALIBRATION_RANGE
    return min(high, max(low, reported / counted))
