"""`durable-agent worker`: claim queued and orphaned runs from the database and execute them.

    main thread    claim (store/queue.py) ──> one thread per run, at most --concurrency
                   sleeps --poll between claims when idle; signals only set events here
    run thread     rebuild the run's recorded settings ──> build_runner ──> Runner.execute
                   with the lease taken in the claim (its Heartbeat thread renews it)

Threads, not processes: a run spends its time waiting on the model or on a command, each
run has its own Runner, and the engine's pool is sized for a run thread plus a heartbeat
thread per run.

Shutdown (SIGTERM or Ctrl-C): stop claiming, let every run finish the step it is in, then
give it back (`pending`, lease released) for another worker. A second signal exits at
once; those runs are taken over by other workers when their leases expire.

A run whose workspace is not a directory on this machine, or whose settings cannot be
built here (a scripted model file missing, no API key), is not executed and not failed: the
worker says so on stderr, leaves it queued for a worker that can run it, and does not look
at it again for SKIP_SECONDS.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from msgspec import Struct

from durable_agent.config.settings import Settings, load_settings, recorded_settings
from durable_agent.errors import ConfigError, DurableAgentError, LeaseLost, StoreError, UsageError
from durable_agent.loop import versions
from durable_agent.loop.interrupts import Interrupts
from durable_agent.loop.outcome import RunReleased
from durable_agent.loop.runner import prepare_folder
from durable_agent.observer import Observer
from durable_agent.status import RUN_ID, RunStatus
from durable_agent.store.engine import open_store_engine
from durable_agent.store.leases import new_owner
from durable_agent.store.queue import Claim, Queue
from durable_agent.store.revision import HEAD_REVISION
from durable_agent.store.runs import Store, store_policy
from durable_agent.store.versions import schema_ahead
from durable_agent.visible import visible
from durable_agent.wiring import build_runner
from durable_agent.workspace.lease import workspace_lease

# How long a worker leaves alone a run it could not execute (workspace not mounted here,
# settings it cannot build): long enough not to spam the log, short enough to notice a
# filesystem that was mounted in the meantime.
SKIP_SECONDS = 300.0


class WorkerOptions(Struct, frozen=True):
    db: str
    concurrency: int = 1
    lease_seconds: float = 30.0
    poll_s: float = 1.0
    once: bool = False
    quiet: bool = False
    max_running: int | None = None
    workspace_root: Path | None = None  # each run in ROOT/RUN_ID, rebuilt from its snapshots
    # docs/versions.md: `compatible` claims the runs of this worker's version key (and runs
    # no release recorded one for); `all` claims every run and accepts what changed for it.
    accept_changes: str = "compatible"
    batch: str | None = None  # claim only this batch's runs (`batch submit --run`)


class Log:
    """Whole lines on stderr from many threads, never interleaved mid-line."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        with self._lock:
            try:
                self.out.write(f"{stamp} {visible(text)}\n")  # errors quote providers and models
                self.out.flush()
            except (OSError, ValueError):  # stderr closed (a pipe reader went away): runs go on
                pass


class _RunStream:
    """A text stream for a run's timeline that prefixes each line with the run id, so the
    timelines of concurrent runs stay readable."""

    def __init__(self, log: Log, run_id: str) -> None:
        self.log, self.prefix, self._buf = log, f"  {run_id[:8]} ", ""

    def write(self, text: str) -> int:
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            self.log.line(self.prefix + line)
        return len(text)

    def flush(self) -> None:
        pass


def run_worker(
    settings: Settings,
    options: WorkerOptions,
    env: Mapping[str, str],
    timeline: Callable[[TextIO], Observer] | None = None,
) -> int:
    """Run a worker on `settings.db` until it is told to stop (or, with `once`, runs out).

    `timeline` makes the observer that prints a run's steps into the log (the CLI passes its
    own, cli/render.Timeline: the worker stays below the CLI); None prints none."""
    assert settings.db is not None
    policy = store_policy(settings)
    engine = open_store_engine(
        settings.db,
        durability=settings.durability,
        pool_size=2 * options.concurrency + 2,
        policy=policy,
        lease_seconds=options.lease_seconds,
    )
    try:
        worker = Worker(Store(engine, policy), options, env, Log(sys.stderr), timeline)
        worker.notify_settings = settings if settings.notify else None
        return worker.run()
    finally:
        engine.dispose()


