"""The workspace commands: `diff`, `restore`, `fork` (SEQ is the step number `show` prints,
which is `steps.seq` as stored: one number everywhere, docs/schema.md).

diff RUN_ID [--step SEQ] [--stat] [--json]      what the run (or one step) changed
restore RUN_ID --at SEQ --to DIR [--force]      the files as they were after step SEQ
fork RUN_ID --at SEQ --workspace DIR [...]      a new run from step SEQ, files included
"""

from __future__ import annotations

import json
import os
import re
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

from durable_agent.errors import DurableAgentError, UsageError
from durable_agent.status import RUN_ID
from durable_agent.visible import visible

RUN_ID_RE = re.compile(rf"^{RUN_ID.pattern}$")  # as `start --run-id` takes it
TREE_ID_RE = re.compile(r"^[0-9a-f]{64}$")  # sha256 of a snapshot's manifest


def _given_dir(path: str, flag: str) -> str:
    """An empty DIR (`--to "$UNSET"`) is not the current directory."""
    if not path:
        raise UsageError(f"{flag} is empty: give it a directory")
    return path


def _open(args: Namespace, env: dict[str, str]) -> Any:
    from durable_agent.config.store import open_store

    return open_store(getattr(args, "db", None), env)


def _seq(run_id: str, seq: int, steps: list[Any]) -> int:
    """`seq` itself, once the run is known to have a step with that number."""
    if not any(s.seq == seq for s in steps):
        if not steps:
            raise UsageError(f"run {run_id} has no steps yet")
        first, last = min(s.seq for s in steps), max(s.seq for s in steps)
        raise UsageError(
            f"run {run_id} has no step {seq} (its steps are {first} to {last}; "
            f"see `durable-agent show {run_id}`)"
        )
    return seq


def _tree_after(store: Any, run_id: str, seq: int) -> str:
    from durable_agent.store.blobs import tree_at

    found = tree_at(store.engine, run_id, seq)
    if found is None:
        raise UsageError(
            f"run {run_id} has no workspace snapshot (no step of it could change files, "
            "or it was recorded with snapshots off)"
        )
    return found.tree


def _scanner(root: Path, settings: dict[str, Any] | None, env: dict[str, str]) -> Any:
    from durable_agent.config.settings import Settings
    from durable_agent.workspace.scan import scanner_for
    from durable_agent.workspace.secrets import for_command

    fields = Settings.model_fields
    s = settings or {}
    exclude = s.get("exclude")
    if not isinstance(exclude, list):  # (an empty list is the run's: it excluded nothing)
        exclude = fields["exclude"].get_default(call_default_factory=True)
    cap = s.get("snapshot_max_file_bytes") or fields["snapshot_max_file_bytes"].default
    return scanner_for(root, list(exclude), int(cap), for_command(env, s))


def _held_line(held: list[bytes], written: bool) -> str | None:
    """What restore and fork say of the paths that held a secret (never stored)."""
    from durable_agent.encoding import show_name
    from durable_agent.workspace.secrets import HELD

    if not held:
        return None
    names = [show_name(os.fsdecode(p)) for p in held]
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    where = "left as they are on disk" if written else "not written to the new workspace"
    return visible(f"{HELD}, so {where}: {shown}")


