"""The guard between the harness and one shell command (Linux). Run by `process.py` as

    python -I -S _guard.py WATCH_FD STATUS_FD ARGV...

ARGV is the shell and its command line (`/bin/bash -c COMMAND`), or that wrapped by the
sandbox (`bwrap ... -- /bin/bash -c COMMAND`, see os_sandbox.py).

It is started in a new session, so it leads the process group that the command and
everything the command forks belong to (pgid == the guard's pid, known at spawn time).

Why a guard process and a pipe, and not only `prctl(PR_SET_PDEATHSIG)` on the command:

- PDEATHSIG fires when the *thread* that forked the child exits, not the process; a
  harness that runs commands from worker threads could kill a command mid-run;
- it only signals the direct child; grandchildren (`sleep 100 &`) are not told;
- it is cleared when the child execs a set-uid binary (`sudo`, `ping` on some systems).

The pipe is the kernel's own, process-wide "the harness is gone" signal: the harness
holds the only write end (close-on-exec, never inherited), so `read` on WATCH_FD
returns EOF exactly when the harness process has died, however it died (SIGKILL, OOM).
The guard then SIGKILLs its whole process group, itself included.

Protocol: the harness writes the line `g DEADLINE` to WATCH_FD once it has recorded the
pgid; only then does the command start, so an effect never begins before its pgid is
durable. DEADLINE (CLOCK_BOOTTIME seconds, or `-`) is when the harness's lease on the run
may be over: a harness stalled between recording the pgid and writing the line (SIGSTOP, a
cgroup freeze) may have lost the run to another host by then, and the guard answers `late`
instead of starting the command.
When the command's shell exits, the guard writes `exit N` (N as in
`os.waitstatus_to_exitcode`: negative for a signal) to STATUS_FD and SIGKILLs the group,
so background leftovers (`server &`) never outlive the call unsupervised.

Only the standard library, and as little of it as possible: this starts on every call.
A command that leaves the group on purpose (`setsid`, double-forking daemons) escapes it.
"""

import os
import signal
import sys
import threading
import time


def _kill_group() -> None:
    os.killpg(0, signal.SIGKILL)  # the whole group, this guard included


def _watch_harness(fd: int) -> None:
    try:
        while os.read(fd, 64):  # the harness never writes after the go line: this waits for EOF
            pass
    except OSError:
        pass
    _kill_group()


def _in_time(deadline: bytes) -> bool:
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME) <= float(deadline)  # nan: never in time
    except ValueError:
        return False


def main(argv: list[str]) -> int:
    watch_fd, status_fd = int(argv[1]), int(argv[2])
    program = argv[3:]
    shell = program[0]
    # The command must not hold these: a copy of STATUS_FD would delay the harness's EOF.
    os.set_inheritable(watch_fd, False)
    os.set_inheritable(status_fd, False)
    # The harness's timeout/cancel SIGTERM goes to the whole group. The guard survives it,
    # so that it still kills the group if the harness dies during the grace period.
    # (The command gets SIGTERM's default back through `setsigdef`.)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    go = b""
    while b"\n" not in go:  # the harness writes nothing after this line
        chunk = os.read(watch_fd, 64)
        if not chunk or len(go) > 64:
            return 0  # the harness died or gave up before the effect began: never start it
        go += chunk
    word, _, deadline = go.split(b"\n", 1)[0].partition(b" ")
    if word != b"g":
        return 0
    if deadline != b"-" and not _in_time(deadline):
        os.write(status_fd, b"late\n")
        return 0
    threading.Thread(target=_watch_harness, args=(watch_fd,), daemon=True).start()
    try:
        pid = os.posix_spawn(
            shell,
            program,
            os.environ,
            # Python ignores SIGPIPE and SIGXFSZ, and ignored signals survive exec: the
            # command must start with the defaults, as from a terminal (`yes | head`).
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT),
            setsigmask=(),
        )
    except OSError as exc:
        os.write(2, f"durable-agent: cannot start {shell}: {exc}\n".encode())
        os.write(status_fd, b"exit 127\n")
        _kill_group()
        return 127  # not reached
    try:
        _, wait_status = os.waitpid(pid, 0)
        os.write(status_fd, f"exit {os.waitstatus_to_exitcode(wait_status)}\n".encode())
    finally:
        # Even if the write fails (the harness died a moment ago): leftovers must go.
        _kill_group()
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
