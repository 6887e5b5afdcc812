"""`durable-agent continue RUN_ID MESSAGE`: a follow-up to a run that has ended, as a new turn
of the same history (loop/turns.py), executed like `resume`: same output, `--json` and exit
codes. `--fork` continues a copy (the original is only read), `--detach` queues it for
workers. `--last` (here, and for `resume` and `show`) is the newest run of this folder.

    continue RUN_ID "MESSAGE"        MESSAGE `-`: read from stdin
    continue --last "MESSAGE"
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from argparse import Namespace
from pathlib import Path
from typing import Any

from durable_agent.cli import jsonl_output, render, streams
from durable_agent.cli.last_run import run_id_of
from durable_agent.errors import UsageError
from durable_agent.loop.turns import TAKEN_FROM, refusal
from durable_agent.status import RunStatus


def _message(args: Namespace) -> str:
    """MESSAGE, or stdin for `-`."""
    if args.last and args.message is None:  # `continue --last MESSAGE`: one positional
        args.message, args.run_id = args.run_id, None
    if args.message is None:
        raise UsageError(
            'give the message: durable-agent continue RUN_ID "MESSAGE" (or - to read it from stdin)'
        )
    text: str = args.message
    if text == "-":
        try:
            text = sys.stdin.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the message from stdin: {exc}") from None
        except (ValueError, AttributeError):  # closed (`<&-`: sys.stdin is None)
            raise UsageError(
                "`continue RUN_ID -` reads the message from stdin, which cannot be read"
            ) from None
        text = text.removesuffix("\n")
    if not text.strip():
        raise UsageError("the message is empty: say what the agent should do next")
    return text


def cmd_continue(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.cli.commands import (
        _check_sandbox,
        _execute,
        _flags,
        _missing_workspace,
        _open,
        _print_queued,
        full_path,
    )
    from durable_agent.config.settings import BUDGET_FIELDS, load_settings, recorded_settings

    message = _message(args)
    store = _open(args, env)
    run_id = run_id_of(store, args)
    run = store.get_run(run_id)
    stood: str | None = None
    recorded = recorded_settings(run.settings)
    names = ("db", "model", "base_url", "api_type", "tool_protocol", "shell", *BUDGET_FIELDS)
    flags = _flags(args, (*names, "sandbox", "network"))
    fork: tuple[str, Path] | None = None
    if args.fork:
        fork = _fork_target(run, args)
        recorded["workspace"] = str(fork[1])  # (as the fork records it)
    else:
        why = refusal(run, store, message)
        if why:
            raise UsageError(why)
        if args.workspace is not None:
            flags["workspace"] = full_path(args.workspace)
    settings = load_settings(flags, env, base=recorded)
    _check_sandbox(settings, env)  # before a fork is made: a refusal leaves nothing behind
    changes = [
        f"{k}: {recorded.get(k)!r} → {v!r}"
        for k, v in settings.redacted_dict().items()
        if k in recorded and k != "db" and recorded.get(k) != v
    ]
    if fork is not None:
        run_id, stood = _fork(store, run, *fork, args, env), "forked"  # always a new turn
        run = store.get_run(run_id)
    _missing_workspace(store, run_id, settings)
    from durable_agent.store.leases import new_owner
    from durable_agent.wiring import build_runner
    from durable_agent.workspace.lease import workspace_lease

    err = streams.forgiving(sys.stderr)
    statuses = frozenset({RunStatus.PENDING}) if args.fork else TAKEN_FROM
    with contextlib.ExitStack() as held:
        if not args.detach:
            with render.json_if_cut_short(args.json, run_id):  # exit 6 with --json: one object
                held.enter_context(
                    workspace_lease(
                        settings.workspace,
                        run_id,
                        env,
                        shared=getattr(args, "allow_shared_workspace", False),
                    )
                )
        cancel = threading.Event()
        quiet = args.quiet or args.json or args.detach
        observer = None if args.detach else jsonl_output.observer_for(args)
        runner = build_runner(settings, env=env, store=store, observer=observer, cancel=cancel)
        owner = new_owner()
        with render.json_if_cut_short(args.json, run_id):
            epoch, before = store.take_over(
                run_id, owner, settings.lease_seconds, statuses=statuses
            )
        stood = stood or before[0]
        if changes:
            store.update_settings(run_id, settings.redacted_dict())
            if not quiet:
                print("continuing under different settings: " + "; ".join(changes), file=err)
        if args.detach:  # recorded here, driven by a worker
            runner.queue_turn(run_id, (owner, epoch), message, stood)
            _print_queued(run_id, args.json)
            return 0
        if not args.json:
            print(
                f"run {run_id} · continuing after model call {run.step_count} ({stood})", file=err
            )
            print(f"  if it is interrupted: durable-agent resume {run_id}", file=err)
        return _execute(runner, run_id, args, cancel, lease=(owner, epoch), turn=(message, stood))


def _fork_target(run: Any, args: Namespace) -> tuple[str, Path]:
    """The copy's id and folder (`--run-id`, `--workspace`; by default a new id and a folder
    beside the run's, named after the copy)."""
    from durable_agent.cli.ws_commands import RUN_ID_RE
    from durable_agent.loop.runner import new_run_id

    new_id = args.new_run_id
    if new_id is not None and not RUN_ID_RE.match(new_id):
        raise UsageError(
            f"invalid --run-id {new_id!r}: use letters, digits, '.', '_' or '-' (at most 64, "
            "a letter or digit first)"
        )
    new_id = new_id or new_run_id()
    if args.workspace is not None:
        return new_id, Path(os.path.abspath(args.workspace))
    original = Path(run.workspace)
    if not original.name:
        raise UsageError("--fork of a run in / needs --workspace DIR for the copy")
    return new_id, original.with_name(f"{original.name}-{new_id}")


def _fork(
    store: Any, run: Any, new_id: str, target: Path, args: Namespace, env: dict[str, str]
) -> str:
    """A copy of `run` as at its last step, files included, in `target`; the original is
    only read. Returns the new run's id."""
    from durable_agent.cli.ws_commands import fork_into

    at = max((s.seq for s in store.steps(run.id)), default=-1)
    fork_into(store, run, at, new_id, target, task=None, env=env)
    if not args.json:
        where = f"after step {at}" if at >= 0 else "before its first step"
        print(
            f"forked {run.id} {where} into {target} as run {new_id} (the original is untouched)",
            file=streams.forgiving(sys.stderr),
        )
    return new_id
