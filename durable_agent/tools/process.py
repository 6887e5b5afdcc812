"""Run one shell command in its own process group, and never let it outlive the harness.

    harness (run_process) ──pipe──> guard (_guard.py, session + group leader)
                                      └── [sandbox: bwrap ... -- | _landlock.py ... --]
                                            └── /bin/bash -c COMMAND ── grandchildren ...

The sandbox wrapper (os_sandbox.py) stays in the guard's process group, so everything
below holds for sandboxed commands too; bubblewrap's PID namespace adds that even a
command that left the group (`setsid`) dies when bwrap does.

The pgid is the guard's pid. `on_start(pgid)` lets the caller record it before the command
starts, and returns when it must have started at the latest (the run's lease: a harness
stalled past it starts nothing). Timeout, cancel, an exception in the caller or the death
of the harness (even by SIGKILL, see `_guard.py`) kill the whole group. When the shell
exits, leftovers in the group are killed too: a call's effects end with the call.

Linux only. Use `kill_process_group` / `process_group_alive` on resume to make sure
nothing of a recorded group still runs before reconciling its step.
"""

from __future__ import annotations

import math
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path

from msgspec import Struct
from msgspec.structs import replace

from durable_agent.encoding import decode_text  # Latin-1 or \xHH, as file text
from durable_agent.redact import is_secret_name
from durable_agent.tools.base import ToolFailure
from durable_agent.tools.groups import (  # the resume half is re-exported from here
    _group_exists,
    _signal_group,
    _wait_until_gone,
    kill_process_group,
    process_group_alive,
)
from durable_agent.tools.os_sandbox import Mechanism, Sandbox, prepare
from durable_agent.tools.sealed import above_stdio, fitted

__all__ = [
    "ProcessOutcome",
    "command_env",
    "default_shell",
    "kill_process_group",
    "process_group_alive",
    "run_process",
    "truncate_middle",
]

GUARD_SCRIPT = Path(__file__).with_name("_guard.py")
KILL_GRACE_S = 2.0
"""Between SIGTERM and SIGKILL on timeout or cancel: time for a test runner to clean up."""
_POLL_S = 0.05  # how often the cancel event is checked: it cannot wake a select()
_DRAIN_S = 0.5  # after the guard is gone, how long to wait for pipes held by escapees
_DIE_WAIT_S = 5.0  # for SIGKILLed processes to actually exit
_READ_CHUNK = 65536

# Set for every command: nothing may wait for a terminal that is not there.
_NON_INTERACTIVE_ENV = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "SYSTEMD_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_EDITOR": "true",  # `git commit` without -m aborts instead of waiting for an editor
    "TERM": "dumb",
    "NO_COLOR": "1",
    "PYTHONUNBUFFERED": "1",
    "PIP_NO_INPUT": "1",
    "DEBIAN_FRONTEND": "noninteractive",
}
_DROPPED_ENV = ("FORCE_COLOR", "CLICOLOR_FORCE")  # would fight NO_COLOR


