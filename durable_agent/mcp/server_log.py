"""An MCP server's stderr log, capped: a server must not fill the disk beside the store.

The server writes into a pipe, not into the file: a thread here reads it and appends to
`mcp-NAME.log` until the file would pass `max_bytes`; then the file becomes `mcp-NAME.log.1`
(the one before that is dropped) and a new file begins with a line that says so and how
much was dropped. At most twice `max_bytes` are ever on disk. A server that writes faster
than the thread reads is held up by the pipe, not buffered here.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_READ_CHUNK = 65536


class CappedLog:
    """Appends to `path`, rotating it at `max_bytes`. Thread-safe (the pipe's reader and the
    SDK's log records write to it)."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path, self.max_bytes = path, max_bytes
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = self._open()
        self.start = os.fstat(self._fd).st_size  # where what this start of the server writes begins
        self._reader: threading.Thread | None = None

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def write(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8", "replace")
        with self._lock:
            if self._fd < 0:
                return
            view = memoryview(data)
            while view:
                # From the file itself: another run's connection to a server of the same name
                # may append to it too.
                room = self.max_bytes - os.fstat(self._fd).st_size
                if room <= 0:
                    self._rotate()
                    continue
                written = os.write(self._fd, view[:room])
                view = view[written:]

    def _rotate(self) -> None:
        old = self.path.with_name(self.path.name + ".1")
        try:
            dropped = old.stat().st_size
        except OSError:
            dropped = 0
        os.close(self._fd)
        self._fd = -1
        os.replace(self.path, old)
        self._fd = self._open()
        self.start = 0
        note = (
            f"[durable-agent: this log was truncated at {self.max_bytes} bytes (mcp_log_max_bytes); "
            f"what came before is in {old.name}"
            + (f", and {dropped} bytes older than that were dropped" if dropped else "")
            + "]\n"
        )
        os.write(self._fd, note.encode())

    def pipe(self) -> int:
        """A pipe's write end for the server's stderr (the caller closes it once the server
        has it), and a thread copying what comes through into the log until its end."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        self._reader = threading.Thread(
            target=self._copy, args=(read_end,), name=f"log-{self.path.name}", daemon=True
        )
        self._reader.start()
        return write_end

    def _copy(self, read_end: int) -> None:
        try:
            while chunk := os.read(read_end, _READ_CHUNK):
                self.write(chunk)
        except OSError:
            pass
        finally:
            os.close(read_end)

    def drain(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for what a server that ended wrote to be in the file: its
        last words are read from there when it failed."""
        if self._reader is not None:
            self._reader.join(timeout_s)

    def close(self, timeout_s: float = 2.0) -> None:
        """After the server is gone: what it wrote last is copied first (a process it left
        holding the pipe is not waited for past `timeout_s`; its writes go nowhere then)."""
        self.drain(timeout_s)
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
