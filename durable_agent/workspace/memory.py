"""Reading project memory: the instruction files named by `memory_files`, from the user's
config folder (`$XDG_CONFIG_HOME/durable-agent`, else `~/.config/durable-agent`), then from
the workspace root down to the task's folder (`memory_dir`). context/memory.py composes
them; loop/memory_step.py records them with the run."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from durable_agent.context.memory import MEMORY_CAP, Memory, MemoryFile, compose

MAX_FILE_BYTES = 1024 * 1024  # read of one file; the composed text is capped far below


def user_memory_dir(env: Mapping[str, str]) -> Path:
    """As the user's config file is found (config/layers.default_config_path)."""
    home = env.get("HOME") or str(Path.home())
    return Path(env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")) / "durable-agent"


def folders(root: Path, task_dir: str | None) -> list[Path]:
    """The workspace root, then each folder down to the task's (a missing one ends it)."""
    out = [root]
    here = root
    for part in Path(task_dir or ".").parts:
        if part in (".", ""):
            continue
        here = here / part
        if not here.is_dir():
            break
        out.append(here)
    return out


def read_memory(
    workspace: Path,
    task_dir: str | None,
    names: Sequence[str],
    env: Mapping[str, str],
    redact: Callable[[str], str] = str,
) -> Memory:
    """The files, each one's text redacted before they are composed: over the cap the text is
    cut at a byte, and a key cut in two there is no key shape any more (its tail went out)."""
    root = Path(os.path.realpath(workspace))
    names = list(dict.fromkeys(names))  # a name given twice is one file, read once
    where: list[tuple[Path, str, str | None]] = []  # farthest first; the folder it must be in
    user = user_memory_dir(env)
    home = env.get("HOME") or str(Path.home())
    for name in names:
        # The user's folder holds the user's config (keys, MCP tokens): only instruction
        # files (*.md) are read there, whatever names a project's memory_files gives.
        if not name.lower().endswith(".md"):
            continue
        path = user / name
        shown = str(path)
        if home and shown.startswith(os.path.join(home, "")):
            shown = "~/" + shown[len(os.path.join(home, "")) :]
        where.append((path, shown, None))
    for folder in folders(root, task_dir):
        for name in names:
            path = folder / name
            # A link out of the workspace is not the project's: a cloned repository's
            # AGENTS.md -> ~/.ssh/id_rsa would send the key to the model.
            real = os.path.realpath(path)
            if real != str(root) and not real.startswith(os.path.join(str(root), "")):
                continue
            where.append((path, path.relative_to(root).as_posix(), str(root)))
    # Nearest first, and no further once the cap is passed: compose cuts the farthest text
    # first, so what lies beyond is only counted. Reading them all held every file whole (a
    # project's memory_files with a name 400 times, or 400 links to one big file: 1.3 GB).
    found: list[MemoryFile] = []
    kept = left_out = 0
    for path, shown, beneath in reversed(where):
        if kept > MEMORY_CAP:
            left_out += _size(path)
        elif (f := _read(path, shown, redact, beneath)) is not None:
            found.append(f)
            kept += len(f.text.encode("utf-8", "surrogatepass"))
    return compose(found[::-1], left_out=left_out)


def _size(path: Path) -> int:
    """Bytes a regular file would have given (as `_read` reads it), else 0."""
    try:
        st = os.stat(path)
    except OSError:
        return 0
    return min(st.st_size, MAX_FILE_BYTES) if stat.S_ISREG(st.st_mode) else 0


def _read(
    path: Path, shown: str, redact: Callable[[str], str], beneath: str | None
) -> MemoryFile | None:
    try:
        # Without blocking: a FIFO named AGENTS.md (no writer) would hang the run.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with open(fd, "rb") as f:
        if beneath is not None and not _opened_in(fd, beneath):
            return None
        try:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            raw = f.read(MAX_FILE_BYTES)
        except OSError:
            return None
    text = raw.decode("utf-8", "replace")
    if not text.strip():
        return None
    return MemoryFile(shown, hashlib.sha256(raw).hexdigest(), len(raw), redact(text))


def _opened_in(fd: int, root: str) -> bool:
    """The file `fd` is open on lies in `root`. read_memory checks the path before it opens
    it; a link put in its place between the two (by a process the run left behind, or
    another run in the same folder) would be followed out of the workspace. Linux names an
    open file in /proc/self/fd; where that cannot be read, the check before stands alone."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return True
    return real == root or real.startswith(os.path.join(root, ""))
