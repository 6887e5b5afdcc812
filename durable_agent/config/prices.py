"""The shipped price table: what common hosted models cost, per million tokens, in USD,
as their providers listed them on PRICES_AS_OF. A `[prices."NAME"]` entry in the config
file replaces a model's row (or adds one); `durable-agent` never fetches prices.

`cached_input` is the price of a prompt token the provider served from its cache
(`usage.prompt_tokens_details.cached_tokens`); prompt tokens not cached cost `input`.
A model is found by its exact name, else by the longest listed name it starts with
followed by `-` (a dated snapshot such as gpt-4.1-mini-2025-04-14), with any `provider/`
prefix (OpenRouter, LiteLLM) left off.
"""

from __future__ import annotations

PRICES_AS_OF = "2025-08-15"

# name: (input, output, cached input) per million tokens, USD.
SHIPPED: dict[str, tuple[float, float, float]] = {
    "gpt-5": (1.25, 10.00, 0.125),
    "gpt-5-mini": (0.25, 2.00, 0.025),
    "gpt-5-nano": (0.05, 0.40, 0.005),
    "gpt-4.1": (2.00, 8.00, 0.50),
    "gpt-4.1-mini": (0.40, 1.60, 0.10),
    "gpt-4.1-nano": (0.10, 0.40, 0.025),
    "gpt-4o": (2.50, 10.00, 1.25),
    "gpt-4o-mini": (0.15, 0.60, 0.075),
    "o3": (2.00, 8.00, 0.50),
    "o3-mini": (1.10, 4.40, 0.55),
    "o4-mini": (1.10, 4.40, 0.275),
    "claude-opus-4": (15.00, 75.00, 1.50),
    "claude-opus-4-1": (15.00, 75.00, 1.50),
    "claude-sonnet-4": (3.00, 15.00, 0.30),
    "claude-3-7-sonnet": (3.00, 15.00, 0.30),
    "claude-3-5-haiku": (0.80, 4.00, 0.08),
    "gemini-2.5-pro": (1.25, 10.00, 0.31),
    "gemini-2.5-flash": (0.30, 2.50, 0.075),
    "deepseek-chat": (0.27, 1.10, 0.07),
    "deepseek-reasoner": (0.55, 2.19, 0.14),
}


def shipped_row(model: str) -> tuple[float, float, float] | None:
    """The shipped (input, output, cached input) of `model`: its exact name, else the
    longest listed name it starts with before a `-`; None when it is not listed."""
    name = model.rpartition("/")[2].lower()
    row = SHIPPED.get(name)
    if row is None:
        fits = [k for k in SHIPPED if name.startswith(k + "-")]
        row = SHIPPED[max(fits, key=len)] if fits else None
    return row
