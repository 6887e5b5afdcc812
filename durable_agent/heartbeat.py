"""Threads that watch a run while its main thread is blocked in a model call or a command.

`Heartbeat` renews the lease every lease_seconds/3 and turns a cancel flag or a lost lease
into the cancel event; `watch_cancel` polls the cancel flag faster while a command runs,
so `durable-agent cancel` kills it within about half a second.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from durable_agent.errors import LeaseLost
from durable_agent.store.journal import Journal

CANCEL_POLL_S = 0.5  # how soon a running command notices `durable-agent cancel`


class Heartbeat:
    """Renews the lease while a long model call or command runs, and notices cancellation.

    Runs in a thread because the main thread is blocked inside the call it protects.
    """

    def __init__(self, journal: Journal, interval: float, cancel: threading.Event) -> None:
        self.journal, self.interval, self.cancel = journal, interval, cancel
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lease-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.journal.heartbeat():
                    self.cancel.set()
            except LeaseLost:
                self.lost = True
                self.cancel.set()  # stop a running command: its results could not be recorded
                return
            except Exception:  # noqa: BLE001 - a failed renewal is retried next beat
                continue


@contextlib.contextmanager
def watch_cancel(cancel: threading.Event, journal: Journal) -> Iterator[None]:
    """While a command runs: turn `durable-agent cancel` (a database flag) into the cancel
    event at once. The lease heartbeat notices it too, but only every lease_seconds/3."""
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(CANCEL_POLL_S) and not cancel.is_set():
            try:
                if journal.cancel_requested():
                    cancel.set()
            except Exception:  # noqa: BLE001 - a busy database is asked again next time
                continue

    watcher = threading.Thread(target=poll, name="cancel-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
