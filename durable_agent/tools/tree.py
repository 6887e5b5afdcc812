"""Walking a folder tree without recursion: Python 3.11's os.walk recurses a level a call,
and a tree 1,000 folders deep (one `mkdir -p` away) raised RecursionError wherever it was
walked, before every later command of the run and in the tools that search."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator


def walk(
    root: str, unlisted: list[str] | None = None, *, beneath: str | None = None
) -> Iterator[tuple[str, list[str], list[str], set[str]]]:
    """os.walk's top-down walk, in the same order (dirnames may be pruned or sorted in
    place). Links to folders are listed, named again in the last item, and not entered; a
    folder that cannot be listed is passed over (added to `unlisted` when permissions forbid it).

    With `beneath` (the workspace's real path, `root` a folder under it by name), each
    folder is opened beneath the workspace's fd with no link followed (tools/beneath.py): one
    swapped for a link to outside since its parent was listed is passed over, not listed."""
    if beneath is None:
        yield from _walk(root, unlisted, None, b"")
        return
    from durable_agent.tools import beneath as fds

    with fds.root(beneath) as root_fd:
        yield from _walk(root, unlisted, root_fd, os.fsencode(beneath))


def _walk(
    root: str, unlisted: list[str] | None, root_fd: int | None, base: bytes
) -> Iterator[tuple[str, list[str], list[str], set[str]]]:
    from durable_agent.tools import beneath as fds

    stack = [root]
    while stack:
        top = stack.pop()
        dirnames: list[str] = []
        filenames: list[str] = []
        links: set[str] = set()
        try:
            with contextlib.ExitStack() as held:
                if root_fd is None:
                    where: str | int = top
                else:
                    where = held.enter_context(fds.open_dir(root_fd, fds.relative_to(base, top)))
                with os.scandir(where) as entries:
                    for entry in entries:
                        try:
                            is_dir = entry.is_dir()
                            if is_dir and entry.is_symlink():
                                links.add(entry.name)
                        except OSError:
                            is_dir = False
                        (dirnames if is_dir else filenames).append(entry.name)
        except fds.Escaped:
            continue  # a link now: not entered, as no link is
        except OSError as exc:
            if unlisted is not None and exc.errno in (errno.EACCES, errno.EPERM):
                unlisted.append(top)  # (a path too long to open, say, is no one's doing to undo)
            continue
        yield top, dirnames, filenames, links
        stack.extend(os.path.join(top, d) for d in reversed(dirnames) if d not in links)
