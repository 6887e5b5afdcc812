"""A batch task's workspace, made as the first durable step of its run (docs/fleets.md).

`batch submit` creates each task's run with `workspace_repo` (a local git repository or a
git URL) and `workspace_ref`, and its workspace folder empty: a placeholder that keeps the
path the run's alone. The step makes the tree in a folder beside it named by the run
(`.NAME.partial-RUN`), then renames that onto the placeholder: rename(2) replaces an empty
directory in one move, so the workspace is either the placeholder (empty) or whole, never
half-made. A crash before the rename leaves the partial folder, which the step's next
attempt removes and makes again; a crash after it leaves a whole workspace and an
unfinished step, which the next attempt takes as it is. A completed step is never run again.

A local repository gets a detached `git worktree` (cheap: one object store), a URL a
`git clone`, checked out at the ref. The step changes files the harness itself puts there,
not the model: it records no snapshots, so the run's first snapshot (its diff's base, as for
`batch export`) is the workspace as the step made it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from durable_agent.errors import LoopExit
from durable_agent.loop.step import StepOutcome, StepSpec, invoke
from durable_agent.loop.step_context import StepContext
from durable_agent.status import StepKind, StopReason
from durable_agent.store.step import Step

KEY = "workspace:setup"
GIT_TIMEOUT_S = 600


def is_local(repo: str) -> bool:
    return "://" not in repo and not repo.startswith("git@") and Path(repo).is_dir()


def setup_workspace(ctx: StepContext) -> bool:
    """Make the workspace if this run is a batch task whose workspace is not made yet.
    True: the run is a batch task (its session must look at its workspace folder again:
    the one it opened may have been the placeholder the step replaced)."""
    repo = ctx.settings.workspace_repo
    if not repo:
        return False
    ref = ctx.settings.workspace_ref or "HEAD"
    spec = StepSpec(
        kind=StepKind.WORKSPACE,
        key=KEY,
        turn=0,
        input={"repo": repo, "ref": ref},
        label="workspace",
        detail=f"{repo} @ {ref}",
        reuse=True,
    )
    done = invoke(ctx, spec, lambda step: _make(ctx, step, repo, ref))
    if done.error is not None:
        raise LoopExit(StopReason.TOOL_ERROR, f"cannot make the workspace: {done.error}")
    return True


def _make(ctx: StepContext, step: Step, repo: str, ref: str) -> StepOutcome:
    target = Path(ctx.settings.workspace)
    local = is_local(repo)
    with _repo_lock(repo if local else None):
        return _make_locked(ctx, target, local, repo, ref)


@contextlib.contextmanager
def _repo_lock(repo: str | None) -> Iterator[None]:
    """Worktree commands of one repository one at a time on this host: two `git worktree
    add` at once on one repository can fail on its locks."""
    if repo is None:
        yield
        return
    key = hashlib.sha256(os.fsencode(os.path.realpath(repo))).hexdigest()[:24]
    path = Path(tempfile.gettempdir()) / f"durable-agent-worktrees-{key}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _make_locked(ctx: StepContext, target: Path, local: bool, repo: str, ref: str) -> StepOutcome:
    if target.is_dir() and any(target.iterdir()):
        # Only the rename below fills the placeholder: an earlier attempt got that far.
        if local:
            _git(["-C", repo, "worktree", "repair", str(target)])
        return StepOutcome(output={"repo": repo, "ref": ref, "head": _head(target), "kept": True})
    partial = target.parent / f".{target.name}.partial-{ctx.journal.run_id}"
    if partial.exists():  # an attempt that died halfway: start over
        shutil.rmtree(partial)
        if local:
            _git(["-C", repo, "worktree", "prune"])
    try:
        if local:
            _git(["-C", repo, "worktree", "add", "--detach", str(partial), ref])
        else:
            _git(["clone", "--quiet", "--no-checkout", "--", repo, str(partial)])  # no option
            _git(["-C", str(partial), "checkout", "--quiet", "--detach", ref])
    except _GitFailed as exc:
        return StepOutcome(error=str(exc))
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(partial, target)  # onto the empty placeholder: whole or not there at all
    if local:
        _git(["-C", repo, "worktree", "repair", str(target)])
    return StepOutcome(output={"repo": repo, "ref": ref, "head": _head(target)})


class _GitFailed(Exception):
    pass


def _git(args: list[str]) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    proc = subprocess.run(
        ["git", *args],
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if proc.returncode != 0:
        raise _GitFailed(f"git {' '.join(args[:4])}: {proc.stderr.strip()[-400:]}")
    return proc.stdout


def _head(path: Path) -> str | None:
    try:
        return _git(["-C", str(path), "rev-parse", "HEAD"]).strip()
    except _GitFailed:
        return None
