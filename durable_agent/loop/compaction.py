"""Compaction: keep each request under the model's window, as durable steps of kind `compact`.

Checked before every model call (model_step.py). When the next request would pass
`compact_at` of the budget (context_budget.py), two stages run, each its own step:

- elide: tool results older than the last `keep_recent_outputs` are replaced in the request
  by a stub naming `read_output(call_id)`; no model call. If the request is then under
  TARGET of the budget, that is all.
- summarize: one model call turns the older part of the conversation (from the previous
  summary up to a cut before an assistant message, so a tool call and its results are
  never split) into a structured summary; the request becomes system prompt + task +
  summary + the recent turns verbatim. Key `compact:<turn>:<hash of the summary request>`.

Both are recorded with intent and outcome (store/journal.py): a crash during the summary
call re-runs only it on resume (the open step's recorded `start` picks the same cut); once
completed its output holds the boundary, replay (context_view.py) applies it, and no resume
pays for it again. Compaction happens only at these points, never a little every turn, so
between two compactions each request extends the previous one byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from msgspec import UNSET

from durable_agent.context.budget import (
    compact_threshold,
    count_message,
    count_request,
    request_budget,
    schema_tokens,
    text_counter,
)
from durable_agent.context.memory import is_memory
from durable_agent.context.view import SUMMARY_HEADER, stub, tool_names
from durable_agent.errors import ModelError
from durable_agent.loop import costs
from durable_agent.loop.replay import RunState
from durable_agent.loop.step import EndThenRaise, StepOutcome, StepSpec, invoke
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import HEAD, Message, ModelTurn, Usage, sha256_text, without_reasoning
from durable_agent.status import StepKind
from durable_agent.store.payloads import CompactInput
from durable_agent.store.step import Step
from durable_agent.store.storable import storable

TARGET = 0.5  # of the budget: a compaction aims this low, so the next one is many turns away
KEEP_RECENT = 0.25  # of the budget: recent turns kept verbatim by a summary (at least one turn)
SUMMARY_INPUT = 0.6  # of the budget: the most a summary request may hold
MESSAGE_CHARS = 4_000  # of one message in the summary request (the rest is cut in the middle)
SUMMARY_SHARE = 0.15  # of the budget: the most a summary may take of every request after it
# Tokens a summary is expected to take (its five sections run to several hundred): what it
# replaces must be larger, or the call is paid for a request no smaller (~1,060 -> ~1,089).
SUMMARY_EXPECTED = 1_000
SUMMARY_PROMPT = (
    "Summarize the conversation below for a continuation of the same task by an agent that "
    "will not see it again. Write a structured summary with these sections: Task; Decisions "
    "made; Files read or changed (paths, what was learned or done); Current state; Next steps. "
    "Keep exact names, paths, commands and error messages; say what was tried and failed. "
    "Tool results can be read again later with read_output(call_id): cite call ids where useful."
)


def count(ctx: StepContext, request: list[Message]) -> int:
    """The request's size in the provider's tokens, as well as the harness can tell beforehand."""
    return int(count_request(request, ctx.schemas, ctx.model.name) * ctx.state.calibration)


def counted_next(ctx: StepContext, lead: list[Message]) -> int:
    """The harness's own (uncalibrated) count of the next request, `[*s.request(), *lead]`,
    without recounting the history: the run state keeps a running count."""
    counter = text_counter(ctx.model.name)
    return (
        ctx.state.request_tokens(counter)
        + sum(count_message(m, counter) for m in lead)
        + schema_tokens(ctx.schemas, counter)
    )


def count_next(ctx: StepContext, lead: list[Message]) -> int:
    """`count_next(ctx, lead)`, kept incrementally."""
    return int(counted_next(ctx, lead) * ctx.state.calibration)


def before_model_call(ctx: StepContext, lead: list[Message]) -> None:
    """Compact if the next request would pass the threshold (or finish an interrupted summary);
    a turn compacts once by itself, unless its request is over the budget."""
    s = ctx.state
    for st in ctx.journal.open_steps.values():
        intent = st.typed_input
        if (
            st.kind == StepKind.COMPACT
            and st.turn == s.turn
            and isinstance(intent, CompactInput)
            and intent.stage == "summarize"
            and intent.start is not UNSET
        ):
            _summarize(ctx, lead, count_next(ctx, lead), cut=intent.start)
            return
    tokens = count_next(ctx, lead)
    if s.view.turn == s.turn:
        # This turn compacted already (a resume after it, or the call's retry): its decisions
        # stand, so a resume sends what the first session would have. An elide that said a
        # summary follows, cut off by a crash before it, gets that summary now; only a request
        # over the budget (a resume with a smaller --max-context-tokens) compacts again.
        budget = request_budget(ctx.settings)
        cut = _cut(ctx, budget) if s.view.summary_due else None
        if cut is not None and _summary_helps(
            ctx, tokens, cut, budget
        ):  # as the first session decided
            _summarize(ctx, lead, tokens, cut=cut)
        elif tokens > request_budget(ctx.settings):
            compact(ctx, lead, tokens)
        return
    if tokens > compact_threshold(ctx.settings):
        compact(ctx, lead, tokens)


def compact(
    ctx: StepContext,
    lead: list[Message],
    tokens: int,
    *,
    forced: bool = False,
    by_hand: bool = False,
) -> bool:
    """Elide, then summarize if still over TARGET (always, when `forced` by the provider).
    Returns whether the request changed. At most one elide per turn (its step key).
    `by_hand` (`durable-agent compact`, forced too): no summary that would not shrink the
    request (summary_too_small), and an elide says so, so a resume does not make it either.

    A budget too small for what a summary keeps verbatim (`_tight`: the task and the last
    turn, with one more like it, pass the threshold) would pay a summary call on every turn
    and never reach TARGET. There every tool result the model has already seen is elided,
    the recent ones too (free), and a summary is made only when the request is still over
    `_tight_bar`."""
    from durable_agent.loop import hooks

    hooks.pre_compact(ctx)
    s = ctx.state
    budget = request_budget(ctx.settings)
    tight = not forced and _tight(ctx, lead)
    bar = budget * (_tight_bar(ctx) if tight else TARGET)
    elided = [] if s.view.elide_turn == s.turn else _elidable(ctx, tight=tight)
    if elided:
        after = _count_elided(ctx, lead, elided)
        enough = after <= bar and not forced
        if by_hand and not enough:  # elided, no summary would shrink it: that is all
            enough = _no_summary_pays(ctx, budget, elided)
        _elide(ctx, tokens, after, elided, summary_due=not enough)
        if enough:
            return True
        tokens = after
    elif tight and tokens <= bar:
        return False
    cut = _cut(ctx, budget)
    if cut is None:
        return bool(elided)
    if not forced and not _summary_helps(ctx, tokens, cut, budget):
        return bool(elided)
    if by_hand and summary_too_small(ctx, cut, budget) is not None:
        return bool(elided)
    _summarize(ctx, lead, tokens, cut=cut)
    return True


def _no_summary_pays(ctx: StepContext, budget: int, elided: list[int]) -> bool:
    """summary_too_small, decided for the request once `elided` are stubs (before the elide
    is recorded: its output says whether a summary follows)."""
    s = ctx.state
    request = _with_stubs(ctx, s.view.request(s.messages), elided, tool_names(s.messages))
    cut = _cut(ctx, budget, request)
    return cut is None or summary_too_small(ctx, cut, budget, request) is not None


def summary_too_small(
    ctx: StepContext, cut: int, budget: int, request: list[Message] | None = None
) -> tuple[int, int] | None:
    """(tokens replaced, tokens a summary is expected to take) when a summary up to `cut`
    would not make the requests after it smaller: then none is made, and none is paid.

    Decided before the call, on what the summary replaces (the messages and the previous
    summary) against what a summary takes (SUMMARY_EXPECTED, or the SUMMARY_SHARE of the
    budget it is cut to when that is less, with its header): a summary measured after the
    call would be paid for already, and the model's answer would decide what a resume does."""
    s = ctx.state
    counter = text_counter(ctx.model.name)
    header = count_message(Message("user", SUMMARY_HEADER), counter) * s.calibration
    cost = min(SUMMARY_EXPECTED, budget * SUMMARY_SHARE) + header
    replaced = _replaced(ctx, cut, request)
    return (int(replaced), int(cost)) if replaced <= cost else None


