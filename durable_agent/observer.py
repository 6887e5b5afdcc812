"""What the loop reports while it runs. The CLI renders it (render.py); tests may record it.

Only notifications: an observer never changes what the loop does.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from msgspec import Struct


class DeltaKind(StrEnum):
    """What a piece of a streamed answer is (Observer.delta)."""

    START = "start"  # a try begins: what an earlier try showed is void
    TEXT = "text"
    REASONING = "reasoning"  # the model's thinking: shown dimmed, never sent back
    TOOL = "tool"  # a tool call's name, once known


class StepEvent(Struct, frozen=True):
    seq: int
    turn: int
    kind: str  # model | tool | verify
    name: str  # model name, tool name or the verify command
    detail: str = ""  # a short summary of the arguments or the answer
    state: str = "started"  # started | completed | failed | reused | retry
    duration_ms: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    estimated: bool = False  # the endpoint reported no usage: the token counts are an estimate
    attempts: int = 1
    error: str | None = None
    # For traces (loop/telemetry.py): the step's key, its call, whether an earlier session
    # began it, what it paid, and facts of its kind (a model's answer, a tool's arguments).
    key: str = ""
    call_id: str | None = None
    resumed: bool = False
    cached_tokens: int | None = None
    cost: float | None = None
    facts: dict[str, Any] | None = None


class Observer:
    """No-op base; override what you need."""

    def run_started(self, run_id: str, *, resumed: bool, steps_done: int) -> None: ...

    def step(self, event: StepEvent) -> None: ...

    def note(self, text: str) -> None: ...

    def delta(self, seq: int, turn: int, kind: DeltaKind, text: str) -> None:
        """A piece of a model call's answer as it streams in (step `seq`). Never stored:
        the step's outcome is."""
