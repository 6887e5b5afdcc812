"""One model call, as a durable step: budgets → key → intent → call (with retries) → outcome.

The key is `model:<turn>:<hash of the request messages>`. A step left `started` by a crash
is called again under the same key (the earlier attempts are counted); a completed one is
never called again, because its answer is in the history and replay starts after it.
"""

from __future__ import annotations

from typing import Any

from durable_agent import guard
from durable_agent.errors import LoopExit
from durable_agent.messages import Message, ModelTurn, ToolCall
from durable_agent.observer import StepEvent
from durable_agent.status import StepKind, StopReason
from durable_agent.step_context import StepContext
from durable_agent.store.rows import utcnow
from durable_agent.store.step import Step


def model_step(ctx: StepContext) -> None:
    s = ctx.state
    _check_budgets(ctx)
    turn = s.turn
    key = f"model:{turn}:{s.history.digest[:32]}"
    request = {"turn": turn, "request_hash": s.history.digest, "messages": len(s.messages),
               "model": ctx.model.name}
    obs = ctx.observer
    with ctx.journal.step(key, StepKind.MODEL, request, turn=turn) as step:
        earlier = step.attempts - 1  # attempts of sessions before this one
        obs.step(StepEvent(step.seq, turn, "model", ctx.model.name, attempts=step.attempts))

        def on_attempt(n: int, failure: Any) -> None:  # failure: models.retry.Failure | None
            if failure is not None:
                step.set_attempts(earlier + n, failure.describe())
                obs.step(StepEvent(step.seq, turn, "model", ctx.model.name, state="retry",
                                   attempts=earlier + n, error=failure.describe()))

        from durable_agent.models.retry import ModelCallError, RetryPolicy, call_with_retries

        try:
            answer, attempts = call_with_retries(
                lambda: ctx.model.complete(s.messages, ctx.schemas, turn),
                ctx.retry_policy or RetryPolicy(), sleep=ctx.sleep, on_attempt=on_attempt)
        except ModelCallError as exc:
            step.attempts = earlier + exc.attempts
            step.fail(str(exc), counters=ctx.counters())  # a failed call adds nothing to the history
            raise
        turn_out: ModelTurn = answer
        calls = _call_ids(ctx, turn_out.tool_calls, turn)
        redact = ctx.redactor.redact
        message = Message("assistant", redact(turn_out.content) if turn_out.content else turn_out.content,
                          tool_calls=calls)
        usage = turn_out.usage
        s.step_count += 1
        s.prompt_tokens += usage.prompt_tokens
        s.completion_tokens += usage.completion_tokens
        s.append(message)
        step.attempts = earlier + attempts
        output = {"content": message.content, "tool_calls": [c.to_dict() for c in calls],
                  "usage": turn_out.to_dict()["usage"]}
        if turn_out.raw is not None:  # part of the answer was unusable: keep what came, redacted
            output["raw"] = redact(turn_out.raw)
        step.complete(output, messages=[message], counters=ctx.counters(),
                      tokens=(usage.prompt_tokens, usage.completion_tokens))
    obs.step(StepEvent(step.seq, turn, "model", ctx.model.name, state="completed", detail=_summary(message),
                       attempts=step.attempts, duration_ms=_ms_since(step), prompt_tokens=usage.prompt_tokens,
                       completion_tokens=usage.completion_tokens))


def _check_budgets(ctx: StepContext) -> None:
    s = ctx.state
    price = ctx.settings.prices.get(ctx.settings.model or "")
    spent = price.cost(s.prompt_tokens, s.completion_tokens) if price else None
    stop = guard.before_model_call(ctx.limits, steps=s.step_count, tokens=s.prompt_tokens + s.completion_tokens,
                                   active_ms=ctx.active_ms(), spent=spent)
    if stop is None:
        return
    reason, detail = stop
    if ctx.journal.step_failed(f"verify:{s.turn}"):
        # The finish gate rejected the last answer: the budget ran out while verification failed.
        reason, detail = StopReason.VERIFICATION_FAILED, f"{detail} while verification still fails"
    raise LoopExit(reason, detail)


def _call_ids(ctx: StepContext, calls: tuple[ToolCall, ...], turn: int) -> tuple[ToolCall, ...]:
    """Keep the provider's ids; derive one from turn and position where it is missing or reused.

    The harness's own secrets are replaced here, once: what is stored, what runs and what
    the model sees again are then the same text. Only those exact values: a key-shaped
    string the model writes (a test fixture) is an effect, written and run byte for byte.
    """
    used = ctx.state.used_call_ids
    fixed = []
    for i, call in enumerate(calls):
        cid = call.id
        if not cid or cid in used:
            cid = f"call_{turn}_{i}"
            while cid in used:
                cid += "_"
        used.add(cid)
        fixed.append(ToolCall(id=cid, name=call.name, arguments=ctx.redactor.redact_known(call.arguments)))
    return tuple(fixed)


def _ms_since(step: Step) -> int:
    return int((utcnow() - step.started_at).total_seconds() * 1000)


def _summary(message: Message) -> str:
    if message.tool_calls:
        return ", ".join(c.name for c in message.tool_calls)
    text = (message.content or "").strip().replace("\n", " ")
    return text[:80] + ("…" if len(text) > 80 else "")
