"""Bytes handed to a child through a file descriptor instead of its command line.

The kernel caps what exec takes: one argument at 128 KiB (MAX_ARG_STRLEN), and all of them
with the environment at a quarter of the stack limit (`exec_limit`, at most 6 MiB); past
either, exec fails with E2BIG ("Argument list too long") and the command never runs, yet a model's
command can be a 300 KiB heredoc. Such a command goes into a sealed memfd instead: the shell
reads it from the start, and nothing (the command included) can change it once the harness
has written it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import resource
from collections.abc import Mapping, Sequence

from durable_agent.tools.base import ToolFailure

MAX_ARGUMENT = 32 * 4096 - 1
"""The longest single argument exec takes: MAX_ARG_STRLEN (32 pages) less its closing NUL."""

_MOST = 6 << 20  # exec's limit however large the stack (_STK_LIM / 4 * 3)
_MARGIN = 4096  # for what the kernel's count has and ours might not; sealing costs nothing
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_MFD_NOEXEC_SEAL = (
    0x0008  # Linux 6.3 (not in Python 3.11's os): where vm.memfd_noexec=2 asks for it
)


def sealed(data: bytes, name: str) -> int:
    """A file descriptor holding `data`, read from its start, that no one can write again.
    Never 0, 1 or 2 (a harness started with those closed would get one back, and a child's
    stdin or stdout would then replace it). Non-inheritable, as Python makes every
    descriptor: pass it to the child with `pass_fds`. The caller closes it."""
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    try:
        first = os.memfd_create(name, flags | _MFD_NOEXEC_SEAL)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # a kernel older than 6.3 does not know the flag
            raise
        first = os.memfd_create(name, flags)
    fd = above_stdio(first)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def above_stdio(fd: int) -> int:
    """`fd` moved to 3 or above (and closed where it was): a descriptor handed to a child must
    not be 0, 1 or 2, which a harness started with those closed gives out first and which the
    child's stdin, stdout and stderr then replace."""
    if fd > 2:
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def exec_limit() -> int:
    """The bytes exec takes for argument and environment strings with their pointers
    (fs/exec.c): a quarter of the stack limit, at most 6 MiB. (The kernel lets 128 KiB
    through on a smaller stack, but the program then has no stack left to start on.)"""
    stack, _hard = resource.getrlimit(resource.RLIMIT_STACK)
    return _MOST if stack == resource.RLIM_INFINITY else min(stack // 4, _MOST)


def exec_size(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """What starting `argv` with `env` takes of `exec_limit`: each string with its NUL and its
    pointer, the program's path that the kernel copies too, and a margin."""
    strings = [argv[0], *argv, *(f"{name}={value}" for name, value in env.items())]
    return sum(len(os.fsencode(s)) + 1 + 8 for s in strings) + 8 + _MARGIN


def fitted(
    argv: list[str],
    env: Mapping[str, str],
    command: bytes,
    *,
    guard: Sequence[str],
    mounts: bool,
    always: bool = False,
) -> tuple[list[str], int | None]:
    """`argv` (ending `SHELL -c COMMAND`, started behind `guard`'s arguments) as it can start,
    and the descriptor to pass along (the caller closes it): the command in a sealed file
    when it is too long for exec, read by the shell byte for byte. Only `$0` (/dev/fd/N), an
    empty $BASH_EXECUTION_STRING, a last command killed by a signal (exit 128+N: bash no
    longer execs it in its place) and the descriptor its processes inherit (read-only) tell
    the two apart. ToolFailure, in one line, when even that cannot start. `always`: in a
    sealed file whatever its length."""
    for name, value in env.items():
        if len(os.fsencode(f"{name}={value}")) > MAX_ARGUMENT:
            raise ToolFailure(
                f"cannot start the command: the environment variable {name} is longer "
                f"than one string may be ({MAX_ARGUMENT} bytes)"
            )
    limit, script = exec_limit(), None
    if always or len(command) > MAX_ARGUMENT or exec_size([*guard, *argv], env) > limit:
        script = sealed(command, "durable-agent-command")
        argv = [*argv[:-2], f"/dev/fd/{script}"]
    size = exec_size([*guard, *argv], env)
    if size > limit:
        if script is not None:
            os.close(script)
        raise ToolFailure(
            f"cannot start the command: the environment{' and the sandbox mounts' if mounts else ''} "
            f"take {size} bytes of the {limit} that starting a program allows"
            + (" (`ulimit -s` raises it)" if limit < _MOST else "")
        )
    return argv, script
