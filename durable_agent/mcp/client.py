"""One MCP server session, driven from the synchronous harness.

The `mcp` SDK is async (anyio). Each server gets a thread of its own running an asyncio
loop; one long-lived task there enters the transport and the `ClientSession` and holds
them open (anyio's context managers must be left by the task that entered them). The
harness submits each request to that loop and waits for it with a timeout, so a tool call
is an ordinary blocking call.

A server that dies is noticed by the failed request (or by the holder task ending); the
connection is torn down and the next call starts it again. Its stderr goes to a log file,
capped and rotated (server_log.py), whose tail is quoted when it fails to start or dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from pathlib import Path
from typing import IO, Any, TypeVar

from msgspec import Struct, field

from durable_agent.errors import ConfigError
from durable_agent.mcp.server_log import CappedLog

T = TypeVar("T")
MISSING_EXTRA = "MCP servers need the `mcp` extra: pip install 'durable-agent[mcp]'"


def require_sdk() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ConfigError(MISSING_EXTRA) from None


_SDK_LOGS: dict[int, CappedLog] = {}  # a server's loop thread -> that server's log file


class _ToServerLog(logging.Handler):
    """The SDK's own log records (a message it could not parse, with its traceback) go to
    the log of the server whose loop thread wrote them, beside its stderr: never to the
    terminal, which Python's last-resort handler would print them on."""

    def emit(self, record: logging.LogRecord) -> None:
        log = _SDK_LOGS.get(record.thread or 0)
        if log is None:
            return
        with contextlib.suppress(OSError, ValueError):  # closed as the server stops
            log.write(self.format(record) + "\n")


def _route_sdk_log() -> None:
    sdk = logging.getLogger("mcp")
    if not any(isinstance(handler, _ToServerLog) for handler in sdk.handlers):
        sdk.addHandler(_ToServerLog())
        sdk.propagate = False


class ServerFailed(Exception):
    """The server could not be started, or died, or broke the protocol. Not a tool error."""


class CallTimedOut(Exception):
    """A call took longer than its timeout (it may still be running on the server)."""


class Launch(Struct, frozen=True):
    """How to reach one server: an argv with its environment (stdio) or a URL."""

    name: str
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    log_path: Path | None = None
    log_max_bytes: int = 5_000_000  # the setting mcp_log_max_bytes
    cleanup: Callable[[], None] = lambda: None
    network: bool | None = None  # under a sandbox: whether it has the network (None: unconfined)
    cache_dir: str | None = None  # the folder it may write under the sandbox


class RemoteTool(Struct, frozen=True):
    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]


class CallOutcome(Struct, frozen=True):
    text: str
    is_error: bool
    structured: Any


