"""What a provider's `usage` says beyond the two counts: the prompt tokens it served from
its cache (billed at the cached-input price). One function, so every way of reading an
answer (a whole body, a stream's last chunk) reads it the same."""

from __future__ import annotations

from typing import Any

MAX_TOKENS = 2**31 - 1


def cached_prompt_tokens(usage: Any, prompt_tokens: int) -> int:
    """`usage.prompt_tokens_details.cached_tokens` (OpenAI, vLLM, most compatible servers),
    else 0. A count that is no count (negative, not an int, more than the prompt) is 0:
    never a cheaper price than the one surely owed."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= prompt_tokens:
        return value
    return 0