def why_no_summary(ctx: StepContext) -> str | None:
    """For `durable-agent compact`: why no summary was made although turns could be, if the
    reason is that it would not shrink the request (summary_too_small)."""
    budget = request_budget(ctx.settings)
    cut = _cut(ctx, budget)
    small = summary_too_small(ctx, cut, budget) if cut is not None else None
    if small is None:
        return None
    return (
        f"no summary made: the older turns hold ~{small[0]:,} tokens, no more than a summary "
        f"takes (~{small[1]:,}), so it would not shrink the request; no model call was paid"
    )


def _summary_helps(ctx: StepContext, tokens: float, cut: int, budget: int) -> bool:
    """False when even an empty summary up to `cut` would leave the request over the budget
    (the newest results alone pass it): a call paid every turn for a request a little
    smaller. A provider that refuses the request forces one (model_step), and fails the run
    if none helps."""
    return tokens - _replaced(ctx, cut) <= budget


def _replaced(ctx: StepContext, cut: int, request: list[Message] | None = None) -> float:
    """Tokens of what a summary up to `cut` replaces: the last summary and the messages (of
    `request`, the view's by default)."""
    s = ctx.state
    request, offset = _sent(s, request)
    counter = text_counter(ctx.model.name)
    first = max(s.view.start, HEAD) + offset - (1 if s.view.summary is not None else 0)
    return sum(count_message(m, counter) for m in request[first : cut + offset]) * s.calibration


