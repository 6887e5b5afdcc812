"""What a model call cost: its usage at its model's price (`[prices]`, else the shipped
table), recorded on its step; the run's cost is the sum of its steps'."""

from __future__ import annotations

from durable_agent.loop.step_context import StepContext
from durable_agent.messages import Usage


def pay(ctx: StepContext, model: str, usage: Usage) -> float | None:
    """The call's cost, added to the run's totals with its cached tokens (None: no price)."""
    s = ctx.state
    s.cached_tokens += usage.cached_tokens
    price = ctx.settings.price(model)
    if price is None:
        return None
    cost = price.cost(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
    s.cost = (s.cost or 0.0) + cost
    return cost
