"""The live channel of a model call: what it has streamed so far, for the web view.

The store keeps no per-token rows (a write per token would cost more than the call); the
step's outcome is the durable record. While a streamed call runs, its process keeps a small
JSON file with the text, the thinking and the tool names so far, rewritten at most every
WRITE_EVERY_S when it changed (write then rename: a reader sees a whole file) and removed
when the call ends, whatever the end. `durable-agent ui` reads it on the same machine and sends it over
its event stream. A run executed on another machine (a worker sharing PostgreSQL) shows its
steps as they complete, without live tokens.

Where: `$XDG_RUNTIME_DIR/durable-agent/live/<store>/<run id>.json` (or the temp folder's
`durable-agent-<uid>/live/...`), `<store>` a hash of the store's identity
(store.location.store_key), so two stores' runs of the same id never meet. Folders are
private to the user (0700). Nothing here can fail a run: a file that cannot be written is
no live view.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from durable_agent.observer import DeltaKind

WRITE_EVERY_S = 0.1  # at most ten writes a second, whatever the stream's pace
KEEP_CHARS = 32 * 1024  # of the text and of the thinking: the newest part is what is shown


def channel_dir(store_key: str, env: Mapping[str, str]) -> Path:
    runtime = env.get("XDG_RUNTIME_DIR")
    base = (
        Path(runtime) / "durable-agent"
        if runtime and os.path.isabs(runtime)
        else Path(tempfile.gettempdir()) / f"durable-agent-{os.getuid()}"
    )
    return base / "live" / hashlib.sha256(store_key.encode()).hexdigest()[:16]


def channel_file(store_key: str, env: Mapping[str, str], run_id: str) -> Path:
    return channel_dir(store_key, env) / f"{run_id}.json"


def read(path: Path) -> dict[str, Any] | None:
    """The call's state as last written; None when no call is streaming."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Channel:
    """The writer's side, for one model call (step `seq`). The pieces only change the state
    in memory; a thread of its own writes it when it changed, at most every WRITE_EVERY_S,
    so the last pieces before a pause in the stream are seen during the pause, and a fast
    stream costs at most ten small writes a second."""

    def __init__(self, path: Path, seq: int, turn: int) -> None:
        self.path, self.seq, self.turn = path, seq, turn
        self.tries = 0
        self.text, self.reasoning = "", ""
        self.tools: list[str] = []
        self.version = 0
        self._written = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._broken = False

    def add(self, kind: DeltaKind, text: str) -> None:
        with self._lock:
            if kind is DeltaKind.START:
                self.tries += 1
                self.text, self.reasoning, self.tools = "", "", []
            elif kind is DeltaKind.TEXT:
                self.text = (self.text + text)[-KEEP_CHARS:]
            elif kind is DeltaKind.REASONING:
                self.reasoning = (self.reasoning + text)[-KEEP_CHARS:]
            else:
                self.tools.append(text)
            self.version += 1
        if self._thread is None and not self._broken:
            self._thread = threading.Thread(target=self._loop, name="live-channel", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._closed.wait(WRITE_EVERY_S):
            self.flush()

    def flush(self) -> None:
        """Write the state now, if it changed since the last write."""
        with self._lock:
            if self.version == self._written or self._broken or self._closed.is_set():
                return
            self._written = self.version
            doc = {
                "seq": self.seq,
                "turn": self.turn,
                "try": self.tries,
                "version": self.version,
                "text": self.text,
                "reasoning": self.reasoning,
                "tools": list(self.tools),
            }
            try:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
                tmp.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
                tmp.replace(self.path)
            except OSError:
                self._broken = True  # (a full disk, a read-only temp folder): no live view

    def close(self) -> None:
        """The call ended: no more writes, the file goes (the step row says how it ended)."""
        with self._lock:
            self._closed.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(OSError):
            self.path.unlink()
