"""A `delegate` call: a child run, made and run durably, its answer the call's observation.

    intent     the step's intent row and the child's run row (runs.parent_id, parent_step)
               in one commit; the child's id is derived from the parent's id and the step's
               key, so no crash and no resume ever makes a second child for one call
    effect     the child runs in this process under its own lease (a Runner of its own),
               until it stops; a resume of the parent finds the intent and resumes the child
    outcome    the child's final answer (or how it failed) is the call's one tool message;
               its tokens are counted in the parent's too (budgets roll up)

A child that is blocked (it needs a person's approval) blocks the parent, with the child's
request in the parent's error; a cancel of the parent stops the child. The step's row stays
`started` in both cases: a resume of the parent goes on with the same child.

The call is a tool call like any other to the policy: its `pre_tool` hooks run first (a
block is its error observation), then the `[[rules]]` decide it (deny: an error observation;
ask: the run stops `blocked` before the child is made, and the decided approval is used in
the intent's commit, as an ordinary call's is). A `copy` child's folder is removed once its
outcome is recorded (`drop_copy`; a resume removes one a crash left). docs/delegation.md
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from durable_agent.config.policy import Verdict
from durable_agent.config.settings import Settings, validation_text
from durable_agent.errors import LoopExit
from durable_agent.loop import approvals, hooks
from durable_agent.loop.observation import observed, refuse
from durable_agent.loop.step import StepCall, StepOutcome, StepSpec, open_step
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import ToolCall
from durable_agent.status import EffectClass, RunStatus, StepKind, StopReason
from durable_agent.store.records import ApprovalKind, RunRecord
from durable_agent.tools.base import Tool, ToolResult
from durable_agent.tools.delegate import NAME, DelegateArgs

# A child in these states is run (again) when its parent's step runs: it has not ended, or
# it stopped for a person (an approval, a cancel) and the parent is resumed.
GO_ON = {
    RunStatus.PENDING,
    RunStatus.RUNNING,
    RunStatus.WAITING,
    RunStatus.BLOCKED,
    RunStatus.CANCELLED,
}


class Children(Protocol):
    """How a run makes and runs its children (loop/runner.py: in this process)."""

    def depth(self, run_id: str) -> int: ...

    def children(self, run_id: str) -> list[RunRecord]: ...

    def creation(self, parent_id: str, child_id: str, task: str, settings: Settings) -> Any:
        """Callable(seq) -> the statements that create the child run (in the intent)."""

    def run(self, child_id: str, settings: Settings, tools: dict[str, Tool]) -> RunRecord:
        """Run the child until it stops (or find it ended); its record as it is then."""

    def pending_request(self, child_id: str) -> str | None: ...

    def cancelled(self, run_id: str) -> bool:
        """Is a cancel of the run requested (a child cancelled with it is not its answer)?"""

    def changes(self, child_id: str) -> str:
        """The child's changes to its files, as a unified diff ("" when none)."""

    def cancel_children(self, run_id: str) -> list[str]:
        """Cancel the run's children (and theirs) that have not ended, as `cancel` does."""


def child_id(parent_id: str, key: str) -> str:
    """The child's run id: the parent's, and a digest of the parent's id and the step key."""
    digest = hashlib.sha256(f"{parent_id}\0{key}".encode()).hexdigest()[:12]
    return f"{parent_id[:40]}-{digest}"


class _Delegation:
    """One delegate call between its intent and its outcome."""

    def __init__(
        self,
        call: ToolCall,
        step: StepCall,
        kid: str,
        task: str,
        settings: Settings,
        tools: dict[str, Tool],
        use: int | None,
    ) -> None:
        self.call, self.step, self.kid, self.task = call, step, kid, task
        self.settings, self.tools = settings, tools
        self.use = use  # a decided approval (an `ask` rule): used in the intent's commit


def copies_root(env: Any) -> Path:
    data = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "durable-agent" / "copies"


def copy_folder(env: Any, kid: str) -> Path:
    """Where a `copy` child works: beside the default store, out of every workspace."""
    return copies_root(env) / kid


def drop_copy(ctx: StepContext, kid: str, workspace: str) -> None:
    """Remove a `copy` child's folder, once the parent recorded its outcome: its changes are
    in that observation (a diff) and its snapshots in the store (`restore`/`fork` of the
    child rebuild its files). Only a folder directly under the copies folder, that is the
    child's recorded workspace: never another (a shared child's, a worker's
    `--workspace-root` folder, one reached through a link)."""
    folder = copy_folder(ctx.env, kid)
    if workspace != str(folder) or folder.is_symlink() or not folder.is_dir():
        return
    root = os.path.realpath(copies_root(ctx.env))
    if os.path.dirname(os.path.realpath(folder)) != root or os.path.realpath(folder) == root:
        return
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():  # (a file it may not remove): left, said, not the run's failure
        ctx.observer.note(f"the copy of child run {kid} could not be removed: {folder}")


