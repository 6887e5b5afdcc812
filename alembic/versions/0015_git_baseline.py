"""The git baseline (`snapshot_baseline = "git"`): a workspace tree records the git commit
whose files its snapshot left to the repository (docs/data.md, workspace/git_baseline.py).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

import sqlalchemy as sa

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workspace_trees") as batch:
        batch.add_column(sa.Column("git", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("workspace_trees") as batch:
        batch.drop_column("git")
