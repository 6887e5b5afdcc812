"""What a run ran with, and what a resume does when that changed (docs/versions.md).

    fingerprint   durable-agent's release and the store's schema revision, the system
                  prompt's hash, every offered tool
                  (its JSON schema's hash, its effect class, its source), the MCP servers'
                  reported name and version, the model, its endpoint and tool protocol, and
                  the settings that change behaviour
    run_versions  one row when the run first executes, then one for each change a resume
                  (or a `continue`: `record_version`) carries on with

On every session (`Runner._drive`: `start`, `resume`, workers, the `Agent` API and the web
view all come through it) the current fingerprint is held against the run's last row and
each difference classified:

    compatible     continue, a new row, one line saying what changed
    needs consent  the run stops `blocked` / `changed_since_checkpoint` with the diff as the
                   question; `resume --accept-changes` (or `approve`) records the consent as a
                   step of kind `version`, whose outcome writes the new row, and continues
    refused        one line, exit 2, nothing of the run written (VersionRefused)

`version_key` is the hash of what every run of a worker shares and whose change needs
consent (the release's major.minor, the system prompt): stored on the run, it lets a
worker's claim take only runs it continues without consent (store/queue.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from msgspec import Struct, field
from msgspec.structs import asdict

from durable_agent import __version__
from durable_agent.config.settings import BUDGET_FIELDS
from durable_agent.context.prompts import SYSTEM_PROMPT
from durable_agent.errors import LoopExit, VersionRefused
from durable_agent.loop.step import StepOutcome, StepSpec, invoke
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import HEAD
from durable_agent.status import StepKind, StopReason
from durable_agent.store import versions as rows
from durable_agent.store.records import Decision, StepState
from durable_agent.store.revision import HEAD_REVISION
from durable_agent.store.rows import utcnow
from durable_agent.store.step import USE_APPROVAL
from durable_agent.tools.base import Tool, tool_schema

# The package's own, which the installed distribution's is made from (pyproject.toml):
# importlib.metadata's search of the installed distributions cost every start about 1% of
# its instructions.
RELEASE = __version__

COMPATIBLE, CONSENT, REFUSED = "compatible", "needs_consent", "refused"

# Settings whose change changes what the run does (the rest: where logs go, timeouts).
BEHAVIOUR = (
    *BUDGET_FIELDS,
    "max_tool_calls_per_turn",
    "shell",
    "shell_allowlist",
    "shell_always_ask",
    "sandbox",
    "network",
    "verify",
    "temperature",
    "api_type",
    "snapshots",
)


class Change(Struct, frozen=True):
    what: str  # e.g. `tool read_file`, `model`, `durable-agent`
    before: Any
    after: Any
    level: str  # compatible | needs_consent | refused
    why: str

    def line(self) -> str:
        return f"{self.what}: {_shown(self.before)} → {_shown(self.after)} ({self.why})"


class VersionPolicy(Struct, frozen=True):
    """What this session may continue with. `accept`: `none` stops on a change that needs
    consent; `all` records the consent (by `by`) and goes on. `given`: settings this resume's
    own flags set (a person asked for them: compatible). `pin`: the tools as recorded."""

    accept: str = "none"
    pin: bool = False
    by: str = "resume --accept-changes"
    given: frozenset[str] = field(default_factory=frozenset)


def sha256(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def major_minor(release: str) -> str:
    return ".".join(release.split("+")[0].split(".")[:2])


def version_key(release: str | None = None, prompt_sha256: str | None = None) -> str:
    """What a worker and a run must share for the worker to continue it without consent."""
    release = RELEASE if release is None else release
    prompt = sha256(SYSTEM_PROMPT) if prompt_sha256 is None else prompt_sha256
    return sha256({"release": major_minor(release), "system_prompt": prompt})[:32]


def fingerprint(
    settings: Any,
    model_name: str,
    tools: Mapping[str, Tool],
    *,
    sources: Mapping[str, str] | None = None,
    mcp_catalog: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The fingerprint as stored (JSON). `sources`: tool name -> where it came from;
    `mcp_catalog`: the run's recorded MCP servers (runs.tool_sources)."""
    sources = sources or {}
    mcp_catalog = mcp_catalog or {}
    mcp_source = {
        entry["name"]: f"mcp {server}"
        for server, listed in mcp_catalog.items()
        for entry in listed.get("tools") or []
    }
    catalog: dict[str, Any] = {}
    for name in sorted(tools):
        tool = tools[name]
        function = tool_schema(tool)["function"]
        catalog[name] = {
            "schema_sha256": sha256(function.get("parameters") or {}),
            "description_sha256": sha256(function.get("description") or ""),
            "effect": str(tool.effect.value),
            "source": sources.get(name) or mcp_source.get(name) or "python",
        }
    dumped = settings.redacted_dict()
    return {
        "durable_agent": RELEASE,
        "schema": HEAD_REVISION,
        "system_prompt_sha256": sha256(SYSTEM_PROMPT),
        "model": {
            "name": model_name,
            "endpoint": dumped.get("base_url"),
            "tool_protocol": dumped.get("tool_protocol"),
        },
        "tools": catalog,
        "mcp_servers": {
            server: dict(listed.get("server_info") or {}) for server, listed in mcp_catalog.items()
        },
        "settings": {k: dumped.get(k) for k in BEHAVIOUR},
    }