def drop_copies(ctx: StepContext) -> None:
    """A session's start: the folders of `copy` children whose outcome is recorded that a
    crash left between that commit and their removal."""
    if not ctx.settings.delegate or ctx.children is None:
        return
    unfinished = {st.seq for st in ctx.journal.open_steps.values()}
    for child in ctx.children.children(ctx.state.run_id):
        if child.parent_step is not None and child.parent_step not in unfinished:
            drop_copy(ctx, child.id, child.workspace)


def delegate_call(ctx: StepContext, call: ToolCall, key: str) -> None:
    """One call: intent (with the child's row), the child run to its end, the outcome."""
    d = _prepare(ctx, call, key)
    if d is None:
        return
    children: Children = ctx.children

    def effect(_step: Any) -> StepOutcome:
        _not_cancelled(ctx)
        _let_go(ctx)
        return _outcome(ctx, d, children.run(d.kid, d.settings, d.tools))

    d.step.run(
        effect,
        input=d.step.input,
        use_approval=d.use,
        also=_made_with(ctx, d),
    )
    drop_copy(ctx, d.kid, str(d.settings.workspace))  # after the outcome's commit


def _not_cancelled(ctx: StepContext) -> None:
    """Right after the intents' commit, before any child runs: a cancel of this run seen
    there came before the children were made, and the walk of `cancel` over the children
    may have come before them too (it found none). They are cancelled here, unrun, and the
    run stops with them (a resume makes no other: the intents name them)."""
    if ctx.cancel.is_set() or ctx.journal.cancel_seen:
        ctx.children.cancel_children(ctx.state.run_id)
        raise LoopExit(StopReason.CANCELLED, "cancelled by request (with its child runs)")


def _let_go(ctx: StepContext) -> None:
    """Before the children run (their intents committed): give the parent's writing
    connection back to the pool. A parent waits for its children in this process, and each
    of them for its own: kept, a chain deeper than the pool (or more waiting parents than
    it has connections) held every connection while the deepest run waited for one."""
    ctx.journal.close()


def side_by_side(ctx: StepContext, calls: list[ToolCall]) -> bool:
    """Are these calls (all that an answer left to run) delegations to run at once: read-only
    ones, or on copies? Children that may write the shared folder run one at a time: two
    writers would race each other's files, and each would find the other's changes as drift
    on a resume."""
    if len(calls) < 2 or ctx.children is None or NAME not in ctx.tools:
        return False
    for call in calls:
        if call.name != NAME:
            return False
        try:
            if DelegateArgs.model_validate(call.parsed_arguments()).workspace == "shared-write":
                return False
        except ValueError:
            return False
    return True


def delegate_together(ctx: StepContext, calls: list[tuple[ToolCall, str]]) -> None:
    """Several read-only delegate calls of one answer: their intents in order, their children
    side by side (at most max_children at once, each a Runner with its own lease and
    database session, on a thread of its own), their outcomes in the calls' order. A crash
    anywhere leaves each call as `delegate_call` would: its intent, its child, its outcome."""
    from concurrent.futures import ThreadPoolExecutor

    children: Children = ctx.children
    started = []
    for call, key in calls:
        d = _prepare(ctx, call, key, share=len(calls))
        if d is not None:
            d.step.begin(input=d.step.input, use_approval=d.use, also=_made_with(ctx, d))
            started.append(d)
    if started:
        _not_cancelled(ctx)
    _let_go(ctx)
    with ThreadPoolExecutor(max_workers=ctx.settings.max_children) as pool:
        running = [pool.submit(children.run, d.kid, d.settings, d.tools) for d in started]
        ended = [f.result() for f in running]  # (a store fault in one: raised, all waited for)
    for d, child in zip(started, ended, strict=True):
        d.step.end(_outcome(ctx, d, child))
        drop_copy(ctx, d.kid, str(d.settings.workspace))


