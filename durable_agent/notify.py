"""The deliverer of the notifications outbox (store/outbox.py): in the process that ran a
run (after its session) and in every worker (a thread), it claims each undelivered row,
sends it, retries with tenacity, and marks it delivered.

Exactly once per key: a row is marked only after its target accepted it, so a crash
between the commit and the send, or between the send and the mark, sends it again later
under the same `Idempotency-Key`; a receiver keeps the keys it has seen and drops a repeat.

A webhook gets `POST url` with the event as JSON and these headers:

    Idempotency-Key            the row's key, the same on every retry and redelivery
    X-Durable-Agent-Event      the event (blocked, completed, failed, ...)
    X-Durable-Agent-Timestamp  unix seconds when this attempt was signed
    X-Durable-Agent-Signature  sha256=HEX, HEX = HMAC-SHA256(secret, TIMESTAMP "." KEY "." BODY)

(only with a `secret`). A command gets the JSON on stdin and DURABLE_AGENT_EVENT,
DURABLE_AGENT_IDEMPOTENCY_KEY and DURABLE_AGENT_RUN_ID in its environment; exit 0 is
delivered.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from durable_agent.config.settings import NotifyTarget, Settings, webhook_name
from durable_agent.redact import is_secret_name
from durable_agent.store.outbox import NOTIFY_HOOKS, Notification, Outbox
from durable_agent.store.retrying import StorePolicy
from durable_agent.tools.process import has_url_password

KEY_HEADER = "Idempotency-Key"
EVENT_HEADER = "X-Durable-Agent-Event"
TIMESTAMP_HEADER = "X-Durable-Agent-Timestamp"
SIGNATURE_HEADER = "X-Durable-Agent-Signature"


class DeliveryFailed(Exception):
    pass


class _NotFollowed(urllib.request.HTTPRedirectHandler):
    """A 3xx is an answer that did not accept the event: following it would send a GET, with
    the key and signature and without the event, to wherever it points (a cloud's metadata
    address...), and that address's 200 would mark the event sent."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


class _Timed:
    """A handler whose connections register their sockets with the delivery under way in
    this thread (_deadline): urllib's timeout bounds each read, not the exchange, and a
    receiver that sends its status line a byte at a time would hold the deliverer for ever."""

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        def connection(*args: Any, **kw: Any) -> Any:
            conn = http_class(*args, **kw)
            conn._create_connection = _registered  # (http.client's hook for making the socket)
            return conn

        return super().do_open(connection, req, **kwargs)  # type: ignore[misc]


class _TimedHTTP(_Timed, urllib.request.HTTPHandler):
    pass


class _TimedHTTPS(_Timed, urllib.request.HTTPSHandler):
    pass


_local = threading.local()