class ServerConnection:
    """A started server: `tools()` and `call()` block; `close()` stops it (idempotent)."""

    def __init__(self, launch: Launch, startup_timeout_s: float) -> None:
        self.launch = launch
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"mcp-{launch.name}", daemon=True
        )
        self._stop: asyncio.Event | None = None
        self._holder: asyncio.Future[None] | None = None
        self._session: Any = None
        # What the server says it is (initialize's serverInfo): part of a run's fingerprint.
        self.server_info: dict[str, str] = {}
        self._log: CappedLog | None = None
        self._errlog: IO[str] | None = None  # the pipe's write end, until the server has it
        self._unreadable: tuple[int, Exception | None] = (
            0,
            None,
        )  # messages the SDK dropped, the last
        # Only what this start of the server wrote is quoted, not an earlier one's stderr.
        path = launch.log_path
        self._log_from = path.stat().st_size if path is not None and path.exists() else 0
        self._thread.start()
        try:
            self._submit(self._open(), startup_timeout_s)
        except Exception as exc:
            self.close()
            if isinstance(exc, ServerFailed):
                raise
            why = (
                f"did not start within {startup_timeout_s:g}s"
                if isinstance(exc, CallTimedOut)
                else str(exc)
            )
            raise ServerFailed(
                self._with_tail(f"MCP server {launch.name!r} failed to start: {why}")
            ) from None

    @property
    def alive(self) -> bool:
        return (
            self._holder is not None
            and not self._holder.done()
            and self._session is not None
            and not self._loop.is_closed()
        )

    def responsive(self, timeout_s: float) -> bool:
        """Whether the server still answers a ping. One that died between calls is seen here,
        before a call is sent to it, so it is started again and the call is not lost to it.
        An error answer (a server without ping) is an answer: it is alive."""
        if not self.alive:
            return False
        try:
            self._submit(self._session.send_ping(), timeout_s)
        except CallTimedOut:
            return False
        except Exception as exc:  # noqa: BLE001 - the transport's failures mean it is gone
            return self.alive and not _is_transport_error(exc)
        return True

    def tools(self, timeout_s: float) -> list[RemoteTool]:
        listed: list[RemoteTool] = []
        cursor: str | None = None
        while True:
            page = self._request(self._list_page(cursor), timeout_s)
            for tool in page.tools:
                raw = (
                    tool.annotations.model_dump(by_alias=True, exclude_none=True)
                    if tool.annotations
                    else {}
                )
                listed.append(
                    RemoteTool(
                        tool.name,
                        tool.description or "",
                        dict(tool.input_schema or {}),
                        _camel(raw),
                    )
                )
            cursor = getattr(page, "next_cursor", None) or getattr(page, "nextCursor", None)
            if not cursor:
                return listed

    def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        timeout_s: float,
        cancel: threading.Event | None = None,
    ) -> CallOutcome:
        result = self._request(self._session.call_tool(tool, arguments), timeout_s, cancel)
        texts = []
        for block in result.content:
            text = getattr(block, "text", None)
            texts.append(
                text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')} content]"
            )
        structured = getattr(result, "structured_content", None)
        if structured is None:
            structured = getattr(result, "structuredContent", None)
        is_error = bool(getattr(result, "is_error", getattr(result, "isError", False)))
        return CallOutcome("\n".join(texts), is_error, structured)

    def stderr_tail(self, chars: int = 400) -> str:
        """The end of what this start of the server wrote to stderr, on one line."""
        path = self.launch.log_path
        if self._log is not None:
            self._log.drain(0.5)  # (a server still running keeps it open: not waited for long)
        if path is None or not path.exists():
            return ""
        start = self._log.start if self._log is not None else self._log_from
        with path.open("rb") as f:
            f.seek(max(start, path.stat().st_size - chars))
            text = f.read().decode("utf-8", "replace")
        return " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self._stop is not None and self._holder is not None and not self._holder.done():
            self._loop.call_soon_threadsafe(self._stop.set)
            deadline = time.monotonic() + 5.0
            while not self._holder.done() and time.monotonic() < deadline:
                time.sleep(0.02)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self._loop.close()
        if self._thread.ident is not None:
            _SDK_LOGS.pop(self._thread.ident, None)
        self._release_errlog()
        if self._log is not None:
            self._log.close()
        self.launch.cleanup()

    # -- inside the loop ---------------------------------------------------------------
    async def _open(self) -> None:
        ready: asyncio.Future[None] = self._loop.create_future()
        self._stop = asyncio.Event()
        self._holder = asyncio.ensure_future(self._hold(ready))
        await ready

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        from mcp import ClientSession

        try:
            async with AsyncExitStack() as stack:
                try:
                    read, write = await stack.enter_async_context(self._transport())
                finally:
                    # The server holds its stderr now (or never will): only it keeps the
                    # pipe open, so the log's reader ends when the server does.
                    self._release_errlog()
                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self._on_message)
                )
                initialized = await session.initialize()
                info = getattr(initialized, "serverInfo", None)
                if info is not None:
                    self.server_info = {
                        "name": str(getattr(info, "name", "")),
                        "version": str(getattr(info, "version", "")),
                    }
                self._session = session
                ready.set_result(None)
                assert self._stop is not None
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to the waiting caller, if any
            if not ready.done():
                ready.set_exception(
                    ServerFailed(
                        self._with_tail(
                            f"MCP server {self.launch.name!r} failed to start: {_describe(exc)}"
                        )
                    )
                )
        finally:
            self._session = None

    async def _on_message(self, message: Any) -> None:
        # A message the SDK could not read (nested past its parser's limits, say) is logged
        # there and dropped: the answer it carried would never come, and the call would
        # wait out its whole timeout. Counted here, it ends the call waiting (_submit).
        if isinstance(message, Exception):
            self._unreadable = (self._unreadable[0] + 1, message)

    def _transport(self) -> Any:
        launch = self.launch
        if launch.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(launch.url)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        assert launch.log_path is not None
        self._log = CappedLog(launch.log_path, launch.log_max_bytes)
        _route_sdk_log()
        _SDK_LOGS[threading.get_ident()] = self._log  # this runs in the server's loop thread
        params = StdioServerParameters(
            command=launch.argv[0], args=launch.argv[1:], env=launch.env, cwd=launch.cwd
        )
        # Through a pipe, not the file itself: only so can the log be capped (a server's
        # stderr written straight to the file filled the disk beside the store).
        self._errlog = os.fdopen(self._log.pipe(), "w")
        return stdio_client(params, errlog=self._errlog)

    def _release_errlog(self) -> None:
        errlog, self._errlog = self._errlog, None
        if errlog is not None:
            errlog.close()

    async def _list_page(self, cursor: str | None) -> Any:
        if cursor is None:
            return await self._session.list_tools()
        from mcp.types import PaginatedRequestParams

        return await self._session.list_tools(params=PaginatedRequestParams(cursor=cursor))

    # -- from the harness's thread -------------------------------------------------------
    def _request(
        self, coro: Coroutine[Any, Any, T], timeout_s: float, cancel: threading.Event | None = None
    ) -> T:
        if not self.alive:
            coro.close()
            raise ServerFailed(self._with_tail(f"MCP server {self.launch.name!r} is not running"))
        try:
            return self._submit(coro, timeout_s, cancel)
        except (CallTimedOut, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - the transport's failures, translated once
            if self.alive and not _is_transport_error(exc):
                raise ServerFailed(f"MCP server {self.launch.name!r}: {_describe(exc)}") from None
            raise ServerFailed(
                self._with_tail(
                    f"MCP server {self.launch.name!r} died or broke the connection: {_describe(exc)}"
                )
            ) from None

    def _submit(
        self, coro: Coroutine[Any, Any, T], timeout_s: float, cancel: threading.Event | None = None
    ) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        deadline = time.monotonic() + timeout_s
        unreadable = self._unreadable[0]
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CallTimedOut(f"no answer within {timeout_s:g}s")
                if cancel is not None and cancel.is_set():
                    raise CallTimedOut("cancelled while waiting for the server")
                try:
                    return future.result(timeout=min(left, 0.1))
                except TimeoutError:
                    if future.done():
                        raise
                    count, error = self._unreadable
                    if count != unreadable and error is not None:
                        raise ServerFailed(
                            f"MCP server {self.launch.name!r} sent a message that could not be "
                            f"read, its answer lost: {_describe(error)}"
                        ) from None
                    if self._holder is not None and self._holder.done():
                        # The holder ended: the server is gone and this answer will not come.
                        time.sleep(0.1)
                        if not future.done():
                            raise ServerFailed(
                                self._with_tail(
                                    f"MCP server {self.launch.name!r} died during the call"
                                )
                            ) from None
        finally:
            if not future.done():
                future.cancel()

    def _with_tail(self, message: str) -> str:
        tail = self.stderr_tail()
        return f"{message}; its stderr ends with: {tail}" if tail else message


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return str(exc) or type(exc).__name__


def _is_transport_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return any(word in text for word in ("closed", "connection", "brokenresource", "endofstream"))


def _camel(annotations: dict[str, Any]) -> dict[str, Any]:
    """Annotations under their protocol names (readOnlyHint ...), whatever the SDK's spelling."""
    names = {
        "read_only_hint": "readOnlyHint",
        "destructive_hint": "destructiveHint",
        "idempotent_hint": "idempotentHint",
        "open_world_hint": "openWorldHint",
    }
    return {names.get(k, k): v for k, v in annotations.items()}
