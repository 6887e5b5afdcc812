"""Leases: who may execute a run right now. Take, renew (the Journal's fence), is-live.

A lease is (`lease_owner`, `lease_expires_at`, `lease_epoch`) on `runs`. The owner is
`host:pid:nonce-space`, so a process on the same host, boot and PID namespace can prove a
holder dead (its pid is gone) and take the run over at once instead of waiting for the
lease to expire. Resume, the worker's queue and the renderers all ask the same question here.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from durable_agent.status import RunStatus

if TYPE_CHECKING:
    from sqlalchemy import Connection


def new_owner() -> str:
    """host:pid:nonce-space — the host, the pid and the space its pid lives in (`_pid_space`)
    let a process that sees the same pids find that the owner died."""
    import uuid  # (its import costs `list` and `show`, which never take a lease)

    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}-{_pid_space()}"


@lru_cache(maxsize=1)
def _pid_space() -> str:
    """This boot and PID namespace, in 8 hex digits ("" when they cannot be read). A hostname
    is not enough: containers sharing the host's network (and name) each number their own
    pids, and one's live owner looked dead from another, which took its lease at once."""
    import hashlib

    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip()
        space = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return hashlib.sha256(boot + b"/" + str(space).encode()).hexdigest()[:8]


def owner_is_dead(owner: str) -> bool:
    """True only when we can prove it: same host, boot and PID namespace, and that pid is gone
    or a zombie.
    (An owner written before the namespace was recorded is never judged: its lease expires.)"""
    host, _, rest = owner.partition(":")
    pid_text, _, nonce = rest.partition(":")
    space = _pid_space()
    if (
        host != socket.gethostname()
        or not pid_text.isdigit()
        or not space
        or not nonce.endswith(f"-{space}")
    ):
        return False
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _defunct(pid)


def _defunct(pid: int) -> bool:
    """A zombie (state Z, or X while it is reaped): killed, not yet waited for by its parent.
    `kill -9` then `resume` at once found its pid still there and called the owner live."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True  # reaped since the kill above
    except OSError:
        return False
    # `pid (comm) S ...`: the name may hold spaces and parentheses, the state follows the last `)`.
    return stat.rpartition(b")")[2].split()[:1] in ([b"Z"], [b"X"])


def is_live(owner: str | None, expires_at: datetime | None, now: datetime) -> bool:
    """Held and not expired, by an owner not proven dead (same host, pid gone)."""
    return (
        owner is not None
        and expires_at is not None
        and expires_at > now
        and not owner_is_dead(owner)
    )


def is_executing(run: Any, now: datetime) -> bool:
    """`running` under a live lease: its process is still at work (a crashed run is
    `running` too, with an owner that is gone or a lease that ran out)."""
    return run.status == RunStatus.RUNNING and is_live(run.lease_owner, run.lease_expires_at, now)


# What taking a run to execute it sets (and what a `continue`'s message commit sets).
RUNNING_AGAIN: dict[str, Any] = {
    "status": RunStatus.RUNNING.value,
    "stop_reason": None,
    "error": None,
    "finished_at": None,
}


def running_again(run_id: str) -> tuple[Any, dict[str, Any]]:
    """The statement that sets a run taken with its status kept `running` (a `continue`'s
    message commit: loop/turns.py), as a Journal commit takes statements."""
    from sqlalchemy import update

    from durable_agent.store.schema import runs

    return update(runs).where(runs.c.id == run_id).values(**RUNNING_AGAIN), {}


def take(
    conn: Connection,
    run_id: str,
    *,
    previous_epoch: int,
    owner: str,
    lease_seconds: float,
    now: datetime,
    clear_cancel: bool,
    keep_status: bool = False,
) -> int:
    """Take the lease of a run whose row the caller has locked; returns the new epoch.

    The new epoch fences out the previous holder, should it still live: every Journal write
    checks (owner, epoch). `clear_cancel`: a person asked the run to go on (`resume`); a
    worker keeps a cancel that reached a worker which then died. `keep_status`: only the
    lease changes hands; the run stays as it ended (`continue`, until its message is recorded:
    a crash before that leaves the run as it was, not `running`).
    """
    # Imported here: `list` and `show` ask whether a run is live without SQLAlchemy.
    from sqlalchemy import update

    from durable_agent.store.schema import runs

    epoch = previous_epoch + 1
    extra: dict[str, Any] = {"cancel_requested": False} if clear_cancel else {}
    if not keep_status:
        extra.update(RUNNING_AGAIN)
    res = conn.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.lease_epoch == previous_epoch)
        .values(
            lease_owner=owner,
            lease_epoch=epoch,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            updated_at=now,
            resume_count=runs.c.resume_count + (1 if previous_epoch > 0 else 0),
            **extra,
        )
    )
    if res.rowcount != 1:  # cannot happen under the row lock; never run a run twice
        raise RuntimeError(f"run {run_id} changed under its row lock")
    return epoch
