"""Process groups of commands: signal one, wait until it is gone, and on resume find out
whether anything of a recorded group still runs (and kill it). Linux only (/proc)."""

from __future__ import annotations

import contextlib
import os
import signal
import time


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(pgid, sig)


# --- resume: what is left of a recorded group ------------------------------------------


def process_group_alive(
    pgid: int, *, call_id: str | None = None, run_id: str | None = None
) -> bool:
    """Does any live (non-zombie) process of group `pgid` remain?

    With `call_id` (and `run_id`), only if one of them carries `DURABLE_AGENT_CALL_ID=call_id`
    (and `DURABLE_AGENT_RUN_ID=run_id`) in its environment: after a reboot, or on another
    machine that took the run over, the number may belong to someone else's group, and call
    ids like `call_1_0` repeat across runs.
    """
    members = _live_members(_check_pgid(pgid))
    if call_id is not None:
        return any(_has_ids(pid, call_id, run_id) for pid in members)
    return bool(members)


def kill_process_group(
    pgid: int,
    *,
    call_id: str | None = None,
    run_id: str | None = None,
    grace_s: float = 1.0,
    wait_s: float = 5.0,
) -> bool:
    """SIGTERM group `pgid`, SIGKILL what is left after `grace_s`, and wait (up to `wait_s`)
    until no member remains. Returns True if live members were found and signalled.
    `call_id` as in `process_group_alive`: a group that is not ours is left alone."""
    if not process_group_alive(pgid, call_id=call_id, run_id=run_id):
        return False
    _signal_group(pgid, signal.SIGTERM)
    if not _wait_until_gone(pgid, grace_s):
        _signal_group(pgid, signal.SIGKILL)
        _wait_until_gone(pgid, wait_s)
    return True


def _wait_until_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _live_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _group_exists(pgid: int) -> bool:
    """Cheap first check (no /proc scan); zombies count, so True may be a false alarm."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, it is just not ours to signal
    return True


def _check_pgid(pgid: int) -> int:
    # killpg(0) and killpg(1) mean "my own group" and "init's": never what a record means.
    if pgid <= 1 or pgid == os.getpgrp():
        raise ValueError(f"refusing to touch process group {pgid}")
    return pgid


def _live_members(pgid: int) -> list[int]:
    """Pids in group `pgid`, zombies excluded (an unreaped zombie runs nothing; in
    containers whose init does not reap, `killpg(pgid, 0)` would see them forever)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited while we looked
        # "pid (comm) state ppid pgrp ...": comm may contain spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry.name))
    return members


def _has_ids(pid: int, call_id: str, run_id: str | None) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        return False
    if f"DURABLE_AGENT_CALL_ID={call_id}".encode() not in environ:
        return False
    return run_id is None or f"DURABLE_AGENT_RUN_ID={run_id}".encode() in environ
