"""The loop: preflight → model call → tool calls → record → … until an answer or a stop.

Start and resume are the same code: `execute` rebuilds the run from the database and asks
the recorded history what comes next (tool calls without results, a final answer to verify,
or the next model call). Every branch records new state or raises a `LoopExit`, caught in
exactly one place (`_drive`), which ends the run."""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from msgspec.structs import force_setattr

from durable_agent import errors
from durable_agent.config.settings import Settings
from durable_agent.context.prompts import SYSTEM_PROMPT
from durable_agent.loop import delegate_step, finish_gate, guard, hooks, telemetry, turns, versions
from durable_agent.loop.delegate_step import GO_ON
from durable_agent.loop.heartbeat import Heartbeat
from durable_agent.loop.memory_step import load_memory
from durable_agent.loop.model_step import model_step
from durable_agent.loop.outcome import ChildrenGoing, Outcome, RunReleased, finish
from durable_agent.loop.replay import rebuild
from durable_agent.loop.step_context import StepContext
from durable_agent.loop.tool_step import over_cap, run_tool, stop_leftover_processes, tool_key
from durable_agent.loop.workspace_setup import setup_workspace
from durable_agent.messages import Message
from durable_agent.models import ModelClient
from durable_agent.observer import Observer
from durable_agent.redact import Redactor
from durable_agent.status import RunStatus, StopReason
from durable_agent.store import leases, retrying
from durable_agent.store.journal import Journal
from durable_agent.store.records import RunRecord
from durable_agent.store.runs import Store, new_run_statements
from durable_agent.store.waiting import NOT_ENDED
from durable_agent.tools.base import Tool, tool_schema
from durable_agent.workspace import recorder, resume


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


