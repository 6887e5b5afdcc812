"""The loop: preflight → model call → tool calls → record → … until an answer or a stop.

Start and resume are the same code: `_drive` rebuilds the run from the database and asks
the recorded history what comes next (tool calls without results, a final answer to
verify, or the next model call). Every branch either records new state or raises a
`LoopExit`, which is caught in exactly one place (`_Drive.run`) and ends the run.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from durable_agent import finish_gate, guard
from durable_agent.errors import HistoryDiverged, LeaseLost, LoopExit, ModelError, UsageError
from durable_agent.messages import Message, ModelTurn, ToolCall
from durable_agent.models import ModelClient
from durable_agent.observer import Observer, StepEvent
from durable_agent.prompts import SYSTEM_PROMPT
from durable_agent.redact import Redactor
from durable_agent.replay import RunState, rebuild
from durable_agent.settings import Settings
from durable_agent.status import STATUS_FOR_REASON, RunStatus, StepKind, StopReason
from durable_agent.store.journal import Counters, Journal
from durable_agent.store.rows import new_owner
from durable_agent.store.runs import Store
from durable_agent.tool_steps import ToolSteps
from durable_agent.tools.base import Tool, tool_schema


@dataclass(frozen=True)
class Outcome:
    run_id: str
    status: RunStatus
    stop_reason: str | None
    answer: str | None
    error: str | None


class RunReleased(Exception):
    """The run stopped between two steps because its worker shuts down (`Runner.release`).

    Not an end: nothing is finished or recorded, the worker gives the lease back and the run
    waits, `pending`, for another worker.
    """


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


class Heartbeat:
    """Renews the lease while a long model call or command runs, and notices cancellation.

    Runs in a thread because the main thread is blocked inside the call it protects.
    """

    def __init__(self, journal: Journal, interval: float, cancel: threading.Event) -> None:
        self.journal, self.interval, self.cancel = journal, interval, cancel
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lease-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.journal.heartbeat():
                    self.cancel.set()
            except LeaseLost:
                self.lost = True
                self.cancel.set()  # stop a running command: its results could not be recorded
                return
            except Exception:  # noqa: BLE001 - a failed renewal is retried next beat
                continue


class Runner:
    def __init__(self, *, store: Store, settings: Settings, model: ModelClient, tools: dict[str, Tool],
                 env: Mapping[str, str], redactor: Redactor, observer: Observer | None = None,
                 cancel: threading.Event | None = None, sleep: Callable[[float], None] = time.sleep,
                 retry_policy: Any = None, crash_after_commits: int | None = None) -> None:
        self.store, self.settings, self.model, self.tools = store, settings, model, tools
        self.env, self.redactor = env, redactor
        self.observer = observer or Observer()
        self.cancel = cancel or threading.Event()
        self.sleep = sleep
        self.retry_policy = retry_policy
        self.crash_after_commits = crash_after_commits
        # Set by a worker that shuts down: stop at the next step boundary with RunReleased.
        self.release = threading.Event()
        self.schemas = [tool_schema(t) for t in tools.values()]
        self.limits = guard.Limits(settings.max_steps, settings.max_tool_calls, settings.max_tokens,
                                   settings.max_seconds, settings.max_repeats)

    # -- entry points ------------------------------------------------------------------------
    def create(self, task: str, run_id: str | None = None, *, lease_owner: str | None = None) -> str:
        """Record a new run with its first messages; returns its id.

        Without `lease_owner` it is `pending` (queued for workers); with one it is created
        already leased to that owner at epoch 1 (`execute(run_id, lease=(owner, 1))`).
        """
        run_id = run_id or new_run_id()
        if self.store.run_exists(run_id):
            raise UsageError(f"a run with id {run_id!r} already exists; resume it or pick another id")
        first = [Message("system", SYSTEM_PROMPT), Message("user", self.redactor.redact(task))]
        lease = (lease_owner, self.settings.lease_seconds) if lease_owner else None
        self.store.create_run(run_id, task=self.redactor.redact(task), workspace=str(self.settings.workspace),
                              model=self.model.name, settings=self.settings.redacted_dict(),
                              first_messages=first, lease=lease)
        return run_id

    def execute(self, run_id: str, *, lease: tuple[str, int] | None = None) -> Outcome:
        """Take the lease and drive the run until it ends or stops; resume uses this too.

        `lease`: the (owner, epoch) a worker already took when it claimed the run.
        """
        if lease is None:
            owner = new_owner()
            epoch = self.store.acquire_lease(run_id, owner, self.settings.lease_seconds)
        else:
            owner, epoch = lease
        journal = Journal(self.store.engine, run_id, owner, epoch, self.settings.lease_seconds,
                          crash_after_commits=self.crash_after_commits)
        interval = max(0.2, self.settings.lease_seconds / 3)
        try:
            with Heartbeat(journal, interval, self.cancel) as beat:
                try:
                    return _Drive(self, journal).run()
                except LeaseLost:
                    beat.lost = True
                    raise
        finally:
            journal.close()


class _Drive:
    """One session of one run under one lease."""

    def __init__(self, runner: Runner, journal: Journal) -> None:
        self.r = runner
        self.settings = runner.settings
        self.journal = journal
        self.session_start = time.monotonic()
        loaded = journal.load()
        journal.cancel_seen = bool(loaded.run.cancel_requested)  # a worker keeps a cancel it took over
        self.state: RunState = rebuild(loaded.run, loaded.messages, loaded.open_steps, loaded.next_seq)
        self.resumed = loaded.run.resume_count > 0 or loaded.run.step_count > 0
        self.tool_steps = ToolSteps(self)

    # -- helpers used by ToolSteps too ---------------------------------------------------
    def active_ms(self) -> int:
        return self.state.active_ms + int((time.monotonic() - self.session_start) * 1000)

    def counters(self) -> Counters:
        s = self.state
        return Counters(s.step_count, s.tool_call_count, s.prompt_tokens, s.completion_tokens,
                        len(s.messages), self.active_ms())

    def next_seq(self) -> int:
        seq = self.state.next_step_seq
        self.state.next_step_seq += 1
        return seq

    def check_cancel(self) -> None:
        if self.r.release.is_set():
            raise RunReleased(self.state.run_id)
        # cancel_seen comes back with every checkpoint (no extra query per step); the
        # heartbeat sets the event while a long call or command runs.
        if self.r.cancel.is_set() or self.journal.cancel_seen:
            raise LoopExit(StopReason.CANCELLED, "cancelled by request")

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> Outcome:
        self.r.observer.run_started(self.state.run_id, resumed=self.resumed, steps_done=self.state.step_count)
        try:
            self.tool_steps.stop_leftover_processes()
            while True:
                self.check_cancel()
                pending = self.state.pending_calls()
                if pending:
                    for call in pending:
                        self.tool_steps.run(call)
                    continue
                answer = self.state.final_answer()
                if answer is not None:
                    if finish_gate.verified(self, answer):
                        raise LoopExit(StopReason.FINISHED, answer=answer)
                    continue
                self.model_step()
        except LoopExit as stop:
            return self.finish(stop.reason, answer=stop.answer, error=stop.detail or None)
        except ModelError as exc:
            return self.finish(StopReason.MODEL_ERROR, error=str(exc))
        except HistoryDiverged as exc:
            return self.finish(StopReason.MODEL_ERROR, error=f"history diverged: {exc}")
        except KeyboardInterrupt:
            # "Stop now" can land between a change of the in-memory state and its commit:
            # end the run with what the database holds, not with what was in flight.
            self.journal.discard_deferred()
            loaded = self.journal.load()
            self.state = rebuild(loaded.run, loaded.messages, loaded.open_steps, loaded.next_seq)
            return self.finish(StopReason.CANCELLED, error="interrupted (Ctrl-C)")
        except (LeaseLost, RunReleased):
            raise
        except Exception as exc:
            # A bug or an unexpected failure of a tool or the store: the run ends failed and
            # resumable, with the reason, instead of staying `running` with a traceback.
            return self.finish(StopReason.TOOL_ERROR, error=f"unexpected {type(exc).__name__}: {exc}")

    def finish(self, reason: StopReason, *, answer: str | None = None, error: str | None = None) -> Outcome:
        status = STATUS_FOR_REASON[reason]
        if reason is StopReason.FINISHED:
            error = None
        self.journal.finish_run(status=status.value, stop_reason=reason.value, answer=answer,
                                error=error, counters=self.counters())
        return Outcome(self.state.run_id, status, reason.value, answer, error)

    # -- one model call ---------------------------------------------------------------------
    def model_step(self) -> None:
        s = self.state
        stop = guard.before_model_call(self.r.limits, steps=s.step_count,
                                       tokens=s.prompt_tokens + s.completion_tokens, active_ms=self.active_ms())
        if stop is None:  # --max-cost: the tokens so far at the model's configured price
            price = self.settings.prices.get(self.settings.model or "")
            spent = price.cost(s.prompt_tokens, s.completion_tokens) if price else None
            stop = guard.before_model_cost(self.settings.max_cost, spent)
        if stop is not None:
            reason, detail = stop
            if s.messages[-1].role == "user" and s.step_count > 0:
                # The last observation is a rejected finish: the budget ran out while verification failed.
                reason, detail = StopReason.VERIFICATION_FAILED, f"{detail} while verification still fails"
            raise LoopExit(reason, detail)
        turn = s.turn
        key = f"model:{turn}:{s.history.digest[:32]}"
        prior = s.open_steps.pop(key, None)
        for other in s.open_steps.values():
            if other.kind == StepKind.MODEL and other.turn == turn:
                raise HistoryDiverged(
                    f"model step {turn} was recorded for different request messages "
                    f"({other.idempotency_key} vs {key})")
        earlier = prior.attempts if prior is not None else 0
        if prior is not None:
            seq = prior.seq
            started_at = self.journal.restart_step(seq, attempts=earlier + 1)
        else:
            seq = self.next_seq()
            request = {"turn": turn, "request_hash": s.history.digest, "messages": len(s.messages),
                       "model": self.r.model.name}
            started_at = self.journal.start_step(seq=seq, kind=StepKind.MODEL, key=key, turn=turn, input=request)
        obs = self.r.observer
        obs.step(StepEvent(seq, turn, "model", self.r.model.name, attempts=earlier + 1))

        def on_attempt(n: int, failure: Any) -> None:
            if failure is not None:
                self.journal.set_attempts(seq, earlier + n, failure.describe())
                obs.step(StepEvent(seq, turn, "model", self.r.model.name, state="retry",
                                   attempts=earlier + n, error=failure.describe()))

        from durable_agent.models.retry import ModelCallError, RetryPolicy, call_with_retries

        try:
            result, attempts = call_with_retries(
                lambda: self.r.model.complete(s.messages, self.r.schemas, turn),
                self.r.retry_policy or RetryPolicy(), sleep=self.r.sleep, on_attempt=on_attempt)
        except ModelCallError as exc:
            self.journal.finish_step(seq=seq, state="failed", started_at=started_at, output=None,
                                     error=str(exc), attempts=earlier + exc.attempts, counters=self.counters(),
                                     new_messages=())  # a failed call adds nothing to the history
            raise
        turn_out: ModelTurn = result
        calls = self._call_ids(turn_out.tool_calls, turn)
        redact = self.r.redactor.redact
        message = Message("assistant", redact(turn_out.content) if turn_out.content else turn_out.content,
                          tool_calls=calls)
        s.step_count += 1
        s.prompt_tokens += turn_out.usage.prompt_tokens
        s.completion_tokens += turn_out.usage.completion_tokens
        mseq = s.append(message)
        output = {"content": message.content, "tool_calls": [c.to_dict() for c in calls],
                  "usage": turn_out.to_dict()["usage"]}
        self.journal.finish_step(seq=seq, state="completed", started_at=started_at, output=output, error=None,
                                 attempts=earlier + attempts, prompt_tokens=turn_out.usage.prompt_tokens,
                                 completion_tokens=turn_out.usage.completion_tokens,
                                 counters=self.counters(), new_messages=[(mseq, message)])
        obs.step(StepEvent(seq, turn, "model", self.r.model.name, state="completed",
                           detail=_summary(message), attempts=earlier + attempts,
                           duration_ms=_ms_since(started_at), prompt_tokens=turn_out.usage.prompt_tokens,
                           completion_tokens=turn_out.usage.completion_tokens))

    def _call_ids(self, calls: tuple[ToolCall, ...], turn: int) -> tuple[ToolCall, ...]:
        """Keep the provider's ids; derive one from turn and position where it is missing or reused.

        The harness's own secrets are replaced here, once: what is stored, what runs and what
        the model sees again are then the same text. Only those exact values: a key-shaped
        string the model writes (a test fixture) is an effect, written and run byte for byte.
        """
        fixed = []
        for i, call in enumerate(calls):
            cid = call.id
            if not cid or cid in self.state.used_call_ids:
                cid = f"call_{turn}_{i}"
                while cid in self.state.used_call_ids:
                    cid += "_"
            self.state.used_call_ids.add(cid)
            fixed.append(ToolCall(id=cid, name=call.name, arguments=self.r.redactor.redact_known(call.arguments)))
        return tuple(fixed)


def _ms_since(started_at: Any) -> int:
    from durable_agent.store.rows import utcnow

    return int((utcnow() - started_at).total_seconds() * 1000)


def _summary(message: Message) -> str:
    if message.tool_calls:
        return ", ".join(c.name for c in message.tool_calls)
    text = (message.content or "").strip().replace("\n", " ")
    return text[:80] + ("…" if len(text) > 80 else "")