def _prepare(ctx: StepContext, call: ToolCall, key: str, *, share: int = 1) -> _Delegation | None:
    """Open the call's step and decide it: None when it was answered at once (bad arguments,
    a limit: an error observation recorded). `share`: the calls run side by side, among which
    the parent's remaining budget is divided."""
    s = ctx.state
    children: Children | None = ctx.children
    spec = StepSpec(
        StepKind.DELEGATE,
        key,
        s.turn,
        {"arguments": call.arguments_or_text()},
        call_id=call.id,
        tool_name=NAME,
        label=NAME,
        detail=_brief(call),
    )
    # As for any tool call: the pre_tool hooks before its step is opened (each a step of its
    # own, run once), a block its error observation.
    blocked = hooks.pre_tool(ctx, call)
    step = open_step(ctx, spec)
    if blocked is not None and step.prior is None:
        refuse(ctx, call, step, f"blocked by a pre_tool hook: {blocked}")
        return None
    kid = child_id(s.run_id, key)
    try:
        args = DelegateArgs.model_validate(call.parsed_arguments())
    except ValueError as exc:
        detail = validation_text(exc, "arguments") if isinstance(exc, ValidationError) else str(exc)
        refuse(ctx, call, step, f"invalid arguments for delegate: {detail}")
        return None
    if children is None:
        refuse(ctx, call, step, "delegation is not available in this session")
        return None
    made = tools_for(ctx.tools, args)
    if isinstance(made, str):
        refuse(ctx, call, step, made)
        return None
    settings = child_settings(ctx, args, kid, share).model_copy(
        update={"child_tools": sorted(made)}
    )
    use: int | None = None
    if step.prior is None:  # a new call: the limits and rules decide; a child made is gone on with
        problem = _over_limits(ctx, children)
        if problem is not None:
            refuse(ctx, call, step, problem)
            return None
        # The rules, as for any tool (by name, and by arguments: the task, the workspace
        # mode). No rule matched: it runs (the child's own calls face the rules in turn).
        decision = approvals.decide_call(ctx, call, exec_tool=False, asks=False)
        if decision.verdict is Verdict.DENY:
            refuse(ctx, call, step, f"not allowed by the policy: {decision.reason}")
            return None
        if decision.verdict is Verdict.ASK:
            # Blocked here, before the child is made; a decided approval is used in the
            # intent's commit (a crash before it finds the decision still unused).
            approval = approvals.decided(
                ctx, call, ApprovalKind.APPROVAL_REQUIRED, call.arguments, decision.reason
            )
            if approvals.denied(approval):
                refuse(
                    ctx,
                    call,
                    step,
                    "the user denied this delegate call; do not make it again",
                    use_approval=approval.id,
                )
                return None
            use = approval.id
        if settings.max_cost is not None and settings.max_cost <= 0:
            # The parent's budget is spent: it stops here (a raised budget resumes it).
            raise LoopExit(
                StopReason.MAX_TOKENS,
                f"cost budget: max_cost={ctx.settings.max_cost:g} is spent, no child is started",
            )
        if settings.max_tokens is not None and settings.max_tokens <= 0:
            # As for cost: a child made with no tokens could never run (max_tokens >= 1 is
            # every run's setting: a worker or `resume CHILD` would refuse its settings).
            raise LoopExit(
                StopReason.MAX_TOKENS,
                f"token budget: max_tokens={ctx.settings.max_tokens} is spent, no child is started",
            )
    step.step.input = {**spec.input, "child": kid}
    ctx.observer.note(f"delegating to run {kid}: {_short(args.task)}")
    return _Delegation(call, step, kid, args.task, settings, made, use)


def _made_with(ctx: StepContext, d: _Delegation) -> Any:
    """The child's row with the intent's, once: a recorded intent made it already."""
    if d.step.prior is not None:
        return None
    return ctx.children.creation(ctx.state.run_id, d.kid, d.task, d.settings)


def _outcome(ctx: StepContext, d: _Delegation, child: RunRecord) -> StepOutcome:
    """The child's end as the call's outcome, or the parent's stop (blocked, cancelled)."""
    children: Children = ctx.children
    s, kid = ctx.state, d.kid
    status = RunStatus(child.status)
    if status is RunStatus.BLOCKED:
        request = children.pending_request(kid) or child.error or "it needs a decision"
        raise LoopExit(
            StopReason.APPROVAL_REQUIRED,
            f"child run {kid} is blocked: {request}; decide it "
            f"(`durable-agent approve {kid}` or `deny`), then resume {s.run_id}",
        )
    if status is RunStatus.CANCELLED and (
        ctx.cancel.is_set() or ctx.journal.cancel_seen or children.cancelled(s.run_id)
    ):
        raise LoopExit(StopReason.CANCELLED, "cancelled by request (with its child runs)")
    if status in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING):  # let go of
        raise LoopExit(StopReason.CANCELLED, f"child run {kid} did not end")
    return _answered(ctx, d.call, child)


