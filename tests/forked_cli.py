"""The CLI as a real process without paying its imports each time.

Most tests drive `python -m durable_agent ...` to its end, thousands of times per suite, and
each process spent most of its CPU importing the package, SQLAlchemy and pydantic again. A
zygote process (one per test process) imports them once; each command then runs in a
process forked from it: its own pid, file descriptors, working directory, environment and
exit status (a SIGKILL it sends itself is its status, as for any process), only without the
imports. What a fresh process would take from the test at the call is given to it: stdio
descriptors, environment, working directory, umask, resource limits, `sys.argv`, a random
seed. On the way out it does what the interpreter does that a command can see: threads
joined, atexit handlers run, SQLite connections closed (the WAL folded into the file),
files flushed.

What the zygote cannot be, `run` leaves to a plain subprocess: another interpreter, an
environment whose Python or locale variables differ from the zygote's (they shape start-up
itself), or DURABLE_AGENT_TEST_FORK=0 (the whole suite then runs without it).

Commands a test must signal or kill from outside while they run use `subprocess.Popen`
directly, as before.
"""

from __future__ import annotations

import io
import json
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Variables read while the interpreter starts (encodings, paths, flags): a child forked from
# the zygote keeps the zygote's values, so a command whose environment changes one of them
# runs as a plain subprocess.
_STARTUP_PREFIXES = ("PYTHON", "LC_", "LANG", "VIRTUAL_ENV")
_PRELOAD = (
    "durable_agent.cli.parser",
    "durable_agent.cli.commands",
    "durable_agent.wiring",
    "durable_agent.config.settings",
    "durable_agent.loop.runner",
    "durable_agent.store.engine",
    "durable_agent.store.runs",
    "durable_agent.cli.read_commands",
    "durable_agent.cli.render",
    "durable_agent.cli.ws_commands",
    "durable_agent.models.openai_model",
    "durable_agent.worker",
    "sqlalchemy.dialects.sqlite",
    "alembic.command",
    "alembic.config",
    "alembic.runtime.migration",
    "openai",
    "psycopg",
)


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_PREFIXES)}


_BASE_ENV = dict(os.environ)  # as this test process started, before any test changed it


