"""One model call, as a durable step: budgets → key → intent → call (with retries) → outcome.

The key is `model:<turn>:<hash of the request messages>`. A step left `started` by a crash
is called again under the same key (the earlier attempts are counted); a completed one is
never called again, because its answer is in the history and replay starts after it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from durable_agent import live
from durable_agent.context.budget import calibrate
from durable_agent.errors import LeaseLost, LoopExit, StoreError
from durable_agent.loop import compaction, costs, guard, stored_once
from durable_agent.loop.heartbeat import watch_cancel
from durable_agent.loop.rate_limit import limited
from durable_agent.loop.replay import RunState
from durable_agent.loop.step import EndThenRaise, StepOutcome, StepSpec, invoke
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import (
    CUT_NUDGE,
    EMPTY_NUDGE,
    HEAD,
    Message,
    ModelTurn,
    ToolCall,
    without_reasoning,
)
from durable_agent.models import deadline
from durable_agent.models.estimate import estimate_usage
from durable_agent.observer import StepEvent
from durable_agent.status import StepKind, StopReason
from durable_agent.store.schema import messages as message_rows
from durable_agent.store.step import Step
from durable_agent.store.storable import storable

if TYPE_CHECKING:
    from durable_agent.models.failures import Failure

__all__ = ["CUT_NUDGE", "EMPTY_NUDGE", "empty_answer", "model_step"]


def model_step(ctx: StepContext) -> None:
    """One model call; a provider's `context_length` refusal gets one forced compaction and
    one retry (a new step: the request changed), then the run fails saying what was tried."""
    from durable_agent.models.retry import ModelCallError

    try:
        _model_step(ctx)
    except ModelCallError as exc:
        if exc.failure.reason != "context_length":
            raise
        s = ctx.state
        lead = _lead(s)
        if not compaction.compact(ctx, lead, compaction.count_next(ctx, lead), forced=True):
            raise compaction.cannot_fit(ctx, str(exc)) from None
        try:
            _model_step(ctx)
        except ModelCallError as again:
            if again.failure.reason != "context_length":
                raise
            raise compaction.cannot_fit(ctx, str(again)) from None


def _lead(s: RunState) -> list[Message]:
    return (
        [Message("user", EMPTY_NUDGE)]
        if empty_answer(s.messages[-1] if s.messages else None)
        else []
    )


def _model_step(ctx: StepContext) -> None:
    s = ctx.state
    # A trailing empty answer without a nudge is the second in a row, which ended a session
    # (`empty_answer`): a resume nudges once more, in the same transaction as this call's
    # answer, so the run stays resumable (with another --model, say) and nothing is re-paid.
    lead = _lead(s)
    _check_budgets(ctx)
    compaction.before_model_call(ctx, lead)
    turn = s.turn
    key = f"model:{turn}:{s.history.digest[:32]}"
    sent = s.request()  # a fresh list (the model may keep it): no second copy of the history
    sent.extend(lead)
    counted = compaction.counted_next(ctx, lead)
    over = compaction.over_budget(ctx, counted)
    request: dict[str, Any] = {
        "turn": turn,
        "request_hash": s.history.digest,
        "messages": len(s.messages),
        "model": ctx.model.name,
    }
    supersede = False
    if s.view.compactions:
        request["sent_messages"] = len(sent)
        # A call refused or cut off before this turn's compaction is not this one.
        supersede = s.view.turn == turn
    obs = ctx.observer
    spec = StepSpec(
        StepKind.MODEL,
        key,
        turn,
        request,
        label=ctx.model.name,
        supersede=supersede,
        metered=True,
    )

    def call(step: Step) -> StepOutcome:
        earlier = step.attempts - 1  # attempts of sessions before this one
        if over is not None:
            obs.note(
                f"the request is ~{over['tokens']:,} tokens, over the context budget of {over['budget']:,}, "
                "and compacting cannot make it smaller: sent as it is"
            )

        failed: list[str] = []

        def on_attempt(n: int, failure: Failure | None) -> None:
            if failure is not None:
                failed.append(failure.describe())
                step.set_attempts(earlier + n, failed[-1])
                obs.step(
                    StepEvent(
                        step.seq,
                        turn,
                        StepKind.MODEL.value,
                        ctx.model.name,
                        state="retry",
                        attempts=earlier + n,
                        error=failed[-1],
                    )
                )

        def before_retry(
            n: int,
        ) -> None:  # counted before it goes out: a crash in it still counts it
            step.set_attempts(earlier + n, failed[-1] if failed else None)

        from durable_agent.models.retry import ModelCallError, RetryPolicy, call_with_retries

        try:
            with _stoppable(ctx), _live(ctx, step.seq, turn):
                answer, attempts = call_with_retries(
                    # each try waits for the model's rate limits first (docs/fleets.md)
                    lambda: limited(
                        ctx, lambda: ctx.model.complete(sent, ctx.schemas, turn), counted
                    ),
                    ctx.retry_policy or RetryPolicy(),
                    sleep=_backoff(ctx),
                    on_attempt=on_attempt,
                    before_retry=before_retry,
                )
        except ModelCallError as exc:
            if isinstance(
                exc.__cause__, StoreError | LeaseLost
            ):  # recording a try: the store's, not the model's
                raise exc.__cause__ from None
            # A failed call adds nothing to the history.
            failure = StepOutcome(error=str(exc), attempts=earlier + exc.attempts)
            raise EndThenRaise(failure, exc, announce=False) from None
        except deadline.Stopped:
            stopped = LoopExit(StopReason.CANCELLED, "cancelled by request")
            outcome = StepOutcome(error="cancelled while waiting for the model's answer")
            raise EndThenRaise(outcome, stopped, announce=False) from None
        return _answered(ctx, answer, attempts + earlier, sent, lead, counted, over)

    outcome = invoke(ctx, spec, call)
    message, nudge = outcome.result
    if nudge is None and empty_answer(message):  # the second in a row: recorded, then the stop
        raise LoopExit(
            StopReason.EMPTY_ANSWER,
            "the model answered with nothing twice in a row (no text "
            "and no tool call, even after being told); `resume` nudges it once more, "
            "e.g. with another --model",
        )


def _answered(
    ctx: StepContext,
    turn_out: ModelTurn,
    attempts: int,
    sent: list[Message],
    lead: list[Message],
    counted: int,
    over: dict[str, int] | None,
) -> StepOutcome:
    """The answer into the history (with a nudge when it is not final), as the step's outcome."""
    s = ctx.state
    calls = _call_ids(ctx, turn_out.tool_calls, s.turn)
    redactor = ctx.redactor
    message = Message(
        "assistant",
        redactor.redact_known_escaped(redactor.redact(turn_out.content))
        if turn_out.content
        else turn_out.content,
        tool_calls=calls,
    )
    usage = turn_out.usage
    if not usage.reported:
        usage = estimate_usage(sent, ctx.schemas, turn_out)
    elif not compaction.scripted(
        ctx.model
    ):  # the provider's count of this request calibrates the next
        s.calibration = calibrate(counted, usage.prompt_tokens)
    before = lead[-1] if lead else (s.messages[-1] if s.messages else None)
    nudge = _nudge(before, message, turn_out.finish_reason)
    s.step_count += 1
    s.prompt_tokens += usage.prompt_tokens
    s.completion_tokens += usage.completion_tokens
    cost = costs.pay(ctx, ctx.model.name, usage)
    for m in lead:
        s.append(m)
    message_seq = s.append(message)
    written = [*lead, message]
    if nudge is not None:  # in the same transaction as the answer: a resume never re-nudges
        written.append(Message("user", nudge[1]))
        s.append(written[-1])
    output: dict[str, Any] = {
        "content": message.content,
        "tool_calls": [c.to_dict() for c in calls],
        "usage": replace(turn_out, usage=usage).to_dict()["usage"],
    }
    if not compaction.scripted(ctx.model):  # a script's counts are made up: nothing to calibrate
        output["context"] = {"counted": counted}
    if over is not None:
        output["over_budget"] = over
    if turn_out.finish_reason is not None:
        output["finish_reason"] = turn_out.finish_reason
    if turn_out.reasoning is not None:  # kept for the reader; never sent back to the model
        output["reasoning"] = redactor.redact_known_escaped(redactor.redact(turn_out.reasoning))
    if nudge is not None:
        output["nudge"] = {"reason": nudge[0], "message": nudge[1]}
    if turn_out.raw is not None:  # part of the answer was unusable: keep what came, redacted
        output["raw"] = redactor.redact_known_escaped(redactor.redact(turn_out.raw))
    stored_once.model_output(output, message_seq)  # a big answer: its message holds it
    return StepOutcome(
        output,
        messages=written,
        tokens=(usage.prompt_tokens, usage.completion_tokens),
        cached_tokens=usage.cached_tokens,
        cost=cost,
        estimated=usage.estimated,
        attempts=attempts,
        detail=_summary(message, nudge),
        result=(message, nudge),
        facts={
            "response_model": turn_out.model,
            "finish_reason": turn_out.finish_reason,
            "input": sent,
            "output": message,
        },
    )