class Runner:
    def __init__(
        self,
        *,
        store: Store,
        settings: Settings,
        model: ModelClient,
        tools: dict[str, Tool],
        env: Mapping[str, str],
        redactor: Redactor,
        observer: Observer | None = None,
        cancel: threading.Event | None = None,
        sleep: Callable[[float], None] = time.sleep,
        retry_policy: Any = None,
        store_policy: retrying.StorePolicy | None = None,
        tool_source: Any = None,
        model_for: Callable[[Settings], ModelClient] | None = None,
    ) -> None:
        self.store, self.settings, self.model, self.tools = store, settings, model, tools
        self.tool_source = tool_source  # tool_sources.ToolSet: the run's plugin and MCP tools
        self.env, self.redactor, self.sleep, self.retry_policy = env, redactor, sleep, retry_policy
        self.store_policy = store_policy or store.policy
        self.observer, self.cancel = observer or Observer(), cancel or threading.Event()
        # Set by a worker that shuts down: stop at the next step boundary with RunReleased.
        self.release = threading.Event()
        # A worker's run: a child that has not ended is left to the workers' queue and the
        # run stops `waiting` for it (store/waiting.py); else its children run in this process.
        self.children_wait = False
        # What this session may go on with when the run's fingerprint changed (loop/versions.py).
        self.versions = versions.VersionPolicy()
        self._takeover = False  # this session took over a run whose process died
        self.model_for = model_for  # a child's model, when it names another (wiring.build_model)

    def create(
        self,
        task: str,
        run_id: str | None = None,
        *,
        lease_owner: str | None = None,
        queue: Mapping[str, Any] | None = None,
        batch_task: Mapping[str, Any] | None = None,
    ) -> str:
        """Record a new run with its first messages; returns its id. Without `lease_owner` it
        is `pending` (for workers); with one it is created leased to that owner at epoch 1.
        `batch_task`: its row of batch_tasks (task_id, seq, spec), made with it."""
        run_id = new_run_id() if run_id is None else errors.checked_run_id(run_id)
        if self.store.run_exists(run_id):
            raise errors.UsageError(
                f"a run with id {run_id!r} already exists; resume it or pick another id"
            )
        first = [Message("system", SYSTEM_PROMPT), Message("user", self.redactor.redact(task))]
        lease = (lease_owner, self.settings.lease_seconds) if lease_owner else None
        self.store.create_run(
            run_id,
            task=self.redactor.redact(task),
            workspace=str(self.settings.workspace),
            model=self.model.name,
            settings=self.settings.redacted_dict(),
            first_messages=first,
            lease=lease,
            queue=queue,  # batch_id, priority, queue_key (docs/fleets.md)
            batch_task=batch_task,
            # A batch task's workspace is an empty placeholder until its first step makes it
            # (loop/workspace_setup.py): its first snapshot is taken after that, not now.
            tree_start=None
            if self.settings.workspace_repo
            else recorder.at_creation(
                self.settings, self.store.engine, self.store_policy, redactor=self.redactor
            ),
            version_key=versions.version_key(),
        )
        return run_id

    def execute(
        self,
        run_id: str,
        *,
        lease: tuple[str, int] | None = None,
        turn: tuple[str, str] | None = None,
        takeover: bool = False,
    ) -> Outcome:
        """Take the lease (or use the one a worker took) and drive the run until it stops.
        `turn`: (message, how the run stood before this session took it): `continue` first
        records the person's message as a new turn (loop/turns.py). `takeover`: the run was
        `running` when its lease was taken (its process died)."""
        if lease is None:
            owner = leases.new_owner()
            epoch, stood = self.store.take_over(run_id, owner, self.settings.lease_seconds)
            lease, takeover = (owner, epoch), stood[0] == RunStatus.RUNNING
        self._takeover = takeover
        journal = Journal(
            self.store.engine,
            run_id,
            *lease,
            self.settings.lease_seconds,
            policy=self.store_policy,
            sleep=self.sleep,
        )
        try:
            with Heartbeat(journal, max(0.2, self.settings.lease_seconds / 3), self.cancel) as beat:
                try:
                    if (
                        self.tool_source is not None
                    ):  # the run's recorded tools (starting MCP servers
                        self.tools = self.tool_source.open(
                            self.store, run_id
                        )  # under a live lease)
                    return self._drive(journal, beat, turn)
                except errors.LeaseLost:
                    beat.lost = True
                    raise
                except (
                    errors.StoreError,
                    errors.ConfigError,
                    errors.VersionRefused,
                    errors.WorkspaceUnreachable,
                ):  # the store, a server that will not start, a change nothing can cover
                    journal.release_lease()  # let a resume in at once, if the store allows it
                    raise
        finally:
            journal.close()
            if self.tool_source is not None:
                self.tool_source.close()

    def queue_turn(self, run_id: str, lease: tuple[str, int], message: str, stood: str) -> None:
        """`continue --detach`: record the person's message as a new turn under `lease`, then
        hand the run to the workers' queue (`pending`); a worker drives the turn."""
        journal = Journal(
            self.store.engine,
            run_id,
            *lease,
            self.settings.lease_seconds,
            policy=self.store_policy,
            sleep=self.sleep,
        )
        try:
            ctx = self.context(journal, time.monotonic())
            stop_leftover_processes(ctx)
            resume.rebuild_if_missing(ctx)
            # As in _drive: the person's message is consent to what runs now (the worker
            # that drives the turn then finds no change to ask about).
            self.record_version(ctx, "continue")
            turns.open_turn(ctx, message, stood=stood)
            journal.hand_to_queue()
        except (errors.StoreError, errors.WorkspaceUnreachable):
            journal.release_lease()  # the run stays as it was left: `continue` again
            raise
        except errors.LoopExit as stop:  # (the workspace is not the run's folder)
            journal.release_lease()
            raise errors.ConfigError(stop.detail or stop.reason.value) from None
        finally:
            journal.close()

    def context(
        self, journal: Journal, session_start: float, beat: Heartbeat | None = None
    ) -> StepContext:
        """The run as rebuilt from its rows, ready for steps (also `durable-agent compact`)."""
        loaded = journal.load()
        s = self.settings
        state = rebuild(
            run_id=loaded.run.id,
            messages=loaded.messages,
            active_ms=loaded.run.active_ms,
            model_tokens=loaded.model_tokens,
            compactions=loaded.compactions,
            last_model_output=loaded.last_model_output,
            window=turns.window_of(loaded.user_turns),
            paid=(loaded.model_cached, loaded.model_cost),
            older=loaded.older,
        )
        state.session = loaded.run.resume_count
        limits = guard.Limits(
            s.max_steps, s.max_tool_calls, s.max_tokens, s.max_seconds, s.max_repeats, s.max_cost
        )
        return StepContext(
            journal=journal,
            state=state,
            settings=s,
            model=self.model,
            tools=self.tools,
            schemas=[tool_schema(t) for t in self.tools.values()],
            redactor=self.redactor,
            observer=self.observer,
            cancel=self.cancel,
            env=self.env,
            limits=limits,
            clock=time.monotonic,
            sleep=self.sleep,
            session_start=session_start,
            retry_policy=self.retry_policy,
            resumed=loaded.run.resume_count > 0,
            beat=beat,
            forked_at=loaded.run.fork_seq if loaded.run.forked_from else None,
            children=InProcessChildren(self),
        )

    def version_fingerprint(self, ctx: StepContext) -> dict[str, Any]:
        """What this session runs the run with (loop/versions.py)."""
        recorded = self.store.tool_sources(ctx.state.run_id) if self.tool_source else None
        return versions.fingerprint(
            self.settings,
            self.model.name,
            ctx.tools,
            sources=getattr(self.tool_source, "sources", None),
            mcp_catalog=(recorded or {}).get("mcp_servers"),
        )

    def record_version(self, ctx: StepContext, reason: str) -> None:
        """A run_versions row for `reason` (a `continue`), under this session's lease."""
        versions.record_version(ctx, self.version_fingerprint(ctx), reason)

    def _pin_tools(self, journal: Journal) -> None:
        """`resume --pin`: offer the tools the run recorded, not ones added since."""
        from durable_agent.store.versions import last_version

        last = last_version(journal.engine, journal.run_id, journal.policy)
        if last is not None:
            recorded = last.fingerprint.get("tools") or {}
            self.tools = {n: t for n, t in self.tools.items() if n in recorded}

    def _drive(
        self, journal: Journal, beat: Heartbeat, turn: tuple[str, str] | None = None
    ) -> Outcome:
        start = time.monotonic()
        if self.versions.pin:
            self._pin_tools(journal)
        ctx = self.context(journal, start, beat)
        if not telemetry.wanted(self.settings, self.env):
            return self._steps(journal, beat, ctx, start, turn)
        try:
            session = telemetry.Session(ctx, takeover=self._takeover)
        except telemetry.Unavailable as exc:  # the extra missing: the run goes on untraced
            ctx.observer.note(str(exc))
            return self._steps(journal, beat, ctx, start, turn)
        force_setattr(ctx, "observer", telemetry.TracingObserver(ctx.observer, session))
        try:
            outcome = self._steps(journal, beat, ctx, start, turn)
        except BaseException as exc:
            session.end(None, exc)
            raise
        session.end(outcome.status.value)
        return outcome

    def _steps(
        self,
        journal: Journal,
        beat: Heartbeat,
        ctx: StepContext,
        start: float,
        turn: tuple[str, str] | None,
    ) -> Outcome:
        self.observer.run_started(
            ctx.state.run_id,
            resumed=(ctx.resumed or ctx.state.step_count > 0) and turn is None,
            steps_done=ctx.state.step_count,
        )
        try:
            if turn is None:
                # Before anything of the session runs: what changed since the checkpoint.
                versions.check(ctx, self.version_fingerprint(ctx), self.versions)
            if setup_workspace(ctx):  # a batch task's workspace, made once (docs/fleets.md)
                ctx = self.context(journal, start, beat)  # the folder the step renamed in
            stop_leftover_processes(ctx)
            if turn is not None:
                resume.rebuild_if_missing(ctx)  # the message step records the files: not none
                # A person's new message is consent to what runs now: the row rides with it.
                self.record_version(ctx, "continue")
                turns.open_turn(ctx, turn[0], stood=turn[1])
                # From the rows, as a resume would: the new turn's window, its stale steps gone.
                observer = ctx.observer  # (traced: the session's span goes on)
                ctx = self.context(journal, start, beat)
                force_setattr(ctx, "observer", observer)
            delegate_step.drop_copies(ctx)  # a crash left them after their outcome's commit
            resume.check(ctx)  # rebuild a missing workspace; stop on drift
            # Project memory: read on a new run, the recorded text after; a new turn
            # (`continue`) reads the files again.
            load_memory(
                ctx, new_turn=ctx.state.turn if turn is not None else turns.opened_by_message(ctx)
            )
            hooks.session_start(ctx, ctx.state.session)
            hooks.fire_resume(ctx, ctx.state.session)
            while True:
                self._check_cancel(ctx)
                if pending := ctx.state.pending_calls():
                    cap = ctx.settings.max_tool_calls_per_turn
                    asked, over = ctx.state.calls_over(cap)
                    if not over and delegate_step.side_by_side(ctx, pending):
                        # Children of one answer that do not write the shared folder run at
                        # once (docs/delegation.md).
                        delegate_step.delegate_together(
                            ctx, [(call, tool_key(call)) for call in pending]
                        )
                        continue
                    for call in pending:
                        self._check_cancel(ctx)
                        run_tool(
                            ctx, call, over_cap=over_cap(asked, cap) if call.id in over else None
                        )
                    continue
                hooks.post_tools(ctx)  # the last answer's calls all ran (once each: durable)
                if (answer := ctx.state.final_answer()) is not None:
                    if hooks.stop(ctx, answer) and finish_gate.verify(ctx, answer):
                        raise errors.LoopExit(StopReason.FINISHED, answer=answer)
                    continue
                model_step(ctx)
        except errors.LoopExit as stop:
            return finish(ctx, stop.reason, answer=stop.answer, error=stop.detail or None)
        except errors.ModelError as exc:
            return finish(ctx, StopReason.MODEL_ERROR, error=str(exc))
        except errors.HistoryDiverged as exc:
            return finish(ctx, StopReason.STEP_MISMATCH, error=str(exc))
        except KeyboardInterrupt:
            # "Stop now" can land between a change of the in-memory state and its commit:
            # end the run with what the database holds, not with what was in flight.
            return finish(
                self.context(journal, start, beat),
                StopReason.CANCELLED,
                error="interrupted (Ctrl-C)",
            )
        except ChildrenGoing as going:
            return self._wait(ctx, going.children)
        except (
            errors.LeaseLost,
            RunReleased,
            errors.StoreError,
            errors.VersionRefused,
            errors.WorkspaceUnreachable,  # before any file was written: resumable as it was
        ):
            raise  # nothing more may be written by this session
        except Exception as exc:
            # A bug or an unexpected failure of a tool: the run ends failed and resumable,
            # with the reason, instead of staying `running` with a traceback.
            return finish(
                self.context(journal, start, beat),
                StopReason.TOOL_ERROR,
                error=f"unexpected {type(exc).__name__}: {exc}",
            )

    def _wait(self, ctx: StepContext, children: list[str]) -> Outcome:
        """Stop `waiting` for child runs (a worker's run): no lease, no process. The intents
        and the children's rows are committed; a worker goes on with the run once they
        ended, and its resume records each child's outcome (store/waiting.py)."""
        ctx.journal.discard_deferred()  # (nothing is deferred after an intent's commit)
        status = RunStatus(ctx.journal.wait_for_children())
        going = [
            c.id for c in self.store.children(ctx.state.run_id) if c.status in NOT_ENDED
        ] or children
        ctx.observer.note(
            f"waiting for child run(s) {', '.join(going)}: "
            + ("the lease is released" if status is RunStatus.WAITING else "they ended already")
        )
        return Outcome(ctx.state.run_id, status, None, None, None)

    def _check_cancel(self, ctx: StepContext) -> None:
        if self.release.is_set():
            raise RunReleased(ctx.state.run_id)
        # cancel_seen comes back with every checkpoint (no extra query per step); the
        # heartbeat sets the event while a long call or command runs.
        if self.cancel.is_set() or ctx.journal.cancel_seen:
            raise errors.LoopExit(StopReason.CANCELLED, "cancelled by request")


