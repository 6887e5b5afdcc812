"""The SQL of run_versions (0009): what each session of a run ran with (loop/versions.py).

Rows are written in the transaction of the checkpoint that acts on them (a consent step's
outcome, or a commit of their own through the run's Journal: fenced on the lease), so a
crash leaves either the row and its effect or neither.
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct
from sqlalchemy import Engine, and_, insert, or_, select, text, update

from durable_agent.status import RunStatus
from durable_agent.store import retrying
from durable_agent.store.revision import HEAD_REVISION
from durable_agent.store.rows import utcnow
from durable_agent.store.schema import approvals, run_versions, runs
from durable_agent.store.storable import storable

# The approval kind (and its call id) of a run stopped by a change that needs consent.
CHANGED = "changed_since_checkpoint"
CALL = "version"


class VersionRecord(Struct, frozen=True):
    id: int
    run_id: str
    seq: int
    fingerprint: dict[str, Any]
    fingerprint_sha256: str
    version_key: str
    reason: str
    changes: list[dict[str, Any]] | None


def record_statements(
    run_id: str,
    *,
    seq: int,
    fingerprint: dict[str, Any],
    sha256: str,
    version_key: str,
    reason: str,
    changes: list[dict[str, Any]] | None,
) -> list[tuple[Any, dict[str, Any]]]:
    """A new run_versions row, and the run's claim key with it (for Journal.commit)."""
    row = storable(
        {
            "run_id": run_id,
            "seq": seq,
            "fingerprint": fingerprint,
            "fingerprint_sha256": sha256,
            "version_key": version_key,
            "reason": reason,
            "changes": changes,
            "recorded_at": utcnow(),
        }
    )
    return [
        (insert(run_versions).values(**row), {}),
        (update(runs).where(runs.c.id == run_id).values(version_key=version_key), {}),
    ]


def last_version(
    engine: Engine, run_id: str, policy: retrying.StorePolicy | None = None
) -> VersionRecord | None:
    def read() -> VersionRecord | None:
        with engine.connect() as conn:
            row = conn.execute(
                select(run_versions)
                .where(run_versions.c.run_id == run_id)
                .order_by(run_versions.c.id.desc())
                .limit(1)
            ).first()
        return None if row is None else _record(row)

    return retrying.run(read, policy or retrying.StorePolicy())


def versions(engine: Engine, run_id: str) -> list[VersionRecord]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(run_versions).where(run_versions.c.run_id == run_id).order_by(run_versions.c.id)
        ).all()
    return [_record(r) for r in rows]


def _record(row: Any) -> VersionRecord:
    m = row._mapping
    return VersionRecord(**{name: m[name] for name in VersionRecord.__struct_fields__})


def claim_filter(version_key: str) -> Any:
    """Runs a worker of `version_key` continues without anyone's consent: its own, and
    runs no release of this feature recorded (NULL: made before 0009, adopted on resume)."""
    return or_(runs.c.version_key.is_(None), runs.c.version_key == version_key)


def needs_consent(engine: Engine) -> list[str]:
    """Ids of runs stopped `blocked` for a change since their checkpoint, oldest first."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(runs.c.id)
            .where(and_(runs.c.status == RunStatus.BLOCKED.value, runs.c.stop_reason == CHANGED))
            .order_by(runs.c.created_at, runs.c.id)
        ).all()
    return [r.id for r in rows]


def pending_question(engine: Engine, run_id: str) -> str | None:
    """The readable diff of a run waiting for consent (the pending approval's reason)."""
    with engine.connect() as conn:
        return conn.execute(
            select(approvals.c.reason)
            .where(
                approvals.c.run_id == run_id,
                approvals.c.kind == CHANGED,
                approvals.c.decision.is_(None),
            )
            .order_by(approvals.c.id.desc())
            .limit(1)
        ).scalar()


def schema_ahead(engine: Engine) -> str | None:
    """The store's revision when it is one this code does not know (a newer durable-agent
    upgraded it): a worker stops claiming. None when it is ours (or older)."""
    with engine.connect() as conn:
        revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    if revision is None or revision == HEAD_REVISION:
        return None
    return str(revision) if _number(revision) > _number(HEAD_REVISION) else None


def _number(revision: str) -> int:
    digits = "".join(c for c in str(revision) if c.isdigit())
    return int(digits) if digits else 0