@contextlib.contextmanager
def _live(ctx: StepContext, seq: int, turn: int) -> Iterator[None]:
    """While the call streams: each piece to the observer (the CLI's timeline) and to the
    run's live channel (the web view, durable_agent/live.py). Nothing of it is stored: the
    step's outcome is the record. A script does not stream."""
    if compaction.scripted(ctx.model):
        yield
        return
    from durable_agent.config.layers import default_db_url
    from durable_agent.models.streaming import Delta, listening
    from durable_agent.store.location import store_key

    where = store_key(ctx.settings.db or default_db_url(ctx.env))
    channel = live.Channel(live.channel_file(where, ctx.env, ctx.state.run_id), seq, turn)
    obs = ctx.observer

    def on_delta(piece: Delta) -> None:
        obs.delta(seq, turn, piece.kind, piece.text)
        channel.add(piece.kind, piece.text)

    try:
        with listening(on_delta):
            yield
    finally:
        channel.close()


@contextlib.contextmanager
def _stoppable(ctx: StepContext) -> Iterator[None]:
    """While a provider's answer is awaited: `durable-agent cancel` (polled as for a command)
    stops the call within a fraction of a second (models/deadline.py). A script answers at once."""
    if compaction.scripted(ctx.model):
        yield
        return
    with watch_cancel(ctx.cancel, ctx.journal, ctx.beat), deadline.stopping(ctx.cancel):
        yield


