"""What the demo claims, checked against what was recorded (pure: rows and file text in).

Kept apart from story.py so the claims can be read, and tested, on their own.
"""

from __future__ import annotations

from collections import Counter

from msgspec import Struct, field

from durable_agent.status import RunStatus, StepKind
from durable_agent.store.payloads import ToolOutput
from durable_agent.store.records import RunRecord, StepRecord, StepState


class Verdict(Struct):
    lines: list[str] = field(default_factory=list)  # what happened, in words
    problems: list[str] = field(default_factory=list)  # claims the records contradict

    @property
    def ok(self) -> bool:
        return not self.problems


def check_story(
    *,
    run: RunRecord,
    before: list[StepRecord],
    after: list[StepRecord],
    resumed_code: int,
    witness_before: Counter[str],
    witness: Counter[str],
    calc_py: str,
) -> Verdict:
    v = Verdict()
    if resumed_code != 0 or run.status != RunStatus.COMPLETED:
        v.problems.append(
            f"the resumed run ended {run.status} ({run.stop_reason}), exit code {resumed_code}"
        )
    _check_once(v, before, after)
    _check_models(v, run, before, after)
    _check_commands(v, after, witness_before, witness)
    if "return a + b" in calc_py and "return a - b" not in calc_py:
        v.lines.append("calc.py now: add() adds, and test_calc.py passes")
    else:
        v.problems.append("calc.py does not hold the fix")
    return v


def _check_once(v: Verdict, before: list[StepRecord], after: list[StepRecord]) -> None:
    keys = Counter(s.idempotency_key for s in after)
    twice = [k for k, n in keys.items() if n > 1]
    if twice:
        v.problems.append(f"steps recorded twice: {', '.join(twice)}")
    final = {s.seq: s for s in after}
    for old in before:
        new = final.get(old.seq)
        if new is None or new.idempotency_key != old.idempotency_key:
            v.problems.append(f"step {old.seq} recorded before the crash is gone or replaced")
        elif old.state != StepState.STARTED and (old.finished_at, old.attempts) != (
            new.finished_at,
            new.attempts,
        ):
            v.problems.append(f"step {old.seq} ({old.kind}) was executed again after the resume")
        elif old.state == StepState.STARTED:
            _describe_settled(v, old, new)


def _describe_settled(v: Verdict, old: StepRecord, new: StepRecord) -> None:
    what = f"{new.tool_name or new.kind} (step {new.seq})"
    if new.state == StepState.STARTED:
        v.problems.append(f"{what} was cut off by the crash and is still unsettled")
    elif new.attempts == old.attempts:
        out = new.typed_output
        result = out.result if isinstance(out, ToolOutput) else None
        v.lines.append(
            f"{what}: cut off by the crash; the resume checked the workspace and settled it "
            f"without running it again: {result or new.state}"
        )
    else:
        v.lines.append(
            f"{what}: cut off before its effect; the resume ran it (attempt {new.attempts}), "
            "which the recorded before/after state allowed"
        )


def _check_models(
    v: Verdict, run: RunRecord, before: list[StepRecord], after: list[StepRecord]
) -> None:
    answered_before = {
        s.seq for s in before if s.kind == StepKind.MODEL and s.state == StepState.COMPLETED
    }
    models = [s for s in after if s.kind == StepKind.MODEL]
    made_after = [s for s in models if s.seq not in answered_before]
    tokens = sum((s.prompt_tokens or 0) + (s.completion_tokens or 0) for s in models)
    total = run.prompt_tokens + run.completion_tokens
    if len(models) != run.step_count or tokens != total:
        v.problems.append(
            f"model steps ({len(models)}, {tokens} tokens) do not add up to the run's "
            f"totals ({run.step_count}, {total} tokens)"
        )
    if any(s.attempts != 1 for s in models):
        v.problems.append("a model call was made more than once")
    v.lines.append(
        f"model calls: {len(answered_before)} answered before the crash and reused from the "
        f"database, {len(made_after)} made after; {total} tokens in all, each paid once"
    )


def _check_commands(
    v: Verdict, after: list[StepRecord], witness_before: Counter[str], witness: Counter[str]
) -> None:
    calls = [s.call_id or "" for s in after if s.tool_name == "run_command"]
    runs = ", ".join(
        f"{cid} ×{witness[cid]}" + (" (before the crash)" if witness_before[cid] else " (after)")
        for cid in calls
    )
    v.lines.append(
        f"test_calc.py logged {sum(witness.values())} runs in the workspace, by call: {runs or 'none'}"
    )
    if sorted(witness) != sorted(calls) or any(n != 1 for n in witness.values()):
        v.problems.append(
            f"the workspace saw test runs {dict(witness)} for the recorded commands {calls}"
        )