def prepare_folder(store: Store, env: Mapping[str, str], child_id: str, workspace: Path) -> None:
    """The child's folder before it runs: a `copy` child that has not begun has its folder
    made again from the snapshot (one a crash cut off while it was being filled is not taken
    as it stands); made if missing, so a worker finds it (a `copy` is filled on start)."""
    copy = delegate_step.copy_folder(env, child_id)
    if workspace == copy and not store.steps(child_id):
        shutil.rmtree(copy, ignore_errors=True)
    os.makedirs(workspace, mode=0o700, exist_ok=True)


def _answered_since(store: Store, child: RunRecord) -> bool:
    """A `blocked` child whose last question was decided after it stopped."""
    if child.status != RunStatus.BLOCKED or child.finished_at is None:
        return False
    asked = store.approvals(child.id)
    last = asked[-1] if asked else None
    return (
        last is not None
        and last.decided_at is not None
        and last.used_at is None
        and last.decided_at >= child.finished_at
    )


class _Linked(threading.Event):
    """A child's cancel: its own, or its parent's (a cancel of the parent stops the child;
    one of the child stops only the child)."""

    def __init__(self, parent: threading.Event) -> None:
        super().__init__()
        self.parent = parent

    def is_set(self) -> bool:
        return super().is_set() or self.parent.is_set()


