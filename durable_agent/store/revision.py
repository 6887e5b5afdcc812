"""Facts about the store that need no SQLAlchemy (for the commands that read it without:
store/sqlite_reads.py)."""

HEAD_REVISION = "0019"  # the Alembic head the tables mirror; a test holds it equal to alembic/
MAX_RUN_ID_PREFIX = (
    1000  # longer ids are matched whole, never as a prefix (SQLite refuses a long LIKE)
)
