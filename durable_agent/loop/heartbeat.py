"""The thread that watches a run while its main thread is blocked in a model call or a command.

`Heartbeat` renews the lease every lease_seconds/3 and turns a cancel flag or a lost lease
into the cancel event; while a call is armed (`watch_cancel`) it also polls the cancel flag
every CANCEL_POLL_S, so `durable-agent cancel` kills a command or ends a wait for the model
within about half a second.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from durable_agent.errors import LeaseLost, StoreFileGone
from durable_agent.store.journal import Journal

CANCEL_POLL_S = 0.5  # how soon a running command notices `durable-agent cancel`


class Heartbeat:
    """Renews the lease while a long model call or command runs, and notices cancellation.

    Runs in a thread because the main thread is blocked inside the call it protects. One
    thread for the session: a thread started and joined around every call cost a step about
    a quarter of a millisecond (most of it the two hand-offs of the GIL).
    """

    def __init__(
        self,
        journal: Journal,
        interval: float,
        cancel: threading.Event,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.journal, self.interval, self.cancel, self._clock = journal, interval, cancel, clock
        self.lost = False
        # Set and cleared by the main thread with a plain assignment: no lock, so a Ctrl-C
        # landing there leaves nothing held. Not for nesting (nothing nests a call).
        self.armed = False
        self._tick = min(interval, CANCEL_POLL_S)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lease-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def _loop(self) -> None:
        renew_at = self._clock() + self.interval
        # Each wait ends at the next look or at the renewal, whichever comes first: a
        # renewal rounded up to the look's tick came up to half a second late on a short lease.
        while not self._stop.wait(max(0.0, min(self._tick, renew_at - self._clock()))):
            try:
                if self._clock() >= renew_at:
                    renew_at = self._clock() + self.interval
                    if self.journal.heartbeat():
                        self.cancel.set()
                elif (
                    self.armed
                    and not self.cancel.is_set()
                    and self.journal.cancel_requested(once=True)
                ):
                    # One try: a look retried through a store outage held the next renewal
                    # back past the lease, and another worker took the run over.
                    self.cancel.set()
            except LeaseLost:
                self.lost = True
                self.cancel.set()  # stop a running command: its results could not be recorded
                return
            except StoreFileGone:
                # The store was deleted or replaced: nothing of a running command could be
                # recorded. Stopped, it ends at its checkpoint, which says why (exit 7).
                self.cancel.set()
                return
            except Exception:  # noqa: BLE001 - a failed renewal or look is tried again next tick
                continue


@contextlib.contextmanager
def watch_cancel(
    cancel: threading.Event, journal: Journal, beat: Heartbeat | None = None
) -> Iterator[None]:
    """While a command or a model call runs: turn `durable-agent cancel` (a database flag)
    into the cancel event within CANCEL_POLL_S. The session's heartbeat does the polling
    when there is one; without (a caller outside a session), a thread of its own."""
    if beat is not None and beat.running:
        beat.armed = True
        try:
            yield
        finally:
            beat.armed = False
        return
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
