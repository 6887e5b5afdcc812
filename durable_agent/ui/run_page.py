"""The run page: header (status, budgets used as bars, workspace, sandbox, lineage), the
timeline chart, the actions a person can take, every step expandable, the conversation.

The step rows and the chart are also what the live event stream sends (as HTML), so the
page and its updates cannot drift apart."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from msgspec import Struct, field

from durable_agent.presentation import (
    approval_subject,
    counts,
    fmt_age,
    fmt_ms,
    run_cost,
    sandbox_line,
    step_what,
)
from durable_agent.status import RESUMABLE, RunStatus
from durable_agent.store import leases
from durable_agent.store.records import (
    ApprovalRecord,
    MessageRecord,
    RunRecord,
    StepRecord,
    StepState,
)
from durable_agent.store.rows import utcnow
from durable_agent.store.runs import ENDED
from durable_agent.transcript import iso_utc
from durable_agent.ui.pages import e, frame, owner_state, status_badge, u
from durable_agent.ui.queries import FileChange
from durable_agent.ui.timeline import chart, css_class

INLINE_STEPS = (
    200  # up to this many steps their bodies are in the page; beyond, fetched when opened
)
MAX_PRE = 20_000  # characters of one input/output shown inline; the JSON API has all of it


class RunView(Struct, frozen=True):
    run: RunRecord
    steps: list[StepRecord]
    approvals: list[ApprovalRecord]
    messages: list[MessageRecord]
    changes: dict[int, list[FileChange]] = field(default_factory=dict)
    children: list[RunRecord] = field(default_factory=list)  # runs it delegated to


def page(view: RunView, *, csrf: str, notice: str | None = None) -> str:
    run, now = view.run, utcnow()
    inline = len(view.steps) <= INLINE_STEPS
    body = [f'<h1>Run <span class="mono">{e(run.id)}</span></h1>']
    if notice:
        body.append(f'<p class="notice" id="notice">{e(notice)}</p>')
    body.append(f'<section id="header">{header(view, now)}</section>')
    body.append(f'<section id="actions">{actions(view, csrf, now)}</section>')
    if view.children:
        body.append(f"<h2>Child runs</h2>{child_runs(view.children)}")
    body.append(
        f'<h2>Timeline</h2><div class="chart" id="chart">{chart(view.steps, now)}</div>{_legend()}'
    )
    body.append(
        f'<h2>Steps <span class="count" id="step-count">{len(view.steps)}</span></h2>'
        f'<div id="steps">{"".join(step_row(run, s, view.changes.get(s.seq), now, inline=inline) for s in view.steps)}</div>'
    )
    # A model call's answer as it streams in (the "tokens" event, ui.js); empty otherwise.
    body.append(
        '<section id="live" class="live" hidden><h2>Model answering</h2>'
        '<pre class="live-thinking"></pre><p class="live-tools"></p>'
        '<pre class="live-text"></pre></section>'
    )
    body.append(f'<h2>Conversation</h2><div id="conversation">{conversation(view.messages)}</div>')
    return frame(f"run {run.id}", "".join(body), csrf=csrf, run_id=run.id)


def header(view: RunView, now: datetime) -> str:
    run = view.run
    rows = [
        (
            "status",
            status_badge(run.status)
            + (f" ({e(run.stop_reason)})" if run.stop_reason else "")
            + (" · cancel requested" if run.cancel_requested else ""),
        ),
        ("task", f'<span class="task">{e(run.task)}</span>'),
        ("model", e(run.model)),
        ("workspace", f'<span class="mono">{e(run.workspace)}</span>'),
    ]
    sandbox = sandbox_line(run.settings)
    if sandbox:
        rows.append(("sandbox", e(sandbox)))
    if (
        run.forked_from
    ):  # lineage, as `show` prints it (from the run's row: the live header keeps it)
        after = "" if run.fork_seq is None else f" after step {run.fork_seq}"
        rows.append(
            (
                "forked from",
                f'<a href="/runs/{u(run.forked_from)}">{e(run.forked_from)}</a>{e(after)}',
            )
        )
    if run.parent_id:  # delegated (docs/delegation.md)
        step = "" if run.parent_step is None else f" in its step {run.parent_step}"
        rows.append(
            ("parent", f'<a href="/runs/{u(run.parent_id)}">{e(run.parent_id)}</a>{e(step)}')
        )
    rows.append(("created", f"{e(iso_utc(run.created_at))} ({e(fmt_age(run.created_at))})"))
    if run.finished_at:
        rows.append(("finished", e(iso_utc(run.finished_at))))
    rows.append(
        (
            "owner",
            f'<span class="owner o-{owner_state(run, now)}">{owner_state(run, now)}</span>'
            + (f" {e(run.lease_owner)} (epoch {run.lease_epoch})" if run.lease_owner else ""),
        )
    )
    cost = run_cost(run)
    rows.append(
        (
            "totals",
            e(
                f"{counts(run, len(view.steps))} · {run.prompt_tokens}+{run.completion_tokens} tokens"
                + ("" if cost is None else f" · cost {cost:.4f}")
                + f" · {fmt_ms(run.active_ms)} active"
                + (f" · resumed {run.resume_count}×" if run.resume_count else "")
            ),
        )
    )
    if run.error:
        rows.append(("error", f'<span class="error">{e(run.error)}</span>'))
    if run.answer:
        rows.append(("answer", f'<pre class="answer">{e(run.answer)}</pre>'))
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="header">{table}</table><div class="budgets">{budgets(run)}</div>'


def child_runs(children: list[RunRecord]) -> str:
    """The runs this one delegated to: each linked, with its status, cost and task."""
    rows = []
    for c in children:
        cost = run_cost(c)
        spent = f"{c.prompt_tokens + c.completion_tokens} tokens" + (
            "" if cost is None else f" · cost {cost:.4f}"
        )
        rows.append(
            f'<tr><td><a class="mono" href="/runs/{u(c.id)}">{e(c.id)}</a></td>'
            f"<td>{status_badge(c.status)}</td><td>{e(spent)}</td>"
            f'<td class="task">{e(c.task)}</td></tr>'
        )
    return f'<table class="children">{"".join(rows)}</table>'


def budgets(run: RunRecord) -> str:
    """Each budget the run has, as used / allowed and a bar (red once it is spent)."""
    settings = run.settings if isinstance(run.settings, dict) else {}
    used: list[tuple[str, str, float, Any]] = [
        ("model calls", "max_steps", run.step_count, settings.get("max_steps")),
        ("tool calls", "max_tool_calls", run.tool_call_count, settings.get("max_tool_calls")),
        (
            "tokens",
            "max_tokens",
            run.prompt_tokens + run.completion_tokens,
            settings.get("max_tokens"),
        ),
        ("seconds", "max_seconds", run.active_ms / 1000, settings.get("max_seconds")),
        ("cost", "max_cost", run_cost(run) or 0.0, settings.get("max_cost")),
    ]
    bars = []
    for label, name, value, limit in used:
        if not isinstance(limit, int | float) or isinstance(limit, bool) or limit <= 0:
            continue
        share = min(value / limit, 1.0)
        full = " full" if value >= limit else ""
        bars.append(
            f'<div class="budget" data-budget="{name}"><span class="label">{label}</span>'
            f'<span class="bar{full}"><span style="width:{share * 100:.1f}%"></span></span>'
            f'<span class="used">{_num(value)} / {_num(limit)}</span></div>'
        )
    return "".join(bars) or '<p class="muted">no budgets recorded</p>'


def _num(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def actions(view: RunView, csrf: str, now: datetime) -> str:
    run = view.run
    pending = next((a for a in reversed(view.approvals) if a.decision is None), None)
    out = []
    if pending is not None and run.status == RunStatus.BLOCKED:
        what = approval_subject(pending.tool_name, pending.command, 400)
        out.append(
            f'<div class="question" id="question"><p>The run asks ({e(pending.kind)}, call '
            f"{e(pending.call_id)}): <code>{e(what)}</code></p>"
            # (a diff of what changed since the checkpoint is one line per change: kept)
            + (f'<p class="reason">{e(pending.reason)}</p>' if pending.reason else "")
            + _form(run.id, "approve", "approve and resume", csrf, by=True)
            + _form(run.id, "deny", "deny and resume", csrf, by=True)
            + "</div>"
        )
    if leases.is_executing(run, now) or run.status in (RunStatus.PENDING, RunStatus.WAITING):
        out.append(_form(run.id, "cancel", "cancel", csrf))
    elif run.status in RESUMABLE and pending is None:
        out.append(_form(run.id, "resume", "resume on the worker queue", csrf))
    if run.status == RunStatus.PENDING:
        out.append(
            '<p class="muted">pending: a worker (`durable-agent worker`) will continue it</p>'
        )
    if run.status == RunStatus.WAITING:
        out.append(
            '<p class="muted">waiting for its child runs: a worker continues it once they ended</p>'
        )
    if run.status in ENDED:  # a follow-up: a new turn of the history (`durable-agent continue`)
        out.append(
            f'<form method="post" action="/runs/{u(run.id)}/continue" class="action">'
            f'<input type="hidden" name="csrf" value="{e(csrf)}">'
            '<textarea name="message" rows="2" cols="60" maxlength="20000" '
            'placeholder="a follow-up: what should it do next?"></textarea>'
            '<button type="submit" id="continue-button" class="b-continue">continue</button></form>'
        )
    return "".join(out)


def _form(run_id: str, action: str, label: str, csrf: str, *, by: bool = False) -> str:
    name = '<input name="by" placeholder="your name" maxlength="60">' if by else ""
    return (
        f'<form method="post" action="/runs/{u(run_id)}/{action}" class="action">'
        f'<input type="hidden" name="csrf" value="{e(csrf)}">{name}'
        f'<button type="submit" id="{action}-button" class="b-{action}">{e(label)}</button></form>'
    )


def step_row(
    run: RunRecord,
    s: StepRecord,
    changes: list[FileChange] | None,
    now: datetime,
    *,
    inline: bool = True,
) -> str:
    """One step as `<details>`: its line, and (inline, or fetched when it is opened on long
    pages) its input, output, error and changed files."""
    state = s.state
    if state == StepState.STARTED and not leases.is_executing(run, now):
        state = "cut off"  # an intent without an outcome: the next resume settles it
    tokens = (
        f" · {s.prompt_tokens}+{s.completion_tokens} tokens" if s.prompt_tokens is not None else ""
    )
    if s.cached_tokens:
        tokens += f" ({s.cached_tokens} cached)"
    if s.cost is not None:
        tokens += f" · cost {s.cost:.4f}"
    tries = f" · {s.attempts} attempts" if s.attempts > 1 else ""
    summary = (
        f'<span class="seq">#{s.seq}</span> <span class="{css_class(s)} chip">{e(s.kind)}'
        f'{"" if not s.effect else " " + e(s.effect)}</span> <span class="state st-{e(state.replace(" ", "-"))}">'
        f'{e(state)}</span> <span class="what">{e(step_what(run, s))}</span> '
        f'<span class="muted">{e(fmt_ms(s.duration_ms))}{e(tokens)}{e(tries)}</span>'
    )
    if inline:
        body, lazy = step_body(s, changes), ""
    else:
        body = (
            f'<a href="/api/runs/{u(run.id)}/steps?from={s.seq}&amp;limit=1">input and output</a>'
        )
        lazy = " data-lazy"
    return (
        f'<details class="step" id="step-{s.seq}" data-seq="{s.seq}" data-state="{e(s.state)}"{lazy}>'
        f'<summary>{summary}</summary><div class="body">{body}</div></details>'
    )


def step_body(s: StepRecord, changes: list[FileChange] | None) -> str:
    parts = [
        f"<dl><dt>started</dt><dd>{e(iso_utc(s.started_at))}</dd>"
        f"<dt>finished</dt><dd>{e(iso_utc(s.finished_at) if s.finished_at else None)}</dd>"
        f"<dt>duration</dt><dd>{e(fmt_ms(s.duration_ms))}</dd><dt>attempts</dt><dd>{s.attempts}</dd>"
        f'<dt>key</dt><dd class="mono">{e(s.idempotency_key)}</dd>'
        f"<dt>lease epoch</dt><dd>{e(s.lease_epoch)}</dd></dl>"
    ]
    parts.append(f"<h4>input</h4><pre>{_json(s.input)}</pre>")
    parts.append(f"<h4>output</h4><pre>{_json(s.output)}</pre>")
    if s.error:
        parts.append(f'<h4>error</h4><pre class="error">{e(s.error)}</pre>')
    if changes:
        files = "".join(
            f'<li><span class="change c-{e(c.change)}">{e(c.change)}</span> '
            f'<span class="mono">{e(c.path)}</span> <span class="muted">{e(c.bytes)} bytes</span></li>'
            for c in changes
        )
        diff = f"/runs/{u(s.run_id)}/steps/{s.seq}/diff"
        parts.append(
            f'<h4>files changed <a class="muted" href="{diff}">diff</a></h4><ul class="files">{files}</ul>'
            f'<pre class="diff" data-diff="{diff}">(the diff is at the link above)</pre>'
        )  # ui.js fills it
    return "".join(parts)


def _json(value: Any) -> str:
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, indent=2, ensure_ascii=False, default=str)
    )
    if len(text) > MAX_PRE:
        text = (
            text[:MAX_PRE] + f"\n… ({len(text) - MAX_PRE} more characters: see /api/runs/…/steps)"
        )
    return e(text)


def conversation(messages: list[MessageRecord]) -> str:
    if not messages:
        return '<p class="muted">no messages</p>'
    out = []
    for m in messages:
        calls = ""
        if m.tool_calls:
            calls = f'<pre class="calls">{_json(m.tool_calls)}</pre>'
        about = f" · answers {e(m.tool_call_id)}" if m.tool_call_id else ""
        if m.role == "system":  # long and the same for every run: folded
            out.append(
                f'<details class="msg r-system" data-seq="{m.seq}"><summary class="role">system prompt</summary>'
                f"<pre>{e(m.content or '')}</pre></details>"
            )
            continue
        out.append(
            f'<div class="msg r-{e(m.role)}" data-seq="{m.seq}"><div class="role">{e(m.role)}{about}</div>'
            f"<pre>{e(m.content or '')}</pre>{calls}</div>"
        )
    return "".join(out)


def _legend() -> str:
    kinds = [
        ("k-model", "model call"),
        ("e-read", "tool: read"),
        ("e-write", "tool: write"),
        ("e-exec", "tool: exec"),
        ("k-verify", "verify"),
        ("k-compact", "compaction"),
        ("failed", "failed"),
        ("retried", "retried"),
    ]
    items = "".join(
        f'<span class="key"><span class="swatch mark {c}"></span>{t}</span>' for c, t in kinds
    )
    return (
        f'<div class="legend">{items}<span class="key"><span class="swatch resume-key"></span>resumed</span>'
        f'<span class="key"><span class="swatch gap-key"></span>stopped</span></div>'
    )