def classify(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    *,
    used_tools: Iterable[str] = (),
    open_tools: Iterable[str] = (),
    given: Iterable[str] = (),
) -> list[Change]:
    """Each difference between two fingerprints, classified. `used_tools`: tools the
    history called; `open_tools`: tools of calls cut off unfinished (resume must reconcile
    them); `given`: settings this session's caller set on purpose."""
    used, given_set = set(used_tools), set(given)
    out: list[Change] = []
    b_rel, a_rel = str(before.get("durable_agent")), str(after.get("durable_agent"))
    if b_rel != a_rel:
        same = major_minor(b_rel) == major_minor(a_rel)
        why = "a patch release" if same else "a major or minor release"
        out.append(Change("durable-agent", b_rel, a_rel, COMPATIBLE if same else CONSENT, why))
    b_rev, a_rev = str(before.get("schema")), str(after.get("schema"))
    if b_rev != a_rev:
        if rows._number(b_rev) > rows._number(a_rev):
            out.append(
                Change("store schema", b_rev, a_rev, REFUSED, "recorded by a newer durable-agent")
            )
        else:
            out.append(Change("store schema", b_rev, a_rev, COMPATIBLE, "the store was upgraded"))
    # (Project memory is not here: a resume keeps the text its memory step recorded, and a
    # `continue` reads the files again with the person's message as consent.)
    b_prompt, a_prompt = before.get("system_prompt_sha256"), after.get("system_prompt_sha256")
    if b_prompt != a_prompt and a_prompt is not None:
        out.append(Change("system prompt", b_prompt, a_prompt, CONSENT, "changed"))
    b_model, a_model = before.get("model") or {}, after.get("model") or {}
    for key in ("name", "endpoint", "tool_protocol"):
        if b_model.get(key) != a_model.get(key):
            what = "model" if key == "name" else f"model {key.replace('_', ' ')}"
            out.append(Change(what, b_model.get(key), a_model.get(key), CONSENT, "a different one"))
    out.extend(_tool_changes(before.get("tools") or {}, after.get("tools") or {}, used))
    for name in sorted(set(open_tools) - set(after.get("tools") or {})):
        out.append(
            Change(
                f"tool {name}",
                "an unfinished call",
                None,
                REFUSED,
                "a call cut off by the crash needs it to be reconciled",
            )
        )
    b_mcp, a_mcp = before.get("mcp_servers") or {}, after.get("mcp_servers") or {}
    for server in sorted(set(b_mcp) | set(a_mcp)):
        if b_mcp.get(server) != a_mcp.get(server):
            out.append(
                Change(
                    f"MCP server {server}",
                    b_mcp.get(server),
                    a_mcp.get(server),
                    COMPATIBLE,
                    "its tools are offered as recorded",
                )
            )
    b_set, a_set = before.get("settings") or {}, after.get("settings") or {}
    for key in sorted(set(b_set) | set(a_set)):
        if b_set.get(key) == a_set.get(key):
            continue
        if key in BUDGET_FIELDS and _raised(b_set.get(key), a_set.get(key)):
            level, why = COMPATIBLE, "a budget raised"
        elif key in given_set:
            level, why = COMPATIBLE, "set by this resume"
        else:
            level, why = CONSENT, "a setting that changes behaviour"
        out.append(Change(f"setting {key}", b_set.get(key), a_set.get(key), level, why))
    return out


