"""OpenTelemetry traces and metrics of runs (the `otel` extra; docs/observability.md).

Off unless OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set or `[otel] enabled =
true`; off, or without the extra, nothing of opentelemetry is imported (`wanted` reads
only the settings and the environment).

One trace per run, whole across crashes and resumes: its id is recorded on the run
(`runs.trace_id`) by the first traced session. Each session is an `invoke_agent` span whose
id follows from (trace id, lease epoch), parented on the run's (virtual) root span and
linked to the session it follows. Spans are exported as they end (a SIGKILL loses only
the spans still open), and the session that takes over a run whose process died exports
what that process could not: its `invoke_agent` span (same id, so the step spans it
already exported hang under it) and the attempt that was cut off, as an interrupted
attempt; the step is then paid again as its next attempt.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from durable_agent.config.settings import Settings
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import Message
from durable_agent.observer import Observer, StepEvent
from durable_agent.status import StepKind
from durable_agent.store.records import StepState

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
SCOPE = "durable_agent"
_SPAN_NAMES = {"verify": "verify", "compact": "compaction"}


class Unavailable(Exception):
    """Tracing is asked for, but the `otel` extra is not installed."""


def wanted(settings: Settings, env: Mapping[str, str]) -> bool:
    if str(env.get("OTEL_SDK_DISABLED", "")).lower() == "true":
        return False
    return settings.otel.enabled or any(env.get(v) for v in ENDPOINT_VARS)


def _ns(when: datetime | None) -> int | None:
    if when is None:
        return None
    return int(when.replace(tzinfo=UTC).timestamp() * 1e9)


def span_id_of(trace_id: str, what: str) -> int:
    """A span id that every process derives alike: a session's from its lease epoch."""
    digest = hashlib.sha256(f"{trace_id}:{what}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


class _Process:
    """The process's providers, made once (a worker traces many runs in threads)."""

    lock = threading.Lock()
    tracer: Any = None
    meter: Any = None
    instruments: dict[str, Any] = {}
    forced = threading.local()  # the span id the next span gets (a session's)


def install(tracer_provider: Any, meter_provider: Any) -> None:
    """Use these providers (tests: the SDK's in-memory exporter and reader)."""
    with _Process.lock:
        _Process.tracer = tracer_provider.get_tracer(SCOPE)
        _Process.meter = meter_provider.get_meter(SCOPE)
        _make_instruments()


def _setup() -> None:
    with _Process.lock:
        if _Process.tracer is not None:
            return
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        except ImportError:
            raise Unavailable(
                "OpenTelemetry is on (OTEL_EXPORTER_OTLP_ENDPOINT or [otel] enabled) but the "
                "`otel` extra is missing: pip install 'durable-agent[otel]'; not traced"
            ) from None
        # The OTEL_* variables (service name, resource attributes, endpoint, headers,
        # timeouts, export interval) are read by the SDK itself.
        resource = Resource.create({"service.name": "durable-agent"})
        tracer_provider = TracerProvider(resource=resource, id_generator=_ids())
        # Exported as each span ends: a process that is killed loses only its open spans.
        tracer_provider.add_span_processor(SimpleSpanProcessor(_bounded(OTLPSpanExporter())))
        meter_provider = MeterProvider(
            resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())]
        )
        # The last metrics, at the end of a command: waited for as long as an export may take
        # (the SDK's default, 30 s, kept a command whose collector hangs from exiting).
        atexit.register(meter_provider.shutdown, timeout_millis=_export_limit("METRICS") * 1000)
        _Process.tracer = tracer_provider.get_tracer(SCOPE)
        _Process.meter = meter_provider.get_meter(SCOPE)
        _make_instruments()


