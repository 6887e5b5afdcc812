"""On resume: the workspace must be the one the last snapshot recorded.

    missing or empty   rebuilt from the last snapshot (a worker on another host, a person's
                       `resume --workspace DIR`), and the run goes on
    equal              nothing to do (a scan of an unchanged workspace only stats files)
    different          never silently overwritten: the run stops `blocked`
                       (`workspace_drift`) with the differing paths in the question;
                       `approve` continues with the files as they are, `approve --deny` puts
                       the snapshot back and continues, `restore` does it by hand

A step cut off by a crash (intent only) is left to its reconciliation (write hashes, the
command's approval): the files it may have half changed are not drift.
"""

from __future__ import annotations

import os

from durable_agent.errors import LoopExit, UsageError
from durable_agent.status import EffectClass, StepKind, StopReason
from durable_agent.store.blobs import BlobStore, TreeAt, save_statements, tree_at
from durable_agent.store.records import ApprovalKind, Decision, StepState
from durable_agent.store.rows import utcnow
from durable_agent.store.step import USE_APPROVAL
from durable_agent.workspace import progress, recorder, snapshot
from durable_agent.workspace.manifest import changes, tree_id
from durable_agent.workspace.materialize import RestoreStopped, materialize
from durable_agent.workspace.recorder import Site

DRIFT = ApprovalKind.WORKSPACE_DRIFT
CALL = "workspace"  # the approval's call id: the drift is the run's, not one tool call's
SHOWN = 20  # differing paths named in the question


def rebuild_if_missing(ctx: Site) -> TreeAt | None:
    """The first half of `check`: a missing or empty workspace is rebuilt from the last
    snapshot. Returns the snapshot to check a present workspace against (None: nothing to
    check, or it was just rebuilt)."""
    if not ctx.settings.snapshots:
        return None
    journal = ctx.journal
    last = tree_at(journal.engine, journal.run_id, policy=journal.policy)
    if last is None:
        return None
    root = ctx.settings.workspace
    blobs = BlobStore(journal.engine, journal.policy, journal.run_id)
    if not os.path.isdir(root) or not os.listdir(root):
        manifest = snapshot.load(blobs, last.tree)
        if manifest:
            held: list[bytes] = []
            materialize(
                manifest,
                root,
                recorder.scanner(ctx),
                blobs.blob,
                present=blobs.present_blobs,
                fetch=blobs.blobs,
                held=held,
            )
            when = f"of step {last.seq}" if last.seq >= 0 else "taken when the run was created"
            ctx.observer.note(
                f"rebuilt the workspace {root} from the snapshot {when} ({len(manifest)} paths)"
                + recorder.held_note(held)
            )
        return None
    return last


def check(ctx: Site) -> None:
    last = rebuild_if_missing(ctx)
    if last is None:
        return
    journal = ctx.journal
    root = ctx.settings.workspace
    blobs = BlobStore(journal.engine, journal.policy, journal.run_id)
    if any(
        s.state == StepState.STARTED
        and (
            s.effect in (EffectClass.WRITE, EffectClass.EXEC)
            or s.kind in (StepKind.VERIFY, StepKind.HOOK, StepKind.DELEGATE)
        )
        for s in journal.open_steps.values()
    ):
        return
    recorded = snapshot.load(blobs, last.tree)
    scanner = recorder.scanner(ctx)
    scanner.seed(recorded)  # a folder it may not list is as recorded, not drift
    if ctx.settings.snapshot_baseline == "git":
        snapshot.use_git(scanner)  # a file the commit holds keeps its `git:` id: no drift
    with progress.working("checking the workspace against its last snapshot"):
        current = scanner.scan().manifest
    if tree_id(current) == last.tree:
        return
    # A file read whose bytes are those its `git:` id named, of a commit HEAD no longer is
    # (moved between sessions): stored by its sha256 from now on, and no change.
    differing = changes(recorded, current, same=scanner.same_bytes)
    if not differing:  # the same files, one withheld for a secret by one side only
        return
    approval = journal.approval_for(CALL, DRIFT)
    if approval is not None and approval.decision is not None:
        if approval.decision == Decision.DENIED:  # put the snapshot back, then go on
            replaced = snapshot.take(
                scanner, blobs
            )  # the person's files first: --deny can be undone
            save_statements(journal.engine, replaced.statements, journal.policy)
            undo = f"durable-agent restore {journal.run_id} --tree {replaced.tree_id} --to {root} --force"
            ctx.observer.note(
                f"putting the workspace back as the snapshot of step {last.seq} has it; "
                f"the files it replaces: {undo}"
            )  # first: said even if it stops halfway
            try:
                materialize(
                    recorded,
                    root,
                    scanner,
                    blobs.blob,
                    present=blobs.present_blobs,
                    fetch=blobs.blobs,
                )
            except (RestoreStopped, UsageError) as exc:  # a full disk; an ignored file in the way
                raise LoopExit(
                    StopReason.WORKSPACE_DRIFT,
                    f"could not put the snapshot back ({exc}); the "
                    f"files as they were: {undo}; resume once it can be done",
                ) from None
        journal.commit([(USE_APPROVAL, {"b_id": approval.id, "used_at": utcnow()})])
        return
    names = ", ".join(f"{c.shown} ({c.change})" for c in differing[:SHOWN])
    more = f" and {len(differing) - SHOWN} more" if len(differing) > SHOWN else ""
    when = f"after step {last.seq}" if last.seq >= 0 else "taken when the run was created"
    reason = (
        f"the workspace {root} differs from the snapshot {when} in "
        f"{len(differing)} path(s): {names}{more}"
    )
    journal.request_approval(
        call_id=CALL,
        kind=DRIFT,
        tool_name=CALL,
        command=None,
        reason=ctx.redactor.redact(reason),
        step_seq=last.seq,
    )
    run_id = journal.run_id
    at = f"--at {last.seq}" if last.seq >= 0 else f"--tree {last.tree}"
    raise LoopExit(
        StopReason.WORKSPACE_DRIFT,
        f"{reason}. Continue with the files as they are: `durable-agent approve {run_id}`; "
        f"put the snapshot back: `durable-agent approve {run_id} --deny` (or "
        f"`durable-agent restore {run_id} {at} --to {root} --force`); then resume.",
    )
