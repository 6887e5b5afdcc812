"""Workspace confinement: every path a tool touches resolves inside the workspace."""

from __future__ import annotations

import os
from pathlib import Path

from durable_agent.encoding import bad_name_char, name_from_arg, show_name
from durable_agent.tools.base import ToolFailure
from durable_agent.tools.gitguard import inside_git_dir

PROJECT_DIR = ".durable-agent"  # the project's config folder (config/layers.PROJECT_CONFIG)


def resolve(
    workspace: Path, path: str, *, for_write: bool = False, store: str | None = None
) -> Path:
    """The real path of `path` inside `workspace`, or ToolFailure.

    Symlinks are resolved before the check, so a link that points outside is refused
    just like `..` or an absolute path elsewhere. The check alone is no guard: a process
    that outlives its call (an MCP server's child, another run's command) can swap a folder
    for a link between it and the open. So the tools open what this returns beneath the
    workspace's fd with no link followed (tools/beneath.py), and a link that appeared since
    is refused there.
    """
    if "\x00" in path:
        raise ToolFailure("path contains a NUL byte")
    problem = bad_name_char(path)
    if problem:
        raise ToolFailure(problem)
    path = name_from_arg(
        workspace, path
    )  # `bad\xffname` as shown by `relative` (durable_agent/encoding.py)
    # On strings: every file tool call comes here, and Path.resolve and Path.parents cost
    # more than the lstat calls that do the work.
    real_root = os.path.realpath(workspace)
    real = os.path.realpath(os.path.join(real_root, path))  # an absolute `path` replaces the root
    if real != real_root and not real.startswith(os.path.join(real_root, "")):
        raise ToolFailure(f"path {path!r} is outside the workspace; use a path relative to it")
    root, target = Path(real_root), Path(real)
    if for_write:
        if not os.path.isdir(real_root):  # a write would make a new, empty one in its place
            raise ToolFailure(
                f"the workspace {show_name(real_root)} is gone (deleted or unmounted): "
                "nothing was written"
            )
        # Any git dir, nested ones too: a planted sub/.git/config runs its fsmonitor the next
        # time the *user* runs git there, outside any sandbox.
        if inside_git_dir(target, root, path):
            raise ToolFailure(
                f"refusing to write {path!r}: it is inside a git directory "
                "(.git internals); use git commands instead"
            )
        if _in_project_config(target, root, path):
            raise ToolFailure(
                f"refusing to write {path!r}: .durable-agent/ holds the project's own "
                "settings for durable-agent, which a run may not change"
            )
        # `new/`, `file.txt/.`: a name for a folder, as open(2) takes it (EISDIR), never
        # a file written (or overwritten) at what realpath makes of it.
        if target == root or target.is_dir() or path.rsplit("/", 1)[-1] in ("", ".", ".."):
            raise ToolFailure(f"{path!r} is a directory")
        if store and _is_store_file(real, store):
            raise ToolFailure(
                f"refusing to write {path!r}: it is this run's own store (its "
                "checkpoints); leave it alone"
            )
    return target


def _in_project_config(target: Path, root: Path, requested: str) -> bool:
    parts = Path(os.path.normpath(requested)).parts
    return target.relative_to(root).parts[:1] == (PROJECT_DIR,) or parts[:1] == (PROJECT_DIR,)


def _is_store_file(real: str, store: str) -> bool:
    from durable_agent.config.layers import store_files

    files = store_files(store)
    return real in files[:4] or bool(files) and real.startswith(os.path.join(files[4], ""))


def relative(workspace: Path, target: Path) -> str:
    """The workspace-relative path as shown to the model: bytes that are not UTF-8 as `\\xHH`,
    which `resolve` takes back."""
    rel = target.relative_to(workspace.resolve())
    return show_name(rel.as_posix() or ".")


def escapes(workspace: Path, path: Path) -> bool:
    """Does `path` (inside the workspace by name) lead outside it through a symlink?"""
    real_root = os.path.realpath(workspace)
    real = os.path.realpath(path)
    return real != real_root and not real.startswith(os.path.join(real_root, ""))
