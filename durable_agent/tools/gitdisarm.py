"""Take out what a repository created by a command would make git run on the host.

The sandbox keeps an existing repository's `config` and `hooks/` read-only (gitguard.py),
but a command may create a repository and plant code in it in one go (`git init sub &&
printf '[core]\\n\\tfsmonitor = rm -rf ~' >> sub/.git/config`): the user's next `git status`
there, outside any sandbox, would run it. So after each command, in every git dir that did
not exist before the run, the harness removes:

- from every `config` and `config.worktree` in it (submodules' `modules/*/config` and
  `worktrees/*/config.worktree` included): every setting whose name says it runs a program
  (`_runs_program`), every `alias.*` (an alias without `!` can still carry
  `-c core.pager=...`), and every `include.*` and `includeIf.*` (they pull in another file,
  which a command may write, with any of the above: git would read it, we would not);
- from every `hooks/` in it: every entry but git's own `*.sample` files (git runs hooks
  only by their fixed names, never a `.sample`).

Settings are edited by git's own parser (`git config --file`) on a private copy, under an
environment that reads no other config (GIT_CONFIG_NOSYSTEM, GIT_CONFIG_GLOBAL=/dev/null,
an empty HOME): nothing the repository holds is run, and git decides what the file says,
as it will when the user runs it. The copy is read, and the result written back, through a
handle on the git dir itself that is checked to lie in the workspace, never by following a
name a command may have swapped for a link. A config git cannot edit (malformed, or no git
on the host) is moved aside as `config.disabled` whole: failing safe, git then reads none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

_CONFIGS = ("config", "config.worktree")
_NOT_WALKED = frozenset({"objects", "refs", "logs", "lfs"})  # git's data, never its code
_MAX_CONFIG = 1 << 20  # a bigger config is not read: moved aside whole

# Whole sections whose every key names a program or pulls in other settings.
_SECTIONS = frozenset(
    {
        "alias",
        "include",
        "includeif",
        "filter",
        "pager",
        "credential",
        "difftool",
        "mergetool",
        "browser",
        "man",
        "sendemail",
        "trailer",
        "gpg",
        "protocol",  # protocol.ext.allow: a remote `ext::COMMAND` would then run it
    }
)
# Keys (section.key, lower case) that name a program, beyond the suffixes below.
_KEYS = frozenset(
    {
        "core.fsmonitor",
        "core.hookspath",
        "core.sshcommand",
        "core.pager",
        "core.editor",
        "core.askpass",
        "core.gitproxy",
        "core.alternaterefscommand",
        "core.worktree",  # points git's work tree (and its attributes) anywhere
        "diff.external",
        "sequence.editor",
        "interactive.difffilter",
        "uploadpack.packobjectshook",
        "web.browser",
        "ssh.variant",
        "submodule.fetchjobs",
    }
)
# Last parts of a key that name a program: diff.X.textconv, merge.X.driver, remote.X.uploadpack...
_SUFFIXES = (
    "command",
    "cmd",
    "program",
    "helper",
    "driver",
    "textconv",
    "editor",
    "pager",
    "hook",
    "uploadpack",
    "receivepack",
    "proxy",
    "vcs",
    "update",  # submodule.X.update = !command
)


def _runs_program(key: str) -> bool:
    """Whether git may run a program named by `key` (git's lower-cased section and last
    part; a subsection keeps its case between them)."""
    section, _, rest = key.partition(".")
    section = section.lower()
    last = rest.rsplit(".", 1)[-1].lower()
    short = f"{section}.{last}"
    return section in _SECTIONS or short in _KEYS or any(last.endswith(s) for s in _SUFFIXES)


class _Root:
    """The workspace's real path, and the check that a directory handle lies beneath it."""

    def __init__(self, workspace: Path) -> None:
        self.path = os.path.realpath(workspace)

    def holds(self, fd: int) -> bool:
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        return where == self.path or where.startswith(os.path.join(self.path, ""))


_CREATED: dict[str, set[str]] = {}  # workspace -> git dirs its commands created, this process


def created(before: dict[str, str], after: dict[str, str], workspace: Path) -> list[str]:
    """The git dirs of `after` (gitguard.git_state) that a command of this process's runs
    created: those not in `before`, and those remembered from earlier commands (under
    Landlock nothing keeps a later command from planting in them)."""
    seen = _CREATED.setdefault(os.path.realpath(workspace), set())
    seen.update(p for p, d in after.items() if d == "git dir" and p not in before)
    return sorted(p for p in seen if after.get(p) == "git dir")


