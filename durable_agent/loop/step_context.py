"""What every step needs, in one frozen value: the leaf that the step modules import.

`model_step`, `tool_step` and `finish_gate` take a `StepContext` and import nothing of the
runner, so the loop's pieces can be read (and tested) one at a time. The context is
frozen; what changes while the run goes on lives in `state` (the conversation, rebuilt from
the rows) and in `journal` (the step rows, the lease).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from msgspec import Struct
from msgspec.structs import force_setattr

from durable_agent.config.settings import Settings
from durable_agent.errors import LoopExit
from durable_agent.loop.guard import Limits
from durable_agent.loop.replay import RunState
from durable_agent.models import ModelClient
from durable_agent.observer import Observer
from durable_agent.redact import Redactor
from durable_agent.status import StopReason
from durable_agent.store.journal import Journal
from durable_agent.store.step import Counters
from durable_agent.tools.base import Tool

if TYPE_CHECKING:  # tenacity's side stays unimported until a call fails
    from durable_agent.loop.heartbeat import Heartbeat
    from durable_agent.models.retry import RetryPolicy


class StepContext(Struct, frozen=True, weakref=True):
    journal: Journal
    state: RunState
    settings: Settings
    model: ModelClient
    tools: Mapping[str, Tool]
    schemas: list[dict[str, Any]]
    redactor: Redactor
    observer: Observer
    cancel: threading.Event
    env: Mapping[str, str]
    limits: Limits
    clock: Callable[[], float]  # monotonic seconds: active time
    sleep: Callable[[float], None]  # between model retries
    session_start: float  # clock() when this session took the run
    retry_policy: RetryPolicy | None = None  # None: the Settings defaults
    resumed: bool = False  # the run had a session before this one
    beat: Heartbeat | None = None  # the session's lease heartbeat, which also watches for a cancel
    forked_at: int | None = None  # a fork's `fork_seq`: its memory is read again (memory_step)
    children: Any = None  # loop/delegate_step.Children: how this run makes and runs child runs
    workspace_id: tuple[int, int] | None = None  # as this session found it (set by __post_init__)

    def __post_init__(self) -> None:
        # Held open while the session lasts: a folder deleted and made again would get the
        # same inode number back (ext4 hands a freed one out again) and look unchanged.
        try:
            fd = os.open(self.settings.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (OSError, ValueError):
            return
        weakref.finalize(self, os.close, fd)
        st = os.fstat(fd)
        force_setattr(self, "workspace_id", (st.st_dev, st.st_ino))

    def workspace_moved(self) -> bool:
        """Is the workspace another folder than the one this session started in? A mount
        point unmounted under the run leaves the folder below it (empty), where a write or
        a command would land and the next snapshot record every file as deleted by it."""
        return (
            self.workspace_id is not None
            and _identity(self.settings.workspace) != self.workspace_id
        )

    def check_workspace(self) -> None:
        """Stop the run (failed, resumable) before a write or a command in another folder."""
        if self.workspace_moved():
            raise LoopExit(
                StopReason.TOOL_ERROR,
                f"the workspace {self.settings.workspace} is not the folder "
                "this session started in (unmounted, or deleted and made again): nothing more was "
                "run or written; resume once it is back",
            )

    def active_ms(self) -> int:
        """Active time over all sessions of the run, this one included."""
        return self.state.active_ms + int((self.clock() - self.session_start) * 1000)

    def counters(self) -> Counters:
        s = self.state
        return Counters(
            s.step_count,
            s.tool_call_count,
            s.prompt_tokens,
            s.completion_tokens,
            len(s.messages),
            self.active_ms(),
            s.cached_tokens,
            s.cost,
        )


def _identity(folder: str | os.PathLike[str]) -> tuple[int, int] | None:
    try:
        st = os.stat(folder)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino
