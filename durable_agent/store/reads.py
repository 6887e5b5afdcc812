"""`list` and `show`, the reads people type most, behind one interface whichever way answers.

`RunReads` is what both commands need. `Store` (store/runs.py) implements it through
SQLAlchemy, for every database. `Reads` implements it for a store named by its URL: on an
SQLite store at this version's revision it reads the rows with the standard library
(store/sqlite_reads.py: no SQLAlchemy to import, the commands answer at once), and it opens
the whole `Store` only for what that way leaves (another database, a store to create or
upgrade, an unknown id, a hand-edited value), which also gives every refusal in its words.
Callers never choose: they call `list_runs` and `show`. Both ways give the same records
(tests/test_store_conformance.py holds them to it); `plain=False` turns the standard-library
way off, so a test can run the same reads both ways.

This module imports no SQLAlchemy: the whole store is opened through the `open_store`
callable, and only when it is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from durable_agent.store import sqlite_reads
from durable_agent.store.records import ApprovalRecord, RunRecord, StepRecord

Shown = tuple[RunRecord, list[StepRecord], list[ApprovalRecord]]


class RunReads(Protocol):
    def list_runs(self, *, status: str | None = None, limit: int = 50) -> list[RunRecord]:
        """Runs newest first (created_at, then id), with this status if one is given."""
        ...

    def show(self, run_id: str) -> Shown:
        """The run with this id or unique prefix, its steps (by seq) and approvals (by id);
        RunNotFound, or a UsageError for an ambiguous prefix, as `Store.find_run_id`."""
        ...


class Reads:
    """`RunReads` for the store at `db`, the whole store opened by `open_store` when needed."""

    def __init__(self, db: str, open_store: Callable[[], RunReads], *, plain: bool = True) -> None:
        self.db = db
        self.plain = plain
        self._open = open_store
        self._store: RunReads | None = None

    def store(self) -> RunReads:
        """The whole store, opened once (its schema brought to head, or its refusal raised)."""
        if self._store is None:
            self._store = self._open()
        return self._store

    def list_runs(self, *, status: str | None = None, limit: int = 50) -> list[RunRecord]:
        found = sqlite_reads.list_runs(self.db, status=status, limit=limit) if self.plain else None
        return found if found is not None else self.store().list_runs(status=status, limit=limit)

    def show(self, run_id: str) -> Shown:
        found = sqlite_reads.show(self.db, run_id) if self.plain else None
        return found if found is not None else self.store().show(run_id)
