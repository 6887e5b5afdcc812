"""Ctrl-C and SIGTERM, the same way for a foreground run and for a worker: the first one
asks for a stop at the next step boundary, the second one stops now.

Handlers run in the main thread between two bytecodes: `first` and `second` must only set
events or raise, never take a lock the main thread may hold.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    def __init__(self, first: Callable[[int], None], second: Callable[[int], None]) -> None:
        self.first, self.second = first, second
        self.count = 0
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():  # Python's rule for signals
            for sig in SIGNALS:
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *_: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.count += 1
        (self.first if self.count == 1 else self.second)(signum)
