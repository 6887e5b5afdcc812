"""run_versions: what a run ran with (durable-agent, schema, prompt, tools, model, settings).

One row each time that changed for the run (its first session, an accepted or compatible
change on a resume, a `continue`): `seq` is the step from which it took effect, `fingerprint`
the whole of it as JSON (readable with json_extract / ->>), `reason` why the row was written.
`runs.version_key` is the hash of the parts of the run's latest fingerprint whose change needs
a person's consent: a worker claims only runs whose key is its own (store/queue.py).

Adding a table and a nullable column takes PostgreSQL's lock on `runs` only for the
catalog change: workers of the previous release holding leases wait a moment, lose nothing
(their statements name their columns) and carry on.

Revision ID: 0009
Revises: 0006
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision = "0009"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json = sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
    op.create_table(
        "run_versions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("fingerprint", json, nullable=False),
        sa.Column("fingerprint_sha256", sa.String(64), nullable=False),
        sa.Column("version_key", sa.String(64), nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("changes", json),
        sa.Column("recorded_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_run_versions_run", "run_versions", ["run_id", "id"])
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("version_key", sa.String(64)))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("version_key")
    op.drop_index("ix_run_versions_run", "run_versions")
    op.drop_table("run_versions")