def _sent(s: RunState, request: list[Message] | None = None) -> tuple[list[Message], int]:
    """The request as the view builds it (or `request`, the same with stubs), and the offset:
    message seq i is request[i + offset]."""
    if request is None:
        request = s.view.request(s.messages)
    return request, len(request) - len(s.messages)


def _tight_bar(ctx: StepContext) -> float:
    """Of the budget: what a tight compaction may leave, halfway from `compact_at` to the
    whole budget (the other half is a margin for the error of the count)."""
    return (1 + ctx.settings.compact_at) / 2


def _elidable(ctx: StepContext, *, tight: bool = False) -> list[int]:
    """Seqs of tool results still sent verbatim and longer than their stubs, but the most
    recent `keep_recent_outputs`; `tight`: every one the model was sent already too (not the
    last turn's results)."""
    s = ctx.state
    view = s.view
    names = tool_names(s.messages)
    # Only results longer than their stub: eliding a short one ("ok", a line) made the
    # request bigger (58 of them: 2,403 -> 3,616 tokens).
    shown = [
        i
        for i in range(max(view.start, HEAD), len(s.messages))
        if (m := s.messages[i]).role == "tool"
        and i not in view.elided
        and len(m.content or "") > len(stub(m, names).content or "")
    ]
    keep = ctx.settings.keep_recent_outputs
    older = shown[:-keep] if keep else shown
    if not tight:
        return older
    last = _last_turn(s.messages)
    return sorted({*older, *(i for i in shown if last is not None and i < last)})


def _tight(ctx: StepContext, lead: list[Message]) -> bool:
    """Whether the system prompt, the task and the last turn (which every summary keeps
    verbatim), with one more turn of that size, pass the threshold: then no summary makes
    room for the next turns, and each would pay another. Eliding seen results does not
    change it: a resume decides as the first session did."""
    s = ctx.state
    last = _last_turn(s.messages)
    if last is None or last < s.view.start:
        return False
    request = s.view.request(s.messages)
    offset = len(request) - len(s.messages)  # request index of message seq i is i + offset
    kept = count(ctx, [*request[:HEAD], *request[last + offset :], *lead])
    turn = count(ctx, request[last + offset :]) - count(ctx, [])  # the last turn alone (no schemas)
    return kept + turn > compact_threshold(ctx.settings)


