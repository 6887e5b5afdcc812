"""What a long piece of workspace work is doing, for a live display to show.

The first snapshot of a big workspace (a run's creation) and the drift check of a resume
walk the whole tree before any step begins: 36 s at 500,000 files with the default
baseline, and nothing else on the screen. The work is wrapped in `working(label)`; the
scanner adds the names it lists (`listed`), and the terminal's status line asks
`under_way()` at each redraw (cli/status_line.py). Nothing here is stored or waited on: a
display that never asks costs a thread-local lookup per folder walked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Work:
    __slots__ = ("label", "since", "listed")

    def __init__(self, label: str) -> None:
        self.label, self.since, self.listed = label, time.monotonic(), 0


_local = threading.local()
_lock = threading.Lock()
_active: list[Work] = []


@contextmanager
def working(label: str) -> Iterator[Work]:
    """`label` is under way in this thread for the block (the outermost one counts)."""
    if getattr(_local, "work", None) is not None:
        yield _local.work
        return
    work = _local.work = Work(label)
    with _lock:
        _active.append(work)
    try:
        yield work
    finally:
        _local.work = None
        with _lock:
            _active.remove(work)


def listed(names: int) -> None:
    """A scan listed `names` more names (in this thread's work, if any)."""
    work = getattr(_local, "work", None)
    if work is not None:
        work.listed += names


def under_way() -> Work | None:
    """The longest-running work of this process under way, if any."""
    with _lock:
        return _active[0] if _active else None
