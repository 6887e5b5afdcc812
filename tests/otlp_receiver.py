"""A real OTLP/HTTP receiver on 127.0.0.1 for the tracing tests: it takes the protobuf
bodies the OTLP exporters POST to /v1/traces and /v1/metrics and decodes them with
opentelemetry-proto, keeping every span and metric name it was sent."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class OtlpReceiver:
    def __init__(self) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[Any] = []
        self.metric_names: set[str] = set()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                with receiver.lock:
                    if self.path.endswith("/v1/traces"):
                        request = ExportTraceServiceRequest.FromString(body)
                        for rs in request.resource_spans:
                            for ss in rs.scope_spans:
                                receiver.spans.extend(ss.spans)
                    elif self.path.endswith("/v1/metrics"):
                        request = ExportMetricsServiceRequest.FromString(body)
                        for rm in request.resource_metrics:
                            for sm in rm.scope_metrics:
                                receiver.metric_names.update(m.name for m in sm.metrics)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def attrs(span: Any) -> dict[str, Any]:
    """A decoded span's attributes as plain values."""
    out: dict[str, Any] = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [getattr(x, x.WhichOneof("value")) for x in v.array_value.values]
        else:
            out[kv.key] = getattr(v, kind)
    return out