def _last_turn(messages: Sequence[Message]) -> int | None:
    """Seq of the last assistant message: the results after it are ones the model has not seen."""
    return next(
        (i for i in range(len(messages) - 1, HEAD - 1, -1) if messages[i].role == "assistant"), None
    )


def _count_elided(ctx: StepContext, lead: list[Message], seqs: list[int]) -> int:
    """The next request's tokens once `seqs` are stubs."""
    s = ctx.state
    request = s.view.request(s.messages)
    return count(ctx, [*_with_stubs(ctx, request, seqs, tool_names(s.messages)), *lead])


def _elide(
    ctx: StepContext, before: int, after: int, seqs: list[int], *, summary_due: bool
) -> None:
    s = ctx.state
    key = f"compact:{s.turn}:elide"  # one per turn (`compact`)
    output: dict[str, Any] = {
        "stage": "elide",
        "turn": s.turn,
        "elided": seqs,
        "tokens_before": before,
        "tokens_after": after,
    }
    if summary_due:  # decided now: a resume cut off before the summary makes it (before_model_call)
        output["then"] = "summarize"
    spec = StepSpec(
        StepKind.COMPACT,
        key,
        s.turn,
        {"stage": "elide", "elided": len(seqs)},
        label="context",
        detail=f"elided {len(seqs)} tool outputs: {before:,} → {after:,} tokens",
        announce=False,  # nothing to wait for: no model call
        timed=False,
    )

    def elide(_step: Step) -> StepOutcome:
        s.compacted(output)
        return StepOutcome(output)

    invoke(ctx, spec, elide)


def _with_stubs(
    ctx: StepContext, request: list[Message], seqs: list[int], names: dict[str, str]
) -> list[Message]:
    stubs = {ctx.state.messages[i].tool_call_id for i in seqs}
    return [stub(m, names) if m.role == "tool" and m.tool_call_id in stubs else m for m in request]


def _cut(ctx: StepContext, budget: int, request: list[Message] | None = None) -> int | None:
    """Where the summary ends: before the oldest assistant message from which the recent
    turns still fit in KEEP_RECENT of the budget (at least the last turn is kept); None when
    there is nothing before it to summarize."""
    s = ctx.state
    start = max(s.view.start, HEAD)
    request, offset = _sent(s, request)
    counter = text_counter(ctx.model.name)
    keep, tail = budget * KEEP_RECENT, 0.0
    cut = None
    for i in range(len(s.messages) - 1, start, -1):
        tail += count_message(request[i + offset], counter) * s.calibration
        if s.messages[i].role != "assistant":
            continue
        if cut is not None and tail > keep:
            break
        cut = i
    return cut


def _summary_request(ctx: StepContext, cut: int, budget: int) -> list[Message]:
    s = ctx.state
    view = s.view
    lines = [f"Previous summary:\n{view.summary}\n"] if view.summary else []
    for i in range(max(view.start, HEAD), cut):
        m = view.elided.get(i) or s.messages[i]
        if is_memory(m):
            continue  # kept verbatim by the view: not the summary's to retell
        text = m.content or ""
        if len(text) > MESSAGE_CHARS:
            half = MESSAGE_CHARS // 2
            text = f"{text[:half]}\n[... {len(text) - MESSAGE_CHARS:,} characters cut ...]\n{text[-half:]}"
        calls = "".join(f"\n→ {c.name}({c.arguments}) [{c.id}]" for c in m.tool_calls)
        who = f"tool result {m.tool_call_id}" if m.role == "tool" else m.role
        lines.append(f"## {who}\n{text}{calls}")
    body = "\n\n".join(lines)
    room = int(budget * SUMMARY_INPUT * 4 / max(s.calibration, 0.5))  # ~4 characters per token
    if len(body) > room:  # the oldest part goes first: the previous summary covers what led here
        body = "[... earlier part cut ...]\n" + body[-room:]
    task = s.messages[1].content if len(s.messages) > 1 else ""
    return [
        Message("system", SUMMARY_PROMPT),
        Message("user", f"The task:\n{task}\n\nThe conversation:\n\n{body}"),
    ]


