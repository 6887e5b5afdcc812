"""Everything the CLI prints: the live step timeline, summaries, tables and JSON shapes."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, TextIO

from durable_agent.observer import Observer, StepEvent
from durable_agent.store.journal import utcnow


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


class Timeline(Observer):
    """One line per finished step on stderr: `Step 3 · tool · edit_file src/app.py · 12 ms`."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def run_started(self, run_id: str, *, resumed: bool, steps_done: int) -> None:
        if resumed:
            self._line(f"↻ resumed run {run_id} after {steps_done} model steps")

    def step(self, e: StepEvent) -> None:
        if e.state == "started":
            return
        if e.state == "retry":
            self._line(f"  ↺ {e.kind} {e.name}: attempt {e.attempts} failed: {e.error}")
            return
        parts = [f"Step {e.seq + 1}", e.kind, f"{e.name} {e.detail}".strip()]
        parts.append(fmt_ms(e.duration_ms))
        if e.prompt_tokens is not None:
            parts.append(f"{e.prompt_tokens}+{e.completion_tokens} tokens")
        if e.attempts > 1:
            parts.append(f"{e.attempts} attempts")
        if e.state == "failed":
            parts.append(f"error: {(e.error or '').splitlines()[0][:100] if e.error else 'failed'}")
        self._line(" · ".join(parts))

    def note(self, text: str) -> None:
        self._line(f"  {text}")

    def _line(self, text: str) -> None:
        print(text, file=self.out, flush=True)


def summary(run: Any, out: TextIO) -> None:
    tokens = run.prompt_tokens + run.completion_tokens
    print(f"{run.status} ({run.stop_reason}) · {run.step_count} steps · {run.tool_call_count} tool calls · "
          f"{run.message_count} messages · {tokens} tokens · {fmt_ms(run.active_ms)}", file=out)
    if run.error and run.status != "completed":
        print(f"  {run.error}", file=out)
    if run.status != "completed":
        print(f"  continue with: durable-agent resume {run.id}", file=out)


def _iso(value: Any) -> Any:
    return value.isoformat() + "Z" if isinstance(value, datetime) else value


def row_json(row: Any) -> dict[str, Any]:
    return {k: _iso(v) for k, v in row._mapping.items()}


def run_json(run: Any) -> dict[str, Any]:
    return row_json(run)


def step_json(step: Any) -> dict[str, Any]:
    return row_json(step)


def result_json(run: Any) -> dict[str, Any]:
    duration = run.active_ms
    return {"run_id": run.id, "status": run.status, "stop_reason": run.stop_reason, "answer": run.answer,
            "steps": run.step_count, "tool_calls": run.tool_call_count, "prompt_tokens": run.prompt_tokens,
            "completion_tokens": run.completion_tokens, "duration_ms": duration, "error": run.error}


def _short(text: str | None, width: int) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def run_table(runs: list[Any], out: TextIO) -> None:
    if not runs:
        print("no runs yet: try `durable-agent demo` or `durable-agent start \"…\"`", file=out)
        return
    header = f"{'ID':<16}  {'STATUS':<15}  {'STEPS':>5}  {'TOKENS':>8}  {'AGE':>8}  TASK"
    print(header, file=out)
    for r in runs:
        tokens = r.prompt_tokens + r.completion_tokens
        print(f"{r.id:<16}  {r.status:<15}  {r.step_count:>5}  {tokens:>8}  {fmt_age(r.created_at):>8}  "
              f"{_short(r.task, 50)}", file=out)


def show(run: Any, steps: list[Any], approvals: list[Any], out: TextIO) -> None:
    p = lambda text="": print(text, file=out)  # noqa: E731
    p(f"run        {run.id}")
    p(f"status     {run.status}" + (f" ({run.stop_reason})" if run.stop_reason else ""))
    p(f"task       {_short(run.task, 100)}")
    p(f"model      {run.model}")
    p(f"workspace  {run.workspace}")
    p(f"created    {_iso(run.created_at)} ({fmt_age(run.created_at)})")
    if run.finished_at:
        p(f"finished   {_iso(run.finished_at)}")
    p(f"totals     {run.step_count} steps · {run.tool_call_count} tool calls · {run.message_count} messages · "
      f"{run.prompt_tokens}+{run.completion_tokens} tokens · {fmt_ms(run.active_ms)} active"
      + (f" · resumed {run.resume_count}×" if run.resume_count else ""))
    if run.error:
        p(f"error      {run.error}")
    if run.answer:
        p(f"answer     {_short(run.answer, 200)}")
    p()
    if not steps:
        p("no steps recorded yet")
    for s in steps:
        name = s.tool_name or (run.model if s.kind == "model" else "")
        detail = ""
        if s.kind == "tool" and isinstance(s.input, dict):
            args = s.input.get("arguments")
            detail = _short(json.dumps(args, ensure_ascii=False) if not isinstance(args, str) else args, 60)
        tokens = f" · {s.prompt_tokens}+{s.completion_tokens} tokens" if s.prompt_tokens is not None else ""
        attempts = f" · {s.attempts} attempts" if s.attempts > 1 else ""
        err = f" · error: {_short(s.error, 80)}" if s.error else ""
        p(f"{s.seq + 1:>4}  {s.kind:<6} {s.state:<9} {name} {detail} · {fmt_ms(s.duration_ms)}{tokens}{attempts}{err}")
    for a in approvals:
        decision = a.decision or "PENDING"
        by = f" by {a.decided_by}" if a.decided_by else ""
        p(f"approval  {a.kind} · {decision}{by} · call {a.call_id} · {_short(a.command or a.tool_name, 60)}")
