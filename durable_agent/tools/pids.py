"""A limit on the processes one sandboxed command may start (a fork bomb stops at it).

RLIMIT_NPROC is no answer when the harness runs as root: the kernel never applies it to
real uid 0, and a user namespace does not change that (bubblewrap maps the sandbox's uid to
the harness's own, so the command's processes are still root's outside). Nor can the
command run as another uid: it must write the workspace, which the harness's user owns.

So each command gets a cgroup of its own with `pids.max` (cgroup v1's pids hierarchy, or
cgroup v2 where the harness's cgroup delegates the pids controller), made under the
harness's own cgroup and joined by the first process before it execs the sandbox
(`joining`): everything the command starts is counted, and fork() fails with EAGAIN past
the limit. The cgroup is removed after the command.

Fail safe: when no such cgroup can be made and the harness runs as root, commands are
refused (one line, naming --sandbox off); a harness that is not root keeps the kernel's
per-user RLIMIT_NPROC, which applies to it (docs/sandbox.md).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time

PIDS_MAX = 1024
"""Processes and threads one command may have at once: far above what builds and test
runners use (`make -j`, pytest-xdist), far below what takes a machine down."""

_counter = itertools.count()


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount point, root within the hierarchy, fs type, super options) of cgroup mounts."""
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                    point = fields[4].replace("\\040", " ")
                    found.append((point, fields[3], tail[0], tail[2]))
    except OSError:
        return []
    return found


def _own_paths() -> dict[str, str]:
    """Controller ("" for cgroup v2) -> this process's cgroup path in that hierarchy."""
    paths: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) == 3:
                    for controller in parts[1].split(",") if parts[1] else [""]:
                        paths[controller] = parts[2]
    except OSError:
        return {}
    return paths


def _join(point: str, root: str, path: str) -> str:
    rel = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
    return os.path.normpath(os.path.join(point, "" if rel == "." else rel))


def _parent() -> str | None:
    """The cgroup directory under which a command's pids cgroup can be made, or None."""
    own = _own_paths()
    for point, root, kind, options in _mounts():
        if kind == "cgroup" and "pids" in options.split(",") and "pids" in own:
            here = _join(point, root, own["pids"])
            if os.access(here, os.W_OK) and os.path.exists(os.path.join(here, "pids.max")):
                return here
            if os.access(here, os.W_OK) and here == point:  # the root has no pids.max
                return here
    for point, root, kind, _ in _mounts():
        if kind == "cgroup2" and "" in own:
            here = _join(point, root, own[""])
            try:
                with open(os.path.join(here, "cgroup.subtree_control"), encoding="ascii") as f:
                    delegated = "pids" in f.read().split()
            except OSError:
                continue
            if delegated and os.access(here, os.W_OK):
                return here
    return None


def new_group(limit: int = PIDS_MAX) -> str | None:
    """A fresh cgroup limited to `limit` processes, or None when none can be made here."""
    parent = _parent()
    if parent is None:
        return None
    if next(_counter) == 0:
        _sweep(parent)
    group = os.path.join(parent, f"durable-agent-{os.getpid()}-{next(_counter)}")
    try:
        os.mkdir(group)
    except OSError:
        return None
    try:
        with open(os.path.join(group, "pids.max"), "w", encoding="ascii") as f:
            f.write(str(limit))
    except OSError:
        remove_group(group)
        return None
    return group


def _sweep(parent: str) -> None:
    """Remove the empty cgroups a harness killed by SIGKILL left behind (its pid is gone),
    once per process: a cgroup holding processes cannot be removed, and is not."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if len(parts) != 4 or parts[:2] != ["durable", "agent"] or not parts[2].isdigit():
            continue
        pid = int(parts[2])
        if pid == os.getpid() or os.path.exists(f"/proc/{pid}"):
            continue
        path = os.path.join(parent, name)
        with contextlib.suppress(OSError):
            # A minute old at least: a harness in another PID namespace (whose pid we cannot
            # see) may be about to join the group it just made.
            if time.time() - os.stat(path).st_mtime > 60:
                os.rmdir(path)


def joining(group: str, argv: list[str]) -> list[str]:
    """`argv` started by a shell that first moves itself into `group`: if that fails, the
    command does not run (the shell's error and exit code 2 say so)."""
    procs = os.path.join(group, "cgroup.procs")
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]


def remove_group(group: str, wait_s: float = 2.0) -> None:
    """Remove `group` once its last process has gone (the command's are SIGKILLed by then,
    but the kernel takes a moment to release them); left in place if it never empties."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(group)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.02)


def refusal() -> str:
    return (
        "refusing to run the command: the harness runs as root, where the kernel's process "
        f"limit does not apply, and no cgroup can be made here to limit the command to {PIDS_MAX} "
        "processes (a fork bomb would take the machine down); run the harness as another user, "
        "give it a writable pids cgroup, or pass --sandbox off"
    )


def probe() -> str | None:
    """None when commands can be limited here (or need not be: not root), else why not."""
    if os.geteuid() != 0:
        return None
    group = new_group()
    if group is None:
        return refusal()
    with contextlib.suppress(OSError):
        os.rmdir(group)
    return None
