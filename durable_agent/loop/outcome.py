"""How a session of a run ends: an `Outcome` (the run stopped, recorded) or `RunReleased`
(a worker gives the run back between two steps, nothing recorded)."""

from __future__ import annotations

from msgspec import Struct

from durable_agent.loop.notify_events import event_rows
from durable_agent.loop.step_context import StepContext
from durable_agent.status import STATUS_FOR_REASON, RunStatus, StopReason


class Outcome(Struct, frozen=True):
    run_id: str
    status: RunStatus
    stop_reason: str | None
    answer: str | None
    error: str | None


class RunReleased(Exception):
    """The run stopped between two steps because its worker shuts down (`Runner.release`).

    Not an end: nothing is finished or recorded, the worker gives the lease back and the run
    waits, `pending`, for another worker.
    """


class ChildrenGoing(Exception):
    """A worker's run reached `delegate` calls whose children have not ended (their intents
    and rows are committed): it stops `waiting` for them, its lease and process released,
    and any worker goes on with it once they ended (store/waiting.py). Not an end either."""

    def __init__(self, children: list[str]) -> None:
        super().__init__(", ".join(children))
        self.children = children


def finish(
    ctx: StepContext, reason: StopReason, *, answer: str | None = None, error: str | None = None
) -> Outcome:
    status = STATUS_FOR_REASON[reason]
    if reason is StopReason.FINISHED:
        error = None
    ctx.journal.finish_run(
        status=status.value,
        stop_reason=reason.value,
        answer=answer,
        error=error,
        counters=ctx.counters(),
        notifications=event_rows(ctx, status.value, reason.value, answer, error),
    )
    return Outcome(ctx.state.run_id, status, reason.value, answer, error)