def _tool_changes(
    before: Mapping[str, Any], after: Mapping[str, Any], used: set[str]
) -> list[Change]:
    out: list[Change] = []
    for name in sorted(set(before) | set(after)):
        b, a = before.get(name) or {}, after.get(name) or {}
        if b == a:
            continue
        what = f"tool {name}"
        if not b:
            out.append(Change(what, None, a["source"], COMPATIBLE, "added"))
        elif not a:
            level = CONSENT if name in used else COMPATIBLE
            why = "removed; the history called it" if name in used else "removed, never called"
            out.append(Change(what, b["source"], None, level, why))
        else:
            for part in ("schema_sha256", "effect", "source"):
                if b.get(part) != a.get(part):
                    # Another source with the same schema and effect class (a program's own
                    # wrapper of a built-in) is the same tool to the history.
                    level = CONSENT if name in used and part != "source" else COMPATIBLE
                    why = f"its {part.removesuffix('_sha256')} changed" + (
                        "; the history called it" if name in used else ""
                    )
                    out.append(Change(what, b.get(part), a.get(part), level, why))
                    break
            else:
                out.append(Change(what, "description", "description", COMPATIBLE, "described anew"))
    return out


def _raised(before: Any, after: Any) -> bool:
    if after is None:
        return True  # unlimited now
    if before is None:
        return False
    try:
        return float(after) >= float(before)
    except (TypeError, ValueError):
        return False


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]  # a hash
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def diff_text(changes: Iterable[Change]) -> str:
    """The readable diff: one line per difference, its class first."""
    return "\n".join(f"  [{c.level}] {c.line()}" for c in changes)


# -- the session's check --------------------------------------------------------------------
def check(
    ctx: StepContext,
    current: dict[str, Any],
    policy: VersionPolicy,
) -> None:
    """Hold the run's last recorded fingerprint against `current` and act on the differences
    (see the module docstring). Called under the lease, before any step of the session."""
    journal = ctx.journal
    run_id = journal.run_id
    last = rows.last_version(journal.engine, run_id, journal.policy)
    sha = sha256(current)
    key = version_key(current["durable_agent"], current["system_prompt_sha256"])
    if last is not None and not isinstance(last.fingerprint, dict):
        last = None  # (not an object: as if none was recorded)
    if last is None:
        # Its first session, or a run an earlier release made (no row yet): what it runs
        # with from here on is what it recorded first. The row rides with the session's
        # first checkpoint (no commit of its own: the steps keep their checkpoints' order).
        reason = "start" if journal.next_seq == 0 else "adopted"
        journal.defer_statements(_row(run_id, journal.next_seq, current, sha, key, reason, None))
        if reason == "adopted":
            ctx.observer.note(f"recorded what run {run_id} runs with from here on (run_versions)")
        return
    previous = sha256(last.fingerprint)  # of what is stored (its column is for people)
    if previous == sha:
        _settle_question(ctx, "nothing changed any more (resume --pin, or put back)")
        return
    used = {call.name for m in ctx.state.messages for call in m.tool_calls}
    if ctx.state.dropped > HEAD:  # (calls a summary replaced are no longer in memory)
        used |= journal.tool_names_below(ctx.state.dropped)
    open_tools = {
        s.tool_name
        for s in journal.open_steps.values()
        if s.state == StepState.STARTED and s.tool_name and s.kind == StepKind.TOOL
    }
    try:
        changes = classify(
            last.fingerprint, current, used_tools=used, open_tools=open_tools, given=policy.given
        )
    except (AttributeError, TypeError, ValueError, KeyError):
        # A row no release wrote (edited by hand, damaged): no stored value may make a run
        # unresumable (SPEC §5). What runs now is recorded over it, and said.
        journal.defer_statements(
            _row(run_id, journal.next_seq, current, sha, key, "unreadable", None)
        )
        ctx.observer.note("the run's last run_versions row is unreadable; recorded what runs now")
        return
    if not changes:  # (only parts that are not compared)
        return
    refused = [c for c in changes if c.level == REFUSED]
    if refused:
        raise VersionRefused(
            f"run {run_id} cannot continue here: "
            + "; ".join(c.line() for c in refused)
            + " (nothing was written)"
        )
    consent = [c for c in changes if c.level == CONSENT]
    listed = [asdict(c) for c in changes]
    if not consent:
        _settle_question(ctx, "nothing left that needs consent (resume --pin, or put back)")
        journal.defer_statements(
            _row(run_id, journal.next_seq, current, sha, key, "compatible", listed)
        )
        ctx.observer.note(
            "changed since the last checkpoint: " + "; ".join(c.line() for c in changes)
        )
        return
    approval = journal.approval_for(rows.CALL, rows.CHANGED)
    decided = approval is not None and approval.decision is not None
    if decided and approval is not None and approval.decision == Decision.DENIED:
        raise LoopExit(
            StopReason.CHANGED_SINCE_CHECKPOINT,
            f"the changes since the checkpoint were refused by {approval.decided_by}; "
            f"resume with --pin to continue as recorded where possible",
        )
    if policy.accept == "all" or decided:
        by = approval.decided_by if decided and approval is not None else policy.by
        if approval is not None and not decided:  # the question a block asked: answered now
            journal.settle_approval(approval.id, by=by or "a person")
        consent_step(
            ctx,
            previous,
            current,
            sha,
            key,
            listed,
            by=by or "a person",
            approval_id=approval.id if approval is not None else None,
        )
        ctx.observer.note(
            f"continuing with {len(changes)} change(s) since the last checkpoint, accepted by {by}"
        )
        return
    text = diff_text(changes)
    journal.request_approval(
        call_id=rows.CALL,
        kind=rows.CHANGED,
        tool_name=rows.CALL,
        command=None,
        reason=ctx.redactor.redact(f"changed since the checkpoint:\n{text}"),
        step_seq=None,
    )
    raise LoopExit(
        StopReason.CHANGED_SINCE_CHECKPOINT,
        f"{len(consent)} change(s) since the checkpoint need consent:\n{text}\n"
        f"Continue with them: `durable-agent resume {run_id} --accept-changes`; "
        f"as recorded where possible: `durable-agent resume {run_id} --pin`.",
    )