def _bounded(exporter: Any) -> Any:
    """`exporter`, waited for at most its timeout (OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT) and a
    second: spans are exported in the run's thread, and the OTLP exporter's timeout bounds
    each read, not the answer, so a collector that sends it a byte at a time held the run
    for good (SIGTERM too waits for the step). An export still hanging after that goes on in
    its own thread; the spans that end meanwhile are dropped, not waited for."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    limit = _export_limit("TRACES")

    class Bounded(SpanExporter):
        def __init__(self) -> None:
            self.hanging: threading.Thread | None = None

        def export(self, spans: Any) -> SpanExportResult:
            if self.hanging is not None and self.hanging.is_alive():
                return SpanExportResult.FAILURE
            result = [SpanExportResult.FAILURE]

            def send() -> None:
                result[0] = exporter.export(spans)

            thread = threading.Thread(target=send, name="otlp-export", daemon=True)
            thread.start()
            thread.join(limit)
            if thread.is_alive():
                self.hanging = thread
            return result[0]

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(exporter.force_flush(timeout_millis))

    return Bounded()


def _export_limit(signal: str) -> float:
    """Seconds an export may take: the OTLP exporter's timeout for `signal` (the SDK reads
    the same variables, in seconds, default 10) and one more."""
    raw = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_TIMEOUT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TIMEOUT"
    )
    try:
        return float(raw or 10) + 1
    except ValueError:
        return 11.0


def _ids() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class Ids(RandomIdGenerator):
        def generate_span_id(self) -> int:
            forced = getattr(_Process.forced, "span_id", None)
            if forced is not None:
                _Process.forced.span_id = None
                return int(forced)
            return super().generate_span_id()

    return Ids()


def _make_instruments() -> None:
    m = _Process.meter
    _Process.instruments = {
        "tokens": m.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens per model call"
        ),
        "duration": m.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="Model call duration"
        ),
        "steps": m.create_counter("durable_agent.steps", unit="{step}", description="Steps ended"),
        "retries": m.create_counter(
            "durable_agent.retries", unit="{attempt}", description="Attempts beyond the first"
        ),
        "cost": m.create_counter("durable_agent.cost", unit="USD", description="Cost of steps"),
    }


def _provider_name(settings: Settings) -> str:
    url = settings.base_url or ""
    return (
        "azure.ai.openai"
        if settings.api_type == "azure" or "/openai/deployments/" in url
        else "openai"
    )


class Session:
    """The `invoke_agent` span of one session of a run, and the observer that makes the
    step spans under it."""

    def __init__(self, ctx: StepContext, *, takeover: bool) -> None:
        _setup()
        from opentelemetry import trace
        from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

        self.ctx, self.settings = ctx, ctx.settings
        journal = ctx.journal
        self.trace_hex = journal.trace_id(os.urandom(16).hex())
        self.trace_int = int(self.trace_hex, 16)
        self.epoch = journal.epoch
        self.provider = _provider_name(ctx.settings)
        self.capture = ctx.settings.otel.capture_content
        flags = TraceFlags(TraceFlags.SAMPLED)

        def context_of(span_id: int) -> Any:
            return SpanContext(self.trace_int, span_id, is_remote=True, trace_flags=flags)

        self._context_of = context_of
        root = trace.set_span_in_context(
            trace.NonRecordingSpan(context_of(span_id_of(self.trace_hex, "run")))
        )
        # Each take of the lease is the next epoch: the session before this one is the
        # epoch before (its step rows may carry a later epoch since: a restarted step's does).
        previous = self.epoch - 1 if self.epoch > 1 else None
        tracer = _Process.tracer
        if takeover and previous is not None:
            now = datetime.now(UTC).replace(tzinfo=None)
            seen = journal.sessions().get(previous, (now, now))
            self._died(root, previous, seen, tracer, previous - 1 if previous > 1 else None)
        links = (
            [Link(context_of(span_id_of(self.trace_hex, f"session:{previous}")))]
            if previous is not None
            else []
        )
        _Process.forced.span_id = span_id_of(self.trace_hex, f"session:{self.epoch}")
        self.span = tracer.start_span(
            "invoke_agent",
            context=root,
            kind=SpanKind.INTERNAL,
            links=links,
            attributes={
                **self._common(),
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "durable-agent",
                "durable_agent.session.epoch": self.epoch,
                "durable_agent.resumed": previous is not None,
            },
        )
        self.context = trace.set_span_in_context(self.span)
        self.open: dict[int, Any] = {}
        for approval in journal.decided_unused():  # the waits this session ends
            wait = tracer.start_span(
                f"approval_wait {approval.tool_name or ''}".strip(),
                context=self.context,
                start_time=_ns(approval.requested_at),
                attributes={
                    **self._common(),
                    "durable_agent.approval.id": approval.id,
                    "durable_agent.approval.kind": approval.kind,
                    "durable_agent.approval.decision": approval.decision or "",
                    "durable_agent.approval.decided_by": approval.decided_by or "",
                    "gen_ai.tool.name": approval.tool_name or "",
                    "gen_ai.tool.call.id": approval.call_id,
                },
            )
            wait.end(end_time=_ns(approval.decided_at))

    def _common(self) -> dict[str, Any]:
        return {
            "gen_ai.conversation.id": self.ctx.state.run_id,
            "gen_ai.provider.name": self.provider,
            "gen_ai.request.model": self.settings.model or "",
        }

    def _died(
        self,
        root: Any,
        epoch: int,
        seen: tuple[datetime, datetime],
        tracer: Any,
        before: int | None,
    ) -> None:
        """What the session at `epoch` could not export before its process died: its span,
        and the attempts it left open (each then paid again, as the next attempt)."""
        from opentelemetry import trace
        from opentelemetry.trace import Link, Status, StatusCode

        _Process.forced.span_id = span_id_of(self.trace_hex, f"session:{epoch}")
        span = tracer.start_span(
            "invoke_agent",
            context=root,
            links=[Link(self._context_of(span_id_of(self.trace_hex, f"session:{before}")))]
            if before is not None
            else [],
            start_time=_ns(seen[0]),
            attributes={
                **self._common(),
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "durable-agent",
                "durable_agent.session.epoch": epoch,
                "durable_agent.session.died": True,
            },
        )
        inside = trace.set_span_in_context(span)
        for row in self.ctx.journal.open_steps.values():
            if row.state != StepState.STARTED or (row.lease_epoch or 0) >= self.epoch:
                continue
            cut = tracer.start_span(
                self._name(row.kind, row.tool_name or self.settings.model or ""),
                context=inside,
                start_time=_ns(row.started_at),
                attributes={
                    **self._step_attributes(row.kind, row.tool_name, row.call_id),
                    "durable_agent.step.seq": row.seq,
                    "durable_agent.step.attempt": row.attempts,
                    "durable_agent.step.idempotency_key": row.idempotency_key,
                    "durable_agent.step.resumed": row.attempts > 1,
                    "durable_agent.step.interrupted": True,
                },
            )
            cut.set_status(Status(StatusCode.ERROR, "its process died during the attempt"))
            cut.end(end_time=max(_ns(seen[1]) or 0, _ns(row.started_at) or 0))
        span.set_status(Status(StatusCode.ERROR, "the process running the session died"))
        span.end(end_time=_ns(seen[1]))

    def _name(self, kind: str, name: str) -> str:
        if kind == StepKind.MODEL:
            return f"chat {name}"
        if kind == StepKind.TOOL:
            return f"execute_tool {name}"
        return _SPAN_NAMES.get(kind, kind)

    def _step_attributes(self, kind: str, tool: str | None, call_id: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gen_ai.conversation.id": self.ctx.state.run_id,
            "durable_agent.step.kind": kind,
        }
        if kind in (StepKind.MODEL, StepKind.COMPACT):
            out["gen_ai.operation.name"] = "chat"
            out["gen_ai.provider.name"] = self.provider
            out["gen_ai.request.model"] = self.settings.model or ""
        elif kind == StepKind.TOOL:
            out["gen_ai.operation.name"] = "execute_tool"
            out["gen_ai.tool.name"] = tool or ""
            out["gen_ai.tool.type"] = "function"
            if call_id:
                out["gen_ai.tool.call.id"] = call_id
        return out

    # -- the observer's side ---------------------------------------------------------------
    def step(self, e: StepEvent) -> None:
        if e.state == StepState.STARTED:
            self.open[e.seq] = _Process.tracer.start_span(
                self._name(e.kind, e.name),
                context=self.context,
                attributes={
                    **self._step_attributes(
                        e.kind, e.name if e.kind == StepKind.TOOL else None, e.call_id
                    ),
                    "durable_agent.step.seq": e.seq,
                    "durable_agent.step.attempt": e.attempts,
                    "durable_agent.step.idempotency_key": e.key,
                    "durable_agent.step.resumed": e.resumed,
                },
            )
            return
        if e.state not in (StepState.COMPLETED.value, StepState.FAILED.value):
            return
        span = self.open.pop(e.seq, None)
        if span is None:  # an instant step (no `started`): its span covers its duration
            end = time.time_ns()
            span = _Process.tracer.start_span(
                self._name(e.kind, e.name),
                context=self.context,
                start_time=end - (e.duration_ms or 0) * 1_000_000,
                attributes={
                    **self._step_attributes(
                        e.kind, e.name if e.kind == StepKind.TOOL else None, e.call_id
                    ),
                    "durable_agent.step.seq": e.seq,
                    "durable_agent.step.attempt": e.attempts,
                    "durable_agent.step.idempotency_key": e.key,
                    "durable_agent.step.resumed": e.resumed,
                },
            )
        self._finish(span, e)

    def _finish(self, span: Any, e: StepEvent) -> None:
        from opentelemetry.trace import Status, StatusCode

        facts = e.facts or {}
        base = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": self.provider}
        base["gen_ai.request.model"] = self.settings.model or ""
        ins = _Process.instruments
        if e.prompt_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", e.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", e.completion_tokens or 0)
            ins["tokens"].record(e.prompt_tokens, {**base, "gen_ai.token.type": "input"})
            ins["tokens"].record(e.completion_tokens or 0, {**base, "gen_ai.token.type": "output"})
            if e.duration_ms is not None:
                ins["duration"].record(e.duration_ms / 1000, base)
        if e.cached_tokens:
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", e.cached_tokens)
        if e.cost is not None:
            span.set_attribute("durable_agent.cost", e.cost)
            ins["cost"].add(e.cost, base)
        if facts.get("response_model"):
            span.set_attribute("gen_ai.response.model", str(facts["response_model"]))
        if facts.get("finish_reason"):
            span.set_attribute("gen_ai.response.finish_reasons", [str(facts["finish_reason"])])
        if e.kind in (StepKind.MODEL, StepKind.COMPACT):
            span.set_attribute("durable_agent.step.attempts", e.attempts)
            if e.attempts > 1:
                ins["retries"].add(e.attempts - 1, base)
        if self.capture:
            self._content(span, facts)
        ins["steps"].add(
            1, {"durable_agent.step.kind": e.kind, "durable_agent.step.state": e.state}
        )
        if e.state == StepState.FAILED.value:
            span.set_status(Status(StatusCode.ERROR, (e.error or "failed")[:500]))
        span.end()

    def _content(self, span: Any, facts: dict[str, Any]) -> None:
        """Messages and arguments as the store keeps them (redacted the same way)."""

        def shown(m: Any) -> dict[str, Any]:
            d = m.to_api() if isinstance(m, Message) else m  # role, content, tool_calls
            return d if isinstance(d, dict) else {"content": str(d)}

        if isinstance(facts.get("input"), list):
            span.set_attribute("gen_ai.input.messages", _dumps([shown(m) for m in facts["input"]]))
        elif facts.get("input") is not None:
            span.set_attribute("gen_ai.tool.call.arguments", _dumps(facts["input"]))
        if facts.get("output") is not None:
            span.set_attribute("gen_ai.output.messages", _dumps([shown(facts["output"])]))

    def end(self, status: str | None, error: BaseException | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        for span in self.open.values():  # cut off by the end of the session (a store fault)
            span.set_status(Status(StatusCode.ERROR, "the session ended during the step"))
            span.end()
        self.open.clear()
        if status is not None:
            self.span.set_attribute("durable_agent.run.status", status)
        if error is not None:
            self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))
        self.span.end()


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)[:100_000]


class TracingObserver(Observer):
    """The session's observer: the spans, then whoever observed before (the timeline)."""

    def __init__(self, inner: Observer, session: Session) -> None:
        self.inner, self.session = inner, session

    def run_started(self, run_id: str, *, resumed: bool, steps_done: int) -> None:
        self.inner.run_started(run_id, resumed=resumed, steps_done=steps_done)

    def step(self, event: StepEvent) -> None:
        with contextlib.suppress(Exception):  # a tracing fault never changes the run
            self.session.step(event)
        self.inner.step(event)

    def note(self, text: str) -> None:
        self.inner.note(text)
