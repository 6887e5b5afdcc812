"""Landlock launcher (the fallback when bubblewrap is not usable). Run by os_sandbox.py as

    python -I -S _landlock.py MODE WORKSPACE TMPDIR NETWORK -- ARGV...

It restricts itself and then execs ARGV, so the command and everything it forks inherit
the rules (Landlock domains are inherited and can only be narrowed). Only writes are
handled: reading stays allowed everywhere, as under bubblewrap's `--ro-bind / /`.
Writable: the workspace (unless MODE is read-only), TMPDIR (a private directory the
harness removes afterwards) and the character devices commands write to (/dev/null...).
With ABI >= 4 and NETWORK off, TCP bind and connect are denied; with ABI >= 6 the command
cannot signal processes outside its domain. Landlock also denies ptrace-class access
(reading `/proc/<pid>/environ`, `/proc/<pid>/mem`) to processes outside the domain.

Only the standard library: this starts on every command. A failure to restrict is fatal
(exit 126 with a message): never exec the command unconfined.
"""

import ctypes
import os
import signal
import struct
import sys

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# LANDLOCK_ACCESS_FS_* bits, with the ABI that introduced them.
_WRITE_FILE, _REMOVE_DIR, _REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
_MAKE_CHAR, _MAKE_DIR, _MAKE_REG, _MAKE_SOCK = 1 << 6, 1 << 7, 1 << 8, 1 << 9
_MAKE_FIFO, _MAKE_BLOCK, _MAKE_SYM = 1 << 10, 1 << 11, 1 << 12
_REFER = 1 << 13  # ABI 2
_TRUNCATE = 1 << 14  # ABI 3
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty")


def _fail(message: str) -> None:
    os.write(2, f"durable-agent: Landlock sandbox: {message}; the command was not run\n".encode())
    os._exit(126)


def main(argv: list[str]) -> None:
    mode, workspace, tmpdir, network = argv[1:5]
    if argv[5] != "--" or len(argv) < 7:
        _fail("bad arguments")
    command = argv[6:]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_CREATE_RULESET, None, 0, 1)
    if abi < 1:
        _fail("the kernel has no Landlock")

    write_dir = (
        _WRITE_FILE
        | _REMOVE_DIR
        | _REMOVE_FILE
        | _MAKE_CHAR
        | _MAKE_DIR
        | _MAKE_REG
        | _MAKE_SOCK
        | _MAKE_FIFO
        | _MAKE_BLOCK
        | _MAKE_SYM
    )
    write_file = _WRITE_FILE
    if abi >= 2:
        write_dir |= _REFER
    if abi >= 3:
        write_dir |= _TRUNCATE
        write_file |= _TRUNCATE
    handled_net = 0 if network == "on" or abi < 4 else _NET_BIND_TCP | _NET_CONNECT_TCP
    scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL if abi >= 6 else 0
    # struct landlock_ruleset_attr grew with the ABI: pass only the fields this kernel knows.
    if abi >= 6:
        attr = struct.pack("=QQQ", write_dir, handled_net, scoped)
    elif abi >= 4:
        attr = struct.pack("=QQ", write_dir, handled_net)
    else:
        attr = struct.pack("=Q", write_dir)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(_SYS_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), 0)
    if ruleset < 0:
        _fail(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")

    rules = [(tmpdir, write_dir)] + [(d, write_file) for d in _DEVICES if os.path.exists(d)]
    if mode == "workspace-write":
        rules.append((workspace, write_dir))
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError as exc:
            if path in _DEVICES:
                continue
            _fail(f"cannot open {path}: {exc.strerror}")
        # struct landlock_path_beneath_attr is packed: u64 allowed_access, s32 parent_fd.
        rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
        if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, 0) < 0:
            _fail(f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}")
        os.close(fd)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail(f"prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) < 0:
        _fail(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    os.close(ruleset)
    # Python ignores SIGPIPE and SIGXFSZ, and ignored signals survive exec (`yes | head`).
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execv(command[0], command)
    except OSError as exc:
        _fail(f"cannot start {command[0]}: {exc.strerror}")


if __name__ == "__main__":
    main(sys.argv)
