"""Paths beneath a directory handle: every harness file operation on a workspace goes
through a directory fd held on the workspace and never follows a symlink on the way.

A check of a path by name ("is it inside the workspace?") and the open by name that follows
are two lookups: a process that outlives its call (an MCP server's child, a second run's
command) can swap a folder for a link to outside between them, and the harness, which runs
unsandboxed, would read or write there. So a path is opened *relative to the workspace's
fd* with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` where the kernel has it (Linux
5.6), else one component at a time with `O_NOFOLLOW | O_DIRECTORY` from the held fd; names
are then created, renamed and removed relative to the final folder's fd. A link anywhere in
the path is refused (`Escaped`), whatever it points at: the callers resolve links inside
the workspace by name first (tools/sandbox.resolve) and open the resolved path here, so a
link that appeared since is the race, not the user's layout.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import secrets
import stat
from collections.abc import Iterator

PathArg = str | bytes

_NR_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class Escaped(OSError):
    """The path leads through a symlink, or out of the directory: refused, not followed."""


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


def _load_openat2() -> object | None:
    """libc's syscall() if openat2 works here (the kernel has it and no seccomp filter
    refuses it), else None: the component walk is used."""
    if _NR_OPENAT2 is None or os.environ.get("DURABLE_AGENT_NO_OPENAT2"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    how = _OpenHow(os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, 0, _RESOLVE_BENEATH)
    fd = syscall(
        ctypes.c_long(_NR_OPENAT2),
        ctypes.c_int(-100),  # AT_FDCWD
        ctypes.c_char_p(b"."),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:  # ENOSYS (an older kernel), EPERM (seccomp): walk instead
        return None
    os.close(fd)
    return syscall


_syscall = _load_openat2()


def has_openat2() -> bool:
    return _syscall is not None


def _parts(rel: PathArg) -> list[str]:
    """The components of a relative path (str, undecodable bytes as surrogates, as os
    hands names out); `..` or an absolute path is an escape."""
    raw = os.fsdecode(rel)
    if raw.startswith("/"):
        raise Escaped(errno.EXDEV, "an absolute path is not beneath the workspace", raw)
    parts = [p for p in raw.split("/") if p and p != "."]
    if ".." in parts:
        raise Escaped(errno.EXDEV, "a path with '..' is not beneath the workspace", raw)
    return parts


def _openat2(dir_fd: int, rel: bytes, flags: int, mode: int) -> int:
    how = _OpenHow(
        flags | os.O_CLOEXEC,
        mode if flags & os.O_CREAT else 0,  # (openat2 refuses a mode without O_CREAT)
        _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS,
    )
    assert _syscall is not None and _NR_OPENAT2 is not None
    for _ in range(100):  # EAGAIN: a rename elsewhere on the system raced the lookup; again
        fd = _syscall(  # type: ignore[operator]
            ctypes.c_long(_NR_OPENAT2),
            ctypes.c_int(dir_fd),
            ctypes.c_char_p(rel),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err == errno.EINTR or err == errno.EAGAIN:
            continue
        if err in (errno.ELOOP, errno.EXDEV):
            raise Escaped(err, "a symlink in the path (not followed)", rel)
        raise OSError(err, os.strerror(err), rel)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), rel)


def _step(dir_fd: int, name: str, flags: int, mode: int = 0o666) -> int:
    """Open one component under `dir_fd` without following a link; a link is `Escaped`."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        # O_NOFOLLOW gives ELOOP for a link (whatever it is by now), or ENOTDIR when
        # O_DIRECTORY is asked as well.
        if exc.errno == errno.ELOOP or (
            exc.errno in (errno.ENOTDIR, errno.ENXIO) and _is_link(dir_fd, name)
        ):
            raise Escaped(errno.ELOOP, "a symlink in the path (not followed)", name) from None
        raise


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_at(dir_fd: int, rel: PathArg, flags: int, mode: int = 0o666) -> int:
    """An fd for `rel` beneath `dir_fd` (any open flags), no link followed on the way.
    `rel` "" or "." is the folder itself (opened again with `flags`). The last name is
    opened with os.open under its folder's fd (O_NOFOLLOW), so an error names it as usual."""
    parts = _parts(rel)
    if not parts:
        return os.open(".", flags | os.O_CLOEXEC, dir_fd=dir_fd)
    with open_dir(dir_fd, "/".join(parts[:-1])) as parent:
        return _step(parent, parts[-1], flags, mode)


@contextlib.contextmanager
def open_dir(dir_fd: int, rel: PathArg, *, create: bool = False) -> Iterator[int]:
    """The folder `rel` beneath `dir_fd`, open for the block (closed after). With `create`,
    missing folders are made on the way (mkdirat under the fd just opened)."""
    fd = _dir_fd(dir_fd, _parts(rel), create)
    try:
        yield fd
    finally:
        os.close(fd)


def _dir_fd(dir_fd: int, parts: list[str], create: bool) -> int:
    if _syscall is not None and not create:
        return _openat2(dir_fd, os.fsencode("/".join(parts) or "."), _DIR_FLAGS, 0)
    fd = os.open(".", _DIR_FLAGS, dir_fd=dir_fd)
    try:
        for part in parts:
            try:
                nxt = _step(fd, part, _DIR_FLAGS)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # made meanwhile: opened below
                    os.mkdir(part, 0o777, dir_fd=fd)
                nxt = _step(fd, part, _DIR_FLAGS)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def parent_of(dir_fd: int, rel: PathArg, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """(fd of the folder that holds `rel`, the last name): for mkdirat, renameat,
    unlinkat, symlinkat relative to it."""
    parts = _parts(rel)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "the workspace itself", os.fsdecode(rel))
    with open_dir(dir_fd, "/".join(parts[:-1]), create=create) as fd:
        yield fd, parts[-1]


@contextlib.contextmanager
def root(path: PathArg) -> Iterator[int]:
    """The workspace's own folder, held for the block. The workspace path itself is the
    user's (not something a command can change), so it is opened by name."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        yield fd
    finally:
        os.close(fd)


def relative_to(root_path: PathArg, path: PathArg) -> str:
    """`path` (under `root_path` by name) as a path relative to it; Escaped if it is not."""
    base = os.fsdecode(root_path).rstrip("/") or "/"
    raw = os.fsdecode(path)
    if raw == base:
        return "."
    if base == "/":
        return raw.lstrip("/") or "."
    if not raw.startswith(base + "/"):
        raise Escaped(errno.EXDEV, "not beneath the workspace", raw)
    return raw[len(base) + 1 :]


def temp_name(name: str, prefix: str = ".da-") -> str:
    """A fresh name beside `name` for a file to be renamed over it."""
    return f".{name}{prefix}{secrets.token_hex(6)}.tmp"


def create_exclusive(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """A new file under `dir_fd`, never an existing one nor through a link (O_EXCL)."""
    return os.open(
        name,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        mode,
        dir_fd=dir_fd,
    )


def chmod_at(dir_fd: int, name: str, mode: int) -> None:
    """chmod a file or folder named under `dir_fd`, never through a link: Linux has no
    lchmod, so the inode is pinned with O_PATH | O_NOFOLLOW and changed through /proc."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise Escaped(errno.ELOOP, "not a file or folder (not changed)", name)
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def remove_at(dir_fd: int, name: str) -> None:
    """Remove `name` under `dir_fd` (a folder with all in it, fd-relative: rmtree's safe
    walk never follows a link); nothing if it is not there."""
    import shutil

    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)
