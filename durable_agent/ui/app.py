"""The routes of `durable-agent ui` (Starlette): pages, the JSON API, the live event
stream, the actions. Store reads are blocking SQLAlchemy calls: they run in Starlette's
thread pool, never on the event loop."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from msgspec import Struct
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from durable_agent import live as live_channel
from durable_agent import presentation
from durable_agent.errors import DurableAgentError, RunBusy, RunNotFound, StoreError
from durable_agent.status import RunStatus
from durable_agent.store import leases
from durable_agent.store.records import StepRecord, StepState
from durable_agent.store.rows import utcnow
from durable_agent.store.runs import Store
from durable_agent.ui import actions, link_page, pages, queries, run_page
from durable_agent.ui.security import Access, BodyTooLarge, Guard
from durable_agent.ui.timeline import chart

STATIC = Path(__file__).resolve().parent / "static"
STATUSES = {s.value for s in RunStatus}
KEEPALIVE_S = 15.0
LIVE_S = 0.1  # how often a streaming call's live file is looked at between two polls


class UiConfig(Struct, frozen=True):
    store: Store
    access: Access
    user: str  # who decides when the form names nobody: "token-holder" or the local user
    poll_s: float = 0.5  # how often the event stream looks for new steps
    stream_max_s: float = 3600.0  # one event stream's life; the browser reconnects
    # The server is shutting down: open streams end at their next poll (the browser then
    # reconnects), before the server's graceful timeout would cancel them with a traceback.
    stopping: Callable[[], bool] = lambda: False
    # Where the runs' live channels are (durable_agent/live.py): a streaming call's tokens
    # so far, sent as "tokens" events; None: no live tokens.
    live_dir: Path | None = None
    link_key: str | None = None  # checks notifications' approve/deny links (store/links.py)


def _json(doc: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(doc, ensure_ascii=False), status_code=status, media_type="application/json"
    )


def build_app(cfg: UiConfig) -> Any:
    store, access = cfg.store, cfg.access
    extras = queries.Changes(store)

    def fail(request: Request, exc: Exception) -> Response:
        status = (
            404
            if isinstance(exc, RunNotFound)
            else 409
            if isinstance(exc, RunBusy | DurableAgentError)
            else 500
        )
        if isinstance(exc, StoreError):
            status = 503
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if request.url.path.startswith("/api/"):
            return _json({"error": message}, status)
        return HTMLResponse(pages.error_page(status, message, csrf=access.csrf), status_code=status)

    def filters(request: Request) -> tuple[str | None, str | None, str | None, int]:
        status = request.query_params.get("status") or None
        if status is not None and status not in STATUSES:
            raise UnknownStatus(status)
        needle = (request.query_params.get("q") or "").strip()[:200] or None
        limit = request.query_params.get("limit", "")
        size = (
            min(max(found, 1), 500) if (found := _number(limit)) is not None else queries.PAGE_SIZE
        )
        return status, needle, request.query_params.get("after") or None, size

    def index(request: Request) -> Response:
        status, needle, after, size = filters(request)
        page = queries.run_page(store, status=status, needle=needle, cursor=after, limit=size)
        return HTMLResponse(pages.runs_list(page, status=status, needle=needle, csrf=access.csrf))

    def view(run_id: str) -> run_page.RunView:
        run = store.get_run(run_id)
        return run_page.RunView(
            run,
            store.steps(run_id),
            store.approvals(run_id),
            store.messages(run_id),
            extras.by_step(run_id),
            store.children(run_id),
        )

    def run_html(request: Request) -> Response:
        notice = actions.NOTICES.get(request.query_params.get("done", ""))
        return HTMLResponse(run_page.page(view(_run_id(request)), csrf=access.csrf, notice=notice))

    def step_html(request: Request) -> Response:
        run_id, seq = _run_id(request), _number(request.path_params["seq"])
        if seq is None or seq > MAX_SEQ:
            store.get_run(run_id)
            return HTMLResponse("no such step", status_code=404)
        found = [s for s in queries.steps_from(store, run_id, seq, 1) if s.seq == seq]
        if not found:
            store.get_run(run_id)  # 404 naming the run when it is the run that is missing
            return HTMLResponse("no such step", status_code=404)
        return HTMLResponse(run_page.step_body(found[0], extras.by_step(run_id).get(seq)))

    def step_diff(request: Request) -> Response:
        """What one step changed in the workspace, as `durable-agent diff --step` prints it."""
        from durable_agent.workspace.diffing import step_diff as diff_lines

        run_id, seq = _run_id(request), _number(request.path_params["seq"])
        store.get_run(run_id)  # 404 naming the run when it is the run that is missing
        if seq is None or seq > MAX_SEQ:
            return HTMLResponse("no such step", status_code=404)
        lines = diff_lines(store.engine, run_id, seq)  # the store is at head: snapshot tables exist
        if lines is None:
            return HTMLResponse("no such step", status_code=404)
        return PlainTextResponse(
            "".join(lines), headers={"Content-Type": "text/plain; charset=utf-8"}
        )

    def api_runs(request: Request) -> Response:
        status, needle, after, size = filters(request)
        page = queries.run_page(store, status=status, needle=needle, cursor=after, limit=size)
        return _json(
            {
                "runs": [presentation.run_json(r, settings=False) for r in page.runs],
                "next": page.next_cursor,
            }
        )

    def api_run(request: Request) -> Response:
        run_id = _run_id(request)
        run, steps, approvals = store.get_run(run_id), store.steps(run_id), store.approvals(run_id)
        return _json(presentation.show_json(run, steps, approvals))  # what `show --json` prints

    def api_steps(request: Request) -> Response:
        run_id = _run_id(request)
        store.get_run(run_id)  # 404 for an unknown run, not an empty list
        first, limit = request.query_params.get("from", "0"), request.query_params.get("limit", "")
        found = queries.steps_from(
            store,
            run_id,
            min(_number(first) or 0, MAX_SEQ),
            None if (most := _number(limit)) is None else min(most, MAX_SEQ),
        )
        return _json([presentation.row_json(s) for s in found])

    async def events(request: Request) -> Response:
        run_id = _run_id(request)
        await run_in_threadpool(store.get_run, run_id)
        first = request.query_params.get("from", "0")
        stream = _Stream(store, extras, run_id, min(_number(first) or 0, MAX_SEQ), cfg)
        return StreamingResponse(
            stream.events(request.is_disconnected),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    def act(name: str) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:  # our forms are url-encoded (no python-multipart needed for a few fields)
                form = {
                    k: v[0]
                    for k, v in parse_qs((await request.body()).decode("utf-8", "replace")).items()
                }
            except BodyTooLarge:
                return Response(
                    "request body too large\n", status_code=413, media_type="text/plain"
                )
            csrf = form.get("csrf")
            if not access.csrf_ok(csrf if isinstance(csrf, str) else None):
                return Response(
                    "missing or wrong CSRF token: reload the page\n",
                    status_code=403,
                    media_type="text/plain",
                )
            run_id = _run_id(request)
            by = form.get("by")
            who = actions.decided_by(by if isinstance(by, str) else None, default=cfg.user)
            if name in ("approve", "deny"):
                done = await run_in_threadpool(
                    lambda: actions.answer(store, run_id, approved=name == "approve", by=who)
                )
            elif name == "cancel":
                done = await run_in_threadpool(actions.cancel, store, run_id)
            elif name == "continue":
                said = form.get("message")
                message = said if isinstance(said, str) else ""
                done = await run_in_threadpool(actions.continue_run, store, run_id, message)
            else:
                done = await run_in_threadpool(actions.resume, store, run_id)
            return RedirectResponse(
                f"/runs/{quote(done.run_id, safe='')}?done={done.notice}", status_code=303
            )

        return endpoint

    async def link(request: Request) -> Response:
        token = request.path_params["token"]
        handler = link_page.decide if request.method == "POST" else link_page.show
        page = await run_in_threadpool(handler, store, cfg.link_key, token)
        return HTMLResponse(page.html, status_code=page.status)

    def bad_status(request: Request, exc: Exception) -> Response:
        message = f"unknown status {exc}; one of: {', '.join(sorted(STATUSES))}"
        if request.url.path.startswith("/api/"):
            return _json({"error": message}, 400)
        return HTMLResponse(pages.error_page(400, message, csrf=access.csrf), status_code=400)

    routes = [
        Route("/", index),
        Route("/runs/{run_id}", run_html),
        # {seq} as text: Starlette's int convertor turns 5,000 digits into a 500
        Route("/runs/{run_id}/steps/{seq}", step_html),
        Route("/runs/{run_id}/steps/{seq}/diff", step_diff),
        *(
            Route(f"/runs/{{run_id}}/{name}", act(name), methods=["POST"])
            for name in ("approve", "deny", "cancel", "resume", "continue")
        ),
        Route("/link/{token}", link, methods=["GET", "POST"]),
        Route("/api/runs", api_runs),
        Route("/api/runs/{run_id}", api_run),
        Route("/api/runs/{run_id}/steps", api_steps),
        Route("/api/runs/{run_id}/events", events),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(
        routes=routes, exception_handlers={DurableAgentError: fail, UnknownStatus: bad_status}
    )
    return Guard(app, access)


def _run_id(request: Request) -> str:
    """The run an address names. One with NUL names none (no run id holds it) and is not
    looked up: PostgreSQL refuses NUL in a parameter, which would read as the store failing."""
    run_id: str = request.path_params["run_id"]
    if "\x00" in run_id:
        raise RunNotFound(run_id)
    return run_id


class UnknownStatus(Exception):
    """A ?status= that is no run status: 400 naming the ones there are."""


MAX_SEQ = 2**63 - 1
"""The largest step number a store can hold (BIGINT): a bigger one names no step."""


def _number(text: str) -> int | None:
    """A number from a URL: ASCII digits only (`str.isdigit` takes "²", which int() refuses),
    beyond MAX_SEQ capped there, without converting thousands of digits (Python refuses)."""
    if not text or not text.isascii() or not text.isdigit():
        return None
    digits = text.lstrip("0") or "0"
    return MAX_SEQ + 1 if len(digits) > 19 else min(int(digits), MAX_SEQ + 1)


def _signature(step: StepRecord) -> tuple[Any, ...]:
    return step.state, step.attempts, step.finished_at


class _Stream:
    """One page's live feed: every poll, the steps from the oldest one still open, and an
    event with the changed rows (as HTML), the chart, the header and the actions when
    anything changed. It ends once the run is neither executing nor queued."""

    def __init__(
        self, store: Store, extras: queries.Changes, run_id: str, first: int, cfg: UiConfig
    ) -> None:
        self.store, self.extras, self.run_id, self.cfg = store, extras, run_id, cfg
        self.known: dict[int, StepRecord] = {}
        self.sent: dict[int, tuple[Any, ...]] = {}
        self.first = first  # the page already shows the closed steps before this one
        self.run_sig: tuple[Any, ...] | None = None
        self.live_sig: tuple[Any, ...] | None = None  # of the tokens event last sent

    def tokens(self) -> dict[str, Any] | None:
        """The run's streaming call as its live file has it, when it changed since the last
        one sent; `{"seq": None}` once it is gone (the call ended: its step row says how)."""
        if self.cfg.live_dir is None or "/" in self.run_id:
            return None
        state = live_channel.read(self.cfg.live_dir / f"{self.run_id}.json")
        sig = None if state is None else (state.get("seq"), state.get("try"), state.get("version"))
        if sig == self.live_sig:
            return None
        self.live_sig = sig
        return state if state is not None else {"seq": None}

    def poll(self) -> tuple[dict[str, Any] | None, bool]:
        if not self.known:  # first look: all of it (the chart needs every step)
            for s in queries.steps_from(self.store, self.run_id, 0):
                self.known[s.seq] = s
                if s.seq < self.first and s.state != StepState.STARTED:
                    self.sent[s.seq] = _signature(s)  # the page shows it already
        else:
            open_seqs = [seq for seq, r in self.known.items() if r.state == StepState.STARTED]
            start = min(open_seqs, default=max(self.known) + 1)
            for s in queries.steps_from(self.store, self.run_id, start):
                self.known[s.seq] = s
        run = self.store.get_run(self.run_id)
        now = utcnow()
        live = leases.is_executing(run, now) or run.status in (
            RunStatus.PENDING,
            RunStatus.WAITING,
        )
        changed = [
            s for seq, s in sorted(self.known.items()) if self.sent.get(seq) != _signature(s)
        ]
        run_sig = (run.status, run.updated_at, run.lease_owner, run.message_count)
        if not changed and run_sig == self.run_sig:
            return None, live
        self.run_sig = run_sig
        for s in changed:
            self.sent[s.seq] = _signature(s)
        steps = [self.known[k] for k in sorted(self.known)]
        changes = self.extras.by_step(self.run_id) if changed else {}
        view = run_page.RunView(
            run, steps, self.store.approvals(self.run_id), self.store.messages(self.run_id)
        )
        doc = {
            "status": run.status,
            "count": len(steps),
            "live": live,
            "steps": [
                {"seq": s.seq, "html": run_page.step_row(run, s, changes.get(s.seq), now)}
                for s in changed
            ],
            "chart": chart(steps, now),
            "header": run_page.header(view, now),
            "actions": run_page.actions(view, self.cfg.access.csrf, now),
            "conversation": run_page.conversation(view.messages),
        }
        return doc, live

    async def events(self, disconnected: Callable[[], Any]) -> AsyncIterator[bytes]:
        deadline = time.monotonic() + self.cfg.stream_max_s
        yield b"retry: 2000\n\n"
        quiet_since = time.monotonic()
        while time.monotonic() < deadline and not self.cfg.stopping() and not await disconnected():
            try:
                doc, live = await run_in_threadpool(self.poll)
            except StoreError as exc:  # the store is away: say so, keep trying
                yield f"event: problem\ndata: {json.dumps(str(exc))}\n\n".encode()
                await asyncio.sleep(self.cfg.poll_s * 4)
                continue
            if doc is not None:
                yield f"event: update\ndata: {json.dumps(doc, ensure_ascii=False)}\n\n".encode()
                quiet_since = time.monotonic()
            elif (
                time.monotonic() - quiet_since > KEEPALIVE_S
            ):  # a long model call: keep proxies from closing it
                yield b": still here\n\n"
                quiet_since = time.monotonic()
            # Between two polls of the store: a streaming call's tokens, every LIVE_S.
            polled = time.monotonic()
            while True:
                tokens = await run_in_threadpool(self.tokens)
                if tokens is not None:
                    data = json.dumps(tokens, ensure_ascii=False)
                    yield f"event: tokens\ndata: {data}\n\n".encode()
                    quiet_since = time.monotonic()
                left = self.cfg.poll_s - (time.monotonic() - polled)
                if not live or left <= 0:
                    break
                await asyncio.sleep(min(left, LIVE_S) if self.live_sig else left)
            if not live:
                yield b"event: end\ndata: {}\n\n"
                return
