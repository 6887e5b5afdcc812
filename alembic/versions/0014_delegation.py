"""Delegation: a child run records its parent run and the parent's `delegate` step, and the
view `run_tree(root_id, run_id, parent_id, depth)` walks every run's tree (docs/delegation.md).

Revision ID: 0014
Revises: 0006
Create Date: 2026-12-05
"""

import sqlalchemy as sa

from alembic import op

revision = "0014"
down_revision = "0011"
branch_labels = None
depends_on = None

# A recursive CTE in a view: the same text on SQLite and PostgreSQL. The roots are the runs
# without a parent; depth 0 is the root itself.
RUN_TREE = """
CREATE VIEW run_tree AS
WITH RECURSIVE tree(root_id, run_id, parent_id, depth) AS (
    SELECT r.id, r.id, r.parent_id, 0 FROM runs r WHERE r.parent_id IS NULL
    UNION ALL
    SELECT t.root_id, c.id, c.parent_id, t.depth + 1
    FROM runs c JOIN tree t ON c.parent_id = t.run_id
)
SELECT root_id, run_id, parent_id, depth FROM tree
"""


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("parent_id", sa.String(64)))
        batch.add_column(sa.Column("parent_step", sa.Integer))
    op.create_index("ix_runs_parent", "runs", ["parent_id"])
    op.execute(RUN_TREE)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS run_tree")
    op.drop_index("ix_runs_parent", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("parent_step")
        batch.drop_column("parent_id")
