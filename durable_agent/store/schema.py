"""Tables (SPEC §7). The schema is created and changed only by the Alembic migrations in
alembic/versions; this module mirrors the head revision for the queries in journal.py.

JSON columns hold JSON text on SQLite (readable with json_extract) and jsonb on PostgreSQL.
Times are naive UTC.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

# The Alembic revision this code expects (engine.py upgrades any database behind it).
from durable_agent.store.revision import HEAD_REVISION as HEAD_REVISION

metadata = MetaData()


class JsonColumn(TypeDecorator[Any]):
    """JSON text on SQLite, jsonb on PostgreSQL. A decorator rather than `with_variant`, so
    SQLAlchemy's PostgreSQL dialect is imported only for a PostgreSQL store: it cost every
    command on an SQLite store a seventh of its start-up."""

    impl = JSON
    cache_ok = True

    def __init__(self) -> None:
        super().__init__(none_as_null=True)

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB(none_as_null=True))
        return dialect.type_descriptor(JSON(none_as_null=True))


def json_type() -> JsonColumn:
    return JsonColumn()


runs = Table(
    "runs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("task", Text, nullable=False),
    Column("workspace", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("status", String(20), nullable=False),
    Column("stop_reason", String(32)),
    Column("answer", Text),
    Column("error", Text),
    Column("created_at", DateTime, nullable=False),
    Column("updated_at", DateTime, nullable=False),
    Column("finished_at", DateTime),
    Column("step_count", Integer, nullable=False, default=0),
    Column("tool_call_count", Integer, nullable=False, default=0),
    Column("prompt_tokens", BigInteger, nullable=False, default=0),
    Column("completion_tokens", BigInteger, nullable=False, default=0),
    Column("lease_owner", String(200)),
    Column("lease_expires_at", DateTime),
    Column("lease_epoch", Integer, nullable=False, default=0),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    # Beyond the fixed names:
    Column("settings", json_type()),  # the run's recorded settings (never the API key)
    Column("message_count", Integer, nullable=False, default=0),
    Column("active_ms", BigInteger, nullable=False, default=0),  # summed over resumes
    Column("resume_count", Integer, nullable=False, default=0),
    Column("last_checkpoint", String(32)),  # 0004: token of the last committed checkpoint
    Column("tool_sources", json_type()),  # 0005: MCP servers and their tools as first offered
    Column("forked_from", String(64)),  # 0006: the run this one was forked from (`fork`)
    Column("fork_seq", Integer),  # 0006: ... after its step with this seq
    Column("tree_start", String(64)),  # 0006: the workspace snapshot taken when the run was created
    Column("version_key", String(64)),  # 0009: what must match for a worker to claim it
    Column("batch_id", String(64)),  # 0010: the batch this run is a task of
    Column("priority", Integer, nullable=False, default=0),  # 0010: higher is claimed first
    Column("queue_key", String(200)),  # 0010: concurrency key (queue_keys.max_running, else 1)
    Column("cached_tokens", BigInteger),  # 0011: prompt tokens the provider served from its cache
    Column("cost", Float),  # 0011: the sum of the steps' costs (NULL: no price for the model)
    Column("trace_id", String(32)),  # 0011: the run's one OpenTelemetry trace (hex)
    Column("parent_id", String(64)),  # 0014: the run that delegated this one (`delegate`)
    Column("parent_step", Integer),  # 0014: ... in its step with this seq
)
# 0003: `list` pages in (created_at, id) order; workers claim from the small partial index
# ix_runs_claimable (created_at, id) WHERE status IN ('pending', 'running'), which is left
# out here: its dialect options would import SQLAlchemy's PostgreSQL dialect into every
# command on an SQLite store, and only the migrations create indexes.
Index("ix_runs_created_id", runs.c.created_at, runs.c.id)
Index("ix_runs_status_created_id", runs.c.status, runs.c.created_at, runs.c.id)

steps = Table(
    "steps",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("state", String(16), nullable=False),
    Column("idempotency_key", String(200), nullable=False),
    Column("call_id", String(200)),
    Column("tool_name", String(100)),
    Column("input", json_type()),
    Column("output", json_type()),
    Column("error", Text),
    Column("attempts", Integer, nullable=False, default=1),
    Column("prompt_tokens", Integer),
    Column("completion_tokens", Integer),
    Column("started_at", DateTime, nullable=False),
    Column("finished_at", DateTime),
    Column("duration_ms", Integer),
    # Beyond the fixed names:
    Column("turn", Integer),  # the model turn this step belongs to
    Column("effect", String(8)),  # read | write | exec for tools
    Column("pgid", Integer),  # process group of a running command, for resume to check
    Column("lease_epoch", Integer),  # the epoch that wrote the intent
    Column("tree_before", String(64)),  # 0006: workspace snapshot when the step started
    Column("tree_id", String(64)),  # 0006: workspace snapshot after the step (effect steps)
    Column("cached_tokens", Integer),  # 0011: of prompt_tokens, served from the provider's cache
    Column("cost", Float),  # 0011: at the price table's price when the step was paid
    UniqueConstraint("run_id", "seq", name="uq_steps_run_seq"),
    UniqueConstraint("run_id", "idempotency_key", name="uq_steps_run_key"),
)

messages = Table(
    "messages",
    metadata,
    Column("run_id", String(64), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("role", String(16), nullable=False),
    Column("content", Text),
    Column("tool_calls", json_type()),
    Column("tool_call_id", String(200)),
    Column("step_seq", Integer),  # the step that produced it
    Column("created_at", DateTime, nullable=False),
)

approvals = Table(
    "approvals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("call_id", String(200), nullable=False),
    Column("step_seq", Integer),
    Column("kind", String(32), nullable=False),  # approval_required | uncertain_side_effect
    Column("tool_name", String(100)),
    Column("command", Text),
    Column("reason", Text),
    Column("requested_at", DateTime, nullable=False),
    Column("decision", String(16)),  # NULL while pending, then approved | denied
    Column("decided_by", String(200)),
    Column("decided_at", DateTime),
    Column("used_at", DateTime),  # when resume acted on the decision
    Column(
        "restore_workspace", Boolean
    ),  # 0006: `approve --restore`: pre-command snapshot back first
)
Index("ix_approvals_run", approvals.c.run_id, approvals.c.call_id)

# 0006: the workspace as part of the checkpoint (workspace/). Blobs and trees are content
# addressed and shared by all runs; a tree is a full manifest or a delta on a base tree.
workspace_blobs = Table(
    "workspace_blobs",
    metadata,
    Column("hash", String(64), primary_key=True),  # sha256 of the uncompressed bytes
    Column("size", BigInteger, nullable=False),  # uncompressed
    Column("data", LargeBinary, nullable=False),  # zlib
)

workspace_trees = Table(
    "workspace_trees",
    metadata,
    Column("id", String(64), primary_key=True),  # sha256 of the canonical full manifest
    Column("base", String(64)),  # NULL: `data` is a full manifest; else a delta on this tree
    Column("depth", Integer, nullable=False),  # deltas to walk down to a full manifest
    Column("entries", Integer, nullable=False),  # paths in the full manifest
    Column("data", LargeBinary, nullable=False),  # zlib of JSON (workspace/manifest.py)
    # 0015: JSON of the git commit whose files this tree's snapshot did not store (its
    # commit, repo, remote, prefix: workspace/git_baseline.py); NULL: every blob is stored
    Column("git", Text),
)

workspace_changes = Table(
    "workspace_changes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("path", Text, nullable=False),  # shown with `\xHH` for bytes that are not UTF-8
    Column("change", String(8), nullable=False),  # added | modified | deleted | mode
    Column("bytes", BigInteger),  # size after the change (before it, for deleted)
)
Index("ix_workspace_changes_run_seq", workspace_changes.c.run_id, workspace_changes.c.seq)

# 0009: what each session of a run ran with (loop/versions.py, docs/versions.md).
run_versions = Table(
    "run_versions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),  # the step from which it took effect
    Column("fingerprint", json_type(), nullable=False),
    Column("fingerprint_sha256", String(64), nullable=False),
    Column("version_key", String(64), nullable=False),
    Column("reason", String(32), nullable=False),  # start | adopted | compatible | accepted | ...
    Column("changes", json_type()),  # the differences from the row before, classified
    Column("recorded_at", DateTime, nullable=False),
)
Index("ix_run_versions_run", run_versions.c.run_id, run_versions.c.id)
# 0011: the outbox of notifications ([[notify]]): one row per event and target, inserted in
# the transaction that changes the run's status; a deliverer sends it and marks it.
notifications = Table(
    "notifications",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(200), nullable=False),  # sent as Idempotency-Key
    Column("run_id", String(64)),  # NULL for `notify test`
    Column("event", String(32), nullable=False),
    Column("target", Text, nullable=False),  # the url, or the command (JSON argv)
    Column("payload", json_type(), nullable=False),
    Column("created_at", DateTime, nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("claimed_until", DateTime),  # a deliverer is sending it until then
    Column("delivered_at", DateTime),
    Column("last_error", Text),
    UniqueConstraint("idempotency_key", name="uq_notifications_key"),
)
Index("ix_notifications_delivered", notifications.c.delivered_at, notifications.c.id)

# 0011: where the web view is reached from outside (`ui --public-url`) and the key that signs
# the approve/deny links of `blocked` notifications: one row (id 1), shared through the store
# by the view that checks the links and the processes that write them.
web_links = Table(
    "web_links",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("public_url", Text),
    Column("secret", String(64), nullable=False),  # hex; as secret as the store itself
    Column("updated_at", DateTime, nullable=False),
)

# 0010: fleets (docs/fleets.md). ix_runs_claim_order (priority, created_at, id) over the
# claimable runs is left out here like ix_runs_claimable (its dialect options).
Index("ix_runs_batch", runs.c.batch_id)

queue_keys = Table(
    "queue_keys",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("max_running", Integer, nullable=False),
    Column("updated_at", DateTime, nullable=False),
)

batches = Table(
    "batches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("status", String(20), nullable=False),  # active | cancelled | finished
    Column("max_parallel", Integer),
    Column("workdir", Text, nullable=False),
    Column("created_at", DateTime, nullable=False),
    Column("updated_at", DateTime, nullable=False),
    Column("finished_at", DateTime),
)

batch_tasks = Table(
    "batch_tasks",
    metadata,
    Column("batch_id", String(64), ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True),
    Column("task_id", String(200), primary_key=True),
    Column("run_id", String(64), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("spec", json_type()),
    Column("created_at", DateTime, nullable=False),
)

rate_limits = Table(
    "rate_limits",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("updated_at", DateTime, nullable=False),
)

rate_events = Table(
    "rate_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", String(200), nullable=False),
    Column("at", DateTime, nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("run_id", String(64)),
)
Index("ix_rate_events_key_at", rate_events.c.key, rate_events.c.at)

schedules = Table(
    "schedules",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("cron", String(200), nullable=False),
    Column("tz", String(100), nullable=False),
    Column("task", Text, nullable=False),
    Column("settings", json_type()),
    Column("catch_up", String(8), nullable=False),
    Column("paused", Boolean, nullable=False),
    Column("next_tick", DateTime, nullable=False),
    Column("last_tick", DateTime),
    Column("last_run_id", String(64)),
    Column("created_at", DateTime, nullable=False),
    Column("updated_at", DateTime, nullable=False),
)

schedule_ticks = Table(
    "schedule_ticks",
    metadata,
    Column(
        "schedule",
        String(200),
        ForeignKey("schedules.name", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("tick", DateTime, primary_key=True),
    Column("run_id", String(64), nullable=False),
    Column("created_at", DateTime, nullable=False),
)
