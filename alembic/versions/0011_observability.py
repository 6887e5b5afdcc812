"""Watched from elsewhere: cached prompt tokens and cost per step (and their run totals),
the run's trace id (one OpenTelemetry trace across crashes and resumes), and the
`notifications` outbox (a row per event and target, written in the transaction that
changes the run's status; delivered afterwards, once per idempotency key), and
`web_links`: the web view's public address and the key that signs its approve links.

Revision ID: 0011
Revises: 0006
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("cached_tokens", sa.Integer))
        batch.add_column(sa.Column("cost", sa.Float))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("cached_tokens", sa.BigInteger))
        batch.add_column(sa.Column("cost", sa.Float))
        batch.add_column(sa.Column("trace_id", sa.String(32)))
    op.create_table(
        "notifications",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("idempotency_key", sa.String(200), nullable=False),
        sa.Column("run_id", sa.String(64)),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column(
            "payload",
            sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("claimed_until", sa.DateTime),
        sa.Column("delivered_at", sa.DateTime),
        sa.Column("last_error", sa.Text),
        sa.UniqueConstraint("idempotency_key", name="uq_notifications_key"),
    )
    op.create_index("ix_notifications_delivered", "notifications", ["delivered_at", "id"])
    op.create_table(
        "web_links",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("public_url", sa.Text),
        sa.Column("secret", sa.String(64), nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("web_links")
    op.drop_index("ix_notifications_delivered", "notifications")
    op.drop_table("notifications")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("trace_id")
        batch.drop_column("cost")
        batch.drop_column("cached_tokens")
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("cost")
        batch.drop_column("cached_tokens")
