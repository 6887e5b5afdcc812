"""The notifications outbox (0011): rows written in the transaction that changes a run's
status (`Journal.finish_run`), then claimed, sent and marked by a deliverer
(durable_agent/notify.py). A crash anywhere in between leaves the row undelivered, or
claimed until its claim runs out: the next deliverer sends it again under the same key.

Also the web view's public address and link key (`web_links`), which the writers of a
`blocked` notification read to sign its approve/deny links.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from msgspec import Struct
from sqlalchemy import Engine, insert, or_, select, update

from durable_agent.store import retrying
from durable_agent.store.rows import utcnow
from durable_agent.store.schema import notifications, web_links
from durable_agent.store.storable import storable

# Called with "claimed" (the row is ours, nothing sent) and "posted" (the target accepted
# it, not yet marked): the crash suites kill the process there (store/faults.py).
NOTIFY_HOOKS: list[Callable[[str], None]] = []


class Notification(Struct, frozen=True):
    id: int
    idempotency_key: str
    run_id: str | None
    event: str
    target: str
    payload: Any
    created_at: datetime
    attempts: int
    delivered_at: datetime | None
    last_error: str | None


def event_rows(
    base: str,
    event: str,
    run_id: str | None,
    payload: dict[str, Any],
    targets: Sequence[tuple[int, str]],
) -> list[dict[str, Any]]:
    """One row per target (index in the config, target) of an event: its key is `base` and
    the index, the same on every retry of the commit that writes it."""
    rows = []
    for index, target in targets:
        key = f"{base}:{index}"
        rows.append(
            {
                "idempotency_key": key,
                "run_id": run_id,
                "event": event,
                "target": target,
                "payload": {**payload, "idempotency_key": key},
            }
        )
    return rows


def insert_statements(rows: Sequence[dict[str, Any]]) -> list[tuple[Any, dict[str, Any]]]:
    """The inserts of new events, for the transaction of the status change they report."""
    now = utcnow()
    return [
        (insert(notifications).values(storable({**row, "created_at": now, "attempts": 0})), {})
        for row in rows
    ]


class Outbox:
    def __init__(self, engine: Engine, policy: retrying.StorePolicy | None = None) -> None:
        self.engine = engine
        self.policy = policy or retrying.StorePolicy()

    def _write(self, statement: Any) -> int:
        def attempt() -> int:
            with self.engine.begin() as conn:
                return int(conn.execute(statement).rowcount or 0)

        return retrying.run(attempt, self.policy)

    def add(self, rows: Sequence[dict[str, Any]]) -> None:
        """Events outside any run (`notify test`)."""

        def attempt() -> None:
            with self.engine.begin() as conn:
                for statement, _ in insert_statements(rows):
                    conn.execute(statement)

        retrying.run(attempt, self.policy)

    def due(self, limit: int = 100) -> list[Notification]:
        """Undelivered rows nobody is sending now, oldest first."""
        now = utcnow()
        query = (
            select(*[notifications.c[name] for name in Notification.__struct_fields__])
            .where(
                notifications.c.delivered_at.is_(None),
                or_(notifications.c.claimed_until.is_(None), notifications.c.claimed_until < now),
            )
            .order_by(notifications.c.id)
            .limit(limit)
        )
        rows = retrying.read(self.engine, lambda conn: conn.execute(query).all(), self.policy)
        return [Notification(**row._mapping) for row in rows]

    def claim(self, row_id: int, seconds: float) -> bool:
        """Ours to send for `seconds` (False: another deliverer has it, or it was sent)."""
        now = utcnow()
        return (
            self._write(
                update(notifications)
                .where(
                    notifications.c.id == row_id,
                    notifications.c.delivered_at.is_(None),
                    or_(
                        notifications.c.claimed_until.is_(None),
                        notifications.c.claimed_until < now,
                    ),
                )
                .values(claimed_until=now + timedelta(seconds=seconds))
            )
            == 1
        )

    def delivered(self, row_id: int, attempts: int) -> None:
        self._write(
            update(notifications)
            .where(notifications.c.id == row_id)
            .values(delivered_at=utcnow(), claimed_until=None, attempts=attempts, last_error=None)
        )

    def failed(self, row_id: int, attempts: int, error: str) -> None:
        """Not delivered this pass: free for the next one."""
        self._write(
            update(notifications)
            .where(notifications.c.id == row_id)
            .values(claimed_until=None, attempts=attempts, last_error=storable(error[:2000]))
        )

    def all(self) -> list[Notification]:
        query = select(*[notifications.c[n] for n in Notification.__struct_fields__]).order_by(
            notifications.c.id
        )
        rows = retrying.read(self.engine, lambda conn: conn.execute(query).all(), self.policy)
        return [Notification(**row._mapping) for row in rows]

    # -- the web view's links ------------------------------------------------------------
    def links(self) -> tuple[str | None, str | None]:
        """(public URL, link key) as the web view last set them; (None, None) before."""
        row = retrying.read(
            self.engine,
            lambda conn: conn.execute(
                select(web_links.c.public_url, web_links.c.secret).where(web_links.c.id == 1)
            ).first(),
            self.policy,
        )
        return (None, None) if row is None else (row[0], row[1])

    def set_public_url(self, url: str | None) -> str:
        """Record the web view's public address; returns the link key (made once)."""

        def attempt() -> str:
            with self.engine.begin() as conn:
                found = conn.execute(select(web_links.c.secret).where(web_links.c.id == 1)).first()
                if found is None:
                    secret = os.urandom(32).hex()
                    conn.execute(
                        insert(web_links).values(
                            id=1, public_url=url, secret=secret, updated_at=utcnow()
                        )
                    )
                    return secret
                conn.execute(
                    update(web_links)
                    .where(web_links.c.id == 1)
                    .values(public_url=url, updated_at=utcnow())
                )
                return str(found[0])

        return retrying.run(attempt, self.policy)
