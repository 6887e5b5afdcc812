"""Bytes handed to a child through a file descriptor instead of its command line.

The kernel caps one argument at 128 KiB (MAX_ARG_STRLEN): past it, exec fails with E2BIG
("Argument list too long") and the command never runs, yet a model's command can be a
300 KiB heredoc. Such a command goes into a sealed memfd instead: the shell reads it from
the start, and nothing (the command included) can change it once the harness has written it.
"""

from __future__ import annotations

import fcntl
import os

MAX_ARGUMENT = 32 * 4096 - 1
"""The longest single argument exec takes: MAX_ARG_STRLEN (32 pages) less its closing NUL."""

_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def sealed(data: bytes, name: str) -> int:
    """A file descriptor holding `data`, read from its start, that no one can write again.
    Non-inheritable, as Python makes every descriptor: pass it to the child with `pass_fds`.
    The caller closes it."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
