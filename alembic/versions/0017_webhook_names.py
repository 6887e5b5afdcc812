"""`notifications.target` names a webhook without its path or query.

A Slack or Discord hook's URL holds its credential in the path, others take `?token=`:
the outbox kept the whole URL. A row now names a webhook by its scheme and host and a
digest of the whole URL (config/settings.py `webhook_name`, whose words are copied here so
that this revision stays what it is), and this rewrites the rows stored before. A command
target (a JSON list) is left as it is.

A deliverer of this version still sends a pending row that names its webhook by the whole
URL (one a process of an earlier version queued after this ran).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

import hashlib
from urllib.parse import urlsplit

import sqlalchemy as sa

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

notifications = sa.table("notifications", sa.column("id", sa.Integer), sa.column("target", sa.Text))


def webhook_name(url: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    digest = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{parts.scheme}://{host}/... sha256:{digest}"


def upgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(notifications.c.id, notifications.c.target).where(
            sa.or_(
                notifications.c.target.like("http://%"), notifications.c.target.like("https://%")
            )
        )
    ).all()
    for row_id, target in rows:
        if "/... sha256:" in target:
            continue  # named so already
        conn.execute(
            notifications.update()
            .where(notifications.c.id == row_id)
            .values(target=webhook_name(target))
        )


def downgrade() -> None:
    pass  # the URLs are not kept: a downgraded deliverer cannot send the pending rows again
