"""Helpers of the workspace tests: an exact picture of a directory, and running the CLI."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import forked_cli

Picture = dict[bytes, tuple[Any, ...]]


def picture(root: Path, *, skip: tuple[bytes, ...] = ()) -> Picture:
    """Every path under `root` (bytes, so any name) with its kind, content, permission bits or
    link target. Directories are listed too, so an empty one left behind is a difference."""
    out: Picture = {}
    base = os.fsencode(str(root))
    for dirpath, dirnames, filenames in os.walk(base):
        rel_dir = os.path.relpath(dirpath, base)
        for name in sorted(dirnames + filenames):
            rel = name if rel_dir == b"." else os.path.join(rel_dir, name)
            if rel.split(b"/")[0] in skip:
                continue
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                with open(full, "rb") as f:
                    out[rel] = (
                        "file",
                        stat.S_IMODE(st.st_mode),
                        hashlib.sha256(f.read()).hexdigest(),
                    )
        dirnames[:] = [d for d in dirnames if not (rel_dir == b"." and d in skip)]
    return out


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(os.fsencode(str(src)), os.fsencode(str(dst)), symlinks=True)


def da(
    args: list[str],
    env: dict[str, str],
    cwd: Path,
    *,
    timeout: float = 120,
    extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return forked_cli.run(args, env={**env, **(extra or {})}, cwd=cwd, timeout=timeout)
