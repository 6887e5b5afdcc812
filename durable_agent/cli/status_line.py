"""The live status line of the timeline (a TTY only), and `short`, the one-line cut it uses."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from typing import TextIO

from durable_agent.presentation import short


class StatusLine:
    """One terminal line, redrawn by a thread, saying what is in progress and for how long.

    Only for a TTY: the carriage returns and erase codes would litter a pipe or a log file.
    Every write holds one lock, so a timeline line never lands in the middle of a redraw.
    """

    ERASE = "\r\x1b[2K"

    def __init__(
        self, out: TextIO, *, interval: float = 0.1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.out, self.interval, self.clock = out, interval, clock
        utf8 = (getattr(out, "encoding", "") or "").lower().replace("-", "") == "utf8"
        self.frames = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏" if utf8 else "|/-\\"
        self._lock = threading.Lock()
        self._label: str | None = None
        self._detail = ""
        self._since = 0.0
        self._tick = 0
        self._shown = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._idle: Callable[[], tuple[str, str, float] | None] | None = None

    def show(
        self, label: str, detail: str = "", *, restart_clock: bool = True, draw: bool = True
    ) -> None:
        """`⠹ {label} {elapsed} s · {detail}` until the next clear() or show().

        `draw=False` when a print() follows at once: it draws the new label itself."""
        with self._lock:
            self._label, self._detail = label, detail
            if restart_clock:
                self._since = self.clock()
            if draw:
                self._draw()
        self._start()

    def _start(self) -> None:
        if self._thread is None:  # started on first use (or watch): a pipe's timeline has none
            self._thread = threading.Thread(target=self._loop, name="status-line", daemon=True)
            self._thread.start()

    def watch(self, idle: Callable[[], tuple[str, str, float] | None]) -> None:
        """Between labels, show what `idle` says is under way (label, detail, seconds it has
        taken; None: nothing), asked at each redraw: work that is not a step, such as the
        first snapshot of a big workspace, which shows nothing else for seconds."""
        with self._lock:
            self._idle = idle
        self._start()

    def clear(self) -> None:
        with self._lock:
            self._label = None
            self._erase()

    def print(self, text: str) -> None:
        """A permanent line above the status line (which is redrawn after it, if any)."""
        with self._lock:
            self._erase()
            self.out.write(text + "\n")
            self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.clear()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                if self._shown:  # the spinner turns while a line is shown, from its first frame
                    self._tick += 1
                self._draw()

    def _draw(self) -> None:
        label, detail = self._label, self._detail
        elapsed = self.clock() - self._since
        if label is None and self._idle is not None:
            shown = self._idle()
            if shown is not None:
                label, detail, elapsed = shown
            elif self._shown:  # the idle work is over: its line goes
                self._erase()
        if label is None:
            self.out.flush()
            return
        head = self.frames[self._tick % len(self.frames)] + " "
        tail = f" {elapsed:.1f} s" + (f" · {detail}" if detail else "")
        width = shutil.get_terminal_size((100, 20)).columns - 1
        # Shorten the label, not the elapsed time: on a narrow terminal the time matters most.
        label = short(label, max(width - len(head) - len(tail), 12))
        self.out.write(self.ERASE + short(head + label + tail, width))
        self.out.flush()
        self._shown = True

    def _erase(self) -> None:
        if self._shown:
            self.out.write(self.ERASE)
            self._shown = False
