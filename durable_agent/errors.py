"""Errors, one tree, and the tiny family of loop exits.

    DurableAgentError            every error this package raises on purpose
    ├── UsageError               bad flag, bad config, unknown run id (exit 2)
    │   ├── ConfigError
    │   └── RunNotFound
    ├── RunBusy                  another live process holds the run's lease (exit 6)
    ├── LeaseLost                our lease was taken over: write nothing more
    ├── HistoryDiverged          recorded history does not match what replay rebuilt
    └── ModelError               the model call failed (classified in models/failures.py)

Loop exits are not errors: `LoopExit` carries the stop reason out of the loop and is
caught in exactly one place, `runner._Drive.run`.
"""

from __future__ import annotations

from durable_agent.status import StopReason


class DurableAgentError(Exception):
    """Root of every error raised on purpose. The message says what to do next."""


class UsageError(DurableAgentError):
    pass


class ConfigError(UsageError):
    pass


class RunNotFound(UsageError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r} (see `durable-agent list`)")
        self.run_id = run_id


class RunBusy(DurableAgentError):
    def __init__(self, run_id: str, owner: str) -> None:
        super().__init__(
            f"run {run_id} is being executed by another live process ({owner}); "
            "wait for it, or `durable-agent cancel` it"
        )
        self.run_id = run_id
        self.owner = owner


class LeaseLost(DurableAgentError):
    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"lost the lease on run {run_id}: another process took it over; "
            "this process wrote nothing more"
        )
        self.run_id = run_id


class HistoryDiverged(DurableAgentError):
    pass


class ModelError(DurableAgentError):
    """A model call that failed for good (permanent, or retries exhausted)."""

    def __init__(self, message: str, *, attempts: int = 1, permanent: bool = True) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.permanent = permanent


class LoopExit(Exception):
    """Leaves the loop with a stop reason; not an error."""

    def __init__(self, reason: StopReason, detail: str = "", answer: str | None = None) -> None:
        super().__init__(detail or reason.value)
        self.reason = reason
        self.detail = detail
        self.answer = answer
