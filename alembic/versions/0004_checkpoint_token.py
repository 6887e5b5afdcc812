"""runs.last_checkpoint: the token of the last checkpoint transaction that committed.

Every fenced checkpoint writes a fresh token into its run row, in the same transaction as
its step and message rows. When the connection drops while COMMIT is in flight, the
writer cannot know whether the transaction landed; reading the token back settles it
(ours: it committed, do not write it again; not ours: it did not, write it again).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("last_checkpoint", sa.String(32)))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("last_checkpoint")
