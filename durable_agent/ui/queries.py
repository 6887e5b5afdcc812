"""The web view's reads beyond the CLI's: a page of runs by keyset, the steps that changed
since the last look (for the live page), and the files a step changed where the store has
workspace snapshots. The SQL is the store's (store/runs.py); here are the page's cursor and
size.

Pages are keyset pages on the (created_at, id) order, newest first: the cursor is the last
row's (created_at, id), so page 2,000 costs what page 1 costs.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import TYPE_CHECKING

from msgspec import Struct

from durable_agent.store.records import FileChange as FileChange  # (the pages name it here)
from durable_agent.store.records import RunRecord, StepRecord

if TYPE_CHECKING:
    from durable_agent.store.runs import Store

PAGE_SIZE = 50


class RunPage(Struct, frozen=True):
    runs: list[RunRecord]
    next_cursor: str | None  # None on the last page


def encode_cursor(run: RunRecord) -> str:
    raw = f"{run.created_at.isoformat()}|{run.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str] | None:
    """The (created_at, id) a cursor names; None for one that is not ours (page 1 then)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        when, _, run_id = raw.partition("|")
        if "\x00" in run_id:  # no id holds one (and PostgreSQL refuses it in a parameter)
            return None
        return datetime.fromisoformat(when), run_id
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None


def run_page(
    store: Store,
    *,
    status: str | None = None,
    needle: str | None = None,
    cursor: str | None = None,
    limit: int = PAGE_SIZE,
) -> RunPage:
    """One page of runs, newest first, after `cursor`; `needle` matches the id or the task
    (case-insensitively)."""
    after = decode_cursor(cursor) if cursor else None
    # One more than the page: whether there is a next page, without counting.
    rows = store.run_page(status=status, needle=needle, after=after, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return RunPage(rows, encode_cursor(rows[-1]) if more and rows else None)


def steps_from(
    store: Store, run_id: str, first_seq: int, limit: int | None = None
) -> list[StepRecord]:
    """The run's steps with seq >= first_seq: the live page asks from its oldest step that
    was still open (an intent row gets its outcome later) and anything newer."""
    return store.steps_from(run_id, first_seq, limit)


class Changes:
    """The files each step changed, where the store has workspace snapshots (the
    `step_changes` view); an empty answer where it has none."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def available(self) -> bool:
        return self.store.has_step_changes()

    def by_step(self, run_id: str) -> dict[int, list[FileChange]]:
        return self.store.step_changes(run_id)
