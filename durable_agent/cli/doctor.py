"""`durable-agent doctor`: which mechanism contains commands here, proven by a self-check.

The check runs one real command through the same path as `run_command` (guard, sandbox,
scrubbed environment) in a throw-away workspace and then looks from the outside:

- a write inside the workspace must land;
- a write to a file outside it (a canary next to the workspace, visible to the sandbox
  but read-only there: it is not under /tmp, which the sandbox replaces) must not;
- with bubblewrap, a write to the workspace's `.git/config` must not land;
- with the network off, a connect to a listener on 127.0.0.1 must not reach it (the
  listener's backlog is read after the command ended: no timing involved);
- the harness's `/proc/<pid>/environ` must not be readable;
- `/proc/sys` must not be writable (root without capabilities may set most sysctls);
- with bubblewrap, `/run` (daemon sockets) must be empty but for the resolver's files.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from durable_agent.tools.os_sandbox import (
    NO_LANDLOCK_ENV,
    Mechanism,
    Sandbox,
    landlock_abi,
    resolve_sandbox,
)
from durable_agent.tools.process import command_env, run_process


def run_doctor(*, mode: str, network: bool, env: Mapping[str, str], out: TextIO) -> int:
    def p(text: str) -> None:
        print(text, file=out, flush=True)

    sandbox = resolve_sandbox(mode, network, env)
    p(f"sandbox    {sandbox.describe()}")
    if sandbox.bwrap:
        p(f"bubblewrap {sandbox.bwrap} ({_bwrap_version(sandbox.bwrap)})")
    abi = 0 if env.get(NO_LANDLOCK_ENV, "") not in ("", "0") else landlock_abi()
    p(
        f"landlock   {'ABI ' + str(abi) if abi else 'not available (or disabled)'}"
        + (" (the fallback)" if abi and sandbox.mechanism is not Mechanism.LANDLOCK else "")
    )
    warning = sandbox.warning()
    if warning:
        p(warning)
    if sandbox.mechanism is Mechanism.OFF:
        p("--sandbox off: commands run unconfined; nothing to check")
        return 0
    if sandbox.mechanism is Mechanism.NONE:
        p(f"✗ {sandbox.refusal()}")
        return 1
    started = time.monotonic()
    failures = self_check(sandbox, env, p)
    took = time.monotonic() - started
    if failures:
        p(
            f"✗ the sandbox does NOT work ({len(failures)} check(s) failed in {took:.2f} s): "
            + "; ".join(failures)
            + ". Pass --sandbox off only if you accept unconfined commands."
        )
        return 1
    p(f"✓ the sandbox works ({took:.2f} s)")
    return 0


def self_check(sandbox: Sandbox, env: Mapping[str, str], say: Callable[[str], None]) -> list[str]:
    """Run the probe command; returns what failed (empty: all good). `say` prints a line."""
    base = Path(tempfile.mkdtemp(prefix="durable-agent-doctor-", dir=_outside_tmp()))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        ws = base / "workspace"
        (ws / ".git" / "hooks").mkdir(parents=True)
        (ws / ".git" / "config").write_text("[core]\n")
        canary = base / "canary.txt"
        canary.write_text("canary\n")
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        command = (
            "echo inside > inside.txt; "
            f"echo pwned > {canary} 2>/dev/null; "
            "echo '[core] fsmonitor = touch planted' >> .git/config 2>/dev/null; "
            f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo NET-CONNECTED; "
            # Opening is the access check (and a builtin: no PATH needed to be tested).
            f"(: < /proc/{os.getpid()}/environ) 2>/dev/null && echo PROC-VISIBLE; "
            # Opened for append, nothing written: root may set most sysctls (core_pattern).
            "(: >> /proc/sys/kernel/core_pattern) 2>/dev/null && echo SYSCTL-WRITABLE; "
            "ls -A /run 2>/dev/null | grep -qv '^systemd$' && echo RUN-VISIBLE; "
            "exit 0"
        )
        outcome = run_process(
            command,
            cwd=ws,
            env=command_env(env, run_id="doctor", call_id="doctor"),
            timeout_s=30,
            sandbox=sandbox,
            workspace=ws,
        )
        checks: list[tuple[str, bool]] = [
            ("a command runs", outcome.exit_code == 0),
            ("a write inside the workspace works", _read(ws / "inside.txt") == "inside\n"),
            ("a write outside the workspace fails", _read(canary) == "canary\n"),
            (
                "other processes are hidden (/proc/PID/environ)",
                "PROC-VISIBLE" not in outcome.stdout,
            ),
            ("kernel settings are read-only (/proc/sys)", "SYSCTL-WRITABLE" not in outcome.stdout),
        ]
        if sandbox.mechanism is Mechanism.BUBBLEWRAP:
            checks.append((".git/config is read-only", _read(ws / ".git" / "config") == "[core]\n"))
            checks.append(
                ("daemon sockets under /run are hidden", "RUN-VISIBLE" not in outcome.stdout)
            )
        if not sandbox.network:
            checks.append(
                (
                    "the network is off",
                    not _connected(listener) and "NET-CONNECTED" not in outcome.stdout,
                )
            )
        failures = []
        for name, ok in checks:
            say(f"  {'ok ' if ok else 'FAILED'} {name}")
            if not ok:
                failures.append(name)
        if outcome.exit_code != 0:
            say(f"  the probe said: {(outcome.stderr or outcome.stdout).strip()[:300]}")
        return failures
    finally:
        listener.close()
        shutil.rmtree(base, ignore_errors=True)


def _outside_tmp() -> str:
    """A scratch directory not under /tmp, so the canary is visible (read-only) inside the
    sandbox rather than hidden by its private /tmp: the check then proves read-only."""
    for candidate in ("/var/tmp", os.path.expanduser("~/.cache")):
        if os.path.isdir(candidate) and os.access(candidate, os.W_OK):
            return candidate
    return tempfile.gettempdir()


def _connected(listener: socket.socket) -> bool:
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _bwrap_version(bwrap: str) -> str:
    try:
        proc = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "version unknown"
    return proc.stdout.strip() or "version unknown"
