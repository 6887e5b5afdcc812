"""The step hooks: a snapshot when a step that can change files starts, and when it ends.

    before(ctx, step)  rides in the intent commit: `steps.tree_before` (what a command that
                       is cut off started from; what this step's changes are measured from)
    after(ctx, step)   rides in the outcome commit: `steps.tree_id` and the step's rows in
                       `workspace_changes` (the `step_changes` view)

The step primitive (loop/step.py) calls these, for the steps that can change files
(write, exec, verify) and only once an intent row exists: a read, or a write refused
before it ran, takes no snapshot and costs nothing. They take a `Site` (what they need of
the session; the loop's StepContext is one), so the workspace layer imports nothing of
the loop.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import TYPE_CHECKING, Protocol

from durable_agent.config.settings import Settings
from durable_agent.errors import ConfigError
from durable_agent.observer import Observer
from durable_agent.redact import Redactor
from durable_agent.store.blobs import BlobStore, WorkspaceWrite, changes_statement, save_statements
from durable_agent.store.journal import Journal
from durable_agent.store.retrying import StorePolicy
from durable_agent.store.step import Step
from durable_agent.workspace import progress, secrets, snapshot
from durable_agent.workspace.manifest import Change, Manifest, changes
from durable_agent.workspace.scan import MAX_DEPTH, Scanner, scanner_for

if TYPE_CHECKING:
    from sqlalchemy import Engine


class Site(Protocol):
    """Where a step runs: the run's settings, its journal (store, lease), who is told."""

    @property
    def settings(self) -> Settings: ...

    @property
    def journal(self) -> Journal: ...

    @property
    def observer(self) -> Observer: ...

    @property
    def redactor(self) -> Redactor: ...

    def workspace_moved(self) -> bool: ...


def scanner(ctx: Site) -> Scanner:
    s = ctx.settings
    return scanner_for(
        s.workspace, s.exclude, s.snapshot_max_file_bytes, secrets.for_run(s, ctx.redactor)
    )


def _git(settings: Settings) -> bool:
    """Files the checkout's HEAD commit holds are left to git (`snapshot_baseline`)."""
    return settings.snapshot_baseline == "git"


def before(ctx: Site, step: Step, writes: Collection[bytes] | None = None) -> WorkspaceWrite | None:
    """`writes`: the paths the step will write (a file tool's plan), all it may change; the
    files between steps are as the last snapshot left them (a command's is a full scan), so
    only these are looked at. Drift from outside is caught by the next full scan (resume's)."""
    if not ctx.settings.snapshots:  # (a moved workspace stopped the run before: check_workspace)
        return None
    scan = scanner(ctx)
    blobs = BlobStore(ctx.journal.engine, ctx.journal.policy, ctx.journal.run_id)
    snap = snapshot.take(scan, blobs, writes, git=_git(ctx.settings))
    snapshot.remember(snap.tree_id, snap.manifest)
    step.tree_before = snap.tree_id
    return WorkspaceWrite(
        snap.statements,
        {"tree_before": snap.tree_id},
        committed=functools.partial(snapshot.committed, scan, blobs, snap),
    )


def at_creation(
    settings: Settings, engine: Engine, policy: StorePolicy | None = None, *, redactor: Redactor
) -> str | None:
    """The workspace as a new run finds it, stored (content addressed: no lease needed), so a
    worker on another host can start a detached run from the user's files."""
    if not settings.snapshots or not settings.workspace.is_dir():
        return None
    blobs = BlobStore(engine, policy)
    scanner = scanner_for(
        settings.workspace,
        settings.exclude,
        settings.snapshot_max_file_bytes,
        secrets.for_run(settings, redactor),
    )
    if scanner.exclude_refused:
        rule, why = scanner.exclude_refused[0]
        raise ConfigError(
            f"exclude: the rule {rule!r} cannot be used ({why}); write it another way"
        )
    with progress.working("snapshotting the workspace"):
        snap = snapshot.take(scanner, blobs, git=_git(settings))
        save_statements(engine, snap.statements, policy)
        snapshot.committed(scanner, blobs, snap)
    snapshot.remember(snap.tree_id, snap.manifest)
    return snap.tree_id


def _changes_since(ctx: Site, tree_before: str | None) -> list[Change] | None:
    """The changes from snapshot `tree_before` to the files now; None when unknown."""
    if not ctx.settings.snapshots or not tree_before:
        return None
    blobs = BlobStore(ctx.journal.engine, ctx.journal.policy, ctx.journal.run_id)
    try:
        old = snapshot.load(blobs, tree_before)
    except KeyError:
        return None
    scan = scanner(ctx).scan()
    return changes(old, scan.manifest, scan.delta_from(old))


def unchanged_since(ctx: Site, tree_before: str | None) -> bool:
    """No file differs from snapshot `tree_before` (True also when that cannot be told)."""
    return not _changes_since(ctx, tree_before)