class InProcessChildren:
    """A run's children (loop/delegate_step.py), run in this process, each by a Runner of
    its own with its own lease and database session (several at once on threads of their
    own: delegate_step.delegate_together)."""

    def __init__(self, parent: Runner) -> None:
        self.parent = parent

    def depth(self, run_id: str) -> int:
        return self.parent.store.depth(run_id)

    def children(self, run_id: str) -> list[RunRecord]:
        return self.parent.store.children(run_id)

    def pending_request(self, child_id: str) -> str | None:
        asked = self.parent.store.pending_approval(child_id)
        if asked is None:
            return None
        what = asked.command or asked.tool_name or asked.call_id
        return f"{asked.kind} for {what}" + (f" ({asked.reason})" if asked.reason else "")

    def cancelled(self, run_id: str) -> bool:
        return bool(self.parent.store.get_run(run_id).cancel_requested)

    def cancel_children(self, run_id: str) -> list[str]:
        return self.parent.store.cancel_children(run_id)

    def changes(self, child_id: str) -> str:
        from durable_agent.store.blobs import first_tree, tree_at
        from durable_agent.workspace import diffing

        engine = self.parent.store.engine
        last = tree_at(engine, child_id)
        before = first_tree(engine, child_id)
        if last is None or before is None or last.tree == before:
            return ""
        old, new, found, blobs = diffing.between(engine, before, last.tree)
        return "".join(diffing.unified(old, new, found, blobs.blob))

    def creation(
        self, parent_id: str, child_id: str, task: str, settings: Settings
    ) -> Callable[[int], list[Any]]:
        p = self.parent
        redactor = p.redactor
        first = [Message("system", SYSTEM_PROMPT), Message("user", redactor.redact(task))]
        # The parent's files as the child starts from them (a `copy` child's folder is made
        # from this snapshot when it first runs: workspace/resume.py rebuilds it).
        tree_start = recorder.at_creation(
            p.settings, p.store.engine, p.store_policy, redactor=redactor
        )
        # In the workers' queue a child goes as its parent: its batch's workers claim it
        # (`batch submit --run`), at its priority. (Not a task of the batch: batch_tasks.)
        made_by = p.store.get_run(parent_id)
        queue = {"batch_id": made_by.batch_id, "priority": made_by.priority}

        def statements(seq: int) -> list[Any]:
            return new_run_statements(
                child_id,
                task=redactor.redact(task),
                workspace=str(settings.workspace),
                model=settings.model or "",
                settings=settings.redacted_dict(),
                first_messages=first,
                tree_start=tree_start,
                parent=(parent_id, seq),
                # The release that made it, as for any run: a worker of another version
                # key claims it only with consent (docs/versions.md).
                version_key=versions.version_key(),
                queue=queue,
            )

        return statements

    def run(self, child_id: str, settings: Settings, tools: dict[str, Tool]) -> RunRecord:
        p = self.parent
        store = p.store
        child = store.get_run(child_id)
        if RunStatus(child.status) not in GO_ON:
            return child  # it ended before the parent read it: its outcome is read once
        # Its budgets and tools as recorded when it was made (the parent's state may differ
        # on a resume: its siblings side by side may have ended since).
        recorded = child.settings if isinstance(child.settings, dict) else {}
        kept = ("model", "max_steps", "max_cost", "max_tokens", "child_tools")
        settings = settings.model_copy(update={k: recorded[k] for k in kept if k in recorded})
        if settings.child_tools is not None:
            tools = {n: t for n, t in tools.items() if n in settings.child_tools}
        model = p.model
        if settings.model != p.settings.model:
            if p.model_for is None:
                raise errors.ConfigError("a child with another model needs a model factory")
            model = p.model_for(settings)
        runner = Runner(
            store=store,
            settings=settings,
            model=model,
            tools=tools,
            env=p.env,
            redactor=p.redactor,
            cancel=_Linked(p.cancel),
            sleep=p.sleep,
            retry_policy=p.retry_policy,
            store_policy=p.store_policy,
            model_for=p.model_for,
        )
        runner.release = p.release
        if p.children_wait:
            # Made (never emptied: a worker may be filling it) so a worker finds it; the
            # worker that claims the child prepares it under the child's lease.
            os.makedirs(settings.workspace, mode=0o700, exist_ok=True)
            if _answered_since(store, child):
                # Blocked, and a person answered its question since (`approve PARENT`,
                # then `resume --detach PARENT`): the workers' queue goes on with it.
                store.requeue(child_id)
            elif RunStatus(child.status) in (RunStatus.BLOCKED, RunStatus.CANCELLED):
                return child  # stopped: its outcome (the parent blocked, or told it ended)
            # Not ended: the workers' queue has it; the parent stops `waiting` for it.
            raise ChildrenGoing([child_id])
        prepare_folder(store, p.env, child_id, Path(settings.workspace))
        try:
            runner.execute(child_id)
        except errors.RunBusy:
            # Another process runs it (a worker, or a dead parent's session whose lease has
            # not run out yet): wait until it ends or its lease can be taken.
            while not p.cancel.is_set():
                child = store.get_run(child_id)
                if RunStatus(child.status) not in (
                    RunStatus.PENDING,
                    RunStatus.RUNNING,
                    RunStatus.WAITING,
                ):
                    return child
                p.sleep(0.2)
                try:
                    runner.execute(child_id)
                    break
                except errors.RunBusy:
                    continue
        return store.get_run(child_id)