class _Zygote:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="da-zygote-")
        self.path = os.path.join(self.dir, "sock")
        self.env = _BASE_ENV
        # stdin is the zygote's lifeline: when this process ends, it reads EOF and exits.
        self.proc = subprocess.Popen(
            [sys.executable, __file__, self.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
            cwd=self.dir,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if ready != b"ready\n":
            raise RuntimeError(f"the CLI zygote did not start: {ready!r}")


_zygote: _Zygote | None = None
_lock = threading.Lock()


def _get() -> _Zygote:
    global _zygote
    with _lock:
        if _zygote is None or _zygote.proc.poll() is not None:
            _zygote = _Zygote()
        return _zygote


# Inherited by a fresh process from the test process as it is at the call.
_LIMITS = (
    resource.RLIMIT_NOFILE,
    resource.RLIMIT_NPROC,
    resource.RLIMIT_FSIZE,
    resource.RLIMIT_AS,
    resource.RLIMIT_CPU,
    resource.RLIMIT_CORE,
    resource.RLIMIT_STACK,
)


def _umask() -> int:
    with _lock:  # (reading it means setting it)
        mask = os.umask(0o22)
        os.umask(mask)
    return mask


def usable(env: Mapping[str, str]) -> bool:
    if os.environ.get("DURABLE_AGENT_TEST_FORK", "1") == "0":
        return False
    return _startup_env(env) == _startup_env(_BASE_ENV)


def run(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path | str,
    timeout: float = 120,
    input: str | None = None,
    text: bool = True,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run([sys.executable, "-m", "durable_agent", *args], capture_output=True,
    text=text, stdin=DEVNULL or `input`)`, in a forked process when it can be (text=False:
    the output's bytes as they were written)."""
    argv = [sys.executable, "-m", "durable_agent", *args]
    if not usable(env):
        kwargs: dict[str, Any] = (
            {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
        )
        return subprocess.run(
            argv, cwd=cwd, env=dict(env), capture_output=True, text=text, timeout=timeout, **kwargs
        )
    if not os.path.isdir(cwd):
        raise FileNotFoundError(
            2, "No such file or directory", str(cwd)
        )  # as subprocess.run raises it
    zygote = _get()
    with (
        tempfile.TemporaryFile() as stdin,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        if input is not None:
            stdin.write(input.encode())
            stdin.seek(0)
        request = json.dumps(
            {
                "args": list(args),
                "env": dict(env),
                "cwd": str(cwd),
                "umask": _umask(),
                "limits": {str(r): resource.getrlimit(r) for r in _LIMITS},
            }
        ).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(zygote.path)
            socket.send_fds(
                sock,
                [len(request).to_bytes(8, "big") + request],
                [stdin.fileno(), out.fileno(), err.fileno()],
            )
            answers = sock.makefile("rb")
            pid = json.loads(answers.readline())["pid"]
            deadline = time.monotonic() + timeout
            timed_out = False
            while not select.select([sock], [], [], max(0.0, deadline - time.monotonic()))[0]:
                os.kill(pid, signal.SIGKILL)  # as subprocess.run does on a timeout
                timed_out = True
                deadline = time.monotonic() + 30
            line = answers.readline()
            if not line:
                raise RuntimeError(f"the CLI zygote lost the command {list(args)}")
            code = json.loads(line)["code"]
        out.seek(0)
        err.seek(0)
        stdout: Any
        stderr: Any
        if text:  # as text=True decodes: locale encoding, universal newlines
            stdout, stderr = io.TextIOWrapper(out).read(), io.TextIOWrapper(err).read()
        else:
            stdout, stderr = out.read(), err.read()
    if timed_out:
        raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


# -- the zygote ---------------------------------------------------------------------------------
Job = tuple[dict[str, Any], list[int]]


def _serve(path: str) -> Job | None:
    """Import, then fork a handler per command. Returns only in a command's own process,
    with its request: the interpreter then runs it at top level and ends as any process does."""
    import contextlib
    import importlib

    for name in _PRELOAD:
        with contextlib.suppress(
            ImportError
        ):  # an optional extra not installed: its commands import it
            importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        ready = select.select([listener, sys.stdin], [], [], 1.0)[0]
        _reap()
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            listener.close()
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
            return None  # the test process is gone
        if listener in ready:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                return _handle(conn)
            conn.close()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _handle(conn: socket.socket) -> Job:
    """In a process forked per command: fork the command (which returns its job), report its
    pid, wait, report its exit status (negative: the signal that ended it, as subprocess
    reports it), and end."""
    try:
        head, fds, _, _ = socket.recv_fds(conn, 8, 3)
        size = int.from_bytes(head, "big")
        data = b""
        while len(data) < size:
            data += conn.recv(size - len(data))
        pid = os.fork()
    except BaseException:
        os._exit(1)  # the client sees its connection close
    if pid == 0:
        conn.close()
        return json.loads(data), fds
    try:
        for fd in fds:
            os.close(fd)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        conn.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    finally:
        os._exit(0)


def _become_cli(request: dict[str, Any], fds: list[int]) -> None:
    """Turn this forked process into `python -m durable_agent ARGS` and end as it would.
    The interpreter's own stream objects stay, over the new descriptors (the encoding and
    buffering a process started with the same locale would choose)."""
    import random

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])  # what this test process has now, not what the zygote had
    for name, (soft, hard) in request["limits"].items():
        resource.setrlimit(int(name), (soft, hard))
    sys.path[0] = request["cwd"]  # `python -m` puts the working directory first
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # found again from this environment's TMPDIR
    random.seed()
    import durable_agent

    sys.argv = [
        os.path.join(os.path.dirname(durable_agent.__file__ or ""), "__main__.py"),
        *request["args"],
    ]
    _exit_as_the_interpreter(_run_main())


def _run_main() -> int:
    """`raise SystemExit(main())` at top level: the exit status the interpreter would give."""
    import traceback

    try:
        from durable_agent.cli.parser import main

        raise SystemExit(main())
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return -signal.SIGINT
    except BaseException:  # noqa: BLE001  (printed as the interpreter prints it)
        traceback.print_exc()
        return 1


def _exit_as_the_interpreter(code: int) -> None:
    """What the interpreter does on the way out that a command can see, then `_exit`: join
    the threads left running, run the atexit handlers, close the SQLite connections still
    open (closing the last one folds the WAL into the database file) and flush the files
    still open. A whole finalization would tear down the thousand modules the zygote
    imported, a tenth of a second per command."""
    import atexit
    import gc
    import io
    import sqlite3

    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    files = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)  # exact types: an ABC check
    for obj in gc.get_objects():  # per object costs a second
        try:
            if type(obj) is sqlite3.Connection:
                obj.close()
            elif type(obj) in files and not obj.closed:
                obj.flush()
        except Exception:  # noqa: BLE001, S112  (as the finalizers: nothing to report it to)
            continue
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            code = code or 120  # the interpreter's status when its last flush fails
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # not this file's folder: each command puts its own directory there
    job = _serve(sys.argv[1])
    if job is not None:
        _become_cli(*job)