class Worker:
    def __init__(
        self,
        store: Store,
        options: WorkerOptions,
        env: Mapping[str, str],
        log: Log,
        timeline: Callable[[TextIO], Observer] | None = None,
    ) -> None:
        self.store, self.options, self.env, self.log = store, options, env, log
        self.timeline = timeline
        self.queue = Queue(store.engine)
        if options.accept_changes != "all":  # mixed fleets: only runs it goes on with alone
            self.queue.version_key = versions.version_key()
        self.name = new_owner().rsplit(":", 1)[0]  # host:pid; each claim gets its own owner
        self.stopping = threading.Event()  # shared by every Runner as its `release` event
        self.wake = threading.Event()  # a run thread ended, or a signal came
        self.counts: Counter[str] = Counter()  # updated by run threads: only through _count
        self._active: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._skip: dict[str, float] = {}  # run id -> monotonic time until which we leave it
        # Runs this worker stopped on a store fault, their leases still ours (nobody could
        # release them): run id -> monotonic time by which that lease has expired. `--once`
        # does not leave before then, so it takes them back instead of leaving them `running`.
        self._interrupted: dict[str, float] = {}
        self._taken_back: set[str] = set()  # runs `--once` waited for and claimed again
        # `--once`: the store failure it stops on (exit 7), rather than polling a store that
        # is gone for ever or taking back, again and again, a run the store keeps failing.
        self.store_failure: StoreError | None = None
        # [[notify]] of the worker's config: its deliverer thread sends the outbox's rows
        # (the ends of the runs it executes, and any a crashed process left behind).
        self.notify_settings: Settings | None = None
        self.notify_wake = threading.Event()
        self._schedules_at = 0.0  # monotonic time of the last look at the schedules

    # -- main loop ------------------------------------------------------------------------
    def run(self) -> int:
        o = self.options
        url = self.store.engine.url.render_as_string(hide_password=True)
        limit = f" · global limit {o.max_running}" if o.max_running else ""
        self.log.line(
            f"worker {self.name} · {url} · concurrency {o.concurrency} · "
            f"lease {o.lease_seconds:g}s{limit}{' · --once' if o.once else ''}"
        )
        deliverer, sending, finished = None, None, threading.Event()
        if self.notify_settings is not None:
            from durable_agent.notify import Deliverer

            deliverer = Deliverer(self.store.engine, self.notify_settings, self.store.policy)
            sending = deliverer.background(finished, self.notify_wake, o.poll_s)
        with Interrupts(self._first_signal, self._second_signal):
            reason = self._loop()
            self._drain()
        if deliverer is not None and sending is not None:
            # Stopped and joined before the store is closed (a thread still sending as the
            # interpreter and the engine went crashed the process); then a last pass for the
            # ends of the last runs.
            finished.set()
            self.notify_wake.set()
            sending.join()
            with contextlib.suppress(Exception):
                deliverer.deliver_due()
        c = self.counts
        done = ", ".join(f"{n} {k}" for k, n in sorted(c.items()) if k not in {"claimed"})
        self.log.line(
            f"worker {self.name} stopped ({reason}) · {c['claimed']} claimed"
            + (f" · {done}" if done else "")
        )
        left = self._skipped_now()
        if left:
            self.log.line(
                f"left for other workers: {len(left)} run(s) this worker cannot execute: "
                + ", ".join(sorted(left))
            )
        if self.store_failure is not None:
            raise self.store_failure  # one error line, exit 7 (cli.py)
        return 0

    def _loop(self) -> str:
        o = self.options
        while not self.stopping.is_set():
            if (
                o.once and self.store_failure is not None
            ):  # claim nothing more; the runs in hand end
                return "the store is unavailable"
            if (ahead := self._schema_ahead()) is not None:
                self.log.line(
                    f"the store's schema is at revision {ahead}, newer than this durable-agent "
                    f"knows ({HEAD_REVISION}); claiming no more runs: upgrade durable-agent here"
                )
                return "store schema newer than this durable-agent"
            self._fire_schedules()
            if self._running_count() < o.concurrency:
                try:
                    result = self.queue.claim(
                        new_owner(),
                        o.lease_seconds,
                        max_running=o.max_running,
                        exclude=self._skipped_now(),
                        accept=_anywhere if o.workspace_root else _reachable,
                        batch=o.batch,  # fleets: `batch submit --run` drains its batch only
                    )
                except StoreError as exc:  # the server restarted, a network blip: claim again later
                    self.log.line(f"cannot claim: {exc}")
                    if o.once:  # (the store's own retries have waited already)
                        self.store_failure = exc
                        continue
                    result = None
                if result is not None:
                    for rej in result.rejected:
                        self._skip_run(
                            rej.run_id,
                            f"its workspace {rej.workspace} is not a directory on "
                            "this machine; left queued for a worker that can reach it",
                        )
                    if result.claim is not None:
                        self._start(result.claim)
                        continue  # fill the free slots before sleeping
                    if (
                        o.once
                        and not result.at_limit
                        and self._running_count() == 0
                        and not self._still_ours()
                    ):
                        return "nothing left to claim"
            self.wake.wait(o.poll_s)
            self.wake.clear()
        return "signal"

    def _schema_ahead(self) -> str | None:
        """A `db upgrade` by a newer release while this worker runs: its runs finish their
        step, nothing more is claimed (a fault reading it is the claim's to report)."""
        try:
            return schema_ahead(self.store.engine)
        except Exception:  # noqa: BLE001
            return None

    def _fire_schedules(self) -> None:
        """Start the runs of schedules whose tick has come (docs/fleets.md), at most once a
        poll interval; every worker does, and each tick starts one run over all of them."""
        if self.options.batch is not None:  # `batch submit --run` drains its batch only
            return
        if time.monotonic() - self._schedules_at < self.options.poll_s:
            return
        self._schedules_at = time.monotonic()
        from durable_agent import schedules

        try:
            schedules.fire_due(
                self.store, self.env, self.options.db, schedules.clock(self.env), self.log.line
            )
        except (StoreError, DurableAgentError, OSError, ValueError) as exc:
            self.log.line(f"cannot start scheduled runs: {exc}")
        self._finish_batches()

    def _finish_batches(self) -> None:
        """Finish the batches whose last run ended where nobody finished them (a worker killed
        between the run's end and `finish_if_done`): else such a batch stays `active`, its
        `batch_done` never sent. Looked at with the schedules, once a poll interval."""
        from durable_agent.store import fleet

        try:
            for batch_id in fleet.done_unfinished(self.store.engine):
                self._batch_progress(batch_id)
        except StoreError as exc:
            self.log.line(f"cannot look at the batches: {exc}")

    def _still_ours(self) -> bool:
        """Is a lease of a run this worker was interrupted in still to expire?"""
        now = time.monotonic()
        with self._lock:
            self._interrupted = {k: t for k, t in self._interrupted.items() if t > now}
            return bool(self._interrupted)

    def _running_count(self) -> int:
        with self._lock:
            return len(self._active)

    def _skipped_now(self) -> set[str]:
        now = time.monotonic()
        with self._lock:
            self._skip = {k: t for k, t in self._skip.items() if t > now}
            return set(self._skip)

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def _skip_run(self, run_id: str, why: str) -> None:
        with self._lock:
            self._skip[run_id] = time.monotonic() + SKIP_SECONDS
        self._count("skipped")
        self.log.line(f"skipped run {run_id}: {why}")

    def _start(self, claim: Claim) -> None:
        self._count("claimed")
        with self._lock:
            if self._interrupted.pop(claim.run_id, None) is not None:
                self._taken_back.add(claim.run_id)
        if claim.takeover:
            was = f"took over run {claim.run_id} from {claim.previous_owner or 'a released lease'}"
        else:
            was = f"claimed run {claim.run_id}"
        self.log.line(f"{was} (epoch {claim.epoch})")
        thread = threading.Thread(
            target=self._execute, args=(claim,), name=f"run-{claim.run_id}", daemon=True
        )
        with self._lock:
            self._active[claim.run_id] = thread
        thread.start()

    def _drain(self) -> None:
        with self._lock:
            threads = list(self._active.values())
        if threads and self.stopping.is_set():
            self.log.line(
                f"stopping: {len(threads)} run(s) finish their current step, then go back to "
                "the queue (signal again to exit at once)"
            )
        for t in threads:
            t.join()

    # Signal handlers run in the main thread between two bytecodes: only set events and write
    # with os.write, never take a lock (the main thread may hold it: a deadlock).
    def _first_signal(self, _signum: int) -> None:
        self.stopping.set()
        self.wake.set()

    def _second_signal(self, signum: int) -> None:
        with contextlib.suppress(OSError):
            os.write(
                2,
                b"second signal: exiting now; other workers take the runs over when "
                b"their leases expire\n",
            )
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    # -- one run, in its own thread -----------------------------------------------------------
    def _execute(self, claim: Claim) -> None:
        started = time.monotonic()
        try:
            self._execute_claim(claim, started)
        finally:
            with self._lock:
                self._active.pop(claim.run_id, None)
            self.wake.set()
            self.notify_wake.set()

    def _execute_claim(self, claim: Claim, started: float) -> None:
        rid = claim.run_id
        try:
            settings = self._run_settings(claim)
            observer = (
                None
                if self.options.quiet or self.timeline is None
                else self.timeline(_RunStream(self.log, rid))  # type: ignore[arg-type]
            )
            runner = build_runner(
                settings,
                env=self.env,
                store=self.store,
                observer=observer,
                cancel=threading.Event(),
            )
        except DurableAgentError as exc:  # e.g. a scripted model file or an API key missing here
            self._give_back(claim, f"cannot execute it on worker {self.name}: {exc}")
            self._skip_run(rid, f"{exc}; left queued for another worker")
            return
        except Exception as exc:  # noqa: BLE001 - a bug in one run must not kill the worker
            return self._unexpected(claim, exc)
        runner.release = self.stopping  # SIGTERM: stop at the next step boundary
        # A child not ended: the run stops `waiting` and this thread goes back to claiming
        # (the children among others), not holding a lease and a slot while they run.
        runner.children_wait = True
        if self.options.accept_changes == "all":
            runner.versions = versions.VersionPolicy(
                accept="all", by=f"worker {self.name} (--accept-changes all)"
            )
        try:
            # One live run per workspace, as for `start` and `resume`: a workspace another
            # process runs in (WorkspaceBusy) gives the run back, queued, below.
            with workspace_lease(
                settings.workspace, rid, self.env, shared=self._read_only_child(claim)
            ):
                outcome = runner.execute(
                    rid, lease=(claim.owner, claim.epoch), takeover=claim.takeover
                )
        except RunReleased:
            self._count("released")
            if self._give_back(claim, None):
                self.log.line(
                    f"released run {rid} between two steps; it is pending for another worker"
                )
            return
        except LeaseLost:
            # Another worker took the lease (ours expired: this process stalled or lost the
            # database for longer than the lease). The fence made sure we wrote nothing more.
            self._count("lost")
            self.log.line(
                f"lost run {rid}: its lease was taken over by another worker; "
                "this worker wrote nothing more to it"
            )
            return
        except StoreError as exc:
            # The database went away mid-run. Nothing is lost (the last checkpoint is
            # committed); the run is claimable again once the lease expires, by any worker.
            self._count("interrupted")
            with self._lock:  # (a heartbeat renewed it at most a lease ago)
                if self.options.once and rid in self._taken_back:  # a second time: not a blip
                    self.store_failure = exc
                else:
                    self._interrupted[rid] = time.monotonic() + self.options.lease_seconds + 1
            self.log.line(
                f"run {rid} interrupted: {exc}; it is claimable again when its lease expires"
            )
            return
        except DurableAgentError as exc:  # e.g. one of its MCP servers will not start on this host
            self._give_back(claim, f"cannot execute it on worker {self.name}: {exc}")
            self._skip_run(rid, f"{exc}; left queued for another worker")
            return
        except Exception as exc:  # noqa: BLE001 - a bug in one run must not kill the worker
            return self._unexpected(claim, exc)
        self._count(outcome.status.value)
        secs = time.monotonic() - started
        if outcome.status in (RunStatus.WAITING, RunStatus.PENDING):  # (store/waiting.py)
            self.log.line(
                f"run {rid} is {outcome.status.value} for its child runs · lease released · "
                f"{secs:.1f}s"
            )
            return
        tail = f": {outcome.error.splitlines()[0][:120]}" if outcome.error else ""
        try:
            run = self.store.get_run(rid)
            counts = f" · {run.step_count} model calls · {run.tool_call_count} tool calls"
        except StoreError:
            counts = ""
        self.log.line(
            f"finished run {rid} · {outcome.status.value} ({outcome.stop_reason}){counts} · "
            f"{secs:.1f}s{tail}"
        )
        if claim.batch_id is not None:
            self._batch_progress(claim.batch_id)

    def _batch_progress(self, batch_id: str) -> None:
        """A batch's run ended: is the batch finished? `finish_if_done` is true exactly once
        over all workers, so what follows it happens once per batch."""
        from durable_agent.store import fleet

        try:
            if fleet.finish_if_done(self.store.engine, batch_id, self.batch_done_targets()):
                self.batch_done(batch_id)
        except StoreError as exc:  # the next run of the batch to end asks again
            self.log.line(f"could not check batch {batch_id}: {exc}")

    def batch_done_targets(self) -> list[tuple[int, str]]:
        """The [[notify]] entries of this worker's config that want `batch_done`."""
        if self.notify_settings is None:
            return []
        return self.notify_settings.notify_targets("batch_done")

    def batch_done(self, batch_id: str) -> None:
        """THE place a batch finishes (once, on one worker); its `batch_done` notifications
        were written with the finish (fleet.finish_if_done): the deliverer sends them."""
        self.log.line(f"batch {batch_id} finished")
        self.notify_wake.set()

    def _unexpected(self, claim: Claim, exc: Exception) -> None:
        """A bug, most likely: say everything, give the run back, and leave it alone for a while
        here (another worker, or a fixed version, may do better)."""
        self._count("crashed")
        self.log.line(
            f"run {claim.run_id} stopped on an unexpected error: {exc!r}\n"
            + traceback.format_exc().rstrip()
        )
        self._give_back(claim, f"worker {self.name} hit an unexpected error: {exc!r}")
        self._skip_run(claim.run_id, "unexpected error (see above); left queued for another worker")

    def _run_settings(self, claim: Claim) -> Settings:
        # Like `resume`: the run's recorded settings, with this worker's database and lease.
        recorded = recorded_settings(claim.settings)
        flags: dict[str, object] = {
            "db": self.options.db,
            "lease_seconds": self.options.lease_seconds,
        }
        root = self.options.workspace_root
        child = self._child_folder(claim)
        if child is not None:  # a child run: its parent's folder, or its copy (delegation.md)
            flags["workspace"] = child
            try:  # (a copy not begun is emptied, under the child's lease: filled on start)
                prepare_folder(self.store, self.env, claim.run_id, child)
            except OSError as exc:
                raise ConfigError(f"cannot make the child's folder {child}: {exc}") from None
        elif root is not None:  # no shared file system: the run's files come from the store
            if not RUN_ID.fullmatch(
                claim.run_id
            ):  # `..` (made before ids were checked): not ROOT/..
                raise UsageError(
                    f"run id {claim.run_id!r} cannot name a folder under --workspace-root"
                )
            flags["workspace"] = root / claim.run_id
            try:
                (root / claim.run_id).mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # the root gone or read-only since the start: say so, skip it
                raise ConfigError(f"cannot make its folder under --workspace-root: {exc}") from None
        return load_settings(flags, self.env, base=recorded)

    def _child_folder(self, claim: Claim) -> Path | None:
        """Where a child run (delegation) runs here: a `shared`/`shared-write` one in the
        folder its parent runs in as this worker places it (`--workspace-root ROOT`:
        ROOT/ROOT_RUN_ID, not ROOT/CHILD_ID), a `copy` one in its recorded copy folder.
        None: not a child (its settings record no `child_tools`)."""
        if not isinstance(claim.settings, dict) or claim.settings.get("child_tools") is None:
            return None
        run = self.store.get_run(claim.run_id)
        return self._folder_of(run)

    def _folder_of(self, run: Any) -> Path:
        root = self.options.workspace_root
        if run.parent_id is None:
            return root / run.id if root is not None else Path(run.workspace)
        if delegated_workspace(self.store, run) == "copy":
            return Path(run.workspace)
        return self._folder_of(self.store.get_run(run.parent_id))

    def _read_only_child(self, claim: Claim) -> bool:
        """A `shared` child: it writes nothing, and reads its parent's folder beside its
        siblings (run side by side), so it takes no workspace lease (delegation.md)."""
        if not isinstance(claim.settings, dict) or claim.settings.get("child_tools") is None:
            return False
        return delegated_workspace(self.store, self.store.get_run(claim.run_id)) == "shared"

    def _give_back(self, claim: Claim, note: str | None) -> bool:
        try:
            return self.queue.release(claim.run_id, claim.owner, claim.epoch, note=note)
        except StoreError as exc:  # the lease then simply expires and someone takes it over
            self.log.line(
                f"could not release run {claim.run_id} ({exc}); it is claimable "
                "when its lease expires"
            )
            return False


def delegated_workspace(store: Store, run: Any) -> str | None:
    """The `workspace` a child run was delegated with (shared, shared-write, copy), as its
    parent's `delegate` step recorded the call; None for a run nobody delegated."""
    if run.parent_id is None or run.parent_step is None:
        return None
    step = next((s for s in store.steps(run.parent_id) if s.seq == run.parent_step), None)
    arguments = (step.input or {}).get("arguments") if step is not None else None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = None
    mode = arguments.get("workspace") if isinstance(arguments, dict) else None
    return mode if isinstance(mode, str) else "shared"


def _anywhere(_workspace: str) -> bool:
    return True  # --workspace-root: every run's workspace is rebuilt here from its snapshots


def _reachable(workspace: str) -> bool:
    """Can this machine execute a run in `workspace`? Paths are compared as recorded: a shared
    filesystem must be mounted at the same path on every worker."""
    try:
        return Path(workspace).is_dir()
    except OSError:
        return False
