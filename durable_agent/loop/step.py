"""The one step primitive: every durable step of a run goes through `invoke` (or `open_step`).

A step is a spec (kind, idempotency key, effect class, input) and a function. The
primitive owns the protocol; the caller keeps only its decisions:

    open_step(ctx, spec)                   find: a recorded unfinished step under the key is
      │                                    this step again (`prior`); one of the same kind
      │                                    and place under another key is `StepMismatch`;
      │                                    `spec.reuse`: a completed one is returned as it is
      │                                    (`reused`), nothing runs. A step that can change
      │                                    files stops the run first if the workspace moved
      ├─ (caller decides on `prior`: refuse → .record(outcome): no intent; an interrupted
      │   attempt's row still gets its after snapshot)
      ▼
    .run(fn, input=, use_approval=)
      1. intent    before snapshot when the step can change files (write, exec, verify),
                   in the intent commit, fenced on the lease; a read commits nothing
                   (its outcome rides with the next commit: a crash re-runs it)
      2. event     `started`
      3. fn(step)  the effect; returns a StepOutcome (or raises EndThenRaise: record, then
                   raise). `step` is the row: a command's process group (`set_pgid`) and
                   a model call's retries (`set_attempts`) are fenced commits too
      4. outcome   after snapshot (same kinds), its changes against the before snapshot
                   (`step_changes`), complete or fail in one fenced commit with the
                   step's messages and the run's counters
      5. event     `completed` or `failed`

Store faults are never the step's outcome: a write that fails raises (StoreError,
StoreUnavailable, LeaseLost) and the session ends with the row as the store last had it;
resume reconciles it. Any other exception out of `fn` leaves the row `started` too.

    invoke(ctx, spec, fn) == open_step(ctx, spec).run(fn, input=spec.input)   (or the reused)

A new kind of step (a hook, a delegation, a notification) is a `StepSpec` and a function.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from msgspec import Struct

from durable_agent.loop.step_context import StepContext
from durable_agent.messages import Message
from durable_agent.observer import StepEvent
from durable_agent.status import EffectClass, StepKind
from durable_agent.store.blobs import WorkspaceWrite
from durable_agent.store.records import StepRecord, StepState
from durable_agent.store.rows import utcnow
from durable_agent.store.step import Step
from durable_agent.workspace import recorder

_CHANGES_FILES = (EffectClass.WRITE, EffectClass.EXEC)


class StepSpec(Struct, frozen=True):
    """What a step is. `label` and `detail` are what its events show (the model's name, the
    tool and its arguments, the command)."""

    kind: StepKind
    key: str
    turn: int
    input: Any = None
    effect: EffectClass | None = None  # a tool's; None for the harness's own steps
    call_id: str | None = None
    tool_name: str | None = None
    label: str = ""
    detail: str = ""
    reuse: bool = False  # a completed step under the key stands: it is not run again
    supersede: bool = False  # unfinished steps of this kind and turn under other keys are stale
    announce: bool = True  # a `started` event (an instant step, elision, has none)
    timed: bool = True  # the end event says how long the step took
    metered: bool = False  # the end event says its attempts and tokens (a model call)
    # The snapshot the step's changes are measured from, when not the files as it starts: a
    # user_message measures from the run's last snapshot, so its changes are the person's
    # edits between two turns (and the files it records are where the next turn starts).
    tree_before: str | None = None

    @property
    def changes_files(self) -> bool:
        """Snapshots before and after: a write, a command, a verification (build output), a
        person's message (the files as the person left them), a hook."""
        return self.effect in _CHANGES_FILES or self.kind in (
            StepKind.VERIFY,
            StepKind.USER_MESSAGE,
            StepKind.HOOK,
            StepKind.DELEGATE,  # a child's changes in a shared workspace are the step's
        )

    @property
    def deferred(self) -> bool:
        """No intent row: a read lost to a crash is simply run again."""
        return self.effect is EffectClass.READ


