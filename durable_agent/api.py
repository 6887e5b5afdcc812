"""The Python API: the same durable runs as the CLI, from a program.

    from durable_agent import Agent

    agent = Agent(model="scripted:turns.json", workspace="project", db="sqlite:///runs.db")
    # (a relative script path is read from the workspace: project/turns.json)
    outcome = agent.start("fix the failing test")      # an Outcome: run_id, status, answer, ...
    agent.resume(outcome.run_id)                       # after a crash, a budget, an approval
    agent.continue_run(outcome.run_id, "now add a test")  # a follow-up: a new turn of the history

Everything goes through `wiring.build_runner` and `Runner.execute`, as `durable-agent start`
and `resume` do: the same checkpoints, leases, sandbox and effect classes; no second loop.
Settings are the CLI's (keyword arguments named like the config file's keys) and are
recorded with the run, so `durable-agent resume RUN_ID` can continue a run started here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from msgspec import Struct

from durable_agent.config.settings import BUDGET_FIELDS, Settings, load_settings, recorded_settings
from durable_agent.errors import UsageError
from durable_agent.loop.outcome import Outcome
from durable_agent.observer import Observer
from durable_agent.status import RESUMABLE, RunStatus
from durable_agent.store.records import ApprovalRecord, RunRecord, StepRecord
from durable_agent.store.runs import Store
from durable_agent.tool_sources import ToolInfo
from durable_agent.tools.base import Tool


class RunView(Struct, frozen=True):
    """One run as `durable-agent show` sees it."""

    run: RunRecord
    steps: list[StepRecord]
    approvals: list[ApprovalRecord]


class Agent:
    """Runs tasks durably. `tools` adds Python tools (objects with name, description,
    args_model, effect and run; see docs/tools.md) to the built-in, plugin and MCP ones.
    `env` replaces `os.environ` as the source of credentials and of what commands inherit."""

    def __init__(
        self,
        model: str | None = None,
        workspace: str | Path | None = None,
        db: str | None = None,
        tools: Sequence[Tool] = (),
        *,
        env: Mapping[str, str] | None = None,
        observer: Observer | None = None,
        **settings: Any,
    ) -> None:
        self._flags: dict[str, Any] = {"model": model, "db": db, **settings}
        if workspace is not None:
            self._flags["workspace"] = Path(workspace)
        self._env = dict(os.environ if env is None else env)
        self._tools = list(tools)
        self._observer = observer
        self._store: Store | None = None
        self.settings: Settings = load_settings(self._flags, self._env)  # fails now on bad settings

    @property
    def store(self) -> Store:
        if self._store is None:
            from durable_agent.store.runs import open_store

            self._store = open_store(self.settings)
        return self._store

    def start(self, task: str, *, run_id: str | None = None) -> Outcome:
        """Create a run and execute it until it stops; the Outcome says how it ended."""
        from durable_agent.store.leases import new_owner
        from durable_agent.wiring import build_runner

        if not isinstance(task, str) or not task.strip():
            raise UsageError("the task is empty: say what the agent should do")
        runner = build_runner(
            self.settings,
            env=self._env,
            store=self.store,
            observer=self._observer,
            extra_tools=self._tools,
        )
        runner.tool_source.prepare()  # an MCP server that cannot start fails before the run exists
        owner = new_owner()
        run_id = runner.create(task, run_id, lease_owner=owner)
        return runner.execute(run_id, lease=(owner, 1))

    def resume(self, run_id: str, *, accept_changes: bool = False, **budgets: Any) -> Outcome:
        """Continue a run that is not completed under its recorded settings; budget keywords
        (max_steps=80, ...) raise its budgets, as the CLI's flags do. `accept_changes`: go on
        although what it runs with changed in a way that needs consent (docs/versions.md)."""
        from durable_agent.store.leases import new_owner
        from durable_agent.wiring import build_runner

        unknown = set(budgets) - set(BUDGET_FIELDS)
        if unknown:
            raise UsageError(
                f"resume takes budgets only ({', '.join(BUDGET_FIELDS)}), not {', '.join(sorted(unknown))}"
            )
        store = self.store
        run_id = store.find_run_id(run_id)
        run = store.get_run(run_id)
        if run.status == RunStatus.COMPLETED or run.status not in RESUMABLE:
            raise UsageError(f"run {run_id} is {run.status}; nothing to resume")
        flags = {"db": self.settings.db, **budgets}
        settings = load_settings(flags, self._env, base=recorded_settings(run.settings))
        runner = build_runner(
            settings, env=self._env, store=store, observer=self._observer, extra_tools=self._tools
        )
        from durable_agent.loop.versions import VersionPolicy

        runner.versions = VersionPolicy(
            accept="all" if accept_changes else "none",
            by="python (Agent.resume(accept_changes=True))",
            given=frozenset(budgets),
        )
        owner = new_owner()
        epoch = store.acquire_lease(run_id, owner, settings.lease_seconds)
        store.update_settings(run_id, settings.redacted_dict())
        return runner.execute(run_id, lease=(owner, epoch))

    def continue_run(self, run_id: str, message: str, **budgets: Any) -> Outcome:
        """A follow-up to a run that has ended (completed, failed, budget_exceeded, cancelled)
        as a new turn of its history, executed like `resume` (as `durable-agent continue`).
        Budget keywords apply to the new turn; the run's totals keep counting. The same
        message again after a crash is not added twice. UsageError for a running or
        blocked run, with what to do."""
        from durable_agent.loop import turns
        from durable_agent.store.leases import new_owner
        from durable_agent.wiring import build_runner

        unknown = set(budgets) - set(BUDGET_FIELDS)
        if unknown:
            raise UsageError(
                f"continue_run takes budgets only ({', '.join(BUDGET_FIELDS)}), not {', '.join(sorted(unknown))}"
            )
        if not isinstance(message, str) or not message.strip():
            raise UsageError("the message is empty: say what the agent should do next")
        store = self.store
        run_id = store.find_run_id(run_id)
        run = store.get_run(run_id)
        why = turns.refusal(run, store, message)
        if why:
            raise UsageError(why)
        flags = {"db": self.settings.db, **budgets}
        settings = load_settings(flags, self._env, base=recorded_settings(run.settings))
        runner = build_runner(
            settings, env=self._env, store=store, observer=self._observer, extra_tools=self._tools
        )
        owner = new_owner()
        epoch, before = store.take_over(
            run_id, owner, settings.lease_seconds, statuses=turns.TAKEN_FROM
        )
        store.update_settings(run_id, settings.redacted_dict())
        return runner.execute(run_id, lease=(owner, epoch), turn=(message, before[0]))

    def runs(self, *, status: str | None = None, limit: int = 50) -> list[RunRecord]:
        """Runs, newest first (as `durable-agent list`). UsageError for an unknown status or
        a limit below 1, as the command says them."""
        if status is not None and status not in {s.value for s in RunStatus}:
            raise UsageError(
                f"unknown status {status!r}; one of: {', '.join(s.value for s in RunStatus)}"
            )
        if type(limit) is not int or limit < 1:
            raise UsageError(f"limit must be a whole number of at least 1, not {limit!r}")
        return self.store.list_runs(
            status=status, limit=min(limit, 1 << 31)
        )  # (SQL takes no bigger)

    def show(self, run_id: str) -> RunView:
        """One run with its steps and approvals (as `durable-agent show`)."""
        store = self.store
        run_id = store.find_run_id(run_id)
        return RunView(store.get_run(run_id), store.steps(run_id), store.approvals(run_id))

    def approve(self, run_id: str, *, deny: bool = False, by: str = "python") -> ApprovalRecord:
        """Answer the pending approval of a `blocked` run (then `resume` it); the answered
        record. UsageError when another answer (a link, the view, the CLI) came first."""
        store = self.store
        run_id = store.find_run_id(run_id)
        pending = store.pending_approval(run_id)
        if pending is None:
            raise UsageError(f"run {run_id} has no pending approval")
        if not store.decide_once(run_id, pending.id, approved=not deny, by=by):
            raise UsageError(store.answered_meanwhile(run_id, pending.id))
        return next(a for a in store.approvals(run_id) if a.id == pending.id)

    def tools(self) -> list[ToolInfo]:
        """Every tool a run started now would be offered (as `durable-agent tools`)."""
        from durable_agent.wiring import build_tool_set

        settings = self.settings.model_copy(
            update={"workspace": self.settings.workspace.expanduser().resolve()}
        )
        tool_set = build_tool_set(settings, self._env, self._tools)
        try:
            return tool_set.listing()
        finally:
            tool_set.close()
