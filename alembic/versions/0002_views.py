"""Views for people who inspect the store with sqlite3 or psql: tool_calls, run_totals,
pending_approvals (docs/schema.md explains every column, docs/queries.md uses them).

Plain SQL that SQLite and PostgreSQL both accept, except reading the arguments out of the
JSON `input` column, which is spelled per dialect.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# SQLite's json_extract returns an object as JSON text; PostgreSQL's -> keeps it jsonb.
_ARGUMENTS = {
    "sqlite": "json_extract(s.input, '$.arguments')",
    "postgresql": "s.input -> 'arguments'",
}

TOOL_CALLS = """
CREATE VIEW tool_calls AS
SELECT s.run_id, s.seq, s.turn, s.call_id, s.tool_name, s.effect, s.state, s.attempts,
       s.duration_ms, s.started_at, s.finished_at, s.error, s.idempotency_key, s.lease_epoch,
       {arguments} AS arguments
FROM steps s
WHERE s.kind = 'tool'
"""

# Aggregates come from subqueries joined on run id, so a run without steps or approvals
# still has its row (LEFT JOIN) with zeros (COALESCE).
RUN_TOTALS = """
CREATE VIEW run_totals AS
SELECT r.id AS run_id, r.status, r.stop_reason, r.model, r.task, r.created_at, r.finished_at,
       r.step_count AS model_calls, r.tool_call_count AS tool_calls, r.message_count,
       r.prompt_tokens, r.completion_tokens, r.prompt_tokens + r.completion_tokens AS total_tokens,
       r.active_ms, r.resume_count,
       COALESCE(s.step_rows, 0) AS step_rows,
       COALESCE(s.failed_steps, 0) AS failed_steps,
       COALESCE(s.unfinished_steps, 0) AS unfinished_steps,
       COALESCE(s.extra_attempts, 0) AS extra_attempts,
       COALESCE(s.model_ms, 0) AS model_ms,
       COALESCE(s.tool_ms, 0) AS tool_ms,
       COALESCE(a.pending_approvals, 0) AS pending_approvals
FROM runs r
LEFT JOIN (
    SELECT run_id,
           COUNT(*) AS step_rows,
           SUM(CASE WHEN state = 'failed' THEN 1 ELSE 0 END) AS failed_steps,
           SUM(CASE WHEN state = 'started' THEN 1 ELSE 0 END) AS unfinished_steps,
           SUM(attempts - 1) AS extra_attempts,
           SUM(CASE WHEN kind = 'model' THEN COALESCE(duration_ms, 0) ELSE 0 END) AS model_ms,
           SUM(CASE WHEN kind = 'tool' THEN COALESCE(duration_ms, 0) ELSE 0 END) AS tool_ms
    FROM steps
    GROUP BY run_id
) s ON s.run_id = r.id
LEFT JOIN (
    SELECT run_id, COUNT(*) AS pending_approvals
    FROM approvals
    WHERE decision IS NULL
    GROUP BY run_id
) a ON a.run_id = r.id
"""

PENDING_APPROVALS = """
CREATE VIEW pending_approvals AS
SELECT a.id AS approval_id, a.run_id, a.kind, a.call_id, a.tool_name, a.command, a.reason,
       a.requested_at, r.status AS run_status, r.task
FROM approvals a
JOIN runs r ON r.id = a.run_id
WHERE a.decision IS NULL
"""


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    arguments = _ARGUMENTS.get(dialect, _ARGUMENTS["sqlite"])
    op.execute(TOOL_CALLS.format(arguments=arguments))
    op.execute(RUN_TOTALS)
    op.execute(PENDING_APPROVALS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS pending_approvals")
    op.execute("DROP VIEW IF EXISTS run_totals")
    op.execute("DROP VIEW IF EXISTS tool_calls")
