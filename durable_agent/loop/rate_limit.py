"""Rate limits per model, shared by every worker through the store (docs/fleets.md).

`[models."NAME"] rpm = 60, tpm = 200000` in the config: before each request to NAME (each
retry too) the session takes capacity from a sliding window in the store
(store/fleet.take_capacity), and waits while there is none, saying so in the timeline
("waiting for rate limit"), instead of sending a request the provider would answer with
429. tpm counts the harness's estimate of the prompt when the request goes out, corrected to
the usage the provider reports once it answers.

The provider counts requests when they arrive, some time after the capacity was taken: a
request's place in the window is held from when it is taken until it answered (stamped
`request_timeout_s` ahead, then moved back to the answer's time), so no later request can
count it gone before it arrived. The window is also a little longer than configured
(MARGIN), for the requests' own unequal delays.
"""

from __future__ import annotations

from collections.abc import Callable

from durable_agent.loop.step_context import StepContext
from durable_agent.messages import ModelTurn
from durable_agent.models import deadline
from durable_agent.store import fleet
from durable_agent.store.rows import utcnow

MARGIN = 0.02  # of the window, plus MARGIN_S
MARGIN_S = 0.05
POLL_S = 2.0  # longest single wait before asking again (capacity freed early: a cancel)


def limited(ctx: StepContext, call: Callable[[], ModelTurn], estimate: int) -> ModelTurn:
    """`call` once the model's limits have room for it."""
    name = ctx.settings.model or ctx.model.name
    info = ctx.settings.models.get(name)
    if info is None or (info.rpm is None and info.tpm is None):
        return call()
    wants = []
    if info.rpm is not None:
        wants.append(fleet.Want(f"rpm:{name}", 1, info.rpm))
    if info.tpm is not None:
        wants.append(fleet.Want(f"tpm:{name}", max(1, estimate), info.tpm))
    window = ctx.settings.rate_limit_window_s
    told = False
    while True:
        wait, ids = fleet.take_capacity(
            ctx.journal.engine,
            wants,
            window * (1 + MARGIN) + MARGIN_S,
            utcnow(),
            ctx.journal.run_id,
            hold_s=ctx.settings.request_timeout_s,
        )
        if not wait:
            break
        if not told:
            limits = ", ".join(f"{w.key.split(':')[0]} {w.limit}" for w in wants)
            ctx.observer.note(f"waiting for rate limit: {name} ({limits}) · {wait:.1f}s")
            told = True
        if ctx.cancel.wait(min(wait, POLL_S)):
            raise deadline.Stopped
    try:
        answer = call()
    except BaseException:
        fleet.settle_capacity(ctx.journal.engine, ids, utcnow())
        raise
    used = answer.usage.prompt_tokens + answer.usage.completion_tokens
    tokens = {ids[-1]: used} if info.tpm is not None and used else None
    fleet.settle_capacity(ctx.journal.engine, ids, utcnow(), tokens)
    return answer