def disarm(gitdirs: Iterable[str], workspace: Path) -> list[str]:
    """Remove what would make git run a program from each of `gitdirs` (real paths inside
    `workspace`); one line for each git dir changed (or that could not be)."""
    root = _Root(workspace)
    notes: list[str] = []
    for gitdir in sorted(set(gitdirs)):
        try:
            fd = os.open(gitdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # gone, or a link put in its way: nothing of ours to act on there
        try:
            if not root.holds(fd):
                continue
            removed, failed = _disarm_dir(fd)
        finally:
            os.close(fd)
        shown = os.path.relpath(gitdir, root.path)
        if removed:
            notes.append(
                f"removed from the git repository {shown}, which this run created, what would "
                f"make git run a program when you use it: {', '.join(removed)}"
            )
        if failed:
            notes.append(
                f"could not clean the git repository {shown} ({'; '.join(failed)}): "
                "look at its config and hooks before running git there"
            )
    return notes


def _disarm_dir(top: int) -> tuple[list[str], list[str]]:
    removed: list[str] = []
    failed: list[str] = []
    # fwalk works on directory handles and never follows a link: what it reaches lies in
    # the git dir whatever a process still running does to the names meanwhile.
    for rel, dirnames, filenames, dfd in os.fwalk(".", dir_fd=top):
        here = os.path.normpath(rel)
        prefix = "" if here == "." else here + "/"
        if "HEAD" in filenames:  # a git dir (this one, a submodule's): its data is no code
            dirnames[:] = [d for d in dirnames if d not in _NOT_WALKED]
        for name in _CONFIGS:
            if name in filenames or name in dirnames:
                _clean_config(dfd, name, prefix, removed, failed)
        if "hooks" in filenames or "hooks" in dirnames:
            with contextlib.suppress(OSError):
                if not stat.S_ISDIR(os.lstat("hooks", dir_fd=dfd).st_mode):
                    # a link to a folder of programs (never walked), or a file: git would
                    # follow the link to run what is there
                    try:
                        _remove(dfd, "hooks")
                        removed.append(f"{prefix}hooks (a link)")
                    except OSError as exc:
                        failed.append(f"{prefix}hooks: {exc.strerror}")
        if os.path.basename(here) == "hooks":
            for name in sorted([*filenames, *dirnames]):
                if name.endswith(".sample"):
                    continue
                try:
                    _remove(dfd, name)
                    removed.append(f"{prefix}{name}")
                except OSError as exc:
                    failed.append(f"{prefix}{name}: {exc.strerror}")
            dirnames[:] = []
    return removed, failed


def _remove(dfd: int, name: str) -> None:
    st = os.lstat(name, dir_fd=dfd)
    if stat.S_ISDIR(st.st_mode):
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        try:
            for entry in os.listdir(sub):
                _remove(sub, entry)
        finally:
            os.close(sub)
        os.rmdir(name, dir_fd=dfd)
    else:
        os.unlink(name, dir_fd=dfd)


def _clean_config(dfd: int, name: str, prefix: str, removed: list[str], failed: list[str]) -> None:
    shown = prefix + name
    try:
        st = os.lstat(name, dir_fd=dfd)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        # A link (git reads its target, maybe a file the command wrote) or anything else
        # git would try to read: removed, never followed.
        try:
            _remove(dfd, name)
            removed.append(f"{shown} (not a plain file)")
        except OSError as exc:
            failed.append(f"{shown}: {exc.strerror}")
        return
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        with open(fd, "rb") as f:
            text = f.read(_MAX_CONFIG + 1)
    except OSError as exc:
        failed.append(f"{shown}: {exc.strerror}")
        return
    with tempfile.TemporaryDirectory(prefix="durable-agent-gitconfig-") as tmp:
        copy = os.path.join(tmp, "config")
        with open(copy, "wb") as f:
            f.write(text)
        keys = None if len(text) > _MAX_CONFIG else _edit(copy, tmp)
        if keys is None:  # git could not read or edit it: git will read none of it
            try:
                os.rename(name, name + ".disabled", src_dir_fd=dfd, dst_dir_fd=dfd)
                removed.append(f"{shown} (unreadable by git: moved to {shown}.disabled)")
            except OSError as exc:
                failed.append(f"{shown}: {exc.strerror}")
            return
        if not keys:
            return
        with open(copy, "rb") as f:
            cleaned = f.read()
    try:
        _replace(dfd, name, cleaned, stat.S_IMODE(st.st_mode))
    except OSError as exc:
        failed.append(f"{shown}: {exc.strerror}")
        return
    removed.extend(f"{k} in {shown}" for k in keys)


def _replace(dfd: int, name: str, data: bytes, mode: int) -> None:
    """Write `data` as `name` in the directory `dfd`, by a new file renamed over it."""
    temp = f".{name}.durable-agent-{os.getpid()}"
    fd = os.open(
        temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd
    )
    try:
        os.write(fd, data)
        os.fchmod(fd, mode & 0o777)
    finally:
        os.close(fd)
    try:
        os.rename(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dfd)
        raise


def _git_env(home: str) -> dict[str, str]:
    """Only what git needs to parse one file: no system or global config, no repository."""
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": home,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CEILING_DIRECTORIES": home,
        "LC_ALL": "C",
    }


def _git(args: list[str], tmp: str) -> subprocess.CompletedProcess[bytes] | None:
    git = shutil.which("git")
    if git is None:
        return None
    try:
        return subprocess.run(
            [git, *args],
            cwd=tmp,
            env=_git_env(tmp),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def _edit(copy: str, tmp: str) -> list[str] | None:
    """Unset, in the file `copy`, every key that runs a program; the keys removed, or None
    when git could not do it."""
    listed = _git(["config", "--file", copy, "--no-includes", "--null", "--list"], tmp)
    if listed is None or listed.returncode != 0:
        return None
    keys: list[str] = []
    for entry in listed.stdout.split(b"\0"):
        if not entry:
            continue
        key = os.fsdecode(entry.split(b"\n", 1)[0])
        if _runs_program(key) and key not in keys:
            keys.append(key)
    for key in keys:
        done = _git(["config", "--file", copy, "--unset-all", key], tmp)
        if done is None or done.returncode != 0:
            return None
    if keys:  # what is left must still be git's to read, and hold none of them
        again = _git(["config", "--file", copy, "--no-includes", "--null", "--list"], tmp)
        if again is None or again.returncode != 0:
            return None
        left = [os.fsdecode(e.split(b"\n", 1)[0]) for e in again.stdout.split(b"\0") if e]
        if any(_runs_program(k) for k in left):
            return None
    return keys
