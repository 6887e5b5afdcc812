"""Settings: defaults < user config file (TOML) < project config (.durable-agent/config.toml
in the workspace) < environment (DURABLE_AGENT_<SETTING>) < command-line flags.

Validated once, here. Nothing else in the package reads the environment for settings;
`load_settings` is given the environment by the CLI.
"""

# No `from __future__ import annotations` here: the Settings model's annotations, read as
# strings, were each compiled again by typing.ForwardRef on every start (a fifth of building
# the model); evaluated where they are written they cost nothing more.
import functools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    PrivateAttr,
    SecretStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import CoreSchema, core_schema

from durable_agent.config.layers import (  # noqa: F401  (ENV_VARS, default_db_url: the settings' layers)
    ENV_VARS,
    default_config_path,
    default_db_url,
    merge_layers,
    read_config_file,
)
from durable_agent.config.mcp_servers import (
    McpServerConfig,
    check_server_names,
    holds_redacted,
    merge_recorded,
    recorded_env,
)
from durable_agent.config.policy import Hook, Rule
from durable_agent.config.shell_policy import DEFAULT_ALLOWLIST  # one list, kept with its parser
from durable_agent.encoding import name_from_arg
from durable_agent.errors import ConfigError
from durable_agent.redact import Redactor, is_secret_name


class _WhenGiven:
    """Marks a setting whose type is validated by a validator built the first time a value is
    given for it (a config's [[rules]], [[hooks]], [mcp_servers.NAME]...): built with the
    Settings model, they cost every start about 1% of its instructions, for settings most
    configs never give. (Their models are built when defined: pydantic 2.7 to 2.10, within
    the declared floor, cannot dump a model whose build was deferred from such a field.)
    The validation and its errors (their locations too) are the type's own; a value dumps
    as what it is (its models' serializers)."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(functools.partial(_validate, source))


WhenGiven = _WhenGiven()


@functools.cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def _validate(kind: Any, value: Any) -> Any:
    return _adapter(kind).validate_python(value)


class ModelPrice(BaseModel):
    """What one model costs, per million tokens (any currency; USD for the hosted APIs)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    input_per_mtok: float = Field(ge=0, le=1e6)
    """Price of one million prompt tokens."""
    output_per_mtok: float = Field(ge=0, le=1e6)
    """Price of one million completion tokens."""
    cached_input_per_mtok: float | None = Field(None, ge=0, le=1e6)
    """Price of one million prompt tokens served from the provider's cache (input_per_mtok
    when unset)."""

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        cached = min(max(cached_tokens, 0), prompt_tokens)
        cached_price = (
            self.input_per_mtok
            if self.cached_input_per_mtok is None
            else self.cached_input_per_mtok
        )
        return (
            (prompt_tokens - cached) * self.input_per_mtok
            + cached * cached_price
            + completion_tokens * self.output_per_mtok
        ) / 1e6


NOTIFY_EVENTS = (
    "blocked",
    "completed",
    "failed",
    "budget_exceeded",
    "changed_since_checkpoint",
    "batch_done",
)
NotifyEvent = Literal[
    "blocked", "completed", "failed", "budget_exceeded", "changed_since_checkpoint", "batch_done"
]


def _default_events() -> list[NotifyEvent]:
    return ["blocked", "completed", "failed", "budget_exceeded"]