class StepOutcome(Struct):
    """What a step ended with. `error` set: it failed. `result` is the caller's, not stored."""

    output: Any = None
    error: str | None = None
    messages: Sequence[Message] = ()
    tokens: tuple[int, int] | None = None  # prompt, completion: paid for by this step
    cached_tokens: int | None = None  # of the prompt, served from the provider's cache
    cost: float | None = None  # what the tokens cost at the model's price (None: no price)
    estimated: bool = False  # the tokens are the harness's estimate
    attempts: int | None = None  # all attempts so far, when the step retried inside
    use_approval: int | None = None  # a decided approval this outcome acts on (marked used)
    detail: str | None = None  # the end event's, if not the spec's
    duration_ms: int | None = None  # the end event's, if not the step's own
    result: Any = None
    # More rows for the outcome's own commit (a `version` step's run_versions row): the
    # step and what it stands for land together or not at all.
    statements: Sequence[Any] = ()
    facts: dict[str, Any] | None = None  # for the step's span: its answer's model, its content


class EndThenRaise(Exception):
    """Raised by a step's function: record `outcome`, then raise `then` (a cancel, a
    Ctrl-C, a failure the loop must see). `announce`: with the end event."""

    def __init__(self, outcome: StepOutcome, then: BaseException, *, announce: bool = True) -> None:
        super().__init__(str(then))
        self.outcome, self.then, self.announce = outcome, then, announce


StepFn = Callable[[Step], StepOutcome]