def _backoff(ctx: StepContext) -> Callable[[float], None]:
    """The wait between two tries, cut short by a cancel (an injected sleep, in tests, as given)."""
    if ctx.sleep is not time.sleep:
        return ctx.sleep

    def pause(seconds: float) -> None:
        if ctx.cancel.wait(seconds):
            raise deadline.Stopped

    return pause


def empty_answer(message: Message | None) -> bool:
    """An assistant message with neither text nor a tool call: not a final answer. Text that
    is only a reasoning block (`<think>…</think>`) is no answer either."""
    return (
        message is not None
        and message.role == "assistant"
        and not message.tool_calls
        and not without_reasoning(message.content or "").strip()
    )


def _nudge(
    previous: Message | None, answer: Message, finish_reason: str | None
) -> tuple[str, str] | None:
    """(why, the user message) to append after `answer` (which follows `previous`), or None
    when it stands as it is.

    An answer cut off by the length limit is not final: the model is told and continues
    (bounded by the budgets). An empty answer is nudged once; a second one in a row gets
    no nudge, and the next step ends the run (`empty_answer`).
    """
    if answer.tool_calls:
        return None
    if finish_reason == "length":
        return "length", CUT_NUDGE
    if empty_answer(answer):
        if previous is not None and previous.role == "user" and previous.content == EMPTY_NUDGE:
            return None
        return "empty_answer", EMPTY_NUDGE
    return None


