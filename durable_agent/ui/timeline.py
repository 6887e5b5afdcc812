"""The run page's timeline chart: one SVG mark per step on a time axis, a lane per kind
(model calls, tool calls by effect class, verifications, compactions, any other kind),
with resume boundaries, the gaps while the run was stopped, failures and retries.

Rendered on the server (the page works without script) and sent again whole by the live
page's event stream when a step changes: a chart of 1,000 marks is a few hundred KB."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from html import escape

from durable_agent.status import EffectClass, StepKind
from durable_agent.store.records import StepRecord, StepState

WIDTH = 1000
LANE_H = 22
LEFT = 90  # room for the lane labels
GAP_MIN_FRACTION = 0.02  # a pause shorter than this share of the axis is not drawn as a gap
STOP_SHARE = 0.1  # a stop is drawn at most this share of the time the run executed


def lane(step: StepRecord) -> str:
    """`model`, `tool:read|write|exec`, `verify`, or the step's own kind (e.g. `compact`)."""
    if step.kind == StepKind.TOOL:
        return f"tool:{step.effect or 'other'}"
    return step.kind


def css_class(step: StepRecord) -> str:
    """The mark's colour classes: kind, effect, and state (failed, open, retried)."""
    classes = ["mark", f"k-{_token(step.kind)}"]
    if step.effect:
        classes.append(f"e-{_token(step.effect)}")
    if step.state == StepState.FAILED:
        classes.append("failed")
    elif step.state == StepState.STARTED:
        classes.append("open")
    if step.attempts > 1:
        classes.append("retried")
    return " ".join(classes)


def _token(value: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in value)[:24] or "x"


def _end(step: StepRecord, now: datetime) -> datetime:
    if step.finished_at is not None:
        return step.finished_at
    return now if step.state == StepState.STARTED else step.started_at


def chart(steps: list[StepRecord], now: datetime) -> str:
    if not steps:
        return '<svg class="timeline" id="timeline" viewBox="0 0 1000 30"><text x="10" y="20">no steps yet</text></svg>'
    start = min(s.started_at for s in steps)
    end = max(max(_end(s, now) for s in steps), start)
    span = max((end - start).total_seconds(), 0.001)
    stops = _stops(steps, now, span * GAP_MIN_FRACTION)
    x = _axis(start, span, stops)

    lanes = sorted({lane(s) for s in steps}, key=_lane_order)
    row = {name: i for i, name in enumerate(lanes)}
    height = 30 + LANE_H * len(lanes)
    parts = [
        f'<svg class="timeline" id="timeline" viewBox="0 0 {WIDTH} {height}" '
        f'preserveAspectRatio="none" role="img" aria-label="timeline of {len(steps)} steps">'
    ]
    for name, i in row.items():
        y = 8 + i * LANE_H
        parts.append(
            f'<text class="lane" x="4" y="{y + 14}">{escape(name)}</text>'
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - 10}" y1="{y + LANE_H}" y2="{y + LANE_H}"/>'
        )
    parts.extend(_boundaries(steps, stops, x, height))
    for s in steps:
        x0 = x(s.started_at)
        w = max(x(_end(s, now)) - x0, 2.0)
        y = 10 + row[lane(s)] * LANE_H
        title = f"#{s.seq} {s.kind} {s.tool_name or ''} {s.state} {s.duration_ms if s.duration_ms is not None else '-'} ms"
        if s.attempts > 1:
            title += f" · {s.attempts} attempts"
        parts.append(
            f'<a href="#step-{s.seq}"><rect class="{css_class(s)}" data-seq="{s.seq}" '
            f'x="{x0:.1f}" y="{y}" width="{w:.1f}" height="{LANE_H - 6}">'
            f"<title>{escape(title)}</title></rect></a>"
        )
    parts.append(
        f'<text class="axis" x="{LEFT}" y="{height - 4}">{escape(_clock(start))}</text>'
        f'<text class="axis" x="{WIDTH - 10}" y="{height - 4}" text-anchor="end">'
        f"{escape(_clock(end))} (+{_span_text(span)})</text></svg>"
    )
    return "".join(parts)