def cmd_diff(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.store.blobs import first_tree
    from durable_agent.workspace import diffing

    store = _open(args, env)
    run_id = store.find_run_id(args.run_id)
    if args.step is not None:
        seq = _seq(run_id, args.step, store.steps(run_id))
        before, after = diffing.step_range(store.engine, run_id, seq) or (None, None)
    else:
        last = max((s.seq for s in store.steps(run_id)), default=-1)
        before = first_tree(store.engine, run_id)
        after = _tree_after(store, run_id, last) if before is not None else None
    old, new, found, blobs = diffing.between(store.engine, before, after)
    if args.json:
        print(
            json.dumps(
                {
                    "run_id": run_id,
                    "step": args.step,
                    "from_tree": before,
                    "to_tree": after,
                    "changes": [
                        {"path": c.shown, "change": c.change, "bytes": c.bytes}
                        | ({"secret": True} if c.secret else {})
                        for c in found
                    ],
                },
                ensure_ascii=False,
            )
        )
    elif args.stat:
        sys.stdout.writelines(
            visible(line) for line in diffing.stat_lines(found)
        )  # names a command chose
    else:
        lines = diffing.patch(old, new, found, blobs.blob)
        if sys.stdout.isatty():  # for a person: what a file holds cannot drive the terminal
            sys.stdout.writelines(visible(b.decode("utf-8", "replace")) for b in lines)
        else:  # for `git apply`: byte for byte
            sys.stdout.flush()
            sys.stdout.buffer.writelines(lines)
            sys.stdout.buffer.flush()
    return 0


def cmd_restore(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.cli import render
    from durable_agent.encoding import show_name
    from durable_agent.store.blobs import BlobStore, save_statements
    from durable_agent.workspace import progress, snapshot
    from durable_agent.workspace.materialize import RestoreStopped, materialize
    from durable_agent.workspace.validation import check_manifest

    store = _open(args, env)
    run_id = store.find_run_id(args.run_id)
    run = store.get_run(run_id)
    blobs = BlobStore(store.engine)
    if args.tree is not None:
        if not TREE_ID_RE.match(args.tree):  # not bytes the store could hold (a traceback before)
            raise UsageError(
                f"no workspace snapshot {args.tree!r} in this store (a snapshot id is "
                "64 hex digits, as an undo line prints it)"
            )
        tree = args.tree
    elif args.at is not None:
        tree = _tree_after(store, run_id, _seq(run_id, args.at, store.steps(run_id)))
    else:
        raise UsageError("say which snapshot: --at SEQ (a step number as `show` prints it)")
    target = Path(os.path.abspath(_given_dir(args.to, "--to")))
    scanner = _scanner(target, run.settings, env)
    try:
        manifest = snapshot.load(blobs, tree)
    except KeyError:
        raise UsageError(f"no workspace snapshot {tree} in this store") from None
    # Before the undo snapshot and any change: a manifest edited in the store stops here.
    check_manifest(manifest, scanner, blobs.present_blobs, blobs.blob)
    undo = None
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        if not target.is_dir():
            raise UsageError(f"{target} is not a directory")
        if not args.force:
            raise UsageError(
                f"{target} is not empty; restore into it only with --force (its current "
                "files are snapshotted first, so it can be undone)"
            )
        with render.work_status(sys.stderr), progress.working("snapshotting it first (undo)"):
            kept = snapshot.take(scanner, blobs)
            save_statements(store.engine, kept.statements)
        undo = kept.tree_id
    again = f"durable-agent restore {run_id} --tree {undo} --to {target} --force" if undo else None
    if again is not None:  # first: a restore that fails halfway (a full disk) can still be undone
        print(f"undo with: {again}", flush=True)
    held: list[bytes] = []
    try:
        with render.work_status(sys.stderr):
            done = materialize(
                manifest,
                target,
                scanner,
                blobs.blob,
                present=blobs.present_blobs,
                fetch=blobs.blobs,
                held=held,
            )
    except RestoreStopped as exc:
        raise DurableAgentError(
            f"the restore {exc}" + (f"; undo with: {again}" if again else "")
        ) from None
    print(
        f"restored {target} to the snapshot after step {args.at} of run {run_id}"
        if not args.tree
        else f"restored {target} to snapshot {tree}",
        f"({len(done)} path(s) changed)",
    )
    said = _held_line(held, written=True)
    if said:
        print(said)
    big = sorted(
        show_name(os.fsdecode(path)) for path, entry in manifest.items() if entry.kind == "big"
    )
    if (
        big
    ):  # never stored (over snapshot_max_file_bytes): what is there of them is not the snapshot's
        print(
            visible(
                f"left as they are, too large to have been snapshotted: {', '.join(big[:10])}"
                + (f" and {len(big) - 10} more" if len(big) > 10 else "")
            )
        )
    return 0


def cmd_fork(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.loop.runner import new_run_id

    store = _open(args, env)
    run_id = store.find_run_id(args.run_id)
    run = store.get_run(run_id)
    seq = _seq(run_id, args.at, store.steps(run_id))
    target = Path(os.path.abspath(_given_dir(args.workspace, "--workspace")))
    _empty_target(target)
    new_id = args.new_run_id or new_run_id()
    if not RUN_ID_RE.match(new_id):
        raise UsageError(
            f"invalid --run-id {new_id!r}: use letters, digits, '.', '_' or '-' (at most 64, "
            "a letter or digit first)"
        )
    fork_into(store, run, seq, new_id, target, task=args.task, env=env)
    if args.json:
        print(
            json.dumps(
                {"run_id": new_id, "forked_from": run_id, "fork_seq": seq, "workspace": str(target)}
            )
        )
    else:
        print(new_id)
        print(
            f"forked {run_id} after step {args.at} into {target}; continue with: durable-agent resume {new_id}",
            file=sys.stderr,
        )
    return 0


def _empty_target(target: Path) -> None:
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UsageError(f"--workspace {target} must be an empty directory or not exist yet")


def fork_into(
    store: Any,
    run: Any,
    seq: int,
    new_id: str,
    target: Path,
    *,
    task: str | None,
    env: dict[str, str],
) -> None:
    """The fork itself (`fork`, `continue --fork`): run `new_id`, pending, with `run`'s
    history up to step `seq` and its files as after that step written into `target` (an
    empty folder, or one to make)."""
    from durable_agent.cli import render
    from durable_agent.store.blobs import BlobStore, tree_at
    from durable_agent.store.forks import fork_run
    from durable_agent.workspace import snapshot
    from durable_agent.workspace.materialize import RestoreStopped, materialize
    from durable_agent.workspace.validation import check_manifest

    run_id = run.id
    _empty_target(target)
    if store.run_exists(new_id):
        raise UsageError(f"a run with id {new_id!r} already exists; pick another id")
    found = tree_at(store.engine, run_id, seq)
    blobs = BlobStore(store.engine)
    scanner = _scanner(target, run.settings, env)
    try:
        manifest = snapshot.load(blobs, found.tree) if found is not None else None
    except KeyError:
        raise DurableAgentError(
            f"run {run_id} names a workspace snapshot this store does not have"
        ) from None
    if manifest is not None:  # before the folder is made: an edited manifest stops here
        check_manifest(manifest, scanner, blobs.present_blobs, blobs.blob)
    held: list[bytes] = []
    try:
        target.mkdir(parents=True, exist_ok=True)
        if manifest is not None:
            with render.work_status(sys.stderr):
                materialize(
                    manifest,
                    target,
                    scanner,
                    blobs.blob,
                    present=blobs.present_blobs,
                    fetch=blobs.blobs,
                    held=held,
                )
    except (OSError, RestoreStopped) as exc:  # (mkdir's OSError names no more than the target)
        why = exc if isinstance(exc, RestoreStopped) else f"{exc.strerror or exc} at {target}"
        raise DurableAgentError(f"cannot make the fork's workspace: {why}") from None
    settings = dict(run.settings or {})
    settings["workspace"] = str(target)
    fork_run(store.engine, run_id, seq, new_id, workspace=str(target), settings=settings, task=task)
    said = _held_line(held, written=False)
    if said:
        print(said, file=sys.stderr)
