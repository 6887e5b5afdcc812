"""Partial indexes that keep a resume's reads independent of the run's length
(store/journal.py `Journal.load`, docs/performance.md "Long runs").

- ix_steps_open: the steps not completed (a crash's cut-off call, a failed one). A step
  enters it with its intent row and leaves it when it completes, so it holds a few rows
  per run however long the run is; a resume finds them without reading every step.
- ix_steps_turns: the `compact` and `user_message` steps (a summary, a person's message):
  a few per run, read at every resume (the view's start, the turn's budget window).
- ix_steps_paid: the paid steps' token counts and costs (model, compact, delegate), so
  the run's totals are summed from the rows without reading them (a SUM over this index).
- ix_steps_counted: the model steps whose output holds a provider's count to calibrate by
  (store/step.py `calibrating_output`): none in a scripted run, where finding that out
  read every model step's output.
- ix_messages_tool_call: the tool results by call id. A resume no longer loads the ids of
  every call a summary replaced (9,000 at 10,000 steps); a new call's id is looked up here
  instead, and so are the few a repeat streak below the view's start needs.

The WHERE clauses are the queries' own terms, as those spell them (a partial index is only
used when the query's WHERE implies the index's: on SQLite with the constants written out,
not bound). The columns a query's WHERE names are in the index too (`kind`, `role`): SQLite
3.40 reads the row for a column it lacks even where the index's WHERE settles the term.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

import sqlalchemy as sa

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

OPEN = sa.text("state != 'completed'")
TURNS = sa.text("kind = 'compact' OR kind = 'user_message'")
TOOL = sa.text("role = 'tool'")
PAID = sa.text("kind IN ('model', 'compact', 'delegate')")
COUNTED_SQLITE = sa.text("kind = 'model' AND output LIKE '%\"context\"%'")
COUNTED_POSTGRESQL = sa.text("kind = 'model' AND jsonb_typeof(output -> 'context') = 'object'")


def upgrade() -> None:
    op.create_index(
        "ix_steps_open", "steps", ["run_id", "seq"], postgresql_where=OPEN, sqlite_where=OPEN
    )
    op.create_index(
        "ix_steps_turns", "steps", ["run_id", "seq"], postgresql_where=TURNS, sqlite_where=TURNS
    )
    op.create_index(
        "ix_steps_paid",
        "steps",
        ["run_id", "kind", "prompt_tokens", "completion_tokens", "cached_tokens", "cost"],
        postgresql_where=PAID,
        sqlite_where=PAID,
    )
    op.create_index(
        "ix_steps_counted",
        "steps",
        ["run_id", "seq"],
        postgresql_where=COUNTED_POSTGRESQL,
        sqlite_where=COUNTED_SQLITE,
    )
    op.create_index(
        "ix_messages_tool_call",
        "messages",
        ["run_id", "tool_call_id", "role"],
        postgresql_where=TOOL,
        sqlite_where=TOOL,
    )


def downgrade() -> None:
    op.drop_index("ix_messages_tool_call", table_name="messages")
    op.drop_index("ix_steps_counted", table_name="steps")
    op.drop_index("ix_steps_paid", table_name="steps")
    op.drop_index("ix_steps_turns", table_name="steps")
    op.drop_index("ix_steps_open", table_name="steps")
