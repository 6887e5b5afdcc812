"""The workspace as part of the checkpoint: content-addressed blobs and trees, the changes
of each step (and the view `step_changes`), the snapshot ids on steps, fork lineage on runs,
and `approvals.restore_workspace` (`approve --restore`).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

import sqlalchemy as sa

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

STEP_CHANGES = """
CREATE VIEW step_changes AS
SELECT c.run_id, c.seq, c.path, c.change, c.bytes
FROM workspace_changes c
"""


def upgrade() -> None:
    op.create_table(
        "workspace_blobs",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "workspace_trees",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("base", sa.String(64)),
        sa.Column("depth", sa.Integer, nullable=False),
        sa.Column("entries", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "workspace_changes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("change", sa.String(8), nullable=False),
        sa.Column("bytes", sa.BigInteger),
    )
    op.create_index("ix_workspace_changes_run_seq", "workspace_changes", ["run_id", "seq"])
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("tree_before", sa.String(64)))
        batch.add_column(sa.Column("tree_id", sa.String(64)))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("forked_from", sa.String(64)))
        batch.add_column(sa.Column("fork_seq", sa.Integer))
        batch.add_column(sa.Column("tree_start", sa.String(64)))
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("restore_workspace", sa.Boolean))
    op.execute(STEP_CHANGES)


def downgrade() -> None:
    op.execute("DROP VIEW step_changes")
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("restore_workspace")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("tree_start")
        batch.drop_column("fork_seq")
        batch.drop_column("forked_from")
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("tree_id")
        batch.drop_column("tree_before")
    op.drop_index("ix_workspace_changes_run_seq", "workspace_changes")
    op.drop_table("workspace_changes")
    op.drop_table("workspace_trees")
    op.drop_table("workspace_blobs")