def _summarize(ctx: StepContext, lead: list[Message], before: int, *, cut: int) -> None:
    from durable_agent.models.retry import ModelCallError, RetryPolicy, call_with_retries

    s = ctx.state
    budget = request_budget(ctx.settings)
    request = _summary_request(ctx, cut, budget)
    digest = sha256_text("\n".join(m.content or "" for m in request))
    key = f"compact:{s.turn}:{digest[:32]}"
    model = _summary_model(ctx)
    intent = {
        "stage": "summarize",
        "start": cut,
        "from": max(s.view.start, HEAD),
        "tokens_before": before,
        "model": model.name,
        "request_hash": digest,
    }
    # A summary of this turn cut off or refused before (a resume under another budget asks
    # for another one) is not the one made now.
    spec = StepSpec(
        StepKind.COMPACT,
        key,
        s.turn,
        intent,
        label="context",
        detail="summarizing",
        supersede=True,
        timed=False,
    )

    def summarize(step: Step) -> StepOutcome:
        earlier = step.attempts - 1
        try:
            answer, attempts = call_with_retries(
                lambda: model.complete(request, [], s.turn),
                ctx.retry_policy or RetryPolicy(),
                sleep=ctx.sleep,
            )
        except ModelCallError as exc:
            failed = StepOutcome(
                error=f"compaction summary failed: {exc}", attempts=earlier + exc.attempts
            )
            if exc.failure.reason == "context_length":
                # The summary's own request, not the run's (which model_step retries once after
                # a forced compaction): that would summarize the same messages again.
                refused = ModelError(
                    f"compacting the context failed: the summary request was refused as too long ({exc}); "
                    f"it holds up to {SUMMARY_INPUT:.0%} of the context budget. Resume with a lower "
                    "--max-context-tokens, or start the run again with compact_model set to a model with a "
                    "larger window",
                    attempts=exc.attempts,
                )
                raise EndThenRaise(failed, refused, announce=False) from None
            raise EndThenRaise(failed, exc, announce=False) from None
        summary = _summary_text(ctx, answer, cut)
        usage = answer.usage
        s.prompt_tokens += usage.prompt_tokens
        s.completion_tokens += usage.completion_tokens
        cost = costs.pay(ctx, model.name, usage)
        output: dict[str, Any] = {
            "stage": "summarize",
            "turn": s.turn,
            "start": cut,
            "summary": summary,
            "tokens_before": before,
        }
        s.compacted(output)
        output["tokens_after"] = after = count_next(ctx, lead)
        return StepOutcome(
            output,
            tokens=(usage.prompt_tokens, usage.completion_tokens),
            cached_tokens=usage.cached_tokens,
            cost=cost,
            attempts=earlier + attempts,
            detail=f"summarized messages {intent['from']}-{cut - 1}: {before:,} → {after:,} tokens",
        )

    invoke(ctx, spec, summarize)


_EMPTY = "(the summary came back empty)"
_BEFORE = "\n\nThe summary before it:\n"


