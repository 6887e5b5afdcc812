"""Walking a folder tree without recursion: Python 3.11's os.walk recurses a level a call,
and a tree 1,000 folders deep (one `mkdir -p` away) raised RecursionError wherever it was
walked, before every later command of the run and in the tools that search."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator


def walk(
    root: str, unlisted: list[str] | None = None
) -> Iterator[tuple[str, list[str], list[str], set[str]]]:
    """os.walk's top-down walk, in the same order (dirnames may be pruned or sorted in
    place). Links to folders are listed, named again in the last item, and not entered; a
    folder that cannot be listed is passed over (added to `unlisted` when permissions forbid it)."""
    stack = [root]
    while stack:
        top = stack.pop()
        dirnames: list[str] = []
        filenames: list[str] = []
        links: set[str] = set()
        try:
            with os.scandir(top) as entries:
                for entry in entries:
                    try:
                        is_dir = entry.is_dir()
                        if is_dir and entry.is_symlink():
                            links.add(entry.name)
                    except OSError:
                        is_dir = False
                    (dirnames if is_dir else filenames).append(entry.name)
        except OSError as exc:
            if unlisted is not None and exc.errno in (errno.EACCES, errno.EPERM):
                unlisted.append(top)  # (a path too long to open, say, is no one's doing to undo)
            continue
        yield top, dirnames, filenames, links
        stack.extend(os.path.join(top, d) for d in reversed(dirnames) if d not in links)
