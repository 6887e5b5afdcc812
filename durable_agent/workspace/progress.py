"""What a long piece of workspace work is doing, for a live display to show.

The first snapshot of a big workspace (a run's creation) and the drift check of a resume
walk the whole tree before any step begins: 36 s at 500,000 files with the default
baseline, and nothing else on the screen; a restore or a fork writes every file. The work
is wrapped in `working(label)`; the scanner adds the names it lists (`listed`), a restore
what it has written (`advanced`), and the terminal's status line asks `under_way()` at
each redraw (cli/status_line.py). Nothing here is stored or waited on: a display that
never asks costs a thread-local lookup per folder walked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Work:
    """`label` under way since `since` (time.monotonic()): `done` of `total` (None: not
    known) `unit` so far."""

    __slots__ = ("label", "unit", "total", "since", "done")

    def __init__(self, label: str, unit: str, total: int | None) -> None:
        self.label, self.unit, self.total = label, unit, total
        self.since, self.done = time.monotonic(), 0

    def detail(self) -> str:
        """`12,000 paths listed`, `12,000 of 50,001 files written`; "" before the first."""
        if not self.done:
            return ""
        of = f" of {self.total:,}" if self.total is not None else ""
        return f"{self.done:,}{of} {self.unit}"


LISTED, WRITTEN = "paths listed", "paths written"  # the units counted here
_local = threading.local()
_lock = threading.Lock()
_active: list[Work] = []


@contextmanager
def working(label: str, unit: str = LISTED, total: int | None = None) -> Iterator[Work]:
    """`label` is under way in this thread for the block (the outermost one counts): what
    a scan lists is counted, unless `unit` says what the block counts itself (`Work.done`)."""
    if getattr(_local, "work", None) is not None:
        yield _local.work
        return
    work = _local.work = Work(label, unit, total)
    with _lock:
        _active.append(work)
    try:
        yield work
    finally:
        _local.work = None
        with _lock:
            _active.remove(work)


def advanced(n: int, unit: str) -> None:
    """`n` more `unit` done (counted by this thread's work, if it counts those)."""
    work = getattr(_local, "work", None)
    if work is not None and work.unit == unit:
        work.done += n


def listed(names: int) -> None:
    """A scan listed `names` more names."""
    advanced(names, LISTED)


def under_way() -> Work | None:
    """The longest-running work of this process under way, if any."""
    with _lock:
        return _active[0] if _active else None
