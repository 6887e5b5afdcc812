"""A deadline on a whole HTTP exchange, enforced at every socket operation.

httpx bounds each wait (connect, one read, one write), never the exchange: a server that
sends a header line every half second, endless `103 Early Hints`, a trickled error body
or empty deflate blocks (which decode to nothing, so a loop over the decoded body never
sees them) held a model call, its run's cancel and time budget, for as long as it liked.
So the connection pool's network backend is wrapped: each connect, read and write waits
at most until the deadline of the call under way (a context variable, so a connection
kept alive from an earlier call obeys the current one), and one that starts after it
raises the HTTP library's own ReadTimeout, which openai reports as a timeout. No thread
is left behind and nothing else changes: a call without a deadline runs as before.

Inside `stopping(event)` a read waits in slices of STOP_SLICE_S and raises `Stopped` once
the event is set: `durable-agent cancel` ends a call waiting on a slow model at once, not
when the model answers (request_timeout_s, 10 minutes by default).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_DEADLINE: ContextVar[float | None] = ContextVar("durable_agent_http_deadline", default=None)
_STOP: ContextVar[threading.Event | None] = ContextVar("durable_agent_http_stop", default=None)
STOP_SLICE_S = 0.25


class Stopped(BaseException):
    """The call was stopped (its run cancelled) while it waited for the answer. Not an
    Exception, like KeyboardInterrupt: neither openai nor the retry layer take it for a
    failed try, and the HTTP pool closes the connection it was read from."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Socket operations of the hooked clients in this block end by `seconds` from now."""
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


@contextmanager
def stopping(event: threading.Event) -> Iterator[None]:
    """Reads of the hooked clients in this block raise `Stopped` soon after `event` is set."""
    token = _STOP.set(event)
    try:
        yield
    finally:
        _STOP.reset(token)


def hook(openai_client: Any) -> bool:
    """Wrap the network backend of every connection pool of an openai client: the default
    transport's and each proxy's (HTTP(S)_PROXY mounts transports of their own, which then
    carry all the traffic). False when any has another shape: then only the body read is
    bounded, by the caller."""
    http = getattr(openai_client, "_client", None)
    mounts = getattr(http, "_mounts", None)
    transports = [
        getattr(http, "_transport", None),
        *(mounts.values() if isinstance(mounts, dict) else []),
    ]
    pools = [getattr(t, "_pool", None) for t in transports if t is not None]
    inners = [getattr(pool, "_network_backend", None) for pool in pools]
    if (
        not pools
        or not isinstance(mounts, dict)
        or not all(callable(getattr(i, "connect_tcp", None)) for i in inners)
    ):
        return False
    for pool, inner in zip(pools, inners, strict=True):
        if pool is not None and not isinstance(inner, _Backend):
            pool._network_backend = _Backend(inner)
    return True


def _bound(timeout: float | None, timeout_error: type[Exception]) -> float | None:
    """The wait allowed for one socket operation: its own timeout, cut at the deadline."""
    end = _DEADLINE.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise timeout_error("the deadline of the whole request passed (request_timeout_s)")
    return left if timeout is None else min(timeout, left)


def _timeout_error(inner: object) -> type[Exception]:
    """ReadTimeout of the httpcore that made `inner` (httpcore or httpcore2): the class its
    transport maps to its own ReadTimeout, and openai to APITimeoutError."""
    module = sys.modules.get(type(inner).__module__.partition(".")[0])
    found = getattr(module, "ReadTimeout", None)
    return found if isinstance(found, type) and issubclass(found, Exception) else TimeoutError


class _Stream:
    def __init__(self, inner: Any, error: type[Exception]) -> None:
        self._inner, self._error = inner, error

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        stop = _STOP.get()
        if stop is None:
            data: bytes = self._inner.read(max_bytes, _bound(timeout, self._error))
            return data
        ends = None if timeout is None else time.monotonic() + timeout
        while (
            True
        ):  # in slices, looking at the event between them (a timed-out recv can be made again)
            if stop.is_set():
                raise Stopped
            wait = _bound(None if ends is None else max(0.0, ends - time.monotonic()), self._error)
            if (
                wait is not None and wait <= 0
            ):  # (a zero timeout would read non-blocking: not a timeout)
                raise self._error("timed out")
            try:
                data = self._inner.read(
                    max_bytes, STOP_SLICE_S if wait is None else min(wait, STOP_SLICE_S)
                )
                return data
            except self._error:
                if wait is not None and wait <= STOP_SLICE_S:
                    raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bound(timeout, self._error))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> _Stream:
        return _Stream(
            self._inner.start_tls(ssl_context, server_hostname, _bound(timeout, self._error)),
            self._error,
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend:
    def __init__(self, inner: Any) -> None:
        self._inner, self._error = inner, _timeout_error(inner)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> _Stream:
        stream = self._inner.connect_tcp(
            host, port, _bound(timeout, self._error), local_address, socket_options
        )
        return _Stream(stream, self._error)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> _Stream:
        stream = self._inner.connect_unix_socket(path, _bound(timeout, self._error), socket_options)
        return _Stream(stream, self._error)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)
