"""Initial schema: runs, steps, messages, approvals and the run_timeline view.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine:
    return sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("task", sa.Text, nullable=False),
        sa.Column("workspace", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("stop_reason", sa.String(32)),
        sa.Column("answer", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.Column("finished_at", sa.DateTime),
        sa.Column("step_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("tool_call_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("lease_owner", sa.String(200)),
        sa.Column("lease_expires_at", sa.DateTime),
        sa.Column("lease_epoch", sa.Integer, nullable=False, server_default="0"),
        sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("settings", _json()),
        sa.Column("message_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("active_ms", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("resume_count", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_index("ix_runs_status_created", "runs", ["status", "created_at"])
    op.create_index("ix_runs_created", "runs", ["created_at"])

    op.create_table(
        "steps",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("idempotency_key", sa.String(200), nullable=False),
        sa.Column("call_id", sa.String(200)),
        sa.Column("tool_name", sa.String(100)),
        sa.Column("input", _json()),
        sa.Column("output", _json()),
        sa.Column("error", sa.Text),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="1"),
        sa.Column("prompt_tokens", sa.Integer),
        sa.Column("completion_tokens", sa.Integer),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("finished_at", sa.DateTime),
        sa.Column("duration_ms", sa.Integer),
        sa.Column("turn", sa.Integer),
        sa.Column("effect", sa.String(8)),
        sa.Column("pgid", sa.Integer),
        sa.Column("lease_epoch", sa.Integer),
        sa.UniqueConstraint("run_id", "seq", name="uq_steps_run_seq"),
        sa.UniqueConstraint("run_id", "idempotency_key", name="uq_steps_run_key"),
    )

    op.create_table(
        "messages",
        sa.Column(
            "run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text),
        sa.Column("tool_calls", _json()),
        sa.Column("tool_call_id", sa.String(200)),
        sa.Column("step_seq", sa.Integer),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )

    op.create_table(
        "approvals",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("call_id", sa.String(200), nullable=False),
        sa.Column("step_seq", sa.Integer),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("tool_name", sa.String(100)),
        sa.Column("command", sa.Text),
        sa.Column("reason", sa.Text),
        sa.Column("requested_at", sa.DateTime, nullable=False),
        sa.Column("decision", sa.String(16)),
        sa.Column("decided_by", sa.String(200)),
        sa.Column("decided_at", sa.DateTime),
        sa.Column("used_at", sa.DateTime),
    )
    op.create_index("ix_approvals_run", "approvals", ["run_id", "call_id"])

    op.execute(
        """
        CREATE VIEW run_timeline AS
        SELECT s.run_id, s.seq, s.turn, s.kind, s.tool_name, s.state, s.attempts,
               s.duration_ms, s.prompt_tokens, s.completion_tokens,
               s.started_at, s.finished_at, s.error, s.idempotency_key
        FROM steps s
        """
    )


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS run_timeline")
    op.drop_table("approvals")
    op.drop_table("messages")
    op.drop_table("steps")
    op.drop_table("runs")
