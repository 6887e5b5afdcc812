"""Git repositories inside the workspace: what must stay read-only, and what counts as one.

Git runs programs named in its own files: `config` (core.fsmonitor, core.pager,
core.hooksPath, filter and diff drivers...), `hooks/`, and through `commondir`, `modules/`
and `worktrees/` the config of another git dir. A command or file tool that can write
those plants code that runs later, when the *user* runs git outside any sandbox
(issue 11: `sub/.git/config` with `fsmonitor = "rm -f ../../victim.txt"`).

The rule (chosen so that legitimate `git add`, `git commit`, `git stash`, `git checkout`
in a workspace repo still work inside the sandbox):

- the git dir itself stays writable, because git writes `index`, `objects/`, `refs/`,
  `logs/` and creates its lock files (`index.lock`, `HEAD.lock`) next to them;
- `config`, `hooks/`, `info/`, `modules/`, `worktrees/`, `commondir` and `config.worktree`
  are bound read-only (`hooks/` is created empty first if missing, so a command cannot
  create it); a `.git` *file* (worktrees, submodules) is read-only too;
- consequence: `git config ...` fails inside the sandbox; use `git -c user.name=...` or
  the GIT_AUTHOR_*/GIT_COMMITTER_* variables. Submodule commits fail (their git dirs live
  in `modules/`).

The file tools refuse to write anywhere inside any git dir (`inside_git_dir`).

Repositories are found when a command starts, `.git` folders and bare ones under any name
(`_looks_like_git_dir`); one *created* by a command (`git init`, `git init --bare tools`, or
`mkdir sub/.git` and a planted config) is protected from the next command on, but what the
creating command wrote into it stays. `git_state` before and `git_changes` after each
command name such changes in the command's result (and under Landlock, which cannot make
`.git` read-only, changes to existing config and hooks too), so neither the model nor the
person reading the run is left unaware: docs/sandbox.md says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from pathlib import Path

from durable_agent.tools.tree import walk

# Entries of a git dir that make git run something or read another git dir's config.
PROTECTED_ENTRIES = (
    "config",
    "hooks",
    "info",
    "modules",
    "worktrees",
    "commondir",
    "config.worktree",
)
# Directories too big to walk on every command, where a repository is not looked for (one
# planted there is not protected: docs/sandbox.md names this).
_NO_DESCENT = frozenset(
    {".git", "node_modules", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox"}
)


def find_git_dirs(
    workspace: Path, unlisted: list[str] | None = None
) -> tuple[list[Path], list[Path]]:
    """(git dirs, `.git` files) inside `workspace`, all as real paths inside it.

    A `.git` that is a symlink or a `gitdir:` file counts by its target when the target is
    inside the workspace (it is writable there); a target outside is read-only anyway.
    Repositories are also found by their shape under any name (`git init --bare tools`),
    in the folders not walked, behind links to folders, and as the common dirs that
    `commondir` files name: git reads the config of each. Folders that cannot be listed
    (`chmod 311`, a repository out of sight below) are added to `unlisted`."""
    root = os.path.realpath(workspace)
    dirs: list[Path] = []
    files: list[Path] = []
    for dirpath, dirnames, filenames, links in walk(root, unlisted):
        # The names first, so most folders cost no stat (a link or file HEAD is in filenames).
        if (
            "HEAD" in filenames or "HEAD" in dirnames or "config" in filenames
        ) and _looks_like_git_dir(Path(dirpath)):
            dirs.append(Path(dirpath))
        if os.path.basename(dirpath) == "objects" and _looks_like_git_dir(Path(dirpath).parent):
            # git's own entries hold files only; one with folders inside is walked after all
            dirnames[:] = [
                d for d in dirnames if not _git_object_entry(d) or _has_folders(dirpath, d)
            ]
        if ".git" in dirnames or ".git" in filenames:
            _dot_git(os.path.join(dirpath, ".git"), root, dirs, files)
        for d in dirnames:  # not walked into: a repository by itself, or one a link leads to
            if d in _NO_DESCENT or d in links:
                target = os.path.realpath(os.path.join(dirpath, d))
                if _inside(target, root):
                    _repository_at(target, root, dirs, files)
        dirnames[:] = [d for d in dirnames if d not in _NO_DESCENT and d not in links]
    for gitdir in list(dirs):  # wherever its common dir lies in the workspace
        _keep(_pointer(gitdir / "commondir", ""), root, dirs)
    return sorted(set(dirs)), sorted(set(files))


def _git_object_entry(name: str) -> bool:
    """One of the entries git makes in objects/: pack, info, the two-hex-digit fan-out."""
    return name in ("pack", "info") or (
        len(name) == 2 and all(c in "0123456789abcdef" for c in name)
    )


def _keep(path: str | None, root: str, dirs: list[Path]) -> None:
    """`path` as a git dir, when it is a folder inside the workspace (one outside is read-only anyway)."""
    if path is not None and _inside(path, root) and os.path.isdir(path):
        dirs.append(Path(path))


def _repository_at(path: str, root: str, dirs: list[Path], files: list[Path]) -> None:
    if _looks_like_git_dir(Path(path)):
        dirs.append(Path(path))
    entry = os.path.join(path, ".git")
    if os.path.lexists(entry):
        _dot_git(entry, root, dirs, files)


def _has_folders(parent: str, name: str) -> bool:
    try:
        return os.lstat(os.path.join(parent, name)).st_nlink != 2
    except OSError:
        return True


def _dot_git(entry: str, root: str, dirs: list[Path], files: list[Path]) -> None:
    if os.path.islink(entry):
        target = os.path.realpath(entry)
        if os.path.isfile(target):  # a link to a `gitdir:` file: git reads it from here
            _keep(_pointer(Path(target), "gitdir: ", base=Path(entry).parent), root, dirs)
        else:
            _keep(target, root, dirs)
    elif os.path.isdir(entry):
        dirs.append(Path(entry))
    elif os.path.isfile(entry):
        files.append(Path(entry))
        _keep(_pointer(Path(entry), "gitdir: "), root, dirs)


def _pointer(path: Path, prefix: str, base: Path | None = None) -> str | None:
    """The real path a `.git` file (prefix "gitdir: ") or a `commondir` file names, read as
    git reads it: the whole file, only its trailing newlines dropped (a name may end in a
    space). None when there is none (or it is not a regular file: never blocked on)."""
    try:
        if not path.is_file():
            return None
        text = os.fsdecode(_head(str(path))).rstrip("\r\n")
    except OSError:
        return None
    if not text.startswith(prefix) or len(text) == len(prefix) or "\0" in text:
        return None
    return os.path.realpath(os.path.join(base or path.parent, text[len(prefix) :]))


def git_protections(workspace: Path) -> tuple[list[Path], list[Path]]:
    """(paths to pin, paths to bind read-only) for one command, each in mount order.

    Pinned: every git dir, and every directory between the workspace and a git dir or a
    `.git` file, bound (writable) onto itself. A mount point cannot be renamed or removed,
    so a command cannot move a repository aside and put a copy with a planted config in its
    place (`mv .git x && cp -r x .git && echo ... >> .git/config`).

    A folder a command made unlistable (`chmod 311 d`) hides what is below it: one of the
    user's own gets its owner's read and search back first (bound read-only instead, the
    workspace root among them, it could never be given back); another's is bound read-only
    whole."""
    unlisted: list[str] = []
    dirs, files = find_git_dirs(workspace, unlisted)
    if unlisted and _give_back(unlisted):
        unlisted.clear()
        dirs, files = find_git_dirs(workspace, unlisted)
    root = Path(os.path.realpath(workspace))
    pins: set[Path] = set()
    for path in [*dirs, *(f.parent for f in files)]:
        for here in (path, *path.parents):
            if here == root or not here.is_relative_to(root):
                break
            pins.add(here)
    paths: list[Path] = [*files, *map(Path, unlisted)]
    for gitdir in dirs:
        hooks = gitdir / "hooks"
        if not hooks.exists() and not hooks.is_symlink():
            with contextlib.suppress(OSError):
                hooks.mkdir()  # an empty, read-only hooks/ leaves nothing to plant one in
        for name in PROTECTED_ENTRIES:
            entry = gitdir / name
            # A symlinked entry is bound by its target, which is what git reads.
            if entry.exists():
                paths.append(entry)
    return sorted(pins, key=lambda p: (len(p.parts), p)), paths


def _give_back(folders: list[str]) -> bool:
    """Owner read and search back on those of `folders` that are ours; whether any changed."""
    changed = False
    for folder in folders:
        with contextlib.suppress(OSError):
            st = os.lstat(folder)
            if st.st_uid == os.geteuid() and stat.S_ISDIR(st.st_mode):
                os.chmod(folder, stat.S_IMODE(st.st_mode) | stat.S_IRUSR | stat.S_IXUSR)
                changed = True
    return changed


# Files that, created in an existing git dir, make git read another config (`commondir`:
# the whole common dir, config included; `config.worktree`). A read-only mount needs
# something to cover, and git itself never creates them there (a linked worktree's
# `commondir` lives under `worktrees/`, which is read-only), so they are removed after the
# command instead: `remove_planted`.
_REDIRECTS = ("commondir", "config.worktree")


def remove_planted(before: dict[str, str], workspace: Path) -> list[str]:
    """Remove `commondir`/`config.worktree` that a command created in a git dir that existed
    before it (`before`: `git_state`); one line for each."""
    root = os.path.realpath(workspace)
    notes = []
    for gitdir in (path for path, digest in before.items() if digest == "git dir"):
        if os.path.realpath(gitdir) != gitdir:
            continue  # moved, or a link put in its way (no pins under Landlock): never act outside
        for name in _REDIRECTS:
            entry = os.path.join(gitdir, name)
            if entry in before or not os.path.lexists(entry):
                continue
            try:
                if os.path.isdir(entry) and not os.path.islink(entry):
                    shutil.rmtree(entry)
                else:
                    os.unlink(entry)
            except OSError as exc:
                notes.append(
                    f"this command created {os.path.relpath(entry, root)}, which makes git read "
                    f"another config, and it could not be removed ({exc.strerror}): remove it "
                    "before running git there"
                )
                continue
            notes.append(
                f"removed {os.path.relpath(entry, root)}, which this command created: it would "
                "make git read another repository's config when you run git there"
            )
    return notes


def inside_git_dir(target: Path, root: Path, requested: str = "") -> bool:
    """Does `target` (a real path inside the real `root`) lie in a git dir, or does the path
    the model asked for name one? Nested repositories count, and so do git dirs that are
    not called `.git` (the target of a `gitdir:` file): they are recognised by their shape."""
    if ".git" in Path(os.path.normpath(requested)).parts:
        return True
    rel = target.relative_to(root)
    if ".git" in rel.parts:
        return True
    here = root
    for part in ("", *rel.parts[:-1]):  # the workspace itself too (a bare repository's layout)
        here = here / part if part else here
        if _looks_like_git_dir(here, target):
            return True
    return False


def _looks_like_git_dir(path: Path, writing: Path | None = None) -> bool:
    """The shape git recognises a repository by (HEAD, with objects/ and refs/ or a
    `commondir`), or a common dir another one's `commondir` may name (objects/ and refs/,
    no HEAD needed, whose config git reads), counting what `writing` is about to create:
    writes made one by one (the config first, while the folder is not yet a repository)
    must not assemble one."""

    def made(name: str, *, folder: bool) -> bool:
        entry = path / name
        if writing is not None and (
            writing == entry if not folder else writing.is_relative_to(entry)
        ):
            return True
        if folder:  # git only asks that it be searchable (access X_OK): an executable file passes
            return os.access(entry, os.X_OK)
        return entry.is_file() or entry.is_symlink()  # git reads a HEAD link without following it

    stores = made("objects", folder=True) and made("refs", folder=True)
    if made("HEAD", folder=False):
        return stores or made("commondir", folder=False)
    return stores and made("config", folder=False)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(os.path.join(root, ""))


def git_state(workspace: Path) -> dict[str, str]:
    """What `git_changes` compares: every git dir and the digest of each protected entry."""
    dirs, files = find_git_dirs(workspace)
    state: dict[str, str] = {str(f): _digest(f) for f in files}
    for gitdir in dirs:
        state[str(gitdir)] = "git dir"
        for name in PROTECTED_ENTRIES:
            entry = gitdir / name
            if entry.exists():
                state[str(entry)] = _digest(entry)
    return state


def git_changes(
    before: dict[str, str], workspace: Path, after: dict[str, str] | None = None
) -> list[str]:
    """Lines naming git dirs a command created and protected entries it created or changed
    (`after`: git_state now, when already known)."""
    root = Path(os.path.realpath(workspace))
    after = git_state(workspace) if after is None else after
    notes = []
    new_dirs = [
        path for path, digest in after.items() if digest == "git dir" and path not in before
    ]
    for path, digest in sorted(after.items()):
        if before.get(path) == digest:
            continue
        if digest != "git dir" and any(path.startswith(os.path.join(d, "")) for d in new_dirs):
            continue  # named once, with its repository
        shown = os.path.relpath(path, root)
        if digest == "git dir":
            notes.append(
                f"this command created the git repository {shown}: what its config and hooks "
                "hold was written by the command (settings and hooks that run programs are "
                "removed); review it before running git there outside the sandbox"
            )
        else:
            verb = "created" if path not in before else "changed"
            notes.append(f"this command {verb} {shown}, which git reads to run programs; review it")
    return notes


def _digest(path: Path) -> str:
    """Content of a file, or names and contents of a directory's files (hooks/, info/)."""
    h = hashlib.sha256()
    try:
        if path.is_dir():
            names = sorted(
                os.path.relpath(os.path.join(d, f), path)
                for d, _, found, _ in walk(str(path))
                for f in found
            )
            for name in names:
                h.update(os.fsencode(name) + b"\0")
                with contextlib.suppress(OSError):
                    h.update(_head(os.path.join(path, name)))
        else:
            h.update(_head(str(path)))
    except OSError:
        return "unreadable"
    return h.hexdigest()


def _head(path: str) -> bytes:
    """The first MiB of a regular file; a FIFO (which would block the open) reads as its type."""
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return b"\0not a regular file"
        return f.read(1 << 20)
