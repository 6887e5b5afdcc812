"""The web view's HTML holds whatever the store holds — a task, a tool's output, a file
name, a model's answer — as text: hypothesis writes hostile strings into every field the
pages show, and the parsed page has only the elements and attributes the view itself
writes (no script, no handler, no link of the store's choosing)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import asdict

from durable_agent.store.records import ApprovalRecord, MessageRecord, RunRecord, StepRecord
from durable_agent.ui.pages import runs_list
from durable_agent.ui.queries import FileChange, RunPage
from durable_agent.ui.run_page import RunView, page
from durable_agent.ui.timeline import chart

T0 = datetime(2026, 1, 1, 12, 0, 0)
HOSTILE = st.one_of(
    st.text(max_size=60),
    st.sampled_from(
        [
            "<script>alert(1)</script>",
            '"><img src=x onerror=alert(1)>',
            "' onmouseover='x",
            "</pre><iframe src=//evil>",
            "&lt;b&gt;",
            "javascript:alert(1)",
        ]
    ),
)


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts = 0
        self.bad: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.scripts += 1
        if tag in ("iframe", "img", "object", "embed"):
            self.bad.append(tag)
        for name, value in attrs:
            if name.startswith("on"):
                self.bad.append(f"{tag}[{name}]")
            if name == "href" and value is not None and not value.startswith(("/", "#")):
                self.bad.append(f"{tag}[href={value}]")


def _run(text: str) -> RunRecord:
    return RunRecord(
        id="r1",
        task=text,
        workspace=text,
        model=text,
        status="blocked",
        stop_reason=text,
        answer=text,
        error=text,
        created_at=T0,
        updated_at=T0,
        finished_at=T0,
        step_count=1,
        tool_call_count=1,
        prompt_tokens=1,
        completion_tokens=1,
        lease_owner=text,
        lease_expires_at=T0,
        lease_epoch=1,
        cancel_requested=False,
        settings={"sandbox": text, "max_steps": 5},
        message_count=1,
        active_ms=5,
        resume_count=0,
        forked_from=text,
        fork_seq=2,
    )


def _step(seq: int, text: str, kind: str) -> StepRecord:
    return StepRecord(
        run_id="r1",
        seq=seq,
        kind=kind,
        state="failed",
        idempotency_key=text,
        call_id=text,
        tool_name=text,
        input={"arguments": text},
        output={"content": text, "tool_calls": [{"name": text}]},
        error=text,
        attempts=2,
        prompt_tokens=1,
        completion_tokens=1,
        started_at=T0 + timedelta(seconds=seq),
        finished_at=T0 + timedelta(seconds=seq + 1),
        duration_ms=1000,
        turn=0,
        effect=text,
        pgid=None,
        lease_epoch=1 + seq,
    )


def _parsed(html: str) -> Tags:
    tags = Tags()
    tags.feed(html)
    return tags


@settings(max_examples=60, deadline=None)
@given(HOSTILE, st.sampled_from(["model", "tool", "verify", "compact", "<b>odd kind</b>"]))
def test_hostile_store_text_never_becomes_markup(text: str, kind: str) -> None:
    run = _run(text)
    steps = [_step(0, text, "model"), _step(1, text, kind)]
    approvals = [
        ApprovalRecord(
            id=1,
            run_id="r1",
            call_id=text,
            step_seq=1,
            kind=text,
            tool_name=text,
            command=text,
            reason=text,
            requested_at=T0,
            decision=None,
            decided_by=None,
            decided_at=None,
            used_at=None,
        )
    ]
    messages = [
        MessageRecord(
            run_id="r1",
            seq=0,
            role=text,
            content=text,
            tool_calls=[{"x": text}],
            tool_call_id=text,
            step_seq=None,
            created_at=T0,
        )
    ]
    view = RunView(run, steps, approvals, messages, {1: [FileChange(text, text, 3)]})
    html = page(view, csrf="c", notice=text)
    tags = _parsed(html)
    assert tags.scripts == 1 and tags.bad == [], tags.bad  # only the package's own ui.js
    listing = _parsed(runs_list(RunPage([run], None), status=None, needle=text, csrf="c"))
    assert listing.scripts == 1 and listing.bad == []


def test_the_chart_has_one_mark_per_step_and_marks_resumes_and_stops() -> None:
    steps = [_step(i, "x", "model" if i % 2 == 0 else "tool") for i in range(6)]
    steps = [
        StepRecord(
            **{
                **asdict(s),
                "lease_epoch": 1 if s.seq < 3 else 2,
                "started_at": s.started_at + timedelta(seconds=100 if s.seq >= 3 else 0),
                "finished_at": (s.finished_at or T0) + timedelta(seconds=100 if s.seq >= 3 else 0),
            }
        )
        for s in steps
    ]
    svg = chart(steps, T0 + timedelta(hours=1))
    assert svg.count('<rect class="mark') == 6
    assert svg.count('class="resume"') == 1 and svg.count('class="gap"') == 1
    assert chart([], T0).count("<rect") == 0


def test_a_long_stop_is_drawn_narrow_and_labelled_so_the_steps_stay_readable() -> None:
    """A run that waited 20 minutes for a person between two 3-second stretches: the stop
    is a labelled band of at most a tenth of the executing time, not 99% of the axis."""

    def step(seq: int, at: float, epoch: int) -> StepRecord:
        s = _step(seq, "x", "model")
        return StepRecord(
            **{
                **asdict(s),
                "started_at": T0 + timedelta(seconds=at),
                "finished_at": T0 + timedelta(seconds=at + 1),
                "lease_epoch": epoch,
            }
        )

    steps = [step(0, 0, 1), step(1, 2, 1), step(2, 1203, 2), step(3, 1205, 2)]
    svg = chart(steps, T0 + timedelta(hours=1))
    widths = [
        float(w)
        for w in re.findall(
            r'<rect class="mark[^"]*" data-seq="\d+" x="[\d.]+" y="\d+" width="([\d.]+)"', svg
        )
    ]
    assert len(widths) == 4 and min(widths) > 100  # a second of work is wide, not a 2-pixel sliver
    gap = re.search(r'<rect class="gap" x="([\d.]+)" y="0" width="([\d.]+)"', svg)
    assert gap and float(gap.group(2)) < 0.1 * 900 and "stopped for 20.0 min" in svg
    xs = [float(v) for v in re.findall(r'data-seq="\d+" x="([\d.]+)"', svg)]
    assert (
        xs == sorted(xs) and xs[2] >= float(gap.group(1)) + float(gap.group(2)) - 0.1
    )  # after the band
    assert svg.count('class="resume"') == 1


def test_the_runs_list_counts_model_calls_under_that_name() -> None:
    # step_count is the model calls (what --max-steps counts), as `list` and the summary say.
    html = runs_list(RunPage([_run("t")], None), status=None, needle=None, csrf="x")
    assert "<th>model calls</th>" in html and "<th>steps</th>" not in html
