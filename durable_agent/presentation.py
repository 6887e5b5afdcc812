"""How a run and its steps read, for every face of the store: the CLI's output
(cli/render.py), the web view (ui/) and the demo. The text and JSON shapes live here once, so
`show` and a run's page cannot drift apart, and the web view needs nothing of the CLI."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from msgspec import UNSET
from msgspec.structs import fields

from durable_agent.status import StepKind
from durable_agent.store.payloads import (
    CompactInput,
    CompactOutput,
    HookInput,
    HookOutput,
    MemoryInput,
    ModelOutput,
    ToolInput,
    ToolOutput,
    UserMessageInput,
    UserMessageOutput,
    VerifyInput,
    VerifyOutput,
)
from durable_agent.store.records import ApprovalRecord, RunRecord, StepRecord, StepState
from durable_agent.store.rows import utcnow
from durable_agent.transcript import as_dict, iso_utc

# What an approval asks reads the same everywhere; it lives beside `visible` so the loop's
# blocked message (below this layer) words it the same way.
from durable_agent.visible import approval_subject as approval_subject
from durable_agent.visible import call_arguments as call_arguments
from durable_agent.visible import tool_label as tool_label


def short(value: Any, width: int) -> str:
    """One line, at most `width` characters (an ellipsis marks the cut). A value that is
    not text (a stored value of another shape, see transcript.as_dict) is shown as JSON."""
    text = (
        value
        if isinstance(value, str)
        else ""
        if value is None
        else json.dumps(value, ensure_ascii=False)
    )
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def fmt_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms // 60_000} min {ms % 60_000 // 1000} s"


def fmt_age(when: datetime | None) -> str:
    if when is None:
        return "-"
    secs = int((utcnow() - when).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit} ago"
    return f"{max(secs, 0)}s ago"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def run_cost(run: RunRecord) -> float | None:
    """The run's cost: the sum of its steps' (each at its model's price when it was paid);
    for a run recorded before steps kept a cost, its tokens at the price in its settings."""
    if run.cost is not None:
        return run.cost
    price = as_dict(as_dict(run.settings).get("prices")).get(str(run.model))
    if price is None:
        return None  # (most runs: no pydantic import for `list` and `show`)
    from pydantic import ValidationError

    from durable_agent.config.settings import ModelPrice

    try:
        return ModelPrice.model_validate(price).cost(run.prompt_tokens, run.completion_tokens)
    except (ValidationError, TypeError, ValueError):  # an unreadable price
        return None


def counts(run: RunRecord, steps: int | None) -> str:
    """`9 model calls · 17 steps · 8 tool calls`: model calls are what --max-steps counts;
    steps are the timeline's rows (model calls, tool calls, verifications)."""
    rows = "" if steps is None else f" · {plural(steps, 'step')}"
    return (
        f"{plural(run.step_count, 'model call')}{rows} · {plural(run.tool_call_count, 'tool call')}"
    )


def sandbox_line(settings: Any) -> str | None:
    """How the run's commands were contained, from its recorded settings (None for runs
    recorded before `--sandbox` existed)."""
    if not isinstance(settings, dict) or "sandbox" not in settings:
        return None
    mode, mechanism = settings["sandbox"], settings.get("sandbox_mechanism")
    if mode == "off":
        return "off (commands ran unconfined)"
    net = "network on" if settings.get("network") else "network off"
    if mechanism in (None, "none"):
        return f"{mode}, no mechanism available (commands refused), {net}"
    return f"{mode} by {mechanism}, {net}"


def step_what(run: RunRecord, s: StepRecord) -> str:
    """A step in a few words: `→ read_file` (a model call's decision), `edit_file {"path": …}`."""
    if s.kind == StepKind.MODEL:
        return _model_what(run, s)
    if s.kind == StepKind.COMPACT:
        given, out = s.typed_input, s.typed_output
        stage = given.stage if isinstance(given, CompactInput) else "?"
        sizes = ""
        if isinstance(out, CompactOutput):
            before, after = out.tokens_before, out.tokens_after
            if before is not UNSET and after is not UNSET:
                sizes = f": {before:,} → {after:,} tokens"
        return f"context {stage}{sizes}"
    if s.kind == StepKind.MEMORY:
        loaded = s.typed_input
        if not isinstance(loaded, MemoryInput):
            return "project memory"
        names = ", ".join(f.path for f in loaded.files) or "no files"
        return short(f"project memory: {names} (sha256 {loaded.sha256[:12]})", 90)
    if s.kind == StepKind.USER_MESSAGE:
        given, out = s.typed_input, s.typed_output
        text = given.message if isinstance(given, UserMessageInput) else "?"
        closed = out.closed_calls if isinstance(out, UserMessageOutput) else UNSET
        said = f"you: {short(' '.join(text.split()), 80)}"
        return said + (f" (closed {plural(len(closed), 'unanswered call')})" if closed else "")
    if s.kind == StepKind.VERSION:  # loop/versions.py: consent to what changed
        consent: dict[str, Any] = s.input if isinstance(s.input, dict) else {}
        changes = consent.get("changes") or []
        by = consent.get("accepted_by")
        return f"{len(changes)} change(s) since the checkpoint, accepted by {by}"
    if s.kind == StepKind.WORKSPACE:  # a batch task's workspace (docs/fleets.md)
        made = s.input if isinstance(s.input, dict) else {}
        return (
            f"workspace from {short(str(made.get('repo')), 60)} @ {short(str(made.get('ref')), 20)}"
        )
    if s.kind == StepKind.VERIFY:
        verify = s.typed_input
        command = verify.command if isinstance(verify, VerifyInput) else None
        return f"verify `{short(command, 60)}`"
    if s.kind == StepKind.HOOK:
        hook, done = s.typed_input, s.typed_output
        if not isinstance(hook, HookInput):
            return "hook"
        ended = ""
        if isinstance(done, HookOutput):
            ended = f" → exit {done.exit_code}" if done.exit_code is not None else " → not run"
        on = f" {hook.tool}" if isinstance(hook.tool, str) else ""
        return f"hook {hook.event}{on} `{short(hook.command, 50)}`{ended}"
    tool = s.typed_input
    args = tool.arguments if isinstance(tool, ToolInput) else None
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return f"{s.tool_name} {short(text, 70)}"


def turn_starts(steps: list[StepRecord]) -> dict[int, int]:
    """Where each turn of a continued run began: {seq of its completed user_message step:
    turn number}. Turn 1 is the task (before the first step); empty for a run of one turn."""
    seqs = [
        s.seq for s in steps if s.kind == StepKind.USER_MESSAGE and s.state == StepState.COMPLETED
    ]
    return {seq: i + 2 for i, seq in enumerate(seqs)}


def _model_what(run: RunRecord, s: StepRecord) -> str:
    call = f"model call {s.turn + 1} " if s.turn is not None else ""
    out = s.typed_output
    if not isinstance(out, ModelOutput):  # no outcome yet, or not this version's shape
        return call + str(run.model)
    names = [short(c.function.name or "?", 40) for c in out.tool_calls]
    over = out.over_budget
    if over is not UNSET:
        call += f"(~{over.tokens:,} tokens, over the budget of {over.budget:,}) "
    if names:
        return call + "→ " + ", ".join(names)
    nudge = out.nudge.reason if out.nudge is not UNSET else None
    if nudge == "length":  # not an answer: the model was told to continue
        cut = out.content or ""
        return (
            call
            + "→ cut off at the length limit, told to continue"
            + (f": {short(cut, 40)}" if cut else "")
        )
    if nudge == "empty_answer":  # nothing, or only a reasoning block
        return call + "→ empty answer, told to answer"
    if out.content:
        return call + "→ answer: " + short(out.content, 60)
    return call + "→ empty answer"  # completed with neither text nor a call


def estimated_tokens(s: StepRecord) -> bool:
    """A model call whose token counts are the harness's estimate (no usage was reported)."""
    out = s.typed_output
    return isinstance(out, ModelOutput) and out.usage.estimated is True


def workspace_note(s: StepRecord) -> str | None:
    """What the step's after snapshot left out, and why (None: nothing)."""
    out = s.typed_output
    if isinstance(out, ToolOutput | VerifyOutput) and out.workspace_note is not UNSET:
        return out.workspace_note or None
    return None


# -- JSON shapes (`show --json` and the web view's API) ---------------------------------
def iso_value(value: Any) -> Any:
    return iso_utc(value) if isinstance(value, datetime) else value


def row_json(row: Any) -> dict[str, Any]:
    return {f.name: iso_value(getattr(row, f.name)) for f in fields(row)}


def run_json(run: RunRecord, *, settings: bool = True) -> dict[str, Any]:
    doc = row_json(run)
    if not settings:
        doc.pop("settings", None)
    return doc


def show_json(
    run: RunRecord, steps: list[StepRecord], approvals: list[ApprovalRecord]
) -> dict[str, Any]:
    doc = run_json(run)
    doc["steps"] = [row_json(s) for s in steps]
    doc["approvals"] = [row_json(a) for a in approvals]
    return doc
