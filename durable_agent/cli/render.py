"""Everything the CLI prints: the live step timeline, summaries, tables and JSON shapes."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from durable_agent.cli.status_line import (
    StatusLine as StatusLine,  # re-exported: the timeline's live line
)
from durable_agent.cli.streams import forgiving
from durable_agent.observer import DeltaKind, Observer, StepEvent
from durable_agent.presentation import (
    approval_subject,
    counts,
    estimated_tokens,
    fmt_age,
    fmt_ms,
    iso_value,
    plural,
    run_cost,
    sandbox_line,
    short,
    step_what,
    turn_starts,
    workspace_note,
)
from durable_agent.status import RunStatus, StepKind
from durable_agent.store import leases
from durable_agent.store.records import ApprovalRecord, RunRecord, StepRecord, StepState
from durable_agent.store.rows import utcnow
from durable_agent.visible import visible
from durable_agent.workspace import progress


def is_tty(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


# -- live output ---------------------------------------------------------------------------
class Timeline(Observer):
    """One line per finished step: `Step 3 · tool · edit_file src/app.py · 12 ms`; a model
    call's line says which one it is: `Step 2 · model call 2 · m → edit_file · 1.5 s`.

    On a terminal, a status line below it shows what is running and for how long; when
    `out` is a pipe or a file (or `live=False`), only the plain lines are written.
    Call `close()` when the run returns, so the status line is erased before the summary.
    """

    def __init__(
        self,
        out: TextIO,
        *,
        live: bool | None = None,
        interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        live = is_tty(out) if live is None else live
        out = self.out = forgiving(out)
        self.status = StatusLine(out, interval=interval, clock=clock) if live else None
        if self.status is not None:
            self.status.watch(workspace_work)
        self.tokens = 0  # used by this process; a resume starts from 0
        # A streamed answer as it arrives (delta): its kind ("text" | "reasoning"), the line
        # not yet ended, and whether it is open on the output (written without a status line).
        self._live_kind: DeltaKind | None = None
        self._partial = ""
        self._open = False
        self._activity_label = ""

    def run_started(self, run_id: str, *, resumed: bool, steps_done: int) -> None:
        if resumed:
            self._line(f"↻ resumed run {run_id} after {plural(steps_done, 'model call')}")

    def step(self, e: StepEvent) -> None:
        self._end_live()
        if e.state == StepState.STARTED:
            self._activity_label = self._activity(e)
            if self.status is not None:
                self.status.show(self._activity_label, self._so_far())
            return
        if e.state == "retry":
            if self.status is not None:  # still the same step: keep its clock running
                self.status.show(
                    self._activity(e),
                    f"retrying: attempt {e.attempts + 1}",
                    restart_clock=False,
                    draw=False,
                )
            self._line(f"  ↺ {e.kind} {e.name}: attempt {e.attempts} failed: {e.error}")
            return
        self.tokens += (e.prompt_tokens or 0) + (e.completion_tokens or 0)
        if self.status is not None:
            self.status.clear()  # the step is over: its status line goes, its timeline line stays
        self._line(step_line(e))

    def note(self, text: str) -> None:
        self._line(f"  {text}")

    # Prefixes of the streamed lines: the answer's text, the model's thinking (dimmed on a
    # terminal), a tool call's name as soon as it is known.
    TEXT, THINKING, TOOL = "  │ ", "  ┆ ", "  → "
    DIM, PLAIN = "\x1b[2m", "\x1b[0m"

    def delta(self, seq: int, turn: int, kind: DeltaKind, text: str) -> None:
        if kind is DeltaKind.START:  # a try begins: an earlier try's text stays above, ended
            self._end_live()
            return
        if kind is DeltaKind.TOOL:
            self._line(f"{self.TOOL}{text}")
            return
        if kind != self._live_kind:
            self._end_live()
            self._live_kind = kind
        prefix = self.THINKING if kind is DeltaKind.REASONING else self.TEXT
        if self.status is None:  # a pipe or a file: each piece as it comes, flushed
            pieces = visible(text).split("\n")
            for i, piece in enumerate(pieces):
                if i:
                    self.out.write("\n")
                    self._open = False
                if piece and not self._open:
                    self.out.write(prefix)
                    self._open = True
                self.out.write(piece)
            self.out.flush()
            return
        # A terminal: whole lines above the status line, the line being written in it.
        *done, self._partial = (self._partial + text).split("\n")
        for line in done:
            self._live_print(prefix + visible(line), kind)
        self.status.show(
            self._activity_label or "model",
            visible(self._partial[-200:]),
            restart_clock=False,
        )

    def _live_print(self, text: str, kind: DeltaKind) -> None:
        if self.status is not None:
            dim = kind is DeltaKind.REASONING
            self.status.print(f"{self.DIM}{text}{self.PLAIN}" if dim else text)

    def _end_live(self) -> None:
        """End the streamed line under way, if any, so the next line starts on its own."""
        if self._partial and self._live_kind is not None:
            prefix = self.THINKING if self._live_kind is DeltaKind.REASONING else self.TEXT
            self._live_print(prefix + visible(self._partial), self._live_kind)
        if self._open:
            self.out.write("\n")
            self.out.flush()
        self._partial, self._open, self._live_kind = "", False, None

    def close(self) -> None:
        if self.status is not None:
            self.status.close()

    def _activity(self, e: StepEvent) -> str:
        if e.kind == StepKind.MODEL:
            text = (
                f"model {short(e.name, 30)} thinking"  # a long scripted:PATH must not hide the verb
            )
        elif e.kind == StepKind.VERIFY:
            text = f"verifying `{short(e.name, 50)}`"
        elif e.kind == StepKind.COMPACT:
            text = "compacting the context (summary)"
        else:
            text = f"{e.name} {short(e.detail, 50)}".strip() + " running"
        return visible(text)

    def _so_far(self) -> str:
        return f"{self.tokens} tokens so far" if self.tokens else ""

    def _line(self, text: str) -> None:
        self._end_live()
        text = visible(text)  # names, details and errors come from the model and commands
        if self.status is not None:
            self.status.print(text)
        else:
            print(text, file=self.out, flush=True)


WORK_SHOWN_AFTER = 0.5  # s: a snapshot of a small tree comes and goes unseen


def workspace_work() -> tuple[str, str, float] | None:
    """The workspace work this process has under way between steps (workspace/progress.py:
    a new run's first snapshot, a resume's drift check), once it has lasted a moment."""
    work = progress.under_way()
    elapsed = time.monotonic() - work.since if work is not None else 0.0
    if work is None or elapsed < WORK_SHOWN_AFTER:
        return None
    return work.label, work.detail(), elapsed


@contextlib.contextmanager
def work_status(out: TextIO) -> Iterator[None]:
    """For a command with no timeline (restore, fork): on a terminal, its long workspace
    work in a status line for the block."""
    if not is_tty(out):
        yield
        return
    status = StatusLine(forgiving(out))
    status.watch(workspace_work)
    try:
        yield
    finally:
        status.close()


def clear_status(observer: Observer | None) -> None:
    """Erase the live status line before a line printed beside the timeline (start's first
    lines, after the first snapshot): it would be written at the end of the status line."""
    timeline = getattr(observer, "inner", observer)
    if isinstance(timeline, Timeline) and timeline.status is not None:
        timeline.status.clear()


def step_line(e: StepEvent) -> str:
    # Every row is a step, numbered by its stored `steps.seq` (the `show` table's #); a model
    # row also says which model call it is, the number budgets (--max-steps) and the summary count.
    head = f"Step {e.seq}" if e.seq >= 0 else "Step"
    what = (
        f"{e.name} → {e.detail}"
        if e.kind == StepKind.MODEL and e.detail
        else f"{e.name} {e.detail}".strip()
    )
    kind = f"model call {e.turn + 1}" if e.kind == StepKind.MODEL else e.kind
    parts = [head, kind, what]
    if e.duration_ms is not None:  # a compaction by elision takes no measurable time
        parts.append(fmt_ms(e.duration_ms))
    if e.prompt_tokens is not None:
        parts.append(
            f"~{e.prompt_tokens}+{e.completion_tokens} tokens (estimated: no usage reported)"
            if e.estimated
            else f"{e.prompt_tokens}+{e.completion_tokens} tokens"
        )
    if e.attempts > 1:
        parts.append(f"{e.attempts} attempts")
    if e.state == "reused":
        parts.append("recorded earlier, not run again")
    if e.state == StepState.FAILED:
        first = (e.error or "failed").splitlines()[0] if e.error else "failed"
        parts.append(f"error: {first[:100]}")
    return " · ".join(parts)


def _cost_text(run: RunRecord) -> str:
    cost = run_cost(run)
    cached = f" ({run.cached_tokens} cached)" if run.cached_tokens else ""
    return cached + ("" if cost is None else f" · cost {cost:.4f}")


def estimated(steps: list[StepRecord]) -> bool:
    """Whether any model call's token counts are the harness's estimate (no usage reported)."""
    return any(estimated_tokens(s) for s in steps)


def _tokens_note(is_estimated: bool) -> str:
    return " (partly estimated: the endpoint reported no usage)" if is_estimated else ""


def summary(
    run: RunRecord, out: TextIO, *, steps: int | None = None, estimated: bool = False
) -> None:
    """`9 model calls · 17 steps · 8 tool calls · 19 messages · 485 tokens (329 in + 156 out) ·
    0.3 s · completed (finished)`"""
    tokens = run.prompt_tokens + run.completion_tokens
    print(
        visible(
            f"{counts(run, steps)} · "
            f"{plural(run.message_count, 'message')} · "
            f"{tokens} tokens ({run.prompt_tokens} in + {run.completion_tokens} out){_tokens_note(estimated)}"
            f"{_cost_text(run)} · "
            f"{fmt_ms(run.active_ms)} · {run.status} ({run.stop_reason})"
        ),
        file=out,
    )
    if run.error and run.status != RunStatus.COMPLETED:
        print(f"  {visible(run.error)}", file=out)
    if run.status != RunStatus.COMPLETED:
        print(f"  continue with: durable-agent resume {run.id}", file=out)


# -- JSON shapes ---------------------------------------------------------------------------
def result_json(run: RunRecord) -> dict[str, Any]:
    """The `--json` result. `steps` is the contract's name for the model calls (what --max-steps
    counts); `model_calls` says the same in the words the timeline and summary use."""
    return {
        "run_id": run.id,
        "status": run.status,
        "stop_reason": run.stop_reason,
        "answer": run.answer,
        "steps": run.step_count,
        "model_calls": run.step_count,
        "tool_calls": run.tool_call_count,
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "duration_ms": run.active_ms,
        "error": run.error,
    }


@contextlib.contextmanager
def json_if_cut_short(as_json: bool, run_id: str) -> Iterator[None]:
    """With --json stdout holds one object however the command ends: when the store goes
    (exit 7) or another process takes the run (exit 6), the run id and the error, with the
    rest null (the store could not say), so a script reads it as it reads any result."""
    from durable_agent.errors import DurableAgentError

    try:
        yield
    except DurableAgentError as exc:
        if as_json:
            doc = dict.fromkeys(
                (
                    "status",
                    "stop_reason",
                    "answer",
                    "steps",
                    "model_calls",
                    "tool_calls",
                    "prompt_tokens",
                    "completion_tokens",
                    "duration_ms",
                )
            )
            print(
                json.dumps({"run_id": run_id, **doc, "error": str(exc)}),
                file=forgiving(sys.stdout),
                flush=True,
            )
        raise


# -- list and show -------------------------------------------------------------------------
def run_table(runs: list[RunRecord], out: TextIO, *, status: str | None = None) -> None:
    if not runs:
        if status:
            print(f"no runs with status {status}", file=out)
        else:
            print('no runs yet: try `durable-agent demo` or `durable-agent start "…"`', file=out)
        return
    print(
        f"{'ID':<16}  {'STATUS':<15}  {'MODEL CALLS':>11}  {'TOKENS':>8}  {'COST':>8}  {'AGE':>8}  TASK",
        file=out,
    )
    for r in runs:
        tokens = r.prompt_tokens + r.completion_tokens
        cost = run_cost(r)
        spent = "-" if cost is None else f"{cost:.4f}"
        print(
            f"{r.id:<16}  {_status(r, _executing(r), short=True):<15}  {r.step_count:>11}  {tokens:>8}  {spent:>8}  {fmt_age(r.created_at):>8}  "
            f"{visible(short(r.task, 50))}",
            file=out,
        )


def show(
    run: RunRecord, steps: list[StepRecord], approvals: list[ApprovalRecord], out: TextIO
) -> None:
    def p(text: str = "") -> None:
        print(visible(text), file=out)  # the task, answers, errors, tool names: the model's text

    live = _executing(run)
    p(f"run        {run.id}")
    p(f"status     {_status(run, live)}" + (f" ({run.stop_reason})" if run.stop_reason else ""))
    p(f"task       {short(run.task, 100)}")
    p(f"model      {run.model}")
    p(f"workspace  {run.workspace}")
    if run.forked_from:
        after = "" if run.fork_seq is None else f" after step {run.fork_seq}"
        p(f"forked     from {run.forked_from}{after}")
    sandbox = sandbox_line(run.settings)
    if sandbox:
        p(f"sandbox    {sandbox}")
    p(f"created    {iso_value(run.created_at)} ({fmt_age(run.created_at)})")
    if run.finished_at:
        p(f"finished   {iso_value(run.finished_at)}")
    if live:
        p(
            f"lease      held by {run.lease_owner} until {iso_value(run.lease_expires_at)} (epoch {run.lease_epoch})"
        )
    elif run.status == RunStatus.WAITING:
        p("lease      none: it waits for its child runs; a worker goes on with it once they ended")
    elif run.status == RunStatus.RUNNING:
        p(
            f"lease      its process ({run.lease_owner or 'none'}) is gone: "
            f"`durable-agent resume {run.id}` continues the run"
        )
    p(
        f"totals     {counts(run, len(steps))} · "
        f"{plural(run.message_count, 'message')} · "
        f"{run.prompt_tokens}+{run.completion_tokens} tokens{_tokens_note(estimated(steps))}{_cost_text(run)} · "
        f"{fmt_ms(run.active_ms)} active"
        + (f" · resumed {run.resume_count}×" if run.resume_count else "")
    )
    if run.error:
        p(f"error      {run.error}")
    if run.answer:
        p(f"answer     {short(run.answer, 200)}")
    p()
    if not steps:
        p("no steps recorded yet")
    else:
        _step_table(run, steps, p, live=live)
    if approvals:
        p()
        p("approvals")
        for a in approvals:
            decision = a.decision or "PENDING"
            by = f" by {a.decided_by}" if a.decided_by else ""
            p(
                f"  #{a.id} {a.kind} · {decision}{by} · call {a.call_id} · {approval_subject(a.tool_name, a.command, 80)}"
            )
            if a.reason:
                p(f"      {short(a.reason, 120)}")
        if any(a.decision is None for a in approvals):
            p(
                f"  answer with: durable-agent approve {run.id} [--deny], then durable-agent resume {run.id}"
            )


def _status(run: RunRecord, live: bool, *, short: bool = False) -> str:
    """`running` only while a process executes it; a run whose process is gone says so."""
    if run.status == RunStatus.RUNNING and not live:
        return "running (dead)" if short else "running (its process is gone: resume it)"
    return str(run.status)


def _executing(run: RunRecord) -> bool:
    """Running under a live lease: its process is still at work (a crashed run is `running` too)."""
    return leases.is_executing(run, utcnow())


def _step_table(
    run: RunRecord, steps: list[StepRecord], p: Callable[[str], None], *, live: bool
) -> None:
    kinds = max(7, *(len(s.kind) for s in steps))  # `user_message` in a continued run
    p(
        f"{'#':>4}  {'KIND':<{kinds}} {'STATE':<10} {'TIME':>8} {'TOKENS':>9} {'COST':>8} {'TRIES':>5}  WHAT"
    )
    epoch = steps[0].lease_epoch
    turns = turn_starts(steps)
    if turns:
        p(f"{'':>4}  ── turn 1: the task ──")
    for s in steps:
        if s.seq in turns:  # a `continue` began here (a session of its own)
            p(f"{'':>4}  ── turn {turns[s.seq]}: continued (lease epoch {s.lease_epoch}) ──")
        elif s.lease_epoch is not None and epoch is not None and s.lease_epoch > epoch:
            p(f"{'':>4}  ── resumed (lease epoch {s.lease_epoch}) ──")
        epoch = s.lease_epoch if s.lease_epoch is not None else epoch
        tokens = f"{s.prompt_tokens}+{s.completion_tokens}" if s.prompt_tokens is not None else ""
        if tokens and estimated_tokens(s):
            tokens = "~" + tokens  # the endpoint reported no usage: the harness's estimate
        state = s.state
        if state == StepState.STARTED and not live:
            state = "cut off"  # an intent without an outcome: the next resume settles it
        p(
            f"{s.seq:>4}  {s.kind:<{kinds}} {state:<10} {fmt_ms(s.duration_ms):>8} {tokens:>9} "
            f"{'' if s.cost is None else f'{s.cost:.4f}':>8} {s.attempts:>5}  "
            f"{step_what(run, s)}"
        )
        if s.error:
            p(f"{'':>4}  error: {short(s.error, 110)}")
        left = workspace_note(s)
        if left:  # what the step's snapshot left out, and why
            p(f"{'':>4}  snapshot: {short(left, 300)}")
