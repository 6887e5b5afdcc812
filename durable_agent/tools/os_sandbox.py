"""Containment of commands by the kernel (`--sandbox`, `--network`): the security boundary.

`--shell` (config/shell_policy.py) only decides which commands need a person; a lexer cannot
contain a shell (ANSI-C quoting, expansions, planted git config all defeat it). Here a
command line becomes an argv that the kernel confines:

    bubblewrap   (`bwrap` on PATH, namespaces usable)   everything below is enforced
    landlock     (kernel >= 5.13, through ctypes)       filesystem writes only; see WARNINGS
    none                                                sandboxed modes refuse to run commands

Under bubblewrap (`workspace-write`): `/` is bound read-only, `/dev` and `/proc` are fresh
(a new PID namespace, so no other process's `/proc/<pid>/environ` is visible), `/tmp` and
`/run` are private tmpfs (no daemon's unix socket is reachable there), the workspace is bound read-write (`read-only`: read-only too), the network
namespace is empty unless `--network on`, all capabilities are dropped (as root, bwrap
would keep them and `mount -o remount,rw /` would undo everything), and in every git
repository inside the workspace the parts that make git *run* things are read-only
(see `gitguard.py` for the rule and why `git add/commit` still work).

No `--new-session`: the command must stay in the guard's process group, whose id is
recorded before it starts (process.py, _guard.py) so that a resume can find and kill it.
The guard's session has no controlling terminal, so the TIOCSTI injection that
`--new-session` defends against has no terminal to inject into. `--die-with-parent` and
the PID namespace are a second line: when bwrap dies, everything inside dies with it.

Detection runs a real probe once per process (cached), never a guess from version
numbers: user namespaces are often disabled by the distribution or a container.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from functools import lru_cache
from pathlib import Path

from msgspec import Struct
from msgspec.structs import replace

from durable_agent.tools import gitdisarm, pids
from durable_agent.tools.base import ToolFailure
from durable_agent.tools.gitguard import git_changes, git_protections, git_state, remove_planted
from durable_agent.tools.sandbox import PROJECT_DIR

LANDLOCK_SCRIPT = Path(__file__).with_name("_landlock.py")
NO_LANDLOCK_ENV = "DURABLE_AGENT_NO_LANDLOCK"
"""Set to 1 to pretend the kernel has no Landlock (tests of the refusal, and for users whose
Landlock breaks a tool: then install bubblewrap or pass --sandbox off)."""
BWRAP_MAX_ARGS = 9000
"""bubblewrap refuses more arguments than this after its own name (MAX_ARGS in bwrap.c; the
test of the refusal checks it against the installed bwrap): the protections (gitguard.py) of
about 600 git repositories."""
INSTALL_HINT = (
    "install bubblewrap (apt-get install bubblewrap / dnf install bubblewrap) "
    "or pass --sandbox off to run commands unconfined"
)


class SandboxMode(StrEnum):
    WORKSPACE_WRITE = "workspace-write"
    READ_ONLY = "read-only"
    OFF = "off"


class Mechanism(StrEnum):
    BUBBLEWRAP = "bubblewrap"
    LANDLOCK = "landlock"
    NONE = "none"  # a sandboxed mode with no way to enforce it: commands are refused
    OFF = "off"  # --sandbox off: nothing is enforced, on purpose


class SandboxUnavailable(ToolFailure):
    """A sandboxed mode and no mechanism: the command is refused, never run unconfined."""


class Sandbox(Struct, frozen=True):
    """How commands of one run are contained. Build it with `resolve_sandbox`."""

    mode: SandboxMode
    network: bool
    mechanism: Mechanism
    bwrap: str | None = None
    landlock_abi: int = 0
    problem: str = ""  # why no mechanism is available (mechanism NONE)
    own: tuple[str | None, ...] = ()  # where the harness's own files are (`for_run`, `hidden`)

    @property
    def enforced(self) -> bool:
        return self.mechanism in (Mechanism.BUBBLEWRAP, Mechanism.LANDLOCK)

    def describe(self) -> str:
        """One line for `doctor`, the run header and `show`."""
        if self.mechanism is Mechanism.OFF:
            return "off: commands run unconfined (the shell policy is the only check)"
        net = "network on" if self.network else "network off"
        if self.mechanism is Mechanism.NONE:
            return (
                f"{self.mode}, but no mechanism is available ({self.problem}): commands are refused"
            )
        return f"{self.mode} by {self.mechanism}, {net}"

    def warning(self) -> str | None:
        """What the fallback does not enforce, in one line; None when everything is."""
        if self.mechanism is not Mechanism.LANDLOCK:
            return None
        missing = [
            "a PID namespace (other processes are listed, though Landlock denies "
            "reading their memory and environment: probed before it is used)",
            ".git read-only (Landlock cannot carve a read-only hole in a writable tree)",
            "a private /tmp (TMPDIR points to a private directory instead)",
            "hidden daemon sockets (/run: PostgreSQL, docker, D-Bus stay reachable)",
        ]
        if not self.network:
            missing.append(
                "network off (not enforced)"
                if self.landlock_abi < 4
                else "network off for UDP and other non-TCP sockets (TCP is blocked)"
            )
        return (
            "sandbox: bubblewrap is not usable, falling back to Landlock; not enforced: "
            + "; ".join(missing)
        )

    def refusal(self) -> str:
        return (
            f"refusing to run commands: --sandbox {self.mode} needs bubblewrap or Landlock "
            f"and neither works here ({self.problem}); {INSTALL_HINT}"
        )


def store_refusal(sandbox: Sandbox, db: str, workspace: Path) -> str | None:
    """Why commands must not run when the run's SQLite store lies in the workspace they may
    write: a command could rewrite the run's recorded settings there (`sandbox: off` for the
    next resume) or its approvals. None when the store is elsewhere or out of reach."""
    if sandbox.mode is not SandboxMode.WORKSPACE_WRITE or not sandbox.enforced:
        return None
    from durable_agent.config.layers import sqlite_file

    file = sqlite_file(db)
    if file is None:
        return None
    real, root = str(file), os.path.realpath(workspace)
    if real != root and not real.startswith(os.path.join(root, "")):
        return None
    return (
        f"refusing to run commands: the store {real} is inside the workspace, where sandboxed "
        "commands can write it (and rewrite the run's settings, --sandbox included); keep the "
        "store outside the workspace (--db) or pass --sandbox read-only"
    )


class Launch(Struct):
    """The argv and environment that run one command under the sandbox, and what to undo."""

    argv: list[str]
    env: dict[str, str]
    cleanup: Callable[[], None] = lambda: None
    notes: Callable[[], list[str]] = lambda: []
    """After the command: what it did to git internals (see gitguard.git_changes)."""


def for_run(mode: str, network: bool, env: Mapping[str, str], db: str | None) -> Sandbox:
    """`resolve_sandbox`, hiding the harness's own files from what it runs: its config file
    (which may hold the API key) and its store (every run's history and approvals). Only
    bubblewrap can hide a path inside a readable tree; Landlock grants reading by tree."""
    # Every tool call asks (the hot path): no file is looked at here, only where to look
    # when a command starts (`hidden`: a worker lives on while a config file is made).
    where = tuple(env.get(k) for k in _OWN_ENV)
    key = (mode, network, db, env.get("PATH"), env.get(NO_LANDLOCK_ENV), *where)
    found = _FOR_RUN.get(key)
    if found is None:
        found = resolve_sandbox(mode, network, env)
        if found.mechanism is Mechanism.BUBBLEWRAP:
            from durable_agent.config.layers import default_db_url

            found = replace(found, own=(db or default_db_url(env), *where))
        _FOR_RUN[key] = found
    return found


_FOR_RUN: dict[tuple[object, ...], Sandbox] = {}
_OWN_ENV = ("DURABLE_AGENT_CONFIG", "XDG_CONFIG_HOME", "HOME", "PATH")


def hidden(sandbox: Sandbox, carry: Sequence[Path] = ()) -> tuple[str, ...]:
    """The harness's own files as they are now (config_layers.own_files), but a carried
    program's (an MCP server's script kept in the config folder stays)."""
    if not sandbox.own:
        return ()
    from durable_agent.config.layers import default_config_path, own_files

    db, *where = sandbox.own
    env = {k: v for k, v in zip(_OWN_ENV, where, strict=True) if v is not None}
    found = own_files(db or "", default_config_path(env))
    mine = [os.path.realpath(c) for c in carry]
    shared = _shared_roots(env)
    return tuple(
        h
        for h in found
        if not any(_within(m, h) for m in mine) and not any(_within(s, h) for s in shared)
    )


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(os.path.join(folder, ""))


def _shared_roots(env: Mapping[str, str]) -> set[str]:
    """What a folder of the harness's own (the config's) must not hold to be hidden whole:
    the home folder (a command's git identity is in ~/.gitconfig), the programs a command
    runs (PATH, the harness's Python), or be a top folder of the system (/, /etc, /usr...).
    There only the files themselves are hidden."""
    roots = {os.path.realpath(p) for p in (sys.prefix, env.get("HOME") or Path.home()) if p}
    roots.update(os.path.realpath(p) for p in env.get("PATH", "").split(os.pathsep) if p)
    roots.update({"/", *(str(p) for p in _top_folders())})
    return roots


@lru_cache(maxsize=1)
def _top_folders() -> tuple[Path, ...]:
    try:
        return tuple(p for p in Path("/").iterdir() if p.is_dir())
    except OSError:
        return ()


def resolve_sandbox(mode: str, network: bool, env: Mapping[str, str]) -> Sandbox:
    """The mechanism for `mode` on this machine, probed once per (mode, PATH) and cached.

    `env` is the harness's environment: bwrap is looked up on its PATH, and
    `DURABLE_AGENT_NO_LANDLOCK=1` rules Landlock out."""
    return _resolve(
        SandboxMode(mode),
        network,
        env.get("PATH", os.defpath),
        env.get(NO_LANDLOCK_ENV, "") not in ("", "0"),
    )


@lru_cache(maxsize=16)
def _resolve(mode: SandboxMode, network: bool, path: str, no_landlock: bool) -> Sandbox:
    if mode is SandboxMode.OFF:
        return Sandbox(mode, network, Mechanism.OFF)
    problems = []
    if not sys.platform.startswith("linux"):
        return Sandbox(mode, network, Mechanism.NONE, problem=f"no sandbox for {sys.platform} yet")
    bwrap = shutil.which("bwrap", path=path)
    if bwrap is None:
        problems.append("bwrap is not on PATH")
    else:
        why = _probe_bwrap(bwrap)
        if why is None:
            return Sandbox(mode, network, Mechanism.BUBBLEWRAP, bwrap=bwrap)
        problems.append(f"bwrap does not work: {why}")
    abi = 0 if no_landlock else landlock_abi()
    if abi > 0:
        why = _probe_landlock()
        if why is None:
            return Sandbox(mode, network, Mechanism.LANDLOCK, landlock_abi=abi)
        problems.append(why)
    else:
        problems.append("Landlock is disabled" if no_landlock else "the kernel has no Landlock")
    return Sandbox(mode, network, Mechanism.NONE, problem="; ".join(problems))


def _probe_landlock() -> str | None:
    """None if a Landlock domain keeps a command from this process's environment (the API
    key is there). Landlock denies ptrace-class access out of the domain, /proc/PID/environ
    included; some kernels do not, and then the fallback would leak the secrets it exists
    to keep, so it is not used."""
    target = f"/proc/{os.getpid()}/environ"
    with tempfile.TemporaryDirectory(prefix="durable-agent-probe-") as tmp:
        argv = [
            sys.executable,
            "-I",
            "-S",
            str(LANDLOCK_SCRIPT),
            "read-only",
            tmp,
            tmp,
            "off",
            "--",
            sys.executable,
            "-I",
            "-S",
            "-c",
            "import sys; open(sys.argv[1], 'rb').close()",
            target,
        ]
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=20,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"Landlock does not work: {exc}"
    if proc.returncode == 0:
        return (
            "Landlock on this kernel lets a command read other processes' environment "
            "(/proc/PID/environ)"
        )
    if "PermissionError" in proc.stderr:
        return None
    lines = proc.stderr.strip().splitlines()
    return f"Landlock does not work: {lines[-1] if lines else f'exit code {proc.returncode}'}"


def _probe_bwrap(bwrap: str) -> str | None:
    """None if bwrap can build the namespaces we use, else its complaint (one line)."""
    argv = [
        bwrap,
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--",
        "/bin/sh",
        "-c",
        "exit 0",
    ]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {proc.returncode}"


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when there is none (or it is disabled at boot)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION): the same number
        # (444) on every architecture, as the syscall is newer than the unified table.
        version = int(libc.syscall(444, None, 0, 1))
    except (OSError, AttributeError):
        return 0
    return max(version, 0)


def prepare(
    sandbox: Sandbox | None,
    argv: list[str],
    *,
    cwd: Path,
    workspace: Path,
    env: Mapping[str, str],
    carry: Sequence[Path] = (),
    writable_extra: Sequence[Path] = (),
) -> Launch:
    """`argv` wrapped for `sandbox` (None or mode off: unchanged). Raises SandboxUnavailable
    when a sandboxed mode has no mechanism: the command must not run at all then. `carry`:
    host paths the program itself needs (an MCP server's script); those under /tmp stay
    visible, read-only, in the private /tmp. `writable_extra`: folders it may write besides the
    workspace (an MCP server's cache; bubblewrap only, Landlock keeps them read-only)."""
    if sandbox is None or sandbox.mechanism is Mechanism.OFF:
        return Launch(list(argv), dict(env))
    if sandbox.mechanism is Mechanism.NONE:
        raise SandboxUnavailable(sandbox.refusal())
    ws = Path(os.path.realpath(workspace))
    here = Path(os.path.realpath(cwd))
    writable = sandbox.mode is SandboxMode.WORKSPACE_WRITE
    # bwrap_options first: it creates missing hooks/ dirs, which are not the command's doing.
    keep = programs_in_tmp(env, ws)
    keep += [p for p in in_tmp(carry, ws) if not any(p.is_relative_to(k) for k in keep)]
    options = (
        bwrap_options(
            sandbox,
            cwd=here,
            workspace=ws,
            keep=keep,
            hide=hidden(sandbox, carry),
            writable=writable_extra,
        )
        if sandbox.bwrap
        else []
    )
    before = git_state(ws) if writable else {}
    project_before = _entry_identity(ws / PROJECT_DIR)

    def notes() -> list[str]:
        if not writable:
            return []
        planted = remove_planted(before, ws)
        if _made_in_place(project_before, _entry_identity(ws / PROJECT_DIR)):
            planted += remove_project_config(ws)
        after = git_state(ws)
        disarmed = gitdisarm.disarm(gitdisarm.created(before, after, ws), ws)
        if disarmed:
            after = git_state(ws)
        return [*planted, *disarmed, *git_changes(before, ws, after)]

    if sandbox.mechanism is Mechanism.BUBBLEWRAP:
        assert sandbox.bwrap is not None
        if len(options) + 1 + len(argv) > BWRAP_MAX_ARGS:
            raise SandboxUnavailable(
                f"refusing to run the command: the workspace holds too many git repositories for the "
                f"sandbox (protecting their configs and hooks takes about {len(options) // 3} mounts in all, "
                f"more than bubblewrap accepts in {BWRAP_MAX_ARGS} arguments); give a narrower --workspace, or "
                f"pass --sandbox read-only (nothing in it writable) or --sandbox off"
            )
        group = _pids_group()
        return Launch(
            _limited(group, [sandbox.bwrap, *options, "--", *argv]),
            {**env, "TMPDIR": "/tmp"},  # the host's TMPDIR may be read-only inside
            cleanup=lambda: _remove_group(group),
            notes=notes,
        )
    group = _pids_group()
    tmp = tempfile.mkdtemp(prefix="durable-agent-cmd-")
    wrapped = [
        sys.executable,
        "-I",
        "-S",
        str(LANDLOCK_SCRIPT),
        str(sandbox.mode),
        str(ws),
        tmp,
        "on" if sandbox.network else "off",
        "--",
        *argv,
    ]

    def cleanup() -> None:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_group(group)

    return Launch(_limited(group, wrapped), {**env, "TMPDIR": tmp}, cleanup=cleanup, notes=notes)


def _entry_identity(path: Path) -> tuple[int, int, int] | None:
    """What is at `path` itself (a link is not followed): device, inode and file type; None
    when nothing is."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode)


def _made_in_place(before: tuple[int, int, int] | None, after: tuple[int, int, int] | None) -> bool:
    """The command put a `.durable-agent` the project's settings could be read from (a folder,
    a link) where there was none, or in place of what was there: a file, a link, anything
    bubblewrap could not bind read-only (a real folder is a mount point, not replaceable)."""
    return after is not None and after != before and not stat.S_ISREG(after[2])


def remove_project_config(workspace: Path) -> list[str]:
    """Take out the `.durable-agent` a command made in a workspace that had none: bubblewrap
    can keep an existing folder read-only, not one that is not there yet, and the next run
    started here would read the settings a command chose. One line for what was done."""
    entry = workspace / PROJECT_DIR
    if not os.path.lexists(entry):
        return []
    try:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)  # (never follows a link inside: it walks by descriptors)
        else:
            entry.unlink()
    except OSError as exc:
        return [
            f"this command created {PROJECT_DIR}, the project's settings for durable-agent, "
            f"and it could not be removed ({exc.strerror}): remove it before the next run here"
        ]
    return [
        f"removed {PROJECT_DIR}, which this command created: the project's settings for "
        "durable-agent are not a command's to make"
    ]


def _pids_group() -> str | None:
    """A cgroup limiting the command's processes (pids.py); None when none can be made and
    the harness is not root (the kernel's per-user limit applies to it). As root without
    one the command is refused: a fork bomb would meet no limit at all."""
    group = pids.new_group()
    if group is None and os.geteuid() == 0:
        raise SandboxUnavailable(pids.refusal())
    return group


def _limited(group: str | None, argv: list[str]) -> list[str]:
    return argv if group is None else pids.joining(group, argv)


def _remove_group(group: str | None) -> None:
    if group is not None:
        pids.remove_group(group)


def programs_in_tmp(env: Mapping[str, str], workspace: Path) -> list[Path]:
    """What the command runs that lives under /tmp, which the sandbox replaces by an empty
    private one: the harness's own Python environment (a virtualenv made under /tmp, as a
    CI checkout may be) and the directories on PATH, a virtualenv's bin/ as its whole
    environment. Kept visible read-only; nothing else of the host's /tmp is."""
    found: list[Path] = []
    for raw in (sys.prefix, *env.get("PATH", "").split(os.pathsep)):
        if not raw:
            continue
        path = Path(os.path.realpath(raw))
        try:  # a PATH entry the harness may not look into (/root/...) is no one's program
            if path.name == "bin" and (path.parent / "pyvenv.cfg").exists():
                path = path.parent
            if path.is_dir():
                found.append(path)
        except OSError:
            continue
    return in_tmp(found, workspace)


def in_tmp(paths: Iterable[Path], workspace: Path) -> list[Path]:
    """Those of `paths` (resolved) that exist under the host's /tmp and outside the
    workspace, once each."""
    tmp = os.path.realpath("/tmp")
    found: list[Path] = []
    for raw in paths:
        path = Path(os.path.realpath(raw))
        inside = str(path).startswith(tmp + os.sep)
        if inside and path.exists() and not path.is_relative_to(workspace) and path not in found:
            found.append(path)
    return found


def bwrap_argv(
    sandbox: Sandbox,
    argv: list[str],
    *,
    cwd: Path,
    workspace: Path,
    keep: Sequence[Path] = (),
    hide: Sequence[str] = (),
) -> list[str]:
    assert sandbox.bwrap is not None
    return [
        sandbox.bwrap,
        *bwrap_options(sandbox, cwd=cwd, workspace=workspace, keep=keep, hide=hide),
        "--",
        *argv,
    ]


def bwrap_options(
    sandbox: Sandbox,
    *,
    cwd: Path,
    workspace: Path,
    keep: Sequence[Path] = (),
    hide: Sequence[str] = (),
    writable: Sequence[Path] = (),
) -> list[str]:
    """bwrap's options (what comes between `bwrap` and `--`). Creates missing hooks/ dirs."""
    bind = "--bind" if sandbox.mode is SandboxMode.WORKSPACE_WRITE else "--ro-bind"
    # Order matters: later mounts cover earlier ones. The private /tmp comes before the
    # workspace, so a workspace under /tmp stays visible (and nothing else of /tmp does).
    args = [
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--tmpfs",
        "/dev/shm",
        # The kernel's settings are global, and root without capabilities may still write
        # most of them (core_pattern, modprobe: programs the kernel runs as root, outside);
        # bwrap's own cover of /proc/sys does not always happen (seen with bwrap 0.8).
        "--proc",
        "/proc",
        "--ro-bind-try",
        "/proc/sys",
        "/proc/sys",
        "--ro-bind-try",
        "/proc/sysrq-trigger",
        "/proc/sysrq-trigger",
        "--tmpfs",
        "/tmp",
        # A read-only mount does not stop connect() on a unix socket, and /run holds the
        # daemons' (PostgreSQL with trust auth, MySQL, D-Bus, docker.sock, the user's
        # agents in /run/user): hide it, keeping only the resolver's files for DNS.
        "--tmpfs",
        "/run",
        "--ro-bind-try",
        "/run/systemd/resolve",
        "/run/systemd/resolve",
    ]
    for path in keep:
        args += ["--ro-bind", str(path), str(path)]
    args += [bind, str(workspace), str(workspace)]
    if sandbox.mode is SandboxMode.WORKSPACE_WRITE:
        pins, read_only = git_protections(workspace)
        for path in pins:
            args += ["--bind", str(path), str(path)]
        for path in read_only:
            args += ["--ro-bind", str(path), str(path)]
        # The project's own config (.durable-agent/config.toml): what the next run is set up
        # with is not the command's to change. (Where there is none, a command may make
        # one: remove_project_config takes it out after the command.)
        project = os.path.realpath(workspace / PROJECT_DIR)
        if os.path.isdir(project) and _within(project, os.path.realpath(workspace)):
            args += ["--ro-bind", project, project]
    # Last: nothing mounted after re-exposes them. A folder that holds the workspace stays,
    # its files go one by one (a read of /dev/null: nothing; a write: refused).
    folders = [own for own in hide if os.path.isdir(own) and not workspace.is_relative_to(own)]
    args += [arg for own in folders for arg in ("--tmpfs", own)]
    for own in hide:
        if os.path.isfile(own) and not any(Path(own).is_relative_to(f) for f in folders):
            args += ["--ro-bind", "/dev/null", own]
    # A folder of its own it may write (an MCP server's cache, kept beside the logs in the
    # harness's data folder): after the hiding, which covers that folder, so only it is
    # seen again; never one that holds a hidden file (the store, the config).
    for path in writable:
        if not any(_within(own, os.path.realpath(path)) for own in hide):
            args += ["--bind", str(path), str(path)]
    args += [
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
    ]
    if not sandbox.network:
        args.append("--unshare-net")
    args += ["--chdir", str(cwd)]
    return args
