"""Errors, one tree, and the tiny family of loop exits.

    DurableAgentError            every error this package raises on purpose
    ├── UsageError               bad flag, bad config, unknown run id (exit 2)
    │   ├── ConfigError
    │   ├── RunNotFound
    │   ├── VersionRefused       a change since the checkpoint no consent can cover
    │   └── WorkspaceUnreachable  a snapshot's files are in no git repository reachable here
    ├── RunBusy                  another live process holds the run's lease (exit 6)
    │   └── WorkspaceBusy        ... or the workspace's (workspace/lease.py)
    ├── LeaseLost                our lease was taken over: write nothing more
    ├── HistoryDiverged          recorded history does not match what replay rebuilt
    │   └── StepMismatch         a recorded step has another key than the one being run
    ├── StoreError               a database error, translated at the store boundary
    │   └── StoreUnavailable     connection lost, disk full, I/O error beyond retries (exit 7)
    │       └── StoreFileGone    the SQLite file in use was deleted or replaced (exit 7)
    └── ModelError               the model call failed (classified in models/failures.py)

Loop exits are not errors: `LoopExit` carries the stop reason out of the loop and is
caught in exactly one place, `Runner._drive`.
"""

from __future__ import annotations

from durable_agent.status import RUN_ID, StopReason


class DurableAgentError(Exception):
    """Root of every error raised on purpose. The message says what to do next."""


class UsageError(DurableAgentError):
    pass


class ConfigError(UsageError):
    pass


def checked_run_id(value: object) -> str:
    """`value` if it is a run id (status.RUN_ID; the API takes any value), else UsageError."""
    if not isinstance(value, str) or not RUN_ID.fullmatch(value):
        raise UsageError(
            f"invalid run id {value!r}: 1 to 64 letters, digits, '.', '_' or '-', "
            "a letter or digit first"
        )
    return value


class VersionRefused(UsageError):
    """The run cannot continue under this durable-agent at all (loop/versions.py): a store
    schema newer than this code, or an unfinished call to a tool that is gone. Exit 2, the
    run left as it was."""


class WorkspaceUnreachable(UsageError):
    """A snapshot taken with `snapshot_baseline = "git"` names a commit no repository here
    holds (workspace/git_baseline.py): exit 2 before anything is written, the run left as
    it was (resumable once the repository is back)."""


class RunNotFound(UsageError):
    def __init__(self, run_id: str) -> None:
        shown = run_id if len(run_id) <= 80 else run_id[:60] + f"... ({len(run_id)} characters)"
        super().__init__(f"no run with id {shown!r} (see `durable-agent list`)")
        self.run_id = run_id


class RunBusy(DurableAgentError):
    def __init__(self, run_id: str, owner: str) -> None:
        super().__init__(
            f"run {run_id} is being executed by another live process ({owner}); "
            "wait for it, or `durable-agent cancel` it"
        )
        self.run_id = run_id
        self.owner = owner


class WorkspaceBusy(RunBusy):
    """Another live process executes a run in the workspace (exit 6, as for a run's lease)."""

    def __init__(self, run_id: str, workspace: str, holder: str) -> None:
        DurableAgentError.__init__(
            self,
            f"the workspace {workspace} is in use by {holder}, another live process; two "
            "runs in one workspace race each other's files: wait for it, or pass "
            "--allow-shared-workspace (unsafe)",
        )
        self.run_id = run_id
        self.owner = holder


class LeaseLost(DurableAgentError):
    def __init__(self, run_id: str, why: str = "another process took it over") -> None:
        super().__init__(f"lost the lease on run {run_id}: {why}; this process wrote nothing more")
        self.run_id = run_id


class HistoryDiverged(DurableAgentError):
    pass


class StepMismatch(HistoryDiverged):
    """Resume found a recorded step in the place of the one it is about to run, under
    another idempotency key: the history that led here is not the one recorded."""

    def __init__(self, run_id: str, seq: int, expected_key: str, recorded_key: str) -> None:
        super().__init__(
            f"run {run_id}: step {seq} was recorded as {recorded_key!r} but resume would run "
            f"{expected_key!r}; the recorded history differs from what replay rebuilt, so "
            "nothing more was run (inspect it with `durable-agent show`)"
        )
        self.run_id = run_id
        self.seq = seq
        self.expected_key = expected_key
        self.recorded_key = recorded_key


class StoreError(DurableAgentError):
    """The database refused or failed a statement (translated from the driver's error)."""


class StoreUnavailable(StoreError):
    """The store could not be reached or written (connection lost, server restarting, disk
    full, I/O error) and retries did not help. Nothing past the last commit happened; the
    run is resumable once the store is back."""

    def __init__(self, detail: str, run_id: str | None = None) -> None:
        then = f"; the run is resumable: `durable-agent resume {run_id}`" if run_id else ""
        super().__init__(f"the store is unavailable: {detail}{then}")
        self.detail = detail
        self.run_id = run_id


class StoreFileGone(StoreUnavailable):
    """The SQLite file this process opened is no longer the file at its path: deleted, or
    replaced by another. Nothing more is written (it would go to a file no one can open, or
    mix two stores); what was written to the old file since it went is lost with it."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"the store file {path} was {what} while this process was using it")


class ModelError(DurableAgentError):
    """A model call that failed for good (permanent, or retries exhausted)."""

    def __init__(self, message: str, *, attempts: int = 1) -> None:
        super().__init__(message)
        self.attempts = attempts


class LoopExit(Exception):
    """Leaves the loop with a stop reason; not an error."""

    def __init__(self, reason: StopReason, detail: str = "", answer: str | None = None) -> None:
        super().__init__(detail or reason.value)
        self.reason = reason
        self.detail = detail
        self.answer = answer
