"""The web view's reads beyond the CLI's: a page of runs by keyset, the steps that changed
since the last look (for the live page), and the files a step changed where the store has
workspace snapshots.

Pages are keyset pages on the (created_at, id) order that the `ix_runs_created_id` and
`ix_runs_status_created_id` indexes (migration 0003) already serve, newest first: the
cursor is the last row's (created_at, id), so page 2,000 costs what page 1 costs, where
OFFSET would read every row before it.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any

from msgspec import Struct
from sqlalchemy import Engine, inspect, or_, select, text, tuple_
from sqlalchemy.exc import SQLAlchemyError

from durable_agent.store import retrying
from durable_agent.store.records import RunRecord, StepRecord
from durable_agent.store.runs import Store
from durable_agent.store.schema import runs, steps

PAGE_SIZE = 50
CHANGES_VIEW = (
    "step_changes"  # workspace snapshots (where the store has them): one row per changed file
)


class RunPage(Struct, frozen=True):
    runs: list[RunRecord]
    next_cursor: str | None  # None on the last page


class FileChange(Struct, frozen=True):
    path: str
    change: str
    bytes: int | None


def encode_cursor(run: RunRecord) -> str:
    raw = f"{run.created_at.isoformat()}|{run.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str] | None:
    """The (created_at, id) a cursor names; None for one that is not ours (page 1 then)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        when, _, run_id = raw.partition("|")
        return datetime.fromisoformat(when), run_id
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None


def _like(needle: str) -> str:
    escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def run_page(
    store: Store,
    *,
    status: str | None = None,
    needle: str | None = None,
    cursor: str | None = None,
    limit: int = PAGE_SIZE,
) -> RunPage:
    """One page of runs, newest first, after `cursor`; `needle` matches the id or the task
    (case-insensitively; a scan, stopped by LIMIT as soon as the page is full)."""
    query = select(runs).order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit + 1)
    if status:
        query = query.where(runs.c.status == status)
    if needle:
        pattern = _like(needle.lower())
        query = query.where(
            or_(runs.c.id.ilike(pattern, escape="\\"), runs.c.task.ilike(pattern, escape="\\"))
        )
    after = decode_cursor(cursor) if cursor else None
    if after is not None:
        # A row-value comparison: both backends walk the (created_at, id) index from the cursor.
        query = query.where(tuple_(runs.c.created_at, runs.c.id) < tuple_(*after))

    def read() -> list[RunRecord]:
        with store.engine.connect() as conn:
            return [RunRecord.from_row(r) for r in conn.execute(query)]

    rows = retrying.run(read, store.policy)
    more = len(rows) > limit
    rows = rows[:limit]
    return RunPage(rows, encode_cursor(rows[-1]) if more and rows else None)


def steps_from(
    store: Store, run_id: str, first_seq: int, limit: int | None = None
) -> list[StepRecord]:
    """The run's steps with seq >= first_seq: the live page asks from its oldest step that
    was still open (an intent row gets its outcome later) and anything newer."""
    query = (
        select(steps)
        .where(steps.c.run_id == run_id, steps.c.seq >= first_seq)
        .order_by(steps.c.seq)
        .limit(limit)
    )

    def read() -> list[StepRecord]:
        with store.engine.connect() as conn:
            return [StepRecord.from_row(r) for r in conn.execute(query)]

    return retrying.run(read, store.policy)


class Changes:
    """The files each step changed, read from the `step_changes` view when the store has
    one (stores with workspace snapshots); an empty answer where it has none."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._present: bool | None = None

    def available(self) -> bool:
        if self._present is None:
            try:
                self._present = CHANGES_VIEW in inspect(self.engine).get_view_names()
            except SQLAlchemyError:
                self._present = False
        return self._present

    def by_step(self, run_id: str) -> dict[int, list[FileChange]]:
        if not self.available():
            return {}
        found: dict[int, list[FileChange]] = {}
        try:
            with self.engine.connect() as conn:
                rows: Any = conn.execute(
                    text(
                        f"SELECT seq, path, change, bytes FROM {CHANGES_VIEW} "
                        "WHERE run_id = :run_id ORDER BY seq, path"
                    ),
                    {"run_id": run_id},
                )
                for row in rows:
                    found.setdefault(int(row.seq), []).append(
                        FileChange(
                            str(row.path),
                            str(row.change),
                            None if row.bytes is None else int(row.bytes),
                        )
                    )
        except SQLAlchemyError:  # a view of another shape: show no files rather than fail the page
            return {}
        return found
