"""Workspace confinement: every path a tool touches resolves inside the workspace."""

from __future__ import annotations

import os
from pathlib import Path

from durable_agent.tools.base import ToolFailure
from durable_agent.tools.encoding import bad_name_char, name_from_arg, show_name


def resolve(workspace: Path, path: str, *, for_write: bool = False) -> Path:
    """The real path of `path` inside `workspace`, or ToolFailure.

    Symlinks are resolved before the check, so a link that points outside is refused
    just like `..` or an absolute path elsewhere.
    """
    if "\x00" in path:
        raise ToolFailure("path contains a NUL byte")
    problem = bad_name_char(path)
    if problem:
        raise ToolFailure(problem)
    path = name_from_arg(workspace, path)  # `bad\xffname` as shown by `relative` (tools/encoding.py)
    # On strings: every file tool call comes here, and Path.resolve and Path.parents cost
    # more than the lstat calls that do the work.
    real_root = os.path.realpath(workspace)
    real = os.path.realpath(os.path.join(real_root, path))  # an absolute `path` replaces the root
    if real != real_root and not real.startswith(os.path.join(real_root, "")):
        raise ToolFailure(f"path {path!r} is outside the workspace; use a path relative to it")
    root, target = Path(real_root), Path(real)
    if for_write:
        rel = target.relative_to(root)
        if rel.parts and rel.parts[0] == ".git":
            raise ToolFailure("refusing to write inside .git/: use git commands instead")
        if target == root or target.is_dir():
            raise ToolFailure(f"{path!r} is a directory")
    return target


def relative(workspace: Path, target: Path) -> str:
    """The workspace-relative path as shown to the model: bytes that are not UTF-8 as `\\xHH`,
    which `resolve` takes back."""
    rel = target.relative_to(workspace.resolve())
    return show_name(rel.as_posix() or ".")
