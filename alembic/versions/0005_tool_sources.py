"""runs.tool_sources: the tools a run was offered beyond the built-in ones.

The MCP servers of the run (how to start each) and every tool they offered, with its name,
schema and effect class, as the run first saw them. A resume offers exactly these tools
with these effect classes, even if a server's annotations changed since; a tool that
disappeared from its server becomes an error observation, not a crash.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json = sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("tool_sources", json))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("tool_sources")
