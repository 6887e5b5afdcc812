"""`--jsonl` on the commands that execute a run (`start`, `resume`, and any other that runs
one through `commands._execute`): the run's events on stdout, one JSON object per line, as
`export` prints them, each as soon as its row is written, for CI consumers.

The events are `transcript.build_events` of the rows so far (the same derivation as
`export`, so a line printed live is the line `export` prints afterwards); after each step
event of the loop the rows are read again and the events not yet printed are written (an
event is known by its type, step and time: it does not change once written). `seq` counts
the lines printed. The timeline still goes to stderr (unless --quiet); the last line is
`run_finished` when the run ended, the answer being in it.
"""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from typing import Any, TextIO

from durable_agent.cli import render, streams
from durable_agent.observer import DeltaKind, Observer, StepEvent

_LINE_BREAKS = {0x2028: "\\u2028", 0x2029: "\\u2029", 0x85: "\\u0085"}


def observer_for(args: Namespace) -> Observer | None:
    """The observer of a run this command executes: the timeline on stderr (not with --quiet
    or --json), inside the event printer with --jsonl."""
    timeline = None if (args.quiet or args.json) else render.Timeline(sys.stderr)
    if getattr(args, "jsonl", False):
        return JsonlEvents(streams.forgiving(sys.stdout), timeline)
    return timeline


def attach(observer: Observer | None, store: Any, run_id: str) -> None:
    """Once the run exists: where its events are read from."""
    if isinstance(observer, JsonlEvents):
        observer.attach(store, run_id)


def finish(observer: Observer | None) -> bool:
    """The events left (the run's end); True when this command prints events, not the answer."""
    if isinstance(observer, JsonlEvents):
        observer.flush()
        return True
    return False


class JsonlEvents(Observer):
    def __init__(self, out: TextIO, inner: Observer | None) -> None:
        self.out, self.inner = out, inner
        self.store: Any = None
        self.run_id = ""
        self.printed: set[tuple[Any, ...]] = set()

    def attach(self, store: Any, run_id: str) -> None:
        self.store, self.run_id = store, run_id

    def run_started(self, run_id: str, *, resumed: bool, steps_done: int) -> None:
        if self.inner is not None:
            self.inner.run_started(run_id, resumed=resumed, steps_done=steps_done)
        self.flush()

    def step(self, event: StepEvent) -> None:
        if self.inner is not None:
            self.inner.step(event)
        self.flush()

    def note(self, text: str) -> None:
        if self.inner is not None:
            self.inner.note(text)

    def delta(self, seq: int, turn: int, kind: DeltaKind, text: str) -> None:
        if self.inner is not None:
            self.inner.delta(seq, turn, kind, text)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    def flush(self) -> None:
        if self.store is None:
            return
        from durable_agent.errors import StoreError
        from durable_agent.transcript import events

        try:
            found = list(events(self.store, self.run_id))
        except StoreError:
            return  # the store is away: the next step (or the end) prints what is missing
        for event in found:
            key = (event["type"], event.get("step_seq"), event["at"], event.get("approval_id"))
            if key in self.printed:
                continue
            self.printed.add(key)
            event["seq"] = len(self.printed) - 1
            line = json.dumps(event, ensure_ascii=False).translate(_LINE_BREAKS)
            self.out.write(line + "\n")
        self.out.flush()
