"""Alembic environment. Used by durable-agent itself (engine.upgrade hands over a connection)
and by people running `alembic` by hand (alembic.ini, URL from DURABLE_AGENT_DB)."""

from __future__ import annotations

import os

from sqlalchemy import text

from alembic import context
from durable_agent.store.engine import make_engine
from durable_agent.store.schema import metadata

config = context.config
target_metadata = metadata


def run_migrations(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER most things
        transactional_ddl=True,
    )
    if connection.dialect.name == "postgresql":
        # Several workers may start on an empty database at once: migrate one at a time.
        connection.execute(text("SELECT pg_advisory_xact_lock(727274)"))
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    run_migrations(connection)
else:
    url = os.environ.get("DURABLE_AGENT_DB") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("set DURABLE_AGENT_DB to the database URL")
    engine = make_engine(url)
    with engine.begin() as conn:
        run_migrations(conn)