def changed_so_far(ctx: Site, tree_before: str | None) -> str:
    """For the question about a command cut off by a crash: what it changed until then
    (its pre-command snapshot against the files now), and how to undo it."""
    found = _changes_since(ctx, tree_before)
    if found is None:
        return ""
    if not found:
        return "; so far the workspace has no changes since it started"
    names = ", ".join(f"{c.shown} ({c.change})" for c in found[:20])
    more = f" and {len(found) - 20} more" if len(found) > 20 else ""
    return (
        f"; so far it changed {len(found)} path(s): {names}{more} (`approve --restore` puts them back "
        "as before the command, then runs it again)"
    )


def put_back(ctx: Site, tree: str) -> None:
    """The workspace as snapshot `tree` recorded it (`approve --restore`)."""
    from durable_agent.workspace.materialize import materialize

    blobs = BlobStore(ctx.journal.engine, ctx.journal.policy, ctx.journal.run_id)
    held: list[bytes] = []
    materialize(
        snapshot.load(blobs, tree),
        ctx.settings.workspace,
        scanner(ctx),
        blobs.blob,
        present=blobs.present_blobs,
        fetch=blobs.blobs,
        held=held,
    )
    ctx.observer.note(
        "put the workspace back as it was before the interrupted command" + held_note(held)
    )


def held_note(held: list[bytes]) -> str:
    """For a note on a restore: the paths it left as they are, as they held a secret."""
    if not held:
        return ""
    names = ", ".join(p.decode("utf-8", "backslashreplace")[:200] for p in held[:5])
    more = f" and {len(held) - 5} more" if len(held) > 5 else ""
    return f" ({len(held)} path(s) {secrets.HELD}, left as they are: {names}{more})"


def after(ctx: Site, step: Step, writes: Collection[bytes] | None = None) -> WorkspaceWrite | None:
    # A workspace unmounted (or replaced) under the step: its files are not the step's deletions.
    if not ctx.settings.snapshots or not step.has_row or step.seq < 0 or ctx.workspace_moved():
        return None
    blobs = BlobStore(ctx.journal.engine, ctx.journal.policy, ctx.journal.run_id)
    scan = scanner(ctx)
    snap = snapshot.take(scan, blobs, writes, git=_git(ctx.settings))
    snapshot.remember(snap.tree_id, snap.manifest)
    old: Manifest = {}
    if step.tree_before:
        try:
            old = snapshot.load(blobs, step.tree_before)
        except KeyError:
            old = {}
    rows = [
        {
            "run_id": ctx.journal.run_id,
            "seq": step.seq,
            "path": c.shown,
            "change": c.change,
            "bytes": c.bytes,
        }
        # (a file re-identified by its sha256 after HEAD moved is not the step's change)
        for c in changes(old, snap.manifest, snap.scan.delta_from(old), scan.same_bytes)
    ]
    statements = [*snap.statements, *([changes_statement(rows)] if rows else [])]
    note = None
    if snap.skipped:
        names = ", ".join(p.decode("utf-8", "backslashreplace") for p in snap.skipped[:5])
        more = f" and {len(snap.skipped) - 5} more" if len(snap.skipped) > 5 else ""
        note = (
            f"{len(snap.skipped)} file(s) over the snapshot size cap "
            f"({ctx.settings.snapshot_max_file_bytes} bytes) left out of the snapshot: {names}{more}"
        )
    if snap.scan.too_deep:
        deep = snap.scan.too_deep[0].decode("utf-8", "backslashreplace")
        note = "; ".join(
            filter(
                None,
                [
                    note,
                    f"folders nested more than {MAX_DEPTH} levels deep left out of "
                    f"the snapshot, with all they hold: {deep[:200]}…",
                ],
            )
        )
    left = scan.report_excluded(snap.scan)
    if left:
        names = ", ".join(p.decode("utf-8", "backslashreplace")[:200] for p in left[:5])
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        note = "; ".join(
            filter(
                None,
                [
                    note,
                    f"left out of the snapshot by the exclude setting: {names}{more} (generated "
                    "folders count only where git tracks no file in them)",
                ],
            )
        )
    if snap.scan.unreadable:
        names = ", ".join(
            (p.decode("utf-8", "backslashreplace") or ".")[:200] for p in snap.scan.unreadable[:5]
        )
        more = f" and {len(snap.scan.unreadable) - 5} more" if len(snap.scan.unreadable) > 5 else ""
        note = "; ".join(
            filter(
                None,
                [
                    note,
                    f"{len(snap.scan.unreadable)} folder(s) or file(s) the harness could "
                    f"not read, kept as the last snapshot saw them (left out if never "
                    f"seen): {names}{more}",
                ],
            )
        )
    return WorkspaceWrite(
        statements,
        {"tree_id": snap.tree_id},
        note,
        functools.partial(snapshot.committed, scan, blobs, snap),
    )