class StepCall:
    """One step between find and outcome. `prior`: the recorded unfinished attempt, for the
    caller's decisions (did a write land? may a command run again?)."""

    def __init__(self, ctx: StepContext, spec: StepSpec, step: Step, reused: StepRecord | None):
        self.ctx, self.spec, self.step, self.reused = ctx, spec, step, reused
        self.writes: Collection[bytes] | None = None  # all the step may change (run's `writes`)

    @property
    def prior(self) -> StepRecord | None:
        return self.step.prior

    @property
    def input(self) -> Any:
        return self.step.input

    def run(
        self,
        fn: StepFn,
        *,
        input: Any = None,
        use_approval: int | None = None,
        writes: Collection[bytes] | None = None,
        also: Callable[[int], Sequence[Any]] | None = None,
    ) -> StepOutcome:
        """Intent (with the before snapshot), the effect, the outcome (with the after one).
        `writes`: the workspace paths (relative) that are all `fn` can change (a file tool's
        plan): the snapshots look at them alone, not at the whole tree. `also`: rows made in
        the intent's commit, given the step's seq (a child run)."""
        self.begin(input=input, use_approval=use_approval, writes=writes, also=also)
        try:
            outcome = fn(self.step)
        except EndThenRaise as exc:
            self._end(exc.outcome, announce=exc.announce)
            raise exc.then from exc.then.__cause__
        return self._end(outcome)

    def begin(
        self,
        *,
        input: Any = None,
        use_approval: int | None = None,
        writes: Collection[bytes] | None = None,
        also: Callable[[int], Sequence[Any]] | None = None,
    ) -> None:
        """The first half of `run`: the intent and its event. For effects that run side by
        side (children of one answer, loop/delegate_step.py): each ends with `end`."""
        spec, step = self.spec, self.step
        self.writes = writes
        if spec.deferred:
            step.start(input, durable=False)
        else:
            step.start(input, use_approval=use_approval, workspace=self._before(), also=also)
        if spec.announce:
            self._event(StepState.STARTED.value, detail=spec.detail, attempts=step.attempts)

    def end(self, outcome: StepOutcome) -> StepOutcome:
        """The second half of `run`: the outcome of an effect begun with `begin`."""
        return self._end(outcome)

    def record(self, outcome: StepOutcome) -> StepOutcome:
        """An outcome without running anything (a refusal, a write found landed). A step with
        a row (an interrupted attempt) still gets its after snapshot: what it changed."""
        return self._end(outcome)

    # -- what an interrupted attempt left (its before snapshot against the files now) -------
    def unchanged_since_prior(self) -> bool:
        prior = self.prior
        return recorder.unchanged_since(self.ctx, prior.tree_before if prior else None)

    def changed_since_prior(self) -> str:
        prior = self.prior
        return recorder.changed_so_far(self.ctx, prior.tree_before if prior else None)

    def put_back_prior(self) -> None:
        """`approve --restore`: the workspace as the interrupted attempt started from."""
        prior = self.prior
        if prior is not None and prior.tree_before:
            recorder.put_back(self.ctx, prior.tree_before)

    # -- the protocol ---------------------------------------------------------------------
    def _before(self) -> WorkspaceWrite | None:
        if not self.spec.changes_files:
            return None
        prior = self.prior
        if prior is not None and prior.tree_before:
            # What an interrupted attempt changed is this step's change too: measured from
            # where that attempt started, not from the files it left (a write killed after
            # it landed then showed no change at all).
            self.step.tree_before = prior.tree_before
            return WorkspaceWrite(columns={"tree_before": prior.tree_before})
        if self.spec.tree_before and self.ctx.settings.snapshots:
            self.step.tree_before = self.spec.tree_before
            return WorkspaceWrite(columns={"tree_before": self.spec.tree_before})
        return recorder.before(self.ctx, self.step, self.writes)

    def _after(self) -> WorkspaceWrite | None:
        return recorder.after(self.ctx, self.step, self.writes) if self.spec.changes_files else None

    def _end(self, outcome: StepOutcome, *, announce: bool = True) -> StepOutcome:
        ctx, step = self.ctx, self.step
        ws = self._after()
        output = outcome.output
        if ws is not None and ws.note and isinstance(output, dict):
            output["workspace_note"] = ws.note  # what the snapshot had to leave out
        if outcome.attempts is not None:
            step.attempts = outcome.attempts
        if outcome.error is None:
            step.complete(
                output,
                messages=outcome.messages,
                counters=ctx.counters(),
                tokens=outcome.tokens,
                use_approval=outcome.use_approval,
                workspace=ws,
                extra=outcome.statements,
                cached_tokens=outcome.cached_tokens,
                cost=outcome.cost,
            )
        else:
            step.fail(
                outcome.error,
                output=output,
                messages=outcome.messages,
                counters=ctx.counters(),
                use_approval=outcome.use_approval,
                workspace=ws,
                extra=outcome.statements,
            )
        if announce:
            spec = self.spec
            duration = outcome.duration_ms
            if duration is None and spec.timed:
                duration = int((utcnow() - step.started_at).total_seconds() * 1000)
            tokens = outcome.tokens if spec.metered else None
            self._event(
                StepState.COMPLETED.value if outcome.error is None else StepState.FAILED.value,
                detail=spec.detail if outcome.detail is None else outcome.detail,
                attempts=step.attempts if spec.metered else 1,
                duration_ms=duration,
                prompt_tokens=tokens[0] if tokens else None,
                completion_tokens=tokens[1] if tokens else None,
                estimated=outcome.estimated,
                error=outcome.error,
                cached_tokens=outcome.cached_tokens,
                cost=outcome.cost,
                facts=outcome.facts,
            )
        return outcome

    def _event(self, state: str, **fields: Any) -> None:
        spec = self.spec
        if fields.get("facts") is None and spec.tool_name:
            fields["facts"] = {"input": spec.input}  # a tool's arguments (content, for spans)
        self.ctx.observer.step(
            StepEvent(
                self.step.seq,
                spec.turn,
                spec.kind.value,
                spec.label,
                state=state,
                key=spec.key,
                call_id=spec.call_id,
                resumed=self.step.prior is not None,
                **fields,
            )
        )


def open_step(ctx: StepContext, spec: StepSpec) -> StepCall:
    """Find the step: the recorded attempt to go on with, or a new one (nothing is written)."""
    journal = ctx.journal
    reused = journal.completed(spec.key) if spec.reuse else None
    if reused is None and spec.changes_files:
        ctx.check_workspace()  # no write or command in a folder that is not the run's
    if spec.supersede:
        journal.forget_superseded(spec.kind, spec.turn, spec.key)
    step = journal.find(
        spec.key,
        spec.kind,
        turn=spec.turn,
        call_id=spec.call_id,
        tool_name=spec.tool_name,
        effect=spec.effect.value if spec.effect is not None else None,
    )
    if step.input is None:
        step.input = spec.input
    return StepCall(ctx, spec, step, reused)


def invoke(ctx: StepContext, spec: StepSpec, fn: StepFn) -> StepOutcome:
    """The whole protocol for a step with no decision between finding and starting it.
    A completed step under the key (`spec.reuse`) returns its recorded outcome."""
    call = open_step(ctx, spec)
    if call.reused is not None:
        return StepOutcome(call.reused.output, call.reused.error)
    return call.run(fn, input=spec.input)