def _registered(address: Any, *args: Any) -> socket.socket:
    sock = socket.create_connection(address, *args)
    sockets = getattr(_local, "sockets", None)
    if sockets is not None:
        sockets.append(sock)
    return sock


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """The sockets the block opens are shut down `seconds` after it began, if it is still
    under way: a read waiting on them ends (an OSError, a failed delivery)."""
    sockets: list[socket.socket] = []
    _local.sockets = sockets

    def expire() -> None:
        for sock in list(sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        _local.sockets = None


_OPENER = urllib.request.build_opener(_NotFollowed, _TimedHTTP, _TimedHTTPS)


def body_of(row: Notification) -> bytes:
    return json.dumps(row.payload, sort_keys=True, separators=(",", ":")).encode()


def signature(secret: str, timestamp: str, key: str, body: bytes) -> str:
    """`sha256=` and the hex HMAC-SHA256 of TIMESTAMP.KEY.BODY under `secret`."""
    signed = timestamp.encode() + b"." + key.encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


class Deliverer:
    def __init__(
        self,
        engine: Any,
        settings: Settings,
        policy: StorePolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.outbox = Outbox(engine, policy)
        self.settings = settings
        self.sleep = sleep
        self.targets: dict[str, NotifyTarget] = {t.target: t for t in settings.notify}
        # A row a process of a version before 0017 queued after the store was upgraded
        # names its webhook by the whole URL: still this process's to send.
        self.targets.update((t.url, t) for t in settings.notify if t.url is not None)

    def claim_seconds(self) -> float:
        s = self.settings
        return (s.notify_timeout_s + s.notify_retry_max_wait_s) * s.notify_retry_attempts + 1

    def deliver_due(self) -> tuple[int, list[str]]:
        """One pass over the due rows this process has a target for: (delivered, errors)."""
        done, errors = 0, []
        for row in self.outbox.due():
            target = self.targets.get(row.target)
            if target is None:
                continue  # another process's target: left for one that has it configured
            if not self.outbox.claim(row.id, self.claim_seconds()):
                continue
            for hook in NOTIFY_HOOKS:
                hook("claimed")
            attempts, error = self._send(row, target)
            if error is None:
                for hook in NOTIFY_HOOKS:
                    hook("posted")
                self.outbox.delivered(row.id, row.attempts + attempts)
                done += 1
            else:
                self.outbox.failed(row.id, row.attempts + attempts, error)
                errors.append(f"{row.event} of run {row.run_id} to {_shown(row.target)}: {error}")
        return done, errors

    def _send(self, row: Notification, target: NotifyTarget) -> tuple[int, str | None]:
        from tenacity import Retrying, stop_after_attempt, wait_exponential

        s = self.settings
        tries = [0]

        def once() -> None:
            tries[0] += 1
            if target.url is not None:
                self._post(row, target)
            else:
                self._run(row, target)

        retrying = Retrying(
            stop=stop_after_attempt(s.notify_retry_attempts),
            wait=wait_exponential(
                multiplier=s.notify_retry_initial_wait_s,
                max=s.notify_retry_max_wait_s,
            ),
            sleep=self.sleep,
            reraise=True,
        )
        try:
            retrying(once)
        except (DeliveryFailed, OSError, subprocess.SubprocessError) as exc:
            return tries[0], str(exc) or type(exc).__name__
        return tries[0], None

    def _post(self, row: Notification, target: NotifyTarget) -> None:
        assert target.url is not None
        body = body_of(row)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "durable-agent",
            KEY_HEADER: row.idempotency_key,
            EVENT_HEADER: row.event,
        }
        if target.secret is not None:
            stamp = str(int(time.time()))
            headers[TIMESTAMP_HEADER] = stamp
            headers[SIGNATURE_HEADER] = signature(
                target.secret.get_secret_value(), stamp, row.idempotency_key, body
            )
        request = urllib.request.Request(target.url, data=body, headers=headers, method="POST")
        try:
            # The status is the answer: the body is not read, so a receiver that sends one
            # without end, or a byte at a time, cannot hold the deliverer; nor one that
            # sends its status and headers so (_deadline).
            seconds = self.settings.notify_timeout_s
            with _deadline(seconds), _OPENER.open(request, timeout=seconds):
                pass
        except urllib.error.HTTPError as exc:
            raise DeliveryFailed(f"HTTP {exc.code}") from None
        except urllib.error.URLError as exc:
            raise DeliveryFailed(str(exc.reason)) from None
        except ValueError as exc:  # a url urllib cannot send (InvalidURL, not ASCII)
            raise DeliveryFailed(f"the url cannot be sent: {type(exc).__name__}") from None
        except (OSError, http.client.HTTPException) as exc:  # cut off at the deadline
            raise DeliveryFailed(
                f"no answer within notify_timeout_s ({self.settings.notify_timeout_s:g} s)"
                f": {type(exc).__name__}"
            ) from None

    def _run(self, row: Notification, target: NotifyTarget) -> None:
        assert target.command is not None
        # The process's environment (notify-send needs its DISPLAY and D-Bus address), but
        # for its credentials: the model's API key is no business of a notification program.
        env = {
            **{
                name: value
                for name, value in os.environ.items()
                if not is_secret_name(name) and not has_url_password(value)
            },
            "DURABLE_AGENT_EVENT": row.event,
            "DURABLE_AGENT_IDEMPOTENCY_KEY": row.idempotency_key,
            "DURABLE_AGENT_RUN_ID": row.run_id or "",
        }
        done = subprocess.run(
            target.command,
            input=body_of(row),
            env=env,
            capture_output=True,
            timeout=self.settings.notify_timeout_s,
            check=False,
        )
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip()[-200:]
            raise DeliveryFailed(f"exit {done.returncode}" + (f": {tail}" if tail else ""))

    def background(
        self, stop: threading.Event, wake: threading.Event, every: float
    ) -> threading.Thread:
        """A worker's delivery thread: a pass whenever a run ends, and every `every` seconds."""

        def loop() -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):  # the store away: the next pass tries
                    self.deliver_due()
                wake.wait(every)
                wake.clear()

        thread = threading.Thread(target=loop, name="notify", daemon=True)
        thread.start()
        return thread


def _shown(target: str) -> str:
    """A target as an error line names it. A webhook by its scheme and host only: its path
    or query is often its credential (a Slack or Discord hook's URL, `?token=`)."""
    try:
        parts = urlsplit(target)
    except ValueError:
        parts = None
    # (`HTTPS://`, ` https://`: a webhook too, to urllib; a row an earlier version queued)
    if parts is not None and parts.scheme in ("http", "https"):
        return webhook_name(target).partition(" sha256:")[0]  # scheme://host[:port]/...
    return target if len(target) < 80 else target[:77] + "..."


def deliver_after_session(engine: Any, settings: Settings) -> list[str]:
    """The running process's pass once its session ended: the errors, for one line each."""
    if not settings.notify:
        return []
    try:
        return Deliverer(engine, settings).deliver_due()[1]
    except Exception as exc:  # noqa: BLE001 - the run is recorded; a worker delivers later
        return [str(exc)]