def _stops(
    steps: list[StepRecord], now: datetime, min_gap_s: float
) -> list[tuple[datetime, datetime]]:
    """The times nobody executed the run: from the end of the last step before a resume (a
    new lease epoch) to the first step after it, where that pause is long enough to see."""
    out: list[tuple[datetime, datetime]] = []
    last_end: datetime | None = None
    epoch = steps[0].lease_epoch
    for s in steps:
        if (
            s.lease_epoch is not None
            and epoch is not None
            and s.lease_epoch > epoch
            and last_end is not None
            and (s.started_at - last_end).total_seconds() >= min_gap_s
        ):
            out.append((last_end, s.started_at))
        epoch = s.lease_epoch if s.lease_epoch is not None else epoch
        end = _end(s, now)
        last_end = end if last_end is None or end > last_end else last_end
    return out


def _axis(
    start: datetime, span: float, stops: list[tuple[datetime, datetime]]
) -> Callable[[datetime], float]:
    """Time to x: linear while the run executed; a stop is drawn at most STOP_SHARE of the
    executing time wide (a run that waited an hour for a person would otherwise leave its
    steps as slivers at both ends), and the band says how long it really was."""
    lengths = [(b - a).total_seconds() for a, b in stops]
    active = max(span - sum(lengths), 0.001)
    shown = [min(g, active * STOP_SHARE) for g in lengths]
    scale = (WIDTH - LEFT - 10) / (active + sum(shown))

    def x(when: datetime) -> float:
        t = (when - start).total_seconds()
        cut = 0.0  # seconds of the stops before `when` that are not drawn
        for (a, _), g, g_shown in zip(stops, lengths, shown, strict=True):
            into = (when - a).total_seconds()
            if into <= 0:
                break
            cut += (g - g_shown) * min(into / g, 1.0)
        return LEFT + (t - cut) * scale

    return x


def _boundaries(
    steps: list[StepRecord],
    stops: list[tuple[datetime, datetime]],
    x: Callable[[datetime], float],
    height: int,
) -> list[str]:
    """A shaded band, labelled with its real length, for each stop, and a dashed line where
    each resume (a new lease epoch) began."""
    out: list[str] = []
    for a, b in stops:
        gx, bx = x(a), x(b)
        length = _span_text((b - a).total_seconds())
        out.append(
            f'<rect class="gap" x="{gx:.1f}" y="0" width="{max(bx - gx, 1):.1f}" height="{height - 14}">'
            f"<title>stopped for {length}</title></rect>"
        )
        if bx - gx >= 40:
            out.append(
                f'<text class="gap-label" x="{(gx + bx) / 2:.1f}" y="{height - 18}" '
                f'text-anchor="middle">{escape(length)}</text>'
            )
    epoch = steps[0].lease_epoch
    for s in steps:
        if s.lease_epoch is not None and epoch is not None and s.lease_epoch > epoch:
            bx = x(s.started_at)
            out.append(
                f'<line class="resume" x1="{bx:.1f}" x2="{bx:.1f}" y1="0" y2="{height - 14}">'
                f"<title>resumed (lease epoch {s.lease_epoch})</title></line>"
            )
        epoch = s.lease_epoch if s.lease_epoch is not None else epoch
    return out


def _lane_order(name: str) -> tuple[int, str]:
    order = {
        StepKind.MODEL: 0,
        f"{StepKind.TOOL}:{EffectClass.READ}": 1,
        f"{StepKind.TOOL}:{EffectClass.WRITE}": 2,
        f"{StepKind.TOOL}:{EffectClass.EXEC}": 3,
        StepKind.VERIFY: 5,
        StepKind.COMPACT: 6,
    }
    return order.get(name, 4 if name.startswith(f"{StepKind.TOOL}:") else 7), name


def _clock(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _span_text(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"
