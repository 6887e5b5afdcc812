"""A local webhook receiver for the notification tests (stdlib only).

It records every request (headers, body), fails the first `fail_first` requests with a
503, can be taken down and brought back on the same port, and counts idempotency keys the
way a receiver that deduplicates would: `events()` holds each key once."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self, fail_first: int = 0, secret: str | None = None) -> None:
        self.fail_first = fail_first
        self.secret = secret
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    n = len(receiver.requests)
                    receiver.requests.append(
                        {
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                            "path": self.path,
                        }
                    )
                    failing = n < receiver.fail_first
                self.send_response(503 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        self.server = None

    def accepted(self) -> list[dict[str, Any]]:
        """The requests answered 200, in order."""
        with self.lock:
            return self.requests[self.fail_first :]

    def events(self) -> dict[str, dict[str, Any]]:
        """Key -> event, each key once (what a deduplicating receiver keeps)."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.accepted():
            out.setdefault(r["headers"]["idempotency-key"], json.loads(r["body"]))
        return out

    def verify(self, request: dict[str, Any]) -> bool:
        """The signature header checks out under the secret (as a receiver checks it)."""
        assert self.secret is not None
        h = request["headers"]
        signed = (
            h["x-durable-agent-timestamp"].encode()
            + b"."
            + h["idempotency-key"].encode()
            + b"."
            + request["body"]
        )
        good = hmac.new(self.secret.encode(), signed, hashlib.sha256).hexdigest()
        return hmac.compare_digest(h["x-durable-agent-signature"], "sha256=" + good)

    def close(self) -> None:
        if self.server is not None:
            self.down()
