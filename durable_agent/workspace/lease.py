"""One live run per workspace: the workspace lease.

Two runs on one workspace race each other's files: one's command (or an MCP server's
child) can swap a folder while the other's file tools work through it, and each records
the other's changes as its own. So `start` and `resume` hold an exclusive `flock` on a file
kept outside the workspace, named by the hash of the workspace's real path, for as long as
they execute. The kernel drops the lock when its process dies, however it dies (SIGKILL
too), so a dead owner's lease is taken over at once, as a run lease is (SPEC section 5).
The file says who holds it (run id, pid) for the refusal. `--allow-shared-workspace` skips
it (unsafe: docs/sandbox.md).

A run also holds the lock of every folder above its workspace shared: a run in a
subfolder of a live run's workspace, or in a folder holding it, is refused too.

The lock files live beside the default store (`$XDG_DATA_HOME/durable-agent/workspaces/`),
where commands in the sandbox cannot write. A lease is per user: runs of two users on one
workspace do not see each other's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from durable_agent.errors import RunBusy, WorkspaceBusy


def lease_dir(env: Mapping[str, str]) -> Path:
    base = Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "durable-agent" / "workspaces"


def lease_file(workspace: Path, env: Mapping[str, str]) -> Path:
    key = hashlib.sha256(os.fsencode(os.path.realpath(workspace))).hexdigest()
    return lease_dir(env) / f"{key[:32]}.lock"


@contextlib.contextmanager
def workspace_lease(
    workspace: Path, run_id: str | None, env: Mapping[str, str], *, shared: bool = False
) -> Iterator[Callable[[str], None]]:
    """Hold the workspace's lease for the block; WorkspaceBusy if a live process holds it
    (RunBusy if that is `run_id` itself). Yields what names the run holding it, for a run
    created under the lease. `shared`: take none (`--allow-shared-workspace`)."""
    if shared:
        yield lambda _run_id: None
        return
    path = lease_file(workspace, env)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    held = [fd]
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            if run_id is not None and _holder(fd)[0] == run_id:
                # This very run, in another process: a stalled or frozen owner (SIGSTOP, a
                # paused VM) keeps its flock although its run lease may have expired. The
                # run's lease decides, as for any resume: a live one refuses (exit 6), an
                # expired one is taken over, and every write of the old owner is fenced.
                yield lambda _run_id: None
                return
            raise _busy(fd, run_id, workspace) from None
        # A run in a folder of this workspace, or in one holding it, shares its files all
        # the same: each run also holds every enclosing folder's lock shared, which an
        # exclusive holder there refuses (and which refuses an exclusive taker later).
        for folder in Path(os.path.realpath(workspace)).parents:
            up = os.open(
                lease_file(folder, env),
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
            held.append(up)
            try:
                fcntl.flock(up, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                raise _busy(up, run_id, workspace) from None

        def holder(run_id: str) -> None:
            """Who holds it, for the refusal (written under the lock; read by the one refused)."""
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{run_id} {os.getpid()}\n".encode(), 0)

        holder(run_id or "-")
        try:
            yield holder
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        for each in held:
            os.close(each)  # (drops the lock)


def _holder(fd: int) -> tuple[str, str]:
    """(run id, pid) of the process holding the lease, as it wrote them."""
    try:
        holder_run, pid = os.pread(fd, 200, 0).decode("utf-8", "replace").split()[:2]
    except (OSError, ValueError):
        return "-", "?"
    return holder_run, pid


def _busy(fd: int, run_id: str | None, workspace: Path) -> RunBusy:
    holder_run, pid = _holder(fd)
    if run_id is not None and holder_run == run_id:  # a second `resume` of the very run
        return RunBusy(run_id, f"pid {pid}")
    holder = f"run {holder_run} (pid {pid})" if holder_run != "-" else f"a run (pid {pid})"
    return WorkspaceBusy(run_id or "-", os.path.realpath(workspace), holder)
