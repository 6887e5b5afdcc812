"""The retries after a failed first model call, with tenacity's small strategies (imported
by models/retry.py only once a first try failed: most runs never need tenacity)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from durable_agent.models.failures import classify

if TYPE_CHECKING:
    from durable_agent.models.retry import RetryPolicy


def retrying_for(policy: RetryPolicy, spent: float, sleep: Callable[[float], None]) -> Retrying:
    """The Retrying that goes on after a first try that took `spent` seconds."""
    return Retrying(
        stop=stop_after_attempt(policy.max_attempts)
        | _stop_before_total(policy.max_total_seconds - spent),
        wait=_wait_retry_after(
            wait_random_exponential(multiplier=policy.initial_wait, max=policy.max_wait),
            policy.max_retry_after,
        ),
        retry=retry_if_exception(lambda exc: classify(exc).retryable),
        sleep=sleep,
        reraise=True,  # give up with the client's exception, not tenacity's RetryError
    )


class _wait_retry_after(wait_base):
    """The provider's Retry-After when it sent one (capped), else the fallback backoff."""

    def __init__(self, fallback: wait_base, cap: float) -> None:
        self.fallback = fallback
        self.cap = cap

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        if exc is not None:
            retry_after = classify(exc).retry_after
            if retry_after is not None:
                return min(retry_after, self.cap)
        return float(self.fallback(retry_state))


class _stop_before_total(stop_base):
    """Stop when the time spent plus the next wait would pass the budget.

    Like tenacity's `stop_before_delay` (which 8.3 lacks), but the waits are counted from
    `idle_for`, so the budget also holds with an injected sleep that takes no wall-clock time.
    """

    def __init__(self, max_total: float) -> None:
        self.max_total = max_total

    def __call__(self, retry_state: RetryCallState) -> bool:
        spent = max(retry_state.seconds_since_start or 0.0, retry_state.idle_for)
        return bool(spent + retry_state.upcoming_sleep >= self.max_total)