def _summary_text(ctx: StepContext, answer: ModelTurn, cut: int) -> str:
    """The summary as kept: redacted, its reasoning block dropped; never nothing (an empty
    answer, only reasoning, or tool calls only still says which results can be read
    again); at most SUMMARY_SHARE of the budget, or the requests after it would pass the
    budget (cut there, and said so); and as the store holds it (a NUL or a lone surrogate
    cleaned), so the history in memory is the one a resume reads back."""
    s = ctx.state
    redactor = ctx.redactor  # (the model's free text, like an answer: escaped spellings too)
    text = redactor.redact_known_escaped(
        redactor.redact(storable(without_reasoning(answer.content or "").strip()))
    )
    if not text:
        # Every result replaced so far, newest first (a cut at the cap drops the oldest), then
        # what the last summary the model wrote said.
        ids = [
            m.tool_call_id
            for m in reversed(s.messages[s.dropped : cut])
            if m.role == "tool" and m.tool_call_id
        ]
        if s.dropped > HEAD:  # those before no longer in memory (loop/replay.py): stored
            ids += ctx.journal.tool_result_ids(HEAD, s.dropped)
        last = s.view.summary or ""
        last = last.partition(_BEFORE)[2] if last.startswith(_EMPTY) else last
        text = (
            f"{_EMPTY} The earlier messages were compacted without one; their tool results can be read "
            f"again with read_output(call_id), newest first: {', '.join(ids) or 'none'}."
            + (f"{_BEFORE}{last}" if last else "")
        )
    if answer.finish_reason == "length":
        text += "\n[the summary was cut off at the model's length limit]"
    limit = request_budget(ctx.settings) * SUMMARY_SHARE
    tokens = text_counter(ctx.model.name)(text) * s.calibration
    if tokens > limit:
        note = "\n[summary cut: it was longer than its share of the context]"
        text = text[: max(int(len(text) * limit / tokens) - len(note), 0)] + note
    return text


class _LocalSummary:
    """Summaries for scripted models: a script's turns are the run's model calls, so a summary
    must not take one. Deterministic: a resume writes the same text."""

    name = "local-summary"

    def complete(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], turn: int
    ) -> ModelTurn:
        text = messages[-1].content or ""
        calls = sorted(set(re.findall(r"\[(call_[A-Za-z0-9_]+)\]", text)))
        return ModelTurn(
            f"Task: as given. State: {text.count('## ')} earlier messages compacted at turn "
            f"{turn}; their tool calls: {', '.join(calls) or 'none'}.",
            usage=Usage(0, 0),
        )


def scripted(model: Any) -> bool:
    """A scripted model (`scripted:PATH`, `demo`): its turns are a script, its token counts made up."""
    name = str(getattr(model, "name", ""))
    return name == "demo" or name.startswith("scripted:")


def _summary_model(ctx: StepContext) -> Any:
    """The model that writes summaries: `compact_model` on the same endpoint, or the run's."""
    if scripted(ctx.model):
        return _LocalSummary()
    name = ctx.settings.compact_model
    if not name or name == ctx.model.name:
        return ctx.model
    from durable_agent.models.openai_chat import OpenAIChatModel

    st = ctx.settings
    key = st.api_key.get_secret_value() if st.api_key else "not-needed"
    return OpenAIChatModel(
        name,
        api_key=key,
        base_url=st.base_url,
        read_timeout=st.request_timeout_s,
        connect_timeout=st.connect_timeout_s,
        temperature=st.temperature,
        api_type=st.api_type,
        api_version=st.api_version,
        stream=st.stream,
    )


def over_budget(ctx: StepContext, counted: int) -> dict[str, int] | None:
    """The next request's size and the budget when compaction left it over the budget
    (nothing left to elide, no summary that helps): it is sent as it is, the provider's
    window judges, but never without the run saying so (the timeline, the step's output)."""
    tokens, budget = int(counted * ctx.state.calibration), request_budget(ctx.settings)
    return {"tokens": tokens, "budget": budget} if tokens > budget else None


def cannot_fit(ctx: StepContext, error: str) -> ModelError:
    """The provider still says the request is too long and nothing is left to compact."""
    tokens = count(ctx, ctx.state.request())
    return ModelError(
        f"{error} — tried: compacting the context (older tool outputs elided, older turns "
        f"summarized; {ctx.state.view.compactions} compactions) and one retry; the request is still "
        f"~{tokens:,} tokens for a budget of {request_budget(ctx.settings):,}. Resume with --model naming a "
        "model with a larger window (its context_window from the config file's [models] table) and "
        "--accept-changes (another model needs consent: docs/versions.md); the run "
        "keeps the output_cap, keep_recent_outputs and compact_at it started with"
    )