def _settle_question(ctx: StepContext, by: str) -> None:
    """A question a block asked that no longer stands (the change was undone, or `--pin`
    put the recorded model and tools back): answered, and marked used with the next commit."""
    if not ctx.resumed:
        return
    question = ctx.journal.approval_for(rows.CALL, rows.CHANGED)
    if question is None:
        return
    if question.decision is None:
        ctx.journal.settle_approval(question.id, by=by)
    ctx.journal.defer_statements([(USE_APPROVAL, {"b_id": question.id, "used_at": utcnow()})])


def _row(
    run_id: str,
    seq: int,
    current: dict[str, Any],
    sha: str,
    key: str,
    reason: str,
    changes: list[dict[str, Any]] | None,
) -> list[tuple[Any, dict[str, Any]]]:
    return rows.record_statements(
        run_id,
        seq=seq,
        fingerprint=current,
        sha256=sha,
        version_key=key,
        reason=reason,
        changes=changes,
    )


def consent_step(
    ctx: StepContext,
    previous_sha: str,
    current: dict[str, Any],
    sha: str,
    key: str,
    changes: list[dict[str, Any]],
    *,
    by: str,
    approval_id: int | None,
) -> None:
    """The consent, durable: a step of kind `version` whose outcome writes the new
    run_versions row (and marks the approval used) in the same commit."""
    spec = StepSpec(
        kind=StepKind.VERSION,
        key=f"version:{previous_sha[:16]}:{sha[:16]}",
        turn=ctx.state.step_count,
        input={"from": previous_sha, "to": sha, "changes": changes, "accepted_by": by},
        label="consent",
        detail=f"{len(changes)} change(s) since the checkpoint, accepted by {by}",
        reuse=True,
        supersede=True,
    )

    def accept(step: Any) -> StepOutcome:
        return StepOutcome(
            output={"accepted_by": by, "fingerprint_sha256": sha},
            use_approval=approval_id,
            statements=_row(ctx.journal.run_id, step.seq, current, sha, key, "accepted", changes),
        )

    invoke(ctx, spec, accept)


def record_version(ctx: StepContext, current: dict[str, Any], reason: str) -> None:
    """A row for `reason` (e.g. `continue`: a new message is the person's consent to go on
    with what runs now), its differences from the last row classified, whatever they are."""
    journal = ctx.journal
    last = rows.last_version(journal.engine, journal.run_id, journal.policy)
    sha = sha256(current)
    changes = None if last is None else [asdict(c) for c in classify(last.fingerprint, current)]
    key = version_key(current["durable_agent"], current["system_prompt_sha256"])
    journal.defer_statements(
        _row(journal.run_id, journal.next_seq, current, sha, key, reason, changes)
    )
