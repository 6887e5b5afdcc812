"""Fleets: batches of tasks, queue controls shared by every worker, rate limits, schedules.

- runs.batch_id / runs.priority / runs.queue_key: what a claim orders and limits by
  (docs/fleets.md). Claims go by priority (higher first), then age; a run's queue_key and
  its batch's max_parallel cap how many of its kind hold live leases at once.
- ix_runs_claim_order: the claimable runs (pending or running) in claim order, partial
  like ix_runs_claimable, so the claim reads them in order and stops at the first free one.
- queue_keys: the concurrency limit of a key (a key with no row allows one run at a time).
- batches / batch_tasks: a batch and its tasks; (batch_id, task_id) is the dedup key.
- rate_limits / rate_events: a sliding window per model and measure (rpm, tpm); the
  rate_limits row is what a taker locks (FOR UPDATE on PostgreSQL, BEGIN IMMEDIATE on SQLite).
- schedules / schedule_ticks: cron schedules; (schedule, tick) is the idempotency key of
  the one run a tick starts.

Revision ID: 0010
Revises: 0006
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine:  # type: ignore[type-arg]
    return sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


CLAIMABLE = sa.text("status IN ('pending', 'running')")


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("batch_id", sa.String(64)))
        batch.add_column(sa.Column("priority", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("queue_key", sa.String(200)))
    op.create_index(
        "ix_runs_claim_order",
        "runs",
        [sa.text("priority DESC"), "created_at", "id"],  # the claim's own order
        postgresql_where=CLAIMABLE,
        sqlite_where=CLAIMABLE,
    )
    op.create_index("ix_runs_batch", "runs", ["batch_id"])
    op.create_table(
        "queue_keys",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("max_running", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("status", sa.String(20), nullable=False),  # active | cancelled | finished
        sa.Column("max_parallel", sa.Integer),
        sa.Column("workdir", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.Column("finished_at", sa.DateTime),
    )
    op.create_table(
        "batch_tasks",
        sa.Column(
            "batch_id",
            sa.String(64),
            sa.ForeignKey("batches.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("task_id", sa.String(200), primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),  # line order in the submitted file
        sa.Column("spec", _json()),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "rate_limits",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "rate_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("run_id", sa.String(64)),
    )
    op.create_index("ix_rate_events_key_at", "rate_events", ["key", "at"])
    op.create_table(
        "schedules",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("cron", sa.String(200), nullable=False),
        sa.Column("tz", sa.String(100), nullable=False),
        sa.Column("task", sa.Text, nullable=False),
        sa.Column("settings", _json()),
        sa.Column("catch_up", sa.String(8), nullable=False),  # none | one
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("next_tick", sa.DateTime, nullable=False),  # naive UTC
        sa.Column("last_tick", sa.DateTime),
        sa.Column("last_run_id", sa.String(64)),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "schedule_ticks",
        sa.Column(
            "schedule",
            sa.String(200),
            sa.ForeignKey("schedules.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("tick", sa.DateTime, primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("schedule_ticks")
    op.drop_table("schedules")
    op.drop_index("ix_rate_events_key_at", table_name="rate_events")
    op.drop_table("rate_events")
    op.drop_table("rate_limits")
    op.drop_table("batch_tasks")
    op.drop_table("batches")
    op.drop_table("queue_keys")
    op.drop_index("ix_runs_batch", table_name="runs")
    op.drop_index("ix_runs_claim_order", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("queue_key")
        batch.drop_column("priority")
        batch.drop_column("batch_id")