def _check_budgets(ctx: StepContext) -> None:
    s = ctx.state
    w = s.window  # budgets count from the turn's start (`continue`); the totals go on
    prompt, completion = (
        s.prompt_tokens - w.prompt_tokens,
        s.completion_tokens - w.completion_tokens,
    )
    # The steps' costs, each at its own model's price (since the turn began).
    spent = None if s.cost is None else s.cost - w.cost
    if spent is None:  # none priced yet (or a run recorded before steps kept their cost)
        price = ctx.settings.price(ctx.settings.model)
        spent = price.cost(prompt, completion) if price else None
    stop = guard.before_model_call(
        ctx.limits,
        steps=s.step_count - w.model_calls,
        tokens=prompt + completion,
        active_ms=ctx.active_ms() - w.active_ms,
        spent=spent,
    )
    if stop is None:
        return
    reason, detail = stop[0], stop[1] + guard.since_continue(w.messages)
    if ctx.journal.step_failed(f"verify:{s.turn}"):
        # The finish gate rejected the last answer: the budget ran out while verification failed.
        reason, detail = StopReason.VERIFICATION_FAILED, f"{detail} while verification still fails"
    raise LoopExit(reason, detail)


# The longest call id the stores hold (PostgreSQL refuses a longer one: the call's checkpoint,
# and every resume's, would fail on it).
ID_CHARS: int = message_rows.c.tool_call_id.type.length  # type: ignore[attr-defined]


def _call_ids(ctx: StepContext, calls: tuple[ToolCall, ...], turn: int) -> tuple[ToolCall, ...]:
    """Keep the provider's ids; derive one from turn and position where it is missing, reused
    or too long for the store.

    The harness's own secrets are replaced here, once: what is stored, what runs and what
    the model sees again are then the same text. Only those exact values: a key-shaped
    string the model writes (a test fixture) is an effect, written and run byte for byte.
    """
    used = ctx.state.used_call_ids
    below = ctx.state.ids_below  # ids answered before it are in the store only (a resume)

    def taken(cid: str) -> bool:
        return cid in used or (below > HEAD and ctx.journal.answered_before(cid, below))

    known = ctx.redactor
    fixed = []
    for i, call in enumerate(calls):
        cid = known.redact_known(call.id)  # the name and id too: both are stored and sent back
        # As the store will hold it (a NUL as the text \x00): that is the id every later
        # call is checked against, in memory and in the store (PostgreSQL refuses a NUL
        # in a statement), and an id reused as its stored spelling is reused.
        cid = storable(cid)
        if not cid or len(cid) > ID_CHARS or taken(cid):
            cid = f"call_{turn}_{i}"
            while taken(cid):
                cid += "_"
        used.add(cid)
        fixed.append(
            ToolCall(
                id=cid,
                name=known.redact_known(call.name),
                arguments=known.redact_known_arguments(call.arguments),
            )
        )
    return tuple(fixed)


def _summary(message: Message, nudge: tuple[str, str] | None) -> str:
    """The timeline's words for an answer; one that is not final says so (and what was done)."""
    if message.tool_calls:
        return ", ".join(c.name for c in message.tool_calls)
    text = (message.content or "").strip().replace("\n", " ")
    text = text[:80] + ("…" if len(text) > 80 else "")
    if nudge is not None and nudge[0] == "length":
        return f"cut off at the length limit, told to continue: {text}".rstrip()
    if empty_answer(message):  # nothing, or only a reasoning block
        return "(empty answer, told to answer)" if nudge else "(empty answer)"
    return text