class ProcessOutcome(Struct, frozen=True):
    """What happened. `exit_code` is None unless the command ended by itself (it is None
    after a timeout or cancel); negative means killed by that signal, as in subprocess."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    cancelled: bool
    duration_ms: int
    pgid: int
    stdout_bytes: int  # sizes before truncation
    stderr_bytes: int
    notes: tuple[str, ...] = ()  # from the sandbox: git internals the command created or changed


def default_shell() -> str:
    for candidate in ("/bin/bash", "/usr/bin/bash"):
        if os.access(candidate, os.X_OK):
            return candidate
    return "/bin/sh"


# What a command gets of the host's environment without being told (SPEC §4): where its
# programs and home are, the locale and time zone. An allowlist, not the host's minus a
# denylist: a credential under a name no list foresaw (MYSQL_PWD, a vendor's own) stays out.
# TERM and TMPDIR are set anew below and by the sandbox; listed so `--sandbox off` keeps them.
_ALLOWED_ENV = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TERM", "TMPDIR", "TZ"})
_LOCALE_PREFIX = "LC_"  # LC_ALL, LC_CTYPE, ...


def command_env(
    parent: Mapping[str, str],
    *,
    run_id: str,
    call_id: str,
    passthrough: Iterable[str] = (),
) -> dict[str, str]:
    """The environment for a command (or an MCP server): of `parent`, only PATH, HOME, TERM,
    TMPDIR, TZ, the locale (LANG, LANGUAGE, LC_*) and what `passthrough` (the `command_env`
    setting) names, made non-interactive, plus the run and call ids (so a command, or a
    resume, can tell whose it is).

    A `passthrough` entry is a name, or a pattern such as `GIT_*`. A pattern passes no
    credential-named variable (`redact.is_secret_name`: MYSQL_PWD, *TOKEN*...), none holding
    a URL with a password, and none of the harness's own `DURABLE_AGENT_*` knobs (its
    database, config, crash switch: a `durable-agent` or test suite the command runs must
    not act on them); only a name given exactly passes those."""
    env = {
        name: value
        for name, value in parent.items()
        if name in _ALLOWED_ENV
        # LC_ is a prefix anyone may use (ssh forwards LC_* as it is): a credential-named
        # one (LC_API_KEY) is no locale
        or (name.startswith(_LOCALE_PREFIX) and not is_secret_name(name))
    }
    names = [p for p in passthrough if p]
    if names:
        exact = {p for p in names if not _is_pattern(p)}
        patterns = [p for p in names if _is_pattern(p)]
        for name, value in parent.items():
            if name in exact or (
                patterns
                and any(fnmatchcase(name, p) for p in patterns)
                and not is_secret_name(name)
                and not has_url_password(value)
                and name not in _DROPPED_ENV
                and not name.startswith("DURABLE_AGENT_")
            ):
                env[name] = value
    env.update(_NON_INTERACTIVE_ENV)
    env["DURABLE_AGENT_RUN_ID"] = run_id
    env["DURABLE_AGENT_CALL_ID"] = call_id
    return env


def _is_pattern(entry: str) -> bool:
    return any(c in entry for c in "*?[")


def has_url_password(value: str) -> bool:
    """`postgresql://user:pw@host/db` in DATABASE_URL-like variables."""
    scheme_end = value.find("://")
    if scheme_end < 0:
        return False
    authority = value[scheme_end + 3 :].split("/", 1)[0]
    return "@" in authority and ":" in authority.rsplit("@", 1)[0]


class StartTooLate(Exception):
    """The command was not started: the go came after the deadline `on_start` gave (the
    harness stalled past the point where its lease surely held). Nothing of it ran."""

    def __init__(self, deadline: float) -> None:
        super().__init__(
            f"the command was not started: {_boottime() - deadline:.1f} s past its start deadline"
        )


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def run_process(
    command: str,
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    output_cap: int = 30_000,
    on_start: Callable[[int], float | None] | None = None,
    cancel: threading.Event | None = None,
    kill_grace_s: float = KILL_GRACE_S,
    sandbox: Sandbox | None,
    workspace: Path | None = None,
    private: bool = False,
) -> ProcessOutcome:
    """Run `command` with the shell in `cwd` under exactly `env`, stdin from /dev/null.

    `sandbox` contains it (os_sandbox.py) with `workspace` (default: `cwd`) as the only
    writable tree. It has no default, so that no caller (a custom exec tool passes
    `ctx.sandbox`) runs a command unconfined by forgetting it: None says so on purpose.
    Output of each stream is capped at `output_cap` characters (head and tail kept).
    Raises OSError if the command cannot be started (e.g. `cwd` does not exist),
    SandboxUnavailable if its sandbox cannot be had, whatever `on_start` raises, and
    StartTooLate if the time `on_start` returned (CLOCK_BOOTTIME) passed before the command
    could start; in all these cases the command has not run. `private`: the command goes to
    the shell in a sealed file whatever its length, never on a command line other users of
    the host can read (`ps`).
    """
    line = os.fsencode(command)
    if b"\0" in line:  # exec cannot carry it, and bash takes a file holding one for a binary
        raise ToolFailure(
            "the command holds a NUL byte, which no shell command line can carry "
            "(write such bytes to a file with write_file)"
        )
    shell = default_shell()
    launch = prepare(sandbox, [shell, "-c", command], cwd=cwd, workspace=workspace or cwd, env=env)
    script: int | None = None
    try:
        assert launch.argv[-3:] == [shell, "-c", command]  # prepare wraps the program: the tail
        argv, script = fitted(
            launch.argv,
            launch.env,
            line,
            guard=_guard_argv(2**31 - 1, 2**31 - 1),
            mounts=sandbox is not None and sandbox.mechanism is Mechanism.BUBBLEWRAP,
            always=private,
        )
        outcome = _run(
            argv,
            cwd=cwd,
            env=launch.env,
            timeout_s=timeout_s,
            output_cap=output_cap,
            on_start=on_start,
            cancel=cancel,
            kill_grace_s=kill_grace_s,
            pass_fds=() if script is None else (script,),
        )
    finally:
        if script is not None:
            os.close(script)
        launch.cleanup()
    notes = launch.notes()
    return replace(outcome, notes=tuple(notes)) if notes else outcome


def _guard_argv(watch_fd: int, status_fd: int) -> list[str]:
    # -I -S: the guard must not be affected by the command's PYTHON* variables, and should
    # start fast.
    return [sys.executable, "-I", "-S", str(GUARD_SCRIPT), str(watch_fd), str(status_fd)]


def _run(
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    output_cap: int,
    on_start: Callable[[int], float | None] | None,
    cancel: threading.Event | None,
    kill_grace_s: float,
    pass_fds: tuple[int, ...] = (),
) -> ProcessOutcome:
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if not sys.executable:
        raise RuntimeError("cannot locate the Python interpreter to run the process guard")
    watch_r, watch_w = map(above_stdio, os.pipe())
    status_r, status_w = map(above_stdio, os.pipe())
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            [*_guard_argv(watch_r, status_w), *argv],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
            pass_fds=(watch_r, status_w, *pass_fds),
        )
    except BaseException:
        os.close(watch_w)
        os.close(status_r)
        raise
    finally:
        # Our copies of the guard's ends: status EOF must mean the guard is gone.
        os.close(watch_r)
        os.close(status_w)

    pgid = proc.pid
    watch = _Supervision(proc, status_r, output_cap)
    try:
        given = on_start(pgid) if on_start is not None else None
        # Only a float is a deadline: a hook written before hooks returned one may return
        # anything (a count of bytes written...), which must not stop its commands.
        deadline = given if isinstance(given, float) else None
        if cancel is not None and cancel.is_set():
            watch.cancelled = True  # cancelled before it began: it never runs
        else:
            # The guard starts the command only now, and only by `deadline` (a process frozen
            # since recording the pgid may have lost its run): checked here and, for a freeze
            # in between, by the guard itself.
            if deadline is not None and _boottime() > deadline:
                raise StartTooLate(deadline)
            os.write(watch_w, b"g %.6f\n" % deadline if deadline is not None else b"g -\n")
            watch.run(started + timeout_s, cancel, kill_grace_s)
            if watch.late() and deadline is not None:
                raise StartTooLate(deadline)
    finally:
        # Also on exceptions (KeyboardInterrupt included): nothing of the group may survive
        # this call. Killed before the guard is reaped, so the pgid cannot have been reused.
        _signal_group(pgid, signal.SIGKILL)
        proc.wait()
        os.close(watch_w)
        watch.close()
        # SIGKILL is delivered asynchronously: wait until the last member has died, so a
        # caller never sees a "finished" command whose processes are still running.
        if _group_exists(pgid):
            _wait_until_gone(pgid, _DIE_WAIT_S)

    return ProcessOutcome(
        exit_code=None if watch.timed_out or watch.cancelled else watch.exit_code(),
        stdout=watch.stdout.text(),
        stderr=watch.stderr.text(),
        timed_out=watch.timed_out,
        cancelled=watch.cancelled,
        duration_ms=int((time.monotonic() - started) * 1000),
        pgid=pgid,
        stdout_bytes=watch.stdout.total,
        stderr_bytes=watch.stderr.total,
    )


class _Capture:
    """One output stream: counts every byte, keeps only a bounded head and tail, so a
    command printing gigabytes costs neither memory nor disk."""

    def __init__(self, cap_chars: int) -> None:
        self.cap = max(cap_chars, 0)
        self._keep = 4 * self.cap  # bytes: enough for cap_chars of any UTF-8
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self._keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self._keep:
                del self.tail[: len(self.tail) - self._keep]

    def text(self) -> str:
        dropped = self.total - len(self.head) - len(self.tail)
        if dropped == 0:
            full = decode_text(bytes(self.head + self.tail))[0]
            if len(full) <= self.cap:
                return full
            head_text, tail_text = full, full
        else:
            head_text, tail_text = (decode_text(bytes(part))[0] for part in (self.head, self.tail))
        return truncate_middle(head_text, tail_text, self.total, self.cap)


def truncate_middle(head_text: str, tail_text: str, total_bytes: int, cap: int) -> str:
    """The start of `head_text` and the end of `tail_text` within `cap` characters in all,
    with a marker saying how many of `total_bytes` were left out."""
    # Size the marker with the largest number it can show, so the result never exceeds cap.
    budget = max(cap - len(_marker(total_bytes, total_bytes)), 0)
    head = head_text[: budget // 2]
    tail_len = budget - len(head)
    tail = tail_text[max(len(tail_text) - tail_len, 0) :] if tail_len > 0 else ""
    kept = len(head.encode()) + len(tail.encode())
    return head + _marker(max(total_bytes - kept, 0), total_bytes) + tail


def _marker(omitted: int, total: int) -> str:
    return f"\n[... truncated {omitted} of {total} bytes ...]\n"


class _Supervision:
    """Reads the guard's stdout, stderr and status pipes in one thread (no deadlock on
    large outputs, no reader threads), and enforces the deadline and the cancel event."""

    def __init__(self, proc: subprocess.Popen[bytes], status_fd: int, cap: int) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.pgid = proc.pid
        self.stdout = _Capture(cap)
        self.stderr = _Capture(cap)
        self.status = bytearray()
        self.timed_out = False
        self.cancelled = False
        self._status_fd = status_fd
        self._guard_gone_at: float | None = None
        self._selector = selectors.DefaultSelector()
        self._selector.register(proc.stdout, selectors.EVENT_READ, self.stdout)
        self._selector.register(proc.stderr, selectors.EVENT_READ, self.stderr)
        self._selector.register(status_fd, selectors.EVENT_READ, None)
        self._files = (proc.stdout, proc.stderr)

    def run(self, deadline: float, cancel: threading.Event | None, grace_s: float) -> None:
        escalate_at: float | None = None  # when SIGTERM turns into SIGKILL
        while self._selector.get_map():
            now = time.monotonic()
            if self._guard_gone_at is not None and now >= self._guard_gone_at + _DRAIN_S:
                break  # someone left the group but kept our pipes: stop reading
            if escalate_at is None:
                cancelled = cancel is not None and cancel.is_set()
                if cancelled or now >= deadline:
                    # Racing a command that just ended by itself: it keeps its exit code.
                    if not self._finished():
                        self.cancelled, self.timed_out = cancelled, not cancelled
                    _signal_group(self.pgid, signal.SIGTERM)
                    escalate_at = now + grace_s
            elif now >= escalate_at:
                _signal_group(self.pgid, signal.SIGKILL)
                escalate_at = math.inf
            wakeups = [escalate_at if escalate_at is not None else deadline]
            if escalate_at is None and cancel is not None:
                wakeups.append(now + _POLL_S)
            if self._guard_gone_at is not None:
                wakeups.append(self._guard_gone_at + _DRAIN_S)
            wait = min(wakeups) - now
            for key, _ in self._selector.select(None if wait == math.inf else max(wait, 0.0)):
                self._read(key)

    def _finished(self) -> bool:
        """The command has ended by itself (its status is in) or the guard is gone."""
        return b"\n" in self.status or self._guard_gone_at is not None

    def _read(self, key: selectors.SelectorKey) -> None:
        data = os.read(key.fd, _READ_CHUNK)
        if not data:
            self._selector.unregister(key.fileobj)
            if key.fd == self._status_fd:
                self._guard_gone_at = time.monotonic()
        elif key.data is None:
            self.status += data
        else:
            key.data.feed(data)

    def late(self) -> bool:
        """The guard did not start the command: the go came after its deadline."""
        return bytes(self.status).startswith(b"late\n")

    def exit_code(self) -> int | None:
        line = bytes(self.status).split(b"\n", 1)[0]
        if line.startswith(b"exit "):
            try:
                return int(line[5:])
            except ValueError:
                return None
        return None  # the guard was killed before the command ended

    def close(self) -> None:
        self._selector.close()
        for f in self._files:
            f.close()
        os.close(self._status_fd)
