"""Indexes for the worker's claim query and for `list`.

- ix_runs_claimable: a partial index over the runs a worker may claim (`pending` or
  `running`), in claim order. It stays small however many finished runs pile up, and
  `SELECT … WHERE status IN ('pending', 'running') … ORDER BY created_at, id LIMIT 1 FOR
  UPDATE SKIP LOCKED` reads it in order and stops at the first unlocked row.
  lease_expires_at is deliberately not indexed: every heartbeat and checkpoint rewrites it,
  and on PostgreSQL an indexed column changing there would rule out HOT updates of `runs`.
- ix_runs_created_id / ix_runs_status_created_id: `list` orders by (created_at, id)
  descending, with or without a status filter; the id completes the order, so the first
  page comes straight from the index without a sort. They replace the (created_at) and
  (status, created_at) indexes of 0001, which they cover.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

CLAIMABLE = sa.text("status IN ('pending', 'running')")


def upgrade() -> None:
    op.create_index(
        "ix_runs_claimable",
        "runs",
        ["created_at", "id"],
        postgresql_where=CLAIMABLE,
        sqlite_where=CLAIMABLE,
    )
    op.create_index("ix_runs_created_id", "runs", ["created_at", "id"])
    op.create_index("ix_runs_status_created_id", "runs", ["status", "created_at", "id"])
    op.drop_index("ix_runs_created", table_name="runs")
    op.drop_index("ix_runs_status_created", table_name="runs")


def downgrade() -> None:
    op.create_index("ix_runs_status_created", "runs", ["status", "created_at"])
    op.create_index("ix_runs_created", "runs", ["created_at"])
    op.drop_index("ix_runs_status_created_id", table_name="runs")
    op.drop_index("ix_runs_created_id", table_name="runs")
    op.drop_index("ix_runs_claimable", table_name="runs")
