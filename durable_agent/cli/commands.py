"""What each CLI command does. Parsing is in cli.py; printing helpers in render.py."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import sys
import tempfile
import threading
from argparse import Namespace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_agent import presentation
from durable_agent.cli import collector, jsonl_output, render, streams
from durable_agent.cli.ws_commands import RUN_ID_RE, cmd_diff, cmd_fork, cmd_restore
from durable_agent.errors import ConfigError, StoreUnavailable, UsageError
from durable_agent.loop.interrupts import Interrupts
from durable_agent.status import EXIT_CODES, RESUMABLE, RunStatus
from durable_agent.store.records import ApprovalKind

__all__ = ["cmd_diff", "cmd_fork", "cmd_restore"]  # the workspace commands live in ws_commands.py

if TYPE_CHECKING:
    from durable_agent.config.settings import Settings

# The settings machinery (pydantic) is imported by the commands that run a loop, not by the
# ones that only read or answer the store (`list`, `show`, ...: store_settings.store_options).


def _flags(args: Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: getattr(args, n, None) for n in names}


def full_path(workspace: str | None) -> str | None:
    """`-w DIR` of a resume or continue, as `start` records it: a relative path recorded with
    the run was read from wherever the next command ran (a new folder, rebuilt there)."""
    if workspace is None or workspace == "":  # (an empty one is refused by the settings)
        return workspace
    return str(Path(workspace).expanduser().resolve())


def _mcp_flags(args: Namespace) -> dict[str, Any]:
    """`--mcp NAME=COMMAND ...` as the setting `mcp_servers` (added to the config's servers)."""
    from durable_agent.config.mcp_servers import parse_cli_server

    specs = getattr(args, "mcp", None) or []
    return {"mcp_servers": dict(parse_cli_server(spec) for spec in specs)} if specs else {}


def _store_settings(args: Namespace, env: dict[str, str]) -> Any:
    """The store's settings alone (store_settings.StoreOptions: no pydantic, no wiring)."""
    from durable_agent.config.store import store_options

    return store_options(_flags(args, ("db",)), env)


def _open(args: Namespace, env: dict[str, str]) -> Any:
    from durable_agent.config.store import open_store

    return open_store(getattr(args, "db", None), env)


def _interrupts(cancel: threading.Event, quiet: bool) -> Interrupts:
    """First Ctrl-C (or SIGTERM): stop at the next step boundary (a running command is
    killed), status `cancelled`, resumable. Second one: stop now."""

    def first(_sig: int) -> None:
        cancel.set()
        if not quiet:
            print(
                "\ncancelling at the next step boundary (Ctrl-C again to stop now)",
                file=streams.forgiving(sys.stderr),
            )

    def second(_sig: int) -> None:
        raise KeyboardInterrupt

    return Interrupts(first, second)


def _ended_unread(outcome: Any, lost: Exception, as_json: bool, out: Any, err: Any) -> int:
    """The run's end is committed, and the store went away before it was read back for the
    summary: the end is the outcome's, and so is the exit code. An exit 7 here would tell a
    person (or a script) to run the same `continue` again: a second turn of the same message."""
    print(
        streams.visible(
            f"durable-agent: run {outcome.run_id} ended {outcome.status}"
            f"{f' ({outcome.stop_reason})' if outcome.stop_reason else ''}; its record could "
            f"not be read back ({lost}): `durable-agent show {outcome.run_id}` once the store "
            "is back"
        ),
        file=err,
    )
    if as_json:  # result_json's keys, the counters unknown (as json_if_cut_short has them)
        counters = ("steps", "model_calls", "tool_calls", "prompt_tokens", "completion_tokens")
        result = {
            "run_id": outcome.run_id,
            "status": str(outcome.status),
            "stop_reason": outcome.stop_reason,
            "answer": outcome.answer,
            **dict.fromkeys((*counters, "duration_ms")),
            "error": outcome.error,
        }
        print(json.dumps(result), file=out, flush=True)
    elif outcome.answer:
        answer = outcome.answer
        print(streams.visible(answer) if render.is_tty(sys.stdout) else answer, file=out)
    return EXIT_CODES[RunStatus(outcome.status)]


def _execute(
    runner: Any,
    run_id: str,
    args: Namespace,
    cancel: threading.Event,
    lease: tuple[str, int] | None = None,
    turn: tuple[str, str] | None = None,
    takeover: bool = False,
) -> int:
    collector.from_here()
    jsonl_output.attach(runner.observer, runner.store, run_id)
    try:
        with (
            _interrupts(cancel, args.quiet or args.json),
            render.json_if_cut_short(args.json, run_id),
        ):
            outcome = runner.execute(run_id, lease=lease, turn=turn, takeover=takeover)
            try:
                run = runner.store.get_run(run_id)
            except StoreUnavailable as exc:
                run = None
                lost = exc
    finally:
        close = getattr(runner.observer, "close", None)  # render.Timeline: erase its status line
        if close is not None:
            close()
    out, err = (
        streams.forgiving(sys.stdout),
        streams.forgiving(sys.stderr),
    )  # the exit code is the run's
    if run is None:
        return _ended_unread(outcome, lost, args.json, out, err)
    if runner.settings.notify:  # the end's notifications, committed with it: sent now
        from durable_agent.notify import deliver_after_session

        for problem in deliver_after_session(runner.store.engine, runner.settings):
            print(
                streams.visible(
                    f"durable-agent: notification not delivered yet ({problem}); "
                    "a worker or `durable-agent notify deliver` sends it later"
                ),
                file=err,
            )
    if args.json:
        print(json.dumps(render.result_json(run)), file=out, flush=True)
    elif jsonl_output.finish(runner.observer):
        if not args.quiet:  # the events hold the answer: stdout keeps only them
            render.summary(run, err)
    else:
        if not args.quiet:
            rows = _step_rows(runner.store, run_id)
            render.summary(
                run,
                err,
                steps=None if rows is None else len(rows),
                estimated=rows is not None and render.estimated(rows),
            )
        if outcome.answer:  # as it is to a pipe or a file (data); escaped for a person's terminal
            print(
                streams.visible(outcome.answer) if render.is_tty(sys.stdout) else outcome.answer,
                file=out,
                flush=True,
            )
        elif outcome.error and args.quiet:  # the summary above says it otherwise
            print(streams.visible(f"{run.status} ({run.stop_reason}): {outcome.error}"), file=err)
    if streams.is_broken(out):
        print(
            f"durable-agent: cannot write the output; the run is recorded: durable-agent show {run_id}",
            file=err,
        )
        streams.silence_stdout()
    return EXIT_CODES[RunStatus(run.status)]


def _step_rows(store: Any, run_id: str) -> list[Any] | None:
    """The steps the summary counts; None (not shown) when the store cannot say: the run
    is over and recorded, a failed read must not change its exit code."""
    from durable_agent.errors import StoreError

    try:
        return list(store.steps(run_id))
    except StoreError:
        return None


def cmd_start(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.config.settings import BUDGET_FIELDS, load_settings
    from durable_agent.wiring import build_runner

    if args.run_id is not None and not RUN_ID_RE.match(args.run_id):
        raise UsageError(
            "--run-id takes 1 to 64 letters, digits, '.', '_' or '-', a letter or digit first"
        )
    if args.task == "-":  # `start -`: the task from stdin (a file, a heredoc, a pipe)
        args.task = _stdin_text()
    if not args.task.strip():
        raise UsageError("the task is empty: say what the agent should do")
    names = (
        "workspace",
        "model",
        "base_url",
        "api_type",
        "tool_protocol",
        "db",
        *BUDGET_FIELDS,
        "shell",
        "verify",
        "durability",
        "sandbox",
        "network",
        "memory",
        "delegate",
    )
    rules = {"rules_files": args.rules} if getattr(args, "rules", None) else {}
    settings = load_settings({**_flags(args, names), **_mcp_flags(args), **rules}, env)
    _task_folder(settings)
    _check_sandbox(settings, env)
    from durable_agent.workspace.lease import workspace_lease

    with contextlib.ExitStack() as held:
        if not args.detach:  # one live run per workspace, before anything of it starts
            name_holder = held.enter_context(
                workspace_lease(
                    settings.workspace,
                    args.run_id,
                    env,
                    shared=getattr(args, "allow_shared_workspace", False),
                )
            )
        cancel = threading.Event()
        observer = jsonl_output.observer_for(args)
        runner = build_runner(settings, env=env, observer=observer, cancel=cancel)
        runner.tool_source.prepare()  # MCP servers start now: one that cannot fails before the run exists
        if args.detach:
            runner.tool_source.close()
            run_id = runner.create(args.task, args.run_id, queue=_queue_fields(args))
            render.clear_status(observer)  # (what the first snapshot showed)
            _print_queued(run_id, args.json)
            return 0
        # Created already leased to us: a worker sharing the database cannot claim it first.
        from durable_agent.store.leases import new_owner

        owner = new_owner()
        run_id = runner.create(args.task, args.run_id, lease_owner=owner, queue=_queue_fields(args))
        name_holder(run_id)
        render.clear_status(observer)  # (what the first snapshot showed)
        if not args.json:
            err = streams.forgiving(sys.stderr)
            print(f"run {run_id} · {runner.model.name} · {runner.settings.workspace}", file=err)
            print(f"  resume with: durable-agent resume {run_id}", file=err)
        return _execute(runner, run_id, args, cancel, lease=(owner, 1))


def _stdin_text() -> str:
    try:
        raw = sys.stdin.buffer.read()
    except (OSError, ValueError, AttributeError):
        raise UsageError("`start -` reads the task from stdin, which cannot be read") from None
    return raw.decode("utf-8", "surrogateescape")


def _task_folder(settings: Settings) -> None:
    """The task's folder for project memory (docs/memory.md): the current directory when it
    is inside the workspace, else the workspace root; recorded as `memory_dir`."""
    if not settings.memory or settings.memory_dir is not None:
        return
    try:
        here = Path.cwd().resolve()
        root = settings.workspace.expanduser().resolve()
    except OSError:
        return
    if here != root and here.is_relative_to(root):
        settings.memory_dir = here.relative_to(root).as_posix()


def _queue_fields(args: Namespace) -> dict[str, Any]:
    """`start --priority N --queue-key KEY` (docs/fleets.md)."""
    return {
        "priority": getattr(args, "priority", None),
        "queue_key": getattr(args, "queue_key", None),
    }


def _print_queued(run_id: str, as_json: bool) -> None:
    """A detached start or resume: the run id, or with --json one object like every --json."""
    print(
        json.dumps({"run_id": run_id, "status": RunStatus.PENDING.value}) if as_json else run_id,
        file=streams.forgiving(sys.stdout),
        flush=True,
    )  # (queued is queued, read or not)


def cmd_resume(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.cli.last_run import run_id_of
    from durable_agent.config.settings import BUDGET_FIELDS, load_settings, recorded_settings

    store = _open(args, env)
    run_id = run_id_of(store, args)
    run = store.get_run(run_id)
    if run.status == RunStatus.COMPLETED:
        raise UsageError(
            f"run {run_id} is completed; nothing to resume (send a follow-up with: "
            f'durable-agent continue {run_id} "MESSAGE")'
        )
    if run.status not in RESUMABLE:
        raise UsageError(f"run {run_id} is {run.status}; it cannot be resumed")
    recorded = recorded_settings(run.settings)
    flags = _flags(
        args,
        (
            "db",
            "model",
            "base_url",
            "api_type",
            "tool_protocol",
            "shell",
            *BUDGET_FIELDS,
            "sandbox",
            "network",
            "workspace",
        ),
    )
    flags["workspace"] = full_path(flags["workspace"])
    if getattr(args, "pin", False):  # docs/versions.md
        from durable_agent.cli.versions_command import pinned_flags

        pinned_flags(store, run_id, flags)
    settings = load_settings(flags, env, base=recorded)
    mechanism = _check_sandbox(settings, env)
    changes = [
        f"{k}: {recorded.get(k)!r} → {v!r}"
        for k, v in settings.redacted_dict().items()
        if k in recorded and k != "db" and recorded.get(k) != v
    ]
    was = (run.settings or {}).get("sandbox_mechanism")
    if was is not None and was != mechanism:  # resumed on a host that contains commands otherwise
        changes.append(f"sandbox_mechanism: {was!r} → {mechanism!r}")
    if args.detach:  # a worker continues it, under the settings recorded now
        if getattr(args, "accept_changes", False):  # the consent goes with it (versions.md)
            from durable_agent.cli.versions_command import consent_for_queue

            consent_for_queue(store, run_id)
        store.requeue(
            run_id, settings=settings.redacted_dict() if changes else None, if_status=run.status
        )
        _print_queued(run_id, args.json)
        return 0
    _missing_workspace(store, run_id, settings)
    from durable_agent.workspace.lease import workspace_lease

    with contextlib.ExitStack() as held:
        with render.json_if_cut_short(args.json, run_id):  # exit 6 with --json: one object
            held.enter_context(
                workspace_lease(
                    settings.workspace,
                    run_id,
                    env,
                    shared=getattr(args, "allow_shared_workspace", False),
                )
            )
        return _resume_leased(store, run_id, run, settings, env, changes, args)


def _resume_leased(
    store: Any,
    run_id: str,
    run: Any,
    settings: Settings,
    env: dict[str, str],
    changes: list[str],
    args: Namespace,
) -> int:
    from durable_agent.wiring import build_runner

    cancel = threading.Event()
    observer = jsonl_output.observer_for(args)
    runner = build_runner(settings, env=env, store=store, observer=observer, cancel=cancel)
    from durable_agent.cli.versions_command import resume_policy
    from durable_agent.config.settings import recorded_settings

    runner.versions = resume_policy(args, recorded_settings(run.settings), settings)
    # Take the lease first: a run another live process executes keeps its settings (exit 6).
    from durable_agent.store.leases import new_owner

    owner = new_owner()
    with render.json_if_cut_short(args.json, run_id):
        epoch, stood = store.take_over(run_id, owner, settings.lease_seconds)
    err = streams.forgiving(sys.stderr)  # from here on, the run is ours: output may not stop it
    if changes:
        store.update_settings(run_id, settings.redacted_dict())
        if not args.json:
            print("resuming under different settings: " + "; ".join(changes), file=err)
    if not args.json:
        where = f"model call {run.step_count}" if run.step_count else "the start"
        print(f"run {run_id} · resuming from {where} ({run.status})", file=err)
    # (stood: how the run was when the lease was taken; `running`: its process had died)
    takeover = stood[0] == RunStatus.RUNNING
    return _execute(runner, run_id, args, cancel, lease=(owner, epoch), takeover=takeover)


def _missing_workspace(store: Any, run_id: str, settings: Settings) -> None:
    """A workspace that is not there (another host, a deleted folder) is made, empty, when
    the run has a snapshot to rebuild it from (the runner does that under the lease)."""
    from durable_agent.store.blobs import tree_at

    if (
        not settings.workspace.exists()
        and settings.snapshots
        and tree_at(store.engine, run_id) is not None
    ):
        settings.workspace.mkdir(parents=True)


def _check_sandbox(settings: Settings, env: dict[str, str]) -> str:
    """Before anything runs: a sandboxed mode that cannot be had refuses the run when it could
    run commands (one line, exit 2); the Landlock fallback says what it does not enforce.
    Returns the mechanism, which is recorded with the run. (Warnings go to stderr even with
    --json: stdout keeps only the result object.)"""
    from durable_agent.tools.os_sandbox import Mechanism, resolve_sandbox

    sandbox = resolve_sandbox(settings.sandbox, settings.network, env)
    settings.set_sandbox_mechanism(sandbox.mechanism.value)
    runs_commands = (
        settings.shell != "deny"
        or bool(settings.verify)
        or any(s.command for s in settings.mcp_servers.values())
    )  # servers are processes
    if sandbox.mechanism is Mechanism.NONE and runs_commands:
        raise ConfigError(sandbox.refusal())
    warning = sandbox.warning()
    if warning and runs_commands:
        print(f"durable-agent: warning: {warning}", file=sys.stderr)
    return sandbox.mechanism.value


def cmd_tools(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.config.settings import load_settings
    from durable_agent.wiring import build_tool_set

    settings = load_settings(
        {**_flags(args, ("workspace", "shell", "db")), **_mcp_flags(args)}, env
    )
    tool_set = build_tool_set(
        settings.model_copy(update={"workspace": settings.workspace.expanduser().resolve()}), env
    )
    try:
        infos = tool_set.listing()
    finally:
        tool_set.close()
    if args.json:
        print(json.dumps([info.as_dict() for info in infos], indent=2))
        return 0
    width = max((len(i.name) for i in infos), default=4)
    src = max((len(i.source) for i in infos), default=6)
    print(f"{'NAME':<{width}}  {'SOURCE':<{src}}  {'EFFECT':<6}  DESCRIPTION")
    for i in infos:
        print(
            streams.visible(f"{i.name:<{width}}  {i.source:<{src}}  {i.effect:<6}  {i.description}")
        )  # an MCP server's words
    return 0


def cmd_doctor(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.cli.doctor import run_doctor
    from durable_agent.config.settings import load_settings

    settings = load_settings(_flags(args, ("sandbox", "network")), env)
    return run_doctor(mode=settings.sandbox, network=settings.network, env=env, out=sys.stdout)


def cmd_cancel(args: Namespace, env: dict[str, str]) -> int:
    store = _open(args, env)
    run_id = store.find_run_id(args.run_id)
    status = store.cancel(run_id)
    from durable_agent.cli.run_tree import cancel_children

    if children := cancel_children(store, run_id):  # docs/delegation.md
        print(f"cancelled with it: {', '.join(children)}", file=streams.forgiving(sys.stdout))
    if status == "requested":
        print(
            f"cancellation requested: run {run_id} stops at its next step boundary",
            file=streams.forgiving(sys.stdout),
            flush=True,
        )
    else:
        print(
            f"run {run_id} cancelled; `durable-agent resume {run_id}` continues it",
            file=streams.forgiving(sys.stdout),
            flush=True,
        )
    return 0


def cmd_approve(args: Namespace, env: dict[str, str]) -> int:
    store = _open(args, env)
    run_id = store.find_run_id(args.run_id)
    pending = store.pending_approval(run_id)
    resume_id = run_id
    if pending is None:  # a parent blocked by its child: the child's question is answered
        from durable_agent.cli.run_tree import blocked_child

        if (child := blocked_child(store, run_id)) is not None:
            run_id, pending = child, store.pending_approval(child)
    if pending is None:
        # A second `approve` before the resume: say what was decided instead of a bare "no".
        unused = [
            a for a in store.approvals(run_id) if a.decision is not None and a.used_at is None
        ]
        if unused:
            last = unused[-1]
            what = presentation.approval_subject(last.tool_name, last.command)
            raise UsageError(
                f"run {run_id}: {what} (call {last.call_id}) is already {last.decision}; "
                f"continue with: durable-agent resume {run_id}"
            )
        raise UsageError(f"run {run_id} has no pending approval")
    who = args.by or _user()
    if args.restore and (
        args.deny
        or pending.kind != ApprovalKind.UNCERTAIN_SIDE_EFFECT
        or pending.tool_name == "workspace"
    ):
        raise UsageError(
            "--restore answers a command cut off by a crash (uncertain_side_effect): it puts the "
            "workspace back as before the command, then runs it again; it cannot be combined with --deny"
        )
    if not store.decide_once(
        run_id, pending.id, approved=not args.deny, by=who, restore=args.restore
    ):
        raise UsageError(store.answered_meanwhile(run_id, pending.id))
    what = presentation.approval_subject(pending.tool_name, pending.command)
    verb = "denied" if args.deny else "approved"
    print(streams.visible(f"{verb} {what} (call {pending.call_id}, {pending.kind}) by {who}"))
    print(f"continue with: durable-agent resume {resume_id}")
    return 0


def cmd_compact(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.cli.manual_compaction import compact_run
    from durable_agent.config.settings import load_settings, recorded_settings
    from durable_agent.wiring import build_runner

    store = _open(args, env)
    run_id = store.find_run_id(args.run_id)
    run = store.get_run(run_id)
    flags = _flags(
        args, ("db", "model", "base_url", "api_type", "tool_protocol", "max_context_tokens")
    )
    settings = load_settings(flags, env, base=recorded_settings(run.settings))
    done = compact_run(build_runner(settings, env=env, store=store), run_id)
    if not done.steps:
        print(f"run {run_id}: nothing to compact (~{done.before:,} tokens per request)")
    else:
        print(
            f"run {run_id}: context compacted in {done.steps} step(s): ~{done.before:,} → ~{done.after:,} "
            f"tokens per request"
        )
    if done.note:
        print(f"  {done.note}")
    print(f"continue with: durable-agent resume {run_id}")
    return 0


_LINE_BREAKS = {0x2028: "\\u2028", 0x2029: "\\u2029", 0x85: "\\u0085"}


def cmd_export(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.transcript import events

    store = _open(args, env)
    from durable_agent.cli.run_tree import descendants

    run_id = store.find_run_id(args.run_id)
    # The run's events, then each child run's under its own run id (docs/delegation.md).
    runs = [run_id, *(child.id for _depth, child in descendants(store, run_id))]
    for event in (e for rid in runs for e in events(store, rid)):
        # JSON lets U+2028, U+2029 and U+0085 stand raw in strings, but readers that split on
        # every line break (Python's str.splitlines) would cut an event there: escaped.
        sys.stdout.write(json.dumps(event, ensure_ascii=False).translate(_LINE_BREAKS) + "\n")
    return 0


def cmd_db(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.store.engine import current_revision, make_engine, upgrade

    settings = _store_settings(args, env)
    assert settings.db is not None
    if args.action == "path":
        print(settings.db)
        return 0
    engine = make_engine(settings.db, durability=settings.durability)
    if args.action == "upgrade":
        upgrade(engine)
    print(current_revision(engine) or "empty (run `durable-agent db upgrade`)")
    return 0


def cmd_demo(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.demo.story import clean_demo, run_demo

    if args.db == "":  # as for every other command: empty is a mistake, not "the default"
        raise ConfigError("the store URL is empty: give --db a URL or a file path, or leave it out")
    code = clean_demo(env) if args.clean else run_demo(db=args.db, env=env)
    if streams.is_broken(streams.forgiving(sys.stdout)):
        streams.silence_stdout()  # (what waits in its buffer cannot be written either)
    return code


def cmd_worker(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.config.settings import load_settings
    from durable_agent.worker import WorkerOptions, run_worker

    if args.concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    if not 0 < args.poll <= 86400:  # also NaN; a longer wait is past what a timer can wait for
        raise ConfigError("--poll must be a positive number of seconds, at most 86400")
    # Flags the config can also set are None unless given: the config file is never overridden.
    settings = load_settings(_flags(args, ("db", "lease_seconds", "max_running_runs")), env)
    assert settings.db is not None
    options = WorkerOptions(
        db=settings.db,
        concurrency=args.concurrency,
        lease_seconds=settings.lease_seconds,
        poll_s=args.poll,
        once=args.once,
        quiet=args.quiet,
        max_running=settings.max_running_runs,
        workspace_root=_workspace_root(args.workspace_root) if args.workspace_root else None,
        accept_changes=getattr(args, "accept_changes", "compatible"),
    )
    collector.from_here()  # a worker lives long: its collector runs (collector.py)
    from durable_agent.cli.render import Timeline

    return run_worker(settings, options, env, Timeline)


def _workspace_root(given: str) -> Path:
    """--workspace-root: made if missing, and a folder this worker can write run folders in,
    checked before a run is claimed (a file or /proc there failed every run it took)."""
    root = Path(given).resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--workspace-root {given}: cannot make it a folder ({exc.strerror or exc})"
        ) from None
    try:  # tried, not asked (os.access): root may write anywhere, yet not make a folder in /proc
        os.rmdir(tempfile.mkdtemp(prefix=".durable-agent-probe-", dir=root))
    except OSError as exc:
        raise ConfigError(
            f"--workspace-root {given}: this worker cannot make run folders in it "
            f"({exc.strerror or exc})"
        ) from None
    return root


def cmd_ui(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.ui.serve import TOKEN_ENV, ServeOptions, serve

    settings = _store_settings(args, env)
    token = args.token if args.token is not None else (env.get(TOKEN_ENV) or None)
    collector.from_here()  # a server lives long: its collector runs (collector.py)
    return serve(
        settings,
        ServeOptions(
            host=args.host,
            port=args.port,
            token=token,
            open_browser=args.open_browser,
            public_url=args.public_url,
        ),
    )


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
