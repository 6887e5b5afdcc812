"""A partial index over the steps that recorded a workspace snapshot.

`store/blobs.py` `tree_at` (a resume's drift check, `restore`, `fork`, `diff`) looks for
the run's last step with a `tree_id` or a `tree_before`, and the first with a
`tree_before`. A step that changes nothing in the workspace (a model call, a file read)
records neither, so in a run of mostly such steps both lookups read every step of the run
backwards through the primary key: 14 ms of a 10,000-step run's resume, growing with the
run. ix_steps_trees holds only the steps that recorded a tree.

The WHERE clause is the first lookup's own term, as it spells it (a partial index is used
only when the query's WHERE implies the index's: 0016); the second's `tree_before IS NOT
NULL` implies it, which SQLite and PostgreSQL both prove.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""

import sqlalchemy as sa

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

TREES = sa.text("tree_id IS NOT NULL OR tree_before IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_steps_trees", "steps", ["run_id", "seq"], postgresql_where=TREES, sqlite_where=TREES
    )


def downgrade() -> None:
    op.drop_index("ix_steps_trees", table_name="steps")