class NotifyTarget(BaseModel):
    """One `[[notify]]` entry: a webhook (`url`) or a local program (`command`), and the
    events it is sent (docs/observability.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = None
    """POSTed the event as JSON, with Idempotency-Key and a signature header."""
    command: list[str] | None = None
    """Run with the event as JSON on stdin (exit 0: delivered)."""
    events: list[NotifyEvent] = Field(default_factory=_default_events)
    secret: SecretStr | None = None
    """Key of the HMAC-SHA256 signature header (webhooks)."""

    @model_validator(mode="after")
    def _one_target(self) -> "NotifyTarget":
        if (self.url is None) == (self.command is None):
            raise ValueError("a [[notify]] entry needs either url or command, not both")
        if self.command is not None and not self.command:
            raise ValueError("a [[notify]] command needs a program")
        if self.url is not None:
            # (The url is not repeated in these errors: its path or query may be a secret.)
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("a [[notify]] url must be http:// or https:// and name a host")
            try:
                parts.port  # noqa: B018  (urllib's own parse: a "port" that holds a password's end)
            except ValueError:
                raise ValueError(
                    "a [[notify]] url has a host:port whose port is not a number (a password "
                    "goes before the host: https://user:password@host/...)"
                ) from None
            if not self.url.isascii():
                raise ValueError(
                    "a [[notify]] url must be ASCII: percent-encode its path and query"
                )
        return self

    @property
    def target(self) -> str:
        """How the outbox names it: a webhook by webhook_name (never its path or query),
        the command as a JSON list."""
        import json

        return webhook_name(self.url) if self.url is not None else json.dumps(self.command)


def webhook_name(url: str) -> str:
    """A webhook as the store names it (`notifications.target`): its scheme, host and port,
    and a digest of the whole URL that tells targets apart. A Slack or Discord hook's path
    is its credential, others take `?token=`, some a user:password@: the store never holds
    them. The same words as alembic/versions/0017, which renamed the rows stored before."""
    import hashlib

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


class OtelSettings(BaseModel):
    """`[otel]`: OpenTelemetry traces and metrics (the `otel` extra; docs/observability.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    """Export even without OTEL_EXPORTER_OTLP_ENDPOINT (to the OTLP default, localhost:4318)."""
    capture_content: bool = False
    """Put messages and tool arguments on the spans (redacted as the store is)."""


class ModelInfo(BaseModel):
    """What the harness knows of one model beyond its price (`[models."NAME"]` in the config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    context_window: int | None = Field(None, ge=256)
    """Tokens the model accepts per request (prompt + answer); the built-in table when unset."""
    rpm: int | None = Field(None, ge=1)
    """Requests per minute (per `rate_limit_window_s`) allowed to this model, over every
    worker sharing the store: a call waits for capacity instead of provoking a 429."""
    tpm: int | None = Field(None, ge=1)
    """Tokens (prompt + completion) per minute allowed to this model, over every worker."""


# The fields that take a number, named once for their validator (tests/test_settings.py holds
# them to the annotations): on every field ("*") it cost each start a tenth of the model's build.
NUMBER_FIELDS = (
    "max_steps",
    "max_tool_calls",
    "max_tool_calls_per_turn",
    "max_tokens",
    "max_cost",
    "max_context_tokens",
    "max_seconds",
    "notify_timeout_s",
    "notify_retry_attempts",
    "notify_retry_initial_wait_s",
    "notify_retry_max_wait_s",
    "notify_link_ttl_s",
    "max_repeats",
    "command_timeout_s",
    "compact_at",
    "connect_timeout_s",
    "keep_recent_outputs",
    "lease_seconds",
    "max_running_runs",
    "mcp_log_max_bytes",
    "mcp_startup_timeout_s",
    "mcp_timeout_s",
    "output_cap",
    "request_timeout_s",
    "retry_after_cap_s",
    "retry_initial_wait_s",
    "retry_max_attempts",
    "retry_max_seconds",
    "retry_max_wait_s",
    "snapshot_max_file_bytes",
    "store_retry_attempts",
    "store_retry_seconds",
    "temperature",
    "rate_limit_window_s",  # fleets
    "max_depth",
    "max_children",
)


class Settings(BaseModel):
    """Everything a run can be configured with. Each field documents itself."""

    # allow_inf_nan=False: `--max-seconds inf` would be recorded as the JSON `Infinity`, which
    # neither json_extract nor jsonb reads; "no limit" is an unset budget, not infinity.
    # The docstring under each field documents it for config/default.toml
    # (scripts/gen_default_config.py reads them); pydantic's use_attribute_docstrings would
    # parse this file's source on every start, a sixth of a one-step run's start-up.
    # Empty lists and tables are plain defaults (pydantic copies them for each instance):
    # `default_factory=list` had pydantic read the signature of `list`, parsed from its text
    # by the tokenize module, on every start.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    workspace: Path = Field(default_factory=Path.cwd)
    """Directory the agent works in; every tool path is confined to it."""
    model: str | None = None
    """Model name: an endpoint model, `scripted:PATH` or `demo`."""
    base_url: str | None = None
    """OpenAI-compatible endpoint (default: the OpenAI API)."""
    api_type: Literal["auto", "openai", "azure"] = "auto"
    """azure: Azure OpenAI (api-key header, deployment path); auto: azure for a `/openai/deployments/` URL."""
    api_version: str | None = None
    """Azure OpenAI API version, e.g. "2024-10-21" (default: the URL's `api-version`)."""
    api_key: SecretStr | None = None
    """API key; never stored, logged or shown."""
    db: str | None = None
    """SQLAlchemy URL of the store (default: SQLite in the user data directory)."""
    max_steps: int = Field(50, ge=1)
    """Model calls allowed in the run."""
    max_tool_calls: int | None = Field(None, ge=0)
    """Tool calls allowed in the run (unlimited when unset)."""
    max_tool_calls_per_turn: int = Field(64, ge=1)
    """Tool calls run from one model answer; the rest are answered "not run" without running."""
    max_tokens: int | None = Field(None, ge=1)
    """Prompt plus completion tokens allowed in the run."""
    max_seconds: float | None = Field(None, gt=0)
    """Active seconds allowed in the run, summed over resumes."""
    max_repeats: int = Field(3, ge=1)
    """Same tool call (name + arguments) allowed this many times in a row."""
    shell: Literal["allow", "ask", "deny"] = "ask"
    """run_command policy: run all, ask for what is not allowlisted, or no shell tool. Who is
    asked, not the security boundary: `sandbox` is."""
    sandbox: Literal["workspace-write", "read-only", "off"] = "workspace-write"
    """OS containment of every command (bubblewrap, else Landlock): only the workspace and a
    private /tmp writable, git config and hooks read-only, no other process visible; `off` runs commands
    unconfined. A sandboxed mode with no mechanism refuses to run commands."""
    network: bool = False
    """Commands may use the network (`--network on`); off is enforced by the sandbox."""
    redact_observations: bool = True
    """Redact key-shaped strings (API keys, tokens) in tool results before they are stored or
    sent; false for trusted repositories. The harness's own secrets are always redacted."""
    shell_allowlist: list[str] = Field(default_factory=lambda: list(DEFAULT_ALLOWLIST))
    """Command prefixes that run without approval under `--shell ask` (replaces the default list)."""
    shell_always_ask: list[str] = []
    """Extra regular expressions: a matching command always asks under `--shell ask`, on top of
    the built-in destructive patterns (`rm -rf`, `git reset --hard`, `git clean`, force-push…)."""
    on_uncertain_exec: Literal["block", "tell_model"] = "block"
    """A command cut off by a crash: block for a person, or tell the model it was interrupted."""
    verify: str | None = None
    """Finish gate: a command that must exit 0 before a final answer is accepted."""
    command_timeout_s: float = Field(300.0, gt=0)
    """Default timeout of one run_command."""
    command_env: list[str] = []
    """Host variables commands and MCP servers get beyond PATH, HOME, TERM, TMPDIR, TZ and LANG/LC_*: names or patterns ("GIT_*"); a credential-like name (*PASS*, *PWD*, *TOKEN*, *SECRET*, *KEY*, *CREDENTIAL*, *AUTH*) passes only when named exactly."""
    output_cap: int = Field(20_000, ge=200)
    """Characters of one tool result sent to the model; the rest is marked as truncated."""
    snapshots: bool = True
    """Record a workspace snapshot in the store after every step that can change files
    (`diff`, `restore`, `fork`, resume on another host need them)."""
    exclude: list[str] = Field(
        default_factory=lambda: [
            ".git/",
            ".venv/",
            "venv/",
            "node_modules/",
            "__pycache__/",
            ".tox/",
            ".mypy_cache/",
            ".pytest_cache/",
            ".ruff_cache/",
        ]
    )
    """Paths left out of workspace snapshots (gitignore syntax), besides what .gitignore files
    ignore. A `NAME/` rule for a generated folder (.venv, venv, node_modules, __pycache__,
    .tox, .mypy_cache, .pytest_cache, .ruff_cache) spares the files git tracks in it."""
    snapshot_max_file_bytes: int = Field(10_000_000, ge=0)
    """Files larger than this are left out of snapshots (noted on the step)."""
    snapshot_baseline: Literal["store", "git"] = "store"
    """store: snapshots hold every file in the database. git: in a git checkout, files equal
    to HEAD's are recorded as a reference to that commit, not stored; restore, fork and
    resume read them from the repository (its path, else its remote) (docs/workspace.md)."""
    snapshot_withhold_credential_files: bool = True
    """Withhold files named like secrets (.env*, *.pem, *.key, id_rsa*, .netrc...) from snapshots."""
    durability: Literal["full", "fast"] = "full"
    """full survives power loss (synchronous=FULL); fast may lose the last step on an OS crash."""
    lease_seconds: float = Field(30.0, ge=1, le=1e9)
    """How long a lease lasts without a heartbeat: at least 1 s (the heartbeat renews it every
    third of it; 0.001 s gave exit 7), at most 1e9 (~31 years: its expiry is a date)."""
    store_retry_attempts: int = Field(12, ge=1)
    """Tries of one checkpoint when the database fails transiently (lost connection, locked, I/O)."""
    store_retry_seconds: float = Field(60.0, gt=0)
    """How long a run waits for its database to come back before it stops (exit 7, resumable)."""
    max_running_runs: int | None = Field(None, ge=1)
    """Workers: runs executing at once over all workers sharing the database (no limit when unset)."""
    request_timeout_s: float = Field(600.0, gt=0)
    """The longest one model request may take, from connect to the last byte of its answer."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """Connect timeout of one model request."""
    # -- live tokens (docs/streaming.md) ------------------------------------------------------
    stream: bool = True
    """Ask the endpoint to stream its answers, shown live as they arrive (recorded the same
    either way); an endpoint that cannot is asked unstreamed, and remembered for a week."""
    retry_max_attempts: int = Field(6, ge=1)
    """Tries of one model call, the first included."""
    retry_max_seconds: float = Field(300.0, gt=0)
    """Total time one model call may spend retrying."""
    retry_max_wait_s: float = Field(30.0, gt=0)
    """Longest backoff between two tries."""
    retry_initial_wait_s: float = Field(1.0, gt=0)
    """Upper bound of the first random backoff; it doubles per retry up to retry_max_wait_s."""
    retry_after_cap_s: float = Field(60.0, ge=0)
    """A provider's Retry-After is honoured up to this many seconds."""
    max_cost: float | None = Field(None, gt=0)
    """Spend allowed in the run, in the currency of `prices` (needs a price for the model)."""
    prices: Annotated[dict[str, ModelPrice], WhenGiven] = {}
    """Per-model prices per million tokens, e.g. {"gpt-4.1-mini" = {input_per_mtok = 0.4, ...}};
    over the shipped table of common models (docs/observability.md)."""
    models: Annotated[dict[str, ModelInfo], WhenGiven] = {}
    """Per-model facts, e.g. [models."gpt-4.1-mini"] context_window = 1047576 (the built-in table
    of well-known families, then a conservative 32768 tokens, when a model is not listed)."""
    compact_at: float = Field(0.8, gt=0, le=1)
    """Compact the context before a model call whose request would pass this fraction of the window."""
    keep_recent_outputs: int = Field(4, ge=0)
    """Tool results kept verbatim when older ones are elided (replaced by a read_output stub);
    fewer when the budget barely holds one turn (docs/context.md)."""
    compact_model: str | None = None
    """Model that writes compaction summaries (same endpoint); the run's model when unset."""
    max_context_tokens: int | None = Field(None, ge=256)
    """Cap on the tokens sent per request, below the model's window (compaction keeps under it)."""
    tool_protocol: Literal["native", "text"] = "native"
    """native function calling, or TOOL_CALL lines in text for models without it."""
    temperature: float | None = None
    """Sampling temperature passed to the model (provider default when unset)."""
    tools: list[str] = []
    """Extra tools by import path, e.g. ["package.module:ToolClass"] (a Tool, its class or a
    zero-argument factory); installed plugins (entry points `durable_agent.tools`) load by themselves."""
    mcp_servers: Annotated[dict[str, McpServerConfig], WhenGiven] = {}
    """MCP servers whose tools are offered as NAME__TOOL: [mcp_servers.NAME] with command, args,
    env, cwd (stdio) or url (streamable HTTP); needs the `durable-agent[mcp]` extra."""
    mcp_config: str | None = None
    """A JSON file of MCP servers as Claude Code and Cursor write them ({"mcpServers": {...}});
    its servers join [mcp_servers] (a server of the same name there wins)."""
    mcp_timeout_s: float = Field(120.0, gt=0)
    """Seconds one MCP tool call may take (a server's timeout_s overrides it)."""
    mcp_startup_timeout_s: float = Field(30.0, gt=0)
    """Seconds an MCP server may take to start and list its tools."""
    mcp_log_max_bytes: int = Field(5_000_000, ge=10_000)
    """Size at which an MCP server's stderr log (beside the store) is rotated; one older part is kept, the rest dropped and said so."""

    # -- project memory (docs/memory.md) --------------------------------------------------
    memory: bool = True
    """Read the project's instruction files (memory_files) from the workspace root down to the
    task's folder, and the user's own (~/.config/durable-agent/), into the system context;
    recorded with the run (`--no-memory`: off)."""
    memory_files: list[str] = Field(default_factory=lambda: ["AGENTS.md"])
    """Names of the instruction files, read in this order in each folder, e.g. ["AGENTS.md", "CLAUDE.md"]."""
    memory_dir: str | None = None
    """The task's folder, relative to the workspace root: memory files are read from the root
    down to it. `start` sets it to the current directory when that is inside the workspace."""
    # -- policy: rules and hooks (config/policy.py, docs/policy.md) ------------------------
    rules: Annotated[list[Rule], WhenGiven] = []
    """[[rules]]: allow, ask or deny calls by tool, command prefix, path or arguments; they add
    up over the config layers and `--rules FILE`; the strictest matching decision wins."""
    hooks: Annotated[list[Hook], WhenGiven] = []
    """[[hooks]]: commands run (in the sandbox, as durable steps) at session_start, pre_tool,
    post_tool, pre_compact, stop and resume; exit 2 blocks with stderr as the reason."""
    # -- watched from elsewhere (docs/observability.md) ----------------------------------------
    notify: Annotated[list[NotifyTarget], WhenGiven] = []
    """[[notify]] entries: url (webhook) or command, events (blocked, completed, failed,
    budget_exceeded, changed_since_checkpoint, batch_done), optional secret. Each event is
    sent once per entry, also across crashes (the outbox)."""
    notify_timeout_s: float = Field(10.0, gt=0)
    """Seconds one delivery (a POST, a command) may take."""
    notify_retry_attempts: int = Field(5, ge=1)
    """Tries of one delivery in one pass; a later pass (the next process, a worker) tries again."""
    notify_retry_initial_wait_s: float = Field(1.0, gt=0)
    """First wait between two tries of a delivery; it doubles up to notify_retry_max_wait_s."""
    notify_retry_max_wait_s: float = Field(30.0, gt=0)
    """Longest wait between two tries of a delivery."""
    notify_link_ttl_s: float = Field(86400.0, gt=0)
    """How long the approve/deny links of a `blocked` notification stay valid."""
    otel: Annotated[OtelSettings, WhenGiven] = Field(default_factory=OtelSettings)
    """[otel] enabled, capture_content: OpenTelemetry traces and metrics, on when
    OTEL_EXPORTER_OTLP_ENDPOINT is set or enabled = true (needs durable-agent[otel])."""
    # -- fleets (docs/fleets.md) ---------------------------------------------------------------
    workspace_repo: str | None = None
    """A batch task's source: a local git repository or a git URL; the run's first step makes
    its workspace from it (a worktree or a clone at `workspace_ref`). Set by `batch submit`."""
    workspace_ref: str | None = None
    """The commit, branch or tag the batch task's workspace is made at (default HEAD)."""
    rate_limit_window_s: float = Field(60.0, gt=0, le=3600)
    """The window of the models' `rpm` and `tpm` limits, in seconds (a minute; shorter only to
    test a limit quickly)."""

    # -- delegation: the `delegate` tool and child runs (docs/delegation.md) ----------------
    delegate: bool = False
    """Offer the `delegate` tool: the model hands a part of its task to a child run (`--delegate`)."""
    max_depth: int = Field(2, ge=0)
    """How deep runs may delegate: 1 lets a run have children, 2 grandchildren too; 0 is none."""
    max_children: int = Field(4, ge=1)
    """Children one run may delegate to, in all."""
    child_tools: list[str] | None = None
    """A child run's tools, as its parent's `delegate` call gave them (recorded with the run,
    so whoever resumes it offers the same); unset: every tool."""

    # Found, not configured: the mechanism that contained the commands (recorded on the run).
    _sandbox_mechanism: str | None = PrivateAttr(default=None)

    # The values of the credential-named variables of the environment the settings were
    # loaded from (`load_settings`): recorded as `[REDACTED:NAME]`, never as themselves.
    _env_secrets: dict[str, str] = PrivateAttr(default_factory=dict)

    def set_sandbox_mechanism(self, mechanism: str) -> None:
        self._sandbox_mechanism = mechanism

    def known_secrets(self) -> Redactor:
        """What replaces the harness's own secrets (the key, credential variables' values)
        in what is recorded of the settings, and of the commands they name."""
        key = {"api_key": self.api_key.get_secret_value()} if self.api_key else {}
        return Redactor.from_env(self._env_secrets, shapes=False, extra=key)

    @field_validator(*NUMBER_FIELDS, mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any) -> Any:
        # pydantic takes `max_steps = true` as 1: a slip in a config file, never meant.
        if isinstance(value, bool):
            raise ValueError("must be a number, not true or false")
        return value

    @field_validator("model")
    @classmethod
    def _endpoint_model_is_utf8(cls, model: str | None) -> str | None:
        # Sent as JSON text: bytes that are not UTF-8 failed the run later, as a bug.
        if model and not model.startswith("scripted:") and not model.isascii():
            try:
                model.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("an endpoint's model name must be valid UTF-8") from None
        return model

    @field_validator("base_url")
    @classmethod
    def _base_url_is_http(cls, url: str | None) -> str | None:
        # Caught here, once, in one line: the client's own parser raised a traceback, and a
        # URL it took but could never reach (`ftp://`, no host) made runs that failed later.
        if not url:
            return url
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - parsed for its ValueError ("Port could not be cast...")
        except ValueError as exc:
            raise ValueError(f"not a URL: {mask_url_password(url)!r} ({exc})") from None
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or any(c.isspace() for c in url)
        ):
            raise ValueError(
                f"must be an http:// or https:// URL with a host, e.g. http://localhost:11434/v1; got {mask_url_password(url)!r}"
            )
        return url

    @field_validator("shell_always_ask")
    @classmethod
    def _patterns_compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {pattern!r} ({exc})") from None
        return patterns

    @field_validator("memory_files")
    @classmethod
    def _file_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not name or name in (".", "..") or "/" in name or "\0" in name:
                raise ValueError(f"a file name without a folder, e.g. AGENTS.md; got {name!r}")
        return names

    @field_validator("memory_dir")
    @classmethod
    def _relative_folder(cls, folder: str | None) -> str | None:
        if folder is not None and (
            os.path.isabs(folder) or ".." in Path(folder).parts or "\0" in folder
        ):
            raise ValueError(f"a folder relative to the workspace root, inside it; got {folder!r}")
        return folder

    @field_validator("command_env")
    @classmethod
    def _variable_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not name or "=" in name or "\0" in name or any(c.isspace() for c in name):
                raise ValueError(f"not an environment variable name or pattern: {name!r}")
        return names

    @model_validator(mode="after")
    def _cost_budget_needs_a_price(self) -> "Settings":
        if self.max_cost is not None and self.model and self.price(self.model) is None:
            raise ValueError(
                f"--max-cost needs a price for model {self.model!r}: add "
                f'prices."{self.model}" = {{input_per_mtok = ..., output_per_mtok = ...}} '
                "to the config file"
            )
        return self

    def notify_targets(self, event: str) -> list[tuple[int, str]]:
        """The [[notify]] entries that want `event`: (index in the config, the outbox's name
        of the target). The index is part of each notification's key."""
        return [(i, t.target) for i, t in enumerate(self.notify) if event in t.events]

    def price(self, model: str | None) -> ModelPrice | None:
        """`[prices]`'s price of `model`, else the shipped table's (config/prices.py)."""
        if not model:
            return None
        configured = self.prices.get(model)
        if configured is not None:
            return configured
        from durable_agent.config.prices import shipped_row

        row = shipped_row(model)
        if row is None:
            return None
        return ModelPrice(
            input_per_mtok=row[0], output_per_mtok=row[1], cached_input_per_mtok=row[2]
        )

    def redacted_dict(self) -> dict[str, Any]:
        """The settings recorded on a run: paths as text, no secrets. The key is left out, and
        so is the store URL (it can hold a password; resume and workers bring their own), and a
        password in base_url is masked."""
        # Notification targets are the process's own (its config file), never the run's: a
        # secret recorded masked would sign nothing, and a worker sends to its own targets.
        d = self.model_dump(mode="json", exclude={"api_key", "db", *NOTIFY_FIELDS})
        if d.get("base_url"):
            d["base_url"] = mask_url_password(d["base_url"])
        for server in d.get("mcp_servers", {}).values():  # a server's token stays in the config
            server["env"] = recorded_env(server.get("env") or {})
            if server.get("url"):
                server["url"] = mask_url_password(server["url"])
        if self._sandbox_mechanism is not None:
            d["sandbox_mechanism"] = self._sandbox_mechanism
        # A credential's value given in any setting (`?api-key=` in base_url, a token among
        # an MCP server's args or in the verify command, as a shell expands `$TOKEN`) is
        # recorded by its name: recorded_settings leaves such a setting to the layers again.
        return self.known_secrets().redact_known_json(d)


@functools.cache
def setting_kinds() -> dict[str, str]:
    """Each setting's name and how an environment variable gives it (layers.env_value):
    "text" (names, paths, URLs, choices: as written), "list", or "value" (a TOML value)."""
    import types
    import typing

    kinds: dict[str, str] = {}
    for name, info in Settings.model_fields.items():
        args = [a for a in typing.get_args(info.annotation) if a is not type(None)]
        kind = (
            args[0]
            if typing.get_origin(info.annotation) in (typing.Union, types.UnionType) and args
            else info.annotation
        )
        origin = typing.get_origin(kind)
        if kind in (str, Path, SecretStr) or origin is Literal:
            kinds[name] = "text"
        elif origin is list:
            kinds[name] = "list"
        else:
            kinds[name] = "value"
    return kinds


def mask_url_password(url: str) -> str:
    """`http://user:pw@host/v1` -> `http://user:***@host/v1`; other URLs unchanged."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not parseable (e.g. a bad port): keep nothing that could be a secret
        return "***" if "@" in url else url
    if password is None:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostport}"))


# The settings that take a number (true/false is refused there: _numbers_are_not_booleans).
NOTIFY_FIELDS = (
    "otel",  # (the process's own too: whether and where it exports)
    "notify",
    "notify_timeout_s",
    "notify_retry_attempts",
    "notify_retry_initial_wait_s",
    "notify_retry_max_wait_s",
    "notify_link_ttl_s",
)

# Budget flags that `resume` may raise; recorded settings are otherwise reused.
BUDGET_FIELDS = (
    "max_steps",
    "max_tool_calls",
    "max_tokens",
    "max_seconds",
    "max_repeats",
    "max_cost",
    "max_context_tokens",
)


def recorded_settings(stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's recorded settings, as a base to rebuild its Settings from: without what was
    never recorded in full (the store URL; a base URL whose password was masked), so the
    environment or the flags supply those again."""
    recorded = dict(stored or {})
    for name in [k for k, v in recorded.items() if k != "mcp_servers" and holds_redacted(v)]:
        recorded.pop(name)  # recorded without a credential's value: the layers give it again
    recorded.pop("db", None)
    recorded.pop("sandbox_mechanism", None)  # found again on the host that resumes
    if ":***@" in str(recorded.get("base_url") or ""):
        recorded.pop("base_url")
    if isinstance(
        recorded.get("workspace"), str
    ):  # stored with `\xHH` for bytes that are not UTF-8
        recorded["workspace"] = name_from_arg("/", recorded["workspace"])
    return recorded


def load_settings(
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    *,
    base: Mapping[str, Any] | None = None,
    sources: dict[str, str] | None = None,
) -> Settings:
    """Merge the layers and validate once. `base` (recorded run settings) sits under flags;
    `sources` gets where each value came from (`durable-agent config`)."""
    env = os.environ if env is None else env
    path = default_config_path(env)
    ceilings = {k: Settings.model_fields[k].default for k in BUDGET_FIELDS}
    merged = merge_layers(
        flags, env, path=path, kinds=setting_kinds, base=base, sources=sources, ceilings=ceilings
    )
    _merge_servers(merged, path, base, flags)
    try:
        settings = Settings(**merged)
    except ValidationError as exc:
        raise ConfigError(f"invalid settings: {validation_text(exc, 'settings')}") from None
    check_server_names(settings.mcp_servers)
    settings._env_secrets = {k: v for k, v in env.items() if is_secret_name(k)}
    return settings


def _merge_servers(
    merged: dict[str, Any],
    path: Path | None,
    base: Mapping[str, Any] | None,
    flags: Mapping[str, Any],
) -> None:
    """MCP servers add up over the layers (config, recorded run, --mcp) instead of the last
    layer replacing the whole table; a recorded server gets its masked env from the config."""
    configured = read_config_file(path).get("mcp_servers") or {} if path is not None else {}
    if merged.get("mcp_config") and isinstance(configured, Mapping):
        try:
            configured = {**json_servers(str(merged["mcp_config"]), path), **configured}
        except ConfigError:
            if not base:
                raise
            # A resume runs the servers it recorded: the file only fills in masked env
            # values, and one that moved since is no reason to stop the run.
    for given in (configured, flags.get("mcp_servers") or {}):
        if not isinstance(given, Mapping):  # (`mcp_servers = 5`: a TypeError below, else)
            raise ConfigError(
                f"invalid settings: mcp_servers must be a table of servers "
                f"([mcp_servers.NAME]), not {type(given).__name__}"
            )
    servers: dict[str, Any] = dict(configured)
    if base and isinstance(base.get("mcp_servers"), dict):
        servers = merge_recorded(base["mcp_servers"], configured)  # the run's own servers only
    servers.update(flags.get("mcp_servers") or {})
    if servers:
        merged["mcp_servers"] = servers


def json_servers(given: str, config_path: Path | None) -> dict[str, Any]:
    """The servers of the `mcp_config` JSON file (a relative path is the config file's)."""
    from durable_agent.config.mcp_servers import read_mcp_json

    where = Path(given).expanduser()
    if not where.is_absolute() and config_path is not None:
        where = config_path.parent / where
    return read_mcp_json(where)


def validation_text(exc: ValidationError, root: str) -> str:
    """pydantic's errors in one line: `field.sub: message; ...` (`root` names the whole).

    A check of the whole (a model validator) says its own words, without `root:` or
    pydantic's "Value error, " in front."""
    parts = []
    for e in exc.errors():
        where, msg = ".".join(str(p) for p in e["loc"]), str(e["msg"])
        if e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        parts.append(f"{where or root}: {msg}" if where or e["type"] != "value_error" else msg)
    return "; ".join(parts)