def tools_for(tools: Any, args: DelegateArgs) -> dict[str, Tool] | str:
    """The child's tools: the subset asked for, of this run's; read tools only unless the
    workspace is granted for writing (`shared-write`). A string: why not."""
    write = args.workspace != "shared"  # (a copy is the child's own to change)
    names = list(tools) if args.tools is None else args.tools
    unknown = [n for n in names if n not in tools]
    if unknown:
        return f"unknown tools for the child: {', '.join(unknown)}; available: {', '.join(sorted(tools))}"
    if not write and args.tools is not None:
        writers = [n for n in names if tools[n].effect is not EffectClass.READ]
        if writers:
            return (
                f"the child's workspace is shared read-only, so it may not use "
                f'{", ".join(writers)}; give workspace "shared-write" to let it change files'
            )
    return {n: tools[n] for n in names if write or tools[n].effect is EffectClass.READ}


def child_settings(ctx: StepContext, args: DelegateArgs, kid: str, share: int = 1) -> Settings:
    """The parent's settings, with the child's model and budgets. The child's cost and
    token budgets are at most what the parent has left: the parent's cap stops it too."""
    parent, s = ctx.settings, ctx.state
    w = s.window
    prompt, completion = (
        s.prompt_tokens - w.prompt_tokens,
        s.completion_tokens - w.completion_tokens,
    )
    update: dict[str, Any] = {}
    if args.model:
        update["model"] = args.model
    if args.max_steps:
        update["max_steps"] = args.max_steps
    if args.workspace == "copy":  # its own folder, made from the parent's files (runner.py)
        update["workspace"] = copy_folder(ctx.env, kid)
    costs = [args.max_cost] if args.max_cost is not None else []
    price = parent.prices.get(parent.model or "")
    if parent.max_cost is not None and price is not None:
        costs.append(max(parent.max_cost - price.cost(prompt, completion), 0.0) / share)
    if costs:
        update["max_cost"] = min(costs)
    if parent.max_tokens is not None:
        # What is left, shared out; at least 1 each while anything is left (0: spent, no
        # child is started), as a child's cost share is never 0 while any is left.
        left = max(parent.max_tokens - prompt - completion, 0)
        update["max_tokens"] = max(left // share, 1) if left else 0
    return parent.model_copy(update=update)


def _over_limits(ctx: StepContext, children: Children) -> str | None:
    s, settings = ctx.state, ctx.settings
    depth = children.depth(s.run_id)
    if depth + 1 > settings.max_depth:
        return (
            f"not delegated: this run is at depth {depth} and runs may delegate "
            f"{settings.max_depth} level(s) deep (max_depth); do this part yourself"
        )
    made = len(children.children(s.run_id))
    if made >= settings.max_children:
        return (
            f"not delegated: this run already made {made} child runs, the most it may "
            f"(max_children={settings.max_children}); do this part yourself"
        )
    return None


def _answered(ctx: StepContext, call: ToolCall, child: RunRecord) -> StepOutcome:
    """The child's end as the call's one tool message. The step completes whatever the
    child's status (a failed child is an error observation, not the parent's failure), so
    the tokens it paid count in the parent's."""
    diff = ctx.children.changes(child.id) if child.workspace != str(ctx.settings.workspace) else ""
    if diff:  # a `copy` child's changes, for the parent to apply (or not)
        diff = f"\n\nits changes to its copy of the files (a diff to apply):\n{diff}"
    if child.status == RunStatus.COMPLETED:
        result = ToolResult(output=(child.answer or "") + diff, data={"child": child.id})
    else:
        why = child.error or child.stop_reason or "no reason recorded"
        partial = (f"\nits last answer: {child.answer}" if child.answer else "") + diff
        result = ToolResult(
            output=partial.strip(),
            error=f"child run {child.id} ended {child.status}: {why}",
            data={"child": child.id},
        )
    tokens = (child.prompt_tokens, child.completion_tokens)
    s = ctx.state
    s.prompt_tokens += tokens[0]
    s.completion_tokens += tokens[1]
    seen = observed(ctx, call, result)
    # The step completes whatever the child's end: its error is the observation's, not the step's.
    output = {**seen.output, "status": child.status}
    return StepOutcome(output, None, messages=seen.messages, tokens=tokens)


def _brief(call: ToolCall) -> str:
    try:
        task = call.parsed_arguments().get("task")
    except ValueError:
        task = None
    return _short(task if isinstance(task, str) else call.arguments)


def _short(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= 80 else one[:77] + "..."
