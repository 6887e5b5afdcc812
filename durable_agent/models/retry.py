"""One retry layer for model calls, built from tenacity's small strategies (models/backoff.py,
imported only after a first try failed).

`call_with_retries(fn, policy, sleep=..., on_attempt=...)` calls `fn` until it succeeds,
fails permanently, or the policy is spent:

    stop   stop_after_attempt(max_attempts) | total time (waits included) past max_total_seconds
    wait   the provider's Retry-After (capped at max_retry_after) when it sent one, else
           wait_random_exponential(initial_wait, max_wait): full jitter, doubling windows
    retry  only failures classified retryable (see failures.py; the model client classified
           them at its boundary)
    sleep  injected, so tests and a cancelled run never sleep through a backoff

It raises `ModelCallError` when it gives up. Build the OpenAI client with `max_retries=0`:
stacked retry layers multiply attempts and hide them from the step record.

The policy's defaults are the `Settings` defaults (one source of truth); use
`RetryPolicy.from_settings(settings)` to follow a run's configuration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from msgspec import Struct

from durable_agent.config.settings import Settings
from durable_agent.models.failures import (
    Failure,
    FailureKind,
    ModelCallError,
    ProviderError,
    classify,
)

# Re-exported: the runner imports these from here.
__all__ = [
    "Failure",
    "FailureKind",
    "ModelCallError",
    "ProviderError",
    "RetryPolicy",
    "call_with_retries",
    "classify",
]

T = TypeVar("T")


def _default(setting: str) -> Any:
    return Settings.model_fields[setting].default


class RetryPolicy(Struct, frozen=True):
    """How long a model call keeps trying. Each field is the Settings field named beside it."""

    max_attempts: int = _default("retry_max_attempts")
    """Tries in all, the first included (retry_max_attempts)."""
    max_total_seconds: float = _default("retry_max_seconds")
    """No retry is started whose wait would end past this many seconds (retry_max_seconds)."""
    initial_wait: float = _default("retry_initial_wait_s")
    """Upper bound of the first random backoff; it doubles per retry (retry_initial_wait_s)."""
    max_wait: float = _default("retry_max_wait_s")
    """Largest backoff window without a Retry-After (retry_max_wait_s)."""
    max_retry_after: float = _default("retry_after_cap_s")
    """A provider's Retry-After is honoured up to this many seconds (retry_after_cap_s)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        return cls(
            max_attempts=settings.retry_max_attempts,
            max_total_seconds=settings.retry_max_seconds,
            initial_wait=settings.retry_initial_wait_s,
            max_wait=settings.retry_max_wait_s,
            max_retry_after=settings.retry_after_cap_s,
        )


def call_with_retries(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    on_attempt: Callable[[int, Failure | None], None] | None = None,
    before_retry: Callable[[int], None] | None = None,
) -> tuple[T, int]:
    """Call `fn` until it succeeds, a permanent failure, or the policy is exhausted.

    Returns `(result, attempts)`, attempts counting the successful try. `on_attempt` is
    called after every try with its number and its `Failure` (None for the success), so
    the caller can record attempts on the step; `before_retry` before every try after the
    first, with its number (recorded before it goes out, a try the process dies in still
    counts). Raises `ModelCallError` on giving up.
    Exceptions that are not `Exception` (KeyboardInterrupt) propagate untouched.
    """
    attempts = 0

    def attempt() -> T:
        nonlocal attempts
        attempts += 1
        if attempts > 1 and before_retry is not None:
            before_retry(attempts)
        try:
            result = fn()
        except Exception as exc:
            if on_attempt is not None:
                on_attempt(attempts, classify(exc))
            raise
        if on_attempt is not None:
            on_attempt(attempts, None)
        return result

    # The first try outside tenacity: building a Retrying costs more CPU than a scripted or
    # local model's answer, and nearly every call succeeds at once. A failed first try is
    # handed to tenacity as its attempt 1 (re-raised, not re-made), so waits, Retry-After
    # and the budgets apply exactly as if tenacity had made it.
    started = time.monotonic()
    try:
        return attempt(), attempts
    except Exception as exc:
        if not classify(exc).retryable or policy.max_attempts <= 1:
            raise ModelCallError(classify(exc), attempts) from exc
        first: Exception | None = exc
    spent = time.monotonic() - started

    def again() -> T:
        nonlocal first
        if first is not None:
            failed, first = first, None
            raise failed
        return attempt()

    # Imported only now, on a first failure: a run whose calls succeed never needs tenacity.
    from durable_agent.models.backoff import retrying_for

    retrying = retrying_for(policy, spent, sleep)
    try:
        return retrying(again), attempts
    except Exception as exc:
        raise ModelCallError(classify(exc), attempts) from exc
