"""Server-rendered HTML: the page frame and the runs list. Every value from the store goes
through `escape` (a task, a tool's output or a file name may hold markup); the only script
is the package's own static/ui.js (no CDN: the view works offline)."""

from __future__ import annotations

from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from durable_agent.presentation import fmt_age, fmt_ms, run_cost, short
from durable_agent.status import RunStatus
from durable_agent.store import leases
from durable_agent.store.records import RunRecord
from durable_agent.store.rows import utcnow
from durable_agent.ui.queries import RunPage


def e(value: Any) -> str:
    """Text for HTML: escaped, None as a dash."""
    return "-" if value is None else escape(str(value), quote=True)


def u(run_id: str) -> str:
    """A run id as a path segment of a link (ids made outside the CLI may hold anything)."""
    return e(quote(run_id, safe=""))


def frame(title: str, body: str, *, csrf: str, run_id: str | None = None) -> str:
    # (No CSRF token on a page that must not carry one: a link's, read without the view's.)
    attrs = (f' data-csrf="{e(csrf)}"' if csrf else "") + (
        f' data-run="{e(run_id)}"' if run_id else ""
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · durable-agent</title>"
        '<link rel="stylesheet" href="/static/ui.css">'
        '<script defer src="/static/ui.js"></script></head>'
        f'<body{attrs}><header class="top"><a href="/">durable-agent</a></header>'
        f"<main>{body}</main></body></html>"
    )


def owner_state(run: RunRecord, now: datetime) -> str:
    """live: a process holds its lease now · dead: a lease whose holder is gone or expired ·
    none: nobody holds it."""
    if run.lease_owner is None:
        return "none"
    return "live" if leases.is_live(run.lease_owner, run.lease_expires_at, now) else "dead"


def duration_ms(run: RunRecord) -> int:
    return run.active_ms


def status_badge(status: str) -> str:
    return f'<span class="status s-{e(status)}">{e(status)}</span>'


def runs_list(page: RunPage, *, status: str | None, needle: str | None, csrf: str) -> str:
    now = utcnow()
    options = "".join(
        f'<option value="{s.value}"{" selected" if s.value == status else ""}>{s.value}</option>'
        for s in RunStatus
    )
    form = (
        f'<form class="filters" method="get" action="/">'
        f'<select name="status"><option value="">any status</option>{options}</select>'
        f'<input type="search" name="q" placeholder="id or task" value="{e(needle or "")}">'
        f'<button type="submit">filter</button></form>'
    )
    if not page.runs:
        rows = (
            '<tr><td colspan="11" class="empty">no runs'
            + (" match" if status or needle else " yet")
            + "</td></tr>"
        )
    else:
        rows = "".join(_run_row(r, now) for r in page.runs)
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "run",
            "status",
            "stop reason",
            "task",
            "model",
            "model calls",
            "tokens",
            "cost",
            "age",
            "duration",
            "owner",
        )
    )
    more = ""
    if page.next_cursor:
        query = {
            k: v for k, v in (("status", status), ("q", needle), ("after", page.next_cursor)) if v
        }
        more = (
            f'<p class="more"><a id="next-page" href="/?{e(urlencode(query))}">older runs →</a></p>'
        )
    body = (
        f'<h1>Runs</h1>{form}<table class="runs" id="runs"><thead><tr>{head}</tr></thead>'
        f"<tbody>{rows}</tbody></table>{more}"
    )
    return frame("runs", body, csrf=csrf)


def _run_row(r: RunRecord, now: datetime) -> str:
    cost = run_cost(r)
    tokens = r.prompt_tokens + r.completion_tokens
    return (
        f'<tr class="run" data-id="{e(r.id)}"><td><a href="/runs/{u(r.id)}">{e(r.id)}</a></td>'
        f"<td>{status_badge(r.status)}</td><td>{e(r.stop_reason)}</td>"
        f'<td class="task">{e(short(r.task, 90))}</td><td>{e(short(r.model, 40))}</td>'
        f'<td class="num">{r.step_count}</td><td class="num">{tokens}</td>'
        f'<td class="num">{"-" if cost is None else f"{cost:.4f}"}</td>'
        f"<td>{e(fmt_age(r.created_at))}</td><td>{e(fmt_ms(duration_ms(r)))}</td>"
        f'<td class="owner o-{owner_state(r, now)}">{owner_state(r, now)}</td></tr>'
    )


def error_page(status: int, message: str, *, csrf: str) -> str:
    return frame(
        str(status),
        f'<h1>{status}</h1><p class="error">{e(message)}</p><p><a href="/">all runs</a></p>',
        csrf=csrf,
    )
