"""Budgets and the repeated-action guard (pure: decisions from numbers, no I/O).

Budgets are checked before the action that would exceed them: with max_steps=2 the
third model call is never made.
"""

from __future__ import annotations

from msgspec import Struct

from durable_agent.status import StopReason


class Limits(Struct, frozen=True):
    max_steps: int
    max_tool_calls: int | None
    max_tokens: int | None
    max_seconds: float | None
    max_repeats: int
    max_cost: float | None = None


def before_model_call(
    limits: Limits, *, steps: int, tokens: int, active_ms: int, spent: float | None = None
) -> tuple[StopReason, str] | None:
    """`spent`: the cost so far at the model's configured price (None: no price known)."""
    if steps >= limits.max_steps:
        return StopReason.MAX_STEPS, f"reached max_steps={limits.max_steps} model calls"
    if limits.max_tokens is not None and tokens >= limits.max_tokens:
        return StopReason.MAX_TOKENS, f"used {tokens} tokens of max_tokens={limits.max_tokens}"
    return _time(limits, active_ms) or before_model_cost(limits.max_cost, spent)


def before_model_cost(max_cost: float | None, spent: float | None) -> tuple[StopReason, str] | None:
    """The cost budget (`--max-cost`), checked with the other budgets before a model call.

    SPEC's stop reasons are a fixed vocabulary with no cost entry; spending money is spending
    tokens at a price, so a cost stop ends `budget_exceeded` / `max_tokens` and the detail
    says it was the cost. The cost of the next call is unknown until it is made, so the run
    stops once the spend reaches the budget: the last call may overshoot it by one call.
    """
    if max_cost is None or spent is None or spent < max_cost:
        return None
    return StopReason.MAX_TOKENS, f"cost budget: spent {spent:.4f} of max_cost={max_cost:g}"


def before_tool_call(
    limits: Limits, *, tool_calls: int, streak_if_run: int, active_ms: int
) -> tuple[StopReason, str] | None:
    if limits.max_tool_calls is not None and tool_calls >= limits.max_tool_calls:
        return StopReason.MAX_TOOL_CALLS, f"reached max_tool_calls={limits.max_tool_calls}"
    if streak_if_run > limits.max_repeats:
        return (
            StopReason.REPEATED_ACTION,
            f"the same tool call would run {streak_if_run} times in a row (max_repeats={limits.max_repeats})",
        )
    return _time(limits, active_ms)


def since_continue(window_start: int) -> str:
    """What a stop's detail adds in a continued run: the budgets counted from the turn's start."""
    return " since the run was continued" if window_start else ""


def _time(limits: Limits, active_ms: int) -> tuple[StopReason, str] | None:
    if limits.max_seconds is not None and active_ms >= limits.max_seconds * 1000:
        return (
            StopReason.MAX_SECONDS,
            f"ran {active_ms / 1000:.1f} s of max_seconds={limits.max_seconds:g}",
        )
    return None
