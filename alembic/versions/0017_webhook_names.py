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
import re
from urllib.parse import urlsplit

import sqlalchemy as sa

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

notifications = sa.table("notifications", sa.column("id", sa.Integer), sa.column("target", sa.Text))


_NAMED = re.compile(r"https?://[^/]*/\.\.\. sha256:[0-9a-f]{16}")


def webhook_name(url: str) -> str:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # `https://user:pa/ss@host`: the "port" may end a password
        port, host = None, "?"
    else:
        host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"  # IPv6
    digest = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{parts.scheme}://{host}{'' if port is None else f':{port}'}/... sha256:{digest}"


def upgrade() -> None:
    # Every target that is not a command (a JSON list) is looked at in Python: the config's
    # check (urlsplit) and urllib take `HTTPS://...` and ` https://...` (blanks before it)
    # for webhooks too, and PostgreSQL's LIKE minds the case. One UPDATE a target, not a row:
    # an outbox holds many rows for few targets.
    conn = op.get_bind()
    targets = conn.execute(
        sa.select(notifications.c.target).distinct().where(~notifications.c.target.like("[%"))
    ).scalars()
    for target in list(targets):
        try:
            webhook = urlsplit(target).scheme in ("http", "https")
        except ValueError:  # (no config's url: the check refuses it)
            webhook = False
        if not webhook or _NAMED.fullmatch(target):
            continue  # not a webhook, or named so already
        conn.execute(
            notifications.update()
            .where(notifications.c.target == target)
            .values(target=webhook_name(target))
        )


def downgrade() -> None:
    pass  # the URLs are not kept: a downgraded deliverer cannot send the pending rows again
